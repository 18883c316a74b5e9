"""Prometheus as a telemetry source, for clusters where the sampling agents cannot run.

Pulls node_exporter, dcgm-exporter and engine metrics for a window from an existing
Prometheus server with the range-query API (``/api/v1/query_range``, step = the
sampling interval) and writes them in the agents' sample format (docs/formats.md),
under the agents' metric names, so the timeline, the rails module and the classifier
read them unchanged.

Choices, and why:

* **Raw counters, not rate().** Each counter is queried as it is and written with kind
  ``counter``; the timeline takes window deltas exactly as for the agents' counters
  (resets included). ``rate(x[r])`` would smear each point over ``r`` and make window
  edges depend on ``r``.
* **Scrape times, not step times.** A range query answers at each step with the latest
  scraped value, up to one scrape interval old. Every series of a target is scraped at
  once, so one extra query, ``timestamp(up) + scrape_duration_seconds / 2``, gives the
  middle of each target's scrape at each step (the exporter reads its values between
  the scrape's start and end; on a loaded host that is 100 ms or more); values are
  stamped with it and repeats of one scrape are dropped. Window deltas then agree with
  the node's own counters to within interpolation error.
* **Sums on our side.** A host-wide or per-core CPU ``busy_s`` is the sum of several
  ``mode`` series; they are summed here per scrape (PromQL ``sum`` would lose the
  scrape time).
* **The Prometheus server's clock.** Scrape times are on the server's clock:
  :meth:`PromClient.clock_offset` measures it against ours like the agents' ping, for
  ``nodes.<node>.clock_offset_ns`` in the manifest.

Layouts: ``"source"`` writes ``nodes/<node>/samples/<source>.csv`` (cpu.csv, net.csv,
dcgm.csv, prom.csv...), so the report reads them exactly like an agent's (use it for
nodes where no agent ran: it appends); ``"job"`` writes ``samples/prom_<job>.csv`` with
source ``prom_<job>``, kept apart from an agent's files (the report then lists them
under that source, without the agents' aliases).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.agent.collectors.prom import BodyRefused, read_bounded
from strata_plugin.agent.protocol import SAMPLE_COLUMNS, Sample
from strata_plugin.errors import StrataError
from strata_plugin.formats.atomic import atomic_open, atomic_write_text
from strata_plugin.limits import PROM_API_BYTES_MAX

#: A range query answers with at most 11000 points per series; stay below it.
MAX_POINTS = 10_000
CPU_BUSY_MODES = "user|nice|system|irq|softirq"


class PromError(StrataError, RuntimeError):
    """The Prometheus server refused a query or could not be reached."""


@dataclass(frozen=True)
class PromMetric:
    """One exporter series family mapped onto an agent metric.

    ``device`` is a template over the series' labels (``"cpu{cpu}"``, ``"{device}"``,
    ``"{device}/{port}"``, ``"gpu{gpu}"``, ``""`` for host-wide); series that land on the
    same (node, device) at one scrape are summed (the CPU modes of ``busy_s``).
    """

    name: str  # the exporter's metric name
    source: str  # the agent collector it stands in for
    metric: str  # the agent's metric name
    kind: str  # counter | gauge
    device: str = ""
    matchers: str = ""  # extra PromQL label matchers, e.g. 'mode=~"user|system"'
    scale: float = 1.0


def _m(
    name: str,
    source: str,
    metric: str,
    kind: str,
    device: str = "",
    matchers: str = "",
    scale: float = 1.0,
) -> PromMetric:
    return PromMetric(name, source, metric, kind, device, matchers, scale)


_BUSY = f'mode=~"{CPU_BUSY_MODES}"'
# fmt: off
#: node_exporter (1.x) -> agent names (docs/agent.md, collectors cpu/mem/disk/net/rdma).
NODE_EXPORTER: tuple[PromMetric, ...] = (
    _m("node_cpu_seconds_total", "cpu", "busy_s", "counter", "", _BUSY),
    _m("node_cpu_seconds_total", "cpu", "busy_s", "counter", "cpu{cpu}", _BUSY),
    _m("node_cpu_seconds_total", "cpu", "iowait_s", "counter", "", 'mode="iowait"'),
    _m("node_cpu_seconds_total", "cpu", "steal_s", "counter", "", 'mode="steal"'),
    _m("node_cpu_seconds_total", "cpu", "idle_s", "counter", "", 'mode="idle"'),
    _m("node_cpu_seconds_total", "cpu", "user_s", "counter", "", 'mode=~"user|nice"'),
    _m("node_cpu_seconds_total", "cpu", "system_s", "counter", "", 'mode="system"'),
    _m("node_context_switches_total", "cpu", "ctxt", "counter"),
    _m("node_intr_total", "cpu", "intr", "counter"),
    _m("node_procs_running", "cpu", "procs_running", "gauge"),
    _m("node_procs_blocked", "cpu", "procs_blocked", "gauge"),
    _m("node_load1", "cpu", "load1", "gauge"),
    _m("node_load5", "cpu", "load5", "gauge"),
    _m("node_load15", "cpu", "load15", "gauge"),
    _m("node_pressure_cpu_waiting_seconds_total", "cpu", "psi_cpu_some_s", "counter"),
    _m("node_pressure_io_waiting_seconds_total", "cpu", "psi_io_some_s", "counter"),
    _m("node_pressure_io_stalled_seconds_total", "cpu", "psi_io_full_s", "counter"),
    _m("node_pressure_memory_waiting_seconds_total", "cpu", "psi_memory_some_s", "counter"),
    _m("node_pressure_memory_stalled_seconds_total", "cpu", "psi_memory_full_s", "counter"),
    _m("node_memory_MemTotal_bytes", "mem", "mem_total_bytes", "gauge"),
    _m("node_memory_MemFree_bytes", "mem", "mem_free_bytes", "gauge"),
    _m("node_memory_MemAvailable_bytes", "mem", "mem_available_bytes", "gauge"),
    _m("node_memory_Buffers_bytes", "mem", "buffers_bytes", "gauge"),
    _m("node_memory_Cached_bytes", "mem", "cached_bytes", "gauge"),
    _m("node_memory_Mlocked_bytes", "mem", "mlocked_bytes", "gauge"),
    _m("node_memory_Dirty_bytes", "mem", "dirty_bytes", "gauge"),
    _m("node_memory_Writeback_bytes", "mem", "writeback_bytes", "gauge"),
    _m("node_memory_AnonPages_bytes", "mem", "anon_bytes", "gauge"),
    _m("node_memory_Shmem_bytes", "mem", "shmem_bytes", "gauge"),
    _m("node_memory_SwapTotal_bytes", "mem", "swap_total_bytes", "gauge"),
    _m("node_memory_SwapFree_bytes", "mem", "swap_free_bytes", "gauge"),
    _m("node_vmstat_pgmajfault", "mem", "pgmajfault", "counter"),
    _m("node_vmstat_pgfault", "mem", "pgfault", "counter"),
    _m("node_vmstat_pswpin", "mem", "pswpin", "counter"),
    _m("node_vmstat_pswpout", "mem", "pswpout", "counter"),
    _m("node_vmstat_pgpgin", "mem", "pgpgin_kib", "counter"),
    _m("node_vmstat_pgpgout", "mem", "pgpgout_kib", "counter"),
    _m("node_disk_read_bytes_total", "disk", "read_bytes", "counter", "{device}"),
    _m("node_disk_written_bytes_total", "disk", "write_bytes", "counter", "{device}"),
    _m("node_disk_reads_completed_total", "disk", "reads", "counter", "{device}"),
    _m("node_disk_writes_completed_total", "disk", "writes", "counter", "{device}"),
    _m("node_disk_read_time_seconds_total", "disk", "read_time_s", "counter", "{device}"),
    _m("node_disk_write_time_seconds_total", "disk", "write_time_s", "counter", "{device}"),
    _m("node_disk_io_time_seconds_total", "disk", "busy_s", "counter", "{device}"),
    _m("node_disk_io_time_weighted_seconds_total", "disk", "weighted_io_s", "counter", "{device}"),
    _m("node_disk_io_now", "disk", "in_flight", "gauge", "{device}"),
    _m("node_network_receive_bytes_total", "net", "rx_bytes", "counter", "{device}"),
    _m("node_network_transmit_bytes_total", "net", "tx_bytes", "counter", "{device}"),
    _m("node_network_receive_packets_total", "net", "rx_packets", "counter", "{device}"),
    _m("node_network_transmit_packets_total", "net", "tx_packets", "counter", "{device}"),
    _m("node_network_receive_errs_total", "net", "rx_errs", "counter", "{device}"),
    _m("node_network_transmit_errs_total", "net", "tx_errs", "counter", "{device}"),
    _m("node_network_receive_drop_total", "net", "rx_drop", "counter", "{device}"),
    _m("node_network_transmit_drop_total", "net", "tx_drop", "counter", "{device}"),
    # the interface's speed, which the agent does not read: the report's own name
    _m("node_network_speed_bytes", "net", "link_speed_mbps", "gauge", "{device}", "", 8e-6),
    _m("node_infiniband_port_data_transmitted_bytes_total", "rdma", "xmit_bytes", "counter",
       "{device}/{port}"),
    _m("node_infiniband_port_data_received_bytes_total", "rdma", "rcv_bytes", "counter",
       "{device}/{port}"),
    _m("node_infiniband_port_errors_received_total", "rdma", "port_rcv_errors", "counter",
       "{device}/{port}"),
    _m("node_infiniband_port_transmit_wait_total", "rdma", "port_xmit_wait", "counter",
       "{device}/{port}"),
    _m("node_infiniband_port_discards_transmitted_total", "rdma", "port_xmit_discards",
       "counter", "{device}/{port}"),
    _m("node_infiniband_link_downed_total", "rdma", "link_downed", "counter", "{device}/{port}"),
    _m("node_infiniband_link_error_recovery_total", "rdma", "link_error_recovery", "counter",
       "{device}/{port}"),
    _m("node_infiniband_rate_bytes_per_second", "rdma", "rate_gbps", "gauge", "{device}/{port}",
       "", 8e-9),
    _m("node_infiniband_state_id", "rdma", "state", "gauge", "{device}/{port}"),
)

#: dcgm-exporter (DCGM_FI_*) -> the agent's dcgm names (collectors/dcgm.py FIELD_NAMES),
#: and the report's names where the agent's NVML names would be aliased to them.
DCGM_EXPORTER: tuple[PromMetric, ...] = (
    _m("DCGM_FI_DEV_GPU_UTIL", "dcgm", "gpu_util_pct", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_DEV_MEM_COPY_UTIL", "dcgm", "mem_copy_util_pct", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_DEV_SM_CLOCK", "dcgm", "sm_clock_mhz", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_DEV_MEM_CLOCK", "dcgm", "mem_clock_mhz", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_DEV_GPU_TEMP", "dcgm", "gpu_temp_c", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_DEV_MEMORY_TEMP", "dcgm", "memory_temp_c", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_DEV_POWER_USAGE", "dcgm", "power_w", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "dcgm", "energy_mj", "counter", "gpu{gpu}"),
    _m("DCGM_FI_DEV_FB_USED", "dcgm", "fb_used_mib", "gauge", "gpu{gpu}"),
    # violation times are in microseconds in DCGM; the agent's names are in ns
    _m("DCGM_FI_DEV_POWER_VIOLATION", "dcgm", "violation_power_ns", "counter", "gpu{gpu}", "",
       1e3),
    _m("DCGM_FI_DEV_THERMAL_VIOLATION", "dcgm", "violation_thermal_ns", "counter", "gpu{gpu}",
       "", 1e3),
    _m("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "dcgm", "gr_engine_active", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_PROF_SM_ACTIVE", "dcgm", "sm_active", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_PROF_SM_OCCUPANCY", "dcgm", "sm_occupancy", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "dcgm", "tensor_active", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_PROF_DRAM_ACTIVE", "dcgm", "dram_active", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_PROF_PCIE_TX_BYTES", "dcgm", "pcie_tx_bytes_per_s", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_PROF_PCIE_RX_BYTES", "dcgm", "pcie_rx_bytes_per_s", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_PROF_NVLINK_TX_BYTES", "dcgm", "nvlink_tx_bytes_per_s", "gauge", "gpu{gpu}"),
    _m("DCGM_FI_PROF_NVLINK_RX_BYTES", "dcgm", "nvlink_rx_bytes_per_s", "gauge", "gpu{gpu}"),
)
# fmt: on

#: Series Prometheus adds to every target; not engine metrics.
SYNTHETIC = (
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
)
#: Labels Prometheus (or the scrape config) adds: not part of an agent's device name.
TARGET_LABELS = frozenset({"__name__", "instance", "job", "model_name"})


@dataclass(frozen=True)
class Job:
    """One scrape job to pull, and which mapping applies to it.

    ``kind``: ``"node"`` (node_exporter), ``"dcgm"`` (dcgm-exporter) or ``"engine"``
    (the serving engine's /metrics, mapped like the agent's ``prom`` collector).
    """

    job: str
    kind: str
    metrics: tuple[PromMetric, ...] = ()

    def mapping(self) -> tuple[PromMetric, ...]:
        if self.metrics:
            return self.metrics
        return {"node": NODE_EXPORTER, "dcgm": DCGM_EXPORTER}.get(self.kind, ())


@dataclass(frozen=True)
class ServerClock:
    """The Prometheus server's clock minus ours, from the fastest of a few round trips."""

    offset_ns: int
    rtt_ns: int
    uncertainty_ns: int
    measured_wall_ns: int


