"""Analyse: read a run folder, put every sample on one timeline, summarize, name the bottleneck."""
