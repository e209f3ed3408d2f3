"""Every notebook in notebooks/ runs top to bottom with a small budget, so none can rot."""

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import ROOT

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_there_are_notebooks():
    assert NOTEBOOKS


# Env steps (or samples) per notebook: at least one update of each run it makes (grpo_text: 2,048 SFT samples,
# 32 updates; 512 completions per GRPO run, 2 updates).
BUDGETS = {"grpo_text.ipynb": "2048"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXRL_NOTEBOOK_STEPS", BUDGETS.get(os.path.basename(path), "8192"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebooks' run directories (tempfile.mkdtemp), cleaned by pytest
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
