"""The privacy odometer: the private steps a model ran, which no restore can take back.

The ledger used to be a model weight counted in ``PrivateModel.train_step``: restoring
earlier weights (EarlyStopping's ``restore_best_weights``, ``BackupAndRestore``,
``load_weights``, ``set_weights``) restored an earlier ledger, and steps released by a
custom ``train_step`` or loop were not counted at all. Now (issue 26):

* Every DP optimizer has a :class:`Booking`. ``DPOptimizer.compute_private_gradients``,
  where the noised gradient leaves the optimizer (``apply`` takes nothing else), adds 1
  to its counter in the graph, whoever calls it (``fit``, a custom ``train_step``, a
  custom loop, ``train_on_batch``) and however the gradient is then applied. The counter
  is not a Keras weight: no checkpoint holds it and no restore writes it. On the host the
  booking cuts the count into segments, one per sampling context: a segment opens when
  ``fit`` or ``open_segment`` says how the batches are drawn and closes when that ends.
  Steps outside such a context have no sampling fdp_tf can vouch for and are booked at
  rate 1 (no amplification), with a :class:`fdp_tf.SamplingWarning`.
* ``fit`` vouches for one release per step of its own loop, and nothing else: each
  training step (``train_step``, a subclass's too; :mod:`fdp_tf.fit_booking`) arms a flag in the graph only while
  Keras's ``fit`` of this model runs the training function, and the first release of the
  step spends it on a second counter. Any other release during ``fit`` — a callback's
  ``private_gradients``, ``train_on_batch`` or training function on rows it chose, a
  function traced inside a step and called again elsewhere, a second release in one
  step — is booked at rate 1, in a companion segment of fit's.
* Every ``PrivateModel`` has an :class:`Odometer`: the bookings of every optimizer it
  was compiled with, plus every segment of every ledger table restored into it. Each
  segment has a random id. A restored row with one of the model's own ids is already
  counted live; any other id is kept with the largest step count seen for it (a later
  snapshot of the same segment). So a restore adds the history it brings, and a
  restore of this process's own earlier state adds nothing and removes nothing.

The ``dp_ledger`` weight that files carry is a copy: :meth:`Odometer.sync` merges
whatever it holds (a restore may have written it) and then writes the odometer into it.
"""

from __future__ import annotations

import dataclasses
import secrets
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fdp_tf.ledger import MAX_SEGMENTS, PrivacyLedger, Segment
from fdp_tf.sampling import PoissonSampling, SamplingWarning
from fdp_tf.verify import raise_recorded_refusals

__all__ = ["Booking", "Odometer", "booking_of"]

HOW_TO_AMPLIFY = (
    "For an amplified, certified epsilon train with fit on arrays or on "
    "fdp_tf.poisson_batches(x, y, expected_batch_size=B), or call "
    "model.open_segment(fdp_tf.PoissonSampling(num_examples=N, expected_batch_size=B)) before "
    "steps on batches drawn that way"
)


def new_segment_id() -> int:
    """A random non-zero id below 2**52, exact in the float64 table."""
    return secrets.randbits(52) | 1


def _same_settings(a: Segment, b: Segment) -> bool:
    return a.same_mechanism(b) and (a.l2_norm_clip, a.expected_batch_size) == (b.l2_norm_clip, b.expected_batch_size)


@dataclasses.dataclass
class _Entry:
    """One segment of a booking: ``done`` steps before its last opening, plus the counter
    minus ``base`` while it is open."""

    segment: Segment  # settings and id (its ``steps`` is not used)
    vouched: bool  # False: the sampling is unknown, booked at rate 1
    base: int | None  # counter value when last opened; None once closed
    done: int = 0
    warned: bool = False
    # fit's segments: the fit counter when last opened, and the rate-1 companion that
    # books the releases made during fit beyond one per step of fit's own loop
    fit_base: int | None = None
    strays: "_Entry | None" = None


