"""Verify, then time one kernel launch on the GPU: CUDA events, warm-up, L2 flushed, median and spread.

The function to time is a parameter, so the loop works for generated kernels and for cuBLAS alike.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
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


# Kernels of the timing harness itself.
#
# read_all reads a buffer with 16-byte loads: the flush. Reading (not writing) a buffer twice the size of
# L2 evicts the inputs of the kernel under test and leaves L2 clean; a written buffer would leave L2 full
# of dirty lines, whose write-back then competes with the next kernel's reads (on an H100 that added
# 4-7 us to a 27 us matvec: timed with Nsight Compute, which starts every kernel on clean caches, cuBLAS
# and autotile took the same 27 us there). The test on the sum is never true, but keeps the loads.
#
# hold spins one thread for a given number of nanoseconds of the GPU's global timer. Enqueued before the
# start event, it keeps the GPU busy while the host enqueues the event and the launch, so the events
# time the kernel and not the host's launch path (cupy.matmul takes tens of microseconds of host time
# per call, longer than a small matvec runs on the GPU).
HARNESS_SOURCE = r"""
extern "C" __global__ void read_all(const float4* __restrict__ p, unsigned long long n4, float* out) {
    float s = 0.0f;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
#pragma unroll 4
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 v = p[i];
        s += (v.x + v.y) + (v.z + v.w);
    }
    if (s == 12345.678f) out[0] = s;
}

