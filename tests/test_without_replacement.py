"""Sampling without replacement under replace-one: the bracket against independent references.

References, written here from scratch with scipy (not fdp's code):

* ``_profile_c``: delta of one step of C_p(G_mu) = min{f_p, f_p^-1}** at any real eps, as the
  max of the two directions' closed forms (the hull's conjugate is the max of the conjugates);
* ``_two_steps_c``: delta of C_p(G_mu) composed twice, E over one step's loss L of
  ``_profile_c(eps - L)``, by quadrature over the output x (its loss is monotone in x);
* ``_two_steps_real``: delta of two steps for two real data sets whose other examples have
  gradient 0 and whose replaced example has gradient +C / -C: the pair
  ((1-p) N(0,1) + p N(mu/2,1), (1-p) N(0,1) + p N(-mu/2,1)) composed twice — the case that
  broke the earlier accounting (delta 0.77064 > its "upper bound" 0.7660).
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, special

from hypothesis_budget import examples

import fdp

_NORMAL = 1.0 / math.sqrt(2.0 * math.pi)


def _log_rest(p: float) -> float:
    """log(1 - p); -inf at p = 1 (the full batch)."""
    return math.log1p(-p) if p < 1 else -math.inf


def _remove_loss(x: float, mu: float, p: float) -> float:
    return float(np.logaddexp(_log_rest(p), math.log(p) + mu * x - mu * mu / 2))


def _x_at(loss: float, mu: float, p: float) -> float:
    """x where the remove loss equals ``loss``; -inf below its infimum log(1 - p)."""
    excess = math.exp(loss) - (1.0 - p)
    return -math.inf if excess <= 0 else (math.log(excess / p) + mu * mu / 2) / mu


def _profile_c(eps: float, mu: float, p: float) -> float:
    nd = special.ndtr
    x = _x_at(eps, mu, p)  # remove: (1-p) N(0) + p N(mu) against N(0), loss > eps <=> X > x
    remove = (1 - p) * nd(-x) + p * nd(mu - x) - math.exp(eps) * nd(-x)
    x = _x_at(-eps, mu, p)  # add: the pair swapped, loss > eps <=> X < x
    add = 0.0 if x == -math.inf else nd(x) - math.exp(eps) * ((1 - p) * nd(x) + p * nd(x - mu))
    return max(remove, add, 0.0)


def _two_steps_c(eps: float, mu: float, p: float) -> float:
    """Loss of C_p(G_mu): the remove loss where positive, the add loss where negative, an atom at 0."""
    atom = (1 - p) * math.erf(mu / (2 * math.sqrt(2)))
    half = mu / 2  # the remove loss is positive exactly for x > mu / 2

    def positive(x: float) -> float:
        density = _NORMAL * ((1 - p) * math.exp(-x * x / 2) + p * math.exp(-(x - mu) ** 2 / 2))
        return density * _profile_c(eps - _remove_loss(x, mu, p), mu, p)

    def negative(x: float) -> float:
        return _NORMAL * math.exp(-x * x / 2) * _profile_c(eps + _remove_loss(x, mu, p), mu, p)

    kink = max(_x_at(eps, mu, p), half)  # where eps - L crosses 0 and the profile switches branch
    kw = dict(epsabs=0.0, epsrel=1e-13, limit=1000)  # relative: delta may be ~1e-19
    total = atom * _profile_c(eps, mu, p)
    total += integrate.quad(positive, half, kink, **kw)[0] + integrate.quad(positive, kink, half + 40, **kw)[0]
    return total + integrate.quad(negative, half, half + 40, **kw)[0]


def _two_steps_real(eps: float, mu: float, p: float) -> float:
    shift = mu / 2

    def log_density(y: float, centre: float) -> float:
        return float(np.logaddexp(_log_rest(p) - y * y / 2, math.log(p) - (y - centre) ** 2 / 2))

    def loss(y: float) -> float:  # increasing in y
        return log_density(y, shift) - log_density(y, -shift)

    top, bottom = loss(60.0), loss(-60.0)

    def excess(level: float) -> float:  # E_P[(1 - e^{level - L})_+] of one step
        if top <= level:
            return 0.0
        y = -60.0 if bottom >= level else optimize.brentq(lambda v: loss(v) - level, -60, 60, xtol=1e-15)
        nd = special.ndtr
        p_mass = (1 - p) * nd(-y) + p * nd(shift - y)
        q_mass = (1 - p) * nd(-y) + p * nd(-shift - y)
        return max(p_mass - math.exp(level) * q_mass, 0.0)

    def outer(x: float) -> float:
        return _NORMAL * math.exp(log_density(x, shift)) * excess(eps - loss(x))

    return integrate.quad(outer, -40, 40, epsabs=0.0, epsrel=1e-13, limit=1000)[0]


def _step(mu: float, sample_size: int, dataset_size: int) -> fdp.SampledWithoutReplacement:
    return fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=1 / mu), sample_size=sample_size,
                                         dataset_size=dataset_size)


def _delta_bounds(step: fdp.SampledWithoutReplacement, steps: int, eps: float) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the analysis gap: not what these tests check
        return fdp.PLDAccountant().compose(step, steps=steps).get_delta_bounds(eps)


def test_the_case_that_broke_poisson_style_accounting_is_below_the_upper_bound() -> None:
    """p = 0.9, two steps, mu = 2 (DP-SGD with sigma = 1, B = 9 of N = 10), eps = 0.05."""
    truth = _two_steps_real(0.05, 2.0, 0.9)
    assert truth == pytest.approx(0.770641, abs=2e-6)
    lower, upper = _delta_bounds(_step(2.0, 9, 10), 2, 0.05)
    assert lower <= truth <= upper
    assert _two_steps_c(0.05, 2.0, 0.9) <= upper <= _two_steps_c(0.05, 2.0, 0.9) * (1 + 1e-4)


@pytest.mark.parametrize(("mu", "b", "n", "eps"), [(2.0, 5, 10, 1.0), (1.0, 1, 10, 0.2), (4.0, 3, 10, 2.0),
                                                   (0.5, 9, 10, 0.0)])
def test_two_steps_bracket_the_references(mu: float, b: int, n: int, eps: float) -> None:
    p = b / n
    guarantee, real = _two_steps_c(eps, mu, p), _two_steps_real(eps, mu, p)
    lower, upper = _delta_bounds(_step(mu, b, n), 2, eps)
    assert real <= guarantee + 1e-12
    assert lower <= guarantee <= upper <= guarantee * (1 + 1e-3) + 1e-9
    assert real <= upper


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mu=st.floats(0.3, 4.0), b=st.integers(1, 20), eps=st.floats(0.0, 3.0))
@example(mu=1.0, b=20, eps=0.0)  # the search's: B = N (the references' log(1 - p) at p = 1)
@example(mu=0.5, b=1, eps=1.5)  # the search's: delta 5e-19, below the references' old absolute tolerance
def test_no_bracket_on_the_wrong_side(mu: float, b: int, eps: float) -> None:
    p = b / 20
    guarantee = _two_steps_c(eps, mu, p)
    lower, upper = _delta_bounds(_step(mu, b, 20), 2, eps)
    assert lower <= guarantee + 1e-12 and guarantee <= upper
    assert _two_steps_real(eps, mu, p) <= upper


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 3.0])
def test_one_step_is_tight_and_the_remove_direction(eps: float) -> None:
    """For eps >= 0 one step of C_p(f) is f_p's delta, attained by real data sets: no gap."""
    lower, upper = _delta_bounds(_step(1.5, 30, 100), 1, eps)
    exact = _profile_c(eps, 1.5, 0.3)
    assert lower <= exact <= upper <= exact * (1 + 1e-3) + 1e-12


