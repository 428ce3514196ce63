"""The first query of a fresh install: cold (empty Numba cache) and warm, in new processes.

Each row runs a new Python process that imports fdp and answers one query:
  Gaussian: fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60)
  JL:       fdp.dpsgd(noise_multiplier=0.6, batch_size=256, dataset_size=25000, epochs=15, jl_projections=10)
both with .get_epsilon_bounds(1e-5). "cold" uses a fresh, empty NUMBA_CACHE_DIR (what a
fresh install sees: every kernel the query needs is compiled), "warm" the same cache
again (the kernels are loaded); "cold, FDP_PREFETCH=0" compiles everything in the query's
process (no helper: :mod:`fdp._kernels.prefetch`). Also the time of `fdp warmup` on an empty cache.

Usage:
  python benchmarks/first_call.py [--repeats 2] [--kernels] [--floor] [--concurrent 2]
  PYTHONPATH=/path/to/other/checkout python benchmarks/first_call.py   # the same for another version
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

QUERY = {
    "Gaussian": "fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60)",
    "JL (r = 10)": "fdp.dpsgd(noise_multiplier=0.6, batch_size=256, dataset_size=25000, epochs=15, jl_projections=10)",
}
SCRIPT = """
import time
t0 = time.perf_counter()
import fdp
t1 = time.perf_counter()
{query}.get_epsilon_bounds(1e-5)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def run(query: str, cache: str, **env: str) -> tuple[float, float, float]:
    """(import, query, process wall time) in seconds."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(query=query)], capture_output=True, text=True,
                         env={**os.environ, "NUMBA_CACHE_DIR": cache, **env}, check=True,
                         cwd=cache).stdout  # not this checkout's directory, which `-c` would put first
    wall = time.perf_counter() - start
    imp, q = (float(v) for v in out.split())
    return imp, q, wall


KERNELS = """
from numba.core import event
import fdp
with event.install_recorder("numba:compile") as rec:
    {query}.get_epsilon_bounds(1e-5)
start, spent = {{}}, {{}}
for ts, ev in rec.buffer:  # nested compiles (callees) are inside their caller's time
    key = ev.data["dispatcher"].py_func.__qualname__
    if ev.is_start:
        start[key] = ts
    else:
        spent[key] = spent.get(key, 0.0) + ts - start.pop(key)
for key, sec in sorted(spent.items(), key=lambda kv: -kv[1])[:8]:
    print(f"{{sec:.2f}} {{key}}")
"""


def kernels(query: str) -> str:
    """Numba compile time per kernel of a cold query (numba.core.event), largest first."""
    with tempfile.TemporaryDirectory() as cache:
        return subprocess.run([sys.executable, "-c", KERNELS.format(query=query)], capture_output=True, text=True,
                              env={**os.environ, "NUMBA_CACHE_DIR": cache}, check=True, cwd=cache).stdout


FLOOR_IMPORT = "import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
FLOOR_LOAD = """
import time
import numpy as np
from fdp.pld.pmf import DiscretePLD
pld = DiscretePLD(h=0.5, offset=-4, pmf=np.full(9, 0.1), p_inf=0.0)
t0 = time.perf_counter(); pld.mean(); t1 = time.perf_counter(); pld.log_mgf(np.array([1.0]))
print(t1 - t0, time.perf_counter() - t1)
"""


def floor(cache: str) -> None:
    """What a warm process pays before any fdp code runs: each big import alone, and the
    first and second kernel loaded from a warm cache (Numba loads its registries once)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    for module in ("numpy", "scipy.special", "numba", "fdp"):
        out = subprocess.run([sys.executable, "-c", FLOOR_IMPORT.format(module=module)], capture_output=True,
                             text=True, env=env, check=True, cwd=cache).stdout
        print(f"import {module} alone: {float(out):.2f} s")
    for _ in range(2):  # the first run fills the cache
        out = subprocess.run([sys.executable, "-c", FLOOR_LOAD], capture_output=True, text=True, env=env,
                             check=True, cwd=cache).stdout
    first, second = (float(v) for v in out.split())
    print(f"warm cache: first kernel loaded in {first:.3f} s, the second in {second:.4f} s")


def concurrent(query: str, processes: int, **env: str) -> list[float]:
    """Process wall times of ``processes`` cold queries started together on one empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", SCRIPT.format(query=query)], stdout=subprocess.DEVNULL,
                                  env={**os.environ, "NUMBA_CACHE_DIR": cache, **env}, cwd=cache)
                 for _ in range(processes)]
        walls = []
        for proc in procs:
            proc.wait()
            walls.append(time.perf_counter() - start)
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="cold/warm pairs per query (the median is shown)")
    ap.add_argument("--kernels", action="store_true", help="also: compile seconds per kernel of each cold query")
    ap.add_argument("--floor", action="store_true", help="also: the start-up a warm process pays before fdp runs")
    ap.add_argument("--concurrent", type=int, default=0, metavar="K",
                    help="also: K cold Gaussian queries started together, with helpers and with FDP_PREFETCH=0")
    args = ap.parse_args()
    print("| query | cache | import (s) | query (s) | process (s) |")
    print("|---|---|---:|---:|---:|")
    for name, query in QUERY.items():
        rows: dict[str, list[tuple[float, float, float]]] = {"cold": [], "cold, FDP_PREFETCH=0": [], "warm": []}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:  # one helper process when there is a spare core
                rows["cold"].append(run(query, cache))
                rows["warm"].append(run(query, cache))
            with tempfile.TemporaryDirectory() as cache:  # all compiled in the query's process
                rows["cold, FDP_PREFETCH=0"].append(run(query, cache, FDP_PREFETCH="0"))
        for kind, values in rows.items():
            med = [sorted(v[i] for v in values)[len(values) // 2] for i in range(3)]
            print(f"| {name} | {kind} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} |")
    if args.floor:
        with tempfile.TemporaryDirectory() as cache:
            floor(cache)
    if args.concurrent:
        for label, env in (("helpers", {}), ("FDP_PREFETCH=0", {"FDP_PREFETCH": "0"})):
            walls = concurrent(QUERY["Gaussian"], args.concurrent, **env)
            print(f"{args.concurrent} cold Gaussian queries together ({label}): "
                  + ", ".join(f"{w:.2f}" for w in walls) + " s")
    if args.kernels:
        for name, query in QUERY.items():
            print(f"cold {name}, compile seconds per kernel (callees included):")
            print(kernels(query), end="")
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "fdp", "warmup", "--json"], capture_output=True,
                              env={**os.environ, "NUMBA_CACHE_DIR": cache}, cwd=cache).returncode == 0
        warmup = time.perf_counter() - start
        if not done:  # an fdp without the command (e.g. an older checkout on PYTHONPATH)
            print("fdp warmup: not available")
            return
        after = run(QUERY["JL (r = 10)"], cache)
    print(f"fdp warmup on an empty cache: {warmup:.1f} s; then the JL query's process takes {after[2]:.2f} s")


if __name__ == "__main__":
    main()
