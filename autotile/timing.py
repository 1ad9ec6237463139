"""Verify, then time one kernel launch on the GPU: CUDA events, warm-up, L2 flushed, median and spread.

The function to time is a parameter, so the loop works for generated kernels and for cuBLAS alike.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Timing:
    """Times in milliseconds of one launch: median and quartiles over `reps` repetitions."""

    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    reps: int

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0.02 = 2 %)."""
        return (self.p75_ms - self.p25_ms) / self.median_ms if self.median_ms > 0 else 0.0

    @classmethod
    def from_samples(cls, samples: list[float]) -> "Timing":
        q = np.percentile(samples, [25, 50, 75])
        return cls(float(q[1]), float(q[0]), float(q[2]), float(min(samples)), len(samples))

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self) | {"spread": self.spread}


class L2Flusher:
    """Overwrites a buffer twice the size of L2 so that every repetition reads its inputs from memory."""

    def __init__(self, l2_bytes: int):
        import cupy

        self._buffer = cupy.empty(max(2 * l2_bytes, 8 << 20), dtype=cupy.uint8)

    def __call__(self) -> None:
        self._buffer.fill(0)


def time_launch(launch: Callable[[], Any], flush: Callable[[], None] | None, *, warmup: int = 3,
                min_reps: int = 10, max_reps: int = 200, target_ms: float = 200.0) -> Timing:
    """Time `launch` with CUDA events around it alone (the flush runs before the start event).

    Repeats until `target_ms` of kernel time or `max_reps`, at least `min_reps`: short kernels get more
    repetitions, so their median is as stable as a long kernel's.
    """
    import cupy

    for _ in range(warmup):
        launch()
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    samples: list[float] = []
    total = 0.0
    while len(samples) < min_reps or (total < target_ms and len(samples) < max_reps):
        if flush is not None:
            flush()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        ms = cupy.cuda.get_elapsed_time(start, stop)
        samples.append(ms)
        total += ms
    return Timing.from_samples(samples)


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN or inf when the output holds them)."""
    import cupy

    out64 = cupy.asarray(out, dtype=cupy.float64)
    ref64 = cupy.asarray(ref, dtype=cupy.float64)
    num = float(cupy.linalg.norm((out64 - ref64).ravel()))
    den = float(cupy.linalg.norm(ref64.ravel()))
    return num / den if den > 0 else num


def median(values: list[float]) -> float:
    return float(statistics.median(values))
