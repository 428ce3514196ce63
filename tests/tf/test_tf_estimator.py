"""The JL norm estimator, clipping and noise against per-example references.

Seed: Bu et al., arXiv:2102.03013v1, Algorithm 1 and Proposition "JL projections"
(M_i^2 r / ||g_i||^2 ~ chi2_r).
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import keras
import numpy as np
import tensorflow as tf
from scipy import stats

import fdp_tf
from tf_helpers import (
    CE,
    bilstm_model,
    conv_model,
    dense_data,
    dense_model,
    flat,
    forward_fn,
    gru_model,
    image_data,
    loop_per_example_gradients,
    sequence_data,
)


def _directions(model: keras.Model, r: int, seed: int = 7) -> list[tf.Tensor]:
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=(r, *v.shape)), dtype=v.dtype) for v in model.trainable_variables]


def _flat_direction(directions: list[tf.Tensor], j: int) -> np.ndarray:
    return flat([d[j] for d in directions])


@pytest.mark.parametrize("method", ["forward", "double_vjp"])
def test_projections_equal_inner_products_with_exact_gradients(method: str) -> None:
    model = dense_model()
    x, y = dense_data(n=6)
    r = 2
    directions = _directions(model, r)

    @tf.function  # nested forward accumulators (r = 2) need graph mode
    def run():
        recorded, norms = fdp_tf.jl_norm_estimates(
            forward_fn(model, x, y, training=False), model.trainable_variables, r,
            jvp_method=method, directions=directions,
        )
        return recorded.projections, norms

    projections, norms = run()
    exact = loop_per_example_gradients(model, x, y)
    expected = np.array([[g @ _flat_direction(directions, j) for j in range(r)] for g in exact])
    np.testing.assert_allclose(projections.numpy(), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(norms.numpy(), np.sqrt(np.mean(expected**2, axis=1)), rtol=1e-4)


def test_forward_and_double_vjp_agree_through_unrolled_gru() -> None:
    """Forward mode works through RNNs built with unroll=True; the double vjp agrees."""
    model = gru_model(unroll=True)
    x, y = sequence_data(n=4)
    directions = _directions(model, 2)

    @tf.function
    def projections(method: str) -> tf.Tensor:
        recorded, _ = fdp_tf.jl_norm_estimates(
            forward_fn(model, x, y, training=False), model.trainable_variables, 2,
            jvp_method=method, directions=directions,
        )
        return recorded.projections

    np.testing.assert_allclose(
        projections("forward").numpy(), projections("double_vjp").numpy(), rtol=1e-4, atol=1e-6
    )


def test_nested_forward_mode_refuses_eager_execution() -> None:
    model = dense_model()
    x, y = dense_data(n=3)
    with pytest.raises(ValueError, match="tf.function"):
        fdp_tf.jl_norm_estimates(
            forward_fn(model, x, y), model.trainable_variables, 2, jvp_method="forward", rng=tf.random.Generator.from_seed(1)
        )


def test_forward_mode_through_rnn_loop_fails_with_advice() -> None:
    model = gru_model(unroll=False)
    x, y = sequence_data(n=4)

    @tf.function
    def run():
        return fdp_tf.jl_norm_estimates(
            forward_fn(model, x, y), model.trainable_variables, 1, jvp_method="forward", rng=tf.random.Generator.from_seed(1)
        )[1]

    with pytest.raises(ValueError, match="unroll=True"):
        run()


def test_double_vjp_through_rnn_loop_matches_loop_gradients() -> None:
    model = gru_model(unroll=False)
    x, y = sequence_data(n=4)
    directions = _directions(model, 3)
    recorded, _ = fdp_tf.jl_norm_estimates(
        forward_fn(model, x, y, training=False), model.trainable_variables, 3,
        jvp_method="double_vjp", directions=directions,
    )
    exact = loop_per_example_gradients(model, x, y)
    expected = np.array([[g @ _flat_direction(directions, j) for j in range(3)] for g in exact])
    np.testing.assert_allclose(recorded.projections.numpy(), expected, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("method,r", [("forward", 1), ("double_vjp", 3)])
def test_squared_estimate_follows_chi_square_law(method: str, r: int) -> None:
    """M_i^2 r / ||g_i||^2 ~ chi2_r, so E[M_i^2] = ||g_i||^2 (Proposition "JL projections")."""
    model = dense_model()
    x, y = dense_data(n=4)
    exact_sq = np.array([g @ g for g in loop_per_example_gradients(model, x, y)])
    seed = tf.random.Generator.from_seed(11)

    @tf.function
    def draw():
        return fdp_tf.jl_norm_estimates(
            forward_fn(model, x, y, training=False), model.trainable_variables, r,
            jvp_method=method, rng=seed,
        )[1]

    draws = 600
    samples = np.stack([draw().numpy() for _ in range(draws)]) ** 2 * r / exact_sq  # [K, b]
    # Mean of chi2_r / r is 1 with variance 2/r; 5 standard errors per example.
    tolerance = 5 * np.sqrt(2 / (r * draws))
    np.testing.assert_allclose(samples.mean(axis=0) / r, 1.0, atol=tolerance)
    for i in range(samples.shape[1]):
        assert stats.kstest(samples[:, i], stats.chi2(df=r).cdf).pvalue > 1e-3


def test_clipped_gradient_with_given_norms_equals_example_by_example_sum() -> None:
    """grad (1/B) sum_i min(1, C/M_i) l_i = (1/B) sum_i min(1, C/M_i) g_i, for fixed M."""
    model = dense_model()
    x, y = dense_data(n=6)
    norms = np.array([0.05, 0.5, 1.0, 2.0, 7.0, 30.0], dtype=np.float32)
    clip, expected_batch = 0.8, 10.0
    recorded = fdp_tf.record_forward(forward_fn(model, x, y, training=False))
    grads = fdp_tf.clipped_gradient(
        recorded, model.trainable_variables, fdp_tf.clip_factors(norms, clip), expected_batch
    )
    exact = loop_per_example_gradients(model, x, y)
    expected = sum(min(1.0, clip / m) * g for m, g in zip(norms, exact)) / expected_batch
    np.testing.assert_allclose(flat(grads), expected, rtol=1e-4, atol=1e-7)


def test_clip_factors_handle_zero_norm() -> None:
    factors = fdp_tf.clip_factors(tf.constant([0.0, 0.5, 2.0, 4.0]), 2.0).numpy()
    np.testing.assert_allclose(factors, [1.0, 1.0, 1.0, 0.5])


def _linear_model() -> keras.Model:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(np.zeros((2, 1), dtype=np.float32))
    return model


def _identity_loss(y, y_pred):  # l_i = <w, x_i>, so g_i = x_i
    del y
    return tf.reduce_sum(y_pred, axis=1)


def test_three_four_five_clipping() -> None:
    """g = (3, 4), ||g|| = 5, C = 1 -> clipped (0.6, 0.8); g = (0.3, 0.4) is untouched."""
    model = _linear_model()
    x = np.array([[3.0, 4.0], [0.3, 0.4]], dtype=np.float32)
    y = np.zeros(2, dtype=np.float32)
    fn = forward_fn(model, x, y, loss=_identity_loss)
    exact = fdp_tf.vanilla_private_gradient(
        fn, model.trainable_variables, l2_norm_clip=1.0, noise_multiplier=0.0, expected_batch_size=1
    )
    np.testing.assert_allclose(exact.norms.numpy(), [5.0, 0.5], rtol=1e-6)
    np.testing.assert_allclose(exact.clip_factors.numpy(), [0.2, 1.0], rtol=1e-6)
    np.testing.assert_allclose(flat(exact.gradients), [0.6 + 0.3, 0.8 + 0.4], rtol=1e-6)
    recorded = fdp_tf.record_forward(fn)
    jl = fdp_tf.clipped_gradient(
        recorded, model.trainable_variables, fdp_tf.clip_factors([5.0, 0.5], 1.0), 1.0
    )
    np.testing.assert_allclose(flat(jl), [0.9, 1.2], rtol=1e-6)


def test_jl_with_many_projections_clips_like_exact_norms() -> None:
    """For a 3-4-5 gradient the JL estimate M concentrates at 5 as r grows."""
    model = _linear_model()
    x = np.array([[3.0, 4.0]], dtype=np.float32)
    fn = forward_fn(model, x, np.zeros(1, np.float32), loss=_identity_loss)
    result = fdp_tf.jl_private_gradient(
        fn, model.trainable_variables, l2_norm_clip=1.0, noise_multiplier=0.0,
        jl_projections=500, expected_batch_size=1, rng=tf.random.Generator.from_seed(3), jvp_method="double_vjp",
    )
    # M / ||g|| = sqrt(chi2_r / r) has standard deviation about 1 / sqrt(2 r) = 0.032.
    np.testing.assert_allclose(result.norms.numpy(), [5.0], rtol=0.15)
    np.testing.assert_allclose(flat(result.gradients), [0.6, 0.8], rtol=0.15)


@pytest.mark.parametrize("kind", ["jl", "vanilla"])
def test_noise_std_is_sigma_c_over_b(kind: str) -> None:
    """Zero-gradient model: g~ is pure noise with std sigma C / B per coordinate."""
    model = dense_model(inputs=100, hidden=50, classes=2)
    x, y = dense_data(n=5, inputs=100, classes=2)
    sigma, clip, batch = 2.0, 0.5, 10

    def zero_loss(y_true, y_pred):
        del y_true
        return 0.0 * tf.reduce_sum(y_pred, axis=1)

    fn = forward_fn(model, x, y, loss=zero_loss)
    if kind == "jl":
        result = fdp_tf.jl_private_gradient(
            fn, model.trainable_variables, l2_norm_clip=clip, noise_multiplier=sigma,
            jl_projections=1, expected_batch_size=batch, rng=tf.random.Generator.from_seed(5),
        )
    else:
        result = fdp_tf.vanilla_private_gradient(
            fn, model.trainable_variables, l2_norm_clip=clip, noise_multiplier=sigma,
            expected_batch_size=batch, rng=tf.random.Generator.from_seed(5),
        )
    noise = flat(result.gradients)
    n = noise.size  # 5152 coordinates
    target = sigma * clip / batch
    assert abs(noise.mean()) < 5 * target / np.sqrt(n)
    # std of the sample std is about target / sqrt(2 n): 5 standard errors.
    assert abs(noise.std() - target) < 5 * target / np.sqrt(2 * n)


@pytest.mark.parametrize("vectorized", [True, False])
def test_exact_per_example_norms_equal_loop(vectorized: bool) -> None:
    model = gru_model()
    x, y = sequence_data(n=4)
    recorded = fdp_tf.record_forward(forward_fn(model, x, y, training=False), persistent=True)
    norms = fdp_tf.per_example_norms(
        fdp_tf.per_example_gradients(recorded, model.trainable_variables, vectorized=vectorized)
    )
    expected = [np.linalg.norm(g) for g in loop_per_example_gradients(model, x, y)]
    np.testing.assert_allclose(norms.numpy(), expected, rtol=1e-4)


def test_vanilla_dense_norms_equal_loop() -> None:
    model = dense_model()
    x, y = dense_data(n=8)
    result = fdp_tf.vanilla_private_gradient(
        forward_fn(model, x, y, training=False), model.trainable_variables,
        l2_norm_clip=0.3, noise_multiplier=0.0, expected_batch_size=len(x),
    )
    exact = loop_per_example_gradients(model, x, y)
    np.testing.assert_allclose(result.norms.numpy(), [np.linalg.norm(g) for g in exact], rtol=1e-4)
    expected = sum(min(1.0, 0.3 / np.linalg.norm(g)) * g for g in exact) / len(exact)
    np.testing.assert_allclose(flat(result.gradients), expected, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("kind", ["jl_forward", "jl_double_vjp", "vanilla"])
def test_zero_noise_and_huge_clip_give_the_non_private_gradient(kind: str) -> None:
    model = dense_model()
    x, y = dense_data(n=8)
    fn = forward_fn(model, x, y, training=False)
    variables = model.trainable_variables
    if kind == "vanilla":
        result = fdp_tf.vanilla_private_gradient(
            fn, variables, l2_norm_clip=1e6, noise_multiplier=0.0, expected_batch_size=len(x)
        )
    else:
        result = fdp_tf.jl_private_gradient(
            fn, variables, l2_norm_clip=1e6, noise_multiplier=0.0,
            jl_projections=1 if kind == "jl_forward" else 3, expected_batch_size=len(x),
            jvp_method=kind.removeprefix("jl_"), rng=tf.random.Generator.from_seed(2),
        )
    with tf.GradientTape() as tape:
        mean = tf.reduce_mean(fn().per_example_losses)
    expected = tape.gradient(mean, variables)
    np.testing.assert_allclose(flat(result.gradients), flat(expected), rtol=1e-5, atol=1e-8)


def test_regularization_gradient_is_added_unclipped() -> None:
    model = dense_model()
    x, y = dense_data(n=4)
    variables = model.trainable_variables

    def fn() -> fdp_tf.ForwardPass:
        out = model(x, training=False)
        reg = 0.5 * tf.reduce_sum(tf.square(variables[0]))
        return fdp_tf.ForwardPass(tf.zeros_like(out[:, 0]) * tf.reduce_sum(out, 1), reg, out)

    result = fdp_tf.jl_private_gradient(
        fn, variables, l2_norm_clip=1e-3, noise_multiplier=0.0, jl_projections=1, expected_batch_size=len(x), rng=tf.random.Generator.from_seed(1)
    )
    np.testing.assert_allclose(result.gradients[0].numpy(), variables[0].numpy(), rtol=1e-6)


@pytest.mark.parametrize("method", ["forward", "double_vjp"])
def test_projections_and_gradient_share_one_dropout_mask(method: str) -> None:
    """P_ij = <g_i, v_j> for the per-example gradients of the *same* recorded pass.

    With dropout 0.5 two passes almost surely use different masks, so this
    fails if the projections came from another forward pass than the tape.
    """
    model = dense_model(inputs=5, hidden=16, dropout=0.5)
    _assert_projections_from_the_recorded_pass(model, *dense_data(n=6), method, vectorized=True)


def _assert_projections_from_the_recorded_pass(model, x, y, method: str, vectorized: bool) -> None:
    """P_i1 equals <g_i, v_1> with g_i the per-example gradients of the same recorded pass."""
    directions = _directions(model, 1)
    variables = model.trainable_variables
    n = len(x)

    @tf.function
    def run():
        recorded, _ = fdp_tf.jl_norm_estimates(
            forward_fn(model, x, y, training=True), variables, 1,
            jvp_method=method, directions=directions,
        )
        per_example = fdp_tf.per_example_gradients(recorded, variables, vectorized=vectorized)
        inner = tf.add_n(
            [tf.reduce_sum(tf.reshape(g * d[0], (n, -1)), axis=1) for g, d in zip(per_example, directions)]
        )
        return recorded.projections[:, 0], inner

    projections, inner = run()
    np.testing.assert_allclose(projections.numpy(), inner.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("name", ["conv", "embedding_bilstm"])
def test_exact_per_example_norms_equal_loop_on_conv_and_embedding(name: str, vectorized: bool) -> None:
    """Conv2D kernels and Embedding rows (sparse gradients) give the loop's ||g_i||."""
    if name == "conv":
        model, (x, y) = conv_model(), image_data(n=4)
    else:
        model, (x, y) = bilstm_model(), sequence_data(n=4)
    recorded = fdp_tf.record_forward(forward_fn(model, x, y, training=False), persistent=True)
    per_example = fdp_tf.per_example_gradients(recorded, model.trainable_variables, vectorized=vectorized)
    exact = loop_per_example_gradients(model, x, y)
    np.testing.assert_allclose(
        fdp_tf.per_example_norms(per_example).numpy(), [np.linalg.norm(g) for g in exact], rtol=1e-4
    )
    for i, g in enumerate(exact):  # the vectors themselves, not only their norms
        np.testing.assert_allclose(flat([t[i] for t in per_example]), g, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "name,method", [("conv", "forward"), ("conv", "double_vjp"), ("embedding_bilstm", "double_vjp")]
)
def test_projections_equal_inner_products_on_conv_and_embedding(name: str, method: str) -> None:
    if name == "conv":
        model, (x, y) = conv_model(), image_data(n=4)
    else:
        model, (x, y) = bilstm_model(), sequence_data(n=4)
    directions = _directions(model, 1)
    recorded, _ = fdp_tf.jl_norm_estimates(
        forward_fn(model, x, y, training=False), model.trainable_variables, 1,
        jvp_method=method, directions=directions,
    )
    exact = loop_per_example_gradients(model, x, y)
    expected = [g @ _flat_direction(directions, 0) for g in exact]
    np.testing.assert_allclose(recorded.projections.numpy()[:, 0], expected, rtol=1e-4, atol=1e-5)


