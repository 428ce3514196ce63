"""Epsilon during ``fit``: a Keras callback backed by ``fdp.PLDAccountant``.

After n private steps of an optimizer whose single step is the mechanism
``m`` (``fdp.JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p)`` for
DP-SGD-JL / DP-Adam-JL, ``fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p)``
for exact clipping), the reported value is

    epsilon = fdp.PLDAccountant().compose(m, steps=n).get_epsilon(delta)

a certified upper bound (seed, Theorem "final privacy curve": the
composition of n Poisson-subsampled steps, both neighbouring directions).
"""

from __future__ import annotations

import math
from typing import Any

import keras

from fdp._validation import check_delta, check_integer, check_sampling_rate

__all__ = ["PrivacyCallback", "compute_epsilon"]


def compute_epsilon(
    optimizer: Any, *, delta: float, sampling_rate: float, steps: int | None = None
) -> float:
    """Upper bound on epsilon of ``optimizer`` after ``steps`` private steps.

    Args:
      optimizer: a :class:`fdp_tf.DPOptimizer`.
      delta: target delta in (0, 1).
      sampling_rate: Poisson sampling rate p = B / N in (0, 1].
      steps: number of steps; default the optimizer's ``dp_steps``.

    Returns:
      0.0 before any step, ``inf`` when noise_multiplier is 0, otherwise
      ``fdp.PLDAccountant().compose(optimizer.mechanism(p), steps=n).get_epsilon(delta)``.
    """
    from fdp_tf.optimizers import DPOptimizer

    if not isinstance(optimizer, DPOptimizer):
        raise ValueError(
            f"optimizer must be an fdp_tf DP optimizer to account privacy; got "
            f"{type(optimizer).__name__}"
        )
    delta = check_delta(delta)
    sampling_rate = check_sampling_rate(sampling_rate)
    n = optimizer.steps if steps is None else check_integer("steps", steps, low=0)
    if n == 0:
        return 0.0
    if optimizer.noise_multiplier == 0:
        return math.inf
    import fdp

    accountant = fdp.PLDAccountant().compose(optimizer.mechanism(sampling_rate), steps=n)
    return float(accountant.get_epsilon(delta=delta))


class PrivacyCallback(keras.callbacks.Callback):
    """Puts ``epsilon`` (an upper bound at ``delta``) into the epoch logs.

    Keras's progress bar and ``History`` then show it beside the loss. Place it
    in ``callbacks=[...]``; it runs before the built-in ``History`` and
    progress bar, which therefore see the value.

    Args:
      delta: target delta in (0, 1), e.g. 1e-5 or below 1/N.
      sampling_rate: Poisson rate p = B / N. ``None`` takes the rate that
        ``PrivateModel.fit`` recorded from a :func:`fdp_tf.poisson_batches`
        dataset (or batch_size / N for arrays).
      log_key: the name in the logs (default ``"epsilon"``).

    Raises:
      ValueError: at the start of training, if the optimizer is not a DP
        optimizer or no sampling rate is known.
    """

    def __init__(
        self, *, delta: float, sampling_rate: float | None = None, log_key: str = "epsilon"
    ) -> None:
        super().__init__()
        self.delta = check_delta(delta)
        self.sampling_rate = None if sampling_rate is None else check_sampling_rate(sampling_rate)
        self.log_key = log_key
        self._cache: dict[tuple[int, float], float] = {}

    def _rate(self) -> float:
        rate = self.sampling_rate
        if rate is None:
            rate = getattr(self.model, "sampling_rate", None)
        if rate is None:
            raise ValueError(
                "sampling_rate is unknown: pass PrivacyCallback(sampling_rate=B/N, ...) "
                "or train on fdp_tf.poisson_batches(...) data"
            )
        return check_sampling_rate(rate)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        from fdp_tf.optimizers import DPOptimizer

        if not isinstance(self.model.optimizer, DPOptimizer):
            raise ValueError(
                "PrivacyCallback needs a DP optimizer (fdp_tf.DPAdamJL, ...); the model's "
                f"optimizer is {type(self.model.optimizer).__name__}"
            )
        self._rate()

    def epsilon(self) -> float:
        """Epsilon for the optimizer's current step count and sampling rate (cached)."""
        optimizer = self.model.optimizer
        key = (optimizer.steps, self._rate())
        if key not in self._cache:
            self._cache[key] = compute_epsilon(
                optimizer, delta=self.delta, sampling_rate=key[1], steps=key[0]
            )
        return self._cache[key]

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs[self.log_key] = self.epsilon()
