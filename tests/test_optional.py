"""Missing optional dependencies: the error names the extra that installs them."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_fdp_tf_without_tensorflow_names_the_extra():
    for blocked in ("keras", "tensorflow"):
        proc = _run(f"import sys; sys.modules[{blocked!r}] = None; import fdp_tf")
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError") and 'pip install "fdp[tf]"' in last, last


def test_plot_without_matplotlib_names_the_extra():
    proc = _run("import sys; sys.modules['matplotlib'] = None; sys.modules['matplotlib.pyplot'] = None\n"
                "import fdp; fdp.gaussian_curve(1.0).plot()")
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError") and 'pip install "fdp[plot]"' in last, last
