"""Certified cells of the Z+ / Z- mixtures: the partition of Z and the loss cells.

See the package docstring ("Certified cells") for why the Z+ mixture dominates the
mechanism and the Z- mixture is dominated by it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from fdp._kernels.chi2 import mixture_cells
from fdp.mechanisms.random_sensitivity.convexity import jensen_points, position_bounds, two_point_weights
from fdp.mechanisms.random_sensitivity.laws import ZLaw
from fdp.mechanisms.random_sensitivity.quadrature import Q_END
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["ETA_REL", "X_CUT", "cached_cells", "components", "focus_window", "partition", "z_cells"]

#: Components' noise values are evaluated within X_CUT of their mean; the rest
#: (<= 2 Phi(-X_CUT) ~ 1e-25 of each component) is placed on the safe side.
X_CUT = 10.5
#: Components are coarsened to blocks of width <= ETA_LOSS[pessimistic] * max(spread
#: of their loss, |loss|): the pessimistic side splits each block onto its ends, the
#: optimistic side merges it into one atom (both errors second order in the width;
#: the merge loses more, so it keeps finer blocks).
ETA_LOSS = {True: 1e-2, False: 5e-3}
#: ... and <= W_MAX[pessimistic] (growing as e^{d^2/8} at d sd from the component's
#: means) in absolute loss: delta's hinge (1 - e^{eps - L})_+ bends on a scale of 1,
#: so a block much wider than that moves the eps of a large-loss query by ~ width^2 / 10
#: (seed setting, r = 5, eps ~ 638: 0.33 % with the relative rule alone).
W_MAX = {True: 0.5, False: 0.25}
#: Relative width of a Z-cell, at every mu = Z/sigma > 0. The one-step profile
#: delta_mu(eps) ~ Phibar(eps/mu - mu/2) has d log delta / d log mu ~ x^2 (x ~ 4 to 7
#: where delta is 1e-5 to 1e-12), whatever mu: the scale on which the integrand moves is
#: a fixed fraction of mu, small or large. (The rule used to hold only where mu >= 1,
#: and cells 13-38 % wide below left fdp.JL at p = 1, sigma = 2 with brackets 0.6-11 %
#: wide for r = 20-100; docs/jl.md.)
ETA_REL = 0.01
#: Relative width of a Z-cell is also <= ETA_TAIL / mu^2: the two-point bound of
#: :mod:`.convexity` gains over the cell's top end only where mu * (mu_hi - mu_lo) / 4 is small.
ETA_TAIL = 0.4
#: ... but no finer than this (the cells' cost grows like 1 / width up to the grid's top).
ETA_REL_MIN = 1e-3
#: ... and coarser where the range of mu above that would need more than this many.
TAIL_CELLS = 2000
#: Budget of the proxy error sum_j w_j [D(mu_hi) - D(mu_lo)] / sum_j w_j D(mu_j).
ETA_BULK = 0.1
#: Relative width of the Z-cells in a query's focus window (:func:`focus_window`) ...
FOCUS_REL = 1e-4
#: ... coarser where the window would need more cells than this.
FOCUS_CELLS = 2000
#: The window is widened by this fraction of mu (the other steps' losses move the
#: decisive loss of one step) and by this many units of mu (its Gaussian noise).
FOCUS_MARGIN = 0.01
FOCUS_SPREAD = 6.0
#: No focus below this mu(a): the integrand's step, ~ 1/mu wide relative, is then
#: smooth on the scale of the cells there (ETA_REL_MIN and coarser).
FOCUS_MIN_MU = 50.0


def focus_window(focus: tuple[float, float] | None, sigma: float, p: float,
                 direction: Direction) -> tuple[float, float] | None:
    """The range (z_a, z_b) of Z whose components carry single-step losses in ``focus``.

    Where a heavy tail decides the answer, it is decided by ONE step with a large Z:
    delta(eps) of T steps ~ T E_Z[delta_mu(eps - S)], S the other steps' (much
    smaller) sum. The integrand steps from ~0 to ~p where the component's loss,
    log p + mu^2/2 + mu xi (xi ~ N(0, 1), remove direction), crosses eps - S: at
    mu ~ mu(eps) = sqrt(2 (eps - log p)), within a relative width ~ 1/mu. A cell of
    the partition that straddles that step errs to first order in its width (the
    two-point and Jensen bounds of :mod:`.convexity` are second order only where
    the integrand is smooth on the cell's scale), so the cells there are made
    ``FOCUS_REL`` wide: mu in [mu(a), mu(b)], widened by ``FOCUS_MARGIN`` relative
    and ``FOCUS_SPREAD`` absolute, rounded outwards to powers of 2^(1/64) (nearby
    queries share cached cells). None where there is nothing to focus: no focus,
    mu(a) < ``FOCUS_MIN_MU``, or the add direction at p < 1 (its loss is below
    -log(1 - p) whatever Z).
    """
    if focus is None or (direction is Direction.ADD and p < 1.0):
        return None
    a, b = (float(v) for v in focus)
    if not (math.isfinite(a) and math.isfinite(b) and a <= b):
        return None
    if b > 1e300:  # 2 (b - log p) would overflow: no Z is that large anyway (MAX_LOSS = 1e15)
        return None
    mu_a = math.sqrt(2.0 * max(a - math.log(p), 0.0))
    mu_b = math.sqrt(2.0 * max(b - math.log(p), 0.0))
    if mu_a < FOCUS_MIN_MU:
        return None
    lo = mu_a * (1.0 - FOCUS_MARGIN) - FOCUS_SPREAD
    hi = mu_b * (1.0 + FOCUS_MARGIN) + FOCUS_SPREAD
    lo = 2.0 ** (math.floor(64.0 * math.log2(lo)) / 64.0)
    hi = 2.0 ** (math.ceil(64.0 * math.log2(hi)) / 64.0)
    return sigma * lo, sigma * hi


def proxy(mu: np.ndarray, p: float) -> np.ndarray:
    """D(mu) = log(1 + p^2 (e^{mu^2} - 1)), overflow-free."""
    m2 = np.minimum(np.asarray(mu, dtype=np.float64) ** 2, 1e300)
    with np.errstate(over="ignore"):
        small = np.log1p(p * p * np.expm1(np.minimum(m2, 700.0)))
    return np.where(m2 > 700.0, m2 + 2.0 * math.log(p), small)


def partition(law: ZLaw, sigma: float, p: float, z_top: float,
              z_focus: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Cell edges z_0 < ... < z_K of Z and weights w_j = P(z_j < Z <= z_{j+1}).

    z_0 is the lower end of Z's support, z_K its upper end (maybe inf); z_{K-1}
    is at most ``z_top`` (above it every component's mass is beyond the grid, or
    its loss has saturated) and the bottom cell holds <= 1e-30 of mass. Cells in
    ``z_focus`` (:func:`focus_window`) are ``FOCUS_REL`` wide (or as fine as
    ``FOCUS_CELLS`` cells allow). Any partition gives valid bounds.
    """
    z_bot = float(law.ppf(Q_END))
    if not (z_bot > law.lower):
        z_bot = law.lower
    z_top = min(z_top, float(law.isf(Q_END)), law.upper)
    if not z_top > z_bot:  # a (nearly) degenerate law
        z_top = z_bot * (1 + 1e-12) + 1e-300
    q = np.linspace(0.0, 1.0, 33)[1:-1]
    tail_q = np.geomspace(Q_END, 1.0 / 32, 16)
    inner = np.concatenate([law.ppf(q), law.ppf(tail_q), law.isf(tail_q)])
    inner = inner[np.isfinite(inner) & (inner > z_bot) & (inner < z_top)]
    edges = np.unique(np.concatenate([[z_bot, z_top], inner]))
    if z_focus is not None:
        a, b = max(z_focus[0], z_bot), min(z_focus[1], z_top)
        if b > a > 0.0:
            k = min(FOCUS_CELLS, math.ceil(math.log(b / a) / FOCUS_REL))
            edges = np.unique(np.concatenate([edges, np.geomspace(a, b, k + 1)]))
    # relative width <= rho(mu) = ETA_TAIL / max(mu, 1)^2 clipped to [ETA_REL_MIN, ETA_REL]
    # at every mu > 0 (ETA_REL below mu = 1): geometric refinement (at most ~TAIL_CELLS
    # geometric cells above the mu where ETA_TAIL / mu^2 = ETA_REL_MIN). A bottom cell
    # [0, z_1] (an atom of Z at 0) is bisected only while z_1 >= sigma.
    mu_fine = math.sqrt(ETA_TAIL / ETA_REL_MIN)
    rho_min = max(ETA_REL_MIN, math.log(max(z_top / sigma, mu_fine) / mu_fine) / TAIL_CELLS)
    for _ in range(64):
        lo, hi = edges[:-1], edges[1:]
        rho = np.clip(ETA_TAIL / np.maximum(hi / sigma, 1.0) ** 2, rho_min, ETA_REL)
        wide = (hi > lo * (1.0 + rho)) & ((lo > 0.0) | (hi >= sigma))
        if not np.any(wide):
            break
        lo_w, hi_w = lo[wide], hi[wide]
        k = np.ceil(np.log(hi_w / np.maximum(lo_w, 1e-300)) / np.log1p(rho[wide])).astype(np.int64)
        k = np.minimum(k, 4096)
        new = [np.geomspace(a, b, int(m) + 1)[1:-1] for a, b, m in zip(lo_w, hi_w, k) if a > 0]
        new += [np.linspace(a, b, 3)[1:-1] for a, b in zip(lo_w, hi_w) if a <= 0]
        edges = np.unique(np.concatenate([edges] + new))
    # bisect the cells that dominate the proxy error
    for _ in range(40):
        lo, hi = edges[:-1], edges[1:]
        w = law.mass(lo, hi)
        d_lo, d_hi = proxy(lo / sigma, p), proxy(hi / sigma, p)
        err = w * (d_hi - d_lo)
        total = float(np.sum(w * 0.5 * (d_lo + d_hi)))
        if not total > 0 or float(err.sum()) <= ETA_BULK * total:
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
    # the bottom cell is [z_0, z_1], not (z_0, z_1]: an atom at the lower end of the
    # support (and any mass below it) belongs to it
    weights[0] = law.mass(np.array(-math.inf), np.array(full[1]))
    return full, weights


@functools.lru_cache(maxsize=32)
def components(law: ZLaw, sigma: float, p: float, z_top: float, pessimistic: bool,
               z_focus: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mu_j, w_j) of the Z+ (pessimistic) or Z- (optimistic) mixture, cached (read-only).

    A discrete law is its own finite mixture: mu_j = z_j / sigma on both sides, so the
    two bounds differ only through the grid. Atoms above ``z_top`` (their losses are
    beyond the grid) and the mass the atoms leave out are placed on the safe side:
    Z+ takes inf above and the first atom below, Z- takes z_top (or the last atom)
    above and 0 below; both stay couplings (Z- <= Z <= Z+). Otherwise the cells of
    :func:`partition` with the bounds of :mod:`.convexity`: pessimistic, each finite
    cell split onto its ends with the chord weights (6), components at the edges;
    optimistic, one Jensen point (7) per cell (an infinite top cell: its lower end).
    """
    mus, weights = _components(law, sigma, p, z_top, pessimistic, z_focus)
    mus.setflags(write=False)
    weights.setflags(write=False)
    return mus, weights


def _components(law: ZLaw, sigma: float, p: float, z_top: float, pessimistic: bool,
                z_focus: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    atoms = law.atoms()
    if atoms is None:
        edges, weights = partition(law, sigma, p, z_top, z_focus)
        k = int(np.sum(np.isfinite(edges[1:])))  # cells with a finite upper edge
        under, over = position_bounds(law, edges[:k], edges[1:k + 1], sigma, closed_first=True)
        if pessimistic:  # (6): each finite cell onto its two ends
            return edges / sigma, two_point_weights(edges, weights, over)
        z_bar = np.concatenate([jensen_points(edges[:k], edges[1:k + 1], under, sigma), edges[k:-1]])
        return z_bar / sigma, weights  # (7); an infinite top cell keeps its lower end
    z, w = atoms.z.copy(), atoms.w.copy()
    high = z > z_top
    if pessimistic:
        z[high] = math.inf
        w[0] += atoms.below
        # above: what sf reports, or what the listed masses leave (a custom sf may say 0)
        rest = max(atoms.above, 1.0 - float(w.sum()))
        z, w = np.append(z, math.inf), np.append(w, rest)
    else:
        z[high] = z_top
        z, w = np.append(z, [0.0, z[-1]]), np.append(w, [atoms.below, atoms.above])
        # rounded pmf values may sum above 1: scale down (a sub-probability only lowers
        # delta, so it stays a lower bound; scaling up would not)
        total = float(w.sum())
        if total > 1.0:
            w = w / (total * (1.0 + 4 * 2.0**-53))
    return z / sigma, w


# -------------------------------------------------------------- cells
def loss_spread(mu: np.ndarray, p: float) -> np.ndarray:
    """~ the standard deviation of a component's loss: p sqrt(e^{mu^2} - 1), at most mu.

    (Remove direction; for small p and mu the loss is ~ p (e^{mu x - mu^2/2} - 1).)
    Only sets the block widths near loss 0, so it need not be exact."""
    with np.errstate(over="ignore"):
        spread = p * np.sqrt(np.expm1(np.minimum(mu * mu, 700.0)))
    return np.ascontiguousarray(np.minimum(spread, mu))


def add_point(p_cell, u_cell, tails, grid: Grid, ell: float, m: float) -> None:
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


def mu_top(direction: Direction, grid: Grid, p: float) -> float:
    """mu above which a component is (up to ~1e-25) beyond the grid or saturated."""
    saturate = 2.0 * (X_CUT + 3.0)
    if direction is Direction.ADD and p < 1.0:
        return saturate
    ell_n = (grid.offset + grid.n) * grid.h
    # mu^2/2 - X_CUT mu + log p >= ell_n + 1: the P1 part is beyond ell_n
    c = max(ell_n + 1.0 - math.log(p), 0.0)
    # rounded up to 2^(k/8): a larger top is as sound, and grids of nearly the same
    # range (refinement levels, nearby step counts) then share the cached components
    c = 2.0 ** (math.ceil(8.0 * math.log2(c)) / 8.0) if c > 0.0 else 0.0
    return max(saturate, X_CUT + math.sqrt(X_CUT * X_CUT + 2.0 * c))


def z_cells(law: ZLaw, sigma: float, p: float, direction: Direction, grid: Grid,
           pessimistic: bool, z_focus: tuple[float, float] | None = None) -> LossCells:
    """The loss cells of the Z+ (pessimistic) or Z- mixture on ``grid``."""
    mus, weights = components(law, sigma, p, sigma * mu_top(direction, grid, p), pessimistic, z_focus)
    remove = direction is Direction.REMOVE
    finite = np.isfinite(mus) & (mus > 0) & (weights > 0)
    mf = mus[finite]
    p_cell, u_cell, tails = mixture_cells(
        int(grid.offset), float(grid.h), int(grid.n),
        np.ascontiguousarray(mf), np.ascontiguousarray(weights[finite]),
        loss_spread(mf, p), ETA_LOSS[bool(pessimistic)], W_MAX[bool(pessimistic)],
        float(p), remove, bool(pessimistic), X_CUT,
    )
    tails = tails.copy()
    log1mp = math.log1p(-p) if p < 1.0 else -math.inf
    for mu, w in zip(mus[~finite], weights[~finite]):
        if w <= 0:
            continue
        if mu == 0:  # mu = 0: no privacy loss
            add_point(p_cell, u_cell, tails, grid, 0.0, float(w))
        elif remove:  # mu = inf, remove: p at +inf, 1-p at log(1-p)
            tails[4] += p * w
            if p < 1.0:
                add_point(p_cell, u_cell, tails, grid, log1mp, (1.0 - p) * w)
        else:  # mu = inf, add: all at -log(1-p)
            add_point(p_cell, u_cell, tails, grid, -log1mp, float(w))
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
def cached_cells(mech: Any, direction: Direction, grid: Grid, pessimistic: bool,
                 z_focus: tuple[float, float] | None = None) -> LossCells:
    """:func:`z_cells` of a (hashable) random-sensitivity mechanism, cached."""
    return z_cells(mech.law(), mech.noise_multiplier, mech.sampling_rate, direction, grid, pessimistic, z_focus)
