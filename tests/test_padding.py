"""The padded plan (autotile/codegen/padding.py, autotile/library/padding.py): a float32 matmul whose operands'
rows do not start 16-byte aligned computed on zero-padded copies.

Without a GPU: the padded shapes in every layout give the same product on the original rows and columns
(NumPy, exact integer arithmetic), where the rule takes the plan, the copy kernels compile. On a GPU: the
library's results through the plan against a float64 reference (every layout, batches with a shared B,
views that start mid-vector, torch tensors), the non-finite pattern kept, and the rule's own path on a
shape it takes.
"""

from __future__ import annotations

import numpy as np
import pytest

from autotile.codegen import build
from autotile.codegen import padding as shapes_mod
from autotile.dispatch.select import Selection
from autotile.library import padding

LAYOUTS = ("nn", "nt", "tn", "tt")


def _stored(x: np.ndarray, trans: bool) -> np.ndarray:
    """The matrix as the layout stores it: transposed (contiguous) where its letter is "t"."""
    return np.ascontiguousarray(x.T) if trans else x


def _pad(stored: np.ndarray, copy: shapes_mod.Copy) -> np.ndarray:
    assert stored.shape == (copy.rows, copy.cols)
    out = np.zeros((copy.padded_rows, copy.padded_cols), stored.dtype)
    out[:copy.rows, :copy.cols] = stored
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(5, 7, 9), (1, 3, 1), (8, 13, 6), (33, 2, 17), (4, 4, 4)])
def test_the_padded_product_holds_the_product(layout, shape):
    m, n, k = shape
    rng = np.random.default_rng(sum(shape))
    a, b = rng.integers(-9, 10, (m, k)).astype(np.float64), rng.integers(-9, 10, (k, n)).astype(np.float64)
    plan = shapes_mod.padded(layout, shape, 4)
    mp, np_, kp = plan.shape
    a_pad = _pad(_stored(a, layout[0] == "t"), plan.a)
    b_pad = _pad(_stored(b, layout[1] == "t"), plan.b)
    # the padded operands read in the same layout, at the padded shape
    a_read = a_pad.T if layout[0] == "t" else a_pad
    b_read = b_pad.T if layout[1] == "t" else b_pad
    assert a_read.shape == (mp, kp) and b_read.shape == (kp, np_)
    assert np.array_equal((a_read @ b_read)[:m, :n], a @ b)
    # every padded operand's rows are 16-byte multiples; nothing padded that need not be
    for copy in (plan.a, plan.b):
        assert copy.padded_cols * 4 % shapes_mod.ALIGN_BYTES == 0
        assert copy.padded_cols - copy.cols < 4 and copy.padded_rows - copy.rows < 4
    assert (mp == m) == (layout[0] == "n") or m % 4 == 0
    assert (np_ == n) == (layout[1] == "t") or n % 4 == 0


def test_c_aligned_pads_n_in_every_layout():
    """align_c (the 16-bit types): N padded where B is stored N x K as well, B's added rows zeros."""
    plan = shapes_mod.padded("nt", (5, 9, 8), 2, align_c=True)
    assert plan.shape == (5, 16, 8) and plan.b == shapes_mod.Copy(9, 8, 16, 8) and not plan.a.needed
    assert shapes_mod.padded("nt", (5, 9, 8), 2).shape == (5, 9, 8)
    assert padding.padded_shape("nt", (5, 9, 8), "bfloat16") == (5, 16, 8)
    assert padding.padded_shape("nt", (5, 9, 8), "float32") == (5, 9, 8)


def test_a_batch_keeps_its_count_and_aligned_shapes_stay():
    plan = shapes_mod.padded("nn", (6, 101, 203, 305), 4)
    assert plan.shape == (6, 101, 204, 308)
    assert not shapes_mod.padded("nt", (100, 200, 300), 4).a.needed
    assert shapes_mod.padded("nn", (3, 5, 7), 8).shape == (3, 6, 8)  # float64: 2 elements to 16 bytes


