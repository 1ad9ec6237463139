"""The command line: `autotile` (main.py) and the benchmarks it runs (`autotile bench`, ...)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotile.codegen.limits import DeviceLimits


def gpu_or_error(prog: str, torch: bool = False) -> DeviceLimits | None:
    """The live GPU's `DeviceLimits` (and torch imported, where `torch`), or None after printing one line
    that says what is missing: a benchmark's first step, so that a machine without a GPU (or torch) gets
    the error line and exit status 2 every other bad input gets, not a traceback."""
    from autotile.errors import AutotileError
    from autotile.runtime.device import live_device

    try:
        if torch:
            import torch as _torch  # noqa: F401
        return live_device()
    except ImportError as exc:
        print(f"{prog}: error: needs torch ({exc})", file=sys.stderr)
    except AutotileError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
    return None
