"""Supervised warm start of a small transformer on a verifiable text task; the task is the argument.

    python -m jaxrl.train --config=experiments/text_sft.py:addition
    python -m jaxrl.train --config=experiments/text_sft.py:countdown --config.total_steps=400000

Teacher forcing on the tasks' generated reference solutions (a multi-turn task's: its demonstrator's episodes,
the model's turns learned, the environment's answers attended to); the run directory gets `tokenizer.json`
beside the checkpoints, and `eval_accuracy` is greedy pass@1 on a fixed held-out set.
"""

from ml_collections import ConfigDict

from envs import text
from jaxrl import algos, config as config_lib

TASK_KWARGS = {"addition": {"min_digits": 1, "max_digits": 3}, "multiplication": {"min_digits": 1, "max_digits": 2},
               "countdown": {"num_numbers": 3}, "countdown_tools": {"num_numbers": 3}}


def task_kwargs(task: str) -> ConfigDict:
    """Every option of the task (so any can be set from the command line), with this experiment's choices."""
    return ConfigDict({**text.task_options(task), **TASK_KWARGS.get(task, {})})


def model_length(task: str, **options) -> int:
    """Positions the model needs for the task's prompt and answer (a multi-turn task's whole episode), with this
    experiment's options and `options` over them, at least 48, rounded up to a multiple of 16."""
    built = text.make_task(task, **{**TASK_KWARGS.get(task, {}), **options})
    return max(48, -(-(built.prompt_length + built.answer_length) // 16) * 16)


def get_config(arg: str | None = None) -> ConfigDict:
    task = arg or "addition"
    config = algos.default_config("text_sft")
    config.experiment = f"text_sft_{task}"
    config.task.name = task
    config.task.kwargs = task_kwargs(task)
    config.total_steps = 320_000
    config.num_prompts = 64
    config.model.num_layers, config.model.d_model, config.model.num_heads = 2, 128, 4
    config.model.max_len = model_length(task)
    config.optim.learning_rate = 1e-3
    config.optim.warmup_updates = 100
    config.log.every_steps = 12_800
    config.eval.every_steps = 64_000
    config.eval.episodes = 512
    config.checkpoint.every_steps = 64_000
    return config_lib.finalize(config)
