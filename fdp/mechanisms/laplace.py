"""The (Poisson-subsampled) Laplace mechanism, and its exact tradeoff curve.

One step adds Lap(0, b) noise (density e^{-|x|/b} / (2b)) to a sum of
sensitivity 1, so its output laws are P0 = Lap(0, b) and P1 = Lap(1, b).

Log-likelihood ratio. With mu = 1/b,

    g(x) = log(dP1/dP0)(x) = (|x| - |x - 1|) / b
         = -mu                 for x <= 0          (region A)
         = (2x - 1) / b        for 0 < x < 1       (region C, increasing)
         = +mu                 for x >= 1          (region B).

The loss is constant on A and B: atoms. Their masses are

    P0(A) = 1/2,  P0(B) = e^{-mu}/2,   P1(A) = e^{-mu}/2,  P1(B) = 1/2,

and on C, for 0 <= a <= c <= 1 (integrate the densities),

    P0((a, c]) = (e^{-a/b} - e^{-c/b}) / 2 = e^{-a/b} (1 - e^{-(c-a)/b}) / 2,
    P1((a, c]) = (e^{(c-1)/b} - e^{(a-1)/b}) / 2 = e^{(c-1)/b} (1 - e^{-(c-a)/b}) / 2.   (1)

Subsampling at rate p (pairs of :mod:`fdp.mechanisms.base`):

    remove: L(x) =  lam(g(x)),  X ~ (1-p) P0 + p P1,   lam(g) = log(1 - p + p e^g),
    add:    L(x) = -lam(g(x)),  X ~ P0.

lam is increasing, so on C the remove loss increases and the add loss
decreases in x; a loss grid's cells are x-intervals with end points

    xi(ell) = clip((1 + b gam(ell)) / 2, 0, 1),   gam(ell) = log((e^ell - (1-p)) / p)   (2)

(the x where lam(g(x)) = ell; gam = -inf below the smallest loss log(1-p)).
The remove cell (ell_k, ell_{k+1}] is x in (xi(ell_k), xi(ell_{k+1})]; the add
cell is x in [xi(-ell_{k+1}), xi(-ell_k)). Masses come from (1) in log space,
and the cell excess u = P - e^{ell_k} Q is

    remove: u = p P1(cell) - (e^{ell_k} - (1-p)) P0(cell),
    add:    u = (1 - (1-p) e^{ell_k}) P0(cell) - p e^{ell_k} P1(cell).

The atoms A and B form a two-point discrete pair and are binned exactly by
:func:`fdp.mechanisms._atoms.pair_atoms` (each atom's u uses its exact loss).
Nothing is approximated: the cells are exact for both directions.

Tradeoff curve (no subsampling). The likelihood ratio is non-decreasing in x,
so the Neyman-Pearson tests of P0 against P1 reject for x > t (randomising on
the flat regions A, B, which traces straight segments). Normalising to
Lap(0, 1) against Lap(mu, 1) (Dong-Roth-Su, arXiv:1905.02383v3, Section 2.4):

    t >= mu:     alpha = e^{-t}/2,     beta = 1 - e^{-(t-mu)}/2 = 1 - e^mu alpha,
    0 <= t <= mu: alpha = e^{-t}/2,     beta = e^{t-mu}/2       = e^{-mu} / (4 alpha),
    t <= 0:      alpha = 1 - e^t/2,    beta = e^{t-mu}/2       = e^{-mu} (1 - alpha),

hence

    f(alpha) = 1 - e^mu alpha             for 0 <= alpha <= e^{-mu}/2,
             = e^{-mu} / (4 alpha)        for e^{-mu}/2 <= alpha <= 1/2,          (3)
             = e^{-mu} (1 - alpha)        for 1/2 <= alpha <= 1.

Its dual (sup_alpha 1 - f(alpha) - e^eps alpha; the middle branch is touched
at alpha = e^{-(mu+eps)/2}/2 when |eps| <= mu) is

    delta(eps) = max(0, 1 - e^{(eps - mu)/2})          for eps >= 0.              (4)

The curve is symmetric (x -> 1 - x swaps P0 and P1), so f^-1 = f.

Notation: b = scale, mu = 1/b, p = sampling_rate, ell_k grid losses, x the
noisy output; A, B, C the regions above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fdp._numerics import log1mexp, logsubexp
from fdp._validation import check_array, check_real, check_sampling_rate
from fdp.mechanisms._atoms import RANGE_MARGIN, add_cells, atom_cells, pair_atoms, pair_loss_error, pair_mass_error
from fdp.mechanisms.base import MAX_STEP_LOSS, Mechanism, register_mechanism
from fdp.pld.cells import Direction, Grid, LossCells
from fdp.tradeoff.base import TradeoffCurve, _as_output

__all__ = ["Laplace", "LaplaceCurve", "laplace_curve"]

_LOG_HALF = -math.log(2.0)
#: Above this loss (1 - p) e^-ell < 1e-304 is lost next to 1 in e^ell - (1 - p).
_BIG_LOSS = 700.0


# ---------------------------------------------------------------- the curve
@dataclass(frozen=True)
class LaplaceCurve(TradeoffCurve):
    """f = T(Lap(0, 1) || Lap(mu, 1)), equation (3) of :mod:`fdp.mechanisms.laplace`.

    Args:
      mu: the shift over the scale (sensitivity / b), mu >= 0.

    Raises:
      ValueError: mu negative, NaN or infinite.
    """

    mu: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "mu", check_real("mu", self.mu, low=0.0))

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        return 1.0 - self._evaluate_complement(alpha)

    def _evaluate_complement(self, alpha: np.ndarray) -> np.ndarray:
        """1 - f(alpha), branch by branch without cancellation."""
        mu = self.mu
        a = np.asarray(alpha, dtype=np.float64)
        with np.errstate(divide="ignore", over="ignore"):
            steep = np.exp(mu + np.log(a))  # e^mu alpha
            middle = -np.expm1(-mu - np.log(4.0 * a))  # 1 - e^{-mu}/(4 alpha)
        flat = -np.expm1(-mu) + np.exp(-mu) * a  # 1 - e^{-mu}(1 - alpha)
        knee = 0.5 * math.exp(-mu)
        out = np.where(a <= knee, steep, np.where(a <= 0.5, middle, flat))
        return np.clip(out, 0.0, 1.0)

    def _vertices(self) -> np.ndarray:
        return np.array([0.5 * math.exp(-self.mu), 0.5])

    def inverse(self) -> "LaplaceCurve":
        """The curve is symmetric (x -> 1 - x swaps the pair): f^-1 = f."""
        return self

    def symmetrized(self) -> "LaplaceCurve":
        return self

    def delta(self, epsilon: Any) -> float | np.ndarray:
        """delta(eps) = max(0, 1 - e^{(eps - mu)/2}), equation (4) (exact).

        Raises:
          ValueError: epsilon NaN, infinite or negative.
        """
        eps = check_array("epsilon", epsilon, low=0.0)
        return _as_output(self._delta_values(eps.ravel()), eps)

    def _delta_values(self, eps: np.ndarray) -> np.ndarray:
        return np.clip(-np.expm1(0.5 * (np.asarray(eps, dtype=np.float64) - self.mu)), 0.0, 1.0)

    def _epsilon_upper_bracket(self, delta: np.ndarray) -> np.ndarray:
        # (4) inverted: delta(eps) = d at eps = mu + 2 log(1 - d); a hair above it.
        eps = self.mu + 2.0 * np.log1p(-np.asarray(delta, dtype=np.float64))
        return np.maximum(eps, 0.0) * (1.0 + 1e-12) + 1e-300


def laplace_curve(mu: float) -> LaplaceCurve:
    """The Laplace tradeoff curve T(Lap(0, 1) || Lap(mu, 1)); see :class:`LaplaceCurve`."""
    return LaplaceCurve(mu=mu)


# ------------------------------------------------------------------- cells
def _log_interval_masses(a: np.ndarray, c: np.ndarray, b: float) -> tuple[np.ndarray, np.ndarray]:
    """(log P0((a, c]), log P1((a, c])) of equation (1), for 0 <= a <= c <= 1."""
    w = np.maximum(c - a, 0.0)
    l1m = log1mexp(-w / b)  # log(1 - e^{-(c-a)/b}); -inf for an empty interval
    return _LOG_HALF - a / b + l1m, _LOG_HALF + (c - 1.0) / b + l1m


def _xi(ell: np.ndarray, b: float, p: float) -> np.ndarray:
    """x where the remove loss crosses ell, equation (2), clipped to [0, 1]."""
    ell = np.asarray(ell, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        excess = np.expm1(np.minimum(ell, _BIG_LOSS)) + p  # e^ell - (1 - p)
        gam = np.where(excess > 0.0, np.log(excess) - math.log(p), -np.inf)
        # e^ell overflows above 709 (scale < 1/709): there log(e^ell - (1-p)) = ell exactly
        # (else every loss above 709 was binned at 709: delta(9000) of 10 steps at
        # scale 1e-3 came out 0.17, truth ~1)
        gam = np.where(ell > _BIG_LOSS, ell - math.log(p), gam)
        x = 0.5 * (1.0 + b * gam)
    return np.clip(np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)


def _signed_log(log_pos: np.ndarray, log_neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sign, log|e^{log_pos} - e^{log_neg}|) elementwise."""
    sign = np.where(log_pos >= log_neg, 1.0, -1.0)
    hi, lo = np.maximum(log_pos, log_neg), np.minimum(log_pos, log_neg)
    return sign, logsubexp(hi, lo)


