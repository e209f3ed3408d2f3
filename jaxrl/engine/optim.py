"""The optimiser every algorithm builds, and its learning-rate schedules.

Built inside the traced program from traced numbers (learning rate, clipping norm, weight decay), so that
one compiled program serves a whole sweep over them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

GRAD_CLIPS = ("joint", "per_network")  # "per_network": each top-level network clipped apart, as two optimisers would


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
    clip = optax.clip_by_global_norm(max_grad_norm) if grad_clip == "joint" else clip_each_network(max_grad_norm)
    decay = () if weight_decay is None else (optax.add_decayed_weights(weight_decay),)
    return optax.chain(clip, optax.scale_by_adam(eps=adam_eps), *decay, optax.scale(-learning_rate))


def clip_each_network(max_norm) -> optax.GradientTransformation:
    """Clip the gradient of every top-level module of a flax params tree ({"params": {name: tree}}) to
    global norm `max_norm` on its own."""
    clip = optax.clip_by_global_norm(max_norm)

    def update(updates, state, params=None):
        del params
        networks = {name: clip.update(tree, clip.init(tree))[0] for name, tree in updates["params"].items()}
        return dict(updates, params=networks), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def linear_decay(learning_rate: jax.Array, step: jax.Array, num_updates: int) -> jax.Array:
    """learning_rate * (1 - step / num_updates): zero after the last update."""
    return learning_rate * (1.0 - step / num_updates)


def warmup_cosine(learning_rate: jax.Array, step: jax.Array, warmup_updates: int, num_updates: int) -> jax.Array:
    """Linear warm-up over `warmup_updates`, then cosine decay to zero at `num_updates`."""
    warm = jnp.minimum(1.0, (step + 1) / max(warmup_updates, 1))
    progress = jnp.clip(step / max(num_updates, 1), 0.0, 1.0)
    return learning_rate * warm * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
