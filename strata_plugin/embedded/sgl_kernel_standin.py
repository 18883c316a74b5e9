"""A stand-in for SGLang's kernel package ``sgl_kernel``, installed by
``python -m strata_plugin setup --sglang`` into the SGLang virtualenv only, as
``sgl_kernel/__init__.py``. It is not part of Strata's own package at run time.

What it is and why: PyPI's ``sglang-kernel`` (which SGLang pulls) is the CUDA build; on a
machine without a GPU it fails at import (``libcuda.so.1``), and SGLang's CPU build of it
(``sgl-kernel`` for the CPU) is not on PyPI. On a CPU without AMX, SGLang's CPU path never
calls the package: it runs torch's own attention and layers. But a few of its modules
import names from ``sgl_kernel`` at load time, so the server cannot start without one.
This module provides exactly those names, and each raises if it is ever called: a served
request that reached one would fail loudly, never compute something else in silence.

The names are the ones SGLang 0.5.23's CPU path imports on this kind of machine (found by
starting the real server); a newer SGLang that imports another one fails to start with
an ImportError naming it, and the name belongs here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

__version__ = "0.0.0+strata.standin"

#: The names SGLang's CPU path imports from ``sgl_kernel`` (module level or at startup).
NAMES: tuple[str, ...] = (
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "verify_tree_greedy_cpu",
    "build_tree_kernel_efficient_cpu",
    "assign_req_to_token_pool_cpu",
    "copy_all_layer_kv_cache_cpu",
)


def _absent(name: str) -> Callable[..., NoReturn]:
    def call(*_args: object, **_kwargs: object) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this sgl_kernel is Strata's stand-in "
            "(the CPU kernels are not on PyPI): SGLang took a kernel path this CPU was "
            "not expected to take (one with AMX, or a feature the stand-in does not serve)")
    call.__name__ = call.__qualname__ = name
    return call


for _name in NAMES:
    globals()[_name] = _absent(_name)
