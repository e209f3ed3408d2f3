"""Divergence between chunks: which runs turned non-finite, where, and their last finite state.

A run (one seed of one setting) diverges when a floating-point leaf of its training state or one of its
chunk metrics is NaN or infinite. The loop checks every run after every chunk; the chunk is then replayed
one update at a time from the state it started from (the program takes the number of updates as a traced
value, so the replay computes exactly what the chunk did; it does not consume its input state) to name the
update and the first non-finite quantity, and to recover each diverged run's state after its last finite
update.

What the loop then does (`config.checkpoint.on_nonfinite`): "freeze" keeps the run's last finite state
(the other runs go on; the program stops when every run is frozen); "rollback" restarts the run from the
state before the chunk with a new random key, up to `checkpoint.max_rollbacks` times, then freezes it;
"stop" ends the program at the chunk, keeping the checkpoints it saved before. Only "stop" lets the chunk
reuse its input state's memory (`engine.compile_chunk`'s `donate`): the state is then held once, not twice,
but there is no chunk start to go back to.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import files


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Run `run` first turned non-finite in update `update` (1-based, counted like the loop's `update`), or
    somewhere in updates `update`..`last_update` when its chunk was not replayed to find which."""

    run: int
    update: int
    quantity: str  # e.g. "metrics.policy_loss" or "state.params['params']['actor']['kernel']"
    last_update: int | None = None

    def describe(self, num_seeds: int, num_settings: int) -> str:
        where = f"seed {self.run % num_seeds}" + (f" of setting {self.run // num_seeds}" if num_settings > 1 else "")
        when = f"update {self.update}" if self.last_update is None else f"updates {self.update}-{self.last_update}"
        return f"{where} diverged in {when}: {self.quantity} is not finite"


def _float_leaves(state):
    """[(path, leaf)] of the floating-point leaves (integers and keys are always finite)."""
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return [(path, leaf) for path, leaf in leaves if jnp.issubdtype(leaf.dtype, jnp.floating)]


@jax.jit
def _finite_per_leaf(state) -> jax.Array:
    """[L, R] bool: floating leaf l of run r is finite everywhere (leaves [R, ...])."""
    flags = [jnp.isfinite(leaf).reshape(leaf.shape[0], -1).all(axis=1) for _, leaf in _float_leaves(state)]
    return jnp.stack(flags) if flags else jnp.ones((0, jax.tree.leaves(state)[0].shape[0]), bool)


def first_nonfinite(state, metrics: dict, fetch=jax.device_get) -> list[str | None]:
    """Per run [R]: the first non-finite quantity (metrics first, in their order, then state leaves), or
    None when the run is finite. `metrics`: host arrays with leaves [R] (scalars are shared by all runs);
    `fetch`: device arrays -> host arrays (`program.fetch` for multi-process runs)."""
    num_runs = jax.tree.leaves(state)[0].shape[0]
    names: list[str | None] = [None] * num_runs
    for key, value in metrics.items():
        value = np.broadcast_to(np.asarray(value, dtype=np.float64), (num_runs,))
        for run in np.flatnonzero(~np.isfinite(value)):
            names[run] = names[run] or f"metrics.{key}"
    finite = np.asarray(fetch(_finite_per_leaf(state)))
    paths = [jax.tree_util.keystr(path) for path, _ in _float_leaves(state)]
    for leaf, run in zip(*np.nonzero(~finite)):
        names[run] = names[run] or f"state{paths[leaf]}"
    return names


@jax.jit
def select_runs(take: jax.Array, new, old):
    """Leaves of `new` for the runs where `take` [R] is True, of `old` elsewhere (leaves [R, ...])."""
    return jax.tree.map(lambda a, b: jnp.where(take.reshape(-1, *([1] * (a.ndim - 1))), a, b), new, old)


def run_mask(runs, num_runs: int) -> np.ndarray:
    mask = np.zeros(num_runs, bool)
    mask[list(runs)] = True
    return mask


def replay(run_chunk, start, hp, num_updates: int, first_update: int, runs: list[int], fetch=jax.device_get):
    """Replay a chunk of `num_updates` updates from `start` one update at a time, for the runs `runs` that
    diverged in it. Returns ([Divergence], state whose rows `runs` hold each run's state after its last
    finite update; other rows are unspecified). `first_update`: the loop's number of the chunk's first
    update."""
    found: dict[int, Divergence] = {}
    state = last_finite = start
    for offset in range(num_updates):
        before = state
        state, metrics = run_chunk(state, hp, 1)
        names = first_nonfinite(state, fetch(metrics), fetch)
        newly = [r for r in runs if r not in found and names[r] is not None]
        for run in newly:
            found[run] = Divergence(run, first_update + offset, names[run])
        if newly:
            last_finite = select_runs(run_mask(newly, len(names)), before, last_finite)
        if len(found) == len(runs):
            break
    # A run that did not diverge again in the replay (the program is deterministic, so only a nondeterministic
    # op could cause that) is reported at the chunk's last update and keeps its state from before the chunk.
    for run in runs:
        found.setdefault(run, Divergence(run, first_update + num_updates - 1, "a quantity (not reproduced)"))
    return [found[r] for r in runs], last_finite


def with_new_keys(state, runs: np.ndarray, attempt: int):
    """`state` with the random key of the runs where `runs` [R] is True folded with `attempt` (a rolled-back
    run takes a different path rather than repeating its divergence). The state must have a `key` leaf
    [R, 2]."""
    fresh = jax.vmap(lambda key: jax.random.fold_in(key, 1_000_003 + attempt))(state.key)
    return state.replace(key=jnp.where(jnp.asarray(runs)[:, None], fresh, state.key))


