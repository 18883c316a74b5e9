"""A password in ``--strata-server-url`` (issue 32, item 2): sent as Basic auth, written
and shown nowhere.

A scripted server answers only requests that carry ``Authorization: Basic ...`` of one
user and a random password (401 otherwise, ``/metrics`` included). A whole plugin run
against ``http://user:<password>@127.0.0.1:PORT`` must then measure every request
(the credentials were sent), scrape ``/metrics`` (the agent got them), and leave no
trace of the password, raw or percent-encoded, in any file of the run folder, in the
JUnit XML, in the terminal output, or in the agent's command line (``ps`` shows every
local user /proc/PID/cmdline; the agent gets them by its environment, which only its
owner can read). A server that cannot be reached and a malformed URL say so without it.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from strata_plugin.configure.credentials import (
    UrlAuth,
    redact,
    redact_argv,
    redact_json,
    split_credentials,
)
from tests.sse_script_server import Reply, ScriptServer, Seen, free_port
from tests.test_plugin import llama_reply
from tests.test_robustness_support import PytestRun, make_project

USER = "strata"
PASSWORD = "pw!" + secrets.token_hex(8)  # "!" is percent-encoded in the URL
ENCODED = quote(PASSWORD, safe="")
TOKEN = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

PROFILE = """
name = "creds"
[server]
engine = "llamacpp"
api = "llamacpp"
health_timeout_s = 5
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.2
baseline_s = 0.6
cooldown_s = 0
collectors = ["proc", "cpu", "mem", "prom"]
"""

# The case records its agents' command lines and whether their environment holds the
# scrape's credentials, while they run.
CASES = """
import json, os
from strata_plugin.load.workload import Workload

def _agents():
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == os.getpid() and b"strata_plugin.agent" in cmd:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
            out.append({"cmdline": cmd.decode(errors="replace"),
                        "env_has_auth": b"STRATA_PROM_AUTHORIZATION=Basic " in env})
    return out

def test_with_credentials(strata):
    r = strata.run(Workload("auth", isl=8, osl=6, concurrency=2, requests=8), scale=False)
    assert r.metrics.n_ok == 8, r.problems
    with open(os.environ["AGENTS_OUT"], "w") as fh:
        json.dump(_agents(), fh)
"""

METRICS = (b"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n"
           b"# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 12\n")


class Guarded:
    """llama_reply behind Basic auth; counts what it refused and what it served."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self.metrics = 0

    def __call__(self, seen: Seen) -> Reply:
        if seen.headers.get("authorization") != f"Basic {TOKEN}":
            self.refused.append(seen.path)
            return Reply([(0.0, b"unauthorized")], status=401, framing="length",
                         content_type="text/plain")
        if seen.path == "/metrics":
            self.metrics += 1
            return Reply([(0.0, METRICS)], framing="length", content_type="text/plain")
        return llama_reply(seen)


def _leaks(*paths: Path, text: str = "") -> list[str]:
    found = [str(p) for p in paths for secret in (PASSWORD, ENCODED, TOKEN)
             if secret.encode() in p.read_bytes()]
    found += [f"text contains {s!r}" for s in (PASSWORD, ENCODED, TOKEN) if s in text]
    return found


@pytest.mark.integration
def test_a_password_in_the_url_is_sent_and_written_nowhere(tmp_path):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    (proj / "profile.toml").write_text(PROFILE)
    guard = Guarded()
    agents_out = tmp_path / "agents.json"
    xml = tmp_path / "junit.xml"
    with ScriptServer(guard) as srv:
        url = srv.url.replace("http://", f"http://{USER}:{ENCODED}@")
        run = PytestRun.start(["-v", "-s", "-rA", f"--strata-profile={proj / 'profile.toml'}",
                               f"--strata-server-url={url}", f"--junitxml={xml}",
                               f"--strata-reports-dir={tmp_path / 'reports'}",
                               "--strata-run-id=run"], tmp_path / "out.txt",
                              tmp_path / "reports" / "run", cwd=proj,
                              env={"AGENTS_OUT": str(agents_out)})
        rc = run.wait(180)
    out = run.text()
    assert rc == 0, out[-3000:]
    # sent: every request measured, /metrics scraped, nothing refused
    assert not guard.refused, guard.refused
    assert guard.metrics >= 2
    prom = (run.run_dir / "nodes" / "local" / "samples" / "prom.csv").read_text()
    assert "requests_processing" in prom or "running_requests" in prom, prom[:500]
    # the agent had them by its environment, not its argv
    agents = json.loads(agents_out.read_text())
    assert agents and all(a["env_has_auth"] for a in agents), agents
    assert not [a["cmdline"] for a in agents if _leaks(text=a["cmdline"])]
    assert all("--prom-url" in a["cmdline"] and "***" not in a["cmdline"] for a in agents)
    # written nowhere: every file of the run folder, the JUnit XML, the terminal
    files = sorted(p for p in run.run_dir.rglob("*") if p.is_file())
    assert any(p.name == "report.md" for p in files) and any(
        p.name == "events.jsonl" for p in files)
    assert not _leaks(*files, xml, text=out), _leaks(*files, xml, text=out)
    # what the run does write of the URL: the host and port, the credentials hidden
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    assert f"--strata-server-url=http://***@127.0.0.1:{srv.url.rsplit(':', 1)[1]}" in \
        manifest["argv"]
    assert [s["base_url"] for s in manifest["servers"].values()] == [srv.url]


