"""Each case against its roofline (analysis/roofline.py): the accounting on records whose
answer is known by hand, the roof that applies either side of the machine balance, the
share moving the right way as a case gets heavier, and the verdict's evidence just below
and at its thresholds."""

from __future__ import annotations

import pytest

from strata_plugin.analysis.device_limits import DeviceLimits, Peak
from strata_plugin.analysis.roofline import (
    RooflineInputs,
    annotate,
    case_roofline,
    decode_phase,
    prefill_phase,
    run_inputs,
)
from strata_plugin.analysis.roofline import _model as model_of
from strata_plugin.analysis.rules.window import Evidence, Verdict, WindowSignals
from strata_plugin.analysis.thresholds import value
from strata_plugin.configure.model_facts import FACT_NAMES, Fact, ModelFacts
from strata_plugin.formats.records import EngineClocks, RequestRecord, Timings, TokenEvent, Usage

MS = 1_000_000
# a llama-like model: 1e6 matrix parameters, 1e5 of them the LM head, 4 layers x 4 heads
# x 16 = 256 attention width, 1 MB of weights read a step, 1 kB of KV a token
BASE = {"params_matmul_active": 1_000_000, "params_lm_head": 100_000,
        "stored_bytes": 1_100_000, "stored_bytes_embedding": 100_000,
        "stored_bytes_experts": 0, "layers": 4, "heads": 4, "head_dim": 16,
        "kv_bytes_per_token": 1000, "experts": 1, "experts_per_token": 1,
        "tied_embeddings": False}
ATTN = 4 * 4 * 4 * 16  # 4 x layers x heads x head_dim


def facts(**over) -> ModelFacts:
    vals = {**BASE, **over}
    return ModelFacts("/m.gguf", "gguf", tuple(
        (n, Fact(vals[n], "test") if n in vals else Fact(None, unavailable="not in test"))
        for n in FACT_NAMES))


def cpu(flops=100e9, dram=10e9, cache=None, cache_bytes=None) -> DeviceLimits:
    return DeviceLimits(
        "cpu", "test CPU", Peak("memory bandwidth (DRAM)", dram, "B/s", "measured", "t"),
        Peak("FLOPs", flops, "FLOP/s", "measured", "t"), cache_bytes=cache_bytes,
        cache_bandwidth=None if cache is None else Peak("llc", cache, "B/s", "measured", "t"),
        n_cpus=2)


def rec(i: int, *, t0: int, prompt: int, out: int, gap_ms: float, prompt_ms: float | None = None,
        cached: int = 0, engine: EngineClocks | None = None, phase="measured") -> RequestRecord:
    """A request whose first token comes at t0 and then one token every ``gap_ms``."""
    ev = tuple(TokenEvent(t0 + int(k * gap_ms * MS), 1) for k in range(out))
    t = Timings(prompt_n=prompt, prompt_ms=prompt_ms, cache_n=cached,
                predicted_n=out, predicted_ms=out * gap_ms) if prompt_ms is not None else None
    return RequestRecord(request_id=f"r{i}", case_id="c", phase=phase, api="llamacpp",
                         scheduled_ns=t0 - 10 * MS, dispatched_ns=t0 - 10 * MS, events=ev,
                         timings=t, usage=Usage(prompt_tokens=prompt + cached,
                                                completion_tokens=out, cached_tokens=cached),
                         engine=engine)


def test_prefill_flops_bytes_and_time_by_hand():
    m, _ = model_of(facts())
    r = rec(0, t0=10**12, prompt=512, out=1, gap_ms=1, prompt_ms=100.0, cached=256)
    p = prefill_phase([r], m, None, "")
    # 2 x (matrix - head) x new + 2 x head (the last token's logits) + attention over
    # positions 257..768: sum = 512 x 256 + 512 x 513 / 2
    want = 2 * 900_000 * 512 + 2 * 100_000 + ATTN * (512 * 256 + 512 * 513 / 2)
    assert p.flops == pytest.approx(want)
    assert p.seconds == pytest.approx(0.1) and p.tokens == 512
    # the weights once (embedding aside) and the KV: 512 written, 256 cached read
    assert p.bytes == pytest.approx(1_000_000 + 1000 * 768)
    assert p.clock == "llama.cpp timings.prompt_ms"


