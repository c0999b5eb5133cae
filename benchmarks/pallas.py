"""JAX's own Pallas GPU kernels compiled by jaxtile on the CPU (``jaxtile.pallas.port``: the
installed module with its two Pallas imports swapped), against XLA running the same math
(``jax.nn.softmax``; each module's ``*_reference``) and, for softmax, against Pallas' own
``interpret=True`` (the only way Pallas runs a GPU kernel on a CPU). Targets (issue 22):
softmax >= 0.7x ``jax.nn.softmax``, i.e. ratio jaxtile / XLA <= 1/0.7, and >= 100x
interpret mode. Everything under ``jax.jit``, contenders timed alternately (interleaved
rounds, medians).

    python benchmarks/pallas.py [--rounds 15] [--interpret-calls 1] [--only softmax,...]
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import time

import jax
import jax.experimental.pallas as jax_pallas
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment, interleaved, log, ratio, summary

from jaxtile import pallas as pl

_OPS = pathlib.Path(jax_pallas.__file__).parent / "ops" / "gpu"


@functools.cache
def ported(name: str):
    return pl.port(_OPS / f"{name}.py")


def _compare(name: str, ours, xla, args, *, rounds: int, calls: int) -> dict:
    """Check, then time ``ours`` (jaxtile) and ``xla`` alternately; ratio = jaxtile / XLA."""
    got, want = np.asarray(ours(*args), np.float32), np.asarray(xla(*args), np.float32)
    log(f"{name}: {rounds} rounds x {calls} calls ...")
    contenders = {"jaxtile": lambda: jax.block_until_ready(ours(*args)),
                  "xla": lambda: jax.block_until_ready(xla(*args))}
    interleaved(contenders, rounds=1, calls=calls)     # warm-up, discarded
    samples = interleaved(contenders, rounds=rounds, calls=calls)
    r = ratio(samples, "jaxtile", "xla")
    return {"shapes": [list(np.shape(a)) for a in args if a is not None],
            "unit": "ms per call", "rounds": rounds, "calls_per_round": calls,
            "jaxtile": summary(samples["jaxtile"], 1e3), "xla": summary(samples["xla"], 1e3),
            "ratio": r["of_medians"], "ratio_paired_median": r["paired_median"],
            "speed_vs_xla": round(1 / r["of_medians"], 3),
            "max_abs_err": float(np.max(np.abs(got - want)))}


def softmax(rounds: int, interpret_calls: int) -> dict:
    x = jax.random.normal(jax.random.key(0), (8, 512, 512), jnp.float32)
    ours = jax.jit(ported("softmax").softmax)
    out = _compare("softmax", ours, jax.jit(lambda x: jax.nn.softmax(x, axis=-1)), (x,),
                   rounds=rounds, calls=10)
    # Pallas' own module in interpret mode: seconds per call, so a few calls, not rounds.
    from jax.experimental.pallas.ops.gpu import softmax as pallas_softmax
    interp = jax.jit(functools.partial(pallas_softmax.softmax, interpret=True))
    log(f"softmax: Pallas interpret=True, {interpret_calls} call(s) after a warm-up ...")
    jax.block_until_ready(interp(x))
    times = []
    for _ in range(interpret_calls):
        t0 = time.perf_counter()
        jax.block_until_ready(interp(x))
        times.append(time.perf_counter() - t0)
    ours_ms = out["jaxtile"]["median"]
    out["pallas_interpret"] = summary(times, 1e3)
    out["speedup_vs_interpret"] = round(out["pallas_interpret"]["median"] / ours_ms, 1)
    return out


def norms(rounds: int) -> dict:
    k = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(k[0], (8, 512, 1000), jnp.float32) + 1
    w, b = jax.random.normal(k[1], (1000,)), jax.random.normal(k[2], (1000,))
    out = {}
    for name in ("layer_norm", "rms_norm"):
        module = ported(name)
        out[name] = _compare(name, jax.jit(getattr(module, name)),
                             jax.jit(getattr(module, f"{name}_reference")), (x, w, b),
                             rounds=rounds, calls=5)
    return out


def attention(rounds: int) -> dict:
    module = ported("attention")
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 1024, 4, 64)) for i in range(3))
    blocks = module.BlockSizes(block_q=64, block_k=64)
    out = {}
    for causal in (False, True):
        ours = jax.jit(lambda q, k, v, c=causal: module.mha(q, k, v, None, causal=c,
                                                            block_sizes=blocks))
        xla = jax.jit(lambda q, k, v, c=causal: module.mha_reference(q, k, v, None, causal=c))
        out["mha_causal" if causal else "mha"] = _compare(
            f"mha causal={causal}", ours, xla, (q, k, v), rounds=rounds, calls=3)
    return out


def decode(rounds: int) -> dict:
    module = ported("decode_attention")
    keys = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(keys[0], (8, 32, 64))
    k, v = (jax.random.normal(kk, (8, 2048, 4, 64)) for kk in keys[1:])
    start, length = jnp.zeros((8,), jnp.int32), jnp.full((8,), 1900, jnp.int32)
    ours = jax.jit(lambda *a: module.gqa(*a, block_h=8, block_k=128, k_splits=8))
    return {"gqa": _compare("gqa", ours, jax.jit(module.gqa_reference),
                            (q, k, v, start, length), rounds=rounds, calls=3)}


def paged(rounds: int) -> dict:
    module = ported("paged_attention")
    rng = np.random.default_rng(0)
    batch, heads, kv_heads, d, page, per_seq = 4, 32, 4, 64, 16, 64
    q = jnp.asarray(rng.standard_normal((batch, heads, d)), jnp.float32)
    dense = [rng.standard_normal((batch, page * per_seq, kv_heads, d)).astype(np.float32)
             for _ in range(2)]
    tables = rng.permutation(batch * per_seq).reshape(batch, per_seq).astype(np.int32)
    pages = []
    for t in dense:
        p = np.zeros((kv_heads, batch * per_seq, page, d), np.float32)
        for i in range(batch):
            for j in range(per_seq):
                p[:, tables[i, j]] = t[i, j * page:(j + 1) * page].transpose(1, 0, 2)
        pages.append(jnp.asarray(p))
    lengths = jnp.array([1000, 700, 1024, 300], jnp.int32)
    ours = jax.jit(lambda q, kp, vp, t, n, k, v: module.paged_attention(
        q, kp, vp, t, n, block_h=16, pages_per_compute_block=4, k_splits=4))
    xla = jax.jit(lambda q, kp, vp, t, n, k, v: module.paged_attention_reference(q, k, v, n))
    args = (q, *pages, jnp.asarray(tables), lengths, *map(jnp.asarray, dense))
    return {"paged_attention": _compare("paged_attention", ours, xla, args, rounds=rounds,
                                        calls=3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--interpret-calls", type=int, default=1)
    parser.add_argument("--only", default="softmax,norms,attention,decode,paged")
    args = parser.parse_args()
    runs = {"softmax": lambda: softmax(args.rounds, args.interpret_calls),
            "norms": lambda: norms(args.rounds), "attention": lambda: attention(args.rounds),
            "decode": lambda: decode(args.rounds), "paged": lambda: paged(args.rounds)}
    result = {"benchmark": "pallas",
              "description": "JAX's Pallas GPU kernels ported by jaxtile.pallas.port, compiled "
                             "for the CPU, vs XLA:CPU on jax.nn.softmax / the modules' "
                             "references; ratio = jaxtile / XLA (lower is better for "
                             "jaxtile), speed_vs_xla = 1 / ratio"}
    for name in args.only.split(","):
        result[name] = runs[name]()
    result["environment"] = environment()
    emit(result)


if __name__ == "__main__":
    main()
