import os
import sys

import pytest

from helpers import ROOT


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: learning checks that take minutes (still run in CI)")
    # One XLA compilation cache for the whole session, shared by the xdist workers and the subprocesses the
    # tests start (they inherit the environment): many tests compile the same small programs. Set by the
    # controlling process only, before the workers start; a fresh directory each session, so that no test
    # depends on what an earlier session compiled.
    if not hasattr(config, "workerinput") and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        import tempfile

        config._jaxrl_xla_cache = tempfile.mkdtemp(prefix="jaxrl-tests-xla-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = config._jaxrl_xla_cache
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"


def pytest_unconfigure(config):
    cache = getattr(config, "_jaxrl_xla_cache", None)
    if cache:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)


def run_python(code: str, *, devices: int = 1, timeout: int = 600, env: dict | None = None):
    """Run `code` in a fresh interpreter (XLA device flags only act before jax is imported)."""
    import subprocess

    full_env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                    JAX_PLATFORMS="cpu", **(env or {}))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def python_subprocess():
    return run_python
