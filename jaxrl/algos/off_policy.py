"""What off-policy learners share: a policy acting in auto-resetting envs on a device mesh for many runs at once
(`OffPolicyLearner`), and learning from a replay buffer kept in the training state (`ReplayLearner`).

A learner supplies how it acts (`act`: epsilon-greedy Q-values, a sampled or a noisy deterministic policy) and,
with replay, its gradient steps (`_train`). Its network has the actor-critic calling convention, so `EnvPolicy`
serves it: what an agent sees, action masks, greedy evaluation, loaded actors. Envs are seen with an agent
axis: in a multi-agent env every agent acts with the shared network. Shapes: n envs on this device, A agents,
T steps per update, d observation size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

import envs
from jaxrl import config as config_lib, knobs, mesh as mesh_lib, replay
from jaxrl.algos.env_policy import ActsThroughPolicy, EnvPolicy, PolicyStep
from jaxrl.algos.env_setup import (ENV_KWARGS, ENV_NAME, GAMMA, NUM_ENVS, NUM_STEPS, RESET_RATIO, REWARD_SCALE,
                                   EnvSettings)
from jaxrl.engine import ChunkRunner
from jaxrl.knobs import Knob, knob
from jaxrl.mesh import DATA_AXIS, RUN_AXIS, RUNS


@struct.dataclass
class Acting:
    """Where a run's envs and its acting network stand between updates (in a state: leaves [R, N, ...])."""

    env_state: Any  # [N, ...]
    obs: jax.Array  # [N, A, d]
    carry: Any  # the network's hidden state, [N, A, H] leaves (() for feed-forward networks)
    first: jax.Array  # [N] bool: obs is the first of its episode (the hidden state restarts there)


class OffPolicyLearner(ActsThroughPolicy, ChunkRunner):
    """The acting half. A subclass supplies `act`, `init(key)` (one run's state, with `params`, `acting`,
    `update_step`), `chunk_specs(state)` and `_update(state, hp)`. Hyperparameters carry `reward_scale`."""

    def __init__(self, env: envs.Environment, network, settings: EnvSettings, mesh=None,
                 eval_max_steps: int = 1000, agent_id: str = "both", critic_input: str = "obs"):
        """`agent_id`, `critic_input`: as `EnvPolicy` takes them (critic_input "global_state": stored steps carry
        the env's global state)."""
        self.attach(EnvPolicy(env, network, agent_id, critic_input, eval_max_steps, squash=settings.squash,
                              std_transform=settings.std_transform),
                    settings, mesh)

    @property
    def discrete(self) -> bool:
        """Whether the env's actions are discrete (a categorical policy) rather than continuous."""
        return hasattr(self.policy.dist, "num_actions")

    @property
    def stores_global_state(self) -> bool:
        """Whether stored steps carry the env's global state (for a mixing network or a centralised critic)."""
        return self.policy.critic_input == "global_state"

    def start_acting(self, key: jax.Array) -> Acting:
        """One run's envs, reset (`settings.num_envs` of them), and the network's initial hidden state."""
        n = self.settings.num_envs
        obs, env_state = jax.vmap(self.env.reset)(jax.random.split(key, n))
        return Acting(env_state, obs, self.network.initial_carry((n, self.num_agents)), jnp.ones((n,), bool))

    def act(self, key: jax.Array, policy: PolicyStep, hp: Any, update_step: jax.Array):
        """One env's exploring action from the networks' outputs on it (`policy` leaves without the env axis,
        [A, ...]): (the action stored for learning [A, ...], the action the env is given [A, ...])."""
        raise NotImplementedError

    def rollout(self, params, acting: Acting, hp: Any, key: jax.Array, update_step: jax.Array):
        """T steps of this device's n envs from `acting`. Returns (acting after, steps [n, T, ...] to store,
        episode sums). A step stores obs, action, reward (times hp.reward_scale), next_obs (the final one where
        an episode ended), terminated, done and first; legal actions (mask, next_mask) where the env has them;
        the global state (state, next_state) when `stores_global_state`."""
        s = self.settings
        step_keys = jax.random.split(key, s.num_steps)
        env_keys = mesh_lib.local_share(jax.vmap(lambda k: jax.random.split(k, s.num_envs))(step_keys), axis=1)
        act_keys = jax.vmap(lambda k: mesh_lib.per_item_keys(jax.random.fold_in(k, 1), self.num_local_envs))(step_keys)

        def step(acting: Acting, xs):
            env_key, act_key = xs
            policy = self.policy.step(params, self.env, acting.env_state, acting.obs, acting.carry, acting.first)
            action, env_action = jax.vmap(self.act, (0, 0, None, None))(act_key, policy, hp, update_step)
            next_obs, env_state, reward, done, info = self.env.batch_step(env_key, acting.env_state, env_action)
            ended = info["returned_episode"]
            stored = {"obs": acting.obs, "action": action, "reward": reward * hp.reward_scale,
                      "next_obs": info["final_obs"], "terminated": ended & ~info["truncated"], "done": ended,
                      "first": acting.first}
            if self.agent_env.has_action_masks:  # legal actions where the step was taken and in the next obs
                stored["mask"] = policy.mask
                stored["next_mask"] = jax.vmap(self.agent_env.avail_actions)(info["final_state"])
            if self.stores_global_state:
                stored["state"] = policy.global_state
                stored["next_state"] = jax.vmap(self.agent_env.global_state)(info["final_state"])
            episode = {"episode_return_sum": jnp.where(ended, info["episode_return"].mean(-1), 0.0),
                       "episode_length_sum": jnp.where(ended, info["episode_length"], 0), "episodes": ended}
            if self.policy.reports_wins:
                episode["win_rate_sum"] = ended & info["won"]
            return Acting(env_state, next_obs, policy.carry, ended), (stored, episode)

        acting, (steps, episode) = jax.lax.scan(step, acting, (env_keys, act_keys))
        return acting, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps), jax.tree.map(jnp.sum, episode)

