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
from fuzz_common import LOSS, OwnStep, jl_projections_of, make_optimizer
from fuzz_models import Case


#: How a case's batches are drawn; exact clipping draws all three (by its seed), DP-SGD-JL
#: Poisson only (without replacement refuses it, and random allocation refuses the
#: fuzzer's r = 3 at every sigma it runs: too heavy-tailed for its lattice; the booking of
#: JL epochs is tests/tf/test_tf_batch_schemes.py's).
SCHEMES = ("poisson", "random_allocation", "without_replacement")


def scheme_of(case: Case) -> str:
    """The case's sampling: ``case.scheme`` if set (tests), else by its seed."""
    if case.optimizer.startswith("jl"):
        return "poisson"
    return getattr(case, "scheme", None) or SCHEMES[case.seed % len(SCHEMES)]


@dataclass(frozen=True)
class Phase:
    """Steps the fuzzer ran at one setting. ``sampling``: the scheme of the case; ``size``:
    t of random allocation (``passes`` = passes over the sampler that ran a step), N of
    without replacement; a phase at sampling_rate 1 is a batch nothing vouches for."""

    optimizer: str
    noise_multiplier: float
    sampling_rate: float
    steps: int
    sampling: str = "poisson"
    size: int = 0
    passes: int = 0

    def events(self) -> tuple[Any, int]:
        """(mechanism, count) of these steps, written from the fuzzer's own counts."""
        sigma = self.noise_multiplier
        if self.optimizer.startswith("jl"):
            return fdp.JL(noise_multiplier=sigma, jl_projections=jl_projections_of(self.optimizer),
                          sampling_rate=self.sampling_rate), self.steps
        if self.sampling == "without_replacement":  # replace-one: a replaced row moves a sum by 2C
            b, n = (1, 1) if self.sampling_rate == 1.0 else (round(self.sampling_rate * self.size), self.size)
            return fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=sigma / 2), sample_size=b,
                                                 dataset_size=n), self.steps
        if self.sampling == "random_allocation" and self.sampling_rate < 1.0:
            return fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=sigma), steps_per_epoch=self.size), self.passes
        return fdp.Gaussian(noise_multiplier=sigma, sampling_rate=self.sampling_rate), self.steps


class Count(keras.callbacks.Callback):
    """Training batches fit ran (one release each, steps_per_execution = 1), and the Keras
    epochs that ran one (each a pass over the dataset: a new random allocation)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.passes = 0
        self._stepped = False

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._stepped = False

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.steps += 1
        if not self._stepped:
            self._stepped, self.passes = True, self.passes + 1


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
    kind = case.optimizer
    logged: list[tuple[str, float, int]] = []  # (where, epsilon, phases run by then)
    phases: list[Phase] = []
    path = case.ledger_path

    scheme = scheme_of(case)

    def data(size: int = batch) -> Any:
        if scheme == "random_allocation":
            return fdp_tf.random_allocation_batches(case.x, case.y, steps_per_epoch=-(-n // size))
        if scheme == "without_replacement":
            return fdp_tf.without_replacement_batches(case.x, case.y, batch_size=size)
        return fdp_tf.poisson_batches(case.x, case.y, expected_batch_size=size)

    def vouched(size: int) -> dict[str, Any]:
        """The Phase fields of steps on ``data(size)``."""
        if scheme == "random_allocation":
            t = -(-n // size)
            return dict(sampling_rate=1.0 / t, sampling=scheme, size=t)
        return dict(sampling_rate=size / n, sampling=scheme, size=n)

    def noise_batch(size: int) -> int:
        """The optimizer's B for ``data(size)``: floor(N / t) for random allocation."""
        return n // -(-n // size) if scheme == "random_allocation" else size

    def unvouched(steps: int) -> Phase:
        return Phase(kind, 1.0, 1.0, steps, sampling=scheme)

    def fit(model: fdp_tf.PrivateModel, sigma: float, size: int = batch, **kwargs: Any) -> None:
        count = Count()
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), count]
        try:
            inputs = kwargs.pop("x") if "x" in kwargs else data(size)
            model.fit(inputs, verbose=0, **kwargs)
        finally:
            phases.append(Phase(kind, sigma, steps=count.steps, passes=count.passes, **vouched(size)))

    if path == "fit":
        model = _model(case, 1.0, noise_batch(batch))
        fit(model, 1.0, epochs=2)
    elif path == "backup_and_restore":
        backup = keras.callbacks.BackupAndRestore(os.path.join(tmp, "backup"))
        first = _model(case, 1.0, noise_batch(batch))
        first(case.x[:1])  # BackupAndRestore needs a built model
        try:
            fit(first, 1.0, epochs=3, callbacks=[backup, StopAt(1)])
        except KeyboardInterrupt:
            pass
        other = max(2, n - 1)  # resumed with other settings: sigma and B
        model = _model(case, 0.5, noise_batch(other))
        model(case.x[:1])
        fit(model, 0.5, other, epochs=3, callbacks=[backup])
    elif path == "early_stopping":
        model = _model(case, 1.0, noise_batch(batch))
        stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
        fit(model, 1.0, epochs=3, callbacks=[RisingValLoss(), stop])
    elif path == "checkpoint_and_load":
        file = os.path.join(tmp, "model.keras")
        model = _model(case, 1.0, noise_batch(batch))
        fit(model, 1.0, epochs=2, callbacks=[keras.callbacks.ModelCheckpoint(file)])
        logged.append(("trained", model.epsilon(delta), len(phases)))
        model = keras.models.load_model(file)
        logged.append(("loaded", model.epsilon(delta), len(phases)))
        fit(model, 1.0, epochs=1)
    elif path == "recompile":
        model = _model(case, 1.0, noise_batch(batch))
        fit(model, 1.0, epochs=1)
        model.compile(optimizer=_optimizer(kind, 2.0, noise_batch(batch)), loss=LOSS)
        fit(model, 2.0, epochs=1)
    elif path == "set_weights":
        model = _model(case, 1.0, noise_batch(batch))
        model(case.x[:1])
        start = model.get_weights()
        file = os.path.join(tmp, "start.weights.h5")
        model.save_weights(file)
        fit(model, 1.0, epochs=2)
        model.set_weights(start)
        logged.append(("set_weights", model.epsilon(delta), len(phases)))
        model.load_weights(file)
    elif path == "train_on_batch_after_fit":
        model = _model(case, 1.0, noise_batch(batch))
        fit(model, 1.0, epochs=1)
        for _ in range(3):  # the same example every time: no amplification is vouched for
            model.train_on_batch(case.x[:1], case.y[:1])
        phases.append(unvouched(3))
    elif path == "custom_loop":
        model = _model(case, 1.0, noise_batch(batch))
        model.open_segment({"poisson": fdp_tf.PoissonSampling(num_examples=n, expected_batch_size=batch),
                            "without_replacement": fdp_tf.WithoutReplacementSampling(n, batch),
                            "random_allocation": fdp_tf.RandomAllocationSampling(n, -(-n // batch))}[scheme])
        steps = 0  # (random allocation: refused above, a loop can restart a pass unseen)
        for xb, yb in data():
            result = model.private_gradients(xb, yb)
            model.optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))
            steps += 1
        phases.append(Phase(kind, 1.0, steps=steps, **vouched(batch)))
    else:  # custom_train_step
        model = _model(case, 1.0, noise_batch(batch), wrapper=OwnStep)
        fit(model, 1.0, epochs=2)
    logged.append(("end", model.epsilon(delta), len(phases)))
    return logged, phases
