"""The served model's facts, read from the model itself: its shapes, parameters and
stored bytes, for the roofline (analysis/roofline.py).

Why from the file: "how close to the hardware's limit" needs the bytes a decode step
reads and the FLOPs a prefill does, and both follow from the model as stored (a Q4 GGUF
moves a quarter of the bytes its BF16 original does). A fact that cannot be read is
UNAVAILABLE with the reason, never guessed from a name.

* GGUF (llama.cpp): the metadata (``<arch>.block_count``, ``.attention.head_count``, ...)
  and the tensor table (each tensor's logical shape and stored bytes) of the header.
* Hugging Face checkpoints (vLLM, SGLang): ``config.json`` (its ``text_config`` where the
  model is multimodal) and the safetensors headers (the index's files, or the one file),
  whose ``data_offsets`` give each tensor's stored bytes exactly.

Names: the token embedding is a lookup (no FLOPs, one row read per token); the LM head
is a matrix multiply (tied to the embedding, the embedding is that matrix). Routed
experts of a mixture-of-experts layer count ``experts_per_token / experts`` of their
parameters per token; shared experts are always active. 1-D tensors (norms, biases) are
parameters but no matrix multiply. Quantization metadata (scales, zero points, group
indices) are stored bytes, not parameters; packed integer weights (GPTQ/AWQ ``qweight``)
count ``32 / bits`` parameters per int32.

Every value is checked where it is read: a fact of the wrong JSON or GGUF type, out of
its range (MODEL_SHAPE_MAX) or not finite is UNAVAILABLE with the file and key named
("config.json: num_attention_heads is a str, expected an integer"), never a TypeError
later in the roofline; the same check holds the facts a manifest is read back with.
Files are read within their limits (strata_plugin/limits.py) and only when regular; the
safetensors index may name only files inside the model's folder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from strata_plugin.formats.bounded import read_json
from strata_plugin.formats.model_files import (
    GGML_TYPES,
    ModelFileError,
    TensorInfo,
    read_gguf_header,
    read_safetensors_header,
)
from strata_plugin.limits import (
    HF_CONFIG_BYTES_MAX,
    MODEL_ID_SHOWN_MAX,
    MODEL_SHAPE_MAX,
    SAFETENSORS_INDEX_BYTES_MAX,
)

#: Every fact, in the order the manifest and the report list them, with its meaning.
FACTS: tuple[tuple[str, str], ...] = (
    ("architecture", "the model family as the file names it"),
    ("params_total", "parameters, every tensor's logical elements"),
    ("params_embedding", "the token embedding's parameters (a lookup: no FLOPs)"),
    ("params_lm_head", "the output projection's parameters (the embedding when tied)"),
    ("params_experts", "routed experts' parameters (0: a dense model)"),
    ("params_active", "parameters a token uses: routed experts at experts_per_token/experts"),
    ("params_matmul_active", "parameters in matrix multiplies per token (FLOPs = 2 x this)"),
    ("stored_bytes", "bytes of all tensors as stored (quantized where the file is)"),
    ("stored_bytes_embedding", "bytes of the token embedding as stored"),
    ("stored_bytes_experts", "bytes of the routed experts as stored"),
    ("bytes_per_param", "stored_bytes / params_total"),
    ("weight_dtype", "the tensor type holding most of the bytes"),
    ("layers", "transformer blocks"),
    ("hidden", "hidden size (embedding width)"),
    ("heads", "attention (query) heads"),
    ("kv_heads", "key/value heads"),
    ("head_dim", "dimension of one head"),
    ("ff", "feed-forward width"),
    ("vocab", "vocabulary size"),
    ("context_length", "the model's trained context"),
    ("experts", "routed experts per MoE layer (1: dense)"),
    ("experts_per_token", "routed experts each token uses (1: dense)"),
    ("kv_lora_rank", "multi-head latent attention's compressed KV width (0: none)"),
    ("tied_embeddings", "the LM head is the token embedding"),
    ("kv_cache_dtype", "the KV cache's element type, as the engine is run"),
    ("kv_bytes_per_elem", "bytes per KV cache element"),
    ("kv_bytes_per_token", "KV cache bytes one token adds (K and V, every layer)"),
)
FACT_NAMES = tuple(n for n, _ in FACTS)

#: what each fact's value must be: (kind, least); "shape" is a whole number up to
#: MODEL_SHAPE_MAX, "count" one up to 2^63 - 1, "real" a finite number, "text" a string
#: of at most MODEL_ID_SHOWN_MAX characters
_SHAPE_1 = ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "context_length",
            "experts", "experts_per_token")
FACT_KINDS: dict[str, tuple[str, float]] = {
    **{n: ("shape", 1) for n in _SHAPE_1},
    "ff": ("shape", 0), "kv_lora_rank": ("shape", 0),
    **{n: ("count", 0) for n in FACT_NAMES if n.startswith(("params_", "stored_bytes"))},
    "bytes_per_param": ("real", 0), "kv_bytes_per_elem": ("real", 0),
    "kv_bytes_per_token": ("real", 0),
    "architecture": ("text", 0), "weight_dtype": ("text", 0), "kv_cache_dtype": ("text", 0),
    "tied_embeddings": ("bool", 0),
}
_COUNT_MAX = (1 << 63) - 1
_EXPECTED = {"shape": "an integer", "count": "an integer", "real": "a number",
             "text": "a string", "bool": "true or false"}


def _type_name(v: Any) -> str:
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "array":
        return f"an array of {v[1]} values"
    return {bool: "a bool", int: "an int", float: "a float", str: "a str", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _shown_number(v: int | float) -> str:
    text = str(v)
    return text if len(text) <= 40 else f"a {len(text)}-digit number"


def check_value(name: str, value: Any) -> str:
    """Why ``value`` cannot be the fact ``name`` ("is a str, expected an integer"), or ""
    when it can."""
    kind, least = FACT_KINDS[name]
    if kind == "bool":
        return "" if isinstance(value, bool) else f"is {_type_name(value)}, expected true or false"
    if kind == "text":
        if not isinstance(value, str):
            return f"is {_type_name(value)}, expected a string"
        if len(value) > MODEL_ID_SHOWN_MAX:
            return (f"is a string of {len(value)} characters, past MODEL_ID_SHOWN_MAX "
                    f"({MODEL_ID_SHOWN_MAX})")
        return ""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if kind in ("shape", "count") and not whole:
        return f"is {_type_name(value)}, expected an integer"
    if (kind == "real" and not (whole or isinstance(value, float))) or isinstance(value, bool):
        return f"is {_type_name(value)}, expected a number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"is {value}, expected a finite number"
    most = MODEL_SHAPE_MAX if kind == "shape" else _COUNT_MAX
    if value < least:
        return f"is {_shown_number(value)}, expected {_EXPECTED[kind]} >= {least:g}"
    if value > most:
        return (f"is {_shown_number(value)}, past "
                + (f"MODEL_SHAPE_MAX ({MODEL_SHAPE_MAX})" if kind == "shape" else "2^63 - 1"))
    return ""


@dataclass(frozen=True)
class Fact:
    value: Any  # None when unavailable
    source: str = ""  # where it was read ("GGUF llama.block_count")
    unavailable: str = ""  # why not, when value is None

    def to_json(self) -> dict[str, Any]:
        if self.value is None:
            return {"value": None, "unavailable": self.unavailable or "not read"}
        return {"value": self.value, "source": self.source}


@dataclass(frozen=True)
class KvCacheSetting:
    """The engine's KV cache element type as it is run (a server argument, or the
    engine's default), with where that came from."""

    dtype: str  # "f16", "q8_0", "auto", "fp8" ...
    source: str
    #: bytes per element of K and of V (llama.cpp sets them apart); None: the model's
    bytes_k: float | None = None
    bytes_v: float | None = None


