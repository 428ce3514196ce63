"""Recompute the seed's figure "Privacy curves for various algorithms" (fig:RNNprivacy).

epsilon(delta = 1e-5) against epochs 1..15 for DP-Adam-JL with r = 1, 5, 10, 30
JL projections and DP-Adam-Vanilla (Gaussian), sigma = 0.6, B = 256,
N = 25,000 (p = B/N, 98 steps per epoch, as in the seed's Table "RNN embedding").
Each cell of the table is "lower-upper": certified bounds on the exact epsilon.

The single-step PLD of each mechanism is discretised ONCE per direction on a
grid sized for the last epoch (the accountant's own grid rule at T = 15 * 98),
then composed by FFT for every epoch (:func:`fdp.pld.compose.compose`), which is
exactly what :class:`fdp.PLDAccountant` does for one T; since eps(T) is
non-decreasing in T, each epoch's lower bound is raised to the largest earlier
one and its upper bound lowered to the smallest later one. ``--check`` also times
one public-API query (r = 10, T = 1,465).

Usage:
  python benchmarks/privacy_curves.py [--png PATH] [--epochs 15] [--check] [--quiet]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import fdp
from fdp._progress import Progress
from fdp.pld.capped import capped_optimistic_plds
from fdp.pld.queries import tail_budget as _tail_budget
from fdp.pld.cells import Direction
from fdp.pld.compose import compose
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic

SIGMA = 0.6
BATCH = 256
N = 25_000
DELTA = 1e-5
STEPS_PER_EPOCH = math.ceil(N / BATCH)  # 98
#: FFT window for r = 1's upper bounds (its losses span ~1e15; mass cut off above
#: the window goes to +inf)
HEAVY_POINTS = 1 << 21
#: r = 1's lower bounds: single-step grids of 2^19 cells up to the cap, composed in
#: windows of 2^20 points (the window then reaches as far in loss as 2^21 points on
#: the accountant's 2^20-cell grids; the rounding, <= T h, doubles: 2-6 % brackets
#: instead of 2-5 %, in half the time)
CAP_POINTS, CAP_WINDOW = 1 << 19, 1 << 20
#: r = 1 upper bounds: grids sized for epochs 1, g, g^2, ... (the next one at or
#: above the epoch; any grid is sound for any T, a nearer one is tighter)
HORIZON_GROWTH = 2


def mechanisms() -> dict[str, fdp.Mechanism]:
    p = BATCH / N
    out: dict[str, fdp.Mechanism] = {
        f"JL(r={r})": fdp.JL(noise_multiplier=SIGMA, jl_projections=r, sampling_rate=p) for r in (1, 5, 10, 30)
    }
    out["Vanilla"] = fdp.Gaussian(noise_multiplier=SIGMA, sampling_rate=p)
    return out


def curve(mech: fdp.Mechanism, epochs: int) -> list[tuple[float, float]]:
    """[(lower, upper) epsilon at DELTA for e = 1..epochs]."""
    t_max = epochs * STEPS_PER_EPOCH
    tail = _tail_budget(DELTA)
    heavy = getattr(mech, "jl_projections", 2) < 2
    # r = 1 spans losses up to ~1e15: a window of 2^21 points (the mass cut off above it
    # goes to +inf, so the upper bound stays sound) keeps its FFTs affordable
    max_points = HEAVY_POINTS if heavy else fdp.accountant.MAX_FFT_POINTS
    acc = fdp.PLDAccountant().compose(mech, steps=t_max)

    def side(d: Direction, pessimistic: bool, plan: fdp.PLDAccountant = acc):
        # the accountant's grids for the largest T: level 0 for the upper bound, one
        # halving for the (looser) merging lower bound, as its refinement would do
        grid = plan._plan(d, tail, 0 if pessimistic else 1).grids[0]
        discretise = discretise_pessimistic if pessimistic else discretise_optimistic
        return discretise(mech.loss_cells(d, grid, pessimistic=pessimistic))

    # r = 1: the loss range (hence h) grows with T, so a grid sized for epoch 15 is far
    # too coarse for epoch 1; the leading upper bound uses grids sized for epochs
    # 1, 2, 4, 8, ... (any grid is sound for any T; this is only tightness)
    horizons: dict[int, object] = {}

    def heavy_upper(d: Direction, t: int):
        e = 1
        while e * STEPS_PER_EPOCH < t:
            e *= HORIZON_GROWTH
        t_plan = min(e * STEPS_PER_EPOCH, t_max)
        if t_plan not in horizons:
            horizons[t_plan] = side(d, True, fdp.PLDAccountant().compose(mech, steps=t_plan))
        return horizons[t_plan]

    def eps(pld, t: int, pessimistic: bool) -> float:
        return compose([(pld, t)], pessimistic=pessimistic, tail_mass=tail, max_points=max_points).epsilon(DELTA)

    # the direction with the larger upper bound at T_max leads; the other is needed at
    # epoch e only if its upper bound at T_max (>= its value at every e, as eps(T) is
    # non-decreasing) exceeds the leader's lower bound at e
    uppers = {d: side(d, True) for d in (Direction.REMOVE, Direction.ADD)}
    last = {d: eps(pld, t_max, True) for d, pld in uppers.items()}
    lead = max(last, key=last.get)
    other = Direction.ADD if lead is Direction.REMOVE else Direction.REMOVE
    lowers: dict[Direction, object] = {}
    capped = _CappedLower(mech, lead, tail / t_max, tail) if heavy else None
    rows = []
    for e in range(1, epochs + 1):
        t = e * STEPS_PER_EPOCH
        if t == t_max:
            hi = last[lead]
        else:  # r = 1: only the grid sized for the next power-of-2 epoch (finer than T_max's)
            hi = eps(heavy_upper(lead, t) if heavy else uppers[lead], t, True)
        if capped is not None:  # the grid sized for the tail is too coarse for the lower bound
            lo = capped(t, hi)
        else:
            lowers.setdefault(lead, side(lead, False))
            lo = eps(lowers[lead], t, False)
        if last[other] > lo:
            hi = max(hi, last[other] if t == t_max else eps(uppers[other], t, True))
            if capped is None:
                lowers.setdefault(other, side(other, False))
                lo = max(lo, eps(lowers[other], t, False))
        rows.append((lo, hi))
    return _monotone_in_epochs(rows)


class _CappedLower:
    """Lower bounds from optimistic grids cut at a cap (heavy upper tails).

    The rule of :meth:`fdp.PLDAccountant._capped_lower` on the leading direction
    (where the heavy tail is): caps grow 100-fold until the bound found is below
    cap / 10 or the cap passes 4x the upper bound. Any cap gives a valid lower bound;
    the first is the power of 10 above 4x the epoch's upper bound (where a finite one
    is known), so each cap's grid, discretised once, serves the epochs whose upper
    bounds lie within its decade. The grid has CAP_POINTS cells and the FFT window is
    cut at CAP_WINDOW points: mass above it wraps to smaller losses, which only
    lowers delta (:mod:`fdp.pld.compose`).
    """

    def __init__(self, mech: fdp.Mechanism, direction: Direction, step_tail: float, tail: float) -> None:
        self.mech, self.direction, self.step_tail, self.tail = mech, direction, step_tail, tail
        self.plds: dict[float, object] = {}

    def __call__(self, steps: int, upper: float) -> float:
        best = 0.0
        self.cap = 10.0 ** math.ceil(math.log10(4.0 * upper)) if math.isfinite(upper) else 100.0
        while True:
            if self.cap not in self.plds:
                self.plds[self.cap] = capped_optimistic_plds([self.mech], self.direction, self.step_tail, self.cap,
                                                             points=CAP_POINTS)[0]
            found = compose([(self.plds[self.cap], steps)], pessimistic=False, tail_mass=self.tail,
                            max_points=CAP_WINDOW).epsilon(DELTA)
            best = max(best, found)
            if found < 0.1 * self.cap or self.cap >= 4.0 * upper:
                return best
            self.cap *= 100.0


def _monotone_in_epochs(rows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Tighten each epoch's bounds with its neighbours': eps(T) is non-decreasing in T.

    The T-fold composition is a post-processing of the (T+1)-fold one (drop the last
    output), so delta_T(eps) <= delta_{T+1}(eps) for every eps: a lower bound at an
    earlier epoch is one at every later epoch and an upper bound at a later epoch is
    one at every earlier epoch. This only matters for r = 1, whose composed window
    is cut at max_points (the cut mass is charged to both bounds, loosening them).
    """
    lows = np.maximum.accumulate([lo for lo, _ in rows])
    highs = np.minimum.accumulate([hi for _, hi in rows][::-1])[::-1]
    return [(float(lo), float(hi)) for lo, hi in zip(lows, highs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", help="write the figure (matplotlib, Agg) to this path")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--check", action="store_true", help="also time one PLDAccountant query")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args()

    t0 = time.perf_counter()
    results, timings = {}, {}
    bar = Progress("privacy_curves", not args.quiet)
    for name, mech in mechanisms().items():
        bar.update(f"computing {name}")
        t1 = time.perf_counter()
        results[name] = curve(mech, args.epochs)
        timings[name] = time.perf_counter() - t1
    bar.close("done")
    total = time.perf_counter() - t0

    names = list(results)
    print(f"epsilon(delta={DELTA:g}) bounds [lower-upper], sigma={SIGMA}, p={BATCH}/{N}, "
          f"{STEPS_PER_EPOCH} steps/epoch")
    print("| epoch | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for e in range(args.epochs):
        cells = []
        for n in names:
            lo, hi = results[n][e]
            cells.append(f"{lo:.4g}-{hi:.4g}")
        print(f"| {e + 1} | " + " | ".join(cells) + " |")
    print("time per mechanism (s): " + ", ".join(f"{n} {timings[n]:.2f}" for n in names))
    print(f"total time: {total:.2f} s")

    if args.check:
        t1 = time.perf_counter()
        acc = fdp.PLDAccountant().compose(mechanisms()["JL(r=10)"], steps=1465)
        lo, hi = acc.get_epsilon_bounds(DELTA)
        print(f"PLDAccountant JL(r=10), T=1465: [{lo:.4f}, {hi:.4f}] in {time.perf_counter() - t1:.2f} s")

    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ep = np.arange(1, args.epochs + 1)
        for n in names:
            lo = np.array([r[0] for r in results[n]])
            hi = np.array([r[1] for r in results[n]])
            line, = ax.plot(ep, np.where(np.isfinite(hi), hi, np.nan), label=f"DP-Adam-{n}")
            ax.fill_between(ep, lo, np.where(np.isfinite(hi), hi, lo), color=line.get_color(), alpha=0.25)
        ax.set_yscale("log")
        ax.set_xlabel("epochs")
        ax.set_ylabel(f"epsilon (delta = {DELTA:g})")
        ax.set_title("Privacy curves (sigma=0.6, B=256, N=25000)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
