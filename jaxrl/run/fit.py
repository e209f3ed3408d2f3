"""Fit before you run: the training program's memory, read from its compiled form before any state exists.

The loop compiles its chunk program for the state's shapes alone (`jax.eval_shape` of the algorithm's
`init_seeds`) and reads XLA's memory analysis of it: the bytes a device holds at the program's peak
(arguments, the outputs that do not reuse them, temporaries). Devices that share one memory pool (XLA:CPU's
devices share the host's RAM) add up. A program that cannot fit fails here, before the state is allocated
and before anything is written, naming the part of the state that takes the most and the config key that
sizes it; a program close to the limit gets a warning (evaluation, checkpoint writes and the host need some
memory beside the program).
"""

from __future__ import annotations

import dataclasses
import math

import jax


# Of the free memory: above FAIL_ABOVE a program does not start, above WARN_ABOVE it starts with a warning.
# Evaluation, checkpoint writes and the host need memory beside the chunk program: QMIX on SMAX 10m_vs_11m
# (a 12 GB state) rose from 13.3 to 17.2 GB resident while evaluating and saving.
FAIL_ABOVE, WARN_ABOVE = 0.9, 0.75


class DoesNotFit(ValueError):
    """The training program needs more memory than its devices have free (`fit`: the figures)."""

    def __init__(self, message: str, fit: "ProgramFit"):
        super().__init__(message)
        self.fit = fit


@dataclasses.dataclass(frozen=True)
class ProgramFit:
    """What one chunk program needs, per device, and what its memory pool has free."""

    peak: int  # bytes a device holds at the program's peak
    state: int  # bytes of the training state on a device
    held_twice: bool  # the loop keeps each chunk's input state beside its output (no donation)
    sharing: int  # devices of this process that share one memory pool (the CPU's RAM), else 1
    available: int | None  # bytes free in that pool (None: unknown)
    flops: float | None  # per update, XLA's cost analysis of the loop body (None: not reported)
    largest: tuple[str, int]  # the state's largest part: (top-level field, bytes per device)
    # a checkpoint is restored into host memory the devices share: for a moment it is held twice (measured:
    # a 6.3 GB state restored by orbax on XLA:CPU was killed for memory at 11.8 GB resident)
    restoring: bool = False
    # the config key that sizes each part of the state, and how else to shrink it (top-level field -> advice:
    # the algorithm's `sized_by`)
    sized_by: dict = dataclasses.field(default_factory=dict)

    @property
    def needed(self) -> int:
        """Bytes of the memory pool the program takes (every device sharing it), or restoring its checkpoint."""
        return max(self.peak, 2 * self.state if self.restoring else 0) * self.sharing

    @property
    def fits(self) -> bool:
        return self.available is None or self.needed <= FAIL_ABOVE * self.available

    @property
    def close_to_the_limit(self) -> bool:
        return self.available is not None and self.needed > WARN_ABOVE * self.available

    def need(self) -> str:
        """e.g. "13.2 GB per device (state 12.0 GB, held once)"."""
        devices = f" on {self.sharing} devices sharing the host's memory" if self.sharing > 1 else " per device"
        held = "held twice: each chunk's input is kept until checked" if self.held_twice else "held once"
        if self.restoring and not self.held_twice:
            held += ", twice while its checkpoint is restored"
        return f"{format_bytes(self.needed)}{devices} (state {format_bytes(self.state * self.sharing)}, {held})"

    def describe(self) -> str:
        """The line a run prints before it starts."""
        free = "" if self.available is None else f", {format_bytes(self.available)} free"
        flops = "" if self.flops is None else f"; {self.flops / 1e9:.2g} GFLOP per update"
        return f"memory: {self.need()}{free}{flops}"

    def advice(self) -> str:
        """What to change: the key that sizes the state's largest part, and the settings that hold less."""
        field, size = self.largest
        ways = [f"lower {self.sized_by.get(field, 'its size')}"]
        if self.held_twice:
            ways.append("set checkpoint.on_nonfinite=stop (holds the state once)")
        ways.append("train fewer runs per program (num_seeds, sweep settings) or on more devices")
        return f"its largest part is {field} ({format_bytes(size * self.sharing)}): " + "; or ".join(ways)


