"""The optimiser every algorithm builds, and its learning-rate schedules.

Built inside the traced program from traced numbers (learning rate, clipping norm, weight decay), so that
one compiled program serves a whole sweep over them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxrl import mesh as mesh_lib
from jaxrl.config import GRAD_CLIPS, SCHEDULES  # declared with their config keys
from jaxrl.knobs import declared


def make_optimizer(learning_rate: jax.Array, max_grad_norm: jax.Array, adam_eps: float, grad_clip: str = "joint",
                   weight_decay: jax.Array | None = None) -> optax.GradientTransformation:
    """Gradient-norm clipping, Adam, optional decoupled weight decay (AdamW), then the learning rate.

    grad_clip "joint" clips the norm over all parameters; "per_network" clips each network's (the top-level
    modules of a flax params tree, e.g. actor and critic) by itself. Adam is element-wise, so the latter is
    exactly one optimiser per network, each with its own clipping. `weight_decay=None` leaves the decay
    out of the chain (and of the optimiser state); 0 keeps it in with no effect.
    """
    if grad_clip not in GRAD_CLIPS:
        raise ValueError(f"unknown grad_clip {grad_clip!r}; known: {', '.join(GRAD_CLIPS)}")
    clip = clip_by_global_norm(max_grad_norm) if grad_clip == "joint" else clip_each_network(max_grad_norm)
    decay = () if weight_decay is None else (optax.add_decayed_weights(weight_decay),)
    return optax.chain(clip, optax.scale_by_adam(eps=adam_eps), *decay, optax.scale(-learning_rate))


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """An algorithm's optimiser, its static choices read from the config's `optim` keys (every family holds
    one): `optimizer(hp, update_step)` is update `update_step`'s (0-based) optax optimiser, `make_optimizer`
    with `hp.max_grad_norm` clipping (`grad_clip`), decoupled weight decay `hp.weight_decay` where
    `weight_decay`, and the learning rate `hp.learning_rate` on `schedule` (`scheduled_learning_rate`:
    `warmup_updates` of `num_updates`)."""

    num_updates: int = 1  # over the run: the schedule's length
    schedule: str = declared("optim.schedule").field()
    warmup_updates: int = declared("optim.warmup_updates").field()
    adam_eps: float = declared("optim.adam_eps").field()
    grad_clip: str = declared("optim.grad_clip").field()
    weight_decay: bool = declared("optim.weight_decay").field(convert=lambda decay: decay > 0)  # (hp's the rate)

    def __call__(self, hp, update_step: jax.Array, peak: jax.Array | None = None,
                 decays: bool = True) -> optax.GradientTransformation:
        """A learner with an optimiser per part of its parameters (SAC's critics, actor and temperature) gives
        each its own `peak` learning rate, and `decays=False` where none decays."""
        learning_rate = scheduled_learning_rate(hp.learning_rate if peak is None else peak, update_step,
                                                self.schedule, self.warmup_updates, self.num_updates)
        return make_optimizer(learning_rate, hp.max_grad_norm, self.adam_eps, self.grad_clip,
                              hp.weight_decay if self.weight_decay and decays else None)


def clip_by_global_norm(max_norm) -> optax.GradientTransformation:
    """optax.clip_by_global_norm with the norm of `jaxrl.mesh.global_norm`: gradients of parameters stored sharded
    over `data` count each device's part once (the same clipping as with every parameter replicated)."""
    def update(updates, state, params=None):
        del params
        norm = mesh_lib.global_norm(updates)
        within = norm < max_norm  # (optax's arithmetic, so that unsharded runs clip bit for bit as before)
        return jax.tree.map(lambda g: jax.lax.select(within, g, (g / norm.astype(g.dtype)) * max_norm), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class MasterState(NamedTuple):
    master: Any  # float32 copies of the parameters
    inner: Any  # the wrapped optimiser's state (its moments float32 too)


def float32_master(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` on float32 master copies of low-precision (bfloat16) parameters: the moments and the accumulated
    parameters stay float32, and each update moves the parameters to the master's rounding. Without it, a
    fine-tuning step (a learning rate of 1e-6 on weights near 0.05) is below bfloat16's spacing there (2e-4) and
    is lost."""
    def init(params):
        master = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        return MasterState(master, inner.init(master))

    def update(updates, state, params=None):
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), updates)
        steps, inner_state = inner.update(grads, state.inner, state.master)
        master = optax.apply_updates(state.master, steps)
        moves = jax.tree.map(lambda m, p: (m.astype(p.dtype) - p).astype(p.dtype), master, params)
        return moves, MasterState(master, inner_state)

    return optax.GradientTransformation(init, update)


def clip_each_network(max_norm) -> optax.GradientTransformation:
    """Clip the gradient of every top-level module of a flax params tree ({"params": {name: tree}}) to
    global norm `max_norm` on its own."""
    clip = clip_by_global_norm(max_norm)

    def update(updates, state, params=None):
        del params
        networks = {name: clip.update(tree, clip.init(tree))[0] for name, tree in updates["params"].items()}
        return dict(updates, params=networks), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scheduled_learning_rate(peak: jax.Array, step: jax.Array, schedule: str, warmup_updates: int,
                            num_updates: int) -> jax.Array:
    """The learning rate of update `step` (0-based) of `num_updates`: `peak`, times a linear warm-up over the
    first `warmup_updates` (from 1 / warmup_updates of the peak), times the decay: "constant" (none), "linear"
    (1 - step / num_updates) or "cosine" (0.5 (1 + cos(pi step / num_updates)))."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    learning_rate = peak
    if warmup_updates:
        learning_rate = learning_rate * jnp.minimum(1.0, (step + 1) / warmup_updates)
    if schedule == "linear":
        learning_rate = learning_rate * (1.0 - step / num_updates)
    elif schedule == "cosine":
        progress = jnp.clip(step / max(num_updates, 1), 0.0, 1.0)
        learning_rate = learning_rate * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    return learning_rate
