"""jaxtile quickstart: compile three tile kernels for the CPU, run them inside jax.jit, check
them against jnp and print their time next to XLA's.

    python examples/quickstart.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxtile as jt


def _median_ms(ours, theirs, *args, rounds=15, calls=3):
    """Median ms per call of each, timed in alternation: the two share whatever the machine
    does meanwhile (a core slowed down, another process), which timing one after the other
    would charge to whichever ran then."""
    for fn in (ours, theirs):
        jax.block_until_ready(fn(*args))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for fn, out in zip((ours, theirs), times):
            t0 = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
            out.append((time.perf_counter() - t0) / calls)
    return tuple(1e3 * float(np.median(t)) for t in times)


def main() -> None:
    key = jax.random.key(0)
    kx, ky, ka, kb = jax.random.split(key, 4)
    cases = [
        ("vector add (1M + 1000 tail, f32)", jt.ops.add, lambda x, y: x + y,
         (jax.random.normal(kx, (1_049_576,)), jax.random.normal(ky, (1_049_576,))), 0.0),
        ("row softmax (4096 x 1000, f32)", jt.ops.softmax,
         lambda x: jax.nn.softmax(x, axis=-1), (jax.random.normal(kx, (4096, 1000)) * 4,), 1e-5),
        ("matmul_relu (1000 x 700 x 900, f32)", jt.ops.matmul_relu,
         lambda a, b: jnp.maximum(jnp.matmul(a, b, precision="highest"), 0),
         (jax.random.normal(ka, (1000, 700)), jax.random.normal(kb, (700, 900))), 1e-4),
    ]
    print(f"{'kernel':40s} {'max err':>10s} {'jaxtile ms':>11s} {'XLA ms':>8s} {'ratio':>6s}")
    for name, kernel, formula, args, tol in cases:
        t0 = time.perf_counter()
        ours = jax.jit(kernel)
        got = jax.block_until_ready(ours(*args))
        compile_s = time.perf_counter() - t0
        xla = jax.jit(formula)
        want = xla(*args)
        err = float(jnp.max(jnp.abs(got - want) / (1 + jnp.abs(want))))
        if not err <= tol:
            raise SystemExit(f"{name}: jaxtile and jnp differ by {err:.3g} (> {tol})")
        t_ours, t_xla = _median_ms(ours, xla, *args)
        print(f"{name:40s} {err:10.2e} {t_ours:11.2f} {t_xla:8.2f} {t_ours / t_xla:6.2f}"
              f"   (first call incl. compile: {compile_s:.2f} s)")
    print("\nGenerated Tile IR of matmul_relu for 1000x700x900:\n")
    print(jt.ops.matmul_relu.lower(*cases[2][3]).tile_ir)


if __name__ == "__main__":
    main()
