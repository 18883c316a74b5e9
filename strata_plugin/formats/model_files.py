"""The headers of model files, read without their tensors: GGUF and safetensors.

Why our own readers: the roofline needs a model's shapes and stored bytes, not its
weights, and it must work where the ``gguf`` package (the embedded extra) is not
installed, on a 100 GB checkpoint, in seconds. Both formats put everything needed in a
header: a GGUF file its metadata and tensor table before the data, a safetensors file a
JSON header before the data. Nothing past a header is read.

* GGUF: the format as ggml's ``docs/gguf.md`` specifies it (versions 2 and 3: "GGUF"
  magic, version, tensor count, metadata count, metadata, tensor infos). A tensor's stored
  bytes come from its type's block size and bytes per block, ggml's ``type_traits``
  (``ggml/src/ggml.c``; the same table as gguf-py's ``GGML_QUANT_SIZES``).
* safetensors: an 8-byte little-endian header length, then a JSON object of tensors
  (``dtype``, ``shape``, ``data_offsets``), per the safetensors format description
  (huggingface.co/docs/safetensors, "Format").
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin.errors import StrataError


class ModelFileError(StrataError, ValueError):
    """A model file that is not what its name says, or is cut short."""


#: ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}

# GGUF metadata value types (docs/gguf.md, "gguf_metadata_value_type")
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: arrays longer than this (token lists, scores, merges) are skipped, not materialized
MAX_ARRAY = 64


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # logical elements per dimension
    dtype: str  # "Q8_0", "BF16", ...
    nbytes: int  # bytes as stored

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: dict[str, Any]  # long arrays as ("array", length)
    tensors: tuple[TensorInfo, ...]


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ModelFileError(f"{self.path}: GGUF header cut short at byte {self.pos}")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ModelFileError(f"{self.path}: GGUF string of {n} bytes past the end")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_string(self) -> None:
        n = self.take("<Q")
        self.pos += n

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.take("<I"), self.take("<Q")
            if n > MAX_ARRAY:
                self._skip_array(etype, n)
                return ("array", n)
            return [self.value(etype) for _ in range(n)]
        raise ModelFileError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")

    def _skip_array(self, etype: int, n: int) -> None:
        if etype in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[etype]) * n
        elif etype == _STRING:
            for _ in range(n):
                self.skip_string()
        else:
            for _ in range(n):
                self.value(etype)
        if self.pos > len(self.buf):
            raise ModelFileError(f"{self.path}: GGUF array past the end")


def read_gguf_header(path: Path | str) -> GgufHeader:
    """The metadata and tensor table of a GGUF file (the file is mapped, its tensor data
    never touched)."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # an empty file cannot be mapped
            raise ModelFileError(f"{path}: not a GGUF file ({e})") from None
    try:
        buf = memoryview(mm)
        try:
            return _parse_gguf(_Cursor(buf, path), path)
        finally:
            buf.release()
    finally:
        mm.close()


def _parse_gguf(c: _Cursor, path: Path) -> GgufHeader:
    if len(c.buf) < 4 or bytes(c.buf[:4]) != b"GGUF":
        raise ModelFileError(f"{path}: not a GGUF file (no GGUF magic)")
    c.pos = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise ModelFileError(f"{path}: GGUF version {version}; this reader knows 2 and 3")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        dims = tuple(c.take("<Q") for _ in range(n_dims))
        tid = c.take("<I")
        c.take("<Q")  # offset into the data section
        if tid not in GGML_TYPES:
            raise ModelFileError(f"{path}: tensor {name}: ggml type {tid} unknown to this "
                                 "reader (strata_plugin/formats/model_files.py GGML_TYPES)")
        tname, block, per_block = GGML_TYPES[tid]
        numel = 1
        for d in dims:
            numel *= d
        # ggml's ne[0] is the fastest dimension: numpy order is reversed
        tensors.append(TensorInfo(name, tuple(reversed(dims)), tname,
                                  numel // block * per_block))
    return GgufHeader(version, meta, tuple(tensors))


# --- safetensors ------------------------------------------------------------------------

#: bytes per element of each safetensors dtype (sub-byte types as fractions)
SAFETENSORS_DTYPES: dict[str, float] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "F8_E8M0": 1, "F6_E2M3": 0.75, "F6_E3M2": 0.75, "F4": 0.5,
}
#: a header larger than this is not a safetensors header (the format caps it at 100 MB)
MAX_SAFETENSORS_HEADER = 100_000_000


def read_safetensors_header(path: Path | str) -> tuple[TensorInfo, ...]:
    """The tensors of one safetensors file, from its JSON header alone."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelFileError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_SAFETENSORS_HEADER:
            raise ModelFileError(f"{path}: not a safetensors file (header of {n} bytes)")
        raw = f.read(n)
    if len(raw) < n:
        raise ModelFileError(f"{path}: safetensors header cut short")
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise ModelFileError(f"{path}: safetensors header is not JSON ({e})") from None
    return tuple(_st_tensors(header, path))


def _st_tensors(header: dict[str, Any], path: Path) -> Iterator[TensorInfo]:
    for name, t in sorted(header.items()):
        if name == "__metadata__":
            continue
        try:
            a, b = t["data_offsets"]
            yield TensorInfo(name, tuple(int(d) for d in t["shape"]), str(t["dtype"]),
                             int(b) - int(a))
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"{path}: tensor {name!r} has no dtype/shape/data_offsets"
                                 ) from None
