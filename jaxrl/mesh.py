"""The device mesh: `runs` x `data`, `role` when actors and learners take separate devices, and `model` when a
language model is split over devices.

- `runs` splits independent runs (seeds, sweep settings; the leading axis of every state leaf and of the
  hyperparameters) over devices. Runs never talk to each other, so this axis costs no communication.
- `data` splits one run's batch (environments, prompts) over devices; parameters are replicated along
  it (or, for a pretrained language model, stored split over it: FSDP) and gradients are averaged over it.
- `role` (only with `mesh.split_actor`, size 2) gives each run two groups of devices: the actors (role 0)
  sample the next batch while the learners (role 1) learn from an earlier one (`actor.max_staleness` >= 1). State
  is replicated along it; the update exchanges the sampled batch and the new parameters once per update.
- `model` (only when `mesh.model_devices` > 1) splits a pretrained language model's attention heads, MLP units
  and vocabulary over the devices of each data group (tensor parallel). The training programs handle `runs` and
  `data` themselves (`shard_map`); along `model` XLA partitions them from the parameters' shardings.

Randomness that belongs to one environment is derived from its *global* index, so a run gives the same
numbers on 1 device or on 8, whichever way they are split (up to float summation order).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

RUN_AXIS = "runs"
DATA_AXIS = "data"
MODEL_AXIS = "model"
ROLE_AXIS = "role"
RUNS = P(RUN_AXIS)  # leaves [R, ...]: runs split over the `runs` axis, whole along `data`


def make_mesh(num_devices: int = 0, run_devices: int = 1, model_devices: int = 1, split_actor: bool = False) -> Mesh:
    """A (runs, data) mesh over the first `num_devices` devices of every process (0 means all of them),
    `run_devices` along `runs` and the rest along `data`; with `model_devices` > 1 a (runs, data, model) mesh,
    `model` the innermost axis; with `split_actor` a `role` axis of 2 before `data` (actors, then learners).

    Devices are taken in `jax.devices()` order, process by process, with `data` (then `model`) the inner axes:
    a run's gradient average stays inside a host whenever its data axis fits on one.
    """
    available = jax.devices()
    if num_devices < 0 or num_devices > len(available):
        raise ValueError(f"mesh.num_devices={num_devices} but {len(available)} devices are available")
    n = num_devices or len(available)
    if run_devices < 1 or n % run_devices:
        raise ValueError(f"mesh.run_devices={run_devices} does not divide the {n} devices of the mesh")
    if model_devices < 1 or (n // run_devices) % model_devices:
        raise ValueError(f"mesh.model_devices={model_devices} does not divide the {n // run_devices} devices left "
                         f"for each run's data groups (mesh.num_devices / mesh.run_devices)")
    roles = 2 if split_actor else 1
    if (n // run_devices // model_devices) % roles:
        raise ValueError(f"mesh.split_actor gives each run's actors and learners half of its "
                         f"{n // run_devices // model_devices} data devices: that needs an even number")
    split = model_devices > 1  # (a `model` axis only where it splits something)
    shape = (run_devices, *((roles,) if split_actor else ()), n // run_devices // model_devices // roles,
             *((model_devices,) if split else ()))
    names = (RUN_AXIS, *((ROLE_AXIS,) if split_actor else ()), DATA_AXIS, *((MODEL_AXIS,) if split else ()))
    return Mesh(np.array(available[:n]).reshape(shape), names)


def mesh_for_runs(options, num_runs: int) -> Mesh:
    """The mesh a config's `mesh` options (num_devices, run_devices, model_devices) give `num_runs` runs;
    run_devices 0 gives the runs axis as many devices as divide both the mesh and the runs (runs need no
    communication)."""
    num_devices = options.num_devices or jax.device_count()
    model_devices = options.get("model_devices", 1)  # (a run saved before the key existed has none)
    split_actor = options.get("split_actor", False)  # (only the algorithms that can split have the key)
    run_devices = options.run_devices or auto_run_devices(num_devices // model_devices // (1 + split_actor), num_runs)
    mesh = make_mesh(options.num_devices, run_devices, model_devices, split_actor)
    check_runs(num_runs, mesh)
    return mesh


def split_actor(mesh: Mesh) -> bool:
    """Whether actors and learners have devices of their own (a `role` axis)."""
    return ROLE_AXIS in mesh.axis_names


def model_size(mesh: Mesh) -> int:
    """Devices along the `model` axis (1 when the mesh has none)."""
    return mesh.shape.get(MODEL_AXIS, 1)


def check_no_model_axis(mesh: Mesh, what: str) -> None:
    """Raise before compiling when the mesh splits a model over devices for a run whose model is not split."""
    if model_size(mesh) > 1:
        raise ValueError(f"mesh.model_devices={model_size(mesh)} splits a pretrained language model's layers over "
                         f"devices; {what}: leave it at 1")


def manual_axes(mesh: Mesh) -> frozenset:
    """The axes the training programs split by hand under `shard_map` (all but `model`, which XLA partitions)."""
    return frozenset(name for name in mesh.axis_names if name != MODEL_AXIS)


def manual_spec(spec: P) -> P:
    """`spec` without `model`: what `shard_map` is told of a leaf whose `model` split XLA handles."""
    return P(*[None if entry == MODEL_AXIS else entry for entry in spec])


def auto_run_devices(num_devices: int, num_runs: int) -> int:
    """The most devices the `runs` axis can take: the largest divisor of `num_devices` that divides
    `num_runs`. Splitting runs needs no communication, so it is preferred to splitting each run's batch."""
    return max(d for d in range(1, num_devices + 1) if num_devices % d == 0 and num_runs % d == 0)


