"""Forward mode through Keras LSTM loops (fdp_tf.recurrent_tangents): the tangent pass's
P_i = <grad l_i, v> against exact per-example gradients, one backward pass each."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fdp_tf.forward import ForwardPass
from fdp_tf.recurrent_tangents import lstm_tangent_support, tangent_projections


def _model() -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((7,), dtype="int32")
    h = keras.layers.Embedding(20, 5)(inputs)
    h = keras.layers.Bidirectional(keras.layers.LSTM(4, return_sequences=True))(h)
    h = keras.layers.LSTM(3, go_backwards=True, use_bias=False)(h)
    return keras.Model(inputs, keras.layers.Dense(2)(h))


def test_tangent_pass_matches_exact_per_example_projections() -> None:
    model = _model()
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, size=(5, 7)).astype("int32")
    y = rng.integers(0, 2, size=5)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    variables = model.trainable_variables
    direction = [tf.constant(rng.standard_normal(tuple(v.shape)), tf.float32) for v in variables]

    def forward() -> ForwardPass:
        return ForwardPass(loss_fn(y, model(x, training=True)))

    got = tf.function(lambda: tangent_projections(forward, variables, model, direction))().numpy()
    expected = []
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[i:i + 1], model(x[i:i + 1], training=True))[0]
        grads = tape.gradient(loss, variables)
        expected.append(sum(float(tf.reduce_sum(tf.convert_to_tensor(g) * d)) for g, d in zip(grads, direction)))
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)
    assert np.min(np.abs(expected)) > 1e-3  # projections that say something


def test_unsupported_lstms_are_named() -> None:
    assert lstm_tangent_support(keras.layers.LSTM(3, activation="relu")) is not None
    assert lstm_tangent_support(keras.layers.LSTM(3, return_state=True)) is not None
    assert lstm_tangent_support(keras.layers.GRU(3)) is not None
    assert lstm_tangent_support(keras.layers.LSTM(3)) is None


def test_a_mask_is_refused_not_ignored() -> None:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(9, 3, mask_zero=True),
                              keras.layers.LSTM(2), keras.layers.Dense(1)])
    x = np.array([[1, 2, 0, 0], [3, 4, 5, 0]], dtype="int32")
    variables = model.trainable_variables
    direction = [tf.ones(tuple(v.shape)) for v in variables]

    def forward() -> ForwardPass:
        return ForwardPass(tf.reduce_sum(model(x, training=True), axis=1))

    with pytest.raises(ValueError, match="mask is not supported yet"):
        tangent_projections(forward, variables, model, direction)
