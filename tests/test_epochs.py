"""The epochs convention (fdp.epochs): ceil(N/B) Poisson steps per epoch, partial epochs rounded up."""

from __future__ import annotations

import math

import pytest

import fdp
from fdp.epochs import sampling_rate


def test_steps_per_epoch_is_ceil_n_over_b():
    assert fdp.steps_per_epoch(256, 60000) == 235  # 60000 / 256 = 234.375
    assert fdp.steps_per_epoch(250, 25000) == 100  # exact division
    assert fdp.steps_per_epoch(1, 7) == 7
    assert fdp.steps_per_epoch(7, 7) == 1


def test_epochs_to_steps_integer_and_partial():
    assert fdp.epochs_to_steps(60, 256, 60000) == 14100  # the README's 14,100
    assert fdp.epochs_to_steps(0.5, 256, 60000) == 118  # 117.5 rounded up
    # the decimal the user wrote is exact: 0.3 * 10 is 3 steps, not the 4 that
    # ceil(0.3 * 10.0) = ceil(3.0000000000000004) would give
    assert fdp.epochs_to_steps(0.3, 10, 100) == 3
    assert fdp.epochs_to_steps(1e-9, 256, 60000) == 1  # any started step counts


@pytest.mark.parametrize("kwargs, name", [
    (dict(epochs=0, batch_size=10, dataset_size=100), "epochs"),
    (dict(epochs=-1.0, batch_size=10, dataset_size=100), "epochs"),
    (dict(epochs=math.nan, batch_size=10, dataset_size=100), "epochs"),
    (dict(epochs=math.inf, batch_size=10, dataset_size=100), "epochs"),
    (dict(epochs=1, batch_size=0, dataset_size=100), "batch_size"),
    (dict(epochs=1, batch_size=101, dataset_size=100), "batch_size"),
    (dict(epochs=1, batch_size=2.5, dataset_size=100), "batch_size"),
    (dict(epochs=1, batch_size=10, dataset_size=0), "dataset_size"),
    (dict(epochs=1e13, batch_size=1, dataset_size=100), "epochs"),
])
def test_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        fdp.epochs_to_steps(**kwargs)


def test_dpsgd_is_the_accountant_of_those_steps():
    acc = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=3)
    mech = fdp.Gaussian(noise_multiplier=1.1, sampling_rate=256 / 60000)
    assert acc.events == ((mech, 705),)
    ref = fdp.PLDAccountant().compose(mech, steps=705)
    assert acc.get_epsilon_bounds(1e-5) == ref.get_epsilon_bounds(1e-5)


def test_dpsgd_jl_and_accountant_settings():
    template = fdp.PLDAccountant(max_refinements=0)
    acc = fdp.dpsgd(noise_multiplier=1.0, batch_size=100, dataset_size=10000, epochs=2,
                    jl_projections=30, accountant=template)
    assert acc is template and acc.max_refinements == 0
    (mech, steps), = acc.events
    assert isinstance(mech, fdp.JL) and mech.jl_projections == 30 and steps == 200
    assert mech.sampling_rate == sampling_rate(100, 10000) == 0.01
    with pytest.raises(ValueError, match="accountant"):
        fdp.dpsgd(noise_multiplier=1.0, batch_size=1, dataset_size=10, epochs=1, accountant="pld")
    with pytest.raises(ValueError, match="noise_multiplier"):
        fdp.dpsgd(noise_multiplier=-1.0, batch_size=1, dataset_size=10, epochs=1)


def test_dpsgd_takes_the_steps_run_instead_of_epochs():
    """steps=T is the same accountant as the epochs that make T steps; random allocation
    charges the whole epochs that T steps start; exactly one of the two is required."""
    by_steps = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, steps=14100)
    by_epochs = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60)
    assert by_steps.events == by_epochs.events
    allocation = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, steps=500,
                           sampling="random_allocation")
    assert allocation.events[0][1] == 3  # 500 steps of 235-step epochs start 3 epochs
    for kwargs in (dict(), dict(epochs=1, steps=10)):
        with pytest.raises(ValueError, match="exactly one of epochs=E .* or steps=T"):
            fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, **kwargs)
    with pytest.raises(ValueError, match="steps must be an integer"):
        fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, steps=0)
