"""A first-choice method that crashes inside TensorFlow (fdp_tf.fallback), on every path.

pfor through a grouped Conv3D crashes with ``InvalidArgumentError`` on this CPU (a
backprop-filter op of the wrong shape) while the first step's probe runs it.
``fit`` engaged the loop; an eager custom loop and a user's ``tf.function`` raised
TensorFlow's error on every call (the fuzzer's seed 283 found the eager one), and a
crashed ``fit`` step kept the non-trainable weights its probe's passes had written.
Ground truth: with sigma = 0 the release is (1/B) sum_i min(1, C/||g_i||) g_i, with g_i
from a plain GradientTape on example i alone.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import warnings

import keras
import numpy as np
import tensorflow as tf

import fdp_tf
from tf_helpers import CE, flat, loop_per_example_gradients

L = keras.layers
C = 0.1


def _data(n: int = 8):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, 4, 4, 4, 2)).astype("float32"),
            rng.integers(0, 3, size=n).astype("int32"))


def _grouped_conv3d(*extra: L.Layer) -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((4, 4, 4, 2)), L.Conv3D(2, 2, groups=2), *extra, L.Flatten(), L.Dense(3)])


def _private(inner: keras.Model, batch: int, loss=CE, **kw) -> fdp_tf.PrivateModel:
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=C, noise_multiplier=0.0, learning_rate=1.0, seed=0,
                                    expected_batch_size=batch)
    model = fdp_tf.make_private(inner, optimizer=optimizer, loss=loss, **kw)
    model.open_segment(fdp_tf.PoissonSampling(num_examples=10 * batch, expected_batch_size=batch))
    return model


def _clipped_mean(inner: keras.Model, x, y) -> np.ndarray:
    grads = loop_per_example_gradients(inner, x, y)
    return sum(min(1.0, C / np.linalg.norm(g)) * g for g in grads) / len(x)


def test_an_eager_custom_loop_computes_a_crashed_step_again_with_the_loop() -> None:
    x, y = _data()
    inner = _grouped_conv3d()
    model = _private(inner, len(x))
    with pytest.warns(RuntimeWarning, match="'vectorized' crashed.*computed again with its fallback"):
        result = model.private_gradients(tf.constant(x), tf.constant(y))
    np.testing.assert_allclose(flat(result.gradients), _clipped_mean(inner, x, y), rtol=1e-4, atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # engaged for good: no second crash
        again = model.private_gradients(tf.constant(x), tf.constant(y))
    np.testing.assert_allclose(flat(again.gradients), flat(result.gradients), rtol=1e-6)


def test_a_users_tf_function_uses_the_loop_on_the_call_after_a_crash() -> None:
    x, y = _data()
    inner = _grouped_conv3d()
    model = _private(inner, len(x))
    step = tf.function(lambda: model.private_gradients(tf.constant(x), tf.constant(y)).gradients)
    try:
        first = step()
    except tf.errors.InvalidArgumentError as err:
        assert "pfor" in str(err)  # pfor's crash, nothing released
        checks = model.optimizer._dp_step_checks
        assert float(checks.probing.numpy()) == 1.0 and float(checks.verified.numpy().max()) == 0.0
        first = step()  # the same graph: the first choice counts as failed now
    np.testing.assert_allclose(flat(first), _clipped_mean(inner, x, y), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(flat(step()), flat(first), rtol=1e-6)


class EveryBatchMean(L.Layer):
    """Writes its batch's mean into a non-trainable weight on every training call."""

    def build(self, shape):
        self.mean = self.add_weight(shape=(shape[-1],), initializer="zeros", trainable=False)

    def call(self, h, training=None):
        if training:
            self.mean.assign(keras.ops.mean(h, axis=list(range(len(h.shape) - 1))))
        return h


def test_a_crashed_fit_step_leaves_no_non_trainable_weight_it_wrote() -> None:
    """The crashed step's probe had run the forward pass (writing the batch's mean) before
    pfor crashed, and the step's own restore never ran: the batch's mean stayed in the
    model, and the next step's guard restored to it when it refused."""
    x, y = _data(32)
    layer = EveryBatchMean()
    model = _private(_grouped_conv3d(layer), 8)
    with pytest.warns(RuntimeWarning, match="'vectorized' crashed"), \
            pytest.raises(ValueError, match="updated non-trainable weights"):
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8, seed=1), epochs=1, verbose=0)
    assert np.all(layer.mean.numpy() == 0.0)


def _one_entry(y_true, y_pred):  # shape [1]: refused at run time on Poisson batches
    return keras.ops.mean(CE(y_true, y_pred), keepdims=True)


