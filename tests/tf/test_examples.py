"""examples/*.py run as their docstrings say, on synthetic data of the real shapes.

The MNIST example trains one short epoch; the ε it prints must be the certified upper
bound of an independent accountant for what it ran (sampling rate and steps as printed,
the JL mechanism with the example's r). The IMDb example takes minutes to trace its
LSTM: only its command line is checked here (benchmarks/training.py times the model).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", minversion="2.16")

import fdp  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                          cwd=EXAMPLES.parent, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def test_the_mnist_example_trains_and_prints_a_certified_epsilon():
    done = _run("examples/mnist_cnn.py", "--synthetic", "--num-examples", "512", "--epochs", "1",
                "--batch-size", "64", "--jl-projections", "30", "--noise-multiplier", "1.1")
    assert done.returncode == 0, done.stderr[-3000:]
    # TensorFlow's native start-up lines (twice per run, unaffected by TF_CPP_MIN_LOG_LEVEL)
    assert "I0000" not in done.stderr and "absl::InitializeLog" not in done.stderr, done.stderr[:2000]
    found = re.search(r"epsilon \(upper bound\) at delta=1e-05: (\S+) after (\d+) steps at sampling rate (\S+)",
                      done.stdout)
    assert found, done.stdout
    printed, steps, rate = float(found[1]), int(found[2]), float(found[3])
    assert steps == 512 // 64 and rate == pytest.approx(64 / 512)
    acc = fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=1.1, jl_projections=30, sampling_rate=rate),
                                      steps=steps)
    lower, upper = acc.get_epsilon_bounds(1e-5)
    assert lower * (1 - 5e-4) <= printed  # never below what was spent (4 significant digits)
    assert printed == pytest.approx(upper, rel=5e-4)


def test_the_examples_refuse_to_run_without_data():
    for script in ("examples/mnist_cnn.py", "examples/imdb_lstm.py"):
        done = _run(script)
        assert done.returncode == 2
        assert "give --data PATH (a local .npz) or --synthetic; nothing is downloaded" in done.stderr


def test_the_start_up_filter_drops_only_tensorflows_start_up_lines():
    sys.path.insert(0, str(EXAMPLES))
    try:
        from fdp_tf_common import _START_UP_NOISE
    finally:
        sys.path.remove(str(EXAMPLES))
    noise = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1795829893.566817    8640 port.cc:153] oneDNN custom operations are on.",
        "E0000 00:00:1795829895.732466    8640 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA",
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
        "appropriate compiler flags.",
    ]
    kept = [
        "E0000 00:00:1795829895.732466    8640 op_kernel.cc:1830] OP_REQUIRES failed: OOM",
        "W0000 00:00:1795829895.732466    8640 some.cc:1] a warning",
        "Traceback (most recent call last):",
        "ImportError: libcudart.so.12: cannot open shared object file",
    ]
    assert all(_START_UP_NOISE.match(line) for line in noise)
    assert not any(_START_UP_NOISE.match(line) for line in kept)
