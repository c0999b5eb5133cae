"""Fit the rational functions of ``compiler/cpu/vector_math.py`` (needs scipy).

``tanh_f32``: tanh(x) ~ x P(z) / Q(z), z = x^2, degrees 4 and 5, Q(0) = 1, on [0, SAT].
``erfc_f32``: erfcx(a) = exp(a^2) erfc(a) ~ P(a) / Q(a), degrees 6 and 7, on [0, 10.1].
The relative error of g ~ P/Q (g(z) = tanh(sqrt z) / sqrt z, resp. erfcx) is minimised in
the max norm by differential correction: each step solves the linear program
``min d  s.t.  |P(u_i) - g_i Q(u_i)| <= d g_i Q_prev(u_i)`` over dense sample points, in a
Chebyshev basis of the variable mapped to [-1, 1] for conditioning. For tanh the
float32-rounded coefficients are then nudged by a few ulp each, greedily, to lower the
largest ulp error of the float32 evaluation (Horner with fused multiply-adds, as LLVM emits
it); erfc's error is dominated by the exp and needs no tuning.

    python tools/fit_rational.py
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import chebyshev, polynomial
from scipy.optimize import linprog
from scipy.special import erfcx

SAT = 9.02
M, N = 4, 5
ERFC_END = 10.1


def _power_series(cheb: np.ndarray, end: float) -> np.ndarray:
    """Coefficients in u of a Chebyshev series in t = 2 u / end - 1."""
    in_t = chebyshev.cheb2poly(cheb)
    out, base = np.zeros(len(in_t)), np.array([1.0])
    for c in in_t:
        out[:len(base)] += c * base
        base = polynomial.polymul(base, [-1.0, 2.0 / end])
    return out


def _samples(end: float, low: float = 0.0) -> np.ndarray:
    k = np.arange(4000)
    return np.sort(np.concatenate([end * (1 - np.cos(np.pi * (k + 0.5) / 8000)),
                                   np.linspace(low, end, 4000)]))


def fit(u: np.ndarray, g: np.ndarray, end: float, m: int, n: int
        ) -> tuple[np.ndarray, np.ndarray]:
    """P (degree m) and Q (degree n, Q(0) = 1) with P/Q ~ g at the points u in [0, end]."""
    t = 2 * u / end - 1
    vp = chebyshev.chebvander(t, m)
    vq = chebyshev.chebvander(t, n)[:, 1:]
    q_prev, best = np.ones_like(u), None
    for _ in range(30):
        w = g * q_prev
        a = np.vstack([np.hstack([vp, -g[:, None] * vq, -w[:, None]]),
                       np.hstack([-vp, g[:, None] * vq, -w[:, None]])])
        cost = np.zeros(m + n + 2)
        cost[-1] = 1.0
        sol = linprog(cost, A_ub=a, b_ub=np.concatenate([g, -g]),
                      bounds=[(None, None)] * (m + n + 1) + [(0, None)], method="highs").x
        p = _power_series(sol[:m + 1], end)
        q = _power_series(np.concatenate([[1.0], sol[m + 1:-1]]), end)
        p, q = p / q[0], q / q[0]
        q_prev = polynomial.polyval(u, q)
        err = np.max(np.abs(polynomial.polyval(u, p) / q_prev - g) / g)
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
    x = _samples(SAT, 1e-3)
    p, q = fit(x * x, np.tanh(x) / x, SAT**2, M, N)
    coeffs = tune(np.concatenate([p, q]).astype(np.float32))
    print("_TANH_P =", tuple(float(c) for c in coeffs[:M + 1]))
    print("_TANH_Q =", tuple(float(c) for c in coeffs[M + 1:]))
    a = _samples(ERFC_END)
    p, q = fit(a, erfcx(a), ERFC_END, 6, 7)
    print("_ERFCX_P =", tuple(float(c) for c in p))
    print("_ERFCX_Q =", tuple(float(c) for c in q))


if __name__ == "__main__":
    main()
