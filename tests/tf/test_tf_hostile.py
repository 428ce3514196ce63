"""fdp_tf tried as a hostile user would (issue: private on every path).

Each test failed on 9d22f2a: predictable noise under a global seed, too-small norms
for a weight read outside its layer, silent BatchNormalization / stateful RNN /
data-updated non-trainable weights, NaN updates from one non-finite example, epsilon
lowered by a reload or a recompile, the pfor path on an empty batch, forward mode
through a keras.ops loop.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import functools
import math
import warnings

import keras
import numpy as np
import tensorflow as tf

import fdp
import fdp_tf
from tf_helpers import CE, dense_data, dense_model, flat, forward_fn, loop_per_example_gradients, on_indices

DELTA = 1e-5


def _fit_once(sigma: float = 1.0) -> np.ndarray:
    keras.utils.set_random_seed(0)  # what the examples did with a public default
    x, y = dense_data(n=32)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=sigma,
                                                     learning_rate=0.1), loss=CE)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8), epochs=1, verbose=0)
    return flat(model.trainable_variables)


def test_global_seed_does_not_fix_the_noise_or_the_batches() -> None:
    """Two runs under keras.utils.set_random_seed(0) were bit-identical; now they differ."""
    assert not np.allclose(_fit_once(), _fit_once())
    x, y = dense_data(n=64)
    keras.utils.set_random_seed(0)
    first = [b[1].numpy().tolist() for b in fdp_tf.poisson_batches(x, y, expected_batch_size=8)]
    keras.utils.set_random_seed(0)
    second = [b[1].numpy().tolist() for b in fdp_tf.poisson_batches(x, y, expected_batch_size=8)]
    assert first != second


def test_explicit_seeds_warn_and_public_functions_refuse_ints() -> None:
    with pytest.warns(fdp_tf.NotPrivateWarning, match="NOT differentially private"):
        fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0, seed=3)
    x, y = dense_data(n=8)
    with pytest.warns(fdp_tf.NotPrivateWarning):
        fdp_tf.poisson_batches(x, y, expected_batch_size=2, seed=3)
    shapes = [tf.zeros((3, 4))]
    with pytest.raises(ValueError, match="tf.random.Generator"):
        fdp_tf.add_gaussian_noise(shapes, 1.0, rng=7)
    # None draws from OS entropy: two calls differ; a Generator advances between calls
    assert not np.allclose(fdp_tf.add_gaussian_noise(shapes, 1.0)[0], fdp_tf.add_gaussian_noise(shapes, 1.0)[0])
    generator = tf.random.Generator.from_seed(7)
    a, b = (fdp_tf.add_gaussian_noise([tf.zeros((3, 4))] * 2, 1.0, rng=generator) for _ in range(2))
    assert not np.allclose(a[0], b[0]) and not np.allclose(a[0], a[1])


def _tied_embedding_model(vocab: int = 12, dim: int = 4) -> keras.Model:
    """Functional model whose output projection reads the embedding table through keras.ops.

    (Written with einsum on the variable itself: ``ops.transpose(embeddings)`` would be
    evaluated once when the model is built, a constant that no gradient reaches.)"""
    tokens = keras.Input((3,), dtype="int32")
    embedding = keras.layers.Embedding(vocab, dim)
    hidden = keras.layers.Dense(dim, activation="tanh")(keras.layers.GlobalAveragePooling1D()(embedding(tokens)))
    logits = keras.ops.einsum("bd,vd->bv", hidden, embedding.embeddings)
    return keras.Model(tokens, logits)


class _DoubledDense(keras.layers.Dense):
    @property
    def kernel(self):  # the variable is transformed before use
        return 2.0 * self._kernel


@pytest.mark.parametrize("name", ["tied_embedding", "property_override"])
def test_layerwise_never_releases_more_than_c_per_example(name: str) -> None:
    """Norms were 4.4x (tied weights via ops) and 2x (property) too small; now every
    example's contribution is exactly clipped (compared with a per-example loop)."""
    if name == "tied_embedding":
        model = _tied_embedding_model()
        x = np.random.default_rng(0).integers(0, 12, size=(6, 3)).astype("int32")
        y = np.random.default_rng(1).integers(0, 12, size=6).astype("int32")
    else:
        model = keras.Sequential([keras.Input((5,)), _DoubledDense(4, activation="tanh"), keras.layers.Dense(3)])
        x, y = dense_data(n=6)
    clip = 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a static refusal may warn and fall back
        result = fdp_tf.vanilla_private_gradient(
            forward_fn(model, x, y, training=False), model.trainable_variables, l2_norm_clip=clip,
            noise_multiplier=0.0, expected_batch_size=len(x), per_example_method="layerwise", model=model,
        )
    exact = loop_per_example_gradients(model, x, y)
    norms = np.array([np.linalg.norm(g) for g in exact])
    np.testing.assert_allclose(result.norms.numpy(), norms, rtol=1e-4)
    expected = sum(min(1.0, clip / n) * g for g, n in zip(exact, norms)) / len(x)
    np.testing.assert_allclose(flat(result.gradients), expected, rtol=1e-4, atol=1e-7)


