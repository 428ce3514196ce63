"""A private step that verifies what it assumes before it releases anything.

:meth:`fdp_tf.DPOptimizer.compute_private_gradients` runs :func:`verified_private_gradient`:

1. **non-trainable state** (every step): the model's non-trainable weights are read
   before the step and compared after it (:class:`fdp_tf.guards.StateGuard`);
2. **independence and the per-example method** (the first step of every trace): the
   probe of :mod:`fdp_tf.probes` on that step's batch, before the step's own pass;
3. **the step**, with the method that passed: ``per_example_method="auto"`` falls back
   to the per-example loop when pfor or the layer taps disagree with the batch
   gradient, ``jvp_method="auto"`` to the per-example loop when the taps' projections
   or forward mode's through recurrent loops disagree with it, and to the double vjp
   when forward mode's elsewhere do; an explicitly chosen method that fails is refused;
4. **non-finite examples** dropped (:mod:`fdp_tf.nonfinite`);
5. **the release gated**: the returned gradients depend on every check, so
   ``apply_gradients`` cannot run on a refused step (:mod:`fdp_tf.refusals`).

"Every trace": each trace of the step gets a slot in a per-optimizer flag vector (a
variable out of TensorFlow's tracking, so never saved: a reloaded model is verified
again); the probe runs inside ``tf.cond`` while the slot is unset, i.e. on the first
step whose batch had at least two usable rows, and costs nothing later. Eagerly, all
calls share one slot. Under ``tf.distribute`` the flags are per replica
(``ON_READ``): every replica verifies its own share of the batch.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from fdp_tf.forward import ForwardFn, ForwardPass, PrivateGradient
from fdp_tf.guards import StateGuard
from fdp_tf.nonfinite import single_row_check, without_nonfinite_examples
from fdp_tf.probes import Verdict, method_check, probe, seed_states, signature_fn
from fdp_tf.randomness import num_replicas
from fdp_tf.recurrent_tangents import tangent_unsupported
from fdp_tf.refusals import Check, RefusalRecord, gated, guarding, recording, refuse_unless

__all__ = ["StepChecks", "methods", "raise_recorded_refusals", "step_checks", "verified_private_gradient"]

#: Traces verified separately; a later trace is probed on every step (slow, never unsafe).
SLOTS = 64

NONDETERMINISTIC = (
    "the model's training forward pass did not repeat itself on the same batch from the "
    "same Keras seed states, so the check that examples do not interact cannot compare "
    "like with like. Draw random numbers with keras.random and a keras.random.SeedGenerator "
    "(as Keras's own layers do), not with tf.random"
)
MIXED = (
    "the loss or gradient of an example changed when other examples of the batch changed: "
    "a layer or operation mixes the rows of the batch (e.g. a normalisation or softmax over "
    "axis 0, or keras.ops over the batch axis), so no example's contribution is bounded by "
    "the clipping norm. Make every operation act on each example separately (e.g. "
    "LayerNormalization over the feature axes, never axis=0)"
)

SHARED_RANDOMNESS = (
    "this model draws random numbers in training (Dropout, or another layer that advances a "
    "Keras SeedGenerator), and under a tf.distribute strategy with several replicas Keras draws "
    "the same numbers on every replica (the seed state is mirrored): examples at the same "
    "position of different replicas share their dropout masks, and removing one example "
    "moves others to other positions, so no example's contribution is bounded by the "
    "clipping norm. Train it on one replica, or remove the random layers"
)


def _method_message(kind: str, primary: str, fallback: str | None) -> str:
    if kind == "jl" and primary in ("forward", "auto") and fallback is None:
        return ("jvp_method='forward' computes wrong JL projections for this model (they disagree "
                "with the batch gradient; forward mode is wrong through e.g. grouped "
                "convolutions): use jvp_method='double_vjp' or 'auto'")
    if kind == "jl":
        return ("the JL projections of this model disagree with its batch gradient in forward "
                "mode and by the double vjp (a second derivative TensorFlow does not compute): "
                "train it with exact clipping, fdp_tf.DPSGDVanilla(per_example_method='loop')")
    return (f"per_example_method={primary!r} computes wrong per-example gradients for this model "
            "(sum_i w_i g_i disagrees with the gradient of sum_i w_i l_i; pfor is wrong through "
            "e.g. grouped convolutions): use per_example_method='loop' (exact) or 'auto', which "
            "checks the method and falls back to the loop")


class StepChecks:
    """Verification state of one optimizer: which traces passed, and whether its
    first-choice per-example method failed (then the fallback is used for good).

    ``verified[slot]`` is 1 for a trace that passed the probe with the first choice, 2 with
    the fallback: a trace verified with the first choice is probed again if the fallback is
    engaged later (a crash of another trace), so no trace runs a method it did not check.
    ``probing`` is set while a probe runs the first choice's check and cleared when the
    check has run: a first choice that crashed inside TensorFlow (:mod:`fdp_tf.fallback`)
    leaves it set, so a later call of the same graph counts the first choice as failed.
    """

    def __init__(self) -> None:
        kw: dict[str, Any] = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        with tf.init_scope():  # may be created while the first step traces
            self.verified = tf.Variable(tf.zeros([SLOTS]), name="fdp_verified_traces", **kw)
            # 1 for a trace that ran: TensorFlow discards the first trace of a call that
            # created variables, and its slot is never verified
            self.started = tf.Variable(tf.zeros([SLOTS]), name="fdp_started_traces", **kw)
            # 1 for a trace whose step computed its gradient once: a crash before is its method's
            self.finished = tf.Variable(tf.zeros([SLOTS]), name="fdp_finished_traces", **kw)
            self.failed = tf.Variable(0.0, name="fdp_method_failed", **kw)
            self.probing = tf.Variable(0.0, name="fdp_method_probing", **kw)
        self.record = RefusalRecord()
        self.traces = 0
        self.used: set[int] = set()

    # plain Python at trace time: AutoGraph, converting it inside the traced step, failed on the
    # annotated assignment ("Please report this to the TensorFlow team" in a user's tf.function)
    @tf.autograph.experimental.do_not_convert
    def next_slot(self) -> int | None:
        if tf.executing_eagerly():
            slot: int | None = 0
        else:
            self.traces += 1
            slot = self.traces if self.traces < SLOTS else None
        if slot is not None:
            self.used.add(slot)
        return slot

    def start(self, slot: int | None) -> Any:
        """Record that ``slot``'s trace runs (at its step's start): returns the op."""
        if slot is None:
            return None
        return self.started.assign(tf.tensor_scatter_nd_update(
            tf.convert_to_tensor(self.started), [[slot]], [1.0]))

    def finish(self, slot: int | None, grads: Sequence[Any]) -> Any:
        """Record that ``slot``'s step computed ``grads`` (after them): returns the op."""
        if slot is None:
            return None
        after = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
        with tf.control_dependencies([] if tf.executing_eagerly() else after):
            return self.finished.assign(tf.tensor_scatter_nd_update(
                tf.convert_to_tensor(self.finished), [[slot]], [1.0]))

    def first_runs(self) -> list[int]:
        """On the host: the traces that ran but never computed their gradient (a crash
        there, inside the probe or the first-choice method, is the method's)."""
        finished = self.finished.numpy()
        return [s for s in self.live() if finished[s] < 0.5]

    def live(self) -> list[int]:
        """On the host: the slots of traces that ran."""
        started = self.started.numpy()
        return [s for s in sorted(self.used) if started[s] > 0.5]

    def pending(self, slot: int | None, failed_before: tf.Tensor) -> tf.Tensor:
        """Whether ``slot``'s trace still needs the probe: never verified, or verified
        with the first choice and now running the fallback (a crash elsewhere chose it)."""
        if slot is None:
            return tf.constant(True)
        return self.verified[slot] < tf.where(failed_before, 2.0, 1.0)

    def mark(self, slot: int | None, done: tf.Tensor, on_fallback: tf.Tensor) -> Any:
        """Record that ``slot``'s trace passed the probe: 1 with the first choice, 2 with the fallback."""
        if slot is None:
            return None
        level = tf.where(on_fallback, 2.0, 1.0)
        return _when(done, lambda: self.verified.assign(
            tf.tensor_scatter_nd_update(tf.convert_to_tensor(self.verified), [[slot]], [level])))

    def mark_failed(self, failed: tf.Tensor) -> Any:
        return _when(failed, lambda: self.failed.assign(1.0))

    def pending_on_host(self) -> bool:
        """Whether a later step may still run a probe (so may crash or be refused inside it):
        :meth:`pending` of every trace, read on the host."""
        verified, live = self.verified.numpy(), self.live()
        needed = 2.0 if bool(self.failed_before().numpy()) else 1.0
        return self.traces >= SLOTS or not live or any(verified[s] < needed for s in live)

    def failed_before(self) -> tf.Tensor:
        """The first choice failed its check, or crashed while a probe ran it."""
        return tf.logical_or(tf.convert_to_tensor(self.failed) > 0.5, tf.convert_to_tensor(self.probing) > 0.5)


