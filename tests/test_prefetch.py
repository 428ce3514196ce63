"""fdp._kernels.prefetch: helper processes compile a cold query's later kernels.

What must hold: a helper compiles exactly what the query then loads (same argument
types, else the query compiles it again and nothing is gained); a query with helpers
gives the same bounds as one without; a helper that dies or hangs never makes a query
wait (beyond a bounded time); nothing starts when switched off or in a forked child.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from fdp._kernels import prefetch
from fdp.pld import discretise, pmf

JL_QUERY = ("fdp.dpsgd(noise_multiplier=0.8, batch_size=64, dataset_size=6400, epochs=1, jl_projections=10)"
            ".get_epsilon_bounds(1e-5)")
GAUSSIAN_QUERY = "fdp.dpsgd(noise_multiplier=1.1, batch_size=64, dataset_size=6400, epochs=2).get_epsilon_bounds(1e-5)"


def _python(code: str, cache, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(cache), **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def fresh_state(monkeypatch):
    """This process's prefetch state, emptied for the test and restored after it."""
    saved = (set(prefetch._seen), dict(prefetch._done), list(prefetch._helpers))
    prefetch._forget()
    yield
    for proc in prefetch._helpers:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _wait_closed(proc)
    prefetch._forget()
    prefetch._seen.update(saved[0])
    prefetch._done.update(saved[1])
    prefetch._helpers.extend(saved[2])


def _wait_closed(proc, seconds: float = 5.0) -> bool:
    """Whether the listener closes the helper's pipe within ``seconds`` of its end."""
    end = time.perf_counter() + seconds
    while not proc.stdout.closed and time.perf_counter() < end:
        time.sleep(0.01)
    return proc.stdout.closed


def test_a_helper_compiles_exactly_what_the_queries_then_load(tmp_path):
    """On an empty cache: every group is cold; a helper reports each group; afterwards none
    is cold and a Gaussian and a JL query compile none of the gated kernels."""
    helper = (
        "from fdp._kernels import prefetch\n"
        "print(prefetch.cold_groups(prefetch.GROUPS))\n"
        "proc = prefetch._spawn(list(prefetch.GROUPS))\n"
        "print([line.strip() for line in proc.stdout])\n"
        "print(proc.wait(), prefetch.cold_groups(prefetch.GROUPS))\n"
    )
    cold, reported, after = _python(helper, tmp_path).splitlines()
    assert cold == str(list(prefetch.GROUPS))
    assert reported == str([f"compiled {g}" for g in prefetch.GROUPS])
    assert after == "0 []"
    probe = (
        "import json\n"
        "from numba.core import event\n"
        "import fdp\n"
        "from fdp._kernels import prefetch\n"
        "gated = {d.py_func.__qualname__ for ks in prefetch._KERNELS.values() for d in ks}\n"
        "with event.install_recorder('numba:compile') as rec:\n"
        f"    {GAUSSIAN_QUERY}\n"
        f"    {JL_QUERY}\n"
        "compiled = {ev.data['dispatcher'].py_func.__qualname__ for _, ev in rec.buffer if ev.is_start}\n"
        "print(json.dumps(sorted(compiled & gated)))\n"
    )
    assert json.loads(_python(probe, tmp_path, FDP_PREFETCH="0")) == []


def test_a_cold_query_with_helpers_gives_the_same_bounds(tmp_path):
    """A JL query on an empty cache hands the accountant's groups to min(spare cores, 2)
    helpers (its own, jl, it compiles itself); its bounds are those of a query without."""
    code = (
        "import fdp\n"
        "from fdp._kernels import prefetch\n"
        f"print(repr({JL_QUERY}))\n"
        "print(sorted(prefetch._done), len(prefetch._helpers), prefetch._spare_cores())\n"
    )
    bounds, state = _python(code, tmp_path).splitlines()
    handed, helpers, spare = state.rsplit(" ", 2)
    expected_helpers = min(int(spare), 2)
    assert int(helpers) == expected_helpers
    assert handed == (str(["merge", "pmf"]) if expected_helpers else "[]")
    alone = _python(code, tmp_path, FDP_PREFETCH="0").splitlines()
    assert alone[0] == bounds  # the same floats, printed with repr
    assert alone[1] == f"[] 0 {spare}"  # switched off: nothing handed over