# -------------------------------------------------------------------------------------------------
# Learning from a replay buffer


# The stored leaves that hold observations (and global states): `store_dtype` keeps the floating-point ones, which
# come back as float32 when sampled.
STORED_OBSERVATIONS = ("obs", "next_obs", "state", "next_state")
STORE_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ReplaySettings(EnvSettings):
    """Static sizes and choices of a replay learner (EnvSettings' num_epochs / num_minibatches are unused)."""

    buffer_size: int = knob("replay.buffer_size", 50_000, "env steps kept per run, over all its envs", minimum=1)
    replay_batch: int = knob("replay.batch_size", 128, "sequences per gradient step, over all envs (a multiple of "
                             "num_envs)", minimum=1)
    gradient_steps: int = knob("replay.gradient_steps", 1, "gradient steps per update (num_steps x num_envs env "
                               "steps)", minimum=1)
    learning_starts: int = knob("replay.learning_starts", 1_000, "env steps per run before training starts",
                                minimum=0)
    sequence_length: int = 1  # steps per sampled sequence
    prioritised: bool = knob("replay.prioritised", False, "sample by priority (proportional, Schaul et al. 2016) "
                             "rather than uniformly")
    target_every: int = knob("target.every", 1, "gradient steps between target-network updates", minimum=1)
    # float16 halves the buffer's memory (SMAX's observations lie in [-1, 1]: errors below 2.5e-4)
    store_dtype: str = knob("replay.store_dtype", "float32", "what observations and global states are stored as",
                            choices=STORE_DTYPES)

    @property
    def buffer_steps_per_env(self) -> int:
        return self.buffer_size // self.num_envs


def cast_observations(items: dict, dtype: str) -> dict:
    """`items` (a step, a rollout's steps or a sample, as the buffer keys them) with its floating-point
    observation leaves (STORED_OBSERVATIONS) cast to `dtype`: to the buffer's dtype when stored, back to float32
    when sampled. Integer and boolean observations stay as they are."""
    cast = lambda k, v: k in STORED_OBSERVATIONS and jnp.issubdtype(v.dtype, jnp.floating)  # noqa: E731
    return {k: v.astype(dtype) if cast(k, v) else v for k, v in items.items()}


@struct.dataclass
class ReplayState:
    """Everything needed to continue training exactly. Leaves carry a leading run axis [R, ...]."""

    params: Any
    target_params: Any
    opt_state: Any
    buffer: replay.Buffer  # items [R, N, C, ...]
    acting: Acting  # [R, N, ...]
    key: jax.Array  # [R, 2]
    update_step: jax.Array  # [R] int32