def raise_recorded_refusals(optimizer: Any) -> None:
    """Raise (once) a refusal that a graph recorded but could not raise (under XLA)."""
    checks = getattr(optimizer, "_dp_step_checks", None)
    if checks is not None:
        checks.record.raise_new()


def step_checks(optimizer: Any) -> StepChecks:
    checks = getattr(optimizer, "_dp_step_checks", None)
    if checks is None:
        checks = StepChecks()
        optimizer._dp_step_checks = checks
    return checks


def methods(optimizer: Any, model: Any) -> tuple[str, str, str | None]:
    """(kind, first-choice method, fallback or None) of ``optimizer`` on ``model``."""
    config = optimizer.dp_config
    if config.uses_jl:
        primary = optimizer.resolve_jvp_method(model)
        if config.jvp_method != "auto" or primary in ("double_vjp", "loop"):
            return "jl", primary, None
        # the reference of the taps and of forward mode through recurrent loops is the
        # per-example loop (quick to trace, unlike the double vjp through a loop); forward
        # mode's elsewhere is the double vjp
        through_loops = primary == "layerwise" or (model is not None and tangent_unsupported(model) is None)
        return "jl", primary, ("loop" if through_loops else "double_vjp")
    primary = optimizer.resolve_per_example_method(model)
    return "exact", primary, ("loop" if config.per_example_method == "auto" and primary != "loop" else None)


