"""Model files read as hostile input (formats/model_files.py, formats/bounded.py,
configure/model_facts.py, run/model_source.py): every value typed where it is read, every
count, length, size and nesting bounded (strata_plugin/limits.py) before it is used,
opens that cannot block, index paths confined to the model's folder.

The files are crafted here byte by byte (a GGUF header as docs/gguf.md lays it out, a
safetensors header as its format describes it); the huge claims are header-only or
sparse files, so nothing large is written or read.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest

from strata_plugin import limits
from strata_plugin.configure.model_facts import ModelFacts, read_model_facts
from strata_plugin.formats.model_files import (
    ModelFileError,
    read_gguf_header,
    read_safetensors_header,
)
from strata_plugin.run import model_source

# --- crafted GGUF headers ------------------------------------------------------------


def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, value: object) -> bytes:
    """One metadata entry: an int as uint32 (type 4), a str as string (type 8)."""
    if isinstance(value, str):
        return _s(key) + struct.pack("<I", 8) + _s(value)
    return _s(key) + struct.pack("<I", 4) + struct.pack("<I", value)


def _tensor(name: str, dims: tuple[int, ...], ggml_type: int = 0) -> bytes:
    return (_s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ggml_type, 0))


def _gguf(path: Path, kvs: list[bytes], tensors: list[bytes] = (), n_kv: int | None = None,
          n_tensors: int | None = None, tail: bytes = b"") -> Path:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    path.write_bytes(head + b"".join(kvs) + b"".join(tensors) + tail)
    return path


LLAMA = [_kv("general.architecture", "llama"), _kv("llama.block_count", 2),
         _kv("llama.embedding_length", 64), _kv("llama.attention.head_count", 4),
         _kv("llama.feed_forward_length", 128), _kv("llama.context_length", 512)]
TENSORS = [_tensor("token_embd.weight", (64, 256)), _tensor("blk.0.attn_q.weight", (64, 64))]


def test_a_crafted_gguf_reads_its_facts(tmp_path):
    """The control: the crafted header is well formed, so each refusal below is the
    bound's, not a writer's mistake."""
    f = read_model_facts(_gguf(tmp_path / "m.gguf", LLAMA, TENSORS))
    assert (f.get("layers"), f.get("heads"), f.get("head_dim")) == (2, 4, 16)
    assert f.get("params_total") == 64 * 256 + 64 * 64


def test_a_gguf_head_count_of_the_wrong_type_names_the_file_and_key(tmp_path):
    kvs = [*LLAMA[:3], _kv("llama.attention.head_count", "32"), *LLAMA[4:]]
    path = _gguf(tmp_path / "m.gguf", kvs, TENSORS)
    f = read_model_facts(path)
    assert f.get("heads") is None
    assert f.fact("heads").unavailable == (
        f"{path}: llama.attention.head_count is a str, expected an integer")
    assert f.get("layers") == 2 and f.get("params_total") == 64 * 256 + 64 * 64


@pytest.mark.parametrize("n_kv, words", [
    (2**63, "GGUF_METADATA_MAX"),
    (limits.GGUF_METADATA_MAX + 1, "GGUF_METADATA_MAX"),
    (limits.GGUF_METADATA_MAX, "cut short"),  # within the limit, but not in the file
])
def test_a_claimed_metadata_count_is_checked_before_it_is_read(tmp_path, n_kv, words):
    path = _gguf(tmp_path / "m.gguf", LLAMA, TENSORS, n_kv=n_kv)
    with pytest.raises(ModelFileError, match=words):
        read_gguf_header(path)


def test_a_claimed_tensor_count_past_its_limit_is_refused(tmp_path):
    for n, words in ((2**63, "GGUF_TENSORS_MAX"), (limits.GGUF_TENSORS_MAX + 1,
                                                   "GGUF_TENSORS_MAX")):
        with pytest.raises(ModelFileError, match=words):
            read_gguf_header(_gguf(tmp_path / "m.gguf", LLAMA, TENSORS, n_tensors=n))


def test_a_gguf_string_past_its_limit_is_refused_before_it_is_read(tmp_path):
    at = limits.GGUF_STRING_BYTES_MAX
    ok = _gguf(tmp_path / "ok.gguf", [*LLAMA, _kv("general.description", "x" * at)], TENSORS)
    assert len(read_gguf_header(ok).metadata["general.description"]) == at
    over = _gguf(tmp_path / "over.gguf", [*LLAMA, _kv("general.description", "x" * (at + 1))],
                 TENSORS)
    with pytest.raises(ModelFileError, match="GGUF_STRING_BYTES_MAX"):
        read_gguf_header(over)
    # a 2 GB string that is there (a sparse file): refused on its length, nothing read
    huge = tmp_path / "huge.gguf"
    _gguf(huge, [*LLAMA, _s("general.description") + struct.pack("<I", 8)
                 + struct.pack("<Q", 2 << 30)])
    with open(huge, "r+b") as fh:
        fh.truncate((2 << 30) + 4096)
    with pytest.raises(ModelFileError, match="GGUF_STRING_BYTES_MAX"):
        read_gguf_header(huge)


def test_a_gguf_array_claiming_2_63_elements_is_refused_at_once(tmp_path):
    for etype in (0, 8, 9):  # uint8, string, array
        arr = _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, etype, 2**63)
        path = _gguf(tmp_path / f"a{etype}.gguf", [*LLAMA, arr], TENSORS)
        with pytest.raises(ModelFileError, match="GGUF_ARRAY_MAX"):
            read_gguf_header(path)


def test_gguf_arrays_nested_past_their_limit_are_refused(tmp_path):
    def nested(depth: int) -> bytes:
        """An entry holding ``depth`` arrays, one inside the other, around one uint32."""
        body, etype = struct.pack("<I", 7), 4
        for _ in range(depth):
            body, etype = struct.pack("<IQ", etype, 1) + body, 9
        return _s("x.nested") + struct.pack("<I", etype) + body

    ok = _gguf(tmp_path / "ok.gguf", [*LLAMA, nested(limits.GGUF_ARRAY_DEPTH_MAX)], TENSORS)
    assert read_gguf_header(ok).metadata["x.nested"] == [[7]]
    deep = _gguf(tmp_path / "deep.gguf", [*LLAMA, nested(limits.GGUF_ARRAY_DEPTH_MAX + 1)],
                 TENSORS)
    with pytest.raises(ModelFileError, match="GGUF_ARRAY_DEPTH_MAX"):
        read_gguf_header(deep)


def test_a_tensor_with_2_32_dimensions_or_an_overflowing_shape_is_refused(tmp_path):
    four = _gguf(tmp_path / "four.gguf", LLAMA, [_tensor("t", (2, 3, 4, 5))])
    assert read_gguf_header(four).tensors[0].shape == (5, 4, 3, 2)
    five = _gguf(tmp_path / "five.gguf", LLAMA, [_tensor("t", (2, 3, 4, 5, 6))])
    with pytest.raises(ModelFileError, match="GGUF_DIMS_MAX"):
        read_gguf_header(five)
    claim = _s("t") + struct.pack("<I", 2**32 - 1)
    with pytest.raises(ModelFileError, match="GGUF_DIMS_MAX"):
        read_gguf_header(_gguf(tmp_path / "many.gguf", LLAMA, [claim]))
    with pytest.raises(ModelFileError, match="overflow a 64-bit element count"):
        read_gguf_header(_gguf(tmp_path / "big.gguf", LLAMA, [_tensor("t", (2**32, 2**32))]))


def test_a_gguf_header_past_its_limit_is_refused(tmp_path, monkeypatch):
    """The bound on the whole header (shown on a small bound: the reader takes it from
    limits at import, so the module's copy is the one patched)."""
    from strata_plugin.formats import model_files

    path = _gguf(tmp_path / "m.gguf", [*LLAMA, _kv("general.description", "x" * 5000)],
                 TENSORS)
    monkeypatch.setattr(model_files, "GGUF_HEADER_BYTES_MAX", 4096)
    with pytest.raises(ModelFileError, match="GGUF_HEADER_BYTES_MAX"):
        read_gguf_header(path)


def test_an_architecture_name_past_its_limit_makes_the_facts_unavailable(tmp_path):
    at = limits.MODEL_ID_SHOWN_MAX
    ok = _gguf(tmp_path / "ok.gguf", [_kv("general.architecture", "a" * at), *LLAMA[1:]],
               TENSORS)
    assert read_model_facts(ok).get("architecture") == "a" * at
    long = _gguf(tmp_path / "long.gguf", [_kv("general.architecture", "a" * 100_000),
                                          *LLAMA[1:]], TENSORS)
    f = read_model_facts(long)
    assert f.get("layers") is None
    why = f.fact("layers").unavailable
    assert "MODEL_ID_SHOWN_MAX" in why and len(why) < 400


# --- opens that cannot block -----------------------------------------------------------


def _in_thread(fn, *args):
    """``fn(*args)`` in a daemon thread: (finished within 10 s, its result). A read that
    blocks on a FIFO is let go by opening the FIFO's other end."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    t.join(10)
    return (not t.is_alive()), (out[0] if out else None)


@pytest.fixture
def fifo(tmp_path):
    made: list[Path] = []

    def make(path: Path) -> Path:
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for p in made:  # a reader still waiting (the bug) is let go
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_a_fifo_as_the_weights_file_is_refused_not_waited_on(tmp_path, fifo):
    path = fifo(tmp_path / "model.gguf")
    done, f = _in_thread(read_model_facts, path)
    assert done, "reading the model's facts waited on a FIFO"
    assert f.fact("layers").unavailable == (
        f"{path}: a FIFO, not a regular file (not read: reading it could wait for ever)")


def test_a_fifo_as_config_json_or_a_safetensors_file_is_refused(tmp_path, fifo):
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    fifo(cfg / "config.json")
    done, f = _in_thread(read_model_facts, cfg)
    assert done and "a FIFO, not a regular file" in f.fact("layers").unavailable
    st = tmp_path / "st"
    st.mkdir()
    (st / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    fifo(st / "model.safetensors")
    done, f = _in_thread(read_model_facts, st)
    assert done and f.get("layers") == 2
    assert "a FIFO, not a regular file" in f.fact("stored_bytes").unavailable


# --- config.json -------------------------------------------------------------------------


def _st(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    size = {"BF16": 2, "F32": 4}
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(off))


CFG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
       "vocab_size": 256, "max_position_embeddings": 512, "torch_dtype": "bfloat16"}


def _hf(folder: Path, **cfg: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**CFG, **cfg}))
    _st(folder / "model.safetensors", {"model.embed_tokens.weight": ("BF16", (256, 64)),
                                       "lm_head.weight": ("BF16", (256, 64))})
    return folder


def test_a_head_count_given_as_a_string_is_that_fact_unavailable_named(tmp_path):
    folder = _hf(tmp_path / "m", num_attention_heads="32")
    f = read_model_facts(folder)
    assert f.get("heads") is None
    assert f.fact("heads").unavailable == (
        f"{folder}/config.json: num_attention_heads is a str, expected an integer")
    # the rest is read: the sizes, the tensors; what needed the heads says so
    assert f.get("hidden") == 64 and f.get("params_total") == 2 * 256 * 64
    assert f.get("head_dim") is None and f.get("kv_heads") == 2
    # and the manifest's JSON holds no value of the wrong type
    assert ModelFacts.from_json(json.loads(json.dumps(f.to_json()))) == f


@pytest.mark.parametrize("key, value, words", [
    ("num_hidden_layers", limits.MODEL_SHAPE_MAX, None),
    ("num_hidden_layers", limits.MODEL_SHAPE_MAX + 1,
     "is 2147483648, past MODEL_SHAPE_MAX (2147483647)"),
    ("num_hidden_layers", 10**400, "is a 401-digit number, past MODEL_SHAPE_MAX (2147483647)"),
    ("num_attention_heads", 1, None),
    ("num_attention_heads", 0, "is 0, expected an integer >= 1"),
    ("num_attention_heads", -4, "is -4, expected an integer >= 1"),
    ("num_attention_heads", 4.0, "is a float, expected an integer"),
    ("num_attention_heads", True, "is a bool, expected an integer"),
    ("num_attention_heads", 1e400, "is a float, expected an integer"),
    ("intermediate_size", [128], "is a list, expected an integer"),
    ("tie_word_embeddings", "false", "is a str, expected true or false"),
])
def test_each_config_value_is_typed_and_in_range(tmp_path, key, value, words):
    folder = tmp_path / "m"
    folder.mkdir()
    raw = json.dumps({**CFG, key: 0}).replace(f'"{key}": 0', f'"{key}": {_json(value)}')
    (folder / "config.json").write_text(raw)
    _st(folder / "model.safetensors", {"model.embed_tokens.weight": ("BF16", (256, 64))})
    f = read_model_facts(folder)
    fact = {"num_hidden_layers": "layers", "num_attention_heads": "heads",
            "intermediate_size": "ff", "tie_word_embeddings": "tied_embeddings"}[key]
    if words is None:
        assert f.get(fact) == value
    else:
        assert f.get(fact) is None
        assert f.fact(fact).unavailable == f"{folder}/config.json: {key} {words}"
    assert f.get("vocab") == 256  # one bad value costs its fact, not the others


def _json(v: object) -> str:
    if isinstance(v, float) and v == float("inf"):
        return "1e400"
    return json.dumps(v)


def test_packed_bits_of_zero_make_the_parameter_counts_unavailable(tmp_path):
    folder = _hf(tmp_path / "q", quantization_config={"bits": 0, "quant_method": "gptq"})
    f = read_model_facts(folder)
    assert f.get("params_total") is None and f.get("layers") == 2
    assert f.fact("params_total").unavailable == (
        f"{folder}/config.json: quantization_config.bits is 0, expected 1 to 32")


def test_a_manifest_fact_of_the_wrong_type_is_read_back_unavailable():
    got = ModelFacts.from_json({"facts": {"heads": {"value": "32", "source": "x"},
                                          "layers": {"value": 2, "source": "y"},
                                          "bytes_per_param": {"value": -1.0}}})
    assert got.get("heads") is None and got.get("layers") == 2
    assert got.fact("heads").unavailable == "manifest: heads is a str, expected an integer"
    assert "expected a number >= 0" in got.fact("bytes_per_param").unavailable


def test_a_config_json_past_its_limit_is_refused_before_it_is_read(tmp_path):
    at = limits.HF_CONFIG_BYTES_MAX
    raw = json.dumps(CFG)
    folder = _hf(tmp_path / "ok")
    (folder / "config.json").write_text(raw + " " * (at - len(raw)))
    assert read_model_facts(folder).get("layers") == 2
    (folder / "config.json").write_text(raw + " " * (at + 1 - len(raw)))
    f = read_model_facts(folder)
    assert f.get("layers") is None and "HF_CONFIG_BYTES_MAX" in f.fact("layers").unavailable
    with open(folder / "config.json", "r+b") as fh:  # 4 GB, sparse: never read
        fh.truncate(4 << 30)
    f = read_model_facts(folder)
    assert f.fact("layers").unavailable == (
        f"{folder}/config.json: {4 << 30} bytes, past HF_CONFIG_BYTES_MAX ({at} bytes): "
        "not read")


def test_json_nested_past_its_limit_is_refused_without_a_recursion_error(tmp_path):
    folder = _hf(tmp_path / "m")
    at = limits.MODEL_JSON_DEPTH_MAX
    (folder / "config.json").write_text(json.dumps(
        {**CFG, "x": json.loads("[" * (at - 1) + "]" * (at - 1))}))
    assert read_model_facts(folder).get("layers") == 2
    for depth in (at, 100_000):
        (folder / "config.json").write_text(
            json.dumps(CFG)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}")
        f = read_model_facts(folder)
        assert f.get("layers") is None
        assert "JSON nested past MODEL_JSON_DEPTH_MAX" in f.fact("layers").unavailable


# --- safetensors -------------------------------------------------------------------------


def _raw_st(path: Path, header: object, data: int = 0) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data))
    return path


@pytest.mark.parametrize("header, data, words", [
    ([1, 2], 0, "not a JSON object"),
    ({"t": [1]}, 0, "is not a JSON object"),
    ({"t": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}}, 4,
     "shape is not a list of whole numbers"),
    ({"t": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}}, 8,
     "shape is not a list of whole numbers"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}}, 8,
     "data_offsets is not"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 4,
     "data_offsets end 8 past the file's 4 data bytes"),
    ({"t": {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 8]}}, 8,
     "is 73786976294838206464 bytes, its data_offsets 8"),
])
def test_a_safetensors_header_is_typed_and_consistent(tmp_path, header, data, words):
    with pytest.raises(ModelFileError, match=words):
        read_safetensors_header(_raw_st(tmp_path / "m.safetensors", header, data))


def test_a_consistent_safetensors_header_is_read(tmp_path):
    got = read_safetensors_header(_raw_st(
        tmp_path / "m.safetensors",
        {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 8))
    assert [(t.name, t.shape, t.nbytes) for t in got] == [("t", (2,), 8)]


@pytest.mark.parametrize("entry", ["../outside/secret.safetensors",
                                   "sub/../../outside/secret.safetensors",
                                   "{outside}/secret.safetensors"])
def test_an_index_entry_outside_the_model_folder_is_refused_unquoted(tmp_path, entry):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = b"SECRETS!" + b"x" * 64
    (outside / "secret.safetensors").write_bytes(secret)
    folder = _hf(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": entry.format(outside=outside)}}))
    f = read_model_facts(folder)
    why = f.fact("stored_bytes").unavailable
    assert "names a file outside the model's folder" in why
    assert str(struct.unpack("<Q", secret[:8])[0]) not in why and "SECRETS" not in why
    assert f.get("layers") == 2


def test_an_index_entry_inside_the_model_folder_is_read(tmp_path):
    folder = _hf(tmp_path / "m")
    (folder / "sub").mkdir()
    (folder / "model.safetensors").rename(folder / "sub" / "part-1.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "sub/part-1.safetensors",
                        "lm_head.weight": "sub/./part-1.safetensors"}}))
    assert read_model_facts(folder).get("params_total") == 2 * 256 * 64


# --- a model id the server reports -------------------------------------------------------


def test_a_model_id_past_its_limit_is_shortened_where_it_is_shown():
    at = limits.MODEL_ID_SHOWN_MAX
    ok = "m" * at
    loc = model_source.from_server("vllm", "http://h:1",
                                   {"http://h:1/v1/models": {"data": [{"id": ok}]}}.get)
    assert loc.why == f"the server names no path on this machine (/v1/models id {ok})"
    long = "m" * 100_000
    loc = model_source.from_server("vllm", "http://h:1",
                                   {"http://h:1/v1/models": {"data": [{"id": long}]}}.get)
    assert loc.path is None
    assert loc.why == (f"the server names no path on this machine (/v1/models id "
                       f"{'m' * at}... (100000 characters))")
    f = ModelFacts.unavailable("", loc.why)
    assert len(json.dumps(f.to_json())) < 28 * 400  # one shortened reason a fact


def test_a_refusal_names_a_long_tensor_name_shortened(tmp_path):
    """A reason is repeated for every fact: a tensor name of a megabyte is shown cut."""
    name = "t" * (limits.GGUF_STRING_BYTES_MAX - 1)
    path = _gguf(tmp_path / "m.gguf", LLAMA, [_tensor(name, (2, 3, 4, 5, 6))])
    f = read_model_facts(path)
    why = f.fact("layers").unavailable
    assert "GGUF_DIMS_MAX" in why and len(why) < 600