def test_coverage_check_catches_a_weight_read_outside_its_layer_in_graph_mode() -> None:
    """Inside tf.function the per-step coverage check picks the exact loop on a miss."""
    model = _tied_embedding_model()
    x = np.random.default_rng(0).integers(0, 12, size=(5, 3)).astype("int32")
    y = np.random.default_rng(1).integers(0, 12, size=5).astype("int32")

    @tf.function
    def step():
        return fdp_tf.vanilla_private_gradient(
            forward_fn(model, x, y, training=False), model.trainable_variables, l2_norm_clip=1e-3,
            noise_multiplier=0.0, expected_batch_size=5, per_example_method="layerwise", model=model,
        ).norms

    norms = [np.linalg.norm(g) for g in loop_per_example_gradients(model, x, y)]
    np.testing.assert_allclose(step().numpy(), norms, rtol=1e-4)


class _RunningMean(keras.layers.Layer):
    """Updates a non-trainable running mean from the batch in training mode."""

    def build(self, shape):
        self.mean = self.add_weight(shape=(shape[-1],), initializer="zeros", trainable=False)

    def call(self, x, training=None):
        if training:
            self.mean.assign(0.9 * self.mean + 0.1 * tf.reduce_mean(x, axis=0))
        return x


@pytest.mark.parametrize("layer", ["batch_norm", "stateful_rnn"])
def test_layers_that_mix_or_carry_examples_are_refused_at_compile(layer: str) -> None:
    if layer == "batch_norm":
        inner = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                                  keras.layers.Dense(3)])
        match = "LayerNormalization"
    else:
        inner = keras.Sequential([keras.Input((4, 2), batch_size=2), keras.layers.LSTM(3, stateful=True),
                                  keras.layers.Dense(2)])
        match = "stateful=False"
    with pytest.raises(ValueError, match=match):
        fdp_tf.make_private(inner, optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE)


def test_a_non_trainable_weight_updated_from_data_is_refused_at_the_first_step() -> None:
    x, y = dense_data(n=32)
    inner = keras.Sequential([keras.Input((5,)), _RunningMean(), keras.layers.Dense(3)])
    model = fdp_tf.make_private(inner, optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE)
    with pytest.raises(ValueError, match="non-trainable weights"):
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8), epochs=1, verbose=0)
    np.testing.assert_array_equal(inner.layers[0].mean.numpy(), 0.0)  # restored


@pytest.mark.parametrize("optimizer", ["jl_forward", "jl_double_vjp", "layerwise", "vectorized"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e30])
def test_one_non_finite_example_is_dropped_not_poisonous(optimizer: str, bad: float) -> None:
    """A NaN or inf input, or a finite one whose squared gradient norm overflows
    (1e30 through a linear layer), made every weight NaN."""
    x, y = dense_data(n=16)
    x[3] = bad
    dp = dict(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.1)
    if optimizer.startswith("jl"):
        opt = fdp_tf.DPSGDJL(jl_projections=1 if optimizer == "jl_forward" else 3,
                             jvp_method=optimizer.removeprefix("jl_"), **dp)
    else:
        opt = fdp_tf.DPSGDVanilla(per_example_method=optimizer, **dp)
    linear = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(3)])
    model = fdp_tf.make_private(linear, optimizer=opt, loss=CE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.all(np.isfinite(flat(model.trainable_variables)))
    assert history.history["dropped_examples"] == [1.0]


def test_reload_and_recompile_never_lower_epsilon(tmp_path) -> None:
    """A reload used to reset the rate, a recompile the step count (2.29 and 1.98 logged
    where 6.60 and 2.86 were spent): the ledger travels with the weights."""
    x, y = dense_data(n=64)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=2, verbose=0)  # 8 steps at 0.25
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    restored.compile(optimizer=fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=4), loss=CE)
    restored.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=4), epochs=1, verbose=0)  # 16 at 1/16
    assert restored.ledger.segments == (
        fdp_tf.Segment("gaussian", 1.0, 0, 0.25, 8), fdp_tf.Segment("jl", 1.0, 4, 0.0625, 16))
    expected = (fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.25), steps=8)
                .compose(fdp.JL(noise_multiplier=1.0, jl_projections=4, sampling_rate=0.0625), steps=16)
                .get_epsilon(delta=DELTA))
    assert restored.epsilon(DELTA) == expected
    weights = tmp_path / "w.weights.h5"
    restored.save_weights(weights)
    fresh = fdp_tf.make_private(dense_model())
    fresh.build((None, 5))
    fresh.load_weights(weights)
    assert fresh.ledger == restored.ledger