def verified_private_gradient(
    optimizer: Any,
    forward_fn: ForwardFn,
    variables: Sequence[Any],
    model: Any,
    forward_on_rows: Callable[[tf.Tensor], ForwardPass] | None,
    forward_on_indices: Callable[[tf.Tensor], ForwardPass] | None,
) -> PrivateGradient:
    """One private step of ``optimizer`` with every run-time check (module docstring)."""
    checks = step_checks(optimizer)
    guard = StateGuard(model)  # before anything of the step runs
    # the refusal counters before the step: its release is gated on every check the step noted,
    # wherever it ran (a branch, a loop, a layer's tap) and on every replica; XLA drops the
    # assertions, and a check whose outcome its caller did not gate would else go unheeded
    start = None if tf.executing_eagerly() else checks.record.start()
    slots = set(checks.used)
    # eagerly, what an attempt that fails draws is undone: dropout's seed states (not weights),
    # the step's key (nothing drawn from it was released) and the mark of a probe under way
    # (fdp_tf.fallback decides what a crash means), so a retry is a clean first try
    states = [*seed_states(model), optimizer.rng.state, checks.probing] if tf.executing_eagerly() else []
    seeds = [(s, tf.identity(s)) for s in states]
    # what XLA's dropped assertions do not raise is raised on the host; a refusal anywhere in
    # the step first restores what the step's passes wrote
    with recording(checks.record), guarding(guard):
        try:
            return _verified(checks, guard, start, optimizer, forward_fn, variables, model, forward_on_rows,
                             forward_on_indices)
        except Exception as err:  # noqa: BLE001 - restored, then raised as it was
            # a gradient TensorFlow lacks (fdp_tf.second_order), or eagerly a first choice that
            # crashed inside TensorFlow (fdp_tf.fallback) or a refusal raised before the
            # guard's restore (the probe's first pass), or any other error of the model's code
            # after it wrote a weight: the caller retries, or raises
            if isinstance(err, LookupError):
                checks.used &= slots  # the failed trace's slot was never verified, nor will be
            if tf.executing_eagerly():  # the probe ran: the retry starts where this attempt did
                for state, value in seeds:
                    state.assign(value)
                try:
                    guard.check()  # restores what the attempt changed of the weights, and refuses
                except ValueError:
                    if not isinstance(err, ValueError):  # a refusal already: its own message
                        raise
            raise


