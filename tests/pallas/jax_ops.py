"""JAX's own Pallas GPU kernels (``jax/experimental/pallas/ops/gpu/``), loaded from the
installed ``jax`` with only their two Pallas imports replaced by jaxtile's
(``jaxtile.pallas.port``), as a user ports a module. Nothing is copied into the project:
the source is read at test time."""

import functools
import pathlib

import jax.experimental.pallas as _pallas
import jax.extend.core as jex_core

from jaxtile import pallas as pl

_IMPORTS = ("from jax.experimental import pallas as pl",
            "from jax.experimental.pallas import triton as plgpu")


@functools.cache
def load(name: str):
    """The module ``jax.experimental.pallas.ops.gpu.<name>`` with the two imports swapped."""
    path = pathlib.Path(_pallas.__file__).parent / "ops" / "gpu" / f"{name}.py"
    source = path.read_text()
    for line in _IMPORTS:     # the port changes these two lines and nothing else
        assert source.count(line) == 1, f"{path} no longer holds {line!r} once"
    module = pl.port(path)
    assert "jaxtile.pallas" in repr(module.pl) and "jaxtile.pallas.triton" in repr(module.plgpu)
    return module


def primitives(jaxpr) -> set[str]:
    """The names of every primitive in a jaxpr, nested jaxprs included."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jex_core.jaxprs_in_params(eqn.params):
            names |= primitives(sub)
    return names
