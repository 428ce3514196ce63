"""Epsilon during ``fit``: a Keras callback backed by the model's privacy ledger.

After every epoch the reported value is

    model.ledger.epsilon(delta)
      = fdp.PLDAccountant().compose(m_1, steps=n_1).compose(m_2, steps=n_2)... .get_epsilon(delta)

over the segments the model actually ran (seed, Theorem "final privacy curve" for each:
the composition of n Poisson-subsampled steps, both neighbouring directions): a
certified upper bound on everything spent, across fits, recompiles and reloads.
"""

from __future__ import annotations

from typing import Any

import keras

from fdp._validation import check_delta
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

    Raises:
      ValueError: at the start of training, if the model is not an
        :class:`fdp_tf.PrivateModel` (only it keeps a ledger).
    """

    def __init__(self, *, delta: float, log_key: str = "epsilon", accountant: Any = None, **legacy: Any) -> None:
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
        self._cache: dict[PrivacyLedger, float] = {}

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not hasattr(self.model, "ledger"):
            raise ValueError(
                "PrivacyCallback needs an fdp_tf.PrivateModel (it reads the model's privacy "
                f"ledger); got {type(self.model).__name__}. Wrap it: fdp_tf.make_private(model, ...)"
            )

    def epsilon(self) -> float:
        """Epsilon of everything in the model's ledger (cached per ledger)."""
        ledger = self.model.ledger
        if ledger not in self._cache:
            self._cache[ledger] = ledger.epsilon(self.delta, self.accountant)
        return self._cache[ledger]

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs[self.log_key] = self.epsilon()
