"""A network acting on an environment, as every algorithm that learns on envs uses it: PPO, env GRPO, the
Q-learners (a Q-network in the actor-critic calling convention) and SAC/TD3/TQC. `EnvPolicy`: what the networks
see, one step of them, the initial parameters, the training episode statistics, greedy evaluation and the
episode GIF; `EnvOnMesh`: the env as training steps it (auto-resetting, with episode statistics, its envs split
over the mesh); `policy_functions`: the `engine.Algorithm` fields a policy gives (evaluation, a loaded actor
`EnvActor`, the GIF); and the rollout helpers PPO and env GRPO share.

Single-agent envs are seen with an agent axis of one (`envs.AgentAxis`), so every array reads [..., A, ...].
Agents share parameters; `agent_id` tells them apart. The critic sees each agent's own inputs (IPPO) or the
env's global state (MAPPO, `critic_input="global_state"`). The policy's outputs are read by `self.dist`
(`jaxrl.distributions`: categorical for discrete actions, a Gaussian for continuous ones). Shapes: n envs,
A agents, P policy outputs (K logits, or 2D for D-dimensional continuous actions), d inputs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

import envs
from jaxrl import distributions, mesh as mesh_lib, normalization
from jaxrl.engine import acting
from jaxrl.jitting import RUNS_ONCE, jit_method
from jaxrl.loops import scan_until
from jaxrl.mesh import DATA_AXIS

CRITIC_INPUTS = ("obs", "global_state")  # the critic sees each agent's view (IPPO) or the env's global state (MAPPO)
AGENT_ID_INPUTS = ("both", "critic", "actor", "none")  # which networks see each agent's one-hot index
# Memory advice (`engine.Algorithm.sized_by`): what sizes the state fields every env algorithm has
NETWORK_SIZED = {"params": "the network's sizes", "opt_state": "the network's sizes"}


class PolicyStep(NamedTuple):
    """What the networks make of one time step of n envs (see `EnvPolicy.step`)."""

    carry: Any  # the hidden state after this step
    actor_in: jax.Array  # [n, A, d_actor]
    critic_in: jax.Array  # [n, A, d_critic] (the same array as actor_in when the critic sees the obs)
    policy_out: jax.Array  # [n, A, P] what `EnvPolicy.dist` reads (logits with illegal actions masked, ...)
    value: jax.Array  # [n, A]
    mask: jax.Array | None  # [n, A, K] legal actions, None for envs without masks
    global_state: jax.Array | None  # [n, G] as the env gives it, when the critic sees it


class EnvPolicy:
    """A network acting in `env` (any env of the `envs` API, seen with an agent axis)."""

    def __init__(self, env: envs.Environment, network, agent_id: str = "both", critic_input: str = "obs",
                 eval_max_steps: int = 1000, squash: bool = False, normalize_obs: bool = False,
                 obs_clip: float = 10.0, std_transform: str = "exp"):
        for name, value, known in (("critic_input", critic_input, CRITIC_INPUTS), ("agent_id", agent_id, AGENT_ID_INPUTS)):
            if value not in known:
                raise ValueError(f"unknown {name} {value!r}; known: {', '.join(known)}")
        self.agent_env = envs.as_multi_agent(env)
        if critic_input == "global_state" and not hasattr(self.agent_env, "global_state"):
            raise ValueError(f"critic_input='global_state' needs an env with a global state; {env!r} has none "
                             "(use critic_input='obs')")
        self.network = network
        self.dist = distributions.for_action_space(self.agent_env.action_space(), squash, std_transform)
        self.agent_id, self.critic_input = agent_id, critic_input
        self.num_agents = self.agent_env.num_agents
        self.reports_wins = "won" in step_info_keys(self.agent_env)
        self.recurrent = bool(getattr(network, "recurrent", False))
        self.eval_max_steps = eval_max_steps
        self.normalize_obs, self.obs_clip = normalize_obs, obs_clip

    # ----------------------------------------------------------------------------------------------
    # What the networks see, and one step of them

    def inputs(self, obs: jax.Array, global_state: jax.Array | None, obs_norm: dict | None = None):
        """obs [..., A, d], global_state [..., G] or None -> (actor_in [..., A, d'], critic_in [..., A, d'']).

        With `obs_norm` (the running statistics kept in the parameters, `params["obs_norm"]`), observations
        and global state are normalised first. Returns the same array twice when actor and critic see the same
        inputs (a rollout then stores it once).
        """
        actor_in = self.actor_inputs(obs, obs_norm)
        obs = self._normalized(obs_norm, "obs", obs)
        if global_state is not None:
            global_state = self._normalized(obs_norm, "global_state", global_state)
        if self.critic_input == "obs":
            same_inputs = self.num_agents == 1 or self.agent_id in ("both", "none")
            return actor_in, actor_in if same_inputs else self._with_id(obs, "critic")
        shared = jnp.broadcast_to(global_state[..., None, :], (*obs.shape[:-1], global_state.shape[-1]))
        return actor_in, self._with_id(shared.astype(obs.dtype), "critic")

    def actor_inputs(self, obs: jax.Array, obs_norm: dict | None = None) -> jax.Array:
        """What the actor (a Q-network) sees of observations [..., A, d]: normalised by `obs_norm` when given,
        with the agents' ids when it is told them."""
        return self._with_id(self._normalized(obs_norm, "obs", obs), "actor")

    def _normalized(self, obs_norm: dict | None, name: str, x: jax.Array) -> jax.Array:
        """x normalised by the running statistics `obs_norm[name]` ("obs" or "global_state"); x itself when
        the parameters carry none."""
        return x if obs_norm is None else normalization.normalize(obs_norm[name], x, self.obs_clip)

    def _with_id(self, x: jax.Array, network: str) -> jax.Array:
        """x [..., A, d] with the agents' one-hot ids appended when `network` ("actor"/"critic") sees them."""
        A = self.num_agents
        if A == 1 or self.agent_id not in ("both", network):
            return x
        return jnp.concatenate([x, jnp.broadcast_to(jnp.eye(A, dtype=x.dtype), (*x.shape[:-2], A, A))], axis=-1)

    def critic_input_size(self) -> int:
        """d_critic: the width of the critic's inputs (found by tracing a reset, nothing runs)."""
        def probe(key):
            obs, state = jax.vmap(self.agent_env.reset)(key[None])
            return self.inputs(obs, self.global_state(self.agent_env, state))[1]
        return jax.eval_shape(probe, jax.random.PRNGKey(0)).shape[-1]

    def act(self, params, obs, carry, first, mask, key, critic_size: int):
        """The actor alone, one time step of n envs: obs [n, A, d], first [n] (episode starts: the hidden
        state restarts), mask [n, A, K] legal actions or None, key None for greedy actions -> (the env's
        action [n, A, ...], carry). The critic tower is fed zeros of width `critic_size` (`critic_input_size()`): a deployed policy
        needs no global state."""
        out, carry = self.actor_out(params, obs, carry, first, mask, critic_size)
        action = self.dist.mode(out) if key is None else self.dist.sample(key, out)
        return self.dist.to_env(action), carry

    def actor_out(self, params, obs, carry, first, mask, critic_size: int):
        """`act`'s network pass: (what `self.dist` reads [n, A, P], illegal actions masked; carry)."""
        actor_in = self.actor_inputs(obs, params.get("obs_norm"))
        critic_in = jnp.zeros((*actor_in.shape[:-1], critic_size), actor_in.dtype)
        first = jnp.broadcast_to(first[:, None], actor_in.shape[:2])
        carry, out, _ = self.network.apply(params, carry, actor_in[None], critic_in[None], first[None])
        return self.dist.with_mask(out[0], mask), carry

    def global_state(self, env, env_states):
        """[n, G] for a batch of `env`'s states when the critic needs it, else None."""
        if self.critic_input != "global_state":
            return None
        return jax.vmap(env.global_state)(env_states)

    def step_inputs(self, params, env, env_state, obs, first):
        """What the networks see of n envs' current step (obs [n, A, d], first [n]; `env` is the env whose states
        these are): (actor_in [n, A, d'], critic_in [n, A, d''], first [n, A], global state [n, G] or None)."""
        global_state = self.global_state(env, env_state)
        actor_in, critic_in = self.inputs(obs, global_state, params.get("obs_norm"))
        return actor_in, critic_in, jnp.broadcast_to(first[:, None], actor_in.shape[:2]), global_state

    def step(self, params, env, env_state, obs, carry, first) -> PolicyStep:
        """The networks on n envs' current observations, one time step (rollouts, bootstrap values and
        evaluation all go through here)."""
        actor_in, critic_in, first, global_state = self.step_inputs(params, env, env_state, obs, first)
        mask = jax.vmap(env.avail_actions)(env_state) if env.has_action_masks else None
        carry, out, value = self.network.apply(params, carry, actor_in[None], critic_in[None], first[None])
        return PolicyStep(carry, actor_in, critic_in, self.dist.with_mask(out[0], mask), value[0], mask,
                          global_state)

    def init_params(self, key: jax.Array, env, obs: jax.Array, env_state) -> Any:
        """Initial parameters from `key`; the observations [n, A, d] and states of n envs of `env` give the
        input shapes (the values do not matter). With `normalize_obs` they also hold the (empty) running
        statistics of the observations and global state, {"obs_norm": {"obs", "global_state"}}: not trained,
        but carried with the parameters, so that evaluation, checkpoints and exported policies see them."""
        n, A = obs.shape[:2]
        global_state = self.global_state(env, env_state)
        actor_in, critic_in = self.inputs(obs, global_state)
        params = self.network.init(key, self.network.initial_carry((n, A)), actor_in[None], critic_in[None],
                                   jnp.ones((1, n, A), bool))
        if self.normalize_obs:
            stats = {"obs": normalization.init(obs.shape[-1:])}
            if global_state is not None:
                stats["global_state"] = normalization.init(global_state.shape[-1:])
            params = {**params, "obs_norm": stats}
        return params

    def episode_sums(self, ended: jax.Array, info: dict) -> dict:
        """What one step of n auto-resetting envs (`EnvOnMesh.env`'s `info`) adds to the training episode
        statistics, to be summed over steps and envs: the return (the agents' mean), length and count of the
        episodes that ended at it (`ended` [n]), their wins where the env reports them, and the env's own
        episode info (`episode_info_keys`, e.g. Craftax's achievements) as `<name>_sum`."""
        episode = {"episode_return_sum": jnp.where(ended, info["episode_return"].mean(-1), 0.0),
                   "episode_length_sum": jnp.where(ended, info["episode_length"], 0), "episodes": ended}
        if self.reports_wins:
            episode["win_rate_sum"] = ended & info["won"]
        for name in self.agent_env.episode_info_keys:
            episode[f"{name}_sum"] = jnp.where(ended, info[name], 0.0)
        return episode

    # ----------------------------------------------------------------------------------------------
    # Greedy evaluation

    def greedy_episodes(self, params, key: jax.Array, num_envs: int, keep_states: bool = False,
                        sample: bool = False):
        """One greedy episode per env (no auto-reset), for one seed's params; with `sample`, actions are
        sampled from the policy instead.

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
            policy = self.step(params, env, env_state, obs, carry, first)
            if sample:  # (greedy evaluation keeps its keys: its figures do not change with this option)
                key, action_key = jax.random.split(key)
                action = self.dist.sample(action_key, policy.policy_out)
            else:
                action = self.dist.mode(policy.policy_out)
            carry = policy.carry
            obs, env_state, reward, done, info = jax.vmap(env.step)(jax.random.split(key, num_envs), env_state,
                                                                    self.dist.to_env(action))
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
        # (no more steps once every episode has ended: `scan_until`; a trace's steps not taken are zeros)
        (*_, totals), trace = scan_until(step, init, jax.random.split(step_key, self.eval_max_steps),
                                         lambda c: ~c[4].any())
        means = jax.tree.map(lambda x: jnp.mean(x.astype(jnp.float32)), totals)
        return means, (reset_state, *trace) if keep_states else None

    @jit_method(static_argnums=(3, 4))
    def evaluate(self, params, key: jax.Array, num_envs: int, sample: bool = False):
        """Greedy actions (or sampled, with `sample`), one episode per env, for every seed: {eval_return,
        eval_length[, eval_win_rate]} [S]. Every seed plays the same `num_envs` episodes (the same key): runs
        differ only by their policies."""
        one_run = lambda p: self.greedy_episodes(p, key, num_envs, sample=sample)[0]  # noqa: E731
        # (envs on the host: one run after another, as vmap cannot batch their callbacks in the episode loop)
        return jax.lax.map(one_run, params) if self.agent_env.host_state else jax.vmap(one_run)(params)

    @jit_method(static_argnums=(3,), compiler_options=RUNS_ONCE)
    def _episode_trace(self, params, key: jax.Array, sample: bool):
        return self.greedy_episodes(params, key, 1, keep_states=True, sample=sample)[1]

    def episode_states(self, params, key: jax.Array, sample: bool = False) -> list:
        """The env states of one greedy (or sampled) episode for one seed's params (no seed axis): the reset
        state, then the state after each step, up to the end of the episode."""
        reset_state, states, running = jax.device_get(self._episode_trace(params, key, sample))
        length = int(running[:, 0].sum())
        first = jax.tree.map(lambda x: x[0], reset_state)
        return [first] + [jax.tree.map(lambda x: x[t, 0], states) for t in range(length)]

    def write_artifacts(self, workdir: str, params, seed: int, sample: bool = False) -> list[str]:
        """`eval_episode.gif`: one greedy (or sampled) episode of the first run (params leaves [R, ...]) when
        the env can draw itself (`envs.rendering`)."""
        from envs import rendering

        if rendering.renderer(self.agent_env) is None:
            return []
        states = self.episode_states(jax.tree.map(lambda x: x[0], params), jax.random.PRNGKey(seed), sample)
        return [rendering.save_gif(rendering.render_frames(self.agent_env, states),
                                   os.path.join(workdir, "eval_episode.gif"))]


@dataclasses.dataclass(frozen=True)
class EnvOnMesh:
    """A policy's env as an algorithm trains in it: auto-resetting (by `reset_ratio`) with episode
    statistics, its `num_envs` split over the mesh's data axis (`local_envs` on each device)."""

    env: envs.Environment
    mesh: jax.sharding.Mesh
    local_envs: int

    @classmethod
    def of(cls, policy: EnvPolicy, num_envs: int, reset_ratio: float, mesh=None) -> "EnvOnMesh":
        mesh = mesh if mesh is not None else mesh_lib.make_mesh()
        mesh_lib.check_no_model_axis(mesh, "environment algorithms have none")
        mesh_lib.check_divisible("num_envs", num_envs, mesh)
        return cls(envs.EpisodeStatistics(envs.AutoReset(policy.agent_env, reset_ratio)), mesh,
                   num_envs // mesh.shape[DATA_AXIS])


def policy_functions(policy: EnvPolicy) -> dict:
    """The `engine.Algorithm` fields every env algorithm takes from its policy: greedy evaluation, a loaded
    actor, the episode GIF, shard_map's varying-axes checks as the env supports them."""
    return {"evaluate": policy.evaluate, "actor": functools.partial(EnvActor, policy),
            "write_artifacts": policy.write_artifacts, "vma_checks": policy.agent_env.supports_vma_checks,
            "host_state": policy.agent_env.host_state}


class EnvActor:
    """One trained policy, ready to act: `actor(obs, carry, first=..., mask=..., key=...)` is jitted.

        actor = jaxrl.load_policy("runs/smax_mappo-3m-...")
        obs, state = jax.vmap(actor.env.reset)(keys)            # n envs
        carry = actor.initial_carry(n)
        action, carry = actor(obs, carry, mask=jax.vmap(actor.env.avail_actions)(state))

    Observations are shaped as `env` returns them, batched over n envs: [n, d] for a single-agent env,
    [n, A, d] for a multi-agent one; actions likewise [n] or [n, A]. `first` [n] marks episode starts (the
    hidden state of a recurrent policy restarts; default: none); without `key` actions are greedy.
    """

    def __init__(self, policy: EnvPolicy, params):
        self.policy, self.params = policy, params
        self.env = policy.agent_env.env if isinstance(policy.agent_env, envs.AgentAxis) else policy.agent_env
        self.agent_axis = self.env is not policy.agent_env  # single-agent env, seen with an agent axis
        self.recurrent = policy.recurrent
        self._act = jax.jit(functools.partial(policy.act, critic_size=policy.critic_input_size()))

    def initial_carry(self, num_envs: int):
        """The hidden state before the first step (() for feed-forward policies)."""
        return self.policy.network.initial_carry((num_envs, self.policy.num_agents))

    def __call__(self, obs, carry=None, *, first=None, mask=None, key=None):
        """(action, carry) for one time step; `carry` None: the initial one."""
        if self.agent_axis:
            obs, mask = obs[:, None], None if mask is None else mask[:, None]
        num_envs = obs.shape[0]
        carry = self.initial_carry(num_envs) if carry is None else carry
        first = jnp.zeros((num_envs,), bool) if first is None else first
        action, carry = self._act(self.params, obs, carry, first, mask, key)
        return (action[:, 0] if self.agent_axis else action), carry

    def play(self, key: jax.Array, num_envs: int = 32, sample: bool = False) -> dict:
        """One episode per env, greedy or sampled: {eval_return, eval_length[, eval_win_rate]} (means), as
        the run's evaluation computes them."""
        one_run = jax.tree.map(lambda x: x[None], self.params)
        return {k: float(v[0]) for k, v in jax.device_get(self.policy.evaluate(one_run, key, num_envs, sample)).items()}

    def episode_states(self, key: jax.Array, sample: bool = False) -> list:
        """The env states of one episode (to draw it with `envs.rendering`)."""
        return self.policy.episode_states(self.params, key, sample)


def trainable(params: dict) -> dict:
    """The part of a policy's variables that the optimiser trains: every collection (flax's "params", a mixing
    network's, ...) but the running observation statistics in "obs_norm"."""
    return {name: value for name, value in params.items() if name != "obs_norm"}


def step_info_keys(env: envs.Environment) -> set[str]:
    """The keys of `info` that `env.step` returns for `env` with an agent axis (traced abstractly, nothing
    runs)."""
    space = env.action_space()
    dtype = jnp.int32 if hasattr(space, "n") else jnp.float32

    def probe(key):
        _, state = env.reset(key)
        return env.step(key, state, jnp.zeros((env.num_agents, *space.shape), dtype))[4]
    return set(jax.eval_shape(probe, jax.random.PRNGKey(0)))


def sequence_units(samples: dict, start_carry) -> dict:
    """Time-major samples [T, n, A, ...] -> per-env units for `engine.deal_minibatches`: the A whole
    sequences [n, A, T, ...] of each env, with the carry each began from."""
    units = jax.tree.map(lambda x: jnp.moveaxis(x, 0, 2), samples)
    return dict(units, carry=start_carry)


def step_units(samples: dict) -> dict:
    """Time-major samples [T, n, A, ...] -> per-env units [n, T * A, ...] (single agent-steps)."""
    T, n, A = jax.tree.leaves(samples)[0].shape[:3]
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(n, T * A, *x.shape[3:]), samples)


def distinct_critic_in(actor_in: jax.Array, critic_in: jax.Array) -> jax.Array | None:
    """The critic's inputs as a rollout stores them: None where they are the actor's (`EnvPolicy.inputs` returns
    the same array twice), so that they are kept once."""
    return None if critic_in is actor_in else critic_in


def init_run(policy: EnvPolicy, env, key: jax.Array, num_envs: int):
    """One run's start, its keys drawn as PPO and env GRPO both draw them (the same parameters for the same
    seed): (params, obs [N, A, d] and states of `num_envs` fresh envs of `env`, the state's own key)."""
    param_key, env_key, state_key = jax.random.split(key, 3)
    obs, env_state = jax.vmap(env.reset)(jax.random.split(env_key, num_envs))
    return policy.init_params(param_key, env, obs, env_state), obs, env_state, state_key


def step_randomness(key: jax.Array, dist, num_steps: int, num_env_keys: int, num_envs: int, num_agents: int):
    """All randomness of a rollout drawn up front in a few batched ops rather than T small ones: for every step,
    `num_env_keys` env keys [T, ·, 2] (one per env, or per group) and the action noise of every env and agent
    [T, N, A, ...] (Gumbel per action, or normal per action dimension), drawn for all envs and sliced to this
    device's share, so that each env gets the same numbers on any mesh."""
    step_keys = jax.random.split(key, num_steps)
    action_noise = jax.vmap(lambda k: dist.noise(jax.random.fold_in(k, 1), (num_envs, num_agents)))(step_keys)
    return acting.step_env_keys(step_keys, num_env_keys), mesh_lib.local_share(action_noise, axis=1)
