"""One module per telemetry source; see docs/agent.md for the metrics of each."""

from .base import Collector, Emit, Unavailable

__all__ = ["Collector", "Emit", "Unavailable"]
