"""The library's entry points: `autotile.matmul`, `autotile.matvec` and `autotile.scaled_matmul` (the 8-bit
floats, torch._scaled_mm's contract).

`matmul` and `matvec` route tensors that need a gradient through the differentiable PyTorch operators
(`autotile.library.torch_ops`); everything else, and every repeated call, runs `autotile.library.calls`.
"""

from __future__ import annotations

import sys
from typing import Any

from autotile.dispatch.precision import get_float32_matmul_precision
from autotile.errors import ArgumentError
from autotile.library.calls import matmul_no_autograd, matvec_no_autograd, repeated_call, scaled_matmul
from autotile.runtime import torch_lookup
from autotile.runtime.torch_lookup import MATMUL, MATVEC


def matmul(A: Any, B: Any, out: Any = None, precision: str | None = None, stream: Any = None) -> Any:
    """C = A @ B for CuPy arrays or torch CUDA tensors of float32, float64, float16, int8 or (torch)
    bfloat16; returns C in their framework, of the inputs' type (16-bit types: float32 sums, rounded once;
    int8: exact int32 sums and an int32 C, torch._int_mm's contract).

    A is (..., M, K), B is (..., K, N), C is (..., M, N): 2-D matrices, or batches (the batch dimensions of
    both equal, or one operand a single matrix, broadcast). Each matrix may be row- or column-major (`W.T`):
    read in place. `out`: the result's C-contiguous array (no allocation). `precision`: "highest" (IEEE FP32
    only), "high" (also the FP32-level tf32x3 tensor-core kernels) or "medium" (as "high"); None takes the
    process-wide setting; float64 is IEEE under every setting. `stream`: a torch or CuPy stream, or a
    pointer; None is the inputs' framework's current stream. Tensors that need a gradient go through the
    differentiable operator (`autotile.torch`)."""
    compiled = torch_lookup.extension  # torch tensors' repeated calls, looked up in C++ (None: not built)
    if compiled is not None:
        setting = get_float32_matmul_precision() if precision is None else precision
        c = compiled.call(MATMUL, A, B, out, setting, stream)
        if c is not None:
            return c
    known = repeated_call(A, B, out, precision)  # a repeated call: no tensor needs a gradient, all checked
    if known is not None:
        return known(A, B, out, stream)
    if _needs_grad(A, B):
        _check_differentiable("matmul", out, stream)
        from autotile.library.torch_ops import matmul as differentiable_matmul  # imports torch, which the caller has

        return differentiable_matmul(A, B, precision)
    return matmul_no_autograd(A, B, out, precision, stream)


def matvec(A: Any, x: Any, out: Any = None, precision: str | None = None, stream: Any = None) -> Any:
    """y = A @ x for a 2-D A (M x K, row- or column-major) and a 1-D x (K), CuPy arrays or torch CUDA
    tensors of float32, float64, float16 or (torch) bfloat16; returns y (M) in their framework (16-bit
    types: float32 sums, rounded once). `out` and `stream` as `matmul`'s; tensors that need a gradient go
    through the differentiable operator, as `matmul`'s do.

    `precision` is checked as `matmul`'s is, and changes nothing: every matvec kernel is IEEE."""
    # matmul's steps, written out again rather than shared: the per-call path takes no extra call
    compiled = torch_lookup.extension
    if compiled is not None:
        setting = get_float32_matmul_precision() if precision is None else precision
        y = compiled.call(MATVEC, A, x, out, setting, stream)
        if y is not None:
            return y
    known = repeated_call(A, x, out, precision, "matvec")
    if known is not None:
        return known(A, x, out, stream)
    if _needs_grad(A, x):
        _check_differentiable("matvec", out, stream)
        from autotile.library.torch_ops import matvec as differentiable_matvec

        return differentiable_matvec(A, x, precision)
    return matvec_no_autograd(A, x, out, precision, stream)


def _check_differentiable(name: str, out: Any, stream: Any) -> None:
    if out is not None or stream is not None:
        raise ArgumentError(f"{name} with out= or stream= does not support autograd (an input requires grad); "
                            "call it under torch.no_grad()")


def _needs_grad(a: Any, b: Any) -> bool:
    torch = sys.modules.get("torch")  # no torch imported: no tensor can need a gradient
    if torch is None:
        return False
    tensor = torch.Tensor
    return (((isinstance(a, tensor) and a.requires_grad) or (isinstance(b, tensor) and b.requires_grad))
            and torch.is_grad_enabled())


__all__ = ["matmul", "matmul_no_autograd", "matvec", "matvec_no_autograd", "scaled_matmul"]
