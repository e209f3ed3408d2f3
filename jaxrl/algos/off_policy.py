"""What the off-policy learners' configs share (`q_learning`, `replay_actor_critic`): the keys of their envs,
optimiser and replay buffer, the static settings read from them, and their checks. Acting and learning from the
buffer are functions in `jaxrl.engine.acting`."""

from __future__ import annotations

import dataclasses
from typing import Any

from ml_collections import ConfigDict

from jaxrl import config as config_lib, engine, knobs
from jaxrl.algos.env_policy import NETWORK_SIZED, policy_functions
from jaxrl.algos.env_setup import (ENV_KWARGS, ENV_NAME, GAMMA, NUM_ENVS, NUM_STEPS, RESET_RATIO, REWARD_SCALE,
                                   check_env_and_length, run_sizes)
from jaxrl.engine import OptimizerSettings, acting
from jaxrl.knobs import Knob, knob

TAU = Knob("target.tau", 0.005, "target <- tau * online + (1 - tau) * target at each target update; 1: a copy",
           traced=True, minimum=0.0, maximum=1.0)
PRIORITY_ALPHA = Knob("replay.priority_alpha", 0.6, "prioritised replay: P proportional to priority^alpha",
                      traced=True, minimum=0.0)
PRIORITY_BETA = Knob("replay.priority_beta", 0.4, "prioritised replay: importance weights (N P)^-beta",
                     traced=True, minimum=0.0, maximum=1.0)
STORE_DTYPES = ("float32", "bfloat16", "float16")
OFF_POLICY_KNOBS = (NUM_ENVS, NUM_STEPS, ENV_NAME, ENV_KWARGS, RESET_RATIO, GAMMA, REWARD_SCALE)


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """A replay buffer and how much is learned from it (`engine.acting.replay_update`)."""

    buffer_size: int = knob("replay.buffer_size", 50_000, "env steps kept per run, over all its envs", minimum=1)
    replay_batch: int = knob("replay.batch_size", 128, "sequences per gradient step, over all envs (a multiple of "
                             "num_envs)", minimum=1)
    gradient_steps: int = knob("replay.gradient_steps", 1, "gradient steps per update (num_steps x num_envs env "
                               "steps)", minimum=1)
    learning_starts: int = knob("replay.learning_starts", 1_000, "env steps per run before training starts",
                                minimum=0)
    prioritised: bool = knob("replay.prioritised", False, "sample by priority (proportional, Schaul et al. 2016) "
                             "rather than uniformly")
    target_every: int = knob("target.every", 1, "gradient steps between target-network updates", minimum=1)
    # float16 halves the buffer's memory (SMAX's observations lie in [-1, 1]: errors below 2.5e-4)
    store_dtype: str = knob("replay.store_dtype", "float32", "what observations and global states are stored as",
                            choices=STORE_DTYPES)
    sequence_length: int = 1  # steps per sampled sequence: the learner's (n-step returns, a recurrent unroll)


@dataclasses.dataclass(frozen=True)
class OffPolicySettings:
    """Static sizes and choices of an off-policy learner: changing one compiles a new program."""

    num_envs: int = NUM_ENVS.field()
    num_steps: int = NUM_STEPS.field()
    reset_ratio: int = RESET_RATIO.field()  # training envs: one restart per reset_ratio envs per step
    optimizer: OptimizerSettings = OptimizerSettings()
    num_updates: int = 1  # over the run (`run_sizes`): the learning-rate schedule's length (and exploration's)
    xla_options: tuple[tuple[str, str | bool], ...] | str = ()  # the training program's XLA options, or "auto"
    replay: ReplaySettings | None = None  # None: no buffer, each rollout learned from as it comes (PQN)
    rules: Any = None  # the family's own static choices (`q_learning.QRules`, `replay_actor_critic.ActorCriticRules`)

    @property
    def batch_size(self) -> int:
        """Environment steps per update, over all devices."""
        return self.num_envs * self.num_steps


def sized_by(settings: OffPolicySettings) -> dict:
    """Memory advice (`engine.Algorithm.sized_by`): what sizes each part of an off-policy learner's state, and for
    a buffer of float32 observations, that float16 halves them."""
    sized = {**NETWORK_SIZED, "acting": "num_envs"}
    if settings.replay is not None:
        buffer = "replay.buffer_size"
        if settings.replay.store_dtype == "float32":
            buffer += ", or set replay.store_dtype=float16 (halves its observations)"
        sized.update(target_params=NETWORK_SIZED["params"], buffer=buffer)
    return sized


def off_policy_algorithm(learner, state_specs=acting.replay_specs) -> engine.Algorithm:
    """The `engine.Algorithm` of an off-policy learner (`engine.acting`'s, with its `init(key)` and `update(state,
    hp)`); evaluation, a loaded actor and the episode GIF are its policy's."""
    return engine.Algorithm(learner.settings, learner.envs.mesh, init=learner.init, update=learner.update,
                            state_specs=state_specs, sized_by=sized_by(learner.settings), parts=learner,
                            **policy_functions(learner.policy))


def off_policy_config(name: str) -> ConfigDict:
    """The keys every off-policy learner reads (envs, gamma); the learner adds its network and its own."""
    config = config_lib.base_config()
    config.algorithm = name
    config.num_steps = 4
    return knobs.fill(config, *OFF_POLICY_KNOBS)


def replay_config() -> ConfigDict:
    """config.replay: the buffer and how much is learned from it (`ReplaySettings`, the priorities' exponents)."""
    return knobs.defaults(ReplaySettings, PRIORITY_ALPHA, PRIORITY_BETA).replay


def off_policy_settings(config: ConfigDict, rules, sequence_key: str | None = None) -> OffPolicySettings:
    """The settings of `config` with the family's `rules`, and a replay buffer when it has config.replay, sampling
    sequences as long as the key `sequence_key` says (else single steps)."""
    replay = None
    if "replay" in config:
        replay = knobs.read(ReplaySettings, config, sequence_length=sequence_length(config, sequence_key))
    return knobs.read(OffPolicySettings, config, **run_sizes(config), replay=replay, rules=rules)


def sequence_length(config: ConfigDict, sequence_key: str | None) -> int:
    return knobs.get_value(config, sequence_key) if sequence_key else 1


def check_off_policy_config(config: ConfigDict, sequence_key: str | None = None) -> None:
    """The env, the run's length and, with config.replay, the buffer (holding `sequence_key`'s steps per env)."""
    check_env_and_length(config)
    if "replay" not in config:
        return
    r, length = config.replay, sequence_length(config, sequence_key)
    holding = f"num_steps and {sequence_key}" if sequence_key else "num_steps"
    if r.batch_size % config.num_envs:
        raise ValueError(f"config.replay.batch_size = {r.batch_size} must be a multiple of num_envs = "
                         f"{config.num_envs}: every env gives batch_size / num_envs samples")
    if r.buffer_size % config.num_envs or r.buffer_size // config.num_envs < max(config.num_steps, length):
        raise ValueError(f"config.replay.buffer_size = {r.buffer_size} must be a multiple of num_envs = "
                         f"{config.num_envs} holding at least {holding} steps per env")
