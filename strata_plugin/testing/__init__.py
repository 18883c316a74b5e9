"""Tools to test a serving stack and the harness itself: fault injectors, an SSE emitter,
a multi-process stream pool. Never imported by a run; the fault-injection cases use them."""
