"""One term of random allocation's likelihood ratio, cut into lattice classes.

The epoch's likelihood ratio (:mod:`fdp.mechanisms.allocation_lattice`) is a mean
of t iid terms W = dP1/dP0 under Q = P0. This module bounds one term's law on the
classes g = floor(W / spacing): the Q-mass of each class, and lower bounds on the
remainders b_g = E_Q[W - g spacing ; g] and bbar_g = E_Q[(g+1) spacing - W ; g],
for the Gaussian mechanism, W = exp(mu Y - mu^2/2), Y ~ N(0, 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from fdp.pld.roundoff import U

__all__ = ["NDTR_ERROR", "TermLaw", "gaussian_term_law"]

#: Relative error of scipy's ndtr (Cephes: erfc's published peak relative error is
#: 5.7e-14 on [0, 26.6]; measured here up to 284u on [-12, 12]; charged as 1e-13).
NDTR_ERROR = 1e-13
#: Gauss-Legendre nodes per class for the remainders b and bbar (error bounded below).
QUADRATURE_NODES = 8


@dataclass(frozen=True, eq=False)
class TermLaw:
    """One term W = dP1/dP0 of (1) under Q, on classes g = 0 .. K-1 (and an overflow).

    ``a[g]`` is the Q-mass of class g, exact up to a relative 2u for the classes of a
    partition whose W-ranges lie within [g spacing (1 - xi), (g+1) spacing (1 + xi)]
    (``xi`` = :attr:`xi`); ``b_lo[g]`` <= E_Q[W - g spacing (1 - xi) ; g] and
    ``bbar_lo[g]`` <= E_Q[(g+1) spacing (1 + xi) - W ; g] are lower bounds;
    ``overflow_q`` >= Q(overflow), ``overflow_p1`` >= P1(overflow).
    """

    spacing: float
    xi: float
    a: np.ndarray
    b_lo: np.ndarray
    bbar_lo: np.ndarray
    overflow_q: float
    overflow_p1: float

    @property
    def classes(self) -> int:
        return int(self.a.size)

    def p1_upper(self) -> np.ndarray:
        """Upper bounds on the P1-masses E_Q[W ; g] of the classes."""
        g = np.arange(self.a.size, dtype=np.float64)
        return (g + 1) * self.spacing * (1 + self.xi) * self.a * (1 + 4 * U)


def _tails(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Phi(y) where y < 0 else 0, Phi_bar(y) where y >= 0 else 0): each point's smaller tail."""
    left = np.where(y < 0, special.ndtr(np.minimum(y, 0.0)), 0.0)
    right = np.where(y >= 0, special.ndtr(-np.maximum(y, 0.0)), 0.0)
    return left, right


def _cell_masses(y: np.ndarray) -> np.ndarray:
    """Phi(y[k+1]) - Phi(y[k]) from each point's smaller tail, monotone and by Sterbenz's
    lemma exact where neighbouring tails are within a factor 2 (2u relative elsewhere)."""
    left, right = _tails(y)
    # computed tails kept monotone (each stays within its bound), each on its own side
    left = np.where(y < 0, np.maximum.accumulate(left), 0.0)
    right = np.where(y >= 0, np.minimum.accumulate(np.where(y >= 0, right, 1.0)), 0.0)
    lower = np.where(y < 0, left, 1.0 - right)  # Phi(y'), a partition's exact cdf values
    masses = np.empty(y.size - 1)
    both_left = (y[1:] < 0)
    both_right = (y[:-1] >= 0)
    masses[both_left] = (left[1:] - left[:-1])[both_left]
    masses[both_right] = (right[:-1] - right[1:])[both_right]
    across = ~both_left & ~both_right
    masses[across] = (1.0 - right[1:] - lower[:-1])[across]
    return np.maximum(masses, 0.0)


#: Gauss-Legendre nodes per class for the remainders b and bbar (error bounded below).
QUADRATURE_NODES = 8


