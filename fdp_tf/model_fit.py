"""``PrivateModel``'s fit and ledger: every private step booked where it is released.

The ledger is an odometer (:mod:`fdp_tf.odometer`): it counts what the model's DP
optimizers released in this process plus every record restored into it, so no restore
lowers it. ``fit`` reads how its batches are sampled (:mod:`fdp_tf.fit_inputs`) and books
its steps at that sampling; steps outside ``fit`` or :meth:`open_segment` get no
amplification.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from fdp_tf.fit_inputs import plan_fit
from fdp_tf.guards import NonTrainableWatch, ReportFallbacks, WatchFirstStep
from fdp_tf.ledger import MAX_SEGMENTS, PrivacyLedger, check_relation, empty_table
from fdp_tf.odometer import booking_of
from fdp_tf.optimizers import DPOptimizer
from fdp_tf.batch_schemes import RandomAllocationSampling, WithoutReplacementSampling
from fdp_tf.sampling import PoissonSampling, pad_to_replicas

__all__ = ["LedgerFit"]

#: keras.Model.fit's parameters after (x, y, batch_size), in order.
_FIT_POSITIONAL = ("epochs", "verbose", "callbacks", "validation_split", "validation_data", "shuffle",
                   "class_weight", "sample_weight", "initial_epoch", "steps_per_epoch",
                   "validation_steps", "validation_batch_size", "validation_freq")


def migrated_store(store: Any) -> Any:
    """A store written before the odometer (a ``[64, 5]`` ledger table and a row index
    weight) as today's one weight ``[64, FIELDS]``: C, B and the segment id unknown (0)."""
    try:
        old = len(store) == 2 and np.shape(store["0"]) == (MAX_SEGMENTS, 5)
    except (KeyError, TypeError):
        return store
    if not old:
        return store
    table = empty_table()
    table[:, :5] = np.asarray(store["0"], dtype=np.float64)
    return {"0": table}


