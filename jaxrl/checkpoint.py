"""Orbax checkpoints of the complete training state, written atomically, moved aside only when damaged.

Orbax writes each step into a temporary directory and renames it only once complete, so a crash or a kill
during a save never replaces a good checkpoint. Once a save is complete, the Checkpointer that wrote it records
the step's files (sizes, and a CRC-32 of each file up to `HASHED_BYTES`) in `<directory>/manifests/<step>.json`.

A checkpoint that cannot be restored is judged by that record alone: a file missing, of another size or with
other bytes than were written is damage, and a training run moves the step aside (`<step>.corrupt`, nothing
deleted) and tries the previous one. Anything else (out of memory, permission denied, a stale file handle, a
state of another shape) is an error that leaves every checkpoint where it was; and so is any failure of a
read-only caller (`restore_from`: evaluation, loading a policy, forking), which never moves anything.

Which steps are kept: the newest `keep`, and with `keep_best` the `keep_best` with the highest score passed to
`save` (an evaluation metric), so that a run that later collapsed keeps its best policies.
"""

from __future__ import annotations

import os
import shutil
import sys
import zlib
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxrl import files

MANIFESTS = "manifests"  # <directory>/manifests/<step>.json: what each completed save wrote
SCORES = "scores.json"  # <directory>/scores.json: {step: score} of the steps saved with one (keep_best)
HASHED_BYTES = 64 * 2**20  # files up to this size get a CRC-32 in the manifest; larger ones their size only
# Orbax's own bookkeeping file, which it may rewrite after the save completes: not part of the state.
_UNRECORDED = ("_CHECKPOINT_METADATA",)


class CheckpointError(RuntimeError):
    pass


class Checkpointer:
    """Save and restore a pytree of arrays under `directory/<step>`."""

    def __init__(self, directory: str, keep: int = 3, keep_best: int = 0):
        self.directory = os.path.abspath(directory)
        self.keep, self.keep_best = keep, keep_best
        # Retention is ours (`_retain`): orbax's own would delete by age only.
        options = ocp.CheckpointManagerOptions(max_to_keep=None, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._unrecorded: list[int] = []  # steps this process saved whose manifest is not written yet
        # {step: score}: every process holds the same (its scores are the program's), so all agree on what to keep
        self._scores = files.read_json(os.path.join(self.directory, SCORES), {})
        self.completed = False  # whether a save of this Checkpointer is complete (and recorded)

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: Any, score: float | None = None) -> None:
        """Start saving `state` as `step` (asynchronously; `wait()` blocks until it is on disk). `score`: the
        evaluation metric of this state (higher is better), for `keep_best`."""
        if step in self._manager.all_steps():
            return
        self.wait()  # the previous save is complete: record it before starting the next
        if score is not None:
            self._scores[str(step)] = float(score)
            self._write_scores()
        self._manager.save(step, args=ocp.args.StandardSave(state))
        self._unrecorded.append(step)

    def wait(self) -> None:
        """Block until the saves started are on disk, then record their manifests and apply retention."""
        self._manager.wait_until_finished()
        if self._unrecorded:
            if jax.process_index() == 0:
                for step in self._unrecorded:
                    write_manifest(self._step_dir(step), self._manifest_path(step))
            self._retain()  # every process: orbax's delete waits for all of them
        self.completed |= bool(self._unrecorded)
        self._unrecorded = []

    def restore(self, step: int, target: Any) -> Any:
        """The state saved as `step` (see `restore_latest` for `target`); a missing, mismatched or unreadable
        step is a CheckpointError, and nothing is moved."""
        if step not in self.steps():
            raise CheckpointError(f"no checkpoint {step} in {self.directory}; saved steps: {self.steps()}")
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as err:  # noqa: BLE001  (orbax and tensorstore raise many types)
            damage = self._damage(step)
            raise CheckpointError(_not_restored(self._step_dir(step), err, damage)) from err

    def restore_latest(self, target: Any, move_damaged: bool = True) -> tuple[int, Any]:
        """(step, state) from the newest checkpoint that restores.

        `target` is a pytree of `jax.ShapeDtypeStruct` (with shardings) describing the state. A step that does
        not restore and whose files differ from its manifest is damaged: moved aside when `move_damaged`
        (the training loop), else passed over with a warning; the previous step is tried. Any other failure is a
        CheckpointError that moves nothing.
        """
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoint found in {self.directory}")
        for step in reversed(steps):
            try:
                return step, self._manager.restore(step, args=ocp.args.StandardRestore(target))
            except Exception as err:  # noqa: BLE001  (orbax and tensorstore raise many types)
                path = self._step_dir(step)
                damage = self._damage(step)
                if damage is None:
                    raise CheckpointError(_not_restored(path, err, None)) from err
                if not move_damaged:
                    _warn(f"checkpoint {path} is damaged ({damage}); trying the previous one (training on this "
                          "run moves it aside)")
                    continue
                self._move_aside(step, damage)
        raise CheckpointError(f"no readable checkpoint left in {self.directory}")

    def close(self) -> None:
        self.wait()
        self._manager.close()

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _manifest_path(self, step: int) -> str:
        return os.path.join(self.directory, MANIFESTS, f"{step}.json")

    def _damage(self, step: int) -> str | None:
        """What shows that `step` is damaged, or None; a CheckpointError (nothing moved) when its files cannot
        even be looked at (permission denied, I/O error, stale file handle)."""
        try:
            return damage(self._step_dir(step), files.read_json(self._manifest_path(step)))
        except OSError as err:
            raise CheckpointError(f"checkpoint {self._step_dir(step)} could not be read ({type(err).__name__}: "
                                  f"{err}); nothing was moved") from err

    def _move_aside(self, step: int, damage_found: str) -> None:
        path = self._step_dir(step)
        aside = f"{path}.corrupt"
        if jax.process_index() == 0:  # one process moves it; the others wait for that
            shutil.move(path, aside)
            _warn(f"checkpoint {path} is damaged ({damage_found}); moved it to {aside} and trying the previous one")
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(f"jaxrl checkpoint {step} moved aside")
        self._manager.reload()

    def _write_scores(self) -> None:
        if jax.process_index() == 0:
            files.write_json(os.path.join(self.directory, SCORES), self._scores)

    def _retain(self) -> None:
        """Delete the steps that are neither among the newest `keep` nor the `keep_best` best scored."""
        steps = self.steps()
        kept = set(steps[-self.keep:])
        if self.keep_best:
            scored = sorted((s for s in steps if str(s) in self._scores), key=lambda s: (-self._scores[str(s)], -s))
            kept |= set(scored[:self.keep_best])
        dropped = [step for step in steps if step not in kept]
        for step in dropped:
            self._manager.delete(step)
            if jax.process_index() == 0 and os.path.exists(self._manifest_path(step)):
                os.remove(self._manifest_path(step))
        if any(str(step) in self._scores for step in dropped):
            self._scores = {s: v for s, v in self._scores.items() if int(s) not in dropped}
            self._write_scores()


