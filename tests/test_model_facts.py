"""The model's facts, read from the model itself (configure/model_facts.py,
formats/model_files.py, run/model_source.py).

The known truth is what the generators wrote: strata_plugin/embedded/make_model.py's
arguments (the embedded GGUF, generated here with the setup's exact arguments) and
make_hf_model.py's constants (the vLLM checkpoint, when `setup --vllm` made it). Each
expected number below is computed from those arguments by an independent formula, not by
the reader under test.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from strata_plugin.configure.model_facts import KvCacheSetting, ModelFacts, read_model_facts
from strata_plugin.embedded import make_hf_model
from strata_plugin.embedded.llama_setup import MAIN_MODEL_ARGS, cache_root
from strata_plugin.formats.model_files import ModelFileError, read_gguf_header
from strata_plugin.run import model_source

gguf = pytest.importorskip("gguf")
from strata_plugin.embedded import make_model  # noqa: E402  (needs gguf)

Q8_0 = 34 / 32  # bytes per element of a q8_0 block (32 int8 + an fp16 scale)


def _args(argv) -> dict[str, str]:
    return {argv[i].lstrip("-").replace("-", "_"): argv[i + 1] for i in range(0, len(argv), 2)}


def _llama_truth(dim, layers, heads, kv_heads, ff, vocab, ctx, dtype_bytes, norm_bytes=4):
    """A llama GGUF's facts from make_model's arguments: q, k, v, o, gate, up, down per
    layer, two norms per layer, the embedding, the output norm and the untied output."""
    hd = dim // heads
    kv = kv_heads * hd
    per_layer = dim * dim * 2 + dim * kv * 2 + 3 * dim * ff
    mats = layers * per_layer + 2 * vocab * dim
    norms = layers * 2 * dim + dim
    return {
        "layers": layers, "hidden": dim, "heads": heads, "kv_heads": kv_heads, "head_dim": hd,
        "ff": ff, "vocab": vocab, "context_length": ctx,
        "params_total": mats + norms,
        "params_embedding": vocab * dim, "params_lm_head": vocab * dim,
        "params_matmul_active": layers * per_layer + vocab * dim,
        "stored_bytes": round(mats * dtype_bytes) + norms * norm_bytes,
        "stored_bytes_embedding": round(vocab * dim * dtype_bytes),
        "experts": 1, "experts_per_token": 1, "params_experts": 0,
        "kv_bytes_per_token": layers * kv_heads * hd * 2 * 2,  # K and V, f16
        "tied_embeddings": False,
    }


@pytest.fixture(scope="module")
def embedded_gguf(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The embedded target's main model, generated with the setup's exact arguments."""
    out = tmp_path_factory.mktemp("gguf") / "main.gguf"
    assert make_model.main(["--out", str(out), *MAIN_MODEL_ARGS]) == 0
    return out, _args(MAIN_MODEL_ARGS)


def test_the_embedded_gguf_facts_equal_what_make_model_wrote(embedded_gguf):
    path, a = embedded_gguf
    assert a["dtype"] == "q8_0"
    want = _llama_truth(int(a["dim"]), int(a["layers"]), int(a["heads"]), int(a["kv_heads"]),
                        int(a["ff"]), int(a["vocab"]), int(a["ctx"]), Q8_0)
    f = read_model_facts(path)
    got = {k: f.get(k) for k in want}
    assert got == want
    assert f.get("weight_dtype") == "Q8_0" and f.get("architecture") == "llama"
    assert f.get("bytes_per_param") == pytest.approx(want["stored_bytes"] / want["params_total"])
    assert f.fact("layers").source == "GGUF llama.block_count"
    assert f.fact("kv_bytes_per_token").value == 8192  # 8 layers x 4 x 64 x (2 + 2)


