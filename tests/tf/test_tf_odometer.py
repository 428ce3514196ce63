"""The ledger is a privacy odometer (issue 26, items 1, 2 and rows 1-4 of its table).

Every expected epsilon is an independent ``fdp.PLDAccountant`` composition of the
steps the test actually ran; the ledger's epsilon must not be below it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import math
import random
import warnings

import keras
import numpy as np
import tensorflow as tf

import fdp
import fdp_tf
from tf_helpers import CE, dense_data, dense_model

DELTA = 1e-5


def _spent(*phases: tuple[float, float, int]) -> float:
    """Epsilon of Gaussian phases (sigma, sampling rate, steps), composed independently."""
    accountant = fdp.PLDAccountant()
    for sigma, rate, steps in phases:
        if steps == 0:
            continue
        accountant = accountant.compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=rate), steps=steps)
    return accountant.get_epsilon(delta=DELTA)


def _private(sigma: float = 1.0, inner: keras.Model | None = None, cls=fdp_tf.PrivateModel) -> fdp_tf.PrivateModel:
    model = cls(inner if inner is not None else dense_model())
    model.compile(optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=sigma, learning_rate=0.1),
                  loss=CE)
    return model


class _StopAt(keras.callbacks.Callback):
    """Interrupts fit at the start of an epoch, as a pre-empted job would stop."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt


class _CountSteps(keras.callbacks.Callback):
    """Counts the training batches fit ran (one apply each): independent of the ledger."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


# -- rows 1-4 of the table --------------------------------------------------------


@pytest.mark.parametrize("resume", ["sigma", "rate"])
def test_backup_and_restore_resume_books_its_own_settings(tmp_path, resume: str) -> None:
    """Row 1: 8 steps at sigma = 2, p = 1/4, interrupted; resumed at sigma = 0.5 (or at
    p = 1/2). fit opened the new segment before BackupAndRestore restored the ledger
    weight, so the resumed steps were booked as more steps of the old segment."""
    x, y = dense_data(n=64)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    first = _private(2.0)
    first.build((None, 5))
    with pytest.raises(KeyboardInterrupt):
        first.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=4, verbose=0,
                  callbacks=[backup, _StopAt(2)])
    sigma, batch = (0.5, 16) if resume == "sigma" else (2.0, 32)
    resumed = _private(sigma)
    resumed.build((None, 5))
    count = _CountSteps()
    resumed.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=batch), epochs=4, verbose=0,
                callbacks=[backup, count])
    assert count.steps == 2 * math.ceil(64 / batch)  # epochs 3 and 4
    expected = _spent((2.0, 0.25, 8), (sigma, batch / 64, count.steps))
    assert resumed.ledger.steps == 8 + count.steps
    assert resumed.epsilon(DELTA) >= expected


def test_restore_best_weights_does_not_unspend(tmp_path) -> None:
    """Row 2: EarlyStopping(restore_best_weights=True) chose epoch 1 using epochs 2-3 and
    restored the ledger weight with the weights: 10 of 30 steps were reported."""

    class Score(keras.callbacks.Callback):  # val_loss rising: the best epoch is the first
        def on_epoch_end(self, epoch, logs=None):
            logs["val_loss"] = float(epoch)

    x, y = dense_data(n=100)
    model = _private(1.0)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=5, restore_best_weights=True)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=10), epochs=3, verbose=0,
              callbacks=[Score(), stop])
    assert stop.best_epoch == 0
    expected = _spent((1.0, 0.1, 30))
    assert model.ledger.steps == 30 and model.epsilon(DELTA) >= expected
    model.save(tmp_path / "best.keras")
    assert keras.models.load_model(tmp_path / "best.keras").epsilon(DELTA) >= expected


class OwnStep(fdp_tf.PrivateModel):
    """A train_step written from the documented pieces (no call to PrivateModel.train_step)."""

    def train_step(self, data):
        x, y = data
        result = self.private_gradients(x, y)
        self.optimizer.apply_gradients(zip(result.gradients, self.trainable_variables))
        return {"loss": tf.reduce_mean(result.forward.per_example_losses)}


def test_a_custom_train_step_and_a_custom_loop_are_booked() -> None:
    """Row 3: steps were counted in PrivateModel.train_step only: epsilon 0.0 after 30
    steps of a subclass's train_step and after 10 steps of a custom loop."""
    x, y = dense_data(n=100)
    model = _private(1.0, cls=OwnStep)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=10), epochs=3, verbose=0)
    assert model.ledger.steps == 30 and model.epsilon(DELTA) >= _spent((1.0, 0.1, 30))

    loop = _private(1.0)
    loop.open_segment(fdp_tf.PoissonSampling(num_examples=100, expected_batch_size=10))
    for xb, yb in fdp_tf.poisson_batches(x, y, expected_batch_size=10):
        result = loop.private_gradients(xb, yb)
        loop.optimizer.apply_gradients(zip(result.gradients, loop.trainable_variables))
    assert loop.ledger.steps == 10 and loop.epsilon(DELTA) >= _spent((1.0, 0.1, 10))


