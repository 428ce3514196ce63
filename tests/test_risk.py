"""fdp.attack_risk: certified brackets on the best membership-inference attack."""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

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


@settings(max_examples=examples(12), deadline=None)
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


# ------------------------------------------------------------------ exact references
def _np_tpr(alpha, atoms):
    """The Neyman-Pearson test's TPR at FPR alpha between discrete laws: null Q, alternative
    P, atoms (P_i, Q_i) in mpmath. Reject the atoms of largest likelihood ratio P/Q first
    (Q = 0 first of all), randomising on the atom where the FPR budget runs out."""
    a, tpr = mp.mpf(alpha), mp.mpf(0)
    for p, q in sorted(atoms, key=lambda pq: (pq[1] == 0, pq[0] / pq[1] if pq[1] else 0), reverse=True):
        if a <= q:
            return tpr + p * a / q
        tpr, a = tpr + p, a - q
    return tpr


def _rr_atoms(eps0, steps):
    """Randomized response(eps0) composed ``steps`` times, by binomial enumeration: m reports
    that agree with "x in" have P-mass C(T, m) r^m (1-r)^(T-m) under "in", C(T, m)
    (1-r)^m r^(T-m) under "out", r = e^eps0 / (1 + e^eps0). Pairs (in, out)."""
    e = mp.e ** mp.mpf(eps0)
    r, s = e / (1 + e), 1 / (1 + e)
    return [(mp.binomial(steps, m) * r**m * s**(steps - m), mp.binomial(steps, m) * s**m * r**(steps - m))
            for m in range(steps + 1)]


def _rr_truth(alpha, eps0, steps):
    """(best TPR of "out" against "in", best TPR over both roles, advantage), 60 digits."""
    with mp.workdps(60):
        atoms = _rr_atoms(eps0, steps)
        out_in = _np_tpr(alpha, atoms)
        in_out = _np_tpr(alpha, [(q, p) for p, q in atoms])
        tv = sum(max(p - q, 0) for p, q in atoms)
        return out_in, max(out_in, in_out), tv


#: Room for the 60-digit references' own round-off (a TPR of 1 may come out 1 + 1e-60).
_MP_SLACK = mp.mpf(10) ** -40


def _check_bracket(risk, truth_lower, truth_upper, tv=None):
    for a, lo, hi, t_lo, t_hi in zip(risk.fpr, risk.tpr_lower, risk.tpr_upper, truth_lower, truth_upper):
        assert mp.mpf(lo) <= t_lo + _MP_SLACK, ("tpr_lower above the truth", a, lo, float(t_lo))
        assert mp.mpf(hi) >= t_hi - _MP_SLACK, ("tpr_upper below the truth", a, hi, float(t_hi))
    if tv is not None:
        lo, hi = risk.advantage
        assert mp.mpf(lo) <= tv + _MP_SLACK and mp.mpf(hi) >= tv - _MP_SLACK, (risk.advantage, float(tv))


