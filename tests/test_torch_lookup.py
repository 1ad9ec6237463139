"""The compiled lookup of repeated torch calls (`autotile.runtime.torch_lookup`): its Python side without a
GPU (the build's command and failures, entries kept until the extension loads, then replayed; the switch
that turns it off), and on a GPU the extension itself: every repeated call it serves computes what the
Python path computes (generated kernels and cuBLAS picks, matvec, batches, `x @ W.T`, `out=`, against a
float64 reference, outputs poisoned), and it hands back to Python whatever it must not decide (autograd, a
named stream, TF32 or fp16 accumulation switched on, a torch function mode, a subclass, a bad precision)."""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path

import pytest

from autotile.runtime import torch_lookup


@pytest.fixture
def fresh_lookup(monkeypatch):
    """A process whose compiled lookup has not started, and is left so after the test."""
    torch_lookup._reset_for_tests()
    monkeypatch.setenv(torch_lookup.ENV_VAR, "on")
    yield torch_lookup
    torch_lookup._reset_for_tests()


SIGNATURE = ("matmul", ((3, 4), (4, 1), "dtype", 0, (4, 5), (5, 1), "dtype", 0, False), None, "high")


class _FakeExtension:
    def __init__(self):
        self.entries, self.inits, self.cleared = [], [], 0

    def init(self, types_, settings, workspace):
        self.inits.append((types_, settings, workspace))

    def register(self, *args):
        self.entries.append(args)
        return True

    def clear(self):
        self.cleared += 1


def _fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.Tensor = type("Tensor", (), {})  # type: ignore[attr-defined]
    torch.nn = types.SimpleNamespace(Parameter=type("Parameter", (), {}))  # type: ignore[attr-defined]
    torch.__version__ = "2.11.0+cu130"  # type: ignore[attr-defined]
    return torch


def test_entries_wait_for_the_extension_then_go_in_with_their_codes(fresh_lookup, monkeypatch):
    ext = _FakeExtension()
    release = threading.Event()

    def slow_build(torch):
        release.wait(10)
        return Path("built.so")

    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setattr(torch_lookup, "build", slow_build)
    monkeypatch.setattr(torch_lookup, "_load", lambda path: ext)
    run, other = (lambda a, b, out, stream: "ours"), (lambda a, b, out, stream: "other")
    torch_lookup.register(SIGNATURE, run, ("mm", "tf32"), ("highest", "high", "medium", "emulated"))
    assert torch_lookup.status() == ("building", "") and torch_lookup.extension is None
    second = ("matvec", SIGNATURE[1], ((3,), (1,), "dtype", 0), "highest")
    torch_lookup.register(second, other, None, ("highest", "high", "medium", "emulated"))
    release.set()
    assert torch_lookup.wait(10)
    assert torch_lookup.status() == ("ready", "") and torch_lookup.extension is ext
    assert ext.inits[0][1] == ("highest", "high", "medium", "emulated")
    from autotile.runtime import cublas

    assert ext.inits[0][2] is cublas.table_workspace  # what gives the table's cuBLAS handle a stream's workspace
    # kernel, pair, out's signature, setting, the call, torch's op and its guard as torch_lookup.cpp's codes,
    # and no packed launch
    assert ext.entries == [(0, SIGNATURE[1], None, "high", run, 1, 1, None),
                           (1, SIGNATURE[1], second[2], "highest", other, 0, 0, None)]
    third = ("matmul", SIGNATURE[1], None, "medium")
    torch_lookup.register(third, run, ("bmm", "fp16_accumulation"), ())  # loaded: straight in
    assert ext.entries[-1] == (0, SIGNATURE[1], None, "medium", run, 2, 2, None)
    torch_lookup.clear()
    assert ext.cleared == 1


def test_a_failed_build_leaves_the_python_path_and_says_why_in_one_line(fresh_lookup, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())

    def failing(torch):
        raise RuntimeError("the C++ compiler failed (1): x.cpp:1: error: no\nsecond line")

    monkeypatch.setattr(torch_lookup, "build", failing)
    torch_lookup.register(SIGNATURE, lambda *a: None, None, ("high",))
    assert not torch_lookup.wait(10)
    state, why = torch_lookup.status()
    assert state == "failed" and why.startswith("RuntimeError: the C++ compiler failed") and "\n" not in why
    torch_lookup.register(SIGNATURE, lambda *a: None, None, ("high",))  # tried once per process
    assert torch_lookup.status()[0] == "failed" and torch_lookup.extension is None


