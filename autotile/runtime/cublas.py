"""cuBLAS called directly on device pointers: GEMM, strided batched GEMM and GEMV, for any framework's memory.

float32 and float64 go through the typed routines (Sgemm/Dgemm, their strided batched forms, Sgemv/Dgemv).
bfloat16 and float16 go through `cublasGemmEx` and `cublasGemmStridedBatchedEx`, A, B and C all of the 16-bit
type, summed in float32 (CUBLAS_COMPUTE_32F) and rounded to that type: PyTorch's contract. cuBLAS has no
16-bit GEMV, so their matvec is a GemmEx with one column. int8 goes through the same routines with int32
sums and an int32 C (CUBLAS_COMPUTE_32I: torch._int_mm's contract).

Where the selection chain picks cuBLAS, the library's repeated call should cost what cuBLAS costs, not a
second framework's dispatch on top (CuPy's `matmul` spends tens of microseconds of Python per call, and even
CuPy's thin bindings reset a handle's stream to CuPy's current stream on every call, checking for a graph
capture each time). A `CublasCall` is prepared once for a problem (which routine, the operations, the sizes
and leading dimensions: the operands are packed, so the layout says them all) and a call passes three
pointers and a stream straight to the routine in the cuBLAS library already loaded in the process, through
ctypes without declared argument types: every argument is prepared once as what ctypes passes unconverted
(a Python int for a 32-bit one, a ctypes object of the declared type for a pointer or a 64-bit one), and a
call only sets the three pointers (and a batch's strides) in place. ctypes converting 18 declared arguments
costs about 3 us per call on an H100's host, as much as the rest of the library's call (measured
2026-11-28: a 64x64x64 bfloat16 GemmEx enqueued in 13.3 us with declared types, 10.1 us through CuPy's
Cython binding).

Every matrix here is row-major or column-major as the library's plan says (`autotile.library.plan`). cuBLAS
is column-major: a row-major C = A @ B is computed as its column-major view C^T = B^T @ A^T, and a packed
row-major matrix is its transpose seen column-major, so no data moves.

Each device has a handle of autotile's own, made on first use: its math mode is cuBLAS's default (IEEE
FP32, never TF32, whatever CuPy's or PyTorch's switches say) and its pointer mode "host" (alpha and beta
are host values), and no other library changes either. Each stream it runs on gets a workspace of its own
(as PyTorch does: two streams must not share one), set with the stream, so cuBLAS never allocates inside a
call and a call can be captured into a CUDA graph; a stream first seen during a capture runs without a
workspace (cuBLAS then picks kernels that need none). A handle is not safe to share between threads while
its stream changes: a lock is held from setting the stream to the end of the call (microseconds).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from typing import Any

from autotile.codegen import dtypes
from autotile.codegen.problem import ProblemKey, as_matvec
from autotile.errors import CublasError
from autotile.runtime.device import stream_is_capturing

_OP_N, _OP_T = 0, 1  # cublasOperation_t
# The types routed through the Ex routines: (A's and B's cudaDataType, C's, the cublasComputeType_t of the sums)
# from library_types.h and cublas_api.h; cuBLAS picks the algorithm (CUBLAS_GEMM_DEFAULT).
_CUDA_R_16F, _CUDA_R_16BF, _CUDA_R_8I, _CUDA_R_32I = 2, 14, 3, 10
_COMPUTE_32F, _COMPUTE_32I = 68, 72
_EX_TYPES = {"bfloat16": (_CUDA_R_16BF, _CUDA_R_16BF, _COMPUTE_32F),
             "float16": (_CUDA_R_16F, _CUDA_R_16F, _COMPUTE_32F), "int8": (_CUDA_R_8I, _CUDA_R_32I, _COMPUTE_32I)}
_GEMM_DEFAULT = -1
# Workspace per stream, in bytes: what cuBLAS's documentation recommends (32 MiB on Hopper, 4 MiB before).
WORKSPACE_BYTES = {90: 32 << 20}
DEFAULT_WORKSPACE_BYTES = 4 << 20

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
# (routine name, argument types after the handle); every routine returns a cublasStatus_t
_CREATE = (ctypes.POINTER(_P),)  # cublasCreate_v2 takes only where to write the new handle
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cublasSetStream_v2": (_P,),
    "cublasGetStream_v2": (ctypes.POINTER(_P),),
    "cublasSetWorkspace_v2": (_P, ctypes.c_size_t),
    "cublasSgemm_v2": (_I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I),
    "cublasDgemm_v2": (_I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I),
    "cublasSgemmStridedBatched": (_I, _I, _I, _I, _I, _P, _P, _I, _LL, _P, _I, _LL, _P, _P, _I, _LL, _I),
    "cublasDgemmStridedBatched": (_I, _I, _I, _I, _I, _P, _P, _I, _LL, _P, _I, _LL, _P, _P, _I, _LL, _I),
    "cublasSgemv_v2": (_I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I),
    "cublasDgemv_v2": (_I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I),
    # transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo
    "cublasGemmEx": (_I, _I, _I, _I, _I, _P, _P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _I),
    # as cublasGemmEx, with each operand's stride (long long) after its leading dimension and the batch count
    # after C's
    "cublasGemmStridedBatchedEx": (_I, _I, _I, _I, _I, _P, _P, _I, _I, _LL, _P, _I, _I, _LL, _P, _P, _I, _I, _LL,
                                   _I, _I, _I),
}


# The routines a call makes (GEMM, strided batched GEMM, GEMV): called without declared argument types, on
# arguments `CublasCall` prepares by `_SIGNATURES` (see the module's docstring).
_PER_CALL = frozenset(("cublasSgemm_v2", "cublasDgemm_v2", "cublasSgemmStridedBatched", "cublasDgemmStridedBatched",
                       "cublasSgemv_v2", "cublasDgemv_v2", "cublasGemmEx", "cublasGemmStridedBatchedEx"))


class _Library:
    """The process's libcublas: the handle and stream routines typed once, the per-call routines untyped."""

    def __init__(self, library: ctypes.CDLL):
        self.routines: dict[str, Any] = {}
        for name, argtypes in (("cublasCreate_v2", _CREATE), *((n, (_P, *a)) for n, a in _SIGNATURES.items())):
            routine = library[name]  # a function object of its own (getattr would share one per name)
            if name not in _PER_CALL:
                routine.argtypes = argtypes
            routine.restype = _I
            self.routines[name] = routine

    def check(self, name: str, *args: Any) -> None:
        status = self.routines[name](*args)
        if status:
            raise CublasError(f"{name} returned cuBLAS status {status}")


