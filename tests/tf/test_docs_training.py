"""docs/training.md's python block runs as written, on stand-in data of IMDb's shapes.

The page trains a BiLSTM on IMDb for 15 epochs (minutes, and IMDb cannot be downloaded
here); the test supplies 256 rows of random token ids with IMDb's shapes and runs 2
epochs, with the rest of the block unchanged, then checks what the page claims.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", minversion="2.16")
keras = pytest.importorskip("keras", minversion="3.0")

import fdp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_training_page_runs_and_its_claims_hold(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "training.md").read_text(), flags=re.S)
    assert len(blocks) == 1
    code = blocks[0]
    assert "epochs=15" in code
    code = code.replace("epochs=15", "epochs=2")
    rng = np.random.default_rng(0)
    ns = {
        "x_train": rng.integers(0, 8185, size=(256, 150), dtype=np.int32),
        "y_train": rng.integers(0, 2, size=256).astype(np.int32),
        "x_test": rng.integers(0, 8185, size=(64, 150), dtype=np.int32),
        "y_test": rng.integers(0, 2, size=64).astype(np.int32),
    }
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/training.md", "exec"), ns)
    model, history = ns["model"], ns["history"]
    # "# 598,274 parameters"
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == 598_274
    # "one upper bound per epoch": the ledger's composition, growing
    eps = history.history["epsilon"]
    assert len(eps) == 2 and 0 < eps[0] < eps[1]
    # "the budget: sigma is chosen": the smallest whose certified epsilon is within it
    sigma = model.optimizer.noise_multiplier
    assert sigma == model.budget.noise_multiplier and eps[1] <= 8.0
    steps = fdp.epochs_to_steps(2, batch_size=256, dataset_size=256)
    jl = fdp.JL(noise_multiplier=sigma, sampling_rate=1.0, jl_projections=30)
    assert eps[1] >= fdp.PLDAccountant().compose(jl, steps=steps).get_epsilon_bounds(1e-5)[0]
    less = fdp.JL(noise_multiplier=sigma * 0.99, sampling_rate=1.0, jl_projections=30)
    assert fdp.PLDAccountant().compose(less, steps=steps).get_epsilon(1e-5) > 8.0
    # "saves the privacy ledger with the weights"
    restored = keras.models.load_model(tmp_path / "imdb_private.keras")
    assert restored.epsilon(1e-5) == pytest.approx(eps[1], rel=1e-6)