@dataclass(frozen=True)
class ModelFacts:
    path: str
    format: str  # "gguf" | "hf" | "" (not read)
    facts: tuple[tuple[str, Fact], ...]
    #: where the path came from ("llama.cpp argv -m", "/props model_path")
    located_by: str = ""

    def fact(self, name: str) -> Fact:
        for n, f in self.facts:
            if n == name:
                return f
        return Fact(None, unavailable="not read")

    def get(self, name: str) -> Any:
        return self.fact(name).value

    def missing(self, *names: str) -> list[str]:
        """``name: reason`` for each of these facts that is unavailable."""
        return [f"{n}: {self.fact(n).unavailable or 'not read'}" for n in names
                if self.get(n) is None]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "located_by": self.located_by,
                "facts": {n: f.to_json() for n, f in self.facts}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ModelFacts:
        facts = []
        given = d.get("facts")
        for name in FACT_NAMES:
            e = given.get(name) if isinstance(given, dict) else None
            if not isinstance(e, dict):
                continue
            v = e.get("value")
            why = check_value(name, v) if v is not None else ""
            if why:  # a manifest written by hand, or by an older reader
                facts.append((name, Fact(None, unavailable=f"manifest: {name} {why}")))
            else:
                facts.append((name, Fact(v, str(e.get("source", "")),
                                         str(e.get("unavailable", "")))))
        return cls(str(d.get("path", "")), str(d.get("format", "")), tuple(facts),
                   str(d.get("located_by", "")))

    @classmethod
    def unavailable(cls, path: str, reason: str, located_by: str = "") -> ModelFacts:
        return cls(path, "", tuple((n, Fact(None, unavailable=reason)) for n in FACT_NAMES),
                   located_by)


