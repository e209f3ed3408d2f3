"""Acting in auto-resetting envs and learning from a replay buffer, as functions the off-policy learners share.
They take the family's `learner`, any object with:

    policy    what an agent sees and one step of its network: `step(params, env, env_state, obs, carry, first)`
              -> a step with `policy_out`, `carry`, `mask`, `global_state`; `network` (`initial_carry`),
              `num_agents`, `dist`, `agent_env`, `critic_input`, `global_state(env, env_states)` and
              `episode_sums(ended, info)` (the training episode statistics of a step)
    envs      `env` (auto-resetting, with episode statistics: `reset`, `batch_step`) and `local_envs`, this
              device's share of the envs
    settings  `num_envs`, `num_steps` and, learning from a buffer, `replay` (`buffer_size`, `replay_batch`,
              `gradient_steps`, `learning_starts`, `prioritised`, `target_every`, `store_dtype`,
              `sequence_length`)
    act       (key, one env's policy step, hp, update_step) -> (action stored, action the env is given)
    train     learning from a buffer: (state, buffer, hp, key) -> ((params, target_params, opt_state), buffer,
              metrics)

One replay update, for one run on this device's n envs (`replay_update`):

    `rollout`: T steps of every env -> `replay.add` (observations as replay.store_dtype) -> `train`, the learner's
    gradient steps on batches from `sample_batch`, kept once `learning_starts` env steps have been taken and
    every row holds a sequence

Envs are seen with an agent axis: in a multi-agent env every agent acts with the shared network. Shapes: n envs on
this device, A agents, T steps per update, d observation size, B sequences of L steps in a batch.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import PartitionSpec as P

from jaxrl import mesh as mesh_lib, replay
from jaxrl.mesh import DATA_AXIS, RUN_AXIS, RUNS

# The stored leaves that hold observations (and global states): `store_dtype` keeps the floating-point ones, which
# come back as float32 when sampled.
STORED_OBSERVATIONS = ("obs", "next_obs", "state", "next_state")


@struct.dataclass
class Acting:
    """Where a run's envs and its acting network stand between updates (in a state: leaves [R, N, ...])."""

    env_state: Any  # [N, ...]
    obs: jax.Array  # [N, A, d]
    carry: Any  # the network's hidden state, [N, A, H] leaves (() for feed-forward networks)
    first: jax.Array  # [N] bool: obs is the first of its episode (the hidden state restarts there)


def start(learner, key: jax.Array) -> Acting:
    """One run's envs (settings.num_envs of them), reset, and the network's initial hidden state."""
    n, policy = learner.settings.num_envs, learner.policy
    obs, env_state = jax.vmap(learner.envs.env.reset)(jax.random.split(key, n))
    return Acting(env_state, obs, policy.network.initial_carry((n, policy.num_agents)), jnp.ones((n,), bool))


def step_env_keys(step_keys: jax.Array, num_env_keys: int) -> jax.Array:
    """This device's share [T, n, 2] of `num_env_keys` env keys (one per env, or per group) per step key [T, 2],
    drawn for every env and sliced, so that each env gets the same keys on any mesh."""
    return mesh_lib.local_share(jax.vmap(lambda k: jax.random.split(k, num_env_keys))(step_keys), axis=1)