def test_the_engines_prefill_clock_comes_first_then_timings_then_the_case_mean():
    m, _ = model_of(facts())
    eng = EngineClocks("vllm per-request metrics", prefill_ms=50.0)
    a = rec(0, t0=10**12, prompt=100, out=1, gap_ms=1, prompt_ms=80.0, engine=eng)
    assert prefill_phase([a], m, None, "").seconds == pytest.approx(0.05)
    b = rec(1, t0=10**12, prompt=100, out=1, gap_ms=1)  # no timings, no engine clock
    assert prefill_phase([b], m, None, "") is None
    p = prefill_phase([b], m, 20.0, "the engine's prefill_time_seconds histogram")
    assert p.seconds == pytest.approx(0.02) and "histogram" in p.clock


def test_prefills_in_flight_together_count_their_time_and_weights_once():
    m, _ = model_of(facts())
    t0 = 10**12
    together = [rec(i, t0=t0, prompt=100, out=1, gap_ms=1, prompt_ms=100.0) for i in range(4)]
    apart = [rec(i, t0=t0 + i * 200 * MS, prompt=100, out=1, gap_ms=1, prompt_ms=100.0)
             for i in range(4)]
    a, b = prefill_phase(together, m, None, ""), prefill_phase(apart, m, None, "")
    assert a.flops == b.flops
    assert a.seconds == pytest.approx(0.1) and b.seconds == pytest.approx(0.4)
    assert (a.steps, b.steps) == (1, 4)
    assert b.bytes - a.bytes == pytest.approx(3 * 1_000_000)


def _decode(c: int, ctx: int = 1000, out: int = 33, gap_ms: float = 10.0):
    m, _ = model_of(facts())
    rs = [rec(i, t0=10**12, prompt=ctx, out=out, gap_ms=gap_ms, prompt_ms=1.0)
          for i in range(c)]
    return decode_phase(rs, rs, m)


def test_decode_bytes_per_step_are_the_weights_and_every_running_sequences_kv():
    one = _decode(1)
    # each step: 1 MB of weights + the sequence's KV at 1000 + (tokens so far)
    assert one.batch_mean == pytest.approx(1.0)
    assert one.steps == one.tokens == 32
    per_step = 1_000_000 + 1000 * (1000 + sum(range(1, 33)) / 32)
    assert one.bytes_per_step == pytest.approx(per_step, rel=1e-3)
    assert one.seconds == pytest.approx(32 * 0.010)
    assert one.bytes_s == pytest.approx(per_step / 0.010, rel=1e-3)


def test_a_heavier_decode_moves_more_bytes_a_step_and_its_share_rises():
    """Made heavier: more sequences at the same pace (the weights shared, each one's KV
    added), or a longer context."""
    lim = cpu(flops=1e15, dram=1e12)  # the memory roof applies throughout
    low, high, longer = _decode(1), _decode(4), _decode(1, ctx=4000)
    assert high.batch_mean == pytest.approx(4.0)
    assert high.bytes_per_step - low.bytes_per_step == pytest.approx(3 * (low.bytes_per_step
                                                                          - 1_000_000), rel=1e-3)
    assert longer.bytes_per_step > low.bytes_per_step
    inp = RooflineInputs(facts(), lim)
    shares = []
    for c in (1, 4):
        rs = [rec(i, t0=10**12, prompt=1000, out=33, gap_ms=10.0, prompt_ms=1.0)
              for i in range(c)]
        r = case_roofline(inp, rs)
        assert r.headline_phase == "decode" and r.decode.roof == "memory"
        shares.append(r.decode.share)
    assert shares[1] > shares[0]


def test_speculative_steps_are_tokens_less_accepted_drafts():
    m, _ = model_of(facts())
    r = rec(0, t0=10**12, prompt=10, out=33, gap_ms=10, prompt_ms=1.0)
    r = RequestRecord(**{**r.__dict__, "timings": Timings(prompt_n=10, prompt_ms=1.0,
                                                          predicted_n=33, predicted_ms=330,
                                                          draft_n=30, draft_n_accepted=20)})
    d = decode_phase([r], [r], m)
    assert (d.tokens, d.steps) == (32, 12) and "speculative" in d.notes[0]


