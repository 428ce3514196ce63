"""One term of random allocation's likelihood ratio, cut into lattice classes.

The epoch's likelihood ratio (:mod:`fdp.mechanisms.allocation_lattice`) is a mean
of t iid terms W = dP1/dP0 under Q = P0. This module bounds one term's law on the
classes g = floor(W / spacing): the Q-mass of each class, and lower bounds on the
remainders b_g = E_Q[W - g spacing ; g] and bbar_g = E_Q[(g+1) spacing - W ; g],
for the Gaussian mechanism, W = exp(mu Y - mu^2/2), Y ~ N(0, 1), and for a finite
mixture of such terms with released labels (:func:`mixture_term_law`; the JL
mechanism, :mod:`fdp.mechanisms.allocation_mixtures`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from fdp._kernels.remainder import class_remainders
from fdp.pld.roundoff import U

__all__ = ["NDTR_ERROR", "TermLaw", "gaussian_term_law", "mixture_term_law"]

#: Relative error of scipy's ndtr (Cephes: erfc's published peak relative error is
#: 5.7e-14 on [0, 26.6]; measured here up to 284u on [-12, 12]; charged as 1e-13).
NDTR_ERROR = 1e-13
#: Gauss-Legendre rules offered per class for the remainders b and bbar, fewest nodes
#: first: a class takes the first whose error bound is below RULE_TOLERANCE of the integral (the
#: bound is charged whatever the choice).
QUADRATURE_NODES = (2, 4, 8)
RULE_TOLERANCE = 1e-13


def _rules() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    top = max(QUADRATURE_NODES)
    nodes = np.full((len(QUADRATURE_NODES), top), np.nan)
    weights = np.full((len(QUADRATURE_NODES), top), np.nan)
    log_c = np.empty(len(QUADRATURE_NODES))
    for row, n in enumerate(QUADRATURE_NODES):
        nodes[row, :n], weights[row, :n] = np.polynomial.legendre.leggauss(n)
        log_c[row] = 4 * math.lgamma(n + 1) - math.log(2 * n + 1) - 2 * math.lgamma(2 * n + 1)
    return nodes, weights, log_c


_RULES = _rules()
#: A mixture's component is computed on the classes Y in [-Y_CUT, Y_CUT + mu] meets; the
#: rest of its outputs (Q- and P1-mass <= Phi(-10) ~ 7.6e-24 each side) join the overflow.
Y_CUT = 10.0


@dataclass(frozen=True, eq=False)
class TermLaw:
    """One term W = dP1/dP0 of (1) under Q, on classes g = 0 .. K-1 (and an overflow).

    ``a[g]`` is the Q-mass of class g, exact up to a relative ``a_error`` for the classes of a
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
    a_error: float = 2 * U

    @property
    def classes(self) -> int:
        return int(self.a.size)

    def p1_upper(self) -> np.ndarray:
        """Upper bounds on the P1-masses E_Q[W ; g] of the classes."""
        g = np.arange(self.a.size, dtype=np.float64)
        return (g + 1) * self.spacing * (1 + self.xi) * self.a * (1 + 2 * U + self.a_error)


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