def check_divisible(what: str, size: int, mesh: Mesh) -> None:
    """Raise before compiling when `size` items of one run cannot be split evenly over the `data` axis."""
    n = mesh.shape[DATA_AXIS]
    if size % n:
        raise ValueError(f"{what}={size} does not divide over the {n} devices of the data axis; choose a "
                         f"multiple of {n} (or set mesh.num_devices / mesh.run_devices)")


def check_runs(num_runs: int, mesh: Mesh) -> None:
    """Raise before compiling when `num_runs` runs cannot be split evenly over the `runs` axis."""
    n = mesh.shape[RUN_AXIS]
    if num_runs % n:
        raise ValueError(f"{num_runs} runs (seeds x settings) do not divide over the {n} devices of the runs "
                         f"axis; set mesh.run_devices to a divisor of {num_runs}")


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def per_run(mesh: Mesh) -> NamedSharding:
    """Leaves [R, ...] split over the runs axis (and replicated along `data`)."""
    return NamedSharding(mesh, RUNS)


def over_local_runs(fn, in_axes: tuple, sequential: bool = False):
    """`jax.vmap(fn, in_axes)` over this device's runs (outputs on axis 0), except that a single run is a
    plain call of `fn` on the arguments with that axis squeezed out; `sequential`: one run after another
    (`lax.map`), for programs that call the host (envs stepped by callbacks), which vmap cannot batch where a
    loop or branch depends on the run.

    Same results; the reason is speed: XLA:CPU compiles the program with a leading axis of size 1 much
    worse (a GRPO step on tokens at benchmarks/grpo_tokens.py sizes: 24.7 ms squeezed against 25.9 ms
    vmapped, medians of 3 runs, and the vmapped one varies more). `in_axes`: one
    entry per argument, 0 (mapped) or None (shared).
    """
    if any(axis not in (0, None) for axis in in_axes):
        raise ValueError(f"in_axes must be 0 or None per argument, got {in_axes}")
    vmapped = jax.vmap(fn, in_axes)

    def one_by_one(*args):
        mapped = [arg for arg, axis in zip(args, in_axes) if axis == 0]

        def one(per_run):
            per_run = iter(per_run)
            return fn(*[next(per_run) if axis == 0 else arg for arg, axis in zip(args, in_axes)])
        return jax.lax.map(one, mapped)

    def run(*args):
        sizes = {leaf.shape[0] for arg, axis in zip(args, in_axes) if axis == 0 for leaf in jax.tree.leaves(arg)}
        if sizes != {1}:
            return (one_by_one if sequential else vmapped)(*args)
        squeezed = [arg if axis is None else jax.tree.map(lambda x: x[0], arg) for arg, axis in zip(args, in_axes)]
        return jax.tree.map(lambda x: x[None], fn(*squeezed))

    return run


