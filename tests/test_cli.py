"""The ``fdp`` command line: every command and form, --json parsed back, bad flags."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings

import pytest

import fdp
from fdp.cli import main

SEED = ["--batch-size", "256", "--dataset-size", "25000", "--epochs", "2", "--delta", "1e-5"]
MNIST = ["--noise-multiplier", "1.1", "--batch-size", "256", "--dataset-size", "60000", "--epochs", "60"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_epsilon_both_forms_agree_with_the_library(capsys):
    by_epochs = run_json(capsys, "epsilon", *MNIST, "--delta", "1e-5")
    ref = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60).get_epsilon_bounds(1e-5)
    assert (by_epochs["lower"], by_epochs["upper"]) == ref
    assert by_epochs["steps"] == 14100 and by_epochs["steps_per_epoch"] == 235
    by_rate = run_json(capsys, "epsilon", "--noise-multiplier", "1.1", "--sampling-rate", str(256 / 60000),
                       "--steps", "14100", "--delta", "1e-5")
    assert (by_rate["lower"], by_rate["upper"]) == ref
    code, out, _ = run(capsys, "epsilon", *MNIST, "--delta", "1e-5")
    assert code == 0 and "epsilon in [2.38" in out and "certified" in out


def test_epsilon_jl_and_laplace(capsys):
    jl = run_json(capsys, "epsilon", "--mechanism", "jl", "--noise-multiplier", "0.6", "--jl-projections", "30", *SEED)
    gauss = run_json(capsys, "epsilon", "--noise-multiplier", "0.6", *SEED)
    assert jl["lower"] > gauss["upper"] and jl["jl_projections"] == 30
    lap = run_json(capsys, "epsilon", "--mechanism", "laplace", "--noise-multiplier", "2.0",
                   "--sampling-rate", "1", "--steps", "1", "--delta", "1e-5")
    ref = fdp.PLDAccountant().compose(fdp.Laplace(scale=2.0), steps=1).get_epsilon_bounds(1e-5)
    assert (lap["lower"], lap["upper"]) == ref and ref[1] <= 0.5  # b = 2: (1/b, 0)-DP


def test_delta(capsys):
    d = run_json(capsys, "delta", *MNIST, "--epsilon", "2")
    ref = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60).get_delta_bounds(2.0)
    assert (d["lower"], d["upper"]) == ref


def test_calibrate_sigma_epochs_and_projections(capsys):
    sigma = run_json(capsys, "calibrate", "--batch-size", "256", "--dataset-size", "60000", "--epochs", "60",
                     "--target-epsilon", "1", "--delta", "1e-5")["noise_multiplier"]
    assert fdp.dpsgd(noise_multiplier=sigma, batch_size=256, dataset_size=60000, epochs=60).get_epsilon(1e-5) <= 1
    most = run_json(capsys, "calibrate", *MNIST[:-2], "--target-epsilon", "2", "--delta", "1e-5")
    e = most["epochs"]
    assert fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=e).get_epsilon(1e-5) <= 2
    assert fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=e + 1).get_epsilon(1e-5) > 2
    fewest = run_json(capsys, "calibrate", "--mechanism", "jl", "--noise-multiplier", "1.5", "--sampling-rate", "0.01",
                      "--steps", "300", "--target-epsilon", "6", "--delta", "1e-5")
    r = fewest["jl_projections"]

    def eps(r):
        mech = fdp.JL(noise_multiplier=1.5, jl_projections=r, sampling_rate=0.01)
        return fdp.PLDAccountant().compose(mech, steps=300).get_epsilon(1e-5)
    assert eps(r) <= 6 < eps(r - 1)


def test_unreachable_target_exits_1(capsys):
    code, out, err = run(capsys, "calibrate", "--mechanism", "jl", "--noise-multiplier", "0.3", "--sampling-rate", "1",
                         "--steps", "1000", "--target-epsilon", "0.01", "--delta", "1e-5")
    assert code == 1 and "Gaussian" in err and out == ""


def test_curves_table_json_and_plot(capsys, tmp_path):
    png = tmp_path / "c.png"
    data = run_json(capsys, "curves", "--noise-multiplier", "0.6", "--jl-projections", "30", *SEED, "--plot", str(png))
    assert set(data["curves"]) == {"JL(r=30)", "Gaussian"} and data["epochs"] == [1, 2]
    jl, g = data["curves"]["JL(r=30)"], data["curves"]["Gaussian"]
    assert all(lo <= hi for lo, hi in zip(jl["lower"], jl["upper"]))
    assert jl["lower"][1] > g["upper"][1] and jl["upper"][0] <= jl["upper"][1]
    assert png.stat().st_size > 1000
    code, out, err = run(capsys, "curves", "--noise-multiplier", "0.6", *SEED)
    # the tqdm bar is drawn on a terminal only, so logs and pipes stay clean
    assert code == 0 and "| 2 |" in out and err == ""
    row = next(line for line in out.splitlines() if line.startswith("| 2 |"))
    assert re.fullmatch(r"\| 2 \| \[[-+.e\d]+, [-+.e\d]+\] \|", row), row  # brackets as [lower, upper]


def test_risk(capsys, tmp_path):
    png = tmp_path / "r.png"
    data = run_json(capsys, "risk", *MNIST, "--fpr", "0.001,0.01", "--plot", str(png))
    ref = fdp.attack_risk(fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60),
                          fpr=[0.001, 0.01])
    assert data["tpr_upper"] == list(ref.tpr_upper) and data["fpr"] == [0.001, 0.01]
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("argv, flag", [
    (["epsilon", "--noise-multiplier", "-1", "--sampling-rate", "0.1", "--steps", "10", "--delta", "1e-5"],
     "--noise-multiplier"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "1.5", "--steps", "10", "--delta", "1e-5"],
     "--sampling-rate"),
    (["epsilon", "--noise-multiplier", "abc", "--sampling-rate", "0.1", "--steps", "10", "--delta", "1e-5"],
     "--noise-multiplier"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "0", "--delta", "1e-5"], "--steps"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--delta", "1e-5"], "--steps"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "10", "--delta", "2"], "--delta"),
    (["epsilon", "--noise-multiplier", "1", "--batch-size", "300", "--dataset-size", "100", "--epochs", "1",
      "--delta", "1e-5"], "--batch-size"),
    (["epsilon", "--noise-multiplier", "1", "--batch-size", "10", "--dataset-size", "100", "--epochs", "-1",
      "--delta", "1e-5"], "--epochs"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "10", "--batch-size", "10",
      "--dataset-size", "100", "--epochs", "1", "--delta", "1e-5"], "--sampling-rate"),
    (["epsilon", "--noise-multiplier", "1", "--jl-projections", "5", "--sampling-rate", "0.1", "--steps", "10",
      "--delta", "1e-5"], "--jl-projections"),
    (["epsilon", "--mechanism", "jl", "--noise-multiplier", "1", "--jl-projections", "0", "--sampling-rate", "0.1",
      "--steps", "10", "--delta", "1e-5"], "--jl-projections"),
    (["epsilon", "--mechanism", "rr", "--noise-multiplier", "1"], "--mechanism"),
    (["delta", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "10", "--epsilon", "-1"], "--epsilon"),
    (["calibrate", "--sampling-rate", "0.1", "--steps", "10", "--target-epsilon", "0", "--delta", "1e-5"],
     "--target-epsilon"),
    (["risk", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "10", "--fpr", "2"], "--fpr"),
    (["curves", "--noise-multiplier", "1", "--jl-projections", "5,x", "--batch-size", "10", "--dataset-size", "100",
      "--epochs", "2", "--delta", "1e-5"], "--jl-projections"),
])
def test_bad_flag_is_one_line_naming_it_and_exits_2(capsys, argv, flag):
    with pytest.raises(SystemExit) if _argparse_rejects(argv) else _nothing():
        code = main(argv)
        assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and flag in err and err.count("\n") == 1, err


def _argparse_rejects(argv):
    return any(v in argv for v in ("abc", "rr", "5,x"))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_argparse_errors_exit_2():
    with pytest.raises(SystemExit) as info:
        main(["epsilon", "--noise-multiplier", "abc"])
    assert info.value.code == 2


def test_console_script_and_module_entry_point():
    exe = shutil.which("fdp")
    commands = [[sys.executable, "-m", "fdp"]] + ([[exe]] if exe else [])
    for cmd in commands:
        proc = subprocess.run(cmd + ["epsilon", "--noise-multiplier", "2", "--sampling-rate", "1", "--steps", "4",
                                     "--delta", "1e-5", "--json"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["command"] == "epsilon"
        proc = subprocess.run(cmd + ["epsilon", "--noise-multiplier", "-2", "--sampling-rate", "1", "--steps", "4",
                                     "--delta", "1e-5"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "--noise-multiplier" in proc.stderr
    assert subprocess.run([sys.executable, "-m", "fdp", "--help"], capture_output=True, timeout=120).returncode == 0


def test_warmup_caches_every_kernel_a_query_compiles(tmp_path):
    """After `fdp warmup` on an empty Numba cache, a new process answering a Gaussian and a
    JL query (and an attack-risk query) compiles nothing: every kernel is loaded from disk."""
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    warm = subprocess.run([sys.executable, "-m", "fdp", "warmup", "--json"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert warm.returncode == 0, warm.stderr
    assert set(json.loads(warm.stdout)["seconds"]) == {"Gaussian accountant", "JL mechanism",
                                                        "tradeoff curves and attack risk"}
    probe = (
        "from numba.core import event\n"
        "import fdp\n"
        "with event.install_recorder('numba:compile') as rec:\n"
        "    fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=3).get_epsilon_bounds(1e-5)\n"
        "    fdp.dpsgd(noise_multiplier=0.6, batch_size=256, dataset_size=25000, epochs=2,\n"
        "              jl_projections=10).get_epsilon_bounds(1e-5)\n"
        "    fdp.attack_risk(fdp.dpsgd(noise_multiplier=1.0, batch_size=64, dataset_size=6400, epochs=2), fpr=[0.1])\n"
        "print(sorted({ev.data['dispatcher'].py_func.__qualname__ for _, ev in rec.buffer if ev.is_start}))\n"
    )
    after = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600)
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == "[]", f"compiled after warmup: {after.stdout}"


RISK = ["risk", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "10"]
CURVES = ["curves", "--noise-multiplier", "1", "--batch-size", "10", "--dataset-size", "100", "--epochs", "2",
          "--delta", "1e-5"]


@pytest.mark.parametrize("argv", [
    [*CURVES, "--plot", "/nonexistent/x.png"],
    [*RISK, "--plot", "/nonexistent/x.png"],
    [*RISK, "--plot", ""],
])
def test_an_unwritable_plot_is_a_flag_error_before_computing(capsys, monkeypatch, argv):
    """--plot /nonexistent/x.png computed the whole table, then raised FileNotFoundError
    from savefig (a traceback, exit 1)."""
    def never(*args, **kwargs):
        raise AssertionError("computed before checking --plot")

    monkeypatch.setattr(fdp, "epsilon_curve", never)
    monkeypatch.setattr(fdp, "attack_risk", never)
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith(f"fdp {argv[0]}: error: --plot") and err.count("\n") == 1, err


def test_a_plot_format_matplotlib_lacks_is_a_flag_error(capsys, tmp_path):
    code, out, err = run(capsys, *RISK, "--fpr", "0.1", "--plot", str(tmp_path / "x.nosuchformat"))
    assert code == 2 and "--plot: cannot write" in err and "not supported" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, flag", [
    ([*RISK, "--fpr", ""], "--fpr"),  # exited 0 with an empty table
    ([*RISK, "--fpr", " , "], "--fpr"),
    ([*CURVES, "--jl-projections", ""], "--jl-projections"),
    ([*RISK, "--fpr", "0.1,,0.2"], "--fpr"),  # an empty item was skipped silently
    ([*RISK, "--fpr", "0.1,"], "--fpr"),
    ([*CURVES, "--jl-projections", "1,,4"], "--jl-projections"),
])
def test_an_empty_list_flag_is_refused(capsys, argv, flag):
    with pytest.raises(SystemExit) as info:
        main(argv)
    _, err = capsys.readouterr()
    assert info.value.code == 2 and flag in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, flag", [
    # the library's "delta=1e-300 is below 1e-290 ..." and "epochs=1e+300 gives 1000...0 steps"
    # named the Python argument, not the flag
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.1", "--steps", "10", "--delta", "1e-300"],
     "--delta"),
    (["epsilon", "--noise-multiplier", "1", "--batch-size", "10", "--dataset-size", "100", "--epochs", "1e300",
      "--delta", "1e-5"], "--epochs"),
    (["epsilon", "--noise-multiplier", "1e-200", "--sampling-rate", "0.1", "--steps", "10", "--delta", "1e-5"],
     "--noise-multiplier"),
    (["delta", "--mechanism", "laplace", "--noise-multiplier", "1e-310", "--sampling-rate", "0.1", "--steps", "10",
      "--epsilon", "1"], "--noise-multiplier"),
])
def test_extreme_values_name_their_flag(capsys, argv, flag):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith(f"fdp {argv[0]}: error: {flag}") and err.count("\n") == 1, err
    assert len(err) < 300, err  # no 300-digit step count


def test_laplace_with_a_tiny_scale_answers(capsys):
    """--mechanism laplace --noise-multiplier 1e-60 raised OverflowError (a traceback)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        data = run_json(capsys, "delta", "--mechanism", "laplace", "--noise-multiplier", "1e-60", "--sampling-rate",
                        "0.1", "--steps", "10", "--epsilon", "1")
    truth = 1 - 0.9**10  # some step samples the individual: loss ~1e60
    assert data["lower"] <= truth <= data["upper"]


