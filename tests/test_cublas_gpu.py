"""cuBLAS called directly on pointers (`autotile.runtime.cublas`), and the library's calls that select cuBLAS:
every layout, batches (one operand broadcast), matvec in both layouts, float32 and float64, on shapes that are
no multiple of any tile, against a float64 reference, the output poisoned first. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from autotile.codegen.problem import ProblemKey

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (1, 97, 33), (61, 1, 7), (131, 67, 257), (257, 263, 1)]


def _matrix(cupy, rows: int, cols: int, order: str, dtype: str, batch: int = 0):
    """A random (batch x) rows x cols matrix, stored row-major ("n") or column-major ("t")."""
    shape = (batch, rows, cols) if batch else (rows, cols)
    x = cupy.random.standard_normal(shape).astype(dtype)
    if order == "t":
        x = cupy.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2)
    return x


def _error(out, ref) -> float:
    out64 = np.asarray(out.get(), dtype=np.float64)
    return float(np.linalg.norm(out64 - ref) / max(np.linalg.norm(ref), 1e-300))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_gemm_on_pointers_matches_the_reference(layout, dtype):
    import cupy

    from autotile.runtime.cublas import CublasCall

    stream = cupy.cuda.Stream(non_blocking=True)
    for M, N, K in SHAPES:
        a, b = _matrix(cupy, M, K, layout[0], dtype), _matrix(cupy, K, N, layout[1], dtype)
        out = cupy.full((M, N), cupy.nan, dtype=dtype)
        call = CublasCall(ProblemKey("matmul", dtype, layout, (M, N, K)), cupy.cuda.Device().id)
        # the inputs and the poison are written on the current stream, which a non-blocking one does not wait
        # for (without this, an H200 once ran the product before the poison landed)
        cupy.cuda.runtime.deviceSynchronize()
        call((a.data.ptr, b.data.ptr), out.data.ptr, stream.ptr)
        stream.synchronize()
        ref = a.get().astype(np.float64) @ b.get().astype(np.float64)
        assert _error(out, ref) < (1e-6 if dtype == "float32" else 1e-14), (layout, M, N, K)


@pytest.mark.parametrize("broadcast", ["none", "a", "b"])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_strided_batched_gemm_with_a_broadcast_operand(layout, broadcast):
    import cupy

    from autotile.runtime.cublas import CublasCall

    batch, M, N, K = 5, 37, 19, 23
    a = _matrix(cupy, M, K, layout[0], "float32", 0 if broadcast == "a" else batch)
    b = _matrix(cupy, K, N, layout[1], "float32", 0 if broadcast == "b" else batch)
    out = cupy.full((batch, M, N), cupy.nan, dtype=cupy.float32)
    call = CublasCall(ProblemKey("bmm", "float32", layout, (batch, M, N, K)), cupy.cuda.Device().id)
    strides = (0 if broadcast == "a" else M * K, 0 if broadcast == "b" else K * N)
    call((a.data.ptr, b.data.ptr), out.data.ptr, cupy.cuda.get_current_stream().ptr, strides)
    ref = np.matmul(a.get().astype(np.float64), b.get().astype(np.float64))
    assert _error(out, ref) < 1e-6


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["row", "col"])
def test_gemv_on_pointers_matches_the_reference(layout, dtype):
    import cupy

    from autotile.runtime.cublas import CublasCall

    for M, K in [(1, 1), (1, 17), (29, 1), (1031, 2053)]:
        a = _matrix(cupy, M, K, "n" if layout == "row" else "t", dtype)
        x = cupy.random.standard_normal(K).astype(dtype)
        y = cupy.full(M, cupy.nan, dtype=dtype)
        CublasCall(ProblemKey("matvec", dtype, layout, (M, K)), cupy.cuda.Device().id)(
            (a.data.ptr, x.data.ptr), y.data.ptr, cupy.cuda.get_current_stream().ptr)
        a64, x64 = a.get().astype(np.float64), x.get().astype(np.float64)
        # Against the dot products' own scale (|A| |x|), not ||A x||: a short dot of random signs may cancel
        # to a small result (M = 1, K = 17 once measured 3.1e-6 of ||A x|| on an H200, 2026-11-27: rounding
        # of terms a few times larger than their sum), which says nothing of the routine.
        scale = np.linalg.norm(np.abs(a64) @ np.abs(x64))
        error = float(np.linalg.norm(np.asarray(y.get(), dtype=np.float64) - a64 @ x64) / scale)
        assert error < (1e-6 if dtype == "float32" else 1e-14), (layout, M, K, error)


def test_library_calls_that_select_cublas_run_it_on_pointers(monkeypatch):
    # Every problem selects cuBLAS here: the repeated call runs the direct routine, on CuPy arrays and torch
    # tensors, with and without out=, and matvec too; special values pass through as cuBLAS's own do.
    import cupy

    from autotile.dispatch import select as select_mod
    from autotile.library import calls
    from autotile.runtime import cublas as cublas_mod

    calls.forget()
    monkeypatch.setattr(select_mod, "select", lambda key, device, cache=None, precision=None: select_mod.Selection(
        None, "exact", None, None, "cublas", precision=precision))
    used = []
    original = cublas_mod.CublasCall.__call__

    def spy(self, *args, **kwargs):
        used.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cublas_mod.CublasCall, "__call__", spy)
    try:
        a, b = cupy.random.standard_normal((131, 67)).astype(cupy.float32), cupy.random.standard_normal(
            (67, 257)).astype(cupy.float32)
        a[3, 5], b[7, 11] = cupy.inf, cupy.nan
        for _ in range(2):
            c = calls.matmul_no_autograd(a, b)
            out = cupy.full((131, 257), cupy.nan, dtype=cupy.float32)
            calls.matmul_no_autograd(a, b.T.copy().T, out=out)
            y = calls.matvec_no_autograd(a, b[:, 0].copy())
        for got, expected in ((c, cupy.matmul(a, b)), (out, cupy.matmul(a, b)), (y, cupy.matmul(a, b[:, 0]))):
            assert bool(cupy.array_equal(cupy.isnan(got), cupy.isnan(expected)))
            assert bool(cupy.array_equal(cupy.isinf(got), cupy.isinf(expected)))
            finite = cupy.isfinite(expected)
            assert float(cupy.abs(got[finite] - expected[finite]).max()) < 1e-3
        assert len(used) >= 6
        torch = pytest.importorskip("torch")
        ta, tb = torch.randn(33, 65, device="cuda"), torch.randn(65, 17, device="cuda")
        for _ in range(2):
            tc = calls.matmul_no_autograd(ta, tb.T.contiguous().T)
        assert isinstance(tc, torch.Tensor)
        ref = ta.double() @ tb.double()
        assert float((tc.double() - ref).norm() / ref.norm()) < 1e-6
    finally:
        calls.forget()


@pytest.mark.parametrize("name,reduce", [("regtile-64x128-splitk", "atomic"), ("tf32x3-32x64-split8", "last_block"),
                                         ("tf32x3-32x64-split8", "atomic")])
def test_repeated_split_k_calls_zero_or_sum_on_every_stream(monkeypatch, name, reduce):
    # A split-K config chosen for every problem: repeated library calls take the bound launch (the zeroing
    # memset, or the stream's workspace), on the default stream and on another, poisoned outputs each time.
    import cupy

    from autotile.codegen import kernels
    from autotile.dispatch import select as select_mod
    from autotile.library import calls

    space = kernels.get("matmul").space
    config = space.with_overrides(space.named(name), {"SPLIT_REDUCE": reduce})
    calls.forget()
    monkeypatch.setattr(select_mod, "select", lambda key, device, cache=None, precision=None: select_mod.Selection(
        config, "exact", None, precision=precision))
    try:
        a = cupy.random.standard_normal((67, 4099)).astype(cupy.float32)
        b = cupy.random.standard_normal((4099, 131)).astype(cupy.float32)
        ref = a.get().astype(np.float64) @ b.get().astype(np.float64)  # .get() waits for a and b
        other = cupy.cuda.Stream(non_blocking=True)
        for stream in (None, other, None, other, other):
            out = cupy.full((67, 131), cupy.nan, dtype=cupy.float32)
            # the poison is written on the current stream, which a non-blocking stream does not wait for:
            # ordering the caller's own writes with the stream it passes is the caller's part
            cupy.cuda.runtime.deviceSynchronize()
            calls.matmul_no_autograd(a, b, out=out, stream=stream)
            c = calls.matmul_no_autograd(a, b, stream=stream)
            cupy.cuda.runtime.deviceSynchronize()
            assert _error(out, ref) < 1e-5 and _error(c, ref) < 1e-5, (name, reduce, stream)
    finally:
        calls.forget()


_SPIN = r'''extern "C" __global__ void spin_then_double(float* a, int n, long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {}
    for (int i = threadIdx.x; i < n; i += blockDim.x) a[i] *= 2.0f;
}'''


@pytest.mark.parametrize("kind", ["gemm", "gemv"])
def test_direct_call_runs_on_the_stream_it_is_given(kind):
    # A kernel on a non-blocking stream waits ~30 ms and then doubles A; the cuBLAS call enqueued after it on
    # the same stream must see the doubled A. A call that ran on CuPy's current stream (the default one),
    # as CuPy's own bindings would make it, reads A before the doubling.
    import cupy

    from autotile.runtime import cublas

    M, N, K = (97, 61, 131) if kind == "gemm" else (97, 1, 131)
    a = cupy.random.standard_normal((M, K)).astype(cupy.float32)
    b = cupy.random.standard_normal((K, N) if kind == "gemm" else (K,)).astype(cupy.float32)
    ref = 2.0 * a.get().astype(np.float64) @ b.get().astype(np.float64)
    out = cupy.full(ref.shape, cupy.nan, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    key = ProblemKey("matmul", "float32", "nn", (M, N, K)) if kind == "gemm" else ProblemKey(
        "matvec", "float32", "row", (M, K))
    call = cublas.CublasCall(key, cupy.cuda.Device().id)
    stream = cupy.cuda.Stream(non_blocking=True)
    spin = cupy.RawKernel(_SPIN, "spin_then_double")
    spin((1,), (256,), (a, np.int32(a.size), np.int64(50_000_000)), stream=stream)
    call((a.data.ptr, b.data.ptr), out.data.ptr, stream.ptr)
    assert cublas.handle(cupy.cuda.Device().id).current_stream() == stream.ptr
    stream.synchronize()
    assert _error(out, ref) < 1e-6


@pytest.mark.parametrize("framework", ["cupy", "torch"])
def test_library_cublas_calls_are_captured_into_a_graph_on_a_new_stream(monkeypatch, framework):
    # cuBLAS selected for every problem, first used on the capturing stream inside the capture: the call
    # allocates nothing there (no workspace for a stream first seen in a capture) and replays correctly.
    import cupy

    from autotile.dispatch import select as select_mod
    from autotile.library import calls

    calls.forget()
    monkeypatch.setattr(select_mod, "select", lambda key, device, cache=None, precision=None: select_mod.Selection(
        None, "exact", None, None, "cublas", precision=precision))
    try:
        if framework == "cupy":
            a = cupy.random.standard_normal((131, 67)).astype(cupy.float32)
            b = cupy.random.standard_normal((67, 257)).astype(cupy.float32)
            out = cupy.empty((131, 257), dtype=cupy.float32)
            calls.matmul_no_autograd(a, b, out=out)  # selection and preparation, on the default stream
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                stream.begin_capture()
                calls.matmul_no_autograd(a, b, out=out)
                graph = stream.end_capture()
            a[...] = cupy.random.standard_normal((131, 67)).astype(cupy.float32)
            out.fill(cupy.nan)
            cupy.cuda.runtime.deviceSynchronize()  # written on the current stream: done before the replay
            graph.launch(stream)
            stream.synchronize()
            assert _error(out, a.get().astype(np.float64) @ b.get().astype(np.float64)) < 1e-6
            return
        torch = pytest.importorskip("torch")
        x, w = torch.randn(33, 65, device="cuda"), torch.randn(17, 65, device="cuda")
        out_t = torch.empty(33, 17, device="cuda")
        calls.matmul_no_autograd(x, w.T, out=out_t)
        torch.cuda.synchronize()
        graph_t = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph_t):
            calls.matmul_no_autograd(x, w.T, out=out_t)
        x.copy_(torch.randn(33, 65, device="cuda"))
        out_t.fill_(float("nan"))
        graph_t.replay()
        torch.cuda.synchronize()
        ref = x.double() @ w.T.double()
        assert float((out_t.double() - ref).norm() / ref.norm()) < 1e-6
    finally:
        calls.forget()


def _cublas_selected_and_spied(monkeypatch, torch):
    """cuBLAS selected for every problem (memoized calls forgotten), and two lists that record each call of
    autotile's own cuBLAS routine (`CublasCall`) and the name of each torch op called (mm, bmm, mv, matmul)."""
    from autotile.dispatch import select as select_mod
    from autotile.library import calls
    from autotile.runtime import cublas as cublas_mod

    calls.forget()
    monkeypatch.setattr(select_mod, "select", lambda key, device, cache=None, precision=None: select_mod.Selection(
        None, "exact", None, None, "cublas", precision=precision))
    ours: list = []
    original = cublas_mod.CublasCall.__call__
    monkeypatch.setattr(cublas_mod.CublasCall, "__call__",
                        lambda self, *args, **kwargs: ours.append(self) or original(self, *args, **kwargs))
    natives: list = []
    for name in ("mm", "bmm", "mv", "matmul"):
        op = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *args, _op=op, _name=name, **kwargs: natives.append(_name) or _op(
            *args, **kwargs))
    return ours, natives