def _warn(text: str) -> None:
    if jax.process_index() == 0:
        print(f"warning: {text}", file=sys.stderr)


def _not_restored(path: str, err: Exception, damage_found: str | None) -> str:
    """The one-line reason a step did not restore."""
    detail = " ".join(str(err).split())[:300]
    if damage_found is not None:
        return f"checkpoint {path} is damaged ({damage_found})"
    if _looks_mismatched(err):
        return (f"checkpoint {path} does not match this run's training state ({detail}). Was it written by a "
                "different config?")
    return (f"checkpoint {path} could not be restored ({type(err).__name__}: {detail}); its files are as they were "
            "written, so nothing was moved")


def _looks_mismatched(err: Exception) -> bool:
    """A readable checkpoint of a differently shaped state (as orbax words it)."""
    text = str(err).lower()
    return ("shape" in text and ("mismatch" in text or "not compatible" in text)) or "structure" in text


def manifest(step_dir: str) -> dict[str, list]:
    """{path relative to `step_dir`: [size in bytes, CRC-32 or None (files over HASHED_BYTES)]}."""
    record = {}
    for root, _, names in os.walk(step_dir):
        for name in names:
            if name in _UNRECORDED:
                continue
            path = os.path.join(root, name)
            size = os.path.getsize(path)
            record[os.path.relpath(path, step_dir)] = [size, _crc32(path) if size <= HASHED_BYTES else None]
    return record


def write_manifest(step_dir: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.write_json(path, manifest(step_dir), indent=None)


def damage(step_dir: str, recorded: dict | None) -> str | None:
    """How the files of `step_dir` differ from their manifest `recorded` (a file missing, of another size, with
    other bytes), or None when they do not. A step without a manifest (saved before manifests were written, or
    its writer was killed between orbax's commit and the manifest) counts as damaged only when its data
    directory is missing. OSError (permission denied, I/O error) goes through: it is no evidence either way."""
    if recorded is None:
        return None if os.path.isdir(os.path.join(step_dir, "default")) else "its data directory is missing"
    for relative, (size, crc) in sorted(recorded.items()):
        path = os.path.join(step_dir, relative)
        if not os.path.exists(path):
            return f"{relative} is missing"
        found = os.path.getsize(path)
        if found != size:
            return f"{relative} has {found} bytes, {size} were written"
        if crc is not None and _crc32(path) != crc:
            return f"{relative} holds other bytes than were written"
    return None


def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(2**22):
            crc = zlib.crc32(chunk, crc)
    return crc


def saved_steps(directory: str) -> list[int]:
    """The steps `directory` holds, ascending (looked up without creating anything)."""
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit()) if os.path.isdir(directory) else []


def has_checkpoints(directory: str) -> bool:
    """Whether `directory` holds a saved step (looked up without creating anything)."""
    return bool(saved_steps(directory))


def abstract_state(state: Any, shardings: Any = None) -> Any:
    """ShapeDtypeStructs (with shardings) describing `state`, for `restore_latest`: a state of arrays, or an
    abstract one (e.g. `jax.eval_shape` of an init) with `shardings`, a sharding per leaf or one for a
    whole subtree (e.g. all parameters)."""
    def like(x, sharding):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=getattr(x, "weak_type", False))
    if shardings is None:
        return jax.tree.map(lambda x: like(x, x.sharding), state)
    return jax.tree.map(lambda sharding, part: jax.tree.map(lambda x: like(x, sharding), part),
                        shardings, state, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))


def restore_from(directory: str, target: Any, step: int | None = None) -> tuple[int, Any]:
    """(step, state) from the checkpoints in `directory`, read only (nothing is moved or deleted): the newest
    that restores, or the one saved as `step` (see `Checkpointer`); `target` as for `Checkpointer.restore_latest`."""
    manager = Checkpointer(directory)
    try:
        return (manager.restore_latest(target, move_damaged=False) if step is None
                else (step, manager.restore(step, target)))
    finally:
        manager.close()
