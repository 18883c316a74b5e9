"""Writes the small sample traces beside this file, one per supported public format.

Generated here (seeded), in each format's own columns and units, not copied from the
published traces: Mooncake JSONL (ms timestamps, 512-token hash-id blocks with shared
leading blocks), BurstGPT CSV (s timestamps, one failed request with 0 response tokens),
Azure LLM inference CSV (date-time timestamps), and Strata's own JSONL with prefix
groups, and Strata's JSONL with multi-turn conversations. Run:
python tests/data/traces/make_sample_traces.py
"""

from __future__ import annotations

import csv
import json
import random
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
N = 16


def mooncake(rng: random.Random) -> None:
    # Three "system prompts" (2, 3 and 1 blocks long) shared by the requests of each.
    systems = {0: [0, 1], 1: [2, 3, 4], 2: [5]}
    next_id, t, lines = 6, 0, []
    for _ in range(N):
        sys_ids = systems[rng.randrange(3)]
        own = rng.randrange(1, 3)
        ids = sys_ids + list(range(next_id, next_id + own))
        next_id += own
        isl = (len(ids) - 1) * 512 + rng.randrange(100, 512)
        lines.append({"timestamp": t, "input_length": isl,
                      "output_length": rng.randrange(40, 90), "hash_ids": ids})
        t += int(rng.expovariate(1 / 250))
    (HERE / "mooncake_sample.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines))


def burstgpt(rng: random.Random) -> None:
    rows, t = [], 5.0
    for i in range(N):
        resp = 0 if i == 7 else rng.randrange(4, 12)  # one failure, as the trace logs them
        req = rng.randrange(60, 300)
        rows.append([t, "ChatGPT", req, resp, req + resp, "Conversation log"])
        t = round(t + rng.expovariate(4.0), 3)
    with (HERE / "burstgpt_sample.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type"])
        w.writerows(rows)


def azure(rng: random.Random) -> None:
    t = datetime(2023, 11, 16, 18, 15, 46, 680590)
    rows = []
    for _ in range(N):
        rows.append([t.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", rng.randrange(80, 400),
                     rng.randrange(4, 12)])
        t += timedelta(seconds=rng.expovariate(4.0))
    with (HERE / "azure_sample.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        w.writerows(rows)


def strata(rng: random.Random) -> None:
    lines, t = [], 0.0
    for i in range(N):
        group = "ab"[i % 2] if i % 4 else ""
        lines.append({"timestamp_s": round(t, 3), "input_length": rng.randrange(150, 300),
                      "output_length": rng.randrange(4, 10), "prefix_group": group,
                      "prefix_tokens": 128 if group else 0})
        t += rng.expovariate(4.0)
    (HERE / "strata_sample.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def strata_conversations(rng: random.Random) -> None:
    """Three conversations of three turns; later turns' times are not used (they follow
    the previous answer after think_s)."""
    lines = []
    for c in range(3):
        for turn in range(3):
            lines.append({"timestamp_s": round(c * 0.4 + turn * 5.0, 3),
                          "input_length": rng.randrange(40, 90),
                          "output_length": rng.randrange(4, 8),
                          "conversation_id": f"c{c}", "turn": turn,
                          "think_s": 0.0 if turn == 0 else 0.3})
    (HERE / "strata_conversations_sample.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    for make in (mooncake, burstgpt, azure, strata, strata_conversations):
        make(random.Random(make.__name__))
