"""How a `Decoder`'s parameters split over a device mesh: fully sharded data parallel over the `data` axis (every
weight matrix split along its hidden dimension D) and, when the mesh has a `model` axis, tensor parallel over it
(attention heads, the MLP's hidden units and the vocabulary split). Norms and biases stay whole (they are small).

    shardings = models.sharding.param_shardings(config, mesh)      # a tree of NamedSharding
    lm = models.from_pretrained(name, shardings=shardings)          # each device reads only its shard
    loss = jax.jit(loss_fn)(lm.params, batch)                       # XLA gathers and reduces as needed

A dimension is split only when the mesh axis divides it; `param_specs` says which were.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl.mesh import DATA_AXIS, MODEL_AXIS
from jaxrl.models.config import ModelConfig
from jaxrl.models.decoder import VALUE_HEAD, layer_shapes, param_shapes

# Per parameter, the axis (of its shape) each mesh axis splits: `data` the hidden dimension D (FSDP), `model`
# the heads, MLP units or vocabulary (tensor parallel). Stacked layer parameters count their leading layer axis.
SPLITS = {
    "embed": {DATA_AXIS: 1, MODEL_AXIS: 0},  # [V, D]
    "lm_head": {DATA_AXIS: 0, MODEL_AXIS: 1},  # [D, V]
    "q": {DATA_AXIS: 1, MODEL_AXIS: 2}, "k": {DATA_AXIS: 1, MODEL_AXIS: 2}, "v": {DATA_AXIS: 1, MODEL_AXIS: 2},
    "o": {DATA_AXIS: 3, MODEL_AXIS: 1},  # [L, N, Dh, D]
    "gate": {DATA_AXIS: 1, MODEL_AXIS: 2}, "up": {DATA_AXIS: 1, MODEL_AXIS: 2},  # [L, D, F]
    "down": {DATA_AXIS: 2, MODEL_AXIS: 1},  # [L, F, D]
}


def spec_for(name: str, shape: tuple[int, ...], axis_sizes: dict[str, int]) -> P:
    """The PartitionSpec of one parameter: each mesh axis of `axis_sizes` (name -> size) on the dimension SPLITS
    names, where it divides that dimension; everything else whole."""
    dims = [None] * len(shape)
    for mesh_axis, dim in SPLITS.get(name, {}).items():
        size = axis_sizes.get(mesh_axis, 1)
        if size > 1 and shape[dim] % size == 0:
            dims[dim] = mesh_axis
    return P(*dims)


def param_specs(config: ModelConfig, mesh: Mesh) -> dict:
    """{"params": tree of PartitionSpec} matching `Decoder(config)`'s parameters."""
    sizes = {axis: mesh.shape[axis] for axis in (DATA_AXIS, MODEL_AXIS) if axis in mesh.shape}
    c = config
    tree = {"embed": spec_for("embed", (c.vocab_size, c.hidden_size), sizes), "final_norm": P(),
            "layers": {name: spec_for(name, shape, sizes) for name, shape in layer_shapes(c).items()}}
    if not c.tie_embeddings:
        tree["lm_head"] = spec_for("lm_head", (c.hidden_size, c.vocab_size), sizes)
    if c.value_head:
        tree[VALUE_HEAD] = {"kernel": P(), "bias": P()}
    return {"params": tree}


def param_shardings(config: ModelConfig, mesh: Mesh) -> dict:
    """`param_specs` as NamedShardings on `mesh`."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(config, mesh),
                        is_leaf=lambda x: isinstance(x, P))


def stored_specs(config: ModelConfig, axis_sizes: dict[str, int]) -> dict[str, P]:
    """Parameter name -> `spec_for` its stored shape (stacked layers whole) over mesh axes of `axis_sizes`."""
    return {name: spec_for(name, shape, axis_sizes) for name, shape in param_shapes(config).items()}


def data_dims(config: ModelConfig, data_size: int) -> dict[str, int]:
    """Parameter name -> the dimension of its stored shape that FSDP splits over a `data` axis of `data_size`
    devices (those SPLITS names and the size divides)."""
    return {name: tuple(spec).index(DATA_AXIS)
            for name, spec in stored_specs(config, {DATA_AXIS: data_size}).items() if DATA_AXIS in spec}


def fully_sharded(config: ModelConfig, data_size: int) -> ModelConfig:
    """`config` whose Decoder gathers each parameter that `data_dims` splits as it is used (inside `shard_map`)."""
    return dataclasses.replace(config, fsdp_dims=tuple(sorted(data_dims(config, data_size).items())),
                               fsdp_size=data_size)


def bytes_per_device(tree) -> dict:
    """Device -> bytes of `tree`'s arrays it holds (its addressable shards)."""
    held: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + int(np.prod(shard.data.shape)) * leaf.dtype.itemsize
    return held


def model_mesh(data: int = 0, model: int = 1) -> Mesh:
    """A (data, model) mesh over the first data * model devices (data 0: all devices / model)."""
    devices = jax.devices()
    data = data or len(devices) // model
    if data * model > len(devices) or data < 1:
        raise ValueError(f"a {data} x {model} mesh needs {data * model} devices; {len(devices)} are available")
    return Mesh(np.array(devices[:data * model]).reshape(data, model), (DATA_AXIS, MODEL_AXIS))