@settings(max_examples=examples(25), deadline=None)
@given(eps0=st.floats(0.05, 5.0), steps=st.integers(1, 30), log_fpr=st.floats(math.log(1e-18), math.log(0.5)))
@example(eps0=1.0, steps=5, log_fpr=math.log(1e-15))   # reported: 1.48437e-13 > 1.48413e-13
@example(eps0=1.0, steps=5, log_fpr=math.log(1e-8))    # +2.8e-11 relative
@example(eps0=0.3, steps=20, log_fpr=math.log(1e-15))
@example(eps0=3.0, steps=2, log_fpr=math.log(1e-15))
@example(eps0=2.0, steps=1, log_fpr=math.log(1e-4))
def test_randomized_response_brackets_the_exact_attack(eps0, steps, log_fpr):
    """RR composed T times, against the exact Neyman-Pearson test (binomial enumeration in
    mpmath): tpr_lower <= TPR(out vs in), max over both roles <= tpr_upper, and the
    advantage brackets the total variation distance. Below the top atom's "out" mass the
    best TPR is FPR e^{T eps0}: the lower bound must stay under it (it used to come out
    ~1e-4 above, the float 1 - (1 - TPR) rounding near 1)."""
    fpr = [math.exp(log_fpr), 1e-18, 1e-12, 1e-6, 0.3]
    acc = fdp.PLDAccountant().compose(fdp.RandomizedResponse(epsilon=eps0), steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # an advantage bracket wider than the tolerance
        risk = fdp.attack_risk(acc, fpr=fpr)
    truths = [_rr_truth(a, eps0, steps) for a in risk.fpr]
    _check_bracket(risk, [t[0] for t in truths], [t[1] for t in truths], truths[0][2])
    with mp.workdps(60):
        top_out = mp.mpf(_rr_atoms(eps0, steps)[-1][1])
        for a, lo, (t_lo, _, _) in zip(risk.fpr, risk.tpr_lower, truths):
            if a <= top_out:  # exactly FPR e^{T eps0} there; the bound is within 1e-9 of it
                assert mp.almosteq(t_lo, mp.mpf(a) * mp.e ** (steps * mp.mpf(eps0)), 1e-40)
                assert mp.mpf(lo) >= t_lo * (1 - mp.mpf(1e-9))


def _gdp_tpr(alpha, mu):
    """Phi(Phi^-1(alpha) + mu): the best TPR at FPR alpha under mu-GDP (both roles)."""
    with mp.workdps(60):
        a = mp.mpf(alpha)
        z = mp.findroot(lambda x: mp.log(mp.ncdf(x)) - mp.log(a), -mp.sqrt(-2 * mp.log(a)) if a < 0.5 else 0)
        return mp.ncdf(z + mu)


def _mp_out_in_tpr_deep(alpha, mu, p):
    """:func:`_mp_out_in_tpr` with the threshold solved in log space (alpha down to 1e-300)."""
    with mp.workdps(60):
        a = mp.mpf(alpha)
        t = -mp.findroot(lambda x: mp.log(mp.ncdf(x)) - mp.log(a), -mp.sqrt(-2 * mp.log(a)))  # Phi(-t) = alpha
        return (1 - p) * a + p * mp.ncdf(mu - t)


@pytest.mark.parametrize("sigma, steps", [(1.0, 1), (30.0, 1), (2.0, 10), (5.0, 100)])
def test_gaussian_matches_the_gdp_closed_form(sigma, steps):
    """Gaussian, no subsampling: mu-GDP with mu = sqrt(T) / sigma, TPR = Phi(Phi^-1(alpha) + mu)
    and advantage 2 Phi(mu / 2) - 1, at FPRs down to 1e-18."""
    fpr = [1e-18, 1e-15, 1e-12, 1e-8, 1e-4, 1e-2, 0.3, 0.5]
    mu = mp.sqrt(steps) / sigma
    risk = fdp.attack_risk(fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma), steps), fpr=fpr)
    truth = [_gdp_tpr(a, mu) for a in fpr]
    _check_bracket(risk, truth, truth, 2 * mp.ncdf(mu / 2) - 1)


@pytest.mark.parametrize("scale", [0.2, 1.0, 20.0])
def test_laplace_matches_its_closed_form(scale):
    """One Laplace step (mu = 1/b): 1 - f(alpha) = e^mu alpha up to e^-mu / 2, then
    1 - e^-mu / (4 alpha) up to 1/2, then 1 - e^-mu (1 - alpha); advantage 1 - e^{-mu/2}."""
    fpr = [1e-18, 1e-15, 1e-12, 1e-8, 1e-4, 1e-2, 0.3, 0.5, 0.9]
    risk = fdp.attack_risk(fdp.PLDAccountant().compose(fdp.Laplace(scale=scale), 1), fpr=fpr)
    with mp.workdps(60):
        mu = 1 / mp.mpf(scale)
        truth = [mp.e**mu * a if a <= mp.exp(-mu) / 2 else
                 (1 - mp.exp(-mu) / (4 * a) if a <= 0.5 else 1 - mp.exp(-mu) * (1 - a)) for a in map(mp.mpf, fpr)]
        _check_bracket(risk, truth, truth, 1 - mp.exp(-mu / 2))


