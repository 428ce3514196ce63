"""The JL mechanism of DP-SGD-JL, and Gaussian mechanisms with a random sensitivity.

Paper: Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat, "Fast and Memory Efficient
Differentially Private-SGD via JL Projections", arXiv:2102.03013v2, Section
"Privacy Analysis".

One step, for the worst-case sample, releases (Z, X) with

    without the sample: X ~ N(0, 1),   with it: X ~ N(Z / sigma, 1),             (1)

where for JL with r projections Z = Z_r = 1 / sqrt(chi2_r / r) (Lemma
"subroutine_privacy"; the clipped Z~ = min(|g|/(sigma C), Z_r/sigma) is replaced
by the larger Z_r/sigma via Lemma "Comparing_Gaussian_coupling"). Because Z is
part of the output and has the same law under both hypotheses, the privacy-loss
distribution of (1) -- of either neighbouring relation, with Poisson subsampling
at rate p inside -- is the Z-mixture of subsampled-Gaussian PLDs with mu = Z/sigma:

    PLD_dir = E_Z[ PLD_dir(subsampled Gaussian; mu = Z/sigma, p) ],               (2)
    delta_dir(eps) = E_Z[ delta_dir(eps; mu = Z/sigma, p) ].

The unsubsampled tradeoff curve is the seed's Lemma:

    alpha(t) = E[Phi(-t sigma/Z - Z/(2 sigma))],  beta(t) = E[Phi(t sigma/Z - Z/(2 sigma))].  (3)

Certified cells (``loss_cells``). Partition the range of Z into cells
z_0 < z_1 < ... < z_K with weights w_j = P(z_j < Z <= z_{j+1}). Define
Z+ = z_{j+1} and Z- = z_j on cell j. Then Z- <= Z <= Z+ pointwise (a coupling),
so by Lemma "Comparing_Gaussian_coupling" (post-processing: the map M there
sends (Z+, N(Z+,1)) to (Z, N(Z,1)) and (Z+, N(0,1)) to (Z, N(0,1)), hence any
mixture of the two -- the subsampled pairs of both directions -- to the
corresponding mixture) the Z+ mechanism *dominates* the true one and the Z-
mechanism is *dominated* by it, in both directions and after any composition.
Both are finite mixtures, whose PLDs (2) are sums of exact subsampled-Gaussian
cells: ``pessimistic=True`` uses Z+, ``pessimistic=False`` uses Z-. The top cell
of an unbounded Z has z_K = inf: its pessimistic component is the singular pair
(mu = inf): remove -> P-mass p*w at L = +inf and (1-p)*w at L = log(1-p);
add -> P-mass w at L = -log(1-p) (+inf at p = 1). Its optimistic component uses
the finite z_{K-1}; the bottom cell's optimistic component (z_0 = 0) is mu = 0,
a point mass at L = 0. The cells are chosen adaptively (:func:`_partition`):
relative width <= ``_ETA_REL`` where the loss is large (there the loss ~ mu^2/2
and its relative error is 2x the width), plus bisection of the cells that
dominate sum_j w_j [D(mu_hi) - D(mu_lo)], D(mu) = log(1 + p^2 (e^{mu^2} - 1))
(the Renyi-2 divergence of a subsampled Gaussian, a proxy of each cell's share
of the composed loss), until that sum is <= ``_ETA_BULK`` * sum_j w_j D(mu_j).

Heavy tail. P(L > ell) ~ P(Z^2/(2 sigma^2) > ell) decays like ell^{-r/2}; all
Renyi moments are infinite, so ``loss_range`` bounds the tails from the law of Z
itself (see :meth:`RandomSensitivityGaussian.loss_range`), with the upper tail's
budget relaxed ``UPPER_TAIL_FACTOR``-fold so that the range follows the tail only
as far as the answer needs (losses of 1e6 at r = 2, 1e14 at r = 1); the accountant
widens h to fit. Mass beyond the grid goes to +inf in the pessimistic cells (never
dropped), so cutting the range only loosens the upper bound. ``MAX_LOSS`` = 1e15 is
a float sanity bound, not a modelling cap.

Notation: sigma = noise_multiplier, r = jl_projections, p = sampling_rate,
mu = Z/sigma; w_j, z_j as above; t is the log-likelihood-ratio threshold of (3).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special, stats

from fdp._kernels.chi2 import mixture_alpha_beta, mixture_cells, mixture_delta
from fdp._validation import check_integer, check_real, check_sampling_rate
from fdp.mechanisms.base import Mechanism, register_mechanism
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["JL", "RandomSensitivityGaussian", "jl_alpha_beta", "jl_delta", "MAX_LOSS"]

#: Largest |loss| a single step's grid is asked to cover (a float sanity bound; the
#: heavy upper tail beyond the grid goes to +inf in the pessimistic cells).
MAX_LOSS = 1e15
#: The upper end of the grid leaves UPPER_TAIL_FACTOR times the requested tail mass
#: above it (to +inf, pessimistically): P(L > ell) decays only like ell^(-r/2), and the
#: accountant's per-step budget (1e-4 delta / T) would push a uniform grid to losses of
#: 1e12 at r = 1-3; 1000x that budget (0.1 delta over all steps) keeps the range where
#: the answer is, for a bound that is looser by at most 0.1 delta in delta.
UPPER_TAIL_FACTOR = 1e3
#: Components' noise values are evaluated within X_CUT of their mean; the rest
#: (<= 2 Phi(-X_CUT) ~ 1e-25 of each component) is placed on the safe side.
X_CUT = 10.5
#: Components are coarsened to blocks of width <= ETA_LOSS[pessimistic] * (their
#: typical loss): the pessimistic side splits each block onto its ends (error
#: second order in the width), the optimistic side rounds a merged atom down to
#: the grid (first order in h), so it keeps finer blocks.
ETA_LOSS = {True: 1e-2, False: 1e-3}
#: Relative width of a Z-cell where mu = Z/sigma >= 1.
_ETA_REL = 0.01
#: Budget of the proxy error sum_j w_j [D(mu_hi) - D(mu_lo)] / sum_j w_j D(mu_j).
_ETA_BULK = 0.1
#: Quantile of Z below which everything is one cell, and above which the
#: quadrature of (3) stops (the rest is charged as an absolute error <= 1e-30).
_Q_END = 1e-30
#: Geometric quantile panels per half of Z's law in the quadrature of (3) (ratio ~1.9).
_BASE_PANELS = 110


# --------------------------------------------------------------- laws of Z
class _ZLaw:
    """A law of Z >= 0 with accurate tails: cdf/sf/ppf/isf, vectorised."""

    lower: float = 0.0
    upper: float = math.inf

    def cdf(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sf(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def ppf(self, q: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def isf(self, q: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def mass(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """P(lo < Z <= hi), by differences of whichever tail is smaller."""
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        c_lo, c_hi = self.cdf(lo), self.cdf(hi)
        s_lo, s_hi = self.sf(lo), self.sf(hi)
        return np.clip(np.where(c_hi <= 0.5, c_hi - c_lo, s_lo - s_hi), 0.0, 1.0)


@dataclass(frozen=True)
class _ChiLaw(_ZLaw):
    """Z = 1 / sqrt(chi2_r / r): P(Z <= z) = P(chi2_r >= r / z^2)."""

    r: int

    def cdf(self, z):
        z = np.asarray(z, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.where(z <= 0, 0.0, stats.chi2.sf(self.r / (z * z), self.r))

    def sf(self, z):
        z = np.asarray(z, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.where(z <= 0, 1.0, stats.chi2.cdf(self.r / (z * z), self.r))

    def ppf(self, q):
        with np.errstate(divide="ignore"):
            return np.sqrt(self.r / stats.chi2.isf(np.asarray(q, dtype=np.float64), self.r))

    def isf(self, q):
        with np.errstate(divide="ignore"):
            return np.sqrt(self.r / stats.chi2.ppf(np.asarray(q, dtype=np.float64), self.r))


@dataclass(frozen=True, eq=False)
class _ScipyLaw(_ZLaw):
    """A frozen scipy.stats distribution of Z >= 0."""

    dist: Any

    def __post_init__(self) -> None:
        lo, hi = self.dist.support()
        object.__setattr__(self, "lower", float(lo))
        object.__setattr__(self, "upper", float(hi))

    def cdf(self, z):
        return np.asarray(self.dist.cdf(z), dtype=np.float64)

    def sf(self, z):
        return np.asarray(self.dist.sf(z), dtype=np.float64)

    def ppf(self, q):
        return np.asarray(self.dist.ppf(q), dtype=np.float64)

    def isf(self, q):
        return np.asarray(self.dist.isf(q), dtype=np.float64)


# ------------------------------------------------------------ quadrature
@functools.lru_cache(maxsize=64)
def _quadrature(law: _ZLaw, n_panels_half: int = _BASE_PANELS, order: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Nodes z_i and weights w_i with E[g(Z)] ~ sum_i w_i g(z_i), ordered by z.

    Gauss-Legendre of ``order`` nodes on panels in quantile space q = F(z):
    geometric panels q in [1e-30, 1/2] (ratio ~1.9) mapped by ppf, and the
    mirror image 1 - q in [1e-30, 1/2] mapped by isf (accurate upper tail).
    For g with values in [0, 1] the quantiles left out cost <= 2e-30.
    """
    edges = np.geomspace(_Q_END, 0.5, n_panels_half + 1)
    return _panel_nodes(law, edges, edges, order)


