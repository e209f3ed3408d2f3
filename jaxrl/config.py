"""Experiment configs: the shared layout, checks that fail before compiling, and saving/loading.

Every experiment file's `get_config(arg)` starts from `base_config()`, sets what it needs and returns
`finalize(config, arg)`. The result is locked, so a misspelt key (in Python or on the command line) is an
error, and ConfigDict's type checks reject a value of the wrong type.
"""

from __future__ import annotations

import json
from typing import Any

from ml_collections import ConfigDict


def base_config() -> ConfigDict:
    """Every key a run understands, with defaults. Sizes are static; `ppo.*` numbers are traced."""
    return ConfigDict({
        "experiment": "experiment",
        "algorithm": "ppo",
        "seed": 0,
        "num_seeds": 1,  # seeds trained at once, vmapped
        "total_steps": 100_000,  # environment steps per seed
        "num_envs": 4,  # parallel environments per seed, split over devices
        "num_steps": 128,  # rollout length per update
        "rollout_unroll": 1,  # lax.scan unroll of the rollout loop (a speed knob)
        "xla_options": "",  # XLA compile options for the training programs: "name=value,name=value" (a speed knob)
        "env": {"name": "CartPole-v1", "kwargs": ConfigDict()},
        "ppo": {
            "num_epochs": 4,
            "num_minibatches": 4,
            "learning_rate": 2.5e-4,
            "anneal_lr": True,
            "gamma": 0.99,
            "gae_lambda": 0.95,
            "clip_eps": 0.2,
            "clip_value": True,
            "vf_coef": 0.5,
            "ent_coef": 0.01,
            "max_grad_norm": 0.5,
            "adam_eps": 1e-5,
            "normalize_advantages": True,
            "bootstrap_truncation": True,  # bootstrap from V(final obs) when a time limit cuts an episode
            "critic_input": "obs",  # "obs": each agent's own view (IPPO); "global_state": centralised (MAPPO)
            # multi-agent: "episode": an agent's returns take in the team's rewards to the episode's end, also
            # after the agent died; "agent_done": they stop at the agent's own done flag
            "returns_until": "episode",
            "grad_clip": "joint",  # max_grad_norm over all parameters, or "per_network" (actor, critic apart)
        },
        "network": {
            "kind": "mlp",  # "mlp" (feed-forward) or "gru" (recurrent actor and critic)
            "hidden_sizes": (64, 64),  # mlp
            "fc_size": 128,  # gru: dense layer before and after the GRU
            "rnn_size": 128,  # gru: hidden state size
            "activation": "tanh",
            # multi-agent: which networks see each agent's one-hot index: "both", "critic", "actor", "none"
            "agent_id": "both",
        },
        # num_devices 0: every device (of every process). run_devices: devices along the mesh's `runs` axis
        # (seeds and sweep settings split over them); 0: as many as divide both the devices and the runs.
        "mesh": {"num_devices": 0, "run_devices": 0},
        "log": {"every_steps": 25_000, "progress_bar": True},
        "checkpoint": {"every_steps": 0, "keep": 3},  # 0: at every log interval
        "eval": {"every_steps": 0, "num_envs": 32, "max_steps": 0},  # every_steps 0: only at the end
    })


# PPO keys that GRPO does not read (its clipping and entropy live under `loss`, advantages are by group).
_NOT_IN_GRPO = ("gae_lambda", "clip_eps", "clip_value", "ent_coef", "normalize_advantages", "bootstrap_truncation",
                "returns_until")


def _group_relative_keys() -> ConfigDict:
    """The keys env and text GRPO share: estimator, its options, group size and the policy-loss parts."""
    return ConfigDict({
        "advantage": "grpo",  # an estimator of jaxrl.advantages: grpo, dr_grpo, rloo, median, ...
        "advantage_options": {
            "scale": "",  # "group", "batch" or "none"; "": the estimator's default
            "eps": 1e-6,
            "clip": 0.0,  # clip advantages to [-clip, clip]; 0: off
            "max_reward": 1.0,  # calibrated: the virtual best sample's reward
            "renormalize": False,  # gdpo: renormalise the combined advantages over the batch
        },
        "group": {"size": 8},
        "critic_weight": 0.0,  # > 0 mixes in a learned value baseline (1: critic-based, 0: critic-free)
        "loss": {
            "clip_low": 0.2,
            "clip_high": 0.2,  # > clip_low: DAPO's clip-higher
            "dual_clip": 0.0,  # > 1: cap the loss of negative advantages at -dual_clip * A; 0: off
            "ratio": "token",  # "token" or "sequence" (GSPO)
            "aggregate": "token",  # "token", "sequence" or "constant" (Dr. GRPO)
            "ent_coef": 0.0,
        },
    })


def grpo_config() -> ConfigDict:
    """`base_config()` for the critic-free group-relative algorithm: `ppo.*` keeps the optimiser and epoch
    settings, and the group, advantage estimator and loss parts are chosen by name."""
    config = base_config()
    config.algorithm = "grpo"
    for key in _NOT_IN_GRPO:
        del config.ppo[key]
    config.ppo.gamma = 1.0  # discount of returns-to-go (group.returns="to_go")
    config.update(_group_relative_keys())
    # group.size: G episodes per start state (num_envs = groups * size). group.returns: "episode" gives one
    # advantage per episode, "to_go" a group baseline per step over returns-to-go.
    config.group.returns = "episode"
    config.loss.constant_length = 0  # aggregate="constant": the length divided by; 0: num_steps
    return config


