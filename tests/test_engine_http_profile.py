"""The engine's profiler over HTTP (run/engine_http_profile.py) against a scripted server:
a server with a profiler, one without (404/405), one that fails, one that never answers
the stop. The live vLLM check is tests/test_vllm*.py's to add (not run here)."""

from __future__ import annotations

import json
import subprocess

import pytest
from sse_script_server import Reply, ScriptServer
from vllm_env import vllm_python

from strata_plugin.run import engine_http_profile as hp
from strata_plugin.run.engine_profile import ProfileUnavailable


def _plain(status: int, body: bytes = b"", head_delay_s: float = 0.0):
    return lambda seen: Reply([(0.0, body)], status=status, framing="length",
                              content_type="text/plain", head_delay_s=head_delay_s)


def test_a_server_with_a_profiler_is_started_and_stopped_with_the_case_prefix():
    with ScriptServer(_plain(200)) as srv:
        hp.start(srv.url, "c1~traced", timeout_s=5, headers={"Authorization": "Bearer t"})
        hp.stop(srv.url, timeout_s=5)
    first, second = srv.seen
    assert (first.method, first.path, second.path) == ("POST", "/start_profile",
                                                        "/stop_profile")
    assert json.loads(first.body) == {"profile_prefix": "c1~traced"}
    assert first.headers.get("authorization") == "Bearer t"


def test_sglangs_start_names_the_folder_and_asks_for_a_capture_as_small_as_vllms(tmp_path):
    """SGLang takes its folder in the body (no launch flag): the run's folder, absolute
    (the server's working directory is not the test's), and neither Python stacks nor
    input shapes (SGLang's defaults record both). A server Strata did not launch is sent
    no folder: it writes where its own setting says."""
    with ScriptServer(_plain(200)) as srv:
        hp.start(srv.url, "c1_traced", engine="sglang", output_dir=tmp_path / "srv",
                 timeout_s=5)
        hp.start(srv.url, "c2", engine="sglang", timeout_s=5)
        hp.stop(srv.url, engine="sglang", timeout_s=5)
    launched, attached, stop = srv.seen
    assert json.loads(launched.body) == {
        "profile_prefix": "c1_traced", "output_dir": str(tmp_path.resolve() / "srv"),
        "activities": ["CPU", "GPU"], "with_stack": False, "record_shapes": False}
    assert "output_dir" not in json.loads(attached.body)
    assert json.loads(attached.body)["with_stack"] is False
    assert (stop.path, stop.body) == ("/stop_profile", b"")


def test_a_missing_route_on_sglang_is_not_blamed_on_a_launch_flag():
    with ScriptServer(_plain(404, b"Not Found")) as srv, \
            pytest.raises(ProfileUnavailable, match=r"answered 404 \(SGLang serves it always"):
        hp.start(srv.url, "c1", engine="sglang", timeout_s=5)


@pytest.mark.parametrize("status", [404, 405])
def test_a_server_without_a_profiler_is_said_to_have_none(status):
    with ScriptServer(_plain(status, b"Not Found")) as srv, \
            pytest.raises(ProfileUnavailable, match=f"the server has no profiler: POST "
                                                    f"/start_profile answered {status}"):
        hp.start(srv.url, "c1", timeout_s=5)


@pytest.mark.parametrize("status", [403, 500])
def test_another_refusal_is_quoted_not_taken_for_a_missing_profiler(status):
    with ScriptServer(_plain(status, b"profiler busy")) as srv, \
            pytest.raises(ProfileUnavailable, match=f"answered {status}: profiler busy"):
        hp.start(srv.url, "c1", timeout_s=5)


def test_an_engine_that_ignores_the_stop_is_said_after_the_timeout():
    with ScriptServer(_plain(200, head_delay_s=3.0)) as srv, \
            pytest.raises(ProfileUnavailable, match=r"did not answer POST /stop_profile "
                                                    r"within 0\.5 s"):
        hp.stop(srv.url, timeout_s=0.5)


def test_nothing_listening_is_said():
    with pytest.raises(ProfileUnavailable, match="POST /start_profile failed"):
        hp.start("http://127.0.0.1:9", "c1", timeout_s=5)


@pytest.mark.vllm
@pytest.mark.integration  # imports vLLM: ~10 s
def test_the_vllm_flag_is_accepted_by_the_installed_vllms_config(tmp_path):
    """The flag's JSON parsed by the installed vLLM's own ProfilerConfig (no server)."""
    flag, value = hp.vllm_profiler_args(tmp_path / "torch")
    assert flag == "--profiler-config"
    py = vllm_python()
    code = ("import json,sys; from vllm.config import ProfilerConfig; "
            "c = ProfilerConfig(**json.loads(sys.argv[1])); "
            "print(c.profiler, c.torch_profiler_dir)")
    out = subprocess.run([str(py), "-c", code, value], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["torch", str((tmp_path / "torch").resolve())]
