"""What ``fit`` vouches for: one release per step of its own loop (:mod:`fdp_tf.odometer`).

:func:`booked_as_fit` wraps Keras's training function so that the booking knows when
Keras's ``fit`` of the model (not a callback, not ``train_on_batch``) calls it, and
:func:`armed_step` arms each training step once, so that the step's first release is
booked in fit's segment and any other release at rate 1.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from fdp_tf.odometer import booking_of

__all__ = ["armed_step", "booked_as_fit"]


def booked_as_fit(function: Callable[[Any], Any], model: Any) -> Callable[[Any], Any]:
    """Keras's training function of ``model``: while Keras's ``fit`` of this model calls
    it (its own loop, not a callback or ``train_on_batch``), the booking's flag says so,
    and each step's first release is booked as fit's (:func:`armed_step`)."""

    def train_function(iterator: Any) -> Any:
        booking = booking_of(getattr(model, "optimizer", None))
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        own = (booking is not None and getattr(model, "_fdp_fit_sampling", None) is not None
               and caller is not None and caller.f_code.co_name == "fit" and caller.f_locals.get("self") is model)
        if not own:
            return function(iterator)
        booking.fit_running.assign(1)
        try:
            return function(iterator)
        finally:
            booking.fit_running.assign(0)
            booking.disarm()

    train_function._fdp_guarded = getattr(function, "_fdp_guarded", False)  # type: ignore[attr-defined]
    return train_function


def armed_step(train_step: Callable[..., Any]) -> Callable[..., Any]:
    """``train_step`` arming the booking at its start (once per step at run time: a step
    calling ``super().train_step``, or another step traced on its own, does not arm it
    again), so that one release per step of fit's loop is fit's."""

    @functools.wraps(train_step)
    def step(self: Any, data: Any) -> Any:
        booking = booking_of(getattr(self, "optimizer", None))
        if booking is None:
            return train_step(self, data)
        booking.enter_step()
        logs = train_step(self, data)
        booking.exit_step()  # not reached if the step raises: disarm() resets the depth
        return logs

    return step
