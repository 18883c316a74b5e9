#!/usr/bin/env python3
"""Write a tiny random-weight Llama checkpoint in Hugging Face format (for vLLM on the CPU).

Why: the opt-in vLLM target needs a model vLLM loads offline in seconds, generated here
rather than downloaded (no hub access, no licence, byte-identical on every machine). It
runs with the vLLM virtualenv's interpreter, which has torch, transformers and tokenizers;
Strata's own environment needs none of them.

The checkpoint: LlamaForCausalLM, hidden 256, 4 layers, 4 heads (2 KV heads), MLP 704,
bfloat16 weights from a fixed seed, and a byte-level BPE tokenizer of 1024 entries
(2 special tokens, the 128 ASCII byte symbols, 894 merges) trained with `tokenizers` on a
corpus generated from the same seed. Any token ID in [130, 1024) is an ordinary piece, so
a token-ID prompt of N IDs is N prompt tokens exactly (vLLM adds no BOS to a token-ID
prompt). About 7 MB.

Only ASCII bytes: a token holding a byte of a multi-byte UTF-8 character decodes to an
incomplete character, and vLLM's streaming detokenizer holds text back until it is
complete. A random model emits such bytes freely, so whole outputs arrived in one burst
at the end and the client measured no time per token; with ASCII only, every token is
text the moment it is generated.

    python make_hf_model.py OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

HIDDEN = 256
LAYERS = 4
HEADS = 4
KV_HEADS = 2
FF = 704
VOCAB = 1024
CTX = 4096
SPECIAL = ("<|bos|>", "<|eos|>")


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Pseudo-words with a skewed letter distribution: enough repetition for 766 merges."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    weights = [len(letters) - i for i in range(len(letters))]
    words = ["".join(rng.choices(letters, weights, k=rng.randint(2, 8))) for _ in range(2000)]
    return [" ".join(rng.choices(words, k=rng.randint(5, 20))) for _ in range(lines)]


def ascii_alphabet() -> list[str]:
    """The byte-level symbols (GPT-2's byte-to-unicode map) of bytes 0-127."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    symbol, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbol[b] = chr(b)
        else:
            symbol[b] = chr(256 + extra)
            extra += 1
    return [symbol[b] for b in range(128)]


def make_tokenizer(out: Path, seed: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=list(SPECIAL), show_progress=False,
        initial_alphabet=ascii_alphabet(), limit_alphabet=128,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    if tok.get_vocab_size() != VOCAB:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} entries, wanted {VOCAB}")
    non_ascii = [t for t, i in tok.get_vocab().items()
                 if not tok.decode([i]).isascii() and t not in SPECIAL]
    if non_ascii:
        raise SystemExit(f"tokenizer has non-ASCII pieces: {non_ascii[:5]}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL[0],
                                   eos_token=SPECIAL[1], model_max_length=CTX)
    fast.save_pretrained(str(out))


def make_weights(out: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=CTX, bos_token_id=0, eos_token_id=1,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(args.out, args.seed)
    make_weights(args.out, args.seed)
    (args.out / "strata_model.json").write_text(json.dumps(
        {"hidden": HIDDEN, "layers": LAYERS, "vocab": VOCAB, "ctx": CTX, "seed": args.seed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