def test_a_mixture_of_experts_reads_the_experts_its_tokens_touch():
    m, _ = model_of(facts(stored_bytes=1_100_000 + 8_000_000, stored_bytes_experts=8_000_000,
                          experts=8, experts_per_token=2))
    assert m.weight_bytes(1) == pytest.approx(1_000_000 + 8_000_000 * 2 / 8)
    assert m.weight_bytes(2) == pytest.approx(1_000_000 + 8_000_000 * (1 - (6 / 8) ** 2))
    assert m.weight_bytes(512) == pytest.approx(9_000_000)


def test_the_roof_is_the_compute_one_from_the_machine_balance_up():
    """Intensity of a one-request prefill here: its FLOPs over its bytes; the balance set
    just above and at it."""
    r = rec(0, t0=10**12, prompt=64, out=1, gap_ms=1, prompt_ms=10.0)
    m, _ = model_of(facts())
    p = prefill_phase([r], m, None, "")
    inten = p.flops / p.bytes
    below = case_roofline(RooflineInputs(facts(), cpu(flops=inten * 1.02e10, dram=1e10)), [r])
    at = case_roofline(RooflineInputs(facts(), cpu(flops=inten * 1e10, dram=1e10)), [r])
    assert below.prefill.roof == "memory" and below.prefill.share == pytest.approx(
        p.bytes_s / 1e10)
    assert at.prefill.roof == "compute" and at.prefill.share == pytest.approx(
        p.flops_s / (inten * 1e10))


def test_a_step_that_fits_the_last_level_cache_is_held_against_its_bandwidth():
    rs = [rec(0, t0=10**12, prompt=100, out=33, gap_ms=10, prompt_ms=1.0)]
    per_step = _decode(1, ctx=100).bytes_per_step
    fits = case_roofline(RooflineInputs(facts(), cpu(1e15, 1e10, 1e11, int(per_step) + 1)), rs)
    spills = case_roofline(RooflineInputs(facts(), cpu(1e15, 1e10, 1e11, int(per_step) - 1)), rs)
    assert fits.decode.memory_level == "last-level cache" and fits.decode.limit == 1e11
    assert spills.decode.memory_level == "DRAM" and spills.decode.limit == 1e10


def test_missing_facts_or_limits_say_why_and_no_facts_is_no_row():
    rs = [rec(0, t0=10**12, prompt=100, out=3, gap_ms=10, prompt_ms=1.0)]
    assert case_roofline(None, rs) is None
    gone = ModelFacts.unavailable("", "the server downloads its model (org/x)")
    r = case_roofline(RooflineInputs(gone, cpu()), rs)
    assert r.headline is None and "downloads its model" in r.unavailable
    r = case_roofline(RooflineInputs(facts(), None, "no CPU probe recorded"), rs)
    assert r.prefill is not None and r.prefill.share is None
    assert r.unavailable == "device limits unavailable: no CPU probe recorded"


# --- the verdict's evidence ---------------------------------------------------------------

PLAIN = Verdict(classes=("cpu_compute",), evidence=(), confidence=0.8, inconclusive=False,
                finer_trace=(), missing_signals=(), notes=("last note decides",))


def _roof_at(share: float, other: float = 0.05, roof: str = "memory"):
    """A decode case whose headline share is ``share`` of its roof."""
    peak = 1e10
    rs = [rec(0, t0=10**12, prompt=100, out=33, gap_ms=10, prompt_ms=1.0)]
    base = case_roofline(RooflineInputs(facts(), cpu(1e15, peak)), rs)
    d = base.decode
    from dataclasses import replace

    return replace(base, decode=replace(d, roof=roof, share=share,
                                        bytes_share=share if roof == "memory" else other,
                                        flops_share=other if roof == "memory" else share))


def test_near_the_roof_is_evidence_from_its_threshold_up():
    near = value("roof_near_frac")
    sig = WindowSignals("c", 1.0)
    under = annotate(PLAIN, _roof_at(near * 0.98), sig)
    at = annotate(PLAIN, _roof_at(near), sig)
    (e_under,) = [e for e in under.evidence if e.cls == "roofline"]
    (e_at,) = [e for e in at.evidence if e.cls == "roofline"]
    assert not e_under.met and e_at.met and e_at.threshold == "roof_near_frac"
    assert "bandwidth-bound whatever the utilization counters say" in at.notes[0]
    assert "bound" not in under.notes[0]
    assert under.classes == at.classes == PLAIN.classes  # evidence, never a class
    assert at.notes[-1] == "last note decides"  # the deciding note stays last


