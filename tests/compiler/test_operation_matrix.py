"""Every Tile IR operation, with every dtype it takes, on every backend: the matrix of
``docs/operations.md``, generated from ``op_defs`` and the backends' lowering registries.

One kernel per (backend, dtype) computes every operation that takes the dtype, each into an
output of its own; its result is compared with the kernel's reference semantics and with an
independent jnp formula computed by XLA. The lowered IR of each kernel must hold every op
kind its cases are there to run (so that no case silently stops testing its op). Known holes
run in kernels of their own, as xfails naming the reason.

The default run takes one dtype per backend (:data:`DEFAULT`); ``-m slow`` runs every dtype
on the CPU and in the CUDA emulator (a g++ build per kernel)."""

import dataclasses
import pathlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxtile as jt
from jaxtile.compiler import op_defs, operations_doc

SHAPE = (16, 32)
BACKENDS = {"cpu": "cpu", "cuda-emulator": "cuda:sm_80"}
DTYPES = sorted(op_defs.DTYPES, key=lambda d: (d.kind, d.itemsize, d.name))
DEFAULT = {("cpu", np.dtype(np.float32)), ("cuda-emulator", np.dtype(np.int32))}
"""What the default run covers (the suite's time budget): the most operations on the CPU,
integer arithmetic, atomics and a GEMM through shared memory in the emulator."""
_TRANSCENDENTAL = op_defs.EXPENSIVE - {"div", "rem"}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    """The operation's name in docs/operations.md (``kind`` or ``kind.fn``)."""
    kind: str
    body: Callable
    """Kernel body part: ``body(x_ref, y_ref)`` -> the output ref it writes."""
    want: Callable
    """``want(x, y)``: the expected output, by jnp on whole arrays."""
    dtypes: frozenset
    approximate: bool = False
    """Compared within a few ulps (math functions, float reductions in another order)."""
    loads: bool = True
    """Its kernel reads the inputs (``load`` ops)."""


def _out(r):
    out = jt.empty(r.shape, r.dtype)
    out[...] = r
    return out


def _value(name, kind, fn, dtypes, approximate=False, want=None):
    """A case computing ``fn`` of the input tiles (loaded whole) in the kernel, and ``want``
    (default ``fn``) in jnp."""
    return Case(name, kind, lambda x, y: _out(fn(x[...], y[...])), want or fn, dtypes,
                approximate, loads=kind not in ("const", "iota"))


_LAX_NAMES = {"not": "bitwise_not", "and": "bitwise_and", "or": "bitwise_or",
              "xor": "bitwise_xor"}


def _elementwise(fn):
    if fn in ("round", "round_away"):
        method = (lax.RoundingMethod.TO_NEAREST_EVEN if fn == "round"
                  else lax.RoundingMethod.AWAY_FROM_ZERO)

        def f(a, b):
            return lax.round(a, method)
    elif fn in op_defs.UNARY:
        def f(a, b):
            return getattr(lax, _LAX_NAMES.get(fn, fn))(a)
    else:
        def f(a, b):
            return getattr(lax, _LAX_NAMES.get(fn, fn))(a, b)
    return _value(f"elementwise.{fn}", "elementwise", f,
                  op_defs.get("elementwise").accepts(fn), fn in _TRANSCENDENTAL)


def _identity(fn, dtype):
    """The reduction's starting value, as a numpy scalar (so that jax sees its monoid)."""
    if fn in ("sum", "or"):
        return np.zeros((), dtype)[()]
    if fn in ("prod",):
        return np.ones((), dtype)[()]
    if fn == "and":
        return ~np.zeros((), dtype)[()]
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return np.asarray(-np.inf if fn == "max" else np.inf, dtype)[()]
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    if info is None:  # bool
        return np.asarray(fn == "min", dtype)[()]
    return np.asarray(info.min if fn == "max" else info.max, dtype)[()]


def _rounded_once(f):
    """``f`` as jaxtile computes 16-bit sums and products: in float32, rounded once (XLA's
    own bfloat16/float16 reductions and scans round every step)."""

    def g(a, b):
        if a.dtype not in (jnp.float16, jnp.bfloat16):
            return f(a, b)
        return f(a.astype(jnp.float32), b.astype(jnp.float32)).astype(a.dtype)

    return g