def test_gru_internal_dropout_projections_match_the_same_pass() -> None:
    """GRU(dropout, recurrent_dropout) inside a tf.while_loop: P_ij = <g_i, v_j> of one pass."""
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(20, 6),
            keras.layers.GRU(6, dropout=0.3, recurrent_dropout=0.3),
            keras.layers.Dense(2),
        ]
    )
    _assert_projections_from_the_recorded_pass(model, *sequence_data(n=4), "double_vjp", vectorized=False)


class _MaskedMLP:
    """5 -> Dense(16, tanh) -> inverted dropout 0.5 -> Dense(3), keeping every mask drawn.

    The masks let the test replay a forward pass example by example, so the
    private gradient can be compared with per-example gradients of *that* pass.
    """

    def __init__(self) -> None:
        self.hidden = keras.layers.Dense(16, activation="tanh")
        self.head = keras.layers.Dense(3)
        self.hidden.build((None, 5))
        self.head.build((None, 16))
        self.variables = [*self.hidden.trainable_variables, *self.head.trainable_variables]
        self.masks: list[tf.Tensor] = []

    def logits(self, x, mask) -> tf.Tensor:
        return self.head(self.hidden(x) * mask)

    def forward_fn(self, x, y):
        def run() -> fdp_tf.ForwardPass:
            mask = tf.cast(tf.random.uniform((len(x), 16)) < 0.5, tf.float32) * 2.0
            self.masks.append(mask)
            out = self.logits(x, mask)
            return fdp_tf.ForwardPass(CE(y, out), None, out)

        return run

    def replay_gradients(self, x, y, mask) -> list[np.ndarray]:
        grads = []
        for i in range(len(x)):
            with tf.GradientTape() as tape:
                value = tf.reduce_sum(CE(y[i : i + 1], self.logits(x[i : i + 1], mask[i : i + 1])))
            grads.append(flat(tape.gradient(value, self.variables)))
        return grads


