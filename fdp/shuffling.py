"""A certified lower bound on the epsilon of shuffled DP-SGD.

Shuffling: every epoch a uniformly random permutation of the N examples is cut into
t = floor(N / B) consecutive batches of exactly B, the last N - tB examples dropped
(``drop_remainder=True`` in tf.data, ``drop_last=True`` in PyTorch). No tight upper
bound is known for it (docs/sampling.md). A lower bound needs only two neighbouring
data sets and a test (after Chua et al., "How Private are DP-SGD Implementations?",
ICML 2024):

* every example of D has clipped gradient -C (the same at every step, a linear loss),
  and D' = D plus one example x* with gradient +C. In D every batch sums to -BC; in D',
  if x* is kept (probability 1 - q), it displaces an example of its batch, whose sum
  becomes -BC + 2C. With noise std sigma C per batch sum, one epoch of D' against D is

      P = (1 - q) (1/t) sum_j N(2 e_j / sigma, I_t) + q N(0, I_t),   Q = N(0, I_t),   (1)

  q = (r + 1) / (N + 1) of the N + 1 examples dropped, r = N - tB. (If N + 1 would make
  another batch, r = B - 1, x* is removed from D instead: q = r / N.) Fixed batch sizes
  double the sensitivity: adding an example removes another from its batch.
* the test: the largest of the t batch sums, s = max_j y_j, whose law is explicit,

      F_Q(s) = Phi(s)^t,  F_P(s) = (1 - q) Phi(s - 2/sigma) Phi(s)^(t-1) + q Phi(s)^t,    (2)

  binned on a grid. Binning the maximum is a post-processing of one epoch, so the pair
  of binned laws, composed over the epochs (each a fresh permutation), is dominated by
  the true pair: its epsilon at delta is a lower bound on the run's, in both orders.

The bin masses are computed with mpmath at 40 digits and rounded once (relative error
<= 2u each); :func:`shuffled_lower_bound` charges what that can move delta, so the
number it returns is certified, not estimated.
"""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np

from fdp._validation import check_delta, check_integer, check_real

__all__ = ["shuffled_lower_bound", "max_statistic_pair"]

#: Bins of the largest batch sum per epoch.
BINS = 4000
#: Mass left below the first and above the last bin edge (each lumped into an end bin).
EDGE_TAIL = 1e-30


def max_statistic_pair(noise_multiplier: float, batch_size: int, dataset_size: int,
                       bins: int = BINS) -> tuple[np.ndarray, np.ndarray]:
    """The binned laws (P, Q) of (2) for one epoch: the largest batch sum under D' and D."""
    with mpmath.workdps(40):  # not the global precision: callers' mpmath is left alone
        return _binned_pair(noise_multiplier, batch_size, dataset_size, bins)


def _binned_pair(noise_multiplier: float, batch_size: int, dataset_size: int, bins: int) -> tuple[np.ndarray, np.ndarray]:
    t, r = divmod(dataset_size, batch_size)
    q = mpmath.mpf(r + 1) / (dataset_size + 1) if r <= batch_size - 2 else mpmath.mpf(r) / dataset_size
    shift = mpmath.mpf(2) / noise_multiplier
    lo = min(-4.0, float(mpmath.sqrt(2) * mpmath.erfinv(2 * mpmath.power(EDGE_TAIL, 1.0 / t) - 1)))
    hi = float(shift) + 12.0  # P(N(0,1) > 12) < 1e-32
    edges = [mpmath.mpf(e) for e in np.linspace(lo, hi, bins + 1)]
    phi = [mpmath.ncdf(e) for e in edges]
    phi_shifted = [mpmath.ncdf(e - shift) for e in edges]
    cdf_q = [f ** t for f in phi]
    cdf_p = [(1 - q) * g * f ** (t - 1) + q * f ** t for f, g in zip(phi, phi_shifted)]

    def masses(cdf: list) -> np.ndarray:
        inner = [b - a for a, b in zip(cdf, cdf[1:])]
        return np.array([float(m) for m in [cdf[0], *inner, 1 - cdf[-1]]])

    return masses(cdf_p), masses(cdf_q)


def shuffled_lower_bound(noise_multiplier: float, batch_size: int, dataset_size: int, epochs: int,
                         delta: float) -> float:
    """A certified lower bound on epsilon at ``delta`` of shuffled DP-SGD (add/remove).

    Shuffled DP-SGD has at least this epsilon: the pair of data sets and the test of the
    module docstring reach it. It is **not** an upper bound — none is known for
    shuffling; account Poisson or random-allocation batches for one (docs/sampling.md).

    Args:
      noise_multiplier: sigma > 0 (noise std / clipping norm).
      batch_size: B in [2, N] (every batch exactly B examples).
      dataset_size: N.
      epochs: E >= 1 whole epochs (a fresh permutation each).
      delta: delta in (0, 1).

    Returns:
      epsilon_lower: the run's epsilon at ``delta`` is at least this (0.0 if the test
      reaches no positive epsilon).

    Raises:
      ValueError: an argument out of range (the message names it).

    Examples:
      >>> import fdp
      >>> fdp.shuffled_lower_bound(noise_multiplier=1.0, batch_size=256, dataset_size=60000,
      ...                          epochs=10, delta=1e-5)   # Poisson accounting says 1.10
      8.52...
    """
    from fdp.accountant import PLDAccountant
    from fdp.mechanisms.discrete import FromDistributions

    sigma = check_real("noise_multiplier", noise_multiplier, low=1e-3, high=1e6)
    n = check_integer("dataset_size", dataset_size, low=2, high=10**12)
    b = check_integer("batch_size", batch_size, low=2, high=n)
    e = check_integer("epochs", epochs, low=1, high=10**6)
    delta = check_delta(delta)
    p, q = max_statistic_pair(sigma, b, n)
    keep = (p > 0) | (q > 0)
    p, q = p[keep], q[keep]
    # each mass is within 2u of the exact one (one rounding from 40 digits, plus the
    # normalisation FromDistributions does); E-fold products within (1 + 2u)^(2E) - 1
    eta = math.expm1(2 * e * math.log1p(4 * np.finfo(float).eps))
    acc = PLDAccountant().compose(FromDistributions(p / p.sum(), q / q.sum()), steps=e)
    # delta(eps) = sum (P - e^eps Q)_+ of the float pair exceeds the exact pair's by at most
    # eta (P + e^eps Q) summed where the float term is positive, and there e^eps Q <= P
    # (1 + eta) / (1 - eta): at most 3 eta in all. So the float pair's epsilon at delta +
    # 3 eta is one at which the exact pair's delta is still >= delta.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # only the lower bound is used
        lower = acc.get_epsilon_bounds(delta + 3.0 * eta)[0]
    return max(float(lower), 0.0)