def test_vectorized_path_survives_an_empty_poisson_batch() -> None:
    model = dense_model()
    x, y = dense_data(n=1)

    @tf.function
    def step(x, y):
        return fdp_tf.vanilla_private_gradient(
            forward_fn(model, x, y), model.trainable_variables, l2_norm_clip=1.0, noise_multiplier=1.0,
            expected_batch_size=4, per_example_method="vectorized",
        ).gradients

    grads = step(tf.constant(x[:0]), tf.constant(y[:0]))
    assert all(np.all(np.isfinite(g)) for g in grads)
    # an empty batch still releases the noise, at its full std sigma C / B = 1/4: over
    # m coordinates the sample std has relative standard error 1/sqrt(2m) (~8 % here)
    noise = flat(grads)
    assert abs(noise.std() / 0.25 - 1.0) < 4.0 / np.sqrt(2 * noise.size)


def _dilated_conv_model() -> keras.Model:
    """A model TensorFlow cannot run on zero rows (a dilated Conv2D's bias add crashes)."""
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(2, 3, padding="same", dilation_rate=2)(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))


@pytest.mark.parametrize(("optimizer", "path"), [
    ("vanilla", "fit"), ("vectorized", "fit_jit"), ("jl", "fit_jit"), ("vanilla", "train_on_batch"),
    ("jl", "private_gradients"), ("vanilla", "fit_jit"), ("jl_forward", "fit_jit"), ("jl_loop", "fit_jit"),
])
def test_an_empty_batch_releases_the_noise_alone_on_every_path(optimizer: str, path: str) -> None:
    """Poisson sampling draws empty batches: the step must release N(0, (sigma C / B)^2)
    and nothing else, on a model whose forward pass crashes on zero rows (found by
    tools/privacy_fuzz.py, seed 3627592303: it crashed fit, train_on_batch and custom loops;
    under jit_compile, the non-finite check's map_fn and scatter did not compile on zero rows,
    nor the per-example loop behind the layer taps)."""
    kind = {"vanilla": fdp_tf.DPSGDVanilla,
            "vectorized": functools.partial(fdp_tf.DPSGDVanilla, per_example_method="vectorized"),
            "jl": functools.partial(fdp_tf.DPSGDJL, jl_projections=2),
            "jl_forward": functools.partial(fdp_tf.DPSGDJL, jl_projections=2, jvp_method="forward"),
            "jl_loop": functools.partial(fdp_tf.DPSGDJL, jl_projections=2, jvp_method="loop")}[optimizer]
    # XLA itself cannot differentiate the dilated Conv2D on zero rows: the vectorized case
    # under jit_compile runs a dense model (its non-finite check once failed to compile)
    base = dense_model(inputs=64) if optimizer == "vectorized" else _dilated_conv_model()
    model = fdp_tf.make_private(base, optimizer=kind(
        l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=1.0), loss=CE, jit_compile=path == "fit_jit")
    x, y = np.zeros((0, *base.input_shape[1:]), "float32"), np.zeros((0,), "int32")
    sampling = fdp_tf.PoissonSampling(num_examples=64, expected_batch_size=4)
    before = flat(model.trainable_variables)
    if path.startswith("fit"):
        model.fit(tf.data.Dataset.from_tensors((x, y)), epochs=1, verbose=0, sampling=sampling)
    else:
        model.open_segment(sampling)
        if path == "train_on_batch":
            model.train_on_batch(x, y)
        else:
            result = model.private_gradients(tf.constant(x), tf.constant(y))
            assert result.forward.per_example_losses.shape[0] == 0 and result.norms.shape[0] == 0
            model.optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))
    noise = flat(model.trainable_variables) - before  # learning rate 1: the noise itself
    assert model.ledger.segments[-1].steps == 1
    # sigma C / B = 1/4; over m coordinates the sample std has relative error ~1/sqrt(2m)
    assert abs(noise.std() / 0.25 - 1.0) < 4.0 / np.sqrt(2 * noise.size), noise.std()