def _panel_nodes(law: _ZLaw, lower_q: np.ndarray, upper_s: np.ndarray,
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


def _quadrature_around(law: _ZLaw, z_lo: float, z_hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The fixed panels of :func:`_quadrature`, plus panel edges every
    (z_hi - z_lo) / 32 on [z_lo, z_hi], in whichever tail coordinate is accurate."""
    base = np.geomspace(_Q_END, 0.5, _BASE_PANELS + 1)
    z_new = np.linspace(z_lo, z_hi, _SHARP_PANELS + 1)
    q_new = law.cdf(z_new)
    s_new = law.sf(z_new)
    lower = np.concatenate([base, q_new[(q_new > _Q_END) & (q_new < 0.5)]])
    upper = np.concatenate([base, s_new[(s_new > _Q_END) & (s_new < 0.5)]])
    return _panel_nodes(law, lower, upper)


def _alpha_beta(law: _ZLaw, sigma: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z, w = _quadrature(law)
    tt = np.ascontiguousarray(np.atleast_1d(np.asarray(t, dtype=np.float64)).ravel())
    a, b = mixture_alpha_beta(tt, z / sigma, w)
    shape = np.shape(t)
    return np.clip(a, 0.0, 1.0).reshape(shape), np.clip(b, 0.0, 1.0).reshape(shape)


def _delta(law: _ZLaw, sigma: float, p: float, epsilon: Any, direction: Direction) -> np.ndarray:
    """E_Z[delta_subsampled_gauss(eps; Z / sigma, p)] for each eps.

    Where the loss can exceed eps only through a large mu (remove direction, or
    p = 1), the integrand steps from ~0 to ~p within a few units of mu around
    mu* = sqrt(2 (eps - log p)); for mu* > 8 that eps is recomputed with extra
    panels on mu in [mu* - 12, mu* + 12] (at eps = 1e4, r = 1 the fixed panels
    alone are off by 2 %).
    """
    z, w = _quadrature(law)
    eps = np.asarray(epsilon, dtype=np.float64)
    flat = np.ascontiguousarray(eps.ravel())
    remove = Direction(direction) is Direction.REMOVE
    out = mixture_delta(flat, z / sigma, w, p, remove)
    if remove or p == 1.0:
        with np.errstate(invalid="ignore"):
            mu_star = np.sqrt(2.0 * np.maximum(flat - math.log(p), 0.0))
        for i in np.nonzero(np.isfinite(mu_star) & (mu_star > _SHARP_MU))[0]:
            lo = max(mu_star[i] - _SHARP_HALF_WIDTH, 0.5 * mu_star[i])
            zi, wi = _quadrature_around(law, sigma * lo, sigma * (mu_star[i] + _SHARP_HALF_WIDTH))
            out[i] = mixture_delta(flat[i:i + 1], zi / sigma, wi, p, remove)[0]
    return out.reshape(eps.shape)


def jl_alpha_beta(t: Any, sigma: float, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(alpha(t), beta(t)) of the seed's Lemma "subroutine_privacy", equation (3).

    Quadrature error <= 1e-9 absolute (tests compare with mpmath at 30 digits).
    """
    return JL(noise_multiplier=sigma, jl_projections=r).alpha_beta(t)


def jl_delta(epsilon: Any, sigma: float, r: int, p: float = 1.0,
             direction: Direction | str = Direction.REMOVE) -> np.ndarray:
    """delta(eps) = E_Z[delta_subsampled_gauss(eps; Z/sigma, p)] of ONE step, by quadrature."""
    return JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p).delta(epsilon, direction)


# ------------------------------------------------------------ partition
def _proxy(mu: np.ndarray, p: float) -> np.ndarray:
    """D(mu) = log(1 + p^2 (e^{mu^2} - 1)), overflow-free."""
    m2 = np.minimum(np.asarray(mu, dtype=np.float64) ** 2, 1e300)
    with np.errstate(over="ignore"):
        small = np.log1p(p * p * np.expm1(np.minimum(m2, 700.0)))
    return np.where(m2 > 700.0, m2 + 2.0 * math.log(p), small)


def _partition(law: _ZLaw, sigma: float, p: float, z_top: float) -> tuple[np.ndarray, np.ndarray]:
    """Cell edges z_0 < ... < z_K of Z and weights w_j = P(z_j < Z <= z_{j+1}).

    z_0 is the lower end of Z's support, z_K its upper end (maybe inf); z_{K-1}
    is at most ``z_top`` (above it every component's mass is beyond the grid, or
    its loss has saturated) and the bottom cell holds <= 1e-30 of mass.
    """
    z_bot = float(law.ppf(_Q_END))
    if not (z_bot > law.lower):
        z_bot = law.lower
    z_top = min(z_top, float(law.isf(_Q_END)), law.upper)
    if not z_top > z_bot:  # a (nearly) degenerate law
        z_top = z_bot * (1 + 1e-12) + 1e-300
    q = np.linspace(0.0, 1.0, 33)[1:-1]
    tail_q = np.geomspace(_Q_END, 1.0 / 32, 16)
    inner = np.concatenate([law.ppf(q), law.ppf(tail_q), law.isf(tail_q)])
    inner = inner[np.isfinite(inner) & (inner > z_bot) & (inner < z_top)]
    edges = np.unique(np.concatenate([[z_bot, z_top], inner]))
    # relative width <= _ETA_REL where mu >= 1 (and z > 0): geometric refinement
    for _ in range(64):
        lo, hi = edges[:-1], edges[1:]
        wide = (hi / sigma >= 1.0) & (hi > lo * (1.0 + _ETA_REL))
        if not np.any(wide):
            break
        lo_w, hi_w = lo[wide], hi[wide]
        k = np.ceil(np.log(hi_w / np.maximum(lo_w, 1e-300)) / math.log1p(_ETA_REL)).astype(np.int64)
        k = np.minimum(k, 4096)
        new = [np.geomspace(a, b, int(m) + 1)[1:-1] for a, b, m in zip(lo_w, hi_w, k) if a > 0]
        new += [np.linspace(a, b, 3)[1:-1] for a, b in zip(lo_w, hi_w) if a <= 0]
        edges = np.unique(np.concatenate([edges] + new))
    # bisect the cells that dominate the proxy error
    for _ in range(40):
        lo, hi = edges[:-1], edges[1:]
        w = law.mass(lo, hi)
        d_lo, d_hi = _proxy(lo / sigma, p), _proxy(hi / sigma, p)
        err = w * (d_hi - d_lo)
        total = float(np.sum(w * 0.5 * (d_lo + d_hi)))
        if not total > 0 or float(err.sum()) <= _ETA_BULK * total:
            break
        order = np.argsort(err)[::-1]
        cum = np.cumsum(err[order])
        n_split = int(np.searchsorted(cum, 0.5 * cum[-1])) + 1
        sel = order[:n_split]
        mids = np.where(lo[sel] > 0, np.sqrt(lo[sel] * hi[sel]), 0.5 * (lo[sel] + hi[sel]))
        edges = np.unique(np.concatenate([edges, mids]))
    full = np.concatenate([[law.lower], edges, [law.upper]])
    full = np.unique(full)  # drops duplicates when z_bot == lower or z_top == upper
    weights = law.mass(full[:-1], full[1:])
    return full, weights


# -------------------------------------------------------------- cells
def _add_point(p_cell, u_cell, tails, grid: Grid, ell: float, m: float) -> None:
    """Add P-mass m at loss ell (tails = [p_left, d_left, p_right, u_right, p_inf])."""
    if m <= 0:
        return
    if ell == math.inf:
        tails[4] += m
        return
    pts0 = (grid.offset) * grid.h
    k = math.ceil(ell / grid.h - 1e-12) - grid.offset - 1  # ell_k < ell <= ell_{k+1}
    if ell <= pts0:
        tails[0] += m
        tails[1] += m * math.expm1(pts0 - ell)
    elif k >= grid.n:
        tails[2] += m
        tails[3] += m * -math.expm1((grid.offset + grid.n) * grid.h - ell)
    else:
        k = max(k, 0)
        p_cell[k] += m
        u_cell[k] += m * max(0.0, -math.expm1((grid.offset + k) * grid.h - ell))


def _mu_top(direction: Direction, grid: Grid, p: float) -> float:
    """mu above which a component is (up to ~1e-25) beyond the grid or saturated."""
    saturate = 2.0 * (X_CUT + 3.0)
    if direction is Direction.ADD and p < 1.0:
        return saturate
    ell_n = (grid.offset + grid.n) * grid.h
    # mu^2/2 - X_CUT mu + log p >= ell_n + 1: the P1 part is beyond ell_n
    c = max(ell_n + 1.0 - math.log(p), 0.0)
    return max(saturate, X_CUT + math.sqrt(X_CUT * X_CUT + 2.0 * c))


def _cells(law: _ZLaw, sigma: float, p: float, direction: Direction, grid: Grid,
           pessimistic: bool) -> LossCells:
    edges, weights = _partition(law, sigma, p, sigma * _mu_top(direction, grid, p))
    mus = edges[1:] / sigma if pessimistic else edges[:-1] / sigma
    remove = direction is Direction.REMOVE
    finite = np.isfinite(mus) & (mus > 0) & (weights > 0)
    mf = mus[finite]
    scale = np.maximum(0.5 * mf * mf + math.log(p), 0.25 * mf * mf)
    strides = np.maximum(1, np.floor(np.minimum(ETA_LOSS[bool(pessimistic)] * scale / grid.h, 1e9))).astype(np.int64)
    p_cell, u_cell, tails = mixture_cells(
        int(grid.offset), float(grid.h), int(grid.n),
        np.ascontiguousarray(mf), np.ascontiguousarray(weights[finite]), strides,
        float(p), remove, bool(pessimistic), X_CUT,
    )
    tails = tails.copy()
    log1mp = math.log1p(-p) if p < 1.0 else -math.inf
    for mu, w in zip(mus[~finite], weights[~finite]):
        if w <= 0:
            continue
        if mu == 0:  # mu = 0: no privacy loss
            _add_point(p_cell, u_cell, tails, grid, 0.0, float(w))
        elif remove:  # mu = inf, remove: p at +inf, 1-p at log(1-p)
            tails[4] += p * w
            if p < 1.0:
                _add_point(p_cell, u_cell, tails, grid, log1mp, (1.0 - p) * w)
        else:  # mu = inf, add: all at -log(1-p)
            _add_point(p_cell, u_cell, tails, grid, -log1mp, float(w))
    return LossCells(
        grid=grid,
        p_cell=p_cell,
        u_cell=np.minimum(np.clip(u_cell, 0.0, None), p_cell),
        p_left=float(tails[0]),
        d_left=max(float(tails[1]), 0.0),
        p_right=float(tails[2]),
        u_right=min(max(float(tails[3]), 0.0), float(tails[2])),
        p_inf=min(float(tails[4]), 1.0),
    )


@functools.lru_cache(maxsize=16)
def _cached_cells(mech: "RandomSensitivityGaussian | JL", direction: Direction, grid: Grid,
                  pessimistic: bool) -> LossCells:
    return _cells(mech._law(), mech.noise_multiplier, mech.sampling_rate, direction, grid, pessimistic)


# ------------------------------------------------------------- ranges
def _loss_range(law: _ZLaw, sigma: float, p: float, direction: Direction,
                tail_mass: float) -> tuple[float, float]:
    """(lo, hi) with P(L < lo) <= tail_mass and P(hi < L < inf) <= tail_mass, capped at MAX_LOSS.

    Remove direction, ell > 0, A = log((e^ell - (1-p))/p): given mu,
        P(L > ell | mu) = (1-p) Phibar(A/mu + mu/2) + p Phibar(A/mu - mu/2),
    A/mu + mu/2 >= sqrt(2A) (AM-GM) and A/mu - mu/2 is decreasing in mu, so for any mu*
        P(L > ell) <= (1-p) Phibar(sqrt(2A)) + p [P(Z/sigma > mu*) + Phibar(A/mu* - mu*/2)].
    Each term is made <= tail_mass/3. The add direction's lower tail obeys the
    first bound (P(L < -ell) <= Phibar(sqrt(2A))); its upper end is -log(1-p). At
    p = 1 both directions have the remove direction's law, and the lower tail is
    P(L < -ell) <= P(Z/sigma > mu*) + Phi(-ell/mu*) (L >= mu (X - mu)).
    """
    tau = max(float(tail_mass), 1e-300)
    tau_hi = min(UPPER_TAIL_FACTOR * tau, 0.1)
    log1mp = math.log1p(-p) if p < 1.0 else -math.inf

    def mu_star(mass: float) -> float:
        if mass >= 1.0:
            return 0.0
        z = float(law.isf(mass))
        return (z if math.isfinite(z) else law.upper) / sigma

    def upper_remove() -> float:
        tau = tau_hi
        z1 = float(-special.ndtri(tau / 3.0))
        a = 0.5 * max(z1, 0.0) ** 2 if p < 1.0 else 0.0
        frac = tau / (3.0 * p)
        if frac < 0.5:
            ms = mu_star(frac)
            z2 = float(-special.ndtri(frac))
            a = max(a, ms * (0.5 * ms + z2))
        a = min(a, 1e300)
        hi = float(np.logaddexp(log1mp, math.log(p) + a)) if p < 1.0 else a
        return min(hi, MAX_LOSS)

    if p == 1.0:
        hi = upper_remove()
        ms = mu_star(tau / 2.0)
        lo = ms * float(special.ndtri(tau / 2.0))
        return max(lo, -MAX_LOSS), max(hi, max(lo, -MAX_LOSS) + 1e-6)
    if Direction(direction) is Direction.REMOVE:
        return log1mp, upper_remove()
    z1 = float(-special.ndtri(tau))
    a = 0.5 * max(z1, 0.0) ** 2
    lo = -float(np.logaddexp(log1mp, math.log(p) + a))
    return max(lo, -MAX_LOSS), -log1mp


# ------------------------------------------------------------ mechanisms
class _RandomSensitivityBase(Mechanism):
    """Shared implementation of (2)-(3) given ``_law()``."""

    noise_multiplier: float
    sampling_rate: float
    #: Z+ and Z- differ by up to _ETA_REL = 1 % in the cells that carry large
    #: losses (~ Z^2, so 2 % in loss): the bounds cannot get closer than ~3 %.
    intrinsic_rtol = 0.03

    def _law(self) -> _ZLaw:  # pragma: no cover - abstract
        raise NotImplementedError

    def is_symmetric(self) -> bool:
        return True  # given Z = z a Gaussian shift: both directions agree at p = 1

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool) -> LossCells:
        """Cells of the Z+ (pessimistic) or Z- (optimistic) mixture; see the module docstring."""
        return _cached_cells(self, Direction(direction), grid, bool(pessimistic))

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        return _loss_range(self._law(), self.noise_multiplier, self.sampling_rate,
                           Direction(direction), tail_mass)

    def alpha_beta(self, t: Any) -> tuple[np.ndarray, np.ndarray]:
        """(alpha(t), beta(t)) of equation (3), |error| <= 1e-9, vectorised over t."""
        return _alpha_beta(self._law(), self.noise_multiplier, t)

    def delta(self, epsilon: Any, direction: Direction | str = Direction.REMOVE) -> np.ndarray:
        """delta(eps) of ONE subsampled step in ``direction``: E_Z[delta_gauss(eps; Z/sigma, p)]."""
        return _delta(self._law(), self.noise_multiplier, self.sampling_rate, epsilon,
                      Direction(direction))

    def tradeoff(self):
        """f = T(Z, N(Z/sigma, 1) || Z, N(0, 1)) as an fdp.ParametricCurve, equation (3)."""
        from fdp.tradeoff.parametric import ParametricCurve

        return ParametricCurve(alpha_of_t=_AlphaOfT(self), beta_of_t=_BetaOfT(self))


