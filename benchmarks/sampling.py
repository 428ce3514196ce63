"""Epsilon of DP-SGD under the samplings people run: Poisson, random allocation, without replacement.

For each setting (noise multiplier sigma, dataset N, batch B, epochs E, delta) it prints
fdp's certified bracket for Poisson sampling at p = B / N over E ceil(N / B) steps, for
random allocation (E epochs of t = ceil(N / B) steps, each example in exactly one), and
for batches of exactly B drawn without replacement (the same steps; its epsilon is for
replacing one example, its lower end an attack, so its bracket is wide by nature), the
certified lower bound of shuffled batches (``fdp.shuffled_lower_bound``: no upper bound is known),
with the time of each (cold: the random-allocation lattice built afresh; warm: a
second accountant of the same epoch, the lattice cached), and, with ``--peer``,
PLD_accounting's random-allocation bracket (``gaussian_allocation_epsilon_range``, its
own accuracy default) run in a subprocess under ``--peer-timeout`` seconds.

A second table does the same for DP-SGD-JL (``fdp.JL`` steps): Poisson against random
allocation of the JL step (``fdp.RandomAllocation(fdp.JL(...))``), where its lattice fits.
A third, for k > 1 steps per example (``selected=k``, t = ceil(N k / B)): the bracket, and
the lower bound the sum of the outputs alone gives (k mu sqrt(E / t)-GDP), which was
fdp's before the class sum (:mod:`fdp.mechanisms.allocation_class_sum`).

    python benchmarks/sampling.py [--peer] [--peer-timeout 300] [--json PATH] [--quick] [--only TEXT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import sys
import time
import warnings
from typing import Any

#: (name, sigma, N, B, epochs); delta = 1e-5 throughout.
SETTINGS = [
    ("issue 27: sigma 1, t 235, 10 epochs", 1.0, 60000, 256, 10),
    ("issue 27: sigma 1, t 235, 60 epochs", 1.0, 60000, 256, 60),
    ("MNIST, sigma 1.1, B 256, 60 epochs", 1.1, 60000, 256, 60),
    ("seed's IMDb size, sigma 1, B 256, 15 epochs", 1.0, 25000, 256, 15),
    ("CIFAR-10 size, sigma 2, B 1024, 100 epochs", 2.0, 50000, 1024, 100),
    ("small noise: sigma 0.7, t 235, 10 epochs", 0.7, 60000, 256, 10),
    ("small noise: sigma 0.6, t 235, 10 epochs", 0.6, 60000, 256, 10),
    ("small noise: sigma 0.5, t 235, 10 epochs", 0.5, 60000, 256, 10),
    ("small noise: sigma 0.6, B 256, N 25,000 (t 98), 15 epochs", 0.6, 25000, 256, 15),
]
QUICK = [("quick: sigma 2, t 11, 3 epochs", 2.0, 1050, 100, 3)]
#: (name, sigma, r, N, B, epochs) of DP-SGD-JL.
JL_SETTINGS = [
    ("sigma 2, r 30, t 235, 60 epochs", 2.0, 30, 60000, 256, 60),
    ("sigma 1, r 100, t 235, 10 epochs", 1.0, 100, 60000, 256, 10),
    ("sigma 3, r 30, t 49, 100 epochs", 3.0, 30, 50000, 1024, 100),
    ("sigma 1, r 30, t 235, 10 epochs", 1.0, 30, 60000, 256, 10),
    ("sigma 1, r 10, t 235, 10 epochs", 1.0, 10, 60000, 256, 10),
    ("the seed's IMDb: sigma 0.6, r 30, t 98, 15 epochs", 0.6, 30, 25000, 256, 15),
    ("sigma 1, r 3, t 235, 10 epochs (refused)", 1.0, 3, 60000, 256, 10),
]
JL_QUICK = [("quick: sigma 3, r 30, t 11, 3 epochs", 3.0, 30, 1050, 100, 3)]
#: (name, sigma, k, N, B, epochs) of k-of-t random allocation.
SELECTED_SETTINGS = [
    ("sigma 1, k 2, t 469, 60 epochs", 1.0, 2, 60000, 256, 60),
    ("sigma 2, k 2, t 469, 60 epochs", 2.0, 2, 60000, 256, 60),
    ("sigma 1, k 4, t 938, 60 epochs", 1.0, 4, 60000, 256, 60),
    ("sigma 1, k 3, t 21 (N 700, B 100), 10 epochs", 1.0, 3, 700, 100, 10),
]
SELECTED_QUICK = [("quick: sigma 2, k 2, t 21, 3 epochs", 2.0, 2, 1050, 100, 3)]
DELTA = 1e-5


def _fdp(sigma: float, n: int, b: int, epochs: int) -> dict[str, Any]:
    import fdp
    from fdp.mechanisms import random_allocation

    start = time.perf_counter()
    poisson = fdp.dpsgd(noise_multiplier=sigma, batch_size=b, dataset_size=n, epochs=epochs).get_epsilon_bounds(DELTA)
    t_poisson = time.perf_counter() - start
    for cache in (random_allocation._lattice, random_allocation._atoms, random_allocation._mixture_lattice,
                  random_allocation._mixture_atoms):
        cache.cache_clear()
    times = []
    for _ in range(2):  # cold, then warm (the epoch's lattice cached)
        start = time.perf_counter()
        alloc = fdp.dpsgd(noise_multiplier=sigma, batch_size=b, dataset_size=n, epochs=epochs,
                          sampling="random_allocation").get_epsilon_bounds(DELTA)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the analysis gap's warning: the bracket says it
        fixed = fdp.dpsgd(noise_multiplier=sigma, batch_size=b, dataset_size=n, epochs=epochs,
                          sampling="without_replacement").get_epsilon_bounds(DELTA)
    t_fixed = time.perf_counter() - start
    start = time.perf_counter()
    shuffled = fdp.shuffled_lower_bound(sigma, b, n, epochs, DELTA)
    return {"poisson": poisson, "poisson_s": t_poisson, "allocation": alloc, "allocation_cold_s": times[0],
            "allocation_warm_s": times[1], "without_replacement": fixed, "without_replacement_s": t_fixed,
            "shuffled_lower": shuffled, "shuffled_s": time.perf_counter() - start}


def _fdp_jl(sigma: float, r: int, n: int, b: int, epochs: int) -> dict[str, Any]:
    import fdp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a bracket wider than the tolerance: the table shows it
        start = time.perf_counter()
        poisson = fdp.dpsgd(noise_multiplier=sigma, batch_size=b, dataset_size=n, epochs=epochs,
                            jl_projections=r).get_epsilon_bounds(DELTA)
        t_poisson = time.perf_counter() - start
        start = time.perf_counter()
        try:
            alloc: Any = fdp.dpsgd(noise_multiplier=sigma, batch_size=b, dataset_size=n, epochs=epochs,
                                   jl_projections=r, sampling="random_allocation").get_epsilon_bounds(DELTA)
        except ValueError as err:
            alloc = str(err)
    return {"poisson": poisson, "poisson_s": t_poisson, "allocation": alloc,
            "allocation_s": time.perf_counter() - start}


def _jl_table(settings: list[Any]) -> list[dict[str, Any]]:
    rows = []
    print("\nDP-SGD-JL:")
    print("| setting | fdp Poisson JL | s | fdp random allocation of JL | s (cold) |")
    print("|---|---|---|---|---|")
    for name, sigma, r, n, b, epochs in settings:
        row: dict[str, Any] = {"setting": name, "sigma": sigma, "r": r, "N": n, "B": b, "epochs": epochs,
                               **_fdp_jl(sigma, r, n, b, epochs)}
        rows.append(row)
        alloc = row["allocation"]
        if isinstance(alloc, str):  # the refusal: how much tail its lattice would leave per epoch
            tail = re.search(r"P1-mass (\S+) per epoch", alloc)
            shown = f"refused ({tail.group(1) if tail else '?'} of P1-mass per epoch above the lattice)"
        else:
            shown = _bracket(alloc)
        print(f"| {name} | {_bracket(row['poisson'])} | {row['poisson_s']:.2f} | {shown} "
              f"| {row['allocation_s']:.2f} |", flush=True)
    return rows


def _peer_worker(queue: Any, sigma: float, t: int, epochs: int) -> None:
    from PLD_accounting import gaussian_allocation_epsilon_range

    start = time.perf_counter()
    upper, lower = gaussian_allocation_epsilon_range(delta=DELTA, sigma=sigma, num_steps=t, num_epochs=epochs)
    queue.put((lower, upper, time.perf_counter() - start))


def _peer(sigma: float, t: int, epochs: int, timeout: float) -> dict[str, Any]:
    queue: Any = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_peer_worker, args=(queue, sigma, t, epochs))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        return {"peer": None, "peer_s": None, "peer_note": f"did not finish in {timeout:.0f} s"}
    if queue.empty():
        return {"peer": None, "peer_s": None, "peer_note": f"failed (exit code {proc.exitcode})"}
    lower, upper, seconds = queue.get()
    return {"peer": (lower, upper), "peer_s": seconds, "peer_note": ""}


def _chosen(settings: list[Any], only: str | None) -> list[Any]:
    return [row for row in settings if only is None or only in row[0]]


def _bracket(pair: Any) -> str:
    if pair is None:
        return "—"
    lo, hi = pair
    return f"[{lo:.4f}, {hi:.4f}] ({100 * (hi - lo) / hi:.2f} %)"


def _selected_table(settings: list[Any]) -> list[dict[str, Any]]:
    import fdp

    rows = []
    print("\nk steps per example (random allocation, selected=k):")
    print("| setting | fdp bracket | s | outputs' sum alone (lower) |")
    print("|---|---|---|---|")
    for name, sigma, k, n, b, epochs in settings:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a bracket wider than the tolerance: the table shows it
            start = time.perf_counter()
            acc = fdp.dpsgd(noise_multiplier=sigma, batch_size=b, dataset_size=n, epochs=epochs,
                            sampling="random_allocation", selected=k)
            bracket = acc.get_epsilon_bounds(DELTA)
            seconds = time.perf_counter() - start
            (epoch, count), = acc.events
            t = epoch.steps_per_epoch
            outputs = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma * t ** 0.5 / k), count)
            outputs_lower = outputs.get_epsilon_bounds(DELTA)[0]
        rows.append({"setting": name, "sigma": sigma, "k": k, "t": t, "epochs": count, "bracket": bracket,
                     "s": seconds, "outputs_sum_lower": outputs_lower})
        print(f"| {name} | {_bracket(bracket)} | {seconds:.2f} | {outputs_lower:.4f} |", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", action="store_true", help="also run PLD_accounting (pip install PLD_accounting)")
    parser.add_argument("--peer-timeout", type=float, default=300.0, help="seconds per peer run")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="one small setting (a smoke test)")
    parser.add_argument("--only", help="only the settings whose name contains this text (both tables)")
    args = parser.parse_args(argv)
    rows = []
    print(f"delta = {DELTA:g}; epsilon brackets are certified [lower, upper] (width)")
    print("| setting | t | fdp Poisson | s | fdp random allocation | s cold / warm | PLD_accounting random allocation "
          "| s | fdp without replacement (replace-one) | s | shuffled, lower bound | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, sigma, n, b, epochs in _chosen(QUICK if args.quick else SETTINGS, args.only):
        t = -(-n // b)
        row: dict[str, Any] = {"setting": name, "sigma": sigma, "N": n, "B": b, "epochs": epochs, "t": t,
                               **_fdp(sigma, n, b, epochs)}
        if args.peer:
            row.update(_peer(sigma, t, epochs, args.peer_timeout))
        rows.append(row)
        peer = _bracket(row.get("peer")) if args.peer else "(not run)"
        peer_s = f"{row['peer_s']:.1f}" if row.get("peer_s") else (row.get("peer_note") or "—")
        print(f"| {name} | {t} | {_bracket(row['poisson'])} | {row['poisson_s']:.2f} | {_bracket(row['allocation'])} "
              f"| {row['allocation_cold_s']:.2f} / {row['allocation_warm_s']:.2f} | {peer} | {peer_s} "
              f"| {_bracket(row['without_replacement'])} | {row['without_replacement_s']:.2f} "
              f"| >= {row['shuffled_lower']:.4f} | {row['shuffled_s']:.2f} |", flush=True)
    jl_rows = _jl_table(_chosen(JL_QUICK if args.quick else JL_SETTINGS, args.only))
    selected_rows = _selected_table(_chosen(SELECTED_QUICK if args.quick else SELECTED_SETTINGS, args.only))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dpsgd": rows, "dpsgd_jl": jl_rows, "selected": selected_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