@pytest.mark.integration
def test_an_unreachable_server_and_a_bad_url_say_so_without_the_password(tmp_path):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    (proj / "profile.toml").write_text(PROFILE)
    port = free_port()  # nothing listens there
    for name, url in (("refused", f"http://{USER}:{ENCODED}@127.0.0.1:{port}"),
                      ("bad", f"http://{USER}:{ENCODED}@127.0.0.1:{port}/v1")):
        run = PytestRun.start([f"--strata-profile={proj / 'profile.toml'}",
                               f"--strata-server-url={url}",
                               f"--strata-reports-dir={tmp_path / 'reports'}",
                               f"--strata-run-id={name}"], tmp_path / f"{name}.txt",
                              tmp_path / "reports" / name, cwd=proj,
                              env={"AGENTS_OUT": str(tmp_path / "x.json")})
        rc = run.wait(120)
        out = run.text()
        assert rc != 0, out[-2000:]
        said = ("Strata could not reach the server at http://127.0.0.1:" if name == "refused"
                else "ends in /v1")
        assert said in out, out[-2000:]
        files = sorted(p for p in run.run_dir.rglob("*") if p.is_file()) \
            if run.run_dir.exists() else []
        assert not _leaks(*files, text=out), _leaks(*files, text=out)


# --- the one redaction function --------------------------------------------------------


