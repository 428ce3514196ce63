"""Epsilon read as a risk: certified bounds on a membership-inference attacker's power.

A membership-inference attack on one example x is a test between "x was not in the
training set" (null) and "x was" (alternative). Its false-positive rate is
FPR = alpha (type I error) and its true-positive rate TPR = 1 - beta, so for a run
whose composed tradeoff curve is f (Dong-Roth-Su f-DP), every attack obeys

    TPR <= 1 - f(FPR),                                                        (1)

and the best attack's advantage max(TPR - FPR) is the total variation distance of
the two output laws, delta(0) (the hockey-stick divergence at eps = 0).       (2)

Both come bracketed from the accountant:

* ``tpr_upper`` = 1 - g(alpha), g = ``accountant.tradeoff()``, the certified
  lower bound on the symmetrised curve min{f, f^-1}** (both neighbouring
  relations, either role of the hypotheses): no attack does better.
* ``tpr_lower`` = 1 - u(alpha), u an upper bound on T(out, in), the curve of the
  test with null "x out" (output law P0) and alternative "x in" (the subsampled
  mixture). Any rejection set S has in(S) <= e^eps out(S) + H_{e^eps}(in || out),
  and by duality the best test's TPR is exactly

      1 - T(out, in)(alpha) = inf_eps delta(eps) + e^eps alpha                 (3)

  with delta the profile of the remove direction (P = in, Q = out). Its optimistic
  composed PLD (atoms q_k on the grid x_k = (offset + k) h, true losses within
  e <= loss_error of x_k) gives

      D(eps) = [sum_k q_k (1 - e^{eps + e - x_k})_+ + p_inf + delta_shift] / (1 + rel_error)

  with D <= delta (``DiscretePLD.delta``, bound -1), so the inf of D(eps) + e^eps alpha
  bounds (3) below. Its derivative in eps, e^eps (alpha - sum_{x_k > eps + e}
  q_k e^{e - x_k} / (1 + rel_error)), has constant sign between the breakpoints
  b_j = x_j - e: the inf is at a b_j or at eps -> -inf (D(-inf), the whole mass; at
  +inf the top grid point already has no atom above it). So

      TPR >= max(alpha, min(1, D(-inf), min_j D(b_j) + e^{b_j} alpha)).      (4)

  The best test also has TPR >= alpha (reject at random); the attack achieving the
  bound exists for the mechanism as defined. (4) is computed in this form, never
  as 1 - (1 - ...): a value near 1 is stored only to within 2^-53 absolutely, far
  more than a TPR of 1e-13 allows. Each float step is bounded, u = 2^-53, and its
  error charged downwards:

  - ``DiscretePLD.profile_on_grid`` returns eps_j <= b_j and d_j <= D(b_j)
    (rounding included, see there);
  - s_j = fl(fl(exp(eps_j)) (1 - 16u)) <= e^{eps_j} <= e^{b_j}: exp is within
    1 ulp, <= 2u relative, charged as 8u; the product adds one rounding. s_j = 0
    where eps_j < -700, so that exp never enters the subnormal range;
  - r_j = fl(fl(s_j alpha) + d_j) <= (s_j alpha + d_j)(1 + u)^2 + 2^-1075 (1 + u):
    the product may underflow (absolute error <= 2^-1075), the sum of two
    non-negative floats errs relatively. With m = min_j r_j, the float below m is
    <= m - 2^-1074, and fl of that times 1 - 4u, stepped one float down, is
    <= (m - 2^-1074) / (1 + u)^2 <= min_j s_j alpha + d_j;
  - D(-inf) = (sum_k q_k + p_inf + delta_shift) / (1 + rel_error): ``math.fsum``
    is correctly rounded, and each of the four steps is stepped one float down
    (the divisor one float up).

* ``tpr_upper``'s float steps: g = ``accountant.tradeoff()`` is a polygon; its
  evaluation by linear interpolation (``numpy.interp``) between vertices (a0, b0),
  (a1, b1) in [0, 1]^2, g~ = fl(b0 + fl(fl(b1 - b0) / fl(a1 - a0)) fl(alpha - a0)),
  has a product within 5.01u relative of the exact term (b1 - b0)(alpha - a0) /
  (a1 - a0), at most 1 in size, and a final rounding <= u, so |g~ - g| <= 6.02u;
  fl(1 - g~) errs by <= u more (not at all when g~ >= 1/2). fl(1 - g~) + 8u, stepped
  one float up and capped at 1, is therefore >= 1 - g(alpha). (The polygon's own
  vertices are the tradeoff module's: see ``fdp.tradeoff.epsilon_delta``.)
* ``advantage`` = ``accountant.get_delta_bounds(0.0)``, (2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fdp._validation import check_array

__all__ = ["AttackRisk", "DEFAULT_FPR", "attack_risk"]

#: False-positive rates reported when none are given.
DEFAULT_FPR = (1e-5, 1e-4, 1e-3, 1e-2, 0.1)


@dataclass(frozen=True)
class AttackRisk:
    """Certified brackets on the best membership-inference attack (see :mod:`fdp.risk`).

    Attributes:
      fpr: the false-positive rates alpha asked for.
      tpr_lower, tpr_upper: lower <= the best attack's TPR at each alpha <= upper.
      advantage: (lower, upper) on max over attacks of TPR - FPR.
    """

    fpr: np.ndarray
    tpr_lower: np.ndarray
    tpr_upper: np.ndarray
    advantage: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        """Plain floats and lists (for JSON)."""
        return {
            "fpr": [float(a) for a in self.fpr],
            "tpr_lower": [float(t) for t in self.tpr_lower],
            "tpr_upper": [float(t) for t in self.tpr_upper],
            "advantage": [float(self.advantage[0]), float(self.advantage[1])],
        }

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        """TPR against FPR on log-log axes: the certified band, the diagonal TPR = FPR
        (a guess), and the points asked for. Needs matplotlib (``pip install "fdp[plot]"``)."""
        from fdp._optional import require

        plt = require("matplotlib.pyplot", "plot")
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 4))
        ax.fill_between(self.fpr, self.tpr_lower, self.tpr_upper, alpha=0.35,
                        label="best attack's TPR (certified band)", **kwargs)
        ax.plot(self.fpr, self.tpr_upper, "o-", markersize=3, label="upper bound: 1 - f(FPR)")
        ax.plot(self.fpr, self.fpr, "--", color="0.6", label="random guess")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("false-positive rate")
        ax.set_ylabel("true-positive rate")
        ax.set_title(f"membership inference; advantage <= {self.advantage[1]:.3g}")
        ax.legend(fontsize=8)
        return ax


def attack_risk(accountant: Any, fpr: Any = DEFAULT_FPR) -> AttackRisk:
    """Bounds on the best membership-inference attack against ``accountant``'s run.

    Args:
      accountant: an :class:`fdp.PLDAccountant` with the run's mechanisms composed
        (e.g. ``fdp.dpsgd(...)``).
      fpr: false-positive rates in [0, 1] (scalar or 1-D).

    Returns:
      The bounds, as an ``AttackRisk``.

    Raises:
      ValueError: fpr outside [0, 1] or NaN; an accountant with no events.

    Examples:
      >>> import fdp
      >>> acc = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60)
      >>> risk = fdp.attack_risk(acc, fpr=[0.01])   # TPR at FPR 1 % is at most ~0.10
    """
    from fdp.accountant import PLDAccountant
    from fdp.pld.cells import Direction

    if not isinstance(accountant, PLDAccountant):
        raise ValueError(f"accountant must be an fdp.PLDAccountant; got {type(accountant).__name__}")
    alpha = np.atleast_1d(check_array("fpr", fpr, low=0.0, high=1.0)).astype(np.float64).ravel()
    g = np.asarray(accountant.tradeoff()(alpha), dtype=np.float64)
    upper = np.minimum(np.nextafter((1.0 - g) + _EVAL_MARGIN, np.inf), 1.0)

    pld = accountant.composed_pld(Direction.REMOVE, pessimistic=False)  # delta = H(in || out)
    if pld.tilt != 0.0 or pld.bound >= 0:  # pragma: no cover - the accountant's composed_pld
        raise AssertionError("attack_risk needs an untilted optimistic PLD")
    lower = np.maximum(alpha, np.minimum(1.0, np.minimum(_mass_lower(pld), _lines_minimum(pld, alpha))))
    return AttackRisk(fpr=alpha, tpr_lower=lower, tpr_upper=upper,
                      advantage=tuple(accountant.get_delta_bounds(0.0)))


#: Unit round-off of float64.
_U = 2.0**-53
#: The absolute error charged to the evaluation of 1 - g(alpha) (module docstring).
_EVAL_MARGIN = 8.0 * _U
#: Elements per block of the (alpha, line) table of :func:`_lines_minimum`.
_BLOCK = 1 << 22


def _lines_minimum(pld: Any, alpha: np.ndarray) -> np.ndarray:
    """A lower bound on min_j D(b_j) + e^{b_j} alpha of (4), for each alpha."""
    eps, d = pld.profile_on_grid()  # eps_j <= b_j, d_j <= D(b_j)
    with np.errstate(over="ignore"):
        s = np.exp(eps) * (1.0 - 16.0 * _U)  # <= e^{eps_j} (exp within 1 ulp, charged 8u)
    s[eps < -700.0] = 0.0  # (never a subnormal exp)
    out = np.empty(alpha.size)
    rows = max(1, _BLOCK // max(s.size, 1))
    big = eps > 700.0  # e^{eps_j} overflows: e^{eps_j} alpha from its log (alpha may be subnormal)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for i in range(0, alpha.size, rows):
            a = alpha[i:i + rows, None]
            product = np.where(a > 0.0, s * a, 0.0)  # (inf * 0 never enters)
            if big.any():
                log_a = np.log(a)
                t = eps[big] + log_a
                # log within 1 ulp (2u |log a|), the sum within u |t|, charged as 4u each; exp as 16u
                slack = 4.0 * _U * (np.abs(eps[big]) + np.abs(log_a) + np.abs(t))
                product[:, big] = np.where(a > 0.0, np.exp(t - slack) * (1.0 - 16.0 * _U), 0.0)
            out[i:i + rows] = np.min(product + d, axis=1)
    # r_j <= (s_j alpha + d_j)(1 + u)^2 + 2^-1075 (1 + u): take one float off, then 1 - 4u
    return np.maximum(np.nextafter(np.nextafter(out, -np.inf) * (1.0 - 4.0 * _U), -np.inf), 0.0)


def _mass_lower(pld: Any) -> float:
    """A lower bound on D(-inf) = (sum_k q_k + p_inf + delta_shift) / (1 + rel_error)."""
    def down(x: float) -> float:  # the float below a round-to-nearest result is below the exact value
        return math.nextafter(x, -math.inf)

    total = down(math.fsum(pld.pmf.tolist()))  # fsum is correctly rounded
    total = down(down(total + pld.p_inf) + pld.delta_shift)
    return max(down(total / math.nextafter(1.0 + pld.rel_error, math.inf)), 0.0)