def test_a_release_applied_by_hand_is_booked() -> None:
    """The noised gradient leaves the optimizer in compute_private_gradients: applied by
    hand instead of through apply_gradients, the step is still booked."""
    x, y = dense_data(n=16)
    model = _private(1.0)
    model.open_segment(fdp_tf.PoissonSampling(num_examples=16, expected_batch_size=16))
    result = model.private_gradients(x, y)
    for variable, gradient in zip(model.trainable_variables, result.gradients):
        variable.assign_sub(0.1 * gradient)
    assert model.ledger.segments == (fdp_tf.Segment("gaussian", 1.0, 0, 1.0, 1),)


def test_train_on_batch_after_fit_gets_no_amplification() -> None:
    """Row 4: 50 train_on_batch steps on example 0 after a fit at p = 0.1 were booked at
    p = 0.1. Their sampling is unknown: they are booked at rate 1, with a warning."""
    x, y = dense_data(n=100)
    model = _private(1.0)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=10), epochs=1, verbose=0)
    with pytest.warns(fdp_tf.SamplingWarning, match="rate 1"):
        for _ in range(50):
            model.train_on_batch(x[:1], y[:1])
        ledger = model.ledger
    assert ledger.steps == 60
    assert model.epsilon(DELTA) >= _spent((1.0, 0.1, 10), (1.0, 1.0, 50))


_SIGNATURE = [tf.TensorSpec([None, 5], tf.float32), tf.TensorSpec([None], tf.int32)]


class _SharedStep(fdp_tf.PrivateModel):
    """A train_step releasing through a tf.function that a callback may call too (its
    trace, made inside fit's step, is then reused outside it); ``twice``: it releases
    each sampled batch twice; ``idle``: it releases nothing (red team: its armed flag
    was left for the callback's release); ``inner``: after its release it calls a
    train_step traced on its own outside fit, on rows it chose (red team: that trace
    armed the step again)."""

    twice = idle = False
    inner = None

    def train_step(self, data):
        x, y = data[0], data[1]
        if not self.idle:
            self.shared_step(x, y)
        if self.twice:
            self.shared_step(x, y)
        if self.inner is not None:
            self.inner()
        return {"steps": tf.constant(1.0)}

    @tf.function(input_signature=_SIGNATURE)
    def shared_step(self, x, y):
        result = self.private_gradients(x, y)
        self.optimizer.apply_gradients(zip(result.gradients, self.trainable_variables))
        return tf.constant(0)


class _ReleasesOnItsOwnRows(keras.callbacks.Callback):
    """A hostile callback: during fit, every other batch, it releases a private gradient
    on rows it chose (example 0), by one of several routes."""

    def __init__(self, x: np.ndarray, y: np.ndarray, route: str) -> None:
        super().__init__()
        self.x, self.y, self.route = tf.constant(x[:1]), tf.constant(y[:1]), route
        self.traced = tf.function(self._step)
        self.released = 0

    def _step(self, x: tf.Tensor, y: tf.Tensor) -> None:
        result = self.model.private_gradients(x, y)
        self.model.optimizer.apply_gradients(zip(result.gradients, self.model.trainable_variables))

    def on_train_batch_end(self, batch, logs=None):
        if batch % 2:
            return
        if self.route == "eager":
            self._step(self.x, self.y)
        elif self.route == "traced":
            self.traced(self.x, self.y)
        elif self.route == "train_on_batch":
            self.model.train_on_batch(self.x, self.y)
        elif self.route == "train_function":  # Keras's training function, on its own rows
            self.model.train_function(iter(tf.data.Dataset.from_tensors((self.x, self.y)).repeat()))
        else:  # "shared_trace": the step's own tf.function, traced inside fit's step
            self.model.shared_step(self.x, self.y)
        self.released += 1


