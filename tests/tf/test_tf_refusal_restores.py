"""A refused step leaves every non-trainable weight as it was, on every path and every step.

The invariant: a check that refuses a step in the graph first restores what the step's
passes wrote (fdp_tf.refusals.guarding). Before, a check inside a pass (one loss per
input row on a batch of dynamic size, a non-finite gradient, the recurrent tangents'
agreement) raised its assertion before the step's guard restored anything. ``fit``
restored from a host copy on a first step only; on a later step, in a user's
``tf.function`` and under ``train_on_batch``, the batch's mean a layer had written stayed in
the model, which anyone may publish. A rare batch triggers both the write and the refusal
here: a layer that writes its batch mean when the batch holds an outlier, and a loss that
returns one entry per batch on such a batch (a hostile "robust" loss).
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import keras
import numpy as np
import tensorflow as tf

import fdp_tf
from fdp_tf.guards import StateGuard
from fdp_tf.refusals import guarding, refuse_unless
from tf_helpers import CE, OutlierMean

L = keras.layers
ROWS = 8
MARK = 3  # the label of the outlier row (the loss reads it modulo 3)


class OutlierBatchMean(L.Layer):
    """Writes its batch's mean into a non-trainable weight when the batch holds |x| > 5."""

    def build(self, shape):
        self.mean = self.add_weight(shape=(shape[-1],), initializer="zeros", trainable=False)

    def call(self, h, training=None):
        if training:
            outlier = keras.ops.any(keras.ops.abs(h) > 5.0)
            self.mean.assign(keras.ops.where(outlier, keras.ops.mean(h, axis=0), self.mean))
        return h


def rare_one_entry(y_true, y_pred):
    """One loss per row, except on a batch holding the marked label: one entry in all."""
    y = tf.cast(tf.reshape(y_true, [-1]), tf.int32)
    per_row = CE(y % 3, y_pred)
    return tf.cond(tf.reduce_any(y >= MARK), lambda: tf.reduce_mean(per_row, keepdims=True), lambda: per_row)


def _model(*extra: L.Layer):
    keras.utils.set_random_seed(5)
    layer = OutlierBatchMean()
    inner = keras.Sequential([keras.Input((5,)), layer, *extra, L.Dense(3)])
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=0.1, noise_multiplier=1.0, learning_rate=0.1,
                                    expected_batch_size=ROWS)
    model = fdp_tf.make_private(inner, optimizer=optimizer, loss=rare_one_entry)
    return model, layer


def _batches():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3 * ROWS, 5)).astype("float32")
    y = rng.integers(0, 3, size=3 * ROWS).astype("int32")
    x[2 * ROWS + 1, 0], y[2 * ROWS + 1] = 8.0, MARK  # in the third batch only
    return x, y


def _refused(run, layer) -> None:
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="one entry per input row"):
        run()
    assert np.all(layer.mean.numpy() == 0.0), "the refused step's batch mean stayed in the model"


def test_fit_refusing_a_later_step_restores_what_it_wrote() -> None:
    x, y = _batches()
    model, layer = _model()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(ROWS)  # rows of dynamic size
    sampling = fdp_tf.PoissonSampling(num_examples=100 * ROWS, expected_batch_size=ROWS)
    _refused(lambda: model.fit(data, epochs=1, verbose=0, sampling=sampling), layer)


@pytest.mark.parametrize("first", [True, False])
def test_a_users_tf_function_refusing_a_step_restores_what_it_wrote(first: bool) -> None:
    x, y = _batches()
    model, layer = _model()
    model.open_segment(fdp_tf.PoissonSampling(num_examples=100 * ROWS, expected_batch_size=ROWS))
    spec = [tf.TensorSpec([None, 5], tf.float32), tf.TensorSpec([None], tf.int32)]
    step = tf.function(lambda x, y: model.private_gradients(x, y).gradients, input_signature=spec)
    if not first:
        step(x[:ROWS], y[:ROWS])  # verified: the later step runs no probe
    _refused(lambda: step(x[2 * ROWS:], y[2 * ROWS:]), layer)


def test_train_on_batch_refusing_a_later_step_restores_what_it_wrote() -> None:
    x, y = _batches()
    model, layer = _model()
    model.open_segment(fdp_tf.PoissonSampling(num_examples=100 * ROWS, expected_batch_size=ROWS))
    model.train_on_batch(x[:ROWS], y[:ROWS])
    _refused(lambda: model.train_on_batch(x[2 * ROWS:2 * ROWS + 5], y[2 * ROWS:2 * ROWS + 5]), layer)


class RowMixer(L.Layer):
    """Adds half the batch mean: examples interact (the probe refuses it)."""

    def call(self, h):
        return h + 0.5 * keras.ops.mean(h, axis=0, keepdims=True)


def test_a_step_refused_inside_its_probe_does_not_vouch_for_the_trace() -> None:
    """The probe's first pass is refused: its later passes, which compare rows, never ran,
    so the trace is still unverified and the next batch (a loss of the right shape, a
    row-mixing model) is probed and refused."""
    x, y = _batches()
    model, layer = _model(RowMixer())
    model.open_segment(fdp_tf.PoissonSampling(num_examples=100 * ROWS, expected_batch_size=ROWS))
    spec = [tf.TensorSpec([None, 5], tf.float32), tf.TensorSpec([None], tf.int32)]
    step = tf.function(lambda x, y: model.private_gradients(x, y).gradients, input_signature=spec)
    _refused(lambda: step(x[2 * ROWS:], y[2 * ROWS:]), layer)
    with pytest.raises(tf.errors.InvalidArgumentError, match="mixes the rows"):
        step(x[:ROWS], y[:ROWS])


