r"""GRPO on tokens from a supervised warm start; the task is the argument.

    python -m jaxrl.train --config=experiments/text_sft.py:addition --workdir=runs/sft_addition
    python -m jaxrl.train --config=experiments/text_grpo.py:addition --config.init_from=runs/sft_addition
    python -m jaxrl.train --config=experiments/text_grpo.py:addition --config.init_from=runs/sft_addition \
        --config.advantage.estimator=dr_grpo --config.loss.aggregate=constant --config.group.oversample=2
    python -m jaxrl.train --config=experiments/text_grpo.py:countdown --config.init_from=runs/sft_countdown \
        --config.rollout.pool_size=512 --config.rollout.replay=correct,hints --config.rollout.generate=tree
    python -m jaxrl.train --config=experiments/text_grpo.py:countdown --config.init_from=runs/sft_countdown \
        --config.group.size=128 --config.num_prompts=2    # BroRL: broad exploration, 128 rollouts per prompt

The model settings must match the warm start's (they are read from this config, the weights and the
tokenizer from `init_from`). RL may train on harder problems than SFT saw: any task option can be set, e.g.
`--config.task.kwargs.max_number=50` for Countdown. Rollout strategies (`config.rollout`, see docs/grpo.md's
table): one registry per stage (generate, filter, control, replay), a config line each.
"""

from ml_collections import ConfigDict

from envs import text
from experiments.text_sft import model_length, task_kwargs
from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    task = arg or "addition"
    config = algos.default_config("text_grpo")
    config.experiment = f"text_grpo_{task}"
    config.task.name = task
    config.task.kwargs = task_kwargs(task)
    config.total_steps = 64_000  # completions per seed
    config.num_prompts = 32
    config.group.size = 8
    config.group.oversample = 2  # DAPO dynamic sampling: two candidate prompts per slot
    config.loss.clip_high = 0.28  # DAPO clip-higher: slows the entropy collapse
    config.model.num_layers, config.model.d_model, config.model.num_heads = 2, 128, 4
    config.model.max_len = model_length(task)
    config.optim.learning_rate = 1e-4
    config.optim.warmup_updates = 10
    config.log.every_steps = 2_560
    config.eval.every_steps = 12_800
    config.eval.episodes = 512
    config.checkpoint.every_steps = 12_800
    if getattr(text.TASKS.get(task), "roles", ()):  # each turn learns its own role's reward, against the group's
        config.advantage.estimator, config.advantage.turn_gamma = "turn_grpo", 0.0
    return config_lib.finalize(config)