@jax.custom_batching.custom_vmap
def _max_over_vmapped(x: jax.Array) -> jax.Array:
    """x itself; under vmap, the maximum over the mapped axis, unmapped (every mapped call sees one value)."""
    return x


@_max_over_vmapped.def_vmap
def _max_over_vmapped_rule(axis_size, in_batched, x):
    del axis_size
    return (_max_over_vmapped(jnp.max(x, axis=0)) if in_batched[0] else x), False


def agreed_max(x: jax.Array) -> jax.Array:
    """The maximum of `x` (a scalar) over the devices of the `data` axis and over the runs vmapped on this
    device: one value that every run of a data group agrees on. A `lax.switch` on it then takes one branch (an
    index that differs between vmapped runs would make it compute every branch and select) and every device of
    the group takes the same one (the branches may hold collectives over `data`). Inside `shard_map`."""
    return _max_over_vmapped(jax.lax.pmax(x, DATA_AXIS))


def runs_of(hyperparams, num_runs: int, mesh: Mesh):
    """Hyperparameters with a leading run axis [R], placed on the mesh: scalar leaves are shared by every
    run (broadcast), leaves [R] give each run its own value (a sweep)."""
    def expand(x):
        x = jnp.asarray(x)
        if x.ndim == 0:
            return jnp.broadcast_to(x, (num_runs,))
        if x.shape != (num_runs,):
            raise ValueError(f"a hyperparameter has shape {x.shape}; expected a scalar or one value per run "
                             f"({num_runs},)")
        return x
    check_runs(num_runs, mesh)
    return jax.device_put(jax.tree.map(expand, hyperparams), per_run(mesh))


def local_indices(num_local: int) -> jax.Array:
    """int32 [num_local]: global indices of this device's items (inside `shard_map` over DATA_AXIS)."""
    return jax.lax.axis_index(DATA_AXIS) * num_local + jnp.arange(num_local)


def local_share(x: jax.Array, axis: int = 0) -> jax.Array:
    """This device's contiguous share of a global `axis` (inside `shard_map` over DATA_AXIS)."""
    num_local = x.shape[axis] // jax.lax.axis_size(DATA_AXIS)
    start = jax.lax.axis_index(DATA_AXIS) * num_local
    return jax.lax.dynamic_slice_in_dim(x, start, num_local, axis=axis)


def gather_shares(tree):
    """Every device's leaves [n, ...] concatenated in device order -> [n * devices, ...] (inside `shard_map`
    over DATA_AXIS; the inverse of `local_share`).

    A sum of zero-padded copies rather than `all_gather`, so that the result is typed as the same on every
    device (state replicated over the data axis may be written with it); adding zeros is exact."""
    def one(x):
        n, dtype = x.shape[0], x.dtype
        x = x.astype(jnp.int32) if dtype == jnp.bool_ else x
        full = jnp.zeros((n * jax.lax.axis_size(DATA_AXIS), *x.shape[1:]), x.dtype)
        full = jax.lax.dynamic_update_slice_in_dim(full, x, jax.lax.axis_index(DATA_AXIS) * n, axis=0)
        return jax.lax.psum(full, DATA_AXIS).astype(dtype)

    return jax.tree.map(one, tree)


def per_item_keys(key: jax.Array, num_local: int) -> jax.Array:
    """[num_local, 2] keys, one per local item, that depend only on the item's global index."""
    return jax.vmap(jax.random.fold_in, (None, 0))(key, local_indices(num_local))


def split_over_data(x) -> bool:
    """Whether `x` (inside `shard_map`) holds a different part on each device of the `data` axis: a parameter
    stored sharded (fully sharded data parallel), as opposed to one replicated along it."""
    return DATA_AXIS in jax.typeof(x).mat.varying