class LedgerFit:
    """The fit and ledger half of :class:`fdp_tf.PrivateModel` (a mixin before
    ``keras.Model``; it uses the model's ``dp_ledger`` weight and ``_odometer``)."""

    # -- fit: sampling and the ledger (an odometer: fdp_tf.odometer) -------------

    @property
    def ledger(self) -> PrivacyLedger:
        """Everything trained so far: every step released by the optimizers this model was
        compiled with, in this process, and every record restored into it."""
        return self._odometer.sync(self.dp_ledger)

    def projected_epsilon(self, delta: float, steps: int, accountant: Any = None) -> float:
        """Certified epsilon of the ledger after ``steps`` more private steps booked as the
        ones now running (during ``fit``: at its sampling; else at rate 1)."""
        from fdp_tf.budget import segment_for

        optimizer = getattr(self, "optimizer", None)
        ledger = self.ledger
        if not isinstance(optimizer, DPOptimizer) or steps <= 0:
            return ledger.epsilon(delta, accountant)
        spec = (getattr(self, "_fdp_fit_sampling", None) or (None,))[0]
        more = segment_for(optimizer, spec, int(steps))
        return PrivacyLedger(tuple(ledger.segments) + (more,)).epsilon(delta, accountant)

    def epsilon(self, delta: float, accountant: Any = None) -> float:
        """Certified upper bound on epsilon at ``delta`` of all training in the ledger
        (``accountant``: an :class:`fdp.PLDAccountant` whose settings to use)."""
        return self.ledger.epsilon(delta, accountant)

    # Every path that writes or reads the saved ledger table goes through the odometer:
    # a file gets all steps run so far; a restore adds its records and removes nothing.
    def save_own_variables(self, store: Any) -> None:
        self._odometer.sync(self.dp_ledger)
        super().save_own_variables(store)

    def load_own_variables(self, store: Any) -> None:
        super().load_own_variables(migrated_store(store))
        self._odometer.sync(self.dp_ledger)

    def get_weights(self) -> list[Any]:
        self._odometer.sync(self.dp_ledger)
        return super().get_weights()

    def set_weights(self, weights: Any) -> None:
        super().set_weights(weights)
        self._odometer.sync(self.dp_ledger)

    def train_on_batch(self, *args: Any, **kwargs: Any) -> Any:
        """Keras ``train_on_batch``; its steps are booked at sampling rate 1 (warned) unless
        :meth:`open_segment` said how the batches are drawn."""
        booking = booking_of(getattr(self, "optimizer", None))
        if booking is not None and getattr(self, "_fdp_fit_sampling", None) is None:
            booking.warn_if_unknown()
        # inside fit (a callback) its release is not fit's own step: booked at rate 1
        # beside fit's segment (fdp_tf.odometer), warned when the ledger is read
        return super().train_on_batch(*args, **kwargs)

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, *args: Any,
            sampling: Any = None, **kwargs: Any) -> Any:
        """Keras ``fit``; its steps are booked at the sampling the input is drawn with.

        * A :func:`fdp_tf.poisson_batches` dataset: p = B / N is read from it and a
          DP optimizer without ``expected_batch_size`` gets B.
        * ``sampling=fdp_tf.PoissonSampling(num_examples=N, expected_batch_size=B)``:
          for any other input that is Poisson-sampled (e.g. a ``poisson_batches``
          dataset after ``.map``); you vouch for the sampling.
        * A :func:`fdp_tf.random_allocation_batches` or
          :func:`fdp_tf.without_replacement_batches` dataset (or ``sampling=`` their
          specs): booked under that scheme — random allocation in whole epochs (a pass
          cut short is charged whole), without replacement for replacing one example.
        * Arrays: drawn as Poisson batches of expected size ``batch_size`` from the rows
          left after ``validation_split``; ``shuffle=False`` keeps Keras's fixed batches,
          booked at rate 1 with a :class:`fdp_tf.SamplingWarning`
          (:mod:`fdp_tf.fit_inputs`).

        Steps after ``fit`` (``train_on_batch``, a custom loop) have unknown sampling
        again until :meth:`open_segment`.

        Raises:
          ValueError: for a DP optimizer when neither B nor p can be known (a
            dataset or generator without ``sampling=``), or when B disagrees with the
            optimizer's ``expected_batch_size``.
        """
        # Keras's positional arguments after batch_size, by name (callbacks, validation_split
        # and shuffle are read below)
        if len(args) > len(_FIT_POSITIONAL):
            raise TypeError(f"fit takes at most {3 + len(_FIT_POSITIONAL)} positional arguments")
        for name, value in zip(_FIT_POSITIONAL, args):
            if name in kwargs:
                raise TypeError(f"fit got multiple values for argument {name!r}")
            kwargs[name] = value
        optimizer = getattr(self, "optimizer", None)
        plan = plan_fit(x, y, batch_size, kwargs, sampling, isinstance(optimizer, DPOptimizer))
        x, y, batch_size, kwargs = plan.x, plan.y, plan.batch_size, plan.kwargs
        booking = booking_of(optimizer)
        if booking is not None:
            check_relation(self._odometer.segments(), plan.sampling)  # before anything changes
            booking.check(plan.sampling)
            self._set_expected_batch_size(optimizer, plan.expected_batch_size, strict=plan.sampling is not None)
            booking.open(plan.sampling, warned=plan.sampling is None, fit=True)  # plan_fit warned
        replicas = self.distribute_strategy.num_replicas_in_sync
        if isinstance(x, tf.data.Dataset):
            kwargs.setdefault("shuffle", False)  # a dataset is not reshuffled by Keras anyway
            if replicas > 1:
                x = pad_to_replicas(x, replicas)
        watch = NonTrainableWatch(self.base_model) if isinstance(optimizer, DPOptimizer) else None
        callbacks = list(kwargs.pop("callbacks", None) or [])
        if watch is not None and watch.variables:
            callbacks.append(WatchFirstStep(watch))
        if watch is not None:
            callbacks.append(ReportFallbacks(self.fallback_tracker))
        self._fdp_fit_sampling = (plan.sampling,) if booking is not None else None
        if booking is not None and plan.sampling is not None:
            self._warn_past_budget(x, plan.sampling, kwargs)
        try:
            return super().fit(x, y, batch_size, callbacks=callbacks, **kwargs)
        finally:
            self._fdp_fit_sampling = None
            if booking is not None:
                booking.open(None)  # fit's sampling ends with it
            self._odometer.sync(self.dp_ledger)

    def _warn_past_budget(self, x: Any, spec: Any, kwargs: dict[str, Any]) -> None:
        """Warn once per fit if the epochs asked for end above the budget of make_private."""
        budget = getattr(self, "budget", None)
        if budget is None:
            return
        from fdp_tf.budget import spec_of
        from fdp_tf.sampling import sampling_of

        epochs = int(kwargs.get("epochs", 1)) - int(kwargs.get("initial_epoch", 0))
        per_pass = kwargs.get("steps_per_epoch") or spec_of(x if sampling_of(x) is not None else spec)[1]
        planned = self.projected_epsilon(budget.delta, epochs * int(per_pass))
        if planned > budget.target_epsilon:
            warnings.warn(
                f"this fit ({epochs} epochs of {per_pass} steps) will end at epsilon <= {planned:.4g} at "
                f"delta={budget.delta:g}, above the budget {budget.target_epsilon:g} the noise multiplier was "
                f"chosen for ({budget.epochs} epochs in all). Fit fewer epochs, or stop at the budget: "
                f"callbacks=[fdp_tf.PrivacyCallback(delta={budget.delta:g}, stop_at_epsilon={budget.target_epsilon:g})]",
                UserWarning, stacklevel=3)

    def open_segment(self, sampling: Any) -> None:
        """Book the next private steps at ``sampling`` (a custom loop or ``train_on_batch``
        on batches drawn that way; you vouch for it) until the next ``fit`` or call:
        a :class:`fdp_tf.PoissonSampling` or :class:`fdp_tf.WithoutReplacementSampling`.
        Random allocation is booked by ``fit`` only: a loop may cut a pass short and start
        another without the ledger seeing it, and each pass is a whole epoch to charge."""
        if isinstance(sampling, RandomAllocationSampling):
            raise ValueError("open_segment cannot book random allocation: a custom loop may start a new "
                             "pass over the batches at any step, and every pass is an epoch to charge. "
                             "Train on fdp_tf.random_allocation_batches with fit, or book fixed-size or "
                             "Poisson batches here")
        if not isinstance(sampling, (PoissonSampling, WithoutReplacementSampling)):
            raise ValueError("sampling must be an fdp_tf.PoissonSampling or WithoutReplacementSampling; got "
                             f"{type(sampling).__name__}")
        optimizer = getattr(self, "optimizer", None)
        if optimizer is None:
            raise ValueError("compile the model with its optimizer before open_segment")
        booking = booking_of(optimizer)
        if booking is not None:
            check_relation(self._odometer.segments(), sampling)
            booking.check(sampling)
            self._set_expected_batch_size(optimizer, sampling.expected_batch_size, strict=True)
            booking.open(sampling)

    def _set_expected_batch_size(self, optimizer: Any, size: int, *, strict: bool) -> None:
        current = optimizer.expected_batch_size
        if current is None:
            optimizer.expected_batch_size = size
            if getattr(self, "train_function", None) is not None:
                self.make_train_function(force=True)
        elif current != size and (strict or current > size):  # a larger B: too little noise
            raise ValueError(
                f"expected_batch_size of the optimizer is {current} but the data are "
                f"sampled with expected batch size {size}; they must agree (the noise std "
                "sigma*C/B uses B)"
            )
