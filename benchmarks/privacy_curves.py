"""Recompute the seed's figure "Privacy curves for various algorithms" (fig:RNNprivacy).

epsilon(delta = 1e-5) against epochs 1..15 for DP-Adam-JL with r = 1, 5, 10, 30
JL projections and DP-Adam-Vanilla (Gaussian), sigma = 0.6, B = 256,
N = 25,000 (p = B/N, 98 steps per epoch, as in the seed's Table "RNN embedding").
Each cell of the table is "lower-upper": certified bounds on the exact epsilon.

Each curve is :func:`fdp.epsilon_curve` (fdp/curves.py): the single-step PLD of each
mechanism is discretised ONCE per direction on the accountant's grid for the last
epoch, then composed by FFT for every epoch; r = 1's heavy tail gets its own grids
(see that module). ``--check`` also times one public-API query (r = 10, T = 1,465).

Usage:
  python benchmarks/privacy_curves.py [--png PATH] [--epochs 15] [--check] [--quiet]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import fdp
from tqdm import tqdm

SIGMA = 0.6
BATCH = 256
N = 25_000
DELTA = 1e-5
STEPS_PER_EPOCH = math.ceil(N / BATCH)  # 98

def mechanisms() -> dict[str, fdp.Mechanism]:
    p = BATCH / N
    out: dict[str, fdp.Mechanism] = {
        f"JL(r={r})": fdp.JL(noise_multiplier=SIGMA, jl_projections=r, sampling_rate=p) for r in (1, 5, 10, 30)
    }
    out["Vanilla"] = fdp.Gaussian(noise_multiplier=SIGMA, sampling_rate=p)
    return out


def curve(mech: fdp.Mechanism, epochs: int, progress=None) -> list[tuple[float, float]]:
    """[(lower, upper) epsilon at DELTA for e = 1..epochs] (:func:`fdp.epsilon_curve`)."""
    return fdp.epsilon_curve(mech, [e * STEPS_PER_EPOCH for e in range(1, epochs + 1)], DELTA,
                             progress=progress)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", help="write the figure (matplotlib, Agg) to this path")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--check", action="store_true", help="also time one PLDAccountant query")
    ap.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    ap.add_argument("--tail-cells", type=int, default=None,
                    help="what-if: the JL Z-partition's TAIL_CELLS (default: the library's, 2000)")
    args = ap.parse_args()
    if args.tail_cells is not None:
        from fdp.mechanisms.random_sensitivity import cells as z_cells

        z_cells.TAIL_CELLS = args.tail_cells

    t0 = time.perf_counter()
    results, timings = {}, {}
    mechs = mechanisms()
    with tqdm(total=len(mechs) * args.epochs, desc="privacy_curves", unit="epoch", disable=args.quiet) as bar:
        for name, mech in mechs.items():
            bar.set_postfix_str(name)
            t1 = time.perf_counter()
            results[name] = curve(mech, args.epochs, progress=bar.update)
            timings[name] = time.perf_counter() - t1
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
