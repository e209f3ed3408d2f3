r"""A reward model on a pretrained language model (`jaxrl.models`) from outcome labels; the task is the argument.

    python -m jaxrl.train --config=experiments/lm_reward_model.py:addition
    python -m jaxrl.train --config=experiments/lm_grpo.py:addition --config.reward.model=<that run> \
        --config.reward.model_weight=1.0

The model is `config.model.name` (smollm2-135m-instruct by default, a Hugging Face directory or a .gguf file): the
sampler is the model as loaded, frozen, which answers each question through its chat template; the reward model is
the same weights under a fresh value head, which learns which of its replies the task's verifier accepts
(`reward_model.objective`, Bradley-Terry by default). See docs/reward-models.md.
"""

from ml_collections import ConfigDict

from experiments.lm_grpo import on_pretrained
from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    task = arg or "addition"
    config = on_pretrained(algos.default_config("text_reward_model"), task)
    config.experiment = f"lm_reward_model_{task}"
    config.total_steps = 16 * 8 * 16  # labelled completions per seed: 16 updates
    config.optim.learning_rate = 1e-5
    config.log.every_steps = 16 * 8
    config.eval.every_steps = config.checkpoint.every_steps = 16 * 8 * 4
    config.eval.episodes = 64
    return config_lib.finalize(config)