extern "C" __global__ void hold(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""

HOLD_US = 300.0  # longer than the host takes to enqueue one cuBLAS or autotile launch


def _harness_kernel(name: str) -> Any:
    from autotile.codegen import build

    return build.compile_kernel(HARNESS_SOURCE, name)


class L2Flusher:
    """Reads a buffer twice the size of L2 (at least 8 MiB), so that every repetition reads its inputs
    from device memory and starts with no dirty lines in L2."""

    def __init__(self, l2_bytes: int):
        import cupy

        n4 = max(2 * l2_bytes, 8 << 20) // 16
        self._buffer = cupy.ones(4 * n4, dtype=cupy.float32)
        self._sink = cupy.zeros(1, dtype=cupy.float32)
        self._args = (self._buffer, np.uint64(n4), self._sink)
        self._grid = (4 * cupy.cuda.Device().attributes["MultiProcessorCount"],)
        self._kernel = _harness_kernel("read_all")

    def __call__(self) -> None:
        self._kernel(self._grid, (256,), self._args)


def hold_gpu(microseconds: float = HOLD_US) -> None:
    """Enqueue a kernel that keeps the GPU busy for `microseconds` (see HARNESS_SOURCE)."""
    _harness_kernel("hold")((1,), (1,), (np.uint64(int(microseconds * 1e3)),))


PROBE_REPS = 5  # repetitions after which a candidate clearly slower than the best so far stops (`clearly_slower`)


def clearly_slower(samples: list[float], give_up_ms: float | None, probe_reps: int = PROBE_REPS) -> bool:
    """Whether timing can stop: after `probe_reps` repetitions, even the fastest of them took longer than
    `give_up_ms`. Noise on a GPU (clocks, a neighbour's load) mostly adds time, so the minimum of a few
    runs above the threshold says the kernel is slower than it, and more runs would only pin down by how
    much. None never stops early."""
    return give_up_ms is not None and len(samples) >= probe_reps and min(samples) > give_up_ms


# Repetitions are enqueued in batches behind one hold kernel, not one hold each: a batch of n costs the GPU
# one hold as long as the host takes to enqueue the n (about 20-60 us each) instead of n holds of HOLD_US,
# which on an 80 us kernel was four fifths of the timing's GPU time.
MAX_BATCH = 32  # repetitions enqueued behind one hold
MAX_HOLD_US = 20_000.0  # a longer hold than this is not tried: the launch then gets a hold of its own
HOLD_MARGIN = 2.0  # the hold lasts this many times the host's measured enqueue time of the batch, plus HOLD_US
MAX_MISSES = 2  # batches thrown away before each repetition gets a hold of its own


def time_launch(launch: Callable[[], Any], flush: Callable[[], None] | None, *, warmup: int = 3,
                min_reps: int = 10, max_reps: int = 200, target_ms: float = 200.0,
                give_up_ms: float | None = None, max_batch: int = MAX_BATCH) -> Timing:
    """Time `launch` with CUDA events around it alone: each repetition runs the flush, the start event, the
    launch and the stop event, all enqueued behind a hold kernel, so the interval holds the launched work
    and neither the flush nor the host's launch path.

    Repeats until `target_ms` of kernel time or `max_reps`, at least `min_reps`: short kernels get more
    repetitions, so their median is as stable as a long kernel's. With `give_up_ms` (the tuner's threshold,
    above the best time so far), a launch `clearly_slower` than it stops after PROBE_REPS repetitions: its
    median then comes from those few (`Timing.reps` says how many).

    Repetitions go in batches behind one hold (MAX_BATCH). A batch whose hold ended before the host had
    enqueued all of it (the GPU may then have waited on the host inside a timed interval: a launch that
    synchronises, or a slow host) is thrown away and tried again with a longer hold; where even that fails,
    each repetition gets a hold of its own, as `max_batch=1` asks from the start.
    """
    import cupy

    for _ in range(warmup):
        launch()
    hold_gpu(1.0)  # compiles the hold kernel outside the timed loop
    cupy.cuda.Device().synchronize()
    samples: list[float] = []
    total = 0.0
    first = PROBE_REPS if give_up_ms is not None else min_reps
    per_launch_us = 50.0  # the host's enqueue time of one repetition, measured from the first batch on
    alone = max_batch <= 1  # each repetition behind a hold of its own
    misses = 0  # batches thrown away
    while len(samples) < min_reps or (total < target_ms and len(samples) < max_reps):
        wanted = first if not samples else _reps_wanted(samples, total, min_reps, max_reps, target_ms)
        n = 1 if alone else max(1, min(wanted, max_batch, max_reps - len(samples) or 1))
        hold_us = HOLD_US if alone else HOLD_US + HOLD_MARGIN * per_launch_us * n
        if hold_us > MAX_HOLD_US:
            n = max(1, int((MAX_HOLD_US - HOLD_US) / (HOLD_MARGIN * per_launch_us)))
            hold_us = HOLD_US + HOLD_MARGIN * per_launch_us * n
        events = _events(n)
        hold_gpu(hold_us)
        held = events[0][2]
        held.record()  # done once the hold is: the GPU has started the batch
        began = time.perf_counter()
        for i in range(n):
            start, stop, _ = events[i]
            if flush is not None:
                flush()
            start.record()
            launch()
            stop.record()
        caught_up = held.done  # the hold ended before the host had enqueued the whole batch
        per_launch_us = (time.perf_counter() - began) * 1e6 / n
        events[n - 1][1].synchronize()
        if caught_up and n > 1:
            misses += 1
            alone = misses >= MAX_MISSES
            continue
        for i in range(n):
            ms = cupy.cuda.get_elapsed_time(events[i][0], events[i][1])
            samples.append(ms)
            total += ms
        if clearly_slower(samples, give_up_ms):
            break
    return Timing.from_samples(samples)


def back_to_back_ms(launch: Callable[[], Any], reps: int = 30) -> float:
    """Milliseconds per call of `reps` calls of `launch` enqueued back to back (after one call and a
    synchronisation; no flush, nothing waited for between them), between two events: what a model's layers
    see, the longer of the host's time per call and the GPU's."""
    import cupy

    launch()
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        launch()
    stop.record()
    stop.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, stop)) / reps


def _reps_wanted(samples: list[float], total: float, min_reps: int, max_reps: int, target_ms: float) -> int:
    """How many more repetitions reach `target_ms` of kernel time (within `min_reps`..`max_reps`)."""
    typical = max(statistics.median(samples), 1e-6)
    more = math.ceil(max(0.0, target_ms - total) / typical)
    return max(min_reps - len(samples), min(more, max_reps - len(samples)), 1)


_EVENT_POOLS: dict[int, list[tuple[Any, Any, Any]]] = {}  # per device


def _events(n: int) -> list[tuple[Any, Any, Any]]:
    """`n` (start, stop, spare) CUDA event triples of the current device, reused from call to call (creating
    one costs host time)."""
    import cupy

    pool = _EVENT_POOLS.setdefault(cupy.cuda.Device().id, [])
    while len(pool) < n:
        pool.append((cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.Event()))
    return pool[:n]


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN or inf when the output holds them)."""
    import cupy

    from autotile.codegen.kernels import to_float64

    out64 = to_float64(cupy.asarray(out))  # CuPy's own astype would read float32 denormals as zero
    ref64 = to_float64(cupy.asarray(ref))
    num = float(cupy.linalg.norm((out64 - ref64).ravel()))
    den = float(cupy.linalg.norm(ref64.ravel()))
    return num / den if den > 0 else num