def test_only_known_groups_can_be_gated():
    with pytest.raises(ValueError, match="group must be one of .*'fft'"):
        prefetch.gated("fft")
    with pytest.raises(ValueError, match="group must be one of .*'fft'"):
        prefetch.compile_group("fft")


def test_a_gated_kernel_is_still_its_dispatcher():
    kernel = pmf._log_mgf
    assert kernel.group == "pmf"
    assert kernel.py_func is kernel.dispatcher.py_func
    assert kernel.dispatcher in prefetch._KERNELS["pmf"]


def _fake_helper(code: str):
    def spawn(groups):
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return spawn


def test_a_helper_that_dies_does_not_keep_a_query_waiting(fresh_state, monkeypatch):
    monkeypatch.setattr(prefetch, "_spawn", _fake_helper("raise SystemExit(3)"))
    monkeypatch.setattr(prefetch, "cold_groups", lambda groups: list(groups))
    monkeypatch.setattr(prefetch, "_spare_cores", lambda: 1)
    monkeypatch.delenv("FDP_PREFETCH", raising=False)
    prefetch.start(["jl", "pmf", "merge"])
    assert sorted(prefetch._done) == ["merge", "pmf"]  # jl kept: this process needs it first
    start = time.perf_counter()
    prefetch.wait_for("pmf")
    prefetch.wait_for("merge")
    assert time.perf_counter() - start < prefetch.WAIT_SECONDS / 3


def test_a_helper_that_hangs_is_waited_for_a_bounded_time(fresh_state, monkeypatch):
    monkeypatch.setattr(prefetch, "_spawn", _fake_helper("import time; time.sleep(120)"))
    monkeypatch.setattr(prefetch, "cold_groups", lambda groups: list(groups))
    monkeypatch.setattr(prefetch, "_spare_cores", lambda: 1)
    monkeypatch.setattr(prefetch, "WAIT_SECONDS", 0.5)
    monkeypatch.delenv("FDP_PREFETCH", raising=False)
    prefetch.start(["pmf", "merge"])
    assert sorted(prefetch._done) == ["merge"]  # pmf kept: this process needs it first
    start = time.perf_counter()
    merged = discretise._merge_sweep(0.5, np.full(4, 0.25), np.full(4, 0.01), 0.0, 0.0, 0.0, 0.0)
    assert 0.4 < time.perf_counter() - start < 10.0  # waited, then compiled (or loaded) it here
    assert merged.sum() == pytest.approx(1.0)
    start = time.perf_counter()  # given up on: no second wait (each gated call waited before)
    discretise._merge_sweep(0.5, np.full(4, 0.25), np.full(4, 0.01), 0.0, 0.0, 0.0, 0.0)
    assert time.perf_counter() - start < 0.3


def test_a_reported_group_is_not_waited_for_again(fresh_state, monkeypatch):
    monkeypatch.setattr(prefetch, "_spawn", _fake_helper(
        "import time; print('compiled merge', flush=True); time.sleep(120)"))
    monkeypatch.setattr(prefetch, "cold_groups", lambda groups: list(groups))
    monkeypatch.setattr(prefetch, "_spare_cores", lambda: 1)
    monkeypatch.setattr(prefetch, "WAIT_SECONDS", 20.0)
    monkeypatch.delenv("FDP_PREFETCH", raising=False)
    prefetch.start(["pmf", "merge"])
    start = time.perf_counter()
    prefetch.wait_for("merge")
    assert time.perf_counter() - start < 10.0


def test_nothing_starts_when_switched_off_or_without_a_spare_core(fresh_state, monkeypatch):
    spawned = []
    monkeypatch.setattr(prefetch, "_spawn", lambda groups: spawned.append(groups))
    monkeypatch.setattr(prefetch, "cold_groups", lambda groups: list(groups))
    monkeypatch.setenv("FDP_PREFETCH", "0")
    prefetch.start(["pmf", "merge"])
    monkeypatch.delenv("FDP_PREFETCH")
    monkeypatch.setattr(prefetch, "_spare_cores", lambda: 0)
    prefetch.start(["pmf", "merge"])
    assert spawned == [] and prefetch._done == {}