def test_far_below_both_roofs_on_a_busy_device_is_a_scheduling_question():
    far = value("roof_far_frac")
    busy = WindowSignals("c", 1.0, server_cpu_cores=1.9, server_threads=8, n_cores=2)
    idle = WindowSignals("c", 1.0, server_cpu_cores=0.5, server_threads=8, n_cores=2)
    hit = annotate(PLAIN, _roof_at(far * 0.98, other=0.1), busy, "cpu", 2)
    assert "a scheduling, synchronization or per-operation overhead question, not the " \
        "hardware's limit" in hit.notes[0]
    assert "the server used 1.90 of its 2 CPUs" in hit.notes[0]
    assert "scheduling" not in annotate(PLAIN, _roof_at(far, other=0.1), busy, "cpu", 2).notes[0]
    assert "scheduling" not in annotate(PLAIN, _roof_at(0.1, other=far), busy, "cpu", 2).notes[0]
    assert "scheduling" not in annotate(PLAIN, _roof_at(0.1, other=0.1), idle, "cpu", 2).notes[0]
    # the CPUs the server may use decide "busy": 0.9 of one pinned CPU is busy
    one = WindowSignals("c", 1.0, server_cpu_cores=0.9, server_threads=8, n_cores=2)
    assert "scheduling" in annotate(PLAIN, _roof_at(0.1, other=0.1), one, "cpu", 1).notes[0]
    gpu = WindowSignals("c", 1.0, gpu_util=0.95)
    on_gpu = annotate(PLAIN, _roof_at(0.1, other=0.1), gpu, "gpu").notes[0]
    assert "gpu_util 0.95" in on_gpu and "a scheduling or kernel-launch question" in on_gpu


def test_the_evidence_is_replaced_not_added_and_failures_get_none():
    sig = WindowSignals("c", 1.0)
    once = annotate(PLAIN, _roof_at(0.9), sig)
    twice = annotate(once, _roof_at(0.5), sig)
    assert sum(n.startswith("roofline:") for n in twice.notes) == 1
    assert [e.value for e in twice.evidence if e.cls == "roofline"] == [0.5]
    failed = Verdict(("requests_failed",), (Evidence("requests_failed", "failed_share", 1.0,
                                                     ">=", "requests_failed_share", 0.5, "", "",
                                                     True),), 1.0, False, (), (), notes=("x",))
    assert annotate(failed, _roof_at(0.9), sig) == failed


# --- scripts/gpu_check.sh -----------------------------------------------------------------