def _remainder(y_edge: np.ndarray, lo: np.ndarray, hi: np.ndarray, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """(value, error bound) of int_lo^hi |expm1(mu (y - y_edge))| phi(y) dy per class, by
    Gauss-Legendre with n = QUADRATURE_NODES nodes: its error is at most
    h^{2n+1} (n!)^4 / ((2n+1) ((2n)!)^2) M / R^{2n} (the remainder formula with Cauchy's
    estimate of the 2n-th derivative on discs of radius R = 1), M a bound on the
    integrand's modulus within distance 1 of [lo, hi]: (e^{mu (hi - y_edge + 1)} + 1)
    e^{1/2} phi(the point of [lo - 1, hi + 1] nearest 0)."""
    n = QUADRATURE_NODES
    nodes, weights = np.polynomial.legendre.leggauss(n)
    half = 0.5 * (hi - lo)
    mid = 0.5 * (hi + lo)
    y = mid[:, None] + half[:, None] * nodes[None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        f = np.abs(np.expm1(mu * (y - y_edge[:, None]))) * np.exp(-0.5 * y * y) * 0.3989422804014327
        value = half * (f @ weights)
    value = np.where(hi > lo, value, 0.0)
    nearest = np.clip(0.0, lo - 1.0, hi + 1.0)
    top = np.maximum(np.abs(hi - y_edge), np.abs(lo - y_edge)) + 1.0
    with np.errstate(over="ignore"):
        bound_m = (np.exp(mu * top) + 1.0) * math.exp(0.5) * 0.3989422804014328 * np.exp(-0.5 * nearest * nearest)
    log_c = 4 * math.lgamma(n + 1) - math.log(2 * n + 1) - 2 * math.lgamma(2 * n + 1)
    with np.errstate(divide="ignore", over="ignore"):
        error = np.exp((2 * n + 1) * np.log(np.maximum(hi - lo, 0.0)) + log_c) * bound_m
    # the float sum of n positive terms, each a few roundings off, at nodes and with weights a
    # few ulp off (the integrand's relative change there is <= (mu + |y|) |y| u per ulp of y)
    scale = 1.0 + (mu + np.abs(mid) + half) * (np.abs(mid) + half)
    error = np.where(hi > lo, error + 64 * U * scale * np.abs(value), 0.0)
    return value, error


def gaussian_term_law(mu: float, spacing: float, classes: int) -> TermLaw:
    """:class:`TermLaw` of W = exp(mu Y - mu^2/2), Y ~ N(0, 1): class g is
    Y in (y_g, y_{g+1}], y_g = (log(g spacing) + mu^2/2) / mu.

    The Q-masses are differences of the computed tails Phi~(y_g) (Phi left of 0,
    Phi_bar right of it), made monotone: each is Phi(y'_g) for a threshold y'_g with
    |y'_g - y_g| <= s = 2 * 1.26 * NDTR_ERROR (the Mills ratio is <= 1.26), so they are
    the exact masses (up to the subtraction's 2u) of the partition at the y'_g, whose
    W-ranges are within the relative ``xi`` of the lattice (the thresholds' few-ulp
    errors included).

    The remainders are integrals, never differences of tails (whose error, relative to
    the tail, the split would divide by the spacing):

        b_g = int_{y_g}^{y_{g+1}} (w(y) - g spacing) phi(y) dy
            = w(y_g) int expm1(mu (y - y_g)) phi(y) dy + (w(y_g) - g spacing) a_g,

    by :func:`_remainder`, w(y_g) = g spacing (1 + r), |r| <= xi; likewise bbar_g from
    the right end. Moving an end from y_g to y'_g changes b_g by at most s times
    (w - g spacing) phi there: ~ spacing s phi at the right end, ~ 0 at the left.
    """
    g = np.arange(classes + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_w = np.log(g * spacing)
        y = (log_w + 0.5 * mu * mu) / mu  # y_0 = -inf
    shift = 2 * 1.26 * NDTR_ERROR
    top_log = float(np.max(np.abs(log_w[1:]))) if classes else 0.0
    xi = math.expm1(mu * shift + 16 * U * (top_log + mu * mu + 1.0))
    a = _cell_masses(y)
    lo, hi = y[:-1], y[1:]
    lo_w, hi_w = g[:-1] * spacing, g[1:] * spacing
    finite_lo = np.where(np.isfinite(lo), lo, hi - 40.0)  # class 0: (-inf, y_1], its tail below 40 sds
    left, left_err = _remainder(finite_lo, finite_lo, hi, mu)
    right, right_err = _remainder(hi, finite_lo, hi, mu)
    # class 0 has no left end: b_0 = E_Q[W ; W < spacing] = P1(Y < y_1 - ...) directly bounded
    left[0], left_err[0] = 0.0, 0.0
    with np.errstate(over="ignore"):
        density = np.where(np.isfinite(y), np.exp(-0.5 * (np.abs(y) - shift) ** 2), 0.0) * 0.3989422804014328
    # at the right end the integrand is <= (g+1) spacing (1 + xi)^2 - g spacing (1 - xi), at the
    # left end |W - g spacing (1 - xi)| <= 3 xi g spacing (W there is g spacing within 2 xi)
    moved = 1.01 * shift * (density[1:] * ((hi_w - lo_w) * (1 + xi) + 3 * hi_w * xi) + density[:-1] * 3 * lo_w * xi)
    b = lo_w * (left - left_err) * (1 - xi) * (1 - 4 * U) - moved - 4 * U * a * lo_w
    bbar = hi_w * (right - right_err) * (1 - xi) * (1 - 4 * U) - moved - 4 * U * a * hi_w
    # class 0, W in [0, spacing): b_0 = P1(class 0) and bbar_0 = spacing a_0 - P1(class 0),
    # from P1's tail at y'_1 (within NDTR_ERROR, and the end moved by <= shift)
    p1_first = float(special.ndtr(y[1] - mu)) if classes else 0.0  # P1(Y <= y_1), W < spacing
    b[0] = p1_first * (1 - NDTR_ERROR) - 0.4 * shift
    bbar[0] = spacing * a[0] * (1 - 2 * U) - p1_first * (1 + NDTR_ERROR) - 0.4 * shift
    b_lo = np.clip(b, 0.0, None)
    bbar_lo = np.clip(bbar, 0.0, None)
    _, top_q = _tails(np.array([y[-1]]))
    _, top_p1 = _tails(np.array([y[-1] - mu]))
    return TermLaw(spacing=spacing, xi=xi, a=a, b_lo=b_lo, bbar_lo=bbar_lo,
                   overflow_q=float(top_q[0]) * (1 + NDTR_ERROR) + 2.5 * shift,
                   overflow_p1=float(top_p1[0]) * (1 + NDTR_ERROR) + 2.5 * shift)