class ReplayLearner(OffPolicyLearner):
    """Each update: a rollout (`rollout`), its steps added to the buffer, then `settings.gradient_steps` gradient
    steps (`_train`), which leave the learned state unchanged until `learning_starts` env steps have been
    taken and every row holds a sequence. A subclass supplies `act`, `init_learned(key, obs, env_state)` and
    `_train`."""

    settings: ReplaySettings

    def stored_step(self, acting: Acting) -> dict:
        """One env's stored step (zeros shaped like the rollout's, `rollout`) from the envs of `acting`."""
        A, dist, obs = self.num_agents, self.policy.dist, acting.obs
        if self.discrete:
            action = jnp.zeros((A,), jnp.int32)
        else:
            action = jnp.zeros((A, dist.action_dim), jnp.float32)
        step = {"obs": obs[0], "action": action, "reward": jnp.zeros((A,)), "next_obs": obs[0],
                "terminated": jnp.zeros((), bool), "done": jnp.zeros((), bool), "first": jnp.zeros((), bool)}
        if self.agent_env.has_action_masks:
            step["mask"] = step["next_mask"] = jnp.zeros((A, dist.num_actions), bool)
        if self.stores_global_state:
            step["state"] = step["next_state"] = self.policy.global_state(self.env, acting.env_state)[0]
        return cast_observations(step, self.settings.store_dtype)

    def init_learned(self, key: jax.Array, obs: jax.Array, env_state: Any) -> tuple:
        """(params, target_params, opt_state) of a new run."""
        raise NotImplementedError

    def init(self, key: jax.Array) -> ReplayState:
        param_key, env_key, state_key = jax.random.split(key, 3)
        s = self.settings
        acting = self.start_acting(env_key)
        buffer = replay.init(self.stored_step(acting), s.num_envs, s.buffer_steps_per_env, s.prioritised)
        return ReplayState(*self.init_learned(param_key, acting.obs, acting.env_state), buffer, acting, state_key,
                           jnp.int32(0))

    def chunk_specs(self, state: ReplayState) -> ReplayState:
        split = P(RUN_AXIS, DATA_AXIS)
        buffer = replay.Buffer(jax.tree.map(lambda _: split, state.buffer.items),
                               None if state.buffer.priorities is None else split, RUNS, RUNS)
        return ReplayState(params=RUNS, target_params=RUNS, opt_state=RUNS, buffer=buffer, acting=split, key=RUNS,
                           update_step=RUNS)

    def _train(self, state: ReplayState, buffer: replay.Buffer, hp: Any, key: jax.Array):
        """The update's gradient steps: ((params, target_params, opt_state), buffer with new priorities,
        metrics averaged over the steps)."""
        raise NotImplementedError

    def sample_batch(self, buffer: replay.Buffer, key: jax.Array, alpha=0.6, beta=0.4) -> tuple[dict, replay.Sample]:
        """This device's share of a batch: ({"items": leaves [B, L, ...], "weights": [B]}, the sample), B =
        replay_batch / num_envs per env of this device, L = sequence_length. `alpha`, `beta`: prioritised replay's."""
        s = self.settings
        sample = replay.sample(buffer, key, s.replay_batch // s.num_envs, s.sequence_length, alpha, beta)
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731  [n, k, ...] -> [n k, ...]
        items = cast_observations(jax.tree.map(flat, sample.items), "float32")
        return {"items": items, "weights": flat(sample.weights)}, sample

    @property
    def learned_steps_per_sequence(self) -> int:
        """How many steps of a sampled sequence a gradient step learns from (the replay ratio counts them)."""
        return 1

    def target_due(self, count: jax.Array) -> jax.Array:
        """Whether gradient step `count` (counted over the run) moves the target network."""
        return (count + 1) % self.settings.target_every == 0

    def gradient_counts(self, update_step: jax.Array) -> jax.Array:
        """[G] the run-wide indices of this update's gradient steps."""
        G = self.settings.gradient_steps
        return update_step * G + jnp.arange(G)

    def _update(self, state: ReplayState, hp: Any):
        s = self.settings
        key, rollout_key, train_key = jax.random.split(state.key, 3)
        acting, steps, episode = self.rollout(state.params, state.acting, hp, rollout_key, state.update_step)
        buffer = replay.add(state.buffer, cast_observations(steps, s.store_dtype))
        learned, trained_buffer, aux = self._train(state, buffer, hp, train_key)
        env_steps = (state.update_step + 1) * s.num_steps * s.num_envs
        ready = (env_steps >= s.learning_starts) & (replay.num_starts(buffer, s.sequence_length) > 0)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ready, a, b), new, old)  # noqa: E731
        params, target_params, opt_state = keep(learned, (state.params, state.target_params, state.opt_state))
        buffer = buffer.replace(priorities=keep(trained_buffer.priorities, buffer.priorities))
        metrics = {**aux, "buffer_fill": replay.fill(buffer),
                   "replay_ratio": jnp.float32(s.gradient_steps * s.replay_batch * self.learned_steps_per_sequence
                                               / (s.num_steps * s.num_envs)),
                   "learning": ready.astype(jnp.float32), **self.exploration_metrics(hp, state.update_step)}
        metrics.update(jax.lax.psum(episode, DATA_AXIS))
        state = ReplayState(params, target_params, opt_state, buffer, acting, key, state.update_step + 1)
        return state, metrics

    def exploration_metrics(self, hp: Any, update_step: jax.Array) -> dict:
        """What the learner logs about its exploration (e.g. epsilon)."""
        return {}


