"""Load: workloads, exact prompts, the streaming client, the load generator, one case."""
