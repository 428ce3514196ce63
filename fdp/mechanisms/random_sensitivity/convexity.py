"""Second-order bounds within a Z-cell: every privacy profile is convex in s = Phi(mu/2).

Theorem. Let delta_mu(eps) = H_{e^eps}(P_mu || Q_mu) be the privacy profile of the
Poisson-subsampled Gaussian pair with shift mu, in either direction, for any
sampling rate p in (0, 1] and ANY eps in R. As a function of

    s(mu) = Phi(mu / 2)                                                           (4)

delta_mu(eps) is nondecreasing and convex on mu in [0, inf].

Proof. (i) p = 1: delta^G_mu(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) has
d delta / d mu = phi(eps/mu - mu/2) (the two terms' derivatives combine by
e^eps phi(eps/mu + mu/2) = phi(eps/mu - mu/2)). With ds/dmu = phi(mu/2)/2,

    d delta / d s = 2 phi(eps/mu - mu/2) / phi(mu/2) = 2 exp(eps/2 - eps^2 / (2 mu^2)),   (5)

which is positive and nondecreasing in mu, hence in s: delta is convex in s.
(ii) p < 1, remove: P = (1-p) N(0,1) + p N(mu,1), Q = N(0,1), gamma = e^eps.
H_gamma(P || Q) = int (p phi(x-mu) - (gamma-1+p) phi(x))_+ dx, which is 1 - gamma
(free of mu) if gamma <= 1 - p, else p delta^G_mu(log((gamma-1+p)/p)).
Add: H_gamma(Q || P) = int ((1 - gamma(1-p)) phi(x) - gamma p phi(x-mu))_+ dx, which
is 0 if gamma(1-p) >= 1, else c delta^G_mu(log(gamma p / c)), c = 1 - gamma(1-p) > 0
(reflection x -> mu - x turns H(N(0,1) || N(mu,1)) into H(N(mu,1) || N(0,1))).
Either way a nonnegative constant, free of mu, times (i) at some eps' in R. QED

Consequences for a cell [a, b] of mu = Z/sigma with conditional law nu, at every eps
and in both directions (a mixture with Z released has the nu-average profile):

* Edmundson-Madansky: the chord of a convex function lies above it, so
      E_nu[delta_mu] <= (1 - pi) delta_a + pi delta_b  for every pi >= E_nu[theta],
      theta = (s(mu) - s(a)) / (s(b) - s(a)).                                      (6)
  The two-point mixture (a w.p. 1 - pi, b w.p. pi, the label released) has a larger
  profile at every eps, hence a lower tradeoff curve: it DOMINATES the cell, and
  so does any composition of it.
* Jensen: E_nu[delta_mu] >= delta_{mu_bar}, s(mu_bar) <= E_nu[s(mu)]: the single
  Gaussian component mu_bar is DOMINATED by the cell.                              (7)

Both err by the cell's spread in s squared, where the coupling Z- <= Z <= Z+ of
:mod:`.cells` erred by its width: at the same cells the JL bracket narrows from
~3 % to ~0.1 % (docs/jl.md).

E_nu[theta] (and E_nu[s]) are bracketed by Riemann sums over ``SUBCELLS`` pieces
of each cell (theta is increasing in Z); the float error of the law's masses (a
few ulps of the cdf per piece) is charged as ``ROUNDING_MARGIN`` on the safe side.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr, ndtri_exp

from fdp.mechanisms.random_sensitivity.laws import ZLaw

__all__ = ["ROUNDING_MARGIN", "SUBCELLS", "jensen_points", "position_bounds", "two_point_weights"]

#: Pieces per cell of the Riemann sums bracketing E[theta | cell].
SUBCELLS = 256
#: Safe-side margin on E[theta | cell] for the float error of the law's masses.
ROUNDING_MARGIN = 1e-9


def _log_sbar(z: np.ndarray, sigma: float) -> np.ndarray:
    """log(1 - s) = log Phi(-mu/2), mu = z/sigma: keeps precision where s -> 1."""
    return log_ndtr(-0.5 * np.asarray(z, dtype=np.float64) / sigma)


def _theta(z: np.ndarray, a: np.ndarray, b: np.ndarray, sigma: float) -> np.ndarray:
    """theta(z) = (s(z) - s(a)) / (s(b) - s(a)) of (6), in [0, 1]."""
    ta = _log_sbar(a, sigma)
    with np.errstate(invalid="ignore", divide="ignore"):
        th = np.expm1(_log_sbar(z, sigma) - ta) / np.expm1(_log_sbar(b, sigma) - ta)
    return th  # nan only for a degenerate cell: the callers take the safe end


def position_bounds(law: ZLaw, lo: np.ndarray, hi: np.ndarray, sigma: float,
                    closed_first: bool) -> tuple[np.ndarray, np.ndarray]:
    """Bounds (under, over) on E[theta(Z) | lo < Z <= hi] for finite cells.

    Each cell is cut into SUBCELLS equal pieces with masses v_i; theta increasing
    gives sum v_i theta(z_i) <= E[theta 1_cell] <= sum v_i theta(z_{i+1}).
    ``closed_first``: the first cell is [lo, hi] (an atom at lo counts).
    """
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    frac = np.linspace(0.0, 1.0, SUBCELLS + 1)
    z = lo[:, None] + (hi - lo)[:, None] * frac[None, :]
    z[:, -1] = hi  # exact ends
    v = law.mesh_mass(z)
    if closed_first and lo.size:
        v[0, 0] = float(law.mass(np.array(-math.inf), np.array(z[0, 1])))
    th = _theta(z, lo[:, None], hi[:, None], sigma)
    total = v.sum(axis=1)
    th = np.clip(th, 0.0, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        # an undefined theta counts as 0 from below and 1 from above (the safe ends)
        under = (v * np.nan_to_num(th[:, :-1], nan=0.0)).sum(axis=1) / total
        over = (v * np.nan_to_num(th[:, 1:], nan=1.0)).sum(axis=1) / total
    # an empty cell: any position is valid; the safe ends
    under = np.where(total > 0, under, 0.0)
    over = np.where(total > 0, over, 1.0)
    return (np.clip(under - ROUNDING_MARGIN, 0.0, 1.0), np.clip(over + ROUNDING_MARGIN, 0.0, 1.0))


def two_point_weights(edges: np.ndarray, weights: np.ndarray, over: np.ndarray) -> np.ndarray:
    """Weights on the edges of the dominating mixture (6), cells merged at shared edges.

    ``over[j]`` bounds E[theta | cell j] from above for the finite cells (the last
    cell, if its upper edge is inf, puts all its weight on it: pi = 1)."""
    at_edge = np.zeros(edges.size)
    k = over.size
    at_edge[:k] += weights[:k] * (1.0 - over)
    at_edge[1:k + 1] += weights[:k] * over
    at_edge[k + 1:] += weights[k:]  # cells without a bound (the infinite top cell)
    return at_edge


def jensen_points(lo: np.ndarray, hi: np.ndarray, under: np.ndarray, sigma: float) -> np.ndarray:
    """z_bar in [lo, hi] with s(z_bar/sigma) <= s(lo) + under (s(hi) - s(lo)), as (7) needs.

    Computed in log(1 - s); the relative 1e-12 taken off covers ndtri_exp's few ulps."""
    ta, tb = _log_sbar(lo, sigma), _log_sbar(hi, sigma)
    with np.errstate(invalid="ignore", divide="ignore"):
        t_bar = ta + np.log1p(under * np.expm1(tb - ta))
        z_bar = -2.0 * sigma * ndtri_exp(t_bar) * (1.0 - 1e-12)
    z_bar = np.nan_to_num(z_bar, nan=0.0)
    return np.clip(z_bar, lo, hi)
