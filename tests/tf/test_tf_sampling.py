"""Poisson sampling pipeline, arrays drawn as Poisson batches, the fixed-batch warning."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import warnings

import numpy as np

import fdp_tf
from tf_helpers import CE, dense_data, dense_model


def _batches(dataset):
    return [(np.asarray(x), np.asarray(y)) for x, y in dataset]


def test_batch_sizes_are_binomial_with_the_expected_mean() -> None:
    n, b, steps = 1000, 50, 400
    x = np.arange(n, dtype=np.float32)[:, None]
    y = np.arange(n)
    dataset = fdp_tf.poisson_batches(x, y, expected_batch_size=b, steps_per_epoch=steps, seed=0)
    sizes = np.array([len(bx) for bx, _ in _batches(dataset)])
    p = b / n
    variance = n * p * (1 - p)  # Binomial(N, p)
    assert len(sizes) == steps
    assert abs(sizes.mean() - b) < 5 * np.sqrt(variance / steps)
    assert 0.7 * variance < sizes.var() < 1.3 * variance  # variable, not fixed-size


def test_examples_are_included_independently_at_rate_p() -> None:
    n, b, steps = 200, 20, 500
    x = np.arange(n, dtype=np.float32)[:, None]
    y = np.arange(n)
    counts = np.zeros(n)
    for bx, by in _batches(fdp_tf.poisson_batches(x, y, expected_batch_size=b, steps_per_epoch=steps, seed=1)):
        np.testing.assert_array_equal(bx[:, 0].astype(int), by)  # rows stay paired
        assert len(np.unique(by)) == len(by)  # no duplicates within a batch
        counts[by] += 1
    p = b / n
    # Each count is Binomial(steps, p): mean 50, sd 6.7.
    assert abs(counts.mean() - steps * p) < 1.0
    assert counts.min() > steps * p - 6 * np.sqrt(steps * p * (1 - p))


def test_each_epoch_draws_new_batches_and_seed_reproduces() -> None:
    x, y = dense_data(n=100)
    dataset = fdp_tf.poisson_batches(x, y, expected_batch_size=10, seed=3)
    first = [by.tolist() for _, by in _batches(dataset)]
    second = [by.tolist() for _, by in _batches(dataset)]
    assert first != second
    again = [by.tolist() for _, by in _batches(fdp_tf.poisson_batches(x, y, expected_batch_size=10, seed=3))]
    assert again == first
    assert len(first) == 10  # ceil(N / B) steps per epoch


def test_spec_and_sample_weights_and_x_only() -> None:
    x, y = dense_data(n=50)
    w = np.ones(50, dtype=np.float32)
    dataset = fdp_tf.poisson_batches(x, y, expected_batch_size=5, sample_weight=w, seed=0)
    spec = fdp_tf.poisson_sampling_of(dataset)
    assert spec == fdp_tf.PoissonSampling(num_examples=50, expected_batch_size=5, steps_per_epoch=10)
    assert spec.sampling_rate == 0.1
    assert all(len(element) == 3 for element in dataset)
    assert fdp_tf.poisson_sampling_of(dataset.map(lambda a, b, c: (a, b))) is None
    only_x = fdp_tf.poisson_batches(x, expected_batch_size=5, seed=0)
    assert next(iter(only_x)).shape[1:] == (5,)


def test_fit_takes_expected_batch_size_and_rate_from_the_dataset() -> None:
    x, y = dense_data(n=64)
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=1)
    model = fdp_tf.make_private(dense_model(), optimizer=optimizer, loss=CE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fdp_tf.SamplingWarning)
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16, seed=0), epochs=1, verbose=0)
    assert optimizer.expected_batch_size == 16
    assert model.ledger.segments[-1].sampling_rate == 0.25
    with pytest.raises(ValueError, match="expected_batch_size"):
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8, seed=0), epochs=1, verbose=0)


def test_arrays_are_drawn_as_poisson_batches_and_fixed_batches_warn() -> None:
    """Arrays were cut by Keras into fixed batches and booked as Poisson with a warning;
    now they are drawn as Poisson batches (certified, no warning). shuffle=False keeps
    Keras's fixed batches: booked at rate 1 (no amplification), with the warning."""
    x, y = dense_data(n=64)
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0)
    model = fdp_tf.make_private(dense_model(), optimizer=optimizer, loss=CE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    sampling = [w for w in caught if issubclass(w.category, fdp_tf.SamplingWarning)]
    assert len(sampling) == 1
    assert "shuffle=False" in str(sampling[0].message) and "rate 1" in str(sampling[0].message)
    assert optimizer.expected_batch_size == 16
    assert model.ledger.segments == (
        fdp_tf.Segment("gaussian", 1.0, 0, 0.25, 4), fdp_tf.Segment("gaussian", 1.0, 0, 1.0, 4))


def test_validation_split_rate_counts_only_training_rows() -> None:
    """validation_split=0.5 leaves 32 of 64 rows: p = 16/32, not 16/64 (it was 0.05 for 0.1)."""
    x, y = dense_data(n=64)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, validation_split=0.5)
    assert model.ledger.segments == (fdp_tf.Segment("gaussian", 1.0, 0, 0.5, 2),)


def test_non_private_optimizer_does_not_warn() -> None:
    import keras

    x, y = dense_data(n=32)
    model = fdp_tf.make_private(dense_model(), optimizer=keras.optimizers.SGD(0.1), loss=CE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fdp_tf.SamplingWarning)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(expected_batch_size=0), "expected_batch_size"),
        (dict(expected_batch_size=101), "expected_batch_size"),
        (dict(expected_batch_size=2.5), "expected_batch_size"),
        (dict(expected_batch_size=10, steps_per_epoch=0), "steps_per_epoch"),
    ],
)
def test_bad_sampling_arguments(kwargs, name) -> None:
    x, y = dense_data(n=100)
    with pytest.raises(ValueError, match=name):
        fdp_tf.poisson_batches(x, y, **kwargs)


def test_mismatched_rows() -> None:
    x, y = dense_data(n=10)
    with pytest.raises(ValueError, match="same number of rows"):
        fdp_tf.poisson_batches(x, y[:5], expected_batch_size=2)


def test_an_epoch_has_the_steps_of_fdps_epoch_convention() -> None:
    """poisson_batches draws fdp.steps_per_epoch(B, N) = ceil(N / B) batches per epoch,
    so fdp.dpsgd(..., epochs=E) accounts exactly what E epochs of it run."""
    import fdp

    x, y = dense_data(n=103)
    dataset = fdp_tf.poisson_batches(x, y, expected_batch_size=10, seed=5)
    assert len(list(_batches(dataset))) == fdp.steps_per_epoch(10, 103) == 11
    assert fdp_tf.poisson_sampling_of(dataset).steps_per_epoch == 11


def test_padding_batches_for_replicas_keeps_their_static_shape() -> None:
    """Found by the privacy fuzzer (seed 4275269902, depthwise on two replicas): the padding
    to a multiple of the replicas lost every static dimension, and a DepthwiseConv2D, which
    builds from its input's channels, crashed in fit with a TypeError."""
    import tensorflow as tf

    from fdp_tf.sampling import pad_to_replicas

    x = np.zeros((5, 4, 4, 2), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros(5, "int32"))).batch(3)
    padded = pad_to_replicas(data, 2)
    x_spec, y_spec, w_spec = padded.element_spec
    assert x_spec.shape.as_list() == [None, 4, 4, 2] and y_spec.shape.as_list() == [None]
    assert [len(b[0]) for b in padded] == [4, 2]
