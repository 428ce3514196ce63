"""Random allocation ("balls in bins"): each example in exactly one step of an epoch.

A DP-SGD epoch of t steps in which every example is assigned to one step chosen
uniformly at random (fresh each epoch; batch sizes are Binomial(N, 1/t)). For the
Gaussian mechanism with noise multiplier sigma (mu = 1 / sigma), one epoch — all t
adaptive steps — is dominated by the pair (Chua et al., "Balls-and-Bins Sampling for
DP-SGD", AISTATS 2025; Feldman and Shenfeld, "Privacy amplification by random
allocation", arXiv:2502.08202, Sec. 3)

    remove:  P = (1/t) sum_{j=1}^t N(mu e_j, I_t),   Q = N(0, I_t)
    add:     the pair swapped, (Q, P),

under add/remove of one example. Its likelihood ratio is dP/dQ(y) = (1/t) sum_j
exp(mu y_j - mu^2/2), a mean of t iid terms under Q; :mod:`fdp.mechanisms.allocation_lattice`
bounds its law from both sides on a lattice of likelihood ratios, so the accountant
composes epochs (with each other and with any other mechanism) with certified
lower and upper bounds like any other mechanism.

The JL mechanism (and any Gaussian with a random released sensitivity) enters as a
finite mixture of Gaussian terms that dominates a step from above or is dominated by
it from below (:mod:`fdp.mechanisms.allocation_mixtures`), each mixture on its own
lattice (:func:`fdp.mechanisms.allocation_terms.mixture_term_law`). Randomized response
needs no lattice: its epoch's likelihood ratio depends only on the number of ones, a
binomial (:mod:`fdp.mechanisms.allocation_discrete`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from fdp._validation import check_integer, format_value
from fdp.mechanisms._atoms import RANGE_MARGIN, atom_cells
from fdp.mechanisms.allocation_lattice import (FIRST_CLASS_MASS, FIRST_CLASS_SPLIT, MAX_LATTICE_POINTS, TAIL,
                                               EpochLattice, epoch_lattice, first_class_mass, lattice_points,
                                               loss_error, optimistic_atoms, pessimistic_atoms,
                                               refine_first_class, term_sums)
from fdp.mechanisms.allocation_big import big_classes, mixture_big_law
from fdp.mechanisms.allocation_mixtures import mixture_plan, step_components
from fdp.mechanisms.allocation_selected import epoch_blocks
from fdp.mechanisms.allocation_terms import gaussian_term_law, mixture_term_law
from fdp.mechanisms.allocation_discrete import randomized_response_epoch
from fdp.mechanisms.base import Mechanism, mechanism_from_dict, register_mechanism
from fdp.mechanisms.discrete import RandomizedResponse
from fdp.mechanisms.gaussian import Gaussian
from fdp.mechanisms.random_sensitivity.mechanism import RandomSensitivityBase
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["RandomAllocation", "MAX_STEPS_PER_EPOCH"]

#: Largest number of steps per epoch accepted (the lattice grows like t).
MAX_STEPS_PER_EPOCH = 10**6
#: Lattice spacing as a fraction of the sd of one epoch's likelihood ratio S / t: the
#: split into two atoms per class widens the bracket by O((spacing / sd)^2) per epoch.
SPACING_PER_SD = 1 / 16
#: Largest randomized-response epsilon inside random allocation (its atoms' rounding bound
#: grows like t * epsilon; at 100 and t = 10^6 it is ~1e-6 of a mass).
MAX_RR_EPSILON = 100.0
#: A lattice coarser than half the sd no longer says anything useful: refused.
COARSEST_SPACING_PER_SD = 1 / 2


@register_mechanism
@dataclass(frozen=True)
class RandomAllocation(Mechanism):
    """One epoch of random allocation: every example used in exactly one of its steps.

    Each of the ``steps_per_epoch`` = t steps runs ``mechanism`` (at sampling rate 1:
    the allocation is the sampling) on the examples allocated to it; each example goes
    to one step chosen uniformly at random, fresh every epoch. Compose it once per
    epoch: ``acc.compose(fdp.RandomAllocation(...), steps=epochs)``. The expected batch
    is N / t, the noise std sigma C / (N / t).

    Args:
      mechanism: the step: ``fdp.Gaussian(noise_multiplier=sigma)`` (DP-SGD),
        ``fdp.JL(noise_multiplier=sigma, jl_projections=r)`` (DP-SGD-JL), an
        ``fdp.RandomSensitivityGaussian`` or ``fdp.RandomizedResponse(epsilon=eps0)`` (one
        bit per step; its epoch's loss is t + 1 atoms,
        :mod:`fdp.mechanisms.allocation_discrete`), each with sampling_rate 1.
      steps_per_epoch: t in [1, 10^6].
      selected: steps each example is used in per epoch, k in [1, t]; k = 1 is "balls in
        bins". k > 1 (Gaussian step only) is bounded above by k blocks of 1-of-t/k and
        below by a statistic of the epoch's outputs (:mod:`fdp.mechanisms.allocation_selected`):
        within 0.2 % at sigma 1, t 469, k 2 over 60 epochs, wider at small t.

    Raises:
      ValueError: another mechanism or a sampling_rate other than 1, t or k out of range,
        k > 1 with a JL step, or a noise multiplier so small (a JL step: so few projections)
        that the lattice would not fit (the message says what does).

    Examples:
      >>> import fdp
      >>> epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=1.0), steps_per_epoch=235)
      >>> lower, upper = fdp.PLDAccountant().compose(epoch, steps=10).get_epsilon_bounds(1e-5)
    """

    mechanism: Gaussian | RandomSensitivityBase | RandomizedResponse
    steps_per_epoch: int
    selected: int = 1
    kind = "random_allocation"

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, (Gaussian, RandomSensitivityBase, RandomizedResponse)):
            raise ValueError("mechanism must be fdp.Gaussian(noise_multiplier=...) (the DP-SGD step), "
                             "fdp.JL(noise_multiplier=..., jl_projections=...) (the DP-SGD-JL step) or "
                             f"fdp.RandomizedResponse(epsilon=...); got {format_value(self.mechanism)}")
        if self.mechanism.sampling_rate != 1.0:
            raise ValueError("mechanism must have sampling_rate=1 inside random allocation (the "
                             "allocation is the sampling); got sampling_rate="
                             f"{format_value(self.mechanism.sampling_rate)}")
        object.__setattr__(self, "steps_per_epoch",
                           check_integer("steps_per_epoch", self.steps_per_epoch, low=1, high=MAX_STEPS_PER_EPOCH))
        selected = check_integer("selected", self.selected, low=1, high=self.steps_per_epoch)
        object.__setattr__(self, "selected", selected)
        if selected > 1:
            if not isinstance(self.mechanism, Gaussian):
                raise ValueError(f"selected={selected} (k > 1 steps per example) is certified for the Gaussian "
                                 f"step only; got {format_value(self.mechanism)}. Use selected=1 with "
                                 "steps_per_epoch=t/k and k times as many epochs (an upper bound on k-of-t "
                                 "allocation, docs/sampling.md), or Poisson sampling")
            self.parts()  # builds (and so checks) every block's lattice now
            return
        if isinstance(self.mechanism, RandomizedResponse) and self.steps_per_epoch > 1:
            if self.mechanism.epsilon > MAX_RR_EPSILON:  # its atoms' error bound grows with t eps0
                raise ValueError(f"epsilon must be at most {MAX_RR_EPSILON:g} for randomized response inside random "
                                 f"allocation (one step's privacy loss; beyond it nothing is hidden); got "
                                 f"{format_value(self.mechanism.epsilon)}")
            return  # t + 1 atoms, no lattice
        if self.steps_per_epoch == 1:
            return  # one step at rate 1: the step itself (see _one_step)
        if isinstance(self.mechanism, Gaussian):
            if _linear(self.mu, self.steps_per_epoch):
                return
            if not _fits(_ANY_SIGMA, self.steps_per_epoch):  # no sigma would do: say that t is the cause
                raise ValueError(_too_small(self.mu, self.steps_per_epoch))
        mixture_plan(self.mechanism, self.steps_per_epoch)  # refuses at once a lattice that would not fit

    def parts(self) -> tuple[tuple[Mechanism, int], ...]:
        """k = 1: the epoch itself; k > 1: its k blocks (:func:`fdp.mechanisms.allocation_selected.epoch_blocks`)."""
        if self.selected == 1:
            return ((self, 1),)
        return _blocks(self.mechanism, self.steps_per_epoch, self.selected)

    def _whole(self) -> None:
        if self.selected > 1:
            raise ValueError(f"a k-of-t epoch (selected={self.selected}) has no cells of its own: compose it in an "
                             "fdp.PLDAccountant, which accounts its k blocks")

    @property
    def _one_step(self) -> Mechanism | None:
        """t = 1: the epoch is its step at sampling rate 1, whose own cells are exact where
        the lattice's class [0, spacing) would put Q-mass at likelihood ratio 0 (a loss of
        +inf in the add direction: 20 full-batch epochs at sigma 1 had an infinite upper
        bound); None otherwise."""
        return self.mechanism if self.steps_per_epoch == 1 else None

    @property
    def sampling_rate(self) -> float:  # type: ignore[override]
        """1: the mechanism is one whole epoch (the accountant's Poisson rate does not apply)."""
        return 1.0

    @property
    def mu(self) -> float:
        """1 / sigma: the Gaussian step's sensitivity (a JL step's is Z / sigma)."""
        return 1.0 / self.mechanism.noise_multiplier

    def _atoms(self, direction: Direction, pessimistic: bool) -> tuple[np.ndarray, np.ndarray, float]:
        if isinstance(self.mechanism, RandomizedResponse):
            losses, masses, _, _ = _rr_atoms(self.mechanism.epsilon, self.steps_per_epoch, direction)
            return losses, masses, 0.0
        if isinstance(self.mechanism, Gaussian) and _linear(self.mu, self.steps_per_epoch):
            return _atoms(self.mu, self.steps_per_epoch, direction, pessimistic)
        return _mixture_atoms(self.mechanism, self.steps_per_epoch, direction, pessimistic)

    # -- the accountant's interface ----------------------------------------------------

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        self._whole()
        if self._one_step is not None:
            return self._one_step.loss_cells(direction, grid, pessimistic=pessimistic, focus=focus)
        if isinstance(self.mechanism, RandomizedResponse):  # exact atoms, their rounding charged
            losses, masses, mass_error, atom_error = _rr_atoms(self.mechanism.epsilon, self.steps_per_epoch,
                                                               Direction(direction))
            return atom_cells(grid, losses, masses, loss_error=atom_error, mass_error=mass_error)
        losses, masses, p_inf = self._atoms(Direction(direction), pessimistic)
        return atom_cells(grid, losses, masses, p_inf=p_inf, loss_error=loss_error(losses))

    def focus_key(self, direction: Direction, focus: tuple[float, float]) -> Any:
        return None if self._one_step is None else self._one_step.focus_key(direction, focus)

    def grid_anchor(self, direction: Direction) -> float | None:
        """The step's own anchor at t = 1 (an atom on the grid is binned exactly)."""
        return None if self._one_step is None else self._one_step.grid_anchor(direction)

    def loss_atoms(self, direction: Direction) -> Any:
        """The step's own atoms at t = 1 (a grid through all of them is exact)."""
        return None if self._one_step is None else self._one_step.loss_atoms(direction)

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        self._whole()
        if self._one_step is not None:
            return self._one_step.loss_range(direction, tail_mass)
        lo, hi = math.inf, -math.inf
        for pessimistic in (True, False):
            losses, masses, _ = self._atoms(Direction(direction), pessimistic)
            if losses.size == 0:  # everything at +inf (or dropped): no finite range to add
                continue
            order = np.argsort(losses)
            cum = np.cumsum(masses[order])
            first = min(int(np.searchsorted(cum, tail_mass, side="right")), losses.size - 1)
            last = min(int(np.searchsorted(cum, cum[-1] - tail_mass, side="left")), losses.size - 1)
            lo, hi = min(lo, float(losses[order][first])), max(hi, float(losses[order][last]))
        if lo > hi:
            lo = hi = 0.0
        width = max(hi - lo, abs(hi), abs(lo), 1e-300) * RANGE_MARGIN
        return lo - width, hi + width

    def tradeoff(self):
        """A valid f-DP guarantee of one epoch: min{f, f^-1}** of the curve f of the
        dominating pair's remove direction (the add direction is the swapped pair, whose
        curve is f^-1), below the true curve of either ordering."""
        from fdp.tradeoff import PiecewiseLinearCurve

        if self.selected > 1 or (isinstance(self.mechanism, RandomizedResponse) and self._one_step is None):
            # blocks, or atoms whose rounding only the cells charge: the accountant's certified curve
            from fdp.accountant import PLDAccountant

            return PLDAccountant().compose(self).tradeoff()
        if self._one_step is not None:
            return self._one_step.tradeoff()
        losses, masses, p_inf = self._atoms(Direction.REMOVE, True)
        return PiecewiseLinearCurve.from_privacy_loss_atoms(losses, masses, p_inf).symmetrized()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "mechanism": self.mechanism.to_dict(),
                "steps_per_epoch": self.steps_per_epoch, "selected": self.selected}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RandomAllocation":
        inner = mechanism_from_dict(data.get("mechanism"))
        return cls(mechanism=inner, steps_per_epoch=data["steps_per_epoch"],  # type: ignore[arg-type]
                   selected=data.get("selected", 1))