class _ScanLayer(keras.layers.Layer):
    """A cumulative sum over time written with keras.ops.scan (forward mode cannot pass)."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1],), initializer="ones")

    def call(self, x):
        def body(carry, xt):
            carry = carry + xt * self.w
            return carry, carry

        last, _ = keras.ops.scan(body, keras.ops.zeros_like(x[:, 0]), keras.ops.transpose(x, (1, 0, 2)))
        return last


def test_jvp_auto_handles_a_loop_it_cannot_see() -> None:
    """jvp_method='auto' picked forward mode for an ops.scan layer and failed at the first step."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4, 3)).astype("float32")
    y = rng.integers(0, 2, size=16).astype("int32")
    inner = keras.Sequential([keras.Input((4, 3)), _ScanLayer(), keras.layers.Dense(2)])
    model = fdp_tf.make_private(inner, optimizer=fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                                jl_projections=1), loss=CE)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8), epochs=1, verbose=0)
    assert model.optimizer.steps == 2


@pytest.mark.parametrize("method", ["vanilla", "jl"])
def test_mirrored_strategy_adds_the_noise_exactly_once(method: str) -> None:
    _check_distributed_noise(method, "mirrored", replicas=2)


def test_multi_worker_strategy_runs_the_same_path() -> None:
    """MultiWorkerMirroredStrategy as one worker (no TF_CONFIG): collective ops, the same
    private step; the noise is added once at the target std and the ledger is right."""
    _check_distributed_noise("vanilla", "multiworker", replicas=1)


def _check_distributed_noise(method: str, strategy: str, replicas: int) -> None:
    """Two replicas added the same noise and Keras summed it: std 2.0x the target.

    The update of a zero-gradient model is pure noise; its sample std over m = 20,000
    coordinates has standard error target / sqrt(2 m) = 0.5 % of the target, so a
    band of +-3 % (6 standard errors) tells 1.0x from sqrt(2) = 1.41x or 2x."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "mirrored_noise.py"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    proc = subprocess.run([sys.executable, str(script), method, strategy], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["replicas"] == replicas
    assert abs(result["std"] / result["target"] - 1.0) < 6 / np.sqrt(2 * result["size"])
    assert result["steps"] == 1 and result["rate"] == 8 / 64


def _cancelling_escape_model() -> keras.Model:
    """A Dense layer on x[:, :2] whose kernel is also read through keras.ops on
    z = x[:, 2:]: with a loss linear in the output, the part of example i's gradient
    that the taps miss is z_i, and the batch below has sum_i z_i = 0."""
    x = keras.Input((4,))
    dense = keras.layers.Dense(1, use_bias=False)
    return keras.Model(x, dense(x[:, :2]) + keras.ops.matmul(x[:, 2:], dense.kernel))


def test_coverage_check_sees_a_miss_that_cancels_across_the_batch() -> None:
    """The tape's gradient of the missed uses with equal weights sums to exactly 0 on
    this model and batch, so a check with weights 1 would pass and the released sum
    would not be the model's gradient; the random weights r_i catch it."""
    from fdp_tf.layerwise import layerwise_norms

    model = _cancelling_escape_model()
    x = np.array([[1.0, 0.3, 1.0, 2.0], [-1.0, 0.3, -1.0, -2.0], [1.0, -0.7, 0.5, -1.0],
                  [-1.0, -0.7, -0.5, 1.0]], "float32")

    def linear_loss():
        out = model(x)
        return fdp_tf.ForwardPass(out[:, 0], None, out)

    variables = model.trainable_variables
    found = layerwise_norms(linear_loss, variables, model)
    assert found.reason is None and not bool(found.covered)
    # with weights 1 the missed uses cancel exactly: that check would be fooled
    escaped = found.recorded.tape.gradient(found.recorded.forward.per_example_losses, variables)
    assert all(np.all(tf.convert_to_tensor(g).numpy() == 0) for g in escaped if g is not None)
    assert any(g is not None for g in escaped)
    # and the private gradient falls back to exact per-example gradients
    result = fdp_tf.vanilla_private_gradient(
        linear_loss, variables, l2_norm_clip=1e6, noise_multiplier=0.0, expected_batch_size=4,
        per_example_method="layerwise", model=model,
    )
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(model(x)[:, 0]) / 4
    np.testing.assert_allclose(flat(result.gradients), flat(tape.gradient(total, variables)), rtol=1e-5)


