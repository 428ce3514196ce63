"""Shared set-up for the fdp_tf tests; the whole directory is skipped without TensorFlow."""

from __future__ import annotations

import gc
import os
from typing import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest

try:
    tf = pytest.importorskip("tensorflow", minversion="2.16")
    keras = pytest.importorskip("keras", minversion="3.0")
except pytest.skip.Exception:
    # Collected from the repository root, raising here would skip the directory;
    # but ``pytest tests/tf`` loads this file at start-up, where a skip is an
    # error. So every test module repeats the importorskip and skips itself.
    tf = keras = None

if tf is not None and os.environ.get("PYTEST_XDIST_WORKER"):
    # Several workers share few cores: one op thread each avoids oversubscription.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


@pytest.fixture(autouse=True)
def _seeded() -> Iterator[None]:
    """Every test starts from the same Python / NumPy / TF / Keras seeds, and leaves no
    Keras state or cyclic garbage behind: without this a test worker grew to ~11 GiB by
    the end of the suite (2 workers: 22.4 of 24 GiB in use), and a benchmark subprocess
    started then stalled for 30 minutes."""
    if keras is not None:
        keras.utils.set_random_seed(1234)
    yield
    if keras is not None:
        keras.backend.clear_session()
        gc.collect()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Seeded tests here silence the "not private" warning (slow tests: tests/conftest.py)."""
    here = os.path.dirname(__file__)
    # tests seed their optimizers and batches on purpose: silence the "not private"
    # warning there (the tests of the warning itself use pytest.warns, which still sees it)
    quiet = pytest.mark.filterwarnings("ignore::fdp_tf.randomness.NotPrivateWarning")
    for item in items:
        if str(item.path).startswith(here) and tf is not None:
            item.add_marker(quiet)