@functools.lru_cache(maxsize=16)
def _blocks(step: Gaussian, steps: int, selected: int) -> tuple[tuple[Mechanism, int], ...]:
    mu = 1.0 / step.noise_multiplier
    lattice = _plan(mu, steps) if _linear(mu, steps) else None  # the class sum's, else the outputs' sum
    return epoch_blocks(step, steps, selected, lambda m: RandomAllocation(step, steps_per_epoch=m), lattice)


@functools.lru_cache(maxsize=64)
def _linear(mu: float, steps: int) -> bool:
    """Whether a Gaussian epoch takes the linear lattice (:func:`_plan`): where it fits at
    its intended spacing, SPACING_PER_SD of the sd. Otherwise (small sigma: the top of one
    term's W, where P1's tail is TAIL, lies so far out that the spacing would have to
    coarsen, or no spacing fits) the epoch is the one-component mixture of
    :mod:`fdp.mechanisms.allocation_mixtures`: spacing from the bulk and the large term on
    logarithmic classes above the linear top (:mod:`fdp.mechanisms.allocation_big`),
    sigma = 0.6, t = 235 at a 0.13 % bracket instead of 3.7 %, sigma = 0.5 accepted."""
    try:
        spacing, _ = _plan(mu, steps)
    except ValueError:
        return False
    return spacing <= _sd(mu, steps) * SPACING_PER_SD * (1 + 1e-9)


