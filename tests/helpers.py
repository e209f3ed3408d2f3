"""What several test files share: experiment configs at test sizes, and building an algorithm from one.

Subprocess tests import these too (`sys.path.insert(0, "tests"); from helpers import ...`)."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_experiment(name: str, arg: str | None = None):
    """experiments/<name>.py's config for `arg` (locked)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "experiments", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def set_keys(config, overrides: dict):
    """Set dotted config keys ("loss.clip_high": 0.28) as the command line does; returns the config."""
    for key, value in overrides.items():
        target = config
        *parents, leaf = key.split(".")
        for part in parents:
            target = target[part]
        target[leaf] = value
    return config


def build(config, num_seeds=1):
    """(algorithm, hyperparams, initial state of `num_seeds` seeds) for a validated config."""
    from jaxrl import algos, mesh as mesh_lib

    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    return algo, hp, algo.init_seeds(config.seed, num_seeds)


def small_cartpole(**overrides):
    """experiments/cartpole_ppo.py at 8 envs x 16 steps, 4 updates, logging every 2."""
    config = load_experiment("cartpole_ppo")
    return set_keys(config, {"num_envs": 8, "num_steps": 16, "total_steps": 8 * 16 * 4, "log.progress_bar": False,
                             "log.every_steps": 8 * 16 * 2, "eval.num_envs": 4, **overrides})


def small_smax_config(scenario="3m", critic_input="global_state", kind="gru", num_envs=8, num_steps=32):
    """experiments/smax_mappo.py with small networks, 4 updates."""
    config = load_experiment("smax_mappo", scenario)
    config.num_envs, config.num_steps = num_envs, num_steps
    config.total_steps = num_envs * num_steps * 4
    config.network.critic_input = critic_input
    config.network.kind = kind
    config.network.fc_size, config.network.rnn_size, config.network.hidden_sizes = 32, 32, (32, 32)
    return config


def small_grpo_config(name="cartpole_grpo", arg=None, num_envs=8, num_steps=64, group_size=4, **overrides):
    """An env GRPO experiment with small networks, 4 updates, 2 minibatches; `overrides` by dotted key."""
    config = load_experiment(name, arg)
    config.num_envs, config.num_steps, config.group.size = num_envs, num_steps, group_size
    config.total_steps = num_envs * num_steps * 4
    config.optim.num_minibatches = 2
    config.network.fc_size, config.network.rnn_size, config.network.hidden_sizes = 32, 32, (32, 32)
    return set_keys(config, overrides)


def tiny_sft_config(task="addition", total_steps=3_200):
    """experiments/text_sft.py with a one-layer model, logging and evaluating every 1,600 samples."""
    config = load_experiment("text_sft", task)
    config.total_steps, config.num_prompts = total_steps, 32
    config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 64, 2
    config.optim.warmup_updates = 10
    config.log.every_steps, config.eval.every_steps, config.eval.num_envs = 1_600, 1_600, 64
    config.checkpoint.every_steps = 1_600
    config.log.progress_bar = False
    return config


def tiny_grpo_config(init_from, **overrides):
    """experiments/text_grpo.py:addition warm-started from the SFT run `init_from` (a tiny_sft_config run):
    8 prompts x 4 samples, 4 updates; `overrides` by dotted key."""
    config = load_experiment("text_grpo", "addition")
    config.init_from = init_from
    config.num_prompts, config.group.size = 8, 4
    config.total_steps = 8 * 4 * 4
    config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 64, 2  # as tiny_sft_config
    config.log.every_steps, config.eval.every_steps, config.eval.num_envs = 64, 128, 32
    config.checkpoint.every_steps = 128
    config.log.progress_bar = False
    return set_keys(config, overrides)
