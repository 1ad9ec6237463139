"""On a real GPU (`pytest -m gpu`): the four operand layouts and batches against a float64 reference, in
every MATH family; the library with torch tensors (same type out, the caller's stream, CUDA graphs,
torch.compile, autograd). Skipped without a GPU; the torch tests also without torch."""

from __future__ import annotations

import pytest

from autotile.codegen import kernels
from autotile.codegen.problem import MATMUL_LAYOUTS, ProblemKey, as_matvec
from autotile.codegen.space import Problem
from autotile.runtime.impl import Generated

pytestmark = pytest.mark.gpu

SHAPES = [(1, 97, 33), (61, 1, 7), (131, 67, 257), (257, 263, 1), (509, 521, 523)]
BATCHED = [(3, 131, 67, 257), (2, 1, 97, 33), (5, 61, 1, 7)]
NAMED = {"float32": ["safe-default", "regtile-128", "tf32x3-128", "tf32x3-64-split8", "tf32x3-16x64",
                     "regtile-64-split8", "seed-naive", "seed-tiled32-pad"],
         "float64": ["safe-default", "dmma-128", "dmma-64-split8", "dmma-128-k16"]}


def _torch():
    return pytest.importorskip("torch")


def _errors(kernel: str, dtype: str, layout: str, shapes, broadcast_b: bool = False) -> list[str]:
    """Named configs (every MATH family, split-K both ways) on every shape, outputs poisoned with NaN."""
    import cupy

    from autotile.runtime.device import live_device
    from autotile.runtime.timing import relative_error

    spec, device = kernels.get(kernel), live_device()
    failures = []
    for name in NAMED[dtype]:
        config = spec.space.named(name)
        if not spec.space.is_feasible(config, Problem(device, dtype, layout)):
            continue
        for shape in shapes:
            rng = cupy.random.default_rng(sum(shape))
            a, b = spec.make_inputs(shape, dtype, layout, rng, cupy)
            if broadcast_b:
                b = b[0]
            ref = kernels.to_float64(a) @ kernels.to_float64(b)
            out = cupy.full(spec.output_shape(shape), cupy.nan, dtype=dtype)
            Generated(config).prepare(ProblemKey(kernel, dtype, layout, shape)).run((a, b), out)
            err, tol = relative_error(out, ref), kernels.tolerance(dtype, shape[-1])
            if not err <= tol:
                failures.append(f"{name} {layout} {shape}: error {err:.2e} > {tol:.2e}")
    return failures


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", MATMUL_LAYOUTS)
def test_every_layout_matches_the_reference(layout, dtype):
    assert _errors("matmul", dtype, layout, SHAPES) == []


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["nn", "nt", "tt"])
def test_batches_match_the_reference_with_and_without_a_broadcast_b(layout, dtype):
    assert _errors("bmm", dtype, layout, BATCHED) == []
    assert _errors("bmm", dtype, layout, BATCHED, broadcast_b=True) == []


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("layout", MATMUL_LAYOUTS)
def test_a_library_matmul_of_one_row_or_column_runs_the_matvec(layout, dtype):
    """`as_matvec`: a matmul with M = 1 or N = 1 runs as a matvec (the operands swapped where M = 1),
    first and repeated calls, with and without `out=`, against a float64 reference, the output poisoned."""
    import cupy

    import autotile
    from autotile.library import calls
    from autotile.runtime.timing import relative_error

    spec = kernels.get("matmul")
    for shape in [(1, 97, 131), (89, 1, 131), (1, 1, 77), (1, 4099, 1031)]:
        vector = as_matvec("matmul", dtype, layout, shape)
        assert vector is not None
        for seed in range(3):  # the first call, then the repeated path twice
            a, b = spec.make_inputs(shape, dtype, layout, cupy.random.default_rng(seed), cupy)
            ref = kernels.to_float64(a) @ kernels.to_float64(b)
            out = cupy.full(shape[:2], cupy.nan, dtype=dtype)
            given = autotile.matmul(a, b, out=out)
            made = autotile.matmul(a, b)
            tol = kernels.tolerance(dtype, shape[2])
            assert given is out and made.shape == shape[:2] and made.flags.c_contiguous
            assert relative_error(out, ref) <= tol and relative_error(made, ref) <= tol, (layout, shape, seed)
        # (1, 1, K) reads alike row- and column-major: the library's layout may differ from the test's name
        assert any(key[1:3] == ("matvec", dtype) and key[4] == vector[1] for key in calls._prepared)