def text_config() -> ConfigDict:
    """Every key of a token-level run (a transformer policy on a verifiable text task, envs/text)."""
    return ConfigDict({
        "experiment": "text",
        "algorithm": "text_sft",
        "seed": 0,
        "num_seeds": 1,
        "total_steps": 200_000,  # samples (prompt and completion pairs) per seed
        "task": {"name": "addition", "kwargs": ConfigDict()},
        "num_prompts": 64,  # per update, split over devices
        "model": {"num_layers": 2, "d_model": 128, "num_heads": 4, "d_ff": 0,  # d_ff 0: 4 * d_model
                  "max_len": 48},  # positions: prompt + answer tokens (RL on longer problems needs room)
        "optim": {"learning_rate": 1e-3, "max_grad_norm": 1.0, "weight_decay": 0.0, "warmup_updates": 50,
                  "adam_eps": 1e-8},
        "xla_options": "",  # as in base_config
        "mesh": {"num_devices": 0, "run_devices": 0},
        "log": {"every_steps": 6_400, "progress_bar": True},
        "checkpoint": {"every_steps": 0, "keep": 3},
        # num_envs: held-out problems; pass_k: samples per problem for eval_pass@k (0: greedy only)
        "eval": {"every_steps": 0, "num_envs": 512, "max_steps": 0, "pass_k": 8},
    })


def text_grpo_config() -> ConfigDict:
    """`text_config()` for RL on tokens from a warm start: group, estimator, loss and sampling choices."""
    config = text_config()
    config.algorithm = "text_grpo"
    config.update(_group_relative_keys())
    config.group.oversample = 1  # > 1: DAPO dynamic sampling, candidate prompts per slot
    config.loss.kl = "k3"
    config.loss.kl_coef = 0.0  # > 0: KL to the frozen starting policy
    config.loss.vf_coef = 0.5  # weight of the value head's loss when critic_weight > 0
    config.update(ConfigDict({
        "init_from": "",  # a text_sft run directory (its newest checkpoint and tokenizer.json); "": from scratch
        "reward_weights": (1.0, 0.1),  # correct, well_formed
        "sampling": {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
    }))
    config.optim.update({"num_epochs": 1, "num_minibatches": 1})
    return config


def finalize(config: ConfigDict, arg: str | None = None) -> ConfigDict:
    """Reject a config argument the experiment does not take, then lock the config."""
    if arg:
        raise ValueError(f"experiment {config.experiment!r} takes no config argument, got {arg!r}")
    config.lock()
    return config


def get_value(config: ConfigDict, key: str):
    """The value of a dotted key, e.g. get_value(config, "ppo.learning_rate")."""
    for part in key.split("."):
        config = config[part]
    return config


def set_value(config: ConfigDict, key: str, value) -> None:
    """Set a dotted key, e.g. set_value(config, "ppo.learning_rate", 1e-3)."""
    section, _, name = key.rpartition(".")
    (get_value(config, section) if section else config)[name] = value


def positive(config: ConfigDict, *keys: str) -> None:
    for key in keys:
        value = get_value(config, key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"config.{key} must be a positive integer, got {value!r}")


def xla_options(config: ConfigDict) -> tuple[tuple[str, str | bool], ...]:
    """config.xla_options "name=value,..." -> ((name, value), ...), sorted, true/false as bools (as XLA_FLAGS
    spells them; XLA's option parser wants Python bools); ValueError if an item is not `name=value` with an
    XLA option name (they start with "xla_")."""
    items = [item.strip() for item in config.xla_options.split(",") if item.strip()]
    options = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().startswith("xla_"):
            raise ValueError(f"config.xla_options: {item!r} is not name=value with an XLA option name "
                             "(e.g. xla_cpu_enable_fast_math=false)")
        value = value.strip()
        options.append((name.strip(), {"true": True, "false": False}.get(value.lower(), value)))
    return tuple(sorted(options))


def _check_xla_options(config: ConfigDict) -> None:
    """Compile a trivial program with the options, so that one this XLA does not know fails here, not after
    the training program's compile."""
    options = xla_options(config)
    if not options:
        return
    import jax

    try:
        jax.jit(lambda x: x + 1).lower(0.0).compile(dict(options))
    except Exception as error:  # XLA raises its runtime error type; the message names the option
        raise ValueError(f"config.xla_options {config.xla_options!r}: {str(error).splitlines()[0]}") from None


def validate_shared(config: ConfigDict) -> None:
    """Check the keys every run has (`jaxrl.algos.validate` adds the algorithm's own checks)."""
    _check_xla_options(config)
    positive(config, "num_seeds", "total_steps", "log.every_steps", "eval.num_envs", "checkpoint.keep")
    for key in ("checkpoint.every_steps", "eval.every_steps", "eval.max_steps", "mesh.num_devices",
                "mesh.run_devices"):
        section, name = key.split(".")
        if config[section][name] < 0:
            raise ValueError(f"config.{key} must be >= 0, got {config[section][name]!r}")


def unit_interval(value: float, key: str) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"config.{key} must lie in [0, 1], got {value!r}")


def one_of(value: str, known, key: str) -> None:
    if value not in known:
        raise ValueError(f"unknown config.{key} {value!r}; known: {', '.join(known)}")


def to_dict(config: ConfigDict) -> dict[str, Any]:
    """A JSON-ready plain dict (tuples become lists)."""
    return json.loads(config.to_json())


def save(config: ConfigDict, path) -> None:
    with open(path, "w") as f:
        f.write(config.to_json(indent=2, sort_keys=True))


def load(path) -> ConfigDict:
    """The config a run saved, locked like a fresh one."""
    with open(path) as f:
        config = ConfigDict(json.load(f))
    config.lock()
    return config


def differences(a: ConfigDict, b: ConfigDict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two configs."""
    da, db = (to_dict(a), to_dict(b)) if not prefix else (a, b)
    keys = sorted(set(da) | set(db))
    out = []
    for key in keys:
        va, vb = da.get(key), db.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += differences(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}")
    return out
