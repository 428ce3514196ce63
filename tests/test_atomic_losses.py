"""Purely atomic privacy losses (randomized response, Laplace's end atoms) against exact
enumeration.

Randomized response composed T times has a binomial privacy loss: k steps at the loss
l1 of output 1 and T - k at l0, so delta(eps) is a sum of T + 1 terms, weighed here in
mpmath from the output laws alone (no code of the library). Found loose before (sound,
useless): RR(22.2) x 8 had delta(83.5) in [0, 1] (truth ~1), RR(3.41) x 72 had eps at
delta = 7.1e-37 in [245.52, inf] (truth 245.52), Laplace(1) x 50 eps at 1e-40 in
[49.0, inf] (truth 50).
"""

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
from fdp.pld.cells import Direction
from fdp.pld.chernoff import composed_window
from fdp.pld.plan import LATTICE_DIVISORS, lattice_spacing
from fdp.pld.queries import MIN_DELTA

DPS = 80


def _atoms(eps0: float, p: float, remove: bool) -> list[tuple[mp.mpf, mp.mpf]]:
    """(loss, P-mass) of outputs 0 and 1 of randomized response sampled at rate p."""
    e = mp.e ** mp.mpf(eps0)
    p0, p1 = [1 / (1 + e), e / (1 + e)], [e / (1 + e), 1 / (1 + e)]
    mix = [(1 - mp.mpf(p)) * p0[i] + mp.mpf(p) * p1[i] for i in range(2)]
    big_p, big_q = (mix, p0) if remove else (p0, mix)
    return [(mp.log(big_p[i] / big_q[i]), big_p[i]) for i in range(2)]


def _exact_delta(eps0: float, p: float, steps: int, eps: float) -> mp.mpf:
    """max over both directions of sum_k C(T, k) m1^k m0^(T-k) (1 - e^(eps - L_k))_+."""
    with mp.workdps(DPS):
        out = mp.mpf(0)
        for remove in (True, False):
            (l0, m0), (l1, m1) = _atoms(eps0, p, remove)
            total = mp.mpf(0)
            for k in range(steps + 1):
                loss = k * l1 + (steps - k) * l0
                if loss > eps:
                    total += mp.binomial(steps, k) * m1**k * m0 ** (steps - k) * -mp.expm1(mp.mpf(eps) - loss)
            out = max(out, total)
        return min(out, mp.mpf(1))  # the masses sum to 1 within 1e-80


def _exact_epsilon(eps0: float, p: float, steps: int, delta: float) -> mp.mpf:
    """Bisection on the non-increasing delta(eps), to 2^-200 of T eps0."""
    with mp.workdps(DPS):
        lo, hi = mp.mpf(0), mp.mpf(steps * eps0 + 1)
        if _exact_delta(eps0, p, steps, 0.0) <= delta:
            return lo
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _exact_delta(eps0, p, steps, mid) > delta else (lo, mid)
        return hi