@functools.lru_cache(maxsize=16)
def _plan(mu: float, steps: int) -> tuple[float, int]:
    """(lattice spacing, classes per term) for one epoch: spacing SPACING_PER_SD of the sd
    of S / t, coarser if the lattice would not fit; the top class where P1(W >= top) <= TAIL.

    The span is estimated; near the limit the real window (the term law's Chernoff window,
    which the lattice will use) decides, so that a lattice that cannot fit is refused here
    and not at the first query (red team: sigma 0.5 at t = 2 passed, then failed)."""
    spacing, classes = _estimated_plan(mu, steps)
    for _ in range(4):
        if _estimated_points(mu, steps, spacing) < 0.3 * MAX_LATTICE_POINTS:  # far from the limit
            return spacing, classes
        points = lattice_points(gaussian_term_law(mu, spacing, classes), steps)
        if points <= MAX_LATTICE_POINTS:
            return spacing, classes
        spacing *= 1.05 * points / MAX_LATTICE_POINTS
        if spacing > _sd(mu, steps) * COARSEST_SPACING_PER_SD:
            break
        classes = _classes(mu, spacing)
    raise ValueError(_too_small(mu, steps))


def _sd(mu: float, steps: int) -> float:
    """sd of one epoch's likelihood ratio S / t under Q."""
    return math.sqrt(math.expm1(min(mu * mu, 700.0)) / steps)


