"""The abstract tradeoff curve and its generic (numerical) operations.

A *tradeoff function* (Dong, Roth and Su, "Gaussian Differential Privacy",
arXiv:1905.02383v3, Definition 2.1 and the characterisation that follows it) is

    f(alpha) = T(P||Q)(alpha) = inf { 1 - E_Q[phi] : E_P[phi] <= alpha },

the smallest type II error beta of a test phi of P against Q with type I error at
most alpha. Exactly the functions f: [0, 1] -> [0, 1] that are convex,
continuous, non-increasing and satisfy f(alpha) <= 1 - alpha arise this way.
A mechanism is f-DP when T(M(D)||M(D')) >= f for all neighbours: a *larger*
curve is *more* private, so for a privacy guarantee the *smaller* value is the
safe (pessimistic, sound) side. Every numerical answer here errs that way:

* ``f(alpha)``: exact up to rounding for closed forms; root-finding
  representations return the lower end of the final bracket (<= f).
* ``delta(epsilon)``: an upper bound (certified by concavity, see
  :func:`conjugate_delta`).
* ``epsilon(delta)``: an upper bound (the bisection's upper end).
* ``symmetrized()`` and ``to_piecewise_linear(side="lower")``: curves <= f.

Notation used in the docstrings: alpha = type I error, beta = type II error,
Id(alpha) = 1 - alpha (the curve of two identical distributions),
f*(y) = sup_alpha (y alpha - f(alpha)) the convex conjugate.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from fdp._validation import check_array, check_integer, check_real, check_sampling_rate, format_value
from fdp.tradeoff import _numeric

if TYPE_CHECKING:  # pragma: no cover - annotations only, never run
    from fdp.tradeoff.piecewise import PiecewiseLinearCurve

__all__ = ["TradeoffCurve", "conjugate_delta", "EPSILON_SEARCH_MAX"]

#: Largest epsilon that :meth:`TradeoffCurve.epsilon` searches; beyond it the
#: answer is reported as ``inf``.
EPSILON_SEARCH_MAX = 1000.0

_DIRECTIONS = ("remove", "add")


#: The classes the generic operations return, by name: their modules import this one, so
#: they register them (:func:`_result_class`) instead of being imported here (no cycle);
#: fdp/tradeoff/__init__.py imports them all before any of its modules can be used.
_RESULT_CLASSES: dict[str, Any] = {}
_C = TypeVar("_C", bound=type)


def _result_class(cls: _C) -> _C:
    """Class decorator: make ``cls`` available to the generic operations of this module."""
    _RESULT_CLASSES[cls.__name__] = cls
    return cls


def _as_output(values: np.ndarray, like: np.ndarray) -> float | np.ndarray:
    """Scalar (0-d) input -> Python float; array input -> array of that shape."""
    values = np.asarray(values, dtype=np.float64).reshape(like.shape)
    if like.ndim == 0:
        return float(values)
    return values


class TradeoffCurve(abc.ABC):
    """A tradeoff function f: [0, 1] -> [0, 1] (Dong-Roth-Su f-DP), vectorised.

    Subclasses are immutable (frozen dataclasses) and implement
    :meth:`_evaluate` on a validated float64 array. Everything else has a
    generic numerical implementation here that subclasses may override with
    exact ones.

    Calling ``f(alpha)`` accepts a float or array-like in [0, 1] and returns a
    float for scalar input, else a NumPy array of the same shape.
    """

    __slots__ = ()

    # ------------------------------------------------------------------ core
    @abc.abstractmethod
    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        """f(alpha) for a validated float64 array (any shape) in [0, 1]."""

    def _evaluate_complement(self, alpha: np.ndarray) -> np.ndarray:
        """1 - f(alpha); subclasses override where that avoids cancellation."""
        return 1.0 - self._evaluate(alpha)

    def _vertices(self) -> np.ndarray:
        """alpha-coordinates of kinks (empty for smooth curves)."""
        return np.empty(0)

    def __call__(self, alpha: Any) -> float | np.ndarray:
        """beta = f(alpha), the smallest type II error at type I error alpha.

        Args:
          alpha: type I error(s) in [0, 1]; float or array-like.

        Returns:
          float for scalar input, else an array of alpha's shape.

        Raises:
          ValueError: alpha is NaN, infinite or outside [0, 1].
        """
        a = check_array("alpha", alpha, low=0.0, high=1.0)
        return _as_output(self._evaluate(a.ravel()), a)

    # ------------------------------------------------------------ operations
    def inverse(self) -> TradeoffCurve:
        """The inverse curve f^-1(alpha) = inf { t in [0, 1] : f(t) <= alpha }.

        If f = T(P||Q) then f^-1 = T(Q||P) (Dong-Roth-Su, arXiv:1905.02383v3,
        Section 2; stated in the seed paper after its definition of the
        tradeoff function). Generic implementation:
        vectorised bisection on the non-increasing f (see
        :class:`~fdp.tradeoff.operations.InverseCurve`).
        """
        return _RESULT_CLASSES["InverseCurve"](base=self)

    def symmetrized(self) -> TradeoffCurve:
        """The symmetric curve g = min{f, f^-1}** (lower convex envelope).

        If the mechanism is f-DP for one ordering of neighbours and f^-1-DP for
        the other, it is g-DP for both; g is the largest symmetric tradeoff
        function below min{f, f^-1} (Dong-Roth-Su, arXiv:1905.02383v3, section on
        subsampling, where this envelope defines the operator C_p).

        Generic implementation: g is computed exactly for the sound piecewise
        linear lower approximation ``self.to_piecewise_linear(side="lower")``,
        so the result is <= the exact envelope (the safe side).
        """
        return self.to_piecewise_linear(side="lower").symmetrized()

    def subsampled(self, p: Any, *, direction: str = "remove") -> TradeoffCurve:
        """Tradeoff curve of one step under Poisson subsampling at rate p.

        With f = T(P0||P1) (P0: output without the individual, P1: with it),
        Dong-Roth-Su (arXiv:1905.02383v3, subsampling section; the seed paper's
        "mixture" proposition) give

            f_p = T(P0 || (1-p) P0 + p P1) = p f + (1-p) Id,   Id(alpha) = 1 - alpha.

        In the privacy-loss convention of docs/accountant.md (pair (P, Q), loss
        log dP/dQ, curve T(Q||P)):

        * ``direction="remove"``: P = (1-p) P0 + p P1, Q = P0, curve
          T(P0 || (1-p) P0 + p P1) = f_p;
        * ``direction="add"``: P = P0, Q = (1-p) P0 + p P1, curve
          T((1-p) P0 + p P1 || P0) = f_p^-1.

        A subsampled mechanism must be accounted in both directions; the
        symmetric guarantee of one step is ``min{f_p, f_p^-1}**``.

        Args:
          p: sampling rate in (0, 1].
          direction: "remove" (f_p) or "add" (f_p^-1).

        Raises:
          ValueError: p outside (0, 1] or an unknown direction.
        """
        rate = check_sampling_rate(p, name="p")
        _check_direction(direction)
        curve = self if rate == 1.0 else _RESULT_CLASSES["SubsampledCurve"](base=self, sampling_rate=rate)
        return curve if direction == "remove" else curve.inverse()

    # --------------------------------------------------------------- duality
    def delta(self, epsilon: Any) -> float | np.ndarray:
        """delta(eps) = 1 + f*(-e^eps) = sup_alpha (1 - f(alpha) - e^eps alpha).

        The smallest delta such that f-DP implies (eps, delta)-DP
        (Dong-Roth-Su, arXiv:1905.02383v3, Proposition 2.12). For f = T(Q||P)
        this is the hockey-stick divergence H_{e^eps}(P||Q).

        Generic implementation: :func:`conjugate_delta`, a certified *upper*
        bound (exact to about 1e-15 absolute).

        Args:
          epsilon: eps >= 0, float or array-like.

        Returns:
          float for scalar input, else an array of epsilon's shape.

        Raises:
          ValueError: epsilon NaN, infinite or negative.
        """
        eps = check_array("epsilon", epsilon, low=0.0)
        return _as_output(conjugate_delta(self, eps.ravel()), eps)

    def _delta_values(self, eps: np.ndarray) -> np.ndarray:
        """Unvalidated delta on a flat array (used by :meth:`epsilon`)."""
        return np.asarray(self.delta(eps), dtype=np.float64).reshape(eps.shape)

    def _epsilon_upper_bracket(self, delta: np.ndarray) -> np.ndarray | None:
        """An eps with delta(eps) <= delta, if a subclass knows one cheaply."""
        return None

    def epsilon(self, delta: Any) -> float | np.ndarray:
        """The smallest eps >= 0 with delta(eps) <= delta (an upper bound).

        delta(eps) is non-increasing, so the answer is found by vectorised
        bisection; the upper end of the final bracket is returned, hence
        delta(returned eps) <= delta and the returned eps is >= the exact one by
        at most a few units in the 12th digit. ``inf`` when no eps <= 1000 works
        (e.g. delta below the mass 1 - f(0) of certain distinguishability).

        Args:
          delta: delta in (0, 1), float or array-like.

        Raises:
          ValueError: delta NaN or outside the open interval (0, 1).
        """
        d = check_array("delta", delta, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)
        return _as_output(self._epsilon_values(d.ravel()), d)

    def _epsilon_values(self, delta: np.ndarray) -> np.ndarray:
        out = np.zeros(delta.shape)
        at_zero = self._delta_values(np.zeros(delta.shape)) <= delta
        hi = self._epsilon_upper_bracket(delta)
        if hi is None:
            # delta at eps = 2^k, k = -3..9, plus the search maximum.
            grid = np.concatenate([2.0 ** np.arange(-3, 10), [EPSILON_SEARCH_MAX]])
            ok = self._delta_values(grid)[None, :] <= delta[:, None]
            first = np.where(ok.any(axis=1), ok.argmax(axis=1), -1)
            hi = np.where(first >= 0, grid[np.maximum(first, 0)], np.inf)
        hi = np.asarray(hi, dtype=np.float64)
        solvable = ~at_zero & np.isfinite(hi)
        out[~at_zero & ~np.isfinite(hi)] = np.inf
        if np.any(solvable):
            d = delta[solvable]

            def too_big(e: np.ndarray) -> np.ndarray:  # True at lo, False at hi
                return self._delta_values(e) > d

            _, upper = _numeric.bisect_monotone(
                too_big, np.zeros(d.shape), hi[solvable], rel_keys=1 << 10
            )
            out[solvable] = upper
        return out

    # ------------------------------------------------------------ comparison
    def dominates(self, other: TradeoffCurve, *, atol: float = 1e-9) -> bool:
        """True if f >= g - atol pointwise, i.e. f is at least as private as g.

        Checked on a dense grid of alpha (1025 uniform points plus 161
        log-spaced points near 0 and near 1) together with the kinks (vertices)
        of both curves. Between two piecewise-linear curves the check is exact
        (both are linear between the union of their vertices); for smooth
        curves a violation narrower than the grid spacing can be missed.

        Args:
          other: the curve g to compare with.
          atol: absolute tolerance on beta (default 1e-9, above the rounding
            error of the root-finding representations).

        Raises:
          TypeError: other is not a TradeoffCurve.
          ValueError: atol negative or not finite.
        """
        if not isinstance(other, TradeoffCurve):
            raise TypeError(f"other must be a TradeoffCurve; got {type(other).__name__}")
        tol = check_real("atol", atol, low=0.0)
        grid = np.unique(
            np.concatenate([_numeric.default_alpha_grid(), self._vertices(), other._vertices()])
        )
        grid = grid[(grid >= 0.0) & (grid <= 1.0)]
        return bool(np.all(self._evaluate(grid) >= other._evaluate(grid) - tol))

    # ------------------------------------------------------ approximations
    def to_piecewise_linear(self, *, num_points: int = 2049, side: str = "lower") -> PiecewiseLinearCurve:
        """A piecewise-linear approximation of f, on the chosen side.

        Samples x_0 = 0 < ... < x_n = 1 are the union of a uniform grid, points
        log-spaced near 0 and 1, and the same grids mapped through f^-1 (so
        steep and flat stretches are both resolved). With f_i = f(x_i) and the
        secant slopes s_i = (f_{i+1} - f_i) / (x_{i+1} - x_i):

        * ``side="upper"``: the chords through (x_i, f_i); >= f by convexity.
        * ``side="lower"``: on [x_i, x_{i+1}] the secant lines of the *adjacent*
          intervals, l_{i-1}(x) = f_i + s_{i-1}(x - x_i) and
          l_{i+1}(x) = f_{i+1} + s_{i+1}(x - x_{i+1}), lie below f (a chord
          extended outside its interval lies below a convex function), so
          max(l_{i-1}, l_{i+1}, 0) <= f; the lower convex hull of those
          polygons is returned (<= f, the sound side for privacy).

        Both sides differ from f by O(h^2 f'') with h the local spacing.

        Args:
          num_points: uniform grid size (>= 3).
          side: "lower" (sound, <= f) or "upper" (>= f).

        Raises:
          ValueError: bad num_points or side.
        """
        piecewise = _RESULT_CLASSES["PiecewiseLinearCurve"]
        n = check_integer("num_points", num_points, low=3)
        if side not in ("lower", "upper"):
            raise ValueError(f"side must be one of 'lower', 'upper'; got {format_value(side)}")
        base = _numeric.default_alpha_grid(n, max(17, n // 4))
        inv = self.inverse()
        adapted = inv._evaluate(base)
        x = np.unique(np.concatenate([base, adapted[np.isfinite(adapted)]]))
        x = x[(x >= 0.0) & (x <= 1.0)]
        fx = self._evaluate(x)
        fc = self._evaluate_complement(x)
        if side == "upper":
            return piecewise._from_vertices(x, fx, 1.0 - x, fc)
        px, py = _numeric.secant_lower_polygon(x, fx)
        return piecewise._from_vertices(px, py, 1.0 - px, 1.0 - py)

    # ----------------------------------------------------------------- plot
    def plot(self, ax: Any = None, *, show_identity: bool = True, **kwargs: Any) -> Any:
        """Draw beta = f(alpha) on [0, 1] and, dashed, the diagonal Id(alpha) = 1 - alpha.

        matplotlib is imported only when this is called.

        Args:
          ax: a matplotlib Axes; a new figure is created when None.
          show_identity: also draw Id (the curve of perfect privacy).
          **kwargs: passed to ``ax.plot`` for the curve (label, color, ...).

        Returns:
          The matplotlib Axes.
        """
        from fdp._optional import require

        plt = require("matplotlib.pyplot", "plot")
        if ax is None:
            _, ax = plt.subplots(figsize=(4.5, 4.5))
        grid = np.unique(np.concatenate([np.linspace(0.0, 1.0, 501), self._vertices()]))
        ax.plot(grid, self._evaluate(grid), **kwargs)
        if show_identity:
            ax.plot([0.0, 1.0], [1.0, 0.0], linestyle="--", color="0.6", linewidth=1.0)
        ax.set_xlim(0.0, 1.0)
        ax.set_ylim(0.0, 1.0)
        ax.set_xlabel("type I error alpha")
        ax.set_ylabel("type II error beta")
        ax.set_aspect("equal")
        return ax


def _check_direction(direction: Any) -> None:
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of 'remove', 'add'; got {format_value(direction)}")


def conjugate_delta(curve: TradeoffCurve, epsilon: np.ndarray, *, mirrored: bool = False) -> np.ndarray:
    """Certified upper bound on delta(eps) = sup_alpha (1 - f(alpha) - e^eps alpha).

    phi(alpha) = (1 - f(alpha)) - e^eps alpha is concave, so a scan of [0, 1]
    (log-spaced down to alpha ~ 1e-300, plus uniform points) followed by a
    golden-section search brackets its maximiser (:func:`_numeric.golden_max`), and
    :func:`_numeric.concave_max_upper_bound` turns the final four points into
    an upper bound (chords of a concave function, extended, lie above it). Exact up to the
    rounding of f (about 1e-16 absolute), and never below the true value when f
    is evaluated exactly. Vectorised over eps (unvalidated float array).

    This is the generic implementation behind :meth:`TradeoffCurve.delta`;
    subclasses with closed forms override it, and the tests compare the two.

    With ``mirrored=True`` it returns delta of the *inverse* curve without
    inverting: the graph of f^-1 is the graph of f mirrored in the diagonal,
    so delta_{f^-1}(eps) = sup_alpha (1 - alpha - e^eps f(alpha)), again a
    concave maximisation (f convex).
    """
    eps = np.asarray(epsilon, dtype=np.float64)
    shape = eps.shape
    eps = eps.ravel()
    if eps.size == 0:
        return np.zeros(shape)

    col = eps[:, None]

    def phi(alpha: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            if mirrored:
                return (1.0 - alpha) - np.exp(col + np.log(curve._evaluate(alpha)))
            return curve._evaluate_complement(alpha) - np.exp(col + np.log(alpha))

    pts, vals = _numeric.golden_max(phi, 0.0, 1.0, eps.size)
    if mirrored:  # concave in alpha, but the bound needs the abscissa beta = f(alpha)
        pts = curve._evaluate(pts)[::-1]
        vals = vals[::-1]
    upper = _numeric.concave_max_upper_bound(pts, vals)
    return np.clip(upper, 0.0, 1.0).reshape(shape)

