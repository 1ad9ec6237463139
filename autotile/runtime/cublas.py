"""cuBLAS called directly on device pointers: GEMM, strided batched GEMM and GEMV, for any framework's memory.

Where the selection chain picks cuBLAS, the library's repeated call should cost what cuBLAS costs, not a
second framework's dispatch on top (CuPy's `matmul` spends tens of microseconds of Python per call). A
`CublasCall` is prepared once for a problem (which routine, the operations, the sizes and leading
dimensions: the operands are packed, so the layout says them all) and a call passes three pointers and a
stream to CuPy's thin binding of the routine.

Every matrix here is row-major or column-major as the library's plan says (`autotile.library.plan`). cuBLAS
is column-major: a row-major C = A @ B is computed as its column-major view C^T = B^T @ A^T, and a packed
row-major matrix is its transpose seen column-major, so no data moves.

Each device has a handle of autotile's own, made on first use: its math mode is cuBLAS's default (IEEE
FP32, never TF32, whatever CuPy's or PyTorch's switches say) and its pointer mode "host" (alpha and beta
are host values), and no other library changes either. A handle is not safe to share between threads while
its stream changes: a lock is held from setting the stream to the end of the call (microseconds).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from autotile.codegen.problem import ProblemKey

_OP_N, _OP_T = 0, 1  # cublasOperation_t
_handles: dict[int, list[Any]] = {}  # device id -> [handle, the stream last set on it]
_lock = threading.Lock()
# alpha = 1, beta = 0 in each precision, in host memory that lives as long as the process
_SCALARS: dict[str, tuple[np.ndarray, np.ndarray]] = {
    "float32": (np.ones(1, np.float32), np.zeros(1, np.float32)),
    "float64": (np.ones(1, np.float64), np.zeros(1, np.float64))}


def _library() -> Any:
    from cupy_backends.cuda.libs import cublas

    return cublas


def _handle(device: int) -> list[Any]:
    """[handle, last stream] of autotile's own cuBLAS handle on `device` (made with `device` current)."""
    entry = _handles.get(device)
    if entry is None:
        import cupy

        with cupy.cuda.Device(device):
            entry = _handles.setdefault(device, [_library().create(), None])
    return entry


class CublasCall:
    """One problem's cuBLAS routine with every argument but the pointers and the stream fixed.

    `key` is the library's problem: matmul (M, N, K) or bmm (batch, M, N, K) in a layout of two letters
    ("n": row-major, "t": column-major; A's then B's), or matvec (M, K) with A "row" or "col"."""

    def __init__(self, key: ProblemKey, device: int):
        cublas = _library()
        self.device = device
        self.batched = key.kernel == "bmm"
        alpha, beta = _SCALARS[key.dtype]
        self._alpha, self._beta = alpha.ctypes.data, beta.ctypes.data
        double = key.dtype == "float64"
        self._kind = "gemv" if key.kernel == "matvec" else "batched" if self.batched else "gemm"
        if key.kernel == "matvec":
            M, K = key.shape
            self._routine = cublas.dgemv if double else cublas.sgemv
            # y = A x; a row-major A is, seen column-major, the K x M matrix A^T
            self._fixed = (_OP_T, K, M, K) if key.layout == "row" else (_OP_N, M, K, M)
            return
        *batch, M, N, K = key.shape
        a_rowmajor, b_rowmajor = key.layout[0] == "n", key.layout[1] == "n"
        # C^T (N x M) = op(B^T-view) (N x K) @ op(A^T-view) (K x M)
        op_b, ldb = (_OP_N, N) if b_rowmajor else (_OP_T, K)
        op_a, lda = (_OP_N, K) if a_rowmajor else (_OP_T, M)
        self._gemm = (op_b, op_a, N, M, K)
        self._ld = (ldb, lda, N)
        self._out_stride = M * N
        self._batch = batch[0] if batch else 1
        if self.batched:
            self._routine = cublas.dgemmStridedBatched if double else cublas.sgemmStridedBatched
        else:
            self._routine = cublas.dgemm if double else cublas.sgemm

    def __call__(self, pointers: tuple[int, ...], out_ptr: int, stream_ptr: int,
                 batch_strides: tuple[int, ...] = ()) -> None:
        """out = A @ B (or A @ x) for the operands at `pointers`, on the CUDA stream `stream_ptr`; a bmm
        takes the batch strides of A and B in elements (0: one matrix for the whole batch)."""
        entry = _handle(self.device)
        with _lock:
            handle = entry[0]
            if entry[1] != stream_ptr:
                _library().setStream(handle, stream_ptr)
                entry[1] = stream_ptr
            if self._kind == "gemv":
                trans, m, n, lda = self._fixed
                self._routine(handle, trans, m, n, self._alpha, pointers[0], lda, pointers[1], 1, self._beta,
                              out_ptr, 1)
            elif self._kind == "batched":
                (op_b, op_a, n, m, k), (ldb, lda, ldc) = self._gemm, self._ld
                stride_a, stride_b = batch_strides
                self._routine(handle, op_b, op_a, n, m, k, self._alpha, pointers[1], ldb, stride_b,
                              pointers[0], lda, stride_a, self._beta, out_ptr, ldc, self._out_stride, self._batch)
            else:
                (op_b, op_a, n, m, k), (ldb, lda, ldc) = self._gemm, self._ld
                self._routine(handle, op_b, op_a, n, m, k, self._alpha, pointers[1], ldb, pointers[0], lda,
                              self._beta, out_ptr, ldc)


__all__ = ["CublasCall"]