_library_instance: _Library | None = None


def loaded_library_path() -> str | None:
    """The path of the libcublas that CuPy loaded into this process (None where none is found): the one
    whose handles and routines match CuPy's CUDA runtime, even where PyTorch brought another version."""
    from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads libcublas)

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libcublas.so" in line}
    except OSError:
        return None
    if not paths:
        return None
    import cupy

    major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    matching = sorted(p for p in paths if os.path.basename(p).startswith(f"libcublas.so.{major}"))
    return (matching or sorted(paths))[0]


def _library() -> _Library:
    global _library_instance
    if _library_instance is None:
        path = loaded_library_path()
        if path is None:  # not Linux, or linked some other way: the soname CuPy's runtime would load
            import cupy

            path = f"libcublas.so.{cupy.cuda.runtime.runtimeGetVersion() // 1000}"
        _library_instance = _Library(ctypes.CDLL(path))
    return _library_instance


class _Handle:
    """autotile's cuBLAS handle on one device, the stream it was last set to and a workspace per stream."""

    def __init__(self, device: int):
        import cupy

        self.device = device
        handle = _P()
        with cupy.cuda.Device(device):
            _library().check("cublasCreate_v2", ctypes.byref(handle))
            capability = int(cupy.cuda.Device(device).compute_capability)  # "90" on sm_90
        self.handle = handle.value
        self.workspace_bytes = WORKSPACE_BYTES.get(capability, DEFAULT_WORKSPACE_BYTES)
        self.stream: int | None = None
        self.workspaces: dict[int, tuple[int, int]] = {}  # stream -> (pointer, bytes); kept for the process

    def workspace(self, stream_ptr: int) -> tuple[int, int]:
        """The workspace of `stream_ptr` (pointer, bytes), made on first use (current device must be this
        handle's); (0, 0) while the stream captures a CUDA graph (nothing may be allocated then)."""
        workspace = self.workspaces.get(stream_ptr)
        if workspace is None:
            import cupy

            if stream_is_capturing(stream_ptr):
                return (0, 0)
            workspace = (cupy.cuda.runtime.malloc(self.workspace_bytes), self.workspace_bytes)
            self.workspaces[stream_ptr] = workspace
        return workspace

    def use_stream(self, stream_ptr: int) -> None:
        """Point the handle at `stream_ptr` and at that stream's workspace (made on first use: current
        device must be this handle's)."""
        library = _library()
        workspace = self.workspace(stream_ptr)
        library.check("cublasSetStream_v2", self.handle, stream_ptr)
        library.check("cublasSetWorkspace_v2", self.handle, workspace[0], workspace[1])
        # Without a workspace (set during a capture) the stream is not recorded as set: its next call comes
        # back here and, once the capture has ended, gets the stream's workspace.
        self.stream = stream_ptr if workspace[1] else None

    def current_stream(self) -> int:
        """The stream cuBLAS has on record for this handle (for tests)."""
        stream = _P()
        _library().check("cublasGetStream_v2", self.handle, ctypes.byref(stream))
        return stream.value or 0


