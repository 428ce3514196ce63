"""fdp.epsilon_curve: many step counts at once, each point a certified bracket."""

from __future__ import annotations

import pytest

import fdp


def _overlaps(a, b):
    return a[0] <= b[1] and b[0] <= a[1]


@pytest.mark.parametrize("mech", [
    fdp.Gaussian(noise_multiplier=0.8, sampling_rate=0.01),
    fdp.JL(noise_multiplier=1.0, jl_projections=10, sampling_rate=0.02),
    fdp.Laplace(scale=2.0, sampling_rate=0.05),
])
def test_each_point_brackets_what_the_accountant_brackets(mech):
    """Both are certified brackets of the same epsilon, so they must intersect; a curve
    point that missed the accountant's bracket would prove one of them wrong."""
    steps = [50, 100, 400]
    ticks = []
    curve = fdp.epsilon_curve(mech, steps, 1e-5, progress=lambda: ticks.append(1))
    assert len(ticks) == len(steps)
    for t, point in zip(steps, curve):
        ref = fdp.PLDAccountant().compose(mech, steps=t).get_epsilon_bounds(1e-5)
        assert _overlaps(point, ref), (t, point, ref)
        assert 0.0 < point[0] <= point[1] <= 1.01 * ref[1]  # and about as tight
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(curve, curve[1:]))  # monotone in T


@pytest.mark.filterwarnings("ignore:epsilon bounds")  # the accountant's own r = 1 bracket is ~3 % wide
def test_heavy_tail_points_bracket_the_accountant():
    """JL with r = 1 (losses to ~1e15) takes the capped-grid path."""
    mech = fdp.JL(noise_multiplier=1.0, jl_projections=1, sampling_rate=0.01)
    steps = [20, 40]
    curve = fdp.epsilon_curve(mech, steps, 1e-5)
    for t, point in zip(steps, curve):
        ref = fdp.PLDAccountant().compose(mech, steps=t).get_epsilon_bounds(1e-5)
        assert _overlaps(point, ref), (t, point, ref)
        assert point[1] <= 2.0 * point[0]  # within a factor 2


@pytest.mark.parametrize("steps, delta, match", [
    ([], 1e-5, "steps"),
    ([10, 10], 1e-5, "steps"),
    ([20, 10], 1e-5, "steps"),
    ([0, 10], 1e-5, "steps"),
    ([10], 0.0, "delta"),
    ([10], 1.5, "delta"),
])
def test_bad_input(steps, delta, match):
    with pytest.raises(ValueError, match=match):
        fdp.epsilon_curve(fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.1), steps, delta)
    with pytest.raises(ValueError, match="mechanism"):
        fdp.epsilon_curve("gaussian", [10], 1e-5)
