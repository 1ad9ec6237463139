"""How a call's operands map to a problem (`autotile.library.plan`): layouts from strides, batches, folding, copies."""

from __future__ import annotations

import types

import numpy as np
import pytest

from autotile.codegen.problem import ProblemKey
from autotile.dispatch import select
from autotile.errors import ArgumentError
from autotile.library.plan import batch_stride, matrix_order, plan_matmul


def _strides(x: np.ndarray) -> tuple[int, ...]:
    return tuple(s // x.itemsize for s in x.strides)


def _plan(a: np.ndarray, b: np.ndarray):
    return plan_matmul(a.shape, _strides(a), b.shape, _strides(b))


def _rowmajor(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


@pytest.mark.parametrize("a_t,b_t", [(False, False), (False, True), (True, False), (True, True)])
def test_the_four_layouts_are_read_where_they_lie(a_t, b_t):
    M, N, K = 131, 67, 257
    a = _rowmajor(K, M).T if a_t else _rowmajor(M, K)
    b = _rowmajor(N, K).T if b_t else _rowmajor(K, N)
    plan = _plan(a, b)
    assert (plan.kernel, plan.shape, plan.out_shape) == ("matmul", (M, N, K), (M, N))
    assert plan.layout == ("t" if a_t else "n") + ("t" if b_t else "n")
    assert not plan.copy_a and not plan.copy_b


def test_x_at_w_transposed_is_nt():
    x, w = _rowmajor(4096, 1024), _rowmajor(512, 1024)
    assert _plan(x, w.T).layout == "nt"


def test_a_size_one_dimension_has_no_stride_to_respect():
    assert matrix_order(1, 7, 999, 1) == "n"  # one row: its stride is never used
    assert matrix_order(7, 1, 1, 999) == "n"  # one column, rows adjacent
    assert matrix_order(1, 1, 5, 9) == "n"
    assert matrix_order(7, 1, 999, 1) is None  # one column, rows 999 apart: not packed


def test_general_strided_views_are_copied():
    a = _rowmajor(64, 128)[:, ::2]  # every other column: neither packed layout
    plan = _plan(a, _rowmajor(64, 32))
    assert plan.copy_a and not plan.copy_b
    sliced = _rowmajor(64, 128)[:, :64]  # a row stride longer than the row
    assert _plan(sliced, _rowmajor(64, 32)).copy_a
    flipped = _rowmajor(4, 64, 64)[::-1]  # a negative batch stride
    assert _plan(flipped, _rowmajor(4, 64, 8)).copy_a


def test_a_batch_runs_as_one_bmm_with_its_strides():
    a, b = _rowmajor(8, 33, 17), _rowmajor(8, 17, 5)
    plan = _plan(a, b)
    assert (plan.kernel, plan.layout, plan.shape, plan.out_shape) == ("bmm", "nn", (8, 33, 5, 17), (8, 33, 5))
    assert plan.batch_strides == (33 * 17, 17 * 5)
    transposed = _plan(_rowmajor(8, 17, 33).transpose(0, 2, 1), _rowmajor(8, 5, 17).transpose(0, 2, 1))
    assert transposed.layout == "tt" and transposed.batch_strides == (33 * 17, 17 * 5)


def test_a_2d_operand_is_broadcast_over_the_batch():
    a, b = _rowmajor(33, 17), _rowmajor(8, 17, 5)
    plan = _plan(a, b)
    assert plan.kernel == "bmm" and plan.batch_strides == (0, 17 * 5) and plan.out_shape == (8, 33, 5)
    one = _plan(_rowmajor(1, 33, 17), b)  # a batch of one is broadcast too
    assert one.batch_strides == (0, 17 * 5)


def test_a_row_major_batch_times_a_matrix_folds_into_one_tall_matmul():
    x, w = _rowmajor(4, 128, 64), _rowmajor(32, 64)
    plan = _plan(x, w.T)
    assert (plan.kernel, plan.layout, plan.shape, plan.out_shape) == ("matmul", "nt", (4 * 128, 32, 64), (4, 128, 32))
    # a transposed batch does not fold: its matrices are not one tall row-major matrix
    assert _plan(_rowmajor(4, 64, 128).transpose(0, 2, 1), w.T).kernel == "bmm"


def test_leading_batch_dimensions_merge_into_one_stride():
    a = _rowmajor(2, 3, 16, 8)
    assert batch_stride(a.shape, _strides(a)) == 16 * 8
    assert batch_stride(a[:, :2].shape, _strides(a[:, :2])) is None  # (2, 2) of a (2, 3) batch: no one stride
    plan = _plan(a, _rowmajor(2, 3, 8, 4))
    assert plan.kernel == "bmm" and plan.shape == (6, 16, 4, 8) and plan.out_shape == (2, 3, 16, 4)


def test_empty_products_compute_nothing():
    plan = _plan(_rowmajor(4, 0), _rowmajor(0, 5))
    assert plan.kernel == "" and plan.out_shape == (4, 5) and not plan.copy_a
    assert _plan(_rowmajor(0, 3, 4), _rowmajor(0, 4, 5)).out_shape == (0, 3, 5)


@pytest.mark.parametrize("a_shape,b_shape,needle", [
    ((3, 4), (5, 6), "(4 != 5)"),
    ((2, 3, 4), (3, 4, 5), "batch dimensions do not match"),
    ((4,), (4, 5), "2 or more dimensions"),
])
def test_bad_shapes_are_one_clear_line(a_shape, b_shape, needle):
    with pytest.raises(ArgumentError) as info:
        _plan(_rowmajor(*a_shape), _rowmajor(*b_shape))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_transposed_layouts_and_batches_borrow_the_nn_and_one_matrix_choice():
    assert select.borrowed_keys(ProblemKey("matmul", "float32", "nt", (64, 64, 64))) == [
        ProblemKey("matmul", "float32", "nn", (64, 64, 64))]
    assert select.borrowed_keys(ProblemKey("bmm", "float32", "tn", (8, 64, 32, 16))) == [
        ProblemKey("bmm", "float32", "nn", (8, 64, 32, 16)),
        ProblemKey("matmul", "float32", "tn", (64, 32, 16)), ProblemKey("matmul", "float32", "nn", (64, 32, 16))]
    assert select.borrowed_keys(ProblemKey("bmm", "float32", "nn", (8, 64, 32, 16))) == [
        ProblemKey("matmul", "float32", "nn", (64, 32, 16))]
    assert select.borrowed_keys(ProblemKey("matmul", "float32", "row", (64, 64, 64))) == []  # "row" is nn


def test_a_batch_lowers_the_k_splits_it_no_longer_needs():
    from autotile.codegen import kernels

    space = kernels.get("matmul").space
    config = space.named("tf32x3-64-split8")
    shape = (128, 128, 8192)  # 4 tiles x 8 splits = 32 blocks on one matrix
    assert select.fewer_splits_for_batch(config, shape, 1)["SPLIT_K"] == 8
    assert select.fewer_splits_for_batch(config, shape, 2)["SPLIT_K"] == 4
    assert select.fewer_splits_for_batch(config, shape, 64)["SPLIT_K"] == 1


@pytest.mark.parametrize("layout,shape,expected", [
    ("nn", (1, 97, 131), ("col", (97, 131), True)), ("tn", (1, 97, 131), ("col", (97, 131), True)),
    ("nt", (1, 97, 131), ("row", (97, 131), True)), ("tt", (1, 97, 131), ("row", (97, 131), True)),
    ("nn", (89, 1, 131), ("row", (89, 131), False)), ("nt", (89, 1, 131), ("row", (89, 131), False)),
    ("tn", (89, 1, 131), ("col", (89, 131), False)), ("tt", (89, 1, 131), ("col", (89, 131), False)),
    ("nn", (1, 1, 77), ("col", (1, 77), True)),
])
def test_a_matmul_of_one_row_or_column_is_planned_as_a_matvec(layout, shape, expected):
    """M = 1: y = B^T a, B^T row-major where B is column-major (the second letter "t"); N = 1: y = A b."""
    from autotile.codegen.problem import as_matvec

    assert as_matvec("matmul", "float32", layout, shape) == expected


def test_only_2d_float_matmuls_of_one_row_or_column_are_matvecs():
    from autotile.codegen.problem import as_matvec

    assert as_matvec("matmul", "float32", "nn", (2, 97, 131)) is None
    assert as_matvec("bmm", "float32", "nn", (4, 1, 97, 131)) is None
    assert as_matvec("matmul", "int8", "nt", (1, 97, 128)) is None  # no int8 matvec: cuBLAS's int8 GEMM or ours
    assert as_matvec("matmul", "bfloat16", "nt", (1, 97, 128)) == ("row", (97, 128), True)


def test_a_matmul_tuned_on_its_very_shape_is_not_turned_into_a_matvec(monkeypatch):
    """A record of the matmul itself (the selection's "exact" step) is what the user asked for: it runs."""
    import types

    from autotile.dispatch import select as select_mod
    from autotile.library import calls

    steps = {(1, 97, 131): "exact", (1, 97, 133): "model"}
    monkeypatch.setattr(calls, "_device", lambda device_id: None)
    monkeypatch.setattr(select_mod, "select",
                        lambda key, device, precision: types.SimpleNamespace(step=steps[key.shape]))
    monkeypatch.setattr(calls, "_matvec_plans", {})
    assert calls._matvec_plan("matmul", "float32", "nt", (1, 97, 131), "high", 0) is None
    assert calls._matvec_plan("matmul", "float32", "nt", (1, 97, 133), "high", 0) == ("row", (97, 133), True)
    assert calls._matvec_plan("matmul", "float32", "nt", (2, 97, 133), "high", 0) is None


def test_where_cublas_won_the_framework_is_asked_for_its_own_call():
    from autotile.library import calls
    from autotile.runtime.operands import Framework

    asked = []

    class Native(Framework):
        def native_first(self, kernel, dtype, dims, run):
            asked.append((kernel, dtype, dims))
            return ("native first", run)

        def native_op(self, kernel, dtype, dims):  # what the compiled lookup is told torch's call is
            return ("mm", "tf32")

    fallback = lambda a, b, out, stream: ("ours", a, b, out, stream)  # noqa: E731
    direct = calls._Prepared(runner=None, selection=None, direct=object())  # type: ignore[arg-type]
    call = calls._Call(direct, (3, 4), 48, "float32", 0, ())
    assert calls._native_first(Native(), call, "matmul", (2, 2), fallback) == (("native first", fallback),
                                                                              ("mm", "tf32"))
    assert asked == [("matmul", "float32", (2, 2))]  # the user's call: kernel and dimensions
    generated = calls._Call(calls._Prepared(runner=None, selection=None), (3, 4), 48, "float32", 0, ())  # type: ignore[arg-type]
    assert calls._native_first(Native(), generated, "matmul", (2, 2), fallback) == (fallback, None)  # not cuBLAS
    assert asked == [("matmul", "float32", (2, 2))]
    assert calls._native_first(Framework(), call, "matvec", (2, 1), fallback) == (fallback, None)  # no native call


def _fake_torch(switches: dict[str, bool], made: list) -> types.SimpleNamespace:
    """What TorchFramework reads of torch: its dtypes, the switches that change cuBLAS's arithmetic, and
    mm/bmm/mv/matmul recording their calls."""
    def op(name):
        return lambda a, b, out=None: made.append((name, a, b, out)) or name

    def switch(name):
        return lambda: switches[name]

    c_module = types.SimpleNamespace(_get_cublas_allow_tf32=switch("tf32"),
                                     _get_cublas_allow_fp16_accumulation=switch("fp16"))
    names = ("float32", "float64", "bfloat16", "float16", "int8", "int32")
    return types.SimpleNamespace(_C=c_module, **{n: object() for n in names},
                                 **{n: op(n) for n in ("mm", "bmm", "mv", "matmul")})


@pytest.mark.parametrize("dtype,kernel,dims,op,switch", [
    ("float32", "matmul", (2, 2), "mm", "tf32"), ("float16", "matmul", (3, 3), "bmm", "fp16"),
    ("bfloat16", "matmul", (3, 2), "matmul", None), ("float64", "matvec", (2, 1), "mv", None)])
def test_torch_runs_its_own_call_unless_a_stream_is_named_or_a_switch_changes_the_arithmetic(dtype, kernel, dims,
                                                                                           op, switch):
    from autotile.runtime.operands import TorchFramework

    made: list = []
    switches = {"tf32": False, "fp16": False}
    framework = TorchFramework(_fake_torch(switches, made))
    ours = lambda a, b, out, stream: ("ours", stream)  # noqa: E731
    run = framework.native_first(kernel, dtype, dims, ours)
    assert run("A", "B", None, None) == op and made == [(op, "A", "B", None)]
    assert run("A", "B", "C", None) == op and made[-1] == (op, "A", "B", "C")
    assert run("A", "B", None, "s") == ("ours", "s")  # a named stream: autotile's own call
    if switch is not None:
        switches[switch] = True  # read per call
        assert run("A", "B", None, None) == ("ours", None)
    assert len(made) == 2
    assert framework.native_first(kernel, "int8", dims, ours) is ours  # torch._int_mm is another kernel
    # what the compiled lookup is told: the same op, guarded by the same switch
    guard = {"tf32": "tf32", "fp16": "fp16_accumulation", None: None}[switch]
    assert framework.native_op(kernel, dtype, dims) == (op, guard)
    assert framework.native_op(kernel, "int8", dims) is None