def format_bytes(num_bytes: float) -> str:
    """e.g. "12.0 GB", "35 MB"."""
    return f"{num_bytes / 1e9:.1f} GB" if num_bytes >= 1e9 else f"{num_bytes / 1e6:.0f} MB"


def largest_part(state) -> tuple[str, int]:
    """(top-level field, bytes per device) of the state's largest part (sharded parts spread over devices)."""
    fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)} if dataclasses.is_dataclass(state) \
        else {"state": state}
    sizes = {name: per_device_bytes(part) for name, part in fields.items()}
    name = max(sizes, key=sizes.get)
    return name, sizes[name]


def per_device_bytes(tree) -> int:
    """Bytes of `tree` (ShapeDtypeStructs with shardings, or arrays) on one device."""
    def on_one(x):
        sharding = getattr(x, "sharding", None)
        shape = x.shape if sharding is None else sharding.shard_shape(x.shape)
        return math.prod(shape) * x.dtype.itemsize
    return sum(on_one(x) for x in jax.tree.leaves(tree))


def memory_available(device) -> int | None:
    """Bytes free in `device`'s memory pool: the host's available RAM for a CPU device (Linux), else the
    device's limit less what it holds (None where the runtime does not say)."""
    if device.platform == "cpu":
        try:
            with open("/proc/meminfo") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        except (OSError, StopIteration):
            return None
    stats = device.memory_stats() or {}
    if "bytes_limit" not in stats:
        return None
    return stats["bytes_limit"] - stats.get("bytes_in_use", 0)


def measure(compiled, abstract_state, mesh, held_twice: bool, restoring: bool = False,
            sized_by: dict | None = None) -> ProgramFit:
    """The fit of a compiled chunk program (`engine.compile_chunk`) for states shaped like `abstract_state`
    (ShapeDtypeStructs with shardings) on `mesh`. `restoring`: the run resumes from a checkpoint (which counts
    where the devices share the host's memory); `sized_by`: the algorithm's state field -> config key."""
    memory = compiled.memory_analysis()
    state = per_device_bytes(abstract_state)
    peak = memory.peak_memory_in_bytes
    if held_twice:  # the loop holds the input state while the program runs: it is among the program's arguments
        peak = max(peak, 2 * state + memory.temp_size_in_bytes)
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    host_memory = local[0].platform == "cpu"
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    flops = float(cost["flops"]) if isinstance(cost, dict) and cost.get("flops", 0) > 0 else None
    return ProgramFit(int(peak), state, held_twice, len(local) if host_memory else 1, memory_available(local[0]),
                      flops, largest_part(abstract_state), restoring and host_memory, dict(sized_by or {}))


def check(algo, abstract, hyperparams, donate: bool, restoring: bool = False) -> ProgramFit:
    """Compile `algo`'s chunk program for states shaped like `abstract` (`Algorithm.abstract_seeds`) and return
    its fit; raise DoesNotFit, naming the key to change (the algorithm's `sized_by`), when it cannot fit.
    `restoring`: the run resumes from a checkpoint."""
    compiled = algo.chunk_program(abstract, hyperparams, donate=donate)
    fit = measure(compiled, abstract, algo.mesh, held_twice=not donate, restoring=restoring, sized_by=algo.sized_by)
    if not fit.fits:
        raise DoesNotFit(f"this config does not fit in memory: it needs {fit.need()}, and a run may take "
                         f"{FAIL_ABOVE:.0%} of the {format_bytes(fit.available)} free; {fit.advice()}", fit)
    return fit
