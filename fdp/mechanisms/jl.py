"""The JL mechanism of DP-SGD-JL (seed, Section "Privacy Analysis").

Paper: Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat, "Fast and Memory Efficient
Differentially Private-SGD via JL Projections", arXiv:2102.03013v2.

One step of DP-SGD-JL, for the worst-case sample, is the Gaussian mechanism with
the random released sensitivity Z = Z_r = 1/sqrt(chi2_r / r) (Lemma
"subroutine_privacy"): f = T(Z, N(Z/sigma, 1) || Z, N(0, 1)). The maths of such
mechanisms -- the Z-mixture of subsampled-Gaussian PLDs, the tradeoff curve by
quadrature, the certified cells -- is in :mod:`fdp.mechanisms.random_sensitivity`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fdp._validation import check_integer, check_real, check_sampling_rate
from fdp.mechanisms.base import register_mechanism
from fdp.mechanisms.random_sensitivity import MAX_LOSS, ChiLaw, RandomSensitivityBase, RandomSensitivityGaussian, ZLaw
from fdp.pld.cells import Direction

__all__ = ["JL", "MAX_LOSS", "RandomSensitivityGaussian", "jl_alpha_beta", "jl_delta"]


def jl_alpha_beta(t: Any, sigma: float, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(alpha(t), beta(t)) of the seed's Lemma "subroutine_privacy", equation (3).

    Quadrature error <= 1e-9 absolute (tests compare with mpmath at 30 digits).
    """
    return JL(noise_multiplier=sigma, jl_projections=r).alpha_beta(t)


def jl_delta(epsilon: Any, sigma: float, r: int, p: float = 1.0,
             direction: Direction | str = Direction.REMOVE) -> np.ndarray:
    """delta(eps) = E_Z[delta_subsampled_gauss(eps; Z/sigma, p)] of ONE step, by quadrature."""
    return JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p).delta(epsilon, direction)


@register_mechanism
@dataclass(frozen=True)
class JL(RandomSensitivityBase):
    """One step of DP-SGD-JL / DP-Adam-JL (seed, Lemma "subroutine_privacy").

    f = T(Z, N(Z/sigma, 1) || Z, N(0, 1)) with Z = 1/sqrt(chi2_r / r), Poisson
    subsampled at rate p. Its epsilon is at least the Gaussian mechanism's with
    the same sigma and tends to it as r -> inf.

    Args:
      noise_multiplier: sigma > 0 (noise std / clipping norm).
      jl_projections: r >= 1, the number of JL projections.
      sampling_rate: p in (0, 1].

    Examples:
      >>> import fdp
      >>> acc = fdp.PLDAccountant().compose(
      ...     fdp.JL(noise_multiplier=0.6, jl_projections=30, sampling_rate=256 / 25000), steps=98)
    """

    noise_multiplier: float
    jl_projections: int
    sampling_rate: float = 1.0
    kind = "jl"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier",
            check_real("noise_multiplier", self.noise_multiplier, low=0.0, low_inclusive=False),
        )
        object.__setattr__(self, "jl_projections",
                           check_integer("jl_projections", self.jl_projections, low=1, high=10**9))
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))

    def law(self) -> ZLaw:
        return ChiLaw(self.jl_projections)
