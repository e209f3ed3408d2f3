"""Reading and writing .safetensors files as memory-mapped numpy arrays, bfloat16 included.

The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte offsets into the
data that follows) and the raw little-endian tensors. safetensors' own numpy API refuses bfloat16 (numpy has no
such dtype), which is how most checkpoints are stored; here bfloat16 is `ml_dtypes.bfloat16` (a jax dependency),
and a tensor is a view into `np.memmap` of the file: nothing is read until a slice of it is used.
"""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np

from jaxrl import files

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def read_header(path: str) -> tuple[dict, int]:
    """-> (header: name -> {"dtype", "shape", "data_offsets"}, where the data starts)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


def open_tensors(path: str) -> dict[str, np.ndarray]:
    """name -> a read-only memory-mapped array of each tensor in the file."""
    header, start = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, which is not supported "
                             f"(supported: {', '.join(DTYPES)})")
        begin, end = info["data_offsets"]
        tensors[name] = data[start + begin:start + end].view(DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors


def save(tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write name -> array (C order, any dtype of `DTYPES`) as one .safetensors file (written whole, then renamed
    into place, so a kill mid-write leaves no half file under `path`)."""
    header, offset = {}, 0
    arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
    for name, a in arrays.items():
        header[name] = {"dtype": NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with files.atomic_file(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for a in arrays.values():
            f.write(a.tobytes())
