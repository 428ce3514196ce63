"""A lower bound on one k-of-t random-allocation epoch: the sum of its terms' classes.

For the Gaussian step (mu = 1 / sigma) a k-of-t epoch is the pair
(:mod:`fdp.mechanisms.allocation_selected`)

    P_k = mean over k-subsets S of N(mu 1_S, I_t),    Q = N(0, I_t).

Cut each output y_j into the class g_j of its term W_j = exp(mu y_j - mu^2/2) on a
linear lattice (:func:`fdp.mechanisms.allocation_terms.gaussian_term_law`: spacing
Delta, classes 0 .. K-1, the rest an overflow) and release only

    M = g_1 + ... + g_t      (or one outcome "overflow" if a term overflows).

That is a post-processing of the epoch's output, so the pair of M's laws is dominated by
(P_k, Q) in both directions: its delta, and that of its composition over the epochs,
are lower bounds. M is symmetric in the steps, so its law under P_k is the same for
every subset S, a convolution:

    Q(M = m)   = (a^{*t})_m,                      a_g  = Q(g),
    P_k(M = m) = (a1^{*k} * a^{*(t-k)})_m,         a1_g = P1(g) = E_Q[W ; g]          (1)

with a1_g in [g Delta (1 - xi) a_g + b_g, (g + 1) Delta (1 + xi) a_g - bbar_g] (the
term law's remainders b, bbar). At k = 1, M is the lattice class of
:mod:`fdp.mechanisms.allocation_lattice` (S = sum W_j is then sufficient: the likelihood
ratio is S / t). At k > 1 the likelihood ratio is the elementary symmetric polynomial
e_k(W) / C(t, k), which S no longer determines, but for t >> k nearly does: at sigma 1,
t 469, k 2, 60 epochs (delta 1e-5) this gives eps >= 4.08 against the k blocks' upper
bound 4.09, where the sum of the outputs gave 2.98. At k = t the sum of the outputs is
sufficient and this statistic is not: :func:`fdp.mechanisms.allocation_selected.epoch_blocks`
keeps whichever of the two has the larger mean privacy loss.

**Bounds, not estimates.** Q's masses are :func:`fdp.mechanisms.allocation_lattice.term_sums`'
[q_lo, q_hi]; P_k's are computed on the same FFT window and tilt, once with a1's lower
bounds and once with its upper ones, each with the round-off bound of the FFT; the lower
ones also lose the wrap-around envelope (the window's Chernoff bound covers k terms of
P1's law). The atoms are then, remove: P-mass p_lo at loss log(p_lo / q_hi); add: Q-mass
q_lo at loss log(q_lo / p_hi). Each mass is below the class's true mass and each loss below
its true loss, so every hockey-stick divergence, of one epoch and of their composition, is
below the true one: a dominated pair. The overflow, the classes outside the window and the
atoms whose lower mass is 0 are dropped, which only lowers it further.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fdp.mechanisms._atoms import atom_cells, atom_loss_range
from fdp.mechanisms.allocation_fft import MAX_LATTICE_POINTS, fft_window, power_product, spectrum, tilted
from fdp.mechanisms.allocation_lattice import loss_error, term_sums
from fdp.mechanisms.allocation_terms import TermLaw, gaussian_term_law
from fdp.mechanisms.base import Mechanism
from fdp.pld.cells import Direction, Grid, LossCells
from fdp.pld.roundoff import U

__all__ = ["ClassSumEpoch", "ClassSums", "class_sum_atoms", "p1_class_bounds", "selected_sums"]


@dataclass(frozen=True, eq=False)
class ClassSums:
    """Bounds on the laws (1) of M for m = start .. start + q_lo.size - 1 (no overflow):
    ``q_lo <= Q(M = m) <= q_hi`` and ``p_lo <= P_k(M = m) <= p_hi``."""

    start: int
    q_lo: np.ndarray
    q_hi: np.ndarray
    p_lo: np.ndarray
    p_hi: np.ndarray


def p1_class_bounds(law: TermLaw) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds on a1_g = E_Q[W ; g], each class's P1-mass, from its Q-mass
    (relative error ``law.a_error``) and remainders; every rounding charged (a few
    products and one sum or difference of positive numbers: 8u relative)."""
    g = np.arange(law.a.size, dtype=np.float64)
    a_lo = law.a * (1 - law.a_error)
    a_hi = law.a * (1 + law.a_error)
    lower = (g * law.spacing * (1 - law.xi) * a_lo + law.b_lo) * (1 - 8 * U)
    upper = ((g + 1) * law.spacing * (1 + law.xi) * a_hi * (1 + 8 * U) - law.bbar_lo) * (1 + 8 * U)
    return np.maximum(lower, 0.0), np.maximum(upper, lower)


