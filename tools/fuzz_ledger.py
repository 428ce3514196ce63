"""The privacy fuzzer's accounting paths (check (c) of ``privacy_fuzz``).

Each path trains a case's model for a few private steps while doing what Keras users do
to weights and optimizers between them, and returns the epsilons the model logged (at
every point a user could read one) together with the phases the fuzzer itself ran:
steps counted by a Keras callback or by its own loops, each at the sampling it used
(rate 1 where nothing vouches for the sampling). None of it reads fdp_tf's ledger.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import keras

import fdp
import fdp_tf
from fuzz_common import JL_PROJECTIONS, LOSS, OwnStep, make_optimizer
from fuzz_models import Case


@dataclass(frozen=True)
class Phase:
    """Steps the fuzzer ran at one setting."""

    optimizer: str
    noise_multiplier: float
    sampling_rate: float
    steps: int

    def mechanism(self) -> Any:
        if self.optimizer == "jl":
            return fdp.JL(noise_multiplier=self.noise_multiplier, jl_projections=JL_PROJECTIONS,
                          sampling_rate=self.sampling_rate)
        return fdp.Gaussian(noise_multiplier=self.noise_multiplier, sampling_rate=self.sampling_rate)


class Count(keras.callbacks.Callback):
    """Training batches fit ran (one release each, steps_per_execution = 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.steps += 1


class StopAt(keras.callbacks.Callback):
    """Interrupts fit at the start of an epoch, as a pre-empted job would stop."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if epoch == self.epoch:
            raise KeyboardInterrupt


class RisingValLoss(keras.callbacks.Callback):
    """val_loss rising every epoch: EarlyStopping's best epoch is the first."""

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["val_loss"] = float(epoch)


def _model(case: Case, sigma: float, batch: int, wrapper: Any = None) -> fdp_tf.PrivateModel:
    model = (wrapper or fdp_tf.PrivateModel)(case.build())
    model.compile(optimizer=_optimizer(case.optimizer, sigma, batch), loss=LOSS)
    return model


def _optimizer(kind: str, sigma: float, batch: int) -> fdp_tf.DPOptimizer:
    return make_optimizer(kind, sigma, batch, learning_rate=0.1)


def run_ledger_path(case: Case, tmp: str, delta: float) -> tuple[list[tuple[str, float, int]], list[Phase]]:
    """Run ``case.ledger_path``; returns ((where, logged epsilon, phases run by then), ...)
    and the phases run."""
    keras.backend.clear_session()
    n = len(case.x)
    batch = max(2, n // 2)
    p = batch / n
    kind = case.optimizer
    logged: list[tuple[str, float, int]] = []  # (where, epsilon, phases run by then)
    phases: list[Phase] = []
    path = case.ledger_path

    def data(size: int = batch) -> Any:
        return fdp_tf.poisson_batches(case.x, case.y, expected_batch_size=size)

    def fit(model: fdp_tf.PrivateModel, sigma: float, rate: float, **kwargs: Any) -> None:
        count = Count()
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), count]
        try:
            inputs = kwargs.pop("x") if "x" in kwargs else data()
            model.fit(inputs, verbose=0, **kwargs)
        finally:
            phases.append(Phase(kind, sigma, rate, count.steps))

    if path == "fit":
        model = _model(case, 1.0, batch)
        fit(model, 1.0, p, epochs=2)
    elif path == "backup_and_restore":
        backup = keras.callbacks.BackupAndRestore(os.path.join(tmp, "backup"))
        first = _model(case, 1.0, batch)
        first(case.x[:1])  # BackupAndRestore needs a built model
        try:
            fit(first, 1.0, p, epochs=3, callbacks=[backup, StopAt(1)])
        except KeyboardInterrupt:
            pass
        other = max(2, n - 1)  # resumed with other settings: sigma and B
        model = _model(case, 0.5, other)
        model(case.x[:1])
        fit(model, 0.5, other / n, x=data(other), epochs=3, callbacks=[backup])
    elif path == "early_stopping":
        model = _model(case, 1.0, batch)
        stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
        fit(model, 1.0, p, epochs=3, callbacks=[RisingValLoss(), stop])
    elif path == "checkpoint_and_load":
        file = os.path.join(tmp, "model.keras")
        model = _model(case, 1.0, batch)
        fit(model, 1.0, p, epochs=2, callbacks=[keras.callbacks.ModelCheckpoint(file)])
        logged.append(("trained", model.epsilon(delta), len(phases)))
        model = keras.models.load_model(file)
        logged.append(("loaded", model.epsilon(delta), len(phases)))
        fit(model, 1.0, p, epochs=1)
    elif path == "recompile":
        model = _model(case, 1.0, batch)
        fit(model, 1.0, p, epochs=1)
        model.compile(optimizer=_optimizer(kind, 2.0, batch), loss=LOSS)
        fit(model, 2.0, p, epochs=1)
    elif path == "set_weights":
        model = _model(case, 1.0, batch)
        model(case.x[:1])
        start = model.get_weights()
        file = os.path.join(tmp, "start.weights.h5")
        model.save_weights(file)
        fit(model, 1.0, p, epochs=2)
        model.set_weights(start)
        logged.append(("set_weights", model.epsilon(delta), len(phases)))
        model.load_weights(file)
    elif path == "train_on_batch_after_fit":
        model = _model(case, 1.0, batch)
        fit(model, 1.0, p, epochs=1)
        for _ in range(3):  # the same example every time: no amplification is vouched for
            model.train_on_batch(case.x[:1], case.y[:1])
        phases.append(Phase(kind, 1.0, 1.0, 3))
    elif path == "custom_loop":
        model = _model(case, 1.0, batch)
        model.open_segment(fdp_tf.PoissonSampling(num_examples=n, expected_batch_size=batch))
        steps = 0
        for xb, yb in data():
            result = model.private_gradients(xb, yb)
            model.optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))
            steps += 1
        phases.append(Phase(kind, 1.0, p, steps))
    else:  # custom_train_step
        model = _model(case, 1.0, batch, wrapper=OwnStep)
        fit(model, 1.0, p, epochs=2)
    logged.append(("end", model.epsilon(delta), len(phases)))
    return logged, phases