# -------------------------------------------------------------------------------------------------
# From a config


TAU = Knob("target.tau", 0.005, "target <- tau * online + (1 - tau) * target at each target update; 1: a copy",
           traced=True, minimum=0.0, maximum=1.0)
PRIORITY_ALPHA = Knob("replay.priority_alpha", 0.6, "prioritised replay: P proportional to priority^alpha",
                      traced=True, minimum=0.0)
PRIORITY_BETA = Knob("replay.priority_beta", 0.4, "prioritised replay: importance weights (N P)^-beta",
                     traced=True, minimum=0.0, maximum=1.0)

OFF_POLICY_KNOBS = (NUM_ENVS, NUM_STEPS, ENV_NAME, ENV_KWARGS, RESET_RATIO, GAMMA, REWARD_SCALE)


def off_policy_config(name: str) -> ConfigDict:
    """The keys every off-policy learner reads (envs, gamma); the learner adds its network and its own."""
    config = config_lib.base_config()
    config.algorithm = name
    config.num_steps = 4
    return knobs.fill(config, *OFF_POLICY_KNOBS)


def off_policy_settings(config: ConfigDict) -> dict:
    """EnvSettings fields every off-policy learner reads."""
    o = config.optim
    return dict(num_envs=config.num_envs, num_steps=config.num_steps,
                num_updates=config.total_steps // (config.num_envs * config.num_steps), schedule=o.schedule,
                warmup_updates=o.warmup_updates, adam_eps=o.adam_eps, weight_decay=o.weight_decay > 0,
                grad_clip=o.grad_clip, xla_options=config_lib.xla_options(config), reset_ratio=config.env.reset_ratio)


def check_off_policy_config(config: ConfigDict) -> None:
    if config.env.name not in envs.registered():
        raise ValueError(f"unknown config.env.name {config.env.name!r}; known environments: "
                         f"{', '.join(envs.registered())}")
    batch = config.num_envs * config.num_steps
    if config.total_steps < batch:
        raise ValueError(f"total_steps = {config.total_steps} is less than one update (num_envs * num_steps = {batch})")


def replay_config() -> ConfigDict:
    """config.replay: the buffer and how much is learned from it (`ReplaySettings`, the priorities' exponents)."""
    return knobs.defaults(ReplaySettings, PRIORITY_ALPHA, PRIORITY_BETA).replay


def check_replay_config(config: ConfigDict, sequence_length: int = 1, sequence_key: str = "returns.n_step") -> None:
    r = config.replay
    if r.batch_size % config.num_envs:
        raise ValueError(f"config.replay.batch_size = {r.batch_size} must be a multiple of num_envs = "
                         f"{config.num_envs}: every env gives batch_size / num_envs samples")
    if r.buffer_size % config.num_envs or r.buffer_size // config.num_envs < max(config.num_steps, sequence_length):
        raise ValueError(f"config.replay.buffer_size = {r.buffer_size} must be a multiple of num_envs = "
                         f"{config.num_envs} holding at least num_steps and {sequence_key} steps per env")
