"""Sound, drift-free discretisations of a privacy-loss distribution.

Both discretisations put atoms on the grid points ell_k = (offset + k) h and are
*exact garblings in likelihood-ratio space*, so composing them T times has no
error that grows with T beyond the per-step one (no "rounding drift").

Pessimistic (connect-the-dots, Doroshenko et al. 2022, arXiv:2207.04380v1, Sec. 4)
    Every outcome of cell k, with likelihood ratio R in [x_k, x_{k+1}] (x = e^ell),
    is split at random into the two end points so that its P-mass and Q-mass are
    kept: a fraction (x_{k+1} - R)/(x_{k+1} - x_k) of its Q-mass goes to x_k, the
    rest to x_{k+1}. The original pair is a post-processing of the split pair
    (merge the two atoms back), hence the split pair *dominates* it: its delta(eps)
    is >= the truth for every eps, and so is the delta of its T-fold composition
    (composition is monotone, Dong-Roth-Su 2019, arXiv:1905.02383v3, Thm 4).
    Summed over the cell, the P-mass sent to the right end point is

        right_k = e^h / (e^h - 1) * u_cell[k],   left_k = p_cell[k] - right_k.

    The left tail (L <= ell_0) is moved up to ell_0 (losses only increase), and the
    right tail (L > ell_n) goes to +inf; both are pessimistic by coupling.

Optimistic (merging; this module)
    Merging outcomes is a post-processing, so a merged pair is *dominated* by the
    truth. Sweeping the grid from left to right, we merge the mass below each grid
    point (ratio < x_k) with just enough of the mass above it (ratio > x_k) that
    the merged atom has likelihood ratio exactly x_k: with the deficit
    D = x_k Q(S) - P(S) of what is carried in and the excess U = P(S') - x_k Q(S')
    of the next cell, a fraction theta = D / U of that cell is merged. When the
    next cell's excess cannot balance the carry, the unbalanced rest of the carry
    is rounded *down* to the grid point below it (its loss only decreases:
    optimistic by coupling, Lemma: delta of a composition is monotone in each
    loss). For smooth PLDs the rounded mass is O(h) of a cell, so the drift is
    O(h^2) per step, the same order as the connect-the-dots error. The merged
    atoms keep P-mass and Q-mass, so before rounding the result is a valid pair
    dominated by the truth; its delta(eps) is <= the truth for every eps.

Notation: u_cell, p_cell etc. are defined in :mod:`fdp.pld.cells`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from fdp._kernels.gate import gated
from fdp.pld.cells import LossCells
from fdp.pld.pmf import DiscretePLD

__all__ = ["discretise_pessimistic", "discretise_optimistic"]

#: Above this grid spacing the merging sweep's factors e^h overflow; use rounding down.
_FLOOR_ONLY_SPACING = 30.0


def discretise_pessimistic(cells: LossCells) -> DiscretePLD:
    """Connect-the-dots discretisation: delta(eps) >= truth for every eps."""
    h = cells.grid.h
    factor = 1.0 / -math.expm1(-h)  # e^h / (e^h - 1)
    right = np.minimum(factor * np.clip(cells.u_cell, 0.0, None), cells.p_cell)
    left = cells.p_cell - right
    pmf = np.zeros(cells.grid.n + 1)
    pmf[:-1] += left
    pmf[1:] += right
    pmf[0] += cells.p_left
    return DiscretePLD(
        h=h,
        offset=cells.grid.offset,
        pmf=pmf,
        p_inf=min(1.0, cells.p_right + cells.p_inf),
        loss_error=cells.loss_error,
        rel_error=cells.mass_error,
    )


def discretise_optimistic(cells: LossCells) -> DiscretePLD:
    """Merging discretisation: delta(eps) <= truth for every eps."""
    h = cells.grid.h
    if h > _FLOOR_ONLY_SPACING:
        # cells so wide that e^h overflows: round every loss down to its grid point
        # (optimistic by coupling; the relative error h / loss is then negligible)
        pmf = np.zeros(cells.grid.n + 1)
        pmf[:-1] = cells.p_cell
        pmf[-1] = cells.p_right
        return DiscretePLD(h=h, offset=cells.grid.offset, pmf=pmf, p_inf=float(cells.p_inf),
                           loss_error=cells.loss_error, rel_error=cells.mass_error)
    pmf = _merge_sweep(
        h,
        np.ascontiguousarray(cells.p_cell, dtype=np.float64),
        np.ascontiguousarray(cells.u_cell, dtype=np.float64),
        float(cells.p_left),
        float(cells.d_left),
        float(cells.p_right),
        float(cells.u_right),
    )
    return DiscretePLD(h=h, offset=cells.grid.offset, pmf=pmf, p_inf=float(cells.p_inf),
                           loss_error=cells.loss_error, rel_error=cells.mass_error)


@gated("merge")
@njit(cache=True)
def _merge_sweep(h, p_cell, u_cell, p_left, d_left, p_right, u_right):  # pragma: no cover - numba
    """Two merging sweeps that meet at a grid point m. Returns the pmf on n+1 points.

    Where the density increases the sweep must run left to right, where it
    decreases right to left: then the carried rest shrinks from cell to cell and
    balancing rarely fails (the other way round it fails every other cell). At m
    the two carries are balanced against each other and what is left against the
    atoms already placed nearby (:func:`_junction`); only what those cannot
    balance is rounded down.

    m minimises the *excess lost* to rounding, sum of P-mass x (loss it is moved
    down by), to first order the drop of the mean loss per step, which the T-fold
    composition multiplies by T. (Counting rounded P-mass instead puts m at a
    narrow peak at the bottom of the grid, e.g. the subsampled losses piled up just
    above log(1 - p), and rounds that whole peak down by ~h/2.)
    """
    n = p_cell.shape[0]
    em1 = math.expm1(h)
    eh = em1 + 1.0
    emh = -math.expm1(-h)  # 1 - e^{-h}
    # forward (left-to-right) pass. Carry into x_k: a fraction of cell k-1 (the left
    # tail for k = 0) with P-mass cp and deficit cd = x_k Q - P >= 0; cell k brings
    # excess u = P - x_k Q >= 0. Recorded: the carry and the excess lost before every
    # point, and the atoms each step places (a sweep stopped at m keeps those before m)
    left_lost = np.zeros(n + 1)
    left_cp = np.zeros(n + 1)
    left_cd = np.zeros(n + 1)
    fwd_atom = np.zeros(n + 1)  # placed at k by the step at k
    fwd_floor = np.zeros(n + 1)  # placed at k - 1 by the step at k
    cp = p_left
    cd = max(d_left, 0.0)
    lost = 0.0
    for k in range(n + 1):
        left_cp[k] = cp
        left_cd[k] = cd
        left_lost[k] = lost
        if k == n:
            break
        p = p_cell[k]
        u = min(max(u_cell[k], 0.0), p)
        if cd <= u:
            theta = cd / u if u > 0.0 else 0.0
            fwd_atom[k] = cp + theta * p
            rest = 1.0 - theta
            cp = rest * p
            cd = rest * max(em1 * p - eh * u, 0.0)
        else:
            phi = u / cd
            fwd_atom[k] = phi * cp + p
            fwd_floor[k] = (1.0 - phi) * cp
            # rounded from its ratio (in [x_{k-1}, x_k]) down to x_{k-1}
            lost += (1.0 - phi) * max(emh * cp - (1.0 - emh) * cd, 0.0)
            cp = 0.0
            cd = 0.0
    # backward (right-to-left) pass. Carry into x_k: a fraction of cell k (the right
    # tail for k = n) with P-mass rp and excess re = P - x_k Q >= 0; cell k-1 brings
    # deficit a = (e^h - 1) p - e^h u. Recorded: the carry after every point, the
    # excess lost above it, and the atom each step places
    right_cp = np.zeros(n + 1)
    right_re = np.zeros(n + 1)
    right_lost = np.zeros(n + 1)
    bwd_atom = np.zeros(n + 1)
    rp = p_right
    re = min(max(u_right, 0.0), p_right)
    lost = 0.0
    right_cp[n] = rp
    right_re[n] = re
    for k in range(n, 0, -1):
        p = p_cell[k - 1]
        u = min(max(u_cell[k - 1], 0.0), p)
        a = max(em1 * p - eh * u, 0.0)
        if re <= a:
            theta = re / a if a > 0.0 else 0.0
            bwd_atom[k] = rp + theta * p
            rest = 1.0 - theta
            rp = rest * p
            re = rest * u
        else:
            # all of cell k-1 balances part of the carry; the rest (ratio > x_k) stays
            # at x_k, rounded down: its excess is lost
            bwd_atom[k] = rp + p
            lost += re - a
            rp = 0.0
            re = 0.0
        right_lost[k - 1] = lost
        right_cp[k - 1] = rp
        right_re[k - 1] = re
    best = n - n  # not the literal 0: numba would compile _junction for Literal[int](0) as well
    best_cost = math.inf
    for m in range(n + 1):
        cost = left_lost[m] + right_lost[m]
        if cost >= best_cost:
            continue
        cost += _junction_loss(h, m, left_cp[m], left_cd[m], right_cp[m], right_re[m], fwd_atom, fwd_floor,
                               bwd_atom)
        if cost < best_cost:
            best_cost = cost
            best = m
    m = best
    # the forward sweep's atoms below m (a rounded rest goes to the point below its step;
    # at k = 0 there is none and it is dropped, which only lowers delta), the backward
    # sweep's above m, and the junction at m
    pmf = np.zeros(n + 1)  # element loops, not slice assignment: numba compiles them ~5 s faster
    for k in range(m):
        pmf[k] = fwd_atom[k]
    for k in range(1, m):
        pmf[k - 1] += fwd_floor[k]
    for k in range(m + 1, n + 1):
        pmf[k] = bwd_atom[k]
    _junction(h, m, left_cp[m], left_cd[m], right_cp[m], right_re[m], pmf)
    return pmf


@njit(cache=True)
def _junction_loss(h, m, cp, cd, rp, re, fwd_atom, fwd_floor, bwd_atom):  # pragma: no cover - numba
    """Mean loss that :func:`_junction` at x_m would lose, given the atoms the sweeps
    meeting at m place (forward below m, backward above m): the excess it rounds
    down, plus ~ c d / 2 for each excess c it balances against an atom at distance d
    (merging what lies d apart loses that much to second order)."""
    n = bwd_atom.shape[0] - 1
    merged = 0.0
    if cd <= re:
        excess = re - cd
        for j in range(m - 1, max(m - 1 - _JUNCTION_REACH, -1), -1):
            if excess <= 0.0:
                return merged
            atom = fwd_atom[j] + (fwd_floor[j + 1] if j + 1 < m else 0.0)
            used = min(atom * math.expm1((m - j) * h), excess)
            merged += 0.5 * used * (m - j) * h
            excess -= used
        return merged + max(excess, 0.0)
    phi = re / cd
    deficit = (1.0 - phi) * cd
    for j in range(m + 1, min(m + 1 + _JUNCTION_REACH, n + 1)):
        if deficit <= 0.0:
            return merged
        used = min(bwd_atom[j] * -math.expm1(-(j - m) * h), deficit)
        merged += 0.5 * used * (j - m) * h
        deficit -= used
    if deficit <= 0.0:
        return merged
    # the unbalanced share of the left carry rounds down to x_{m-1}
    share = deficit / ((1.0 - phi) * cd)
    emh = -math.expm1(-h)
    return merged + share * (1.0 - phi) * max(emh * cp - (1.0 - emh) * cd, 0.0)


#: How far from the meeting point the junction looks for atoms to balance against.
_JUNCTION_REACH = 64


@njit(cache=True)
def _junction(h, m, cp, cd, rp, re, pmf):  # pragma: no cover - numba
    """Merge the two carries at x_m, balancing what is left against placed atoms.

    The left carry (P-mass cp, deficit cd = x_m Q - P) and the right carry (rp,
    excess re = P - x_m Q) are merged into an atom at x_m as far as they balance.
    What is left would have to be rounded down (first-order in h). Instead it is
    balanced against atoms the sweeps already placed, which are themselves merges
    of original outcomes with ratio >= their grid point: an atom of P-mass A at
    x_j, j < m, has deficit at most A (x_m / x_j - 1) at x_m (at most: a rounded-
    down atom has less Q than A / x_j), one at x_j, j > m, excess at least
    A (1 - x_m / x_j). Merging part of it with the leftover carry gives a group
    whose ratio is >= x_m; placing it at x_m is a merge (a garbling) followed at
    most by rounding down, so the result stays dominated by the truth. Only what
    no atom within ``_JUNCTION_REACH`` points balances is rounded down.
    """
    n = pmf.shape[0] - 1
    if cd <= re:
        excess = re - cd  # left by the merged carries; balance it with atoms below m
        pmf[m] += cp + rp
        for j in range(m - 1, max(m - 1 - _JUNCTION_REACH, -1), -1):
            if excess <= 0.0:
                break
            per_mass = math.expm1((m - j) * h)  # deficit per unit P-mass at x_m
            take = min(pmf[j], excess / per_mass)
            pmf[j] -= take
            pmf[m] += take
            excess -= take * per_mass
        # the unbalanced rest of the right carry (ratio in [x_m, x_{m+1}]) stays at x_m: rounded down
        return
    phi = re / cd
    pmf[m] += phi * cp + rp
    left_p = (1.0 - phi) * cp
    deficit = (1.0 - phi) * cd
    for j in range(m + 1, min(m + 1 + _JUNCTION_REACH, n + 1)):
        if deficit <= 0.0:
            break
        per_mass = -math.expm1(-(j - m) * h)  # excess per unit P-mass at x_m
        take = min(pmf[j], deficit / per_mass)
        pmf[j] -= take
        pmf[m] += take
        deficit -= take * per_mass
    if deficit > 0.0 and (1.0 - phi) * cd > 0.0:
        # the unbalanced share of the left carry (ratio in [x_{m-1}, x_m]) rounds down
        share = deficit / ((1.0 - phi) * cd)
        pmf[m] += (1.0 - share) * left_p
        if m > 0:
            pmf[m - 1] += share * left_p
        # (m = 0: the left tail has no point below; dropping P-mass only lowers delta)
    else:
        pmf[m] += left_p
