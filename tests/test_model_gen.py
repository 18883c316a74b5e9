"""Fast checks of strata_plugin/embedded/make_model.py on tiny shapes.

Why: benchmark numbers are only comparable across machines if the generated model is the
same bytes, and llama.cpp only tokenizes arbitrary text if the byte-fallback vocabulary is
laid out the way its SPM tokenizer expects.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

MAKE_MODEL = Path(__file__).resolve().parent.parent / "strata_plugin" / "embedded" / "make_model.py"
SMALL = ["--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ff", "96"]
SMALL += ["--vocab", "512", "--ctx", "16384"]


def _load_module():
    spec = importlib.util.spec_from_file_location("make_model", MAKE_MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_model = _load_module()


def _generate(tmp_path: Path, name: str, *extra: str) -> Path:
    out = tmp_path / name
    assert make_model.main(["--out", str(out), *SMALL, *extra]) == 0
    return out


def _value(reader, key: str):
    """A scalar, string or array field, read in a way that works across gguf versions."""
    field = reader.fields[key]
    parts = [field.parts[i] for i in field.data]
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(p).decode() for p in parts]
        return [p[0].item() for p in parts]
    if field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(parts[0]).decode()
    return parts[0][0].item()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return _generate(tmp_path_factory.mktemp("model"), "m.gguf", "--seed", "0")


def test_same_seed_same_bytes(model: Path, tmp_path: Path):
    again = _generate(tmp_path, "again.gguf", "--seed", "0")
    assert again.read_bytes() == model.read_bytes()


def test_other_seed_other_weights_same_vocab(model: Path, tmp_path: Path):
    other = _generate(tmp_path, "other.gguf", "--seed", "1")
    assert other.read_bytes() != model.read_bytes()
    a, b = gguf.GGUFReader(model), gguf.GGUFReader(other)
    # A speculative draft must share the target's vocabulary, whatever its seed.
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        assert _value(a, key) == _value(b, key)


def test_metadata_reads_back(model: Path):
    r = gguf.GGUFReader(model)
    assert _value(r, "general.architecture") == "llama"
    assert _value(r, "llama.context_length") == 16384
    assert _value(r, "llama.embedding_length") == 64
    assert _value(r, "llama.block_count") == 2
    assert _value(r, "llama.attention.head_count_kv") == 2
    assert _value(r, "llama.vocab_size") == 512
    assert _value(r, "tokenizer.ggml.model") == "llama"
    assert len(_value(r, "tokenizer.ggml.tokens")) == 512
    shapes = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    assert shapes["token_embd.weight"] == [64, 512]  # ggml order: ne0 = n_embd
    assert shapes["blk.0.attn_k.weight"] == [64, 32]  # GQA: kv_heads * head_dim outputs
    assert shapes["output.weight"] == [64, 512]


def test_byte_tokens_have_byte_type(model: Path):
    r = gguf.GGUFReader(model)
    tokens = _value(r, "tokenizer.ggml.tokens")
    types = _value(r, "tokenizer.ggml.token_type")
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert [_value(r, f"tokenizer.ggml.{k}_token_id") for k in ("unknown", "bos", "eos")] == [
        0,
        1,
        2,
    ]
    for b in range(256):
        assert tokens[3 + b] == f"<0x{b:02X}>"
        assert types[3 + b] == gguf.TokenType.BYTE
    assert len(set(tokens)) == len(tokens)


def test_merged_pieces_are_reachable(model: Path):
    """SPM merges only ever join two existing pieces, so every piece must split into two."""
    r = gguf.GGUFReader(model)
    tokens = _value(r, "tokenizer.ggml.tokens")
    types = _value(r, "tokenizer.ggml.token_type")
    normal = {t for t, k in zip(tokens, types, strict=True) if k == gguf.TokenType.NORMAL}
    merged = [t for t in normal if len(t) > 1]
    assert len(merged) > 50
    for piece in merged:
        assert any(piece[:i] in normal and piece[i:] in normal for i in range(1, len(piece)))


def test_weights_finite_and_q8(tmp_path: Path):
    args = make_model.parse_args(["--out", str(tmp_path / "x.gguf"), *SMALL])
    weights = make_model.make_weights(args)
    logits = make_model.forward_logits(args, weights, [1, 70, 71, 72, 73])
    assert np.isfinite(logits).all()
    assert 0.1 < float(logits.std()) < 10
    out = _generate(tmp_path, "q.gguf", "--dtype", "q8_0")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32


def test_only_text_pieces_can_win(model: Path):
    """Zero output rows for bytes/control/unused tokens: no early EOS, no split UTF-8 chunks."""
    r = gguf.GGUFReader(model)
    types = np.array(_value(r, "tokenizer.ggml.token_type"))
    out = next(t for t in r.tensors if t.name == "output.weight")
    w = gguf.quants.dequantize(out.data, out.tensor_type).reshape(len(types), -1)
    assert not w[types != gguf.TokenType.NORMAL].any()
    assert (np.abs(w[types == gguf.TokenType.NORMAL]).sum(axis=1) > 0).all()
