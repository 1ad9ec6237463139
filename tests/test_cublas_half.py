"""cuBLAS on pointers for bfloat16 and float16 (`autotile.runtime.cublas`): GemmEx and its strided batched
form, float32 sums. The arguments each prepared call passes are checked without a GPU, against a recording
stand-in for libcublas; the GPU tests compare the products with a float64 reference."""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from autotile.codegen.problem import ProblemKey
from autotile.runtime import cublas as cublas_mod

HALF = ["bfloat16", "float16"]
TYPE_CODE = {"bfloat16": 14, "float16": 2}  # CUDA_R_16BF, CUDA_R_16F
COMPUTE_32F, GEMM_DEFAULT = 68, -1
HANDLE, STREAM = 0xABC0, 0x5700
A_PTR, B_PTR, OUT_PTR = 0x1000, 0x2000, 0x3000


class _FakeHandle:
    """Stands for autotile's handle: records the streams it is pointed at."""

    def __init__(self) -> None:
        self.handle = HANDLE
        self.stream: int | None = None
        self.streams: list[int] = []

    def use_stream(self, stream_ptr: int) -> None:
        self.streams.append(stream_ptr)
        self.stream = stream_ptr


@pytest.fixture
def calls(monkeypatch):
    """Every routine call made through a stand-in libcublas, as (name, arguments with the handle)."""
    made: list[tuple[str, tuple[int, ...]]] = []

    def recorder(name):
        def routine(*args):
            made.append((name, _as_passed(name, args)))
            return 0
        return routine

    library = types.SimpleNamespace(routines={name: recorder(name) for name in cublas_mod._SIGNATURES})
    fake = _FakeHandle()
    monkeypatch.setattr(cublas_mod, "_library", lambda: library)
    monkeypatch.setattr(cublas_mod, "handle", lambda device: fake)
    return made


def _as_passed(name: str, args: tuple) -> tuple[int, ...]:
    """The values of a call of the untyped routine `name`, each checked to reach it as its declared type
    does: a 32-bit int as a Python int that fits, anything else as a ctypes object of exactly that type
    (a Python int would be passed as a C int, cutting a pointer to 32 bits)."""
    argtypes = (ctypes.c_void_p, *cublas_mod._SIGNATURES[name])  # the handle, then the routine's own
    assert len(args) == len(argtypes), name
    values = []
    for value, argtype in zip(args, argtypes, strict=True):
        if argtype is ctypes.c_int:
            assert type(value) is int and -(1 << 31) <= value < 1 << 31, (name, value)
            values.append(value)
        else:
            assert type(value) is argtype, (name, value, argtype)
            values.append(value.value or 0)  # a null c_void_p reads None
    return tuple(values)


def _call(made, key: ProblemKey, strides: tuple[int, ...] = ()) -> tuple[str, tuple[int, ...]]:
    """The one routine call `key`'s CublasCall makes, its arguments checked against the routine's declared
    signature (`_as_passed`)."""
    cublas_mod.CublasCall(key, 0)((A_PTR, B_PTR), OUT_PTR, STREAM, strides)
    assert len(made) == 1
    return made[0]


def _scalars(alpha: int, beta: int) -> tuple[float, float]:
    return ctypes.c_float.from_address(alpha).value, ctypes.c_float.from_address(beta).value