def read_model_facts(path: Path | str, kv: KvCacheSetting | None = None,
                     located_by: str = "") -> ModelFacts:
    """The facts of the model at ``path``: a GGUF file, or a Hugging Face checkpoint
    folder (or its config.json). Unreadable: every fact UNAVAILABLE with the reason."""
    p = Path(path)
    try:
        if p.name == "config.json" and not p.is_dir():
            p = p.parent
        if p.is_dir():
            if not (p / "config.json").exists():
                return ModelFacts.unavailable(str(p), f"{p} has no config.json", located_by)
            return _hf_facts(p, kv, located_by)
        if p.exists():  # a regular file, else refused when opened (a FIFO would block)
            return _gguf_facts(p, kv, located_by)
        return ModelFacts.unavailable(str(p), f"{p} is not a file or folder on this machine",
                                      located_by)
    except (OSError, ValueError) as e:  # ModelFileError, BoundedReadError
        return ModelFacts.unavailable(str(p), str(e), located_by)


# --- shared arithmetic ------------------------------------------------------------------


class _Builder:
    """The facts as they are read: each value checked against its fact's kind
    (FACT_KINDS), a wrong one UNAVAILABLE naming ``file`` and the key it came from."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.facts: dict[str, Fact] = {}

    def put(self, name: str, value: Any, source: str, why_not: str = "",
            key: str = "") -> None:
        assert name in FACT_NAMES, name
        if value is None:
            self.facts[name] = Fact(None, unavailable=why_not or f"{source}: not present")
            return
        why = check_value(name, value)
        if why:
            self.facts[name] = Fact(None, unavailable=f"{self.file}: {key or name} {why}")
        else:
            self.facts[name] = Fact(value, source)

    def get(self, name: str) -> Any:
        f = self.facts.get(name)
        return None if f is None else f.value

    def fact_why(self, name: str, default: str) -> str:
        f = self.facts.get(name)
        return f.unavailable if f is not None and f.unavailable else default

    def done(self, path: Path, fmt: str, located_by: str) -> ModelFacts:
        out = [(n, self.facts.get(n, Fact(None, unavailable="not read"))) for n in FACT_NAMES]
        return ModelFacts(str(path), fmt, tuple(out), located_by)


@dataclass(frozen=True)
class _Tensors:
    """The tensor table split the way the roofline counts it."""

    params: int
    matmul: int  # params in 2-D+ tensors other than the embedding
    embedding: int
    lm_head: int
    experts: int  # routed experts (params)
    expert_matmul: int
    stored: int
    stored_embedding: int
    stored_experts: int
    dtype_bytes: dict[str, int]


def _split(tensors: Sequence[tuple[TensorInfo, int]], is_embedding, is_lm_head, is_expert,
           is_meta) -> _Tensors:
    """``tensors``: (info, logical params) pairs."""
    params = matmul = emb = head = exp = exp_mm = stored = s_emb = s_exp = 0
    by_dtype: dict[str, int] = {}
    for t, n in tensors:
        stored += t.nbytes
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
        if is_meta(t.name):
            continue
        params += n
        if is_embedding(t.name):
            emb += n
            s_emb += t.nbytes
            continue
        mm = n if len([d for d in t.shape if d > 1]) >= 2 else 0
        matmul += mm
        if is_lm_head(t.name):
            head += n
        if is_expert(t.name):
            exp += n
            exp_mm += mm
            s_exp += t.nbytes
    return _Tensors(params, matmul, emb, head, exp, exp_mm, stored, s_emb, s_exp, by_dtype)


def _derive(b: _Builder, t: _Tensors, src: str, tied: bool | None) -> None:
    """The parameter and byte facts from the split tensor table, with MoE weighting."""
    b.put("params_total", t.params, src)
    b.put("params_embedding", t.embedding, src)
    b.put("stored_bytes", t.stored, src)
    b.put("stored_bytes_embedding", t.stored_embedding, src)
    b.put("stored_bytes_experts", t.stored_experts, src)
    b.put("params_experts", t.experts, src)
    if t.params:
        b.put("bytes_per_param", round(t.stored / t.params, 6), f"{src}: stored bytes / params")
    if t.dtype_bytes:
        b.put("weight_dtype", max(sorted(t.dtype_bytes), key=lambda k: t.dtype_bytes[k]),
              f"{src}: the type holding most bytes")
    head = t.lm_head
    matmul = t.matmul
    if tied:
        head = t.embedding  # the embedding matrix is the output projection
        matmul += t.embedding
    b.put("params_lm_head", head, src + (" (tied: the embedding)" if tied else ""))
    e, k = b.get("experts"), b.get("experts_per_token")
    if t.experts and (not e or not k):
        why = "routed experts in the tensors but no expert counts in the metadata"
        b.put("params_active", None, src, why)
        b.put("params_matmul_active", None, src, why)
        return
    share = (k / e) if t.experts else 1.0
    how = f"{src}: routed experts x {k}/{e}" if t.experts else src
    b.put("params_active", round(t.params - t.experts * (1 - share)), how)
    b.put("params_matmul_active", round(matmul - t.expert_matmul * (1 - share)), how)


def _rope_dim(b: _Builder, v: Any, key: str) -> int | str:
    """The rope width beside a multi-head latent attention's rank: a whole number, else
    why not (its KV bytes then unavailable)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MODEL_SHAPE_MAX:
        return v
    return f"{b.file}: {key} " + check_value("ff", v)  # "ff": a shape that may be 0


