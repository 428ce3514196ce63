"""Equations (2)-(3) by quadrature over Z: delta(eps) of one step and the tradeoff curve.

Values, not bounds: the accountant's bounds come from the cells of
:mod:`fdp.mechanisms.random_sensitivity.cells`. See the package docstring for the maths.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from fdp._kernels.chi2_quadrature import mixture_alpha_beta, mixture_delta
from fdp.mechanisms.random_sensitivity.laws import ZLaw
from fdp.pld.cells import Direction

__all__ = ["Q_END", "mixture_alpha_beta_of", "mixture_delta_of", "quadrature"]

#: Quantile of Z below which everything is one cell, and above which the
#: quadrature of (3) stops (the rest is charged as an absolute error <= 1e-30).
Q_END = 1e-30
#: Geometric quantile panels per half of Z's law in the quadrature of (3) (ratio ~1.9).
BASE_PANELS = 110


@functools.lru_cache(maxsize=64)
def quadrature(law: ZLaw, n_panels_half: int = BASE_PANELS, order: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Nodes z_i and weights w_i with E[g(Z)] ~ sum_i w_i g(z_i), ordered by z.

    Gauss-Legendre of ``order`` nodes on panels in quantile space q = F(z):
    geometric panels q in [1e-30, 1/2] (ratio ~1.9) mapped by ppf, and the
    mirror image 1 - q in [1e-30, 1/2] mapped by isf (accurate upper tail).
    For g with values in [0, 1] the quantiles left out cost <= 2e-30. A discrete
    law is summed exactly over its atoms instead (the quadrature in quantile space
    would straddle its jumps).
    """
    atoms = law.atoms()
    if atoms is not None:
        return np.ascontiguousarray(atoms.z), np.ascontiguousarray(atoms.w)
    edges = np.geomspace(Q_END, 0.5, n_panels_half + 1)
    return panel_nodes(law, edges, edges, order)


def panel_nodes(law: ZLaw, lower_q: np.ndarray, upper_s: np.ndarray,
                 order: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes on panels given by edges in q = F(z) (lower half, mapped
    by ppf) and in s = 1 - F(z) (upper half, mapped by isf), both within [1e-30, 1/2]."""
    x, wx = np.polynomial.legendre.leggauss(order)

    def nodes(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, b = edges[:-1, None], edges[1:, None]
        q = (0.5 * (b - a) * x[None, :] + 0.5 * (a + b)).ravel()
        return q, (0.5 * (b - a) * wx[None, :]).ravel()

    q, wq = nodes(np.unique(lower_q))
    s_, ws = nodes(np.unique(upper_s))
    z = np.concatenate([law.ppf(q), law.isf(s_)[::-1]])
    w = np.concatenate([wq, ws[::-1]])
    ok = np.isfinite(z)
    return np.ascontiguousarray(z[ok]), np.ascontiguousarray(w[ok])


#: Above this mu*(eps) = sqrt(2 (eps - log p)), delta_subsampled_gauss(eps; mu) jumps
#: from ~0 to ~p within a few units of mu around mu*: too sharp for the fixed panels.
_SHARP_MU = 8.0
#: Half-width (in mu) of the refined window around mu*, and its number of panels.
_SHARP_HALF_WIDTH = 12.0
_SHARP_PANELS = 32


def quadrature_around(law: ZLaw, z_lo: float, z_hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The fixed panels of :func:`quadrature`, plus panel edges every
    (z_hi - z_lo) / 32 on [z_lo, z_hi], in whichever tail coordinate is accurate
    (a discrete law: its atoms, as in :func:`quadrature`)."""
    if law.atoms() is not None:
        return quadrature(law)
    base = np.geomspace(Q_END, 0.5, BASE_PANELS + 1)
    z_new = np.linspace(z_lo, z_hi, _SHARP_PANELS + 1)
    q_new = law.cdf(z_new)
    s_new = law.sf(z_new)
    lower = np.concatenate([base, q_new[(q_new > Q_END) & (q_new < 0.5)]])
    upper = np.concatenate([base, s_new[(s_new > Q_END) & (s_new < 0.5)]])
    return panel_nodes(law, lower, upper)


def mixture_alpha_beta_of(law: ZLaw, sigma: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z, w = quadrature(law)
    tt = np.ascontiguousarray(np.atleast_1d(np.asarray(t, dtype=np.float64)).ravel())
    a, b = mixture_alpha_beta(tt, z / sigma, w)
    shape = np.shape(t)
    return np.clip(a, 0.0, 1.0).reshape(shape), np.clip(b, 0.0, 1.0).reshape(shape)


def mixture_delta_of(law: ZLaw, sigma: float, p: float, epsilon: Any, direction: Direction) -> np.ndarray:
    """E_Z[delta_subsampled_gauss(eps; Z / sigma, p)] for each eps.

    Where the loss can exceed eps only through a large mu (remove direction, or
    p = 1), the integrand steps from ~0 to ~p within a few units of mu around
    mu* = sqrt(2 (eps - log p)); for mu* > 8 that eps is recomputed with extra
    panels on mu in [mu* - 12, mu* + 12] (at eps = 1e4, r = 1 the fixed panels
    alone are off by 2 %).
    """
    z, w = quadrature(law)
    eps = np.asarray(epsilon, dtype=np.float64)
    flat = np.ascontiguousarray(eps.ravel())
    remove = Direction(direction) is Direction.REMOVE
    out = mixture_delta(flat, z / sigma, w, p, remove)
    if remove or p == 1.0:
        with np.errstate(invalid="ignore"):
            mu_star = np.sqrt(2.0 * np.maximum(flat - math.log(p), 0.0))
        for i in np.nonzero(np.isfinite(mu_star) & (mu_star > _SHARP_MU))[0]:
            lo = max(mu_star[i] - _SHARP_HALF_WIDTH, 0.5 * mu_star[i])
            zi, wi = quadrature_around(law, sigma * lo, sigma * (mu_star[i] + _SHARP_HALF_WIDTH))
            out[i] = mixture_delta(flat[i:i + 1], zi / sigma, wi, p, remove)[0]
    return out.reshape(eps.shape)