def test_off_in_the_environment_builds_nothing(fresh_lookup, monkeypatch):
    monkeypatch.setenv(torch_lookup.ENV_VAR, "off")
    monkeypatch.setattr(torch_lookup, "build", lambda torch: pytest.fail("built while off"))
    torch_lookup.register(SIGNATURE, lambda *a: None, None, ("high",))
    assert torch_lookup.status() == ("off", "") and not torch_lookup.wait(0.1)
    assert torch_lookup._pending == {}


def test_the_build_command_and_its_failures(tmp_path, monkeypatch):
    torch = _fake_torch()
    torch.__file__ = str(tmp_path / "torch" / "__init__.py")  # type: ignore[attr-defined]
    torch._C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=False)  # type: ignore[attr-defined]
    assert torch_lookup._torch_version(torch) == 211 and torch_lookup.standards(torch) == ("c++17", "c++20")
    torch.__version__ = "2.14.1"  # type: ignore[attr-defined]
    assert torch_lookup.standards(torch) == ("c++20", "c++17")
    command = torch_lookup.build_command(torch, Path("x.cpp"), Path("x.so"), "c++20")
    assert "-std=c++20" in command and "-D_GLIBCXX_USE_CXX11_ABI=0" in command
    assert "-DAUTOTILE_TORCH_VERSION=214" in command and f"-I{tmp_path / 'torch' / 'include'}" in command
    # a torch without headers: the compiler's error, in one line, and no file left behind
    monkeypatch.setenv("AUTOTILE_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    import sysconfig

    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        with pytest.raises(RuntimeError, match="no Python headers"):
            torch_lookup.build(torch)
        return
    with pytest.raises(RuntimeError, match=r"the C\+\+ compiler failed") as failed:
        torch_lookup.build(torch)
    assert "\n" not in str(failed.value) and "error" in str(failed.value)
    left = [p.name for p in (tmp_path / "cache" / torch_lookup.HOST_DIR).iterdir() if not p.name.endswith(".lock")]
    assert left == []  # no extension, no temporary file (the builders' lock file stays)


def test_processes_that_build_at_once_compile_once(tmp_path, monkeypatch):
    import sysconfig
    import time

    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "Python.h").write_text("")
    monkeypatch.setattr(sysconfig, "get_paths", lambda *args, **kwargs: {"include": str(headers)})
    monkeypatch.setenv("AUTOTILE_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    torch = _fake_torch()
    torch.__file__ = str(tmp_path / "torch" / "__init__.py")  # type: ignore[attr-defined]
    torch._C = types.SimpleNamespace()  # type: ignore[attr-defined]
    compiles = []

    def slow_compile(torch_, folder, target):
        compiles.append(target)
        time.sleep(0.5)  # the others wait on the lock meanwhile
        target.write_bytes(b"built")

    monkeypatch.setattr(torch_lookup, "_compile", slow_compile)
    built: list = []
    builders = [threading.Thread(target=lambda: built.append(torch_lookup.build(torch))) for _ in range(3)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(10)
    assert len(compiles) == 1 and len(built) == 3 and len(set(built)) == 1 and built[0].read_bytes() == b"built"


def test_building_ahead_says_what_it_did_in_one_line(fresh_lookup, monkeypatch, tmp_path):
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def torch_found(found):
        return lambda name, *args: (object() if found else None) if name == "torch" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", torch_found(False))
    assert torch_lookup.build_ahead() == "the compiled lookup of torch calls: not built (torch is not installed)"
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setattr(importlib.util, "find_spec", torch_found(True))
    monkeypatch.setattr(torch_lookup, "build", lambda torch: tmp_path / "torch_lookup-x.so")
    built = torch_lookup.build_ahead()
    assert built.startswith(f"the compiled lookup of torch calls: {tmp_path / 'torch_lookup-x.so'} (")

    def failing(torch):
        raise RuntimeError("the C++ compiler failed (1): error: x")

    monkeypatch.setattr(torch_lookup, "build", failing)
    assert torch_lookup.build_ahead() == ("the compiled lookup of torch calls could not be built: RuntimeError: "
                                          "the C++ compiler failed (1): error: x")
    monkeypatch.setenv(torch_lookup.ENV_VAR, "off")
    assert torch_lookup.build_ahead() == "the compiled lookup of torch calls is off ($AUTOTILE_COMPILED_LOOKUP)"


def test_a_generated_launch_is_packed_as_data_with_its_batch_strides_or_declined():
    import struct

    import numpy as np

    from autotile.codegen.kernels import Launch
    from autotile.codegen.tensor_map import TensorBox
    from autotile.runtime.impl import KernelRunner

    class StubKernel:  # what the runner touches of a compiled kernel
        max_dynamic_shared_size_bytes = 1 << 20
        function_pointer = 0xC0FFEE
        name = "stub"

        def sibling(self, name):  # LOADER=presplit's split kernels
            return self

    sizes = (np.int32(29), np.int32(43), np.int32(97))
    launch = Launch((3, 2, 7), (128, 1, 1), 4096, zero_output=True)
    runner = KernelRunner(StubKernel(), launch, sizes, batched=True)
    packed = runner.packed_launch((2813, 0), out_nbytes=1000)
    assert packed is not None
    assert (packed.function, packed.grid, packed.block, packed.shared_bytes) == (0xC0FFEE, (3, 2, 7), (128, 1, 1), 4096)
    assert packed.zero_bytes == 1000 and packed.offsets == (0, 8, 16, 24, 32, 40, 48, 56)
    # the slots after the three addresses: M, N, K (int32: an 8-byte slot's low half), the batch strides
    values = [struct.unpack_from("<q", packed.image, offset)[0] for offset in packed.offsets[3:]]
    assert values == [29, 43, 97, 2813, 0] and len(packed.image) == 64
    assert runner.packed_launch((0, 4171), 1000).image[48:64] == struct.pack("<qq", 0, 4171)  # per signature
    plain = KernelRunner(StubKernel(), Launch((1, 1, 1), (32, 1, 1), 0, zero_output=False), sizes)
    assert plain.packed_launch((), out_nbytes=1000).zero_bytes == 0
    # launches that need more than three addresses per call: left to the Python call
    box = TensorBox(operand=0, inner=64, outer=64, box_inner=32, box_outer=64)
    for declined in (Launch((1, 1, 1), (32, 1, 1), 0, False, workspace_elems=64, tickets=4),
                     Launch((1, 1, 1), (384, 1, 1), 0, False, tensor_maps=(box, box)),
                     Launch((1, 1, 1), (384, 1, 1), 0, False, tensor_maps=(box, box), presplit_k=128)):
        assert KernelRunner(StubKernel(), declined, sizes).packed_launch(()) is None


def test_every_cublas_routine_the_library_calls_has_its_signature_in_the_compiled_table():
    from autotile.runtime import cublas

    source = torch_lookup.SOURCE.read_text()
    for name in cublas._PER_CALL:
        kinds = "P" + "".join(cublas._KIND_LETTERS[t] for t in cublas._SIGNATURES[name])
        assert f'{{"{kinds}", invoke<{", ".join(kinds)}>}}' in source, name  # the letters, then the same types


# ---- on a GPU: the extension itself ----------------------------------------------------------------------

@pytest.fixture
def compiled(fresh_lookup):
    """torch, with the library's memoized calls forgotten before and after (the compiled table with them)."""
    torch = pytest.importorskip("torch")
    from autotile.library import calls

    calls.forget()
    yield torch
    calls.forget()


def _served(kernel, A, B, out=None, precision="high"):
    """What the compiled table returns for this call (None: it hands the call to Python)."""
    assert torch_lookup.wait(300), torch_lookup.status()
    return torch_lookup.extension.call(torch_lookup.KERNELS[kernel], A, B, out, precision, None)


def _error(got, ref) -> float:
    return float((got.double() - ref).norm() / ref.norm())


TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 1e-2, "float16": 2e-3}


def _cases(torch, dtype):
    """(name, kernel, A, B, out shape): shapes no tile divides, every operand layout the library reads in place."""
    g = torch.Generator(device="cuda").manual_seed(11)

    def r(*shape):
        return (torch.rand(*shape, device="cuda", generator=g) - 0.5).to(getattr(torch, dtype))

    return [("mm nn", "matmul", r(67, 131), r(131, 45), (67, 45)),
            ("x @ W.T", "matmul", r(37, 259), r(83, 259).T, (37, 83)),
            ("tn", "matmul", r(131, 67).T, r(131, 45), (67, 45)),
            ("bmm", "matmul", r(3, 29, 97), r(3, 97, 43), (3, 29, 43)),
            ("broadcast", "matmul", r(2, 3, 29, 97), r(97, 43), (2, 3, 29, 43)),
            ("one row", "matmul", r(1, 301), r(301, 77), (1, 77)),
            ("matvec row", "matvec", r(131, 257), r(257), (131,)),
            ("matvec col", "matvec", r(257, 131).T, r(257), (131,))]


def _call(autotile, kernel, A, B, out=None, **kwargs):
    return (autotile.matmul if kernel == "matmul" else autotile.matvec)(A, B, out=out, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("cublas", [False, True], ids=["selected", "cublas"])
def test_every_repeated_call_it_serves_matches_the_reference(compiled, monkeypatch, dtype, cublas):
    torch = compiled
    import autotile

    if cublas:
        _select_cublas(monkeypatch)
    for name, kernel, A, B, shape in _cases(torch, dtype):
        ref = (A.double() @ B.double())
        for with_out in (False, True):
            for _ in range(2):  # the first call prepares and registers; then the table serves it
                out = torch.full(shape, float("nan"), device="cuda", dtype=A.dtype) if with_out else None
                got = _call(autotile, kernel, A, B, out)
            served = _served(kernel, A, B, torch.full_like(got, float("nan")) if with_out else None)
            assert served is not None, (name, with_out)
            for result in (got, served):
                assert result.shape == shape and result.dtype == A.dtype
                assert _error(result, ref) < TOLERANCE[dtype], (name, dtype, with_out)
            got = _call(autotile, kernel, A, B, out)  # now through the table
            if with_out:
                assert got is out
            assert _error(got, ref) < TOLERANCE[dtype], (name, dtype, with_out)
    if cublas:  # every cuBLAS pick is called from C++, on the table's own handle
        ext = torch_lookup.extension
        assert ext.launches() == (0, ext.size())


@pytest.mark.gpu
def test_a_cublas_pick_captured_in_a_cuda_graph_replays_right(compiled, monkeypatch):
    torch = compiled
    import autotile

    _select_cublas(monkeypatch)
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.rand(67, 131, device="cuda", generator=g) - 0.5
    b = torch.rand(131, 45, device="cuda", generator=g) - 0.5
    for _ in range(2):  # prepared and registered on the default stream
        autotile.matmul(a, b)
    assert torch_lookup.wait(300) and _served("matmul", a, b) is not None
    out = torch.full((67, 45), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on the capture's kind of stream, as torch's graphs want
        autotile.matmul(a, b, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a stream the table's handle meets first during the capture
        autotile.matmul(a, b, out=out)
    out.fill_(float("nan"))
    a.mul_(2.0)  # the replay reads the inputs' memory as it is then
    graph.replay()
    torch.cuda.synchronize()
    assert _error(out, a.double() @ b.double()) < 1e-6


def _select_cublas(monkeypatch):
    from autotile.dispatch import select as select_mod

    monkeypatch.setattr(select_mod, "select", lambda key, device, cache=None, precision=None: select_mod.Selection(
        None, "exact", None, None, "cublas", precision=precision))


def _spied(monkeypatch, torch):
    """Lists that record each call of autotile's own cuBLAS routine and of torch's mm from Python."""
    from autotile.runtime import cublas as cublas_mod

    ours: list = []
    original = cublas_mod.CublasCall.__call__
    monkeypatch.setattr(cublas_mod.CublasCall, "__call__",
                        lambda self, *args, **kwargs: ours.append(self) or original(self, *args, **kwargs))
    natives: list = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *args, **kwargs: natives.append("mm") or mm(*args, **kwargs))
    return ours, natives


@pytest.mark.gpu
def test_cublas_picks_run_torchs_operator_from_the_table_and_hand_back_what_it_must_not_decide(compiled,
                                                                                              monkeypatch):
    torch = compiled
    import autotile
    from autotile.errors import AutotileError

    _select_cublas(monkeypatch)
    ours, natives = _spied(monkeypatch, torch)
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.rand(131, 1031, device="cuda", generator=g) + 0.5  # near 1 over a long K: TF32 would show
    b = torch.rand(1031, 67, device="cuda", generator=g) + 0.5
    ref = a.double() @ b.double()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        autotile.matmul(a, b)
        assert _served("matmul", a, b) is not None

        def repeated(*args, **kwargs):
            ours.clear()
            natives.clear()
            return autotile.matmul(*args, **kwargs)

        got = repeated(a, b)  # cuBLAS called from C++: neither Python call is made
        assert (natives, len(ours)) == ([], 0) and _error(got, ref) < 1e-6
        assert torch_lookup.extension.launches()[1] == torch_lookup.extension.size()  # every entry a cuBLAS call
        torch.backends.cuda.matmul.allow_tf32 = True  # torch's GEMM would round to TF32: the table's handle, IEEE
        got = repeated(a, b)
        assert (natives, len(ours)) == ([], 0) and _error(got, ref) < 1e-6
        torch.backends.cuda.matmul.allow_tf32 = False
        got = repeated(a, b, stream=torch.cuda.Stream())  # a named stream: the Python path's call
        torch.cuda.synchronize()
        assert (natives, len(ours)) == ([], 1) and _error(got, ref) < 1e-6

        class Watching(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        with Watching():  # cuBLAS called from C++ is no torch operator: nothing for a mode to see
            got = repeated(a, b)
        assert (natives, len(ours)) == ([], 0) and _error(got, ref) < 1e-6
        a_grad = a.clone().requires_grad_(True)
        assert _served("matmul", a_grad, b) is None  # autograd must see it
        assert repeated(a_grad, b).grad_fn is not None
        with torch.no_grad():
            assert _served("matmul", a_grad, b) is not None

        class Sub(torch.Tensor):
            pass

        assert _served("matmul", a.as_subclass(Sub), b) is None
        assert _served("matmul", a, b, precision="bogus") is None
        with pytest.raises(AutotileError, match="bogus"):
            autotile.matmul(a, b, precision="bogus")
        assert _served("matmul", a, b, precision="highest") is None  # another setting: another signature
        from autotile.library import calls

        calls.forget()
        assert torch_lookup.extension.size() == 0 and _served("matmul", a, b) is None
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.mark.gpu
def test_float16_with_fp16_accumulation_on_still_sums_in_float32(compiled, monkeypatch):
    torch = compiled
    import autotile

    if not hasattr(torch.backends.cuda.matmul, "allow_fp16_accumulation"):
        pytest.skip("this torch has no fp16 accumulation switch (torch 2.7+)")
    _select_cublas(monkeypatch)
    ours, natives = _spied(monkeypatch, torch)
    a = torch.rand(40, 264, device="cuda", dtype=torch.float16)
    w = torch.rand(72, 264, device="cuda", dtype=torch.float16)
    before = torch.backends.cuda.matmul.allow_fp16_accumulation
    try:
        for on in (False, True):
            torch.backends.cuda.matmul.allow_fp16_accumulation = on
            autotile.matmul(a, w.T)
            assert _served("matmul", a, w.T) is not None
            ours.clear()
            natives.clear()
            got = autotile.matmul(a, w.T)  # the table's cuBLAS handle sums in float32 whatever torch's switch
            assert (natives, len(ours)) == ([], 0)
            assert _error(got, a.double() @ w.double().T) < 1e-3
    finally:
        torch.backends.cuda.matmul.allow_fp16_accumulation = before


@pytest.mark.gpu
def test_the_torch_operators_eager_calls_take_the_table_too(compiled, monkeypatch):
    torch = compiled
    import autotile.torch  # noqa: F401  (registers torch.ops.autotile)

    _select_cublas(monkeypatch)
    ours, natives = _spied(monkeypatch, torch)
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.rand(67, 131, device="cuda", generator=g) - 0.5
    b = torch.rand(131, 45, device="cuda", generator=g) - 0.5
    x = torch.rand(131, device="cuda", generator=g) - 0.5
    for _ in range(2):
        torch.ops.autotile.matmul(a, b)
        torch.ops.autotile.matvec(a, x)
    assert _served("matmul", a, b) is not None and _served("matvec", a, x) is not None
    ours.clear()
    natives.clear()
    got, y = torch.ops.autotile.matmul(a, b), torch.ops.autotile.matvec(a, x)
    assert (natives, len(ours)) == ([], 0)  # served by the table: torch's operators through ATen
    assert _error(got, a.double() @ b.double()) < 1e-6 and _error(y, a.double() @ x.double()) < 1e-6
    a_grad = a.clone().requires_grad_(True)  # autograd's: the operator's backward runs
    torch.ops.autotile.matmul(a_grad, b).sum().backward()
    assert _error(a_grad.grad, torch.ones(67, 45, device="cuda").double() @ b.double().T) < 1e-6


def _select_named(monkeypatch, matmul_name, matvec_names, overrides):
    """Every problem runs the named generated configs (matvec: by A's storage, "row" or "col"), with
    `overrides` of their parameters."""
    from autotile.codegen import kernels
    from autotile.dispatch import select as select_mod

    def named(key, device, cache=None, precision=None):
        if key.kernel == "matvec":
            name = matvec_names[0] if key.layout == "row" else matvec_names[1]
        else:
            name = matmul_name
        space = kernels.get(key.kernel).space
        config = space.with_overrides(space.named(name), overrides)
        return select_mod.Selection(config, "exact", key.shape, precision=precision or "high")

    monkeypatch.setattr(select_mod, "select", named)


@pytest.mark.gpu
@pytest.mark.parametrize("matmul_name, matvec_names, overrides, packed", [
    ("regtile-128x64", ("warp-per-row", "col-vec4"), {}, True),
    # split-K atomics: the output zeroed on the stream first
    ("regtile-64x128-splitk", ("warp-per-row-split8", "col-vec4-split8"), {"SPLIT_REDUCE": "atomic"}, True),
    # split-K summed by the last block: a workspace kept per stream, which the Python call makes
    ("regtile-64-split8", ("warp-per-row-split8", "col-vec4-split8"), {"SPLIT_REDUCE": "last_block"}, False),
], ids=["one-pass", "split-k-atomic", "split-k-last-block"])
def test_generated_kernels_launch_from_the_table_with_no_python(compiled, monkeypatch, matmul_name, matvec_names,
                                                                 overrides, packed):
    torch = compiled
    import autotile
    from autotile.library import calls

    _select_named(monkeypatch, matmul_name, matvec_names, overrides)
    cases = _cases(torch, "float32")
    _, kernel, A, B, _ = cases[0]
    _call(autotile, kernel, A, B)  # the build starts; later entries go straight into the loaded table
    assert torch_lookup.wait(300), torch_lookup.status()
    calls.forget()
    ext = torch_lookup.extension
    python_calls: list = []

    def profile(frame, event, arg):
        if event == "call":
            python_calls.append(frame.f_code.co_name)

    for name, kernel, A, B, shape in cases:
        ref = A.double() @ B.double()
        for with_out in (False, True):
            before = ext.launches()[0]
            first = torch.full(shape, float("nan"), device="cuda") if with_out else None
            _call(autotile, kernel, A, B, first)  # prepares and registers, with the kernel's packed launch
            assert ext.launches()[0] == before + packed, (name, with_out)
            out = torch.full(shape, float("nan"), device="cuda") if with_out else None
            python_calls.clear()
            sys.setprofile(profile)
            got = ext.call(torch_lookup.KERNELS[kernel], A, B, out, "high", None)
            sys.setprofile(None)
            # allocated and launched from C++; else the Python call runs
            assert (python_calls == []) == packed, (name, with_out, python_calls)
            assert got is not None and got.shape == shape and got.dtype == A.dtype
            assert (got is out) if with_out else got.is_contiguous()
            assert _error(got, ref) < 1e-5, (name, with_out)
            with torch.cuda.stream(torch.cuda.Stream()):  # torch's current stream, whichever it is
                side = torch.full(shape, float("nan"), device="cuda") if with_out else None
                got = ext.call(torch_lookup.KERNELS[kernel], A, B, side, "high", None)
            torch.cuda.synchronize()
            assert _error(got, ref) < 1e-5, (name, with_out)


def test_an_entry_is_described_only_where_the_lookup_takes_it(fresh_lookup, monkeypatch):
    monkeypatch.setattr(torch_lookup, "build", lambda torch: pytest.fail("built while off"))
    monkeypatch.setenv(torch_lookup.ENV_VAR, "off")
    assert not torch_lookup.accepts() and torch_lookup.status() == ("off", "")
    torch_lookup._reset_for_tests()
    monkeypatch.setenv(torch_lookup.ENV_VAR, "on")
    assert torch_lookup.accepts() and torch_lookup.status() == ("idle", "")
