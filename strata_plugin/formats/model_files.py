"""The headers of model files, read without their tensors: GGUF and safetensors.

Why our own readers: the roofline needs a model's shapes and stored bytes, not its
weights, and it must work where the ``gguf`` package (the embedded extra) is not
installed, on a 100 GB checkpoint, in seconds. Both formats put everything needed in a
header: a GGUF file its metadata and tensor table before the data, a safetensors file a
JSON header before the data. Nothing past a header is read.

Every count, length and size a header claims is checked against what is left of the file
and against its limit (strata_plugin/limits.py) before it is used, so a corrupt header
claiming 2^63 entries or a 2 GB string is refused at once, naming the file and the limit,
and nothing is allocated for it. Files are opened only when they are regular files
(formats/bounded.py: a FIFO would block the open).

* GGUF: the format as ggml's ``docs/gguf.md`` specifies it (versions 2 and 3: "GGUF"
  magic, version, tensor count, metadata count, metadata, tensor infos). A tensor's stored
  bytes come from its type's block size and bytes per block, ggml's ``type_traits``
  (``ggml/src/ggml.c``; the same table as gguf-py's ``GGML_QUANT_SIZES``).
* safetensors: an 8-byte little-endian header length, then a JSON object of tensors
  (``dtype``, ``shape``, ``data_offsets``), per the safetensors format description
  (huggingface.co/docs/safetensors, "Format").
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin.errors import StrataError
from strata_plugin.formats.bounded import BoundedReadError, open_regular, parse_json
from strata_plugin.limits import (
    GGUF_ARRAY_DEPTH_MAX,
    GGUF_ARRAY_MAX,
    GGUF_DIMS_MAX,
    GGUF_HEADER_BYTES_MAX,
    GGUF_METADATA_MAX,
    GGUF_STRING_BYTES_MAX,
    GGUF_TENSORS_MAX,
    SAFETENSORS_HEADER_BYTES_MAX,
)


class ModelFileError(StrataError, ValueError):
    """A model file that is not what its name says, is cut short, or claims more than
    its limits."""


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
#: the fewest bytes one element of each kind takes (a string: its 8-byte length; an
#: array: its type and length), so a claimed count is checked against the bytes left
_MIN_BYTES = {**{t: struct.calcsize(f) for t, f in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}
#: a tensor's entry without its dimensions: name length, dimension count, type, offset
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8
_INT64_MAX = (1 << 63) - 1


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
    """Reads within the header's bound (the file, at most GGUF_HEADER_BYTES_MAX)."""

    def __init__(self, buf: memoryview, path: Path, file_size: int) -> None:
        self.buf, self.pos, self.path, self.file_size = buf, 0, path, file_size

    def _past(self, what: str) -> ModelFileError:
        if self.file_size > len(self.buf):  # the file goes on: the header is too large
            return ModelFileError(f"{self.path}: GGUF header past GGUF_HEADER_BYTES_MAX "
                                  f"({GGUF_HEADER_BYTES_MAX} bytes) at {what}")
        return ModelFileError(f"{self.path}: GGUF header cut short at byte {self.pos} "
                              f"({what})")

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise self._past(f"byte {self.pos}")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def count(self, n: int, what: str, most: int, limit_name: str, min_bytes: int) -> int:
        """A claimed count, checked against its limit and the bytes left before a loop
        runs over it."""
        if n > most:
            raise ModelFileError(f"{self.path}: GGUF {what}: {n} claimed, past {limit_name} "
                                 f"({most})")
        if n * min_bytes > self.left():
            raise self._past(f"{what}: {n} claimed, {n * min_bytes} bytes or more")
        return n

    def _length(self) -> int:
        n = self.take("<Q")
        if n > GGUF_STRING_BYTES_MAX:
            raise ModelFileError(f"{self.path}: GGUF string of {n} bytes at byte {self.pos}, "
                                 f"past GGUF_STRING_BYTES_MAX ({GGUF_STRING_BYTES_MAX})")
        if n > self.left():
            raise self._past(f"a string of {n} bytes")
        return n

    def string(self) -> str:
        n = self._length()
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_string(self) -> None:
        n = self._length()  # it moves past the length first
        self.pos += n

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            if depth >= GGUF_ARRAY_DEPTH_MAX:
                raise ModelFileError(f"{self.path}: GGUF arrays nested past "
                                     f"GGUF_ARRAY_DEPTH_MAX ({GGUF_ARRAY_DEPTH_MAX}) at byte "
                                     f"{self.pos}")
            etype, n = self.take("<I"), self.take("<Q")
            if etype not in _MIN_BYTES:
                raise ModelFileError(f"{self.path}: unknown GGUF value type {etype} at byte "
                                     f"{self.pos}")
            self.count(n, "array length", GGUF_ARRAY_MAX, "GGUF_ARRAY_MAX", _MIN_BYTES[etype])
            if n > MAX_ARRAY:
                self._skip_array(etype, n, depth + 1)
                return ("array", n)
            return [self.value(etype, depth + 1) for _ in range(n)]
        raise ModelFileError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")

    def _skip_array(self, etype: int, n: int, depth: int) -> None:
        if etype in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[etype]) * n  # within the bytes left: count()
        elif etype == _STRING:
            for _ in range(n):
                self.skip_string()
        else:
            for _ in range(n):
                self.value(etype, depth)