def test_calibrating_the_steps_of_a_leak_free_target_stops_at_the_accountants_limit(capsys, monkeypatch):
    """The doubling search went past the accountant's 10^11 steps (it stopped at 10^12) and
    was refused as "--steps must be an integer in [1, 100000000000]; got 137438953472"
    (no --steps given). The limit is lowered here to keep the search short."""
    monkeypatch.setattr("fdp.accountant.MAX_STEPS", 1000)
    code, out, err = run(capsys, "calibrate", "--target-epsilon", "1e300", "--delta", "1e-5", "--sampling-rate",
                         "0.01", "--noise-multiplier", "1")
    assert code == 1 and out == "" and "more than 512 steps" in err and "at most 1e+03" in err, err


def _eps(sigma: float, epochs: float, sampling: str) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fdp.dpsgd(noise_multiplier=sigma, batch_size=1000, dataset_size=10000, epochs=epochs,
                         sampling=sampling).get_epsilon(1e-5)


def test_calibrate_with_a_sampling_scheme(capsys):
    """--sampling without_replacement: the sigma found meets the target and 2 % less misses it;
    --sampling random_allocation: the most whole epochs, one more misses."""
    base = ["calibrate", "--batch-size", "1000", "--dataset-size", "10000", "--delta", "1e-5", "--json"]
    assert main([*base, "--target-epsilon", "8", "--epochs", "3", "--sampling", "without_replacement"]) == 0
    out = json.loads(capsys.readouterr().out)
    sigma = out["noise_multiplier"]
    assert out["neighboring"] == "replace_one" and out["steps"] == 30
    assert _eps(sigma, 3, "without_replacement") <= 8 < _eps(0.98 * sigma, 3, "without_replacement")
    assert main([*base, "--target-epsilon", "2", "--noise-multiplier", "1.5", "--sampling",
                 "random_allocation"]) == 0
    out = json.loads(capsys.readouterr().out)
    k = out["epochs"]
    assert out["steps_per_epoch"] == 10
    assert _eps(1.5, k, "random_allocation") <= 2 < _eps(1.5, k + 1, "random_allocation")
    assert main([*base, "--target-epsilon", "2", "--sampling", "random_allocation"]) == 2
    assert "--epochs" in capsys.readouterr().err


