"""The profile's [load] table and the report's rows on where a load ran."""

from __future__ import annotations

import pytest

from strata_plugin.configure.load_spec import LoadSpec
from strata_plugin.configure.profile import ProfileError, load_profile
from strata_plugin.report.load_spread import rows
from tests.test_robustness_profile import GOOD


def _load(tmp_path, table: str):
    p = tmp_path / "p.toml"
    p.write_text(GOOD + "\n[load]\n" + table)
    return p, load_profile(p)


def test_no_load_table_is_the_pool_on_auto(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(GOOD)
    assert load_profile(p).load == LoadSpec(engine="local", processes="auto")


def test_the_ray_table_loads(tmp_path):
    _, prof = _load(tmp_path, 'engine = "ray"\naddress = "ray://10.0.0.1:10001"\n'
                              'workers_per_node = 2\nnum_cpus = 0.5\nresources = { client = 1 }\n')
    assert prof.load == LoadSpec(engine="ray", address="ray://10.0.0.1:10001",
                                 workers_per_node=2, num_cpus=0.5,
                                 resources=(("client", 1.0),))
    _, prof = _load(tmp_path, "processes = 1\n")
    assert prof.load.processes == 1


@pytest.mark.parametrize(("table", "key", "expected"), [
    ('processes = "many"\n', "load.processes", '"auto" or a number >= 1'),
    ("processes = 0\n", "load.processes", '"auto" or a number >= 1'),
    ('engine = "spark"\n', "load.engine", "one of ['local', 'ray']"),
    ('engine = "ray"\n', "load.address", "the Ray cluster's address"),
    ('engine = "ray"\naddress = "auto"\nworkers_per_node = 0\n', "load.workers_per_node",
     "an integer in [1, 256]"),
    ("procesess = 2\n", "load.procesess", "a known key"),
])
def test_a_bad_load_value_names_the_file_and_key(tmp_path, table, key, expected):
    with pytest.raises(ProfileError) as info:
        _load(tmp_path, table)
    msg = str(info.value)
    assert "p.toml" in msg and f"'{key}'" in msg and expected in msg, msg


def test_the_report_says_where_the_load_ran():
    sc = {"processes": 2, "hosts": 1, "engine": "pool", "placement": "auto: 512 streams",
          "client_cpu_total_cores": 0.5, "incomplete": "process 1: died",
          "per_process": [
              {"process": "process 0", "host": "vm", "streams": 256, "requests": 256,
               "client_cpu_cores": 0.25, "loop_lag_p99_ms": 1.0, "loop_own_lag_p99_ms": 0.5,
               "read_backlog_p99_bytes": 100, "client_bound": True, "reasons": ["stamps late"]},
              {"process": "process 1", "host": "vm", "streams": 256, "requests": 256,
               "client_bound": None, "lost": "died"}]}
    got = dict(rows(sc))
    assert got["load carried by"].startswith("2 processes on 1 host (the worker pool)")
    assert "client_bound=True; stamps late" in got["self-check, process 0 (vm)"]
    assert "lost: died" in got["self-check, process 1 (vm)"]
    assert got["incomplete"] == "process 1: died"
    one = dict(rows({"processes": 1, "hosts": 1, "engine": "loop", "per_process": []}))
    assert one == {"load carried by": "1 process on 1 host (one loop)"}
    assert rows({"client_bound": False}) == []  # a self-check from before the pool


def test_ray_missing_says_how_to_install(monkeypatch):
    import sys

    from strata_plugin.load.ray_engine import RayUnavailable, import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # what a missing package imports as
    with pytest.raises(RayUnavailable, match=r'engine = "ray" needs Ray installed: pip install '
                                             r'"strata\[ray\]"'):
        import_ray()


def test_a_ray_bundle_is_never_empty(tmp_path):
    with pytest.raises(ProfileError, match=r"load\.num_cpus"):
        _load(tmp_path, 'engine = "ray"\naddress = "auto"\nnum_cpus = 0\n')
    _, prof = _load(tmp_path, 'engine = "ray"\naddress = "auto"\nnum_cpus = 0.01\n')
    assert prof.load.num_cpus == 0.01
