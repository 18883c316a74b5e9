"""Run: the live session, server lifetimes, nodes and their agents, the run folder."""
