"""The functional environment API shared by every jaxrl environment.

An environment object holds only static configuration (sizes, choices); everything that changes during
an episode lives in a state pytree and every number a sweep may vary lives in a params pytree:

    obs, state = env.reset(key, params)
    obs, state, reward, done, info = env.step(key, state, action, params)
    mask = env.avail_actions(state, params)          # bool [num_actions] (or [agents, num_actions])

`params` may be omitted (the env's `default_params` are used). Single-agent envs return obs `[obs_dim]`,
scalar reward and done; multi-agent envs (`multi_agent` true) carry a leading agent axis, even with one
agent, and offer `global_state(state, params)` for centralised critics. `done` is `terminated | truncated`;
`info` always holds both flags so that learners can bootstrap through time-limit truncation.
Vectorisation is the caller's `jax.vmap`; auto-reset and episode statistics are wrappers.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Discrete:
    """`n` choices, sampled as int32 in [0, n)."""

    n: int = struct.field(pytree_node=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, (), 0, self.n)

    def contains(self, x: jax.Array) -> jax.Array:
        return jnp.logical_and(x >= 0, x < self.n)


@struct.dataclass
class Box:
    """A float array of `shape` with elementwise bounds."""

    low: Any = struct.field(pytree_node=False)
    high: Any = struct.field(pytree_node=False)
    shape: tuple[int, ...] = struct.field(pytree_node=False)
    dtype: Any = struct.field(pytree_node=False, default=jnp.float32)

    def sample(self, key: jax.Array) -> jax.Array:
        low = jnp.broadcast_to(jnp.asarray(self.low, self.dtype), self.shape)
        high = jnp.broadcast_to(jnp.asarray(self.high, self.dtype), self.shape)
        # Unbounded dimensions are sampled from a unit normal instead of an infinite range.
        bounded = jnp.isfinite(low) & jnp.isfinite(high)
        uniform = jax.random.uniform(key, self.shape, self.dtype, jnp.where(bounded, low, 0.0),
                                     jnp.where(bounded, high, 1.0))
        return jnp.where(bounded, uniform, jax.random.normal(key, self.shape, self.dtype))

    def contains(self, x: jax.Array) -> jax.Array:
        return jnp.all((x >= self.low) & (x <= self.high))


class Environment:
    """Base class: subclasses implement `default_params`, `reset`, `step` and the spaces."""

    name: str = "environment"
    num_agents: int = 1
    multi_agent: bool = False  # True: obs, reward, done, actions and masks carry a leading agent axis.
    has_action_masks: bool = False  # True when `avail_actions` can forbid actions.
    max_episode_steps: int | None = None  # the time limit, when the env has one
    # Keys of `info` that describe the episode that just ended (e.g. Craftax's achievements), meaningful where
    # the episode ended: learners log their means over the episodes that ended.
    episode_info_keys: tuple[str, ...] = ()
    # False when `step` fails shard_map's varying-axis type checks (e.g. a lax.cond whose branches mix
    # per-device and replicated values, as in some third-party envs); learners then turn the checks off.
    supports_vma_checks: bool = True
    # True when the env lives on the host (stepped by callbacks from the program, `envs.adapters.gymnasium`):
    # runs on a device then go one after another rather than vmapped, and a state is stepped once.
    host_state: bool = False

    @property
    def default_params(self) -> Any:
        return None

    def _params(self, params):
        return self.default_params if params is None else params

    def reset(self, key: jax.Array, params=None) -> tuple[jax.Array, Any]:
        raise NotImplementedError

    def step(self, key: jax.Array, state, action: jax.Array, params=None):
        raise NotImplementedError

    def batch_step(self, keys: jax.Array, states, actions: jax.Array, params=None):
        """`step` for a batch of envs (keys [n, 2], states and actions with a leading [n]): `vmap`ped, unless a
        wrapper steps the batch jointly (`envs.AutoReset` with `reset_ratio`)."""
        return jax.vmap(self.step, in_axes=(0, 0, 0, None))(keys, states, actions, params)

    def restart(self, key: jax.Array, state, params=None) -> tuple[jax.Array, Any]:
        """The first (obs, state) of the next episode after `state`'s, for `envs.AutoReset`: a fresh `reset`
        unless the env restarts more cheaply (Brax's envs go back to their episode's first state, as Brax's own
        auto-reset does: a reset costs as much as a physics step)."""
        return self.reset(key, params)

    # Optional `observe(state, params=None) -> obs`: the observation as a function of the state alone, equal to
    # what `reset` and `step` return with that state. `envs.AutoReset` then observes only the state it keeps
    # (the step's or the restart's) instead of computing both observations and selecting one, which for envs
    # with large observations (SMAX: every unit as each ally sees it) is a large share of a step. Wrappers do
    # not forward it (one that changes observations would make it wrong).
    observe = None

    def observation_space(self, params=None) -> Box:
        raise NotImplementedError

    def action_space(self, params=None) -> Discrete:
        raise NotImplementedError

    @property
    def num_actions(self) -> int:
        return self.action_space().n

    @property
    def obs_dim(self) -> int:
        (dim,) = self.observation_space().shape
        return dim

    def avail_actions(self, state, params=None) -> jax.Array:
        """bool [num_actions]: every action is legal unless the env says otherwise."""
        return jnp.ones((self.num_actions,), dtype=bool)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def unknown_name(kind: str, name: str, known: Iterable[str]) -> ValueError:
    """The error for a name missing from a registry: the closest known name, then all of them."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {kind} {name!r}.{hint} Known {kind}s: {', '.join(known)}")


def override_params(default_params, overrides: dict | None, env_id: str):
    """A library's params dataclass with `overrides` ({field: value}) applied; a ValueError names any field
    it does not have."""
    if not overrides:
        return default_params
    fields = type(default_params).__dataclass_fields__
    unknown = set(overrides) - set(fields)
    if unknown:
        raise ValueError(f"{env_id} has no env params {sorted(unknown)}; its params: {', '.join(fields)}")
    return default_params.replace(**overrides)


def varying_axes(x) -> frozenset:
    """The mesh axes `x` (an array, a tracer, or a ShapeDtypeStruct from `jax.eval_shape`) varies over inside
    `shard_map` (none outside it)."""
    mat = x.manual_axis_type if isinstance(x, jax.ShapeDtypeStruct) else getattr(jax.typeof(x), "mat", None)
    return frozenset(mat.varying) if mat is not None else frozenset()


def vary_over(tree, axes: frozenset):
    """`tree`'s leaves typed as varying over the mesh `axes` too (inside `shard_map`): values the same on every device
    that must take the type of per-device ones (a loop carry started from constants, a host callback's results)."""
    def cast(x):
        missing = tuple(sorted(axes - varying_axes(x)))
        return jax.lax.pcast(x, missing, to="varying") if missing else x
    return jax.tree.map(cast, tree)
