"""Small optimisers for the calibration fits, in plain Python (the project does not depend on
numpy or scipy): Levenberg-Marquardt least squares, Nelder-Mead, and the parameter
transforms that keep every candidate physical.

Parameters are searched in transformed space: a log for times (positive), a scaled logit for
quantities with bounds (efficiencies in (0, MAX_EFFICIENCY), bytes per quantized weight in
(1, 3)), so neither optimiser can propose a negative time or an efficiency above the cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

#: Upper bound on any fitted efficiency: no engine sustains its full peak.
MAX_EFFICIENCY = 0.9
#: Bounds of quantities fitted between two limits (the rest are positive times).
BOUNDS: dict[str, tuple[float, float]] = {
    "weight_bw_efficiency": (0.0, MAX_EFFICIENCY),
    "kv_bw_efficiency": (0.0, MAX_EFFICIENCY),
    "compute_efficiency": (0.0, MAX_EFFICIENCY),
    "attention_efficiency": (0.0, MAX_EFFICIENCY),
    # One int8/fp8 weight costs at least its storage byte; dequantization can make it cost
    # more than a bf16 weight's two, but not without limit.
    "quantized_weight_bytes": (1.0, 3.0),
}
_CLAMP = 40.0


def encode(name: str, value: float) -> float:
    """Physical value -> unbounded search coordinate."""
    if name in BOUNDS:
        lo, hi = BOUNDS[name]
        frac = min(max((value - lo) / (hi - lo), 1e-9), 1 - 1e-9)
        return math.log(frac / (1 - frac))
    return math.log(max(value, 1e-12))


def decode(name: str, x: float) -> float:
    """Search coordinate -> physical value (inverse of encode)."""
    x = max(-_CLAMP, min(_CLAMP, x))
    if name in BOUNDS:
        lo, hi = BOUNDS[name]
        return lo + (hi - lo) / (1 + math.exp(-x))
    return math.exp(x)


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a x = b (Gaussian elimination, partial pivoting; a is small and square)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            raise ZeroDivisionError("singular system")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            if factor:
                for c in range(col, n + 1):
                    m[r][c] -= factor * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def least_squares(residuals: Callable[[list[float]], list[float]], x0: Sequence[float],
                  max_iter: int = 100, tol: float = 1e-9, step: float = 1e-6,
                  ridge: float = 1e-8) -> tuple[list[float], float]:
    """Minimise sum(residuals(x)**2) from x0 by Levenberg-Marquardt with a forward-difference
    Jacobian. A tiny ridge towards x0 keeps coordinates that no residual depends on where
    they started (a parameter the data cannot see stays at its prior). Returns (x, cost)."""
    x = list(x0)
    n = len(x)
    origin = list(x0)

    def cost_of(r: list[float], point: list[float]) -> float:
        return sum(v * v for v in r) + ridge * sum((p - o) ** 2 for p, o in zip(point, origin))

    r = residuals(x)
    cost = cost_of(r, x)
    lam = 1e-3
    for _ in range(max_iter):
        jac = []                                        # columns: d residuals / d x_j
        for j in range(n):
            shifted = x[:]
            shifted[j] += step
            jac.append([(a - b) / step for a, b in zip(residuals(shifted), r)])
        jtj = [[sum(a * b for a, b in zip(jac[i], jac[j])) for j in range(n)] for i in range(n)]
        grad = [sum(a * b for a, b in zip(jac[i], r)) + ridge * (x[i] - origin[i])
                for i in range(n)]
        improved = False
        while lam < 1e10:
            system = [[jtj[i][j] + (lam * (jtj[i][i] + 1e-12) + ridge if i == j else 0.0)
                       for j in range(n)] for i in range(n)]
            try:
                delta = solve(system, [-g for g in grad])
            except ZeroDivisionError:
                lam *= 10
                continue
            candidate = [max(-_CLAMP, min(_CLAMP, a + d)) for a, d in zip(x, delta)]
            r_new = residuals(candidate)
            cost_new = cost_of(r_new, candidate)
            if cost_new < cost:
                gain = cost - cost_new
                x, r, cost = candidate, r_new, cost_new
                lam = max(lam * 0.3, 1e-9)
                improved = True
                break
            lam *= 10
        if not improved or gain <= tol * (cost + tol):
            break
    return x, cost


def nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], step: float = 0.5,
                tol: float = 1e-12, max_iter: int = 4000, restarts: int = 6) -> list[float]:
    """Minimise f from x0 (standard reflect/expand/contract/shrink), restarting the simplex
    around the best point until a restart no longer improves it. For objectives that are not
    sums of squares."""
    best = list(x0)
    best_f = f(best)
    for _ in range(restarts):
        n = len(best)
        simplex = [best] + [[v + (step if i == j else 0.0) for j, v in enumerate(best)]
                            for i in range(n)]
        values = [f(p) for p in simplex]
        for _ in range(max_iter):
            order = sorted(range(n + 1), key=values.__getitem__)
            simplex, values = [simplex[i] for i in order], [values[i] for i in order]
            if values[-1] - values[0] <= tol * (abs(values[0]) + tol):
                break
            centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
            worst = simplex[-1]
            reflect = [c + (c - w) for c, w in zip(centroid, worst)]
            fr = f(reflect)
            if fr < values[0]:
                expand = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
                fe = f(expand)
                simplex[-1], values[-1] = (expand, fe) if fe < fr else (reflect, fr)
            elif fr < values[-2]:
                simplex[-1], values[-1] = reflect, fr
            else:
                inside = fr >= values[-1]
                contract = [c + (0.5 * (w - c) if inside else 0.5 * (r - c))
                            for c, w, r in zip(centroid, worst, reflect)]
                fc = f(contract)
                if fc < min(fr, values[-1]):
                    simplex[-1], values[-1] = contract, fc
                else:                                   # shrink towards the best point
                    simplex = [simplex[0]] + [[b + 0.5 * (v - b) for b, v in zip(simplex[0], p)]
                                              for p in simplex[1:]]
                    values = [values[0]] + [f(p) for p in simplex[1:]]
        i = min(range(n + 1), key=values.__getitem__)
        improved = values[i] < best_f - tol * (abs(best_f) + tol)
        best, best_f = simplex[i], values[i]
        if not improved:
            break
        step *= 0.5
    return best
