"""The library's per-call path (`autotile.library.calls.repeated_call`): a repeated call of a known
signature found with one read of each array and one lookup, and every call that must not take it sent to
the general path. Without a GPU: a stand-in framework and memoized calls."""

from __future__ import annotations

import pytest

import autotile
from autotile.dispatch import precision as precision_mod
from autotile.library import calls
from autotile.runtime import operands
from autotile.runtime.operands import Framework


class Array:
    def __init__(self, shape: tuple[int, ...], needs_grad: bool = False) -> None:
        self.shape, self.needs_grad = shape, needs_grad


class Parameter(Array):
    """A subclass of the framework's array type, as nn.Parameter is of torch.Tensor."""


class Stand(Framework):
    name = "stand-in"

    def signature(self, x):
        return (x.shape,) if isinstance(x, Array) else None

    def read_pair(self, a, b):
        return (a.shape, b.shape, a.needs_grad or b.needs_grad)


@pytest.fixture
def stand(monkeypatch):
    framework = Stand()
    monkeypatch.setattr(operands, "_by_type", {})
    monkeypatch.setattr(operands, "OWN_TYPES", {})
    monkeypatch.setattr(calls, "OWN_TYPES", operands.OWN_TYPES)
    monkeypatch.setattr(operands, "framework_of", lambda *arrays: framework)
    monkeypatch.setattr(calls, "_calls", {})
    monkeypatch.setattr(precision_mod, "_setting", "high")
    return framework


def test_a_memoized_signature_is_found_once_both_types_are_known(stand):
    a, b = Array((3, 4)), Parameter((4, 5))
    calls._calls[("matmul", ((3, 4), (4, 5), False), None, "high")] = lambda *args: ("memoized", args)
    assert calls.repeated_call(a, b, None, None) is None  # types not seen yet: the general path
    assert operands.framework_by_type(a, b) is stand  # the general path's lookup registers both types
    found = calls.repeated_call(a, b, None, None)
    assert found is not None and found(a, b, None, None) == ("memoized", (a, b, None, None))
    assert autotile.matmul(a, b) == ("memoized", (a, b, None, None))  # the entry point takes it first


def test_the_key_holds_the_setting_and_the_outputs_signature(stand):
    a, b, out = Array((3, 4)), Array((4, 5)), Array((3, 5))
    operands.framework_by_type(a, b)
    calls._calls[("matmul", ((3, 4), (4, 5), False), ((3, 5),), "highest")] = "with out, highest"
    assert calls.repeated_call(a, b, out, "highest") == "with out, highest"
    assert calls.repeated_call(a, b, out, None) is None  # the process-wide setting is "high"
    assert calls.repeated_call(a, b, None, "highest") is None
    assert calls.repeated_call(a, b, Array((3, 6)), "highest") is None


def test_a_call_that_autograd_must_see_never_takes_the_memoized_call(stand):
    a, b = Array((3, 4), needs_grad=True), Array((4, 5))
    operands.framework_by_type(a, b)
    # memoized by the differentiable operator's own forward (`matmul_no_autograd`): not for the entry point
    calls._calls[("matmul", ((3, 4), (4, 5), True), None, "high")] = "no autograd"
    assert calls.repeated_call(a, b, None, None) is None


def test_a_matvec_that_autograd_must_see_never_takes_the_memoized_call(stand):
    a, x = Array((3, 4)), Array((4,), needs_grad=True)
    operands.framework_by_type(a, x)
    calls._calls[("matvec", ((3, 4), (4,), True), None, "high")] = "no autograd"
    assert calls.repeated_call(a, x, None, None, "matvec") is None
    calls._calls[("matvec", ((3, 4), (4,), False), None, "high")] = "memoized"
    assert calls.repeated_call(a, Array((4,)), None, None, "matvec") == "memoized"


def test_only_a_frameworks_own_types_are_read_unchecked(stand):
    a = Array((3, 4))
    assert operands.framework_by_type("host data", a) is stand  # a host array: the general path converts it
    assert operands.OWN_TYPES == {Array: stand}  # str is not the stand-in's own type
    calls._calls[("matmul", ((3, 4), (4, 5), False), None, "high")] = "memoized"
    assert calls.repeated_call("host data", a, None, None) is None
    assert calls.repeated_call(a, "host data", None, None) is None
    assert stand.pair_signature("host data", a) is None and stand.pair_signature(a, a) == ((3, 4), (3, 4), False)


@pytest.mark.parametrize(("answer", "capturing"), [(False, False), (True, True), (2, True), ("implicit", True)])
def test_is_capturing_reads_the_stream_and_counts_the_legacy_streams_refusal_as_capturing(monkeypatch, answer,
                                                                                          capturing):
    """cudaStreamIsCapturing's answer per stream: none, active, invalidated (2), and the legacy stream's error
    while another stream captures in global mode (which a synchronising call there would break too)."""
    import types

    class CUDARuntimeError(RuntimeError):
        pass

    asked: list[int] = []

    def stream_is_capturing(ptr: int) -> object:
        asked.append(ptr)
        if answer == "implicit":
            raise CUDARuntimeError("cudaErrorStreamCaptureImplicit")
        return answer

    runtime = types.SimpleNamespace(streamIsCapturing=stream_is_capturing, CUDARuntimeError=CUDARuntimeError)
    monkeypatch.setattr(operands, "_cupy", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
    assert operands.is_capturing(0xBEEF) is capturing
    assert asked == [0xBEEF]
