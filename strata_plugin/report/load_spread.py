"""Where a case's load ran: how many processes and hosts carried it, each one's self-check.

Rows for the case's "Workload as run" table (report/markdown.py), read from the
self-check in cases.jsonl (load/generator.SelfCheck: ``processes``, ``hosts``,
``engine``, ``placement``, ``per_process``, ``clock_alignment_error_ms``,
``incomplete``, and for an open loop ``rate_asked`` / ``rate_achieved``).
"""

from __future__ import annotations

from typing import Any

from strata_plugin.report.fmt import md_num


def rows(sc: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, text)`` rows; none for a self-check written before the pool existed."""
    if not sc or "processes" not in sc:
        return []
    n, hosts = int(sc.get("processes") or 1), int(sc.get("hosts") or 1)
    engine = sc.get("engine") or "loop"
    what = {"loop": "one loop", "threads": "a thread per request (HTTPS or a proxy)",
            "pool": "the worker pool", "ray": "Ray actors"}.get(engine, engine)
    text = (f"{n} process{'es' if n != 1 else ''} on {hosts} host{'s' if hosts != 1 else ''}"
            f" ({what})")
    if sc.get("placement"):
        text += f"; {sc['placement']}"
    out = [("load carried by", text)]
    if sc.get("client_cpu_total_cores") is not None and n > 1:
        out.append(("client CPU, all processes", f"{md_num(sc['client_cpu_total_cores'])} cores"))
    if sc.get("clock_alignment_error_ms") is not None:
        out.append(("clock alignment error",
                    f"{md_num(sc['clock_alignment_error_ms'])} ms (the worst worker's offset "
                    "to this host, half its best round trip; records moved onto this "
                    "host's timeline)"))
    if sc.get("rate_asked") is not None:
        asked, got = sc["rate_asked"], sc.get("rate_achieved")
        err = (f", error {md_num(100 * (got - asked) / asked)}%"
               if got is not None and asked else "")
        out.append(("open-loop rate", f"asked {md_num(asked)}/s, achieved "
                                      f"{md_num(got)}/s{err} (dispatches over the arrivals' span)"))
    if sc.get("incomplete"):
        out.append(("incomplete", str(sc["incomplete"])))
    if n > 1:
        for p in sc.get("per_process") or ():
            out.append((f"self-check, {p.get('process')}"
                        + (f" ({p['host']})" if p.get("host") else ""), _one(p)))
    return out


def _one(p: dict[str, Any]) -> str:
    if p.get("client_bound") is None:
        return f"{p.get('streams')} streams, {p.get('requests')} requests; lost: {p.get('lost')}"
    text = (f"{p.get('streams')} streams, {p.get('requests')} requests, client CPU "
            f"{md_num(p.get('client_cpu_cores'))} cores, loop lag p99 "
            f"{md_num(p.get('loop_lag_p99_ms'))} ms (its own work "
            f"{md_num(p.get('loop_own_lag_p99_ms'))} ms), read backlog p99 "
            f"{p.get('read_backlog_p99_bytes')} B, client_bound={p.get('client_bound')}")
    if p.get("clock_offset_ms") is not None:
        text += (f", clock offset {md_num(p['clock_offset_ms'])} ms "
                 f"± {md_num(p.get('clock_error_ms'))}")
    return text + "".join(f"; {r}" for r in p.get("reasons") or ())
