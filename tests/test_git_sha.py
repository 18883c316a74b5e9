"""manifest.json's git sha: the commit, "no commits" in a new repository, else "unknown"."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from strata_plugin.run.run_folder import _git_sha

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")


def test_a_repository_without_commits_says_so(tmp_path):
    """`git rev-parse HEAD` prints "HEAD" there (and fails): that was recorded as the sha."""
    subprocess.run(["git", "init", "-q", str(tmp_path / "new")], check=True)
    assert _git_sha(tmp_path / "new") == "no commits"
    (tmp_path / "plain").mkdir()
    assert _git_sha(tmp_path / "plain") == "unknown"


def test_a_commit_is_its_sha(tmp_path):
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("x")
    env = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "-C", str(repo), "add", "f"], check=True)
    subprocess.run(["git", *env, "-C", str(repo), "commit", "-qm", "x"], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert _git_sha(repo) == head and len(head) == 40