def test_the_gguf_reader_agrees_with_the_gguf_package_and_the_file_size(embedded_gguf):
    path, _ = embedded_gguf
    mine = read_gguf_header(path)
    theirs = gguf.GGUFReader(path)
    assert {t.name: t.nbytes for t in mine.tensors} == {
        t.name: int(t.n_bytes) for t in theirs.tensors}
    data = sum(t.nbytes for t in mine.tensors)
    # the data section is the tensors (aligned) at the end of the file, after the header
    assert 0 < path.stat().st_size - data < 64 * 1024


def test_a_float16_model_reads_two_bytes_a_parameter(tmp_path):
    small = ["--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ff", "96",
             "--vocab", "512", "--ctx", "2048"]
    out = tmp_path / "f16.gguf"
    assert make_model.main(["--out", str(out), *small, "--dtype", "f16"]) == 0
    want = _llama_truth(64, 2, 4, 2, 96, 512, 2048, 2.0)
    f = read_model_facts(out)
    assert {k: f.get(k) for k in want} == want
    assert f.get("weight_dtype") == "F16"


def test_the_kv_cache_type_comes_from_the_server_argv(embedded_gguf):
    path, _ = embedded_gguf
    loc = model_source.from_argv("llamacpp", ["llama-server", "-m", str(path), "-ctk", "q8_0",
                                              "-ctv", "q8_0", "-t", "2"])
    assert loc.path == str(path) and loc.located_by == "llama.cpp argv -m"
    f = read_model_facts(loc.path, loc.kv, loc.located_by)
    assert f.get("kv_cache_dtype") == "q8_0"
    assert f.get("kv_bytes_per_token") == pytest.approx(8 * 4 * 64 * 2 * Q8_0)
    assert "--cache-type-k q8_0" in f.fact("kv_bytes_per_elem").source
    # without the flags: llama.cpp's default f16, said so
    dflt = model_source.from_argv("llamacpp", ["llama-server", "--model", str(path)])
    assert dflt.kv.dtype == "f16" and "default" in dflt.kv.source


