r"""A reward model from outcome labels: a policy's completions, labelled by the task's verifier; the task is the argument.

    python -m jaxrl.train --config=experiments/text_sft.py:countdown --workdir=runs/sft_countdown
    python -m jaxrl.train --config=experiments/text_reward_model.py:countdown --config.init_from=runs/sft_countdown \
        --workdir=runs/rm_countdown
    python -m jaxrl.train --config=experiments/text_grpo.py:countdown --config.init_from=runs/sft_countdown \
        --config.reward.model=runs/rm_countdown

The sampler and the reward model's body start from `init_from` (their model settings must match it);
`--config.reward_model.objective=pointwise` trains on labels one by one instead of Bradley-Terry pairs.
"""

from ml_collections import ConfigDict

from experiments.text_sft import model_length, task_kwargs
from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    task = arg or "countdown"
    config = algos.default_config("text_reward_model")
    config.experiment = f"text_reward_model_{task}"
    config.task.name = task
    config.task.kwargs = task_kwargs(task)
    config.total_steps = 64_000  # labelled completions per seed
    config.num_prompts = 32
    config.group.size = 8
    config.model.num_layers, config.model.d_model, config.model.num_heads = 2, 128, 4
    config.model.max_len = model_length(task)
    config.optim.learning_rate = 1e-4
    config.optim.warmup_updates = 10
    config.log.every_steps = 2_560
    config.eval.every_steps = 16_000
    config.eval.episodes = 256
    config.checkpoint.every_steps = 16_000
    return config_lib.finalize(config)