def _log_top(mu: float) -> float:
    return mu * mu / 2 - mu * float(special.ndtri(TAIL))  # W where P1's upper tail is TAIL


def _classes(mu: float, spacing: float) -> int:
    return int(math.ceil(math.exp(_log_top(mu)) / spacing)) + 1


def _estimated_points(mu: float, steps: int, spacing: float) -> float:
    # the window of M spans about top + 16 sd(S) in units of S (the Chernoff edges, generously),
    # and t classes more (S in [M spacing, (M + t) spacing)); it starts near t / spacing, not 0
    return (math.exp(_log_top(mu)) + 16 * _sd(mu, steps) * steps) / spacing + steps


def _estimated_plan(mu: float, steps: int) -> tuple[float, int]:
    if _log_top(mu) > 700:
        raise ValueError(_too_small(mu, steps))
    sd = _sd(mu, steps)
    spacing = sd * SPACING_PER_SD
    points = _estimated_points(mu, steps, spacing)
    if points > 0.9 * MAX_LATTICE_POINTS:
        spacing *= points / (0.9 * MAX_LATTICE_POINTS)
    if spacing > sd * COARSEST_SPACING_PER_SD:
        raise ValueError(_too_small(mu, steps))
    return spacing, _classes(mu, spacing)


def _too_small(mu: float, steps: int) -> str:
    if mu > _ANY_SIGMA and not _fits(_ANY_SIGMA, steps):  # no noise multiplier would do: t is the cause
        return (f"steps_per_epoch={steps} is too many for random-allocation accounting: one epoch's "
                f"lattice grows with the steps, and at this many it would exceed {MAX_LATTICE_POINTS} points "
                "whatever the noise multiplier. Use fewer steps per epoch (a larger batch; 10,000 fit) or "
                "account Poisson sampling")
    # caught by _linear: such an epoch takes the mixture route (which refuses in its own words)
    return (f"noise_multiplier={1 / mu:.4g} is too small for the linear lattice with steps_per_epoch={steps}: "
            f"one term's likelihood ratio is so heavy-tailed that it would exceed {MAX_LATTICE_POINTS} points")