@pytest.mark.parametrize("dtype,setting,kernel,layout,shape,expected", [
    ("float32", "high", "matmul", "nn", (4096, 4096, 4095), True),  # K odd
    ("float32", "high", "matmul", "nt", (2049, 3001, 2048), False),  # rows of K (A) and K (B): aligned
    ("float32", "high", "matmul", "tn", (2049, 3001, 2048), True),  # A stored K x M: rows of M = 2049
    ("float32", "high", "matmul", "nn", (4096, 4096, 4096), False),  # aligned
    ("float32", "high", "matmul", "nn", (64, 4096, 4095), True),  # short M: weighed (the predictions decide)
    ("float32", "high", "matmul", "nn", (511, 511, 1023), False),  # under MIN_VOLUME
    ("float32", "high", "bmm", "nn", (8, 511, 511, 1023), True),  # a batch's volume
    ("float32", "highest", "matmul", "nn", (4096, 4096, 4095), False),  # no tf32x3: nothing to pad for
    ("float64", "high", "matmul", "nn", (4096, 4096, 4095), False),
    # the 16-bit types: C's rows count too (cuBLAS runs them 3-7x slower unaligned), whatever the setting
    ("bfloat16", "highest", "matmul", "nn", (4096, 4096, 4095), True),
    ("bfloat16", "high", "matmul", "nt", (2049, 3001, 2048), True),  # rows of C: N = 3001
    ("float16", "high", "matmul", "nt", (2049, 3000, 2048), False),  # every row a multiple of 8 elements
    ("float16", "high", "bmm", "tt", (4, 2048, 1024, 1020), True),  # rows of K = 1020 in B
    ("int8", "high", "matmul", "nt", (4096, 4096, 4088), True),  # rows of K = 4088 bytes
    ("int8", "high", "matmul", "nt", (4096, 4100, 4096), False),  # int8's C is int32: rows of 16400 bytes
    ("int8", "high", "matmul", "nn", (4096, 4104, 4096), True),  # B's rows of N = 4104 bytes
])
def test_where_the_plan_is_weighed(dtype, setting, kernel, layout, shape, expected):
    assert padding.applies(dtype, setting, kernel, layout, shape) is expected


def test_the_plan_can_be_turned_off():
    assert padding.enabled()
    try:
        assert not padding.enabled(False)
        assert not padding.applies("float32", "high", "matmul", "nn", (4096, 4096, 4095))
    finally:
        padding.enabled(True)
    assert padding.applies("float32", "high", "matmul", "nn", (4096, 4096, 4095))


def test_the_copies_cost_their_bytes_and_launches():
    """A copy reads an operand and writes its padded matrices (both operands in one launch); C, where N grew,
    is read padded and written back (a second launch); a B shared by the batch is copied once."""
    per_byte, launch = 1 / padding.COPY_BYTES_PER_MS, padding.COPY_LAUNCH_MS
    # K = 7 -> 8: A 10 x 7 -> 10 x 8 and B 7 x 12 -> 8 x 12, twice
    assert padding.copy_ms("nn", (2, 10, 12, 7), "float32") == pytest.approx(
        2 * (70 + 80 + 84 + 96) * 4 * per_byte + launch)
    assert padding.copy_ms("nn", (2, 10, 12, 7), "float32", (70, 0)) == pytest.approx(
        (2 * (70 + 80) + 84 + 96) * 4 * per_byte + launch)
    # N = 9 -> 12: B 8 x 9 -> 8 x 12, and C's 5 x 12 back to 5 x 9
    assert padding.copy_ms("nn", (5, 9, 8), "float32") == pytest.approx((72 + 96 + 60 + 45) * 4 * per_byte + 2 * launch)


def test_int8s_copies_count_its_int32_c():
    """int8: the operands' bytes, and C's columns back at 4 bytes an element."""
    per_byte, launch = 1 / padding.COPY_BYTES_PER_MS, padding.COPY_LAUNCH_MS
    # K = 8 -> 16: A 5 x 8 -> 5 x 16; N = 9 -> 16: B 8 x 9 -> 16 x 16; C's 5 x 16 int32 back to 5 x 9
    assert padding.copies("nn", (5, 9, 8), "int8") == ((40 + 80) + (72 + 256) + 4 * (80 + 45), 2)
    assert padding.copy_ms("nn", (5, 9, 8), "int8") == pytest.approx(
        ((40 + 80) + (72 + 256) + 4 * (80 + 45)) * per_byte + 2 * launch)


