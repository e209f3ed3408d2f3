"""The import contracts of .importlinter hold: envs never imports jaxrl, leaves never import the engine,
algorithms or host loop, algorithms never import the host loop, and no two sibling modules import each other."""

import os
import shutil
import subprocess
import sys

from helpers import ROOT


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    result = subprocess.run([lint, "--config", os.path.join(ROOT, ".importlinter")], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
