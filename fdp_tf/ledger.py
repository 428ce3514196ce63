"""What a model's training actually ran, and the epsilon of all of it.

A :class:`PrivacyLedger` is a list of :class:`Segment` s: one mechanism (exact
clipping = subsampled Gaussian, DP-SGD-JL = ``fdp.JL``, or a non-private optimizer)
at one Poisson sampling rate, run for some number of steps. The epsilon of the whole
training is that of the heterogeneous composition

    fdp.PLDAccountant().compose(m_1, steps=n_1).compose(m_2, steps=n_2)...

(seed, Theorem "final privacy curve", per segment; composition of independent
mechanisms multiplies tradeoff curves), a certified upper bound that is exact for
multi-phase runs: a later phase at a smaller rate is charged at its own rate, not at
the larger one, and never hides an earlier phase.

:class:`fdp_tf.PrivateModel` keeps the ledger in a non-trainable variable, so it is
saved and restored with the weights (``save``, ``save_weights``,
``BackupAndRestore``, ``ModelCheckpoint``) and survives a recompile with a new
optimizer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fdp._validation import check_delta, check_integer, check_sampling_rate

__all__ = ["MAX_SEGMENTS", "PrivacyLedger", "Segment", "compute_epsilon"]

MAX_SEGMENTS = 64  # rows of the saved table; a fit that would need more is refused

# mechanism codes in the saved table
NON_PRIVATE, GAUSSIAN, JL = 0, 1, 2
_KINDS = {NON_PRIVATE: "non_private", GAUSSIAN: "gaussian", JL: "jl"}
FIELDS = 5  # kind, noise_multiplier, jl_projections, sampling_rate, steps


@dataclass(frozen=True)
class Segment:
    """Steps of one mechanism at one sampling rate.

    Attributes:
      kind: ``"gaussian"`` (exact clipping), ``"jl"`` (DP-SGD-JL) or ``"non_private"``.
      noise_multiplier: sigma.
      jl_projections: r for ``"jl"``, else 0.
      sampling_rate: Poisson rate p = B / N of the rows trained on.
      steps: private steps run.
    """

    kind: str
    noise_multiplier: float
    jl_projections: int
    sampling_rate: float
    steps: int

    def mechanism(self) -> Any:
        """The ``fdp`` mechanism of one step; ``None`` for a non-private segment."""
        import fdp

        if self.kind == "gaussian":
            return fdp.Gaussian(noise_multiplier=self.noise_multiplier, sampling_rate=self.sampling_rate)
        if self.kind == "jl":
            return fdp.JL(noise_multiplier=self.noise_multiplier, jl_projections=self.jl_projections,
                          sampling_rate=self.sampling_rate)
        return None

    def row(self) -> list[float]:
        code = {v: k for k, v in _KINDS.items()}[self.kind]
        return [float(code), float(self.noise_multiplier), float(self.jl_projections),
                float(self.sampling_rate), float(self.steps)]

    def same_mechanism(self, other: "Segment") -> bool:
        return (self.kind, self.noise_multiplier, self.jl_projections, self.sampling_rate) == (
            other.kind, other.noise_multiplier, other.jl_projections, other.sampling_rate)


@dataclass(frozen=True)
class PrivacyLedger:
    """The segments run so far, oldest first."""

    segments: tuple[Segment, ...] = ()

    @classmethod
    def from_table(cls, table: Any) -> "PrivacyLedger":
        """Read the saved ``[MAX_SEGMENTS, 5]`` table (rows with kind < 0 are unused)."""
        rows = np.asarray(table, dtype=np.float64).reshape(-1, FIELDS)
        segments = [
            Segment(_KINDS[int(k)], float(s), int(r), float(p), int(n))
            for k, s, r, p, n in rows if k >= 0
        ]
        return cls(tuple(segments))

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
        accountant = fdp.PLDAccountant() if accountant is None else accountant.fresh()
        for s in active:
            accountant = accountant.compose(s.mechanism(), steps=s.steps)
        return float(accountant.get_epsilon(delta=delta))


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
      steps: number of steps; default the optimizer's ``dp_steps``.
    """
    mechanism = getattr(optimizer, "mechanism", None)
    if mechanism is None or not hasattr(optimizer, "dp_config"):
        raise ValueError(
            f"optimizer must be an fdp_tf DP optimizer to account privacy; got "
            f"{type(optimizer).__name__}"
        )
    sampling_rate = check_sampling_rate(sampling_rate)
    n = optimizer.steps if steps is None else check_integer("steps", steps, low=0)
    segment = optimizer.segment(sampling_rate, n)
    return PrivacyLedger((segment,)).epsilon(delta)


def table_with(table: Any, segment: Segment) -> tuple[np.ndarray, int]:
    """The table with ``segment`` opened (or the last row continued); returns the row."""
    rows = np.asarray(table, dtype=np.float64).reshape(-1, FIELDS).copy()
    used = [i for i in range(len(rows)) if rows[i, 0] >= 0]
    if used:
        last = used[-1]
        current = PrivacyLedger.from_table(rows[last:last + 1]).segments[0]
        if current.same_mechanism(segment):
            return rows, last
    row = used[-1] + 1 if used else 0
    if row >= len(rows):
        raise ValueError(
            f"the privacy ledger holds at most {len(rows)} segments (mechanism or sampling "
            "rate changes); this fit would open one more. Start a new model, or keep the "
            "noise multiplier and sampling rate fixed across fits"
        )
    rows[row] = segment.row()
    rows[row, 4] = 0.0
    return rows, row


def empty_table() -> np.ndarray:
    table = np.zeros((MAX_SEGMENTS, FIELDS))
    table[:, 0] = -1.0
    return table