@pytest.mark.parametrize("kind", ["jl_forward", "jl_double_vjp", "vanilla_vectorized", "vanilla_loop"])
def test_one_forward_pass_gives_norms_and_clipped_gradient_under_dropout(kind: str) -> None:
    """forward_fn runs once, and g~ = (1/B) sum_i c_i g_i for the g_i of that pass (sigma = 0).

    A second forward pass would draw another dropout mask, and the clipped
    gradient (or, for exact clipping, the norms) would not match the replay.
    """
    net = _MaskedMLP()
    x, y = dense_data(n=6)
    clip, batch = 0.3, 8
    fn = net.forward_fn(x, y)
    if kind.startswith("jl"):
        result = fdp_tf.jl_private_gradient(
            fn, net.variables, l2_norm_clip=clip, noise_multiplier=0.0,
            jl_projections=1 if kind == "jl_forward" else 3, expected_batch_size=batch, rng=tf.random.Generator.from_seed(4),
            jvp_method=kind.removeprefix("jl_"),
        )
    else:
        result = fdp_tf.vanilla_private_gradient(
            fn, net.variables, l2_norm_clip=clip, noise_multiplier=0.0, expected_batch_size=batch,
            per_example_method="vectorized" if kind == "vanilla_vectorized" else "loop",
        )
    assert len(net.masks) == 1
    exact = net.replay_gradients(x, y, net.masks[0])
    factors = result.clip_factors.numpy()
    assert factors.min() < 1.0  # some examples are clipped: the test is not vacuous
    expected = sum(c * g for c, g in zip(factors, exact)) / batch
    np.testing.assert_allclose(flat(result.gradients), expected, rtol=1e-4, atol=1e-7)
    if kind.startswith("vanilla"):
        np.testing.assert_allclose(result.norms.numpy(), [np.linalg.norm(g) for g in exact], rtol=1e-4)
        np.testing.assert_allclose(factors, [min(1.0, clip / np.linalg.norm(g)) for g in exact], rtol=1e-4)


