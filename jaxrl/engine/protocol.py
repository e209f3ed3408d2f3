"""What the training loop (`jaxrl.train`), sweeps and benchmarks ask of an algorithm."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax


@runtime_checkable
class Algorithm(Protocol):
    """An algorithm object, built from a config by its registered builder.

    A state is a pytree whose leaves carry a leading run axis [R, ...] (R = settings x seeds); hyperparameters
    are a pytree of traced numbers with scalar or [R] leaves.
    """

    settings: Any  # static choices; `.batch_size` (env steps or samples per update, all devices), `.num_updates`
    mesh: jax.sharding.Mesh  # the (runs, data) mesh its programs run on
    compile_seconds: float  # seconds spent compiling so far (the loop reports a chunk's compile time apart)

    def init_seeds(self, seed: int, num_seeds: int, num_settings: int = 1) -> Any:
        """The initial state of R = num_settings * num_seeds runs, placed on the mesh."""

    def state_shardings(self, state: Any) -> Any:
        """A NamedSharding per leaf of `state` (for checkpoint restores onto the mesh)."""

    def run_chunk(self, state: Any, hyperparams: Any, num_updates: int, donate: bool = False) -> tuple[Any, dict]:
        """`num_updates` updates of every run in one compiled program: (state, metrics with leaves [R]).
        `donate` (only with `checkpoint.on_nonfinite` "stop"): the program may reuse `state`'s memory; the
        caller does not use `state` again."""

    def evaluate(self, params: Any, key: jax.Array, num: int) -> dict:
        """Metrics of the current policies (leaves [R]) on `num` held-out episodes or problems."""

    def write_files(self, workdir: str) -> None:
        """At the start of a run: what else a run directory needs to be reloaded (e.g. a tokenizer)."""

    def write_artifacts(self, workdir: str, params: Any, seed: int) -> list[str]:
        """At the end of a run, from the first run's parameters (leaves [1, ...]): files to look at (an
        episode GIF, sample completions); returns their paths."""
