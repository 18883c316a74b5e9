"""Offline regeneration: the same raw files give the same derived bytes, PNGs included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bundle_factory import gpu_run

from strata_plugin.analysis.run_folder import DERIVED, DERIVED_DIRS
from strata_plugin.report import write_report

ROOT = Path(__file__).resolve().parents[1]


def derived_files(run: Path) -> dict[str, bytes]:
    out = {name: (run / name).read_bytes() for name in DERIVED}
    for d in DERIVED_DIRS:
        for p in sorted((run / d).rglob("*")):
            out[str(p.relative_to(run))] = p.read_bytes()
    return out


def raw_copy(src: Path, dst: Path) -> Path:
    """A copy of the run folder with every derived file removed."""
    shutil.copytree(src, dst)
    for name in DERIVED:
        (dst / name).unlink(missing_ok=True)
    for d in DERIVED_DIRS:
        shutil.rmtree(dst / d, ignore_errors=True)
    return dst


@pytest.mark.integration
def test_regeneration_is_byte_identical(tmp_path):
    run = gpu_run(tmp_path / "live")
    write_report(run)
    first = derived_files(run)
    assert any(k.endswith(".png") for k in first)
    # Again in place (derived files present), and in two fresh copies of the raw files.
    write_report(run)
    assert derived_files(run) == first
    for k in range(2):
        copy = raw_copy(run, tmp_path / f"copy{k}" / run.name)
        write_report(copy)
        assert derived_files(copy) == first


@pytest.mark.integration
def test_cli_in_fresh_processes_with_different_hash_seeds(tmp_path):
    run = gpu_run(tmp_path / "live")
    write_report(run)
    expected = derived_files(run)
    for seed in ("1", "4242"):
        copy = raw_copy(run, tmp_path / f"seed{seed}" / run.name)
        env = dict(os.environ, PYTHONHASHSEED=seed, MPLBACKEND="pdf")
        out = subprocess.run(
            [sys.executable, "-m", "strata_plugin", "report", str(copy)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        got = derived_files(copy)
        assert got.keys() == expected.keys()
        for name in expected:
            assert got[name] == expected[name], name


@pytest.mark.integration
def test_derived_files_do_not_depend_on_the_clock_or_folder(tmp_path):
    run = gpu_run(tmp_path / "a")
    write_report(run)
    text = (run / "report.md").read_text() + (run / "summary.json").read_text()
    assert str(tmp_path) not in text
    assert "benchmark.json" in DERIVED
    data = (run / "benchmark.json").read_text()
    assert '"datetime": "2025-01-01T00:00:00+00:00"' in data


@pytest.mark.integration
def test_parallel_sample_loading_gives_the_same_analysis(tmp_path):
    """Big runs load samples in a spawned worker; the result must not depend on it."""
    from strata_plugin.analysis.case_summary import analyze_run

    run = gpu_run(tmp_path)
    serial = analyze_run(run, parallel=False)
    parallel = analyze_run(run, parallel=True)
    assert parallel.hw_by_window == serial.hw_by_window
    assert [a.verdict for a in parallel.analyses] == [a.verdict for a in serial.analyses]
    assert [a.headline for a in parallel.analyses] == [a.headline for a in serial.analyses]
    assert parallel.store.keys == serial.store.keys
    assert (parallel.store.t == serial.store.t).all()
