"""Proximal policy optimisation, written for a device mesh and for many seeds at once.

One call of `PPO.run_chunk` runs K updates (K traced: one program for every K) under a single `jax.jit`:

    shard_map over the (runs, data) mesh (seeds split over `runs`, environments over `data`, parameters
    replicated along `data`)
      vmap over this device's seeds (each with its own hyperparameters: a sweep is a seed axis)
        lax.fori_loop over K updates:  rollout (lax.scan over T steps) -> GAE -> epochs x minibatches

Shapes: S seeds, N environments (n = N / devices on one device), T steps per rollout, A agents (1 for
single-agent envs), K actions.
Numbers a sweep may vary live in `PPOHyperparams` (a pytree); sizes and code-path choices live in
`PPOSettings` (static).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec as P

import envs
from jaxrl import distributions, losses, mesh as mesh_lib
from jaxrl.advantages import gae
from jaxrl.jitting import jit_method
from jaxrl.mesh import DATA_AXIS, RUN_AXIS, RUNS


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
    critic_input: str = "obs"  # "obs": a value per agent from its own view (IPPO); "global_state" (MAPPO)
    agent_id: str = "both"  # which networks see each agent's one-hot index (parameters are shared): AGENT_ID_INPUTS
    returns_until: str = "episode"  # an agent's returns run to the end of the episode, or stop when it is done
    grad_clip: str = "joint"  # max_grad_norm clips all parameters' gradient together, or each network's alone
    xla_options: tuple[tuple[str, str | bool], ...] = ()  # XLA compile options of the training program

    @property
    def batch_size(self) -> int:
        """Environment steps per update, over all devices."""
        return self.num_envs * self.num_steps


CRITIC_INPUTS = ("obs", "global_state")
AGENT_ID_INPUTS = ("both", "critic", "actor", "none")
# "episode": an agent's advantages and value targets take in every team reward up to the end of the episode,
# also after it died (SMAX rewards dead agents: a sacrifice that wins the battle is credited). "agent_done":
# they stop at the agent's own done flag, as if its death ended its episode.
RETURNS_UNTIL = ("episode", "agent_done")
GRAD_CLIPS = ("joint", "per_network")  # "per_network": actor and critic clipped apart, as two optimisers would


@struct.dataclass
class TrainState:
    """Everything needed to continue training exactly. Leaves carry a leading seed axis [S, ...]."""

    params: Any
    opt_state: Any
    env_state: Any  # [S, N, ...]
    obs: jax.Array  # [S, N, A, obs_dim] (A = 1 for single-agent envs)
    carry: Any  # the network's hidden state, leaves [S, N, A, ...]; () for feed-forward networks
    first: jax.Array  # [S, N] bool: `obs` is the first of an episode (recurrent state restarts)
    key: jax.Array  # [S, 2]
    update_step: jax.Array  # [S] int32


@struct.dataclass
class Transition:
    """One rollout step for n local envs and A agents: leaves [n, A, ...] (stacked to [T, ...] by the scan)."""

    actor_in: jax.Array  # [n, A, d_actor]
    critic_in: jax.Array | None  # [n, A, d_critic]; None when the critic sees the actor's inputs
    first: jax.Array  # [n]
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array  # [n, A]: the step ends this agent's returns (the episode's end, or see `returns_until`)
    mask: jax.Array | None  # [n, A, num_actions]
    truncated: jax.Array | None  # [n]
    final_value: jax.Array | None  # [n, A]: value of the last obs of an episode cut by the time limit


class PolicyStep(NamedTuple):
    """What the networks make of one time step of n envs (see `PPO._policy_step`)."""

    carry: Any  # the hidden state after this step
    actor_in: jax.Array  # [n, A, d_actor]
    critic_in: jax.Array  # [n, A, d_critic] (the same array as actor_in when the critic sees the obs)
    logits: jax.Array  # [n, A, K], illegal actions masked
    value: jax.Array  # [n, A]
    mask: jax.Array | None  # [n, A, K] legal actions, None for envs without masks


def make_optimizer(hp: PPOHyperparams, learning_rate: jax.Array, adam_eps: float, grad_clip: str = "joint"):
    """Adam with gradient-norm clipping; built inside the trace so that its numbers can be traced.

    grad_clip "joint" clips the norm over all parameters; "per_network" clips each network's (the top-level
    modules of a flax params tree, e.g. actor and critic) by itself. Adam is element-wise, so the latter is
    exactly two Adam optimisers, one per network, each with its own clipping.
    """
    clip = (optax.clip_by_global_norm(hp.max_grad_norm) if grad_clip == "joint"
            else clip_each_network(hp.max_grad_norm))
    return optax.chain(clip, optax.scale_by_adam(eps=adam_eps), optax.scale(-learning_rate))


def clip_each_network(max_norm) -> optax.GradientTransformation:
    """Clip the gradient of every top-level module of a flax params tree ({"params": {name: tree}}) to
    global norm `max_norm` on its own."""
    clip = optax.clip_by_global_norm(max_norm)

    def update(updates, state, params=None):
        del params
        networks = {name: clip.update(tree, clip.init(tree))[0] for name, tree in updates["params"].items()}
        return dict(updates, params=networks), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


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


def seed_keys(seed: int, num_seeds: int, num_settings: int = 1) -> jax.Array:
    """[R, 2] with R = num_settings * num_seeds, settings-major: run r trains seed r % num_seeds, and seed s
    of every setting (and of every run with the same `seed`) starts from the same key."""
    keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(seed), jnp.arange(num_seeds))
    return jnp.tile(keys, (num_settings, 1))


def gradient_step(loss_fn, optimizer, params, opt_state, batch, hp):
    """One optimiser step on this device's `batch` (inside shard_map), gradients averaged over devices.

    loss_fn(params, batch, hp) -> (loss, aux). Returns (params, opt_state, aux averaged over devices, with
    `grad_norm` before clipping).
    """
    # Differentiate per device, then average: without the cast, shard_map would already sum the
    # gradients of the replicated parameters over devices (the transpose of broadcasting them).
    grads, aux = jax.grad(loss_fn, has_aux=True)(mesh_lib.varying(params), batch, hp)
    grads, aux = jax.lax.pmean((grads, aux), DATA_AXIS)
    aux = dict(aux, grad_norm=optax.tree.norm(grads))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, aux


def optimise(loss_fn, optimizer, params, opt_state, units, hp, key: jax.Array, num_epochs: int,
             num_minibatches: int):
    """Epochs x minibatches of `gradient_step` on this device's units [n, U, ...] (dealt by
    `deal_minibatches`). Returns (params, opt_state, aux [epochs, minibatches])."""
    def minibatch_step(carry, batch):
        params, opt_state, aux = gradient_step(loss_fn, optimizer, *carry, batch, hp)
        return (params, opt_state), aux

    def epoch(carry, key):
        return jax.lax.scan(minibatch_step, carry, deal_minibatches(key, units, num_minibatches))

    (params, opt_state), aux = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, num_epochs))
    return params, opt_state, aux


def repeat_updates(update, state, hp, num_updates: jax.Array):
    """Apply `update(state, hp) -> (state, metrics)` a traced number of times (one compiled program for
    every chunk length); returns (state, metrics summed over the updates)."""
    _, shapes = jax.eval_shape(update, state, hp)
    zeros = jax.tree.map(mesh_lib.zeros_like_abstract, shapes)

    def body(_, carry):
        state, totals = carry
        state, metrics = update(state, hp)
        return state, jax.tree.map(jnp.add, totals, metrics)

    return jax.lax.fori_loop(0, num_updates, body, (state, zeros))


def global_mean(x: jax.Array) -> jax.Array:
    """Mean over every device's share (shares are equal in size)."""
    return jax.lax.pmean(jnp.mean(x), DATA_AXIS)


