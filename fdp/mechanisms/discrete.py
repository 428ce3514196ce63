"""Mechanisms with finitely many outputs: randomized response and a generic pair.

Both are a pair of discrete output laws P0 (without the individual) and P1
(with it) on the same finite set. Their privacy losses are finitely many atoms,
binned exactly by :mod:`fdp.mechanisms._atoms` (equation (1) there gives the
loss of each outcome for both neighbouring relations under Poisson sampling at
rate p). The unsubsampled tradeoff curve f = T(P0 || P1) is the exact
Neyman-Pearson polygon of the pair
(:meth:`fdp.PiecewiseLinearCurve.from_privacy_loss_atoms`).

Randomized response (binary, parameter eps0 >= 0):

    P0 = (P0(1), P0(0)) = (1, e^eps0) / (1 + e^eps0),
    P1 = (P1(1), P1(0)) = (e^eps0, 1) / (1 + e^eps0),

so r = log(P1/P0) = +eps0 on output 1 and -eps0 on output 0: the unsubsampled
loss is +eps0 with P1-mass e^eps0/(1+e^eps0) and -eps0 with 1/(1+e^eps0). Its
delta is

    delta(eps) = sum_i (P1_i - e^eps P0_i)_+ = max(0, (e^eps0 - e^eps) / (1 + e^eps0)),

which is the dual of the (eps0, 0)-DP curve (Dong-Roth-Su, arXiv:1905.02383v3,
Prop. 2.5 and the remark after it: randomized response attains f_{eps0,0}).
The log-masses are taken as -log(1 + e^eps0) = -logaddexp(0, eps0) and
eps0 - logaddexp(0, eps0), so that eps0 in the hundreds neither overflows nor
rounds a mass to 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fdp._validation import check_array, check_real, check_sampling_rate
from fdp.mechanisms._atoms import largest_atom, pair_atoms, pair_cells, pair_loss_range
from fdp.mechanisms.base import MAX_STEP_LOSS, Mechanism, register_mechanism
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["RandomizedResponse", "FromDistributions", "pair_tradeoff"]

#: Tolerance on the total mass of each distribution given to FromDistributions.
SUM_TOL = 1e-9


def pair_tradeoff(log_p0: np.ndarray, log_p1: np.ndarray):
    """Exact f = T(P0 || P1) of a discrete pair given by log-masses (a PiecewiseLinearCurve).

    The pair (P, Q) = (P1, P0) has losses log(P1_i / P0_i) with P-masses P1_i;
    outcomes with P0_i = 0 < P1_i are the +inf atom. See
    :meth:`fdp.PiecewiseLinearCurve.from_privacy_loss_atoms`.
    """
    from fdp.tradeoff import PiecewiseLinearCurve

    loss, mass = pair_atoms(log_p0, log_p1, 1.0, Direction.REMOVE)
    finite = np.isfinite(loss)
    p_inf = float(np.sum(mass[np.isposinf(loss)]))
    p_inf = min(p_inf, 1.0)
    return PiecewiseLinearCurve.from_privacy_loss_atoms(loss[finite], np.minimum(mass[finite], 1.0), p_inf=p_inf)


class _DiscretePair(Mechanism):
    """Shared behaviour: subclasses provide ``_log_pair() -> (log P0, log P1)``."""

    def _log_pair(self) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        """Exact cells (the same for ``pessimistic`` True and False)."""
        lp0, lp1 = self._log_pair()
        return pair_cells(lp0, lp1, self.sampling_rate, Direction(direction), grid)

    def is_null(self) -> bool:
        """P0 == P1 entry by entry (e.g. randomized response with epsilon 0)."""
        lp0, lp1 = self._log_pair()
        return bool(np.array_equal(lp0, lp1))

    def grid_anchor(self, direction: Direction) -> float | None:
        """The finite non-zero atom of largest |loss| (see :meth:`Mechanism.grid_anchor`)."""
        return largest_atom(*self._log_pair(), self.sampling_rate, Direction(direction))

    def loss_atoms(self, direction: Direction) -> np.ndarray:
        """The finite losses of equation (1) with P-mass (see :meth:`Mechanism.loss_atoms`)."""
        loss, mass = pair_atoms(*self._log_pair(), self.sampling_rate, Direction(direction))
        return loss[(mass > 0.0) & np.isfinite(loss)]

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        """Smallest and largest finite loss after dropping <= tail_mass of atoms at each end."""
        lp0, lp1 = self._log_pair()
        return pair_loss_range(lp0, lp1, self.sampling_rate, Direction(direction), tail_mass)


@register_mechanism
@dataclass(frozen=True)
class RandomizedResponse(_DiscretePair):
    """Binary randomized response with parameter ``epsilon``, Poisson-subsampled.

    Output laws P0 = Bernoulli(1 / (1 + e^eps)), P1 = Bernoulli(e^eps / (1 + e^eps)):
    the true bit is reported with probability e^eps / (1 + e^eps). Without
    subsampling the loss is +-eps and the tradeoff curve is the (eps, 0)-DP
    curve ``fdp.epsilon_delta_curve(eps, 0)``; delta(eps') = max(0, (e^eps -
    e^eps') / (1 + e^eps)). See :mod:`fdp.mechanisms.discrete`.

    Args:
      epsilon: eps in [0, 1e300] (0 reports a fair coin: no privacy loss).
      sampling_rate: Poisson sampling rate p in (0, 1].

    Raises:
      ValueError: epsilon NaN, infinite or negative; sampling_rate outside (0, 1].

    Examples:
      >>> import fdp
      >>> fdp.PLDAccountant().compose(fdp.RandomizedResponse(epsilon=1.0), 10).get_epsilon(1e-6)
    """

    epsilon: float
    sampling_rate: float = 1.0
    kind = "randomized_response"
    exact_cells = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_real("epsilon", self.epsilon, low=0.0, high=MAX_STEP_LOSS))
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))

    def _log_pair(self) -> tuple[np.ndarray, np.ndarray]:
        eps = self.epsilon
        norm = float(np.logaddexp(0.0, eps))  # log(1 + e^eps)
        lo, hi = -norm, eps - norm  # log of 1/(1+e^eps), e^eps/(1+e^eps)
        return np.array([lo, hi]), np.array([hi, lo])  # outputs (1, 0)

    def probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """(P0, P1) over the outputs (1, 0)."""
        lp0, lp1 = self._log_pair()
        return np.exp(lp0), np.exp(lp1)

    def is_symmetric(self) -> bool:
        return True

    def tradeoff(self):
        from fdp.tradeoff import epsilon_delta_curve

        return epsilon_delta_curve(self.epsilon, 0.0)


def _check_distribution(name: str, values: Any) -> np.ndarray:
    arr = check_array(name, values, low=0.0, ndim=1)
    if arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-dimensional array of probabilities; got shape (0,)")
    total = float(np.sum(arr))
    if not abs(total - 1.0) <= SUM_TOL:
        raise ValueError(f"{name} must sum to 1 (within {SUM_TOL:g}); got sum {total!r}")
    return arr


@register_mechanism
@dataclass(frozen=True)
class FromDistributions(_DiscretePair):
    """A mechanism given by two discrete output laws on the same finite set.

    ``p_probs`` is P1 (the output law *with* the individual), ``q_probs`` is
    P0 (without): the unsubsampled privacy-loss pair is (P, Q) = (p_probs,
    q_probs), loss log(p_i / q_i), and the tradeoff curve is f = T(q || p),
    the exact Neyman-Pearson polygon. Outcomes with q_i = 0 < p_i give an
    infinite loss (the p_inf atom, distinguishable with certainty).

    The probabilities are stored as tuples (hashable, JSON-serialisable); each
    distribution is divided by its sum (which must be 1 within 1e-9) before use.

    Args:
      p_probs: 1-D array-like of P1's probabilities, >= 0, finite, summing to 1.
      q_probs: 1-D array-like of P0's probabilities, same shape.
      sampling_rate: Poisson sampling rate p in (0, 1].

    Raises:
      ValueError: not 1-D, empty, shapes differ, entries negative/NaN/infinite,
        a sum off 1 by more than 1e-9, or sampling_rate outside (0, 1].

    Examples:
      >>> import fdp
      >>> mech = fdp.FromDistributions([0.5, 0.3, 0.2], [0.2, 0.3, 0.5])
      >>> fdp.PLDAccountant().compose(mech, 5).get_epsilon(1e-6)
    """

    p_probs: tuple[float, ...]
    q_probs: tuple[float, ...]
    sampling_rate: float = 1.0
    kind = "from_distributions"
    exact_cells = True

    def __post_init__(self) -> None:
        p = _check_distribution("p_probs", self.p_probs)
        q = _check_distribution("q_probs", self.q_probs)
        if p.shape != q.shape:
            raise ValueError(
                f"p_probs and q_probs must have the same shape (one probability per outcome); "
                f"got {p.shape} and {q.shape}"
            )
        object.__setattr__(self, "p_probs", tuple(float(v) for v in p))
        object.__setattr__(self, "q_probs", tuple(float(v) for v in q))
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))

    def _log_pair(self) -> tuple[np.ndarray, np.ndarray]:
        p = np.asarray(self.p_probs, dtype=np.float64)
        q = np.asarray(self.q_probs, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.log(q) - math.log(q.sum()), np.log(p) - math.log(p.sum())

    def is_symmetric(self) -> bool:
        """True when some permutation of the outcomes swaps p and q exactly.

        Then the pair (P1, P0) is the pair (P0, P1) relabelled, so both
        neighbouring relations have the same privacy loss at p = 1. (A
        sufficient condition: pairs that are symmetric only after merging
        outcomes of equal loss are reported as not symmetric, which is safe.)
        """
        pairs = sorted(zip(self.p_probs, self.q_probs))
        swapped = sorted(zip(self.q_probs, self.p_probs))
        return pairs == swapped

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "p_probs": list(self.p_probs),
            "q_probs": list(self.q_probs),
            "sampling_rate": self.sampling_rate,
        }

    def tradeoff(self):
        """Exact T(q || p) (no subsampling) as a PiecewiseLinearCurve."""
        return pair_tradeoff(*self._log_pair())
