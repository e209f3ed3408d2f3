"""Environments that step on the host (gymnasium's, Atari's through ale-py) inside jaxrl's compiled programs.

    env = envs.make("gymnasium", env_id="CartPole-v1")
    env = envs.make("gymnasium", env_id="ALE/Breakout-v5", obs_type="ram")   # pip install ale-py

jaxrl's learners roll out inside one compiled program. An environment written in Python or C++ joins it through
a host callback (`jax.experimental.io_callback`): a batch of envs takes one callback per step, whatever vmaps
batch it (envs, runs), and the program waits for it. Such a step costs real host CPU, which is what the
actor/learner split (`mesh.split_actor`, `jaxrl.engine.staleness`) overlaps with learning on another device.

The host keeps each env's instance under a *slot*: the key data of the key it was reset with. A vmap that would
broadcast one env's state to several calls (one env stepped twice at once) is refused.
The program's state holds the slot, the env's step count and the first observation of the episode the host
started when the last one ended; so:

- episodes restart on the host in the step that ends them (gymnasium's "same step" auto-reset): `step`
  returns the ended episode's last observation and `restart` the new one's first (`envs.AutoReset` then keeps
  it), so a time limit can be bootstrapped from the final observation;
- a run is reproducible: each env is seeded from its slot, so the same seed gives the same episodes, on any
  number of devices (slots come from each env's global key);
- the host's state is not in the checkpoint: a resumed run, or a state stepped twice (an update timed and
  thrown away), finds its envs where they are, not where the state says. The step count catches it: a step
  from a count the host has left raises, naming the env; a resumed run (no instance yet) starts the env's
  episodes again from its seed.

Observations are flattened to float32 [obs_dim]; actions are `Discrete(n)` or a `Box` [d] as the env declares.
`done` = terminated | truncated; `info["truncated"]` is the time limit where the episode did not terminate.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback

from envs.core import Box, Discrete, Environment, vary_over, varying_axes


def _gymnasium():
    try:
        import gymnasium
    except ImportError as e:
        raise ImportError('host environments need gymnasium: pip install -e ".[gymnasium]" (Atari: ".[atari]")') from e
    return gymnasium


@struct.dataclass
class HostEnvState:
    slot: jax.Array  # uint32 [2]: the reset key's data
    steps: jax.Array  # int32: steps this env has taken (the host checks it against its own)
    reset_obs: jax.Array  # float32 [obs_dim]: the first observation of the episode the last step started


class HostEnvs:
    """The host side: gymnasium env instances by slot, reset and stepped in batches (thread-safe: several
    devices call back at once). Past `keep` instances, the half least recently used are closed, so that
    evaluations (which reset fresh slots each time) do not pile them up; a training batch, used every step, stays."""

    def __init__(self, make: Callable[[], Any], obs_dim: int, action_shape: tuple = (), keep: int = 4096):
        self.make, self.obs_dim, self.action_shape, self.keep = make, obs_dim, action_shape, keep
        self.envs: dict[tuple, list] = {}  # slot -> [env, steps taken, last used]
        self.batches: dict[bytes, list] = {}  # the slots of a batch stepped before -> its entries
        self.clock = 0  # host calls so far (an entry's "last used")
        self.lock = threading.Lock()

    def _obs(self, obs) -> np.ndarray:
        return np.asarray(obs, np.float32).reshape(self.obs_dim)

    @staticmethod
    def _seed(slot: tuple) -> int:
        return (slot[0] << 32 | slot[1]) % (2 ** 63)

    def _fresh(self, slot: tuple):
        """A new instance for `slot`, reset from its seed: (entry, first obs)."""
        env = self.make()
        obs, _ = env.reset(seed=self._seed(slot))
        return [env, 0, self.clock], self._obs(obs)

    def _remember(self, slot: tuple, entry: list) -> None:
        old = self.envs.get(slot)
        if old is not None and old[0] is not entry[0]:
            old[0].close()
        self.envs[slot] = entry
        self.batches.clear()  # (a batch may hold the instance replaced, or one closed below)
        if len(self.envs) > self.keep:
            by_use = sorted(self.envs, key=lambda s: self.envs[s][2])
            for stale in by_use[:len(by_use) // 2]:
                if self.envs[stale][2] < self.clock:  # (never one this call uses)
                    self.envs.pop(stale)[0].close()

    def reset(self, slots: np.ndarray) -> np.ndarray:
        """slots uint32 [..., 2] -> first observations float32 [..., obs_dim]."""
        flat = slots.reshape(-1, 2)
        out = np.zeros((len(flat), self.obs_dim), np.float32)
        with self.lock:
            self.clock += 1
            self.keep = max(self.keep, 4 * len(flat))
            for i, slot in enumerate(map(tuple, flat.tolist())):
                entry, out[i] = self._fresh(slot)
                self._remember(slot, entry)
        return out.reshape(*slots.shape[:-1], self.obs_dim)

    def _entry(self, slot: tuple, steps: int) -> list:
        """The instance `slot` names, checked to be at `steps`."""
        entry = self.envs.get(slot)
        if entry is None:  # a resumed run: this process never saw the env, which starts again from its seed
            entry, _ = self._fresh(slot)
            entry[1] = steps
            self._remember(slot, entry)
        if entry[1] != steps:
            raise RuntimeError(f"host env {slot} is at step {entry[1]} but the program steps it from step {steps}: "
                               "a state whose envs live on the host can be stepped once (not timed, forked or "
                               "replayed)")
        return entry

    def step(self, ids: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """ids uint32 [..., 3] (slot, steps taken), actions [..., *action_shape] -> float32 [..., 2 * obs_dim + 3]:
        the observation, reward, terminated, truncated and the first observation of the episode the host started
        where one ended (each env whose episode ends is reset at once). A batch stepped before finds its
        instances in one lookup; each env's step count is still checked."""
        batch, flat = ids.shape[:-1], ids.reshape(-1, 3)
        steps = flat[:, 2].astype(np.int64)
        flat_actions = actions.reshape(len(flat), *actions.shape[len(batch):])
        chosen = (flat_actions.tolist() if not self.action_shape
                  else [a.reshape(self.action_shape) for a in flat_actions])
        d = self.obs_dim
        out = np.zeros((len(flat), 2 * d + 3), np.float32)
        key = flat[:, :2].tobytes()
        with self.lock:
            self.clock += 1
            entries = self.batches.get(key)
            if entries is None:
                entries = self.batches[key] = [self._entry(tuple(slot), step) for slot, step in
                                               zip(flat[:, :2].tolist(), steps.tolist())]
            for i, (entry, action) in enumerate(zip(entries, chosen)):
                if entry[1] != steps[i]:
                    entry = entries[i] = self._entry(tuple(flat[i, :2].tolist()), int(steps[i]))
                obs, reward, terminated, truncated, _ = entry[0].step(action)
                out[i, :d], out[i, d:d + 3] = self._obs(obs), (reward, terminated, truncated)
                if terminated or truncated:
                    out[i, d + 3:] = self._obs(entry[0].reset()[0])
                entry[1], entry[2] = entry[1] + 1, self.clock
        return out.reshape(*batch, 2 * d + 3)


