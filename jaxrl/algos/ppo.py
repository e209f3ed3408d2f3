"""Proximal policy optimisation, written for a device mesh and for many seeds at once.

One call of `PPO.run_chunk` runs K updates (K traced: one program for every K) under a single `jax.jit`:

    shard_map over the `data` axis (environments split over devices, parameters replicated)
      vmap over seeds
        lax.fori_loop over K updates:  rollout (lax.scan over T steps) -> GAE -> epochs x minibatches

Shapes: S seeds, N environments (n = N / devices on one device), T steps per rollout.
Numbers a sweep may vary live in `PPOHyperparams` (a pytree); sizes and code-path choices live in
`PPOSettings` (static).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec as P

import envs
from jaxrl import distributions, losses, mesh as mesh_lib
from jaxrl.advantages import gae
from jaxrl.mesh import DATA_AXIS
from jaxrl.networks import ActorCritic


@struct.dataclass
class PPOHyperparams:
    """Dynamic numbers: traced, so one compiled program serves a whole sweep over them."""

    learning_rate: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5


@dataclasses.dataclass(frozen=True)
class PPOSettings:
    """Static sizes and choices: changing one compiles a new program."""

    num_envs: int = 4
    num_steps: int = 128
    num_epochs: int = 4
    num_minibatches: int = 4
    num_updates: int = 1  # total over the run, for learning-rate annealing
    anneal_lr: bool = True
    normalize_advantages: bool = True
    clip_value: bool = True
    bootstrap_truncation: bool = True
    adam_eps: float = 1e-5
    rollout_unroll: int = 1

    @property
    def batch_size(self) -> int:
        """Environment steps per update, over all devices."""
        return self.num_envs * self.num_steps


@struct.dataclass
class TrainState:
    """Everything needed to continue training exactly. Leaves carry a leading seed axis [S, ...]."""

    params: Any
    opt_state: Any
    env_state: Any  # [S, N, ...]
    obs: jax.Array  # [S, N, obs_dim]
    key: jax.Array  # [S, 2]
    update_step: jax.Array  # [S] int32


@struct.dataclass
class Transition:
    """One rollout step for n local envs: leaves [n, ...] (stacked to [T, n, ...] by the scan)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array
    mask: jax.Array | None
    truncated: jax.Array | None
    final_obs: jax.Array | None


def make_optimizer(hp: PPOHyperparams, learning_rate: jax.Array, adam_eps: float):
    """Adam with global-norm clipping; built inside the trace so that its numbers can be traced."""
    return optax.chain(optax.clip_by_global_norm(hp.max_grad_norm),
                       optax.scale_by_adam(eps=adam_eps),
                       optax.scale(-learning_rate))


def minibatch_block_size(units_per_env: int, num_minibatches: int) -> int:
    """Smallest number of envs whose units split evenly into `num_minibatches` parts."""
    return num_minibatches // math.gcd(units_per_env, num_minibatches)