@pytest.mark.parametrize("argv, hint", [
    (["epsilon", "--sigma", "1", "--delta", "1e-5"], "--sigma: did you mean --noise-multiplier?"),
    (["delta", "--noise-multipler", "1", "--epsilon", "1"], "--noise-multipler: did you mean --noise-multiplier?"),
    (["calibrate", "--eps", "2", "--delta", "1e-5"], "--eps: did you mean --target-epsilon?"),
    (["epsilon", "--bogus", "3", "--delta", "1e-5"], None),
])
def test_an_unknown_flag_names_the_flag_meant_and_the_subcommand_help(capsys, argv, hint):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and len(err.splitlines()) == 1
    assert f"(see fdp {argv[0]} --help)" in err
    assert (hint in err) if hint else "did you mean" not in err


def test_every_flag_has_help_and_calibrate_says_leave_out_what_to_find():
    from fdp.cli.parser import build_parser

    parser = build_parser()
    for name, command in parser.commands.items():
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"fdp {name} {action.option_strings[0]} has no help"
    assert "leave out what to find" in parser.commands["calibrate"].format_help()


def test_calibrate_draws_no_progress_frames_into_a_redirected_stderr(capsys):
    code, out, err = run(capsys, "calibrate", "--noise-multiplier", "1.1", "--sampling-rate", "0.01", "--target-epsilon",
                         "2", "--delta", "1e-5")
    assert code == 0 and "\r" not in err and "calibrate" not in err
