"""Privacy losses with atoms: binning point masses, and finite discrete pairs.

Shared by the mechanisms whose privacy loss has atoms (Laplace, randomized
response, :class:`~fdp.mechanisms.discrete.FromDistributions`,
:class:`~fdp.mechanisms.from_delta.FromDelta`).

Binning an atom (see :mod:`fdp.pld.cells` for the fields). An atom of P-mass m
at finite loss l is an outcome with likelihood ratio dP/dQ = e^l, so its
Q-mass is m e^{-l}. It belongs to cell k when ell_k <= l < ell_{k+1} (the
last cell also takes l = ell_n), where it contributes

    p_cell[k] += m,    u_cell[k] += m - e^{ell_k} m e^{-l} = m (1 - e^{ell_k - l}),

(the exact excess over the left grid point, computed with ``-expm1``); below
the grid, p_left += m and d_left += m (e^{ell_0 - l} - 1); above it,
p_right += m and u_right += m (1 - e^{ell_n - l}); at l = +inf, p_inf += m.
An atom on an interior grid point could sit in either neighbouring cell (the
discretisations read only (p, u), and both say "all mass at that point"); as
the left end of its cell (u = 0) it is kept in place by the merging
(optimistic) sweep, so a grid through the atoms gives exact bounds.
Atoms at l = -inf have no P-mass and are ignored.

Discrete pairs. With output laws P0 (without the individual) and P1 (with it)
on a finite set, and Poisson sampling rate p, write r_i = log(P1_i / P0_i) for
outcome i. The two neighbouring relations of :mod:`fdp.mechanisms.base` give

    remove: P_i = (1-p) P0_i + p P1_i,  Q_i = P0_i,
            L_i = log(P_i / Q_i) = log(1 - p + p e^{r_i}),                  (1)
    add:    P_i = P0_i,  Q_i = (1-p) P0_i + p P1_i,   L_i = -log(1 - p + p e^{r_i}),

evaluated as ``logaddexp(log(1-p), log(p) + r_i)`` from the log-masses, so that
neither e^{r_i} nor tiny masses overflow or underflow. Outcomes with Q_i = 0 <
P_i carry L = +inf (the p_inf atom); outcomes with P_i = 0 carry no P-mass.

Notation: m = P-mass of an atom, l its loss, ell_k the grid points.
"""

from __future__ import annotations

import math

import numpy as np

from fdp.pld.cells import Direction, Grid, LossCells
from fdp.pld.roundoff import U

__all__ = ["atom_cells", "add_cells", "atom_loss_range", "pair_atoms", "pair_cells", "pair_loss_error",
           "pair_loss_range", "pair_mass_error"]

#: Relative widening of a loss range whose ends are atoms, so that rounding in
#: ``Grid.covering`` can never push the top atom off the grid (it would then be
#: charged to +inf, a large and needless overestimate).
RANGE_MARGIN = 1e-12


def atom_cells(grid: Grid, losses: np.ndarray, masses: np.ndarray, p_inf: float = 0.0,
               loss_error: float = 0.0, mass_error: float = 0.0) -> LossCells:
    """Cells of a privacy loss made of atoms (P-masses ``masses`` at ``losses``) plus ``p_inf``.

    Vectorised: one ``searchsorted`` for the cell index and ``bincount`` sums.

    Args:
      grid: the loss grid.
      losses: 1-D array of atom losses (finite or +-inf).
      masses: 1-D array of P-masses >= 0, same length.
      p_inf: extra P-mass at +inf.
      loss_error: a bound on |true loss - ``losses``| of every atom (carried in the cells).
      mass_error: a bound on the relative error of every mass (carried in the cells).

    Returns:
      LossCells; atoms at +inf are added to p_inf, atoms at -inf dropped.
    """
    losses = np.asarray(losses, dtype=np.float64).ravel()
    masses = np.asarray(masses, dtype=np.float64).ravel()
    p_inf = float(p_inf) + float(np.sum(masses[np.isposinf(losses)]))
    keep = np.isfinite(losses) & (masses > 0.0)
    loss, mass = losses[keep], masses[keep]
    pts = grid.points
    n = grid.n
    # pts[idx-1] <= loss < pts[idx]: an atom on a grid point is the left end of its cell
    # (u = 0), except on the last point, where it is the right end of the last cell
    idx = np.searchsorted(pts, loss, side="right")
    idx = np.where(loss == pts[-1], n, idx)
    left, right = idx == 0, idx == n + 1
    inside = ~left & ~right
    k = idx[inside] - 1
    with np.errstate(over="ignore"):
        u_atom = mass[inside] * -np.expm1(pts[k] - loss[inside])
        d_left = float(np.sum(mass[left] * np.expm1(pts[0] - loss[left])))
    u_right = float(np.sum(mass[right] * -np.expm1(pts[n] - loss[right])))
    return LossCells(
        grid=grid,
        p_cell=np.bincount(k, weights=mass[inside], minlength=n).astype(np.float64),
        u_cell=np.bincount(k, weights=u_atom, minlength=n).astype(np.float64),
        p_left=float(np.sum(mass[left])),
        d_left=max(d_left, 0.0),
        p_right=float(np.sum(mass[right])),
        u_right=max(u_right, 0.0),
        p_inf=p_inf,
        loss_error=float(loss_error),
        mass_error=float(mass_error),
    )


