"""Epochs of minibatch gradient steps on this device's samples, gradients averaged over the data axis."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxrl import mesh as mesh_lib
from jaxrl.mesh import DATA_AXIS


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


def gradient_step(loss_fn, optimizer, params, opt_state, batch, hp, step_scale=None):
    """One optimiser step on this device's `batch` (inside shard_map), gradients averaged over devices.

    loss_fn(params, batch, hp) -> (loss, aux). `step_scale` (a scalar, None: 1) multiplies the optimiser's
    update, as a learning rate scaled for this step would (Adam's update does not scale with the loss). Returns
    (params, opt_state, aux averaged over devices, with `grad_norm` before clipping).
    """
    # Differentiate per device, then average: without the cast, shard_map would already sum the
    # gradients of the replicated parameters over devices (the transpose of broadcasting them). A parameter
    # stored sharded over `data` (gathered where it is used) gets its part of the sum of every device's gradient
    # (the transpose of the gather): divided by the devices, it is the same average.
    sharded = jax.tree.map(mesh_lib.split_over_data, params)
    grads, aux = jax.grad(loss_fn, has_aux=True)(mesh_lib.varying(params), batch, hp)
    devices = jax.lax.axis_size(DATA_AXIS)
    grads = jax.tree.map(lambda g, split: g / devices if split else jax.lax.pmean(g, DATA_AXIS), grads, sharded)
    aux = dict(jax.lax.pmean(aux, DATA_AXIS), grad_norm=mesh_lib.global_norm(grads))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    if step_scale is not None:
        updates = jax.tree.map(lambda u: (u * step_scale).astype(u.dtype), updates)
    return optax.apply_updates(params, updates), opt_state, aux


def optimise(loss_fn, optimizer, params, opt_state, units, hp, key: jax.Array, num_epochs: int,
             num_minibatches: int, step_scale=None):
    """Epochs x minibatches of `gradient_step` (each step scaled by `step_scale`) on this device's units
    [n, U, ...] (dealt by `deal_minibatches`). Returns (params, opt_state, aux [epochs, minibatches])."""
    def minibatch_step(carry, batch):
        params, opt_state, aux = gradient_step(loss_fn, optimizer, *carry, batch, hp, step_scale)
        return (params, opt_state), aux

    def epoch(carry, key):
        return jax.lax.scan(minibatch_step, carry, deal_minibatches(key, units, num_minibatches))

    (params, opt_state), aux = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, num_epochs))
    return params, opt_state, aux
