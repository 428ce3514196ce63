"""docs/accountant.md runs as written, and the numbers it prints are right.

The python blocks run in order in one namespace (later blocks reuse ``acc``,
``mech``, ``mixed`` ...), each with its stdout captured. After each block a
check recomputes what the block printed from a closed form (mu-GDP, the CLT
formula) or from a direct, independent accountant call, and compares. The
"# about [a, b]" comments of the doc are compared with the live values too,
so they cannot go stale silently. No output is hard-coded here.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import time
from pathlib import Path

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

import fdp

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "accountant.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def _gdp_delta(eps: float, mu: float) -> float:
    """mu-GDP delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong-Roth-Su, mu-GDP corollary)."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def _gdp_epsilon(delta: float, mu: float) -> float:
    """Inverse of _gdp_delta in eps (delta(eps) decreases in eps)."""
    return brentq(lambda e: _gdp_delta(e, mu) - delta, 0.0, 200.0, xtol=1e-13, rtol=1e-13)


def _gdp_mu(eps: float, delta: float) -> float:
    """mu at which mu-GDP has delta(eps) = delta (delta increases in mu)."""
    return brentq(lambda m: _gdp_delta(eps, m) - delta, 1e-3, 50.0, xtol=1e-13, rtol=1e-13)


def _check_about_comments(block: str, values: list[float]) -> None:
    """Each '# about [a, b]' comment agrees with the live (lower, upper) to its shown digits."""
    matches = list(re.finditer(r"# about \[([-\d.]+), ([-\d.]+)\]", block))
    assert matches, "the block has no '# about [a, b]' comment (format changed?)"
    for match in matches:
        shown = [match.group(1), match.group(2)]
        for text, live in zip(shown, values):
            decimals = len(text.split(".")[1]) if "." in text else 0
            # one unit of the last digit shown (timing-free: the values are deterministic)
            assert abs(float(text) - live) <= 1.0001 * 10.0**-decimals, (
                f"doc says about {text}, the accountant gives {live}")


# ----------------------------------------------------------------- the checks
def check_dp_sgd(ns, out, block):
    lo, hi = ns["lo"], ns["hi"]
    assert f"[{lo:.4f}, {hi:.4f}]" in out
    assert f"<= {hi:.4f}" in out  # get_epsilon is the upper end
    assert 0.0 < lo <= hi and hi - lo <= 1e-3 * hi  # epsilon_rtol = 1e-3
    fresh = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.1, sampling_rate=256 / 60000), steps=14100)
    assert fresh.get_epsilon(1e-5) == hi
    _check_about_comments(block, [lo, hi])
    try:  # an independent pessimistic estimate, when the peer is installed
        from dp_accounting.pld import privacy_loss_distribution as pld_mod
    except ImportError:
        return
    theirs = pld_mod.from_gaussian_mechanism(
        standard_deviation=1.1, sampling_prob=256 / 60000, use_connect_dots=True,
        value_discretization_interval=1e-4,
    ).self_compose(14100).get_epsilon_for_delta(1e-5)
    assert lo <= theirs <= hi * (1 + 2e-3)


def check_delta(ns, out, block):
    lo_d, hi_d, acc = ns["lo_d"], ns["hi_d"], ns["acc"]
    assert f"[{lo_d:.4e}, {hi_d:.4e}]" in out and f"<= {hi_d:.4e}" in out
    assert 0.0 <= lo_d <= hi_d and acc.get_delta(2.0) == hi_d
    # 2.0 is below the certified lower bound on eps(1e-5), so the exact delta(2.0) > 1e-5
    assert 2.0 < ns["lo"] and hi_d > 1e-5
    assert (hi_d - lo_d) <= 0.05 * hi_d


def check_mixed(ns, out, block):
    mixed, lo_m, hi_m = ns["mixed"], ns["lo_m"], ns["hi_m"]
    assert "1700 3" in out and f"[{lo_m:.3f}, {hi_m:.3f}]" in out
    _check_about_comments(block, [lo_m, hi_m])
    phases = list(mixed.events)
    # order does not matter
    rev = fdp.PLDAccountant()
    for m, c in reversed(phases):
        rev.compose(m, steps=c)
    assert rev.get_epsilon_bounds(1e-5) == pytest.approx((lo_m, hi_m), rel=1e-9)
    # dropping the warm-up can only lower epsilon; running it at noise 1.0 can only raise it
    dropped = fdp.PLDAccountant()
    for m, c in phases[1:]:
        dropped.compose(m, steps=c)
    noisier_first = fdp.PLDAccountant()
    noisier_first.compose(fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.01), steps=phases[0][1])
    for m, c in phases[1:]:
        noisier_first.compose(m, steps=c)
    lo_drop, _ = dropped.get_epsilon_bounds(1e-5)
    _, hi_more = noisier_first.get_epsilon_bounds(1e-5)
    assert lo_drop <= hi_m and lo_m <= hi_more
    assert dropped.get_epsilon(1e-5) < hi_m < noisier_first.get_epsilon(1e-5)


