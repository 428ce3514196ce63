"""P-mass one epoch of random allocation charges at +inf, with and without the tilt.

For the Gaussian step at small noise multipliers, the epoch's upper (pessimistic) pair puts
at +inf what its lattice cannot place: the tail above the top, and the round-off of the
FFT convolutions, which the remove direction weighs by the classes' likelihood ratios.
The convolutions are exponentially tilted (``fdp.mechanisms.allocation_fft.tilt_exponent``);
``--untilted`` also builds each lattice with the tilt off, for comparison. Each epoch's
charge adds to delta, so it bounds the smallest delta with a finite upper epsilon.

``--pairs`` prints, for the JL step with a frequent large term, the other charge: two
terms above the linear lattice's top T0 in one epoch, at each doubling of the lattice's
spacing from the bulk's (the plan stops at the first within ``PAIRS_SHARE`` of the limit).

    python benchmarks/allocation_charge.py [--untilted] [--quick]
    python benchmarks/allocation_charge.py --pairs
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

SIGMAS = (0.6, 0.5)
STEPS = (2, 10, 30, 98, 235)


def _charge(sigma: float, t: int) -> tuple[str, float]:
    import fdp
    import fdp.mechanisms.random_allocation as ra
    from fdp.pld.cells import Direction

    for cache in (ra._lattice, ra._atoms, ra._mixture_lattice, ra._mixture_atoms):
        cache.cache_clear()
    mu = 1 / sigma
    if ra._linear(mu, t):
        return "linear", ra._atoms(mu, t, Direction.REMOVE, True)[2]
    return "mixture", ra._mixture_atoms(fdp.Gaussian(noise_multiplier=sigma), t, Direction.REMOVE, True)[2]


#: (sigma, r, t) of the --pairs table: a frequent large term (benchmarks/sampling.py's JL rows).
PAIRS = ((1.0, 10, 235), (0.6, 30, 98))


def pairs_table() -> None:
    """Per doubling d of the spacing: T0 and the pair charge; the plan's own choice marked."""
    import math

    import fdp
    from fdp.mechanisms import allocation_mixtures as am

    print(f"| sigma | r | t | spacing / plan's | T0 | two large terms, P-mass per epoch | "
          f"within {am.PAIRS_SHARE} x {am.TAIL_LIMIT:g} |")
    print("|---|---|---|---|---|---|---|")
    for sigma, r, t in PAIRS:
        mechanism = fdp.JL(noise_multiplier=sigma, jl_projections=r)
        plan = am.mixture_plan(mechanism, t)
        mus, weights = am.step_components(mechanism, True)
        for d in range(-5, 3):
            spacing = plan.spacing * 2.0**d
            log_t0 = math.log(plan.classes * spacing)
            charge = am._two_large(mus, weights, log_t0, t)
            fits = "yes" if charge <= am.PAIRS_SHARE * am.TAIL_LIMIT else "no"
            mark = " (the plan)" if d == 0 else ""
            print(f"| {sigma} | {r} | {t} | 2^{d}{mark} | {math.exp(log_t0):.4g} | {charge:.2g} | {fits} |",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--untilted", action="store_true", help="also build each lattice without the tilt")
    parser.add_argument("--quick", action="store_true", help="one small setting (a smoke test)")
    parser.add_argument("--pairs", action="store_true", help="the two-large-terms charge of the JL step instead")
    args = parser.parse_args(argv)
    if args.pairs:
        pairs_table()
        return 0
    import fdp.mechanisms.allocation_fft as lattice_fft

    settings = [(0.6, 10)] if args.quick else [(s, t) for s in SIGMAS for t in STEPS]
    print("| sigma | t | route | P-mass at +inf per epoch | untilted | s |")
    print("|---|---|---|---|---|---|")
    tilt = lattice_fft.tilt_exponent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for sigma, t in settings:
            start = time.perf_counter()
            route, charged = _charge(sigma, t)
            flat = "—"
            if args.untilted:
                lattice_fft.tilt_exponent = lambda *a, **k: 0.0
                try:
                    flat = f"{_charge(sigma, t)[1]:.2g}"
                finally:
                    lattice_fft.tilt_exponent = tilt
            print(f"| {sigma} | {t} | {route} | {charged:.2g} | {flat} | {time.perf_counter() - start:.1f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
