"""``import autotile.torch``: autotile's operations as PyTorch custom operators (``torch.ops.autotile.*``).

This is the public name; the operators live in `autotile.library.torch_ops` (read it for what each one
takes). Importing this module imports torch; ``import autotile`` never does.
"""

from autotile.library.torch_ops import matmul, matmul_out, matvec

__all__ = ["matmul", "matmul_out", "matvec"]
