"""Facts of the CPU kernel ABI that code outside the CPU backend relies on, without importing
TVM: the cache records them per entry, and the loader and export payload read them from
there."""

DATA_ALIGNMENT = 64
"""Byte alignment the generated code assumes for every buffer's data pointer: what XLA:CPU
provides (the FFI handler checks it before every call)."""
