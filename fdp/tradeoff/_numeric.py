"""Vectorised root finding and maximisation used by the generic curve operations.

Everything here works on whole arrays at once: a loop runs over *iterations*
(at most ~100), never over grid points or queries.

Searches run over the *ordered bit patterns* of float64 numbers rather than over
the reals. The map ``key(x)`` below is monotone, so a bisection on keys visits
numbers spread logarithmically near 0 (good for alpha ~ 1e-300) and ends on two
adjacent floats after at most 64 halvings, whatever the interval, including
the infinite interval [-inf, inf].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "float_to_key",
    "key_to_float",
    "bisect_monotone",
    "golden_max",
    "concave_max_upper_bound",
    "secant_lower_polygon",
    "default_alpha_grid",
]

_MAGNITUDE = np.int64(0x7FFF_FFFF_FFFF_FFFF)
_GOLDEN = 0.3819660112501051  # 1 - 1/phi


def float_to_key(x: np.ndarray) -> np.ndarray:
    """Monotone map float64 -> int64 (x < y  <=>  key(x) < key(y); -0.0 < +0.0)."""
    i = np.ascontiguousarray(x, dtype=np.float64).view(np.int64)
    return np.where(i < 0, i ^ _MAGNITUDE, i)


def key_to_float(k: np.ndarray) -> np.ndarray:
    """Inverse of :func:`float_to_key`."""
    k = np.ascontiguousarray(k, dtype=np.int64)
    return np.where(k < 0, k ^ _MAGNITUDE, k).view(np.float64)


def _key_span(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """hi - lo as uint64 (exact; int64 subtraction could overflow)."""
    return hi.astype(np.uint64) - lo.astype(np.uint64)


def _key_add(lo: np.ndarray, step: np.ndarray) -> np.ndarray:
    return (lo.astype(np.uint64) + step).astype(np.int64)


def bisect_monotone(
    predicate: Callable[[np.ndarray], np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    rel_keys: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised bisection for the switch point of a monotone predicate.

    Requires ``predicate(lo)`` True and ``predicate(hi)`` False (elementwise)
    and that the predicate switches once from True to False on [lo, hi].

    Args:
      predicate: maps an array of points to a boolean array of the same shape.
      lo, hi: arrays (broadcast together) of floats, lo < hi.
      rel_keys: stop once hi and lo are at most this many floats apart
        (0 = adjacent floats).

    Returns:
      (lo, hi): arrays with predicate(lo) True, predicate(hi) False and lo, hi
      adjacent floats (or ``rel_keys`` floats apart).
    """
    lo, hi = np.broadcast_arrays(np.asarray(lo, np.float64), np.asarray(hi, np.float64))
    klo = float_to_key(lo.copy())
    khi = float_to_key(hi.copy())
    target = np.uint64(max(1, rel_keys))
    for _ in range(66):
        span = _key_span(klo, khi)
        active = span > target
        if not np.any(active):
            break
        kmid = _key_add(klo, span >> np.uint64(1))
        mid = key_to_float(kmid)
        ok = np.asarray(predicate(mid), dtype=bool)
        klo = np.where(active & ok, kmid, klo)
        khi = np.where(active & ~ok, kmid, khi)
    return key_to_float(klo), key_to_float(khi)