def test_fit_falls_back_to_the_model_gradient_when_a_weight_escapes_the_taps() -> None:
    """Inside fit (a traced train step) the coverage check sees the tied output
    projection and the step uses exact per-example gradients of a fresh pass: with
    sigma = 0, a huge C and every example in the batch (p = 1), one SGD step moves the
    weights by exactly -lr times the mean gradient, escaped use included; fit warns
    that the step fell back (counted before the validation resets the metrics)."""
    model = _tied_embedding_model()
    x = np.random.default_rng(0).integers(0, 12, size=(8, 3)).astype("int32")
    y = np.random.default_rng(1).integers(0, 12, size=8).astype("int32")
    before = [v.numpy().copy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        mean_loss = tf.reduce_mean(CE(y, model(x)))
    expected = [b - 0.5 * g.numpy() for b, g in zip(before, tape.gradient(mean_loss, model.trainable_variables))]
    private = fdp_tf.make_private(
        model, optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1e6, noise_multiplier=0.0, learning_rate=0.5), loss=CE)
    assert private.optimizer.resolve_per_example_method(model) == "layerwise"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.NotPrivateWarning)
        with pytest.warns(RuntimeWarning, match="1 of 1 layer-wise steps fell back"):
            private.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8, steps_per_epoch=1, seed=0),
                        epochs=1, verbose=0, validation_data=(x, y))
    for got, want in zip(model.trainable_variables, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_backup_and_restore_and_model_checkpoint_keep_the_ledger(tmp_path) -> None:
    """A run interrupted after its second epoch and resumed by BackupAndRestore ends with
    the ledger (and epsilon) of the uninterrupted run; a ModelCheckpoint file carries
    the ledger of its epoch."""

    class StopAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise KeyboardInterrupt  # as a pre-empted job would stop

    x, y = dense_data(n=64)

    def fresh() -> fdp_tf.PrivateModel:
        model = fdp_tf.make_private(
            dense_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE)
        model.build((None, 5))  # BackupAndRestore restores into a built model
        return model

    def data():
        return fdp_tf.poisson_batches(x, y, expected_batch_size=16)  # 4 steps per epoch

    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch{epoch}.keras"))
    with pytest.raises(KeyboardInterrupt):
        fresh().fit(data(), epochs=4, verbose=0, callbacks=[backup, checkpoint, StopAt()])
    resumed = fresh()
    resumed.fit(data(), epochs=4, verbose=0, callbacks=[backup])
    whole = fresh()
    whole.fit(data(), epochs=4, verbose=0)
    assert resumed.ledger == whole.ledger == fdp_tf.PrivacyLedger((fdp_tf.Segment("gaussian", 1.0, 0, 0.25, 16),))
    assert resumed.epsilon(DELTA) == whole.epsilon(DELTA)
    second = keras.models.load_model(tmp_path / "epoch2.keras")
    assert second.ledger.segments == (fdp_tf.Segment("gaussian", 1.0, 0, 0.25, 8),)


@pytest.mark.skipif(not tf.config.list_physical_devices("GPU"), reason="needs a GPU: where a private step runs")
@pytest.mark.parametrize("kind", ["jl", "layerwise"])
def test_a_gpu_is_not_forced_to_the_cpu(kind: str) -> None:
    """With a GPU, the released gradient (clipped sum plus noise) is computed on it."""
    model = dense_model()
    x, y = dense_data(n=16)
    args = dict(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=16)
    if kind == "jl":
        result = fdp_tf.jl_private_gradient(forward_fn(model, x, y), model.trainable_variables,
                                            jl_projections=2, **args)
    else:
        result = fdp_tf.vanilla_private_gradient(forward_fn(model, x, y), model.trainable_variables,
                                                 per_example_method="layerwise", model=model, **args)
    assert all("GPU" in g.device for g in result.gradients), [g.device for g in result.gradients]


def test_after_a_rerun_norms_and_clip_factors_belong_to_the_rerun() -> None:
    """The rerun on the finite rows used to report the first pass's norms (NaN for
    every row); now each kept row has the rerun's exact norm, the dropped row NaN
    and clip factor 0."""
    model = dense_model()
    x, y = dense_data(n=6)
    x[2] = np.nan
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=0.1, noise_multiplier=1.0, expected_batch_size=6,
                                    per_example_method="loop")

    def on_rows(keep):
        return forward_fn(model, tf.boolean_mask(x, keep), tf.boolean_mask(y, keep), training=False)()

    result = optimizer.compute_private_gradients(
        forward_fn(model, x, y, training=False), model.trainable_variables, model=model,
        forward_on_rows=on_rows, forward_on_indices=on_indices(model, x, y, training=False))
    kept = [i for i in range(6) if i != 2]
    exact = [np.linalg.norm(g) for g in loop_per_example_gradients(model, x[kept], y[kept])]
    norms, factors = result.norms.numpy(), result.clip_factors.numpy()
    np.testing.assert_allclose(norms[kept], exact, rtol=1e-4)
    np.testing.assert_allclose(factors[kept], np.minimum(1.0, 0.1 / np.array(exact)), rtol=1e-4)
    assert np.isnan(norms[2]) and factors[2] == 0.0 and int(result.dropped) == 1


