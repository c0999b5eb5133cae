"""JAX primitives: the tile-language ops used in kernel bodies and ``kernel_call``."""

from . import autodiff, batching, kernel_call, lowering, reference, tile_ops  # noqa: F401
