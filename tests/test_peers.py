"""Cross-checks against the peer accountants (skipped when they are not installed).

Settings are those of benchmarks/accountant.py (the four DP-SGD settings); the peers are
run live here, not quoted.
"""

from __future__ import annotations

import pytest

import fdp

SETTINGS = [
    # (sampling rate, noise multiplier, steps, delta)
    (256 / 60000, 1.1, 14100, 1e-5),
    (0.01, 0.8, 10000, 1e-6),
    (256 / 25000, 0.6, 1465, 1e-5),
    (0.001, 1.0, 100000, 1e-6),
]


@pytest.mark.parametrize("q, sigma, steps, delta", SETTINGS)
def test_dp_accounting_connect_dots_inside_our_bounds(q, sigma, steps, delta):
    pld_mod = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    pld = pld_mod.from_gaussian_mechanism(
        standard_deviation=sigma, sampling_prob=q, use_connect_dots=True,
        value_discretization_interval=1e-4,
    ).self_compose(steps)
    theirs = pld.get_epsilon_for_delta(delta)  # a pessimistic estimate: >= the truth
    lo, hi = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=q), steps=steps).get_epsilon_bounds(delta)
    assert lo <= theirs  # lo <= truth <= theirs
    assert theirs <= hi * (1 + 2e-3)  # their discretisation error is small
    assert (hi - lo) / hi <= 1e-3


@pytest.mark.parametrize("q, sigma, steps, delta", SETTINGS[:3])
def test_prv_accountant_interval_overlaps_ours(q, sigma, steps, delta):
    prv = pytest.importorskip("prv_accountant")
    acc = prv.PRVAccountant(
        prvs=[prv.PoissonSubsampledGaussianMechanism(noise_multiplier=sigma, sampling_probability=q)],
        max_self_compositions=[steps], eps_error=0.01, delta_error=delta / 1000,
    )
    p_lo, p_est, p_hi = acc.compute_epsilon(delta=delta, num_self_compositions=[steps])
    lo, hi = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=q), steps=steps).get_epsilon_bounds(delta)
    assert lo <= p_hi and p_lo <= hi
    assert p_lo <= lo <= p_hi or p_lo <= hi <= p_hi
