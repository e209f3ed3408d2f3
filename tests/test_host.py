"""jaxrl.host (the malloc setting the entry points apply) and mesh.over_local_runs (one run: no vmap)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import host, mesh as mesh_lib


def test_keep_freed_memory_applies_on_glibc_and_zero_leaves_malloc_alone():
    assert host.keep_freed_memory(0) is False
    if sys.platform.startswith("linux"):
        assert host.keep_freed_memory(64) is True  # mallopt accepted the setting
    # Memory freed and allocated again stays correct.
    for _ in range(3):
        x = np.ones((1 << 22,), np.float32)
        assert float(x.sum()) == float(1 << 22)


PAGE_FAULTS_OF_A_REALLOCATION = """
import resource, sys
import numpy as np
from jaxrl import host
if sys.argv[1] == "keep":
    assert host.keep_freed_memory(64)
size = 256 << 20
np.ones(size, np.uint8)  # allocated, touched and freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
np.ones(size, np.uint8)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (size / 4096))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_keep_freed_memory_reuses_a_large_freed_buffer_without_faulting_its_pages_again():
    """A 256 MiB buffer freed and allocated again: with glibc's defaults it is mapped afresh (a page fault per
    4 KiB page, or per huge page where the kernel gives them); kept, its pages are reused (almost no faults),
    whether the process applies the setting or starts with it in its environment."""
    def faults_per_page(mode, env=None):
        out = subprocess.run([sys.executable, "-c", PAGE_FAULTS_OF_A_REALLOCATION, mode], capture_output=True,
                             text=True, check=True, env=None if env is None else {**os.environ, **env})
        return float(out.stdout.strip())

    assert faults_per_page("keep") < 0.001
    assert faults_per_page("default", host.freed_memory_environment(64)) < 0.001  # the same, from the environment
    assert host.freed_memory_environment(0) == {}
    assert faults_per_page("default") > 0.004  # (0.0098 on the 2-core AMD EPYC, 2026-12-03)


def step(state, hp, shared):
    """A per-run function with a reduction and a matmul, as the training programs have."""
    return {"w": state["w"] - hp * (state["w"] @ shared), "norm": jnp.linalg.norm(state["w"])}, hp * 2


@pytest.mark.parametrize("runs", [1, 3])
def test_over_local_runs_equals_vmap(runs):
    state = {"w": jax.random.normal(jax.random.key(0), (runs, 4, 4))}
    hp = jnp.arange(1.0, runs + 1.0)
    shared = jax.random.normal(jax.random.key(1), (4, 4))
    ours = jax.jit(mesh_lib.over_local_runs(step, (0, 0, None)))(state, hp, shared)
    reference = jax.vmap(step, (0, 0, None))(state, hp, shared)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(reference)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_over_local_runs_rejects_other_axes():
    with pytest.raises(ValueError, match="in_axes must be 0 or None"):
        mesh_lib.over_local_runs(step, (1, 0, None))