@pytest.mark.parametrize("route", ["eager", "traced", "train_on_batch", "train_function", "shared_trace", "twice",
                                   "idle", "inner"])
def test_releases_of_a_callback_during_fit_get_no_amplification(route: str) -> None:
    """fit vouches for one release per step of its own loop. Releases on rows a callback
    chose were booked at fit's p = 0.1 (issue 27 red team: private_gradients, its own
    tf.function, Keras's training function, a tf.function first traced inside fit's step;
    train_on_batch alone had been fixed), and so was a step releasing its batch twice;
    then (second round) a callback's release after a step that released nothing, and a
    train_step traced on its own called inside fit's step. Now each is booked at rate 1,
    with a warning, also while fit still runs (what PrivacyCallback reads at an epoch's end)."""
    x, y = dense_data(n=100)
    model = _private(1.0, cls=_SharedStep if route in ("shared_trace", "twice", "idle", "inner") else fdp_tf.PrivateModel)
    model.twice, model.idle = route == "twice", route == "idle"
    if route == "inner":  # a train_step traced on its own before fit, on rows it chose
        rows = (tf.constant(x[:1]), tf.constant(y[:1]))
        model.optimizer.build(model.trainable_variables)
        model.optimizer.expected_batch_size = 10
        model.inner = tf.function(lambda: fdp_tf.PrivateModel.train_step(model, rows))
        model.inner.get_concrete_function()
    hostile = _ReleasesOnItsOwnRows(x, y, route)
    count, seen = _CountSteps(), []
    peek = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(model.ledger))
    with pytest.warns(fdp_tf.SamplingWarning, match="rate 1"):
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=10), epochs=2, verbose=0,
                  callbacks=[count, peek] + ([] if route in ("twice", "inner") else [hostile]))
    extra = 20 if route in ("twice", "inner") else hostile.released
    own = 0 if route == "idle" else 20  # steps of fit's loop that released
    assert count.steps == 20 and extra in (10, 20)
    for ledger, epochs in ((seen[0], 1), (seen[1], 2), (model.ledger, 2)):
        by_rate: dict[float, int] = {}
        for segment in ledger.segments:
            by_rate[segment.sampling_rate] = by_rate.get(segment.sampling_rate, 0) + segment.steps
        expected = {0.1: own * epochs // 2, 1.0: extra * epochs // 2}
        assert by_rate == {rate: steps for rate, steps in expected.items() if steps}, (route, ledger)
    # two upper bounds of one composition, composed in another order: equal to round-off
    assert model.epsilon(DELTA) >= _spent((1.0, 0.1, own), (1.0, 1.0, extra)) * (1 - 1e-12)
    if route == "eager":  # more fit after it: fit's steps continue at p = 0.1
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=10), epochs=1, verbose=0)
        assert model.ledger.steps == 40