def _selection(config, step: str, predicted_ms, implementation: str = "generated") -> Selection:
    return Selection(config, step, None, implementation=implementation, step=step, predicted_ms=predicted_ms)


def test_the_plan_pays_where_its_predicted_time_beats_the_call_as_it_is():
    from autotile.codegen import kernels

    config = kernels.get("matmul").space.named("tf32x3-64")
    shape = (2048, 1024, 1023)  # under the sizes measured to pay: the predictions decide
    copies = padding.copy_ms("nn", shape, "float32")
    padded = _selection(config, "model", 1.0)
    just_faster = (1.0 + copies) * (1 + padding.MARGIN) * 1.01
    assert padding.pays(_selection(None, "model", just_faster, "cublas"), padded, "nn", shape, "float32")
    assert not padding.pays(_selection(None, "model", just_faster / 1.03, "cublas"), padded, "nn", shape, "float32")
    direct = _selection(None, "model", 10.0, "cublas")
    # the padded shape's choice must be a generated kernel a record or the model picked, with a time
    assert padding.pays(direct, _selection(config, "exact", 1.0), "nn", shape, "float32")
    assert not padding.pays(direct, _selection(None, "model", 1.0, "cublas"), "nn", shape, "float32")
    assert not padding.pays(direct, _selection(config, "nearest", 1.0), "nn", shape, "float32")
    assert not padding.pays(direct, _selection(config, "model", None), "nn", shape, "float32")
    # a choice borrowed from nn's model for a transposed layout has no predicted time: the measured sizes
    assert padding.pays(direct, _selection(config, "model", None), "tn", (4096, 4096, 4095), "float32")
    # back to back, a padded call takes at least the host's time for its three launches
    tiny = _selection(config, "model", 1e-4)
    assert not padding.pays(_selection(None, "model", padding.HOST_MS, "cublas"), tiny, "nn", (5, 9, 8), "float32")
    assert padding.pays(_selection(None, "model", 2 * padding.HOST_MS, "cublas"), tiny, "nn", (5, 9, 8), "float32")
    # the sizes measured to pay take it whatever the predictions say; the call as it is without a
    # prediction, only those
    faster = _selection(None, "model", 0.01, "cublas")
    assert padding.pays(faster, padded, "nn", (4096, 4096, 4095), "float32")
    assert not padding.pays(faster, padded, "nn", (1000, 4096, 4095), "float32")
    assert not padding.pays(faster, padded, "nn", (4096, 4096, 401), "float32")
    unknown = _selection(config, "nearest", None)
    assert padding.pays(unknown, padded, "nn", (4096, 4096, 4095), "float32")
    assert not padding.pays(unknown, padded, "nn", shape, "float32")
    # a batch under those sizes: not on predictions (they ran 1.35-1.5x optimistic for small padded batches)
    assert not padding.pays(_selection(None, "model", 10.0, "cublas"), padded, "nn", (2, 1024, 1024, 1023), "float32")
    assert padding.pays(_selection(None, "model", 10.0, "cublas"), padded, "nn", (9, 1024, 1024, 1023), "float32")
    # a call as it is that runs the kernels splitting once (any rows at full speed): the predictions decide,
    # at the measured sizes too
    presplit = kernels.get("matmul").space.named("wgmma-128-presplit")
    assert presplit.get("LOADER") == "presplit" and padding.reads_any_rows(_selection(presplit, "model", 1.0))
    assert not padding.reads_any_rows(_selection(config, "model", 1.0))
    assert not padding.reads_any_rows(_selection(None, "model", 1.0, "cublas"))
    large = (4096, 4096, 4095)
    same = _selection(presplit, "model", 1.0)
    assert not padding.pays(_selection(presplit, "model", 1.0), same, "nn", large, "float32")
    assert padding.pays(_selection(presplit, "model", 2.0), same, "nn", large, "float32")
    assert not padding.pays(_selection(presplit, "model", None), same, "nn", large, "float32")
    # but never onto a padded choice that is not what the padding is for
    assert not padding.pays(faster, _selection(None, "model", 1.0, "cublas"), "nn", (4096, 4096, 4095), "float32")