def _reduce(fn):
    combine = {"sum": lax.add, "prod": lax.mul, "max": lax.max, "min": lax.min,
               "and": lax.bitwise_and, "or": lax.bitwise_or}[fn]

    def f(a, b):
        return lax.reduce(a, _identity(fn, np.dtype(a.dtype)), combine, (1,))

    return _value(f"reduce.{fn}", "reduce", f, op_defs.get("reduce").accepts(fn),
                  approximate=fn in ("sum", "prod"), want=_rounded_once(f))


def _scan(fn):
    f = {"sum": lax.cumsum, "prod": lax.cumprod, "max": lax.cummax, "min": lax.cummin}[fn]

    def g(a, b):
        return f(a, axis=1)

    return _value(f"scan.{fn}", "scan", g, op_defs.get("scan").accepts(fn),
                  approximate=fn in ("sum", "prod"), want=_rounded_once(g))


def _argreduce(fn):
    f = jnp.argmax if fn == "max" else jnp.argmin
    return _value(f"argreduce.{fn}", "argreduce", lambda a, b: f(a, axis=1),
                  op_defs.get("argreduce").accepts(fn))


def _atomic(fn):
    update = {"add": jt.atomic_add, "max": jt.atomic_max, "min": jt.atomic_min}[fn]
    combine = {"add": jnp.add, "max": jnp.maximum, "min": jnp.minimum}[fn]

    def body(x, y):
        out = jt.empty(x.shape, x.dtype)
        update(out, x[...])
        update(out, y[...])
        return out

    # an output updated atomically starts as zeros
    return Case(f"atomic.{fn}", "atomic", body,
                lambda a, b: combine(combine(jnp.zeros_like(a), a), b),
                op_defs.get("atomic").accepts(fn))


def _copy_body(x, y):
    t = jt.shared(x.shape, x.dtype)
    jt.copy(x, t)
    return _out(t[...])


def _accumulator(dtype):
    if dtype in op_defs.FLOATS | op_defs.FLOAT8:
        return np.dtype(np.float32) if dtype.itemsize < 4 else dtype
    return np.dtype(np.int32) if dtype.itemsize < 4 else dtype


def _gemm_body(x, y):
    a_s = jt.shared((16, 16), x.dtype)
    b_s = jt.shared((16, 16), y.dtype)
    jt.copy(x.at[0, 0], a_s)
    jt.copy(y.at[0, 16], b_s)
    acc = jt.fragment((16, 16), _accumulator(np.dtype(x.dtype)))
    acc[...] = jnp.zeros(acc.shape, acc.dtype)
    jt.gemm(a_s, b_s, acc)
    return _out(acc[...])


def _gemm_want(a, b):
    t = _accumulator(np.dtype(a.dtype))
    wide = np.float64 if t in op_defs.FLOATS else np.int64
    exact = np.asarray(a[:, :16], wide) @ np.asarray(b[:, 16:], wide)
    return jnp.asarray(exact.astype(t))


def _converts():
    """One case per dtype converted to (from every other: to its own is no op)."""
    return [_value(f"convert.{to.name}", "convert",
                   lambda a, b, to=to: lax.convert_element_type(a, to), op_defs.DTYPES - {to})
            for to in DTYPES]


def _pattern(shape):
    """A fixed bool pattern, whatever the dtype under test."""
    return lax.broadcasted_iota(jnp.int32, shape, 1) % 3 == 0


