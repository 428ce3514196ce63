"""Every run-time refusal holds under XLA (the fuzzer's jit_compile finding).

XLA drops ``tf.debugging.Assert``: with ``jit_compile=True`` a model whose layers mix
the rows of a batch trained silently, one example moving the update by 1.09 C (Conv1D +
UnitNormalization over the batch axis, fuzz seed 1006) and 0.83 C (a user's layer). The
class: a refusal that relies on an assertion op. Now a refused step releases zeros by
value and the refusal is raised on the host after the compiled step. The same refusals
without XLA are tested in test_tf_independence.py; here on ``fit``, ``train_on_batch``
and a custom loop in ``tf.function(jit_compile=True)``; each test failed before (trained).
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
from tf_helpers import CE, OutlierMean, dense_data, flat

L = keras.layers
MIXED = "mixes the rows of the batch"
STATE = "non-trainable weights"


def _model(kind: str) -> keras.Model:
    if kind == "mixing":
        return keras.Sequential([keras.Input((5,)), L.Dense(4, activation="tanh"), L.UnitNormalization(axis=0),
                                 L.Dense(3)])
    return keras.Sequential([keras.Input((5,)), OutlierMean(), L.Dense(4, activation="tanh"), L.Dense(3)])


def _data(kind: str):
    x, y = dense_data(n=8)
    if kind == "state":
        x[3] = 50.0
    return x, y


def _private(kind: str, jit: bool) -> fdp_tf.PrivateModel:
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=0.1, noise_multiplier=1.0, expected_batch_size=8,
                                    learning_rate=1.0)
    return fdp_tf.make_private(_model(kind), optimizer=optimizer, loss=CE, jit_compile=jit)


def _assert_nothing_released(model: fdp_tf.PrivateModel, before: np.ndarray) -> None:
    np.testing.assert_array_equal(flat(model.trainable_variables), before)
    for v in model.non_trainable_weights:
        if "seed_generator" not in v.path and "dp_ledger" not in v.path:
            np.testing.assert_array_equal(v.numpy(), 0.0)


@pytest.mark.parametrize("kind", ["mixing", "state"])
@pytest.mark.parametrize("path", ["fit", "train_on_batch"])
def test_a_refusal_holds_under_xla(kind: str, path: str) -> None:
    x, y = _data(kind)
    model = _private(kind, jit=True)
    before = flat(model.trainable_variables)
    with warnings.catch_warnings(), pytest.raises(ValueError, match=MIXED if kind == "mixing" else STATE):
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        if path == "fit":
            model.fit(tf.data.Dataset.from_tensors((x, y)), epochs=1, verbose=0,
                      sampling=fdp_tf.PoissonSampling(num_examples=80, expected_batch_size=8))
        else:
            model.train_on_batch(x, y)
    _assert_nothing_released(model, before)


@pytest.mark.parametrize("kind", ["mixing", "state"])
def test_a_custom_xla_loop_releases_zeros_and_the_ledger_raises(kind: str) -> None:
    """Inside tf.function(jit_compile=True) nothing can raise: the refused step's gradient
    is zeros, and the first read of the booked steps raises the refusal (once)."""
    x, y = _data(kind)
    model = _private(kind, jit=False)
    model.open_segment(fdp_tf.PoissonSampling(num_examples=80, expected_batch_size=8))
    before = flat(model.trainable_variables)

    @tf.function(jit_compile=True)
    def step(x, y):
        result = model.private_gradients(x, y)
        model.optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))
        return result.gradients

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        grads = step(tf.constant(x), tf.constant(y))
    assert all(np.all(np.asarray(g) == 0.0) for g in grads)
    _assert_nothing_released(model, before)
    with pytest.raises(ValueError, match=MIXED if kind == "mixing" else STATE):
        model.ledger
    assert model.ledger.steps == 1  # raised once; the refused step stays booked


def test_saving_after_a_refused_custom_xla_step_raises_the_refusal(tmp_path) -> None:
    """model.save writes the ledger, so it reads the refusal count: the refusal nobody
    has seen is raised there (the weights it saves are those before the zero update)."""
    x, y = _data("state")
    model = _private("state", jit=False)
    model.open_segment(fdp_tf.PoissonSampling(num_examples=80, expected_batch_size=8))

    @tf.function(jit_compile=True)
    def step(x, y):
        result = model.private_gradients(x, y)
        model.optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        step(tf.constant(x), tf.constant(y))
    file = tmp_path / "refused.keras"
    with pytest.raises(ValueError, match=STATE):
        model.save(file)
    assert model.ledger.steps == 1  # raised once


def _recurrent(jit: bool, kind: str) -> fdp_tf.PrivateModel:
    inputs = keras.Input((5,), dtype="int32")
    h = L.Bidirectional(L.LSTM(4))(L.Embedding(12, 4, mask_zero=True)(inputs))
    common = dict(l2_norm_clip=0.1, noise_multiplier=1.0, expected_batch_size=8)
    optimizer = fdp_tf.DPSGDJL(jl_projections=3, **common) if kind == "jl" else fdp_tf.DPSGDVanilla(**common)
    return fdp_tf.make_private(keras.Model(inputs, L.Dense(3)(h)), optimizer=optimizer, loss=CE, jit_compile=jit)


@pytest.mark.parametrize("kind,set_after_compile", [("jl", False), ("jl", True), ("exact", False)])
def test_a_private_step_through_a_recurrent_loop_under_xla_is_refused_before_anything_compiles(
        kind: str, set_after_compile: bool) -> None:
    """XLA crashed the whole process in some runs (fuzz seed 5, JL: a failed shape check
    or a segfault compiling the double vjp through a masked Bidirectional LSTM on a
    dynamic batch; seed 2792654124, exact clipping: the same check failing in a where
    op). Nothing is traced: the refusal comes from make_train_function, also when
    ``jit_compile`` is set after compile."""
    model = _recurrent(jit=not set_after_compile, kind=kind)
    if set_after_compile:
        model.jit_compile = True
    x = np.random.default_rng(0).integers(1, 12, size=(8, 5)).astype("int32")
    y = np.arange(8) % 3
    with pytest.raises(ValueError, match="jit_compile=False") as info:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert "lstm" in str(info.value)  # names the layer
    assert int(model.optimizer.dp_steps.numpy()) == 0


@pytest.mark.parametrize("method", ["layerwise", "auto"])
def test_a_token_id_outside_the_table_refuses_a_later_xla_step(method: str) -> None:
    """Found by review: XLA drops the taps' assertions on token ids, and its lookup reads a
    clamped row; an id of 13 in a table of 10 keyed example 1's norm piece into example
    2's rows, and on a step after a clean one (no probe) removing example 1 moved the update
    by 1.012 C. Now the id check is a refusal noted in the step's record, and the release
    is gated on every check noted (fdp_tf.verify): the step releases zeros and fit raises."""
    keras.utils.set_random_seed(3)
    inner = keras.Sequential([keras.Input((3,), dtype="int32"), L.Embedding(10, 4), L.Flatten(), L.Dense(3)])
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=0.1, noise_multiplier=1.0, expected_batch_size=4,
                                    learning_rate=1.0, per_example_method=method)
    model = fdp_tf.make_private(inner, optimizer=optimizer, loss=CE, jit_compile=True)
    sampling = fdp_tf.PoissonSampling(num_examples=40, expected_batch_size=4)
    x = np.array([[1, 2, 3], [4, 5, 6], [1, 1, 1], [2, 2, 2]], "int32")
    y = np.array([0, 1, 2, 0], "int32")

    def fit(x: np.ndarray) -> None:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), epochs=1, verbose=0, sampling=sampling)

    fit(x)  # a clean step: the trace's probe ran
    before = flat(model.trainable_variables)
    x[1, 2] = 13
    with pytest.raises(ValueError, match="token id is outside"):
        fit(x)
    np.testing.assert_array_equal(flat(model.trainable_variables), before)
