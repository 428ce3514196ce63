"""A step on a fixed-size batch drawn without replacement, under the replace-one relation.

Each step draws a batch of exactly B of the N examples, uniformly and without
replacement, independently of the other steps, and runs the mechanism on it.
Neighbouring data sets have the same size N and differ in one example (*replace
one*). Subsampling theorem (Dong, Roth and Su, "Gaussian Differential Privacy",
JRSS-B 2022, Theorem 4.2 of arXiv:1905.02383): if the mechanism is f-DP between
batches that differ in one replaced example, the step is

    C_p(f) = min{f_p, f_p^{-1}}**-DP,   f_p = p f + (1 - p) Id,   p = B / N,

which is exactly what the accountant composes for the mechanism Poisson-subsampled
at rate p (both directions, :mod:`fdp.mechanisms.base`). So this class is that
mechanism at p = B / N, named for what it is: its epsilon is a guarantee for
*replacing* one example, not for adding or removing one (a different, incomparable
relation: under replace-one a clipped sum moves by up to 2C, so DP-SGD's step with
noise std sigma C is the Gaussian mechanism with noise multiplier sigma / 2 here;
``fdp.dpsgd(sampling="without_replacement")`` does that).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from fdp._validation import check_integer, format_value
from fdp.mechanisms.base import Mechanism, mechanism_from_dict, register_mechanism
from fdp.mechanisms.gaussian import Gaussian
from fdp.mechanisms.laplace import Laplace
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["SampledWithoutReplacement"]


@register_mechanism
@dataclass(frozen=True)
class SampledWithoutReplacement(Mechanism):
    """One step on a batch of exactly ``sample_size`` of ``dataset_size`` examples, drawn
    without replacement; neighbouring data sets differ in one *replaced* example.

    Args:
      mechanism: the step as a function of its batch, at sampling_rate 1:
        ``fdp.Gaussian(noise_multiplier=s)`` or ``fdp.Laplace(scale=s)``, with s the noise
        relative to the sensitivity between two batches that differ in one replaced
        example (as dp_accounting's events under REPLACE_ONE). For DP-SGD with clipping
        norm C and noise std sigma C that sensitivity is 2C: s = sigma / 2.
      sample_size: B in [1, N].
      dataset_size: N >= 1.

    Raises:
      ValueError: another mechanism, a sampling_rate other than 1, or B outside [1, N].

    Example:
      >>> import fdp
      >>> step = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=0.55), sample_size=256,
      ...                                       dataset_size=60000)
      >>> fdp.PLDAccountant().compose(step, steps=14100).get_epsilon_bounds(1e-5)[1] > 0
      True
    """

    mechanism: Any
    sample_size: int
    dataset_size: int
    kind = "sampled_without_replacement"
    #: The neighbouring relation its epsilon is for.
    neighboring: ClassVar[str] = "replace_one"

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, (Gaussian, Laplace)):
            raise ValueError("mechanism must be fdp.Gaussian or fdp.Laplace (the step on its batch); got "
                             f"{format_value(self.mechanism)}")
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
    def subsampled(self) -> Mechanism:
        """The mechanism at sampling rate B / N, whose privacy loss this step has."""
        return dataclasses.replace(self.mechanism, sampling_rate=self.sampling_rate)

    @property
    def kernel_groups(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.subsampled.kernel_groups

    @property
    def exact_cells(self) -> bool:  # type: ignore[override]
        return self.subsampled.exact_cells

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        return self.subsampled.loss_cells(direction, grid, pessimistic=pessimistic, focus=focus)

    def focus_key(self, direction: Direction, focus: tuple[float, float]) -> Any:
        return self.subsampled.focus_key(direction, focus)

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        return self.subsampled.loss_range(direction, tail_mass)

    def grid_anchor(self, direction: Direction) -> float | None:
        return self.subsampled.grid_anchor(direction)

    def loss_atoms(self, direction: Direction) -> Any:
        return self.subsampled.loss_atoms(direction)

    def is_null(self) -> bool:
        return self.subsampled.is_null()

    def is_symmetric(self) -> bool:
        return self.mechanism.is_symmetric()

    def tradeoff(self):
        """f of the step between two batches that differ in one replaced example."""
        return self.mechanism.tradeoff()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "mechanism": self.mechanism.to_dict(), "sample_size": self.sample_size,
                "dataset_size": self.dataset_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SampledWithoutReplacement":
        return cls(mechanism=mechanism_from_dict(data.get("mechanism")), sample_size=data["sample_size"],
                   dataset_size=data["dataset_size"])