# (M, N, K) = (131, 67, 257). cuBLAS computes the row-major C as its column-major C^T = B^T A^T: B first.
# Per layout: B's operation and leading dimension, then A's ("n": row-major, "t": column-major).
GEMM_ARGS = {"nn": (0, 67, 0, 257), "nt": (1, 257, 0, 257), "tn": (0, 67, 1, 131), "tt": (1, 257, 1, 131)}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", list(GEMM_ARGS))
def test_matmul_calls_gemm_ex(calls, layout, dtype):
    name, args = _call(calls, ProblemKey("matmul", dtype, layout, (131, 67, 257)))
    op_b, ldb, op_a, lda = GEMM_ARGS[layout]
    t = TYPE_CODE[dtype]
    assert name == "cublasGemmEx"
    handle, *head, alpha, b, b_type, ldb_, a, a_type, lda_, beta, c, c_type, ldc, compute, algo = args
    assert handle == HANDLE and head == [op_b, op_a, 67, 131, 257]
    assert (b, b_type, ldb_) == (B_PTR, t, ldb) and (a, a_type, lda_) == (A_PTR, t, lda)
    assert (c, c_type, ldc) == (OUT_PTR, t, 67)
    assert (compute, algo) == (COMPUTE_32F, GEMM_DEFAULT)
    assert _scalars(alpha, beta) == (1.0, 0.0)  # host float32: the compute type's


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout,strides", [("nn", (33 * 17, 17 * 65)), ("nt", (0, 65 * 17)), ("tt", (33 * 17, 0))])
def test_bmm_calls_strided_batched_gemm_ex(calls, layout, strides, dtype):
    # (batch, M, N, K) = (3, 33, 65, 17); a stride of 0 broadcasts one matrix over the batch
    name, args = _call(calls, ProblemKey("bmm", dtype, layout, (3, 33, 65, 17)), strides)
    op_b, ldb = (0, 65) if layout[1] == "n" else (1, 17)
    op_a, lda = (0, 17) if layout[0] == "n" else (1, 33)
    t = TYPE_CODE[dtype]
    assert name == "cublasGemmStridedBatchedEx"
    (handle, *head, alpha, b, b_type, ldb_, stride_b, a, a_type, lda_, stride_a, beta, c, c_type, ldc, stride_c,
     batch, compute, algo) = args
    assert handle == HANDLE and head == [op_b, op_a, 65, 33, 17]
    assert (b, b_type, ldb_, stride_b) == (B_PTR, t, ldb, strides[1])
    assert (a, a_type, lda_, stride_a) == (A_PTR, t, lda, strides[0])
    assert (c, c_type, ldc, stride_c, batch) == (OUT_PTR, t, 65, 33 * 65, 3)
    assert (compute, algo) == (COMPUTE_32F, GEMM_DEFAULT)
    assert _scalars(alpha, beta) == (1.0, 0.0)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", ["row", "col"])
def test_matvec_calls_gemm_ex_with_one_column(calls, layout, dtype):
    # (M, K) = (29, 53): y (M x 1) = op(A) x, a row-major A being A^T seen column-major (ld K)
    name, args = _call(calls, ProblemKey("matvec", dtype, layout, (29, 53)))
    op_a, lda = (1, 53) if layout == "row" else (0, 29)
    t = TYPE_CODE[dtype]
    assert name == "cublasGemmEx"
    handle, *head, alpha, a, a_type, lda_, x, x_type, ldx, beta, y, y_type, ldy, compute, algo = args
    assert handle == HANDLE and head == [op_a, 0, 29, 1, 53]
    assert (a, a_type, lda_) == (A_PTR, t, lda) and (x, x_type, ldx) == (B_PTR, t, 53)
    assert (y, y_type, ldy) == (OUT_PTR, t, 29)
    assert (compute, algo) == (COMPUTE_32F, GEMM_DEFAULT)
    assert _scalars(alpha, beta) == (1.0, 0.0)


@pytest.mark.parametrize("key,strides,expected", [
    (ProblemKey("matmul", "float32", "nt", (131, 67, 257)), (),
     ("cublasSgemm_v2", (1, 0, 67, 131, 257), (B_PTR, 257, A_PTR, 257), (OUT_PTR, 67))),
    (ProblemKey("bmm", "float64", "tn", (3, 33, 65, 17)), (0, 17 * 65),
     ("cublasDgemmStridedBatched", (0, 1, 65, 33, 17), (B_PTR, 65, 17 * 65, A_PTR, 33, 0), (OUT_PTR, 65, 33 * 65, 3))),
    (ProblemKey("matvec", "float32", "row", (29, 53)), (),
     ("cublasSgemv_v2", (1, 53, 29), (A_PTR, 53, B_PTR, 1), (OUT_PTR, 1))),
    (ProblemKey("matvec", "float64", "col", (29, 53)), (),
     ("cublasDgemv_v2", (0, 29, 53), (A_PTR, 29, B_PTR, 1), (OUT_PTR, 1))),
])
def test_float32_and_float64_keep_the_typed_routines(calls, key, strides, expected):
    # the typed routines' arguments, in the order they had before the 16-bit types came
    name, args = _call(calls, key, strides)
    routine, head, operands, output = expected
    n_head = len(head)
    assert name == routine and args[0] == HANDLE and args[1:1 + n_head] == head
    assert args[2 + n_head:2 + n_head + len(operands)] == operands  # after alpha
    assert args[-len(output):] == output  # after beta


