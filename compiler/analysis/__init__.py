"""Analyses of Tile IR that passes share instead of each re-deriving them.

:mod:`.scalars`: the range (and so the constant) each integer or bool scalar holds, with the
wrap-around of its dtype (canonicalisation, the clamp check, gemm panels).
:mod:`.affine`: the scalars that are ``scale * block_index + offset`` (output coverage,
shard inference).
:mod:`.divisibility`: a number each integer scalar is always a multiple of (the GPU code
generator's aligned vector accesses).
:mod:`.symbolic`: integer scalars as expressions over block indices, loop variables and
dynamic sizes, with the conditions known at a point (the GPU bounds proofs).
"""