def test_the_library_takes_transposed_and_batched_cupy_arrays_without_copies():
    import cupy

    import autotile

    rng = cupy.random.default_rng(3)
    x = rng.random((300, 257), dtype=cupy.float32) - 0.5
    w = rng.random((129, 257), dtype=cupy.float32) - 0.5
    y = autotile.matmul(x, w.T)
    assert isinstance(y, cupy.ndarray) and y.shape == (300, 129)
    ref = x.astype(cupy.float64) @ w.T.astype(cupy.float64)
    assert float(cupy.linalg.norm(y - ref) / cupy.linalg.norm(ref)) < kernels.tolerance("float32", 257)
    a = rng.random((6, 65, 33), dtype=cupy.float32) - 0.5
    b = rng.random((6, 33, 17), dtype=cupy.float32) - 0.5
    c = autotile.matmul(a, b)
    ref = a.astype(cupy.float64) @ b.astype(cupy.float64)
    assert c.shape == (6, 65, 17)
    assert float(cupy.linalg.norm(c - ref) / cupy.linalg.norm(ref)) < kernels.tolerance("float32", 33)


# -- torch ----------------------------------------------------------------------------------------------

def _rel(out, ref) -> float:
    torch = _torch()
    return float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_in_torch_out_every_layout_and_batch(dtype):
    torch = _torch()
    import autotile

    tdtype = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    M, N, K = 257, 131, 509
    x = torch.rand(M, K, device="cuda", dtype=tdtype, generator=g) - 0.5
    w = torch.rand(N, K, device="cuda", dtype=tdtype, generator=g) - 0.5
    tol = kernels.tolerance(dtype, K)
    for a, b in [(x, w.T), (x.T.contiguous().T, w.T), (x, w.T.contiguous()), (x.T.contiguous().T, w.T.contiguous())]:
        y = autotile.matmul(a, b)
        assert isinstance(y, torch.Tensor) and y.dtype == tdtype and y.shape == (M, N)
        assert _rel(y, a.double() @ b.double()) < tol
    batch = torch.rand(4, M, K, device="cuda", dtype=tdtype, generator=g) - 0.5
    y = autotile.matmul(batch, w.T)  # a linear layer on a batch: one tall matmul
    assert y.shape == (4, M, N) and _rel(y, batch.double() @ w.T.double()) < tol
    bw = torch.rand(4, K, N, device="cuda", dtype=tdtype, generator=g) - 0.5
    y = autotile.matmul(batch, bw)
    assert y.shape == (4, M, N) and _rel(y, batch.double() @ bw.double()) < tol
    v = torch.rand(K, device="cuda", dtype=tdtype, generator=g) - 0.5
    y = autotile.matvec(x, v)
    assert isinstance(y, torch.Tensor) and _rel(y, x.double() @ v.double()) < tol


def test_repeated_torch_calls_return_new_packed_tensors():
    """A repeated call allocates its result through a template (`TorchFramework.allocator`): each call's
    tensor is new, C-contiguous, of the right shape, and holds that call's product, for 2-D, batched (3-D and
    4-D) and matvec results, the one-row matmul (cuBLAS's GEMV, where cuBLAS runs) among them."""
    torch = _torch()
    import autotile

    g = torch.Generator(device="cuda").manual_seed(1)

    def t(*shape):
        return torch.rand(*shape, device="cuda", generator=g) - 0.5

    cases = [(lambda: t(37, 53), t(53, 29)), (lambda: t(1, 301), t(97, 301).T), (lambda: t(5, 37, 53), t(5, 53, 29)),
             (lambda: t(2, 3, 37, 53), t(2, 3, 53, 29))]
    for make_a, b in cases:
        results = []
        for _ in range(3):  # the first call prepares; the others take the repeated path
            a = make_a()
            y = autotile.matmul(a, b)
            assert y.is_contiguous() and y.shape == (*a.shape[:-1], b.shape[-1])
            assert _rel(y, a.double() @ b.double()) < kernels.tolerance("float32", a.shape[-1])
            results.append(y)
        assert len({r.data_ptr() for r in results}) == 3  # each call's own storage
    A = t(61, 43)
    ys = [autotile.matvec(A, v) for v in (t(43), t(43))]
    assert ys[0].data_ptr() != ys[1].data_ptr() and all(y.is_contiguous() and y.shape == (61,) for y in ys)