def deal_minibatches(key: jax.Array, units: Any, num_minibatches: int) -> Any:
    """Shuffle this device's samples and deal them into equal minibatches.

    Envs are grouped in blocks of `minibatch_block_size` consecutive envs; each block's units are
    permuted with a key drawn from the block's global index and dealt evenly to every minibatch.
    Minibatch contents therefore do not depend on how many devices share the envs.

    units: leaves [n, U, ...] (U units per env: time steps, or 1 whole sequence)
    returns leaves [M, n * U / M, ...]
    """
    n, units_per_env = jax.tree.leaves(units)[0].shape[:2]
    block = minibatch_block_size(units_per_env, num_minibatches)
    num_blocks, block_units = n // block, block * units_per_env
    keys = mesh_lib.per_item_keys(key, num_blocks)
    perms = jax.vmap(jax.random.permutation, (0, None))(keys, block_units)  # [blocks, block_units]

    def deal(x):
        x = x.reshape(num_blocks, block_units, *x.shape[2:])
        x = jax.vmap(lambda xb, p: xb[p])(x, perms)
        x = x.reshape(num_blocks, num_minibatches, block_units // num_minibatches, *x.shape[2:])
        x = jnp.swapaxes(x, 0, 1)
        return x.reshape(num_minibatches, -1, *x.shape[3:])

    return jax.tree.map(deal, units)


def global_mean(x: jax.Array) -> jax.Array:
    """Mean over every device's share (shares are equal in size)."""
    return jax.lax.pmean(jnp.mean(x), DATA_AXIS)


def normalize(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / (std + eps) with statistics over the global minibatch."""
    mean = global_mean(x)
    var = global_mean(jnp.square(x)) - jnp.square(mean)
    return (x - mean) / (jnp.sqrt(jnp.maximum(var, 0.0)) + eps)


class PPO:
    """Single-agent PPO with separate actor and critic MLPs over a vectorised environment."""

    def __init__(self, env: envs.Environment, network, settings: PPOSettings, mesh=None,
                 eval_max_steps: int = 1000):
        self.base_env = env
        self.env = envs.EpisodeStatistics(envs.AutoReset(env))
        self.network = network
        self.settings = settings
        self.mesh = mesh if mesh is not None else mesh_lib.make_mesh()
        self.eval_max_steps = eval_max_steps
        mesh_lib.check_divisible("num_envs", settings.num_envs, self.mesh)
        self.num_local_envs = settings.num_envs // self.mesh.shape[DATA_AXIS]
        block = minibatch_block_size(settings.num_steps, settings.num_minibatches)
        if self.num_local_envs % block:
            raise ValueError(
                f"num_envs * num_steps = {settings.batch_size} cannot be split into num_minibatches="
                f"{settings.num_minibatches} equal minibatches on each of {self.mesh.shape[DATA_AXIS]} "
                f"devices: the envs on one device ({self.num_local_envs}) must be a multiple of {block}")
        self._chunk_fn = None
        self.compile_seconds = 0.0  # of `run_chunk`, for logs and benchmarks

    # ----------------------------------------------------------------------------------------------
    # Initial state

    def init(self, key: jax.Array) -> TrainState:
        """A fresh TrainState for one seed (no seed axis)."""
        param_key, env_key, state_key = jax.random.split(key, 3)
        reset_keys = jax.random.split(env_key, self.settings.num_envs)
        obs, env_state = jax.vmap(self.env.reset)(reset_keys)
        params = self.network.init(param_key, obs[:1])
        optimizer = make_optimizer(PPOHyperparams(), 0.0, self.settings.adam_eps)
        return TrainState(params, optimizer.init(params), env_state, obs, state_key, jnp.int32(0))

    def state_shardings(self, state: TrainState) -> TrainState:
        """NamedShardings for a seeded TrainState: env axis split over devices, the rest replicated."""
        specs = self._state_specs()
        return jax.tree.map(lambda spec, leaf: NamedSharding(self.mesh, spec), specs, state,
                            is_leaf=lambda x: isinstance(x, P))

    def _state_specs(self) -> TrainState:
        split = P(None, DATA_AXIS)  # [S, N, ...]: seeds whole, envs over devices
        return TrainState(params=P(), opt_state=P(), env_state=split, obs=split, key=P(), update_step=P())

    def init_seeds(self, seed: int, num_seeds: int) -> TrainState:
        """TrainState with a leading seed axis [S], placed on the mesh."""
        keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(seed), jnp.arange(num_seeds))
        # Seeds one after another (lax.map, not vmap) on one device, then placed on the mesh: a batched
        # QR (the orthogonal initialiser under vmap) can deadlock XLA:CPU's LAPACK thread pool (jaxlib
        # 0.10.2, seen on 1 and on 8 devices), and a replicated init would run it on every device.
        state = jax.jit(lambda keys: jax.lax.map(self.init, keys))(keys)
        return jax.device_put(state, self.state_shardings(state))

    # ----------------------------------------------------------------------------------------------
    # One update on this device's share of the envs (inside shard_map, one seed)

    def _policy(self, params, obs, env_state):
        logits, value = self.network.apply(params, obs)
        mask = jax.vmap(self.env.avail_actions)(env_state) if self.base_env.has_action_masks else None
        return distributions.masked_logits(logits, mask), value, mask

    def _rollout(self, params, env_state, obs, key):
        s = self.settings
        # All randomness of the rollout drawn up front in a few batched ops rather than T small ones:
        # for every step, a key per env and Gumbel noise per env and action, drawn for all N envs
        # and sliced to this device's share, so that each env gets the same numbers on any mesh.
        step_keys = jax.random.split(key, s.num_steps)
        env_keys = jax.vmap(lambda k: jax.random.split(k, s.num_envs))(step_keys)  # [T, N, 2]
        action_noise = jax.vmap(lambda k: jax.random.gumbel(
            jax.random.fold_in(k, 1), (s.num_envs, self.base_env.num_actions)))(step_keys)  # [T, N, A]
        env_keys, action_noise = (mesh_lib.local_share(x, axis=1) for x in (env_keys, action_noise))

        def step(carry, xs):
            env_state, obs = carry
            env_key, noise = xs
            logits, value, mask = self._policy(params, obs, env_state)
            action = distributions.sample_with_noise(logits, noise)
            next_obs, env_state, reward, done, info = jax.vmap(self.env.step)(env_key, env_state, action)
            bootstrap = s.bootstrap_truncation
            transition = Transition(
                obs=obs, action=action, log_prob=distributions.log_prob(logits, action), value=value,
                reward=reward, done=done, mask=mask,
                truncated=info["truncated"] if bootstrap else None,
                final_obs=info["final_obs"] if bootstrap else None)
            episode = (jnp.where(info["returned_episode"], info["episode_return"], 0.0),
                       jnp.where(info["returned_episode"], info["episode_length"], 0),
                       info["returned_episode"])
            return (env_state, next_obs), (transition, episode)

        (env_state, obs), (traj, episode) = jax.lax.scan(
            step, (env_state, obs), (env_keys, action_noise), unroll=s.rollout_unroll)
        return env_state, obs, traj, episode

    def _loss(self, params, batch, hp: PPOHyperparams):
        logits, values = self.network.apply(params, batch["obs"])
        logits = distributions.masked_logits(logits, batch["mask"])
        log_ratio = distributions.log_prob(logits, batch["action"]) - batch["log_prob"]
        advantages = batch["advantages"]
        if self.settings.normalize_advantages:
            advantages = normalize(advantages)
        policy_loss = jnp.mean(losses.ppo_clip_loss(log_ratio, advantages, hp.clip_eps))
        clip = hp.clip_eps if self.settings.clip_value else None
        value_loss = jnp.mean(losses.value_loss(values, batch["value"], batch["targets"], clip))
        entropy = jnp.mean(distributions.entropy(logits))
        total = policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy
        aux = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
               "approx_kl": jnp.mean(jnp.expm1(log_ratio) - log_ratio),
               "clip_fraction": jnp.mean(losses.clip_fraction(log_ratio, hp.clip_eps))}
        return total, aux

    def _learning_rate(self, hp: PPOHyperparams, update_step: jax.Array) -> jax.Array:
        if not self.settings.anneal_lr:
            return hp.learning_rate
        return hp.learning_rate * (1.0 - update_step / self.settings.num_updates)

    def _update(self, state: TrainState, hp: PPOHyperparams):
        """One PPO update for one seed on this device's envs: returns (state, metrics)."""
        s = self.settings
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        env_state, obs, traj, episode = self._rollout(state.params, state.env_state, state.obs, rollout_key)

        _, last_value = self.network.apply(state.params, obs)
        reward = traj.reward
        if s.bootstrap_truncation:  # a time limit is not a terminal state: add the value it cut off
            _, final_value = self.network.apply(state.params, traj.final_obs)
            reward = reward + hp.gamma * final_value * traj.truncated
        advantages, targets = gae(reward, traj.value, traj.done, last_value, hp.gamma, hp.gae_lambda)

        samples = {"obs": traj.obs, "action": traj.action, "log_prob": traj.log_prob, "value": traj.value,
                   "mask": traj.mask, "advantages": advantages, "targets": targets}
        samples = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), samples)  # [n, T, ...]
        optimizer = make_optimizer(hp, self._learning_rate(hp, state.update_step), s.adam_eps)
        grad_fn = jax.grad(self._loss, has_aux=True)

        def minibatch_step(carry, batch):
            params, opt_state = carry
            grads, aux = grad_fn(params, batch, hp)
            grads, aux = jax.lax.pmean((grads, aux), DATA_AXIS)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), aux

        def epoch(carry, key):
            minibatches = deal_minibatches(key, samples, s.num_minibatches)
            return jax.lax.scan(minibatch_step, carry, minibatches)

        (params, opt_state), aux = jax.lax.scan(epoch, (state.params, state.opt_state),
                                                jax.random.split(epoch_key, s.num_epochs))
        returns, lengths, ended = jax.lax.psum(
            (episode[0].sum(), episode[1].sum(), episode[2].sum()), DATA_AXIS)
        metrics = jax.tree.map(jnp.mean, aux)
        metrics.update(episode_return_sum=returns, episode_length_sum=lengths, episodes=ended)
        state = TrainState(params, opt_state, env_state, obs, key, state.update_step + 1)
        return state, metrics

    # ----------------------------------------------------------------------------------------------
    # K updates for every seed, compiled once per K

    def _run_updates(self, state: TrainState, hp: PPOHyperparams, num_updates: jax.Array):
        """`num_updates` (traced) updates: one compiled program serves every chunk length."""
        _, shapes = jax.eval_shape(self._update, state, hp)
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

        def body(_, carry):
            state, totals = carry
            state, metrics = self._update(state, hp)
            return state, jax.tree.map(jnp.add, totals, metrics)

        state, totals = jax.lax.fori_loop(0, num_updates, body, (state, zeros))
        sums = ("episode_return_sum", "episode_length_sum", "episodes")
        return state, {k: v if k in sums else v / num_updates for k, v in totals.items()}

    def run_chunk(self, state: TrainState, hp: PPOHyperparams, num_updates: int):
        """Run `num_updates` updates for every seed; returns (state, metrics with leaves [S]).

        Compiles on the first call (the seconds it took are kept in `compile_seconds`).
        """
        num_updates = jnp.int32(num_updates)
        if self._chunk_fn is None:
            specs = self._state_specs()
            local = jax.vmap(self._run_updates, (0, None, None))
            sharded = jax.shard_map(local, mesh=self.mesh, in_specs=(specs, P(), P()), out_specs=(specs, P()))
            shardings, replicated = self.state_shardings(state), mesh_lib.replicated(self.mesh)
            jitted = jax.jit(sharded, in_shardings=(shardings, replicated, replicated),
                             out_shardings=(shardings, replicated), donate_argnums=0)
            tick = time.perf_counter()
            self._chunk_fn = jitted.lower(state, hp, num_updates).compile()
            self.compile_seconds = time.perf_counter() - tick
        return self._chunk_fn(state, hp, num_updates)

    # ----------------------------------------------------------------------------------------------
    # Greedy evaluation

    @functools.partial(jax.jit, static_argnums=(0, 3))
    def evaluate(self, params, key: jax.Array, num_envs: int):
        """Greedy actions, one episode per env, for every seed: {eval_return, eval_length} [S]."""

        def one_seed(params, key):
            reset_key, step_key = jax.random.split(key)
            obs, env_state = jax.vmap(self.base_env.reset)(jax.random.split(reset_key, num_envs))

            def step(carry, key):
                obs, env_state, alive, ret, length = carry
                logits, _ = self.network.apply(params, obs)
                if self.base_env.has_action_masks:
                    mask = jax.vmap(self.base_env.avail_actions)(env_state)
                    logits = distributions.masked_logits(logits, mask)
                action = distributions.greedy(logits)
                keys = jax.random.split(key, num_envs)
                obs, env_state, reward, done, info = jax.vmap(self.base_env.step)(keys, env_state, action)
                ret = ret + reward * alive
                length = length + alive
                alive = alive & ~envs.episode_over(done, info)
                return (obs, env_state, alive, ret, length), None

            init = (obs, env_state, jnp.ones(num_envs, bool), jnp.zeros(num_envs), jnp.zeros(num_envs, jnp.int32))
            (_, _, _, ret, length), _ = jax.lax.scan(step, init, jax.random.split(step_key, self.eval_max_steps))
            return {"eval_return": ret.mean(), "eval_length": length.mean()}

        return jax.vmap(one_seed)(params, jax.random.split(key, jax.tree.leaves(params)[0].shape[0]))
