"""Numerically stable primitives used across fdp (NumPy, vectorised).

Probabilities that meet ``e^epsilon`` are handled in log space: at epsilon in
the hundreds ``e^eps * Phi_bar(x)`` overflows and underflows at once.
"""

from __future__ import annotations

import numpy as np
from scipy import special

__all__ = ["log1mexp", "logsubexp", "log_norm_interval", "log_norm_cells", "norm_interval"]


def log1mexp(a: np.ndarray) -> np.ndarray:
    """log(1 - exp(a)) for a <= 0, accurate on the whole range (Maechler 2012)."""
    a = np.asarray(a, dtype=np.float64)
    out = np.empty_like(a)
    near = a > -0.6931471805599453  # each branch only where it is used
    far = ~near
    with np.errstate(divide="ignore", invalid="ignore"):
        out[near] = np.log(-np.expm1(a[near]))
        out[far] = np.log1p(-np.exp(a[far]))
    return out


def logsubexp(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log(exp(a) - exp(b)) for a >= b; -inf where a == b (including both -inf)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where(np.isneginf(b), -np.inf, b - a)
        out = a + log1mexp(np.minimum(diff, 0.0))
    return np.where(np.isneginf(a), -np.inf, out)


def log_norm_interval(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log(Phi(b) - Phi(a)) for a <= b, evaluated in the tail where it is accurate.

    For intervals right of zero it uses the upper tail, log(Phi_bar(a) - Phi_bar(b)),
    so that masses of order 1e-300 keep full relative precision.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    right = a > 0  # both endpoints in the upper tail: use Phi_bar(x) = Phi(-x)
    lo = np.where(right, special.log_ndtr(-a), special.log_ndtr(b))
    hi = np.where(right, special.log_ndtr(-b), special.log_ndtr(a))
    return logsubexp(lo, hi)


def log_norm_cells(t: np.ndarray) -> np.ndarray:
    """log|Phi(t[k+1]) - Phi(t[k])| for k = 0..n-1, t monotone (either direction).

    The same tail rule as :func:`log_norm_interval` (cells right of zero through
    Phi_bar), with one ``log_ndtr`` per point instead of four per cell: each point
    gets L = log Phi(-|t|), the log of its smaller tail. A cell with both ends
    <= 0 is logsubexp(L_b, L_a), one with both ends > 0 logsubexp(L_a, L_b), and
    the (at most one) cell across zero uses log Phi(b) = log1mexp(L_b).
    """
    t = np.asarray(t, dtype=np.float64)
    if t.size >= 2 and t[0] > t[-1]:
        return log_norm_cells(t[::-1])[::-1]
    tails = special.log_ndtr(-np.abs(t))  # log of the smaller tail at each point
    a, b = t[:-1], t[1:]
    la, lb = tails[:-1], tails[1:]
    right = a > 0
    across = (a <= 0) & (b > 0)
    hi_end = np.where(right, la, lb)
    lo_end = np.where(right, lb, la)
    if np.any(across):
        hi_end = np.where(across, log1mexp(np.minimum(lb, 0.0)), hi_end)
    return logsubexp(hi_end, lo_end)


def norm_interval(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Phi(b) - Phi(a) for a <= b without cancellation in either tail."""
    return np.exp(log_norm_interval(a, b))
