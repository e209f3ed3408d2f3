r"""GRPO on a pretrained language model (`jaxrl.models`); the task is the argument.

    python -m jaxrl.train --config=experiments/lm_grpo.py:addition
    python -m jaxrl.train --config=experiments/lm_grpo.py:multiplication --config.model.name=path/to/Qwen2.5-0.5B-Instruct
    python -m jaxrl.train --config=experiments/lm_grpo.py:dataset --config.task.kwargs.path=gsm8k.jsonl

The model is `config.model.name`: an installed name (smollm2-135m-instruct, the default), a Hugging Face
directory or a .gguf file; its weights are the starting point and its tokenizer and chat template pose each
question (`config.task.system_prompt`, `config.task.instruction`); the reply's final answer follows
`config.task.answer_marker` and the task's verifier checks it. Every GRPO-family key of experiments/text_grpo.py
applies (estimators, losses, rollout strategies).
"""

from ml_collections import ConfigDict

from experiments.text_sft import task_kwargs
from jaxrl import algos, config as config_lib


def on_pretrained(config: ConfigDict, task: str) -> ConfigDict:
    """`config` (a text algorithm's defaults) on the installed pretrained model, its task posed in chat: what
    every experiment on a pretrained model shares."""
    config.model.name = "smollm2-135m-instruct"
    config.task.name = task
    config.task.kwargs = {} if task == "dataset" else task_kwargs(task)
    config.task.reply_length = 96
    config.num_prompts = 16
    config.group.size = 8
    config.optim.warmup_updates = 2
    config.optim.weight_decay = 0.0
    # Memory: 128 completions of a 30-layer model keep ~25 GB of activations for the backward pass; four
    # minibatches and recomputed layers bring one update under 4 GB.
    config.optim.num_minibatches = 4
    config.model.remat = True
    return config


def get_config(arg: str | None = None) -> ConfigDict:
    task = arg or "addition"
    config = on_pretrained(algos.default_config("text_grpo"), task)
    config.experiment = f"lm_grpo_{task}"
    config.total_steps = 16 * 8 * 40  # completions per seed: 40 updates
    config.loss.clip_high = 0.28
    config.optim.learning_rate = 2e-6
    config.log.every_steps = 16 * 8
    config.eval.every_steps = 16 * 8 * 10
    config.eval.episodes = 64
    config.eval.pass_k = 0
    config.checkpoint.every_steps = 16 * 8 * 10
    return config_lib.finalize(config)