def normalize(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / (std + eps) with statistics over the global minibatch."""
    mean = global_mean(x)
    var = global_mean(jnp.square(x)) - jnp.square(mean)
    return (x - mean) / (jnp.sqrt(jnp.maximum(var, 0.0)) + eps)


class PPO:
    """PPO for single- and multi-agent envs, with feed-forward or recurrent actor-critics.

    Single-agent envs are seen with an agent axis of one (`envs.AgentAxis`), so every array below reads
    [..., A, ...]. Agents share parameters; `settings.agent_id` tells them apart. The critic sees each
    agent's own inputs (IPPO) or the env's global state (MAPPO, `critic_input="global_state"`).
    Recurrent networks train on whole rollouts per (env, agent), starting from the hidden state the
    rollout started with and restarting it at episode starts; feed-forward ones on shuffled steps.
    """

    def __init__(self, env: envs.Environment, network, settings: PPOSettings, mesh=None,
                 eval_max_steps: int = 1000):
        for name, known in (("critic_input", CRITIC_INPUTS), ("agent_id", AGENT_ID_INPUTS),
                            ("returns_until", RETURNS_UNTIL), ("grad_clip", GRAD_CLIPS)):
            if getattr(settings, name) not in known:
                raise ValueError(f"unknown {name} {getattr(settings, name)!r}; known: {', '.join(known)}")
        self.base_env = env
        self.agent_env = envs.as_multi_agent(env)
        if settings.critic_input == "global_state" and not hasattr(self.agent_env, "global_state"):
            raise ValueError(f"critic_input='global_state' needs an env with a global state; {env!r} has none "
                             "(use critic_input='obs')")
        self.env = envs.EpisodeStatistics(envs.AutoReset(self.agent_env))
        self.num_agents = self.agent_env.num_agents
        self.reports_wins = "won" in _step_info_keys(self.agent_env)
        self.network = network
        self.recurrent = bool(getattr(network, "recurrent", False))
        self.settings = settings
        self.mesh = mesh if mesh is not None else mesh_lib.make_mesh()
        self.eval_max_steps = eval_max_steps
        mesh_lib.check_divisible("num_envs", settings.num_envs, self.mesh)
        self.num_local_envs = settings.num_envs // self.mesh.shape[DATA_AXIS]
        # Minibatch units per env: whole sequences (one per agent) or single agent-steps.
        units_per_env = self.num_agents * (1 if self.sequence_minibatches else settings.num_steps)
        block = minibatch_block_size(units_per_env, settings.num_minibatches)
        if self.num_local_envs % block:
            unit = "sequences (envs x agents)" if self.sequence_minibatches else "samples (envs x steps x agents)"
            raise ValueError(
                f"the {settings.num_envs * units_per_env} {unit} of an update cannot be split into "
                f"num_minibatches={settings.num_minibatches} equal minibatches on each of "
                f"{self.mesh.shape[DATA_AXIS]} devices: the envs on one device ({self.num_local_envs}) must "
                f"be a multiple of {block}")
        self._chunk_fn = None
        self.compile_seconds = 0.0  # of `run_chunk`, for logs and benchmarks

    @property
    def sequence_minibatches(self) -> bool:
        """Minibatches hold whole (env, agent) sequences (recurrent networks) rather than single agent-steps."""
        return self.recurrent

    # ----------------------------------------------------------------------------------------------
    # What the networks see

    def _inputs(self, obs: jax.Array, global_state: jax.Array | None):
        """obs [..., A, d], global_state [..., G] or None -> (actor_in [..., A, d'], critic_in [..., A, d'']).

        Returns the same array twice when actor and critic see the same inputs (the rollout then stores it once).
        """
        A, ids_for = self.num_agents, self.settings.agent_id
        ids = jnp.broadcast_to(jnp.eye(A, dtype=obs.dtype), (*obs.shape[:-2], A, A)) if A > 1 else None

        def with_id(x, network):
            return x if ids is None or ids_for not in ("both", network) else jnp.concatenate([x, ids], axis=-1)

        actor_in = with_id(obs, "actor")
        if self.settings.critic_input == "obs":
            same_inputs = ids is None or ids_for in ("both", "none")
            return actor_in, actor_in if same_inputs else with_id(obs, "critic")
        shared = jnp.broadcast_to(global_state[..., None, :], (*obs.shape[:-1], global_state.shape[-1]))
        return actor_in, with_id(shared.astype(obs.dtype), "critic")

    def _global_state(self, env, env_states):
        """[n, G] for a batch of `env`'s states when the critic needs it, else None."""
        if self.settings.critic_input != "global_state":
            return None
        return jax.vmap(env.global_state)(env_states)

    def _policy_step(self, params, env, env_state, obs, carry, first) -> PolicyStep:
        """The networks on n envs' current observations, one time step (rollouts, bootstrap values and
        evaluation all go through here). obs [n, A, d], first [n]; `env` is the env whose states these are."""
        actor_in, critic_in = self._inputs(obs, self._global_state(env, env_state))
        mask = jax.vmap(env.avail_actions)(env_state) if env.has_action_masks else None
        first = jnp.broadcast_to(first[:, None], actor_in.shape[:2])
        carry, logits, value = self.network.apply(params, carry, actor_in[None], critic_in[None], first[None])
        return PolicyStep(carry, actor_in, critic_in, distributions.masked_logits(logits[0], mask), value[0], mask)

    # ----------------------------------------------------------------------------------------------
    # Initial state

    def init(self, key: jax.Array) -> TrainState:
        """A fresh TrainState for one seed (no seed axis)."""
        param_key, env_key, state_key = jax.random.split(key, 3)
        N, A = self.settings.num_envs, self.num_agents
        obs, env_state = jax.vmap(self.env.reset)(jax.random.split(env_key, N))
        carry, first = self.network.initial_carry((N, A)), jnp.ones((N,), bool)
        actor_in, critic_in = self._inputs(obs, self._global_state(self.env, env_state))
        params = self.network.init(param_key, carry, actor_in[None], critic_in[None],
                                   jnp.broadcast_to(first[None, :, None], (1, N, A)))
        optimizer = make_optimizer(PPOHyperparams(), 0.0, self.settings.adam_eps, self.settings.grad_clip)
        return TrainState(params, optimizer.init(params), env_state, obs, carry, first, state_key, jnp.int32(0))

    def state_shardings(self, state: TrainState) -> TrainState:
        """NamedShardings for a seeded TrainState: seeds over the runs axis, envs over the data axis."""
        specs = self._state_specs(state)
        return jax.tree.map(lambda spec, leaf: NamedSharding(self.mesh, spec), specs, state,
                            is_leaf=lambda x: isinstance(x, P))

    def _state_specs(self, state: TrainState) -> TrainState:
        split = P(RUN_AXIS, DATA_AXIS)  # [S, N, ...]: seeds over the runs axis, envs over the data axis
        return TrainState(params=RUNS, opt_state=RUNS, env_state=split, obs=split,
                          carry=jax.tree.map(lambda _: split, state.carry), first=split, key=RUNS, update_step=RUNS)

    def init_seeds(self, seed: int, num_seeds: int, num_settings: int = 1) -> TrainState:
        """TrainState with a leading run axis [R = num_settings * num_seeds] (see `seed_keys`), on the mesh."""
        keys = seed_keys(seed, num_seeds, num_settings)
        # Seeds one after another (lax.map, not vmap) on one device, then placed on the mesh: a batched
        # QR (the orthogonal initialiser under vmap) can deadlock XLA:CPU's LAPACK thread pool (jaxlib
        # 0.10.2, seen on 1 and on 8 devices), and a replicated init would run it on every device.
        mesh_lib.check_runs(len(keys), self.mesh)
        state = self._init_runs(keys)
        return jax.device_put(state, self.state_shardings(state))

    @jit_method
    def _init_runs(self, keys: jax.Array) -> TrainState:
        """One state per key [R, 2] (compiled once per algorithm and run count)."""
        return jax.lax.map(self.init, keys)

    # ----------------------------------------------------------------------------------------------
    # One update on this device's share of the envs (inside shard_map, one seed)

    def _rollout(self, params, state: TrainState, key):
        """T steps of n local envs. Returns ((env_state, obs, carry, first) after, trajectory, episode sums)."""
        s, A, K = self.settings, self.num_agents, self.agent_env.num_actions
        # All randomness of the rollout drawn up front in a few batched ops rather than T small ones:
        # for every step, a key per env and Gumbel noise per env, agent and action, drawn for all N envs
        # and sliced to this device's share, so that each env gets the same numbers on any mesh.
        step_keys = jax.random.split(key, s.num_steps)
        env_keys = jax.vmap(lambda k: jax.random.split(k, s.num_envs))(step_keys)  # [T, N, 2]
        action_noise = jax.vmap(lambda k: jax.random.gumbel(
            jax.random.fold_in(k, 1), (s.num_envs, A, K)))(step_keys)  # [T, N, A, K]
        env_keys, action_noise = (mesh_lib.local_share(x, axis=1) for x in (env_keys, action_noise))

        def step(carry, xs):
            env_state, obs, net_carry, first = carry
            env_key, noise = xs
            policy = self._policy_step(params, self.env, env_state, obs, net_carry, first)
            action = distributions.sample_with_noise(policy.logits, noise)
            next_obs, env_state, reward, done, info = jax.vmap(self.env.step)(env_key, env_state, action)
            final_value = None
            if s.bootstrap_truncation:  # the critic's value of the obs a time limit cut off
                final_value = self._policy_step(params, self.agent_env, info["final_state"], info["final_obs"],
                                                policy.carry, jnp.zeros_like(first)).value
            ended = info["returned_episode"]
            if s.returns_until == "episode":
                done = jnp.broadcast_to(ended[:, None], done.shape)
            transition = Transition(
                actor_in=policy.actor_in,
                critic_in=None if policy.critic_in is policy.actor_in else policy.critic_in,
                first=first, action=action, log_prob=distributions.log_prob(policy.logits, action),
                value=policy.value, reward=reward, done=done, mask=policy.mask,
                truncated=info["truncated"] if s.bootstrap_truncation else None, final_value=final_value)
            episode = {"episode_return_sum": jnp.where(ended, info["episode_return"].mean(-1), 0.0),
                       "episode_length_sum": jnp.where(ended, info["episode_length"], 0),
                       "episodes": ended}
            if self.reports_wins:
                episode["win_rate_sum"] = ended & info["won"]
            return (env_state, next_obs, policy.carry, ended), (transition, episode)

        init = (state.env_state, state.obs, state.carry, state.first)
        after, (traj, episode) = jax.lax.scan(step, init, (env_keys, action_noise), unroll=s.rollout_unroll)
        return after, traj, jax.tree.map(jnp.sum, episode)

    def _loss(self, params, batch, hp: PPOHyperparams):
        if self.recurrent:  # batch leaves [B, T, ...] -> time-major, from the carry each sequence began with
            carry = batch["carry"]
            batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), {k: v for k, v in batch.items() if k != "carry"})
        else:
            carry = ()
        critic_in = batch["actor_in"] if batch["critic_in"] is None else batch["critic_in"]
        _, logits, values = self.network.apply(params, carry, batch["actor_in"], critic_in, batch["first"])
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

    def _minibatch_units(self, samples: dict, start_carry) -> dict:
        """Time-major samples [T, n, A, ...] -> per-env units [n, U, ...] for `deal_minibatches`.

        `sequence_minibatches`: U = A whole sequences [T, ...], each with the carry it started from.
        Otherwise (feed-forward PPO): U = T * A single steps.
        """
        if self.sequence_minibatches:
            units = jax.tree.map(lambda x: jnp.moveaxis(x, 0, 2), samples)  # [n, A, T, ...]
            return dict(units, carry=start_carry)
        n, T = self.num_local_envs, self.settings.num_steps
        return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(n, T * self.num_agents, *x.shape[3:]), samples)

    def _collect(self, state: TrainState, hp: PPOHyperparams, rollout_key: jax.Array):
        """Rollout and advantages for one seed on this device's envs: ((env_state, obs, carry, first) after the
        rollout, episode sums, minibatch units [n, U, ...] for `_optimise`)."""
        s = self.settings
        (env_state, obs, carry, first), traj, episode = self._rollout(state.params, state, rollout_key)
        last_value = self._policy_step(state.params, self.env, env_state, obs, carry, first).value
        reward = traj.reward
        if s.bootstrap_truncation:  # a time limit is not a terminal state: add the value it cut off
            reward = reward + hp.gamma * traj.final_value * traj.truncated[..., None]
        advantages, targets = gae(reward, traj.value, traj.done, last_value, hp.gamma, hp.gae_lambda)
        samples = {"actor_in": traj.actor_in, "critic_in": traj.critic_in,
                   "first": jnp.broadcast_to(traj.first[..., None], traj.action.shape),
                   "action": traj.action, "log_prob": traj.log_prob, "value": traj.value, "mask": traj.mask,
                   "advantages": advantages, "targets": targets}
        return (env_state, obs, carry, first), episode, self._minibatch_units(samples, state.carry)

    def _update(self, state: TrainState, hp: PPOHyperparams):
        """One PPO update for one seed on this device's envs: returns (state, metrics)."""
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        (env_state, obs, carry, first), episode, units = self._collect(state, hp, rollout_key)
        params, opt_state, aux = self._optimise(state, units, hp, epoch_key)
        metrics = jax.tree.map(jnp.mean, aux)
        metrics.update(jax.lax.psum(episode, DATA_AXIS))
        state = TrainState(params, opt_state, env_state, obs, carry, first, key, state.update_step + 1)
        return state, metrics

    def _optimise(self, state: TrainState, units: dict, hp: PPOHyperparams, key: jax.Array):
        """Epochs x minibatches of `self._loss` on this device's units [n, U, ...], gradients averaged over
        devices. Returns (params, opt_state, aux [epochs, minibatches])."""
        s = self.settings
        optimizer = make_optimizer(hp, self._learning_rate(hp, state.update_step), s.adam_eps, s.grad_clip)
        return optimise(self._loss, optimizer, state.params, state.opt_state, units, hp, key, s.num_epochs,
                        s.num_minibatches)

    # ----------------------------------------------------------------------------------------------
    # K updates for every seed, compiled once per K

    def _run_updates(self, state: TrainState, hp: PPOHyperparams, num_updates: jax.Array):
        """`num_updates` (traced) updates: one compiled program serves every chunk length."""
        state, totals = repeat_updates(self._update, state, hp, num_updates)
        return state, {k: v if k.endswith("_sum") or k == "episodes" else v / num_updates
                       for k, v in totals.items()}

    def run_chunk(self, state: TrainState, hp: PPOHyperparams, num_updates: int):
        """Run `num_updates` updates for every seed; returns (state, metrics with leaves [S]).

        `hp` leaves are scalars (shared by every seed) or [S] (one value per seed: a sweep). Compiles on
        the first call (the seconds it took are kept in `compile_seconds`).
        """
        num_updates = jnp.int32(num_updates)
        hp = mesh_lib.runs_of(hp, state.update_step.shape[0], self.mesh)
        if self._chunk_fn is None:
            specs = self._state_specs(state)
            local = jax.vmap(self._run_updates, (0, 0, None))
            sharded = jax.shard_map(local, mesh=self.mesh, in_specs=(specs, RUNS, P()), out_specs=(specs, RUNS),
                                    check_vma=self.agent_env.supports_vma_checks)
            shardings, per_run = self.state_shardings(state), mesh_lib.per_run(self.mesh)
            jitted = jax.jit(sharded, in_shardings=(shardings, per_run, mesh_lib.replicated(self.mesh)),
                             out_shardings=(shardings, per_run), donate_argnums=0)
            tick = time.perf_counter()
            self._chunk_fn = jitted.lower(state, hp, num_updates).compile(dict(self.settings.xla_options) or None)
            self.compile_seconds = time.perf_counter() - tick
        return self._chunk_fn(state, hp, num_updates)

    def sample_trajectory(self, state: TrainState) -> Transition:
        """One rollout with the current parameters, nothing updated (for inspection and tests).

        Returns the Transition with leaves [S, T, N, ...]; the rollout starts from `state`'s env states
        and hidden states with its key, exactly as the next update's rollout will.
        """
        specs = self._state_specs(state)
        local = jax.vmap(lambda st: self._rollout(st.params, st, jax.random.split(st.key, 3)[1])[1])
        fn = jax.shard_map(local, mesh=self.mesh, in_specs=(specs,), out_specs=P(RUN_AXIS, None, DATA_AXIS),
                           check_vma=self.agent_env.supports_vma_checks)
        return jax.jit(fn)(state)

    # ----------------------------------------------------------------------------------------------
    # Greedy evaluation

    def _greedy_episodes(self, params, key: jax.Array, num_envs: int, keep_states: bool = False):
        """One greedy episode per env (no auto-reset), for one seed's params.

        Returns (means over envs {eval_return, eval_length[, eval_win_rate]}, trace): with `keep_states`
        the trace is (reset states, states after each step [T, num_envs, ...], still running before
        each step [T, num_envs]), else None.
        """
        env = self.agent_env
        reset_key, step_key = jax.random.split(key)
        obs, reset_state = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
        totals = {"eval_return": jnp.zeros(num_envs), "eval_length": jnp.zeros(num_envs, jnp.int32)}
        if self.reports_wins:
            totals["eval_win_rate"] = jnp.zeros(num_envs, bool)

        def step(c, key):
            obs, env_state, carry, first, alive, totals = c
            policy = self._policy_step(params, env, env_state, obs, carry, first)
            carry, action = policy.carry, distributions.greedy(policy.logits)
            obs, env_state, reward, done, info = jax.vmap(env.step)(jax.random.split(key, num_envs), env_state, action)
            totals = dict(totals, eval_return=totals["eval_return"] + reward.mean(-1) * alive,
                          eval_length=totals["eval_length"] + alive)
            if self.reports_wins:
                totals["eval_win_rate"] = totals["eval_win_rate"] | (info["won"] & alive)
            trace = (env_state, alive) if keep_states else None
            alive = alive & ~envs.episode_over(done, info)
            return (obs, env_state, carry, jnp.zeros_like(first), alive, totals), trace

        carry = self.network.initial_carry((num_envs, self.num_agents))
        running = jnp.ones(num_envs, bool)
        init = (obs, reset_state, carry, running, running, totals)
        (*_, totals), trace = jax.lax.scan(step, init, jax.random.split(step_key, self.eval_max_steps))
        means = jax.tree.map(lambda x: jnp.mean(x.astype(jnp.float32)), totals)
        return means, (reset_state, *trace) if keep_states else None

    @jit_method(static_argnums=(3,))
    def evaluate(self, params, key: jax.Array, num_envs: int):
        """Greedy actions, one episode per env, for every seed: {eval_return, eval_length[, eval_win_rate]} [S].
        Every seed plays the same `num_envs` episodes (the same key): runs differ only by their policies."""
        return jax.vmap(lambda p: self._greedy_episodes(p, key, num_envs)[0])(params)

    def episode_states(self, params, key: jax.Array) -> list:
        """The env states of one greedy episode for one seed's params (no seed axis): the reset state, then
        the state after each step, up to the end of the episode."""
        run = jax.jit(lambda params, key: self._greedy_episodes(params, key, 1, keep_states=True)[1])
        reset_state, states, running = jax.device_get(run(params, key))
        length = int(running[:, 0].sum())
        first = jax.tree.map(lambda x: x[0], reset_state)
        return [first] + [jax.tree.map(lambda x: x[t, 0], states) for t in range(length)]


def _step_info_keys(env: envs.Environment) -> set[str]:
    """The keys of `info` that `env.step` returns (traced abstractly, nothing runs)."""
    def probe(key):
        _, state = env.reset(key)
        return env.step(key, state, jnp.zeros((env.num_agents,), jnp.int32))[4]
    return set(jax.eval_shape(probe, jax.random.PRNGKey(0)))