def test_only_the_routines_a_call_makes_go_untyped(calls):
    """The handle's own routines (create, stream, workspace) are called with Python ints for pointers:
    declared types keep those 64 bits; only the routines a CublasCall makes, on prepared ctypes objects,
    may go without."""
    keys = [ProblemKey(kernel, dtype, layout, shape) for dtype in ("float32", "float64", *HALF)
            for kernel, layout, shape in (("matmul", "nt", (8, 8, 8)), ("bmm", "nn", (2, 8, 8, 8)),
                                          ("matvec", "row", (8, 8)))]
    made_by_calls = set()
    for key in keys:
        calls.clear()
        _call(calls, key, (64, 64) if key.kernel == "bmm" else ())
        made_by_calls.add(calls[0][0])

    class Routine:
        argtypes = None
        restype = None

    library = cublas_mod._Library(_Routines(Routine))
    untyped = {name for name, routine in library.routines.items() if routine.argtypes is None}
    assert untyped == made_by_calls
    for name in ("cublasCreate_v2", "cublasSetStream_v2", "cublasGetStream_v2", "cublasSetWorkspace_v2"):
        assert library.routines[name].argtypes[0] in (ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))


class _Routines:
    """Stands for a ctypes.CDLL: a fresh routine object per name, as `CDLL.__getitem__` gives."""

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def __getitem__(self, name: str):
        return self.kind()


def test_stream_is_set_only_when_it_changes(calls):
    call = cublas_mod.CublasCall(ProblemKey("matmul", "bfloat16", "nn", (8, 8, 8)), 0)
    for stream in (STREAM, STREAM, STREAM + 1, STREAM + 1):
        call((A_PTR, B_PTR), OUT_PTR, stream)
    assert cublas_mod.handle(0).streams == [STREAM, STREAM + 1]
    assert len(calls) == 4


def test_a_failing_status_names_the_routine(calls, monkeypatch):
    call = cublas_mod.CublasCall(ProblemKey("matmul", "float16", "nn", (8, 8, 8)), 0)
    monkeypatch.setattr(call, "_routine", lambda *args: 7)
    with pytest.raises(cublas_mod.CublasError, match="cublasGemmEx returned cuBLAS status 7"):
        call((A_PTR, B_PTR), OUT_PTR, STREAM)


class _Array:
    """Just what CublasRunner reads of a CuPy array: its pointer, dimensions and strides."""

    def __init__(self, ptr: int, shape: tuple[int, ...], itemsize: int = 2) -> None:
        self.data = types.SimpleNamespace(ptr=ptr)
        self.ndim, self.itemsize = len(shape), itemsize
        steps = [itemsize]
        for size in reversed(shape[1:]):
            steps.insert(0, steps[0] * size)
        self.strides = tuple(steps)


@pytest.mark.parametrize("dtype", HALF)
def test_cublas_runner_sends_16_bit_types_to_the_direct_call(monkeypatch, dtype):
    cupy = pytest.importorskip("cupy")
    from autotile.runtime.impl import Cublas

    made: list[tuple[ProblemKey, int]] = []
    runs: list[tuple] = []

    class Recording:
        def __init__(self, key: ProblemKey, device: int) -> None:
            made.append((key, device))
            self.batched = key.kernel == "bmm"

        def __call__(self, *args) -> None:
            runs.append(args)

    monkeypatch.setattr(cublas_mod, "CublasCall", Recording)
    monkeypatch.setattr(cupy.cuda, "Device", lambda: types.SimpleNamespace(id=3))
    key = ProblemKey("bmm", dtype, "nn", (3, 33, 65, 17))
    runner = Cublas().prepare(key)
    a, b, out = _Array(A_PTR, (3, 33, 17)), _Array(B_PTR, (17, 65)), _Array(OUT_PTR, (3, 33, 65))
    stream = types.SimpleNamespace(ptr=STREAM)
    for _ in range(2):
        runner.run((a, b), out, stream)
    assert made == [(key, 3)]  # made once, on the device current at the first run
    assert runs == [((A_PTR, B_PTR), OUT_PTR, STREAM, (33 * 17, 0))] * 2
    assert all(isinstance(s, int) for s in runs[0][3])


