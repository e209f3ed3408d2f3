"""The device mesh: the batch (environment) axis is split over devices, parameters are replicated.

Randomness that belongs to one environment is derived from its *global* index, so a run gives the same
numbers on 1 device or on 8 (up to float summation order).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def make_mesh(num_devices: int = 0) -> Mesh:
    """A 1-D mesh named `data` over the first `num_devices` local devices (0 means all of them)."""
    available = jax.devices()
    if num_devices < 0 or num_devices > len(available):
        raise ValueError(f"mesh.num_devices={num_devices} but {len(available)} devices are available")
    devices = available[: num_devices or len(available)]
    return Mesh(devices, (DATA_AXIS,))


def check_divisible(what: str, size: int, mesh: Mesh) -> None:
    """Raise before compiling when `size` items cannot be split evenly over the mesh's devices."""
    n = mesh.shape[DATA_AXIS]
    if size % n:
        raise ValueError(f"{what}={size} does not divide over {n} devices; choose a multiple of {n} "
                         f"(or set mesh.num_devices)")


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def local_indices(num_local: int) -> jax.Array:
    """int32 [num_local]: global indices of this device's items (inside `shard_map` over DATA_AXIS)."""
    return jax.lax.axis_index(DATA_AXIS) * num_local + jnp.arange(num_local)


def local_share(x: jax.Array, axis: int = 0) -> jax.Array:
    """This device's contiguous share of a global `axis` (inside `shard_map` over DATA_AXIS)."""
    num_local = x.shape[axis] // jax.lax.axis_size(DATA_AXIS)
    start = jax.lax.axis_index(DATA_AXIS) * num_local
    return jax.lax.dynamic_slice_in_dim(x, start, num_local, axis=axis)


def per_item_keys(key: jax.Array, num_local: int) -> jax.Array:
    """[num_local, 2] keys, one per local item, that depend only on the item's global index."""
    return jax.vmap(jax.random.fold_in, (None, 0))(key, local_indices(num_local))


def varying(tree):
    """Mark the leaves of `tree` that are not yet varying over DATA_AXIS as varying (inside `shard_map`).

    Two uses: gradients taken with respect to replicated parameters cast this way stay per device,
    instead of being summed over devices implicitly (the transpose of broadcasting them); and a loop
    carry built from constants gets the type of the per-device values the loop body makes of it.
    """
    def cast(x):  # (pcast refuses a value that is varying already)
        return x if DATA_AXIS in jax.typeof(x).mat.varying else jax.lax.pcast(x, DATA_AXIS, to="varying")
    return jax.tree.map(cast, tree)
