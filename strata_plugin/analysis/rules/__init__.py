"""Rules that turn one window's signals into a verdict: what the hardware waited on.

Shaped like top-down analysis: first "is the GPU busy or waiting?", then which
kind of busy (compute, memory bandwidth, communication, PCIe copies, latency /
low occupancy) or which kind of waiting (host CPU / launch, input-starved, disk
I/O and page faults, waiting on a peer). Throttling is a modifier on any of them.
Serving classes (queueing, KV-cache capacity, prefill-decode interference, the
client itself) sit beside. A server without a GPU (llama.cpp on the CPU) gets the
host classes from proc/cpu/mem/disk/net samples alone. The time ledger
(``analysis/ledger.py``) adds what the counters cannot: the server stalled
(``server_stalled``), time before the server (``outside_server``), and what no clock
explains (``unexplained``); and, split by cause with the run state, it names the
first class: the largest cause of the case's metric (``verdict.py``; no ``headroom``).

The package: ``table.py`` declares every rule once (class, group, signals with their
sources) and derives ``CLASSES``, the groups and ``SIGNAL_SOURCES``; ``gpu.py``,
``host.py`` and ``serving.py`` are the rule families; ``verdict.py`` is the machinery
(ranking, conflicts, confidence); ``window.py`` the input and output data;
``outcome.py`` what one rule records and the names rules are written with (``RuleCheck``,
``Outcome``, ``signal_margin``); ``traces.py`` the finer traces a verdict names;
``registry.py`` the rules of other packages (``strata.rules`` entry points) and the
table the verdict runs, Strata's rows and theirs (docs/extending.md, "A rule").

Three promises, each tested:

* every number a rule compares against is in the one table
  (:mod:`strata_plugin.analysis.thresholds`), with its source;
* a rule whose signal was not measured does not fire and does not clear: it is
  "unassessable", and the verdict names the missing signal and why it is missing;
* when the evidence cannot separate two classes, or contradicts itself, the
  verdict is inconclusive and names the finer trace that would settle it.
"""

from strata_plugin.analysis.rules.gpu import (
    rule_gpu_communication,
    rule_gpu_compute,
    rule_gpu_latency,
    rule_gpu_memory_bandwidth,
    rule_gpu_pcie_copy,
    rule_host_cpu_launch,
    rule_throttling,
    rule_waiting_on_peer,
)
from strata_plugin.analysis.rules.host import (
    rule_cpu_compute,
    rule_cpu_contention,
    rule_cpu_limited,
    rule_input_starved,
    rule_io_page_faults,
    rule_memory_pressure,
    rule_network,
    rule_server_stalled,
)
from strata_plugin.analysis.rules.outcome import (
    Outcome,
    RuleCheck,
    compare,
    margin,
    round_sig,
    signal_margin,
)
from strata_plugin.analysis.rules.registry import RulePlugin
from strata_plugin.analysis.rules.serving import (
    rule_client_bound,
    rule_interference,
    rule_kv_cache,
    rule_outside_server,
    rule_queueing,
    rule_unexplained,
)
from strata_plugin.analysis.rules.table import (
    AMBIGUOUS,
    CLASSES,
    CLIENT_MEASURED,
    CONTRADICTIONS,
    CORE_CPU,
    CORE_GPU,
    CPU_SERVER_RULES,
    GPU_RULES,
    GROUPS,
    HOST_RULES,
    MODIFIERS,
    RULES,
    SERVING,
    SERVING_RULES,
    SIGNAL_SOURCES,
    Rule,
)
from strata_plugin.analysis.rules.traces import (
    TRACE_BLOCK,
    TRACE_CLOCK,
    TRACE_CUDA,
    TRACE_GPM,
    TRACE_LEDGER,
    TRACE_MEM,
    TRACE_NCCL,
    TRACE_NET,
    TRACE_RUNSTATE,
    TRACE_SCHED,
    TRACE_SERVER,
)
from strata_plugin.analysis.rules.verdict import classify
from strata_plugin.analysis.rules.window import Evidence, Verdict, WindowSignals

__all__ = [
    "AMBIGUOUS", "CLASSES", "CLIENT_MEASURED", "CONTRADICTIONS", "CORE_CPU", "CORE_GPU",
    "CPU_SERVER_RULES", "GPU_RULES", "GROUPS", "HOST_RULES", "MODIFIERS", "RULES", "SERVING",
    "SERVING_RULES", "SIGNAL_SOURCES", "TRACE_BLOCK", "TRACE_CLOCK", "TRACE_CUDA",
    "TRACE_GPM", "TRACE_LEDGER", "TRACE_MEM", "TRACE_NCCL", "TRACE_NET", "TRACE_RUNSTATE",
    "TRACE_SCHED", "TRACE_SERVER", "Evidence", "Outcome", "Rule", "RuleCheck", "RulePlugin",
    "Verdict", "WindowSignals", "classify", "compare", "margin", "round_sig",
    "rule_client_bound", "rule_cpu_compute", "rule_cpu_contention", "rule_cpu_limited",
    "rule_gpu_communication", "rule_gpu_compute", "rule_gpu_latency",
    "rule_gpu_memory_bandwidth", "rule_gpu_pcie_copy", "rule_host_cpu_launch",
    "rule_input_starved", "rule_interference", "rule_io_page_faults", "rule_kv_cache",
    "rule_memory_pressure", "rule_network", "rule_outside_server", "rule_queueing",
    "rule_server_stalled", "rule_throttling", "rule_unexplained", "rule_waiting_on_peer",
    "signal_margin",
]
