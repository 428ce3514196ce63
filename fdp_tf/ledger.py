"""What a model's training actually ran, and the epsilon of all of it.

A :class:`PrivacyLedger` is a list of :class:`Segment` s: one mechanism (exact
clipping = subsampled Gaussian, DP-SGD-JL = ``fdp.JL``, or a non-private optimizer)
at one sampling (Poisson at a rate; random allocation with t steps per epoch,
``fdp.RandomAllocation``, charged in whole epochs; fixed-size batches drawn without
replacement, ``fdp.SampledWithoutReplacement``, under replace-one), run for some
number of steps. The epsilon of the whole training is that of the heterogeneous
composition

    fdp.PLDAccountant().compose(m_1, steps=n_1).compose(m_2, steps=n_2)...

(seed, Theorem "final privacy curve", per segment; composition of independent
mechanisms multiplies tradeoff curves), a certified upper bound that is exact for
multi-phase runs: a later phase at a smaller rate is charged at its own rate, not at
the larger one, and never hides an earlier phase.

:class:`fdp_tf.PrivateModel` keeps the ledger in an odometer (:mod:`fdp_tf.odometer`)
fed by the optimizer's release; the table saved with the weights is a copy of it.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fdp._validation import check_delta, check_integer, check_sampling_rate

__all__ = ["MAX_SEGMENTS", "PrivacyLedger", "Segment", "check_relation", "compute_epsilon", "one_relation"]

MAX_SEGMENTS = 64  # rows of the saved table (more segments are merged by mechanism)

# mechanism codes in the saved table
NON_PRIVATE, GAUSSIAN, JL = 0, 1, 2
_KINDS = {NON_PRIVATE: "non_private", GAUSSIAN: "gaussian", JL: "jl"}
FIELDS = 8  # kind, noise_multiplier, jl_projections, sampling_rate, steps, l2_norm_clip,
#            expected_batch_size, segment_id
# The sampling scheme rides in the kind code (code = kind + 10 * scheme: tables written
# before schemes existed hold 0, 1, 2 and read as Poisson) and its size (t for random
# allocation, N without replacement) in the jl_projections column; a JL segment of
# random allocation holds t + r * _JL_SHIFT there (t <= 10^6 < 2^20; exact in float64).
_SCHEMES = ("poisson", "random_allocation", "without_replacement")
_JL_SHIFT = 2**20

# More noise is post-processing of less (add independent noise to the release), so
# epsilon(sigma) <= epsilon(sigma') for every sigma' <= sigma: where the accountant's
# grid overflows at a huge sigma (mu = 1/sigma below its resolution), the ledger
# accounts such segments at a smaller sigma', a valid upper bound that is still ~0.
_HUGE_SIGMA = 1e3


@dataclass(frozen=True)
class Segment:
    """Steps of one mechanism at one sampling rate.

    Attributes:
      kind: ``"gaussian"`` (exact clipping), ``"jl"`` (DP-SGD-JL) or ``"non_private"``.
      noise_multiplier: sigma.
      jl_projections: r for ``"jl"``, else 0.
      sampling_rate: Poisson rate p = B / N of the rows trained on; 1.0 (no
        amplification) where the sampling of the batches is unknown.
      steps: private steps run.
      l2_norm_clip: C (informational: epsilon does not depend on it).
      expected_batch_size: B of the optimizer, 0 if unknown (informational).
      segment_id: random id of the odometer segment this row copies (0 in merged
        views); lets a restore tell a later snapshot of a segment from another one.
      sampling: ``"poisson"`` (each example joins each batch with probability
        ``sampling_rate``), ``"random_allocation"`` (each example in k of the t steps of
        every epoch, ``sampling_rate`` = k / t; ``steps`` is a whole number of epochs, a
        partial one charged whole) or ``"without_replacement"`` (exactly B =
        ``sampling_rate`` * N examples per step; epsilon for replacing one example).
      scheme_size: t for random allocation, N for without replacement, else 0.
    """

    kind: str
    noise_multiplier: float
    jl_projections: int
    sampling_rate: float
    steps: int
    l2_norm_clip: float = field(default=0.0, compare=False)
    expected_batch_size: int = field(default=0, compare=False)
    segment_id: int = field(default=0, compare=False)
    sampling: str = "poisson"
    scheme_size: int = 0

    @property
    def neighboring(self) -> str:
        """The relation its epsilon is for: "replace_one" without replacement, else "add_remove"."""
        return "replace_one" if self.sampling == "without_replacement" else "add_remove"

    def mechanism(self) -> Any:
        """The ``fdp`` mechanism of one accounted event (a step; an epoch of random
        allocation); ``None`` for a non-private segment."""
        import fdp

        if self.kind == "jl" and self.sampling == "without_replacement":
            raise ValueError(f"{self.sampling} batches are accounted for DP-SGD (exact clipping) only, not "
                             "DP-SGD-JL: train DP-SGD-JL on fdp_tf.poisson_batches or "
                             "fdp_tf.random_allocation_batches")
        if self.kind == "gaussian" and self.sampling == "random_allocation":
            return fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=self.noise_multiplier),
                                        steps_per_epoch=self.scheme_size, selected=self.selected)
        if self.kind == "jl" and self.sampling == "random_allocation":
            return fdp.RandomAllocation(fdp.JL(noise_multiplier=self.noise_multiplier,
                                               jl_projections=self.jl_projections),
                                        steps_per_epoch=self.scheme_size, selected=self.selected)
        if self.kind == "gaussian" and self.sampling == "without_replacement":
            # a replaced example moves the clipped sum by up to 2C: sigma / 2 there
            return fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=self.noise_multiplier / 2),
                                                 sample_size=round(self.sampling_rate * self.scheme_size),
                                                 dataset_size=self.scheme_size)
        if self.kind == "gaussian":
            return fdp.Gaussian(noise_multiplier=self.noise_multiplier, sampling_rate=self.sampling_rate)
        if self.kind == "jl":
            return fdp.JL(noise_multiplier=self.noise_multiplier, jl_projections=self.jl_projections,
                          sampling_rate=self.sampling_rate)
        return None

    @property
    def selected(self) -> int:
        """k, the steps each example is in per epoch of random allocation: the sampling
        rate k / t times t (tables written before k existed hold 1 / t); else 1."""
        if self.sampling != "random_allocation":
            return 1
        return max(1, round(self.sampling_rate * self.scheme_size))

    def events(self) -> int:
        """How many times :meth:`mechanism` runs: the steps, or the epochs of random
        allocation (a partial epoch is charged whole: its steps reveal no more)."""
        if self.sampling == "random_allocation":
            return -(-self.steps // self.scheme_size)
        return self.steps

    def row(self) -> list[float]:
        code = {v: k for k, v in _KINDS.items()}[self.kind] + 10 * _SCHEMES.index(self.sampling)
        size = self.scheme_size if self.sampling != "poisson" else self.jl_projections
        if self.kind == "jl" and self.sampling == "random_allocation":
            size = self.scheme_size + self.jl_projections * _JL_SHIFT
        return [float(code), float(self.noise_multiplier), float(size),
                float(self.sampling_rate), float(self.steps), float(self.l2_norm_clip),
                float(self.expected_batch_size), float(self.segment_id)]

    def same_mechanism(self, other: "Segment") -> bool:
        return (self.kind, self.noise_multiplier, self.jl_projections, self.sampling_rate, self.sampling,
                self.scheme_size) == (other.kind, other.noise_multiplier, other.jl_projections,
                                      other.sampling_rate, other.sampling, other.scheme_size)


@dataclass(frozen=True)
class PrivacyLedger:
    """The segments run so far, oldest first."""

    segments: tuple[Segment, ...] = ()

    @classmethod
    def from_table(cls, table: Any) -> "PrivacyLedger":
        """Read the saved ``[MAX_SEGMENTS, FIELDS]`` table (rows with kind < 0 are unused)."""
        rows = np.asarray(table, dtype=np.float64).reshape(-1, FIELDS)
        segments = []
        for k, s, r, p, n, c, b, i in rows:
            if k < 0:
                continue
            scheme, kind = divmod(int(k), 10)
            jl, size = (int(r), 0) if scheme == 0 else (0, int(r))
            if scheme != 0 and _KINDS[kind] == "jl":
                jl, size = divmod(int(r), _JL_SHIFT)
            segments.append(Segment(_KINDS[kind], float(s), jl, float(p), int(n), float(c), int(b), int(i),
                                    _SCHEMES[scheme], size))
        return cls(tuple(segments))

    def table(self) -> np.ndarray:
        """The ``[MAX_SEGMENTS, FIELDS]`` table of these segments (at most MAX_SEGMENTS)."""
        if len(self.segments) > MAX_SEGMENTS:
            raise ValueError(
                f"the saved privacy ledger holds at most {MAX_SEGMENTS} distinct mechanisms (noise "
                f"multiplier, r, sampling rate); this one has {len(self.segments)}. Start a new "
                "model, or keep the noise multiplier and sampling rate fixed across fits"
            )
        table = empty_table()
        for i, segment in enumerate(self.segments):
            table[i] = segment.row()
        return table

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.segments)

    def epsilon(self, delta: float, accountant: Any = None) -> float:
        """Certified upper bound on epsilon at ``delta`` of everything in the ledger.

        0.0 before any step; ``inf`` if any step ran without noise or without a DP
        optimizer. ``accountant``: an :class:`fdp.PLDAccountant` whose settings to use
        (e.g. ``max_refinements``, ``grid_scale``); its events are not used.
        """
        delta = check_delta(delta)
        active = [s for s in self.segments if s.steps > 0]
        if not active:
            return 0.0
        if any(s.kind == "non_private" or s.noise_multiplier == 0 for s in active):
            return math.inf
        import fdp

        if accountant is not None and not isinstance(accountant, fdp.PLDAccountant):
            raise ValueError(f"accountant must be an fdp.PLDAccountant or None; got {type(accountant).__name__}")
        active = one_relation(active)
        # one composition per mechanism: the same epsilon for a run however it was split
        runs: dict[Segment, int] = {}
        for s in active:
            key = Segment(s.kind, s.noise_multiplier, s.jl_projections, s.sampling_rate, 0,
                          sampling=s.sampling, scheme_size=s.scheme_size)
            runs[key] = runs.get(key, 0) + s.events()
        huge = max(s.noise_multiplier for s in runs)
        while True:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fresh = fdp.PLDAccountant() if accountant is None else accountant.fresh()
                for s, n in runs.items():
                    capped = dataclasses.replace(s, noise_multiplier=min(s.noise_multiplier, huge))
                    fresh = fresh.compose(capped.mechanism(), steps=n)
                epsilon = float(fresh.get_epsilon(delta=delta))
            if math.isfinite(epsilon) or huge <= _HUGE_SIGMA:
                break
            huge = max(huge / 1e3, _HUGE_SIGMA)  # only the huge sigmas are lowered
        for warning in caught:  # those of the attempt that answered
            warnings.warn(warning.message, stacklevel=2)
        return epsilon


def one_relation(segments: list[Segment]) -> list[Segment]:
    """``segments`` with one neighbouring relation: if any is replace-one (fixed-size batches),
    a Gaussian step at rate 1 (a batch of unknown sampling) becomes what it is under
    replace-one, a full batch without replacement (a replaced example moves its sum by 2C).

    Raises:
      ValueError: add/remove segments that have no replace-one form (amplified Poisson
        or random allocation, DP-SGD-JL) beside replace-one ones.
    """
    if all(s.neighboring == "add_remove" for s in segments):
        return segments
    out = [dataclasses.replace(s, sampling="without_replacement", scheme_size=1)
           if (s.kind, s.sampling, s.sampling_rate) == ("gaussian", "poisson", 1.0) else s for s in segments]
    mixed = [s for s in out if s.neighboring == "add_remove" and s.kind != "non_private"]
    if mixed:
        raise ValueError(
            f"this model ran {sum(s.steps for s in mixed)} step(s) with {mixed[0].sampling} batches "
            f"(epsilon for adding or removing one example) and steps on fixed-size batches drawn without "
            "replacement (epsilon for replacing one): no single epsilon covers both. Train one model with "
            "one kind of batches")
    return out


def check_relation(segments: list[Segment], sampling: Any) -> None:
    """Refuse, before any step, a sampling whose relation cannot join ``segments``
    (:func:`one_relation`); ``sampling`` None (rate 1) joins either."""
    if sampling is None:
        return
    probe = Segment("gaussian", 1.0, 0, sampling.sampling_rate, 1, sampling=sampling.scheme,
                    scheme_size=getattr(sampling, "scheme_size", 0))
    try:
        one_relation([*segments, probe])
    except ValueError:
        before = sorted({s.sampling for s in segments if s.steps > 0 and s.kind != "non_private"})
        raise ValueError(
            f"this model already trained on {' and '.join(before)} batches, whose epsilon is for "
            f"{_RELATION['add_remove' if sampling.neighboring == 'replace_one' else 'replace_one']}; "
            f"{sampling.scheme} batches "
            f"are accounted for {_RELATION[sampling.neighboring]}, and no single epsilon covers both. "
            f"Keep to one kind of batches, or train a new model on {sampling.scheme} batches") from None


_RELATION = {"add_remove": "adding or removing one example", "replace_one": "replacing one example"}


def compute_epsilon(
    optimizer: Any, *, delta: float, sampling_rate: float, steps: int | None = None
) -> float:
    """Upper bound on epsilon of ``optimizer``'s steps at one sampling rate.

    For a custom training loop; ``PrivateModel`` users read the model's ledger
    (:class:`fdp_tf.PrivacyCallback`, ``PrivateModel.epsilon``), which also covers
    recompiles, reloads and phases at different rates.

    Args:
      optimizer: a :class:`fdp_tf.DPOptimizer`.
      delta: target delta in (0, 1).
      sampling_rate: Poisson sampling rate p = B / N in (0, 1].
      steps: number of steps; default the optimizer's ``dp_steps``, or the noised
        gradients it released in this process if more (a restore may lower ``dp_steps``).
    """
    mechanism = getattr(optimizer, "mechanism", None)
    if mechanism is None or not hasattr(optimizer, "dp_config"):
        raise ValueError(
            f"optimizer must be an fdp_tf DP optimizer to account privacy; got "
            f"{type(optimizer).__name__}"
        )
    sampling_rate = check_sampling_rate(sampling_rate)
    if steps is None:
        from fdp_tf.odometer import booking_of  # (it imports this module)

        booking = booking_of(optimizer)
        n = max(optimizer.steps, booking.released if booking is not None else 0)
    else:
        n = check_integer("steps", steps, low=0)
    segment = optimizer.segment(sampling_rate, n)
    return PrivacyLedger((segment,)).epsilon(delta)


def empty_table() -> np.ndarray:
    table = np.zeros((MAX_SEGMENTS, FIELDS))
    table[:, 0] = -1.0
    return table