# -- the invariant, under random sequences of what users and Keras do ----------------


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_no_sequence_of_restores_lowers_the_ledger(tmp_path, seed: int) -> None:
    """Train, set_weights(old), load_weights(old file), save + load_model, recompile with
    another sigma, BackupAndRestore resume, train_on_batch, in a random order: the
    ledger's steps never decrease, are never fewer than the releases this test ran, and
    its epsilon is never below an independent composition of them."""
    rng = random.Random(seed)
    x, y = dense_data(n=32)
    model = _private(1.0)
    model.build((None, 5))
    snapshots, files = [model.get_weights()], [tmp_path / "start.weights.h5"]
    model.save_weights(files[0])
    phases: list[tuple[float, float, int]] = []
    seen = 0

    def train(epochs: int, callbacks=()) -> None:  # 2 steps per epoch at p = 1/2
        count = _CountSteps()  # what ran (after a resume Keras starts later fits late)
        try:
            model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=epochs, verbose=0,
                      callbacks=[*callbacks, count])
        finally:
            phases.append((model.optimizer.noise_multiplier, 0.5, count.steps))

    ops = ["train", "set_weights", "load_weights", "reload", "recompile", "resume", "train_on_batch"]
    for i, op in enumerate(["train", *rng.sample(ops, len(ops)), "train"]):
        if op == "train":
            train(1)
        elif op == "set_weights":
            model.set_weights(rng.choice(snapshots))
        elif op == "load_weights":
            model.load_weights(rng.choice(files))
        elif op == "reload":
            model.save(tmp_path / f"m{i}.keras")
            model = keras.models.load_model(tmp_path / f"m{i}.keras")
        elif op == "recompile":
            model.compile(optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=rng.choice([0.8, 1.5])),
                          loss=CE)
        elif op == "resume":
            backup = keras.callbacks.BackupAndRestore(str(tmp_path / f"backup{i}"))
            with pytest.raises(KeyboardInterrupt):
                train(2, [backup, _StopAt(1)])
            train(2, [backup])  # restores the weights of the end of epoch 1, runs epoch 2
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
                model.train_on_batch(x[:4], y[:4])
            phases.append((model.optimizer.noise_multiplier, 1.0, 1))
        steps = model.ledger.steps
        assert steps >= seen and steps >= sum(n for _, _, n in phases), (op, steps, phases)
        seen = steps
        if rng.random() < 0.5:  # later restores may go back to here
            snapshots.append(model.get_weights())
            files.append(tmp_path / f"w{i}.weights.h5")
            model.save_weights(files[-1])
    assert model.epsilon(DELTA) >= _spent(*phases)


def test_a_restore_adds_a_foreign_history_and_counts_its_own_once(tmp_path) -> None:
    """A file from another run is added (not max'ed with this run's steps); reloading
    this run's own earlier file, or the same foreign file twice, adds nothing."""
    x, y = dense_data(n=32)
    other = _private(2.0)
    other.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=3, verbose=0)  # 6 steps
    other.save_weights(tmp_path / "other.weights.h5")
    model = _private(1.0)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=1, verbose=0)  # 2 steps
    model.save_weights(tmp_path / "own.weights.h5")
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=1, verbose=0)  # 2 more
    for path in ("other", "own", "other", "own"):
        model.load_weights(tmp_path / f"{path}.weights.h5")
    assert model.ledger.steps == 6 + 4
    assert model.epsilon(DELTA) >= _spent((2.0, 0.5, 6), (1.0, 0.5, 4))


def test_compute_epsilon_at_a_huge_sigma_is_about_zero() -> None:
    """The accountant's grid overflowed at sigma = 1e20 (epsilon inf); more noise is
    post-processing of less, so the ledger accounts it at a smaller sigma: still ~0."""
    gaussian = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1e20)
    jl = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1e20, jl_projections=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # wide-bracket notes of the accountant
        assert fdp_tf.compute_epsilon(gaussian, delta=DELTA, sampling_rate=1e-3, steps=1000) < 1e-6
        assert fdp_tf.compute_epsilon(jl, delta=DELTA, sampling_rate=1.0, steps=1000) < 1e-6


# -- sampling provenance ---------------------------------------------------------------


class RecordsRows(fdp_tf.PrivateModel):
    def train_step(self, data):
        logs = super().train_step(data)
        logs["rows"] = tf.shape(tf.nest.flatten(data)[0])[0]
        return logs