_handles: dict[int, _Handle] = {}  # device id -> autotile's handle there
_lock = threading.Lock()
# alpha = 1, beta = 0 in each precision, in host memory that lives as long as the process; the 16-bit types'
# scalars are of their compute type: float32, and int32 for int8
_FLOAT_SCALARS = (ctypes.c_float(1.0), ctypes.c_float(0.0))
_SCALARS: dict[str, tuple[Any, Any]] = {
    "float32": _FLOAT_SCALARS, "float64": (ctypes.c_double(1.0), ctypes.c_double(0.0)),
    "bfloat16": _FLOAT_SCALARS, "float16": _FLOAT_SCALARS, "int8": (ctypes.c_int32(1), ctypes.c_int32(0))}


def _passed(value: Any, argtype: Any) -> Any:
    """`value`, an argument declared `argtype`, as ctypes passes it to a routine without declared types
    unconverted: a 32-bit int as a Python int (checked to fit), anything else as a ctypes object of its
    declared type (a pointer's address, a 64-bit stride); a ctypes object stays itself."""
    if isinstance(value, ctypes._SimpleCData):
        assert type(value) is argtype, (value, argtype)
        return value
    if argtype is _I:
        if not -(1 << 31) <= value < 1 << 31:
            raise CublasError(f"cuBLAS argument {value} does not fit its 32-bit int")
        return int(value)
    return argtype(value)


def _made(handles: dict[int, _Handle], device: int) -> _Handle:
    """`handles`' handle on `device`, made on first use (with `device` current)."""
    entry = handles.get(device)
    if entry is None:
        with _lock:
            entry = handles.get(device) or handles.setdefault(device, _Handle(device))
    return entry


def handle(device: int) -> _Handle:
    """autotile's cuBLAS handle on `device`, made on first use."""
    return _made(_handles, device)


# The compiled lookup's handles (`autotile.runtime.torch_lookup`): one per device, apart from the Python calls'
# handle, since the compiled table sets its stream while holding the GIL and the Python calls set theirs through
# ctypes, which releases it (two threads could otherwise interleave a stream change and a call).
_table_handles: dict[int, _Handle] = {}


def table_handle(device: int) -> _Handle:
    """The compiled lookup's cuBLAS handle on `device` (current), made on first use."""
    return _made(_table_handles, device)


def table_workspace(device: int, stream_ptr: int) -> tuple[int, int]:
    """The workspace (pointer, bytes) of the compiled lookup's handle on `device` for `stream_ptr`: made on
    first use, (0, 0) during a CUDA-graph capture (the compiled table then leaves the call to torch's operator or
    Python)."""
    return table_handle(device).workspace(stream_ptr)


# Each routine's argument kinds, handle first ("P" a pointer, "I" a 32-bit int, "L" a 64-bit int): what the
# compiled lookup reads to call it (`torch_lookup.cpp`'s `kBlasSignatures`)
_KIND_LETTERS = {_P: "P", _I: "I", _LL: "L"}


@dataclasses.dataclass(frozen=True)
class PackedCublasCall:
    """A `CublasCall` as data, for a caller that calls cuBLAS without Python (the compiled lookup of torch
    calls): the routine's address and argument kinds, every argument as a 64-bit word (the handle the compiled
    lookup's own, the operands' and the output's pointers 0: written per call), and where those go."""

    routine: int  # the routine's address in the loaded libcublas
    kinds: str  # one letter per argument, handle first (`_KIND_LETTERS`)
    words: tuple[int, ...]  # the arguments, two's complement in 64 bits
    first: int  # the argument index of the first operand's pointer (cuBLAS's left factor)
    second: int
    out: int
    first_operand: int  # which of the call's operands (0: A, 1: B) cuBLAS takes first
    set_stream: int  # cublasSetStream_v2's and cublasSetWorkspace_v2's addresses
    set_workspace: int


