"""Piecewise-linear tradeoff curves: the exact curves of discrete pairs.

For a pair of discrete distributions the Neyman-Pearson tests (reject when the
likelihood ratio exceeds a threshold, flip a coin at the threshold) trace a
polygon: between two consecutive thresholds the coin-flip probability moves
the test linearly along a segment. Every operation of this module is exact
vertex arithmetic on such polygons; no grid is involved.

Besides the vertices (alpha_k, beta_k) each curve keeps the complements
(1 - alpha_k, 1 - beta_k), computed without cancellation where they come from
(sums of small masses), so that delta(eps) ~ 1e-12 keeps its relative accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fdp._kernels.hull import lower_hull_indices
from fdp._validation import check_array, check_probability, check_sampling_rate, format_value
from fdp.tradeoff.base import TradeoffCurve, _as_output, _check_direction, _result_class

__all__ = ["PiecewiseLinearCurve", "convex_minimum", "identity_curve"]

#: Tolerance on input vertices (convexity, f <= Id, f(1) = 0) and on the total
#: mass of privacy-loss atoms.
VERTEX_TOL = 1e-9


@_result_class
@dataclass(frozen=True, eq=False, repr=False, init=False)
class PiecewiseLinearCurve(TradeoffCurve):
    """A convex polygon f through vertices (alpha_k, beta_k), 0 = alpha_0 < ... < alpha_n = 1.

    f(alpha) is the linear interpolation of the vertices. Construction validates
    that the vertices describe a tradeoff function: alpha starts at 0, ends at 1
    and is non-decreasing, beta <= 1 - alpha, and the polygon is convex (each
    vertex within 1e-9 of the lower convex hull of all vertices). The stored
    vertices are that hull (collinear and duplicate points removed).

    Args:
      alpha: 1-D array of type I errors in [0, 1], non-decreasing, from 0 to 1.
      beta: 1-D array of type II errors in [0, 1], same length.

    Raises:
      ValueError: any of the conditions above fails (the message names it).

    Attributes:
      alpha, beta: read-only vertex arrays (after hull cleaning).
    """

    alpha: np.ndarray
    beta: np.ndarray
    _alpha_c: np.ndarray = field(repr=False)
    _beta_c: np.ndarray = field(repr=False)
    _slopes: np.ndarray = field(repr=False)

    def __init__(self, alpha: Any, beta: Any) -> None:
        a = check_array("alpha", alpha, low=0.0, high=1.0, ndim=1)
        b = check_array("beta", beta, low=0.0, high=1.0, ndim=1)
        if a.size != b.size or a.size < 2:
            raise ValueError(
                f"alpha and beta must have the same length >= 2; got {a.size} and {b.size}"
            )
        if np.any(np.diff(a) < 0.0):
            i = int(np.argmax(np.diff(a) < 0.0))
            raise ValueError(
                f"alpha must be non-decreasing; got alpha[{i}]={format_value(a[i])} > "
                f"alpha[{i + 1}]={format_value(a[i + 1])}"
            )
        if a[0] != 0.0 or a[-1] != 1.0:
            raise ValueError(
                f"alpha must start at 0 and end at 1; got alpha[0]={format_value(a[0])}, "
                f"alpha[-1]={format_value(a[-1])}"
            )
        excess = b - (1.0 - a)
        if np.any(excess > VERTEX_TOL):
            i = int(np.argmax(excess))
            raise ValueError(
                f"beta must satisfy beta <= 1 - alpha (a tradeoff curve lies below Id); "
                f"got beta={format_value(b[i])} at alpha={format_value(a[i])}"
            )
        b = np.where(a == 1.0, 0.0, b)  # f(1) = 0, within VERTEX_TOL by the check above
        idx = lower_hull_indices(a, b)
        gap = b - np.interp(a, a[idx], b[idx])
        if np.any(gap > VERTEX_TOL):
            i = int(np.argmax(gap))
            raise ValueError(
                f"alpha, beta must be the vertices of a convex curve; vertex {i} "
                f"(alpha={format_value(a[i])}, beta={format_value(b[i])}) lies {gap[i]:.3g} "
                "above the lower convex hull. "
                "Use PiecewiseLinearCurve.from_points for the convex envelope of arbitrary points"
            )
        self._set(a[idx], b[idx], 1.0 - a[idx], 1.0 - b[idx])

    # ----------------------------------------------------------- builders
    def _set(self, a: np.ndarray, b: np.ndarray, ac: np.ndarray, bc: np.ndarray) -> None:
        arrays = {"alpha": a, "beta": b, "_alpha_c": ac, "_beta_c": bc}
        for name, arr in arrays.items():
            arr = np.array(arr, dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.diff(b) / np.diff(a)
        s = np.maximum.accumulate(s)  # convex: non-decreasing (removes rounding noise)
        s.setflags(write=False)
        object.__setattr__(self, "_slopes", s)

    @classmethod
    def _from_vertices(
        cls, alpha: np.ndarray, beta: np.ndarray, alpha_c: np.ndarray, beta_c: np.ndarray
    ) -> PiecewiseLinearCurve:
        """Lower convex hull of trusted points (must include alpha = 0 and alpha = 1)."""
        a = np.clip(np.asarray(alpha, np.float64).ravel(), 0.0, 1.0)
        b = np.clip(np.asarray(beta, np.float64).ravel(), 0.0, 1.0)
        ac = np.clip(np.asarray(alpha_c, np.float64).ravel(), 0.0, 1.0)
        bc = np.clip(np.asarray(beta_c, np.float64).ravel(), 0.0, 1.0)
        # Exact ends: f(1) = 0 for every tradeoff function (forcing it only
        # lowers f, the safe side), and complements consistent at 0 and 1.
        b = np.where(a == 1.0, 0.0, b)
        ac = np.where(a == 1.0, 0.0, np.where(a == 0.0, 1.0, ac))
        bc = np.where(b == 0.0, 1.0, bc)
        idx = lower_hull_indices(a, b)
        if a[idx[0]] != 0.0 or a[idx[-1]] != 1.0:  # pragma: no cover - internal invariant
            raise AssertionError("vertex set must span alpha in [0, 1]")
        obj = object.__new__(cls)
        obj._set(a[idx], b[idx], ac[idx], bc[idx])
        return obj

    @classmethod
    def from_points(cls, alpha: Any, beta: Any) -> PiecewiseLinearCurve:
        """The largest convex curve below the given points: their lower convex hull.

        The point (1, 0) is added (every tradeoff function has f(1) = 0). A point
        with alpha = 0 is required: without f(0) nothing sound can be said near 0.
        The result is <= the polygon through the points (sound side).

        Args:
          alpha, beta: 1-D arrays of equal length in [0, 1] (any order).

        Raises:
          ValueError: values outside [0, 1], NaN, mismatched lengths or no alpha = 0.
        """
        a = check_array("alpha", alpha, low=0.0, high=1.0, ndim=1)
        b = check_array("beta", beta, low=0.0, high=1.0, ndim=1)
        if a.size != b.size or a.size < 1:
            raise ValueError(f"alpha and beta must have the same length >= 1; got {a.size} and {b.size}")
        if not np.any(a == 0.0):
            raise ValueError(
                f"alpha must contain 0 (the value f(0) is needed); got min alpha {format_value(a.min())}"
            )
        a = np.append(a, 1.0)
        b = np.minimum(np.append(b, 0.0), 1.0 - a)
        return cls._from_vertices(a, b, 1.0 - a, 1.0 - b)

    @classmethod
    def from_privacy_loss_atoms(cls, losses: Any, masses: Any, p_inf: Any = 0.0) -> PiecewiseLinearCurve:
        """Exact tradeoff curve of a discrete pair given by its privacy-loss distribution.

        The pair (P, Q) is described under P: atoms at losses l_k = log(dP/dQ)
        with P-masses m_k, hence Q-masses m_k e^{-l_k}, plus P-mass p_inf at
        l = +inf (where Q has no mass). The curve returned is f = T(Q||P), whose
        delta is the hockey-stick divergence

            delta(eps) = H_{e^eps}(P||Q) = sum_k m_k (1 - e^{eps - l_k})_+ + p_inf
                       = 1 + f*(-e^eps).

        Neyman-Pearson (test Q against P; reject Q on large loss, coin flip at
        the threshold): the vertices start at (alpha, beta) = (0, 1 - p_inf);
        taking the atoms in decreasing l, each adds its Q-mass to alpha and
        removes its P-mass from beta,

            alpha_k = sum_{j<=k} m_j e^{-l_j},    beta_k = sum_{j>k} m_j,

        and the curve ends at (1, 0) (the remaining Q-mass, where P has none).
        Segment k has slope -e^{l_k}, so the polygon is convex.

        Numerics: Q-masses are exp(log m_k - l_k) (no overflow for huge l;
        they underflow to 0 for l > ~745, which lowers the curve, the safe
        side); 1 - beta_k = p_inf + sum_{j<=k} m_j and 1 - alpha_k are kept
        as sums, not differences. Vectorised: one sort and cumulative sums.

        Args:
          losses: 1-D array of losses; +inf atoms are added to p_inf, -inf
            atoms must have zero mass (P has no mass where dP/dQ = 0).
          masses: 1-D array of P-masses in [0, 1], same length.
          p_inf: P(l = +inf) in [0, 1].

        Returns:
          The PiecewiseLinearCurve T(Q||P).

        Raises:
          ValueError: NaN losses, masses outside [0, 1], mismatched lengths,
            mass at -inf, total P-mass p_inf + sum m_k not 1 within 1e-9, or
            total Q-mass sum m_k e^{-l_k} above 1 + 1e-9. A total P-mass short
            of 1 by at most 1e-9 is added to p_inf (pessimistic); an excess
            that small is removed by rescaling the finite masses.
        """
        loss = check_array("losses", losses, allow_inf=True, ndim=1)
        mass = check_array("masses", masses, low=0.0, high=1.0, ndim=1)
        if loss.shape != mass.shape:
            raise ValueError(f"losses and masses must have the same length; got {loss.size} and {mass.size}")
        pinf = check_probability("p_inf", p_inf)
        bad = np.isneginf(loss) & (mass > 0.0)
        if np.any(bad):
            raise ValueError(
                "losses: an atom at -inf must have zero P-mass (P has no mass where dP/dQ = 0); "
                f"got mass {format_value(mass[bad][0])} at loss -inf"
            )
        pinf = pinf + float(np.sum(mass[np.isposinf(loss)]))
        keep = np.isfinite(loss) & (mass > 0.0)
        loss, mass = loss[keep], mass[keep]
        order = np.argsort(-loss, kind="stable")
        loss, mass = loss[order], mass[order]

        total = pinf + float(np.sum(mass))
        if abs(total - 1.0) > VERTEX_TOL:
            raise ValueError(
                "masses plus p_inf must sum to 1 (a probability distribution under P); "
                f"got {format_value(total)}. "
                "Put truncated tail mass into p_inf"
            )
        if total < 1.0:
            pinf += 1.0 - total
        elif total > 1.0 and mass.size:
            mass = mass * ((1.0 - min(pinf, 1.0)) / float(np.sum(mass)))
        with np.errstate(over="ignore"):
            qmass = np.exp(np.log(mass) - loss)
        qsum = float(np.sum(qmass))
        if not qsum <= 1.0 + VERTEX_TOL:
            raise ValueError(
                f"losses, masses: the Q-masses masses * exp(-losses) sum to {format_value(qsum)} > 1, "
                "so these atoms are not the privacy-loss distribution of a pair of distributions"
            )
        if qsum > 1.0:
            qmass = qmass / qsum
            qsum = 1.0
        zero = np.zeros(1)
        tail_q = np.cumsum(qmass[::-1])[::-1]  # sum_{j>=k} q_j
        tail_m = np.cumsum(mass[::-1])[::-1]  # sum_{j>=k} m_j
        rest_q = max(0.0, 1.0 - qsum)  # Q-mass at l = -inf
        a = np.concatenate([zero, np.cumsum(qmass), [1.0]])
        ac = np.concatenate([rest_q + tail_q, [rest_q, 0.0]])
        b = np.concatenate([tail_m, zero, zero])
        bc = np.concatenate([pinf + np.concatenate([zero, np.cumsum(mass)]), [1.0]])
        if mass.size == 0:
            a, ac, b, bc = np.array([0.0, 1.0]), np.array([1.0, 0.0]), np.zeros(2), np.array([pinf, 1.0])
        b[0] = min(b[0], 1.0 - pinf) if mass.size else b[0]
        return cls._from_vertices(a, b, ac, bc)

    # ---------------------------------------------------------- evaluation
    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        return np.interp(alpha, self.alpha, self.beta)

    def _evaluate_complement(self, alpha: np.ndarray) -> np.ndarray:
        return np.interp(alpha, self.alpha, self._beta_c)

    def _vertices(self) -> np.ndarray:
        return self.alpha

    def __repr__(self) -> str:
        return f"PiecewiseLinearCurve(<{self.alpha.size} vertices>, f(0)={self.beta[0]:.6g})"

    @property
    def num_vertices(self) -> int:
        """Number of vertices of the polygon."""
        return int(self.alpha.size)

    @property
    def alphas(self) -> np.ndarray:
        """Alias of :attr:`alpha` (vertex type I errors)."""
        return self.alpha

    @property
    def betas(self) -> np.ndarray:
        """Alias of :attr:`beta` (vertex type II errors)."""
        return self.beta

    # ---------------------------------------------------------- operations
    def inverse(self) -> PiecewiseLinearCurve:
        """Exact f^-1: the polygon mirrored in the diagonal (vertices (beta_k, alpha_k)).

        f^-1(alpha) = inf { t : f(t) <= alpha }; for alpha >= f(0) that is 0, so
        the vertex (1, 0) is added when f(0) < 1.
        """
        a, b = self.beta[::-1], self.alpha[::-1]
        ac, bc = self._beta_c[::-1], self._alpha_c[::-1]
        if a[-1] < 1.0:
            a, b = np.append(a, 1.0), np.append(b, 0.0)
            ac, bc = np.append(ac, 0.0), np.append(bc, 1.0)
        return PiecewiseLinearCurve._from_vertices(a, b, ac, bc)

    def symmetrized(self) -> PiecewiseLinearCurve:
        """Exact min{f, f^-1}**: the lower convex hull of the vertices of f and f^-1.

        The epigraph of min{f, f^-1} is the union of the two epigraphs; its
        convex hull is spanned by the vertices of both polygons (and upward
        rays), so the envelope is the lower hull of the union of vertex sets.
        """
        inv = self.inverse()
        return PiecewiseLinearCurve._from_vertices(
            np.concatenate([self.alpha, inv.alpha]),
            np.concatenate([self.beta, inv.beta]),
            np.concatenate([self._alpha_c, inv._alpha_c]),
            np.concatenate([self._beta_c, inv._beta_c]),
        )

    def subsampled(self, p: Any, *, direction: str = "remove") -> PiecewiseLinearCurve:
        """Exact f_p = p f + (1 - p) Id (remove) or f_p^-1 (add) as a polygon.

        The vertices keep their alpha; beta_k -> p beta_k + (1 - p)(1 - alpha_k)
        and 1 - beta_k -> p (1 - beta_k) + (1 - p) alpha_k. See
        :meth:`TradeoffCurve.subsampled` for the two directions.
        """
        rate = check_sampling_rate(p, name="p")
        _check_direction(direction)
        b = rate * self.beta + (1.0 - rate) * self._alpha_c
        bc = rate * self._beta_c + (1.0 - rate) * self.alpha
        curve = PiecewiseLinearCurve._from_vertices(self.alpha, b, self._alpha_c, bc)
        return curve if direction == "remove" else curve.inverse()

    # -------------------------------------------------------------- duality
    def delta(self, epsilon: Any) -> float | np.ndarray:
        """Exact delta(eps) = max_k (1 - beta_k - e^eps alpha_k) over the vertices.

        The concave function 1 - f(alpha) - e^eps alpha is maximised at the
        vertex where the segment slopes cross -e^eps, found by binary search
        (Dong-Roth-Su, arXiv:1905.02383v3, Proposition 2.12). e^eps alpha_k is
        evaluated as exp(eps + log alpha_k), so eps in the hundreds is fine.

        Raises:
          ValueError: epsilon NaN, infinite or negative.
        """
        eps = check_array("epsilon", epsilon, low=0.0)
        return _as_output(self._delta_values(eps.ravel()), eps)

    def _delta_values(self, eps: np.ndarray) -> np.ndarray:
        n = self.alpha.size
        with np.errstate(over="ignore"):
            k = np.searchsorted(self._slopes, -np.exp(eps), side="left")
        cand = np.clip(k[None, :] + np.arange(-1, 2)[:, None], 0, n - 1)
        with np.errstate(divide="ignore", over="ignore"):
            log_a = np.log(self.alpha[cand])
            vals = self._beta_c[cand] - np.exp(eps[None, :] + log_a)  # -inf loses the max
        return np.clip(vals.max(axis=0), 0.0, 1.0)

    def _epsilon_values(self, delta: np.ndarray) -> np.ndarray:
        """Exact smallest eps >= 0 with max_k (1 - beta_k - e^eps alpha_k) <= delta.

        That is eps = max(0, max_k log((1 - beta_k - delta) / alpha_k)) over
        vertices with 1 - beta_k > delta (inf if such a vertex has alpha_k = 0).
        The maximising vertex is located from the breakpoints eps_j = log(-s_j)
        of the segment slopes s_j, where delta(eps_j) is non-decreasing in j.
        """
        n = self.alpha.size
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_a = np.log(self.alpha)
            eps_j = np.log(-self._slopes)  # -inf for flat segments
            d_j = self._beta_c[:-1] - np.exp(eps_j + log_a[:-1])
        d_j = np.maximum.accumulate(np.where(np.isnan(d_j), 1.0, d_j))
        j = np.searchsorted(d_j, delta, side="right")
        cand = np.clip(j[None, :] + np.arange(-1, 2)[:, None], 0, n - 1)
        excess = self._beta_c[cand] - delta[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.where(excess > 0.0, np.log(excess) - log_a[cand], -np.inf)
        return np.maximum(g.max(axis=0), 0.0)


def convex_minimum(*curves: TradeoffCurve) -> PiecewiseLinearCurve:
    """min{f_1, ..., f_k}**: the largest tradeoff curve below all the given curves.

    If a mechanism is f_i-DP for each i only on part of its neighbouring pairs
    (e.g. one f per direction), it is min_i f_i -DP, and hence g-DP for the
    convex envelope g = (min_i f_i)** (a tradeoff-function lower bound is
    still valid after taking the envelope, which is what makes it a tradeoff
    function). For piecewise-linear curves g is exact: the lower convex hull of
    the union of their vertices. Other curves enter through their sound lower
    approximation ``to_piecewise_linear(side="lower")``, so g is never above
    the exact envelope.

    Args:
      *curves: one or more TradeoffCurve objects.

    Raises:
      TypeError: an argument is not a TradeoffCurve.
      ValueError: no curves given.
    """
    if not curves:
        raise ValueError("curves must contain at least one TradeoffCurve; got none")
    polys = []
    for i, c in enumerate(curves):
        if not isinstance(c, TradeoffCurve):
            raise TypeError(f"curves[{i}] must be a TradeoffCurve; got {type(c).__name__}")
        polys.append(c if isinstance(c, PiecewiseLinearCurve) else c.to_piecewise_linear(side="lower"))
    return PiecewiseLinearCurve._from_vertices(
        np.concatenate([c.alpha for c in polys]),
        np.concatenate([c.beta for c in polys]),
        np.concatenate([c._alpha_c for c in polys]),
        np.concatenate([c._beta_c for c in polys]),
    )


def identity_curve() -> PiecewiseLinearCurve:
    """Id(alpha) = 1 - alpha: perfect privacy, T(P||P) (the identity of composition)."""
    return PiecewiseLinearCurve(alpha=[0.0, 1.0], beta=[1.0, 0.0])
