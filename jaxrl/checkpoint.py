"""Orbax checkpoints of the complete training state, written atomically.

Orbax writes each step into a temporary directory and renames it only once complete, so a crash or a
kill during a save never replaces a good checkpoint. A checkpoint that cannot be read is moved aside
(`<step>.corrupt`, nothing deleted) and the previous one is used, with a warning.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    pass


class Checkpointer:
    """Save and restore a pytree of arrays under `directory/<step>`."""

    def __init__(self, directory: str, keep: int = 3):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: Any) -> None:
        """Start saving `state` as `step` (asynchronously); `wait()` blocks until it is on disk."""
        if step in self._manager.all_steps():
            return
        self._manager.save(step, args=ocp.args.StandardSave(state))

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def restore(self, step: int, target: Any) -> Any:
        """The state saved as `step` (see `restore_latest` for `target`); a missing, mismatched or unreadable
        step is a CheckpointError, and nothing is moved."""
        if step not in self.steps():
            raise CheckpointError(f"no checkpoint {step} in {self.directory}; saved steps: {self.steps()}")
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as err:
            raise CheckpointError(f"checkpoint {os.path.join(self.directory, str(step))} could not be restored "
                                  f"({type(err).__name__}: {err})") from err

    def restore_latest(self, target: Any) -> tuple[int, Any]:
        """(step, state) from the newest readable checkpoint.

        `target` is a pytree of `jax.ShapeDtypeStruct` (with shardings) describing the state.
        """
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoint found in {self.directory}")
        for step in reversed(steps):
            try:
                return step, self._manager.restore(step, args=ocp.args.StandardRestore(target))
            except Exception as err:  # orbax raises many types for a damaged or mismatched step
                path = os.path.join(self.directory, str(step))
                if not _looks_corrupt(err):
                    raise CheckpointError(
                        f"checkpoint {path} does not match this run's training state ({err}). "
                        "Was it written by a different config?") from err
                aside = f"{path}.corrupt"
                if jax.process_index() == 0:  # one process moves it; the others wait for that
                    shutil.move(path, aside)
                    print(f"warning: checkpoint {path} is unreadable ({type(err).__name__}: {err}); moved it "
                          f"to {aside} and trying the previous one", file=sys.stderr)
                if jax.process_count() > 1:
                    from jax.experimental import multihost_utils
                    multihost_utils.sync_global_devices(f"jaxrl checkpoint {step} moved aside")
                self._manager.reload()
        raise CheckpointError(f"no readable checkpoint left in {self.directory}")

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _looks_corrupt(err: Exception) -> bool:
    """Unreadable files, as opposed to a readable checkpoint of a differently shaped state."""
    text = str(err).lower()
    mismatch = (("shape" in text and ("mismatch" in text or "not compatible" in text)) or "tree structure" in text
                or "structure" in text)
    return not mismatch


def has_checkpoints(directory: str) -> bool:
    """Whether `directory` holds a saved step (looked up without creating anything)."""
    return os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))


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
    """(step, state) from the checkpoints in `directory`: the newest readable one, or the one saved as `step`
    (see `Checkpointer`); `target` as for `Checkpointer.restore_latest`."""
    manager = Checkpointer(directory)
    try:
        return manager.restore_latest(target) if step is None else (step, manager.restore(step, target))
    finally:
        manager.close()
