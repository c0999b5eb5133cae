"""jaxtile's kernel library: ready-made kernels written in the tile language."""

from .add import add
from .matmul import matmul_relu
from .softmax import softmax

__all__ = ["add", "matmul_relu", "softmax"]
