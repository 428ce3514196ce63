"""The Gaussian mechanism with a random released sensitivity, Poisson-subsampled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fdp._validation import check_real, check_sampling_rate
from fdp.mechanisms.base import Mechanism, register_mechanism
from fdp.mechanisms.random_sensitivity.cells import cached_cells, focus_window
from fdp.mechanisms.random_sensitivity.laws import ScipyLaw, ZLaw
from fdp.mechanisms.random_sensitivity.quadrature import mixture_alpha_beta_of, mixture_delta_of
from fdp.mechanisms.random_sensitivity.ranges import loss_range
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["RandomSensitivityBase", "RandomSensitivityGaussian"]


class RandomSensitivityBase(Mechanism):
    """Shared implementation of (2)-(3) given ``law()``."""

    kernel_groups = ("jl",)
    noise_multiplier: float
    sampling_rate: float

    def law(self) -> ZLaw:  # pragma: no cover - abstract
        """The law of the random sensitivity Z."""
        raise NotImplementedError

    def is_symmetric(self) -> bool:
        return True  # given Z = z a Gaussian shift: both directions agree at p = 1

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        """Cells of the Z+ (pessimistic) or Z- (optimistic) mixture; see the package docstring.

        With a ``focus`` the Z-partition is refined where single steps have losses in it
        (:func:`fdp.mechanisms.random_sensitivity.cells.focus_window`)."""
        direction = Direction(direction)
        return cached_cells(self, direction, grid, bool(pessimistic), self.focus_key(direction, focus))

    def focus_key(self, direction: Direction, focus: tuple[float, float] | None) -> tuple[float, float] | None:
        """The range of Z refined for ``focus`` (:func:`~.cells.focus_window`), or None."""
        return focus_window(focus, self.noise_multiplier, self.sampling_rate, Direction(direction))

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        return loss_range(self.law(), self.noise_multiplier, self.sampling_rate,
                           Direction(direction), tail_mass)

    def alpha_beta(self, t: Any) -> tuple[np.ndarray, np.ndarray]:
        """(alpha(t), beta(t)) of equation (3), |error| <= 1e-9, vectorised over t."""
        return mixture_alpha_beta_of(self.law(), self.noise_multiplier, t)

    def delta(self, epsilon: Any, direction: Direction | str = Direction.REMOVE) -> np.ndarray:
        """delta(eps) of ONE subsampled step in ``direction``: E_Z[delta_gauss(eps; Z/sigma, p)]."""
        return mixture_delta_of(self.law(), self.noise_multiplier, self.sampling_rate, epsilon,
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
class RandomSensitivityGaussian(RandomSensitivityBase):
    """Gaussian mechanism whose (released) sensitivity Z/sigma is random, Poisson-subsampled.

    Given Z = z it adds N(0, sigma^2) noise to a query of sensitivity z; Z is
    part of the output. JL is the case Z = 1/sqrt(chi2_r / r); Z = c is
    ``Gaussian(sigma / c)``. A discrete law (``scipy.stats`` discrete, e.g.
    ``bernoulli``, ``poisson`` or ``rv_discrete(values=...)``) is treated exactly as
    the finite mixture of its atoms; a continuous one through certified cells.

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
        object.__setattr__(self, "_zlaw", ScipyLaw(d))

    def law(self) -> ZLaw:
        return self._zlaw  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        raise ValueError(
            "RandomSensitivityGaussian cannot be written to JSON (its z_distribution is an "
            "arbitrary scipy object); use fdp.JL for the JL mechanism"
        )