class Booking:
    """The private steps one DP optimizer released in this process, by segment.

    Args:
      optimizer: the :class:`fdp_tf.DPOptimizer` (its mechanism, C and B label segments).
    """

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer
        with tf.init_scope():  # plain (untracked) variables: no checkpoint or restore touches them
            self.counter = keras.Variable(0, dtype="int64", trainable=False, name="dp_released",
                                          aggregation="only_first_replica")
            # the releases fit vouches for: one per step of its own loop
            self.fit_counter = keras.Variable(0, dtype="int64", trainable=False, name="dp_released_by_fit",
                                              aggregation="only_first_replica")
            # 1 while Keras's fit of the model runs its training function (set on the host)
            self.fit_running = keras.Variable(0, dtype="int64", trainable=False, name="dp_fit_running",
                                              aggregation="only_first_replica")
            # 1 from a step's start (if fit runs it) until its first release
            self.fit_armed = keras.Variable(0, dtype="int64", trainable=False, name="dp_fit_armed",
                                            aggregation="only_first_replica")
            # run-time nesting of armed train_steps: only the outermost arms (a step traced
            # on its own and called inside another must not arm it again)
            self.step_depth = keras.Variable(0, dtype="int64", trainable=False, name="dp_step_depth",
                                             aggregation="only_first_replica")
        self._entries: list[_Entry] = []
        self._current = self._start(None, base=0)
        self._mechanism = self._current.segment  # sigma, r: fixed (traced steps bake them in)

    @property
    def released(self) -> int:
        """Private steps released by the optimizer in this process."""
        return int(self.counter.numpy())

    def release(self) -> None:
        """Book one private release (``compute_private_gradients``; runs in the graph)."""
        self._check_mechanism()
        if not self._current.vouched:  # eagerly, or once when the step is traced
            self._warn(self._current, None)
        self.counter.assign_add(1)
        armed = tf.identity(self.fit_armed.value)  # read before the reset below
        self.fit_counter.assign_add(armed)
        with tf.control_dependencies([armed]):
            self.fit_armed.assign(tf.zeros_like(armed))

    def enter_step(self) -> None:
        """At a training step's start (in the graph): the outermost step's first release is
        fit's if fit's own loop runs the step."""
        self.step_depth.assign_add(1)
        outermost = tf.equal(tf.identity(self.step_depth.value), 1)
        self.fit_armed.assign(tf.where(outermost, tf.identity(self.fit_running.value),
                                       tf.identity(self.fit_armed.value)))

    def exit_step(self) -> None:
        self.step_depth.assign_sub(1)

    def disarm(self) -> None:
        """On the host, after fit's training function returns (or raised): a step that
        released nothing leaves nothing armed for a release elsewhere."""
        self.fit_armed.assign(0)
        self.step_depth.assign(0)

    def open(self, sampling: PoissonSampling | None, *, warned: bool = False, fit: bool = False) -> None:
        """Book the next steps at ``sampling`` (``None``: unknown, rate 1); between steps.

        ``warned``: the caller already told the user these steps get no amplification.
        ``fit``: only one release per step of fit's own loop counts at ``sampling``
        (:func:`armed_step`); the others go to the segment's rate-1 companion.
        """
        if not tf.executing_eagerly():
            raise ValueError(
                "open_segment and fit cut the privacy ledger by reading the optimizer's step "
                "counter: call them outside tf.function"
            )
        self._check_mechanism()
        template = self._template(sampling)  # may refuse: before any state changes (red team)
        self.disarm()
        now, by_fit, current = self.released, int(self.fit_counter.numpy()), self._current
        run, strays = self._split(current, now, by_fit)
        current.done, current.base, current.fit_base = _charged(current.segment, current.done + run), None, None
        if strays:
            companion = current.strays
            companion.done += strays
            if companion not in self._entries:
                self._entries.insert(self._entries.index(current), companion)
        if current.done == 0:
            self._entries.remove(current)
        last = self._entries[-1] if self._entries else None
        if (last is not None and last.vouched == (sampling is not None) and (last.strays is not None) == fit
                and _same_settings(last.segment, template)):
            last.base, self._current = now, last  # the same settings again: continue it
        else:
            self._current = self._start(sampling, base=now)
            if fit:
                self._current.strays = _Entry(self._template(None), False, None)
        if fit:
            self._current.fit_base = by_fit
        self._current.warned = self._current.warned or warned

    def check(self, sampling: Any) -> None:
        """Refuse a sampling this optimizer cannot be booked at (DP-SGD-JL on fixed-size
        batches; a noise multiplier too small for random allocation), changing nothing."""
        self._template(sampling)

    def segments(self) -> list[Segment]:
        """The segments with at least one step (warns once for steps of unknown sampling).

        Raises ``ValueError`` first for a step refused inside a compiled graph (a custom
        loop under ``jit_compile``) that nothing has raised yet: its update was zeros,
        but the run it belongs to did not do what its code says."""
        raise_recorded_refusals(self._optimizer)
        now, by_fit, out = self.released, int(self.fit_counter.numpy()), []
        current = self._current
        run, strays = self._split(current, now, by_fit)
        entries = list(self._entries)
        if strays and current.strays not in entries:
            entries.insert(entries.index(current), current.strays)
        for entry in entries:
            steps = entry.done + (_charged(entry.segment, run) if entry is current else 0)
            steps += strays if entry is current.strays else 0
            if steps > 0:
                if not entry.vouched:
                    self._warn(entry, steps)
                out.append(dataclasses.replace(entry.segment, steps=steps))
        return out

    @staticmethod
    def _split(entry: _Entry, now: int, by_fit: int) -> tuple[int, int]:
        """Releases of the open ``entry`` since it opened: (booked at its sampling, strays
        at rate 1). For fit, only the armed releases (one per step of its loop) are its own."""
        if entry.base is None:
            return 0, 0
        total = now - entry.base
        if entry.fit_base is None:
            return total, 0
        own = by_fit - entry.fit_base
        return own, total - own

    def ids(self) -> set[int]:
        ids = {entry.segment.segment_id for entry in self._entries}
        return ids | {entry.strays.segment.segment_id for entry in self._entries if entry.strays is not None}

    def warn_if_unknown(self) -> None:
        """Warn now (once per segment) if the next steps have no known sampling."""
        if not self._current.vouched:
            self._warn(self._current, None)

    def _check_mechanism(self) -> None:
        was, now = self._mechanism, self._optimizer.segment(1.0)
        if not now.same_mechanism(was):
            raise ValueError(
                f"the noise settings of {type(self._optimizer).__name__} changed after it was "
                f"created (noise_multiplier {was.noise_multiplier} -> {now.noise_multiplier}, "
                f"jl_projections {was.jl_projections} -> {now.jl_projections}); steps already "
                "traced keep the old ones, so they would be booked wrongly. Compile with a new "
                "optimizer to change them"
            )

    def _start(self, sampling: PoissonSampling | None, base: int) -> _Entry:
        entry = _Entry(self._template(sampling), sampling is not None, base)
        self._entries.append(entry)
        return entry

    def _template(self, sampling: Any) -> Segment:
        optimizer = self._optimizer
        rate = 1.0 if sampling is None else sampling.sampling_rate
        template = dataclasses.replace(
            optimizer.segment(rate), l2_norm_clip=float(optimizer.l2_norm_clip),
            expected_batch_size=int(optimizer.expected_batch_size or 0), segment_id=new_segment_id())
        if sampling is not None and sampling.scheme != "poisson":
            jl = template.kind == "jl" and sampling.scheme == "random_allocation"
            if template.kind != "gaussian" and not jl:
                raise ValueError(f"{sampling.scheme} batches are accounted for DP-SGD (exact clipping) only; "
                                 f"got {type(optimizer).__name__}: train it on fdp_tf.poisson_batches"
                                 f"{' or fdp_tf.random_allocation_batches' if template.kind == 'jl' else ''}")
            template = dataclasses.replace(template, sampling=sampling.scheme, scheme_size=sampling.scheme_size)
            template.mechanism()  # a scheme fdp cannot account (too little noise) is refused before a step
        return template

    def _warn(self, entry: _Entry, steps: int | None) -> None:
        if entry.warned:
            return
        entry.warned = True
        what = "private steps" if steps is None else f"{steps} private step(s)"
        warnings.warn(
            f"{what} of {type(self._optimizer).__name__} ran on batches whose sampling fdp_tf "
            "cannot vouch for (train_on_batch, or a custom loop or train_step outside fit and "
            "without model.open_segment): they are booked with no amplification, at sampling "
            f"rate 1. {HOW_TO_AMPLIFY}",
            SamplingWarning,
            stacklevel=3,
        )