#: mu of a noise multiplier of 1000: a lattice that does not fit there fits at no sigma.
_ANY_SIGMA = 1e-3


def _fits(mu: float, steps: int) -> bool:
    try:
        _plan(mu, steps)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=16)
def _lattice(mu: float, steps: int) -> EpochLattice:
    spacing, classes = _plan(mu, steps)
    return _refined(epoch_lattice(gaussian_term_law(mu, spacing, classes), steps),
                    lambda: gaussian_term_law(mu, spacing / FIRST_CLASS_SPLIT, FIRST_CLASS_SPLIT, inside=True), steps)


def _refined(lattice: EpochLattice, finer_law: Any, steps: int) -> EpochLattice:
    """The class M = 0 on a finer lattice where it would put Q-mass at ratio 0 (small t)."""
    if first_class_mass(lattice) <= FIRST_CLASS_MASS:
        return lattice
    return refine_first_class(lattice, epoch_lattice(finer_law(), steps))


@functools.lru_cache(maxsize=16)
def _rr_atoms(epsilon: float, steps: int, direction: Direction) -> tuple[np.ndarray, np.ndarray, float, float]:
    return randomized_response_epoch(epsilon, steps, direction)


@functools.lru_cache(maxsize=64)
def _atoms(mu: float, steps: int, direction: Direction, pessimistic: bool) -> tuple[np.ndarray, np.ndarray, float]:
    lattice = _lattice(mu, steps)
    if pessimistic:
        return pessimistic_atoms(lattice, direction)
    losses, masses = optimistic_atoms(lattice, direction)
    return losses, masses, 0.0



@functools.lru_cache(maxsize=16)
def _mixture_atoms(mechanism: RandomSensitivityBase, steps: int, direction: Direction,
                   pessimistic: bool) -> tuple[np.ndarray, np.ndarray, float]:
    lattice = _mixture_lattice(mechanism, steps, pessimistic)
    if pessimistic:
        return pessimistic_atoms(lattice, direction)
    losses, masses = optimistic_atoms(lattice, direction)
    return losses, masses, 0.0


@functools.lru_cache(maxsize=8)
def _mixture_lattice(mechanism: RandomSensitivityBase, steps: int, pessimistic: bool) -> EpochLattice:
    plan = mixture_plan(mechanism, steps)
    mus, weights = step_components(mechanism, pessimistic, plan.mu_sat, plan.mu_min)
    finer = plan.spacing / FIRST_CLASS_SPLIT
    law = mixture_term_law(mus, weights, plan.spacing, plan.classes)
    lattice = _refined(epoch_lattice(law, steps), lambda: mixture_term_law(mus, weights, finer, FIRST_CLASS_SPLIT, inside=True),
                       steps)
    if plan.log_edges is None:
        return lattice
    return lattice.joined(big_classes(mixture_big_law(mus, weights, plan.log_edges), term_sums(law, steps - 1), steps))