def test_torch_calls_that_select_cublas_take_torchs_own_call_while_it_is_ieee(monkeypatch):
    # cuBLAS selected for every problem: a repeated call on torch tensors runs torch's own op (torch.mm,
    # torch.bmm, torch.mv; cuBLAS enqueued from C++), and autotile's own cuBLAS call where torch's TF32 switch
    # is on (torch's GEMM would then round to TF32) or where a stream is named. The results stay IEEE FP32.
    torch = pytest.importorskip("torch")
    from autotile.library import calls

    ours, natives = _cublas_selected_and_spied(monkeypatch, torch)
    allowed = torch.backends.cuda.matmul.allow_tf32
    generator = torch.Generator(device="cuda").manual_seed(5)

    def rand(*shape):  # values near 1 over a long K: TF32's rounding (2^-11) shows as an error over 1e-4
        return torch.rand(*shape, device="cuda", generator=generator) + 0.5

    a, b = rand(131, 1031), rand(1031, 67)
    ab, bb = rand(3, 29, 1031), rand(3, 1031, 43)
    x = rand(1031)
    a_col = a.T.contiguous().T  # column-major
    cases = [("mm", lambda out: calls.matmul_no_autograd(a, b.T.contiguous().T, out=out), a.double() @ b.double(),
              (131, 67)),
             ("bmm", lambda out: calls.matmul_no_autograd(ab, bb, out=out), ab.double() @ bb.double(), (3, 29, 43)),
             ("mv", lambda out: calls.matvec_no_autograd(a_col, x, out=out), a.double() @ x.double(), (131,)),
             ("mm", lambda out: calls.matmul_no_autograd(x[None, :], b, out=out), x[None, :].double() @ b.double(),
              (1, 67))]
    try:
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            for name, run, ref, shape in cases:
                for with_out in (False, True):
                    for _ in range(3):  # the first call prepares; the repeated ones take the short path
                        ours.clear()
                        natives.clear()
                        out = torch.full(shape, float("nan"), device="cuda") if with_out else None
                        got = run(out)
                        if with_out:
                            assert got is out
                    assert float((got.double() - ref).norm() / ref.norm()) < 1e-6, (name, tf32, with_out)
                    # the repeated call: torch's op, unless TF32 is on (then autotile's own call, IEEE)
                    assert (natives, len(ours)) == (([], 1) if tf32 else ([name], 0)), (name, tf32, with_out)
        torch.backends.cuda.matmul.allow_tf32 = False
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch 2.9+: TF32 through the new switch
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            ours.clear()
            natives.clear()
            got = calls.matmul_no_autograd(a, b)  # b row-major now: a new signature, then its repeated call
            got = calls.matmul_no_autograd(a, b)
            assert (natives, len(ours)) == ([], 2)
            ref = a.double() @ b.double()
            assert float((got.double() - ref).norm() / ref.norm()) < 1e-6
            torch.backends.cuda.matmul.fp32_precision = "ieee"
        stream = torch.cuda.Stream()
        ours.clear()
        natives.clear()
        for _ in range(2):  # a named stream: autotile's own call, the first time and repeated
            calls.matmul_no_autograd(a.T.contiguous().T, b, stream=stream)
        assert (natives, len(ours)) == ([], 2)
    finally:
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cuda.matmul.allow_tf32 = allowed
        calls.forget()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8"])
