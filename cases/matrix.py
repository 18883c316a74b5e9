"""The two-node attribution matrix (cases/), at its nominal (real deployment) sizes.

Profiles scale these to what their target holds ([scale] in the profile); the
report states every scaled value next to the nominal one.
"""

from strata_plugin import Workload

K = 1024

PREFILL_128K_C1 = Workload("prefill_128k_1_c1", isl=128 * K, osl=1, concurrency=1,
                           requests=3, warmups=1, seed=1)
PREFILL_32K_C16 = Workload("prefill_32k_1_c16", isl=32 * K, osl=1, concurrency=16,
                           requests=16, warmups=1, seed=2)
DECODE_1K_1K_C32 = Workload("decode_1k_1k_c32", isl=1 * K, osl=1 * K, concurrency=32,
                            requests=32, warmups=1, seed=3)
DECODE_1K_4K_C16 = Workload("decode_1k_4k_c16", isl=1 * K, osl=4 * K, concurrency=16,
                            requests=16, warmups=1, seed=4)
LONG_128K_1K_C1 = Workload("long_context_128k_1k_c1", isl=128 * K, osl=1 * K, concurrency=1,
                           requests=2, warmups=1, seed=5)
#: The mixed A/B: the decode control, and the prefill injected into it.
MIXED_DECODE = Workload("mixed_decode_1k_1k_c32", isl=1 * K, osl=1 * K, concurrency=32,
                        requests=32, warmups=1, seed=6)
MIXED_INJECT = Workload("mixed_inject_128k_1", isl=128 * K, osl=1, concurrency=1, seed=7)
