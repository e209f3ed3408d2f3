"""Small files written whole or not at all: a kill, a full disk or a crash mid-write leaves the previous version.

Every JSON or text file jaxrl writes beside a run (config.json, run_info.json, sweep.json, diverged.json,
lineage, evaluation.json, ...) goes through `write_atomic`: the text goes to a temporary file in the same
directory, is flushed to disk, and replaces the old file in one rename.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import IO, Any, Iterator


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w", newline: str | None = None) -> Iterator[IO]:
    """A file opened for writing that replaces `path` only when the block ends without an error (a temporary file
    beside it, fsync, rename); `mode` is "w" or "wb", `newline` as open()'s."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` in one step."""
    with atomic_file(path) as f:
        f.write(text)


def write_json(path: str, value: Any, indent: int | None = 1) -> None:
    """`value` as JSON, written atomically."""
    write_atomic(path, json.dumps(value, indent=indent) + "\n")


def read_json(path: str, default: Any = None) -> Any:
    """The JSON value in `path`, or `default` when the file does not exist."""
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def write_lines(path: str, rows: list[dict]) -> None:
    """JSON lines (one object a line), written atomically."""
    write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))
