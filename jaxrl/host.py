"""Settings of the host process that XLA:CPU programs run faster with.

`python -m jaxrl.train` and `python -m jaxrl.sweep` apply them (flag `--malloc_pad_mb`); in a notebook or
your own script, call `jaxrl.host.keep_freed_memory()` once.
"""

from __future__ import annotations

import ctypes
import sys


def _malloc_settings(pad_mb: int) -> tuple[tuple[int, str, int], ...]:
    """`keep_freed_memory`'s setting: (glibc's mallopt parameter number (malloc.h), the environment variable that
    sets it at a process's start, value) each. Trim threshold -1: never trim; at most 0 blocks in mappings of
    their own."""
    return ((-2, "MALLOC_TOP_PAD_", min(pad_mb, 2047) << 20), (-1, "MALLOC_TRIM_THRESHOLD_", -1),
            (-4, "MALLOC_MMAP_MAX_", 0))


def keep_freed_memory(pad_mb: int = 256) -> bool:
    """Let glibc's malloc keep the memory a program frees, for its next allocations, instead of giving it back
    to the OS: no trimming of its heaps, which grow `pad_mb` MiB at a time, and no block in a mapping of its own
    (glibc's default above a threshold of 128 KiB that it raises to at most 32 MiB: such a block is mapped afresh
    and unmapped when freed).

    Why: a compiled XLA:CPU program allocates its temporary buffers at every call and frees them when it
    returns. With glibc's defaults, every call maps those pages afresh and the kernel zero-fills each one on
    first touch. Measured on 2 cores: a GRPO step on tokens (benchmarks/grpo_tokens.py sizes) took 24 ms with a
    256 MiB pad against 32 ms without; a GRPO step on SmolLM2-135M (benchmarks/lm_grpo.py: buffers of hundreds
    of MiB, which the pad alone left to their own mappings) 18.7 s against 28-31 s.

    The cost: memory freed after a peak stays with the process (its resident size stays near the peak).
    Process-wide: other libraries in the process (numpy, torch) get the same behaviour. Returns whether the
    setting was applied: False for pad_mb <= 0, and off Linux or on a C library without `mallopt` (nothing to
    change there).
    """
    if pad_mb <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process already uses
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all([bool(mallopt(parameter, value)) for parameter, _, value in _malloc_settings(pad_mb)])


def freed_memory_environment(pad_mb: int = 256) -> dict[str, str]:
    """The environment variables that give a new process `keep_freed_memory(pad_mb)`'s setting from its start,
    for a process that does not import jaxrl (a peer library's side of a benchmark); empty for pad_mb <= 0."""
    return {} if pad_mb <= 0 else {variable: str(value) for _, variable, value in _malloc_settings(pad_mb)}