# --- the HTTP client ---------------------------------------------------------------------


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port filled in from the scheme."""
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    try:
        port = u.port
    except ValueError:
        port = None
    return scheme, (u.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


class _SameOriginHeaders(urllib.request.HTTPRedirectHandler):
    """Follow a redirect, but carry the caller's headers (the bearer token) only to the
    same scheme, host and port: urllib's own handler resends every header to wherever
    the server points (a token sent to another host, or over plain http, is leaked)."""

    def __init__(self, private: Iterable[str]) -> None:
        self.private = {h.lower() for h in private}

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) != _origin(req.full_url):
            for name in [k for k in new.headers if k.lower() in self.private]:
                del new.headers[name]
            for name in [k for k in new.unredirected_hdrs if k.lower() in self.private]:
                del new.unredirected_hdrs[name]
        return new


class PromClient:
    """The few Prometheus HTTP API calls this module needs (standard library only).

    ``headers`` may carry an Authorization header; it is sent, never written anywhere,
    and not sent on when the server redirects to another scheme, host or port (the
    redirect is followed without it).
    """

    def __init__(
        self, base_url: str, timeout_s: float = 30.0, headers: Mapping[str, str] | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.queries: list[dict[str, object]] = []  # what was asked, for the run folder
        self._opener = urllib.request.build_opener(_SameOriginHeaders(self.headers))

    def _get(self, path: str, params: Mapping[str, str]) -> object:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        req = urllib.request.Request(url, headers={"Accept": "application/json", **self.headers})
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                body = json.loads(read_bounded(resp, PROM_API_BYTES_MAX, None,
                                               f"the answer of {path}"))
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("error", "")
            except (ValueError, OSError):
                detail = ""
            raise PromError(f"HTTP {e.code} from {self.base_url}{path}: {detail}") from None
        except BodyRefused as e:
            raise PromError(f"{self.base_url}{path}: {e} (limits.PROM_API_BYTES_MAX): narrow "
                            "the job's matchers or shorten the window") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise PromError(f"{self.base_url}{path}: {getattr(e, 'reason', e)}") from None
        if not isinstance(body, dict):
            raise PromError(f"{path}: the answer is not a JSON object")
        if body.get("status") != "success":
            raise PromError(f"{path}: {body.get('errorType')}: {body.get('error')}")
        return body.get("data")

    def query_range(
        self, query: str, start_s: float, end_s: float, step_s: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """(labels, [(t, value)...]) per series; long ranges are split under MAX_POINTS."""
        out: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
        span = step_s * (MAX_POINTS - 1)
        t = start_s
        while t <= end_s:
            t1 = min(end_s, t + span)
            params = {
                "query": query,
                "start": f"{t:.3f}",
                "end": f"{t1:.3f}",
                "step": f"{step_s:g}",
            }
            self.queries.append({"api": "query_range", **params})
            data = self._get("/api/v1/query_range", params)
            for series in (data or {}).get("result", []):  # type: ignore[union-attr]
                key = tuple(sorted(series["metric"].items()))
                for ts, val in series["values"]:
                    v = float(val)
                    if math.isfinite(v):
                        out[key].append((float(ts), v))
            t = t1 + step_s
        return [(dict(k), sorted(set(pts))) for k, pts in out.items()]

    def metadata(self) -> dict[str, str]:
        """Metric family -> type (counter, gauge, histogram, summary) where known."""
        try:
            data = self._get("/api/v1/metadata", {})
        except PromError:
            return {}
        return {
            name: entries[0].get("type", "") for name, entries in (data or {}).items() if entries
        }  # type: ignore[union-attr]

    def clock_offset(self, n: int = 5) -> ServerClock:
        """The server's clock against ours: ``time()`` evaluated at its now, NTP-style."""
        best: tuple[int, int, int] | None = None
        for _ in range(n):
            t0 = time.time_ns()
            data = self._get("/api/v1/query", {"query": "time()"})
            t3 = time.time_ns()
            server_ns = round(float(data["result"][0]) * 1e9)  # type: ignore[index]
            mid = (t0 + t3) // 2
            if best is None or t3 - t0 < best[0]:
                best = (t3 - t0, server_ns - mid, mid)
        assert best is not None
        # The server's timestamps have ms resolution: that adds to the uncertainty.
        return ServerClock(best[1], best[0], best[0] // 2 + 1_000_000, best[2])


# --- mapping -----------------------------------------------------------------------------


def default_node_of(labels: Mapping[str, str]) -> str:
    """``instance`` without its port, made a valid node label."""
    inst = labels.get("instance", "") or "prometheus"
    host = inst.rsplit(":", 1)[0] if inst.count(":") == 1 else inst
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host.strip("[]"))


