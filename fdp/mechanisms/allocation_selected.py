"""Random allocation of k out of t steps: each example used in k distinct steps per epoch.

The k-subset S of an example's steps is uniform over the C(t, k) subsets. For the
Gaussian step (mu = 1 / sigma) one epoch is dominated by the pair

    remove:  P_k = mean over S of N(mu 1_S, I_t),   Q = N(0, I_t)
    add:     the pair swapped,

(Feldman and Shenfeld, "Privacy amplification by random allocation", arXiv:2502.08202;
k = 1 is :mod:`fdp.mechanisms.random_allocation`). Its likelihood ratio is an elementary
symmetric polynomial of the terms exp(mu y_j - mu^2/2), not a mean of iid terms, so the
lattice of k = 1 does not apply. Two arguments bound it instead:

**Upper bound: k blocks.** Cut the t steps into k blocks of sizes m_1 + ... + m_k = t
(each floor(t/k) or ceil(t/k)) by a uniformly random partition pi, and pick one step
uniformly in each block. The union is a uniform k-subset (its law is invariant under
permutations of the steps, and it always has k elements), so P_k = E_pi P_pi, where for a
fixed pi, P_pi is the product over the blocks of the 1-of-m_j allocation pairs (Q is a
product too). Both hockey-stick divergences are jointly convex and pi does not depend
on the data, so for every eps

    H_eps(P_k || Q) <= E_pi H_eps(P_pi || Q) = H_eps(composition of the k blocks),

and likewise H_eps(Q || P_k): one epoch is dominated by the composition of k
independent 1-of-m_j allocations, each certified by the k = 1 lattice.

**Lower bound: a statistic of the epoch.** Any post-processing of the epoch's output
gives a dominated pair. Two are used, whichever has the larger mean privacy loss (KL
divergence; every choice is sound):

* the sum of the terms' lattice classes (:mod:`fdp.mechanisms.allocation_class_sum`),
  nearly sufficient for t >> k: at sigma 1, t 469, k 2, 60 epochs it closes the bracket
  to [4.08, 4.09];
* the sum of the outputs T = (y_1 + ... + y_t) / sqrt(t), N(k mu / sqrt(t), 1) under P_k
  for every S and N(0, 1) under Q: a Gaussian pair, exact at k = t (where T is
  sufficient) and where the lattice does not fit (small sigma).

The accountant composes an epoch as its k blocks (:meth:`fdp.mechanisms.base.Mechanism.parts`):
each :class:`AllocationBlock` carries one block's allocation for the upper side; the first
also carries the epoch's dominated pair for the lower side, the others the identity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from fdp.mechanisms._atoms import atom_cells
from fdp.mechanisms.allocation_class_sum import ClassSumEpoch, mean_loss
from fdp.mechanisms.base import Mechanism
from fdp.mechanisms.gaussian import Gaussian
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["AllocationBlock", "block_sizes", "epoch_blocks", "epoch_lower"]


def block_sizes(steps: int, selected: int) -> tuple[tuple[int, int], ...]:
    """((block size m, number of such blocks), ...) of a k-of-t epoch: t mod k blocks of
    ceil(t / k) steps and the others of floor(t / k), k blocks in all."""
    size, extra = divmod(steps, selected)
    sizes = ((size + 1, extra), (size, selected - extra))
    return tuple((m, count) for m, count in sizes if count > 0)


@dataclass(frozen=True)
class AllocationBlock(Mechanism):
    """One of the k blocks of a k-of-t random-allocation epoch (the argument is this module's
    docstring): the dominating side is the 1-of-m allocation ``block``; the dominated side
    is ``lower``, the whole epoch's dominated pair, on one block of the epoch, and the
    identity (None) on the others. Internal to the accountant: users compose
    ``fdp.RandomAllocation(..., selected=k)``."""

    block: Mechanism  # fdp.RandomAllocation(step, steps_per_epoch=m), selected 1
    lower: Mechanism | None
    kind = "random_allocation_block"
    bracket_note: ClassVar[str | None] = (
        "accept the gap: a k-of-t random-allocation epoch (selected > 1) is bounded above by k blocks of "
        "1-of-t/k and below by a statistic of its outputs (a post-processing, which no grid sharpens); "
        "selected=1 has a tight bracket (docs/sampling.md, 'More than one step per example')")

    @property
    def sampling_rate(self) -> float:  # type: ignore[override]
        return 1.0

    @property
    def kernel_groups(self) -> tuple[str, ...]:  # type: ignore[override]
        lower = () if self.lower is None else self.lower.kernel_groups
        return tuple(dict.fromkeys((*self.block.kernel_groups, *lower)))

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        if pessimistic:
            return self.block.loss_cells(direction, grid, pessimistic=True, focus=focus)
        if self.lower is None:  # the identity: loss 0 with all the mass
            return atom_cells(grid, np.zeros(1), np.ones(1))
        return self.lower.loss_cells(direction, grid, pessimistic=False, focus=focus)

    def focus_key(self, direction: Direction, focus: tuple[float, float]) -> Any:
        lower = None if self.lower is None else self.lower.focus_key(direction, focus)
        keys = (self.block.focus_key(direction, focus), lower)
        return None if keys == (None, None) else keys

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        a, b = self.block.loss_range(direction, tail_mass)
        c, d = (0.0, 0.0) if self.lower is None else self.lower.loss_range(direction, tail_mass)
        return min(a, c), max(b, d)

    def tradeoff(self):
        return self.block.tradeoff()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "block": self.block.to_dict(),
                "lower": None if self.lower is None else self.lower.to_dict()}


def epoch_lower(step: Gaussian, steps: int, selected: int,
                lattice: tuple[float, int] | None) -> Mechanism:
    """The dominated pair of a k-of-t epoch of ``step`` (module docstring): the class sum on
    the linear lattice ``lattice`` = (spacing, classes) or the sum of the outputs, whichever
    has the larger mean privacy loss in the remove direction (the class sum only where
    ``lattice`` is given and its window fits)."""
    mu = 1.0 / step.noise_multiplier
    outputs = Gaussian(noise_multiplier=step.noise_multiplier * math.sqrt(steps) / selected)
    if lattice is None:
        return outputs
    spacing, classes = lattice
    classes_sum = ClassSumEpoch(step.noise_multiplier, steps, selected, spacing, classes)
    try:
        losses, masses = classes_sum.atoms(Direction.REMOVE)
    except ValueError:  # its window would not fit
        return outputs
    gaussian_kl = (selected * mu) ** 2 / (2 * steps)
    return classes_sum if mean_loss(losses, masses) > gaussian_kl else outputs


def epoch_blocks(step: Gaussian, steps: int, selected: int, allocation: Callable[[int], Mechanism],
                 lattice: tuple[float, int] | None = None) -> tuple[tuple[AllocationBlock, int], ...]:
    """The k-of-t epoch of ``step`` as (block, count) pairs, k blocks in all;
    ``allocation(m)`` is the 1-of-m epoch of ``step``; ``lattice`` as :func:`epoch_lower`'s.
    The first block carries the epoch's dominated pair, the others the identity."""
    lower = epoch_lower(step, steps, selected, lattice)
    blocks: list[tuple[AllocationBlock, int]] = []
    for m, count in block_sizes(steps, selected):
        if not blocks:
            blocks.append((AllocationBlock(allocation(m), lower), 1))
            count -= 1
        if count > 0:
            blocks.append((AllocationBlock(allocation(m), None), count))
    return tuple(blocks)