# --- Hugging Face checkpoints -------------------------------------------------------------


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A safetensors file as the format describes it: an 8-byte header length, the JSON
    header, then the data (zeros)."""
    size = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1}
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(off))


def _hf_llama(folder: Path, *, hidden, layers, heads, kv_heads, ff, vocab, experts=0, k=0,
              dtype="BF16", extra_cfg=None, tied=False) -> None:
    hd = hidden // heads
    t: dict[str, tuple[str, tuple[int, ...]]] = {
        "model.embed_tokens.weight": (dtype, (vocab, hidden))}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = (dtype, (heads * hd, hidden))
        t[p + "self_attn.k_proj.weight"] = (dtype, (kv_heads * hd, hidden))
        t[p + "self_attn.v_proj.weight"] = (dtype, (kv_heads * hd, hidden))
        t[p + "self_attn.o_proj.weight"] = (dtype, (hidden, heads * hd))
        t[p + "input_layernorm.weight"] = (dtype, (hidden,))
        t[p + "post_attention_layernorm.weight"] = (dtype, (hidden,))
        if experts:
            t[p + "block_sparse_moe.gate.weight"] = (dtype, (experts, hidden))
            for e in range(experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                t[q + "w1.weight"] = (dtype, (ff, hidden))
                t[q + "w2.weight"] = (dtype, (hidden, ff))
                t[q + "w3.weight"] = (dtype, (ff, hidden))
        else:
            t[p + "mlp.gate_proj.weight"] = (dtype, (ff, hidden))
            t[p + "mlp.up_proj.weight"] = (dtype, (ff, hidden))
            t[p + "mlp.down_proj.weight"] = (dtype, (hidden, ff))
    t["model.norm.weight"] = (dtype, (hidden,))
    if not tied:
        t["lm_head.weight"] = (dtype, (vocab, hidden))
    folder.mkdir(parents=True, exist_ok=True)
    _write_safetensors(folder / "model.safetensors", t)
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "intermediate_size": ff, "vocab_size": vocab,
           "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
           "tie_word_embeddings": tied, **(extra_cfg or {})}
    if experts:
        cfg.update(num_local_experts=experts, num_experts_per_tok=k)
    (folder / "config.json").write_text(json.dumps(cfg))


def _hf_truth(hidden, layers, heads, kv_heads, ff, vocab):
    hd = hidden // heads
    per_layer = 2 * hidden * heads * hd + 2 * hidden * kv_heads * hd + 3 * hidden * ff
    norms = layers * 2 * hidden + hidden
    return {"params_total": layers * per_layer + 2 * vocab * hidden + norms,
            "params_matmul_active": layers * per_layer + vocab * hidden,
            "stored_bytes": 2 * (layers * per_layer + 2 * vocab * hidden + norms),
            "kv_bytes_per_token": layers * kv_heads * hd * 2 * 2,
            "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
            "head_dim": hd, "ff": ff, "vocab": vocab}


def test_a_checkpoint_shaped_as_make_hf_model_writes_it(tmp_path):
    g = make_hf_model
    _hf_llama(tmp_path / "m", hidden=g.HIDDEN, layers=g.LAYERS, heads=g.HEADS,
              kv_heads=g.KV_HEADS, ff=g.FF, vocab=g.VOCAB)
    f = read_model_facts(tmp_path / "m")
    want = _hf_truth(g.HIDDEN, g.LAYERS, g.HEADS, g.KV_HEADS, g.FF, g.VOCAB)
    assert {k: f.get(k) for k in want} == want
    assert f.get("weight_dtype") == "BF16" and f.get("bytes_per_param") == 2.0
    assert f.get("kv_cache_dtype") == "bf16"  # vLLM's auto: the model's dtype
    assert f.fact("layers").source == "config.json num_hidden_layers"


def test_the_generated_vllm_checkpoint_equals_make_hf_model(request):
    """The real checkpoint `setup --vllm` generated (with torch and transformers)."""
    folder = next((cache_root() / "models").glob("tiny-llama-hf-*"), None)
    if folder is None or not (folder / "config.json").is_file():
        msg = "the vLLM checkpoint is not generated (`bash scripts/setup.sh --vllm`)"
        if os.environ.get("STRATA_REQUIRE_VLLM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    g = make_hf_model
    f = read_model_facts(folder)
    want = _hf_truth(g.HIDDEN, g.LAYERS, g.HEADS, g.KV_HEADS, g.FF, g.VOCAB)
    assert {k: f.get(k) for k in want} == want
    assert f.get("context_length") == g.CTX


def test_a_mixture_of_experts_counts_the_routed_share(tmp_path):
    _hf_llama(tmp_path / "moe", hidden=64, layers=2, heads=4, kv_heads=2, ff=128, vocab=256,
              experts=8, k=2)
    f = read_model_facts(tmp_path / "moe")
    expert = 2 * 8 * 3 * 64 * 128  # layers x experts x (w1, w2, w3)
    assert f.get("params_experts") == expert
    assert f.get("params_active") == f.get("params_total") - expert + expert * 2 // 8
    assert f.get("stored_bytes_experts") == 2 * expert
    assert (f.get("experts"), f.get("experts_per_token")) == (8, 2)


def test_packed_4bit_weights_count_eight_parameters_an_int32(tmp_path):
    folder = tmp_path / "gptq"
    folder.mkdir()
    _write_safetensors(folder / "model.safetensors", {
        "model.embed_tokens.weight": ("F16", (256, 64)),
        "model.layers.0.mlp.down_proj.qweight": ("I32", (128 // 8, 64)),
        "model.layers.0.mlp.down_proj.scales": ("F16", (1, 64)),
        "model.layers.0.mlp.down_proj.qzeros": ("I32", (1, 8)),
        "lm_head.weight": ("F16", (256, 64))})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
        "torch_dtype": "float16", "quantization_config": {"bits": 4, "quant_method": "gptq"}}))
    f = read_model_facts(folder)
    assert f.get("params_total") == 256 * 64 * 2 + 128 * 64  # scales, zeros: no parameters
    assert f.get("stored_bytes") == 2 * 256 * 64 * 2 + 4 * 16 * 64 + 2 * 64 + 4 * 8


def test_what_cannot_be_read_is_unavailable_with_the_reason(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"\0" * 16)
    f = read_model_facts(tmp_path / "bin")
    assert f.get("hidden") == 8 and f.get("stored_bytes") is None
    assert "no safetensors files" in f.fact("stored_bytes").unavailable
    assert "num_hidden_layers" in f.fact("layers").unavailable
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(32))
    g = read_model_facts(bad)
    assert g.get("params_total") is None and "no GGUF magic" in g.fact("params_total").unavailable
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1))
    with pytest.raises(ModelFileError, match="cut short"):
        read_gguf_header(cut)
    gone = read_model_facts(tmp_path / "missing.gguf")
    assert "not a file or folder on this machine" in gone.fact("layers").unavailable
    # and the manifest's JSON round-trips, reasons included
    assert ModelFacts.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_where_each_engine_names_its_model(tmp_path):
    m = tmp_path / "m"
    _hf_llama(m, hidden=64, layers=1, heads=4, kv_heads=2, ff=64, vocab=128)
    assert model_source.from_argv("vllm", ["vllm", "serve", str(m), "--port", "1"]).path == str(m)
    assert model_source.from_argv("vllm", ["python", "-m", "vllm.entrypoints.openai.api_server",
                                           f"--model={m}"]).path == str(m)
    fp8 = model_source.from_argv("vllm", ["vllm", "serve", str(m), "--kv-cache-dtype", "fp8"])
    assert (fp8.kv.dtype, fp8.kv.bytes_k) == ("fp8", 1.0)
    f32 = model_source.from_argv("vllm", ["vllm", "serve", str(m), "--dtype", "float32"])
    assert (f32.kv.bytes_k, f32.kv.source) == (
        4.0, "server argv --dtype float32 (--kv-cache-dtype auto follows it)")
    assert model_source.from_argv("vllm", ["vllm", "serve", str(m)]).kv is None  # the model's
    assert model_source.from_argv("sglang", ["python", "-m", "sglang.launch_server",
                                             "--model-path", str(m)]).path == str(m)
    hub = model_source.from_argv("vllm", ["vllm", "serve", "Qwen/Qwen3-8B"])
    assert hub.path is None and "not a path on this machine" in hub.why
    dl = model_source.from_argv("llamacpp", ["llama-server", "-hf", "org/model-GGUF"])
    assert dl.path is None and "downloads its model" in dl.why
    other = model_source.from_argv("other", ["my-server", str(m)])
    assert other.path is None and "does not know which argument" in other.why
    rel = model_source.from_argv("llamacpp", ["llama-server", "-m", "m"], cwd=tmp_path)
    assert rel.path == str(m)


def test_an_attached_server_says_where_its_model_is(tmp_path):
    m = tmp_path / "model.gguf"
    m.write_bytes(b"GGUF")
    answers = {"http://h:1/props": {"model_path": str(m)}}
    loc = model_source.from_server("llamacpp", "http://h:1", answers.get)
    assert loc.path == str(m) and "/props" in loc.located_by
    assert loc.kv is not None and loc.kv.bytes_k is None  # its KV type is not visible
    answers = {"http://h:1/v1/models": {"data": [{"id": "tiny", "root": str(tmp_path)}]}}
    assert model_source.from_server("vllm", "http://h:1", answers.get).path == str(tmp_path)
    far = {"http://h:1/v1/models": {"data": [{"id": "tiny", "root": "/nowhere/x"}]}}
    loc = model_source.from_server("vllm", "http://h:1", far.get)
    assert loc.path is None and loc.why == ("the server names no path on this machine "
                                            "(/v1/models root /nowhere/x; /v1/models id tiny)")


def test_an_unknown_kv_type_makes_the_kv_bytes_unavailable(embedded_gguf):
    path, _ = embedded_gguf
    f = read_model_facts(path, KvCacheSetting("unknown", "not visible"))
    assert f.get("kv_bytes_per_token") is None
    assert f.fact("kv_bytes_per_token").unavailable == "not visible"
