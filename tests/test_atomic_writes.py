"""Derived files are written whole or not at all (formats/atomic.py): an exception, a
full disk (here a real ``RLIMIT_FSIZE`` in a child process) or a kill in the middle of
a write leaves the previous file under the final name, never part of the new one; and
every derived-file write in report/ and run/dry_run.py goes through the helper."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bundle_factory import CaseSpec, RunSpec, make_run

from strata_plugin.formats.atomic import atomic_open, atomic_write_bytes, atomic_write_text
from strata_plugin.report import write_report

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "strata_plugin"


def test_an_exception_midway_keeps_the_previous_file_and_leaves_nothing(tmp_path):
    p = tmp_path / "report.md"
    p.write_text("old report\n")
    with pytest.raises(RuntimeError, match="midway"):
        with atomic_open(p) as fh:
            fh.write("new " * 10_000)
            fh.flush()
            raise RuntimeError("midway")
    assert p.read_text() == "old report\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["report.md"]  # no temporary left
    atomic_write_text(p, "new\n")
    assert p.read_text() == "new\n"
    atomic_write_bytes(tmp_path / "a.png", b"\x89PNG")
    assert (tmp_path / "a.png").read_bytes() == b"\x89PNG"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.png", "report.md"]


def test_the_new_file_has_the_mode_the_umask_gives(tmp_path):
    old = os.umask(0o077)
    try:
        atomic_write_text(tmp_path / "private.json", "{}\n")
        (tmp_path / "plain.json").write_text("{}\n")
    finally:
        os.umask(old)
    atomic_write_text(tmp_path / "shared.json", "{}\n")
    mode = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert mode["private.json"] == mode["plain.json"] == 0o600
    assert mode["shared.json"] == 0o666 & ~old


def test_a_writer_killed_mid_write_leaves_the_previous_file(tmp_path):
    """A child writes a 64 MB report through the helper, says so after the first 8 MB,
    and is killed with SIGKILL there: the final name still holds the previous report."""
    p = tmp_path / "report.md"
    p.write_text("previous report\n")
    child = textwrap.dedent(f"""
        import sys, time
        from strata_plugin.formats.atomic import atomic_open
        with atomic_open({str(p)!r}) as fh:
            for i in range(64):
                fh.write(("x" * 1023 + "\\n") * 1024)
                if i == 8:
                    fh.flush()
                    print("writing", flush=True)
                    time.sleep(60)
        """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, cwd=ROOT,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
        temps = [x for x in tmp_path.iterdir() if x.name != "report.md"]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert p.read_text() == "previous report\n"
    (temp,) = temps  # the partial file was the hidden temporary, beside it
    assert temp.name.startswith(".report.md.") and temp.stat().st_size >= 8 << 20


_FULL_DISK = """
import resource, signal, sys
sys.path.insert(0, {tests!r})
from strata_plugin.report import write_report
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
try:
    write_report({run!r}, plots=False)
except OSError as exc:
    print("failed:", exc.strerror)
else:
    print("written")