def _device(template: str, labels: Mapping[str, str]) -> str | None:
    try:
        return template.format_map(labels)
    except (KeyError, ValueError):
        return None


def _selector(name: str, job: str, matchers: str) -> str:
    inner = f'job="{_escape(job)}"' + (f",{matchers}" if matchers else "")
    return f"{name}{{{inner}}}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


class _ScrapeTimes:
    """Each target's scrape time at each step: ``timestamp(up)`` (the scrape's start)
    plus half of ``scrape_duration_seconds``, the middle of the exporter's reads."""

    def __init__(self, series: list[tuple[dict[str, str], list[tuple[float, float]]]]) -> None:
        self.by_instance = {labels.get("instance", ""): dict(points) for labels, points in series}

    def at(self, instance: str, t: float) -> float:
        return self.by_instance.get(instance, {}).get(t, t)


def fetch_job(
    client: PromClient,
    job: Job,
    start_ns: int,
    end_ns: int,
    step_s: float,
    node_of: Callable[[Mapping[str, str]], str | None] = default_node_of,
    pad_s: float | None = None,
) -> list[Sample]:
    """One job's samples for one window, on the agents' names, stamped at scrape time.

    The window is padded on each side (``pad_s``, default the larger of two steps and
    15 s: it must exceed the scrape interval) so counters have a scrape beyond each
    edge to interpolate from, as the agents' samples do.
    """
    pad = max(2 * step_s, 15.0) if pad_s is None else pad_s
    start_s = start_ns / 1e9 - pad
    end_s = end_ns / 1e9 + pad
    # the middle of each scrape: values are read between its start and its end
    times = _ScrapeTimes(client.query_range(scrape_time_query(job), start_s, end_s, step_s))
    if job.kind == "engine":
        return _fetch_engine(client, job, start_s, end_s, step_s, node_of, times)
    by_query = _mapping_queries(job)
    # (node, source, device, metric, kind) -> scrape time -> [sum, number of series]
    acc: dict[tuple[str, str, str, str, str], dict[float, list[float]]] = defaultdict(dict)
    for query, maps in by_query.items():
        for labels, points in client.query_range(query, start_s, end_s, step_s):
            node = node_of(labels)
            if not node:
                continue
            inst = labels.get("instance", "")
            # steps that saw the same scrape repeat it: one value per scrape
            per_scrape = {times.at(inst, t): v for t, v in points}
            for m in maps:
                dev = _device(m.device, labels)
                if dev is None:
                    continue
                slot = acc[(node, m.source, dev, m.metric, m.kind)]
                for ts, v in per_scrape.items():
                    cell = slot.setdefault(ts, [0.0, 0])
                    cell[0] += v * m.scale
                    cell[1] += 1
    out = []
    for (node, src, dev, met, kind), slot in acc.items():
        # A sum missing one of its series at a scrape (a stale or late series) would
        # look like a counter reset: such points are dropped.
        full = max(c[1] for c in slot.values())
        out += [
            Sample(round(ts * 1e9), node, src, dev, met, c[0], kind)
            for ts, c in slot.items()
            if c[1] == full
        ]
    return _dedupe(out)


