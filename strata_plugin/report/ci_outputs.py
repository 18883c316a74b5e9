"""Headline metrics in the three formats CI dashboards read without glue.

Written beside ``benchmark.json`` by every report (live or offline):

* ``bencher.json``: Bencher Metric Format (BMF), read by ``bencher run --adapter json
  --file bencher.json`` (bencher.dev, Reference > Bencher Metric Format). One benchmark
  per case, one measure per metric; a percentile whose count gives order-statistic
  bounds (analysis/sufficiency.py) carries them as ``lower_value`` / ``upper_value``.
* ``metrics.txt``: OpenMetrics text, read by GitLab's merge-request metrics report
  (``artifacts: reports: metrics: metrics.txt``; GitLab docs, CI > Testing > Metrics
  reports). One gauge family per metric, one sample per case, ended by ``# EOF``.
* ``github-benchmark-smaller.json`` / ``github-benchmark-bigger.json``: the
  ``customSmallerIsBetter`` and ``customBiggerIsBetter`` inputs of
  github-action-benchmark (a list of ``{name, unit, value, extra}``), one file per tool
  because the action takes one direction per step.

The metric list (``CI_METRICS``) is the one vocabulary for all three: which headline key,
in which unit, and which way is better. Nothing here reads the clock, so a regenerated
report gives the same bytes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SMALLER, BIGGER = "smaller", "bigger"

BENCHER_FILE = "bencher.json"
OPENMETRICS_FILE = "metrics.txt"
GITHUB_SMALLER_FILE = "github-benchmark-smaller.json"
GITHUB_BIGGER_FILE = "github-benchmark-bigger.json"
CI_FILES = (BENCHER_FILE, OPENMETRICS_FILE, GITHUB_SMALLER_FILE, GITHUB_BIGGER_FILE)


@dataclass(frozen=True)
class CiMetric:
    """One headline value as the dashboards get it."""

    key: str  # the headline key (analysis/metrics.py headline())
    unit: str  # as written in bencher / github files
    better: str  # SMALLER or BIGGER
    om_name: str  # OpenMetrics family name (base unit, name ends with the unit)
    om_unit: str = ""  # OpenMetrics UNIT ("" = none declared)
    om_scale: float = 1.0  # headline value * scale = OpenMetrics value


def _latency(key: str) -> CiMetric:
    stem = key.removesuffix("_ms")
    return CiMetric(key, "ms", SMALLER, f"strata_{stem}_seconds", "seconds", 1e-3)


CI_METRICS: tuple[CiMetric, ...] = (
    _latency("ttft_p50_ms"),
    _latency("ttft_p90_ms"),
    _latency("ttft_p99_ms"),
    _latency("tpot_p50_ms"),
    _latency("tpot_p90_ms"),
    _latency("tpot_p99_ms"),
    _latency("e2e_p50_ms"),
    _latency("e2e_p99_ms"),
    _latency("chunk_gap_p99_ms"),
    CiMetric("output_tok_s", "tokens/s", BIGGER, "strata_output_tokens_per_second"),
    CiMetric("request_s", "requests/s", BIGGER, "strata_requests_per_second"),
    CiMetric("goodput_req_s", "requests/s", BIGGER, "strata_goodput_requests_per_second"),
    CiMetric("success_fraction", "ratio", BIGGER, "strata_success_ratio", "ratio"),
    CiMetric("n_errors", "requests", SMALLER, "strata_failed_requests"),
)


@dataclass(frozen=True)
class CiCase:
    """What the CI files need of one analysed case."""

    case_id: str
    config_id: str
    headline: Mapping[str, float | int | str]
    #: headline key -> (lower, upper) bounds, for the percentiles that have them
    bounds: Mapping[str, tuple[float, float]]


def _values(case: CiCase) -> list[tuple[CiMetric, float]]:
    out = []
    for m in CI_METRICS:
        v = case.headline.get(m.key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append((m, float(v)))
    return out


def _measure_slug(key: str) -> str:
    """Bencher measure slugs are kebab case (at most 64 characters)."""
    return key.replace("_", "-")[:64]


def bencher_json(cases: Sequence[CiCase]) -> dict:
    """BMF: ``{benchmark: {measure: {value, lower_value?, upper_value?}}}``."""
    out: dict[str, dict] = {}
    for c in cases:
        measures: dict[str, dict] = {}
        for m, v in _values(c):
            entry: dict[str, float] = {"value": v}
            b = c.bounds.get(m.key)
            if b is not None:
                entry["lower_value"], entry["upper_value"] = float(b[0]), float(b[1])
            measures[_measure_slug(m.key)] = entry
        if measures:
            out[f"strata::{c.case_id}"] = measures
    return out


def github_benchmark_json(cases: Sequence[CiCase], better: str) -> list[dict]:
    """github-action-benchmark custom tool input: ``[{name, unit, value, extra}]``."""
    out = []
    for c in cases:
        n = c.headline.get("n_requests", "")
        for m, v in _values(c):
            if m.better != better:
                continue
            out.append(
                {
                    "name": f"{c.case_id} {m.key}",
                    "unit": m.unit,
                    "value": v,
                    "extra": f"config {c.config_id}; {n} measured requests",
                }
            )
    return out


_LABEL_SAFE = re.compile(r"\s+")


def _label(v: str) -> str:
    """A label value: escaped per OpenMetrics, and without whitespace, because GitLab
    keys a metric by its text up to the first space."""
    v = _LABEL_SAFE.sub("_", v)
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _om_value(v: float) -> str:
    return repr(float(v))


def openmetrics_text(cases: Sequence[CiCase]) -> str:
    """OpenMetrics text: ``# TYPE``/``# UNIT``/``# HELP`` per family, samples, ``# EOF``."""
    lines: list[str] = []
    for m in CI_METRICS:
        samples = [
            (c, v * m.om_scale) for c in cases for mm, v in _values(c) if mm.key == m.key
        ]
        if not samples:
            continue
        lines.append(f"# TYPE {m.om_name} gauge")
        if m.om_unit:
            lines.append(f"# UNIT {m.om_name} {m.om_unit}")
        lines.append(
            f"# HELP {m.om_name} Strata headline {m.key} per case ({m.better} is better)"
        )
        for c, v in samples:
            labels = f'case_id="{_label(c.case_id)}",config_id="{_label(c.config_id)}"'
            lines.append(f"{m.om_name}{{{labels}}} {_om_value(v)}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def ci_files(cases: Sequence[CiCase]) -> dict[str, str]:
    """Every CI file's name and text."""

    def dump(obj: object) -> str:
        return json.dumps(obj, indent=2, sort_keys=True) + "\n"

    return {
        BENCHER_FILE: dump(bencher_json(cases)),
        OPENMETRICS_FILE: openmetrics_text(cases),
        GITHUB_SMALLER_FILE: dump(github_benchmark_json(cases, SMALLER)),
        GITHUB_BIGGER_FILE: dump(github_benchmark_json(cases, BIGGER)),
    }