"""


def test_a_report_that_fails_midway_keeps_every_previous_file(tmp_path):
    """The report is written once; then again in a child whose file-size limit is below
    the size of some of its files, so a write fails with EFBIG part way (a full disk).
    Every file is then byte for byte the first report's: none is cut short.

    The limit is one byte under the largest derived file (the run's timeline, or
    summary.json where the timeline is smaller), so that write fails part way. Without
    the plots (seconds of drawing, twice): every savefig goes through the same helper,
    which ``test_every_derived_file_write_in_report_and_dry_run_is_atomic`` checks below."""
    run = make_run(tmp_path, RunSpec([CaseSpec("a"), CaseSpec("b")]))
    inputs = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    write_report(run, plots=False)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    derived = sorted((len(b), p.name) for p, b in before.items() if inputs.get(p) != b)
    assert len(derived) >= 8  # report.md, summary.json, the CSVs, the CI files, timeline
    assert derived[-1][1] in ("run.json", "summary.json"), derived[-3:]
    assert (run / "timeline" / "run.json").is_file()
    limit = derived[-1][0] - 1  # the largest derived file is written part way, then fails
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK.format(tests=str(ROOT / "tests"), limit=limit,
                                                 run=str(run))],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("failed: File too large"), out.stdout + out.stderr
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    rel = lambda ps: sorted(str(p.relative_to(run)) for p in ps)  # noqa: E731
    lost = rel(p for p in before if p not in after)
    torn = rel(p for p in before if p in after and after[p] != before[p])
    left = rel(p for p in after if p not in before)  # a partial or temporary file
    assert (lost, torn, left) == ([], [], []), f"lost {lost}, torn {torn}, left {left}"


# --- every derived-file write goes through the helper ---------------------------------------

WRITE_MODES = set("wax+")


def in_place_writes(source: str) -> list[tuple[int, str]]:
    """(line, what) for each call that writes a file in place: ``write_text``,
    ``write_bytes``, ``open``/``.open`` with a writing mode, ``shutil.copy*``,
    ``os.rename`` without a temporary, and ``savefig`` outside ``with atomic_open``."""
    tree = ast.parse(source)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(
                isinstance(i.context_expr, ast.Call) and _name(i.context_expr.func)
                == "atomic_open" for i in node.items):
            guarded.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name == "copyfileobj" and id(node) in guarded:
            continue  # into the temporary file of an atomic_open
        if name in ("write_text", "write_bytes", "copy", "copy2", "copyfile", "copyfileobj"):
            found.append((node.lineno, name))
        elif name == "open":
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(node.func, ast.Attribute) and node.args:  # Path.open(mode)
                mode = node.args[0]
            if isinstance(mode, ast.Constant) and WRITE_MODES & set(str(mode.value)):
                found.append((node.lineno, f"open({mode.value!r})"))
        elif name == "savefig" and id(node) not in guarded:
            found.append((node.lineno, "savefig"))
    return found


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def test_the_checker_finds_each_kind_of_in_place_write():
    src = textwrap.dedent("""
        p.write_text("x")
        p.write_bytes(b"x")
        open(p, "w")
        open(p, mode="a")
        p.open("wb")
        shutil.copy2(a, b)
        fig.savefig(p)
        open(p)
        p.open()
        with atomic_open(p, "wb") as fh:
            fig.savefig(fh)
        """)
    assert [w for _, w in in_place_writes(src)] == [
        "write_text", "write_bytes", "open('w')", "open('a')", "open('wb')", "copy2",
        "savefig"]


def test_every_derived_file_write_in_report_and_dry_run_is_atomic():
    files = [*sorted((PKG / "report").glob("*.py")), PKG / "run" / "dry_run.py"]
    bad = [f"{f.relative_to(ROOT)}:{line}: {what}" for f in files
           for line, what in in_place_writes(f.read_text())]
    assert bad == [], "write these through strata_plugin/formats/atomic.py:\n" + "\n".join(bad)


def _outside(source: str, allowed_function: str) -> list[tuple[int, str]]:
    """``in_place_writes`` less those in the body of ``allowed_function``."""
    tree = ast.parse(source)
    spans = [(f.lineno, f.end_lineno or f.lineno) for f in ast.walk(tree)
             if isinstance(f, ast.FunctionDef) and f.name == allowed_function]
    return [(n, w) for n, w in in_place_writes(source)
            if not any(a <= n <= b for a, b in spans)]


def test_tracing_and_prometheus_write_their_files_atomically():
    """run/tracing.py's trace text and run/prometheus.py's sample CSVs and query records
    go through the helper; tracefs control files (kernel switches) only through ``_ctl``."""
    bad = [f"{f}:{line}: {what}" for f, allowed in (("tracing.py", "_ctl"),
                                                     ("prometheus.py", ""))
           for line, what in _outside((PKG / "run" / f).read_text(), allowed)]
    assert bad == [], "\n".join(bad)
    assert _outside("def _ctl(p):\n    p.write_text('1')\np.write_text('2')\n", "_ctl") \
        == [(3, "write_text")]


_PROM_FULL_DISK = """
import resource, signal
from strata_plugin.agent.protocol import Sample
from strata_plugin.run.prometheus import write_samples
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
rows = [Sample(wall_ns=2_000_000_000 + i, node="n1", source="prom_x", device="",
               metric="m", value=float(i), kind="gauge") for i in range({n})]
try:
    write_samples({run!r}, rows)
except OSError as exc:
    print("failed:", exc.strerror)
else:
    print("written")
"""


@pytest.mark.parametrize("room", [-1, 0])
def test_a_prometheus_pull_that_cannot_be_written_whole_leaves_the_previous_samples(
        tmp_path, room):
    """A pull whose rows take the samples file one byte past the file-size limit (a full
    disk) leaves the previous file byte for byte; at exactly the limit it is written."""
    from strata_plugin.agent.protocol import Sample
    from strata_plugin.run.prometheus import write_samples

    rows = [Sample(wall_ns=1_000_000_000 + i, node="n1", source="prom_x", device="",
                   metric="m", value=float(i), kind="gauge") for i in range(50)]
    (path,) = write_samples(tmp_path, rows)
    before = path.read_bytes()
    scratch = tmp_path / "probe"
    (probe,) = write_samples(scratch, rows)
    probe_code = _PROM_FULL_DISK.format(limit=1 << 30, n=200, run=str(scratch))
    subprocess.run([sys.executable, "-c", probe_code], cwd=ROOT, check=True,
                   capture_output=True)
    size = probe.stat().st_size  # the size the second pull makes the file
    out = subprocess.run(
        [sys.executable, "-c", _PROM_FULL_DISK.format(limit=size + room, n=200,
                                                      run=str(tmp_path))],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    left = sorted(p.name for p in path.parent.iterdir())
    if room < 0:
        assert out.stdout.startswith("failed: File too large"), out.stdout + out.stderr
        assert path.read_bytes() == before and left == [path.name]
    else:
        assert out.stdout.startswith("written"), out.stdout + out.stderr
        after = path.read_bytes()
        assert after.startswith(before) and after.count(b"\n") == 251 and left == [path.name]