# -- on a GPU --------------------------------------------------------------------------------------------

def _half_matrix(cupy, shape: tuple[int, ...], order: str, dtype: str):
    """Random values rounded to `dtype`, held as its storage (bfloat16 as uint16 bit patterns), the last two
    axes row-major ("n") or column-major ("t")."""
    from autotile.codegen.dtypes import from_float32

    x = from_float32(cupy.random.standard_normal(shape, dtype=cupy.float32), dtype)
    if order == "t":
        x = cupy.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2)
    return x


def _poisoned(cupy, shape: tuple[int, ...], dtype: str):
    """An output full of NaNs in `dtype`'s storage: an element the call leaves unwritten fails the check."""
    if dtype == "bfloat16":
        return cupy.full(shape, 0x7FC0, dtype=cupy.uint16)
    return cupy.full(shape, cupy.nan, dtype=cupy.float16)


def _float64(x, dtype: str) -> np.ndarray:
    from autotile.codegen.dtypes import to_float32

    return np.asarray(to_float32(x, dtype).get(), dtype=np.float64)


def _error(out, ref: np.ndarray, dtype: str) -> float:
    return float(np.linalg.norm(_float64(out, dtype) - ref) / max(np.linalg.norm(ref), 1e-300))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_gemm_ex_on_pointers_matches_the_reference(layout, dtype):
    import cupy

    from autotile.runtime.cublas import CublasCall

    stream = cupy.cuda.get_current_stream()
    for M, N, K in [(131, 67, 257), (1, 97, 33), (61, 1, 7)]:
        a, b = _half_matrix(cupy, (M, K), layout[0], dtype), _half_matrix(cupy, (K, N), layout[1], dtype)
        out = _poisoned(cupy, (M, N), dtype)
        CublasCall(ProblemKey("matmul", dtype, layout, (M, N, K)), cupy.cuda.Device().id)(
            (a.data.ptr, b.data.ptr), out.data.ptr, stream.ptr)
        ref = _float64(a, dtype) @ _float64(b, dtype)  # the rounded inputs, multiplied exactly enough
        assert _error(out, ref, dtype) < 1e-2, (layout, M, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout,broadcast", [("nn", "none"), ("nt", "a"), ("tn", "b"), ("tt", "none")])
def test_strided_batched_gemm_ex_matches_the_reference(layout, broadcast, dtype):
    import cupy

    from autotile.codegen.kernels import batch_strides
    from autotile.runtime.cublas import CublasCall

    batch, M, N, K = 3, 33, 65, 17
    a = _half_matrix(cupy, (M, K) if broadcast == "a" else (batch, M, K), layout[0], dtype)
    b = _half_matrix(cupy, (K, N) if broadcast == "b" else (batch, K, N), layout[1], dtype)
    out = _poisoned(cupy, (batch, M, N), dtype)
    strides = tuple(int(s) for s in batch_strides((a, b)))
    CublasCall(ProblemKey("bmm", dtype, layout, (batch, M, N, K)), cupy.cuda.Device().id)(
        (a.data.ptr, b.data.ptr), out.data.ptr, cupy.cuda.get_current_stream().ptr, strides)
    ref = np.matmul(_float64(a, dtype), _float64(b, dtype))
    assert _error(out, ref, dtype) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", ["row", "col"])
def test_matvec_as_gemm_ex_matches_the_reference(layout, dtype):
    import cupy

    from autotile.runtime.cublas import CublasCall

    for M, K in [(1, 1), (1, 17), (29, 1), (1031, 2053)]:
        a = _half_matrix(cupy, (M, K), "n" if layout == "row" else "t", dtype)
        x = _half_matrix(cupy, (K,), "n", dtype)
        y = _poisoned(cupy, (M,), dtype)
        CublasCall(ProblemKey("matvec", dtype, layout, (M, K)), cupy.cuda.Device().id)(
            (a.data.ptr, x.data.ptr), y.data.ptr, cupy.cuda.get_current_stream().ptr)
        ref = _float64(a, dtype) @ _float64(x, dtype)
        assert _error(y, ref, dtype) < 1e-2, (layout, M, K)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
def test_cublas_runner_times_16_bit_types_through_gemm_ex(dtype):
    # the tuner's cuBLAS baseline on CuPy arrays: bfloat16's uint16 storage must not be multiplied as integers
    import cupy

    from autotile.runtime.impl import Cublas

    # (key, A's shape and order, B's (x's) shape and order, the output's shape)
    cases = [(ProblemKey("matmul", dtype, "nt", (131, 67, 257)), (131, 257), "n", (257, 67), "t", (131, 67)),
             (ProblemKey("bmm", dtype, "tn", (3, 33, 65, 17)), (3, 33, 17), "t", (17, 65), "n", (3, 33, 65)),
             (ProblemKey("matvec", dtype, "col", (131, 257)), (131, 257), "t", (257,), "n", (131,))]
    for key, a_shape, a_order, b_shape, b_order, out_shape in cases:
        a, b = _half_matrix(cupy, a_shape, a_order, dtype), _half_matrix(cupy, b_shape, b_order, dtype)
        ref = np.matmul(_float64(a, dtype), _float64(b, dtype))
        runner = Cublas().prepare(key)
        for stream in (None, cupy.cuda.Stream(non_blocking=True)):
            out = _poisoned(cupy, out_shape, dtype)
            cupy.cuda.runtime.deviceSynchronize()  # a non-blocking stream does not wait for the poison
            runner.run((a, b), out, stream)
            cupy.cuda.runtime.deviceSynchronize()
            assert _error(out, ref, dtype) < 1e-2, (key, stream)


# A float32 or float64 matmul of one row or one column is a GEMV (cuBLAS's cheaper call on the host): per
# layout and shape, gemv's operation, sizes and leading dimension of the matrix as stored, and whether the
# matrix is B (the row case) or A (the column case).
GEMV_OF_MATMUL = {
    ("nn", (1, 67, 257)): (0, 67, 257, 67, B_PTR, A_PTR), ("tn", (1, 67, 257)): (0, 67, 257, 67, B_PTR, A_PTR),
    ("nt", (1, 67, 257)): (1, 257, 67, 257, B_PTR, A_PTR), ("tt", (1, 67, 257)): (1, 257, 67, 257, B_PTR, A_PTR),
    ("nn", (131, 1, 257)): (1, 257, 131, 257, A_PTR, B_PTR), ("nt", (131, 1, 257)): (1, 257, 131, 257, A_PTR, B_PTR),
    ("tn", (131, 1, 257)): (0, 131, 257, 131, A_PTR, B_PTR), ("tt", (131, 1, 257)): (0, 131, 257, 131, A_PTR, B_PTR),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout,shape", list(GEMV_OF_MATMUL))
def test_a_matmul_of_one_row_or_column_calls_gemv(calls, layout, shape, dtype):
    name, args = _call(calls, ProblemKey("matmul", dtype, layout, shape))
    trans, rows, cols, ld, matrix, vector = GEMV_OF_MATMUL[(layout, shape)]
    assert name == ("cublasSgemv_v2" if dtype == "float32" else "cublasDgemv_v2")
    handle, trans_, rows_, cols_, _alpha, matrix_, ld_, vector_, inc_x, _beta, out, inc_y = args
    assert handle == HANDLE and (trans_, rows_, cols_, ld_) == (trans, rows, cols, ld)
    assert (matrix_, vector_, out, inc_x, inc_y) == (matrix, vector, OUT_PTR, 1, 1)