def selected_sums(law: TermLaw, steps: int, selected: int, max_points: int = MAX_LATTICE_POINTS) -> ClassSums:
    """:class:`ClassSums` of a k-of-t epoch (k = ``selected``, t = ``steps``) on ``law``'s classes.

    Raises:
      ValueError: the window would exceed ``max_points``.
    """
    win = fft_window(law, steps, max_points, selected)
    q = term_sums(law, steps, max_points, window=win)
    n, theta, rest = win.n, win.theta, steps - selected
    a1_lo, a1_hi = p1_class_bounds(law)
    untilt = win.untilt()
    spread = [(spectrum(tilted(law.a, theta), n, rest), rest)] if rest > 0 else []

    def p_sums(a1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        full, error = power_product([(spectrum(tilted(a1, theta), n, selected), selected), *spread], n)
        return win.entries(full) * untilt, error * untilt * win.rounding

    # the rest's Q-masses are exact up to law.a_error each (a1's bounds hold theirs); tilted,
    # each of the t factors and the untilting 4u more
    tilt_error = (steps + 1) * math.log1p(4 * U) if theta > 0 else 0.0
    grow = math.expm1(rest * math.log1p(law.a_error) + tilt_error)
    low, low_error = p_sums(a1_lo)
    high, high_error = p_sums(a1_hi)
    p_lo = np.clip((low - low_error - win.wrapped()) * (1 - grow), 0.0, None)
    p_hi = np.clip((high + high_error) * (1 + grow), 0.0, None)
    return ClassSums(win.lo, q.q_lo, q.q_hi, p_lo, p_hi)


def class_sum_atoms(sums: ClassSums, direction: Direction) -> tuple[np.ndarray, np.ndarray]:
    """(losses, P-masses) of the dominated pair of M (module docstring): remove, P-masses
    p_lo at log(p_lo / q_hi); add (the pair swapped), q_lo at log(q_lo / p_hi). Atoms with
    a zero mass or bound are dropped."""
    if direction is Direction.REMOVE:
        masses, other = sums.p_lo, sums.q_hi
    else:
        masses, other = sums.q_lo, sums.p_hi
    kept = (masses > 0) & (other > 0)
    return np.log(masses[kept] / other[kept]), masses[kept]


def mean_loss(losses: np.ndarray, masses: np.ndarray) -> float:
    """The pair's mean privacy loss (KL divergence) as its atoms give it: what
    :func:`fdp.mechanisms.allocation_selected.epoch_blocks` compares statistics by."""
    return float(np.sum(masses * losses))


@functools.lru_cache(maxsize=16)
def _sums(mu: float, steps: int, selected: int, spacing: float, classes: int) -> ClassSums:
    return selected_sums(gaussian_term_law(mu, spacing, classes), steps, selected)


@functools.lru_cache(maxsize=32)
def _atoms(mu: float, steps: int, selected: int, spacing: float, classes: int,
           direction: Direction) -> tuple[np.ndarray, np.ndarray]:
    return class_sum_atoms(_sums(mu, steps, selected, spacing, classes), direction)


@dataclass(frozen=True)
class ClassSumEpoch(Mechanism):
    """The dominated pair of M (module docstring) for a k-of-t epoch of the Gaussian step
    with noise multiplier ``noise_multiplier``, on the linear lattice (``spacing``,
    ``classes``): the lower side of :class:`fdp.mechanisms.allocation_selected.AllocationBlock`.
    Internal to the accountant."""

    noise_multiplier: float
    steps: int
    selected: int
    spacing: float
    classes: int
    kind = "random_allocation_class_sum"

    @property
    def sampling_rate(self) -> float:  # type: ignore[override]
        return 1.0

    def atoms(self, direction: Direction) -> tuple[np.ndarray, np.ndarray]:
        return _atoms(1.0 / self.noise_multiplier, self.steps, self.selected, self.spacing, self.classes,
                      Direction(direction))

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        """The dominated pair's cells (``pessimistic`` is not served: this is a lower bound)."""
        if pessimistic:
            raise ValueError("ClassSumEpoch is a dominated pair: it has no pessimistic cells")
        losses, masses = self.atoms(direction)
        return atom_cells(grid, losses, masses, loss_error=loss_error(losses))

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        return atom_loss_range(*self.atoms(direction), tail_mass)

    def tradeoff(self):
        """The exact curve of the dominated pair of M (above the epoch's true curve)."""
        from fdp.tradeoff import PiecewiseLinearCurve

        losses, masses = self.atoms(Direction.REMOVE)
        return PiecewiseLinearCurve.from_privacy_loss_atoms(losses, masses)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "noise_multiplier": self.noise_multiplier, "steps": self.steps,
                "selected": self.selected, "spacing": self.spacing, "classes": self.classes}
