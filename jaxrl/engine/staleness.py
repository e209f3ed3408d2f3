"""Learning from batches sampled earlier: the queue of `actor.max_staleness` = eta batches, and the actor/learner
split of the mesh (`mesh.split_actor`), for any algorithm whose update is "sample a batch, then learn from it".

With eta > 0 each update samples a batch with the parameters it starts from and learns from the batch sampled eta
updates before (by the parameters of then); the first eta updates only fill the queue. Sampling and learning then
depend on nothing of each other, which is what lets them run at once:

- on shared devices, in one program, one after the other (XLA does not overlap them: the layout gives the
  split's numbers on a machine with one device);
- with `mesh.split_actor`, on the devices of the mesh's `role` axis: the actors (role 0) sample while the
  learners (role 1) learn, each skipping the other's work, and each hands its result to the other
  (`mesh.by_role`) once per update. The same numbers as the shared layout on the actors' devices alone;
- for envs stepped on the host, the same split as two programs run by two threads (`ThreadedRoles`, which the
  engine uses when the algorithm gives its halves as a `StaleUpdate`).

The queue lives in the state (`pending`: {"batches": leaves [eta, ...], "filled": how many hold a sampled batch}),
so a checkpoint holds every batch in flight: a resumed run loses none and learns none twice.

An algorithm gives `sample(state, hp) -> (state, batch, metrics)` and `learn(state, batch, hp) -> (state,
metrics)`, both for one run on this device inside `shard_map`, and `Roles`: which state fields each side writes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
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


def oldest_and_ready(queue: dict, eta: int) -> tuple[object, jax.Array]:
    """The queue's oldest batch, and whether it was sampled (not one of the zeros the queue starts with)."""
    return jax.tree.map(lambda q: q[0], queue["batches"]), queue["filled"] >= eta


def pushed(queue: dict, batch, eta: int) -> dict:
    """The queue with `batch` pushed on and the oldest popped."""
    batches = jax.tree.map(lambda q, new: jnp.concatenate([q[1:], new[None]]), queue["batches"], batch)
    return {"batches": batches, "filled": jnp.minimum(queue["filled"] + 1, eta)}


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
    oldest, ready = oldest_and_ready(state.pending, eta)
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
    staleness = jnp.where(ready, jnp.float32(eta), 0.0)
    return state.replace(pending=pushed(state.pending, batch, eta)), {**sample_metrics, **learn_metrics,
                                                                      "staleness": staleness}


@dataclasses.dataclass(frozen=True)
class StaleUpdate:
    """An update written as `update` above composes it, for the engine to run its two halves apart
    (`Algorithm.stale`): `sample(state, hp)`, `learn(state, batch, hp)`, which fields each writes, and eta."""

    sample: Callable
    learn: Callable
    roles: Roles
    eta: int


def batch_specs(queue: dict):
    """One batch's PartitionSpecs from the queue's (`queue_specs`' inverse)."""
    return jax.tree.map(lambda spec: P(spec[0], *spec[2:]), queue["batches"], is_leaf=lambda x: isinstance(x, P))


