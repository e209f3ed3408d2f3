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

from envs.adapters.gymnax import GymnaxStyle

ENV_IDS = ("Craftax-Classic-Symbolic-v1", "Craftax-Symbolic-v1")


def _craftax_env(env_id: str):
    try:
        from craftax.craftax_env import make_craftax_env_from_name
    except ImportError as e:
        raise ImportError('the Craftax adapter needs craftax: pip install -e ".[craftax]"') from e
    return make_craftax_env_from_name(env_id, auto_reset=False)


class FromCraftax(GymnaxStyle):
    """A Craftax env by id in the `envs` API (single-agent, discrete actions; see `GymnaxStyle`).

    - `done` is Craftax's game over. The time limit (`params.max_timesteps`) reached by a player who is alive
      (and, in Craftax, has not beaten the final boss) is a truncation; every other game over is terminal.
    - At the end of an episode `info` holds Craftax's `Achievements/<name>` (100 where unlocked in the episode,
      else 0) and `score` (their geometric mean with a 1% offset); learners average them over the episodes
      that ended (`episode_info_keys`).
    - `params=` (a dict) overrides fields of Craftax's `EnvParams`, e.g. `max_timesteps`.
    """

    supports_vma_checks = False  # Craftax's world generation scans over constant carries

    def __init__(self, env_id: str = "Craftax-Classic-Symbolic-v1", params: dict | None = None):
        if env_id not in ENV_IDS:
            from envs.core import unknown_name
            raise unknown_name("Craftax environment (symbolic)", env_id, ENV_IDS)
        env = _craftax_env(env_id)
        super().__init__(env, env_id, env.default_params, params, "max_timesteps")
        self.name = env_id
        self.episode_info_keys = tuple(sorted(self._probe_info_keys()))

    def _probe_info_keys(self) -> set[str]:
        def probe(key):
            _, state = self.env.reset_env(key, self._default_params)
            return self.env.step_env(key, state, jnp.int32(0), self._default_params)[4]
        keys = set(jax.eval_shape(probe, jax.random.PRNGKey(0)))
        return {k for k in keys if k.startswith("Achievements/") or k == "score"}

    def _end_flags(self, state, params, done):
        # the game-over rule without the time limit: what ends an episode for good
        ended_in_game = self.env.is_terminal(state, params.replace(max_timesteps=jnp.iinfo(jnp.int32).max))
        return done & ended_in_game, done & ~ended_in_game

    def _info(self, info):
        return {k: info[k] for k in self.episode_info_keys}