def _charged(segment: Segment, steps: int) -> int:
    """Steps charged for ``steps`` run since a segment opened: for random allocation whole
    epochs (each opening starts a new pass over the sampler; the steps of a pass cut short
    reveal no more than the whole pass), else the steps."""
    if segment.sampling != "random_allocation":
        return steps
    return -(-steps // segment.scheme_size) * segment.scheme_size


def booking_of(optimizer: Any) -> Booking | None:
    """The booking of a DP optimizer; ``None`` for any other optimizer."""
    return getattr(optimizer, "_dp_booking", None)


class _NonPrivateTally:
    """Steps of a non-private optimizer (comparison runs): epsilon is infinite after one.

    Keras's optimizers have no release hook, so the count is read from ``iterations``,
    keeping its largest advance seen (a restore may lower it; one step decides anyway).
    """

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer
        self._base = self._iterations()
        self._steps = 0
        self._segment = Segment("non_private", 0.0, 0, 1.0, 0, segment_id=new_segment_id())

    def _iterations(self) -> int:
        return int(self._optimizer.iterations.numpy())

    def segments(self) -> list[Segment]:
        self._steps = max(self._steps, self._iterations() - self._base)
        return [dataclasses.replace(self._segment, steps=self._steps)] if self._steps > 0 else []

    def ids(self) -> set[int]:
        return {self._segment.segment_id}


class Odometer:
    """Everything a model trained: its optimizers' bookings and every restored record."""

    def __init__(self) -> None:
        self._sources: list[Booking | _NonPrivateTally] = []
        self._restored: dict[int, Segment] = {}  # by segment id: the largest snapshot seen
        self._merged_ids: set[int] = set()  # ids of rows this odometer wrote merged
        self._token = new_segment_id()

    def attach(self, optimizer: Any) -> None:
        """Count every step ``optimizer`` runs from now on (called by ``compile``)."""
        source = booking_of(optimizer) or _NonPrivateTally(optimizer)
        if not any(s is source for s in self._sources):
            self._sources.append(source)

    def segments(self) -> list[Segment]:
        """Every segment with steps: the restored ones, then this process's own."""
        own = [segment for source in self._sources for segment in source.segments()]
        return [*self._restored.values(), *own]

    def ledger(self) -> PrivacyLedger:
        """The segments, adjacent ones with the same settings shown as one."""
        shown: list[Segment] = []
        for segment in self.segments():
            if shown and _same_settings(shown[-1], segment):
                shown[-1] = dataclasses.replace(shown[-1], steps=shown[-1].steps + segment.steps, segment_id=0)
            else:
                shown.append(segment)
        return PrivacyLedger(tuple(shown))

    def absorb(self, table: Any) -> None:
        """Merge a restored ledger table: a foreign segment is added, never max'ed away."""
        own = set().union(*(source.ids() for source in self._sources), self._merged_ids)
        for segment in PrivacyLedger.from_table(table).segments:
            # a row without an id (written by hand) is keyed by its content: idempotent
            key = segment.segment_id or hash(tuple(segment.row()))
            if segment.steps <= 0 or key in own:
                continue
            kept = self._restored.get(key)
            if kept is None or kept.steps < segment.steps:
                self._restored[key] = segment

    def table(self) -> np.ndarray:
        """The table files carry; beyond MAX_SEGMENTS rows, one row per mechanism."""
        segments = self.segments()
        if len(segments) > MAX_SEGMENTS:
            merged: dict[tuple[Any, ...], Segment] = {}
            for s in segments:
                key = (s.kind, s.noise_multiplier, s.jl_projections, s.sampling_rate, s.sampling, s.scheme_size)
                # a fixed id per mechanism: later files carry later snapshots of the same row
                ident = hash((self._token, key)) % (2**52 - 1) + 1
                self._merged_ids.add(ident)
                steps = merged[key].steps if key in merged else 0
                merged[key] = dataclasses.replace(s, steps=steps + s.steps, segment_id=ident)
            segments = list(merged.values())
        return PrivacyLedger(tuple(segments)).table()

    def sync(self, variable: Any) -> PrivacyLedger:
        """Merge what the ledger weight holds, write the odometer into it; the ledger."""
        self.absorb(variable.numpy())
        variable.assign(self.table())
        return self.ledger()