def rollout(learner, params, acting: Acting, hp: Any, key: jax.Array, update_step: jax.Array):
    """T = settings.num_steps steps of this device's n envs from `acting`, acting by `learner.act` (actions
    [A, ...] per env). Returns (acting after, steps [n, T, ...] to store, episode sums over the run's envs on
    every device). A step stores obs, action, reward (times hp.reward_scale), next_obs (the final one where an
    episode ended), terminated, done and first; legal actions (mask, next_mask) where the env has them; the
    global state (state, next_state) when the policy's critic reads it (a mixing network or a centralised critic)."""
    policy, envs, s = learner.policy, learner.envs, learner.settings
    agent_env, env = policy.agent_env, envs.env
    step_keys = jax.random.split(key, s.num_steps)
    env_keys = step_env_keys(step_keys, s.num_envs)
    act_keys = jax.vmap(lambda k: mesh_lib.per_item_keys(jax.random.fold_in(k, 1), envs.local_envs))(step_keys)

    def step(acting: Acting, xs):
        env_key, act_key = xs
        out = policy.step(params, env, acting.env_state, acting.obs, acting.carry, acting.first)
        action, env_action = jax.vmap(learner.act, (0, 0, None, None))(act_key, out, hp, update_step)
        next_obs, env_state, reward, done, info = env.batch_step(env_key, acting.env_state, env_action)
        ended = info["returned_episode"]
        stored = {"obs": acting.obs, "action": action, "reward": reward * hp.reward_scale,
                  "next_obs": info["final_obs"], "terminated": ended & ~info["truncated"], "done": ended,
                  "first": acting.first}
        if agent_env.has_action_masks:  # legal actions where the step was taken and in the next obs
            stored["mask"] = out.mask
            stored["next_mask"] = jax.vmap(agent_env.avail_actions)(info["final_state"])
        if policy.critic_input == "global_state":
            stored["state"] = out.global_state
            stored["next_state"] = jax.vmap(agent_env.global_state)(info["final_state"])
        return Acting(env_state, next_obs, out.carry, ended), (stored, policy.episode_sums(ended, info))

    acting, (steps, episode) = jax.lax.scan(step, acting, (env_keys, act_keys))
    episode = jax.lax.psum(jax.tree.map(jnp.sum, episode), DATA_AXIS)
    return acting, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps), episode


# -------------------------------------------------------------------------------------------------
# Learning from a replay buffer


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


def cast_observations(items: dict, dtype: str) -> dict:
    """`items` (a step, a rollout's steps or a sample, as the buffer keys them) with its floating-point
    observation leaves (STORED_OBSERVATIONS) cast to `dtype`: to the buffer's dtype when stored, back to float32
    when sampled. Integer and boolean observations stay as they are."""
    cast = lambda k, v: k in STORED_OBSERVATIONS and jnp.issubdtype(v.dtype, jnp.floating)  # noqa: E731
    return {k: v.astype(dtype) if cast(k, v) else v for k, v in items.items()}


def stored_step(learner, acting: Acting) -> dict:
    """One env's stored step (zeros shaped like `rollout`'s) from the envs of `acting`."""
    policy = learner.policy
    A, dist, obs = policy.num_agents, policy.dist, acting.obs
    if hasattr(dist, "num_actions"):  # discrete actions
        action = jnp.zeros((A,), jnp.int32)
    else:
        action = jnp.zeros((A, dist.action_dim), jnp.float32)
    step = {"obs": obs[0], "action": action, "reward": jnp.zeros((A,)), "next_obs": obs[0],
            "terminated": jnp.zeros((), bool), "done": jnp.zeros((), bool), "first": jnp.zeros((), bool)}
    if policy.agent_env.has_action_masks:
        step["mask"] = step["next_mask"] = jnp.zeros((A, dist.num_actions), bool)
    if policy.critic_input == "global_state":
        step["state"] = step["next_state"] = policy.global_state(learner.envs.env, acting.env_state)[0]
    return cast_observations(step, learner.settings.replay.store_dtype)


