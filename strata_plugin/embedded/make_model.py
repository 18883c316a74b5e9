#!/usr/bin/env python3
"""Write a small random-weight llama GGUF model for the embedded llama-server target.

Why: the default benchmark target is a real llama.cpp server on the CPU, and it needs a
model that is (a) small enough to ship as a generator instead of a download, (b) large
enough that a 2K-token prefill is clearly measurable on 2 cores (about 1.5 s with q8_0, the
fastest dtype for decode there; see docs/embedded-target.md), and (c) bit-for-bit
reproducible for a given gguf/numpy, so two runs describe the same model.

The weights are random (fixed seed) and the text it generates is noise; only the shapes,
the tokenizer and the timing matter.

Generation arguments (the embedded target; `python -m strata_plugin setup` runs exactly these):

    main:  make_model.py --out tiny-llama.gguf --dim 512 --layers 8 --heads 8 --kv-heads 4 \
               --ff 1376 --vocab 1024 --ctx 16384 --seed 0 --dtype q8_0
    draft: make_model.py --out tiny-llama-draft.gguf --dim 256 --layers 2 --heads 4 \
               --kv-heads 2 --ff 704 --vocab 1024 --ctx 16384 --seed 1 --dtype q8_0

The draft shares the main model's vocabulary (the vocabulary depends on --vocab only, never
on --seed), which is what llama.cpp requires of a speculative-decoding draft model.

Vocabulary: a SentencePiece-style "llama" tokenizer. Ids 0..2 are <unk>, <s>, </s>; ids
3..258 are the byte tokens <0x00>..<0xFF> (type BYTE, so any text, including newlines and
non-ASCII, falls back to bytes); 259..260 are the ChatML control tokens <|im_start|> and
<|im_end|>; then the printable ASCII characters and U+2581 (the SentencePiece space); then
BPE merges learned from a built-in English word list, scored by merge rank so that
tokenization is deterministic; any ids left over are <unused_N> (type UNUSED). The
SentencePiece dummy space prefix is off: llama-server's /detokenize concatenates pieces, so
with it on every /tokenize -> /detokenize round trip would gain a leading space.

Sampling: the output rows of every non-NORMAL token (bytes, <s>, </s>, ChatML, unused) are
zero, so their logit is exactly 0 while the ~700 text pieces get N(0, 1) logits; any top-k
sampler (llama-server's default is top-k 40, and greedy) then only ever emits text pieces.
Why: no early EOS, so output length is exactly max_tokens / n_predict; and no lone UTF-8
continuation bytes, which llama-server holds back until a character completes, so every
streamed chunk is one token and inter-token latency can be read from the stream.

Initialisation: every matrix is N(0, 1/fan_in) so each projection preserves the activation
scale, the residual-output projections are further scaled by 1/sqrt(2 * layers), and the
norm weights are 1. With pre-RMSNorm this keeps activations O(1) for any depth; --check runs
a numpy forward pass and fails if any logit is not finite.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

import gguf
import numpy as np

SPACE = "\u2581"  # SentencePiece's visible space

N_SPECIAL = 3
BYTE_BASE = N_SPECIAL
IM_START_ID = BYTE_BASE + 256
IM_END_ID = IM_START_ID + 1

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Common English words, most frequent first; the corpus the BPE merges are learned from.
WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again
animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left
late run while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter until mile
river car feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl usual young
ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb
sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice
voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest correct able pound done beauty drive stood contain front teach week final
gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring
yes distant fill east paint language among grand ball yet wave drop heart am present heavy
dance engine position arm wide sail material size vary settle speak weight general ice
matter circle pair include divide syllable felt perhaps pick sudden count square reason
length represent art subject region energy hunt probable bed brother egg ride cell believe
fraction forest sit race window store summer train sleep prove lone leg exercise wall catch
mount wish sky board joy winter sat written wild instrument kept glass grass cow job edge
sign visit past soft fun bright gas weather month million bear finish happy hope flower
clothe strange gone jump baby eight village meet root buy raise solve metal whether push
seven paragraph third shall held hair describe cook floor either result burn hill safe cat
century consider type law bit coast copy phrase silent tall sand soil roll temperature finger
industry value fight lie beat excite natural view sense ear else quite broke case middle kill
son lake moment scale loud spring observe child straight consonant nation dictionary milk
speed method organ pay age section dress cloud surprise quiet stone tiny climb cool design
poor lot experiment bottom key iron single stick flat twenty skin smile crease hole trade
melody trip office receive row mouth exact symbol die least trouble shout except wrote seed
tone join suggest clean break lady yard rise bad blow oil blood touch grew cent mix team wire
cost lost brown wear garden equal sent choose fell fit flow fair bank collect save control
decimal gentle woman captain practice separate difficult doctor please protect noon whose
locate ring character insect caught period indicate radio spoke atom human history effect
electric expect crop modern element hit student corner party supply bone rail imagine
provide agree thus capital chair danger fruit rich thick soldier process operate guess
necessary sharp wing create neighbor wash bat rather crowd corn compare poem string bell
depend meat rub tube famous dollar stream fear sight thin triangle planet hurry chief colony
clock mine tie enter major fresh search send yellow gun allow print dead spot desert suit
current lift rose continue block chart hat sell success company subtract event particular
deal swim term opposite wife shoe shoulder spread arrange camp invent cotton born determine
quart nine truck noise level chance gather shop stretch throw shine property column molecule
select wrong gray repeat require broad prepare salt nose plural anger claim continent oxygen
sugar death pretty skill women season solution magnet silver thank branch match suffix
especially fig afraid huge sister steel discuss forward similar guide experience score apple
bought led pitch coat mass card band rope slip win dream evening condition feed tool total
basic smell valley nor double seat arrive master track parent shore division sheet substance
favor connect post spend chord fat glad original share station dad bread charge proper bar
offer segment slave duck instant market degree populate chick dear enemy reply drink occur
support speech nature range steam motion path liquid log meant quotient teeth shell neck
server request token latency throughput benchmark model prompt cache batch queue stream
""".split()