def _verified(checks: StepChecks, guard: StateGuard, start: tf.Tensor | None, optimizer: Any, forward_fn: ForwardFn,
              variables: Sequence[Any], model: Any, forward_on_rows: Callable[[tf.Tensor], ForwardPass] | None,
              forward_on_indices: Callable[[tf.Tensor], ForwardPass] | None) -> PrivateGradient:
    # several replicas draw the same Keras random numbers: a step that draws any is refused
    seeds = StateGuard(None, seed_states(model), SHARED_RANDOMNESS) if num_replicas() > 1 else None
    kind, primary, fallback = methods(optimizer, model)
    failed_before = checks.failed_before()
    if forward_on_indices is None:
        # without it nothing can check that examples do not interact: refused, not warned
        raise ValueError(
            "compute_private_gradients needs forward_on_indices, the forward pass on the batch "
            "whose row j is row rows[j] (e.g. lambda rows: forward(tf.gather(x, rows), "
            "tf.gather(y, rows))), to verify that examples do not interact before anything is "
            "released. In a PrivateModel's train_step or a custom loop call "
            "model.private_gradients(x, y) instead, which passes it"
        )
    slot = checks.next_slot()
    variables = list(variables)
    trusted = (lambda forward_fn: tf.constant(True))
    tests = [method_check(kind, primary, variables, model)]
    if fallback is not None:
        tests.append(method_check(kind, fallback, variables, model) if kind == "jl" else trusted)
    signature = signature_fn(variables, model)
    def probed() -> Verdict:
        found = probe(forward_fn, forward_on_indices, signature, tests, seed_states(model),
                      check_primary=tf.logical_not(failed_before),
                      probing=None if fallback is None else checks.probing)
        # booked here, where the probe ran: a later step of the trace does nothing
        done = tf.reduce_all(tf.stack([found.complete, found.deterministic, found.independent,
                                       found.method_ok]))
        # the method verified: the fallback where the first choice failed, before or now
        on_fallback = tf.logical_or(failed_before, tf.logical_not(found.primary_ok))
        book = [checks.mark(slot, done, on_fallback)]
        if fallback is not None:  # its own check passed: use it from now on
            book.append(checks.mark_failed(tf.logical_and(tf.logical_not(found.primary_ok), found.method_ok)))
        book = [b for b in book if b is not None]
        if book and not tf.executing_eagerly():
            with tf.control_dependencies(book):
                return Verdict(*[tf.identity(t) for t in found])
        return found

    started = checks.start(slot)  # before the probe and the methods, which may crash
    with tf.control_dependencies([] if started is None or tf.executing_eagerly() else [started]):
        pending = checks.pending(slot, failed_before)
    verdict = _cond(pending, probed, Verdict.passed)
    primary_failed = tf.logical_not(verdict.primary_ok)

    def run(fwd: ForwardFn, method: str) -> Callable[[], PrivateGradient]:
        return lambda: optimizer._private_gradient(fwd, variables, model, method=method)

    if fallback is None:
        result = run(forward_fn, primary)()
    else:
        result = _select(tf.logical_or(failed_before, primary_failed), run(forward_fn, fallback),
                         run(forward_fn, primary))
    if forward_on_rows is not None:
        rows = tf.shape(result.forward.per_example_losses)[0]
        # the rare rerun without the non-finite rows uses the method that never fails
        again = fallback or primary
        # pfor and the loop backpropagate through the shared batch (0 * inf reaches every row)
        alone = single_row_check(forward_on_rows, variables, rows) if kind == "exact" else None
        result = without_nonfinite_examples(result, lambda keep: run(lambda: forward_on_rows(keep), again)(), alone)
    refusals = (guard.check()  # first: it restores what the step (and the probe) changed
                + (seeds.check() if seeds is not None else [])
                + refuse_unless(verdict.deterministic, NONDETERMINISTIC)
                + refuse_unless(verdict.independent, MIXED)
                + refuse_unless(verdict.method_ok, _method_message(kind, primary, fallback)))
    if start is not None:
        refusals.append(_refused_anywhere(refusals, checks.record, start))
    grads = gated(result.gradients, refusals)
    finished = checks.finish(slot, grads)
    if finished is not None and not tf.executing_eagerly():
        with tf.control_dependencies([finished]):
            grads = [tf.identity(g) for g in grads]
    return PrivateGradient(grads, result.forward, result.norms, result.clip_factors, result.dropped,
                           result.fallbacks)


