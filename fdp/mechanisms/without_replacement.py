"""A step on a fixed-size batch drawn without replacement, under the replace-one relation.

Each step draws a batch of exactly B of the N examples, uniformly and without
replacement, independently of the other steps, and runs the Gaussian mechanism on
it. Neighbouring data sets have the same size N and differ in one *replaced*
example. If the mechanism is f-DP between batches that differ in one replaced
example, the step is (Dong, Roth and Su, "Gaussian Differential Privacy", JRSS-B
2022, Theorem 4.2 of arXiv:1905.02383)

    C_p(f) = min{f_p, f_p^{-1}}**-DP,   f_p = p f + (1 - p) Id,   p = B / N,     (1)

and (1) is tight for one step: f_p and f_p^{-1} are the tradeoffs of two data sets
whose other examples all have the replaced example's gradient. The replaced example
may push either way at every step, so the steps compose as the *symmetric* curve
(1), not as f_p in one fixed direction (that is Poisson's add/remove accounting,
and it is below the truth here: p = 0.9, two steps, mu = 2, eps = 0.05 give
delta 0.7706 for two real data sets against 0.7660 from f_p composed).

The privacy loss of (1). Write R for the remove pair of the Poisson-subsampled
mechanism, ((1-p) P0 + p P1, P0), whose curve is f_p, and A for the swapped
pair (the add direction, curve f_p^{-1}). For eps >= 0 one step of R dominates A,
delta_R(eps) >= delta_A(eps) (with gamma = e^eps, delta_R = p H_{1+(gamma-1)/p} and
delta_A = (p - (gamma-1)(1-p)) H_{gamma p/(1-gamma+gamma p)} of the symmetric pair
(P0, P1), and the second order is larger, the second factor smaller). The hull's
conjugate is the max of the two conjugates, so delta of (1) is delta_R for eps >= 0
and its PLD is

    omega = omega_R on (0, inf],  omega_A on (-inf, 0),  an atom a0 at 0,
    a0 = 1 - P_R(L > 0) - Q_R(L > 0) = (1 - p) erf(mu / (2 sqrt 2))   (Gaussian),   (2)

the atom being the hull's segment of slope -1. :func:`symmetric_cells` bins (2)
on a loss grid (0 is a grid point of every grid that straddles it).

Lower bounds. The accountant's optimistic side composes R (remove) and A (add):
the privacy of the data sets above, in both orders, which no accounting can go
below. The gap to (2) composed is how much the worst case at every step (which
(1) allows) costs over one fixed pair of data sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy import special

from fdp._validation import check_integer, format_value
from fdp.mechanisms._atoms import add_cells, atom_cells
from fdp.mechanisms.base import Mechanism, mechanism_from_dict, register_mechanism
from fdp.mechanisms.gaussian import Gaussian, subsampled_gaussian_cells
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["SampledWithoutReplacement", "symmetric_cells", "zero_loss_atom"]


def zero_loss_atom(mu: float, p: float) -> float:
    """a0 of (2): the P-mass of loss exactly 0 in C_p(G_mu)."""
    return (1.0 - p) * float(special.erf(mu / (2.0 * math.sqrt(2.0))))


def symmetric_cells(mu: float, p: float, grid: Grid) -> LossCells:
    """Cells (:mod:`fdp.pld.cells`) of the PLD (2) of C_p(G_mu), exactly.

    P and Q of (2) agree with R's above 0 and with A's below 0, and both are
    probabilities, so a grid entirely at or above 0 sees R's cells (its left tail
    holds the same P- and Q-mass as R's), one at or below 0 sees A's, and a grid
    that straddles 0 takes A's cells below 0, R's above, and the atom at the point 0.
    """
    remove = subsampled_gaussian_cells(mu, p, Direction.REMOVE, grid)
    if grid.offset >= 0:
        return remove
    add = subsampled_gaussian_cells(mu, p, Direction.ADD, grid)
    if grid.offset + grid.n <= 0:
        return add
    k0 = -grid.offset  # grid.points[k0] == 0.0
    halves = LossCells(
        grid=grid,
        p_cell=np.concatenate([add.p_cell[:k0], remove.p_cell[k0:]]),
        u_cell=np.concatenate([add.u_cell[:k0], remove.u_cell[k0:]]),
        p_left=add.p_left, d_left=add.d_left,
        p_right=remove.p_right, u_right=remove.u_right, p_inf=remove.p_inf,
    )
    return add_cells(halves, atom_cells(grid, np.zeros(1), np.array([zero_loss_atom(mu, p)])))


@register_mechanism
@dataclass(frozen=True)
class SampledWithoutReplacement(Mechanism):
    """One step on a batch of exactly ``sample_size`` of ``dataset_size`` examples, drawn
    without replacement; neighbouring data sets differ in one *replaced* example.

    Its upper bounds compose (1) of the module docstring, C_p(f) with p = B / N; its
    lower bounds are the privacy of two real data sets (f_p in both orders).

    Args:
      mechanism: the step as a function of its batch, ``fdp.Gaussian(noise_multiplier=s)``
        at sampling_rate 1, with s the noise relative to the sensitivity between two
        batches that differ in one replaced example (as dp_accounting's events read it
        under REPLACE_ONE). For DP-SGD with clipping norm C and noise std sigma C that
        sensitivity is 2C: s = sigma / 2 (``fdp.dpsgd(sampling="without_replacement")``).
      sample_size: B in [1, N].
      dataset_size: N >= 1.

    Raises:
      ValueError: another mechanism, a sampling_rate other than 1, or B outside [1, N].

    Examples:
      >>> import fdp
      >>> step = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=0.55), sample_size=256,
      ...                                       dataset_size=60000)
      >>> lower, upper = fdp.PLDAccountant().compose(step, steps=14100).get_epsilon_bounds(1e-5)
    """

    mechanism: Gaussian
    sample_size: int
    dataset_size: int
    kind = "sampled_without_replacement"
    neighboring: ClassVar[str] = "replace_one"
    bracket_note: ClassVar[str | None] = (
        "accept the gap: with fdp.SampledWithoutReplacement the lower bound is the epsilon of two real "
        "data sets and the upper one the subsampling theorem's guarantee for all data; no grid closes "
        "the gap between them (docs/sampling.md, 'Sampling without replacement')")

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, Gaussian):
            raise ValueError("mechanism must be fdp.Gaussian(noise_multiplier=...) (the step on its batch); "
                             f"got {format_value(self.mechanism)}")
        if self.mechanism.sampling_rate != 1.0:
            raise ValueError("mechanism must have sampling_rate=1 (the batch is drawn without replacement "
                             f"instead); got sampling_rate={format_value(self.mechanism.sampling_rate)}")
        n = check_integer("dataset_size", self.dataset_size, low=1)
        b = check_integer("sample_size", self.sample_size, low=1, high=n)
        object.__setattr__(self, "dataset_size", n)
        object.__setattr__(self, "sample_size", b)

    @property
    def sampling_rate(self) -> float:  # type: ignore[override]
        """p = B / N, the rate of the subsampling theorem."""
        return self.sample_size / self.dataset_size

    @property
    def mu(self) -> float:
        return self.mechanism.mu

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        if pessimistic:
            return symmetric_cells(self.mu, self.sampling_rate, grid)
        return subsampled_gaussian_cells(self.mu, self.sampling_rate, Direction(direction), grid)

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        # (2) has A's lower tail and R's upper one; the optimistic side, either direction's
        subsampled = Gaussian(noise_multiplier=self.mechanism.noise_multiplier, sampling_rate=self.sampling_rate)
        ranges = [subsampled.loss_range(d, tail_mass) for d in Direction]
        return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)

    def is_symmetric(self) -> bool:
        return True

    def tradeoff(self):
        """C_p(f) of (1): the step's tight f-DP guarantee under replace-one."""
        return self.mechanism.tradeoff().subsampled(self.sampling_rate).symmetrized()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "mechanism": self.mechanism.to_dict(), "sample_size": self.sample_size,
                "dataset_size": self.dataset_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SampledWithoutReplacement":
        return cls(mechanism=mechanism_from_dict(data.get("mechanism")),  # type: ignore[arg-type]
                   sample_size=data["sample_size"], dataset_size=data["dataset_size"])