def init_replay(learner, init_learned, key: jax.Array) -> ReplayState:
    """A new run's state: its envs reset, an empty buffer, and `init_learned(key, obs [n, A, d], env states)`'s
    (params, target_params, opt_state)."""
    param_key, env_key, state_key = jax.random.split(key, 3)
    n, r = learner.settings.num_envs, learner.settings.replay
    acting = start(learner, env_key)
    buffer = replay.init(stored_step(learner, acting), n, r.buffer_size // n, r.prioritised)
    return ReplayState(*init_learned(param_key, acting.obs, acting.env_state), buffer, acting, state_key, jnp.int32(0))


def replay_specs(state: ReplayState) -> ReplayState:
    """The state's PartitionSpecs: the buffer and the envs split over the data axis, the rest over runs only."""
    split = P(RUN_AXIS, DATA_AXIS)
    buffer = replay.Buffer(jax.tree.map(lambda _: split, state.buffer.items),
                           None if state.buffer.priorities is None else split, RUNS, RUNS)
    return ReplayState(params=RUNS, target_params=RUNS, opt_state=RUNS, buffer=buffer, acting=split, key=RUNS,
                       update_step=RUNS)


def sample_batch(settings, buffer: replay.Buffer, key: jax.Array, alpha, beta) -> tuple[dict, replay.Sample]:
    """This device's share of a batch: ({"items": leaves [B, L, ...], "weights": [B]}, the sample), B =
    replay.batch_size / num_envs per env of this device, L = replay.sequence_length. `alpha`, `beta`: prioritised
    replay's exponents (hp.priority_alpha, hp.priority_beta; a uniform buffer ignores them)."""
    r = settings.replay
    sample = replay.sample(buffer, key, r.replay_batch // settings.num_envs, r.sequence_length, alpha, beta)
    flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731  [n, k, ...] -> [n k, ...]
    items = cast_observations(jax.tree.map(flat, sample.items), "float32")
    return {"items": items, "weights": flat(sample.weights)}, sample


def reprioritised(buffer: replay.Buffer, sample: replay.Sample, td_errors: jax.Array) -> replay.Buffer:
    """`buffer` with the sampled starts' priorities set from |TD| [B, ...] (the mean over each sample's steps and
    agents), this device's own before the gradient step (the loss's are averaged over devices)."""
    return replay.update_priorities(buffer, sample.columns, per_sample(td_errors).reshape(sample.columns.shape))


def per_sample(x: jax.Array) -> jax.Array:
    """[B, ...] -> [B]: the mean over each sample's steps and agents."""
    return x.reshape(x.shape[0], -1).mean(-1)


def gradient_counts(settings, update_step: jax.Array) -> jax.Array:
    """[G] the run-wide indices of this update's gradient steps."""
    G = settings.replay.gradient_steps
    return update_step * G + jnp.arange(G)


def moved_target(settings, params, target_params, tau, count: jax.Array):
    """The target parameters after gradient step `count` (counted over the run): moved towards `params` by `tau`
    every `target.every` steps, else unchanged."""
    due = (count + 1) % settings.replay.target_every == 0
    return optax.incremental_update(params, target_params, jnp.where(due, tau, 0.0))


def replay_update(learner, state: ReplayState, hp: Any, learned_steps: int = 1, exploration: dict | None = None):
    """One update (see the module's docstring). `learned_steps`: the steps of a sampled sequence a gradient step
    learns from (the replay ratio counts them); `exploration`: metrics of the acting (e.g. epsilon)."""
    s, r = learner.settings, learner.settings.replay
    key, rollout_key, train_key = jax.random.split(state.key, 3)
    acting, steps, episode = rollout(learner, state.params, state.acting, hp, rollout_key, state.update_step)
    buffer = replay.add(state.buffer, cast_observations(steps, r.store_dtype))
    learned, trained_buffer, aux = learner.train(state, buffer, hp, train_key)
    env_steps = (state.update_step + 1) * s.num_steps * s.num_envs
    ready = (env_steps >= r.learning_starts) & (replay.num_starts(buffer, r.sequence_length) > 0)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ready, a, b), new, old)  # noqa: E731
    params, target_params, opt_state = keep(learned, (state.params, state.target_params, state.opt_state))
    buffer = buffer.replace(priorities=keep(trained_buffer.priorities, buffer.priorities))
    ratio = r.gradient_steps * r.replay_batch * learned_steps / (s.num_steps * s.num_envs)
    metrics = {**aux, "buffer_fill": replay.fill(buffer), "replay_ratio": jnp.float32(ratio),
               "learning": ready.astype(jnp.float32), **(exploration or {}), **episode}
    return ReplayState(params, target_params, opt_state, buffer, acting, key, state.update_step + 1), metrics