_SHAPES = {
    "const": lambda a, b: jnp.full(a.shape, 1, a.dtype),
    "iota": lambda a, b: lax.broadcasted_iota(a.dtype, a.shape, 1),
    "broadcast": lambda a, b: lax.broadcast_in_dim(a[0], (4, *a.shape[1:]), (1,)),
    "reshape": lambda a, b: a.reshape(a.shape[1], a.shape[0]),
    "rev": lambda a, b: lax.rev(a, (1,)),
    "slice": lambda a, b: a[1:15:2, 3:30:3],
    "concatenate": lambda a, b: jnp.concatenate([a, b[:, :4]], axis=1),
    "transpose": lambda a, b: a.T,
    "sort": lambda a, b: jnp.sort(a, axis=1),
    "select": lambda a, b: lax.select(_pattern(a.shape), a, b),
    # a square tile added to its transpose: two layouts of one value on a GPU (8-bit floats
    # are added in float32)
    "relayout": lambda a, b: a[:, :16] ^ a[:, :16].T if a.dtype == jnp.bool_
    else (a[:, :16].astype(jnp.float32) + a[:, :16].T.astype(jnp.float32)).astype(a.dtype)
    if np.dtype(a.dtype) in op_defs.FLOAT8 else a[:, :16] + a[:, :16].T,
}
_NOT_RUN = {
    "size": "a dynamic size; tests/jaxtile/test_language_dynamic.py runs it",
    "load_acquire": "flags between blocks; tests/emulator/test_memory_ordering.py runs it",
    "store_release": "flags between blocks; tests/emulator/test_memory_ordering.py runs it",
    "fence": "ordering between blocks; tests/emulator/test_memory_ordering.py runs it",
    "print": "writes text, not an output; tests/jaxtile/test_language_print.py runs it",
    "async_issue": "the GPU pipelining pass's; tests/emulator/test_cuda_pipelines.py runs it",
    "async_commit": "the GPU pipelining pass's; tests/emulator/test_cuda_pipelines.py runs it",
    "async_wait": "the GPU pipelining pass's; tests/emulator/test_cuda_pipelines.py runs it",
    "tma_issue": "the GPU pipelining pass's on TMA targets; tests/emulator/test_hopper_tma.py "
                 "runs it",
    "tma_wait": "the GPU pipelining pass's on TMA targets; tests/emulator/test_hopper_tma.py "
                "runs it",
    "mbarrier_init": "the GPU pipelining pass's on TMA targets; "
                     "tests/compiler/gpu/test_ring_setup.py runs it",
    "tma_store": "the GPU TMA-store pass's; tests/emulator/test_hopper_tma_store.py runs it",
    "tma_store_wait": "the GPU TMA-store pass's; tests/emulator/test_hopper_tma_store.py "
                      "runs it",
    "warp_specialise": "the GPU warp-specialisation pass's (sm_90a); "
                       "tests/emulator/test_hopper_ws_gemm.py runs it",
    "tma_release": "the GPU warp-specialisation pass's (sm_90a); "
                   "tests/emulator/test_hopper_ws_gemm.py runs it",
    "pingpong": "the GPU ping-pong pass's (sm_90a); tests/compiler/gpu/test_pingpong.py "
                "runs it",
    "turn_wait": "the GPU ping-pong pass's (sm_90a); tests/compiler/gpu/test_pingpong.py "
                 "runs it",
    "turn_pass": "the GPU ping-pong pass's (sm_90a); tests/compiler/gpu/test_pingpong.py "
                 "runs it",
}
"""Operations this test does not run, and why."""
_ALSO_IN = {"load": "every case", "store": "every case",
            "barrier": "the copy and gemm cases (through shared memory) on CUDA"}
"""Operations every kernel holds (on the backends that lower them) without a case."""
_HOLES = {
    ("cpu", "const", "bfloat16"): "a bfloat16 constant stored as a whole tile: TVM's "
    "bfloat16 legalisation leaves the vector constant, and the store fails to compile",
}
"""(backend, operation name, dtype name) -> why it fails; run as an xfail of its own."""


def _cases() -> dict[str, Case]:
    out: dict[str, Case] = {}
    for name, kind, fn in operations_doc.operations():
        if kind == "elementwise":
            case = _elementwise(fn)
        elif kind == "reduce":
            case = _reduce(fn)
        elif kind == "scan":
            case = _scan(fn)
        elif kind == "argreduce":
            case = _argreduce(fn)
        elif kind == "atomic":
            case = _atomic(fn)
        elif kind == "copy":
            case = Case(name, kind, _copy_body, lambda a, b: a, op_defs.DTYPES)
        elif kind == "gemm":
            case = Case(name, kind, _gemm_body, _gemm_want, op_defs.get("gemm").accepts())
        elif kind == "convert":
            out.update((c.name, c) for c in _converts())
            continue
        elif kind in _SHAPES:
            d = op_defs.get(kind)
            case = _value(name, kind, _SHAPES[kind], d.accepts(), approximate=False)
        else:
            continue
        out[case.name] = case
    return out


CASES = _cases()


@jt.kernel
def _matrix(x, y, *, cases):
    jt.grid(1)
    return tuple(CASES[name].body(x, y) for name in cases)


