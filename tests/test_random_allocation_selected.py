"""Random allocation of k > 1 steps per example (fdp.mechanisms.allocation_selected):
certified brackets against an independent quadrature of the exact k-of-t pair."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, special, stats

from hypothesis_budget import examples

import fdp
from fdp.mechanisms.allocation_selected import block_sizes


def _norm_sf(x: float) -> float:
    return 0.5 * special.erfc(x / math.sqrt(2.0))


def _two_of_three_delta(mu: float, eps: float, remove: bool) -> float:
    """delta(eps) of one 2-of-3 epoch's pair (P = mean over the 3 pairs S of N(mu 1_S, I),
    Q = N(0, I)): given y_1, y_2 the likelihood ratio is a + b W_3 with W_3 lognormal, whose
    hockey stick has a closed form; scipy integrates that over (y_1, y_2)."""
    e = math.exp(eps)

    def inner(y2: float, y1: float) -> float:
        w1, w2 = math.exp(mu * y1 - mu * mu / 2), math.exp(mu * y2 - mu * mu / 2)
        a, b = w1 * w2 / 3, (w1 + w2) / 3
        density = math.exp(-(y1 * y1 + y2 * y2) / 2) / (2 * math.pi)
        if remove:  # E[(a + b W_3 - e)_+]
            c = (e - a) / b
            if c <= 0:
                return density * (a - e + b)
            y = (math.log(c) + mu * mu / 2) / mu
            return density * ((a - e) * _norm_sf(y) + b * _norm_sf(y - mu))
        c = (1 - e * a) / (e * b)  # E[(1 - e a - e b W_3)_+]
        if c <= 0:
            return 0.0
        y = (math.log(c) + mu * mu / 2) / mu
        return density * ((1 - e * a) * (1 - _norm_sf(y)) - e * b * (1 - _norm_sf(y - mu)))

    value, error = integrate.dblquad(inner, -12.0, 12.0, -12.0, 12.0, epsabs=1e-13, epsrel=1e-10)
    assert error < 1e-9
    return value


def _bracket(sigma: float, eps: float, epochs: int = 1) -> tuple[float, float]:
    epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=sigma), steps_per_epoch=3, selected=2)
    return fdp.PLDAccountant().compose(epoch, steps=epochs).get_delta_bounds(eps)


@pytest.mark.parametrize("sigma, eps", [(0.8, 0.5), (1.0, 1.0), (2.0, 0.0), (3.0, 0.2)])
def test_two_of_three_brackets_the_quadrature(sigma: float, eps: float) -> None:
    lower, upper = _bracket(sigma, eps)
    truth = max(_two_of_three_delta(1 / sigma, eps, remove) for remove in (True, False))
    assert lower <= truth <= upper
    assert upper < 1.5 * truth  # the blocks are not vacuous


@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sigma=st.floats(0.7, 5.0), eps=st.floats(0.0, 3.0))
@example(sigma=0.7, eps=3.0)
def test_two_of_three_bracket_property(sigma: float, eps: float) -> None:
    """A search for a bound on the wrong side of the quadrature."""
    lower, upper = _bracket(sigma, eps)
    truth = max(_two_of_three_delta(1 / sigma, eps, remove) for remove in (True, False))
    assert lower <= truth * (1 + 1e-8) + 1e-15
    assert truth <= upper * (1 + 1e-8) + 1e-15


def test_every_step_selected_is_the_gaussian_mechanism() -> None:
    """k = t: each example in every step, t Gaussian steps; both bounds meet there."""
    epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=1.0), steps_per_epoch=4, selected=4)
    ra = fdp.PLDAccountant().compose(epoch, steps=3).get_epsilon_bounds(1e-5)
    own = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.0), steps=12).get_epsilon_bounds(1e-5)
    assert ra == pytest.approx(own, rel=1e-6)


def test_more_steps_per_example_spend_more_and_stay_below_the_blocks_alone() -> None:
    """k = 2 of t = 235 over 60 epochs lies above k = 1 (each example used twice as often)
    and its upper bound is the composition of 2 blocks of 1-of-117/118, 60 times."""
    sigma, t, epochs = 2.0, 235, 60
    one = fdp.PLDAccountant().compose(fdp.RandomAllocation(fdp.Gaussian(sigma), steps_per_epoch=t), steps=epochs)
    two = fdp.PLDAccountant().compose(fdp.RandomAllocation(fdp.Gaussian(sigma), steps_per_epoch=t, selected=2),
                                      steps=epochs)
    blocks = fdp.PLDAccountant()
    for m, count in block_sizes(t, 2):
        blocks.compose(fdp.RandomAllocation(fdp.Gaussian(sigma), steps_per_epoch=m), steps=count * epochs)
    lo_one, hi_one = one.get_epsilon_bounds(1e-5)
    with pytest.warns(UserWarning, match="accept the gap"):
        lo_two, hi_two = two.get_epsilon_bounds(1e-5)
    assert hi_one < lo_two <= hi_two
    assert hi_two == pytest.approx(blocks.get_epsilon_bounds(1e-5)[1], rel=1e-3)  # grids differ a little
    # the lower bound is the sum statistic's: mu-GDP, mu = 2 sqrt(epochs / t) / sigma, in closed form
    mu = 2 * math.sqrt(epochs / t) / sigma
    gdp = optimize.brentq(lambda e: stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2)
                          - 1e-5, 0.0, 50.0, xtol=1e-12)
    assert gdp * (1 - 1e-3) <= lo_two <= gdp
    assert two.get_epsilon(1e-5) == hi_two  # the upper bound alone: no warning asked for


@pytest.mark.parametrize("steps, selected", [(235, 2), (7, 3), (5, 5), (10**6, 7), (9, 1)])
def test_blocks_cover_the_epoch(steps: int, selected: int) -> None:
    sizes = block_sizes(steps, selected)
    assert sum(m * count for m, count in sizes) == steps
    assert sum(count for _, count in sizes) == selected
    assert max(m for m, _ in sizes) - min(m for m, _ in sizes) <= 1


def test_bad_selections_are_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"selected must be .*got 5"):
        fdp.RandomAllocation(fdp.Gaussian(1.0), steps_per_epoch=4, selected=5)
    with pytest.raises(ValueError, match="Gaussian step only.*selected=1 with steps_per_epoch=t/k"):
        fdp.RandomAllocation(fdp.JL(noise_multiplier=2.0, jl_projections=30), steps_per_epoch=10, selected=2)
    epoch = fdp.RandomAllocation(fdp.Gaussian(1.0), steps_per_epoch=10, selected=2)
    with pytest.raises(ValueError, match="compose it in an fdp.PLDAccountant"):
        epoch.loss_range(fdp.pld.cells.Direction.REMOVE, 1e-12)


def test_selected_epochs_round_trip_and_give_a_curve() -> None:
    epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=1.5), steps_per_epoch=20, selected=3)
    acc = fdp.PLDAccountant().compose(epoch, steps=5)
    again = fdp.PLDAccountant.from_json(acc.to_json())
    assert json.loads(again.to_json()) == json.loads(acc.to_json())
    assert again.get_epsilon(1e-5) == acc.get_epsilon(1e-5)
    rows = fdp.epsilon_curve(epoch, [1, 5], 1e-5)
    assert rows[1] == pytest.approx(acc.get_epsilon_bounds(1e-5), rel=1e-9) and rows[0][1] < rows[1][0]
    curve = epoch.tradeoff()
    alpha = np.linspace(0.0, 1.0, 11)
    beta = np.asarray(curve(alpha))
    assert np.all(beta <= 1 - alpha + 1e-12) and np.all(np.diff(beta) <= 1e-12)


def test_dpsgd_and_the_cli_take_the_steps_per_example(capsys: pytest.CaptureFixture[str]) -> None:
    """An epoch of k-of-t allocation is t = ceil(N k / B) steps (expected batch N k / t ~ B)."""
    from fdp.cli import main

    acc = fdp.dpsgd(noise_multiplier=2.0, batch_size=256, dataset_size=60000, epochs=2.5,
                    sampling="random_allocation", selected=2)
    (epoch, count), = acc.events
    assert (epoch.steps_per_epoch, epoch.selected, count) == (469, 2, 3)
    with pytest.raises(ValueError, match="selected=2 .* is for sampling='random_allocation'"):
        fdp.dpsgd(noise_multiplier=2.0, batch_size=256, dataset_size=60000, epochs=1, selected=2)
    flags = ["--noise-multiplier", "2", "--batch-size", "256", "--dataset-size", "60000", "--epochs", "2.5",
             "--delta", "1e-5", "--json"]
    with pytest.warns(UserWarning, match="accept the gap"):
        assert main(["epsilon", *flags, "--sampling", "random_allocation", "--selected", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["steps_per_epoch"], out["selected"], out["epochs"]) == (469, 2, 3)
    assert out["upper"] == acc.get_epsilon(1e-5)
    assert main(["epsilon", *flags, "--selected", "2"]) == 2
    assert "--selected 2 (steps per example per epoch) is for --sampling random_allocation" in capsys.readouterr().err


def test_calibration_steps_over_noise_multipliers_the_mechanism_refuses() -> None:
    """Random allocation refuses a small sigma (its lattice would not fit) as it is built;
    calibrating to epsilon 3 at t = 235 probed sigma ~ 0.49 and raised that refusal. A
    probe that cannot be built misses the target (the safe side) and the search goes on;
    a stand-in refusal below the answer keeps this test fast."""
    answer = fdp.calibrate_noise_multiplier(target_epsilon=1.0, delta=1e-5, steps=1000,
                                            mechanism=lambda s: fdp.Gaussian(noise_multiplier=s, sampling_rate=0.01))
    refused: list[float] = []

    def step(sigma: float) -> fdp.Gaussian:
        if sigma < 0.97 * answer:  # answer ~ 1.42: sigma = 1, where the rate is read, is refused too
            refused.append(sigma)
            raise ValueError(f"noise_multiplier={sigma} is too small here")
        return fdp.Gaussian(noise_multiplier=sigma, sampling_rate=0.01)

    sigma = fdp.calibrate_noise_multiplier(target_epsilon=1.0, delta=1e-5, steps=1000, mechanism=step)
    assert refused and sigma == pytest.approx(answer, rel=1e-3)


def test_sampling_page_selected_block_prints_what_it_shows() -> None:
    """docs/sampling.md, 'More than one step per example': the block prints the line shown."""
    from doc_blocks import run_first_block, said_to_print, section

    text = section("sampling.md", "### More than one step per example", "## Sampling without replacement")
    with pytest.warns(UserWarning, match="accept the gap"):
        printed = run_first_block(text, "sampling.md").strip()
    assert printed == said_to_print(text)
