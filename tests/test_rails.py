"""Rails and imbalance over synthetic window summaries (timeline.HwStat rows)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from strata_plugin.analysis import rails
from strata_plugin.analysis.rules import WindowSignals, classify
from strata_plugin.analysis.timeline import HwStat

W = "case-1"


def counter(node, source, device, metric, rate, seconds=10.0):
    return HwStat(
        W,
        node,
        source,
        device,
        metric,
        "counter",
        20,
        1.0,
        rate,
        rate,
        rate,
        rate,
        rate,
        rate * seconds,
        rate,
    )


def gauge(node, source, device, metric, mean):
    return HwStat(W, node, source, device, metric, "gauge", 20, 1.0, mean, mean, mean, mean, mean)


def rail(node, dev, tx, rx=None, gbps=400.0):
    return [
        counter(node, "rdma", dev, "xmit_bytes", tx),
        counter(node, "rdma", dev, "rcv_bytes", tx if rx is None else rx),
        gauge(node, "rdma", dev, "link_rate_gbps", gbps),
    ]


def two_nodes_two_rails(slow=40e9):
    return [
        *rail("a", "mlx5_0/1", 40e9),
        *rail("a", "mlx5_3/1", 40e9),
        *rail("b", "mlx5_0/1", 40e9),
        *rail("b", "mlx5_3/1", slow),
    ]


def test_rail_utilization_against_link_rate():
    rep = rails.analyze(two_nodes_two_rails(), window=W)
    assert len(rep.rails) == 4
    r = rep.rails[0]
    assert r.link_bytes_s == pytest.approx(50e9) and r.util == pytest.approx(0.8)
    sat = [f for f in rep.findings if f.kind == "rail_saturated"]
    assert len(sat) == 4 and all(f.cls == "gpu_communication" for f in sat)
    ev = sat[0].evidence[0]
    assert (ev.threshold_name, ev.threshold, ev.met) == ("rdma_link_frac", 0.5, True)
    assert "a/rdma:mlx5_0/1" in ev.source
    assert rep.rail_max_min == pytest.approx(1.0) and rep.signals()["rdma_util"] == 0.8


def test_a_slow_rail_is_an_imbalance_with_its_name():
    rep = rails.analyze(two_nodes_two_rails(slow=10e9), window=W)
    assert rep.rail_max_min == pytest.approx(4.0)
    assert rep.rail_cv is not None and rep.rail_cv > 0.15
    (f,) = rep.by_class("waiting_on_peer")
    assert f.kind == "rail_imbalance" and (f.node, f.device) == ("b", "mlx5_3/1")
    names = {e.threshold_name for e in f.evidence if e.met}
    assert names == {"imbalance_max_min", "imbalance_cv"}
    assert rep.signals()["rdma_rail_max_min"] == pytest.approx(4.0)


def test_idle_rails_are_not_called_unbalanced():
    rows = [*rail("a", "mlx5_0/1", 1000.0), *rail("a", "mlx5_3/1", 10.0)]
    rep = rails.analyze(rows)
    assert rep.rail_max_min is None and not rep.by_class("waiting_on_peer")


def test_error_and_congestion_counters():
    rows = [
        *rail("a", "mlx5_0/1", 1e9),
        counter("a", "rdma", "mlx5_0/1", "symbol_error", 0.3),  # +3 in the 10 s window
        counter("a", "rdma", "mlx5_0/1", "np_cnp_sent", 5000.0),
        counter("a", "rdma", "mlx5_0/1", "rp_cnp_handled", 20.0),  # under the bar
        counter("a", "rdma", "mlx5_0/1", "link_downed", 0.0),  # did not move
    ]
    rep = rails.analyze(rows)
    (r,) = rep.rails
    assert r.errors == (("symbol_error", pytest.approx(3.0)),)
    kinds = {f.kind: f for f in rep.by_class("network")}
    assert set(kinds) == {"rail_errors", "rail_congestion"}
    (cnp,) = kinds["rail_congestion"].evidence
    assert cnp.metric == "np_cnp_sent" and cnp.met and cnp.value == 5000.0
    assert rep.signals()["rdma_error_events"] == pytest.approx(3.0)


def test_ethernet_bytes_where_rdma_should_carry_them():
    eth = [
        counter("a", "net", "eth0", "tx_bytes", 300e6),
        counter("a", "net", "eth0", "rx_bytes", 280e6),
    ]
    # no RDMA counters, but the deployment expects RDMA: a fallback to sockets
    rep = rails.analyze(eth, expect_rdma=True)
    (f,) = rep.findings
    assert f.kind == "socket_fallback" and f.cls == "network" and "NCCL" in f.summary
    assert "no RDMA counters" in f.summary
    # the same bytes beside busy rails are ordinary traffic
    rep = rails.analyze([*eth, *rail("a", "mlx5_0/1", 40e9)])
    assert not [f for f in rep.findings if f.kind == "socket_fallback"]
    # and without RDMA in the picture, Ethernet traffic is not suspicious at all
    assert not rails.analyze(eth).findings
    # loopback never counts
    lo = [counter("a", "net", "lo", "tx_bytes", 1e9)]
    assert not rails.analyze(lo, expect_rdma=True).findings


def test_link_capacity_from_speed_gauge_or_given_cap():
    rows = [
        counter("a", "net", "eth0", "tx_bytes", 900e6),
        gauge("a", "net", "eth0", "link_speed_mbps", 10_000.0),  # 1.25 GB/s
        counter("b", "net", "veth1", "rx_bytes", 0.95e6),
        counter("b", "net", "veth1", "rx_dropped", 0.0),
        counter("b", "net", "veth1", "tx_dropped", 1.2),
    ]
    rep = rails.analyze(rows, link_caps={("b", "veth1"): 1e6})
    a, b = rep.links
    assert a.link_source == "link_speed_mbps" and a.util == pytest.approx(0.72)
    assert b.link_source == "given capacity" and b.util == pytest.approx(0.95)
    kinds = sorted((f.kind, f.node) for f in rep.findings)
    assert kinds == [("net_errors", "b"), ("net_saturated", "a"), ("net_saturated", "b")]
    assert rep.signals()["net_util"] == pytest.approx(0.95)
    # request/response traffic: neither direction full, both together more than one
    rr = [
        counter("c", "net", "veth2", "tx_bytes", 0.62e6),
        counter("c", "net", "veth2", "rx_bytes", 0.55e6),
    ]
    rep = rails.analyze(rr, link_caps={("c", "veth2"): 1e6})
    (x,) = rep.links
    assert x.util == pytest.approx(0.62) and x.wire_busy == pytest.approx(1.17)
    (f,) = rep.findings
    assert f.kind == "net_round_trip_bound" and f.cls == "network"
    assert [(e.threshold_name, e.met) for e in f.evidence] == [
        ("net_link_frac", False),
        ("net_wire_busy", True),
    ]
    assert rep.signals()["net_wire_busy"] == pytest.approx(1.17)
    assert rails.merge_signals({}, rep)["net_wire_busy"] == pytest.approx(1.17)
    # a light two-way load is neither
    light = [
        counter("c", "net", "veth2", "tx_bytes", 0.3e6),
        counter("c", "net", "veth2", "rx_bytes", 0.3e6),
    ]
    assert not rails.analyze(light, link_caps={("c", "veth2"): 1e6}).findings
    # no capacity known: no utilization, and no guess
    bare = rails.analyze([counter("a", "net", "eth0", "tx_bytes", 900e6)])
    assert bare.links[0].util is None and "net_util" not in bare.signals()


def gpus(node, sm, util=90.0, power=600.0, n=8):
    out = []
    for i in range(n):
        s = sm[i] if isinstance(sm, list) else sm
        out += [
            gauge(node, "nvml", f"gpu{i}", "gpm_sm_activity_pct", s),
            gauge(node, "nvml", f"gpu{i}", "gpu_util_pct", util),
            gauge(node, "nvml", f"gpu{i}", "power_w", power),
        ]
    return out


def test_one_slow_gpu_is_a_straggler_and_balanced_peers_are_not():
    sm = [80.0] * 8
    sm[5] = 35.0
    rep = rails.analyze([*gpus("a", 80.0), *gpus("b", sm)])
    flagged = [d for d in rep.gpus if d.straggler]
    assert [(d.node, d.device, d.metric) for d in flagged] == [("b", "gpu5", "gpm_sm_activity_pct")]
    assert flagged[0].rel_dev == pytest.approx(-0.5625)
    (f,) = [f for f in rep.findings if f.kind == "gpu_straggler"]
    assert f.cls == "waiting_on_peer" and f.node == "b" and f.device == "gpu5"
    assert rep.signals()["sm_active_cv"] == pytest.approx(0.1457, abs=1e-3)  # max/min fired
    balanced = rails.analyze([*gpus("a", 80.0), *gpus("b", 78.0)])
    assert not balanced.findings and not any(d.straggler for d in balanced.gpus)


def test_a_slow_node_and_power_from_the_energy_counter():
    rows = [*gpus("a", 80.0, power=650.0), *gpus("b", 50.0, power=400.0)]
    rep = rails.analyze(rows)
    nodes = {(d.node, d.metric): d for d in rep.nodes}
    assert nodes[("b", "gpm_sm_activity_pct")].straggler
    assert nodes[("a", "gpm_sm_activity_pct")].straggler  # two nodes: both sides deviate
    assert {f.kind for f in rep.findings} >= {"node_straggler", "gpu_straggler"}
    # energy_mj (mJ/s = mW) stands in for power_w when there is no power gauge
    energy = [counter("a", "nvml", f"gpu{i}", "energy_mj", 600e3) for i in range(4)]
    energy[3] = counter("a", "nvml", "gpu3", "energy_mj", 300e3)
    rep = rails.analyze(energy)
    (d,) = [d for d in rep.gpus if d.straggler]
    assert (d.device, d.metric, d.value) == ("gpu3", "power_w", 300.0)


def test_signals_feed_the_classifier_for_the_network_and_imbalance_classes():
    # a CPU-only server whose link is the limit: the classifier names the network
    rows = [counter("w", "net", "veth1", "rx_bytes", 0.93e6)]
    rep = rails.analyze(rows, link_caps={("w", "veth1"): 1e6})
    fields = rails.merge_signals({"window": W, "duration_s": 10.0, "net_util": None}, rep)
    verdict = classify(WindowSignals(**fields))
    assert verdict.classes[0] == "network"
    (ev,) = [e for e in verdict.evidence if e.metric == "net_util"]
    assert ev.value == pytest.approx(0.93) and ev.met
    # GPUs waiting on a straggler across two nodes
    sm = [80.0] * 8
    sm[2] = 30.0
    rep = rails.analyze([*gpus("a", 80.0), *gpus("b", sm)])
    base = WindowSignals(
        W, 10.0, gpu_present=True, multi_node=True, n_gpus=16, gpu_util=0.9, sm_active=0.75
    )
    merged = rails.merge_signals(vars(base), rep)
    s = replace(base, **{k: v for k, v in merged.items() if k in rep.signals()})
    verdict = classify(s)
    assert "waiting_on_peer" in verdict.classes + verdict.also_flagged
    # merge never overrides a value the report already computed
    assert (
        rails.merge_signals(
            {"net_util": 0.1}, rails.analyze(rows, link_caps={("w", "veth1"): 1e6})
        )["net_util"]
        == 0.1
    )


def test_thresholds_have_sources():
    for t in rails.RAIL_THRESHOLDS:
        assert t.source and t.value > 0 and t.unit
    assert rails.rule("imbalance_cv").value == 0.15  # the shared table's number


# --- constructed windows through the classifier ------------------------------------------

CAP = 8e6 / 8  # an 8 Mbit/s tbf-capped veth, in bytes/s


def test_capped_round_trip_link_is_named_network():
    # llama.cpp RPC: the busier direction at 0.69 of the cap, both together at 1.19
    rows = [
        counter("head", "net", "veth0", "tx_bytes", 0.69 * CAP),
        counter("head", "net", "veth0", "rx_bytes", 0.50 * CAP),
        gauge("head", "net", "veth0", "link_speed_mbps", 10_000.0),  # the veth's own speed
    ]
    rep = rails.analyze(rows, window=W, link_caps={("head", "veth0"): CAP})
    assert [f.kind for f in rep.findings] == ["net_round_trip_bound"]
    fields = rails.merge_signals({"window": W, "duration_s": 10.0}, rep)
    assert fields["net_wire_busy"] == pytest.approx(1.19)
    verdict = classify(WindowSignals(**fields))
    assert verdict.classes[0] == "network", verdict
    assert any(e.metric == "net_wire_busy" and e.met for e in verdict.evidence)
    # without the cap the veth's 10 Gbit/s hides the link
    plain = rails.merge_signals({"window": W, "duration_s": 10.0}, rails.analyze(rows))
    assert "network" not in classify(WindowSignals(**plain)).classes


GPU_BASE = WindowSignals(
    W, 10.0, gpu_present=True, multi_node=True, n_gpus=16, gpu_util=0.9, sm_active=0.75
)


def quiet_rails(slow=15e9, fast=15e9):
    """Two nodes, two rails each, at 0.3 of a 400 Gb/s port (not saturated)."""
    return [
        *rail("a", "mlx5_0/1", fast),
        *rail("a", "mlx5_3/1", fast),
        *rail("b", "mlx5_0/1", fast),
        *rail("b", "mlx5_3/1", slow),
    ]


def _classify_rows(rows, **kw):
    rep = rails.analyze(rows, window=W, **kw)
    return rep, classify(WindowSignals(**rails.merge_signals(vars(GPU_BASE), rep)))


def test_imbalanced_rails_are_waiting_on_a_peer():
    rows = [*quiet_rails(slow=3e9), *gpus("a", 80.0), *gpus("b", 80.0)]
    rep, verdict = _classify_rows(rows)
    assert [f.kind for f in rep.findings] == ["rail_imbalance"]
    assert "waiting_on_peer" in verdict.classes, verdict
    ev = {e.metric for e in verdict.evidence if e.cls == "waiting_on_peer" and e.met}
    assert {"rdma_rail_max_min", "rdma_rail_cv"} <= ev


def test_a_straggler_gpu_is_waiting_on_a_peer():
    sm = [80.0] * 8
    sm[3] = 30.0
    rep, verdict = _classify_rows([*quiet_rails(), *gpus("a", 80.0), *gpus("b", sm)])
    assert "gpu_straggler" in {f.kind for f in rep.findings}
    assert "waiting_on_peer" in verdict.classes + verdict.also_flagged, verdict
    assert any(e.metric == "straggler_rel_dev" and e.met for e in verdict.evidence)


def test_rail_errors_and_socket_fallback_are_network():
    errs = [*quiet_rails(), counter("b", "rdma", "mlx5_3/1", "symbol_error", 0.5)]
    rep, verdict = _classify_rows(errs)
    assert [f.kind for f in rep.findings] == ["rail_errors"]
    assert "network" in verdict.classes + verdict.also_flagged, verdict
    eth = [
        counter("a", "net", "eth0", "tx_bytes", 400e6),
        gauge("a", "net", "eth0", "link_speed_mbps", 100_000.0),
        *gpus("a", 80.0),
        *gpus("b", 80.0),
    ]
    rep, verdict = _classify_rows(eth, expect_rdma=True)
    assert [f.kind for f in rep.findings] == ["socket_fallback"]
    assert rep.signals()["socket_fallback_bytes_s"] == pytest.approx(400e6)
    assert "network" in verdict.classes, verdict


def test_clean_two_node_window_is_neither_network_nor_waiting_on_a_peer():
    rows = [
        *quiet_rails(),
        *gpus("a", 80.0),
        *gpus("b", 79.0),
        counter("a", "net", "eth0", "tx_bytes", 2e5),
        counter("a", "net", "eth0", "rx_bytes", 2e5),
        gauge("a", "net", "eth0", "link_speed_mbps", 100_000.0),
    ]
    rep, verdict = _classify_rows(rows, expect_rdma=True)
    assert not [f for f in rep.findings if f.cls in ("network", "waiting_on_peer")]
    sig = rep.signals()
    assert sig["straggler_rel_dev"] == 0.0 and sig["socket_fallback_bytes_s"] == 0.0
    assert sig["rdma_error_events"] == 0 and sig["rdma_congestion_per_s"] == 0.0
    flagged = verdict.classes + verdict.also_flagged
    assert "network" not in flagged and "waiting_on_peer" not in flagged, verdict
