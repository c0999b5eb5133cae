"""JAX's own Pallas GPU kernels (``jax/experimental/pallas/ops/gpu/``), loaded from the
installed ``jax`` with only their two Pallas imports replaced by jaxtile's, as a user ports
a module. Nothing is copied into the project: the source is read at test time."""

import pathlib
import sys
import types

import jax.experimental.pallas as _pallas
import jax.extend.core as jex_core

_IMPORTS = {
    "from jax.experimental import pallas as pl": "from jaxtile import pallas as pl",
    "from jax.experimental.pallas import triton as plgpu":
        "from jaxtile.pallas import triton as plgpu",
}

_loaded: dict[str, types.ModuleType] = {}


def load(name: str) -> types.ModuleType:
    """The module ``jax.experimental.pallas.ops.gpu.<name>`` with the two imports swapped."""
    if name not in _loaded:
        path = pathlib.Path(_pallas.__file__).parent / "ops" / "gpu" / f"{name}.py"
        source = path.read_text()
        for old, new in _IMPORTS.items():
            if source.count(old) != 1:
                raise AssertionError(f"{path} no longer holds the line {old!r} once")
            source = source.replace(old, new)
        module = types.ModuleType(f"jaxtile_ported_{name}")
        module.__file__ = str(path)
        sys.modules[module.__name__] = module
        exec(compile(source, str(path), "exec"), module.__dict__)
        _loaded[name] = module
    return _loaded[name]


def primitives(jaxpr) -> set[str]:
    """The names of every primitive in a jaxpr, nested jaxprs included."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jex_core.jaxprs_in_params(eqn.params):
            names |= primitives(sub)
    return names
