"""The import contracts of .importlinter hold: envs never imports jaxrl, leaves never import the engine,
algorithms or host loop, algorithms never import the host loop, and no two sibling modules import each other. And the
middle stays readable: algorithm modules of at most 600 lines, host-loop functions of at most 80, no algorithm class
built on another."""

import ast
import os
import shutil
import subprocess
import sys

from helpers import ROOT

MAX_ALGORITHM_MODULE_LINES, MAX_RUN_FUNCTION_LINES = 600, 80


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    result = subprocess.run([lint, "--config", os.path.join(ROOT, ".importlinter")], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def modules(package: str) -> list[str]:
    """The .py files under jaxrl/<package>, relative to the repository."""
    root = os.path.join(ROOT, "jaxrl", package)
    return sorted(os.path.relpath(os.path.join(folder, name), ROOT) for folder, _, names in os.walk(root)
                  for name in names if name.endswith(".py"))


def test_no_algorithm_module_is_longer_than_600_lines():
    lengths = {path: len(open(os.path.join(ROOT, path)).read().splitlines()) for path in modules("algos")}
    assert {path: n for path, n in lengths.items() if n > MAX_ALGORITHM_MODULE_LINES} == {}


def test_no_host_loop_function_is_longer_than_80_lines():
    long = {}
    for path in modules("run"):
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_RUN_FUNCTION_LINES:
                    long[f"{path}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert long == {}


def test_no_algorithm_class_is_built_on_another():
    """A class of jaxrl/algos may extend another of jaxrl/algos only as a state record (a flax struct dataclass that
    adds a field: a run's frozen reward model or teacher), never as an algorithm."""
    classes = {}
    for path in modules("algos"):
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node
    def record(name: str) -> bool:
        return any("struct.dataclass" in ast.unparse(d) for d in classes[name].decorator_list)

    extended = {name: bases for name, node in classes.items()
                if (bases := [ast.unparse(b) for b in node.bases if ast.unparse(b) in classes])}
    assert "TextGRPOTeacherState" in extended  # (the check sees what extends another)
    assert {name: bases for name, bases in extended.items() if not (record(name) and all(map(record, bases)))} == {}