class Guard:
    """The loop's divergence check: after each chunk, `check` finds the runs that turned non-finite, freezes
    or rolls them back (`on_nonfinite`), and returns a state in which every run is finite.

    Frozen runs are remembered in `<checkpoint_dir>/diverged.json` (with the update of the checkpoint that
    first held them frozen), so that a resumed program keeps them frozen.
    """

    def __init__(self, on_nonfinite: str, max_rollbacks: int, num_seeds: int, num_settings: int,
                 checkpoint_dir: str, fetch=jax.device_get):
        self.on_nonfinite, self.max_rollbacks = on_nonfinite, max_rollbacks
        self.num_seeds, self.num_settings = num_seeds, num_settings
        self.num_runs = num_seeds * num_settings
        self.path = os.path.join(checkpoint_dir, "diverged.json")
        self.fetch = fetch
        self.frozen: dict[int, dict] = {}  # run -> {"update", "quantity", "frozen_at"}
        self.rollbacks = [0] * self.num_runs
        self.stopped = False  # on_nonfinite "stop": a run turned non-finite and the program ends

    @property
    def replays_chunks(self) -> bool:
        """Whether a diverged run's chunk is replayed from its start state (which the loop must then keep)."""
        return self.on_nonfinite != "stop"

    def resume(self, update: int) -> None:
        """Take back the runs frozen at or before `update` (the resumed checkpoint's)."""
        if os.path.exists(self.path):
            with open(self.path) as f:
                saved = {int(run): entry for run, entry in json.load(f).items()}
            self.frozen = {run: entry for run, entry in saved.items() if entry["frozen_at"] <= update}

    @property
    def all_frozen(self) -> bool:
        return len(self.frozen) == self.num_runs

    def thaw(self, runs) -> None:
        """Forget that `runs` are frozen: they now hold a copy of a finite run (`jaxrl.run.population`)."""
        for run in runs:
            self.frozen.pop(int(run), None)

    def check(self, run_chunk, start, state, metrics: dict, hp, num_updates: int, first_update: int):
        """After a chunk of `num_updates` updates from `start` (the state it began with) to `state`
        with host `metrics` [R]: (state, metrics, messages), every run finite; frozen runs hold their last
        finite state and NaN metrics."""
        names = first_nonfinite(state, metrics, self.fetch)
        diverged = [r for r, name in enumerate(names) if name is not None and r not in self.frozen]
        if diverged and not self.replays_chunks:
            self.stopped = True
            last = first_update + num_updates - 1
            return state, metrics, [Divergence(r, first_update, names[r], last).describe(self.num_seeds,
                                                                                          self.num_settings)
                                    for r in diverged]
        messages, rolled, last_finite = [], {}, start  # frozen runs' rows of `start` are their finite state
        if diverged:
            found, last_finite = replay(run_chunk, start, hp, num_updates, first_update, diverged, self.fetch)
            for event in found:
                text = event.describe(self.num_seeds, self.num_settings)
                if self.on_nonfinite == "rollback" and self.rollbacks[event.run] < self.max_rollbacks:
                    self.rollbacks[event.run] += 1
                    rolled[event.run] = self.rollbacks[event.run]
                    messages.append(f"{text}; rolling its chunk back with a new random key (rollback "
                                    f"{self.rollbacks[event.run]} of {self.max_rollbacks})")
                else:
                    self.frozen[event.run] = {"update": event.update, "quantity": event.quantity,
                                              "frozen_at": first_update + num_updates - 1}
                    messages.append(f"{text}; frozen at its last finite state (after update {event.update - 1}), "
                                    "the other runs go on")
        if self.frozen:
            frozen = run_mask(self.frozen, self.num_runs)
            state = select_runs(frozen, last_finite, state)
            metrics = {k: np.where(frozen, np.nan, v) if np.ndim(v) else v for k, v in metrics.items()}
        if rolled:
            state, metrics, more = self._roll_back(run_chunk, start, state, metrics, hp, num_updates,
                                                   first_update, rolled)
            messages += more
        return state, metrics, messages

    def _roll_back(self, run_chunk, start, state, metrics, hp, num_updates, first_update, rolled: dict):
        """Run the chunk again from `start` with new keys for the runs in `rolled` (run -> attempt) and take
        their rows; `check` then handles them like any run (a run that diverges again rolls back again or,
        past `max_rollbacks`, is frozen). Frozen runs' rows of `start` stay their finite state."""
        mask = run_mask(rolled, self.num_runs)
        attempt = max(rolled.values())
        retry_start = with_new_keys(start, mask, attempt)
        if self.frozen:  # their finite state, which `state` holds now
            retry_start = select_runs(run_mask(self.frozen, self.num_runs), state, retry_start)
        retry, retry_metrics = run_chunk(retry_start, hp, num_updates)
        retry_metrics = self.fetch(retry_metrics)
        state = select_runs(mask, retry, state)
        metrics = {k: np.where(mask, retry_metrics[k], v) if np.ndim(v) else v for k, v in metrics.items()}
        return self.check(run_chunk, retry_start, state, metrics, hp, num_updates, first_update)

    def save(self) -> None:
        """Write the frozen runs beside the checkpoints (main process; call when a checkpoint is saved); nothing
        when no run was ever frozen."""
        if not self.frozen and not os.path.exists(self.path):
            return
        files.write_json(self.path, {str(run): entry for run, entry in sorted(self.frozen.items())})
