"""Learning from batches sampled earlier: the queue of `actor.max_staleness` = eta batches, and the actor/learner
split of the mesh (`mesh.split_actor`), for any algorithm whose update is "sample a batch, then learn from it".

With eta > 0 each update samples a batch with the parameters it starts from and learns from the batch sampled eta
updates before (by the parameters of then); the first eta updates only fill the queue. Sampling and learning then
depend on nothing of each other, which is what lets them run at once:

- on shared devices, in one program, one after the other (XLA does not overlap them; the layout changes nothing
  but the numbers, and stands in for the split's on a machine with one device);
- with `mesh.split_actor`, on the devices of the mesh's `role` axis: the actors (role 0) sample while the
  learners (role 1) learn, each skipping the other's work, and each hands its result to the other
  (`mesh.by_role`) once per update. The same numbers as the shared layout on the actors' devices alone.

The queue lives in the state (`pending`: {"batches": leaves [eta, ...], "filled": how many hold a sampled batch}),
so a checkpoint holds every batch in flight: a resumed run loses none and learns none twice.

An algorithm gives `sample(state, hp) -> (state, batch, metrics)` and `learn(state, batch, hp) -> (state,
metrics)`, both for one run on this device inside `shard_map`, and `Roles`: which state fields each side writes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, PartitionSpec as P

from jaxrl import mesh as mesh_lib
from jaxrl.knobs import Knob
from jaxrl.mesh import DATA_AXIS, RUN_AXIS, ROLE_AXIS

MAX_STALENESS = Knob("actor.max_staleness", 0, "eta: each update learns from the batch sampled eta updates before it, "
                     "by the policy of then, while it samples the next; 0: from its own", minimum=0)
SPLIT_ACTOR = Knob("mesh.split_actor", False, "actors and learners on devices of their own: half of each run's "
                   "devices sample the next batch while the other half learn (actor.max_staleness >= 1)")


@dataclasses.dataclass(frozen=True)
class Roles:
    """The state fields sampling writes (`actor`) and those learning writes (`learner`); no field is in both."""

    actor: tuple[str, ...]
    learner: tuple[str, ...]


def empty_queue(sample: Callable, state, hp_class: type, eta: int) -> dict:
    """eta batches of zeros shaped as `sample`'s for the whole batch (traced for their shapes on one abstract
    device, whose share is the whole batch), none filled. `state`: one run's, outside `shard_map`; `hp_class`:
    the hyperparameters' class."""
    one_device = AbstractMesh((1, 1), (RUN_AXIS, DATA_AXIS))
    whole = jax.shard_map(lambda st, h: sample(st, h)[1], mesh=one_device, in_specs=P(), out_specs=P(),
                          check_vma=False)
    shapes = jax.eval_shape(whole, state, abstract_hyperparams(hp_class))
    return {"batches": jax.tree.map(lambda s: jnp.zeros((eta, *s.shape), s.dtype), shapes), "filled": jnp.int32(0)}


def abstract_hyperparams(hp_class: type):
    """An instance of the hyperparameters' class with every field a float32 scalar's shape."""
    return hp_class(*(jax.ShapeDtypeStruct((), jnp.float32) for _ in dataclasses.fields(hp_class)))


def queue_specs(batch_specs) -> dict:
    """The queue's PartitionSpecs from one batch's ([R, ...] leaves): an eta axis after the run axis."""
    queued = jax.tree.map(lambda spec: P(spec[0], None, *spec[1:]), batch_specs, is_leaf=lambda x: isinstance(x, P))
    return {"batches": queued, "filled": P(RUN_AXIS)}


def pushed(queue: dict, batch, eta: int) -> tuple[dict, object, jax.Array]:
    """`batch` pushed onto the queue, the oldest popped: (queue, the oldest batch, whether it was sampled, not one
    of the zeros the queue starts with)."""
    oldest = jax.tree.map(lambda q: q[0], queue["batches"])
    batches = jax.tree.map(lambda q, new: jnp.concatenate([q[1:], new[None]]), queue["batches"], batch)
    return {"batches": batches, "filled": jnp.minimum(queue["filled"] + 1, eta)}, oldest, queue["filled"] >= eta


def learn_when(ready: jax.Array, learn: Callable, state, batch, hp):
    """`learn` where `ready`, else the state as it is and every learning metric 0 (the first eta updates only fill
    the queue). A select, not a lax.cond: with several runs on a device the update is vmapped, where a cond
    computes both branches anyway."""
    learned, metrics = learn(state, batch, hp)
    state = jax.tree.map(lambda after, before: jnp.where(ready, after, before), learned, state)
    return state, jax.tree.map(lambda m: jnp.where(ready, m, jnp.zeros_like(m)), metrics)


def update(sample: Callable, learn: Callable, roles: Roles, state, hp, eta: int, split: bool):
    """One update for one run on this device (inside `shard_map`): sample, then learn from the batch of eta updates
    before (from its own at eta = 0), the two on the devices of their roles when `split`. State has a `pending`
    queue when eta > 0. Metrics: sampling's, learning's, and `staleness` (eta once learning starts, else 0)."""
    if not eta:
        state, batch, sample_metrics = sample(state, hp)
        state, learn_metrics = learn(state, batch, hp)
        return state, {**sample_metrics, **learn_metrics}
    oldest = jax.tree.map(lambda q: q[0], state.pending["batches"])
    ready = state.pending["filled"] >= eta
    if split:
        def actor(state):
            sampled, batch, metrics = sample(state, hp)
            return {f: getattr(sampled, f) for f in roles.actor}, batch, metrics

        def learner(state):
            learned, metrics = learn_when(ready, learn, state, oldest, hp)
            return {f: getattr(learned, f) for f in roles.learner}, metrics

        (sampled, batch, sample_metrics), (learned, learn_metrics) = mesh_lib.by_role((actor, learner), state)
        state = state.replace(**sampled, **learned)
    else:
        state, batch, sample_metrics = sample(state, hp)
        state, learn_metrics = learn_when(ready, learn, state, oldest, hp)
    pending, _, _ = pushed(state.pending, batch, eta)
    staleness = jnp.where(ready, jnp.float32(eta), 0.0)
    return state.replace(pending=pending), {**sample_metrics, **learn_metrics, "staleness": staleness}


def check_config(config) -> None:
    """Raise before compiling where `config`'s staleness and split cannot work together."""
    if config.mesh.split_actor and not config.actor.max_staleness:
        raise ValueError("config.mesh.split_actor samples the next batch while learning from an earlier one: it needs "
                         "config.actor.max_staleness >= 1")


def check_layout(split: bool, mesh) -> None:
    """Raise before compiling where the settings' split and the mesh's axes disagree."""
    if split != mesh_lib.split_actor(mesh):
        raise ValueError(f"mesh.split_actor={split} but the mesh has axes {mesh.axis_names}: build it with "
                         "mesh.mesh_for_runs from the same config")


__all__ = ["MAX_STALENESS", "ROLE_AXIS", "Roles", "SPLIT_ACTOR", "check_config", "check_layout", "empty_queue", "learn_when",
           "pushed", "queue_specs", "update"]
