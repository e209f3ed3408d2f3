"""Bridges between our array-first multi-agent API and JaxMARL's dict-keyed one.

- `DictAgents(env)`: a JaxMARL-style view (agent name -> array) of any of our multi-agent envs, for
  users porting JaxMARL code. Not for hot paths: it only reshuffles arrays into dicts.
- `FromJaxMARL(env_or_id, **kwargs)`: any jaxmarl environment in our array-first API (obs
  `[agents, obs_dim]`, actions `[agents]`, masks, global state), so our algorithms and wrappers run
  on MPE, Overcooked, Hanabi and the rest. jaxmarl is imported only when an id is given.
  Also reachable as `envs.make("jaxmarl", env_id="MPE_simple_spread_v3")`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs.core import Box, Discrete, Environment


class DictAgents:
    """JaxMARL-style dict view of an array-first multi-agent env.

    reset(key) -> (obs {agent: [obs_dim]}, state); step(key, state, {agent: action}) ->
    (obs, state, rewards {agent: r}, dones {agent: d, "__all__": over}, info);
    get_avail_actions(state) -> {agent: bool [num_actions]}. With `world_state=True` the obs dict
    also holds "world_state" (the env's global state), as JaxMARL's SMAX does.
    """

    def __init__(self, env: Environment, agents: list[str] | None = None, world_state: bool = False):
        self.env = env
        self.agents = list(agents or getattr(env, "agents", None) or [f"agent_{i}" for i in range(env.num_agents)])
        if len(self.agents) != env.num_agents:
            raise ValueError(f"{len(self.agents)} agent names for {env.num_agents} agents")
        self.world_state = world_state

    def __getattr__(self, name):
        return getattr(self.env, name)

    def _split(self, x: jax.Array) -> dict[str, jax.Array]:
        return {agent: x[i] for i, agent in enumerate(self.agents)}

    def _obs(self, obs, state, params):
        out = self._split(obs)
        if self.world_state:
            out["world_state"] = self.env.global_state(state, params)
        return out

    def reset(self, key, params=None):
        obs, state = self.env.reset(key, params)
        return self._obs(obs, state, params), state

    def step(self, key, state, actions: dict[str, Any], params=None):
        stacked = jnp.stack([jnp.asarray(actions[agent]) for agent in self.agents])
        obs, state, reward, done, info = self.env.step(key, state, stacked, params)
        dones = dict(self._split(done), __all__=info["episode_over"])
        return self._obs(obs, state, params), state, self._split(reward), dones, info

    def get_avail_actions(self, state, params=None) -> dict[str, jax.Array]:
        return self._split(self.env.avail_actions(state, params))

    def observation_space(self, agent: str | None = None, params=None):
        return self.env.observation_space(params)

    def action_space(self, agent: str | None = None, params=None):
        return self.env.action_space(params)

    def __repr__(self) -> str:
        return f"DictAgents({self.env!r})"


def _flat_dim(space) -> int:
    return int(np.prod(space.shape)) if space.shape else 1


class FromJaxMARL(Environment):
    """A jaxmarl `MultiAgentEnv` in our array-first API.

    Agents are `env.agents` in order. Observations are flattened and zero-padded to the largest
    agent's size; discrete action counts are padded to the largest, with padded actions masked off
    (`has_action_masks` is then true). The jaxmarl env's own auto-reset is bypassed (we call its
    `step_env`): wrap with `envs.AutoReset`. `info["truncated"]` is inferred from a `step` counter
    reaching `env.max_steps` when the env has both; `info["won"]` is given for SMAX-like envs only
    (all enemies dead, some ally alive); the jaxmarl env's own info entries are
    not passed on. `params` are ignored (jaxmarl envs keep their settings on the env object).
    """

    def __init__(self, env: Any, **kwargs):
        if isinstance(env, str):
            try:
                import jaxmarl
            except ImportError as e:  # pragma: no cover - depends on the installed extras
                raise ImportError("FromJaxMARL needs jaxmarl: pip install jaxmarl") from e
            env = jaxmarl.make(env, **kwargs)
        elif kwargs:
            raise TypeError("keyword arguments are only accepted together with an environment id")
        self.env = env
        self.name = f"jaxmarl-{getattr(env, 'name', type(env).__name__)}"
        self.agents = list(env.agents)
        self.num_agents = len(self.agents)
        self.multi_agent = True
        self.supports_vma_checks = False  # jaxmarl's SMAX mixes varying and replicated values in lax.cond
        self.max_episode_steps = getattr(env, "max_steps", None)
        obs_spaces = [env.observation_space(a) for a in self.agents]
        act_spaces = [env.action_space(a) for a in self.agents]
        self._obs_dims = [_flat_dim(s) for s in obs_spaces]
        self._obs_dim = max(self._obs_dims)
        if not all(hasattr(s, "n") for s in act_spaces):
            raise NotImplementedError("FromJaxMARL supports discrete action spaces only")
        self._action_counts = [int(s.n) for s in act_spaces]
        self._num_actions = max(self._action_counts)
        self._padded_actions = len(set(self._action_counts)) > 1
        self._env_masks = self._has_env_masks()
        self.has_action_masks = self._env_masks or self._padded_actions
        self._state_dim = None

    def _has_env_masks(self) -> bool:
        try:
            jax.eval_shape(lambda k: self.env.get_avail_actions(self.env.reset(k)[1]), jax.random.PRNGKey(0))
        except NotImplementedError:
            return False
        return True

    # Sizes -----------------------------------------------------------------------------------------

    @property
    def num_actions(self) -> int:
        return self._num_actions

    @property
    def obs_dim(self) -> int:
        return self._obs_dim

    @property
    def state_dim(self) -> int:
        if self._state_dim is None:
            shape = jax.eval_shape(lambda k: self.global_state(self.reset(k)[1]), jax.random.PRNGKey(0))
            self._state_dim = int(np.prod(shape.shape))
        return self._state_dim

    def observation_space(self, params=None) -> Box:
        return Box(low=-np.inf, high=np.inf, shape=(self._obs_dim,))

    def action_space(self, params=None) -> Discrete:
        return Discrete(self._num_actions)

    # Conversions -----------------------------------------------------------------------------------

    def _stack_obs(self, obs: dict) -> jax.Array:
        """[agents, obs_dim] float32, flattened and zero-padded."""
        rows = [jnp.ravel(obs[a]).astype(jnp.float32) for a in self.agents]
        return jnp.stack([jnp.pad(r, (0, self._obs_dim - r.shape[0])) for r in rows])

    def _stack(self, values: dict, dtype) -> jax.Array:
        return jnp.stack([jnp.asarray(values[a]) for a in self.agents]).astype(dtype)

    def _time_limit_hit(self, state) -> jax.Array:
        step = getattr(state, "step", None)
        if step is None or self.max_episode_steps is None:
            return jnp.bool_(False)
        return step >= self.max_episode_steps

    @property
    def _reports_wins(self) -> bool:
        """SMAX-like: the env has allies and its states track which units are alive."""
        return hasattr(self.env, "num_allies")

    def _won(self, state) -> jax.Array:
        inner = getattr(state, "state", state)  # HeuristicEnemySMAX nests the SMAX state
        alive = inner.unit_alive
        return ~alive[self.env.num_allies:].any() & alive[:self.env.num_allies].any()

    # API -------------------------------------------------------------------------------------------

    def reset(self, key, params=None):
        obs, state = self.env.reset(key)
        return self._stack_obs(obs), state

    def step(self, key, state, actions, params=None):
        actions = {a: actions[i] for i, a in enumerate(self.agents)}
        obs, state, reward, done, _ = self.env.step_env(key, state, actions)
        over = jnp.asarray(done["__all__"])
        truncated = over & self._time_limit_hit(getattr(state, "state", state))
        info = {"terminated": over & ~truncated, "truncated": truncated, "episode_over": over}
        if self._reports_wins:
            info["won"] = over & self._won(state)
        return (self._stack_obs(obs), state, self._stack(reward, jnp.float32),
                self._stack(done, bool) | over, info)

    def avail_actions(self, state, params=None) -> jax.Array:
        """bool [agents, num_actions]; actions beyond an agent's own count are unavailable."""
        counts = jnp.array(self._action_counts)[:, None]
        padded = jnp.arange(self._num_actions)[None, :] < counts
        if not self._env_masks:
            return padded
        masks = self.env.get_avail_actions(state)
        rows = [jnp.pad(jnp.asarray(masks[a], bool), (0, self._num_actions - n))
                for a, n in zip(self.agents, self._action_counts)]
        return jnp.stack(rows) & padded

    def global_state(self, state, params=None) -> jax.Array:
        """The env's world state when it has one, else every agent's observation concatenated."""
        if hasattr(self.env, "get_world_state"):
            return jnp.ravel(self.env.get_world_state(state)).astype(jnp.float32)
        return self._stack_obs(self.env.get_obs(state)).reshape(-1)

    def __repr__(self) -> str:
        return f"FromJaxMARL({type(self.env).__name__})"