def test_each_group_is_looked_at_once_per_process(fresh_state, monkeypatch):
    looked = []
    monkeypatch.setattr(prefetch, "cold_groups", lambda groups: looked.append(list(groups)) or [])
    monkeypatch.delenv("FDP_PREFETCH", raising=False)
    prefetch.start(["jl", "pmf", "merge"])
    prefetch.start(["pmf", "merge"])
    assert looked == [["jl", "pmf", "merge"], []]


def test_a_helper_of_another_fdp_compiles_nothing(capsys):
    prefetch._helper_main("/not/this/fdp/_kernels/prefetch.py", ["jl"])
    assert capsys.readouterr().out == ""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_does_not_wait_for_its_parents_helpers(fresh_state):
    prefetch._done["merge"] = threading.Event()  # a helper of the parent, never reporting
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, json.dumps(sorted(prefetch._done)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as child:
        assert child.read() == "[]"
    os.waitpid(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_while_the_lock_is_held_can_still_start(fresh_state):
    """Another thread of the parent may be inside start() at the fork: the child's copy of
    the lock would stay held forever, and the child's first query would hang."""
    read, write = os.pipe()
    with prefetch._lock:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(read)
            got = prefetch._lock.acquire(timeout=2.0)
            os.write(write, b"acquired" if got else b"held")
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as child:
        assert child.read() == "acquired"
    os.waitpid(pid, 0)


def test_the_listener_closes_a_finished_helpers_pipe(fresh_state, monkeypatch):
    monkeypatch.setattr(prefetch, "_spawn", _fake_helper("print('compiled merge')"))
    monkeypatch.setattr(prefetch, "cold_groups", lambda groups: list(groups))
    monkeypatch.setattr(prefetch, "_spare_cores", lambda: 1)
    monkeypatch.delenv("FDP_PREFETCH", raising=False)
    prefetch.start(["pmf", "merge"])
    prefetch.wait_for("merge")
    (proc,) = prefetch._helpers
    assert _wait_closed(proc)


def test_queries_hand_over_only_the_groups_they_use(fresh_state, monkeypatch):
    """A pessimistic composed PLD or a tradeoff curve never runs the merging sweep: handing
    it to a helper would start one on every run (killed at exit before it is cached)."""
    asked = []
    monkeypatch.setattr(prefetch, "start", lambda groups: asked.append(list(groups)))
    import fdp

    acc = fdp.dpsgd(noise_multiplier=1.0, batch_size=64, dataset_size=6400, epochs=1)
    acc.composed_pld("remove", pessimistic=True)
    acc.tradeoff()
    assert all("merge" not in groups for groups in asked) and asked
    asked.clear()
    acc.composed_pld("remove", pessimistic=False)
    acc.get_epsilon_bounds(1e-5)
    acc.get_delta_bounds(1.0)
    assert [groups[-1] for groups in asked] == ["merge"] * 3
    jl = fdp.dpsgd(noise_multiplier=1.0, batch_size=64, dataset_size=6400, epochs=1, jl_projections=5)
    asked.clear()
    jl.composed_pld("add", pessimistic=True)
    assert asked == [["jl", "pmf"]]


def test_a_helper_imports_nothing_from_the_working_directory(tmp_path):
    """A package named fdp in the working directory (which `python -c` puts first on the
    path) must not run in a helper, whatever flags the parent ran with."""
    (tmp_path / "fdp").mkdir()
    marker = tmp_path / "ran"
    (tmp_path / "fdp" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    script = tmp_path / "parent" / "start.py"
    script.parent.mkdir()
    repo = str(pathlib.Path(prefetch.__file__).resolve().parents[2])
    script.write_text(
        f"import sys; sys.path.insert(0, {repo!r})\n"
        "from fdp._kernels import prefetch\n"
        "proc = prefetch._spawn([])\n"
        "print(proc.wait(), proc.stdout.read() == '')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True"]
    assert not marker.exists()
