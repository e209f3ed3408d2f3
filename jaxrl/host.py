"""Settings of the host process that XLA:CPU programs run faster with.

`python -m jaxrl.train` and `python -m jaxrl.sweep` apply them (flag `--malloc_pad_mb`); in a notebook or
your own script, call `jaxrl.host.keep_freed_memory()` once.
"""

from __future__ import annotations

import ctypes
import sys

_M_TOP_PAD = -2  # glibc's mallopt parameter number (malloc.h)


def keep_freed_memory(pad_mb: int = 256) -> bool:
    """Let glibc's malloc keep up to `pad_mb` MiB of freed memory at the top of each heap for reuse,
    instead of giving it back to the OS as soon as it is freed.

    Why: a compiled XLA:CPU program allocates its temporary buffers at every call and frees them when it
    returns. With glibc's default (keep at most 128 KiB), every call maps those pages afresh and the
    kernel zero-fills each one on first touch. Measured on 2 cores, a GRPO step on tokens
    (benchmarks/grpo_tokens.py sizes) took 24 ms with a 256 MiB pad against 32 ms without.

    The cost: up to `pad_mb` MiB per malloc arena stays resident after a peak. Process-wide: other
    libraries in the process (numpy, torch) get the same behaviour. Returns whether the setting was applied:
    False for pad_mb <= 0, and off Linux or on a C library without `mallopt` (nothing to change there).
    """
    if pad_mb <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process already uses
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_TOP_PAD, min(pad_mb, 2047) << 20))