def scrape_time_query(job: Job) -> str:
    sel = f'{{job="{_escape(job.job)}"}}'
    return f"timestamp(up{sel}) + scrape_duration_seconds{sel} / 2"


def _mapping_queries(job: Job) -> dict[str, list[PromMetric]]:
    """Mapping entries grouped by query, so a family is fetched once per matcher set."""
    by_query: dict[str, list[PromMetric]] = defaultdict(list)
    for m in job.mapping():
        by_query[_selector(m.name, job.job, m.matchers)].append(m)
    return by_query


def _engine_query(job: Job) -> str:
    not_synthetic = "|".join(SYNTHETIC)
    return f'{{job="{_escape(job.job)}",__name__!~"{not_synthetic}"}}'


def job_queries(job: Job) -> list[str]:
    """Every range query :func:`fetch_job` sends for ``job`` (the dry run lists them)."""
    rest = [_engine_query(job)] if job.kind == "engine" else list(_mapping_queries(job))
    return [scrape_time_query(job), *rest]


def _fetch_engine(
    client: PromClient,
    job: Job,
    start_s: float,
    end_s: float,
    step_s: float,
    node_of: Callable[[Mapping[str, str]], str | None],
    times: _ScrapeTimes,
) -> list[Sample]:
    from strata_plugin.agent.collectors.prom import NameMapper, PromSample, kind_of

    series = client.query_range(_engine_query(job), start_s, end_s, step_s)
    types = client.metadata()
    mapper = NameMapper()
    families = {_family(labels["__name__"], types) for labels, _ in series}
    mapping = mapper.update(families)
    out = []
    for labels, points in series:
        name = labels["__name__"]
        node = node_of(labels)
        if not node or name.endswith("_created"):
            continue
        fam = _family(name, types)
        ps = PromSample(name, (), 0.0, fam, types.get(fam, "untyped"))
        metric, kind = mapper.name(ps, mapping), kind_of(ps)
        dev = ";".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in TARGET_LABELS)
        inst = labels.get("instance", "")
        for t, v in points:
            out.append(Sample(round(times.at(inst, t) * 1e9), node, "prom", dev, metric, v, kind))
    return _dedupe(out)