def test_vectorized_per_example_gradients_fall_back_to_the_loop(monkeypatch) -> None:
    """If pfor cannot vectorise the model, exact clipping warns and loops instead."""
    model = dense_model()
    x, y = dense_data(n=5)
    original = tf.GradientTape.jacobian

    def jacobian_without_pfor(self, target, sources, *args, experimental_use_pfor=True, **kwargs):
        if experimental_use_pfor:
            raise ValueError("pfor cannot vectorize this op (simulated)")
        return original(self, target, sources, *args, experimental_use_pfor=False, **kwargs)

    monkeypatch.setattr(tf.GradientTape, "jacobian", jacobian_without_pfor)
    with pytest.warns(RuntimeWarning, match="falling back to one backward pass per example"):
        result = fdp_tf.vanilla_private_gradient(
            forward_fn(model, x, y, training=False), model.trainable_variables,
            l2_norm_clip=1.0, noise_multiplier=0.0, expected_batch_size=len(x),
        )
    expected = [np.linalg.norm(g) for g in loop_per_example_gradients(model, x, y)]
    np.testing.assert_allclose(result.norms.numpy(), expected, rtol=1e-4)


def test_a_seeded_generator_gives_independent_draws_within_a_step() -> None:
    """A seeded generator (ints are refused) must not repeat one draw: equal noise on
    equally shaped variables, or noise equal to a JL direction, would let an observer
    cancel it."""
    shapes = [tf.zeros((3, 4)), tf.zeros((3, 4))]
    noise = [n.numpy() for n in fdp_tf.add_gaussian_noise(shapes, 1.0, rng=tf.random.Generator.from_seed(7))]
    directions = [d.numpy()[0] for d in fdp_tf.sample_directions(shapes, 1, rng=tf.random.Generator.from_seed(7))]
    assert not np.allclose(noise[0], noise[1])
    assert not np.allclose(noise[0], directions[0]) and not np.allclose(directions[0], directions[1])
    again = fdp_tf.add_gaussian_noise(shapes, 1.0, rng=tf.random.Generator.from_seed(7))
    np.testing.assert_array_equal(again[0].numpy(), noise[0])  # reproducible per call