def test_for_the_16_bit_types_the_padded_shapes_cublas_is_worth_it():
    """cuBLAS's 16-bit and int8 GEMMs want aligned rows: the padded shape's cuBLAS, a choice of the model (its
    own or borrowed), is what the plan is for; without predicted times at the sizes measured to pay only, and
    never onto a default that knows nothing of the shape. With them, a 16-bit batch under those sizes takes it
    where the padded shape's time and the copies' are under the call's by MARGIN (the model's cuBLAS times
    tell aligned rows from others on large problems); a float32 batch does not."""
    cublas = _selection(None, "model", None, "cublas")
    shape = (80, 434, 212, 668)  # under the measured sizes
    for dtype in ("bfloat16", "float16"):
        copies = padding.copy_ms("nn", shape, dtype)
        slow = (0.01 + copies) * (1 + padding.MARGIN) * 1.01
        padded = _selection(None, "model", 0.01, "cublas")
        assert padding.pays(_selection(None, "model", slow, "cublas"), padded, "nn", shape, dtype)
        assert not padding.pays(_selection(None, "model", slow / 1.03, "cublas"), padded, "nn", shape, dtype)
    from autotile.codegen import kernels

    tf32x3 = _selection(kernels.get("bmm").space.named("tf32x3-64"), "model", 0.01)
    assert not padding.pays(_selection(None, "model", 10.0, "cublas"), tf32x3, "nn", shape, "float32")
    for dtype in ("bfloat16", "float16"):
        assert padding.pays(cublas, cublas, "nt", (1398, 6313, 1452), dtype)
        assert padding.pays(cublas, cublas, "nn", (3, 900, 900, 900), dtype)  # 2^31.03 multiply-adds
        assert not padding.pays(cublas, cublas, "nn", (1200, 1300, 1300), dtype)  # 2^30.9: under 2^31
        assert not padding.pays(cublas, cublas, "nn", (80, 434, 212, 668), dtype)  # sides of 212
        # the copies of A, B and C against the product: 160 TFLOP/s at the copies' rate, under 300
        assert not padding.pays(cublas, cublas, "nt", (737, 4278, 297), dtype)
        assert padding.pays(cublas, cublas, "nt", (7034, 6836, 311), dtype)
        assert not padding.pays(cublas, _selection(None, "built-in default", None, "cublas"), "nt",
                                (1398, 6313, 1452), dtype)
    # int8: K of at least 512, 1000 flops per byte copied
    assert padding.pays(cublas, cublas, "nt", (1459, 7704, 3704), "int8")
    assert not padding.pays(cublas, cublas, "nt", (2448, 3944, 360), "int8")  # K under 512
    assert not padding.pays(cublas, cublas, "nt", (487, 7984, 5048), "int8")  # 459 flops per byte
    assert not padding.pays(cublas, cublas, "nt", (1398, 6313, 1452), "float32")