def test_fit_on_arrays_draws_certified_poisson_batches() -> None:
    """fit(x, y, batch_size=16) let Keras cut shuffled batches of exactly 16 and booked them
    as Poisson with a SamplingWarning; now the arrays go through fdp_tf's Poisson sampler
    (sizes vary), with validation_split holding out the last rows as in Keras."""
    x, y = dense_data(n=64)
    model = _private(1.0, cls=RecordsRows)
    sizes = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: sizes.append(int(logs["rows"])))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fdp_tf.SamplingWarning)
        history = model.fit(x, y, batch_size=16, epochs=4, verbose=0, validation_split=0.25, callbacks=[record])
    assert "val_loss" in history.history
    assert model.ledger.segments == (fdp_tf.Segment("gaussian", 1.0, 0, 16 / 48, 12),)
    assert len(sizes) == 12 and len(set(sizes)) > 1  # Binomial(48, 1/3), not always 16


def test_fixed_batches_and_class_weights() -> None:
    """shuffle=False keeps Keras's batches, which no sampling amplifies: booked at rate 1
    with a warning. class_weight weighs each example's loss (weights 0: no update at
    sigma = 0); with sample_weight it is refused, as Keras refuses it."""
    x, y = dense_data(n=32)
    model = _private(1.0)
    with pytest.warns(fdp_tf.SamplingWarning, match="shuffle=False"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert model.ledger.segments == (fdp_tf.Segment("gaussian", 1.0, 0, 1.0, 2),)

    quiet = fdp_tf.make_private(dense_model(), optimizer=fdp_tf.DPSGDVanilla(
        l2_norm_clip=1e6, noise_multiplier=0.0, learning_rate=1.0), loss=CE)
    quiet.build((None, 5))
    before = quiet.base_model.get_weights()
    quiet.fit(x, y, batch_size=16, epochs=1, verbose=0, class_weight={0: 0.0, 1: 0.0, 2: 0.0})
    for got, want in zip(quiet.base_model.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="class_weight and sample_weight"):
        quiet.fit(x, y, batch_size=16, class_weight={0: 1.0}, sample_weight=np.ones(32))
    with pytest.raises(ValueError, match="without sampling="):  # Keras would cut fixed batches
        quiet.fit(x, y, sampling=fdp_tf.PoissonSampling(num_examples=32, expected_batch_size=16))


def test_steps_inside_one_execution_are_each_booked() -> None:
    """The release counts in the graph: with several steps per call each one counts."""
    x, y = dense_data(n=64)
    model = fdp_tf.PrivateModel(dense_model())
    model.compile(optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), loss=CE,
                  steps_per_execution=3)
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8), epochs=1, verbose=0)  # 8 steps
    assert model.ledger.segments == (fdp_tf.Segment("gaussian", 1.0, 0, 0.125, 8),)


def test_noise_settings_changed_under_the_booking_are_refused() -> None:
    """A step traced before sigma was lowered by hand would be booked at the new sigma
    (or the reverse): the booking refuses a changed mechanism."""
    import dataclasses

    x, y = dense_data(n=16)
    model = _private(1.0)
    model.optimizer.dp_config = dataclasses.replace(model.optimizer.dp_config, noise_multiplier=0.1)
    with pytest.raises(ValueError, match="noise settings .* changed"):
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=8), epochs=1, verbose=0)


def test_a_ledger_saved_before_the_odometer_still_loads() -> None:
    """Files written before the odometer hold a [64, 5] table (kind, sigma, r, p, steps)
    and a row index; they load into today's [64, 8] table with C, B and id unknown."""
    from fdp_tf.ledger import MAX_SEGMENTS

    old = np.zeros((MAX_SEGMENTS, 5))
    old[:, 0] = -1.0
    old[0] = [1.0, 1.5, 0.0, 0.1, 40.0]  # exact clipping, sigma 1.5, p 0.1, 40 steps
    old[1] = [2.0, 1.0, 4.0, 0.2, 10.0]  # JL r = 4
    model = _private(1.0)
    model.load_own_variables({"0": old, "1": np.array(1, dtype="int32")})
    assert model.ledger.segments == (fdp_tf.Segment("gaussian", 1.5, 0, 0.1, 40), fdp_tf.Segment("jl", 1.0, 4, 0.2, 10))
    model.load_own_variables({"0": old, "1": np.array(1, dtype="int32")})  # the same file again: counted once
    assert model.ledger.steps == 50
