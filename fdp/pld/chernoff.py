"""Chernoff bounds on a composed privacy loss: FFT windows, tilts, a quick eps.

For independent steps with log moment generating functions K_c(lam) = log E[e^{lam L_c}],

    P(S >= t) <= exp(sum_c T_c K_c(lam) - lam t),                     lam > 0,   (2)
    P(S <= t) <= exp(sum_c T_c K_c(-lam) + lam t),

(the numbering of :mod:`fdp.pld.compose`, which charges the window's tails with
them). Every lam gives a valid bound; the functions here only search for a good
one, on log grids around 1 / sd(S) extended where the best lam lies below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fdp.pld.pmf import DiscretePLD
from fdp.pld.roundoff import U

__all__ = ["chernoff_epsilon", "composed_window", "saddle_tilt"]


def _log_mgf_sum(components: Sequence[tuple[DiscretePLD, int]], lam: np.ndarray) -> np.ndarray:
    """sum_c T_c K_c(lam): the log-MGF of the composed (finite) loss, an upper bound."""
    out = np.zeros_like(lam)
    for pld, count in components:
        out += count * pld.log_mgf(lam)
    return out


def _search_lambda(components: Sequence[tuple[DiscretePLD, int]], scale: float, low: float, high: float,
                   points: int, objective) -> tuple[np.ndarray, np.ndarray]:
    """(lam, objective(lam)) (non-finite values as +inf) on ``points`` lam log-spaced from
    low / scale to high / scale, the grid extended below, as densely, down to
    low / spread when its lowest lam has the smallest value.

    Gaussian-like tails have their best lam near 1 / sd (``scale``); a nearly deterministic
    loss (randomized response with a large eps0: sd ~ 1e-3 per step, atoms 44 apart) has
    its best lam for a far tail near 1 / (the gap between atoms), far below 1 / sd; spread
    is the width of the composed support (at most 1e6 scale). Every lam gives a valid
    Chernoff bound: the search only picks the best.
    """
    def finite(values: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(values), values, np.inf)

    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lam = np.logspace(math.log10(low), math.log10(high), points) / scale
        values = finite(objective(lam))
        width = sum(c * (pld.pmf.size - 1) for pld, c in components) * components[0][0].h
        decades = math.log10(min(max(width / scale, 1.0), 1e6))
        extra = math.ceil(decades * (points - 1) / math.log10(high / low))
        if int(np.argmin(values)) == 0 and extra > 0:
            below = np.logspace(math.log10(lam[0]) - decades, math.log10(lam[0]), extra + 1)[:-1]
            lam, values = np.concatenate([below, lam]), np.concatenate([finite(objective(below)), values])
    return lam, values


def _best_chernoff(components, scale: float, log_tau: float, upper: bool) -> tuple[float, float, float]:
    """The best window end over lam > 0 (coarse, then fine), and the lam and log-MGF achieving it.

    Upper tail: t = (K(lam) - log tau) / lam, smallest over lam. Lower tail:
    t = (log tau - K(-lam)) / lam, largest over lam.
    """
    def end(lam: np.ndarray) -> np.ndarray:  # t (upper tail) or -t (lower tail): smaller is better
        return (_log_mgf_sum(components, lam if upper else -lam) - log_tau) / lam

    lam, values = _search_lambda(components, scale, 1e-2, 10**3.5, 12, end)
    lam = float(lam[int(np.argmin(values))]) * np.logspace(-0.25, 0.25, 5)  # fine, around the best
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # lam underflows to 0 at a loss sd ~1e300
        k = _log_mgf_sum(components, lam if upper else -lam)
        values = (k - log_tau) / lam
    i = int(np.argmin(np.where(np.isfinite(values), values, np.inf)))
    t = float(values[i]) if np.isfinite(values[i]) else math.inf
    return (t if upper else -t), float(lam[i]), float(k[i])


def saddle_tilt(components: Sequence[tuple[DiscretePLD, int]], epsilon: float, *, below_top: bool = False) -> float:
    """The tilt theta > 0 that minimises the Chernoff bound sum_c T_c K_c(theta) - theta eps.

    At that theta the tilted composed law has its mean at eps (the saddle point), so
    the entries that decide delta(eps) are the bulk of the tilted FFT. Returns 0 when
    eps is not above the mean of the composed loss (no tilt needed there). An eps at
    or above the top s of the composed support has no saddle point (the bound falls
    for ever, and theta grows to the end of the search: the charge e^{-theta (eps - s)}
    above s is then tiny). With ``below_top`` (for a lower bound, read just below s)
    the aim is s - h / 2 instead, where the top atom holds most of the tilted law, so
    its round-off is relative to it (an unbounded theta would make the charge
    e^{theta (s - eps)} explode below s).
    """
    var = sum(c * pld.variance() for pld, c in components)
    mean = sum(c * pld.mean() for pld, c in components)
    if below_top:
        h = components[0][0].h
        epsilon = min(epsilon, sum(c * (pld.offset + _last_nonzero(pld.pmf)) for pld, c in components) * h - 0.5 * h)
    if not epsilon > mean or var <= 0.0:
        return 0.0

    def excess(lam: np.ndarray) -> np.ndarray:
        return _log_mgf_sum(components, lam) - lam * epsilon

    lam, values = _search_lambda(components, math.sqrt(var), 1e-4, 1e4, 161, excess)
    best = float(lam[int(np.argmin(values))])
    lam = best * np.logspace(-0.06, 0.06, 25)  # fine, around the best
    with np.errstate(invalid="ignore", over="ignore"):
        values = excess(lam)
    best = float(lam[int(np.argmin(np.where(np.isfinite(values), values, np.inf)))])
    return min(best, _largest_tilt(components))


def _largest_tilt(components: Sequence[tuple[DiscretePLD, int]]) -> float:
    """A tilt theta whose inputs' relative error stays small: each tilted entry's log,
    log p + theta l, is computed within 8u (|theta l| + ...), and the T-fold product
    multiplies that error by 2T (:func:`fdp.pld.compose.compose`); theta <= this keeps
    16 u T theta max|l| <= 1e-2. (A loss of sd 1e-38 asked for theta = 1e41, and the
    error bound exceeded 1.) Any theta gives sound results: this only keeps them useful."""
    steps = sum(c for _, c in components)
    extent = max(max(abs(pld.offset), abs(pld.offset + pld.pmf.size)) * pld.h for pld, _ in components)
    return 1e-2 / (16.0 * U * steps * max(extent, components[0][0].h))


def _last_nonzero(pmf: np.ndarray) -> int:
    nonzero = np.flatnonzero(pmf)
    return int(nonzero[-1]) if nonzero.size else 0


def chernoff_epsilon(components: Sequence[tuple[DiscretePLD, int]], delta: float) -> float:
    """An eps with P(L_T > eps) <= delta by the Chernoff bound (2), best over lam on a log
    grid (an upper bound on the composition's eps(delta); inf if no lam gives one)."""
    var = sum(c * pld.variance() for pld, c in components)
    _, eps = _search_lambda(components, max(math.sqrt(var), 1e-12), 1e-4, 1e4, 161,
                            lambda lam: (_log_mgf_sum(components, lam) - math.log(delta)) / lam)
    return float(eps.min())


#: A composed support this many points (plus twice the Chernoff window) long is kept whole.
_WHOLE_SUPPORT = 1024


def composed_window(
    components: Sequence[tuple[DiscretePLD, int]], tail_mass: float, max_points: int | None = None
) -> tuple[float, float, float, float]:
    """Loss window [t_lo, t_hi] outside which each tail of the composed PLD is <= tail_mass.

    Returns (t_lo, t_hi, bound_lo, bound_hi) where bound_* are the Chernoff
    bounds (2) on the mass below t_lo / above t_hi actually achieved. If the
    window would need more than ``max_points`` grid points (heavy upper tails),
    its upper end is cut there and bound_hi is the Chernoff bound at the cut:
    larger than tail_mass, but still charged on the safe side by :func:`compose`.
    """
    h = components[0][0].h
    support_lo = sum(c * pld.offset for pld, c in components) * h
    support_hi = sum(c * (pld.offset + pld.pmf.size - 1) for pld, c in components) * h
    var = sum(c * pld.variance() for pld, c in components)
    scale = max(math.sqrt(var), h)
    log_tau = math.log(tail_mass)
    # coarse-to-fine search over lam on a log scale around 1/scale, each tail separately
    (t_hi, lam_hi, k_hi), (t_lo, lam_lo, k_lo) = (_best_chernoff(components, scale, log_tau, upper)
                                                  for upper in (True, False))
    t_hi = min(t_hi, support_hi)
    t_lo = max(t_lo, support_lo)
    full = (support_hi - support_lo) / h
    whole_fits = max_points is None or full + 3 <= max_points  # never trade a fitting window for a cut one
    if not (np.isfinite(t_hi) and np.isfinite(t_lo)) or (whole_fits and full <= 2.0 * (t_hi - t_lo) / h
                                                         + _WHOLE_SUPPORT):
        t_lo, t_hi = support_lo, support_hi  # cheap enough to keep every atom: no tail charge
    t_hi = max(t_hi, t_lo + h)
    if max_points is not None and (t_hi - t_lo) / h + 3 > max_points:
        t_hi = t_lo + (max_points - 3) * h
        lam, excess = _search_lambda(components, scale, 1e-2, 10**3.5, 64,
                                     lambda lam: _log_mgf_sum(components, lam) - lam * t_hi)
        i = int(np.argmin(excess))
        lam_hi, k_hi = float(lam[i]), float(excess[i] + lam[i] * t_hi)
    # the bounds actually achieved at the (clipped) window ends
    bound_hi = 0.0 if t_hi >= support_hi else float(np.exp(min(0.0, k_hi - lam_hi * t_hi)))
    bound_lo = 0.0 if t_lo <= support_lo else float(np.exp(min(0.0, k_lo + lam_lo * t_lo)))
    return t_lo, t_hi, bound_lo, bound_hi
