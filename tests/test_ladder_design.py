"""Tests for ladder_design.py (`fit.py design`): the simulator against the analytic standard error, design specs,
detection probability, GPU-hours, the CLI and its figure."""
import json
import math
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
import pytest

import figures
import fit
import ladder_design

X = np.geomspace(1.0, 100.0, 8)  # compute in 1e18 FLOPs
LAWS = {"vanilla": (1.6, 0.11), "better": (1.55, 0.115)}


def test_simulated_gamma_spread_matches_the_analytic_loglog_error():
    # E known: gamma is a weighted linear fit in log-log space, whose standard error is closed-form
    n = np.array([1, 1, 1, 1, 1, 1, 3, 3])
    points = {"vanilla": (X, n)}
    sigma = 0.002
    draws = ladder_design.simulate(points, {"vanilla": LAWS["vanilla"]}, 1.7, "vanilla", sigma, 2000,
                                   np.random.default_rng(0), fixed_E=True)["vanilla"]
    se = ladder_design.analytic_gamma_se(X, n, 1.7, *LAWS["vanilla"], sigma)
    assert np.std(draws) == pytest.approx(se, rel=0.06)
    assert np.mean(draws) == pytest.approx(0.11, abs=3 * se / math.sqrt(2000) + 2e-5)
    # the same plan with 4 seeds everywhere halves the error (variance of a mean of 4)
    assert ladder_design.analytic_gamma_se(X, 4 * n, 1.7, *LAWS["vanilla"], sigma) == pytest.approx(se / 2)


def test_refitting_E_widens_gamma_but_delta_gamma_less():
    points = {a: (X, np.ones(8, int)) for a in LAWS}
    rng = lambda: np.random.default_rng(1)
    known = ladder_design.summarize(points, LAWS, 1.7, "vanilla", 0.002,
                                    ladder_design.simulate(points, LAWS, 1.7, "vanilla", 0.002, 150, rng(), True))
    refit = ladder_design.summarize(points, LAWS, 1.7, "vanilla", 0.002,
                                    ladder_design.simulate(points, LAWS, 1.7, "vanilla", 0.002, 150, rng()))
    assert refit["better"]["gamma_ci_halfwidth"] > 2 * known["better"]["gamma_ci_halfwidth"]
    assert refit["better"]["delta_gamma_ci_halfwidth"] < 0.5 * refit["better"]["gamma_ci_halfwidth"]


def test_detection_probability_tracks_the_effect():
    points = {a: (X, np.ones(8, int)) for a in LAWS}
    sim = lambda laws: ladder_design.summarize(points, laws, 1.7, "vanilla", 0.002, ladder_design.simulate(
        points, laws, 1.7, "vanilla", 0.002, 600, np.random.default_rng(2), fixed_E=True))["better"]
    null = sim({"vanilla": (1.6, 0.11), "better": (1.6, 0.11)})
    strong = sim(LAWS)
    assert null["detect_probability"] < 0.06
    # for a normal estimate with sd s = h / 1.96: P(estimate > h) = Phi(delta / s - 1.96)
    from scipy.stats import norm
    expected = norm.cdf(0.005 / (strong["delta_gamma_ci_halfwidth"] / 1.96) - 1.96)
    assert 0.5 < expected < 0.98 and strong["detect_probability"] == pytest.approx(expected, abs=0.04)
    assert null["delta_gamma_true"] == 0 and strong["delta_gamma_true"] == pytest.approx(0.005)


def test_design_specs_select_depths_and_seeds():
    plan = {(a, d): (1e18 * d, 1) for a in ("vanilla", "better") for d in range(6, 24, 2) if a == "vanilla" or d <= 18}
    x, n, ds = ladder_design.apply_design(plan, "d6-18 x3@top2")["vanilla"]
    assert ds == list(range(6, 20, 2)) and list(n) == [1] * 5 + [3, 3] and list(x) == [1e18 * d for d in ds]
    top = ladder_design.apply_design(plan, "d6-22 x3@top2")
    assert top["vanilla"][2][-1] == 22 and top["better"][2][-1] == 18 and list(top["better"][1][-2:]) == [3, 3]
    assert list(ladder_design.apply_design(plan, "x2@8,10")["better"][1][:3]) == [1, 2, 2]
    with pytest.raises(fit.UsageError, match="no planned run has depth 26"):
        ladder_design.apply_design(plan, "d6-26")
    with pytest.raises(fit.UsageError, match="use 'd6-18'"):
        ladder_design.apply_design(plan, "depths 6 to 18")


def test_design_cli_from_dry_run_lines_gpu_hours_and_figure(tmp_path, capsys):
    lines = [json.dumps(dict(arch=a, depth=d, total_flops=1e18 * (d / 8) ** 4.5)) for a in LAWS for d in range(6, 22, 2)]
    (tmp_path / "plan.jsonl").write_text("\n".join(lines) + "\n")
    pilot = dict(E=1.7, arms={a: dict(A=A, gamma=g) for a, (A, g) in LAWS.items()})
    (tmp_path / "pilot.json").write_text(json.dumps(pilot))
    fit.main(["design", str(tmp_path / "plan.jsonl"), "--truth", str(tmp_path / "pilot.json"), "--noise", "0.002",
              "--design", "d6-16", "--design", "d6-20 x3@top2", "--sims", "40", "--mfu", "0.5", "--gpu", "a100",
              "--out", str(tmp_path / "figs"), "--json"])
    out = json.loads(capsys.readouterr().out)
    small, big = out["designs"]
    assert small["runs"] == 12 and big["runs"] == 16 + 2 * 4
    flops = sum(1e18 * (d / 8) ** 4.5 for d in range(6, 18, 2)) * 2
    assert small["flops"] == pytest.approx(flops) and small["gpu_hours"] == pytest.approx(flops / (312e12 * 0.5) / 3600)
    assert big["arms"]["better"]["gamma_se_known_E"] < small["arms"]["better"]["gamma_se_known_E"]
    assert big["depths"]["better"] == {"6": 1, "8": 1, "10": 1, "12": 1, "14": 1, "16": 1, "18": 3, "20": 3}
    for name in figures.DESIGN_FIGURE:
        assert os.path.getsize(tmp_path / "figs" / name) > 1000
    # E/gamma/A flags instead of a pilot: every other arm is the reference + --delta-gamma
    fit.main(["design", str(tmp_path / "plan.jsonl"), "--E", "1.7", "--gamma", "0.11", "--A", "1.6",
              "--delta-gamma", "0.004", "--noise", "0.002", "--sims", "20"])
    text = capsys.readouterr().out
    assert "better" in text and "+0.0040" in text and "GPU-hours" in text


def test_release_pilot_designs_run(capsys):
    release = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference",
                           "fineweb_ladders.csv")
    fit.main(["design", release, "--E", "1.706433", "--gamma", "0.111249", "--A", "1.6354", "--delta-gamma", "0.0055",
              "--noise", "0.001", "--design", "x3@top2", "--sims", "20", "--json"])
    d = json.loads(capsys.readouterr().out)["designs"][0]
    assert d["depths"]["vanilla"] == {"6": 1, "8": 1, "10": 1, "12": 1, "14": 1, "16": 1, "18": 3, "20": 3}
    assert d["depths"]["untied_grow"]["18"] == 3 and d["runs"] == 58 + 8 * 2 * 2