def _reaches(op: tf.Operation, target: tf.Operation) -> bool:
    seen, todo = set(), [op]
    while todo:
        now = todo.pop()
        if now is target:
            return True
        if now.name not in seen:
            seen.add(now.name)
            todo.extend([t.op for t in now.inputs] + list(now.control_inputs))
    return False


def test_a_failed_check_restores_first_and_a_later_write_waits_for_its_assertion() -> None:
    """By construction (fdp_tf.refusals.guarding): the restore runs before the assertion,
    and a write later in the step depends on the assertion, so it cannot land between the
    restore and the abort (without the fence it could: TensorFlow orders an assertion only
    with other stateful ops that hold no variable)."""
    weight = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def step(value):
        with guarding(StateGuard(None, [weight])):
            weight.assign(value)  # a pass writes what it saw
            refuse_unless(value < 0.0, "a check")
            weight.assign(2.0 * value)  # a later pass writes again
        return value

    with pytest.raises(tf.errors.InvalidArgumentError, match="a check"):
        step(tf.constant(1.0))
    assert weight.numpy() == 0.0
    graph = step.get_concrete_function().graph
    (assertion,) = [op for op in graph.get_operations() if op.type == "Assert"]
    later = [op for op in graph.get_operations() if op.type == "AssignVariableOp"][-1]
    assert _reaches(later, assertion)


def test_a_refusal_on_one_replica_refuses_every_replicas_release() -> None:
    """Found by review: with several replicas there is no assertion, and each replica gated
    its release on its own checks only. The refusing replica released zeros, the other its
    clipped sum with its share of the noise alone (std sigma C / B / sqrt(2)), and Keras
    applied the sum: a step at 0.71 x its booked noise."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "replica_refusal.py"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "updated non-trainable weights" in result["raised"]
    assert result["moved"] == 0.0, "a replica's noised sum was applied after another replica refused"
    assert result["seen"] == [0.0, 0.0]


class _ToIds(keras.layers.Layer):
    """Casts its input to token ids (an id beyond the table makes the lookup fail on CPU)."""

    def call(self, x):
        return keras.ops.cast(x, "int32")


def _writer_then_lookup() -> fdp_tf.PrivateModel:
    keras.utils.set_random_seed(0)
    inner = keras.Sequential([keras.Input((3,)), OutlierMean(), _ToIds(), keras.layers.Embedding(10, 2),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    # the loop: no layer tap, whose token-id refusal could raise before the lookup fails
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=0.1, noise_multiplier=1.0, expected_batch_size=4,
                                    learning_rate=0.1, per_example_method="loop")
    return fdp_tf.make_private(inner, optimizer=optimizer, loss=CE)


@pytest.mark.parametrize("path", ["fit", "train_on_batch"])
def test_a_later_step_that_aborts_outside_its_checks_leaves_nothing_written(path: str) -> None:
    """Found by review: an error that is not a refusal (here the embedding lookup of an id
    beyond its table, after a user's layer stored the batch mean) stopped a later step
    before its restore, and only a first step was copied on the host: the mean stayed in the
    model. Now the weights a step may write are copied before every step and put back."""
    model = _writer_then_lookup()
    sampling = fdp_tf.PoissonSampling(num_examples=40, expected_batch_size=4)
    clean = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 1, 2]], "float32")
    y = np.array([0, 1, 2, 0], "int32")

    def step(x: np.ndarray) -> None:
        if path == "fit":
            model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), epochs=1, verbose=0, sampling=sampling)
        else:
            model.open_segment(sampling)
            model.train_on_batch(x, y)

    step(clean)
    step(clean)  # a later step: the probe is done, nothing pending
    (mean,) = [v for v in model.non_trainable_weights if "outlier_mean" in v.path]
    assert np.all(mean.numpy() == 0.0)
    outlier = clean.copy()
    outlier[1, 0] = 57.0  # > 10: the layer stores the mean; an id >= 10: the lookup fails
    with pytest.raises(tf.errors.InvalidArgumentError):
        step(outlier)
    np.testing.assert_array_equal(mean.numpy(), 0.0)


def test_the_weights_a_step_may_write_are_a_users_layers_not_kerass_frozen_ones() -> None:
    """The host copies these before every later step: a user's running statistic, a
    model's own weight; never a frozen Keras layer's (a backbone would be copied per step)."""
    from fdp_tf.introspection import writable_weights

    L_ = keras.layers
    seq = keras.Sequential([keras.Input((5,)), OutlierMean(), L_.Dense(4), L_.Dense(3)])
    seq.layers[1].trainable = False
    assert [w.path for w in writable_weights(seq)] == [seq.layers[0].weights[0].path]
    tokens = keras.Input((5,), dtype="int32")
    recurrent = keras.Model(tokens, L_.Dense(3)(L_.Bidirectional(L_.LSTM(4))(L_.Embedding(12, 4)(tokens))))
    recurrent.trainable = False
    assert len(recurrent.non_trainable_weights) == 9 and writable_weights(recurrent) == []
    wrapped = keras.Sequential([keras.Input((2, 5)), L_.TimeDistributed(OutlierMean())])
    assert len(writable_weights(wrapped)) == 1  # a wrapper's inner layer is judged by its own type

    class Own(keras.Model):
        def __init__(self):
            super().__init__()
            self.head = L_.Dense(3)
            self.offset = self.add_weight(shape=(3,), trainable=False)

        def call(self, x):
            return self.head(x) + self.offset

    own = Own()
    own(np.zeros((1, 5), "float32"))
    own.head.trainable = False
    assert [id(w) for w in writable_weights(own)] == [id(own.offset)]
