"""A first-choice per-example method that crashes inside TensorFlow on a first step.

``"auto"`` picks a per-example method (pfor, forward mode, the layer taps) and the first
step of every trace checks it on its batch (:mod:`fdp_tf.verify`) before anything is
released. Some methods do not fail the check but crash inside TensorFlow while it runs
(pfor through a grouped ``Conv1D`` or ``Conv3D``: ``InvalidArgumentError`` from a
``Conv2DBackpropFilter`` of the wrong shape). Nothing was released then, so the method's
fallback, which works for any model (the per-example loop, or the double vjp), is used
from now on, on every path:

* ``fit`` (:func:`guarded_train_function`): warns, restores the non-trainable weights and
  seed states the crashed step changed, trains the next batch (the consumed one is owed
  at the end);
* an eager custom loop (:func:`retried_after_crash`): warns and computes the same step
  again with the fallback;
* a user's ``tf.function``: the crash surfaces as TensorFlow's error, and the step's
  checks had marked the first choice as under probe before running it
  (:class:`fdp_tf.verify.StepChecks`), so the next call of the same function uses the
  fallback. Not restored there: a non-trainable weight that the probe's passes wrote
  before the crash (only a layer that writes one in training, which every step refuses);
* ``train_on_batch`` and several replicas: a ``ValueError`` that says what to do.

A method the user chose explicitly has no fallback: its crash is a ``ValueError`` naming
the method that works for any model.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, TypeVar

import numpy as np
import tensorflow as tf

from fdp_tf.introspection import seed_states, writable_weights
from fdp_tf.refusals import as_value_error
from fdp_tf.verify import SLOTS, methods, raise_recorded_refusals

__all__ = ["XLA_FAILED", "engage_fallback", "guarded_train_function", "retried_after_crash"]

T = TypeVar("T")

#: What TensorFlow's error says when a graph could not be compiled by XLA.
XLA_FAILED = "tf2xla conversion failed"


def engage_fallback(optimizer: Any, model: Any, err: BaseException | None = None) -> str | None:
    """After a step that crashed inside TensorFlow in a trace's first run, before the step
    computed its gradient once (in the probe, or in the first-choice method: pfor through
    a Conv3D with groups, the double vjp through a ``tf.cond`` whose branches differ in
    shape), or while a probe ran the first choice's check: use the fallback from now on.
    Returns the abandoned method, or ``None`` if the crash is not the method's (every trace
    that ran computed its gradient before, no check was under way) or the method is the
    per-example loop, the reference of every other. A method the user chose (no fallback)
    that crashed so raises a ``ValueError`` naming the one to choose instead."""
    checks = getattr(optimizer, "_dp_step_checks", None)
    if checks is None or float(checks.failed.numpy()) > 0.5:
        return None
    probing = float(checks.probing.numpy()) > 0.5
    if not probing and not checks.first_runs() and checks.traces < SLOTS:
        return None  # every trace that ran computed its gradient before: the crash is not the method's
    kind, primary, fallback = methods(optimizer, model)
    if primary == "loop":
        return None  # a crash of the reference is the model's or the data's, not a method's
    if fallback is None:
        advice = ("per_example_method='loop'" if kind == "exact" else
                  "jvp_method='loop'" if primary == "double_vjp" else "jvp_method='double_vjp' or 'loop'")
        what = "per-example" if kind == "exact" else "JL"
        cause = "" if err is None else f" ({type(err).__name__}: {first_line(err)})"
        raise ValueError(
            f"the {what} method {primary!r} crashed inside TensorFlow on this model's first step{cause}; "
            f"nothing was released. Choose {advice}, which works for any model") from err
    checks.failed.assign(1.0)
    checks.probing.assign(0.0)
    return primary


def retried_after_crash(step: Callable[[], T], optimizer: Any, model: Any) -> T:
    """``step()``; eagerly, if the first-choice method crashed inside TensorFlow before
    anything was released, the same step again with the fallback (used from now on).
    In a graph nothing has run yet: the crash, if any, comes when the graph runs."""
    if not tf.executing_eagerly():
        return step()
    try:
        return step()
    except tf.errors.OpError as err:
        if as_value_error(err) is not None:
            raise
        abandoned = engage_fallback(optimizer, model, err)
        if abandoned is None:
            raise
        warnings.warn(
            f"the per-example method {abandoned!r} crashed on this model's first step "
            f"({type(err).__name__}: {first_line(err)}); nothing was released, and the step is "
            "computed again with its fallback, used from now on", RuntimeWarning, stacklevel=4)
    return step()


def _pending(optimizer: Any) -> bool:
    """Whether a step may still probe (so may crash or be refused inside the probe)."""
    checks = getattr(optimizer, "_dp_step_checks", None)
    return checks is None or checks.pending_on_host()


def guarded_train_function(function: Callable[[Any], Any], model: Any) -> Callable[[Any], Any]:
    """Wrap a Keras training function of a ``PrivateModel``:

    * a run-time refusal (an ``InvalidArgumentError`` carrying
      :data:`fdp_tf.refusals.REFUSED`) is raised as the ``ValueError`` it is;
    * a first step that crashed inside TensorFlow while its trace was unverified (pfor
      through a Conv3D with groups) released nothing: the non-trainable weights and seed
      states its passes changed are restored (its own restore did not get to run; so they
      are after a refusal of such a step), the method's
      fallback is engaged and the next batch trained, and the epoch ends when Keras
      counts it should (the batch the crash consumed is owed at the end of the data);
    * any later step that stopped with an error inside TensorFlow leaves the weights a step
      may write (:func:`fdp_tf.introspection.writable_weights`) as they were before it (a
      copy on the host, taken before every step of a model that has such weights).
    """
    owed = [0]
    last: list[Any] = [None]
    writable: list[Any] = [None]  # walking the layers takes ~2 ms: once

    def train_function(iterator: Any) -> Any:
        # what a crash would leave written: the weights and the dropout seeds the step's passes
        # wrote before it (its own restore never runs), so the retry is a clean first try. On
        # a later step, the weights a step may write at all (a user's running statistic): an
        # abort that is not a refusal (a kernel's error on the data, memory) stops the step
        # before its restore, and what it wrote would stay in the model
        if _pending(model.optimizer):
            state = [*model.base_model.non_trainable_weights, *seed_states(model.base_model)]
        else:
            if writable[0] is None:  # the model is built by now (its first step ran)
                writable[0] = writable_weights(model.base_model)
            state = [v for v in writable[0] if not v.trainable]
        before = [np.array(v.numpy(), copy=True) for v in state]
        try:
            logs = function(iterator)
            raise_recorded_refusals(model.optimizer)  # the refusals XLA could not raise
        except StopIteration:
            if owed[0] and last[0] is not None:
                owed[0] -= 1
                return last[0]
            raise
        except tf.errors.OpError as err:
            # a crash, or a refusal raised before the step's own restore ran (a loss with one
            # entry per batch, met by the probe's first pass), left what the passes wrote
            for v, value in zip(state, before):
                v.assign(value)
            refusal = as_value_error(err)
            if refusal is not None:
                _forget_recorded_refusals(model.optimizer)
                raise refusal from err
            if XLA_FAILED in str(err):  # nothing ran: the step did not compile
                raise ValueError(
                    "the private step of this model does not compile with XLA (jit_compile=True): "
                    f"{first_line(err)}. Nothing was trained; compile the model with "
                    "jit_compile=False") from err
            abandoned = engage_fallback(model.optimizer, model.base_model, err)
            if abandoned is None:
                raise
            if model.distribute_strategy.num_replicas_in_sync > 1:
                # an aborted collective poisons every later one of this process
                raise ValueError(
                    f"the per-example method {abandoned!r} crashed on this model's first step "
                    f"({type(err).__name__}) under a tf.distribute strategy with several "
                    "replicas, where the step cannot be retried; nothing was released. Choose "
                    "the method that works for this model explicitly (per_example_method='loop' "
                    "or jvp_method='double_vjp') in a new process") from err
            if inspect.isgenerator(iterator):  # train_on_batch: its one batch is spent
                raise ValueError(
                    f"the per-example method {abandoned!r} crashed on this model's first step "
                    f"({type(err).__name__}); nothing was released, and its fallback is used "
                    "from now on: run the step again") from err
            warnings.warn(
                f"the per-example method {abandoned!r} crashed on this model's first step "
                f"({type(err).__name__}); nothing was released, and the next batch is trained "
                "with its fallback, used from now on", RuntimeWarning, stacklevel=2)
            try:
                logs = function(iterator)
                raise_recorded_refusals(model.optimizer)
            except tf.errors.OpError as again:
                refusal = as_value_error(again)
                if refusal is not None:
                    _forget_recorded_refusals(model.optimizer)
                    raise refusal from again
                raise
            owed[0] += 1
        last[0] = logs
        return logs

    train_function._fdp_guarded = True  # type: ignore[attr-defined]
    return train_function


def _forget_recorded_refusals(optimizer: Any) -> None:
    """The refusal just raised by an assertion: do not raise it again."""
    try:
        raise_recorded_refusals(optimizer)
    except ValueError:
        pass


def first_line(err: BaseException) -> str:
    """The line of a TensorFlow error that says what failed (not its stack trace)."""
    lines = [line.strip() for line in str(getattr(err, "message", err)).splitlines()]
    useful = [line for line in lines if line and not line.startswith(("Detected at", "File ", "Stack trace",
                                                                        "[[", "tf2xla", "<stack", "Graph execution"))]
    return (useful[0] if useful else type(err).__name__).rstrip(".")[:300]