def gaussian_term_law(mu: float, spacing: float, classes: int, y_cut: float | None = None,
                      inside: bool = False) -> TermLaw:
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

    w(y_g) = g spacing (1 + r), |r| <= xi; likewise bbar_g from the right end. The
    integrals are by n-point Gauss-Legendre, n in QUADRATURE_NODES
    (:func:`fdp._kernels.remainder.class_remainders`), whose error is at most
    h^{2n+1} (n!)^4 / ((2n+1) ((2n)!)^2) M / R^{2n} (the remainder formula with Cauchy's
    estimate of the 2n-th derivative on discs of radius R = 1), M a bound on the
    integrand's modulus within distance 1 of the class: (e^{mu (h + 1)} + 1) e^{1/2}
    phi(the point nearest 0). Moving an end from y_g to y'_g changes b_g by at most s
    times (w - g spacing) phi there: ~ spacing s phi at the right end, ~ 0 at the left.

    ``y_cut``: only the classes met by Y in [-y_cut, y_cut + mu] (and class 0) are
    computed; the outputs of the others join the overflow (Q- and P1-mass
    <= Phi(-y_cut) each side), so what is computed is still the exact partition.

    ``inside``: the top edge moves down by a gap in Y past every threshold that another
    computation of the same W = classes spacing may have made (the monotone tails of
    :func:`_cell_masses` move a threshold by up to s, differently in another array): the
    classes then lie inside that computation's class below it (the outputs in the gap
    belong to no class), never partly beside it.
    """
    if y_cut is None:
        g_lo, g_hi = 1, classes
    else:
        g_hi = min(classes, int(math.ceil(math.exp(min(mu * y_cut + 0.5 * mu * mu, 700.0)) / spacing)) + 1)
        g_lo = max(1, min(g_hi, int(math.floor(math.exp(-mu * y_cut - 0.5 * mu * mu) / spacing)) - 1))
    gap = g_lo > 1  # the classes 1 .. g_lo - 1 join the overflow as one cell
    g = np.concatenate([[0.0, 1.0], np.arange(g_lo, g_hi + 1, dtype=np.float64)]) if gap \
        else np.arange(g_hi + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_w = np.log(g * spacing)
        y = (log_w + 0.5 * mu * mu) / mu  # y_0 = -inf
    shift = 2 * 1.26 * NDTR_ERROR
    if inside and g_hi == classes:
        y = y.copy()
        y[-1] -= 2 * shift + 64 * U * (abs(float(y[-1])) + 1.0)
        shift = 3 * shift + 64 * U * (abs(float(y[-1])) + 1.0)  # how far an end may now be from its edge
    top_log = max(abs(math.log(spacing)), abs(math.log(classes * spacing)))
    xi = math.expm1(mu * shift + 16 * U * (top_log + mu * mu + 1.0))
    masses = _cell_masses(y)
    first = 2 if gap else 1  # index in y of the edge y_{g_lo}
    a = np.zeros(classes)
    a[0] = masses[0]
    a[g_lo:g_hi] = masses[first:]
    lo, hi = y[first:-1], y[first + 1:]
    nodes, weights, log_c = _RULES
    b = np.zeros(classes)
    bbar = np.zeros(classes)
    b[g_lo:g_hi], bbar[g_lo:g_hi] = class_remainders(
        np.ascontiguousarray(lo), np.ascontiguousarray(hi), g[first:-1] * spacing, g[first + 1:] * spacing,
        np.ascontiguousarray(a[g_lo:g_hi]), float(mu), xi, shift, nodes, weights, log_c, RULE_TOLERANCE)
    # class 0, W in [0, spacing): b_0 = P1(class 0) and bbar_0 = spacing a_0 - P1(class 0),
    # from P1's tail at y'_1 (within NDTR_ERROR, and the end moved by <= shift)
    p1_first = float(special.ndtr(y[1] - mu)) if classes else 0.0  # P1(Y <= y_1), W < spacing
    b[0] = max(0.0, p1_first * (1 - NDTR_ERROR) - 0.4 * shift)
    bbar[0] = max(0.0, spacing * a[0] * (1 - 2 * U) - p1_first * (1 + NDTR_ERROR) - 0.4 * shift)
    _, top_q = _tails(np.array([y[-1]]))
    _, top_p1 = _tails(np.array([y[-1] - mu]))
    over_q = float(top_q[0]) * (1 + NDTR_ERROR) + 2.5 * shift
    over_p1 = float(top_p1[0]) * (1 + NDTR_ERROR) + 2.5 * shift
    if gap:  # Q(Y <= y_{g_lo}) and P1(Y <= y_{g_lo}) bound the gap's masses
        over_q += float(special.ndtr(y[2])) * (1 + NDTR_ERROR) + 2.5 * shift
        over_p1 += float(special.ndtr(y[2] - mu)) * (1 + NDTR_ERROR) + 2.5 * shift
    return TermLaw(spacing=spacing, xi=xi, a=a, b_lo=b, bbar_lo=bbar, overflow_q=over_q, overflow_p1=over_p1)


def mixture_term_law(mus: np.ndarray, weights: np.ndarray, spacing: float, classes: int,
                     inside: bool = False) -> TermLaw:
    """:class:`TermLaw` of a finite mixture: component i (weight w_i, its label released
    with the output) has W = exp(mu_i Y - mu_i^2/2), Y ~ N(0, 1).

    The mixture's class g is the union of its components' classes g, so its W-range is
    within the largest xi_i of the lattice, and its Q-mass is sum_i w_i a_i: exact up to
    a relative (n + 3) u for n components (each a_i to 2u, the product and the sum's
    rounding). The remainders' lower bounds add up, rounded down; the overflows, up.
    Two components are exact points: mu = 0 (W = 1 under both hypotheses: Q-mass w at
    the class of 1) and mu = inf (the step that reveals the example: under Q the term
    is W = 0, Q-mass w in class 0; its P1-mass w lies outside every class, at +inf).
    Weights must sum to at most 1 (:func:`fdp.mechanisms.allocation_mixtures.step_components`).
    """
    mus = np.asarray(mus, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    n = int(mus.size)
    a = np.zeros(classes)
    b_lo = np.zeros(classes)
    bbar_lo = np.zeros(classes)
    xi, over_q, over_p1 = 16 * U, 0.0, 0.0
    for mu, w in zip(mus.tolist(), weights.tolist()):
        if w <= 0.0:
            continue
        if mu == math.inf:
            a[0] += w
            bbar_lo[0] += w * spacing * (1 - 2 * U)
            over_p1 += w
        elif mu == 0.0:
            g = int(math.floor(1.0 / spacing))
            if g >= classes:
                over_q += w
                over_p1 += w
                continue
            a[g] += w
            # W = 1 within the float error of g spacing and (g + 1) spacing (xi >= 16u covers it)
            b_lo[g] += w * max(0.0, 1.0 - g * spacing * (1 + 4 * U)) * (1 - 4 * U)
            bbar_lo[g] += w * max(0.0, (g + 1) * spacing * (1 - 4 * U) - 1.0) * (1 - 4 * U)
        else:
            parts = gaussian_term_law(mu, spacing, classes, y_cut=Y_CUT, inside=inside)
            a += w * parts.a
            b_lo += w * parts.b_lo
            bbar_lo += w * parts.bbar_lo
            xi = max(xi, parts.xi)
            over_q += w * parts.overflow_q
            over_p1 += w * parts.overflow_p1
    if n == 1 and weights[0] == 1.0:
        error = 2 * U
    else:
        error = (n + 3) * U
    down = 1 - (n + 2) * U
    up = 1 + (n + 2) * U
    return TermLaw(spacing=spacing, xi=xi, a=a, b_lo=b_lo * down, bbar_lo=bbar_lo * down,
                   overflow_q=min(over_q * up, 1.0), overflow_p1=min(over_p1 * up, 1.0), a_error=error)