def test_tradeoff_is_the_symmetric_hull() -> None:
    step = _step(2.0, 9, 10)
    curve = step.tradeoff()
    alphas = np.linspace(0.0, 1.0, 41)
    np.testing.assert_allclose(curve(alphas), curve.inverse()(alphas), atol=1e-9)
    for eps in (0.0, 0.05, 0.5, 2.0):
        assert float(curve.delta(eps)) == pytest.approx(_profile_c(eps, 2.0, 0.9), abs=1e-6)


def test_the_gap_is_named_not_blamed_on_the_grid() -> None:
    acc = fdp.dpsgd(noise_multiplier=1.0, batch_size=256, dataset_size=60000, epochs=2,
                    sampling="without_replacement")
    with pytest.warns(UserWarning, match="accept the gap"):
        lower, upper = acc.get_epsilon_bounds(1e-5)
    assert 0 < lower < upper
    # the lower bound is two real data sets in one order: DP-SGD's pair at sigma / 2, Poisson-style
    poisson_form = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=0.5, sampling_rate=256 / 60000),
                                               steps=470)
    attack_lower, attack_upper = poisson_form.get_epsilon_bounds(1e-5)
    assert attack_lower * (1 - 1e-9) <= lower <= attack_upper < upper


def test_dpsgd_without_replacement_halves_the_noise_multiplier() -> None:
    """A replaced example moves the clipped sum by up to 2C: DP-SGD's sigma is sigma / 2 there."""
    acc = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=2, sampling="without_replacement")
    (mech, count), = acc.events
    assert count == 470 and mech.mechanism.noise_multiplier == pytest.approx(0.55) and mech.sample_size == 256
    assert acc.neighboring == "replace_one" and fdp.PLDAccountant().neighboring == "add_remove"


def test_relations_do_not_mix() -> None:
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.01), steps=10)
    with pytest.raises(ValueError, match="replace_one.*add_remove|separate accountants"):
        acc.compose(_step(1.0, 1, 100))
    acc = fdp.PLDAccountant().compose(_step(1.0, 1, 100))
    with pytest.raises(ValueError, match="separate accountants"):
        acc.compose(fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.01))


