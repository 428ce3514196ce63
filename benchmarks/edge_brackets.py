"""fdp.PLDAccountant's brackets at the edges: degenerate, pure-DP and slow-converging settings.

Usage: python benchmarks/edge_brackets.py [index ...]   (no index: all settings)

Prints one line per setting of SETTINGS: the query, the certified [lower, upper], its
relative width and the wall time (Numba compiled first, on a small query). The exact
answers are checked in the tests (tests/test_atomic_losses.py: binomial enumeration in
mpmath; tests/test_refinement.py); this script only records what a release gives, to be
run on two checkouts side by side (PYTHONPATH=<other checkout>).
"""

from __future__ import annotations

import argparse
import time
import warnings

import fdp

#: (label, mechanism, steps, query, argument): query "eps" is get_epsilon_bounds(delta),
#: "delta" is get_delta_bounds(epsilon).
SETTINGS = [
    ("RR(22.2) x 8", fdp.RandomizedResponse(epsilon=22.2), 8, "delta", 83.5),
    ("RR(22.2) x 8", fdp.RandomizedResponse(epsilon=22.2), 8, "eps", 1e-30),
    ("RR(3.41) x 72", fdp.RandomizedResponse(epsilon=3.41), 72, "eps", 7.1e-37),
    ("RR(22.2, p=0.999) x 8", fdp.RandomizedResponse(epsilon=22.2, sampling_rate=0.999), 8, "delta", 83.5),
    ("RR(22.2, p=0.999) x 8", fdp.RandomizedResponse(epsilon=22.2, sampling_rate=0.999), 8, "eps", 1e-10),
    ("RR(1) x 10", fdp.RandomizedResponse(epsilon=1.0), 10, "delta", 10.000001),
    ("Laplace(1) x 50", fdp.Laplace(scale=1.0), 50, "eps", 1e-40),
    ("JL(1.1, r=30, p=1/8) x 8", fdp.JL(noise_multiplier=1.1, jl_projections=30, sampling_rate=0.125), 8,
     "eps", 1e-5),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index", nargs="*", type=int, help="settings to run (default: all)")
    args = ap.parse_args()
    warnings.simplefilter("ignore", UserWarning)
    fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=1.0, jl_projections=8, sampling_rate=0.1),
                                steps=10).get_epsilon_bounds(1e-5)  # compile the kernels
    print(f"{'setting':26s} {'query':>22s}  {'[lower, upper]':>44s} {'width':>9s} {'s':>6s}")
    for i in args.index or range(len(SETTINGS)):
        label, mech, steps, query, arg = SETTINGS[i]
        acc = fdp.PLDAccountant().compose(mech, steps=steps)
        start = time.perf_counter()
        lo, hi = acc.get_epsilon_bounds(arg) if query == "eps" else acc.get_delta_bounds(arg)
        seconds = time.perf_counter() - start
        width = (hi - lo) / hi if hi > 0 else 0.0
        name = f"eps at delta={arg:.3g}" if query == "eps" else f"delta at eps={arg:.8g}"
        print(f"{label:26s} {name:>22s}  [{lo:<20.15g}, {hi:<20.15g}] {width:9.2e} {seconds:6.2f}")


if __name__ == "__main__":
    main()
