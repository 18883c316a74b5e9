"""Per-case latency distributions in pytest-benchmark's JSON schema.

So ``pytest-benchmark compare a.json b.json`` (and any tool that reads its files)
can compare two Strata runs. One entry per case and metric: ``group`` is the metric,
``name`` is ``<case_id>[::<A/B arm>::rep<repetition>]::<metric>``, unique in a run (two
repetitions of one workload never share a row), ``fullname`` is ``strata::<name>``
(stable across runs), the stats are
in seconds (pytest-benchmark's unit), built with ``pytest_benchmark.stats.Stats`` from
every measured, successful request. Nothing here reads the clock: ``datetime`` is
the run's start from the manifest, so the file is the same on every regeneration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strata_plugin.analysis.metrics import REQUEST_COMPARED as BENCH_METRICS
from strata_plugin.analysis.request_values import values
from strata_plugin.analysis.run_folder import RunBundle


def _scalar_params(params: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in sorted(params.items())
        if isinstance(v, (str, int, float, bool)) or v is None
    }


def _machine_info(bundle: RunBundle) -> dict[str, Any]:
    host = bundle.manifest.get("host") or {}
    return {
        "node": host.get("hostname", ""),
        "processor": host.get("cpu_model", ""),
        "machine": host.get("machine", ""),
        "python_implementation": "CPython",
        "python_version": host.get("python", ""),
        "python_compiler": "",
        "release": host.get("kernel", ""),
        "system": "Linux",
        "cpu": {"count": host.get("cpus"), "brand_raw": host.get("cpu_model", "")},
        "strata_run_id": bundle.run_id,
        "strata_nodes": sorted((bundle.manifest.get("nodes") or {}).keys()),
    }


def benchmark_json(
    bundle: RunBundle, case_ids: Sequence[str], extra: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The whole file as a dict; ``extra`` adds per-case ``extra_info`` scalars."""
    import pytest_benchmark
    from pytest_benchmark.stats import Stats

    benches = []
    for cid in case_ids:
        info = bundle.case_info(cid)
        recs = bundle.records.get(cid, [])
        for metric in BENCH_METRICS:
            data = [v / 1000.0 for v in values(recs, metric, bundle.metrics_of)]
            if not data:
                continue
            st = Stats()
            for v in data:
                st.update(v)
            stats = st.as_dict()
            stats["data"] = data
            stats["iterations"] = 1
            short = metric.removesuffix("_ms")
            label = cid
            if info.ab_arm:
                label += f"::{info.ab_arm}"
            if info.line.repetition is not None:
                label += f"::rep{info.line.repetition}"
            params = _scalar_params(info.params)
            extra_info = {
                "unit": "s",
                "metric": short,
                "case_id": cid,
                "workload": info.name,
                "config_id": info.config_id,
                "requests": len(data),
            }
            extra_info.update((extra or {}).get(cid, {}))
            benches.append(
                {
                    "group": short,
                    "name": f"{label}::{short}",
                    "fullname": f"strata::{label}::{short}",
                    "params": params,
                    "param": "-".join(f"{k}={v}" for k, v in params.items()),
                    "extra_info": extra_info,
                    "options": {
                        "disable_gc": False,
                        "timer": "strata request timestamps",
                        "min_rounds": len(data),
                        "max_time": 0.0,
                        "min_time": 0.0,
                        "warmup": False,
                    },
                    "stats": stats,
                }
            )
    return {
        "machine_info": _machine_info(bundle),
        "commit_info": {
            "id": str(bundle.manifest.get("git_sha", "unknown")),
            "time": "",
            "author_time": "",
            "dirty": False,
            "project": "strata",
            "branch": "",
        },
        "benchmarks": benches,
        "datetime": str(bundle.manifest.get("started_utc", "")),
        "version": pytest_benchmark.__version__,
    }
