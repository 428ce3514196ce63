"""Sampling without replacement under replace-one (the subsampling theorem of Dong, Roth, Su)."""

from __future__ import annotations

import json

import pytest

import fdp


def test_it_is_the_subsampled_mechanism_at_rate_b_over_n() -> None:
    """C_p(f) with f the step's replace-one curve: both directions of the Poisson-subsampled
    mechanism at p = B / N, so the same brackets exactly."""
    step = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=0.8), sample_size=100, dataset_size=5000)
    ours = fdp.PLDAccountant().compose(step, steps=500).get_epsilon_bounds(1e-6)
    same = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=0.8, sampling_rate=0.02), steps=500)
    assert ours == same.get_epsilon_bounds(1e-6)


def test_dpsgd_without_replacement_halves_the_noise_multiplier() -> None:
    """A replaced example moves the clipped sum by up to 2C: DP-SGD's sigma is sigma / 2 there."""
    acc = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=2, sampling="without_replacement")
    (mech, count), = acc.events
    assert count == 470 and mech.mechanism.noise_multiplier == pytest.approx(0.55) and mech.sample_size == 256
    assert mech.neighboring == "replace_one"


def test_full_batch_is_one_direction_and_the_plain_gaussian() -> None:
    step = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=2.0), sample_size=10, dataset_size=10)
    got = fdp.PLDAccountant().compose(step, steps=5).get_epsilon_bounds(1e-5)
    assert got == fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=2.0), steps=5).get_epsilon_bounds(1e-5)


def test_from_dp_event_and_below_dp_accountings_rdp() -> None:
    dpa = pytest.importorskip("dp_accounting")
    event = dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(60000, 256, dpa.GaussianDpEvent(0.55)), 1000)
    lower, upper = fdp.from_dp_event(event).get_epsilon_bounds(1e-5)
    rdp = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    rdp.compose(event)
    assert lower <= upper <= rdp.get_epsilon(1e-5)  # RDP's bound is an upper bound too
    assert fdp.from_dp_event(dpa.SampledWithoutReplacementDpEvent(100, 0, dpa.GaussianDpEvent(1.0))).steps == 1
    with pytest.raises(ValueError, match="RandomizedResponseDpEvent"):
        fdp.from_dp_event(dpa.SampledWithoutReplacementDpEvent(100, 5, dpa.RandomizedResponseDpEvent(0.5, 2)))


def test_json_round_trip() -> None:
    step = fdp.SampledWithoutReplacement(fdp.Laplace(scale=2.0), sample_size=3, dataset_size=30)
    acc = fdp.PLDAccountant().compose(step, steps=4)
    again = fdp.PLDAccountant.from_json(acc.to_json())
    assert again.events == acc.events and json.loads(acc.to_json())


@pytest.mark.parametrize(("kwargs", "name"), [
    (dict(mechanism=fdp.JL(noise_multiplier=1.0, jl_projections=2), sample_size=1, dataset_size=2), "mechanism"),
    (dict(mechanism=fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.5), sample_size=1, dataset_size=2),
     "sampling_rate"),
    (dict(mechanism=fdp.Gaussian(noise_multiplier=1.0), sample_size=3, dataset_size=2), "sample_size"),
    (dict(mechanism=fdp.Gaussian(noise_multiplier=1.0), sample_size=1, dataset_size=0), "dataset_size"),
])
def test_bad_input_is_a_value_error_naming_it(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        fdp.SampledWithoutReplacement(**kwargs)


def test_cli_without_replacement(capsys: pytest.CaptureFixture[str]) -> None:
    from fdp.cli import main

    assert main(["epsilon", "--noise-multiplier", "1.1", "--batch-size", "256", "--dataset-size", "60000",
                 "--epochs", "1", "--delta", "1e-5", "--sampling", "without_replacement", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=1,
                         sampling="without_replacement").get_epsilon_bounds(1e-5)
    assert out["neighboring"] == "replace_one" and out["steps"] == 235
    assert (out["lower"], out["upper"]) == pytest.approx(expected, rel=1e-12)
