"""jaxtile's kernel library: ready-made kernels written in the tile language.

``matmul``, ``softmax``, ``rms_norm`` and ``layer_norm`` have backward rules
(``Kernel.defvjp``) made of jaxtile kernels, so ``jax.grad`` runs compiled code; the ``*_fwd``
and ``*_bwd`` kernels are those rules' pieces. Their forward-mode rules (``Kernel.defjvp``)
are kernels too (``matmul``, ``softmax``) or a jnp formula of the tangent (the norms). All
take 2-D operands (and 1-D weights); batch them with ``jax.vmap``.

``attention`` is flash attention on (batch, heads, seq, head_dim) operands (grouped-query,
causal, per-sequence lengths, sliding windows; on Hopper, sm_90a, the FlashAttention-3-style
``attention_fwd_ws``), differentiated in both modes by kernels
(``attention_dq``, ``attention_dkdv``, ``attention_jvp``); ``attention_decode`` attends one
query token per sequence to a paged KV cache, split over the sequence.

``scaled_matmul`` multiplies 8-bit float (or any float) matrices with per-tensor scales
applied to the float32 accumulator: the FP8 scale semantics.

Tile parameters a call leaves out come from tables stored per target (``_tiles.py``).
"""

from . import _tiles
from .add import add
from .attention import attention, attention_fwd, attention_fwd_ws
from .attention_bwd import attention_dkdv, attention_dq, attention_jvp
from .attention_decode import attention_decode, decode_combine, decode_partial
from .layer_norm import layer_norm, layer_norm_bwd, layer_norm_fwd
from .matmul import matmul, matmul_relu
from .rms_norm import rms_norm, rms_norm_bwd, rms_norm_fwd
from .scaled_matmul import scaled_matmul, scaled_matmul_kernel
from .softmax import softmax, softmax_bwd

_tiles.install({k.name: k for k in (attention_dkdv, attention_dq, attention_fwd, attention_jvp,
                                    layer_norm, layer_norm_bwd, layer_norm_fwd, matmul,
                                    matmul_relu, rms_norm, rms_norm_bwd, rms_norm_fwd,
                                    softmax, softmax_bwd)})

__all__ = ["add", "attention", "attention_decode", "attention_dkdv", "attention_dq",
           "attention_fwd", "attention_fwd_ws", "attention_jvp", "decode_combine",
           "decode_partial", "layer_norm", "layer_norm_bwd", "layer_norm_fwd", "matmul",
           "matmul_relu", "rms_norm", "rms_norm_bwd", "rms_norm_fwd", "scaled_matmul",
           "scaled_matmul_kernel", "softmax", "softmax_bwd"]