class CublasCall:
    """One problem's cuBLAS routine with every argument but the pointers and the stream fixed.

    `key` is the library's problem: matmul (M, N, K) or bmm (batch, M, N, K) in a layout of two letters
    ("n": row-major, "t": column-major; A's then B's), or matvec (M, K) with A "row" or "col", in float32,
    float64, bfloat16 or float16, or (matmul and bmm) int8 with an int32 C. A call must be made with
    `device` current.

    Every routine here takes its arguments in one order: the fixed ones before the first operand, the first
    operand's pointer and its fixed arguments (for a batch, then its stride), the second operand's likewise,
    beta, the output's pointer and its fixed arguments. The first operand is the one cuBLAS multiplies from
    the left: B for a matmul (C^T = B^T A^T), A for a matvec."""

    def __init__(self, key: ProblemKey, device: int):
        library = _library()
        self.device = device
        self._handle = handle(device)  # made here, with `device` current, and kept: no lookup per call
        self.batched = key.kernel == "bmm"
        alpha, beta = (ctypes.addressof(s) for s in _SCALARS[key.dtype])
        self._beta = beta
        ex_types = _EX_TYPES.get(key.dtype)  # None: float32 or float64, through the typed routines
        double = key.dtype == "float64"
        self._before: tuple[int, ...]  # the routine's arguments after the handle, before the first operand
        self._after_first: tuple[int, ...]
        self._after_second: tuple[int, ...]
        self._after_out: tuple[int, ...]
        # A float32/float64 matmul of one row or column is the GEMV it is (`as_matvec`): cuBLAS's GEMV costs
        # the host about two thirds of its GEMM (`model.HOST_MS`), where the GEMM would run a GEMV-like kernel.
        vector = as_matvec(key.kernel, key.dtype, key.layout, key.shape) if ex_types is None else None
        if key.kernel == "matvec" or vector is not None:
            layout, (M, K), swapped = (key.layout, key.shape, False) if vector is None else vector
            # y = A x; a row-major A is, seen column-major, the K x M matrix A^T
            trans, lda = (_OP_T, K) if layout == "row" else (_OP_N, M)
            self._first, self._second = (1, 0) if swapped else (0, 1)  # the matrix, then the vector
            if ex_types is None:
                self._name = "cublasDgemv_v2" if double else "cublasSgemv_v2"
                m, n = (K, M) if trans == _OP_T else (M, K)  # gemv's sizes are those of A as stored
                self._before = (trans, m, n, alpha)
                self._after_first, self._after_second, self._after_out = (lda,), (1,), (1,)  # x and y: unit steps
            else:
                # no 16-bit GEMV: y (M x 1) = op(A) (M x K) @ x (K x 1), the vectors as one-column matrices
                data_type, out_type, compute = ex_types
                self._name = "cublasGemmEx"
                self._before = (trans, _OP_N, M, 1, K, alpha)
                self._after_first, self._after_second = (data_type, lda), (data_type, K)
                self._after_out = (out_type, M, compute, _GEMM_DEFAULT)
            self._bind(library)
            return
        *batch, M, N, K = key.shape
        a_rowmajor, b_rowmajor = key.layout[0] == "n", key.layout[1] == "n"
        # C^T (N x M) = op(B^T-view) (N x K) @ op(A^T-view) (K x M)
        op_b, ldb = (_OP_N, N) if b_rowmajor else (_OP_T, K)
        op_a, lda = (_OP_N, K) if a_rowmajor else (_OP_T, M)
        self._first, self._second = 1, 0  # B, then A
        self._before = (op_b, op_a, N, M, K, alpha)
        # a batch's output matrices follow one another: M * N elements apart
        out_batch = (M * N, batch[0]) if self.batched else ()
        if ex_types is None:
            self._after_first, self._after_second, self._after_out = (ldb,), (lda,), (N, *out_batch)
            if self.batched:
                self._name = "cublasDgemmStridedBatched" if double else "cublasSgemmStridedBatched"
            else:
                self._name = "cublasDgemm_v2" if double else "cublasSgemm_v2"
        else:
            data_type, out_type, compute = ex_types
            self._after_first, self._after_second = (data_type, ldb), (data_type, lda)
            self._after_out = (out_type, N, *out_batch, compute, _GEMM_DEFAULT)
            self._name = "cublasGemmStridedBatchedEx" if self.batched else "cublasGemmEx"
        self._bind(library)

    def _bind(self, library: _Library) -> None:
        """The routine's whole argument tuple, made once: the fixed arguments as ctypes passes them without
        declared types (`_passed`), and the operands' pointers (and a batch's strides) as ctypes objects
        that each call sets in place."""
        self._routine = library.routines[self._name]
        self._first_ptr, self._second_ptr, self._out_ptr = _P(), _P(), _P()
        self._first_stride, self._second_stride = _LL(), _LL()  # a batch's, in elements
        first: tuple[Any, ...] = (self._first_ptr, *self._after_first)
        second: tuple[Any, ...] = (self._second_ptr, *self._after_second)
        if self.batched:  # each operand's stride follows its leading dimension
            first, second = (*first, self._first_stride), (*second, self._second_stride)
        arguments = (self._handle.handle, *self._before, *first, *second, self._beta, self._out_ptr,
                     *self._after_out)
        argtypes = (_P, *_SIGNATURES[self._name])
        assert len(arguments) == len(argtypes), self._name
        self._arguments = tuple(map(_passed, arguments, argtypes))

    def packed(self, batch_strides: tuple[int, ...] = ()) -> PackedCublasCall:
        """This call as data (`PackedCublasCall`) for the operands' batch strides `batch_strides` (elements),
        on the compiled lookup's handle (`table_handle`; made here: `device` must be current)."""
        library = _library()
        address = ctypes.cast
        words: list[int] = []
        slots = {id(self._first_ptr): "first", id(self._second_ptr): "second", id(self._out_ptr): "out"}
        at: dict[str, int] = {}
        for i, value in enumerate(self._arguments):
            if id(value) in slots:
                at[slots[id(value)]] = i
                words.append(0)
            elif value is self._first_stride or value is self._second_stride:  # B's, then A's
                words.append(batch_strides[1] if value is self._first_stride else batch_strides[0])
            else:
                words.append((value.value or 0) if isinstance(value, ctypes._SimpleCData) else value)
        words[0] = table_handle(self.device).handle or 0
        kinds = "P" + "".join(_KIND_LETTERS[t] for t in _SIGNATURES[self._name])
        return PackedCublasCall(
            address(self._routine, _P).value or 0, kinds, tuple(w & 0xFFFFFFFFFFFFFFFF for w in words),
            at["first"], at["second"], at["out"], self._first,
            address(library.routines["cublasSetStream_v2"], _P).value or 0,
            address(library.routines["cublasSetWorkspace_v2"], _P).value or 0)

    def __call__(self, pointers: tuple[int, ...], out_ptr: int, stream_ptr: int,
                 batch_strides: tuple[int, ...] = ()) -> None:
        """out = A @ B (or A @ x) for the operands at `pointers`, on the CUDA stream `stream_ptr`; a bmm
        takes the batch strides of A and B in elements (0: one matrix for the whole batch)."""
        entry = self._handle
        with _lock:  # the handle's stream and this call's argument objects are shared
            if entry.stream != stream_ptr:
                entry.use_stream(stream_ptr)
            self._first_ptr.value = pointers[self._first]
            self._second_ptr.value = pointers[self._second]
            self._out_ptr.value = out_ptr
            if self.batched:  # B first, then A: their strides likewise
                self._first_stride.value, self._second_stride.value = batch_strides[1], batch_strides[0]
            status = self._routine(*self._arguments)
        if status:
            raise CublasError(f"{self._name} returned cuBLAS status {status}")