def _typed_as_inputs(outputs, *inputs):
    """A host callback's outputs typed as varying over the mesh axes its inputs vary over (inside `shard_map` a
    callback's results are typed as the same on every device, which per-device envs' are not)."""
    return vary_over(outputs, frozenset().union(*map(varying_axes, inputs)))


def _batched_call(fn: Callable) -> Callable:
    """`fn(slot, *args)` (one host callback) that stays one callback under vmap: a batched call passes the whole
    batch. An unbatched slot with batched arguments would step one env several times at once: refused."""
    @jax.custom_batching.custom_vmap
    def call(slot, *args):
        return fn(slot, *args)

    @call.def_vmap
    def rule(axis_size, in_batched, slot, *args):
        if not in_batched[0]:
            raise ValueError("a host env's state is vmapped over as one env several times at once (its state is "
                             "not batched where the arguments are): give each call its own env (state)")
        args = [a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
                for a, batched in zip(args, in_batched[1:])]
        out = call(slot, *args)
        return out, jax.tree.map(lambda _: True, out)

    return call


class FromGymnasium(Environment):
    """A gymnasium environment (`gymnasium.make(env_id, **kwargs)`) stepped on the host. Single-agent."""

    host_state = True

    def __init__(self, env_id: str, **kwargs):
        gymnasium = _gymnasium()
        if env_id.startswith("ALE/"):
            try:
                import ale_py
            except ImportError as e:
                raise ImportError(f"{env_id} needs ale-py: pip install -e \".[atari]\"") from e
            gymnasium.register_envs(ale_py)
        try:
            probe = gymnasium.make(env_id, **kwargs)
        except gymnasium.error.Error as e:
            raise ValueError(f"gymnasium cannot make {env_id!r}: {e}") from e
        self.name, self.env_id, self.kwargs = env_id, env_id, kwargs
        space = probe.observation_space
        self.obs_shape = (int(np.prod(space.shape)),)
        action_space = probe.action_space
        if isinstance(action_space, gymnasium.spaces.Discrete):
            self._action_space = Discrete(int(action_space.n))
        elif isinstance(action_space, gymnasium.spaces.Box):
            self._action_space = Box(np.asarray(action_space.low, np.float32).reshape(-1),
                                     np.asarray(action_space.high, np.float32).reshape(-1),
                                     (int(np.prod(action_space.shape)),))
        else:
            raise ValueError(f"{env_id}: only Discrete and Box action spaces are supported, not {action_space}")
        low = np.asarray(np.broadcast_to(space.low, space.shape), np.float32).reshape(-1)
        high = np.asarray(np.broadcast_to(space.high, space.shape), np.float32).reshape(-1)
        self._observation_space = Box(low, high, self.obs_shape)
        self.max_episode_steps = probe.spec.max_episode_steps if probe.spec is not None else None
        probe.close()
        self.host = HostEnvs(lambda: gymnasium.make(env_id, **kwargs), self.obs_shape[0], action_space.shape)
        self._reset = _batched_call(self._reset_callback)
        self._step = _batched_call(self._step_callback)

    def _reset_callback(self, slot):
        shape = jax.ShapeDtypeStruct((*slot.shape[:-1], *self.obs_shape), jnp.float32)
        obs = io_callback(lambda s: self.host.reset(np.asarray(s)), shape, slot, ordered=False)
        return _typed_as_inputs(obs, slot)

    def _step_callback(self, ids, action):
        shape = jax.ShapeDtypeStruct((*ids.shape[:-1], 2 * self.obs_shape[0] + 3), jnp.float32)
        out = io_callback(lambda i, a: self.host.step(np.asarray(i), np.asarray(a)), shape, ids, action, ordered=False)
        return _typed_as_inputs(out, ids, action)

    def reset(self, key: jax.Array, params=None):
        data = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
        slot = data.astype(jnp.uint32)
        obs = self._reset(slot)
        return obs, HostEnvState(slot, jnp.int32(0), obs)

    def step(self, key: jax.Array, state: HostEnvState, action: jax.Array, params=None):
        ids = jnp.concatenate([state.slot, state.steps.astype(jnp.uint32)[None]])
        out = self._step(ids, action)  # (one array: each output of a host callback costs a conversion)
        d = self.obs_shape[0]
        obs, reward, reset_obs = out[:d], out[d], out[d + 3:]
        terminated, truncated = out[d + 1] > 0, out[d + 2] > 0
        info = {"terminated": terminated, "truncated": truncated & ~terminated}
        return obs, HostEnvState(state.slot, state.steps + 1, reset_obs), reward, terminated | truncated, info

    def restart(self, key: jax.Array, state: HostEnvState, params=None):
        """The episode the host started in the step that ended the last one (no host call)."""
        return state.reset_obs, state

    def observation_space(self, params=None) -> Box:
        return self._observation_space

    def action_space(self, params=None):
        return self._action_space