def test_the_copy_kernels_threads_cover_their_elements():
    """One thread per 16-byte vector for 4- and 8-byte elements; for narrower ones a warp per run of 32
    vectors' elements: of the padded matrix read as one array (so rows narrower than a run leave no lanes
    idle), and, copying back, of a row where rows are at least a run long, else of the matrix."""
    assert shapes_mod.copy_threads(7, 8, 4) == 14
    assert shapes_mod.copy_threads(1752, 56, 2) == -(-1752 * 56 // 256) * 32  # B of 1747 x 49 bfloat16, padded
    assert shapes_mod.copy_threads(3, 16, 1) == 32  # 48 bytes: one warp, most lanes with one element
    assert shapes_mod.unpad_threads(829, 1995, 2000, 2) == 829 * 8 * 32  # a warp per run of 256 of each row
    assert shapes_mod.unpad_threads(33, 49, 56, 2) == -(-33 * 49 // 256) * 32
    assert shapes_mod.unpad_threads(5, 9, 12, 4) == 5 * 3


@pytest.mark.parametrize("dtype,arch", [("float32", "sm_90"), ("float32", "sm_80"), ("float64", "sm_80"),
                                        ("bfloat16", "sm_80"), ("float16", "sm_90"), ("int8", "sm_80"),
                                        ("int32", "sm_90")])
def test_the_copy_kernels_compile(dtype, arch):
    result = build.compile(shapes_mod.render(dtype), arch)
    assert {u.function for u in result.usages} == set(shapes_mod.KERNEL_NAMES)
    assert all(u.spill_stores == 0 and u.stack_frame == 0 for u in result.usages), result.log


# -- on the GPU -------------------------------------------------------------------------------------------

# Sizes that put rows anywhere in a vector; batches, one with a B shared by the batch.
GPU_SHAPES = [(131, 257, 517), (300, 514, 258), (5, 1025, 333), (64, 61, 1)]
GPU_BATCHED = [(3, 131, 257, 129), (4, 67, 130, 258)]


@pytest.fixture
def every_shape_padded(monkeypatch):
    """The plan on every shape it applies to (MIN_VOLUME 1, `pays` always), whatever the padded shape's
    choice, counting its calls."""
    taken: list[tuple[int, ...]] = []
    call = padding.PaddedCall.__call__

    def counted(self, *args):
        taken.append((self.m, self.n))
        return call(self, *args)

    monkeypatch.setattr(padding, "MIN_VOLUME", 1)
    monkeypatch.setattr(padding, "pays", lambda *args, **kwargs: True)
    monkeypatch.setattr(padding.PaddedCall, "__call__", counted)
    from autotile.library import calls

    calls.forget()
    yield taken
    calls.forget()


def _operands(cupy, layout: str, shape: tuple[int, ...], offset: int = 0, shared_b: bool = False):
    """A and B stored as `layout` says, random normal, views `offset` elements into their buffers."""
    *batch, m, n, k = shape
    rng = cupy.random.default_rng(sum(shape) + offset)

    def make(rows: int, cols: int, trans: bool, count: list[int]):
        dims = (*count, cols, rows) if trans else (*count, rows, cols)
        size = int(np.prod(dims))
        x = rng.standard_normal(size + offset, dtype=cupy.float32)[offset:].reshape(dims)
        return x.swapaxes(-1, -2) if trans else x

    a = make(m, k, layout[0] == "t", batch)
    b = make(k, n, layout[1] == "t", [] if shared_b else batch)
    return a, b


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_padded_results_match_the_reference(layout, every_shape_padded):
    import cupy

    import autotile
    from autotile.codegen import kernels
    from autotile.runtime.timing import relative_error

    failures = []
    cases = [(s, 0, False) for s in GPU_SHAPES] + [(s, 1, False) for s in GPU_SHAPES[:2]] + \
        [(s, 0, False) for s in GPU_BATCHED] + [(GPU_BATCHED[0], 0, True)]
    for shape, offset, shared_b in cases:
        a, b = _operands(cupy, layout, shape, offset, shared_b)
        ref = kernels.to_float64(a) @ kernels.to_float64(b)
        out = cupy.full(ref.shape, cupy.nan, dtype=cupy.float32)
        autotile.matmul(a, b, out=out)
        err = relative_error(out, ref)
        if not err <= kernels.tolerance("float32", shape[-1]):
            failures.append(f"{layout} {shape} +{offset}{' shared B' if shared_b else ''}: {err:.2e}")
    assert failures == []
    aligned = [c for c in cases if not padding.applies("float32", "high", "bmm" if len(c[0]) == 4 else "matmul",
                                                       layout, c[0])]
    assert len(every_shape_padded) == len(cases) - len(aligned) > 0


@pytest.mark.gpu
def test_a_repeated_call_runs_the_padded_plan_again_on_new_values(every_shape_padded):
    """The second call of a signature takes the memoized `PaddedCall` (no re-planning): new values, new
    output buffers, the caller's stream."""
    import cupy

    import autotile
    from autotile.codegen import kernels
    from autotile.library import calls
    from autotile.runtime.timing import relative_error

    a, b = _operands(cupy, "nn", (300, 514, 258))
    autotile.matmul(a, b)
    assert len(every_shape_padded) == 1 and len(calls._calls) == 1
    stream = cupy.cuda.Stream(non_blocking=True)
    for scale in (2.0, -3.0):
        with stream:  # the new values made on the call's stream: a non-blocking stream waits for no other
            a2, b2 = a * scale, b + 1
            out = autotile.matmul(a2, b2)
        stream.synchronize()
        ref = kernels.to_float64(a2) @ kernels.to_float64(b2)
        assert relative_error(out, ref) <= kernels.tolerance("float32", 258)
    assert len(every_shape_padded) == 3


@pytest.mark.gpu
def test_padded_results_keep_the_non_finite_pattern(every_shape_padded):
    import cupy

    import autotile
    from autotile.codegen import kernels

    a, b = _operands(cupy, "nn", (263, 389, 517))
    a[7, 11], a[100, 3] = cupy.inf, cupy.nan
    b[5, 200] = -cupy.inf
    ref = kernels.to_float64(a) @ kernels.to_float64(b)
    out = autotile.matmul(a, b)
    assert every_shape_padded
    assert bool(cupy.all(cupy.isnan(out) == cupy.isnan(ref))) and bool(cupy.all(cupy.isinf(out) == cupy.isinf(ref)))
    finite = cupy.isfinite(ref)
    err = float(cupy.linalg.norm((out - ref)[finite]) / cupy.linalg.norm(ref[finite]))
    assert err <= kernels.tolerance("float32", 517)


@pytest.mark.gpu
def test_torch_tensors_through_the_padded_plan(every_shape_padded):
    torch = pytest.importorskip("torch")
    import autotile

    a = torch.randn(300, 517, device="cuda")
    b = torch.randn(517, 257, device="cuda")
    out = autotile.matmul(a, b)
    ref = a.double() @ b.double()
    assert out.dtype == torch.float32 and every_shape_padded
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_16_bit_torch_tensors_through_the_padded_plan(layout, dtype, every_shape_padded):
    """Every layout, odd K, odd N (C's rows: N padded in nt and tt too), a batch, a batch of matrices whose
    padded rows are narrower than a warp's run (the copies step across rows), specials: the result within
    1.5x torch's error against float64, the NaN and Inf pattern torch's, the output poisoned before."""
    torch = pytest.importorskip("torch")
    import autotile

    kind = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(5)
    for shape in ((131, 257, 517), (300, 514, 258), (3, 67, 131, 130), (6, 19, 7, 45), (5, 1025, 336)):
        *batch, m, n, k = shape
        a = torch.randn(*batch, k, m, device="cuda", generator=gen).to(kind).transpose(-1, -2) if layout[0] == "t" \
            else torch.randn(*batch, m, k, device="cuda", generator=gen).to(kind)
        b = torch.randn(*batch, n, k, device="cuda", generator=gen).to(kind).transpose(-1, -2) if layout[1] == "t" \
            else torch.randn(*batch, k, n, device="cuda", generator=gen).to(kind)
        if shape == (300, 514, 258):
            a[7, 11], a[100, 3] = float("inf"), float("nan")
            b[5, 200] = -float("inf")
        out = torch.full((*batch, m, n), float("nan"), dtype=kind, device="cuda")
        taken = len(every_shape_padded)
        autotile.matmul(a, b, out=out)
        assert len(every_shape_padded) == taken + 1, (layout, shape)
        ref = a.double() @ b.double()
        theirs = torch.matmul(a, b)
        assert torch.equal(out.isnan(), theirs.isnan()) and torch.equal(out.isinf(), theirs.isinf())
        finite = ref.isfinite()
        err = float((out.double() - ref)[finite].norm() / ref[finite].norm())
        torch_err = float((theirs.double() - ref)[finite].norm() / ref[finite].norm())
        assert err <= 1.5 * torch_err + 1e-6, (layout, shape, err, torch_err)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_int8_through_the_padded_plan(layout, every_shape_padded):
    """Every layout, rows of K or N that are not multiples of 16 bytes, a batch, a batch of narrow matrices
    (rows of 8 elements): exact int32 sums, C's int32 columns copied back, the output poisoned before."""
    torch = pytest.importorskip("torch")
    import autotile

    gen = torch.Generator(device="cuda").manual_seed(3)

    def operand(batch, rows, cols, trans):
        shape = (*batch, cols, rows) if trans else (*batch, rows, cols)
        x = torch.randint(-128, 128, shape, dtype=torch.int8, device="cuda", generator=gen)
        return x.transpose(-1, -2) if trans else x

    for shape in ((131, 257, 520), (300, 514, 264), (3, 67, 131, 136), (5, 21, 8, 40), (40, 1025, 344)):
        *batch, m, n, k = shape
        a, b = operand(batch, m, k, layout[0] == "t"), operand(batch, k, n, layout[1] == "t")
        out = torch.full((*batch, m, n), -12345, dtype=torch.int32, device="cuda")
        taken = len(every_shape_padded)
        autotile.matmul(a, b, out=out)
        assert len(every_shape_padded) == taken + 1, (layout, shape)
        assert torch.equal(out.double(), a.double() @ b.double()), (layout, shape)


@pytest.mark.gpu
def test_the_rule_takes_the_plan_on_a_large_odd_shape(monkeypatch):
    """Without forcing: a shape the rule takes runs the plan, when the padded shape's choice is worth it."""
    import cupy

    import autotile
    from autotile.codegen import kernels
    from autotile.library import calls
    from autotile.runtime.timing import relative_error

    shape = (2053, 2051, 2049)
    assert padding.applies("float32", "high", "matmul", "nn", shape)
    taken = []
    call = padding.PaddedCall.__call__
    monkeypatch.setattr(padding.PaddedCall, "__call__", lambda self, *args: taken.append(self.m) or call(self, *args))
    calls.forget()
    a, b = _operands(cupy, "nn", shape)
    out = autotile.matmul(a, b)
    expected = calls.padded_plan("matmul", "float32", "nn", shape, "high") is not None
    assert bool(taken) == expected
    ref = kernels.to_float64(a) @ kernels.to_float64(b)
    assert relative_error(out, ref) <= kernels.tolerance("float32", shape[-1])


def test_the_padded_plan_prepares_the_padded_shape_only_where_it_pays(monkeypatch):
    """Without a GPU: both shapes' selections weighed by `padding.pays`, the padded shape prepared where the
    plan pays, nothing where it does not (each decision made once per problem)."""
    import contextlib
    import types

    from autotile.dispatch import select as select_mod
    from autotile.library import calls

    shape = (2053, 2051, 2049)
    padded_shape = padding.padded_shape("nn", shape, "float32")
    selected, prepared, plan_pays = [], [], [True]
    monkeypatch.setattr(select_mod, "select", lambda key, device, precision=None: selected.append(key.shape)
                        or Selection(None, "model", None))
    monkeypatch.setattr(padding, "pays", lambda direct, padded, layout, shape, dtype: plan_pays[0])
    monkeypatch.setattr(calls, "_device", lambda device_id: None)
    monkeypatch.setattr(calls, "_device_of", lambda device_id: contextlib.nullcontext())
    made = types.SimpleNamespace(provisional=False)  # what `_prepare` returns
    monkeypatch.setattr(calls, "_prepare", lambda kernel, dtype, layout, s, setting, device_id, stream_ptr=None:
                        prepared.append(s) or made)
    monkeypatch.setattr(calls, "_padded_plans", {})
    assert calls.padded_plan("matmul", "float32", "nn", shape, "high", 0) is made
    assert selected == [shape, padded_shape] and prepared == [padded_shape]
    assert calls.padded_plan("matmul", "float32", "nn", shape, "high", 0) is made and len(selected) == 2
    plan_pays[0] = False
    monkeypatch.setattr(calls, "_padded_plans", {})
    assert calls.padded_plan("matmul", "float32", "nn", shape, "high", 0) is None
    assert selected == [shape, padded_shape] * 2 and prepared == [padded_shape]
    # prepared inside a CUDA-graph capture without the tuning at first call it asked for: decided again next time
    plan_pays[0], made.provisional = True, True
    monkeypatch.setattr(calls, "_padded_plans", {})
    assert calls.padded_plan("matmul", "float32", "nn", shape, "high", 0, stream_ptr=7) is made
    assert calls.padded_plan("matmul", "float32", "nn", shape, "high", 0) is made
    assert prepared == [padded_shape] * 3 and calls._padded_plans == {}
