"""The documentation site builds strictly, and every python block of every page runs."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Pages whose python blocks other tests run instead, with the reason.
ELSEWHERE = {
    # needs IMDb (not downloadable here) and TensorFlow: tests/tf/test_docs_training.py runs
    # the block as written on stand-in data of IMDb's shapes, for 2 epochs instead of 15
    "training.md": "tests/tf/test_docs_training.py",
}


def test_site_builds_with_strict_links_and_api_reference(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=600,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    reference = (site / "reference" / "index.html").read_text()
    for name in ("PLDAccountant", "get_epsilon_bounds", "dpsgd", "attack_risk", "from_dp_event", "JL"):
        assert name in reference, name
    assert "_events" not in reference and "_cache" not in reference  # no private fields
    # both packages; Sphinx roles became links (or code), examples became code blocks
    for name in ("fdp_tf.make_private", "fdp_tf.DPAdamJL", "fdp_tf.PrivacyCallback", "fdp_tf.poisson_batches",
                 "fdp_tf.noise_multiplier_for", "fdp.fewest_jl_projections"):
        assert f'id="{name}"' in reference, name
    raw_roles = re.findall(r":(?:class|func|meth|mod|data|attr|exc|obj):", reference)
    assert not raw_roles, f"{len(raw_roles)} Sphinx roles shown as text"
    assert "<blockquote>" not in reference  # a >>> example outside an Examples: section
    # a Returns: item "A :class:`X` ..." is split at the role's colon into a name "A" and
    # a description "class:..."
    assert not re.search(r"<p>(class|func|meth|data|attr|mod):", reference)
    assert reference.count('class="gp">&gt;&gt;&gt; ') >= 10  # prompts inside highlighted code
    assert reference.count('class="autorefs autorefs-internal"') >= 40  # roles that link
    for internal in ("_capped_lower", "level -2"):
        assert internal not in reference, internal
    assert (site / "benchmarks" / "index.html").exists() and (site / "readme" / "index.html").exists()


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_every_python_block_runs(page, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)
    if page in ELSEWHERE:
        assert blocks, f"{page} has no python block any more: drop it from ELSEWHERE"
        return
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # pages that save figures write them here
    ns: dict = {"__name__": "__doc__"}
    with contextlib.redirect_stdout(io.StringIO()):
        for block in blocks:
            exec(compile(block, page, "exec"), ns)