PRINTABLE = [chr(c) for c in range(0x21, 0x7F)]


def learn_merges(n_merges: int) -> list[str]:
    """Learn up to n_merges BPE pieces from WORDS; ties break on the pair text, so it is stable."""
    counts: Counter[tuple[str, ...]] = Counter()
    for rank, word in enumerate(WORDS):
        weight = 1 + 2000 // (rank + 10)  # Zipf-like: frequent words merge first
        counts[(SPACE, *word)] += weight
        counts[(SPACE, *word.capitalize())] += max(1, weight // 4)
    words = [list(symbols) for symbols in counts]
    freq = list(counts.values())
    pairs: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, symbols in enumerate(words):
        for pair in pairwise(symbols):
            pairs[pair] += freq[i]
            where.setdefault(pair, set()).add(i)
    known = set(PRINTABLE) | {SPACE}
    pieces: list[str] = []
    while len(pieces) < n_merges and pairs:
        best = max(pairs.values())
        a, b = min(p for p, c in pairs.items() if c == best)
        merged = a + b
        if merged not in known:
            known.add(merged)
            pieces.append(merged)
        for i in sorted(where.pop((a, b), ())):
            old = words[i]
            for pair in pairwise(old):
                pairs[pair] -= freq[i]
                if pairs[pair] <= 0:
                    del pairs[pair]
            new: list[str] = []
            j = 0
            while j < len(old):
                if j + 1 < len(old) and old[j] == a and old[j + 1] == b:
                    new.append(merged)
                    j += 2
                else:
                    new.append(old[j])
                    j += 1
            words[i] = new
            for pair in pairwise(new):
                pairs[pair] += freq[i]
                where.setdefault(pair, set()).add(i)
    return pieces


def build_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Return (tokens, scores, token types) for an SPM byte-fallback vocabulary of n_vocab ids."""
    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [tt.BYTE] * 256
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [tt.CONTROL, tt.CONTROL]
    scores = [0.0] * len(tokens)
    chars = [SPACE, *PRINTABLE]
    n_fixed = len(tokens) + len(chars)
    if n_vocab < n_fixed:
        raise ValueError(f"--vocab must be at least {n_fixed}")
    merges = learn_merges(n_vocab - n_fixed)
    # SentencePiece BPE convention: a piece's score is minus its merge rank, and the single
    # characters rank below every merge; only the relative order of merges matters here.
    tokens += merges
    scores += [-float(i) for i in range(len(merges))]
    types += [tt.NORMAL] * len(merges)
    tokens += chars
    scores += [-float(len(merges) + i) for i in range(len(chars))]
    types += [tt.NORMAL] * len(chars)
    n_unused = n_vocab - len(tokens)
    tokens += [f"<unused_{i}>" for i in range(n_unused)]
    scores += [-1e9] * n_unused
    types += [tt.UNUSED] * n_unused
    return tokens, scores, [int(t) for t in types]


def make_weights(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """Random float32 weights in numpy order (out, in), i.e. GGUF/ggml ne reversed."""
    rng = np.random.default_rng(args.seed)
    head_dim = args.dim // args.heads
    kv_dim = head_dim * args.kv_heads
    resid_scale = 1.0 / np.sqrt(2.0 * args.layers)

    def linear(n_out: int, n_in: int, scale: float = 1.0) -> np.ndarray:
        w = rng.standard_normal((n_out, n_in), dtype=np.float32)
        return w * np.float32(scale / np.sqrt(n_in))

    ones = np.ones(args.dim, dtype=np.float32)
    weights = {"token_embd.weight": rng.standard_normal((args.vocab, args.dim), dtype=np.float32)}
    for i in range(args.layers):
        p = f"blk.{i}."
        weights[p + "attn_norm.weight"] = ones
        weights[p + "attn_q.weight"] = linear(args.dim, args.dim)
        weights[p + "attn_k.weight"] = linear(kv_dim, args.dim)
        weights[p + "attn_v.weight"] = linear(kv_dim, args.dim)
        weights[p + "attn_output.weight"] = linear(args.dim, args.dim, resid_scale)
        weights[p + "ffn_norm.weight"] = ones
        weights[p + "ffn_gate.weight"] = linear(args.ff, args.dim)
        weights[p + "ffn_up.weight"] = linear(args.ff, args.dim)
        weights[p + "ffn_down.weight"] = linear(args.dim, args.ff, resid_scale)
    weights["output_norm.weight"] = ones
    output = linear(args.vocab, args.dim)
    _, _, types = build_vocab(args.vocab)
    output[np.asarray(types) != gguf.TokenType.NORMAL] = 0.0  # see "Sampling" in the docstring
    weights["output.weight"] = output
    return weights


FILE_TYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}


def write_model(args: argparse.Namespace, weights: dict[str, np.ndarray], path: Path) -> None:
    """Write metadata, vocabulary and tensors; the byte layout depends only on args."""
    qtype, ftype = FILE_TYPES[args.dtype]
    tokens, scores, types = build_vocab(args.vocab)
    head_dim = args.dim // args.heads
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"strata-tiny-llama-d{args.dim}-l{args.layers}")
    w.add_description("random weights, generated by strata_plugin/embedded/make_model.py")
    w.add_file_type(int(ftype))
    if qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(args.vocab)
    w.add_context_length(args.ctx)
    w.add_embedding_length(args.dim)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(args.ff)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(args.rope_base)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_eot_token_id(IM_END_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHATML_TEMPLATE)
    for name, data in weights.items():
        if data.ndim == 1:  # norms stay f32, as llama.cpp expects
            w.add_tensor(name, data)
        elif qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(name, gguf.quants.quantize(data, qtype))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def forward_logits(args: argparse.Namespace, weights: dict[str, np.ndarray], ids: list[int]):
    """Reference llama forward pass in numpy (float32), used only to prove logits are finite."""
    head_dim = args.dim // args.heads
    group = args.heads // args.kv_heads
    n = len(ids)

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g

    inv = args.rope_base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def rope(x: np.ndarray) -> np.ndarray:  # (n, heads, head_dim), adjacent pairs as in ggml
        x0, x1 = x[..., 0::2], x[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    x = weights["token_embd.weight"][ids]
    for i in range(args.layers):
        p = f"blk.{i}."
        h = rms(x, weights[p + "attn_norm.weight"])
        q = rope((h @ weights[p + "attn_q.weight"].T).reshape(n, args.heads, head_dim))
        k = rope((h @ weights[p + "attn_k.weight"].T).reshape(n, args.kv_heads, head_dim))
        v = (h @ weights[p + "attn_v.weight"].T).reshape(n, args.kv_heads, head_dim)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim) + mask
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, v).reshape(n, args.dim)
        x = x + o @ weights[p + "attn_output.weight"].T
        h = rms(x, weights[p + "ffn_norm.weight"])
        g = h @ weights[p + "ffn_gate.weight"].T
        u = h @ weights[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ weights[p + "ffn_down.weight"].T
    return rms(x, weights["output_norm.weight"]) @ weights["output.weight"].T


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output .gguf path")
    ap.add_argument("--dim", type=int, default=512, help="embedding width")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: heads // 2 (GQA)")
    ap.add_argument("--ff", type=int, default=None, help="default: llama's 8/3*dim rounded to 32")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=16384, help="llama.context_length")
    ap.add_argument("--rope-base", type=float, default=500000.0, help="rope.freq_base")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=sorted(FILE_TYPES), default="q8_0", help="matrix dtype")
    ap.add_argument("--check", action="store_true", help="numpy forward pass; fail on NaN/inf")
    args = ap.parse_args(argv)
    if args.kv_heads is None:
        args.kv_heads = max(1, args.heads // 2)
    if args.ff is None:
        args.ff = (8 * args.dim // 3 + 31) // 32 * 32
    if args.dim % args.heads or args.heads % args.kv_heads or (args.dim // args.heads) % 2:
        ap.error("dim must split into heads of even size, and heads into kv-heads groups")
    if args.dtype == "q8_0" and (args.dim % 32 or args.ff % 32):
        ap.error("q8_0 needs dim and ff to be multiples of 32")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    weights = make_weights(args)
    if args.check:
        logits = forward_logits(args, weights, [1, *range(BYTE_BASE + 65, BYTE_BASE + 97)])
        if not np.isfinite(logits).all():
            print("make_model: non-finite logits", file=sys.stderr)
            return 1
        print(f"make_model: logits finite, std {float(logits.std()):.3f}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    write_model(args, weights, tmp)
    tmp.replace(args.out)  # atomic: a crashed run never leaves a half-written model behind
    return 0


if __name__ == "__main__":
    sys.exit(main())
