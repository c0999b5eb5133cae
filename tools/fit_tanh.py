"""Fit the coefficients of ``compiler/cpu/vector_math.py::tanh_f32`` (needs scipy).

tanh(x) ~ x P(z) / Q(z), z = x^2, degrees 4 and 5, Q(0) = 1, on [0, SAT]. The relative error
of the rational function g(z) = tanh(sqrt z) / sqrt z ~ P/Q is minimised in the max norm by
differential correction: each step solves the linear program
``min d  s.t.  |P(z_i) - g_i Q(z_i)| <= d g_i Q_prev(z_i)`` over dense sample points, in a
Chebyshev basis of t = 2 z / SAT^2 - 1 for conditioning. Then the float32-rounded
coefficients are nudged by a few ulp each, greedily, to lower the largest ulp error of the
float32 evaluation (Horner with fused multiply-adds, as LLVM emits it).

    python tools/fit_tanh.py
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import chebyshev, polynomial
from scipy.optimize import linprog

SAT = 9.02
M, N = 4, 5


def _power_series_in_z(cheb: np.ndarray) -> np.ndarray:
    """Coefficients in z of a Chebyshev series in t = 2 z / SAT^2 - 1."""
    in_t = chebyshev.cheb2poly(cheb)
    out, base = np.zeros(len(in_t)), np.array([1.0])
    for c in in_t:
        out[:len(base)] += c * base
        base = polynomial.polymul(base, [-1.0, 2.0 / SAT**2])
    return out


def fit() -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(4000)
    x = np.sort(np.concatenate([SAT * (1 - np.cos(np.pi * (k + 0.5) / 8000)),
                                np.linspace(1e-3, SAT, 4000)]))
    z, g = x * x, np.tanh(x) / x
    t = 2 * z / SAT**2 - 1
    vp = chebyshev.chebvander(t, M)
    vq = chebyshev.chebvander(t, N)[:, 1:]
    q_prev, best = np.ones_like(z), None
    for _ in range(30):
        w = g * q_prev
        a = np.vstack([np.hstack([vp, -g[:, None] * vq, -w[:, None]]),
                       np.hstack([-vp, g[:, None] * vq, -w[:, None]])])
        cost = np.zeros(M + N + 2)
        cost[-1] = 1.0
        sol = linprog(cost, A_ub=a, b_ub=np.concatenate([g, -g]),
                      bounds=[(None, None)] * (M + N + 1) + [(0, None)], method="highs").x
        p = _power_series_in_z(sol[:M + 1])
        q = _power_series_in_z(np.concatenate([[1.0], sol[M + 1:-1]]))
        p, q = p / q[0], q / q[0]
        q_prev = polynomial.polyval(z, q)
        err = np.max(np.abs(polynomial.polyval(z, p) / q_prev - g) / g)
        if best is None or err < best[0]:
            best = (err, p, q)
    print(f"relative error before rounding: {best[0]:.3g}")
    return best[1], best[2]


def _ordered(v: np.ndarray) -> np.ndarray:
    bits = v.view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def tune(coeffs: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(0, SAT, 1_500_000),
                        rng.uniform(3, SAT, 1_500_000)]).astype(np.float32)
    want = _ordered(np.tanh(x.astype(np.float64)).astype(np.float32))
    z = (x * x).astype(np.float64)

    def horner(cs: np.ndarray) -> np.ndarray:
        acc = np.full(len(x), cs[-1], np.float32)
        for c in cs[-2::-1]:
            acc = (acc.astype(np.float64) * z + np.float64(c)).astype(np.float32)
        return acc

    def score(cs: np.ndarray) -> tuple[int, int]:
        y = np.minimum(x * horner(cs[:M + 1]) / horner(cs[M + 1:]), np.float32(1.0))
        d = np.abs(_ordered(y) - want)
        return int(d.max()), int((d >= 4).sum())

    best = score(coeffs)
    for _ in range(3):
        improved = False
        for i in [i for i in range(len(coeffs)) if i not in (0, M + 1)]:
            for step in (-3, -2, -1, 1, 2, 3):
                trial = coeffs.copy()
                trial[i:i + 1] = (trial[i:i + 1].view(np.int32) + step).view(np.float32)
                s = score(trial)
                if s < best:
                    best, coeffs, improved = s, trial, True
        if not improved:
            break
    print(f"float32 evaluation: {best[0]} ulp at most, {best[1]} samples at 4 or more")
    return coeffs


def main() -> None:
    p, q = fit()
    coeffs = tune(np.concatenate([p, q]).astype(np.float32))
    print("_TANH_P =", tuple(float(c) for c in coeffs[:M + 1]))
    print("_TANH_Q =", tuple(float(c) for c in coeffs[M + 1:]))


if __name__ == "__main__":
    main()
