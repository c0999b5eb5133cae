"""Flash attention on the CPU: ``jt.ops.attention`` vs XLA's ``jax.nn.dot_product_attention``,
both under ``jax.jit``, timed alternately in one run.

- forward and forward + backward (``jax.grad`` of ``sum(out * g)`` in q, k and v), causal
  and not, B=1, H=8, D=64, float32, at S=1024 and 4096 (issue targets: forward >= 1.5x,
  forward + backward >= 1.2x faster than XLA);
- peak memory at S=8192 (forward, and forward + backward), each contender alone in a fresh
  subprocess: the growth of the peak resident set (VmHWM) during one call over the RSS before it,
  and XLA's compiled ``memory_analysis()`` temporaries (a jaxtile kernel's tiles live
  inside its custom call, where XLA does not see them);
- paged decode (one token per sequence against a 4096-token cache) vs a jnp formula that
  gathers the pages.

Speed-up = XLA time / jaxtile time (above 1: jaxtile is faster).

    python benchmarks/attention.py [--seqs 1024 4096] [--rounds 7] [--memory-seq 8192]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _timing import emit, environment, interleaved, log, summary

import jaxtile as jt

HEADS, DIM = 8, 64
BLOCKS = {"block_q": 64, "block_k": 64}


def xla_attention(q, k, v, causal):
    """jax.nn.dot_product_attention on (batch, heads, seq, dim) operands."""
    def t(x):
        return jnp.swapaxes(x, 1, 2)
    return t(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=causal))


def jaxtile_attention(q, k, v, causal):
    return jt.ops.attention(q, k, v, causal=causal, **BLOCKS)


def _forward(fn: Callable, causal: bool) -> Callable:
    return jax.jit(lambda q, k, v: fn(q, k, v, causal))


def _forward_backward(fn: Callable, causal: bool) -> Callable:
    def loss(q, k, v, g):
        return jnp.sum(fn(q, k, v, causal) * g)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _inputs(seq: int, count: int = 4) -> list[jax.Array]:
    keys = jax.random.split(jax.random.key(seq), count)
    return [jax.random.normal(key, (1, HEADS, seq, DIM), jnp.float32) for key in keys]


def _side_by_side(contenders: dict[str, Callable], args: list[jax.Array], rounds: int,
                  calls: int) -> dict[str, Any]:
    runs = {name: (lambda f=f: jax.block_until_ready(f(*args)))
            for name, f in contenders.items()}
    outs = {name: jax.tree.leaves(f(*args)) for name, f in contenders.items()}
    error = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
                for a, b in zip(outs["jaxtile"], outs["xla"]))
    samples = interleaved(runs, rounds=rounds, calls=calls)
    paired = [x / j for x, j in zip(samples["xla"], samples["jaxtile"])]
    return {
        "jaxtile_ms": summary(samples["jaxtile"], 1e3),
        "xla_ms": summary(samples["xla"], 1e3),
        "speedup_of_medians": round(statistics.median(samples["xla"])
                                    / statistics.median(samples["jaxtile"]), 3),
        "speedup_paired_median": round(statistics.median(paired), 3),
        "max_rel_error_vs_xla": error,
    }


def time_attention(seqs: list[int], rounds: int) -> dict[str, Any]:
    results = {}
    for seq in seqs:
        q, k, v, g = _inputs(seq)
        r = max(3, rounds if seq <= 1024 else rounds // 2)
        for causal in (False, True):
            name = f"S{seq}_{'causal' if causal else 'full'}"
            log(f"attention {name}: forward")
            fwd = _side_by_side({"jaxtile": _forward(jaxtile_attention, causal),
                                 "xla": _forward(xla_attention, causal)}, [q, k, v], r, 1)
            log(f"attention {name}: forward + backward")
            both = _side_by_side({"jaxtile": _forward_backward(jaxtile_attention, causal),
                                  "xla": _forward_backward(xla_attention, causal)},
                                 [q, k, v, g], r, 1)
            results[name] = {"forward": fwd, "forward_backward": both}
            log(f"  forward x{fwd['speedup_of_medians']}, "
                f"forward+backward x{both['speedup_of_medians']}")
    return results


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _memory_child(which: str, mode: str, seq: int) -> None:
    """In a fresh process: print JSON with the peak RSS growth of one call over the RSS
    before it (compilation's own peak is cleared first: ``/proc/self/clear_refs``)."""
    q, k, v, g = _inputs(seq)
    fn = jaxtile_attention if which == "jaxtile" else xla_attention
    f = _forward(fn, True) if mode == "forward" else _forward_backward(fn, True)
    args = [q, k, v] if mode == "forward" else [q, k, v, g]
    compiled = f.lower(*args).compile()
    analysis = compiled.memory_analysis()
    jax.block_until_ready(compiled(*args))           # warm: first-call allocations
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                 # reset the peak (VmHWM) to now
    base = _status_kib("VmRSS")
    jax.block_until_ready(compiled(*args))
    peak = _status_kib("VmHWM")
    print(json.dumps({"peak_rss_growth_mib": round((peak - base) / 1024, 1),
                      "xla_temp_mib": round(analysis.temp_size_in_bytes / 2**20, 1)
                      if analysis is not None else None}))


def measure_memory(seq: int) -> dict[str, Any]:
    """Peak memory of causal attention at ``seq``, each contender in its own process."""
    out: dict[str, Any] = {"seq": seq, "inputs_mib": round(4 * seq * HEADS * DIM * 4 / 2**20, 1),
                           "scores_mib": round(seq * seq * HEADS * 4 / 2**20, 1)}
    for mode in ("forward", "forward_backward"):
        for which in ("jaxtile", "xla"):
            log(f"memory at S={seq}: {which} {mode}")
            proc = subprocess.run([sys.executable, __file__, "--memory-child", which, mode,
                                   str(seq)], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                out[f"{which}_{mode}"] = {"error": proc.stderr.strip().splitlines()[-1:]}
                continue
            out[f"{which}_{mode}"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _decode_inputs(batch: int, kv_heads: int, seq: int, page: int):
    pages_per_seq = seq // page
    keys = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(keys[0], (batch, HEADS, DIM), jnp.float32)
    k_pages = jax.random.normal(keys[1], (kv_heads, batch * pages_per_seq, page, DIM))
    v_pages = jax.random.normal(keys[2], (kv_heads, batch * pages_per_seq, page, DIM))
    table = np.random.default_rng(0).permutation(batch * pages_per_seq).astype(np.int32)
    lengths = jnp.full((batch,), seq - page // 2, jnp.int32)
    return q, k_pages, v_pages, jnp.asarray(table.reshape(batch, pages_per_seq)), lengths


def jnp_decode(q, k_pages, v_pages, table, lengths):
    """Gather each sequence's pages, mask past its length, softmax."""
    hk, _, _, d = k_pages.shape
    keys = jnp.moveaxis(k_pages[:, table], 0, 1).reshape(q.shape[0], hk, -1, d)
    vals = jnp.moveaxis(v_pages[:, table], 0, 1).reshape(q.shape[0], hk, -1, d)
    group = q.shape[1] // hk
    qg = q.reshape(q.shape[0], hk, group, d)
    s = jnp.einsum("bkgd,bksd->bkgs", qg, keys) / np.sqrt(d)
    s = jnp.where(jnp.arange(s.shape[-1]) < lengths[:, None, None, None], s, -jnp.inf)
    return jnp.einsum("bkgs,bksd->bkgd", jax.nn.softmax(s, axis=-1), vals).reshape(q.shape)


def time_decode(rounds: int, splits: int) -> dict[str, Any]:
    results = {}
    for batch, kv_heads in ((4, 8), (4, 2)):
        args = _decode_inputs(batch, kv_heads, 4096, 64)
        name = f"B{batch}_H{HEADS}_KV{kv_heads}_S4096_page64"
        log(f"decode {name}")
        results[name] = _side_by_side(
            {"jaxtile": jax.jit(lambda *a: jt.ops.attention_decode(*a, splits=splits)),
             "xla": jax.jit(jnp_decode)}, list(args), rounds * 4, 5)
        log(f"  x{results[name]['speedup_of_medians']}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--memory-seq", type=int, default=8192,
                        help="sequence length of the memory measurement (0: skip)")
    parser.add_argument("--decode-splits", type=int, default=8)
    parser.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        which, mode, seq = args.memory_child
        _memory_child(which, mode, int(seq))
        return
    result = {
        "benchmark": "attention",
        "description": "jax.jit(jt.ops.attention) vs jax.jit(jax.nn.dot_product_attention) "
                       f"on XLA:CPU, B=1 H={HEADS} D={DIM} float32, tiles {BLOCKS}; "
                       "speedup = XLA time / jaxtile time",
        "attention": time_attention(args.seqs, args.rounds),
        "decode": time_decode(args.rounds, args.decode_splits),
    }
    if args.memory_seq:
        result["memory_causal"] = measure_memory(args.memory_seq)
    result["environment"] = environment()
    emit(result)


if __name__ == "__main__":
    main()