def add_cells(a: LossCells, b: LossCells) -> LossCells:
    """The cells of the sum of two (sub-probability) P-measures on the same grid."""
    if a.grid != b.grid:
        raise ValueError("cannot add LossCells on different grids")
    return LossCells(
        grid=a.grid,
        p_cell=a.p_cell + b.p_cell,
        u_cell=a.u_cell + b.u_cell,
        p_left=a.p_left + b.p_left,
        d_left=a.d_left + b.d_left,
        p_right=a.p_right + b.p_right,
        u_right=a.u_right + b.u_right,
        p_inf=a.p_inf + b.p_inf,
        loss_error=max(a.loss_error, b.loss_error),
        mass_error=max(a.mass_error, b.mass_error),
    )


def atom_loss_range(losses: np.ndarray, masses: np.ndarray, tail_mass: float) -> tuple[float, float]:
    """(lo, hi) with P(L < lo) <= tail_mass and P(hi < L < inf) <= tail_mass, for atoms.

    The atoms are sorted by loss; lo is the first loss at which the cumulative
    mass from below exceeds ``tail_mass``, hi the last at which the cumulative
    mass from above does. Both are widened by :data:`RANGE_MARGIN` (relative).
    (0, 0) when no finite atom has mass.
    """
    losses = np.asarray(losses, dtype=np.float64).ravel()
    masses = np.asarray(masses, dtype=np.float64).ravel()
    keep = np.isfinite(losses) & (masses > 0.0)
    if not np.any(keep):
        return 0.0, 0.0
    order = np.argsort(losses[keep], kind="stable")
    loss, mass = losses[keep][order], masses[keep][order]
    below = np.cumsum(mass)  # mass of atoms 0..j
    above = np.cumsum(mass[::-1])[::-1]  # mass of atoms j..end
    i_lo = int(np.argmax(below > tail_mass)) if np.any(below > tail_mass) else 0
    big = np.nonzero(above > tail_mass)[0]
    i_hi = int(big[-1]) if big.size else loss.size - 1
    lo, hi = float(loss[i_lo]), float(loss[max(i_hi, i_lo)])
    return lo - RANGE_MARGIN * max(1.0, abs(lo)), hi + RANGE_MARGIN * max(1.0, abs(hi))