def _family(name: str, types: Mapping[str, str]) -> str:
    if name in types:
        return name
    for suf in ("_bucket", "_sum", "_count", "_total"):
        if name.endswith(suf) and name[: -len(suf)] in types:
            return name[: -len(suf)]
    return name


def _dedupe(samples: Iterable[Sample]) -> list[Sample]:
    """One row per (series, scrape): steps that saw the same scrape repeat it."""
    seen: dict[tuple[str, str, str, str, int], Sample] = {}
    for s in samples:
        seen.setdefault((s.node, s.source, s.device, s.metric, s.wall_ns), s)
    return sorted(seen.values(), key=lambda s: (s.node, s.source, s.device, s.metric, s.wall_ns))


# --- writing -----------------------------------------------------------------------------


def _fmt(v: float) -> str:
    return str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


def write_samples(
    run_dir: Path | str, samples: Sequence[Sample], *, layout: str = "source", job: str = ""
) -> list[Path]:
    """Append samples as ``nodes/<node>/samples/<source>.csv`` (or ``prom_<job>.csv``).

    The ``source`` column always equals the file's stem, which is what the timeline
    reads the source from.
    """
    if layout not in ("source", "job"):
        raise ValueError(f"layout must be 'source' or 'job': {layout!r}")
    if layout == "job" and not job:
        raise ValueError("layout 'job' needs the job name")
    groups: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for s in samples:
        src = s.source if layout == "source" else f"prom_{job}"
        groups[(s.node, src)].append(s)
    written = []
    for (node, src), rows in sorted(groups.items()):
        path = Path(run_dir) / "nodes" / node / "samples" / f"{src}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            before = path.read_bytes()
        except FileNotFoundError:
            before = b""
        if before and not before.endswith(b"\n"):  # a torn last line: never extended
            before = before[:before.rfind(b"\n") + 1]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if not before:
            w.writerow(SAMPLE_COLUMNS)
        for s in sorted(rows, key=lambda s: s.wall_ns):
            w.writerow((s.wall_ns, node, src, s.device, s.metric, _fmt(s.value), s.kind))
        # The previous rows and this pull's, as one file that replaces the old one: a
        # kill or a full disk mid-write leaves the previous file, never part of a pull.
        with atomic_open(path, "wb") as fh:
            fh.write(before)
            fh.write(buf.getvalue().encode())
        written.append(path)
    return written


