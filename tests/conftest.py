import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def set_keys(config, overrides: dict):
    """Set dotted config keys ("loss.clip_high": 0.28) as the command line does; returns the config."""
    for key, value in overrides.items():
        target = config
        *parents, leaf = key.split(".")
        for part in parents:
            target = target[part]
        target[leaf] = value
    return config