def test_reduced_precision_calls_that_select_cublas_take_torchs_own_call(monkeypatch, dtype):
    # bfloat16 and float16 with cuBLAS selected: the repeated call on torch tensors is torch's own op (its
    # reduced-precision-reduction switches allow at most what autotile's handle allows), except float16
    # while torch sums float16 products in float16 (allow_fp16_accumulation, torch 2.7+). int8 keeps
    # autotile's cublasGemmEx call (torch._int_mm runs cuBLASLt's other kernels).
    torch = pytest.importorskip("torch")
    from autotile.library import calls

    ours, natives = _cublas_selected_and_spied(monkeypatch, torch)
    generator = torch.Generator(device="cuda").manual_seed(9)
    torch_dtype = getattr(torch, dtype)

    def rand(*shape):
        if dtype == "int8":
            return torch.randint(-128, 128, shape, device="cuda", generator=generator, dtype=torch.int8)
        return (torch.rand(*shape, device="cuda", generator=generator) - 0.5).to(torch_dtype)

    a, w = rand(40, 264), rand(72, 264)  # x @ W.T, sizes torch._int_mm takes too
    ref = a.double() @ w.double().T
    accumulation = getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", None)
    switches = [False, True] if dtype == "float16" and accumulation is not None else [False]
    try:
        for fp16_sums in switches:
            if accumulation is not None:
                torch.backends.cuda.matmul.allow_fp16_accumulation = fp16_sums
            for _ in range(3):  # the first call prepares; the repeated ones take the short path
                ours.clear()
                natives.clear()
                got = calls.matmul_no_autograd(a, w.T)
            if dtype == "int8":
                assert torch.equal(got.double(), ref)
            else:
                assert float((got.double() - ref).norm() / ref.norm()) < 1e-2
            expect_native = dtype != "int8" and not fp16_sums
            assert (natives, len(ours)) == ((["mm"], 0) if expect_native else ([], 1)), (dtype, fp16_sums)
    finally:
        if accumulation is not None:
            torch.backends.cuda.matmul.allow_fp16_accumulation = accumulation
        calls.forget()
