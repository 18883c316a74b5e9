"""The raw formats of a run folder, shared by their writers (load, run) and readers (analysis)."""