def check_gdp(ns, out, block):
    mu = math.sqrt(8 / 2.0**2 + 32 / 4.0**2)
    assert ns["mu"] == pytest.approx(mu, rel=1e-15) and mu == pytest.approx(2.0)
    eps_exact, delta_exact = _gdp_epsilon(1e-5, mu), _gdp_delta(1.0, mu)
    lines = [line for line in out.splitlines() if "<=" in line]
    assert len(lines) == 2
    for line, exact, digits in ((lines[0], eps_exact, 4), (lines[1], delta_exact, 5)):
        a, b, c = (float(v) for v in line.split("<="))
        assert b == pytest.approx(exact, abs=10.0**-digits)
        assert a <= b <= c
    exact_acc = ns["exact_acc"]
    lo, hi = exact_acc.get_epsilon_bounds(1e-5)
    assert lo <= eps_exact <= hi
    lo, hi = exact_acc.get_delta_bounds(1.0)
    assert lo <= delta_exact <= hi


def check_clt(ns, out, block):
    p, sigma, steps = 256 / 60000, 1.1, 14100
    mu_clt = p * math.sqrt(steps * (math.exp(1 / sigma**2) - 1))
    eps_clt = _gdp_epsilon(1e-5, mu_clt)
    assert ns["mu_clt"] == pytest.approx(mu_clt, rel=1e-12)
    assert f"mu = {mu_clt:.4f}, epsilon = {eps_clt:.4f}" in out
    assert eps_clt < ns["lo"]  # the doc's claim: the CLT lies below the certified lower bound


def check_tradeoff(ns, out, block, tmp_path):
    g, clt, acc = ns["g"], ns["clt"], ns["acc"]
    assert isinstance(g, fdp.PiecewiseLinearCurve)
    assert f"{float(g(0.05)):.4f} (CLT: {float(clt(0.05)):.4f})" in out
    # duality: the curve's delta is the accountant's delta (same pessimistic PLDs, up to
    # the tilted pass get_delta adds where the FFT round-off matters), and above its lower bound
    assert float(g.delta(2.0)) == pytest.approx(acc.get_delta(2.0), rel=1e-4)
    assert float(g.delta(2.0)) >= acc.get_delta_bounds(2.0)[0]
    # g lies below the true curve, so its epsilon is an upper bound too
    assert float(g.epsilon(1e-5)) >= ns["lo"]
    assert (tmp_path / "accountant_tradeoff.png").stat().st_size > 1000
    import matplotlib.pyplot as plt

    plt.close("all")


def check_json(ns, out, block):
    assert out.startswith('{"format": "fdp.PLDAccountant/1"')
    import json

    data = json.loads(ns["text"])
    assert [e["steps"] for e in data["events"]] == [500, 1000, 200]


def check_calibration(ns, out, block):
    sigma, sigma_1 = ns["sigma"], ns["sigma_1"]
    eps = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=0.01), steps=1000).get_epsilon(1e-5)
    assert eps <= 2.0
    assert f"noise_multiplier = {sigma:.4f}: epsilon <= {eps:.4f}" in out
    # p = 1: T Gaussian steps are mu-GDP with mu = sqrt(T)/sigma, so the exact answer is sqrt(T)/mu*
    exact = math.sqrt(1000) / _gdp_mu(8.0, 1e-5)
    # above the exact sigma (certified upper bound), within the calibration tolerance (1e-3)
    # times the accountant's slack (epsilon_rtol = 1e-3, and eps ~ 1/sigma)
    assert exact * (1 - 1e-9) <= sigma_1 <= exact * (1 + 1e-3) * (1 + 1e-3) * (1 + 1e-9)
    assert f"p = 1: noise_multiplier = {sigma_1:.3f}" in out


def check_jl(ns, out, block):
    eps_jl, eps_g = ns["jl"].get_epsilon(1e-5), ns["gauss"].get_epsilon(1e-5)
    assert f"epsilon <= {eps_jl:.2f}; Gaussian: epsilon <= {eps_g:.3f}" in out
    # the page's JL epsilon lies above the Gaussian one (a measured fact here, not a theorem)
    lo_jl, _ = ns["jl"].get_epsilon_bounds(1e-5)
    assert lo_jl >= eps_g


def check_errors(ns, out, block):
    assert "delta must be in (0, 1); got 0" in out
    assert "delta must be in (0, 1); got 1" in out
    assert "delta must be a finite number in (0, 1); got nan" in out
    assert "delta=1e-300" in out
    assert "the accountant is empty" in out
    assert len([line for line in out.splitlines() if line.strip()]) == 5  # every try raised


CHECKS = [
    check_dp_sgd,
    check_delta,
    check_mixed,
    check_gdp,
    check_clt,
    check_tradeoff,
    check_json,
    check_calibration,
    check_jl,
    check_errors,
]


def test_accountant_doc_examples_run_and_print_the_right_numbers(tmp_path, monkeypatch):
    blocks = _blocks()
    assert len(blocks) == len(CHECKS), (
        f"docs/accountant.md has {len(blocks)} python blocks, the test checks {len(CHECKS)}: "
        "add or remove a check in CHECKS to match"
    )
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__doc_example__"}
    seconds = []
    for i, (code, check) in enumerate(zip(blocks, CHECKS)):
        buf = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"docs/accountant.md[block {i}]", "exec"), ns)
        seconds.append(time.perf_counter() - start)
        if check is check_tradeoff:
            check(ns, buf.getvalue(), code, tmp_path)
        else:
            check(ns, buf.getvalue(), code)
    print("seconds per block:", [round(s, 2) for s in seconds])


def test_docs_links_resolve():
    """Relative links of the docs pages and the README point at files that exist."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