def _kv(b: _Builder, kv: KvCacheSetting | None, model_dtype_bytes: float | None,
        model_dtype: str, rope_dim: int | str = 0) -> None:
    """KV bytes per token: K and V per layer, kv_heads x head_dim each, or multi-head
    latent attention's kv_lora_rank + rope width (one compressed vector per layer)."""
    if kv is not None and kv.bytes_k is None:  # named, but its size is not known
        for n in ("kv_cache_dtype", "kv_bytes_per_elem", "kv_bytes_per_token"):
            b.put(n, None, "", kv.source)
        return
    if kv is None:
        if model_dtype_bytes is None:
            why = "the KV cache type follows the model's dtype, which was not read"
            for n in ("kv_cache_dtype", "kv_bytes_per_elem", "kv_bytes_per_token"):
                b.put(n, None, "", why)
            return
        src = "the engine's default (auto): the model's dtype"
        bk = bv = model_dtype_bytes
        b.put("kv_cache_dtype", model_dtype, src)
    else:
        assert kv.bytes_k is not None  # a named type of unknown size returned above
        bk, bv = kv.bytes_k, kv.bytes_v if kv.bytes_v is not None else kv.bytes_k
        src = kv.source
        b.put("kv_cache_dtype", kv.dtype, src)
    b.put("kv_bytes_per_elem", (bk + bv) / 2, src)
    layers, kvh, hd = b.get("layers"), b.get("kv_heads"), b.get("head_dim")
    rank = b.get("kv_lora_rank") or 0
    if rank and isinstance(rope_dim, str):
        b.put("kv_bytes_per_token", None, "", rope_dim)
        return
    if rank:
        assert isinstance(rope_dim, int)
        per = layers * (rank + rope_dim) * bk if layers else None
        b.put("kv_bytes_per_token", per, "layers x (kv_lora_rank + rope dim) x bytes",
              "layers unavailable")
        return
    if layers is None or kvh is None or hd is None:
        b.put("kv_bytes_per_token", None, "", "layers, kv_heads or head_dim unavailable")
        return
    b.put("kv_bytes_per_token", layers * kvh * hd * (bk + bv),
          "layers x kv_heads x head_dim x (K bytes + V bytes)")


