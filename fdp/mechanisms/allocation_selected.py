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

**Lower bound: the sum statistic.** T = (y_1 + ... + y_t) / sqrt(t) is N(k mu / sqrt(t), 1)
under P_k for every S and N(0, 1) under Q: a post-processing of the pair, so its
Gaussian pair (mu_T = k mu / sqrt(t)) is dominated by the epoch's, in both directions.
It is exact at k = t and tight as sigma grows (the true pair's CLT mean is
sigma sqrt(exp(1/sigma^2) - 1) times larger: 1.31 at sigma 1, 1.07 at sigma 2,
1.01 at sigma 5), so the bracket is wide at sigma near 1 (docs/sampling.md).

The accountant composes an epoch as its k blocks (:meth:`fdp.mechanisms.base.Mechanism.parts`):
:class:`AllocationBlock` carries one block's allocation for the upper side and a k-th of
the sum statistic (the Gaussian with mu_T / sqrt(k): k of them compose to mu_T exactly)
for the lower side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from fdp.mechanisms.base import Mechanism
from fdp.mechanisms.gaussian import Gaussian
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["AllocationBlock", "block_sizes", "epoch_blocks"]


def block_sizes(steps: int, selected: int) -> tuple[tuple[int, int], ...]:
    """((block size m, number of such blocks), ...) of a k-of-t epoch: t mod k blocks of
    ceil(t / k) steps and the others of floor(t / k), k blocks in all."""
    size, extra = divmod(steps, selected)
    sizes = ((size + 1, extra), (size, selected - extra))
    return tuple((m, count) for m, count in sizes if count > 0)


@dataclass(frozen=True)
class AllocationBlock(Mechanism):
    """One of the k blocks of a k-of-t random-allocation epoch (the argument is this module's
    docstring): the dominating side is the 1-of-m allocation ``block``,
    the dominated side the Gaussian ``share`` of the sum statistic (noise multiplier
    sigma sqrt(t / k)). Internal to the accountant: users compose
    ``fdp.RandomAllocation(..., selected=k)``."""

    block: Mechanism  # fdp.RandomAllocation(step, steps_per_epoch=m), selected 1
    share: Gaussian
    kind = "random_allocation_block"
    bracket_note: ClassVar[str | None] = (
        "accept the gap: a k-of-t random-allocation epoch (selected > 1) is bounded above by k blocks of "
        "1-of-t/k and below by the sum of its outputs, a post-processing that no grid sharpens; the gap "
        "shrinks as the noise multiplier grows, and selected=1 has a tight bracket (docs/sampling.md, "
        "'More than one step per example')")

    @property
    def sampling_rate(self) -> float:  # type: ignore[override]
        return 1.0

    @property
    def kernel_groups(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(dict.fromkeys((*self.block.kernel_groups, *self.share.kernel_groups)))

    def _side(self, pessimistic: bool) -> Mechanism:
        return self.block if pessimistic else self.share

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        return self._side(pessimistic).loss_cells(direction, grid, pessimistic=pessimistic, focus=focus)

    def focus_key(self, direction: Direction, focus: tuple[float, float]) -> Any:
        keys = (self.block.focus_key(direction, focus), self.share.focus_key(direction, focus))
        return None if keys == (None, None) else keys

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        (a, b), (c, d) = self.block.loss_range(direction, tail_mass), self.share.loss_range(direction, tail_mass)
        return min(a, c), max(b, d)

    def tradeoff(self):
        return self.block.tradeoff()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "block": self.block.to_dict(), "share": self.share.to_dict()}


def epoch_blocks(step: Gaussian, steps: int, selected: int,
                 allocation: Callable[[int], Mechanism]) -> tuple[tuple[AllocationBlock, int], ...]:
    """The k-of-t epoch of ``step`` as (block, count) pairs, k blocks in all;
    ``allocation(m)`` is the 1-of-m epoch of ``step``."""
    share = Gaussian(noise_multiplier=step.noise_multiplier * math.sqrt(steps / selected))
    return tuple((AllocationBlock(allocation(m), share), count) for m, count in block_sizes(steps, selected))