@dataclass(frozen=True)
class _AlphaOfT:
    mech: Any

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return self.mech.alpha_beta(t)[0]


@dataclass(frozen=True)
class _BetaOfT:
    mech: Any

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return self.mech.alpha_beta(t)[1]


@register_mechanism
@dataclass(frozen=True)
class RandomSensitivityGaussian(_RandomSensitivityBase):
    """Gaussian mechanism whose (released) sensitivity Z/sigma is random, Poisson-subsampled.

    Given Z = z it adds N(0, sigma^2) noise to a query of sensitivity z; Z is
    part of the output. JL is the case Z = 1/sqrt(chi2_r / r).

    Args:
      z_distribution: a frozen ``scipy.stats`` distribution of Z >= 0 (its
        ``cdf``/``sf``/``ppf``/``isf`` should be accurate in the tails).
      noise_multiplier: sigma > 0.
      sampling_rate: Poisson sampling rate p in (0, 1].

    Raises:
      ValueError: bad sigma or p; z_distribution not a frozen scipy distribution
        or with support reaching below 0.
    """

    z_distribution: Any
    noise_multiplier: float
    sampling_rate: float = 1.0
    kind = "random_sensitivity_gaussian"

    def __post_init__(self) -> None:
        d = self.z_distribution
        if not all(hasattr(d, a) for a in ("cdf", "sf", "ppf", "isf", "support")):
            raise ValueError(
                f"z_distribution must be a frozen scipy.stats distribution (e.g. scipy.stats.chi(3)); got {d!r}"
            )
        lo = float(d.support()[0])
        if not lo >= 0.0:
            raise ValueError(f"z_distribution must be supported on Z >= 0; its support starts at {lo!r}")
        object.__setattr__(
            self, "noise_multiplier",
            check_real("noise_multiplier", self.noise_multiplier, low=0.0, low_inclusive=False),
        )
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))
        object.__setattr__(self, "_zlaw", _ScipyLaw(d))

    def _law(self) -> _ZLaw:
        return self._zlaw  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        raise ValueError(
            "RandomSensitivityGaussian cannot be written to JSON (its z_distribution is an "
            "arbitrary scipy object); use fdp.JL for the JL mechanism"
        )


