"""fdp.attack_risk: certified brackets on the best membership-inference attack."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fdp

FPR = [1e-6, 1e-4, 1e-2, 0.1, 0.5]


def _mp_out_in_tpr(alpha, mu, p):
    """Best TPR at FPR alpha between N(0,1) (x out) and (1-p) N(0,1) + p N(mu,1) (x in):
    the likelihood ratio increases in the output, so the Neyman-Pearson test is a
    threshold t with alpha = Phi(-t): TPR = (1-p) alpha + p Phi(mu - t)."""
    with mp.workdps(40):
        t = -mp.sqrt(2) * mp.erfinv(2 * mp.mpf(alpha) - 1)  # Phi(-t) = alpha
        return (1 - p) * mp.mpf(alpha) + p * mp.ncdf(mu - t)


@pytest.mark.parametrize("sigma, p", [(1.0, 1.0), (0.7, 0.3), (2.0, 0.05)])
def test_one_step_brackets_the_neyman_pearson_attack(sigma, p):
    """One step: the best test of "x out" against "x in" is known exactly. It is an
    attack, so the certified upper bound (best attack in either role) is above it; the
    lower bound is a bound on that very test, so it is below, within 0.2 %."""
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), 1)
    risk = fdp.attack_risk(acc, fpr=FPR)
    for a, lo, hi in zip(FPR, risk.tpr_lower, risk.tpr_upper):
        truth = _mp_out_in_tpr(a, 1.0 / sigma, p)
        assert mp.mpf(lo) <= truth <= mp.mpf(hi), (a, lo, float(truth), hi)
        assert lo >= (1 - 2e-3) * truth
        if p == 1.0:  # symmetric: the two roles coincide and the bracket closes
            assert hi <= (1 + 2e-3) * truth
    # p = 1: Gaussian DP, advantage = 2 Phi(mu/2) - 1 exactly
    if p == 1.0:
        tv = float(2 * mp.ncdf(mp.mpf(1.0 / sigma) / 2) - 1)
        assert risk.advantage[0] <= tv <= risk.advantage[1]


@settings(max_examples=12, deadline=None)
@given(sigma=st.floats(0.5, 3.0), p=st.floats(0.001, 1.0), steps=st.integers(1, 300))
def test_bracket_is_ordered_and_above_guessing(sigma, p, steps):
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps)
    risk = fdp.attack_risk(acc, fpr=FPR)
    assert np.all(risk.tpr_lower <= risk.tpr_upper)
    assert np.all(risk.tpr_upper >= np.asarray(FPR) * (1 - 1e-12))  # the best attack beats guessing
    assert np.all(np.diff(risk.tpr_upper) >= 0) and np.all(np.diff(risk.tpr_lower) >= 0)
    lo, hi = risk.advantage
    assert 0.0 <= lo <= hi <= 1.0
    # the advantage bounds every attack's TPR - FPR; the attacks of the lower bound exist
    assert np.max(risk.tpr_lower - np.asarray(FPR)) <= hi + 1e-12


def test_more_noise_less_risk():
    def risk(sigma):
        return fdp.attack_risk(fdp.dpsgd(noise_multiplier=sigma, batch_size=100, dataset_size=10000,
                                         epochs=5), fpr=[1e-3])
    assert risk(2.0).tpr_upper[0] < risk(1.0).tpr_lower[0]


def test_bad_input():
    acc = fdp.dpsgd(noise_multiplier=1.0, batch_size=10, dataset_size=100, epochs=1)
    with pytest.raises(ValueError, match="fpr"):
        fdp.attack_risk(acc, fpr=[0.1, 1.5])
    with pytest.raises(ValueError, match="fpr"):
        fdp.attack_risk(acc, fpr=float("nan"))
    with pytest.raises(ValueError, match="accountant"):
        fdp.attack_risk("acc")


def test_to_dict_and_plot(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    risk = fdp.attack_risk(fdp.dpsgd(noise_multiplier=1.0, batch_size=10, dataset_size=100, epochs=1))
    d = risk.to_dict()
    assert set(d) == {"fpr", "tpr_lower", "tpr_upper", "advantage"} and len(d["fpr"]) == 5
    ax = risk.plot()
    ax.figure.savefig(tmp_path / "risk.png")
    assert (tmp_path / "risk.png").stat().st_size > 1000
