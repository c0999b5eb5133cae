"""The types of the public API: what a kernel body's refs offer, what its indices and loop
bodies are, and what a kernel call takes.

These are static types only (nothing here runs in a kernel); ``jaxtile`` re-exports
:class:`Ref` so that a kernel body may be annotated (``def body(x: jt.Ref) -> jt.Ref``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

import jax
import numpy as np
from jax.typing import ArrayLike


class RefIndexer(Protocol):
    """``ref.at``: indexing it gives a view of the ref (a region with the same methods)."""

    def __getitem__(self, index: Any, /) -> Ref: ...


class Ref(Protocol):
    """A buffer in a kernel body: an array argument, an output (:func:`jaxtile.empty`), an
    on-chip tile (:func:`jaxtile.shared`, :func:`jaxtile.fragment`, :func:`jaxtile.local`)
    or a view of one (``x.at[i, 0]``). Reading it (``x[...]``) gives a traced array; writing
    it (``x[...] = v``) stores one. Indices are ints, traced integer scalars, ``slice`` or
    :func:`jaxtile.ds`."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def at(self) -> RefIndexer: ...

    def __getitem__(self, index: Any, /) -> jax.Array: ...

    def __setitem__(self, index: Any, value: ArrayLike, /) -> None: ...


Index: TypeAlias = int | jax.Array
"""A position or a count in a kernel body: a Python int, a block index, a loop counter or an
integer scalar computed on the device (e.g. read from an input)."""

LoopBody: TypeAlias = Callable[[jax.Array], object]
"""The body of ``jt.loop``/``jt.pipelined``: it gets the iteration's counter and writes its
results to refs. (Typed as returning ``object``: a body that returns a value is a
``KernelError`` at the user's line when traced, which a ``None`` return type would forbid
checking.)"""

Body: TypeAlias = Callable[[], object]
"""The body of ``jt.when``/``jt.while_``: no arguments; like :data:`LoopBody`, it must not
return a value."""

KernelArg: TypeAlias = jax.Array | np.ndarray[Any, Any]
"""An array argument of a kernel call (a JAX array, a tracer or a NumPy array)."""
