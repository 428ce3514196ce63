"""Accounting: mechanisms, epsilon in the logs, step counts across save/restore."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import math
import warnings

import keras
import numpy as np

import fdp
import fdp_tf
from tf_helpers import CE, dense_data, dense_model

DELTA = 1e-5


def _reference_epsilon(mechanism, steps: int) -> float:
    return fdp.PLDAccountant().compose(mechanism, steps=steps).get_epsilon(delta=DELTA)


def test_optimizers_know_their_mechanism() -> None:
    jl = fdp_tf.DPAdamJL(l2_norm_clip=1.0, noise_multiplier=0.6, jl_projections=5)
    exact = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.1)
    assert jl.mechanism(256 / 25000) == fdp.JL(noise_multiplier=0.6, jl_projections=5, sampling_rate=256 / 25000)
    assert exact.mechanism(0.01) == fdp.Gaussian(noise_multiplier=1.1, sampling_rate=0.01)


def test_epsilon_in_history_equals_accountant_gaussian() -> None:
    x, y = dense_data(n=200)
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.1, seed=0)
    model = fdp_tf.make_private(dense_model(), optimizer=optimizer, loss=CE)
    data = fdp_tf.poisson_batches(x, y, expected_batch_size=20, seed=0)  # p = 0.1, 10 steps/epoch
    history = model.fit(data, epochs=2, verbose=0, callbacks=[fdp_tf.PrivacyCallback(delta=DELTA)])
    assert optimizer.steps == 20
    mechanism = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.1)
    expected = [_reference_epsilon(mechanism, 10), _reference_epsilon(mechanism, 20)]
    np.testing.assert_allclose(history.history["epsilon"], expected, rtol=1e-12)
    assert expected[0] < expected[1]


def test_epsilon_in_history_equals_accountant_jl() -> None:
    x, y = dense_data(n=100)
    optimizer = fdp_tf.DPSGDJL(
        l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=3, learning_rate=0.1, seed=0
    )
    model = fdp_tf.make_private(dense_model(), optimizer=optimizer, loss=CE)
    data = fdp_tf.poisson_batches(x, y, expected_batch_size=10, seed=0)  # p = 0.1
    history = model.fit(data, epochs=1, verbose=0, callbacks=[fdp_tf.PrivacyCallback(delta=DELTA)])
    expected = _reference_epsilon(fdp.JL(noise_multiplier=1.0, jl_projections=3, sampling_rate=0.1), 10)
    assert history.history["epsilon"] == [expected]


def test_steps_resume_after_save_and_restore(tmp_path) -> None:
    x, y = dense_data(n=64)
    optimizer = fdp_tf.DPAdamJL(
        l2_norm_clip=1.0, noise_multiplier=0.5, jl_projections=1, learning_rate=0.01, seed=0
    )
    model = fdp_tf.make_private(dense_model(), optimizer=optimizer, loss=CE)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16, seed=0), epochs=2, verbose=0)
    assert optimizer.steps == 8
    path = tmp_path / "private.keras"
    model.save(path)

    restored = keras.models.load_model(path)
    assert isinstance(restored, fdp_tf.PrivateModel)
    assert isinstance(restored.optimizer, fdp_tf.DPAdamJL)
    assert restored.optimizer.steps == 8
    assert restored.optimizer.jl_projections == 1
    assert restored.optimizer.expected_batch_size == 16
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    restored.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16, seed=1), epochs=1, verbose=0)
    assert restored.optimizer.steps == 12


def test_epsilon_after_restore_counts_all_steps(tmp_path) -> None:
    x, y = dense_data(n=40)
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.2, learning_rate=0.1, seed=0)
    model = fdp_tf.make_private(dense_model(), optimizer=optimizer, loss=CE)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=10, seed=0), epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras")
    history = restored.fit(
        fdp_tf.poisson_batches(x, y, expected_batch_size=10, seed=1), epochs=1, verbose=0,
        callbacks=[fdp_tf.PrivacyCallback(delta=DELTA)],
    )
    expected = _reference_epsilon(fdp.Gaussian(noise_multiplier=1.2, sampling_rate=0.25), 8)
    assert history.history["epsilon"] == [expected]
    assert restored.optimizer.epsilon(DELTA, 0.25) == expected


def test_epsilon_edge_cases() -> None:
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=0.0)
    assert fdp_tf.compute_epsilon(optimizer, delta=DELTA, sampling_rate=0.1) == 0.0
    assert fdp_tf.compute_epsilon(optimizer, delta=DELTA, sampling_rate=0.1, steps=5) == math.inf
    with pytest.raises(ValueError, match="optimizer"):
        fdp_tf.compute_epsilon(keras.optimizers.SGD(), delta=DELTA, sampling_rate=0.1)
    with pytest.raises(ValueError, match="delta"):
        fdp_tf.compute_epsilon(optimizer, delta=0.0, sampling_rate=0.1)
    with pytest.raises(ValueError, match="sampling_rate"):
        fdp_tf.compute_epsilon(optimizer, delta=DELTA, sampling_rate=1.5)
    with pytest.raises(ValueError, match="steps"):
        fdp_tf.compute_epsilon(optimizer, delta=DELTA, sampling_rate=0.1, steps=-1)


def test_callback_refuses_a_plain_model_and_fit_refuses_an_unknown_rate() -> None:
    """A .map-ped Poisson dataset hides B and p: fit refuses (it used to divide by the
    realised batch size, noise std 0.64-1.67x the target) and says how to pass them."""
    x, y = dense_data(n=32)
    plain = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    plain.compile(optimizer="sgd", loss=CE)
    with pytest.raises(ValueError, match="PrivateModel"):
        plain.fit(x, y, epochs=1, verbose=0, callbacks=[fdp_tf.PrivacyCallback(delta=DELTA)])
    private = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE
    )
    source = fdp_tf.poisson_batches(x, y, expected_batch_size=8, seed=0)
    mapped = source.map(lambda a, b: (a, b))
    with pytest.raises(ValueError, match=r"sampling=fdp_tf.PoissonSampling.*fdp_tf.sampling_of\(original\)"):
        private.fit(mapped, epochs=1, verbose=0)
    assert private.optimizer.steps == 0
    history = private.fit(mapped, epochs=1, verbose=0, sampling=fdp_tf.sampling_of(source),
                          callbacks=[fdp_tf.PrivacyCallback(delta=DELTA)])
    assert private.optimizer.expected_batch_size == 8
    expected = _reference_epsilon(fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.25), 4)
    assert history.history["epsilon"] == [expected]
    with pytest.raises(ValueError, match="delta"):
        fdp_tf.PrivacyCallback(delta=1.0)
    with pytest.raises(ValueError, match="ledger"):
        fdp_tf.PrivacyCallback(delta=DELTA, sampling_rate=0.1)


def test_ledger_composes_phases_at_their_own_rates() -> None:
    """Two fits at B/N = 0.25 then 0.0625: epsilon is the heterogeneous composition of
    both phases, exactly (it used to charge everything at the largest rate)."""
    x, y = dense_data(n=64)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        with pytest.raises(ValueError, match="expected_batch_size"):
            model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # optimizer's B = 16 > 4
        model.optimizer.expected_batch_size = 4
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    first = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.25)
    second = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.0625)
    assert model.ledger.segments == (
        fdp_tf.Segment("gaussian", 1.0, 0, 0.25, 4), fdp_tf.Segment("gaussian", 1.0, 0, 0.0625, 16)
    )
    expected = fdp.PLDAccountant().compose(first, steps=4).compose(second, steps=16).get_epsilon(delta=DELTA)
    assert model.epsilon(DELTA) == expected
    assert model.epsilon(DELTA) > _reference_epsilon(first, 4)


def test_privacy_callback_uses_the_accountant_settings_it_is_given() -> None:
    """The wide-bracket warning tells users to pass accountant settings: the callback
    and PrivateModel.epsilon take them (the ledger's events are composed on a fresh copy)."""
    x, y = dense_data(n=200)
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.1, seed=0)
    model = fdp_tf.make_private(dense_model(), optimizer=optimizer, loss=CE)
    data = fdp_tf.poisson_batches(x, y, expected_batch_size=20, seed=0)  # p = 0.1, 10 steps/epoch
    coarse = fdp.PLDAccountant(grid_spacing=0.05, max_refinements=0)
    history = model.fit(data, epochs=1, verbose=0,
                        callbacks=[fdp_tf.PrivacyCallback(delta=DELTA, accountant=coarse)])
    mechanism = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.1)
    expected = coarse.fresh().compose(mechanism, steps=10).get_epsilon(DELTA)
    assert history.history["epsilon"] == [expected] != [_reference_epsilon(mechanism, 10)]
    assert model.epsilon(DELTA, accountant=coarse) == expected and coarse.events == ()
    with pytest.raises(ValueError, match="accountant"):
        fdp_tf.PrivacyCallback(delta=DELTA, accountant="pld")
