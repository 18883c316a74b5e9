"""The one table of input limits: every ceiling Strata puts on what a user, a server or a
file hands it, with its value, where it is enforced and why that value.

Bad input must fail fast, in the user's words, and leave memory bounded. Each input
that could otherwise make Strata build, read or keep without end is checked where it
enters, against a limit named here: a workload before its prompts are built, a trace
file line by line, the chat prompt search per count, a response stream per event, the
engine's ``/metrics`` body per read. Past a limit the input is refused with the limit's
name and value (a usage error, a ``TraceError``, a ``ChatTokenizerError``, a
``too_many_events`` request error, an UNAVAILABLE reason), never cut silently.

One exception to "stated here": the sampling agent (``agent/``) ships to other nodes as
a standard-library-only zip that cannot import this package, so its limit
(:data:`PROM_BODY_BYTES_MAX`) is stated in ``agent/collectors/prom.py`` and listed here
by import. ``docs/writing-cases.md`` ("Input limits") prints this table;
``tests/test_limits.py`` holds the page to it.

This module imports nothing of Strata's but that one agent constant, so any layer can
read it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata_plugin.agent.collectors.prom import PROM_BODY_BYTES_MAX


@dataclass(frozen=True)
class Limit:
    name: str
    value: int | float
    unit: str
    where: str  # where it is enforced, and what happens past it
    reason: str  # why this value: a document a user can open, or a measurement here

    def shown(self) -> str:
        """The value as docs/writing-cases.md prints it: ``1 048 576 tokens``."""
        if self.unit == "s" and self.value % 86400 == 0:
            return f"{self.value / 86400:g} days"
        return f"{int(self.value):,} {self.unit}".replace(",", " ")


# --- workloads (load/workload.py: Workload, checked before any prompt is built) ---------

#: Tokens in one prompt and in one answer: 2^20, a million-token context (the longest
#: any engine serves today is of that order; a longer one is a typo). The same bound
#: holds for trace files (load/trace.py).
MAX_ISL = 1 << 20
MAX_OSL = 1 << 20
#: Requests in one phase of a case (its warm-ups, its measured requests): at isl 1, the
#: most that PREPARED_BYTES_MAX holds (500,000 x 4,144 B = 1.93 GiB).
MAX_REQUESTS = 500_000
#: Every request of a phase is prepared (prompt, body, headers) before the phase's clock
#: starts, so that no time stamp waits for a body being built (docs/client.md, "Exact
#: stamps"): a phase must fit in memory, prepared. Its size is estimated as
#: ``requests x (PREPARED_BYTES_PER_REQUEST + isl x PREPARED_BYTES_PER_TOKEN)``, fitted
#: to tracemalloc's count of build_specs + Attempt on this repository's 2-core VM
#: (isl 16, 1024, 32768: 4.8 KB, 49 KB, 1.45 MB a request; tests/test_limits.py
#: measures it again and holds the estimate to within 25%).
PREPARED_BYTES_PER_REQUEST = 4_100
PREPARED_BYTES_PER_TOKEN = 44
PREPARED_BYTES_MAX = 2 << 30

# --- trace files (load/trace.py: read_trace, line by line) -----------------------------

#: Requests (data rows) in one file; cut a longer trace (``head -n``) or sample it.
MAX_ROWS = 2_000_000
#: Bytes in one line (without its line end). A Mooncake row of MAX_ISL tokens carries
#: 2048 hash ids, under 20 KiB; JSON and CSV parsing are bounded by it.
MAX_LINE_BYTES = 64 * 1024
#: Times (offsets from the trace's first request, and think times), in seconds: finite,
#: >= 0, and at most a year; a case replays in real time.
MAX_SPAN_S = 366 * 86400.0

# --- plugins' imports (entry_points.py: each entry point, in a thread of its own) -------

#: Seconds a plugin's import may take before it is refused as hung.
PLUGIN_IMPORT_S = 30.0
#: Characters of what a plugin prints while it imports that are shown (the rest counted).
PLUGIN_OUTPUT_CHARS = 4_000

# --- chat prompts built to the server's count (load/chat_prompts.py) -------------------

#: Words in one prompt: at most this many per token of the target (plus
#: :data:`CHAT_WORDS_SLACK`). Each word of the list is one token or more in a vocabulary
#: that splits at spaces (GPT-2's byte-level pre-tokenizer, SentencePiece's default
#: ``split_by_whitespace``); 2 leaves room for vocabularies with multi-word tokens. A
#: server whose count has not reached the target by then is not counting the text.
CHAT_WORDS_PER_TOKEN = 2
CHAT_WORDS_SLACK = 16
#: Counts asked of the server to find the word count of one prompt: interpolation with
#: a bisection every other step halves the interval at least every two counts, so
#: 2 x log2(2 x MAX_ISL + slack) = 44 suffice for any ISL within MAX_ISL; 4 more for the
#: first guess and the extrapolation while still short.
CHAT_SEARCH_COUNTS = 48
#: Tokens the fillers may add after the words: the gap left is less than one word's
#: tokens (a list word is 1 to 3 tokens in the vocabularies here); more means the count
#: jumps by more than any word can add.
CHAT_FILLER_TOKENS = 8
#: Bytes of one answer of the server's tokenizer endpoint: vLLM's and llama.cpp's
#: ``/tokenize`` list the token ids (under 8 bytes each as JSON: 8 MiB at MAX_ISL), and
#: ``/apply-template`` the templated text (a few bytes a token); 64 MiB is 8x that.
CHAT_ANSWER_BYTES_MAX = 64 << 20

# --- response streams (load/client/core.py: StreamCore, per event) ---------------------

#: Events one request may carry: EVENTS_PER_TOKEN per requested token (max_tokens) plus
#: EXTRA_EVENTS. llama.cpp, vLLM and SGLang send one event per token or fewer (several
#: tokens an event with speculative decoding or a stream interval); llama.cpp's chat
#: stream sends one chunk per message diff, and one token can make up to three (a
#: reasoning delta, a content delta, a tool call's: tools/server/server-task.cpp,
#: ``server_task_result_cmpl_partial::to_json_oaicompat_chat``, which also sends the
#: role chunk before the first token); 4 leaves one more.
#: EXTRA_EVENTS: the role chunk, the finish chunk, the usage chunk, ``[DONE]``, pings.
EVENTS_PER_TOKEN = 4
EXTRA_EVENTS = 16


def max_events(max_tokens: int) -> int:
    """The events one request asking for ``max_tokens`` may carry."""
    return EVENTS_PER_TOKEN * max_tokens + EXTRA_EVENTS


# --- engine metrics (agent/collectors/prom.py; run/prometheus.py) -----------------------

#: Bytes of one answer of an existing Prometheus's HTTP API (run/prometheus.py): a range
#: query returns at most 11,000 points a series (Prometheus's own cap, "Range queries"
#: in its HTTP API page), about 30 bytes each as JSON, so 256 MiB is some 800 series at
#: the cap; more means the job's matchers select more than one run's nodes.
PROM_API_BYTES_MAX = 256 << 20

# --- model files and the CPU probe's cache (formats/model_files.py, formats/bounded.py,
#     configure/model_facts.py, run/cpu_probe.py), checked where each is read ---------------

#: Bytes of a GGUF header (metadata and tensor table; the tensors' data is never read). A
#: 256K-vocabulary model's token list, scores and merges are under 12 MiB; 64 MiB is 5x.
GGUF_HEADER_BYTES_MAX = 64 << 20
#: Metadata entries of one GGUF file: llama.cpp's converters write 30 to 60.
GGUF_METADATA_MAX = 65_536
#: Tensors of one GGUF file: a 671B mixture of experts has about 1,100 (its experts
#: merged per layer); 2^20 is a thousand times that.
GGUF_TENSORS_MAX = 1 << 20
#: Elements of one GGUF metadata array: the longest are a vocabulary's tokens and merges
#: (256K and under a million); 2^24 is 16x the longest.
GGUF_ARRAY_MAX = 1 << 24
#: Bytes of one GGUF string: the longest in use is the chat template, tens of KB.
GGUF_STRING_BYTES_MAX = 1 << 20
#: Arrays inside arrays in GGUF metadata: the format allows it; llama.cpp's files have none.
GGUF_ARRAY_DEPTH_MAX = 2
#: Dimensions of one tensor: ggml's GGML_MAX_DIMS (ggml/include/ggml.h).
GGUF_DIMS_MAX = 4
#: Bytes of a safetensors header: the format's own cap (huggingface/safetensors,
#: safetensors/src/tensor.rs, MAX_HEADER_SIZE = 100,000,000).
SAFETENSORS_HEADER_BYTES_MAX = 100_000_000
#: Bytes of a checkpoint's config.json: a few KB (a multimodal one some 20 KB).
HF_CONFIG_BYTES_MAX = 1 << 20
#: Bytes of model.safetensors.index.json: one line per tensor, about 90,000 lines (7 MB)
#: for the largest mixtures of experts.
SAFETENSORS_INDEX_BYTES_MAX = 64 << 20
#: Nesting of the JSON of model files (config.json, the index, a safetensors header):
#: they nest 3 or 4 deep.
MODEL_JSON_DEPTH_MAX = 32
#: Characters of a model id or path where it is shown (a reason, the report): a file name
#: is at most 255 bytes (NAME_MAX), a Hugging Face repository id at most 96 characters.
MODEL_ID_SHOWN_MAX = 255
#: Integers of a model's shape (layers, hidden size, heads, vocabulary, context, experts):
#: llama.cpp holds them as uint32_t (src/llama-hparams.h), transformers' configs as
#: int32; a value past 2^31 - 1 is not a model.
MODEL_SHAPE_MAX = (1 << 31) - 1
#: Seconds the whole read of the served model's facts may take at a block's start
#: (run/roofline_facts.py: locating the model and reading its headers, in a thread of
#: its own). A stat, open or read on a hung network mount blocks in the kernel, where no
#: non-blocking open reaches; past this the facts are UNAVAILABLE with the reason and the
#: run goes on. The largest read allowed (a 64 MiB GGUF header) takes under 7 s at
#: 10 MB/s, a slow network mount; 60 s is many times that.
MODEL_FACTS_READ_S = 60.0
#: Bytes of the CPU probe's cache file: a measurement is about 3 KB.
CPU_CACHE_BYTES_MAX = 1 << 20
#: A cached CPU figure past these per probed CPU is not a measurement: AMX's bf16 tiles
#: peak at 1,024 FLOPs a cycle and core (Intel's optimization reference manual), 4 TFLOP/s
#: at 4 GHz; a core's L1 loads at 128 B a cycle, 640 GB/s at 5 GHz.
CPU_FLOPS_PER_CPU_MAX = 10**13
CPU_BYTES_S_PER_CPU_MAX = 10**12

# --- the engine's own per-request clocks (analysis/engine_clocks.py) --------------------

#: An engine's clock of a request (its queue, prefill, decode, a token's stamp) is timed
#: inside the request the client timed, from dispatch to the stream's end; past that span
#: by more than this (plus 1000 ppm of it: twice the kernel's largest clock slew) it is
#: not the request's clock (seconds given where ms are meant) and the analysis leaves it
#: out, counted.
ENGINE_CLOCK_SLACK_MS = 5

# --- an attached server's path (run/listener.py: discover) ------------------------------

#: Idle peer connections whose listener is asked for the health path (one socket each,
#: all at once, within DISCOVERY_PEER_CHECK_S): an engine holds a few (a database, a
#: Ray head, ZeroMQ peers); 256 sockets at once stay far under the usual 1024-descriptor
#: soft limit. Past it the rest are not followed, and the path says how many.
DISCOVERY_PEERS_MAX = 256
#: Seconds all the health checks of idle peers take together, whatever their number and
#: however deep the path: a peer that accepts and never answers costs this once, not once
#: per peer (200 such peers, checked in turn at 0.5 s each, took 107 s).
DISCOVERY_PEER_CHECK_S = 2.0
#: Listeners followed as hops of one path: a router over 32 replicas, or a mesh of a
#: few proxies, is under it; each one's descriptors are read every 10 ms of the probe.
DISCOVERY_LISTENERS_MAX = 64
#: Paths (chains from the URL to where they end) listed in the manifest and report.md; a
#: full mesh of 9 proxies has 146,743 of them. Every engine is still found: past this
#: number the engines and proxies are taken from the listeners reached, not the paths.
DISCOVERY_PATHS_MAX = 64
#: Probe requests held open of each kind (a head cut short, a body cut short) while the
#: path is looked at: a round-robin router hands each new connection to its next
#: upstream, so every one of up to this many replicas is carrying a held probe while the
#: sockets are read (one of each found one replica of two: the other's connections, the
#: GETs', lasted a millisecond). An engine holds a connection's thread or task for the
#: window (at most WINDOW_MAX_S = 3 s); past this many replicas, the rest are found only
#: if a GET is seen in flight.
DISCOVERY_HELD_EACH = 8

# --- the engine's profile (analysis/traces/engine_profile.py: samples.txt) -------------

#: perf samples read from one case's capture. At 997 Hz a thread, 8 busy threads for a
#: 10-minute window are 4.8 M samples; each becomes a trace event of ~150 bytes, so this
#: bounds the case's timeline near 750 MB. Past it the capture is refused, in words.
ENGINE_SAMPLES_MAX = 5_000_000
#: Bytes of one torch profiler trace the server wrote (its JSON, after gunzip; the
#: gzipped file is held to the same bound before it is read). The vLLM CPU build's worker
#: without Python stacks wrote 67,000 operations in 0.69 s of a busy window (one request
#: at a time, ISL 200, 16 tokens each): 16.7 MB of JSON, ~24 MB a second, so this holds
#: about 10 seconds of such a window; json.loads holds several times the text in memory.
#: Past it the trace is not merged, in words.
TORCH_TRACE_BYTES_MAX = 256 << 20

# --- the table ---------------------------------------------------------------------------

_PREPARED = ("load/workload.py: Workload, before any prompt is built; a usage error "
             "naming the estimate")

LIMITS: tuple[Limit, ...] = (
    Limit("MAX_ISL", MAX_ISL, "tokens",
          "load/workload.py: Workload (isl, shared_prefix_tokens); load/trace.py: each row; "
          "a usage error / TraceError naming the key",
          "a million-token context (2^20), the order of the longest any engine serves; "
          "building one such prompt took 1.8 s on the 2-core VM (tests/test_trace_input.py)"),
    Limit("MAX_OSL", MAX_OSL, "tokens",
          "load/workload.py: Workload (osl); load/trace.py: each row",
          "as MAX_ISL; it also bounds a request's events (EVENTS_PER_TOKEN) and deadline"),
    Limit("MAX_REQUESTS", MAX_REQUESTS, "requests",
          "load/workload.py: Workload (requests, warmups: each a phase)",
          "every request of a phase is prepared before its clock starts: 4.1 KB each "
          "before its prompt, so at isl 1 the most PREPARED_BYTES_MAX holds (1.93 GiB)"),
    Limit("PREPARED_BYTES_MAX", PREPARED_BYTES_MAX, "bytes", _PREPARED,
          "a phase's requests, prepared, beside the server under test on the same host; "
          "estimated as requests x (4100 + 44 x isl) bytes, fitted to tracemalloc on the "
          "2-core VM (tests/test_limits.py re-measures it)"),
    Limit("MAX_ROWS", MAX_ROWS, "rows", "load/trace.py: read_trace; a TraceError",
          "reading costs 30 to 50 us a row on the 2-core VM: about a minute at the ceiling"),
    Limit("MAX_LINE_BYTES", MAX_LINE_BYTES, "bytes", "load/trace.py: read_trace; a TraceError",
          "a Mooncake row of MAX_ISL tokens has 2048 hash ids, under 20 KiB"),
    Limit("MAX_SPAN_S", MAX_SPAN_S, "s", "load/trace.py: each row's times; a TraceError",
          "a case replays in real time: a year is past any trace meant to be replayed"),
    Limit("CHAT_WORDS_PER_TOKEN", CHAT_WORDS_PER_TOKEN, "words a token",
          "load/chat_prompts.py: the word search (plus CHAT_WORDS_SLACK = 16 words); "
          "a ChatTokenizerError naming the server's count",
          "a list word is one token or more where the vocabulary splits at spaces "
          "(GPT-2's pre-tokenizer, SentencePiece's split_by_whitespace); 2 leaves room "
          "for multi-word tokens"),
    Limit("CHAT_WORDS_SLACK", CHAT_WORDS_SLACK, "words",
          "load/chat_prompts.py: words_max = CHAT_WORDS_PER_TOKEN x ISL + CHAT_WORDS_SLACK",
          "room for a short ISL whose template and head take most of it"),
    Limit("CHAT_SEARCH_COUNTS", CHAT_SEARCH_COUNTS, "counts a prompt",
          "load/chat_prompts.py: most_words; a ChatTokenizerError",
          "a bisection every other count halves the interval: 2 x log2(2 x MAX_ISL + 16) "
          "= 44 counts, 4 more for the first guesses"),
    Limit("CHAT_FILLER_TOKENS", CHAT_FILLER_TOKENS, "tokens",
          "load/chat_prompts.py: exact_content; a ChatTokenizerError",
          "after the words the gap is under one word's tokens (1 to 3 for a list word)"),
    Limit("CHAT_ANSWER_BYTES_MAX", CHAT_ANSWER_BYTES_MAX, "bytes",
          "load/chat_prompts.py: ServerCounter, each answer; a ChatTokenizerError",
          "a /tokenize answer lists the token ids, under 8 B each as JSON: 8 MiB at "
          "MAX_ISL; 8x that"),
    Limit("EVENTS_PER_TOKEN", EVENTS_PER_TOKEN, "events a token",
          "load/client/core.py: StreamCore, EVENTS_PER_TOKEN x max_tokens + EXTRA_EVENTS "
          "(16) events a request; past it the request is a too_many_events error and "
          "the run goes on",
          "one event a token (or fewer) from llama.cpp, vLLM, SGLang; llama.cpp's chat "
          "stream sends a chunk per message diff, up to 3 for one token (reasoning, "
          "content, tool call: tools/server/server-task.cpp, "
          "server_task_result_cmpl_partial::to_json_oaicompat_chat)"),
    Limit("EXTRA_EVENTS", EXTRA_EVENTS, "events",
          "load/client/core.py: StreamCore, with EVENTS_PER_TOKEN; load/client/mux.py: "
          "the deadline of a request without total_s (read_s per token plus these)",
          "the role chunk, the finish chunk, the usage chunk, [DONE], pings"),
    Limit("PROM_BODY_BYTES_MAX", PROM_BODY_BYTES_MAX, "bytes",
          "agent/collectors/prom.py: each /metrics scrape, within the scrape's timeout; "
          "past it the scrape fails with an UNAVAILABLE reason",
          "vLLM 0.32's /metrics (CPU build, one engine, measured here) is 52 818 bytes; "
          "eight engines (data parallel, an engine label each) about 0.4 MB: 4 MiB is 10x "
          "that; the agent parses 90 to 185 ms a MiB on the 2-core VM"),
    Limit("PROM_API_BYTES_MAX", PROM_API_BYTES_MAX, "bytes",
          "run/prometheus.py: PromClient, each HTTP API answer; a PromError naming it",
          "11,000 points a series at most (Prometheus HTTP API, range queries) x ~30 B: "
          "some 800 series at the cap"),
    Limit("PLUGIN_IMPORT_S", PLUGIN_IMPORT_S, "s",
          "entry_points.py: each entry point's import, in a thread of its own; past it a "
          "PluginError naming the plugin (its thread is left behind: a thread cannot be "
          "killed)",
          "a plugin that imports a framework at its top (torch: seconds from a cold disk) "
          "fits with room; Strata's own pytest plugin and report modules import in 1.6 s "
          "on the 2-core VM"),
    Limit("PLUGIN_OUTPUT_CHARS", PLUGIN_OUTPUT_CHARS, "characters",
          "entry_points.py: what a plugin prints while it imports, shown after it (in its "
          "PluginError if it is refused), escaped; the rest counted, not shown",
          "fifty lines of a traceback or a warning; a plugin that prints more at import "
          "is printing data"),
    Limit("GGUF_HEADER_BYTES_MAX", GGUF_HEADER_BYTES_MAX, "bytes",
          "formats/model_files.py: read_gguf_header; a header running past it is refused "
          "(the model's facts UNAVAILABLE, naming the file and the limit)",
          "a 256K-vocabulary model's tokens, scores and merges are under 12 MiB"),
    Limit("GGUF_METADATA_MAX", GGUF_METADATA_MAX, "entries",
          "formats/model_files.py: the metadata count, before any entry is read",
          "llama.cpp's converters write 30 to 60 entries"),
    Limit("GGUF_TENSORS_MAX", GGUF_TENSORS_MAX, "tensors",
          "formats/model_files.py: the tensor count, before any tensor is read",
          "a 671B mixture of experts has about 1,100 (experts merged per layer)"),
    Limit("GGUF_ARRAY_MAX", GGUF_ARRAY_MAX, "elements",
          "formats/model_files.py: each metadata array's length, before it is read",
          "a vocabulary's tokens and merges: 256K and under a million"),
    Limit("GGUF_STRING_BYTES_MAX", GGUF_STRING_BYTES_MAX, "bytes",
          "formats/model_files.py: each string's length, before it is read",
          "the longest string in use is a chat template, tens of KB"),
    Limit("GGUF_ARRAY_DEPTH_MAX", GGUF_ARRAY_DEPTH_MAX, "levels",
          "formats/model_files.py: arrays inside arrays",
          "the format allows nesting; llama.cpp's files have none"),
    Limit("GGUF_DIMS_MAX", GGUF_DIMS_MAX, "dimensions",
          "formats/model_files.py: each tensor's dimension count",
          "ggml's GGML_MAX_DIMS (ggml/include/ggml.h)"),
    Limit("SAFETENSORS_HEADER_BYTES_MAX", SAFETENSORS_HEADER_BYTES_MAX, "bytes",
          "formats/model_files.py: read_safetensors_header, before the header is read",
          "the format's own cap (safetensors/src/tensor.rs, MAX_HEADER_SIZE)"),
    Limit("HF_CONFIG_BYTES_MAX", HF_CONFIG_BYTES_MAX, "bytes",
          "configure/model_facts.py: config.json, before it is read",
          "a checkpoint's config.json is a few KB, a multimodal one some 20 KB"),
    Limit("SAFETENSORS_INDEX_BYTES_MAX", SAFETENSORS_INDEX_BYTES_MAX, "bytes",
          "configure/model_facts.py: model.safetensors.index.json, before it is read",
          "one line per tensor: about 7 MB for the largest mixtures of experts"),
    Limit("MODEL_JSON_DEPTH_MAX", MODEL_JSON_DEPTH_MAX, "levels",
          "formats/bounded.py: config.json, the index, each safetensors header",
          "they nest 3 or 4 deep"),
    Limit("MODEL_ID_SHOWN_MAX", MODEL_ID_SHOWN_MAX, "characters",
          "run/model_source.py: a model id or path the server reports, where it is shown "
          "(shortened, its length said)",
          "a file name is at most 255 bytes (NAME_MAX); a Hugging Face id at most 96"),
    Limit("MODEL_SHAPE_MAX", MODEL_SHAPE_MAX, "per fact",
          "configure/model_facts.py: each shape fact (layers, hidden, heads, vocab, context, "
          "experts); past it, or not a whole number, the fact is UNAVAILABLE naming the "
          "file and key",
          "llama.cpp holds them as uint32_t (src/llama-hparams.h), transformers as int32"),
    Limit("MODEL_FACTS_READ_S", MODEL_FACTS_READ_S, "s",
          "run/roofline_facts.py: locating the served model and reading its facts, in a "
          "thread of its own, at a block's start; past it the facts are UNAVAILABLE "
          "(\"a hung mount?\"), the run goes on and the blocked thread is left behind",
          "the largest header allowed (64 MiB) reads in under 7 s at 10 MB/s, a slow "
          "network mount"),
    Limit("CPU_CACHE_BYTES_MAX", CPU_CACHE_BYTES_MAX, "bytes",
          "run/cpu_probe.py: the cache file, before it is read; past it the CPUs are "
          "measured again and the file rewritten",
          "one measurement is about 3 KB"),
    Limit("CPU_FLOPS_PER_CPU_MAX", CPU_FLOPS_PER_CPU_MAX, "FLOP/s a CPU",
          "run/cpu_probe.py: each cached matrix-multiply rate; past it (or not a finite "
          "positive number) the entry is discarded, measured again, rewritten",
          "AMX's bf16 tiles: 1,024 FLOPs a cycle and core, 4 TFLOP/s at 4 GHz"),
    Limit("CPU_BYTES_S_PER_CPU_MAX", CPU_BYTES_S_PER_CPU_MAX, "B/s a CPU",
          "run/cpu_probe.py: each cached bandwidth, as CPU_FLOPS_PER_CPU_MAX",
          "a core's L1 loads 128 B a cycle: 640 GB/s at 5 GHz"),
    Limit("ENGINE_CLOCK_SLACK_MS", ENGINE_CLOCK_SLACK_MS, "ms",
          "analysis/engine_clocks.py, where requests.jsonl is read: an engine clock longer "
          "than the request the client timed (plus this and 1000 ppm) is left out of the "
          "analysis and counted with its reason (extra.engine_clock_dropped, the case's "
          "verdict notes); the request stands, the file keeps it",
          "the engine times inside the client's span; 1000 ppm is twice the kernel's "
          "largest clock slew (adjtimex, 500 ppm)"),
    Limit("DISCOVERY_PEERS_MAX", DISCOVERY_PEERS_MAX, "connections",
          "run/listener.py: discover, the idle peers of each hop asked for the health "
          "path; past it they are not followed and the path's notes say how many",
          "one socket each, all at once: far under the usual 1024-descriptor limit"),
    Limit("DISCOVERY_PEER_CHECK_S", DISCOVERY_PEER_CHECK_S, "s",
          "run/listener.py: discover, all health checks of idle peers together; a peer "
          "that has not answered by then is not followed",
          "a peer that accepts and never answers costs this once; checked in turn at "
          "0.5 s each, 200 of them took 107 s"),
    Limit("DISCOVERY_LISTENERS_MAX", DISCOVERY_LISTENERS_MAX, "listeners",
          "run/listener.py: discover, the hops followed; past it the path's notes say so",
          "a router over 32 replicas is under it; each hop's descriptors are read every "
          "10 ms of the probe's window"),
    Limit("DISCOVERY_PATHS_MAX", DISCOVERY_PATHS_MAX, "paths",
          "run/listener.py: discover, the paths listed; past it the notes say so and the "
          "engines come from the listeners reached",
          "a full mesh of 9 proxies has 146,743 paths"),
    Limit("DISCOVERY_HELD_EACH", DISCOVERY_HELD_EACH, "connections",
          "run/listener.py: discover, the probe requests held open of each kind; a router "
          "over more replicas has the rest found only where a GET is seen in flight",
          "a round-robin router hands each held probe to its next replica; one of each "
          "found one replica of two (tests/test_router_replicas.py)"),
    Limit("ENGINE_SAMPLES_MAX", ENGINE_SAMPLES_MAX, "samples",
          "analysis/traces/engine_profile.py, where a case's samples.txt is read: past it "
          "the capture is not merged and the report says why; the rest stands",
          "997 Hz on 8 busy threads for 10 minutes is 4.8 M samples, ~750 MB of trace "
          "events"),
    Limit("TORCH_TRACE_BYTES_MAX", TORCH_TRACE_BYTES_MAX, "bytes",
          "analysis/traces/torch_trace.py, where a case's torch profiler trace "
          "(traces/engine/<case>/torch/*.trace.json.gz: vLLM's or SGLang's) is read, "
          "gzipped and after gunzip: past it that trace is not merged and the report says "
          "why; the rest stands",
          "vLLM's CPU worker wrote 67,000 operations (16.7 MB of JSON) in 0.69 s of a busy "
          "window without Python stacks: about a 10-second window"),
)


def limit(name: str) -> Limit:
    """The limit of that name; KeyError names the known ones."""
    for lim in LIMITS:
        if lim.name == name:
            return lim
    raise KeyError(f"no limit {name!r}; the limits are {', '.join(x.name for x in LIMITS)}")


def prepared_bytes(requests: int, isl: int) -> int:
    """The estimated memory of one phase's prepared requests (see PREPARED_BYTES_MAX)."""
    return requests * (PREPARED_BYTES_PER_REQUEST + isl * PREPARED_BYTES_PER_TOKEN)


def max_phase_requests(isl: int) -> int:
    """The most requests of ``isl`` tokens one phase (or one batch) may prepare at once:
    within MAX_REQUESTS and PREPARED_BYTES_MAX."""
    per = PREPARED_BYTES_PER_REQUEST + max(0, isl) * PREPARED_BYTES_PER_TOKEN
    return max(1, min(MAX_REQUESTS, PREPARED_BYTES_MAX // per))