def test_full_batch_is_the_plain_gaussian() -> None:
    step = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=2.0), sample_size=10, dataset_size=10)
    got = fdp.PLDAccountant().compose(step, steps=5).get_epsilon_bounds(1e-5)
    plain = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=2.0), steps=5).get_epsilon_bounds(1e-5)
    assert got == pytest.approx(plain, rel=1e-9)


def test_from_dp_event_and_below_dp_accountings_rdp() -> None:
    dpa = pytest.importorskip("dp_accounting")
    event = dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(60000, 256, dpa.GaussianDpEvent(0.55)), 1000)
    acc = fdp.from_dp_event(event)
    assert acc.events == ((_step(1 / 0.55, 256, 60000), 1000),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lower, upper = acc.get_epsilon_bounds(1e-5)
    rdp = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    rdp.compose(event)
    assert lower <= upper <= rdp.get_epsilon(1e-5)  # RDP's bound is an upper bound too
    assert fdp.from_dp_event(dpa.SampledWithoutReplacementDpEvent(100, 0, dpa.GaussianDpEvent(1.0))).steps == 1
    with pytest.raises(ValueError, match="LaplaceDpEvent"):
        fdp.from_dp_event(dpa.SampledWithoutReplacementDpEvent(100, 5, dpa.LaplaceDpEvent(1.0)))
    mixed = dpa.ComposedDpEvent([event, dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0))])
    with pytest.raises(ValueError, match="separate accountants"):
        fdp.from_dp_event(mixed)


def test_json_round_trip() -> None:
    acc = fdp.PLDAccountant().compose(_step(1.0, 3, 30), steps=4)
    again = fdp.PLDAccountant.from_json(acc.to_json())
    assert again.events == acc.events and again.neighboring == "replace_one" and json.loads(acc.to_json())


@pytest.mark.parametrize(("kwargs", "name"), [
    (dict(mechanism=fdp.Laplace(scale=1.0), sample_size=1, dataset_size=2), "mechanism"),
    (dict(mechanism=fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.5), sample_size=1, dataset_size=2),
     "sampling_rate"),
    (dict(mechanism=fdp.Gaussian(noise_multiplier=1.0), sample_size=3, dataset_size=2), "sample_size"),
    (dict(mechanism=fdp.Gaussian(noise_multiplier=1.0), sample_size=0, dataset_size=2), "sample_size"),
    (dict(mechanism=fdp.Gaussian(noise_multiplier=1.0), sample_size=1, dataset_size=0), "dataset_size"),
])
def test_bad_input_is_a_value_error_naming_it(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        fdp.SampledWithoutReplacement(**kwargs)


def test_cli_without_replacement(capsys: pytest.CaptureFixture[str]) -> None:
    from fdp.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["epsilon", "--noise-multiplier", "1.1", "--batch-size", "256", "--dataset-size", "60000",
                     "--epochs", "1", "--delta", "1e-5", "--sampling", "without_replacement", "--json"]) == 0
        expected = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=1,
                             sampling="without_replacement").get_epsilon_bounds(1e-5)
    out = json.loads(capsys.readouterr().out)
    assert out["neighboring"] == "replace_one" and out["steps"] == 235
    assert (out["lower"], out["upper"]) == pytest.approx(expected, rel=1e-12)


def test_sampling_page_section_runs_and_its_table_is_what_fdp_says() -> None:
    """docs/sampling.md, 'Sampling without replacement': the block prints what the page
    says, and the table's first row is the accountant's bracket."""
    import re

    from doc_blocks import run_first_block, said_to_print, section

    text = section("sampling.md", "## Sampling without replacement", "## Shuffling")
    assert run_first_block(text, "sampling.md").strip() == said_to_print(text)
    row = re.search(r"\| 1 \| (.*?) \| (.*?) \| \[(.*?), (.*?)\] \|", text)
    acc = fdp.dpsgd(noise_multiplier=1.0, batch_size=256, dataset_size=60000, epochs=1,
                    sampling="without_replacement")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lower, upper = acc.get_epsilon_bounds(1e-5)
    assert (row.group(3), row.group(4)) == (f"{lower:.4g}", f"{upper:.4g}")


def test_tiny_noise_gives_a_number_not_a_crash() -> None:
    """Red team: s = 0.01 made the add direction's optimistic cells nan far above its support
    (0 * inf on a grid of spacing 15), and the merge raised ZeroDivisionError."""
    step = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=0.01), sample_size=1, dataset_size=3)
    lower, upper = fdp.PLDAccountant().compose(step).get_epsilon_bounds(1e-5)
    assert 0 < lower <= upper < math.inf


def test_loss_cells_refuse_a_nan() -> None:
    from fdp.pld.cells import Grid, LossCells

    with pytest.raises(ValueError, match="nan"):
        LossCells(grid=Grid(h=1.0, offset=0, n=2), p_cell=np.array([0.5, 0.5]), u_cell=np.array([0.0, np.nan]))
