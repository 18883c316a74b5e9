"""Strata: a pytest plugin that times every LLM request and explains why a server is slow."""

__version__ = "0.1.0"