def golden_max(
    objective: Callable[[np.ndarray], np.ndarray],
    lo: float,
    hi: float,
    rows: int,
    *,
    num_scan: int = 385,
    iterations: int = 90,
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised maximisation of ``rows`` unimodal functions on a common [lo, hi].

    Two stages, both vectorised over the rows:

    1. *Scan* a grid made of points uniform in float keys (so every binade,
       down to 1e-300 near zero, gets its share) and points uniform in value
       (when lo, hi are finite). For a unimodal function the maximiser lies
       between the neighbours of the best grid point. A strict maximum beats
       any plateau of equal values, so flat stretches (values equal to float
       resolution) cannot send the search astray, unlike a golden-section
       search over the whole range.
    2. *Golden section* in ordinary arithmetic inside that bracket, where
       floats are dense relative to the bracket's position.

    Args:
      objective: maps points of shape (rows, k) to values of the same shape.
      lo, hi: the search interval (may be infinite).
      rows: number of independent problems.

    Returns:
      (points, values) of shape (4, rows): a final bracket x0 <= x1 <= x2 <= x3
      with the maximiser inside (for an exactly unimodal objective), and the
      objective there.
    """
    klo, khi = float_to_key(np.array([lo]))[0], float_to_key(np.array([hi]))[0]
    span = _key_span(np.array([klo]), np.array([khi]))[0]
    frac = np.linspace(0.0, 1.0, num_scan)
    keys = _key_add(np.full(num_scan, klo), (frac * float(span)).astype(np.uint64))
    keys[-1] = khi
    grid = key_to_float(keys)
    if np.isfinite(lo) and np.isfinite(hi):
        grid = np.concatenate([grid, np.linspace(lo, hi, num_scan // 3)])
    grid = np.unique(np.clip(grid, lo, hi))
    vals = objective(np.broadcast_to(grid, (rows, grid.size)))
    best = np.argmax(np.nan_to_num(vals, nan=-np.inf), axis=1)
    a = grid[np.maximum(best - 1, 0)]
    b = grid[np.minimum(best + 1, grid.size - 1)]
    # Infinite ends of the bracket: fall back to the best point itself.
    a = np.where(np.isfinite(a), a, grid[best])
    b = np.where(np.isfinite(b), b, grid[best])
    for _ in range(iterations):
        w = b - a
        if not np.any(w > 0.0):
            break
        c = a + _GOLDEN * w
        d = b - _GOLDEN * w
        v = objective(np.stack([c, d], axis=1))
        left = v[:, 0] >= v[:, 1]  # maximiser in [a, d]
        b = np.where(left, d, b)
        a = np.where(left, a, c)
    w = b - a
    pts = np.stack([a, a + _GOLDEN * w, b - _GOLDEN * w, b])
    vals = objective(pts.T).T
    return pts, vals


def _line_at(x0, y0, x1, y1, x):
    """Value at x of the line through (x0, y0), (x1, y1); NaN if x0 == x1."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        slope = (y1 - y0) / (x1 - x0)
        return np.where(x1 > x0, y0 + slope * (x - x0), np.nan)


def concave_max_upper_bound(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Certified upper bound on max of a concave function from a final bracket.

    Given four points x0 <= x1 <= x2 <= x3 (axis 0) with values v of a concave
    function phi whose maximiser lies in [x0, x3], concavity gives (a chord
    extended outside its interval lies above phi):

        on [x0, x1] and [x2, x3]:  phi <= L12        (chord through x1, x2)
        on [x1, x2]:               phi <= min(L01, L23)

    and the maximum over [x1, x2] of min(L01, L23) sits at their intersection
    (clipped to [x1, x2]). The bound returned is the largest of these and of the
    sampled values; NaN pieces (coincident points) are skipped.
    """
    x0, x1, x2, x3 = x
    v0, v1, v2, v3 = v
    cands = [np.maximum(v1, v2), _line_at(x1, v1, x2, v2, x0), _line_at(x1, v1, x2, v2, x3)]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s01 = (v1 - v0) / (x1 - x0)
        s23 = (v3 - v2) / (x3 - x2)
        # intersection of L01 and L23
        xc = (v2 - s23 * x2 - v1 + s01 * x1) / (s01 - s23)
    xc = np.clip(np.where(np.isfinite(xc), xc, x1), x1, x2)
    for xx in (x1, x2, xc):
        a = _line_at(x0, v0, x1, v1, xx)
        b = _line_at(x2, v2, x3, v3, xx)
        cands.append(np.fmin(a, b))
    out = cands[0]
    for c in cands[1:]:
        out = np.fmax(out, c)
    return out


def default_alpha_grid(num_points: int = 1025, num_log: int = 161) -> np.ndarray:
    """A grid on [0, 1]: uniform points plus log-spaced points near 0 and near 1."""
    lin = np.linspace(0.0, 1.0, num_points)
    tail = np.geomspace(1e-16, 0.5, num_log)
    return np.unique(np.concatenate([lin, tail, 1.0 - tail]))


def secant_lower_polygon(x: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of max(l_{i-1}, l_{i+1}, 0) on each [x_i, x_{i+1}] (see TradeoffCurve.to_piecewise_linear)."""
    n = x.size - 1  # number of intervals
    dx = np.diff(x)
    s = np.diff(f) / dx
    i = np.arange(n)
    has_a = i >= 1
    has_b = i + 1 <= n - 1
    sa = np.where(has_a, s[np.maximum(i - 1, 0)], np.nan)  # l_{i-1}: through (x_i, f_i)
    sb = np.where(has_b, s[np.minimum(i + 1, n - 1)], np.nan)  # l_{i+1}: through (x_{i+1}, f_{i+1})
    xl, xr, fl, fr = x[:-1], x[1:], f[:-1], f[1:]

    def lines(xx: np.ndarray) -> np.ndarray:
        a = fl + sa * (xx - xl)
        b = fr + sb * (xx - xr)
        return np.fmax(np.fmax(a, b), 0.0)

    with np.errstate(divide="ignore", invalid="ignore"):
        xc = (fr - fl - sb * xr + sa * xl) / (sa - sb)
        # zero crossing of l_{i-1} (matters on the last interval only)
        xz = xl - fl / sa
    xc = np.clip(np.where(np.isfinite(xc), xc, xl), xl, xr)
    xz = np.clip(np.where(np.isfinite(xz), xz, xr), xl, xr)
    px = np.concatenate([xl, xr, xc, xz])
    py = np.concatenate([lines(xl), lines(xr), lines(xc), lines(xz)])
    py = np.minimum(py, np.concatenate([fl, fr, np.full(2 * n, np.inf)]))
    # The endpoint values: at x_i the polygon passes through f_i (exact samples).
    py = np.clip(py, 0.0, 1.0)
    return px, py
