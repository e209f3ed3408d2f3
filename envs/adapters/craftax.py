"""Craftax and Craftax-Classic (symbolic observations) in the `envs` API.

    env = envs.make("craftax", env_id="Craftax-Classic-Symbolic-v1")     # 1345 numbers, 17 actions
    env = envs.make("craftax", env_id="Craftax-Symbolic-v1")             # 8268 numbers, 43 actions

Needs craftax (`pip install -e ".[craftax]"`). The mapping is exact: with `envs.AutoReset` around it, the same
keys and actions give Craftax's own auto-resetting env's observations, rewards and done flags (both split
the step key the same way). The achievements an episode unlocked are reported when it ends
(`episode_info_keys`), and learners log their rates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs.core import Box, Discrete, Environment

ENV_IDS = ("Craftax-Classic-Symbolic-v1", "Craftax-Symbolic-v1")


def _craftax_env(env_id: str):
    try:
        from craftax.craftax_env import make_craftax_env_from_name
    except ImportError as e:
        raise ImportError('the Craftax adapter needs craftax: pip install -e ".[craftax]"') from e
    return make_craftax_env_from_name(env_id, auto_reset=False)


class FromCraftax(Environment):
    """A Craftax env by id in the `envs` API (single-agent, discrete actions).

    - `done` is Craftax's game over. `info["truncated"]` is the time limit (`params.max_timesteps`) reached
      by a player who is alive (and, in Craftax, has not beaten the final boss); `info["terminated"]` the rest.
    - At the end of an episode `info` holds Craftax's `Achievements/<name>` (100 where unlocked in the episode,
      else 0) and `score` (their geometric mean with a 1% offset); learners average them over the episodes
      that ended (`episode_info_keys`).
    - `params` are Craftax's `EnvParams`; `params=` (a dict) overrides fields, e.g. `max_timesteps`.
    """

    def __init__(self, env_id: str = "Craftax-Classic-Symbolic-v1", params: dict | None = None):
        if env_id not in ENV_IDS:
            from envs.core import unknown_name
            raise unknown_name("Craftax environment (symbolic)", env_id, ENV_IDS)
        self.env_id = env_id
        self.env = _craftax_env(env_id)
        default_params = self.env.default_params
        if params:
            unknown = set(params) - set(type(default_params).__dataclass_fields__)
            if unknown:
                raise ValueError(f"{env_id} has no env params {sorted(unknown)}")
            default_params = default_params.replace(**params)
        self._default_params = default_params
        self.name = env_id
        self.supports_vma_checks = False  # Craftax's world generation scans over constant carries
        self.max_episode_steps = int(default_params.max_timesteps)
        self._obs_dim = int(np.prod(self.env.observation_space(default_params).shape))
        self._num_actions = int(self.env.action_space(default_params).n)
        self.episode_info_keys = tuple(sorted(self._probe_info_keys()))

    def _probe_info_keys(self) -> set[str]:
        def probe(key):
            _, state = self.env.reset_env(key, self._default_params)
            return self.env.step_env(key, state, jnp.int32(0), self._default_params)[4]
        keys = set(jax.eval_shape(probe, jax.random.PRNGKey(0)))
        return {k for k in keys if k.startswith("Achievements/") or k == "score"}

    @property
    def default_params(self):
        return self._default_params

    @property
    def obs_dim(self) -> int:
        return self._obs_dim

    def observation_space(self, params=None) -> Box:
        return Box(low=0.0, high=1.0, shape=(self._obs_dim,))

    def action_space(self, params=None) -> Discrete:
        return Discrete(self._num_actions)

    def reset(self, key, params=None):
        obs, state = self.env.reset_env(key, self._params(params))
        return obs.astype(jnp.float32).reshape(-1), state

    def step(self, key, state, action, params=None):
        params = self._params(params)
        obs, state, reward, done, info = self.env.step_env(key, state, action, params)
        done = jnp.asarray(done, bool)
        # the game-over rule without the time limit: what ends an episode for good
        ended_in_game = self.env.is_terminal(state, params.replace(max_timesteps=jnp.iinfo(jnp.int32).max))
        truncated = done & ~ended_in_game
        info = {k: info[k] for k in self.episode_info_keys}
        info.update(terminated=done & ~truncated, truncated=truncated)
        return obs.astype(jnp.float32).reshape(-1), state, jnp.asarray(reward, jnp.float32), done, info

    def __repr__(self) -> str:
        return f"FromCraftax({self.env_id!r})"