class ThreadedRoles:
    """`mesh.split_actor` as two programs, for envs that step on the host: the actors' (`sample`, on the role
    axis's first device group) and the learners' (`learn_when`, on the second), each update run by two threads at
    once and then exchanged (new parameters to the actors, the sampled batch into the learners' queue).

    Why not one program (`update`): XLA:CPU does not run a device's work while another device of the same program
    is inside a host callback, so the actors' env steps and the learners' optimisation would take turns; two
    programs dispatched from two threads run at once. The numbers are `update`'s (the same `sample` and `learn`);
    the state goes in and comes out as the chunk program's, its queue stacked, so checkpoints and resume are
    unchanged. One process only (the threads' programs would otherwise have to be dispatched in one order on every
    process)."""

    def __init__(self, stale: StaleUpdate, mesh, state_specs: Callable, state_shardings: Callable, *, check_vma: bool,
                 sequential_runs: bool):
        if jax.process_count() > 1:
            raise ValueError("envs stepped on the host with mesh.split_actor run in one process")
        self.stale, self.mesh, self.state_specs, self.state_shardings = stale, mesh, state_specs, state_shardings
        self.options = {"check_vma": check_vma, "sequential_runs": sequential_runs}
        roles = mesh.devices.transpose(1, 0, *range(2, mesh.devices.ndim))  # (role, runs, data)
        self.meshes = [jax.sharding.Mesh(devices, (RUN_AXIS, DATA_AXIS)) for devices in roles]
        self.programs, self.compile_seconds = None, 0.0
        self.actor_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxrl-actor")

    def _compile(self, state, hp):
        """(actor program, learner program) for states shaped like `state` (its queue left out); keeps the specs of
        a state without its queue and of one batch in `self.specs`."""
        from jaxrl.engine.chunks import compile_per_run

        specs = self.state_specs(state)
        self.specs = {"state": specs.replace(pending=None), "batch": batch_specs(specs.pending)}
        specs, batch, runs = self.specs["state"], self.specs["batch"], P(RUN_AXIS)
        bare = state.replace(pending=None)
        one_batch = jax.tree.map(lambda q: q[:, 0], state.pending["batches"])
        s = self.stale

        def actor(state, hp):
            return s.sample(state, hp)

        def learner(state, batch, ready, hp):
            return learn_when(ready, s.learn, state, batch, hp)

        actor_args = (self._on(bare, 0, specs), self._hp(hp, 0, bare))
        actor_program, actor_seconds = compile_per_run(actor, actor_args, self.meshes[0], in_axes=(0, 0),
                                                       in_specs=(specs, runs), out_specs=(specs, batch, runs),
                                                       **self.options)
        learner_args = (self._on(bare, 1, specs), self._on(one_batch, 1, batch),
                        self._on(state.pending["filled"] >= 0, 1, runs), self._hp(hp, 1, bare))
        learner_program, learner_seconds = compile_per_run(learner, learner_args, self.meshes[1], in_axes=(0,) * 4,
                                                           in_specs=(specs, batch, runs, runs),
                                                           out_specs=(specs, runs), **self.options)
        self.compile_seconds += actor_seconds + learner_seconds
        return actor_program, learner_program

    def _on(self, tree, role: int, specs):
        """`tree` placed on the devices of `role` as `specs` say."""
        shardings = jax.tree.map(lambda spec: jax.sharding.NamedSharding(self.meshes[role], spec), specs,
                                 is_leaf=lambda x: isinstance(x, P))
        return jax.device_put(tree, shardings)

    def _hp(self, hp, role: int, state):
        return mesh_lib.runs_of(hp, state.update_step.shape[0], self.meshes[role])

    def run_chunk(self, state, hp, num_updates: int):
        """`Algorithm.run_chunk`'s result, the updates run as described above. Each side's metrics are summed
        where they were computed and fetched once, after the chunk."""
        from jaxrl.engine.chunks import chunk_metrics

        if self.programs is None:
            self.programs = self._compile(state, hp)
        bare, runs = state.replace(pending=None), state.update_step.shape
        acting, learning = self._on(bare, 0, self.specs["state"]), self._on(bare, 1, self.specs["state"])
        hps = self._hp(hp, 0, bare), self._hp(hp, 1, bare)
        readies = {ready: self._on(jnp.full(runs, ready), 1, P(RUN_AXIS)) for ready in (False, True)}
        queue = [self._on(jax.tree.map(lambda q: q[:, i], state.pending["batches"]), 1, self.specs["batch"])
                 for i in range(self.stale.eta)]
        filled = int(jax.device_get(state.pending["filled"])[0])
        sums = {"sample": None, "learn": None}
        on_host = {"staleness": 0.0, "actor_seconds": 0.0, "learner_seconds": 0.0}
        for _ in range(num_updates):
            ready = filled >= self.stale.eta
            acting, learning, batch, metrics, seconds = self._update(acting, learning, queue[0], readies[ready], hps)
            queue, filled = queue[1:] + [self._on(batch, 1, self.specs["batch"])], min(filled + 1, self.stale.eta)
            sums = {side: metrics[side] if sums[side] is None else jax.tree.map(jnp.add, sums[side], metrics[side])
                    for side in sums}
            on_host = {"staleness": on_host["staleness"] + (self.stale.eta if ready else 0.0),
                       "actor_seconds": on_host["actor_seconds"] + seconds[0],
                       "learner_seconds": on_host["learner_seconds"] + seconds[1]}
        learning = learning.replace(**{f: self._on(getattr(acting, f), 1, getattr(self.specs["state"], f))
                                       for f in self.stale.roles.actor})
        pending = {"batches": jax.tree.map(lambda *qs: jnp.stack(qs, axis=1), *queue),
                   "filled": jnp.full(runs, filled, jnp.int32)}
        out = learning.replace(pending=pending)
        # (each side's seconds say which one the other waits for)
        totals = {**jax.device_get(sums["sample"]), **jax.device_get(sums["learn"]),
                  **{k: np.full(runs, v, np.float32) for k, v in on_host.items()}}
        return jax.device_put(out, self.state_shardings(out)), chunk_metrics(totals, num_updates)

    def _update(self, acting, learning, oldest, ready: jax.Array, hps):
        """One update: the actors sample (in the actor thread) while the learners learn from `oldest`; then the
        new parameters go to the actors. (acting, learning, the new batch, {"sample", "learn"} metrics on their
        devices, (actor seconds, learner seconds))."""
        actor_program, learner_program = self.programs

        def act():
            tick = time.perf_counter()
            return jax.block_until_ready(actor_program(acting, hps[0])), time.perf_counter() - tick

        sampling = self.actor_thread.submit(act)
        tick = time.perf_counter()
        learning, learn_metrics = jax.block_until_ready(learner_program(learning, oldest, ready, hps[1]))
        learner_seconds = time.perf_counter() - tick
        (acting, batch, sample_metrics), actor_seconds = sampling.result()
        acting = acting.replace(**{f: self._on(getattr(learning, f), 0, getattr(self.specs["state"], f))
                                   for f in self.stale.roles.learner})
        return acting, learning, batch, {"sample": sample_metrics, "learn": learn_metrics}, (actor_seconds,
                                                                                             learner_seconds)


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


__all__ = ["MAX_STALENESS", "ROLE_AXIS", "Roles", "SPLIT_ACTOR", "StaleUpdate", "ThreadedRoles", "batch_specs",
           "check_config", "check_layout", "empty_queue", "learn_when", "oldest_and_ready", "pushed", "queue_specs",
           "update"]