def unsupported_reason(key: ProblemKey) -> str | None:
    """Why cuBLAS cannot compute `key` (None where it can). Its int8 GEMM runs dependably only with A
    row-major and B column-major (layout nt, cuBLAS's "TN") and every leading dimension a multiple of 4
    elements: elsewhere it returns CUBLAS_STATUS_NOT_SUPPORTED (measured on an H100 with CUDA 13: every
    nt shape of such sides ran, while nn, tn and tt failed on 10-16% of them, without a rule in the sizes).
    It has no int8 GEMV. Its 8-bit float GEMM is cuBLASLt's, which autotile does not call (torch._scaled_mm
    does: the benchmarks compare with that)."""
    if dtypes.get(key.dtype).scaled:
        return "autotile calls no cuBLAS routine for the 8-bit floats (cuBLAS has them in cuBLASLt only)"
    if key.dtype != "int8":
        return None
    if key.kernel == "matvec":
        return "cuBLAS has no int8 matvec"
    if key.layout != "nt":
        return (f"cuBLAS's int8 GEMM takes A row-major and B column-major (layout nt) only, not {key.layout} "
                "(pass B as W.T of a row-major W)")
    *_, M, N, K = key.shape
    leading = {"lda": K, "ldb": K, "ldc": N}  # nt: A's rows and B's columns are K long
    bad = [f"{name} = {value}" for name, value in leading.items() if value % 4]
    return f"cuBLAS's int8 GEMM needs leading dimensions that are multiples of 4 ({', '.join(bad)})" if bad else None


__all__ = ["CublasCall", "CublasError", "handle", "loaded_library_path", "unsupported_reason"]
