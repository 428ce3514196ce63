"""Properties of fdp.PLDAccountant on random (subsampled) Gaussian mechanisms.

Every accountant answer is an interval: get_epsilon_bounds(delta) = (lo, hi)
with lo <= eps_true <= hi. The assertions below use only that, so they are
sound whatever the grid:

* two accountants of the same composition (other order, other grouping) have
  the same eps_true, so their intervals overlap and their upper ends differ by
  at most the larger interval width (hi1 - hi2 <= hi1 - eps_true <= hi1 - lo1);
* if eps_true(A) <= eps_true(B) (fewer steps, lower sampling rate, more noise),
  then lo(A) <= hi(B), and hi(A) <= hi(B) + (hi(A) - lo(A)); when A's interval
  has converged to the requested epsilon_rtol (width <= rtol hi(A)) this reads
  hi(A) <= hi(B) / (1 - rtol).

EPSILON_RTOL is fixed explicitly so that this tolerance reasoning is exact.
The "null" mechanism is fdp.Gaussian(noise_multiplier=1e6): mu = 1e-6, whose
delta(eps) at eps = 4e-5 is below Phi(-40) ~ 1e-350, so it is (4e-5, 0)-DP to
double precision and composing with it moves eps_true by at most NULL_EPS.
A genuinely null mechanism, fdp.FromDistributions(p, p) with P = Q, leaves
eps_true unchanged exactly (tested where fdp.FromDistributions exists).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

import fdp

EPSILON_RTOL = 1e-2
NULL = fdp.Gaussian(noise_multiplier=1e6)
NULL_EPS = 4e-5
#: absolute slack for float rounding in comparisons of two computed epsilons
ROUND = 1e-9

PROPS = settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])

sigmas = st.floats(min_value=0.5, max_value=5.0)
rates = st.floats(min_value=0.01, max_value=1.0)
step_counts = st.integers(min_value=1, max_value=50)
deltas = st.sampled_from([1e-3, 1e-5, 1e-8])


@st.composite
def gaussians(draw):
    return fdp.Gaussian(noise_multiplier=draw(sigmas), sampling_rate=draw(rates))


def bounds(events, delta):
    """(lo, hi) of the composition of ``events`` = [(mechanism, steps), ...]."""
    acc = fdp.PLDAccountant(epsilon_rtol=EPSILON_RTOL)
    for mech, steps in events:
        acc.compose(mech, steps=steps)
    lo, hi = acc.get_epsilon_bounds(delta)
    assert 0.0 <= lo <= hi, (lo, hi)
    return lo, hi


def assert_same_truth(a, b):
    """Intervals of two accountants of the same composition."""
    (lo1, hi1), (lo2, hi2) = a, b
    assert lo1 <= hi2 + ROUND and lo2 <= hi1 + ROUND, (a, b)
    assert abs(hi1 - hi2) <= max(hi1 - lo1, hi2 - lo2) + ROUND, (a, b)


def assert_ordered(small, large):
    """Intervals with eps_true(small) <= eps_true(large)."""
    (lo_s, hi_s), (_, hi_l) = small, large
    assert lo_s <= hi_l + ROUND, (small, large)
    assert hi_s <= hi_l + (hi_s - lo_s) + ROUND, (small, large)
    if hi_s - lo_s <= EPSILON_RTOL * hi_s:  # converged: the rtol form
        assert hi_s <= hi_l / (1.0 - EPSILON_RTOL) + ROUND, (small, large)


@PROPS
@given(a=gaussians(), b=gaussians(), ta=step_counts, tb=step_counts, delta=deltas)
def test_composition_is_commutative(a, b, ta, tb, delta):
    assert_same_truth(bounds([(a, ta), (b, tb)], delta), bounds([(b, tb), (a, ta)], delta))


@PROPS
@given(a=gaussians(), b=gaussians(), c=gaussians(), ta=step_counts, tb=step_counts,
       tc=step_counts, split=st.floats(min_value=0.0, max_value=1.0), delta=deltas)
def test_composition_is_associative(a, b, c, ta, tb, tc, split, delta):
    # ((A^ta B^tb) C^tc) against C^tc, A^k, B^tb, A^(ta-k): other order and A's steps
    # regrouped around the others
    k = int(split * ta)
    regrouped = [(c, tc), (a, k), (b, tb), (a, ta - k)]
    regrouped = [(m, t) for m, t in regrouped if t > 0]
    assert_same_truth(bounds([(a, ta), (b, tb), (c, tc)], delta), bounds(regrouped, delta))


@PROPS
@given(a=gaussians(), ta=step_counts, tn=step_counts, delta=deltas)
def test_composing_with_a_null_mechanism_changes_nothing(a, ta, tn, delta):
    alone = bounds([(a, ta)], delta)
    with_null = bounds([(a, ta), (NULL, tn)], delta)
    # eps_true(A) <= eps_true(A o N) <= eps_true(A) + tn * NULL_EPS
    assert_ordered(alone, with_null)
    lo_n, hi_n = with_null
    lo_a, hi_a = alone
    assert lo_n <= hi_a + tn * NULL_EPS + ROUND, (alone, with_null)
    assert abs(hi_n - hi_a) <= max(hi_a - lo_a, hi_n - lo_n) + tn * NULL_EPS + ROUND


@PROPS
@given(a=gaussians(), ta=step_counts, tn=step_counts, delta=deltas)
def test_composing_with_identical_distributions_changes_nothing(a, ta, tn, delta):
    same = fdp.FromDistributions([0.25, 0.75], [0.25, 0.75])  # P = Q: loss 0, eps_true(A o N) = eps_true(A)
    assert_same_truth(bounds([(a, ta)], delta), bounds([(same, tn), (a, ta)], delta))


@PROPS
@given(a=gaussians(), t1=step_counts, t2=step_counts, delta=deltas)
def test_epsilon_is_monotone_in_steps(a, t1, t2, delta):
    t_small, t_large = sorted((t1, t2))
    assert_ordered(bounds([(a, t_small)], delta), bounds([(a, t_large)], delta))


@PROPS
@given(sigma=sigmas, p1=rates, p2=rates, steps=step_counts, delta=deltas)
def test_epsilon_is_monotone_in_sampling_rate(sigma, p1, p2, steps, delta):
    p_small, p_large = sorted((p1, p2))
    small = bounds([(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p_small), steps)], delta)
    large = bounds([(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p_large), steps)], delta)
    assert_ordered(small, large)


@PROPS
@given(s1=sigmas, s2=sigmas, p=rates, steps=step_counts, delta=deltas)
def test_epsilon_is_monotone_in_inverse_noise(s1, s2, p, steps, delta):
    s_small, s_large = sorted((s1, s2))
    # more noise (larger sigma) is the more private setting
    more_noise = bounds([(fdp.Gaussian(noise_multiplier=s_large, sampling_rate=p), steps)], delta)
    less_noise = bounds([(fdp.Gaussian(noise_multiplier=s_small, sampling_rate=p), steps)], delta)
    assert_ordered(more_noise, less_noise)
