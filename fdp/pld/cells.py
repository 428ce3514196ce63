"""The privacy loss of one mechanism, binned on a uniform loss grid.

This is the interface between mechanisms and the discretiser. A mechanism
reports, for a pair (P, Q) and its privacy loss L = log(dP/dQ)(X), X ~ P,
the P-measure of L in the cells of a grid ell_k = (offset + k) * h:

    p_cell[k] = P(ell_k < L <= ell_{k+1})                          k = 0..n-1
    u_cell[k] = E_P[(1 - e^{ell_k - L}) ; ell_k < L <= ell_{k+1}]
              = p_cell[k] - e^{ell_k} Q(ell_k < L <= ell_{k+1})

``u_cell`` is the *excess* of the cell over its left grid point, in units of
P-mass: 0 when all the cell's mass sits at ell_k, (1 - e^{-h}) p_cell[k] when
it sits at ell_{k+1}. Together (p, u) fix the cell's P-mass and Q-mass, which
is all that the discretisations of :mod:`fdp.pld.discretise` need. The tails:

    p_left  = P(L <= ell_0),      d_left  = E_P[(e^{ell_0 - L} - 1) ; L <= ell_0]
    p_right = P(ell_n < L < inf), u_right = E_P[(1 - e^{ell_n - L}) ; ell_n < L < inf]
    p_inf   = P(L = +inf)         (mass of P where Q has none)

``loss_error`` bounds how far the true losses of binned atoms may be from the
float64 values that were binned (logs and log-sums of the output masses err by a
few ulp); discretisations carry it into :attr:`fdp.pld.pmf.DiscretePLD.loss_error`,
where it is charged to eps on the safe side. ``mass_error`` bounds the relative
float error of every P-mass of the cells' atoms (exp of a computed log-mass); it is
carried into :attr:`fdp.pld.pmf.DiscretePLD.rel_error` and charged to delta.

Notation: x_k = e^{ell_k} is the likelihood ratio dP/dQ at grid point k.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Direction", "Grid", "LossCells"]


class Direction(str, enum.Enum):
    """The two neighbouring relations under Poisson subsampling (rate p).

    REMOVE: P = (1-p) P0 + p P1, Q = P0.   ADD: P = P0, Q = (1-p) P0 + p P1.
    P0 is the output distribution without the individual, P1 with it.
    """

    REMOVE = "remove"
    ADD = "add"


@dataclass(frozen=True)
class Grid:
    """Uniform loss grid ell_k = (offset + k) * h, k = 0..n (n cells, n+1 points)."""

    h: float
    offset: int
    n: int

    def __post_init__(self) -> None:
        if not (self.h > 0 and math.isfinite(self.h)):
            raise ValueError(f"grid spacing h must be a finite number in (0, inf); got {self.h}")
        if self.n < 1:
            raise ValueError(f"grid must have at least one cell; got n={self.n}")

    @property
    def points(self) -> np.ndarray:
        """The n+1 grid losses ell_0..ell_n."""
        return (self.offset + np.arange(self.n + 1, dtype=np.float64)) * self.h

    @classmethod
    def covering(cls, lo: float, hi: float, h: float) -> "Grid":
        """Smallest grid of spacing h whose points cover [lo, hi]."""
        if not (h > 0 and math.isfinite(h) and math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"grid needs finite lo <= hi and h > 0; got lo={lo}, hi={hi}, h={h}")
        first = math.floor(lo / h)
        last = max(math.ceil(hi / h), first + 1)
        return cls(h=h, offset=int(first), n=int(last - first))


@dataclass(frozen=True, eq=False)
class LossCells:
    """P-measure of the privacy loss on the cells of ``grid`` (see module docstring)."""

    grid: Grid
    p_cell: np.ndarray
    u_cell: np.ndarray
    p_left: float = 0.0
    d_left: float = 0.0
    p_right: float = 0.0
    u_right: float = 0.0
    p_inf: float = 0.0
    loss_error: float = 0.0
    mass_error: float = 0.0

    def __post_init__(self) -> None:
        n = self.grid.n
        if self.p_cell.shape != (n,) or self.u_cell.shape != (n,):
            raise ValueError(
                f"p_cell and u_cell must have shape ({n},); got {self.p_cell.shape}, {self.u_cell.shape}"
            )
        # a nan would pass every comparison of the discretisations unseen (or crash them);
        # inf is left alone (an overflowing e^ell in a deficit is deliberate and safe)
        scalars = (self.p_left, self.d_left, self.p_right, self.u_right, self.p_inf)
        if np.isnan(self.p_cell).any() or np.isnan(self.u_cell).any() or np.isnan(scalars).any():
            raise ValueError("a mechanism's loss cells hold a nan; this is a bug in that mechanism's "
                             "cells, please report it with its parameters")

    @property
    def total_mass(self) -> float:
        return float(self.p_left + self.p_cell.sum() + self.p_right + self.p_inf)

    def mixed(self, other: "LossCells", weight: float) -> "LossCells":
        """(1 - weight) * self + weight * other, on the same grid (all fields are linear)."""
        if other.grid != self.grid:
            raise ValueError("cannot mix LossCells on different grids")
        a, b = 1.0 - weight, weight
        return LossCells(
            grid=self.grid,
            p_cell=a * self.p_cell + b * other.p_cell,
            u_cell=a * self.u_cell + b * other.u_cell,
            p_left=a * self.p_left + b * other.p_left,
            d_left=a * self.d_left + b * other.d_left,
            p_right=a * self.p_right + b * other.p_right,
            u_right=a * self.u_right + b * other.u_right,
            p_inf=a * self.p_inf + b * other.p_inf,
            loss_error=max(self.loss_error, other.loss_error),
            mass_error=max(self.mass_error, other.mass_error),
        )