def _times_exp(sign: np.ndarray, log_a: np.ndarray, log_b: np.ndarray) -> np.ndarray:
    """sign * e^{log_a + log_b}, 0 where either factor is 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = log_a + log_b
    return np.where(np.isneginf(log_a) | np.isneginf(log_b), 0.0, sign * np.exp(s))


def _continuous_cells(b: float, p: float, direction: Direction, grid: Grid) -> LossCells:
    """Cells of the region-C part (0 < x < 1) of the P-measure."""
    ell = grid.points
    log1mp = math.log1p(-p) if p < 1.0 else -math.inf
    logp = math.log(p)
    # n + 2 intervals: left tail, the n cells, right tail; ref = their reference loss
    ref = np.concatenate([ell[:1], ell[:-1], ell[-1:]])
    if direction is Direction.REMOVE:
        t = _xi(ell, b, p)  # non-decreasing
        lo = np.concatenate([[0.0], t])
        hi = np.concatenate([t, [1.0]])
        l0, l1 = _log_interval_masses(lo, hi, b)
        log_mass = np.logaddexp(log1mp + l0, logp + l1)
        # u = p P1 - (e^ref - (1-p)) P0
        sign, log_coef = _signed_log(ref, np.full_like(ref, log1mp))
        excess = _times_exp(np.ones_like(ref), np.full_like(ref, logp), l1) - _times_exp(sign, log_coef, l0)
    else:
        t = _xi(-ell, b, p)  # non-increasing
        lo = np.concatenate([t[:1], t[1:], [0.0]])
        hi = np.concatenate([[1.0], t[:-1], t[-1:]])
        l0, l1 = _log_interval_masses(lo, hi, b)
        log_mass = l0
        # u = (1 - (1-p) e^ref) P0 - p e^ref P1
        sign, log_coef = _signed_log(np.zeros_like(ref), log1mp + ref)
        excess = _times_exp(sign, log_coef, l0) - _times_exp(np.ones_like(ref), logp + ref, l1)
    mass = np.exp(log_mass)
    return LossCells(
        grid=grid,
        p_cell=mass[1:-1],
        u_cell=np.clip(excess[1:-1], 0.0, None),
        p_left=float(mass[0]),
        d_left=max(-float(excess[0]), 0.0),
        p_right=float(mass[-1]),
        u_right=max(float(excess[-1]), 0.0),
    )


def _atom_log_masses(mu: float) -> tuple[np.ndarray, np.ndarray]:
    """(log P0, log P1) of the regions A and B."""
    return np.array([_LOG_HALF, _LOG_HALF - mu]), np.array([_LOG_HALF - mu, _LOG_HALF])


def laplace_cells(b: float, p: float, direction: Direction, grid: Grid) -> LossCells:
    """Exact cells of the subsampled Laplace privacy loss (atoms A, B plus region C)."""
    direction = Direction(direction)
    lp0, lp1 = _atom_log_masses(1.0 / b)
    loss, mass = pair_atoms(lp0, lp1, p, direction)
    atoms = atom_cells(grid, loss, mass, loss_error=pair_loss_error(lp0, lp1, p),
                       mass_error=pair_mass_error(lp0, lp1, p))
    return add_cells(atoms, _continuous_cells(b, p, direction, grid))


@register_mechanism
@dataclass(frozen=True)
class Laplace(Mechanism):
    """Laplace mechanism with noise scale ``scale`` (sensitivity 1), Poisson-subsampled.

    Output laws P0 = Lap(0, b), P1 = Lap(1, b) with b = ``scale``. The privacy
    loss lies in [-1/b, 1/b] (at p = 1) with atoms at both ends, each holding
    half of the P-mass or e^{-1/b}/2 of it; cells are exact (see the module
    docstring for the derivation). The unsubsampled tradeoff curve is
    :class:`LaplaceCurve` with mu = 1/b, whose delta is
    delta(eps) = max(0, 1 - e^{(eps - 1/b)/2}).

    Args:
      scale: b in [1e-300, inf) (the loss 1/b stays within float64 range).
      sampling_rate: Poisson sampling rate p in (0, 1].

    Raises:
      ValueError: scale not a finite number >= 1e-300, or sampling_rate outside (0, 1].

    Examples:
      >>> import fdp
      >>> acc = fdp.PLDAccountant().compose(fdp.Laplace(scale=2.0), steps=1)
      >>> lo, hi = acc.get_delta_bounds(epsilon=0.25)   # exact: 1 - e^{-1/8} = 0.1175
    """

    scale: float
    sampling_rate: float = 1.0
    kind = "laplace"
    exact_cells = True

    def __post_init__(self) -> None:
        # mu = 1 / scale is the step's largest loss (MAX_STEP_LOSS: float64 room)
        object.__setattr__(self, "scale", check_real("scale", self.scale, low=1.0 / MAX_STEP_LOSS))
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))

    @property
    def mu(self) -> float:
        """1 / scale: the sensitivity in units of the scale."""
        return 1.0 / self.scale

    def is_symmetric(self) -> bool:
        return True

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        """Exact cells (the same for ``pessimistic`` True and False)."""
        return laplace_cells(self.scale, self.sampling_rate, Direction(direction), grid)

    def grid_anchor(self, direction: Direction) -> float | None:
        """The atom of largest |loss|: lam(mu) (remove) or -lam(-mu) (add)."""
        p, mu = self.sampling_rate, self.mu
        ends = np.array([-mu, mu])
        lam = ends if p == 1.0 else np.logaddexp(math.log1p(-p), math.log(p) + ends)
        loss = lam if Direction(direction) is Direction.REMOVE else -lam
        a = float(loss[np.argmax(np.abs(loss))])
        return a if a != 0.0 and math.isfinite(a) else None

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        """The whole (bounded) support of the loss: [lam(-mu), lam(mu)] or its negative."""
        p, mu = self.sampling_rate, self.mu
        ends = np.array([-mu, mu])  # g on A and on B
        lam = ends if p == 1.0 else np.logaddexp(math.log1p(-p), math.log(p) + ends)
        loss = lam if Direction(direction) is Direction.REMOVE else -lam
        lo, hi = float(np.min(loss)), float(np.max(loss))
        return lo - RANGE_MARGIN * max(1.0, abs(lo)), hi + RANGE_MARGIN * max(1.0, abs(hi))

    def tradeoff(self) -> LaplaceCurve:
        return LaplaceCurve(mu=self.mu)
