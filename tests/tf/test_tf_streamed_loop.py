"""The per-example loop sums its clipped terms as they come (one gradient held, not b).

``streamed_clipped_sum`` is the reference method (``per_example_method="loop"``,
``jvp_method="loop"``) and the fallback every layer-tap step carries in a ``tf.cond``;
holding b gradients there cost memory even when the branch did not run (see
``benchmarks/max_batch.py`` and benchmarks/RESULTS.md, "The seed's memory tables"). These tests check it against the definition, per example, on rows inside and
far outside the clipping norm and on an empty batch, eagerly, in a graph and under XLA.
(A non-finite row poisons every row of a shared backward pass, 0 * inf; the step reruns
without it, :mod:`fdp_tf.nonfinite`, tested with the hostile inputs.)
"""

from __future__ import annotations

import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", minversion="2.16")
keras = pytest.importorskip("keras", minversion="3.0")

from fdp_tf.forward import record_forward  # noqa: E402
from fdp_tf.jl import loop_jl_clipped, sample_directions  # noqa: E402
from fdp_tf.per_example import exact_norm, streamed_clipped_sum  # noqa: E402
from tf_helpers import (conv_model, dense_data, dense_model, forward_fn, image_data,  # noqa: E402
                        loop_per_example_gradients)

CLIP, BATCH = 0.05, 7


def _setting(rows: int, spread: bool):
    if rows == 0:  # Keras's Flatten cannot infer a shape on zero rows: a dense model then
        x, y = dense_data(n=1)
        model = dense_model()
        model(x)
        return model, x[:0], y[:0]
    x, y = image_data(n=rows)
    if spread:
        x = x.copy()
        x[2] *= 1e3  # one row far beyond the clipping norm, one nearly zero
        x[4] *= 1e-4
    model = conv_model()
    model(x[:1])
    return model, x, y


def _reference(model, x, y, norm_of):
    grads = loop_per_example_gradients(model, x, y)
    summed = np.zeros_like(grads[0]) if grads else np.zeros(sum(int(np.prod(v.shape))
                                                                 for v in model.trainable_variables))
    norms, factors = [], []
    for g in grads:
        m = norm_of(g)
        c = CLIP / max(m, CLIP) if np.isfinite(m) else 0.0
        if c > 0:
            summed += c * g / BATCH
        norms.append(m)
        factors.append(c)
    return summed, np.array(norms), np.array(factors)


def _flat(tensors) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(t, np.float64)) for t in tensors])


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
@pytest.mark.parametrize("rows, spread", [(6, False), (6, True), (0, False)])
def test_exact_streamed_sum_is_the_clipped_sum(mode: str, rows: int, spread: bool) -> None:
    model, x, y = _setting(rows, spread)
    variables = model.trainable_variables

    def run():
        recorded = record_forward(forward_fn(model, x, y), persistent=True)
        return streamed_clipped_sum(recorded, variables, exact_norm, CLIP, BATCH)

    if mode != "eager":
        run = tf.function(run, jit_compile=mode == "xla")
    summed, norms, factors = run()
    want, want_norms, want_factors = _reference(model, x, y, lambda g: float(np.linalg.norm(g)))
    assert np.all(np.isfinite(_flat(summed)))
    np.testing.assert_allclose(_flat(summed), want, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(factors.numpy(), want_factors, rtol=1e-4)
    finite = np.isfinite(want_norms)
    np.testing.assert_allclose(norms.numpy()[finite], want_norms[finite], rtol=1e-4)
    assert norms.shape == (rows,) and factors.shape == (rows,)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_jl_loop_estimates_from_each_examples_own_projections(mode: str) -> None:
    model, x, y = _setting(6, True)
    variables = model.trainable_variables
    directions = sample_directions(variables, 3, tf.random.Generator.from_seed(5))
    flat_directions = np.concatenate([np.reshape(np.asarray(d, np.float64), (3, -1)) for d in directions], axis=1)

    def run():
        recorded = record_forward(forward_fn(model, x, y), persistent=True)
        return loop_jl_clipped(recorded, variables, directions, CLIP, BATCH)

    if mode == "graph":
        run = tf.function(run)
    summed, norms, factors = run()
    want, want_norms, want_factors = _reference(
        model, x, y, lambda g: float(np.sqrt(np.mean((flat_directions @ g) ** 2))))
    np.testing.assert_allclose(_flat(summed), want, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(factors.numpy(), want_factors, rtol=1e-4)
    assert factors.numpy()[2] < 1e-2 * factors.numpy()[4]  # the far row is clipped much harder


def test_a_float64_model_is_clipped_at_float64_precision() -> None:
    """The exact norm of a float64 model's gradient is taken in float64: in float32 it is
    off by ~1e-7 relative, so c_i g_i could exceed C by as much (and a norm beyond
    float32's range would become inf, dropping a row that clipping keeps)."""
    x, y = dense_data(n=5)
    x = x.astype("float64") * np.array([[1.0], [10.0], [1e-3], [1e2], [1.0]])
    model = keras.Sequential([keras.Input((5,), dtype="float64"), keras.layers.Dense(4, dtype="float64"),
                              keras.layers.Dense(3, dtype="float64")])
    recorded = record_forward(forward_fn(model, x, y), persistent=True)
    _, norms, factors = streamed_clipped_sum(recorded, model.trainable_variables, exact_norm, CLIP, BATCH)
    want = np.array([np.linalg.norm(g) for g in loop_per_example_gradients(model, x, y)])
    assert norms.dtype == tf.float64
    np.testing.assert_allclose(norms.numpy(), want, rtol=1e-13)
    excess = factors.numpy() * want / CLIP - 1
    assert np.all(excess <= 1e-14), excess  # float64 rounding only


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("clip", [0.05, 0.1, 1.0 / 3.0, 1e-7, 2.0**-20])
def test_the_clipping_norm_is_rounded_down_into_the_models_dtype(dtype: str, clip: float) -> None:
    from fdp_tf.clipping import clip_constant

    value = float(clip_constant(clip, tf.as_dtype(dtype)).numpy())
    assert value <= clip < float(np.nextafter(np.array(value, dtype), np.array(np.inf, dtype)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_the_noise_std_is_rounded_up_into_the_gradients_dtype(dtype: str) -> None:
    """The released noise's std is never below sigma C / B: the share is rounded up into the
    gradient's dtype (before, a Python float went through float32 and was cast to nearest:
    up to 2^-25 relative below it for about half of all values, in every dtype). Exact
    comparison in float64, over 2,000 values from 1e-30 to the dtype's largest (those
    below its smallest normal number are raised to it)."""
    from fdp_tf.randomness import _PRECISION, noise_scale

    kind = tf.as_dtype(dtype)
    eps, smallest = _PRECISION[kind]
    rng = np.random.default_rng(20261128)
    top = min(math.log10(kind.max) - 1, 6.0)
    wanted = 10.0 ** rng.uniform(-30, top, 2000) * rng.uniform(1.0, 2.0, 2000)
    got = np.array([float(tf.cast(noise_scale(float(w), kind), tf.float64).numpy()) for w in wanted])
    assert np.all(got >= wanted), wanted[got < wanted][:5]
    normal = wanted >= smallest
    assert np.all(got[normal] <= wanted[normal] * (1 + 4 * eps))  # a few units more, no more
    assert np.all(got[~normal] == smallest)


def test_a_gradient_dtype_without_a_rounding_rule_is_refused() -> None:
    from fdp_tf.randomness import noise_scale

    with pytest.raises(ValueError, match="dtype int32 cannot carry the noise; allowed: float16"):
        noise_scale(1.0, tf.int32)