def _refused_anywhere(refusals: list[Check], record: RefusalRecord, start: tf.Tensor) -> Check:
    """The release is zeros where any check of the step refused it, on *any* replica: those
    returned to the caller and every one noted in ``record`` since ``start`` (under XLA an
    embedding's out-of-range token id, checked in its tap, moved the removal term of an
    example to 1.012 C). Several replicas have no assertions (an aborted collective fails
    every later step); gated on its own checks alone, the other replicas' clipped sums went
    out with their shares of the noise only (std sigma C / B times sqrt((k - 1) / k))."""
    with tf.control_dependencies([op for check in refusals for op in check.ops]):
        here = tf.reduce_all(tf.stack([check.ok for check in refusals] + [record.unchanged_since(start)]))
    context = tf.distribute.get_replica_context()
    if context is None or num_replicas() == 1:  # this is the only copy of the step
        return Check(here, ())
    refused = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(here), tf.float32))
    return Check(tf.equal(refused, 0.0), ())


def _when(pred: tf.Tensor, assign: Callable[[], Any]) -> Any:
    """Run ``assign`` if ``pred``; returns what the release must wait for (graph mode)."""
    if tf.executing_eagerly():
        if bool(pred):
            assign()
        return None

    def run() -> tf.Tensor:
        assign()  # a stateful op in a branch runs with it (automatic control dependencies)
        return tf.constant(True)

    return tf.cond(pred, run, lambda: tf.constant(False))


def _cond(pred: tf.Tensor, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    if tf.executing_eagerly():
        return true_fn() if bool(pred) else false_fn()
    return tf.cond(pred, true_fn, false_fn)


def _select(pred: tf.Tensor, true_fn: Callable[[], PrivateGradient],
            false_fn: Callable[[], PrivateGradient]) -> PrivateGradient:
    """``tf.cond`` over two private steps (same forward function, maybe other methods)."""
    if tf.executing_eagerly():
        return true_fn() if bool(pred) else false_fn()

    def packed(fn: Callable[[], PrivateGradient]) -> Callable[[], tuple]:
        def run() -> tuple:
            r = fn()
            fallbacks = tf.zeros([], tf.int32) if r.fallbacks is None else tf.cast(r.fallbacks, tf.int32)
            dropped = tf.zeros([], tf.int32) if r.dropped is None else tf.cast(r.dropped, tf.int32)
            reg = () if r.forward.regularization is None else r.forward.regularization
            return (list(r.gradients), r.forward.per_example_losses, reg, r.forward.outputs,
                    r.norms, r.clip_factors, dropped, fallbacks)

        return run

    grads, losses, reg, outputs, norms, factors, dropped, fallbacks = tf.cond(pred, packed(true_fn), packed(false_fn))
    return PrivateGradient(list(grads), ForwardPass(losses, None if reg == () else reg, outputs), norms,
                           factors, dropped, fallbacks)