@pytest.mark.parametrize("sigma, p", [(0.7, 0.3), (2.0, 0.05)])
def test_subsampled_gaussian_at_tiny_fpr(sigma, p):
    """One subsampled-Gaussian step at FPRs down to 1e-18: the lower bound stays under the
    exact "out" against "in" test (the upper bound is also checked against it)."""
    fpr = [1e-18, 1e-15, 1e-12, 1e-9]
    risk = fdp.attack_risk(fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), 1),
                           fpr=fpr)
    truth = [_mp_out_in_tpr_deep(a, 1.0 / sigma, p) for a in fpr]
    _check_bracket(risk, truth, truth)



@pytest.mark.parametrize("mechanism, steps", [(fdp.RandomizedResponse(epsilon=1.0), 5),
                                              (fdp.Gaussian(noise_multiplier=2.0), 3)])
def test_the_profile_on_the_grid_is_rounded_to_the_safe_side(mechanism, steps):
    """DiscretePLD.profile_on_grid against the same sums in 60-digit arithmetic from the
    stored atoms: a lower bound's (eps_j, d_j) has eps_j <= l_j - loss_error and d_j <= the
    exact [sum_{k>j} q_k (1 - e^{-(k-j) h}) + p_inf + delta_shift] / (1 + rel_error); an
    upper bound the reverse (with its kappa charge). attack_risk's lower bound rests on it."""
    acc = fdp.PLDAccountant().compose(mechanism, steps)
    for pessimistic in (False, True):
        pld = acc.composed_pld("remove", pessimistic=pessimistic)
        eps, d = pld.profile_on_grid()
        side = pld.bound
        pick = np.unique(np.concatenate([np.arange(min(pld.pmf.size, 12)) - min(pld.pmf.size, 12),
                                         np.linspace(0, pld.pmf.size - 1, 30).astype(int)])) % pld.pmf.size
        with mp.workdps(60):
            h, le = mp.mpf(pld.h), mp.mpf(pld.loss_error)
            for j in np.unique(pick):
                tail = mp.fsum(mp.mpf(float(q)) * -mp.expm1(-(k - j) * h)
                               for k, q in enumerate(pld.pmf) if k > j and q > 0.0)
                exact = (tail + mp.mpf(pld.p_inf) + mp.mpf(pld.delta_shift))
                exact = exact * (1 + mp.mpf(pld.rel_error)) if side > 0 else exact / (1 + mp.mpf(pld.rel_error))
                grid = mp.mpf(float(pld.losses[j]))
                if side < 0:
                    assert mp.mpf(float(eps[j])) <= grid - le and mp.mpf(float(d[j])) <= max(exact, 0)
                else:
                    assert mp.mpf(float(eps[j])) >= grid + le and mp.mpf(float(d[j])) >= min(exact, 1)


@pytest.mark.parametrize("eps0, steps, fpr", [(720.0, 1, 5e-324), (720.0, 1, 1e-315), (360.0, 2, 5e-324)])
def test_tpr_lower_at_a_subnormal_fpr_stays_below_the_truth(eps0, steps, fpr):
    """Red team: e^{eps_j} overflowed for grid losses above 709, the line that attains the
    minimum dropped out, and tpr_lower came out ~1 where the best TPR is 2.4e-11 (RR(720),
    FPR 5e-324). Below the top atom's Q-mass the best test has TPR = FPR e^{T eps0}."""
    acc = fdp.PLDAccountant().compose(fdp.RandomizedResponse(epsilon=eps0), steps)
    risk = fdp.attack_risk(acc, fpr=[fpr])
    with mp.workdps(50):
        exact = min(mp.mpf(fpr) * mp.e ** (steps * mp.mpf(eps0)), 1)
    assert mp.mpf(float(risk.tpr_lower[0])) <= exact <= mp.mpf(float(risk.tpr_upper[0]))
