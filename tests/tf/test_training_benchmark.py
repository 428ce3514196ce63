"""Smoke test of benchmarks/training.py: the --quick setting runs and prints its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "training.py"
OPTIMIZERS = ("non-DP Adam", "DPAdamJL r=1", "DPAdamJL r=2", "DPAdamVanilla (exact)")
METHODS = {"jl1": "auto", "jl2": "auto", "vanilla": "layerwise", "vanilla_loop": "loop"}


#: A smoke test's limit, not a timing: alone the MNIST run takes ~1 min here, but beside two
#: busy test workers it once took over 600 s (2026-11-27), so the limit only catches a hang.
SMOKE_TIMEOUT = 1800


def _env() -> dict[str, str]:
    """The subprocess's environment: one op thread each when the test workers share the
    cores (as tests/tf/conftest.py sets for the workers themselves)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        env.update(OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    return env


def _run(tmp_path: Path, *extra: str) -> tuple[str, dict]:
    out = tmp_path / "training.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out), *extra],
        capture_output=True, text=True, timeout=SMOKE_TIMEOUT, env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


def _check(stdout: str, results: dict, models: list[str]) -> None:
    assert list(results["results"]) == models
    for model in models:
        rows = results["results"][model]
        expected = ["adam", "jl1", "jl2", "vanilla", "vanilla_loop"]
        assert list(rows) == expected
        for row in rows.values():
            assert "error" not in row, row
            assert row["seconds_per_step"] > 0 and row["steps_measured"] == 2
        assert f"{model}, expected batch" in stdout
    if "mnist" in models:  # what "auto" picks for a CNN inside fit
        assert {o: r["method"] for o, r in results["results"]["mnist"].items() if o in METHODS} == METHODS
    for label in OPTIMIZERS:
        assert f"| {label} |" in stdout
    assert "tensorflow_privacy:" in stdout


def test_quick_benchmark_mnist(tmp_path: Path) -> None:
    stdout, results = _run(tmp_path, "--models", "mnist")
    _check(stdout, results, ["mnist"])


@pytest.mark.slow  # ~1 minute: tracing second-order gradients through the BiLSTM loops
def test_quick_benchmark_both_models_with_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    stdout, results = _run(tmp_path, "--png", str(tmp_path / "training.png"))
    _check(stdout, results, ["imdb", "mnist"])
    assert (tmp_path / "training.png").stat().st_size > 1000


def test_check_cost_benchmark_runs(tmp_path: Path) -> None:
    """benchmarks/check_cost.py --quick: every variant steps, the paired costs print."""
    out = tmp_path / "check_cost.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "check_cost.py"), "--quick", "--models", "mnist",
         "--json", str(out)],
        capture_output=True, text=True, timeout=SMOKE_TIMEOUT, env=_env(), cwd=SCRIPT.parent,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = json.loads(out.read_text())
    assert set(result["seconds"]) == {"non-DP", "JL r=1", "JL r=1, checks off", "JL r=1, probe",
                                      "JL r=1, probe base", "exact", "exact, checks off", "exact, probe",
                                      "exact, probe base", "exact, again"}
    assert all(t > 0 for t in result["seconds"].values())
    assert "checks cost, JL r=1:" in proc.stdout and "checks cost, exact:" in proc.stdout
    assert "the probe adds" in proc.stdout
    assert "noise floor (exact against itself" in proc.stdout and "noise floor" in result


def test_check_cost_parts_switch_one_check_off_and_restore_it() -> None:
    """--parts: each part's patch replaces exactly its function while active and puts
    the original back afterwards (also when the step raises)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import check_cost
    finally:
        sys.path.remove(str(SCRIPT.parent))
    patches = check_cost._part_patches()
    assert set(patches) == set(check_cost.PARTS) and set(check_cost.ALL_CHECKS) <= set(check_cost.PARTS)
    for part, (module, name, _) in patches.items():
        original = getattr(module, name)
        with pytest.raises(RuntimeError):
            with check_cost.without(part):
                assert getattr(module, name) is not original, part
                others = [getattr(m, n) for p, (m, n, _) in patches.items() if p != part]
                raise RuntimeError
        assert getattr(module, name) is original, part
        assert others == [getattr(m, n) for p, (m, n, _) in patches.items() if p != part]