def test_the_gpu_checks_decode_like_pass_is_held_as_a_decode_case_is():
    from strata_plugin.analysis.device_limits import gpu_limits
    from strata_plugin.analysis.roofline import weight_pass
    from tests.test_device_limits import _gpus

    lim = gpu_limits(_gpus(_fake_h100()), "bf16")  # 2619 MHz x 5120 bits: 3.352 TB/s
    peak, nbytes = 2619e6 * 5120 / 8 * 2, 4 << 30
    ok = weight_pass(nbytes, nbytes // 2, 200, 200 * nbytes / 3.0e12, lim)
    assert ok.decode.roof == "memory" and ok.decode.memory_level == "HBM/GDDR"
    assert ok.decode.share == pytest.approx(3.0e12 / peak, rel=1e-3)
    # faster than the peak is what the script's check fails on
    assert weight_pass(nbytes, nbytes // 2, 200, 200 * nbytes / (peak * 1.01), lim
                       ).decode.share > 1


def _fake_h100():
    from tests.fake_nvml import FakeGpu

    return FakeGpu()


def test_gpu_check_runs_its_roofline_checks_on_the_scripted_nvml(tmp_path):
    """The script's dry path: the scripted NVML's two H100s agree with their datasheet
    row, and the decode-like pass says it was skipped (no GPU here)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, STRATA_GPU_CHECK_FAKE="1", OUT=str(tmp_path),
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    p = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), "1"], cwd=root,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "ok   gpu0 FAKE NVIDIA H100 80GB HBM3 (scripted stub, no GPU): NVML 3.352 TB/s, " \
           "datasheet H100 SXM 3.350 TB/s (+0.1%)" in p.stdout
    assert "decode-like pass: skipped (the scripted NVML)" in p.stdout
    assert "ROOFLINE: checks passed" in p.stdout


def test_a_share_above_one_says_the_peak_or_the_count_is_wrong():
    v = annotate(PLAIN, _roof_at(1.05), WindowSignals("c", 1.0))
    assert "above the peak, which a phase cannot be" in v.notes[0]
    assert "whatever the utilization counters say" not in v.notes[0]


# --- inputs no reader should have let through: a roofline or its reason, never a crash ----

def _decode_case(inp: RooflineInputs):
    rs = [rec(0, t0=10**12, prompt=100, out=33, gap_ms=10, prompt_ms=1.0)]
    return case_roofline(inp, rs)


def _note(roof) -> str:
    return annotate(PLAIN, roof, WindowSignals("c", 1.0)).notes[0]


@pytest.mark.parametrize("name, bad, good, words", [
    # a head count as some exported config.json files give it
    ("heads", "32", 32, "heads: '32' (read from test) is a str, not a number"),
    ("heads", 0, 1, "heads: 0 (read from test) is not above zero"),
    ("heads", True, 1, "heads: True (read from test) is a bool, not a number"),
    ("stored_bytes", float("nan"), 1_100_000, "stored_bytes: nan (read from test) is not "
                                              "a finite number"),
    ("stored_bytes_experts", -1, 0, "stored_bytes_experts: -1 (read from test) is negative"),
    ("kv_bytes_per_token", -1000, 0, "kv_bytes_per_token: -1000 (read from test) is negative"),
    ("params_lm_head", 10**400, 100_000, "params_lm_head: 1000000000000000000000000000000000"
                                         "000000 (read from test) is too large"),
    ("tied_embeddings", "false", False, "tied_embeddings: 'false' (read from test) is a str, "
                                        "not true or false"),
], ids=["heads-str", "heads-zero", "heads-bool", "bytes-nan", "experts-negative",
        "kv-negative", "head-overflow", "tied-str"])
def test_a_fact_of_the_wrong_type_or_sign_is_unavailable_with_its_name(name, bad, good, words):
    """Just inside (the ``good`` value) the case has its share; the ``bad`` one says which
    fact, where it was read and what is wrong, and the verdict gets no note from it (no
    "nan%" or "-41174.6% of its memory roof")."""
    ok = _decode_case(RooflineInputs(facts(**{name: good}), cpu(1e15, 1e10)))
    assert ok.unavailable == "" and ok.decode.share > 0
    assert _note(ok).startswith("roofline: decode at ")
    r = _decode_case(RooflineInputs(facts(**{name: bad}), cpu(1e15, 1e10)))
    assert r.headline is None and r.unavailable.startswith("model facts unusable: ")
    assert words in r.unavailable
    assert _note(r) == PLAIN.notes[0]  # no roofline note at all


def test_facts_that_leave_no_dense_weights_or_more_active_experts_than_there_are():
    r = _decode_case(RooflineInputs(facts(stored_bytes=100_000), cpu(1e15, 1e10)))
    assert r.unavailable == ("model facts unusable: stored_bytes 100000 is not more than the "
                             "experts' and the embedding's bytes")
    assert _decode_case(RooflineInputs(facts(stored_bytes=100_001), cpu(1e15, 1e10))).decode.share
    r = _decode_case(RooflineInputs(facts(experts=8, experts_per_token=9), cpu(1e15, 1e10)))
    assert "experts_per_token 9 is more than experts 8" in r.unavailable


@pytest.mark.parametrize("bad", [0.0, -1e10, float("nan"), float("inf")])
def test_a_peak_that_is_no_number_above_zero_is_left_out_with_its_value(bad):
    """A bandwidth peak of 0, negative, NaN or infinite: the decode is held against no
    memory roof, the reason names the value; the compute roof alone where it is known."""
    both = _decode_case(RooflineInputs(facts(), cpu(flops=bad, dram=bad)))
    assert both.headline.roof == "" and both.decode.share is None
    assert f"the memory bandwidth (DRAM) recorded, {bad!r}, is not a finite number above " \
           "zero: left out" in both.unavailable
    assert "no peak of this device known" in both.unavailable
    assert _note(both) == PLAIN.notes[0]
    compute = _decode_case(RooflineInputs(facts(), cpu(flops=1e9, dram=bad)))
    assert compute.decode.roof == "compute" and 0 < compute.decode.share < 1e9
    tiny = _decode_case(RooflineInputs(facts(), cpu(flops=1e9, dram=1e-300)))  # just above 0
    assert tiny.decode.roof == "memory" and tiny.decode.share > 1


def test_a_clock_of_no_finite_positive_value_is_no_clock():
    """The engine's prefill clock NaN or negative: the next clock (timings) times the
    prefill; none left, no prefill phase rather than a NaN one."""
    m, _ = model_of(facts())
    for bad in (float("nan"), -5.0, float("inf")):
        eng = EngineClocks("engine", prefill_ms=bad)
        a = rec(0, t0=10**12, prompt=100, out=1, gap_ms=1, prompt_ms=80.0, engine=eng)
        assert prefill_phase([a], m, None, "").seconds == pytest.approx(0.08)
        b = rec(0, t0=10**12, prompt=100, out=1, gap_ms=1, engine=eng)
        assert prefill_phase([b], m, None, "") is None


def test_an_input_no_check_foresaw_costs_the_roofline_only():
    """Whatever raises inside: the case's roofline says it failed, naming the exception
    and where, and the verdict keeps its classes with a note saying so."""
    r0 = rec(0, t0=10**12, prompt=100, out=33, gap_ms=10, prompt_ms=1.0)
    from dataclasses import replace

    odd = replace(r0, timings=replace(r0.timings, prompt_n="many"))  # typed readers refuse it
    r = case_roofline(RooflineInputs(facts(), cpu()), [odd])
    assert r.headline is None and r.unavailable == (
        "roofline unavailable (ValueError in strata_plugin/analysis/roofline.py _prompt: "
        "invalid literal for int() with base 10: 'many')")
    broken = _roof_at(0.5)
    broken = replace(broken, decode=replace(broken.decode, share="0.5"))
    v = annotate(PLAIN, broken, WindowSignals("c", 1.0))
    assert v.classes == PLAIN.classes and v.notes[0].startswith("roofline: unavailable (TypeError")


def _manifest(servers: dict, entries: dict) -> dict:
    return {"servers": servers, "roofline": entries}


def _entry(**over) -> dict:
    vals = {**BASE, **over}
    return {"model": {"path": "/m.gguf", "format": "gguf", "facts": {
        n: {"value": vals[n], "source": "test"} for n in vals}},
        "cpu": {"cpus": [0, 1], "dram": [{"kernel": "triad", "bytes_s": 1e10,
                                          "array_bytes": 1 << 24, "reps": 3}],
                "matmul": {"flops_s": 1e11, "n": 512, "reps": 3}}}


def test_an_attached_runs_facts_recorded_under_the_profiles_id_are_its_cases(tmp_path):
    """A run recorded before the facts were kept under ``attached``: its one server's
    entry is the attached cases'; a launched run gets no such alias."""
    attached = run_inputs(_manifest({"default": {"base_url": "http://h:1"}},
                                    {"default": _entry()}), tmp_path, gpu_run=False)
    assert set(attached) == {"default", "attached"}
    assert attached["attached"] is attached["default"]
    launched = run_inputs(_manifest({"default": {"argv": ["llama-server"], "base_url": "x"}},
                                    {"default": _entry()}), tmp_path, gpu_run=False)
    assert set(launched) == {"default"}


def test_an_entry_that_cannot_be_read_costs_its_configuration_only(tmp_path):
    entries = {"a": _entry(), "b": {"model": ["not", "an", "object"], "cpu": {}},
               "c": {**_entry(), "cpu": {"cpus": [0], "dram": [{"bytes_s": "fast"}]}}}
    got = run_inputs(_manifest({}, entries), tmp_path, gpu_run=False)
    assert got["a"].limits is not None and got["a"].why_no_limits == ""
    assert got["b"].limits is None and got["b"].why_no_limits.startswith(
        "the recorded facts could not be read: AttributeError in ")
    assert "'list' object has no attribute 'get'" in got["b"].why_no_limits
    assert got["c"].limits is None and "the recorded facts could not be read" in \
        got["c"].why_no_limits
    assert _decode_case(got["b"]).unavailable.startswith("model facts unavailable: ")