def _data(dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return jnp.asarray(rng.integers(0, 2, SHAPE).astype(bool))
    if dtype in op_defs.FLOATS | op_defs.FLOAT8:
        # quarters in [-2, 2]: exact in every float type, and their products too
        return jnp.asarray(rng.integers(-8, 9, SHAPE) / 4, dtype)
    low = -8 if np.issubdtype(dtype, np.signedinteger) else 0
    return jnp.asarray(rng.integers(low, 17 + low, SHAPE), dtype)


def _tolerance(case, dtype):
    if not case.approximate or dtype not in op_defs.FLOATS:
        return {}
    rtol = {2: 2 ** -7, 4: 4e-6, 8: 1e-13}[dtype.itemsize]
    if dtype.name == "float16":
        rtol = 2 ** -9
    return {"rtol": rtol, "atol": rtol}


def _same(got, want, what, rtol=0.0, atol=0.0):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype.kind == "f" or got.dtype in op_defs.FLOAT8 | {np.dtype(jnp.bfloat16)}:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _run(backend, dtype, names):
    with jax.enable_x64(True):
        x, y = _data(dtype, 0), _data(dtype, 1)
        before = jt.backend()
        jax.clear_caches()
        jt.set_backend(backend)
        try:
            got = jax.jit(lambda a, b: _matrix(a, b, cases=names))(x, y)
        finally:
            jt.set_backend(before)
            jax.clear_caches()
        ref = _matrix.reference(x, y, cases=names)
        wants = [CASES[n].want(x, y) for n in names]
        lowered = _matrix.lower(x, y, cases=names, target=BACKENDS[backend]).lowered_ir
    failures = []
    for name, g, r, w in zip(names, got, ref, wants):
        tol = _tolerance(CASES[name], dtype)
        try:
            _same(r, w, f"{name}: reference vs jnp", **tol)
            _same(g, r, f"{name}: compiled vs reference", **tol)
            _same(g, w, f"{name}: compiled vs jnp", **tol)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)
    kinds = {CASES[n].kind for n in names} | {"store"}
    kinds |= {"load"} if any(CASES[n].loads for n in names) else set()
    if backend != "cpu":
        kinds |= {"barrier"} if {"copy", "gemm"} & kinds else set()
    missing = sorted(k for k in kinds if f"= {k}(" not in lowered and f" {k}(" not in lowered)
    assert not missing, f"the lowered IR lost the ops under test: {missing}"


def _params():
    out = []
    for backend in BACKENDS:
        for dtype in DTYPES:
            marks = [] if (backend, dtype) in DEFAULT else [pytest.mark.slow]
            out.append(pytest.param(backend, dtype, marks=marks,
                                    id=f"{backend}-{dtype.name}"))
    return out


def _names(backend, dtype):
    return tuple(n for n, c in CASES.items() if dtype in c.dtypes
                 and (backend, n, dtype.name) not in _HOLES
                 and not (backend == "cpu" and c.kind == "relayout"))


@pytest.mark.parametrize("backend,dtype", _params())
def test_every_operation_with_the_dtype(backend, dtype):
    _run(backend, dtype, _names(backend, dtype))


def _hole_params():
    out = []
    for (backend, name, dtype), reason in _HOLES.items():
        out.append(pytest.param(backend, name, np.dtype(dtype), marks=[
            pytest.mark.xfail(reason=reason, strict=True, raises=jt.KernelError),
            pytest.mark.slow],
            id=f"{backend}-{name}-{dtype}"))
    return out


@pytest.mark.parametrize("backend,name,dtype", _hole_params())
def test_known_holes(backend, name, dtype):
    _run(backend, dtype, (name,))


def test_every_listed_operation_has_a_case_and_every_backend_lowers_it_or_says_not():
    listed = {name for name, _, _ in operations_doc.operations()}
    run = {c.name for c in CASES.values()} | {c.kind for c in CASES.values()}
    assert listed - run - set(_NOT_RUN) - set(_ALSO_IN) == set()
    lowered = operations_doc.lowered()
    page = (pathlib.Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for name, kind, _ in operations_doc.operations():
        row = next(ln for ln in page.splitlines() if ln.startswith(f"| `{name}` |"))
        cells = [c.strip() for c in row.split("|")[2:2 + len(lowered)]]
        for cell, (backend, kinds) in zip(cells, lowered.items()):
            assert cell == ("yes" if kind in kinds else "not lowered"), (name, backend)
    # what no backend lowers is a bug, not a documented gap
    assert all(any(kind in kinds for kinds in lowered.values()) for kind in op_defs.OPS)
