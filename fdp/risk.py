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
  so T(out, in)(alpha) = sup_eps 1 - delta(eps) - e^eps alpha with delta the profile
  of the remove direction (P = in, Q = out), and with its optimistic composed PLD's
  certified lower bounds delta_lo <= delta:

      T(out, in)(alpha) <= sup_eps 1 - delta_lo(eps) - e^eps alpha.

  delta_lo is a discrete PLD's sum over grid losses l_k (shifted by its loss error),
  so 1 - delta_lo(eps) - e^eps alpha has derivative e^eps (sum_{l_k > eps} q_k - alpha')
  of constant sign between grid losses: its sup is at a grid loss (where
  ``DiscretePLD.profile_on_grid`` evaluates it) or at eps -> -inf (the floor
  1 - delta_lo(-inf), the mass the grid lost, ~1e-12), and u <= 1 - alpha is kept.
  The attack achieving 1 - T(out, in)(alpha) exists for the mechanism as defined,
  so the best attack's TPR is at least ``tpr_lower``.
* ``advantage`` = ``accountant.get_delta_bounds(0.0)``, (2).
"""

from __future__ import annotations

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
      An :class:`AttackRisk`.

    Raises:
      ValueError: fpr outside [0, 1] or NaN; an accountant with no events.

    Example:
      >>> import fdp
      >>> acc = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60)
      >>> risk = fdp.attack_risk(acc, fpr=[0.01])   # TPR at FPR 1 % is at most ~0.10
    """
    from fdp.accountant import PLDAccountant
    from fdp.pld.cells import Direction
    from fdp.tradeoff.epsilon_delta import profile_envelope

    if not isinstance(accountant, PLDAccountant):
        raise ValueError(f"accountant must be an fdp.PLDAccountant; got {type(accountant).__name__}")
    alpha = np.atleast_1d(check_array("fpr", fpr, low=0.0, high=1.0)).astype(np.float64).ravel()
    upper = np.clip(1.0 - np.asarray(accountant.tradeoff()(alpha), dtype=np.float64), 0.0, 1.0)

    pld = accountant.composed_pld(Direction.REMOVE, pessimistic=False)  # delta = H(in || out)
    if pld.tilt != 0.0:  # pragma: no cover - the accountant's composed_pld is untilted
        raise AssertionError("attack_risk needs an untilted optimistic PLD")
    eps, delta_lo = pld.profile_on_grid()
    envelope = np.asarray(profile_envelope(eps, delta_lo)(alpha), dtype=np.float64)
    floor = 1.0 - float(pld.delta(float(eps[0]) - 60.0))  # >= 1 - delta_lo(-inf)
    f_up = np.minimum(1.0 - alpha, np.maximum(envelope, max(floor, 0.0)))
    lower = np.clip(1.0 - f_up, 0.0, 1.0)
    return AttackRisk(fpr=alpha, tpr_lower=lower, tpr_upper=upper,
                      advantage=tuple(accountant.get_delta_bounds(0.0)))