# --- GGUF -------------------------------------------------------------------------------

#: ggml type name -> bytes per element, for a KV cache type given by name
GGML_ELEM_BYTES = {name: per / block for name, block, per in GGML_TYPES.values()}


def _gguf_facts(path: Path, kv: KvCacheSetting | None, located_by: str) -> ModelFacts:
    h = read_gguf_header(path)
    m = h.metadata
    b = _Builder(str(path))
    arch = m.get("general.architecture")
    b.put("architecture", arch, "GGUF general.architecture", key="general.architecture")
    if b.get("architecture") is None:
        return ModelFacts.unavailable(
            str(path), b.fact_why("architecture", "GGUF without general.architecture"),
            located_by)

    def key(suffix: str) -> tuple[Any, str, str]:
        k = f"{arch}.{suffix}"
        return m.get(k), f"GGUF {k}", k

    def per_layer(v: Any, src: str) -> tuple[Any, str]:
        """Per-layer values (a list of whole numbers): the widest layer's."""
        if (isinstance(v, list) and v
                and all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
            return max(v), f"{src} (per layer; the largest)"
        return v, src  # anything else is checked (and named) as it is

    for name, suffix in (("layers", "block_count"), ("hidden", "embedding_length"),
                         ("heads", "attention.head_count"), ("ff", "feed_forward_length"),
                         ("context_length", "context_length")):
        v, src, k = key(suffix)
        v, src = per_layer(v, src)
        b.put(name, v, src, key=k)
    kvh, src, kk = key("attention.head_count_kv")
    kvh, src = per_layer(kvh, src)
    if kvh is None and b.get("heads") is not None:
        kvh, src = b.get("heads"), f"{src} absent: as many KV heads as heads (GGUF default)"
    b.put("kv_heads", kvh, src, key=kk)
    hd, src, kk = key("attention.key_length")
    if hd is None and b.get("hidden") and b.get("heads"):
        hd, src = b.get("hidden") // b.get("heads"), f"{src} absent: embedding_length / heads"
    b.put("head_dim", hd, src, key=kk)
    voc, src, kk = key("vocab_size")
    if voc is None:
        toks = m.get("tokenizer.ggml.tokens")
        if isinstance(toks, tuple):
            voc, src, kk = toks[1], "GGUF tokenizer.ggml.tokens (length)", "tokenizer.ggml.tokens"
    b.put("vocab", voc, src, key=kk)
    e, esrc, ek = key("expert_count")
    k, ksrc, kk = key("expert_used_count")
    b.put("experts", 1 if e in (None, 0) else e, f"{esrc} absent: dense"
          if e in (None, 0) else esrc, key=ek)
    b.put("experts_per_token", 1 if k in (None, 0) else k, f"{ksrc} absent: dense"
          if k in (None, 0) else ksrc, key=kk)
    rank, rsrc, rk = key("attention.kv_lora_rank")
    b.put("kv_lora_rank", 0 if rank is None else rank,
          f"{rsrc} absent: none" if rank is None else rsrc, key=rk)
    rank = b.get("kv_lora_rank")
    rope: Any = 0
    if rank:
        rope, _, rope_key = key("rope.dimension_count")
        rope = _rope_dim(b, 0 if rope is None else rope, rope_key)
    names = {t.name for t in h.tensors}
    tied = "output.weight" not in names
    b.put("tied_embeddings", tied, "GGUF tensor table: " + ("no output.weight" if tied
                                                             else "output.weight present"))
    t = _split([(x, x.numel) for x in h.tensors],
               is_embedding=lambda n: n == "token_embd.weight",
               is_lm_head=lambda n: n == "output.weight",
               is_expert=lambda n: "_exps." in n,
               is_meta=lambda n: False)
    _derive(b, t, "GGUF tensor table", tied)
    default = KvCacheSetting("f16", "llama.cpp's default KV cache type (--cache-type-k/-v "
                             "f16)", 2.0, 2.0)
    _kv(b, kv or default, None, "", rope)
    return b.done(path, "gguf", located_by)


# --- Hugging Face -------------------------------------------------------------------------

_HF_DTYPES = {"bfloat16": ("bf16", 2.0), "float16": ("fp16", 2.0), "half": ("fp16", 2.0),
              "float32": ("fp32", 4.0), "float": ("fp32", 4.0)}
_META_SUFFIXES = ("scales", "_scale", "scale_inv", "qzeros", "zeros", "g_idx", "zero_point",
                  "_scale_2", "input_global_scale", "weight_global_scale")


def _hf_config(folder: Path) -> tuple[dict[str, Any], str]:
    cfg = read_json(folder / "config.json", HF_CONFIG_BYTES_MAX, "HF_CONFIG_BYTES_MAX")
    if not isinstance(cfg, dict):
        raise ModelFileError(f"{folder}/config.json is not a JSON object")
    text = cfg.get("text_config")
    if isinstance(text, dict):  # multimodal: the language model's own config
        return {**cfg, **text}, "config.json text_config"
    return cfg, "config.json"


def _index_files(index: Path) -> list[str]:
    """The files model.safetensors.index.json names: each a relative path inside the
    model's folder (no ``..``, not absolute), else the index is refused without quoting
    the entry's target."""
    doc = read_json(index, SAFETENSORS_INDEX_BYTES_MAX, "SAFETENSORS_INDEX_BYTES_MAX")
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wm, dict):
        raise ModelFileError(f"{index}: weight_map is {_type_name(wm)}, expected an object")
    files = set()
    for name, f in wm.items():
        where = f"{index}: weight_map entry {name[:MODEL_ID_SHOWN_MAX]!r}"
        if not isinstance(f, str) or not f or "\0" in f:
            raise ModelFileError(f"{where} is {_type_name(f)}, expected a file name")
        rel = PurePosixPath(f)  # "a/./b" and "a/b" are one file
        if rel.is_absolute() or ".." in rel.parts:
            raise ModelFileError(f"{where} names a file outside the model's folder "
                                 "(refused: only files inside it are read)")
        files.add(str(rel))
    return sorted(files)


