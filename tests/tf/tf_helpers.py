"""Small models, data sets and exact per-example references for the fdp_tf tests."""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

import fdp_tf

CE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def dense_model(inputs: int = 5, hidden: int = 4, classes: int = 3, dropout: float = 0.0) -> keras.Model:
    layers = [keras.Input((inputs,)), keras.layers.Dense(hidden, activation="tanh")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(classes))
    return keras.Sequential(layers)


def padded_tokens(n: int = 6, steps: int = 6, vocab: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Token rows (0 = padding) for masked recurrent models, and labels of 3 classes: padding
    at the start of the first half (the mask changes the recurrence) and at the end of one."""
    rng = np.random.default_rng(7)
    x = rng.integers(1, vocab, size=(n, steps)).astype("int32")
    x[: n // 2, :2] = 0
    x[-1, -1] = 0
    return x, rng.integers(0, 3, size=n).astype("int32")


def conv_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )


def bilstm_model(vocab: int = 20, steps: int = 5, unroll: bool = False) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((steps,), dtype="int32"),
            keras.layers.Embedding(vocab, 6),
            keras.layers.Bidirectional(keras.layers.LSTM(4, unroll=unroll)),
            keras.layers.Dense(2),
        ]
    )


def gru_model(vocab: int = 20, steps: int = 5, unroll: bool = False) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((steps,), dtype="int32"),
            keras.layers.Embedding(vocab, 6),
            keras.layers.GRU(6, unroll=unroll),
            keras.layers.Dropout(0.1),
            keras.layers.Dense(2),
        ]
    )


def dense_data(n: int = 256, inputs: int = 5, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(inputs, classes)), axis=1).astype("int32")
    return x, y


def image_data(n: int = 192, seed: int = 0):
    rng = np.random.default_rng(seed)
    templates = rng.normal(size=(3, 8, 8, 1))
    y = rng.integers(0, 3, size=n).astype("int32")
    x = (templates[y] + 0.5 * rng.normal(size=(n, 8, 8, 1))).astype("float32")
    return x, y


def sequence_data(n: int = 128, vocab: int = 20, steps: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, vocab, size=(n, steps)).astype("int32")
    y = (x[:, -1] < vocab // 2).astype("int32")  # the last token decides: easy for any RNN
    return x, y


def forward_fn(model: keras.Model, x, y, loss=CE, training: bool = True) -> Callable[[], fdp_tf.ForwardPass]:
    def run() -> fdp_tf.ForwardPass:
        out = model(x, training=training)
        return fdp_tf.ForwardPass(loss(y, out), None, out)

    return run


def on_indices(model: keras.Model, x, y, loss=CE, training: bool = True) -> Callable[[Any], fdp_tf.ForwardPass]:
    """``forward_on_indices`` of :func:`forward_fn`: the same pass on ``tf.gather(batch, rows)``."""
    return lambda rows: forward_fn(model, tf.gather(x, rows), tf.gather(y, rows), loss, training)()


def loop_per_example_gradients(model: keras.Model, x, y, loss=CE) -> list[np.ndarray]:
    """g_i, one GradientTape per example: flat float64 vectors."""
    grads = []
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            out = model(x[i : i + 1], training=False)
            value = tf.reduce_sum(loss(y[i : i + 1], out))
        g = tape.gradient(value, model.trainable_variables, unconnected_gradients="zero")
        grads.append(np.concatenate([np.ravel(tf.convert_to_tensor(t).numpy()) for t in g]).astype(np.float64))
    return grads


def flat(tensors) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(t, dtype=np.float64)) for t in tensors])


class OutlierMean(keras.layers.Layer):
    """Stores the batch mean in a non-trainable weight, only for a batch with an outlier
    (|x| > 10): data-dependent state that a check on the first step alone would miss."""

    def build(self, shape):
        self.mean = self.add_weight(shape=(shape[-1],), initializer="zeros", trainable=False)

    def call(self, x, training=None):
        if training:
            outlier = keras.ops.max(keras.ops.abs(x)) > 10.0
            self.mean.assign(keras.ops.where(outlier, keras.ops.mean(x, axis=0), self.mean))
        return x