def test_torch_runs_on_the_callers_stream_without_a_synchronisation():
    torch = _torch()
    import autotile

    M = N = K = 2048
    x = torch.empty(M, K, device="cuda")
    w = torch.empty(N, K, device="cuda")
    out = torch.empty(M, N, device="cuda")
    side = torch.cuda.Stream()
    autotile.matmul(x, w.T, out=out)  # prepared (selection, compile) before the timed part
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy, then the inputs are written on it
        x.copy_(torch.rand(M, K, device="cuda") - 0.5)
        w.copy_(torch.rand(N, K, device="cuda") - 0.5)
        out.fill_(float("nan"))
        autotile.matmul(x, w.T, out=out)  # the current stream is the side stream: ordered after the writes
    torch.cuda.synchronize()
    assert _rel(out, x.double() @ w.T.double()) < kernels.tolerance("float32", K)
    # and an explicit stream= wins over the current one
    out.fill_(float("nan"))
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.mul_(2)
    autotile.matmul(x, w.T, out=out, stream=side)
    torch.cuda.synchronize()
    assert _rel(out, x.double() @ w.T.double()) < kernels.tolerance("float32", K)


def _records(kernel: str, shape: tuple[int, ...]) -> list:
    from autotile.dispatch.cache import TuningCache
    from autotile.runtime.device import live_device

    return [r for _, r in TuningCache().entries(live_device().fingerprint)
            if (r.kernel, r.dtype, tuple(r.shape)) == (kernel, "float32", shape)]


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_a_first_call_inside_a_graph_capture_runs_untuned_and_the_next_call_outside_tunes(framework,
                                                                                         isolated_cache):
    """Tuning at first call synchronises the GPU: inside a capture (torch's global mode, CuPy's) it would
    invalidate the capture, so the captured call runs the selection chain's choice and stores nothing, and the
    first call outside the capture tunes."""
    import cupy

    import autotile
    from autotile.library import calls as ops

    batch, M, N, K = shape = (6, 132, 68, 260)  # rows 16-byte aligned (no padded plan), no side a tile's multiple
    if framework == "torch":
        torch = _torch()
        a, b = torch.rand(batch, M, K, device="cuda") - 0.5, torch.rand(batch, K, N, device="cuda") - 0.5
        out = torch.empty(batch, M, N, device="cuda")
    else:
        rng = cupy.random.default_rng(3)
        a, b = rng.random((batch, M, K), dtype=cupy.float32) - 0.5, rng.random((batch, K, N), dtype=cupy.float32) - 0.5
        out = cupy.empty((batch, M, N), dtype=cupy.float32)
    ops.forget()
    autotile.tune_at_first_call(True)
    try:
        if framework == "torch":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # the first call of the shape, in global capture mode
                autotile.matmul(a, b, out=out)
            replay = graph.replay
        else:
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                stream.begin_capture()
                autotile.matmul(a, b, out=out)
                cupy_graph = stream.end_capture()

            def replay() -> None:
                cupy_graph.launch(stream)
                stream.synchronize()
        assert _records("bmm", shape) == []  # nothing was timed inside the capture, nor kept for later calls
        assert [key for key in ops._prepared if key[4] == shape] == []
        if framework == "torch":
            out.fill_(float("nan"))
        else:
            out.fill(float("nan"))
        replay()
        cupy.cuda.runtime.deviceSynchronize()
        ref = cupy.asarray(a).astype(cupy.float64) @ cupy.asarray(b).astype(cupy.float64)
        error = float(cupy.linalg.norm(cupy.asarray(out) - ref) / cupy.linalg.norm(ref))
        assert error <= kernels.tolerance("float32", K)
        autotile.matmul(a, b)  # outside the capture: tuned now
        steps = [prepared.selection.step for key, prepared in ops._prepared.items() if key[4] == shape]
    finally:
        autotile.tune_at_first_call(None)
        ops.forget()
    assert steps == ["first call"]
    assert len(_records("bmm", shape)) <= 1  # one record where a generated candidate ran (with a database)