def _quiet(call, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the subsampled brackets may be wider than rtol
        return call(*args)


@settings(max_examples=examples(25), deadline=None)
@example(eps0=22.2, p=1.0, steps=8, log_delta=-30.0, eps_at=0.47)
@example(eps0=3.41, p=1.0, steps=72, log_delta=math.log10(7.1e-37), eps_at=0.99)
@example(eps0=22.2, p=0.999, steps=8, log_delta=-10.0, eps_at=0.47)
@example(eps0=0.125, p=0.125, steps=1, log_delta=-18.0, eps_at=0.0)  # the atom's own round-off
@example(eps0=1.0, p=1.0, steps=2, log_delta=-2.0, eps_at=0.0)  # a Chernoff tail charge on 5 atoms
@example(eps0=0.1, p=1.0, steps=176, log_delta=-6.0, eps_at=0.0)  # round-off 1.3e-5 delta
@example(eps0=6.0, p=1.0, steps=16, log_delta=-2.0, eps_at=1.0)  # delta(T eps0) = 0 in [0, 1e-12]
@example(eps0=0.06, p=1.0, steps=256, log_delta=-8.0, eps_at=0.355)  # CI draw: two sides' round-off 1.4e-4 hi
@given(eps0=st.floats(0.05, 40.0), p=st.one_of(st.just(1.0), st.floats(0.01, 1.0)),
       steps=st.integers(1, 300), log_delta=st.floats(-40.0, -2.0), eps_at=st.floats(0.0, 1.1))
def test_randomized_response_brackets_the_binomial_truth(eps0, p, steps, log_delta, eps_at):
    """Both queries bracket the exact answer; without subsampling both atoms +-eps0 lie on
    the grid, so the bracket is the round-off's width alone."""
    delta, eps = 10.0**log_delta, eps_at * steps * eps0
    acc = fdp.PLDAccountant().compose(fdp.RandomizedResponse(epsilon=eps0, sampling_rate=p), steps)
    lo, hi = _quiet(acc.get_epsilon_bounds, delta)
    exact = _exact_epsilon(eps0, p, steps, delta)
    assert mp.mpf(lo) <= exact <= mp.mpf(hi)
    d_lo, d_hi = acc.get_delta_bounds(eps)
    exact_delta = _exact_delta(eps0, p, steps, eps)
    assert mp.mpf(d_lo) <= exact_delta <= mp.mpf(d_hi)
    if p == 1.0:  # no discretisation error left: the FFT's round-off only (~T 1e-14 on delta,
        # at eps = T eps0 too, where the truth is 0), kept where it moves eps by less than
        # rtol / 10 (1e-4 relative), else removed by a tilted pass
        assert hi - lo <= 1e-4 * hi + 1e-12
        assert d_hi - d_lo <= 1e-4 * d_hi + 1e-10


def test_randomized_response_with_a_large_epsilon_gets_useful_bounds():
    """RR(22.2): sd ~ 7e-4 per step, so the sd-based grid needed ~1e7 points for 8 steps
    and the window was cut; delta(83.5) was bracketed by [0, 1]."""
    rr = fdp.RandomizedResponse(epsilon=22.2)
    exact = float(_exact_delta(22.2, 1.0, 8, 83.5))
    lo, hi = fdp.PLDAccountant().compose(rr, 8).get_delta_bounds(83.5)
    assert lo <= exact <= hi and lo > 1.0 - 1e-9
    # the Chernoff window itself, on the fine grid the sd asks for (no lattice: a fixed
    # grid_spacing): its lower end was at -129 (lam searched only above 5 = 0.01 / sd)
    fine = fdp.PLDAccountant(grid_spacing=1e-3).compose(rr, 8)
    parts = fine._parts(Direction.REMOVE, True, 1e-15, 0)
    t_lo, t_hi, _, _ = composed_window(parts, 1e-15, fine.max_points)
    assert 80.0 < t_lo and t_hi >= 177.6
    lo, hi = fine.get_delta_bounds(83.5)
    assert lo <= exact <= hi and lo > 1.0 - 1e-9


@pytest.mark.parametrize("mechanism, steps, top, top_mass", [
    (fdp.RandomizedResponse(epsilon=3.41), 72, 72 * 3.41, (1 / (1 + math.exp(-3.41))) ** 72),
    (fdp.RandomizedResponse(epsilon=22.2), 8, 8 * 22.2, (1 / (1 + math.exp(-22.2))) ** 8),
    (fdp.Laplace(scale=1.0), 50, 50.0, 0.5**50),  # loss +1 where the output is >= 1
], ids=["rr3.41", "rr22.2", "laplace"])
def test_pure_dp_compositions_are_bounded_by_their_top_loss_at_any_delta(mechanism, steps, top, top_mass):
    """Every composed loss is <= T eps0: delta(eps) = 0 from there on, and eps(delta) <= T eps0
    for every delta (the upper bound was inf at tiny delta: the FFT's round-off charge).
    With P-mass m on the top loss, delta(eps) >= m (1 - e^(eps - top)): eps(delta) >=
    top + log(1 - delta / m), which is top in float64 for delta << 1e-16 m."""
    acc = fdp.PLDAccountant().compose(mechanism, steps)
    for delta in (1e-12, 7.1e-37, 1e-200, MIN_DELTA):
        lo, hi = acc.get_epsilon_bounds(delta)
        assert hi <= top * (1 + 1e-12)
        if delta < 1e-20 * top_mass:
            assert lo >= top * (1 - 1e-9)
    assert acc.get_delta_bounds(top * (1 + 1e-12)) == (0.0, 0.0)
    assert acc.get_delta_bounds(top * (1 - 1e-6))[1] > 0.0


def test_a_lattice_is_used_only_where_every_atom_is_on_it():
    rr = fdp.RandomizedResponse(epsilon=1.3)
    for direction in (Direction.REMOVE, Direction.ADD):
        atoms = rr.loss_atoms(direction)
        assert lattice_spacing(atoms) == pytest.approx(1.3, rel=1e-15)
    plan = fdp.PLDAccountant().compose(rr, 1000)._plan(Direction.REMOVE, 1e-15, level=2)
    assert plan.h == lattice_spacing(rr.loss_atoms(Direction.REMOVE))  # not halved: already exact
    # incommensurable atoms (subsampled RR), a continuous loss: no lattice
    assert lattice_spacing(fdp.RandomizedResponse(epsilon=1.3, sampling_rate=0.5).loss_atoms(Direction.REMOVE)) \
        is None
    assert fdp.Gaussian(noise_multiplier=1.0).loss_atoms(Direction.REMOVE) is None
    assert lattice_spacing(np.array([1.0, math.sqrt(2.0)])) is None
    assert lattice_spacing(np.array([0.0])) is None and lattice_spacing(np.array([])) is None


@settings(max_examples=examples(60), deadline=None)
@given(base=st.floats(1e-6, 1e6), multiples=st.lists(st.integers(-LATTICE_DIVISORS, LATTICE_DIVISORS),
                                                       min_size=1, max_size=8))
def test_lattice_spacing_puts_every_atom_exactly_on_a_grid_point(base, multiples):
    atoms = np.array(multiples, dtype=np.float64) * base
    a = lattice_spacing(atoms)
    if not np.any(atoms):
        assert a is None
        return
    assert a is not None  # base itself (or a multiple of it) qualifies
    m = np.rint(atoms / a)
    assert np.array_equal(m * a, atoms)  # the grid's own arithmetic: (offset + k) * h


def test_a_loss_of_sd_1e_38_gets_a_bounded_tilt_not_a_math_domain_error():
    """Red team: the saddle tilt was 1e4 / sd = 1e41 here, the tilted inputs' error bound
    exceeded 1, and compose raised "math domain error". The tilt is now capped (any tilt is
    sound), and compose reads an error bound >= 1/2 as no bound (inf), not a crash."""
    mech = fdp.FromDistributions(p_probs=(2.1993132514563863e-171, 1.3223059044469736e-169, 1.0),
                                 q_probs=(6.659883046501349e-199, 1.4950396255818643e-58, 1.0), sampling_rate=0.01)
    acc = fdp.PLDAccountant().compose(mech, 13)
    lo, hi = _quiet(acc.get_epsilon_bounds, 4.074627789710355e-52)
    assert 0.0 <= lo <= hi < 1e-9  # the bulk of the loss is within 1e-66 of 0


def _pair_remove_epsilon(p1: float, q1: float, delta: float) -> mp.mpf:
    """One step of FromDistributions([p1, 1], [q1, 1]) (normalised), remove direction: the
    only positive loss is outcome 0's, so eps solves P0 - e^eps Q0 = delta."""
    with mp.workdps(DPS):
        big_p, big_q = mp.mpf(p1) / (1 + mp.mpf(p1)), mp.mpf(q1) / (1 + mp.mpf(q1))
        return mp.log((big_p - delta) / big_q)


@pytest.mark.parametrize("p1, q1, delta", [(1e-35, 1e-45, 9.99999999e-36), (1e-35, 1e-45, 9.9999999e-36),
                                           (3e-35, 3e-45, 2.999999997e-35)])
def test_the_masses_own_round_off_is_charged_where_delta_cancels_digits(p1, q1, delta):
    """Red team: delta just below the atom's mass cancels 9 digits of it, so the masses'
    few-ulp error (exp of a log-mass) moved eps by 3e-6; the upper bound was below the truth
    (exposed by the exact lattice grid, which left no slack). Now charged (mass_error)."""
    acc = fdp.PLDAccountant().compose(fdp.FromDistributions([p1, 1.0], [q1, 1.0]), 1)
    lo, hi = _quiet(acc.get_epsilon_bounds, delta)
    exact = _pair_remove_epsilon(p1, q1, delta)
    assert mp.mpf(lo) <= exact <= mp.mpf(hi)


def test_an_atom_at_infinity_heavier_than_delta_gives_infinite_epsilon():
    """Red team: P(L = +inf) = 1e-280 / (1 + 1e-280) > delta, so eps = inf; the +inf atom's
    mass came out 5e-14 low and the upper bound was 3.6e-15."""
    acc = fdp.PLDAccountant().compose(fdp.FromDistributions([1e-280, 1.0], [0.0, 1.0]), 1)
    lo, hi = acc.get_delta_bounds(1.0)
    with mp.workdps(DPS):
        exact = mp.mpf(1e-280) / (1 + mp.mpf(1e-280))
    assert mp.mpf(lo) <= exact <= mp.mpf(hi)
    assert _quiet(acc.get_epsilon_bounds, 9.99999999999999e-281)[1] == math.inf


def test_a_step_with_all_its_mass_at_infinity_composes_to_infinity():
    """Red team: beside any other mechanism, FromDistributions([1, 0], [0, 1]) (the output
    reveals the individual) raised "cannot convert float NaN to integer"; the truth is
    delta = 1 at every eps, eps = inf at every delta < 1."""
    acc = fdp.PLDAccountant().compose(fdp.RandomizedResponse(epsilon=1.0), 3)
    acc.compose(fdp.FromDistributions([1.0, 0.0], [0.0, 1.0]), 1)
    assert _quiet(acc.get_epsilon_bounds, 1e-5) == (math.inf, math.inf)
    lo, hi = acc.get_delta_bounds(3.0)
    assert hi == 1.0 and 1.0 - 1e-14 <= lo <= 1.0  # the lower bound's float steps are rounded down