@register_mechanism
@dataclass(frozen=True)
class JL(_RandomSensitivityBase):
    """One step of DP-SGD-JL / DP-Adam-JL (seed, Lemma "subroutine_privacy").

    f = T(Z, N(Z/sigma, 1) || Z, N(0, 1)) with Z = 1/sqrt(chi2_r / r), Poisson
    subsampled at rate p. Its epsilon is at least the Gaussian mechanism's with
    the same sigma and tends to it as r -> inf.

    Args:
      noise_multiplier: sigma > 0 (noise std / clipping norm).
      jl_projections: r >= 1, the number of JL projections.
      sampling_rate: p in (0, 1].

    Example:
      >>> import fdp
      >>> acc = fdp.PLDAccountant().compose(
      ...     fdp.JL(noise_multiplier=0.6, jl_projections=30, sampling_rate=256 / 25000), steps=98)
    """

    noise_multiplier: float
    jl_projections: int
    sampling_rate: float = 1.0
    kind = "jl"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier",
            check_real("noise_multiplier", self.noise_multiplier, low=0.0, low_inclusive=False),
        )
        object.__setattr__(self, "jl_projections",
                           check_integer("jl_projections", self.jl_projections, low=1, high=10**9))
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))

    def _law(self) -> _ZLaw:
        return _ChiLaw(self.jl_projections)