@pytest.mark.parametrize("shape", [(512, 512, 512), (64, 64, 8192), (131, 67, 257)])
def test_torch_cuda_graph_capture_and_replay_on_new_values(shape):
    torch = _torch()
    import autotile

    M, N, K = shape
    x = torch.rand(M, K, device="cuda") - 0.5
    w = torch.rand(N, K, device="cuda") - 0.5
    out = torch.empty(M, N, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as for any library: selection, compile, split-K buffers
        autotile.matmul(x, w.T, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        autotile.matmul(x, w.T, out=out)
    for _ in range(2):
        x.copy_(torch.rand(M, K, device="cuda") - 0.5)
        w.copy_(torch.rand(N, K, device="cuda") - 0.5)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(out, x.double() @ w.T.double()) < kernels.tolerance("float32", K)


def test_cupy_graph_capture_and_replay():
    import cupy

    import autotile

    x = cupy.random.random((300, 200), dtype=cupy.float32) - 0.5
    w = cupy.random.random((100, 200), dtype=cupy.float32) - 0.5
    out = cupy.empty((300, 100), dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        autotile.matmul(x, w.T, out=out)
        stream.begin_capture()
        autotile.matmul(x, w.T, out=out)
        graph = stream.end_capture()
    x[...] = cupy.random.random((300, 200), dtype=cupy.float32) - 0.5
    out.fill(cupy.nan)
    cupy.cuda.runtime.deviceSynchronize()  # written on the current stream, which a non-blocking one does not wait for
    graph.launch(stream)
    stream.synchronize()
    ref = x.astype(cupy.float64) @ w.T.astype(cupy.float64)
    assert float(cupy.linalg.norm(out - ref) / cupy.linalg.norm(ref)) < kernels.tolerance("float32", 200)


def test_torch_compile_traces_the_custom_operators_without_a_graph_break():
    torch = _torch()
    import autotile.torch  # noqa: F401  (registers torch.ops.autotile)

    def layer(x, w, b):
        return torch.relu(torch.ops.autotile.matmul(x, w.T) + b)

    x = torch.rand(256, 512, device="cuda") - 0.5
    w = torch.rand(128, 512, device="cuda") - 0.5
    b = torch.rand(128, device="cuda")
    explained = torch._dynamo.explain(layer)(x, w, b)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(layer)
    y = compiled(x, w, b)
    assert _rel(y, torch.relu(x.double() @ w.T.double() + b.double())) < kernels.tolerance("float32", 512)


@pytest.mark.parametrize("choice", ["tf32x3-64-split8", "cublas"])
def test_torch_compile_reduce_overhead_records_and_replays_the_operators(monkeypatch, choice):
    # torch.compile's CUDA graph trees warm up with torch's allocations in their graph's pool and refuse to
    # record while a tensor of that pool outlives a call without being its output. What a repeated call
    # keeps (the split-K workspace and tickets of a last_block kernel, the output allocator's one-element
    # template) must come from elsewhere; the replays must compute on each call's new inputs.
    torch = _torch()
    import autotile.torch  # noqa: F401  (registers torch.ops.autotile)
    from autotile.dispatch import select as select_mod
    from autotile.library import calls

    spec = kernels.get("matmul")
    forced = None if choice == "cublas" else spec.space.named(choice)
    monkeypatch.setattr(select_mod, "select", lambda key, device, cache=None, precision=None: select_mod.Selection(
        forced, "exact", None, None, "cublas" if forced is None else "generated", precision=precision))
    counters = torch._dynamo.utils.counters
    counters.clear()
    calls.forget()
    try:
        def layers(x, ws):
            for w in ws:
                x = torch.ops.autotile.matmul(x, w.T)
            return x

        K = 512
        ws = [(torch.rand(K, K, device="cuda") - 0.5) / K ** 0.5 for _ in range(3)]
        compiled = torch.compile(layers, mode="reduce-overhead", fullgraph=True)
        for step in range(4):  # warm-up, recording, replays
            x = torch.rand(5, K, device="cuda") - 0.5
            y = compiled(x, ws).clone()
            ref = x.double()
            for w in ws:
                ref = ref @ w.T.double()
            assert _rel(y, ref) < 3 * kernels.tolerance("float32", K), step
        assert not counters["inductor"]["cudagraph_skips"]  # the graphs ran, not the eager fallback
    finally:
        calls.forget()


def test_autograd_through_the_operator_matches_torch():
    torch = _torch()
    import autotile

    x = (torch.rand(65, 33, device="cuda", dtype=torch.float64) - 0.5).requires_grad_()
    w = (torch.rand(17, 33, device="cuda", dtype=torch.float64) - 0.5).requires_grad_()
    autotile.matmul(x, w.T).square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    (x @ w.T).square().sum().backward()
    assert torch.allclose(gx, x.grad) and torch.allclose(gw, w.grad)


def test_matvec_gradients_through_the_operator_match_torch():
    """`autotile.matvec` on tensors that need a gradient records the differentiable operator (before, the
    gradient was silently dropped), for a row- and a column-major A; its backward is differentiable again."""
    torch = _torch()
    import autotile

    def leaf(*shape):
        return (torch.rand(*shape, device="cuda", dtype=torch.float64) - 0.5).requires_grad_()

    for a in (leaf(65, 33), leaf(33, 65).mT):
        x = leaf(33)
        y = autotile.matvec(a, x)
        assert y.grad_fn is not None
        y.square().sum().backward()
        leaf_a = a if a.is_leaf else a._base
        ga, gx = leaf_a.grad.clone(), x.grad.clone()
        leaf_a.grad = x.grad = None
        (a @ x).square().sum().backward()
        assert torch.allclose(ga, leaf_a.grad) and torch.allclose(gx, x.grad)
        assert torch.autograd.gradcheck(torch.ops.autotile.matvec, (a.detach().requires_grad_(), x))
        assert torch.autograd.gradgradcheck(torch.ops.autotile.matvec, (a.detach().requires_grad_(), x))
    with torch.no_grad():
        assert autotile.matvec(leaf(5, 3), leaf(3)).grad_fn is None
    with pytest.raises(autotile.AutotileError, match="out= or stream="):
        autotile.matvec(leaf(5, 3), leaf(3), out=torch.empty(5, device="cuda", dtype=torch.float64))


def test_the_operators_pass_torchs_own_checks():
    # torch.library.opcheck: the schema, the shape functions against the kernels, the autograd registration
    # and AOT tracing (what torch.compile does with the operators); the inputs need a gradient for the last
    torch = _torch()
    import autotile.torch  # noqa: F401

    def leaf(*shape):
        return (torch.rand(*shape, device="cuda", dtype=torch.float64) - 0.5).requires_grad_()

    w = leaf(17, 33)
    torch.library.opcheck(torch.ops.autotile.matmul.default, (leaf(65, 33), w.T))
    torch.library.opcheck(torch.ops.autotile.matmul.default, (leaf(3, 65, 33), leaf(33, 17), "highest"))
    torch.library.opcheck(torch.ops.autotile.matvec.default, (leaf(65, 33), leaf(33)))
    torch.library.opcheck(torch.ops.autotile.matvec.default, (leaf(33, 65).mT, leaf(33)))
    out = torch.empty(65, 17, device="cuda", dtype=torch.float64)
    torch.library.opcheck(torch.ops.autotile.matmul_out.default, (leaf(65, 33).detach(), w.detach().T, out))


def test_gradients_of_a_broadcast_batch_and_the_second_derivative():
    torch = _torch()
    import autotile.torch  # noqa: F401

    a = (torch.rand(3, 9, 5, device="cuda", dtype=torch.float64) - 0.5).requires_grad_()
    b = (torch.rand(5, 7, device="cuda", dtype=torch.float64) - 0.5).requires_grad_()
    assert torch.autograd.gradcheck(torch.ops.autotile.matmul, (a, b))
    assert torch.autograd.gradgradcheck(torch.ops.autotile.matmul, (a, b))
    with torch.no_grad():  # no gradient wanted: no graph recorded
        assert torch.ops.autotile.matmul(a, b).grad_fn is None
    with torch.inference_mode():
        assert torch.ops.autotile.matmul(a.detach(), b.detach()).shape == (3, 9, 7)
    # under a functorch transform the call goes through the dispatcher (here vmap's per-matrix fallback)
    mapped = torch.vmap(lambda m: torch.ops.autotile.matmul(m, b.detach()))(a.detach())
    assert torch.allclose(mapped, a.detach() @ b.detach())