def global_norm(tree) -> jax.Array:
    """The L2 norm of every leaf of `tree` together, where leaves split over `data` (inside `shard_map`) count
    every device's part once and the other leaves are the same on every device."""
    import optax

    leaves = jax.tree.leaves(tree)
    split = [x for x in leaves if split_over_data(x)]
    if not split:
        return optax.tree.norm(tree)  # (exactly optax's, where nothing is split)
    whole = [x for x in leaves if not split_over_data(x)]
    squares = jax.lax.psum(optax.tree.norm(split, squared=True), DATA_AXIS)
    return jnp.sqrt(squares + optax.tree.norm(whole, squared=True))


def varying(tree):
    """Mark the leaves of `tree` as varying over both mesh axes where they are not yet (inside `shard_map`).

    Two uses: gradients taken with respect to replicated parameters cast this way stay per device,
    instead of being summed over devices implicitly (the transpose of broadcasting them); and a loop
    carry built from constants gets the type of the per-device values the loop body makes of it.
    """
    def cast(x):  # (pcast refuses a value that is varying already)
        missing = tuple(a for a in (RUN_AXIS, DATA_AXIS) if a not in jax.typeof(x).mat.varying)
        return jax.lax.pcast(x, missing, to="varying") if missing else x
    return jax.tree.map(cast, tree)


def zeros_like_abstract(shape: jax.ShapeDtypeStruct) -> jax.Array:
    """Zeros of `shape` (from `jax.eval_shape` inside `shard_map`) varying over the same mesh axes, so that
    they can start a loop carry that the loop body fills with such values."""
    zeros = jnp.zeros(shape.shape, shape.dtype)
    axes = tuple(sorted(shape.manual_axis_type.varying)) if shape.manual_axis_type is not None else ()
    return jax.lax.pcast(zeros, axes, to="varying") if axes else zeros


def _summable(x: jax.Array) -> tuple[jax.Array, Callable]:
    """`x` as a type `psum` takes (PRNG keys as their data, booleans as int32) and the way back."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        return jax.random.key_data(x), lambda y: jax.random.wrap_key_data(y, impl=impl)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.int32), lambda y: y.astype(jnp.bool_)
    return x, lambda y: y


def by_role(fns: tuple[Callable, ...], *args) -> tuple:
    """`(fns[0](*args), fns[1](*args), ...)`, each computed on the devices of its role only and handed to every
    device of the `role` axis (inside `shard_map` on a mesh with one). One branch (`lax.switch` on the role, the
    same for every run on a device, so it stays a branch under vmap) computes a device's own role's function and
    zeros for the others; one sum over `role` then gives every device every result (adding zeros is exact, and
    the sum is typed as the same on every device, as replicated state must be). One branch and one sum, so that
    no device waits for another's result before doing its own work."""
    way_back = {}

    def summable(fn, *args):
        leaves, tree = jax.tree.flatten(fn(*args))
        pairs = [_summable(x) for x in leaves]
        way_back[fn] = tree, [back for _, back in pairs]
        return [x for x, _ in pairs]

    shapes = [jax.eval_shape(functools.partial(summable, fn), *args) for fn in fns]

    def branch(role):
        def run(*args):
            return [summable(fn, *args) if r == role else [zeros_like_abstract(s) for s in shapes[r]]
                    for r, fn in enumerate(fns)]
        return run

    role = jax.lax.axis_index(ROLE_AXIS)
    out = jax.lax.switch(role, [branch(r) for r in range(len(fns))], *args)
    mine = [role == r for r in range(len(fns))]
    summed = jax.lax.psum([[jnp.where(mine[r], x, jnp.zeros_like(x)) for x in part] for r, part in enumerate(out)],
                          ROLE_AXIS)
    results = []
    for fn, part in zip(fns, summed):
        tree, backs = way_back[fn]
        results.append(jax.tree.unflatten(tree, [back(x) for back, x in zip(backs, part)]))
    return tuple(results)