def test_negative_token_ids_are_the_rows_keras_reads():
    """Keras's take wraps id -1 to the last row; the taps used the raw id, so example i's
    key example*rows + id landed in example i-1's rows: norms 0.014 where the truth is
    14.1, and a released gradient 13x C apart between neighbours. Norms and the clipped
    sum now match a per-example loop; ids outside [-rows, rows) are refused."""
    rows = 5
    tokens = keras.Input((1,), dtype="int32")
    embedding = keras.layers.Embedding(rows, 2)
    model = keras.Model(tokens, keras.layers.Dense(3)(keras.layers.Flatten()(embedding(tokens))))
    x = np.array([[4], [-1], [-5], [2]], "int32")
    y = np.array([0, 1, 2, 1], "int32")
    clip = 0.05
    result = fdp_tf.vanilla_private_gradient(
        forward_fn(model, x, y, training=False), model.trainable_variables, l2_norm_clip=clip,
        noise_multiplier=0.0, expected_batch_size=4, per_example_method="layerwise", model=model)
    exact = loop_per_example_gradients(model, x, y)
    norms = np.array([np.linalg.norm(g) for g in exact])
    np.testing.assert_allclose(result.norms.numpy(), norms, rtol=1e-4)
    expected = sum(min(1.0, clip / n) * g for g, n in zip(exact, norms)) / 4
    np.testing.assert_allclose(flat(result.gradients), expected, rtol=1e-4, atol=1e-7)
    from fdp_tf.layerwise.taps import _table_rows

    with pytest.raises(ValueError, match="input_dim"):
        _table_rows(tf.constant([[0, rows]]), rows, "emb")
    with pytest.raises(ValueError, match="input_dim"):
        _table_rows(tf.constant([[-rows - 1]]), rows, "emb")


def test_steps_after_a_recompile_are_not_booked_on_the_old_segment():
    """fit with DP-SGD, then compile(SGD) and train_on_batch: the non-private steps were
    counted as more steps at sigma = 1 (epsilon 2.85 -> 3.25 where it is infinite). Each
    step is booked by what released it: the non-private one makes epsilon infinite."""
    x, y = dense_data(n=64)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=1, verbose=0)
    booked = model.ledger
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=CE)
    assert model.ledger == booked
    model.train_on_batch(x[:16], y[:16])
    assert model.ledger.segments[:1] == booked.segments
    assert model.ledger.segments[1:] == (fdp_tf.Segment("non_private", 0.0, 0, 1.0, 1),)
    assert model.epsilon(DELTA) == math.inf


def test_validation_split_given_by_position_sets_the_rate():
    """fit(x, y, batch_size, epochs, verbose, callbacks, validation_split) read the split
    from the wrong position (and positional callbacks clashed with the wrapper's)."""
    x, y = dense_data(n=64)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        model.fit(x, y, 8, 1, 0, None, 0.5)
    assert model.ledger.segments[-1].sampling_rate == 8 / 32


def test_the_default_path_never_says_it_is_not_private():
    """tests/tf/conftest.py ignores NotPrivateWarning for the seeded tests; an unseeded
    run (OS entropy) must not emit it, or users would learn to ignore it."""
    x, y = dense_data(n=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fdp_tf.NotPrivateWarning)
        model = fdp_tf.make_private(dense_model(), optimizer=fdp_tf.DPSGDJL(
            l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=2), loss=CE)
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8), epochs=1, verbose=0)
        fdp_tf.add_gaussian_noise([tf.zeros(3)], 1.0)