@dataclass(frozen=True)
class PullResult:
    files: tuple[Path, ...]
    samples: int
    nodes: tuple[str, ...]
    clock: ServerClock | None
    queries: int


def pull(
    run_dir: Path | str,
    client: PromClient,
    jobs: Sequence[Job],
    windows: Sequence[tuple[int, int]],
    step_s: float,
    *,
    node_of: Callable[[Mapping[str, str]], str | None] = default_node_of,
    layout: str = "source",
    measure_clock: bool = True,
    pad_s: float | None = None,
) -> PullResult:
    """Fetch every job over every window (harness wall ns) and write the sample files.

    Overlapping windows are merged first so nothing is fetched twice. The queries are
    recorded in ``nodes/<node>/collector_commands/prom_<job>.json``.
    """
    merged = _merge(windows)
    files: set[Path] = set()
    nodes: set[str] = set()
    n = 0
    for job in jobs:
        before = len(client.queries)
        samples: list[Sample] = []
        for a, b in merged:
            samples += fetch_job(client, job, a, b, step_s, node_of, pad_s)
        files.update(write_samples(run_dir, samples, layout=layout, job=job.job))
        job_nodes = sorted({s.node for s in samples})
        nodes.update(job_nodes)
        n += len(samples)
        for node in job_nodes:
            cdir = Path(run_dir) / "nodes" / node / "collector_commands"
            cdir.mkdir(parents=True, exist_ok=True)
            record = {
                "prometheus": client.base_url,
                "job": job.job,
                "kind": job.kind,
                "queries": client.queries[before:],
            }
            atomic_write_text(cdir / f"prom_{job.job}.json",
                              json.dumps(record, indent=1) + "\n")
    clock = client.clock_offset() if measure_clock else None
    return PullResult(tuple(sorted(files)), n, tuple(sorted(nodes)), clock, len(client.queries))


def _merge(windows: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(windows):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]
