"""Smoke tests of the training benchmarks (training.py, step_profile.py, seed_accuracy.py): --quick runs and prints."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "training.py"
OPTIMIZERS = ("non-DP Adam", "DPAdamJL r=1", "DPAdamJL r=2", "DPAdamVanilla (exact)")
METHODS = {"jl1": "auto", "jl2": "layerwise", "vanilla": "layerwise", "vanilla_loop": "loop"}


def _script(name: str) -> Any:
    """The benchmark script ``name`` as a module: the smoke tests run it in this test
    process. As subprocesses (a second TensorFlow beside two busy test workers) they
    stalled for 30 minutes in CI and here, though each takes ~1 min alone."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPT.parent))


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, dict]:
    out = tmp_path / "training.json"
    _script("training").main(["--quick", "--json", str(out), *extra])
    return capsys.readouterr().out, json.loads(out.read_text())


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


def test_quick_benchmark_mnist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stdout, results = _run(tmp_path, capsys, "--models", "mnist")
    _check(stdout, results, ["mnist"])


@pytest.mark.slow  # ~1 minute: tracing second-order gradients through the BiLSTM loops
def test_quick_benchmark_both_models_with_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    stdout, results = _run(tmp_path, capsys, "--png", str(tmp_path / "training.png"))
    _check(stdout, results, ["imdb", "mnist"])
    assert (tmp_path / "training.png").stat().st_size > 1000


@pytest.mark.slow  # 1.5-4 min: ten variants traced
def test_check_cost_benchmark_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/check_cost.py --quick: every variant steps, the paired costs print."""
    out = tmp_path / "check_cost.json"
    assert _script("check_cost").main(["--quick", "--models", "mnist", "--json", str(out)]) in (0, None)
    stdout = capsys.readouterr().out
    (result,) = json.loads(out.read_text())
    assert set(result["seconds"]) == {"non-DP", "JL r=1", "JL r=1, checks off", "JL r=1, probe",
                                      "JL r=1, probe base", "exact", "exact, checks off", "exact, probe",
                                      "exact, probe base", "exact, again"}
    assert all(t > 0 for t in result["seconds"].values())
    assert "checks cost, JL r=1:" in stdout and "checks cost, exact:" in stdout
    assert "the probe adds" in stdout
    assert "noise floor (exact against itself" in stdout and "noise floor" in result


def test_check_cost_parts_switch_one_check_off_and_restore_it() -> None:
    """--parts: each part's patch replaces exactly its function while active and puts
    the original back afterwards (also when the step raises)."""
    check_cost = _script("check_cost")
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


def test_quick_step_profile(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/step_profile.py --quick times every piece of the private step."""
    _script("step_profile").main(["--quick"])
    stdout = capsys.readouterr().out
    for piece in _script("step_profile").PIECES:
        assert f"| {piece} |" in stdout


def test_quick_tangent_loop(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/tangent_loop.py --quick: both tangent routes agree and are timed, and the loop
    fdp_tf's tangent pass becomes under the directions' map carries the primal state once
    (the RESULTS claim that the r x cost is the tangents', not a stacked primal)."""
    assert _script("tangent_loop").main(["--quick"]) == 0
    stdout = capsys.readouterr().out
    rows = [line.split("|") for line in stdout.splitlines() if line.startswith(("| 1 |", "| 3 |"))]
    assert len(rows) == 2 and all(float(row[5]) < 1e-5 for row in rows)
    vectorized = [line for line in stdout.splitlines() if "(5, 16, 13)" in line]
    assert vectorized, stdout
    # the vectorized loop carries h and c unstacked beside their stacked tangents
    assert all("(16, 13), (16, 13), (5, 16, 13), (5, 16, 13)" in line for line in vectorized)


def test_first_step_memory_measures_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/first_step_memory.py, one configuration in this process (the script runs each
    in a fresh one: ``--quick``): every phase measured, the graph counted, the table printed."""
    module = _script("first_step_memory")
    row = module.measure("nondp", batch=2, length=4, skip_probe=False, python_heap=True)
    assert row["graph"]["nodes"] > 100 and row["graph"]["functions"] >= 1
    for phase in ("trace", "first call", "second call", "third call"):
        assert row[phase]["seconds"] > 0 and row[phase]["peak_mib"] >= 0
    assert row["trace"]["python_heap_peak_mib"] > 0
    module._print([{**row, "skip_probe": False}, {"config": "jl1", "skip_probe": True, "error": "boom"}])
    stdout = capsys.readouterr().out
    assert "| non-DP Adam |" in stdout and "| DP-Adam-JL r=1, auto (layer taps), probe skipped | failed: boom |" in stdout


@pytest.mark.slow  # ~1 minute: JL's trace through the BiLSTM, twice
def test_first_step_memory_quick(capsys: pytest.CaptureFixture[str]) -> None:
    assert _script("first_step_memory").main(["--quick"]) == 0
    assert "probe skipped |" in capsys.readouterr().out


@pytest.mark.slow  # ~1 minute: four models trained for one epoch
def test_quick_seed_accuracy(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/seed_accuracy.py --quick trains every method and prints accuracy and epsilon."""
    module = _script("seed_accuracy")
    module.main(["--quick"])
    stdout = capsys.readouterr().out
    for method in module.METHODS:
        row = next(line for line in stdout.splitlines() if line.startswith(f"| {method} |"))
        accuracy, epsilon = row.split("|")[2], row.split("|")[3]
        assert 0.0 <= float(accuracy.split()[0]) <= 1.0
        assert (epsilon.strip() == "inf") == (method == "non-DP SGD")


def test_max_batch_search_and_one_measured_run(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/max_batch.py: the doubling-then-bisection search finds the largest batch under
    the cap (on a fake linear memory model), a run out of memory counts as over, another
    failure is raised, and one real two-step run completes (in this process, whose peak
    RSS may predate the run: the growth is only meaningful in the script's fresh processes)."""
    module = _script("max_batch")
    assert module._build("cnn17m").count_params() == 17_149_298
    assert module._build("cnn").count_params() == 26_010

    def linear(model_name: str, opt_name: str, batch: int, timeout: float) -> dict[str, Any]:
        if batch > 3000:
            return {"error": "exit -9: killed", "out_of_memory": True}
        return {"growth_mib": 0.5 * batch, "seconds": 0.0, "parameters": 1}

    monkeypatch.setattr(module, "_measure", linear)
    found = module.largest_batch("cnn", "sgd", cap_mib=1000.0, start=64, max_batch=60_000, resolution=0.05,
                                 timeout=1.0, log=lambda s: None)
    assert found["largest"] <= 2000 < found["first_over"] <= found["largest"] * 1.05
    monkeypatch.setattr(module, "_measure", lambda *a: {"error": "exit 1: ValueError: bug", "out_of_memory": False})
    with pytest.raises(RuntimeError, match="ValueError: bug"):
        module.largest_batch("cnn", "jl2", cap_mib=1000.0, start=8, max_batch=64, resolution=0.1,
                             timeout=1.0, log=lambda s: None)
    row = module.run_one("cnn", "jl2", 8)
    assert set(row) == {"growth_mib", "seconds", "parameters"}
    assert row["seconds"] > 0 and row["parameters"] == 26_010