def _hf_tensors(folder: Path) -> tuple[list[TensorInfo], str]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = _index_files(index)
        src = f"safetensors headers ({len(files)} files of {index.name})"
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        src = "safetensors header" + ("s" if len(files) > 1 else "")
    if not files:
        raise ModelFileError(f"{folder}: no safetensors files (stored bytes need their "
                             "headers; .bin/.pt checkpoints are not read)")
    out: list[TensorInfo] = []
    for f in files:
        out.extend(read_safetensors_header(folder / f))
    return out, src


def _hf_facts(folder: Path, kv: KvCacheSetting | None, located_by: str) -> ModelFacts:
    cfg, csrc = _hf_config(folder)
    b = _Builder(str(folder / "config.json"))
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs:
        b.put("architecture", archs[0], f"{csrc} architectures", key="architectures[0]")
    else:
        b.put("architecture", cfg.get("model_type"), f"{csrc} architectures",
              key="model_type")

    def first(*keys: str) -> tuple[Any, str, str]:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k], f"{csrc} {k}", k
        return None, f"{csrc} {'/'.join(keys)}", keys[0]

    for name, keys in (("layers", ("num_hidden_layers", "n_layer", "num_layers")),
                       ("hidden", ("hidden_size", "n_embd", "d_model")),
                       ("heads", ("num_attention_heads", "n_head")),
                       ("ff", ("intermediate_size", "ffn_dim", "n_inner")),
                       ("vocab", ("vocab_size",)),
                       ("context_length", ("max_position_embeddings", "n_positions"))):
        v, src, k = first(*keys)
        b.put(name, v, src, key=k)
    kvh, src, k = first("num_key_value_heads", "num_kv_heads")
    if kvh is None and b.get("heads") is not None:
        kvh, src = b.get("heads"), f"{src} absent: as many KV heads as heads"
    b.put("kv_heads", kvh, src, key=k)
    hd, src, k = first("head_dim")
    if hd is None and b.get("hidden") and b.get("heads"):
        hd, src = b.get("hidden") // b.get("heads"), f"{src} absent: hidden_size / heads"
    b.put("head_dim", hd, src, key=k)
    e, esrc, ek = first("num_local_experts", "num_experts", "n_routed_experts",
                        "moe_num_experts")
    k_, ksrc, kk = first("num_experts_per_tok", "moe_top_k", "num_experts_per_token")
    b.put("experts", 1 if e in (None, 0) else e,
          f"{esrc} absent: dense" if e in (None, 0) else esrc, key=ek)
    b.put("experts_per_token", 1 if k_ in (None, 0) else k_,
          f"{ksrc} absent: dense" if k_ in (None, 0) else ksrc, key=kk)
    rank, rsrc, rk = first("kv_lora_rank")
    b.put("kv_lora_rank", 0 if rank is None else rank,
          f"{rsrc} absent: none" if rank is None else rsrc, key=rk)
    tied_v = cfg.get("tie_word_embeddings", False)
    b.put("tied_embeddings", tied_v, f"{csrc} tie_word_embeddings"
          + ("" if "tie_word_embeddings" in cfg else " absent: false"),
          key="tie_word_embeddings")
    tied = b.get("tied_embeddings")
    dtype_name = cfg.get("torch_dtype") or cfg.get("dtype")
    if not isinstance(dtype_name, str):
        dtype_name = None
    model_dtype, model_bytes = _HF_DTYPES.get(str(dtype_name), (str(dtype_name), None))
    bits, bits_why = _quant_bits(cfg, b.file)
    try:
        if bits_why:
            raise ModelFileError(bits_why)
        tensors, tsrc = _hf_tensors(folder)
    except (OSError, ValueError) as e:
        why = str(e)
        for n in ("params_total", "params_embedding", "params_lm_head", "params_experts",
                  "params_active", "params_matmul_active", "stored_bytes",
                  "stored_bytes_embedding", "stored_bytes_experts", "bytes_per_param",
                  "weight_dtype"):
            b.put(n, None, "", why)
    else:
        pairs = [(t, _hf_params(t, bits)) for t in tensors]
        t = _split(pairs,
                   is_embedding=lambda n: n.endswith(("embed_tokens.weight", "wte.weight",
                                                      "word_embeddings.weight")),
                   is_lm_head=lambda n: n.endswith(("lm_head.weight", "embed_out.weight")),
                   is_expert=lambda n: ".experts." in n and "shared_expert" not in n,
                   is_meta=lambda n: n.endswith(_META_SUFFIXES)
                   or n.rsplit(".", 1)[-1] in _META_SUFFIXES)
        _derive(b, t, tsrc, tied)
    rope: int | str = 0
    if b.get("kv_lora_rank"):
        rope = _rope_dim(b, cfg.get("qk_rope_head_dim") or 0, "qk_rope_head_dim")
    _kv(b, kv, model_bytes, model_dtype, rope)
    return b.done(folder, "hf", located_by)


def _quant_bits(cfg: Mapping[str, Any], file: str) -> tuple[int | None, str]:
    """The packed weights' bits (GPTQ/AWQ), and why not where they are given wrong: the
    parameter count of a packed tensor depends on it."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or q.get("bits") is None:
        return None, ""
    bits = q["bits"]
    if isinstance(bits, int) and not isinstance(bits, bool) and 1 <= bits <= 32:
        return bits, ""
    return None, (f"{file}: quantization_config.bits is "
                  + (f"{_shown_number(bits)}, expected 1 to 32"
                     if isinstance(bits, int) and not isinstance(bits, bool)
                     else f"{_type_name(bits)}, expected an integer"))


def _hf_params(t: TensorInfo, bits: int | None) -> int:
    """Logical parameters of one tensor: packed int32 weights (GPTQ/AWQ ``qweight``) hold
    32 / bits each."""
    if bits and t.dtype == "I32" and t.name.endswith("qweight"):
        return t.numel * (32 // bits)
    return t.numel