def read_gguf_header(path: Path | str) -> GgufHeader:
    """The metadata and tensor table of a GGUF file (the file is mapped, its tensor data
    never touched; only a regular file is opened)."""
    path = Path(path)
    try:
        with open_regular(path) as (f, size):
            try:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as e:  # an empty file cannot be mapped
                raise ModelFileError(f"{path}: not a GGUF file ({e})") from None
    except BoundedReadError as e:
        raise ModelFileError(str(e)) from None
    try:
        buf = memoryview(mm)[:GGUF_HEADER_BYTES_MAX]
        try:
            return _parse_gguf(_Cursor(buf, path, size), path)
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
    c.count(n_kv, "metadata count", GGUF_METADATA_MAX, "GGUF_METADATA_MAX", 8 + 4 + 1)
    c.count(n_tensors, "tensor count", GGUF_TENSORS_MAX, "GGUF_TENSORS_MAX",
            _MIN_TENSOR_BYTES)
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        if n_dims > GGUF_DIMS_MAX:
            raise ModelFileError(f"{path}: tensor {name[:200]!r}: {n_dims} dimensions, past "
                                 f"GGUF_DIMS_MAX ({GGUF_DIMS_MAX}, ggml's GGML_MAX_DIMS)")
        dims = tuple(c.take("<Q") for _ in range(n_dims))
        tid = c.take("<I")
        c.take("<Q")  # offset into the data section
        if tid not in GGML_TYPES:
            raise ModelFileError(f"{path}: tensor {name[:200]!r}: ggml type {tid} unknown to this "
                                 "reader (strata_plugin/formats/model_files.py GGML_TYPES)")
        tname, block, per_block = GGML_TYPES[tid]
        numel = 1
        for d in dims:
            numel *= d
            if numel > _INT64_MAX:  # ggml counts elements in int64 (gguf.cpp refuses it too)
                raise ModelFileError(f"{path}: tensor {name[:200]!r}: dimensions {list(dims)} "
                                     "overflow a 64-bit element count")
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
MAX_SAFETENSORS_HEADER = SAFETENSORS_HEADER_BYTES_MAX
_DTYPE_BITS = {k: round(v * 8) for k, v in SAFETENSORS_DTYPES.items()}


def read_safetensors_header(path: Path | str) -> tuple[TensorInfo, ...]:
    """The tensors of one safetensors file, from its JSON header alone: each tensor's
    dtype, shape and offsets typed and checked as the format's own reader checks them
    (offsets within the data, bytes = elements x dtype size)."""
    path = Path(path)
    try:
        with open_regular(path) as (f, size):
            head = f.read(8)
            if len(head) < 8:
                raise ModelFileError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_SAFETENSORS_HEADER:
                raise ModelFileError(f"{path}: not a safetensors file (its header length is "
                                     f"past SAFETENSORS_HEADER_BYTES_MAX, "
                                     f"{MAX_SAFETENSORS_HEADER} bytes)")
            if 8 + n > size:
                raise ModelFileError(f"{path}: safetensors header cut short")
            raw = f.read(n)
        if len(raw) < n:
            raise ModelFileError(f"{path}: safetensors header cut short")
        header = parse_json(raw, f"{path}: safetensors header")
    except BoundedReadError as e:
        raise ModelFileError(str(e)) from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: safetensors header is not a JSON object")
    return tuple(_st_tensors(header, path, size - 8 - n))


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _st_tensors(header: dict[str, Any], path: Path, data_bytes: int) -> Iterator[TensorInfo]:
    for name, t in sorted(header.items()):
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name[:200]!r}"
        if not isinstance(t, dict):
            raise ModelFileError(f"{where} is not a JSON object")
        dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if not isinstance(dtype, str):
            raise ModelFileError(f"{where}: dtype is not a string")
        if not isinstance(shape, list) or not all(_whole(d) for d in shape):
            raise ModelFileError(f"{where}: shape is not a list of whole numbers")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_whole(x) for x in offsets) or offsets[0] > offsets[1]):
            raise ModelFileError(f"{where}: data_offsets is not [begin, end] in bytes")
        a, b = offsets
        if b > data_bytes:
            raise ModelFileError(f"{where}: data_offsets end {b} past the file's "
                                 f"{data_bytes} data bytes")
        numel = 1
        for d in shape:
            numel *= d
        bits = _DTYPE_BITS.get(dtype)
        if bits is not None and (numel * bits + 7) // 8 != b - a:
            raise ModelFileError(f"{where}: shape {shape[:8]} of {dtype} is "
                                 f"{(numel * bits + 7) // 8} bytes, its data_offsets "
                                 f"{b - a}")
        yield TensorInfo(name, tuple(shape), dtype, b - a)
