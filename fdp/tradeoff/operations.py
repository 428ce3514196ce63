"""Curves defined by an operation on another curve: the inverse and subsampling.

These are exact, lazily evaluated wrappers used when the base curve has no
closed form for the result (e.g. the subsampled Gaussian). Piecewise-linear
curves override the operations with exact vertex arithmetic instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fdp._validation import check_array, check_sampling_rate
from fdp.tradeoff import _numeric
from fdp.tradeoff.base import TradeoffCurve, _as_output, _result_class, conjugate_delta

__all__ = ["InverseCurve", "SubsampledCurve"]


@_result_class
@dataclass(frozen=True)
class InverseCurve(TradeoffCurve):
    """f^-1(alpha) = inf { t in [0, 1] : f(t) <= alpha } for a base curve f.

    If f = T(P||Q) then f^-1 = T(Q||P): the same pair with the roles of the
    hypotheses swapped (Dong-Roth-Su, arXiv:1905.02383v3, Section 2). The graph
    of f^-1 is the mirror image of the graph of f in the diagonal beta = alpha.

    Evaluation: vectorised bisection on t over the float keys of [0, 1] (64
    halvings reach adjacent floats). The result is the lower end t_lo of the
    final bracket, where f(t_lo) > alpha >= f(t_hi); so the value returned is
    <= f^-1(alpha) (the safe side) by at most one unit in the last place.

    Attributes:
      base: the curve f being inverted.
    """

    base: TradeoffCurve

    def __post_init__(self) -> None:
        if not isinstance(self.base, TradeoffCurve):
            raise TypeError(f"base must be a TradeoffCurve; got {type(self.base).__name__}")

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        alpha = np.asarray(alpha, dtype=np.float64)
        out = np.zeros(alpha.shape)
        # f^-1(alpha) = 0 where f(0) <= alpha already.
        need = self.base._evaluate(np.zeros(alpha.shape)) > alpha
        if np.any(need):
            target = alpha[need]

            def above(t: np.ndarray) -> np.ndarray:  # True at t = 0, False at t = 1
                return self.base._evaluate(t) > target

            lo, _ = _numeric.bisect_monotone(above, np.zeros(target.shape), np.ones(target.shape))
            out[need] = lo
        return out

    def inverse(self) -> TradeoffCurve:
        """(f^-1)^-1 = f for tradeoff functions: returns the base curve."""
        return self.base

    def delta(self, epsilon: Any) -> float | np.ndarray:
        """delta_{f^-1}(eps) = sup_alpha (1 - alpha - e^eps f(alpha)), an upper bound.

        The graph of f^-1 is the mirror image of the graph of f, so the
        supremum can run over the graph of f (no root-finding); see
        :func:`~fdp.tradeoff.base.conjugate_delta` with ``mirrored=True``. For
        f = T(Q||P) this is H_{e^eps}(Q||P), the other direction's delta.

        Raises:
          ValueError: epsilon NaN, infinite or negative.
        """
        eps = check_array("epsilon", epsilon, low=0.0)
        return _as_output(conjugate_delta(self.base, eps.ravel(), mirrored=True), eps)

    def _vertices(self) -> np.ndarray:
        # Kinks of f^-1 sit at beta-coordinates of the kinks of f.
        v = self.base._vertices()
        return self.base._evaluate(v) if v.size else v


@_result_class
@dataclass(frozen=True)
class SubsampledCurve(TradeoffCurve):
    """f_p = p f + (1 - p) Id, Id(alpha) = 1 - alpha: Poisson subsampling at rate p.

    For f = T(P0||P1), f_p = T(P0 || (1-p) P0 + p P1) (Dong-Roth-Su,
    arXiv:1905.02383v3, subsampling section; the seed paper's mixture
    proposition). This is the *remove* direction of docs/accountant.md; the add
    direction is f_p^-1 (:meth:`TradeoffCurve.subsampled` with
    ``direction="add"``). Evaluation is exact:

        f_p(alpha)     = p f(alpha) + (1 - p)(1 - alpha)
        1 - f_p(alpha) = p (1 - f(alpha)) + (1 - p) alpha   (no cancellation)

    Attributes:
      base: the curve f of one step without subsampling.
      sampling_rate: p in (0, 1].
    """

    base: TradeoffCurve
    sampling_rate: float

    def __post_init__(self) -> None:
        if not isinstance(self.base, TradeoffCurve):
            raise TypeError(f"base must be a TradeoffCurve; got {type(self.base).__name__}")
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        p = self.sampling_rate
        return p * self.base._evaluate(alpha) + (1.0 - p) * (1.0 - alpha)

    def _evaluate_complement(self, alpha: np.ndarray) -> np.ndarray:
        p = self.sampling_rate
        return p * self.base._evaluate_complement(alpha) + (1.0 - p) * alpha

    def _vertices(self) -> np.ndarray:
        return self.base._vertices()
