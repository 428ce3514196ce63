"""Epsilon during ``fit``: a Keras callback backed by the model's privacy ledger.

After every epoch the reported value is

    model.ledger.epsilon(delta)
      = fdp.PLDAccountant().compose(m_1, steps=n_1).compose(m_2, steps=n_2)... .get_epsilon(delta)

over the segments the model actually ran (seed, Theorem "final privacy curve" for each:
the composition of n Poisson-subsampled steps, both neighbouring directions): a
certified upper bound on everything spent, across fits, recompiles and reloads.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras

from fdp._validation import check_delta, check_real
from fdp_tf.ledger import PrivacyLedger, compute_epsilon

__all__ = ["PrivacyCallback", "compute_epsilon"]


class PrivacyCallback(keras.callbacks.Callback):
    """Puts ``epsilon`` (an upper bound at ``delta``) into the epoch logs.

    Keras's progress bar and ``History`` then show it beside the loss. Place it
    in ``callbacks=[...]``; it runs before the built-in ``History`` and
    progress bar, which therefore see the value.

    Args:
      delta: target delta in (0, 1), e.g. 1e-5 or below 1/N.
      log_key: the name in the logs (default ``"epsilon"``).
      accountant: an :class:`fdp.PLDAccountant` whose settings the ledger's epsilon
        uses (e.g. ``fdp.PLDAccountant(max_refinements=6)`` where the default bracket
        is wider than its tolerance); default ``fdp.PLDAccountant()``.
      stop_at_epsilon: a budget: training stops after the last epoch whose end keeps
        epsilon <= it (the next epoch is projected from the ledger before it runs,
        with the steps of an epoch of this fit), and a warning says so at the start
        if the planned epochs would end above it. ``None``: never stops.

    Raises:
      ValueError: at the start of training, if the model is not an
        :class:`fdp_tf.PrivateModel` (only it keeps a ledger), or if the first epoch
        alone would take epsilon above ``stop_at_epsilon`` (nothing is trained).
    """

    def __init__(self, *, delta: float, log_key: str = "epsilon", accountant: Any = None,
                 stop_at_epsilon: float | None = None, **legacy: Any) -> None:
        super().__init__()
        if "sampling_rate" in legacy:
            raise ValueError(
                "PrivacyCallback no longer takes sampling_rate: the model's ledger records the "
                "rate of the rows actually trained on (pass fit(..., sampling=...) for a "
                "pipeline fit cannot read)"
            )
        if legacy:
            raise TypeError(f"unexpected arguments {sorted(legacy)}")
        self.delta = check_delta(delta)
        self.log_key = log_key
        import fdp

        if accountant is not None and not isinstance(accountant, fdp.PLDAccountant):
            raise ValueError(f"accountant must be an fdp.PLDAccountant or None; got {type(accountant).__name__}")
        self.accountant = accountant
        self.stop_at_epsilon = None if stop_at_epsilon is None else check_real(
            "stop_at_epsilon", stop_at_epsilon, low=0.0, low_inclusive=False)
        #: the last epoch run (0-based) when the budget stopped training, else None
        self.stopped_epoch: int | None = None
        self._cache: dict[PrivacyLedger, float] = {}

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not hasattr(self.model, "ledger"):
            raise ValueError(
                "PrivacyCallback needs an fdp_tf.PrivateModel (it reads the model's privacy "
                f"ledger); got {type(self.model).__name__}. Wrap it: fdp_tf.make_private(model, ...)"
            )
        self.stopped_epoch = None
        if self.stop_at_epsilon is None or not self.params.get("steps"):
            return
        steps, epochs = int(self.params["steps"]), int(self.params.get("epochs") or 1)
        first = self.model.projected_epsilon(self.delta, steps, self.accountant)
        if first > self.stop_at_epsilon:
            raise ValueError(
                f"one more epoch ({steps} steps) would take epsilon to {first:.4g} at delta={self.delta:g}, "
                f"above stop_at_epsilon={self.stop_at_epsilon:g}: nothing was trained. Raise the noise "
                "multiplier (fdp_tf.make_private(..., target_epsilon=...) chooses it) or the budget")
        planned = self.model.projected_epsilon(self.delta, steps * epochs, self.accountant)
        if planned > self.stop_at_epsilon:
            warnings.warn(
                f"the planned {epochs} epochs would end at epsilon <= {planned:.4g} at delta={self.delta:g}, "
                f"above stop_at_epsilon={self.stop_at_epsilon:g}: training will stop after the last epoch "
                "within it", UserWarning, stacklevel=2)

    def epsilon(self) -> float:
        """Epsilon of everything in the model's ledger (cached per ledger)."""
        ledger = self.model.ledger
        if ledger not in self._cache:
            self._cache[ledger] = ledger.epsilon(self.delta, self.accountant)
        return self._cache[ledger]

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs[self.log_key] = self.epsilon()
        if self.stop_at_epsilon is None or epoch + 1 >= int(self.params.get("epochs") or 0):
            return
        steps = self.params.get("steps")
        if not steps:  # an input of unknown length: this epoch's steps
            steps = self.model.ledger.steps - getattr(self, "_steps_at_epoch_start", 0)
        following = self.model.projected_epsilon(self.delta, int(steps), self.accountant)
        if following > self.stop_at_epsilon:
            self.model.stop_training = True
            self.stopped_epoch = epoch
            warnings.warn(
                f"PrivacyCallback stopped training after epoch {epoch + 1}: the next would take epsilon from "
                f"{self.epsilon():.4g} to {following:.4g} at delta={self.delta:g}, above stop_at_epsilon="
                f"{self.stop_at_epsilon:g}", UserWarning, stacklevel=2)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.stop_at_epsilon is not None and not self.params.get("steps"):
            self._steps_at_epoch_start = self.model.ledger.steps
