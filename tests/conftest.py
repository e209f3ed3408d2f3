import os
import sys

import pytest

from helpers import ROOT


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: learning checks that take minutes (still run in CI)")


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
