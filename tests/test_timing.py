"""`timing.time_launch`'s batching, without a GPU: a stand-in for CuPy's events says when the hold kernel
ended (before or after the host had enqueued the batch) and what each interval measured."""

from __future__ import annotations

import itertools
import sys
import types

import pytest

from autotile.runtime import timing


class FakeGpu:
    """Events, elapsed times (`kernel_ms` per repetition) and the hold kernels enqueued (microseconds)."""

    def __init__(self, kernel_ms: float = 0.08, hold_ends_early: bool = False):
        self.kernel_ms = kernel_ms
        self.hold_ends_early = hold_ends_early
        self.holds: list[float] = []
        self.launches = 0
        gpu = self

        class Event:
            @property
            def done(self) -> bool:
                return gpu.hold_ends_early

            def record(self) -> None:
                pass

            def synchronize(self) -> None:
                pass

        device = types.SimpleNamespace(id=0, synchronize=lambda: None)
        self.module = types.ModuleType("cupy")
        self.module.cuda = types.SimpleNamespace(Event=Event, Device=lambda: device,  # type: ignore[attr-defined]
                                                 get_elapsed_time=lambda start, stop: gpu.kernel_ms)

    def launch(self) -> None:
        self.launches += 1


@pytest.fixture
def gpu(monkeypatch):
    fake = FakeGpu()
    monkeypatch.setitem(sys.modules, "cupy", fake.module)
    monkeypatch.setattr(timing, "hold_gpu", lambda microseconds=timing.HOLD_US: fake.holds.append(microseconds))
    monkeypatch.setattr(timing, "_EVENT_POOLS", {})
    # the host's enqueue time per repetition, which sizes the batches, from a clock that ticks 1 us per
    # reading: a loaded CI machine's real one made batches smaller and the count below flaky
    ticks = itertools.count()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-6))
    return fake


def test_repetitions_go_in_batches_behind_one_hold_each(gpu):
    result = timing.time_launch(gpu.launch, None)
    assert result.reps == 200 and result.median_ms == pytest.approx(0.08)  # 16 ms of kernel time: max_reps
    assert gpu.launches == 3 + 200  # the warm-up, then every repetition once: no batch thrown away
    batches = gpu.holds[1:]  # the first hold compiles the hold kernel
    assert len(batches) == -(-(200 - 10) // timing.MAX_BATCH) + 1  # min_reps first, then full batches
    assert all(h > timing.HOLD_US for h in batches)  # each as long as its batch takes the host to enqueue


def test_a_clearly_slower_launch_stops_after_the_probe(gpu):
    result = timing.time_launch(gpu.launch, None, give_up_ms=0.01)
    assert result.reps == timing.PROBE_REPS and gpu.launches == 3 + timing.PROBE_REPS


def test_long_kernels_stop_at_the_target_time(gpu):
    gpu.kernel_ms = 50.0
    assert timing.time_launch(gpu.launch, None).reps == 10  # min_reps: 500 ms over the 200 ms target


def test_a_batch_whose_hold_ended_early_is_thrown_away_and_then_each_repetition_is_held(gpu):
    gpu.hold_ends_early = True  # a launch that synchronises, or a host slower than its hold
    result = timing.time_launch(gpu.launch, None)
    assert result.reps == 200
    thrown = timing.MAX_MISSES * 10  # two first batches of min_reps, not counted
    assert gpu.launches == 3 + thrown + 200
    assert gpu.holds[-200:] == [timing.HOLD_US] * 200  # then one hold of HOLD_US per repetition


def test_max_batch_one_holds_every_repetition(gpu):
    timing.time_launch(gpu.launch, None, max_batch=1, min_reps=5, max_reps=5)
    assert gpu.holds[1:] == [timing.HOLD_US] * 5 and gpu.launches == 3 + 5