@pytest.mark.parametrize(("text", "shown"), [
    ("http://u:pw@h:8000", "http://***@h:8000"),
    ("--strata-server-url=https://u:p%40ss@h:1/x?y#z", "--strata-server-url=https://***@h:1/x?y#z"),
    ("http://token@h", "http://***@h"),
    ("http://u:p@ss:w@h:1/", "http://***@h:1/"),  # an unencoded '@' in the password
    ("see http://a:b@h1 and http://c:d@h2/x", "see http://***@h1 and http://***@h2/x"),
    ("http://h:8000/path/me@example", "http://h:8000/path/me@example"),  # not userinfo
    ("mail me@example.com", "mail me@example.com"),
    ("", ""),
])
def test_redact_hides_every_urls_credentials_and_nothing_else(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert redact_argv(["pytest", text]) == ["pytest", shown]
    assert redact_json({"argv": [text], "n": 1, text: None}) == {"argv": [shown], "n": 1,
                                                                 shown: None}


def test_split_takes_the_credentials_apart_as_requests_reads_them() -> None:
    import requests

    url = f"http://{USER}:{ENCODED}@127.0.0.1:8000"
    bare, auth = split_credentials(url)
    assert bare == "http://127.0.0.1:8000" and auth == UrlAuth(USER, PASSWORD)
    assert (auth.user, auth.password) == requests.utils.get_auth_from_url(url)
    prepared = requests.Request("GET", url + "/health").prepare()
    assert auth.header() == prepared.headers["Authorization"] == f"Basic {TOKEN}"
    assert PASSWORD not in repr(auth) and PASSWORD not in str(auth)
    assert split_credentials("http://h:1") == ("http://h:1", None)


def test_the_option_keeps_a_url_without_credentials(tmp_path) -> None:
    """The URL the run keeps (written in the manifest, the dry run, the terminal) has
    none; the config holds them apart and never shows them."""
    from strata_plugin.configure.profile import StrataConfig, load_profile
    from strata_plugin.plugin.options import _server_url

    url, auth = _server_url(f"http://{USER}:{ENCODED}@127.0.0.1:8000/")
    assert url == "http://127.0.0.1:8000" and auth.header() == f"Basic {TOKEN}"
    (tmp_path / "p.toml").write_text(PROFILE)
    cfg = StrataConfig(load_profile(tmp_path / "p.toml"), tmp_path, "r", url, False, None,
                       10.0, tmp_path, server_auth=auth)
    assert PASSWORD not in repr(cfg) and ENCODED not in repr(cfg)
    with pytest.raises(pytest.UsageError) as e:
        _server_url(f"http://{USER}:{ENCODED}@127.0.0.1:8000/v1")
    assert ENCODED not in str(e.value) and "http://***@127.0.0.1:8000" in str(e.value)


def test_the_agent_command_holds_no_credentials_and_its_env_does(tmp_path) -> None:
    from strata_plugin.configure.profile import load_profile
    from strata_plugin.run.agents import AgentFleet
    from strata_plugin.run.server import Server

    class Recorder:
        manifest: dict = {}

    (tmp_path / "p.toml").write_text(PROFILE)
    prof = load_profile(tmp_path / "p.toml")
    fleet = AgentFleet(prof.nodes, prof.telemetry, tmp_path, Recorder())
    server = Server(None, "http://127.0.0.1:8000", auth=UrlAuth(USER, PASSWORD))
    (argv,) = fleet.commands(None, server).values()
    assert "http://127.0.0.1:8000/metrics" in argv and not _leaks(text=" ".join(argv))
    assert fleet.env("local", server) == {"STRATA_PROM_AUTHORIZATION": f"Basic {TOKEN}"}
    assert fleet.env("local", Server(None, "http://127.0.0.1:8000")) is None


def test_a_remote_agent_gets_its_credentials_on_stdin_not_argv() -> None:
    from strata_plugin.run.remote import remote_agent_argv

    argv = remote_agent_argv("node1", ["python3", "-m", "strata_plugin.agent"],
                             env_names=["STRATA_PROM_AUTHORIZATION"], ssh_options=())
    assert argv[argv.index("agent") + 1: argv.index("agent") + 3] == [
        "--env", "STRATA_PROM_AUTHORIZATION"]


def test_the_scrape_sends_the_credentials_from_its_environment(monkeypatch) -> None:
    from strata_plugin.agent.collectors.prom import AUTH_ENV, PromCollector

    guard = Guarded()
    with ScriptServer(guard) as srv:
        monkeypatch.delenv(AUTH_ENV, raising=False)
        bare = PromCollector(srv.url + "/metrics", 1.0)
        bare.scrape_once()
        assert guard.refused == ["/metrics"]
        # says why, in the unavailable note and its event
        assert "HTTP 401" in bare._last_error and "credentials" in bare._last_error
        monkeypatch.setenv(AUTH_ENV, f"Basic {TOKEN}")
        PromCollector(srv.url + "/metrics", 1.0).scrape_once()
        assert guard.metrics == 1


def test_the_health_poll_sends_them_too() -> None:
    from strata_plugin.run.server import Server, ServerStartError

    guard = Guarded()
    with ScriptServer(guard) as srv:
        Server(None, srv.url, auth=UrlAuth(USER, PASSWORD)).wait_healthy(5)
        # without them the answer is the server's, not a start: said at once (a 4xx),
        # naming the credentials to give
        t0 = time.monotonic()
        with pytest.raises(ServerStartError, match=r"HTTP 401 .*Check the credentials"):
            Server(None, srv.url).wait_healthy(5)
        assert time.monotonic() - t0 < 2


def test_bench_passes_the_url_on_and_the_manifest_hides_it() -> None:
    """``python -m strata_plugin bench http://user:pw@...``: the manifest records the
    command line hidden (the user's own shell holds the URL, as it typed it)."""
    from strata_plugin.plugin.bench_cli import pytest_args
    from strata_plugin.run.run_folder import base_manifest

    url = f"http://{USER}:{ENCODED}@127.0.0.1:8000"
    args = pytest_args([url, "--workload", "isl=8,osl=4"])
    assert f"--strata-server-url={url}" in args  # handed to pytest in this process
    m = base_manifest(run_id="r", profile={}, argv=[sys.executable, "-m", "strata_plugin",
                                                     "bench", url], root=Path("/"))
    assert m["argv"][-1] == "http://***@127.0.0.1:8000" and not _leaks(text=json.dumps(m))


def test_a_launched_servers_command_file_hides_a_url_in_its_argv(tmp_path) -> None:
    from strata_plugin.run.server import write_command

    path = write_command(tmp_path, "server-a", {"argv": ["srv", f"--upstream=http://u:{ENCODED}@h"]})
    assert not _leaks(path) and "http://***@h" in path.read_text()
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # (no process left behind)