@pytest.mark.parametrize("eager", [False, True])
def test_a_refused_first_step_leaves_nothing_written(eager: bool) -> None:
    """Found by review: the probe's first pass writes the batch mean, then the check that the
    loss has one entry per row refuses the step before the step's own restore runs; the
    mean stayed in the model, and the probe's mark of a check under way stayed set (the
    next fit silently used the per-example loop for good)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 5)).astype("float32"), rng.integers(0, 3, size=32).astype("int32")
    layer = EveryBatchMean()
    keras.utils.set_random_seed(3)
    model = _private(keras.Sequential([keras.Input((5,)), layer, L.Dense(3)]), 8, loss=_one_entry,
                     run_eagerly=eager)
    with pytest.raises(ValueError, match="one entry per input row"):
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8, seed=1), epochs=1, verbose=0)
    assert np.all(layer.mean.numpy() == 0.0)
    checks = model.optimizer._dp_step_checks
    assert float(checks.probing.numpy()) == 0.0 and float(checks.failed.numpy()) == 0.0


def _dense_step():
    """Data, a private dense model and a user's tf.function of its private step."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 5)).astype("float32"), rng.integers(0, 3, size=8).astype("int32")
    keras.utils.set_random_seed(3)
    model = _private(keras.Sequential([keras.Input((5,)), L.Dense(4, activation="tanh"), L.Dense(3)]), 8)
    return x, y, model, tf.function(lambda: model.private_gradients(tf.constant(x), tf.constant(y)).gradients)


def test_a_trace_verified_with_the_first_choice_is_probed_again_on_the_fallback() -> None:
    """The fallback engaged later (a crash of another trace) is checked on every trace that
    runs it: a trace verified with the first choice is probed again, not trusted."""
    x, y, model, step = _dense_step()
    step()
    checks = model.optimizer._dp_step_checks
    # the traces that ran (the first call traces twice: it created the checks' variables)
    slots = checks.live()
    assert [checks.verified.numpy()[s] for s in slots] == [1.0]  # with the first choice (the taps)
    checks.failed.assign(1.0)  # what engage_fallback does after another trace crashed
    np.testing.assert_allclose(flat(step()), _clipped_mean(model.base_model, x, y), rtol=1e-4, atol=1e-7)
    assert [checks.verified.numpy()[s] for s in slots] == [2.0]  # probed again, with the loop


def test_the_host_saves_the_weights_for_a_second_probe_too() -> None:
    """fit snapshots the non-trainable weights while a probe may run: also when a trace
    verified with the first choice will be probed again on the fallback (it read < 0.5)."""
    from fdp_tf.verify import StepChecks

    checks = StepChecks()
    checks.traces, checks.used = 1, {1}
    checks.started.assign(tf.tensor_scatter_nd_update(checks.started, [[1]], [1.0]))
    checks.verified.assign(tf.tensor_scatter_nd_update(checks.verified, [[1]], [1.0]))
    assert not checks.pending_on_host()
    checks.failed.assign(1.0)
    assert checks.pending_on_host()
    checks.verified.assign(tf.tensor_scatter_nd_update(checks.verified, [[1]], [2.0]))
    assert not checks.pending_on_host()


def test_a_trace_tensorflow_discarded_leaves_no_probe_pending() -> None:
    """The first call of a tf.function that creates variables traces twice, and TensorFlow
    runs only the second trace: the first one's slot was never verified, so the host counted
    a probe as pending for good (fit copied every non-trainable weight on every step) and
    took any later crash for the first-choice method's."""
    _, _, model, step = _dense_step()
    step()
    checks = model.optimizer._dp_step_checks
    assert len(checks.used) == 2  # traced twice, one trace ran
    assert not checks.pending_on_host()
    from fdp_tf.fallback import engage_fallback

    assert engage_fallback(model.optimizer, model.base_model) is None  # a later crash is not the method's
    assert float(checks.failed.numpy()) == 0.0


def test_a_crash_of_the_per_example_loop_is_the_datas_not_a_methods() -> None:
    """Found by review: a token id beyond the embedding's table crashes the loop (the
    reference method, with no fallback) on the first step; the crash was blamed on the
    loop and raised as 'choose per_example_method=loop'."""
    keras.utils.set_random_seed(3)
    inner = keras.Sequential([keras.Input((3,), dtype="int32"), L.Embedding(10, 4), L.Flatten(), L.Dense(3)])
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=C, noise_multiplier=0.0, learning_rate=1.0, seed=0,
                                    expected_batch_size=4, per_example_method="loop")
    model = fdp_tf.make_private(inner, optimizer=optimizer, loss=CE)
    model.open_segment(fdp_tf.PoissonSampling(num_examples=40, expected_batch_size=4))
    x = np.array([[1, 2, 3], [4, 5, 57], [1, 1, 1], [2, 2, 2]], "int32")  # 57 >= input_dim 10
    with pytest.raises(tf.errors.InvalidArgumentError, match="57"):
        model.private_gradients(tf.constant(x), tf.constant([0, 1, 2, 0], "int32"))
    assert float(optimizer._dp_step_checks.failed.numpy()) == 0.0
