"""Readers of the finer traces a diagnostic round captures: evidence, not files."""