def pair_atoms(
    log_p0: np.ndarray, log_p1: np.ndarray, p: float, direction: Direction
) -> tuple[np.ndarray, np.ndarray]:
    """(losses, P-masses) of equation (1) for a discrete pair given by its log-masses.

    Args:
      log_p0, log_p1: 1-D arrays of log P0_i and log P1_i (-inf for zero mass).
      p: sampling rate in (0, 1].
      direction: REMOVE or ADD.

    Returns:
      losses (+inf where Q_i = 0 < P_i) and P-masses, one per outcome; outcomes
      without P-mass get mass 0 (and loss -inf or nan; ignored by the binning).
    """
    lp0 = np.asarray(log_p0, dtype=np.float64)
    lp1 = np.asarray(log_p1, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        r = lp1 - lp0  # +inf where P0 = 0 < P1, -inf where P1 = 0 < P0, nan where both 0
    if p == 1.0:
        lam = r
        log_mix = lp1
    else:
        log1mp, logp = np.log1p(-p), np.log(p)
        with np.errstate(invalid="ignore"):
            lam = np.logaddexp(log1mp, logp + r)
        log_mix = np.logaddexp(log1mp + lp0, logp + lp1)
    if Direction(direction) is Direction.REMOVE:
        loss, log_mass = lam, log_mix
    else:
        loss, log_mass = -lam, lp0
    mass = np.exp(log_mass)
    loss = np.where(mass > 0.0, loss, -np.inf)
    return loss, mass


def pair_loss_error(log_p0: np.ndarray, log_p1: np.ndarray, p: float) -> float:
    """A bound on |computed - exact| of every finite loss of :func:`pair_atoms`.

    The log-masses are within 4u (|log P_i| + 1) of the exact ones (each is a log or a
    log-sum of the mechanism's parameters); r = lp1 - lp0 adds u |r|; logaddexp(a, b) =
    max + log1p(e^-|a-b|) has slope <= 1 in each input and adds <= 4u (|result| + 1);
    log(p) and log1p(-p) are within u of theirs. 16u times the sum of those magnitudes
    (plus 2) over the atoms covers every term, with room to spare.
    """
    lp0 = np.asarray(log_p0, dtype=np.float64)
    lp1 = np.asarray(log_p1, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        r = lp1 - lp0
        lam = r if p == 1.0 else np.logaddexp(np.log1p(-p), np.log(p) + r)
    size = np.abs(lp0) + np.abs(lp1) + np.abs(r) + np.abs(lam)
    size = size[np.isfinite(size)]
    if size.size == 0:
        return 0.0
    logs = 0.0 if p == 1.0 else abs(math.log(p)) + abs(math.log1p(-p))
    return 16.0 * U * (float(np.max(size)) + logs + 2.0)


def pair_mass_error(log_p0: np.ndarray, log_p1: np.ndarray, p: float) -> float:
    """A bound on the relative error of every P-mass of :func:`pair_atoms`, exp(log-mass),
    in either direction: exp turns an absolute error e of the log-mass into a relative
    one e^e - 1 (+ u of its own), and the log-mass is within 16u (s + 2) of the exact one:
    s = |lp| for a log-mass lp of the mechanism (lp0: add; lp1: remove at p = 1), and for
    a remove log-mass at p < 1, lm = logaddexp(a, b), a = log(1-p) + lp0, b = log(p) + lp1,
    s = w0 |lp0| + w1 |lp1| + |lm| + |log p| + |log(1-p)|: its inputs' errors (each within
    e = 8u (|lp0| + |lp1| + |log p| + |log(1-p)| + 2)) move it by their slopes, which stay
    below w0 = min(1, e^{a - lm + e}) and w1 = min(1, e^{b - lm + e}) on the way.
    A term e^-1e50 times the other then carries none of its error: with |lp| ~ 1e50
    (Laplace at scale 1e-50) the old bound, e^{16u |lp|}, overflowed. Masses that exp
    flushes to 0 (log-mass < -745) are left out: the binning drops them, exact values
    below 5e-324. Found by the red team: a single step's delta near P0 = 1e-35 at
    e^eps Q0 = 1e-9 P0 cancels 9 digits, so the masses' few-ulp error moved eps by 3e-6."""
    lp0 = np.asarray(log_p0, dtype=np.float64).ravel()
    lp1 = np.asarray(log_p1, dtype=np.float64).ravel()
    logs = 0.0 if p == 1.0 else abs(math.log(p)) + abs(math.log1p(-p))
    with np.errstate(invalid="ignore", over="ignore"):
        if p == 1.0:
            log_mass, size = np.concatenate([lp0, lp1]), np.abs(np.concatenate([lp0, lp1]))
        else:
            a, b = math.log1p(-p) + lp0, math.log(p) + lp1
            lm = np.logaddexp(a, b)
            e = 8.0 * U * (np.where(np.isfinite(lp0), np.abs(lp0), 0.0) + np.where(np.isfinite(lp1), np.abs(lp1), 0.0)
                           + logs + 2.0)
            w0, w1 = np.exp(np.minimum(a - lm + e, 0.0)), np.exp(np.minimum(b - lm + e, 0.0))
            mixed = np.where(w0 > 0.0, w0 * np.abs(lp0), 0.0) + np.where(w1 > 0.0, w1 * np.abs(lp1), 0.0)
            log_mass = np.concatenate([lp0, lm])  # add masses, remove masses
            size = np.concatenate([np.abs(lp0), mixed + np.abs(lm) + logs])
    kept = size[np.exp(log_mass) > 0.0]
    if kept.size == 0:
        return 2.0 * U
    return math.expm1(16.0 * U * (float(np.max(kept)) + 2.0)) + 2.0 * U


def largest_atom(log_p0: np.ndarray, log_p1: np.ndarray, p: float, direction: Direction) -> float | None:
    """The finite non-zero loss of largest |value| carrying P-mass (a grid anchor), or None."""
    loss, mass = pair_atoms(log_p0, log_p1, p, direction)
    loss = loss[(mass > 0.0) & np.isfinite(loss) & (loss != 0.0)]
    return float(loss[np.argmax(np.abs(loss))]) if loss.size else None


def pair_loss_range(
    log_p0: np.ndarray, log_p1: np.ndarray, p: float, direction: Direction, tail_mass: float
) -> tuple[float, float]:
    """:func:`atom_loss_range` of :func:`pair_atoms`."""
    loss, mass = pair_atoms(log_p0, log_p1, p, direction)
    return atom_loss_range(loss, mass, tail_mass)


def pair_cells(
    log_p0: np.ndarray, log_p1: np.ndarray, p: float, direction: Direction, grid: Grid
) -> LossCells:
    """Exact cells of a discrete pair's privacy loss (equation (1) binned by :func:`atom_cells`)."""
    loss, mass = pair_atoms(log_p0, log_p1, p, direction)
    return atom_cells(grid, loss, mass, loss_error=pair_loss_error(log_p0, log_p1, p),
                      mass_error=pair_mass_error(log_p0, log_p1, p))
