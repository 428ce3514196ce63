"""Randomized response inside random allocation (fdp.mechanisms.allocation_discrete):
brackets against an exact enumeration of every output, and the atoms' error bounds."""

from __future__ import annotations

import itertools
import math

import mpmath as mp
import numpy as np
import pytest
import scipy.stats
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples

import fdp
from fdp.mechanisms.allocation_discrete import _log_binomial_masses, randomized_response_epoch
from fdp.pld.cells import Direction


def _enumerated_delta(eps0: float, steps: int, epochs: int, eps: float) -> float:
    """max over directions of delta(eps): every bit vector of every epoch, its P-mass (the
    mean over the step j holding the example of the product law with step j flipped to
    P1) and its Q-mass, in 40-digit arithmetic; no binomial formula is used."""
    mp.mp.dps = 40
    a = 1 / (1 + mp.e ** mp.mpf(eps0))  # P0(1)

    def law(bit: int, holder: bool):
        return (1 - a if bit else a) if holder else (a if bit else 1 - a)

    epoch = []
    for bits in itertools.product((0, 1), repeat=steps):
        q = mp.fprod(law(b, False) for b in bits)
        p = mp.fsum(mp.fprod(law(b, i == j) for i, b in enumerate(bits)) for j in range(steps)) / steps
        epoch.append((p, q))
    e = mp.e ** mp.mpf(eps)
    best = mp.mpf(0)
    for remove in (True, False):
        total = mp.mpf(0)
        for run in itertools.product(epoch, repeat=epochs):
            p, q = mp.fprod(x[0] for x in run), mp.fprod(x[1] for x in run)
            p, q = (p, q) if remove else (q, p)
            total += max(p - e * q, 0)
        best = max(best, total)
    return float(best)


def _bracket(eps0: float, steps: int, epochs: int, eps: float) -> tuple[float, float]:
    epoch = fdp.RandomAllocation(fdp.RandomizedResponse(epsilon=eps0), steps_per_epoch=steps)
    return fdp.PLDAccountant().compose(epoch, steps=epochs).get_delta_bounds(eps)


@pytest.mark.parametrize("eps0, steps, epochs, eps", [(1.0, 3, 2, 0.5), (2.0, 4, 1, 1.0), (0.5, 4, 1, 0.1),
                                                      (3.0, 3, 2, 2.0)])
def test_small_epochs_bracket_the_enumeration(eps0: float, steps: int, epochs: int, eps: float) -> None:
    lower, upper = _bracket(eps0, steps, epochs, eps)
    truth = _enumerated_delta(eps0, steps, epochs, eps)
    assert lower <= truth <= upper
    assert upper - lower <= 0.03 * truth


@settings(max_examples=examples(6), deadline=None)
@given(eps0=st.floats(0.05, 5.0), steps=st.integers(2, 4), epochs=st.integers(1, 2), eps=st.floats(0.0, 3.0))
@example(eps0=5.0, steps=2, epochs=2, eps=0.0)
def test_bracket_property(eps0: float, steps: int, epochs: int, eps: float) -> None:
    """A search for a bound on the wrong side of the enumeration."""
    lower, upper = _bracket(eps0, steps, epochs, eps)
    truth = _enumerated_delta(eps0, steps, epochs, eps)
    assert lower <= truth * (1 + 1e-12) + 1e-300
    assert truth <= upper * (1 + 1e-12) + 1e-300


@pytest.mark.parametrize("steps", [1, 2, 7, 1000, 100_000])
def test_binomial_masses_lie_within_their_charged_error(steps: int) -> None:
    """log Q_n against scipy's binomial log-pmf: within the bound the cells charge (which
    is far from tight: the measured error is ~1 % of it)."""
    log_q, error = _log_binomial_masses(1.5, steps)
    reference = scipy.stats.binom.logpmf(np.arange(steps + 1), steps, 1 / (1 + math.exp(1.5)))
    assert np.max(np.abs(log_q - reference)) <= error
    for direction in Direction:
        losses, masses, mass_error, _ = randomized_response_epoch(1.5, steps, direction)
        assert abs(masses.sum() - 1) <= mass_error + 1e-15 * steps
        assert np.all(np.abs(losses) <= 1.5 * (1 + 1e-12))  # |log L_n| <= eps0


def test_one_step_is_randomized_response_and_many_steps_hide_more() -> None:
    """t = 1 is the step (the same atoms on the same grid); 50 epochs of t = 1000 spend a
    small fraction of 50 full-batch steps, like Poisson sampling at p = 1 / t does."""
    rr = fdp.RandomizedResponse(epsilon=1.0)
    one = fdp.PLDAccountant().compose(fdp.RandomAllocation(rr, steps_per_epoch=1), steps=50).get_epsilon_bounds(1e-6)
    assert one == pytest.approx(fdp.PLDAccountant().compose(rr, steps=50).get_epsilon_bounds(1e-6), rel=1e-9)
    with pytest.warns(UserWarning):  # atoms off the grid: a bracket of a few tenths of a percent
        lo, hi = fdp.PLDAccountant().compose(fdp.RandomAllocation(rr, steps_per_epoch=1000),
                                             steps=50).get_epsilon_bounds(1e-6)
    assert lo <= hi < 0.05 * one[0]


def test_randomized_response_refuses_more_than_one_step_per_example() -> None:
    with pytest.raises(ValueError, match="Gaussian step only"):
        fdp.RandomAllocation(fdp.RandomizedResponse(epsilon=1.0), steps_per_epoch=10, selected=2)


def test_an_epsilon_beyond_what_can_be_hidden_is_refused_not_a_crash() -> None:
    """epsilon 1e300 raised an OverflowError from the atoms' error bound; now a ValueError
    naming epsilon (t = 1 is the step itself and keeps the step's own range)."""
    with pytest.raises(ValueError, match="epsilon must be at most 100"):
        fdp.RandomAllocation(fdp.RandomizedResponse(epsilon=1e300), steps_per_epoch=5)
    epoch = fdp.RandomAllocation(fdp.RandomizedResponse(epsilon=100.0), steps_per_epoch=1000)
    lower, upper = fdp.PLDAccountant().compose(epoch, steps=2).get_epsilon_bounds(1e-5)
    assert 0 < lower <= upper < math.inf


def test_the_epoch_curve_is_the_accountants_certified_one() -> None:
    """The epoch's tradeoff curve comes from the cells that charge the atoms' rounding."""
    epoch = fdp.RandomAllocation(fdp.RandomizedResponse(epsilon=1.0), steps_per_epoch=50)
    alpha = np.linspace(0.0, 1.0, 21)
    ours = np.asarray(epoch.tradeoff()(alpha))
    certified = np.asarray(fdp.PLDAccountant().compose(epoch).tradeoff()(alpha))
    assert np.array_equal(ours, certified) and np.all(ours <= 1 - alpha + 1e-12)
