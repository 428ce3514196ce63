"""What every mechanism tells the accountant.

A mechanism is a frozen record of its parameters (an *event*). It
describes ONE step of a Poisson-subsampled release: P0 is its output law
without the individual, P1 with it, and the two neighbouring relations give
the pairs (docs/accountant.md, "What it computes"):

    remove: P = (1-p) P0 + p P1,  Q = P0
    add:    P = P0,               Q = (1-p) P0 + p P1

Each mechanism reports the privacy loss L = log(dP/dQ)(X), X ~ P, of either
pair binned on a loss grid (:class:`fdp.pld.cells.LossCells`), and a loss range
outside which each tail is below a given mass. Mechanisms whose PLD is only
known up to a bound (the JL mechanism) return cells of a *dominating* pair when
``pessimistic`` is True and of a *dominated* pair otherwise.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

from fdp._validation import format_value
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["MAX_STEP_LOSS", "RELATIONS", "Mechanism", "register_mechanism", "mechanism_from_dict"]

#: Largest privacy loss of one step that mechanisms accept (Laplace: 1 / scale,
#: Gaussian: 1 / (2 noise_multiplier^2), randomized response: epsilon): the planner's
#: float64 limit on a composition (fdp.pld.plan.MAX_COMPOSED_LOSS = 1e306) leaves room
#: for 10^6 such steps; beyond, e^{-loss}, loss^2 and the grid overflow.
MAX_STEP_LOSS = 1e300

#: The neighbouring relations (:attr:`Mechanism.neighboring`), as errors name them.
RELATIONS = {"add_remove": "adding or removing one example (add_remove)",
             "replace_one": "replacing one example (replace_one)"}

_REGISTRY: dict[str, type["Mechanism"]] = {}


def register_mechanism(cls: type["Mechanism"]) -> type["Mechanism"]:
    """Class decorator: make ``cls`` known to :func:`mechanism_from_dict` (JSON)."""
    _REGISTRY[cls.kind] = cls
    return cls


def mechanism_from_dict(data: Any) -> "Mechanism":
    """Inverse of :meth:`Mechanism.to_dict`.

    Raises:
      ValueError: ``data`` is not a dict with a known "kind" and exactly that kind's
        parameters (the message names the missing and unknown keys), or a value is bad.
    """
    if not isinstance(data, dict):
        raise ValueError(f'mechanism must be a dict with a "kind" key; got {format_value(data)}')
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _REGISTRY:
        raise ValueError(f"unknown mechanism kind {format_value(kind)}; known: {sorted(_REGISTRY)}")
    cls = _REGISTRY[kind]
    params = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    required = [f.name for f in params if f.default is f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    unknown = sorted(set(data) - {"kind", *(f.name for f in params)})
    if missing or unknown:
        raise ValueError(f"a {kind!r} mechanism takes the keys {[f.name for f in params]} (required: "
                         f"{required}); got missing {missing}, unknown {unknown}")
    try:
        return cls.from_dict(data)
    except TypeError as err:  # e.g. a value of the wrong type that no check_* saw first
        raise ValueError(f"a {kind!r} mechanism: {err}") from None


class Mechanism(abc.ABC):
    """One step of a (Poisson-subsampled) mechanism; subclasses are frozen dataclasses."""

    kind: ClassVar[str] = ""
    #: True when ``loss_cells`` is exact (ignores ``pessimistic``): both sides share it.
    exact_cells: ClassVar[bool] = False
    #: Groups of Numba kernels ``loss_cells`` runs (:mod:`fdp._kernels.prefetch`).
    kernel_groups: ClassVar[tuple[str, ...]] = ()
    #: The neighbouring relation its PLD is for: "add_remove" (one example added or
    #: removed; every mechanism here but fdp.SampledWithoutReplacement) or "replace_one".
    neighboring: ClassVar[str] = "add_remove"
    #: Why no grid narrows this mechanism's bracket, when its lower bound is the privacy
    #: of real data sets (an attack) rather than of its guarantee; None when the two meet.
    bracket_note: ClassVar[str | None] = None
    sampling_rate: float

    @abc.abstractmethod
    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        """P-measure of the privacy loss of ``direction``'s pair on the cells of ``grid``.

        ``focus`` = (a, b): a query's answer is decided near single-step losses in
        [a, b] (None: no query at hand). Mechanisms whose cells are bounds rather than
        exact may make them finer there (:meth:`focus_key`); the cells are valid
        bounds for every focus, so it only moves their tightness.
        """

    def focus_key(self, direction: Direction, focus: tuple[float, float]) -> Any:
        """What of ``focus`` ``loss_cells`` would use: None (the default) when its cells do
        not depend on it, so the accountant reuses the unfocused ones."""
        return None

    @abc.abstractmethod
    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        """(lo, hi) with P(L < lo) <= tail_mass and P(hi < L < inf) <= tail_mass."""

    @abc.abstractmethod
    def tradeoff(self):  # -> fdp.TradeoffCurve
        """Tradeoff curve of ONE step without subsampling (the seed's f)."""

    def grid_anchor(self, direction: Direction) -> float | None:
        """A loss value the automatic grid should pass through (an atom of the PLD), or None.

        Discretisations are exact for atoms that sit on grid points, so mechanisms
        with point masses of loss (randomized response, Laplace) name their
        largest one and the accountant shrinks its spacing h slightly to make it
        a multiple of h.
        """
        return None

    def loss_atoms(self, direction: Direction) -> Any:
        """The finite losses carrying P-mass (a 1-D float64 array) when ``direction``'s loss
        is made of finitely many atoms (plus, maybe, one at +inf) and ``loss_cells`` bins
        them exactly; None (the default) when it has a continuous part.

        If all atoms are integer multiples m a of one spacing a, computed exactly
        (float(m) * a == loss, as the grid computes its points), a grid of spacing a
        passes through all of them and both discretisations are exact: the accountant
        then uses it (:func:`fdp.pld.plan.grid_plan`), however small the loss's sd.
        """
        return None

    def parts(self) -> tuple[tuple["Mechanism", int], ...]:
        """What the accountant composes for one run of this mechanism: ((mechanism, count), ...).

        Itself once (the default); a mechanism certified as a composition of others (a
        k-of-t random-allocation epoch: its k blocks, :mod:`fdp.mechanisms.allocation_selected`)
        names them, each with cells for both sides.
        """
        return ((self, 1),)

    def is_null(self) -> bool:
        """True if the two output laws are identical: the privacy loss is exactly 0.

        Composing such a mechanism is the identity, so the accountant leaves it out
        (any number of times, exactly), instead of discretising a point mass.
        """
        return False

    def is_symmetric(self) -> bool:
        """True if without subsampling the two directions have the same PLD.

        Symmetric mechanisms at sampling_rate 1 need only one direction accounted.
        """
        return False

    def to_dict(self) -> dict[str, Any]:
        import dataclasses

        return {"kind": self.kind, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Mechanism":
        fields = {k: v for k, v in data.items() if k != "kind"}
        return cls(**fields)  # type: ignore[call-arg]
