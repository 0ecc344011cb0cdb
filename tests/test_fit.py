"""Tests for fit.py and laws.py: the paper's Figure 3 numbers reproduced from the release
data, synthetic laws with known answers, the design simulator against closed forms, edge cases, CLI."""
import csv
import json
import math
import re
import os
import shlex
import shutil
import subprocess
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as fit.py does: tiny fits, threaded BLAS only adds contention
import numpy as np
import pytest

import core_eval
import train
import figlint
import fit
import laws
from test_train import read_run, tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(REPO, "reference", "fineweb_ladders.csv")

# the paper's Figure 3 fit of the release data: arm -> (gamma, ln A at C0, multipliers at d8..d20)
FIGURE3 = {
    "vanilla": (0.111249, 0.48585, [1.0] * 7),
    "deep_vanilla": (0.111394, 0.47654, [1.0543, 1.0771, 1.0928, 1.0894, 1.0781, 1.0787, 1.0841]),
    "deep_vanilla_grow": (0.113764, 0.46834, [1.1376, 1.1849, 1.2131, 1.2194, 1.2282, 1.2493, 1.2789]),
    "operator_1": (0.114274, 0.47187, [1.1207, 1.1599, 1.1734, 1.2098, 1.2302, 1.2337, 1.2507]),
    "loop_2": (0.114110, 0.47319, [1.0982, 1.1267, 1.1391, 1.1796, 1.2171, 1.2263, 1.2561]),
    "loop_grow": (0.115935, 0.47060, [1.1214, 1.1788, 1.1986, 1.2466, 1.2989, 1.3180, 1.3556]),
    "untied_2": (0.114115, 0.46372, [1.1854, 1.2356, 1.2561, 1.2786, 1.3032, 1.3238, 1.3440]),
    "untied_grow": (0.116787, 0.45589, [1.3044, 1.3347, 1.3646, 1.4336, 1.4846, 1.5201, 1.5526]),
}


def run(capsys, *argv):
    assert fit.main([str(a) for a in argv]) == 0
    return capsys.readouterr()


def run_json(capsys, *argv):
    return json.loads(run(capsys, *argv, "--json").out)


def cli_error(capsys, *argv):
    code = fit.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("fit.py: error:"), err
    return err


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def synthetic_ladders(tmp_path, arms=None, noise=0.0, seed=0, extra_col=False):
    """Ladders from known shared-E laws: arm -> (A, gamma); depths 6..20 at C = 1e18 * (d/8)^4.5."""
    arms = arms or {"vanilla": (1.6, 0.11), "better": (1.55, 0.12)}
    rng, rows = np.random.default_rng(seed), []
    for arm, (A, g) in arms.items():
        for d in range(6, 22, 2):
            C = 1e18 * (d / 8) ** 4.5
            L = 1.7 + A * (C / 1e18) ** -g + noise * rng.standard_normal()
            rows.append([arm, d, C, L] + ([C / 1e15] if extra_col else []))
    header = ["arm", "depth", "compute_flops", "val_loss"] + (["training_seconds"] if extra_col else [])
    return write_csv(tmp_path / "ladders.csv", header, rows), rows


# ------------------------------------------------------------------------------------------------ ladders
def test_release_data_reproduce_the_paper_figure3_fit(capsys):
    out = run_json(capsys, "ladders", RELEASE)
    assert out["E"] == pytest.approx(1.706433, abs=1e-5)
    assert out["C0"] == pytest.approx(1.055751e18, rel=1e-6)
    assert set(out["arms"]) == set(FIGURE3)
    for arm, (gamma, logA, mults) in FIGURE3.items():
        r = out["arms"][arm]
        assert r["gamma"] == pytest.approx(gamma, abs=5e-5), arm
        assert r["logA_C0"] == pytest.approx(logA, abs=5e-4), arm
        assert [m["multiplier"] for m in r["multipliers"]] == pytest.approx(mults, abs=0.002), arm
        assert r["final_multiplier"] == pytest.approx(mults[-1], abs=0.002)
    assert out["arms"]["vanilla"]["gamma_se_given_E"] == pytest.approx(0.000298, abs=2e-6)
    assert out["arms"]["untied_grow"]["gamma_se_given_E"] == pytest.approx(0.000828, abs=2e-6)
    # the printed se carries the refitted floor: the reference's is its free-E fit's, delta-gamma's is much smaller
    assert out["arms"]["vanilla"]["gamma_se"] == pytest.approx(out["arms"]["vanilla"]["free_gamma_se"], rel=1e-9)
    ug = out["arms"]["untied_grow"]
    assert ug["gamma_se"] > 4 * ug["gamma_se_given_E"] and ug["delta_gamma_se"] < ug["gamma_se"] / 2
    assert ug["delta_gamma"] == pytest.approx(FIGURE3["untied_grow"][0] - FIGURE3["vanilla"][0], abs=1e-4)
    # caution: the per-arm free-E fits are very different; only Untied-Grow's own data reject the shared E
    ug = out["arms"]["untied_grow"]
    assert ug["free_gamma"] == pytest.approx(0.0977, abs=1e-3) and ug["free_E"] == pytest.approx(1.474, abs=2e-3)
    assert ug["free_disagrees"] and not out["arms"]["vanilla"]["free_disagrees"]


def test_anchor_depth_moves_budgets_and_c0(capsys):
    out = run_json(capsys, "ladders", RELEASE, "--anchor-depth", "12")
    ref = {int(r["depth"]): float(r["compute_flops"]) for r in csv.DictReader(open(RELEASE)) if r["arm"] == "vanilla"}
    assert out["C0"] == pytest.approx(ref[12], rel=1e-9)
    compute = [m["compute"] for m in out["arms"]["operator_1"]["multipliers"]]
    assert compute == pytest.approx([ref[d] for d in (12, 14, 16, 18, 20)], rel=1e-9)
    assert out["E"] == pytest.approx(1.706433, abs=1e-5)  # E does not depend on the anchor


def test_synthetic_ladders_recover_exponents_and_fitted_multiplier(tmp_path, capsys):
    path, _ = synthetic_ladders(tmp_path)
    out = run_json(capsys, "ladders", path)
    assert out["E"] == pytest.approx(1.7, abs=1e-4)
    assert out["arms"]["better"]["gamma"] == pytest.approx(0.12, abs=1e-4)
    assert out["arms"]["vanilla"]["A"] == pytest.approx(1.6, abs=1e-3)
    # pi(C) from the two exact laws, in closed form
    c = out["arms"]["vanilla"]["multipliers"][-1]["compute"] / 1e18
    lo = math.log(1.6) - 0.11 * math.log(c)  # ln(L_ref - E)
    c_arm = math.exp((math.log(1.55) - lo) / 0.12)
    assert out["arms"]["better"]["fitted_final_multiplier"] == pytest.approx(c / c_arm, rel=1e-3)


def test_compute_at_loss_edge_cases():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    # no bracket: target below every loss -> missing, never extrapolated
    assert math.isnan(laws.compute_at_loss(x, np.array([3.0, 2.9, 2.8, 2.7]), 2.5))
    # linear in loss, log in compute
    assert laws.compute_at_loss(x, np.array([3.0, 2.0, 1.5, 1.0]), 2.5) == pytest.approx(math.sqrt(2))
    # a non-monotone (worsening) segment is skipped even if it brackets the target; the minimum compute wins
    loss = np.array([3.0, 2.0, 2.6, 2.2])
    assert laws.compute_at_loss(x, loss, 2.4) == pytest.approx(2 ** 0.6)  # from the first segment only
    assert laws.compute_at_loss(x, np.array([3.0, 3.0, 2.0, 1.0]), 2.99) == pytest.approx(4 * 2 ** -0.99)
    assert math.isnan(laws.compute_at_loss(x, np.array([2.0, 2.5, 3.0, 3.5]), 2.2))


def test_bad_arms_do_not_stop_others(tmp_path, capsys):
    path, rows = synthetic_ladders(tmp_path)
    rows += [["tiny", 8, 1e18, 3.0], ["tiny", 10, 3e18, 2.9]]  # fewer than 3 points
    rows += [["below_floor", d, 1e18 * d, 1.69 - 0.01 * d] for d in (6, 8, 10)]  # loss <= E
    rows += [["never_reaches", d, 1e18 * (d / 8) ** 4.5, 3.6 - 0.01 * d] for d in (6, 8, 10, 12)]  # no bracket
    write_csv(path, ["arm", "depth", "compute_flops", "val_loss"], rows)
    res = run(capsys, "ladders", path, "--json")
    out = json.loads(res.out)
    assert set(out["arms"]) == {"vanilla", "better", "never_reaches"}
    assert "fewer than 3" in out["errors"]["tiny"] and "<= E" in out["errors"]["below_floor"]
    assert out["arms"]["never_reaches"]["multipliers"] == [] and out["arms"]["never_reaches"]["final_multiplier"] is None
    assert "arm tiny:" in res.err and "arm below_floor:" in res.err and "arm never_reaches: no improving bracket" in res.err


def test_bootstrap_reproducible_with_seed(tmp_path, capsys):
    path, _ = synthetic_ladders(tmp_path, noise=0.003)
    a = run_json(capsys, "ladders", path, "--bootstrap", 20, "--seed", 3)
    b = run_json(capsys, "ladders", path, "--bootstrap", 20, "--seed", 3)
    c = run_json(capsys, "ladders", path, "--bootstrap", 20, "--seed", 4)
    assert a == b and a["arms"]["better"]["gamma_ci"] != c["arms"]["better"]["gamma_ci"]
    r = a["arms"]["better"]
    assert r["gamma_ci"][0] <= r["gamma_ci"][1] and r["bootstrap_valid"] > 15
    assert r["final_multiplier_ci"][0] <= r["final_multiplier_ci"][1] and len(a["E_ci"]) == 2


def test_extrapolate_warns_and_gives_ci(tmp_path, capsys):
    path, _ = synthetic_ladders(tmp_path, noise=0.002)
    res = run(capsys, "ladders", path, "--extrapolate", 1e25, "--bootstrap", 10, "--json")
    out = json.loads(res.out)
    r = out["arms"]["better"]
    assert out["extrapolate"] == 1e25 and r["pi_at_extrapolate"] > 1 and r["gain_at_extrapolate"] > 1
    for key in ("forecast_loss", "gain_at_extrapolate", "pi_at_extrapolate"):
        assert r[f"{key}_ci"][0] <= r[f"{key}_ci"][1]
    assert "warning: extrapolating" in res.err
    assert "warning" not in run(capsys, "ladders", path, "--extrapolate", 1e20, "--bootstrap", 2, "--json").err


def test_extrapolate_forecast_and_figure4_gain_exact(tmp_path, capsys):
    # exact laws: the arm's forecast is its law; the gain inverts the reference's free-E law at that loss
    path, _ = synthetic_ladders(tmp_path)
    C = 1.2252577e21
    r = run_json(capsys, "ladders", path, "--extrapolate", C, "--bootstrap", 0)["arms"]
    x = C / 1e18
    loss = 1.7 + 1.55 * x ** -0.12
    assert r["better"]["forecast_loss"] == pytest.approx(loss, abs=1e-5)
    c_ref = ((loss - 1.7) / 1.6) ** (-1 / 0.11) * 1e18  # vanilla's compute at the arm's forecast loss
    assert r["better"]["gain_at_extrapolate"] == pytest.approx(c_ref / C, rel=2e-3)
    pi = C / ((((1.6 * x ** -0.11) / 1.55) ** (-1 / 0.12)) * 1e18)  # C / C_arm(L_ref(C))
    assert r["better"]["pi_at_extrapolate"] == pytest.approx(pi, rel=2e-3)
    assert r["better"]["gain_at_extrapolate"] != pytest.approx(r["better"]["pi_at_extrapolate"], rel=1e-2)
    assert r["vanilla"]["gain_at_extrapolate"] == pytest.approx(1.0)


def test_release_extrapolation_to_d26_prints_paper_gain_and_pi(capsys):
    out = run_json(capsys, "ladders", RELEASE, "--extrapolate", 1.2252577e21, "--bootstrap", 20)
    ug = out["arms"]["untied_grow"]
    assert ug["gain_at_extrapolate"] == pytest.approx(1.863, abs=0.005)  # anchored at the arm's compute
    assert ug["pi_at_extrapolate"] == pytest.approx(1.806, abs=0.005)    # anchored at the reference's compute
    assert ug["forecast_loss_ci"][0] < ug["forecast_loss"] < ug["forecast_loss_ci"][1]
    assert out["bootstrap"]["kind"] == "points" and not out["bootstrap"]["includes_seed_noise"]


def complete_runs(tmp_path, **fields):
    """The synthetic ladders as complete runs' folders RUNS/ARM_dDD/result.json; fields(arm, depth, C, L) -> the extra
    keys of each result.json. -> (the ladders' CSV path, its rows, RUNS)."""
    path, rows = synthetic_ladders(tmp_path)
    runs = tmp_path / "runs"
    for arm, d, C, L in rows:
        os.makedirs(runs / f"{arm}_d{d:02d}")
        with open(runs / f"{arm}_d{d:02d}" / "result.json", "w") as f:
            json.dump(dict(status="complete", arch=arm, depth=d, estimated_training_flops=C, final_val_loss=L,
                           **{k: v(arm, d, C, L) for k, v in fields.items()}), f)
    return path, rows, runs


def test_result_json_runs_and_time_axis(tmp_path, capsys):
    path, rows, runs = complete_runs(tmp_path, total_training_time_seconds=lambda arm, d, C, L: C / 1e15)
    os.makedirs(runs / "vanilla_d22")
    with open(runs / "vanilla_d22" / "result.json", "w") as f:
        json.dump(dict(status="running", arch="vanilla", depth=22), f)
    from_csv = run_json(capsys, "ladders", path)
    res = run(capsys, "ladders", "--runs-dir", runs, "--json")
    assert json.loads(res.out)["arms"] == from_csv["arms"] and "status 'running'" in res.err
    # --time: the same laws on training seconds give the same exponents (time is proportional to FLOPs here)
    t = run_json(capsys, "ladders", "--runs-dir", runs, "--time")
    assert t["x_unit"] == "s" and t["arms"]["better"]["gamma"] == pytest.approx(0.12, abs=1e-4)
    csv_t, _ = synthetic_ladders(tmp_path, extra_col=True)
    assert run_json(capsys, "ladders", csv_t, "--time")["arms"]["better"]["multipliers"] == t["arms"]["better"]["multipliers"]


def test_figures_written_and_pass_the_figure_lint(tmp_path, capsys, monkeypatch):
    """Figures 3 and 2 (left) of the release's ladders: written, and no colliding tick labels, annotations or legend
    entries, every axis labelled, legends listing the lines drawn (tests/figlint.py)."""
    problems = figlint.capture(monkeypatch, fit)
    os.makedirs(tmp_path / "figs")
    (tmp_path / "figs" / "fig3_ladders.png").write_text("an earlier fit's")  # a fit's outputs are replaced
    res = run(capsys, "ladders", RELEASE, "--out", tmp_path / "figs")
    for name in ("fig3_ladders", "fig2_left"):
        for ext in ("png", "pdf"):
            assert os.path.getsize(tmp_path / "figs" / f"{name}.{ext}") > 1000
    assert "gamma ± se" in res.out and "mult last" in res.out
    assert set(problems) == {"fig3_ladders", "fig2_left"} and problems == {k: [] for k in problems}


def test_a_ladder_without_vanilla_fits_by_the_stated_reference_rule(tmp_path, capsys):
    """Vanilla if present, else --reference-arm, else the only arm; several arms and none named: one line naming the
    flag. The floor and the anchor depth follow from that choice: no second flag (--refit-floor, --anchor-depth)."""
    _, rows = synthetic_ladders(tmp_path)
    renamed = [["loop_2" if a == "vanilla" else "mine", d // 2 - 2, C, L, C / 1e15] for a, d, C, L in rows
               if d < 20]  # depths 1..7: the anchor depth follows from the ladder (its second depth), no flag
    two = write_csv(tmp_path / "two.csv", ["arm", "depth", "compute_flops", "val_loss", "training_seconds"], renamed)
    one = write_csv(tmp_path / "one.csv", ["arm", "depth", "compute_flops", "val_loss"],
                    [r[:4] for r in renamed if r[0] == "loop_2"])
    err = cli_error(capsys, "ladders", two)
    assert "no vanilla in the inputs: name the arm the others are compared with, e.g. --reference-arm loop_2" in err
    only = run_json(capsys, "ladders", one)
    assert only["reference_arm"] == "loop_2" and only["arms"]["loop_2"]["gamma"] == pytest.approx(0.11, abs=1e-3)
    assert only["C0"] == pytest.approx(renamed[1][2])
    named = run_json(capsys, "ladders", two, "--reference-arm", "loop_2")
    assert named["E"] == pytest.approx(only["E"]) and named["arms"]["mine"]["gamma"] == pytest.approx(0.12, abs=1e-3)
    assert run_json(capsys, "ladders", two, "--reference-arm", "mine", "--time")["reference_arm"] == "mine"


# ------------------------------------------------------------------------------------------------ surface
def surface_grid(k, noise, seed=0, A=1000.0, alpha=0.4, B=2000.0, beta=0.3, E=1.5):
    N, D = np.meshgrid(np.geomspace(5e7, 2e9, 6), np.geomspace(1e9, 1e11, 6))
    N, D = N.ravel(), D.ravel()
    L = (A / N ** alpha + B / D ** beta) ** k + E
    return N, D, L * np.exp(noise * np.random.default_rng(seed).standard_normal(len(L)))


@pytest.mark.parametrize("form,k", [("chinchilla", 1.0), ("skaling", 0.5), ("skaling", 1.0)])
def test_surface_recovers_parameters(form, k):
    N, D, L = surface_grid(k, noise=5e-4)
    p = laws.fit_surface(N, D, L, form, delta=1e-3, hops=5, seed=0)
    assert p["k"] == pytest.approx(k, abs=0.1)  # k = 1 data gives k ~ 1 under the Skaling form
    assert p["alpha"] == pytest.approx(0.4, abs=0.05) and p["beta"] == pytest.approx(0.3, abs=0.05)
    assert p["E"] == pytest.approx(1.5, abs=0.1)
    assert laws.mape(p, N, D, L) < 0.1


def test_compute_optimal_closed_form():
    p = dict(A=1000.0, alpha=0.4, B=2000.0, beta=0.3, E=1.5, k=0.5)
    o = laws.compute_optimal(p, 1e21)
    Ns = np.geomspace(o["N"] / 3, o["N"] * 3, 2001)  # brute force along 6 N D = C
    assert Ns[np.argmin(laws.surface_predict(p, Ns, 1e21 / 6 / Ns))] == pytest.approx(o["N"], rel=2e-3)
    assert 6 * o["N"] * o["D"] == pytest.approx(1e21) and o["ratio"] == pytest.approx(o["D"] / o["N"])


def test_surface_cli(tmp_path, capsys):
    N, D, L = surface_grid(0.5, 5e-4)
    path = write_csv(tmp_path / "grid.csv", ["N", "compute", "loss"], zip(N, 6 * N * D, L))
    out = run_json(capsys, "surface", path, "--form", "both", "--hops", 0, "--sparse-l", "--budgets", 1e21)
    sk, ch = out["forms"]["skaling"], out["forms"]["chinchilla"]
    assert sk["params"]["k"] == pytest.approx(0.5, abs=0.1)
    assert sk["mape_all"] < ch["mape_all"]  # the coupled truth: Chinchilla's form cannot follow it
    assert sk["sparse_l"]["n_fit"] == 11 and sk["sparse_l"]["mape_rest"] < 3.0
    assert sk["optimal"][0]["compute"] == 1e21 and out["delta"] == dict(chinchilla=1e-3, skaling=0.05)


# ------------------------------------------------------------------------------------------------ other fits
def test_downstream_forecast(tmp_path, capsys):
    tasks = {"t1": (0.6, 1.0, 0.3, 4.0, 5.0), "t2": (0.8, 1.5, 0.25, 3.0, 4.0), "t3": (0.5, 0.8, 0.35, 5.0, 4.5)}
    arms = {"vanilla": 1.0, "better": 0.9}  # the better arm's reducible NLL is scaled down
    r_true, rows = 0.9, []
    for arm, s in arms.items():
        for C in np.geomspace(3e17, 1e20, 7):
            nll = {t: E + s * A * (C / 1e18) ** -al for t, (E, A, al, a, b) in tasks.items()}
            acc = {t: 1 / (1 + math.exp(tasks[t][3] * nll[t] - tasks[t][4])) for t in tasks}
            rows.append([arm, C, r_true * np.mean(list(acc.values()))] + list(nll.values()) + list(acc.values()))
    path = write_csv(tmp_path / "down.csv", ["arm", "compute_flops", "core"] + [f"nll:{t}" for t in tasks]
                     + [f"acc:{t}" for t in tasks], rows)
    out = run_json(capsys, "downstream", path, "--targets", 0.3, "--at", 1e21)
    assert out["ratio"] == pytest.approx(r_true, abs=1e-6)
    for t, (E, A, al, a, b) in tasks.items():
        assert out["sigmoids"][t]["a"] == pytest.approx(a, abs=1e-3) and out["sigmoids"][t]["b"] == pytest.approx(b, abs=1e-3)
        assert out["arms"]["vanilla"]["nll_laws"][t]["alpha"] == pytest.approx(al, abs=1e-3)

    def true_core(C, s):
        return r_true * np.mean([1 / (1 + math.exp(a * (E + s * A * (C / 1e18) ** -al) - b)) for E, A, al, a, b in tasks.values()])
    for arm, s in arms.items():
        C = out["arms"][arm]["compute_for_target"]["0.3"]
        assert true_core(C, s) == pytest.approx(0.3, abs=1e-4)
        assert out["arms"][arm]["core_at"]["1e+21"] == pytest.approx(true_core(1e21, s), abs=1e-4)
    # the same measurements as train.py runs that core_eval.py evaluated: result.json + eval.json, no CSV
    for i, (arm, C, core, *rest) in enumerate(rows):
        os.makedirs(tmp_path / "runs" / str(i))
        json.dump(dict(status="complete", arch=arm, estimated_training_flops=C),
                  open(tmp_path / "runs" / str(i) / "result.json", "w"))
        json.dump(dict(core_metric=core, losses=dict(zip(tasks, rest[:3])), centered_results=dict(zip(tasks, rest[3:]))),
                  open(tmp_path / "runs" / str(i) / "eval.json", "w"))
    from_runs = run_json(capsys, "downstream", "--runs-dir", tmp_path / "runs", "--targets", 0.3, "--at", 1e21)
    assert from_runs["ratio"] == pytest.approx(out["ratio"]) and set(from_runs["arms"]) == set(out["arms"])
    for arm in arms:
        assert from_runs["arms"][arm]["compute_for_target"] == pytest.approx(out["arms"][arm]["compute_for_target"])


def test_tpp_growth_lr_vertices(tmp_path, capsys):
    rows = [[C, t, math.exp(0.05 * (math.log(t) - math.log(opt)) ** 2 + 1.1)]
            for C, opt in ((1e18, 5.0), (3e18, 5.5), (1e19, 6.0)) for t in (2, 3.5, 5, 8, 13)]
    out = run_json(capsys, "tpp", write_csv(tmp_path / "tpp.csv", ["compute_flops", "tpp", "val_loss"], rows))
    assert [b["tpp"] for b in out["budgets"]] == pytest.approx([5.0, 5.5, 6.0], rel=1e-6)
    assert out["mean_tpp"] == pytest.approx(5.5, rel=1e-6) and out["scale_shift"]["beta"] > 0
    rows = [[d, 1e18 * d, r, 3.0 + 0.1 * (r - opt) ** 2] for d, opt in ((8, 0.52), (9, 0.56), (10, 0.55))
            for r in (0.2, 0.4, 0.6, 0.8)]
    out = run_json(capsys, "growth", write_csv(tmp_path / "g.csv", ["depth", "compute_flops", "rho", "val_loss"], rows))
    assert [g["rho"] for g in out["groups"]] == pytest.approx([0.52, 0.56, 0.55]) and out["rho"] == 0.5
    rows = [[n, v, math.exp(0.02 * (math.log(v) - math.log(0.04 * (n / 1e8) ** -0.7)) ** 2 + 1.2)]
            for n in (1e8, 2e8, 4e8) for v in (0.01, 0.02, 0.04, 0.08, 0.16)]
    out = run_json(capsys, "lr", write_csv(tmp_path / "lr.csv", ["params", "value", "val_loss"], rows))
    assert out["lr"]["beta"] == pytest.approx(-0.7, abs=1e-6) and out["lr"]["anchor"]["value"] == pytest.approx(0.04)
    # no interior minimum: one line naming the group, the others still fitted
    rows += [[8e8, v, 2.0 - 0.01 * math.log(v) ** 2] for v in (0.01, 0.02, 0.04)]
    res = run(capsys, "lr", write_csv(tmp_path / "lr2.csv", ["params", "value", "val_loss"], rows), "--json")
    assert "hparam lr, params 8e+08: no interior minimum" in res.err and len(json.loads(res.out)["lr"]["optima"]) == 3


LOOPS_HEADER = ["depth", "loops", "weight_decay", "compute_flops", "val_loss"]


def test_loops(tmp_path, capsys):
    # log L = base(C) + 0.02 (ln K - ln K*(C))^2 with K*(C) = 2 (C / 1e18)^0.5; compute = d^2 K 1e16 (linear grid in C)
    rows = []
    for d in range(4, 20):
        for K in (1, 2, 3, 4, 6, 8, 12):
            C = d ** 2 * K * 1e16
            kstar = 2 * (C / 1e18) ** 0.5
            for wd in (0.4, 0.8):
                rows.append([d, K, wd, C, math.exp(1.2 - 0.05 * math.log(C / 1e18) + 0.02 * (math.log(K / kstar)) ** 2
                                                   + (0.01 if wd == 0.4 else 0.0))])
    path = write_csv(tmp_path / "grid.csv", LOOPS_HEADER, rows)
    out = run_json(capsys, "loops", path, "--budgets", 5e17, 2e18)
    assert [b["best_loops"] for b in out["budgets"]] == pytest.approx([2 ** 0.5, 2 ** 1.5], rel=0.05)
    assert out["budgets"][1]["gap_to_k1"] > 0
    assert out["gain_fixed_wd"] > 1 and out["gain_all_wd"] >= out["gain_fixed_wd"] - 1e-9


def test_loops_reads_train_runs_like_the_csv(tmp_path, capsys):
    rows = [[d, K, 0.8, d ** 2 * K * 1e16, 3.0 - 0.1 * math.log(d ** 2 * K) + 0.01 * (K - 2) ** 2]
            for d in (4, 6, 8, 10) for K in (1, 2, 4)]
    csv_out = run_json(capsys, "loops", write_csv(tmp_path / "g.csv", LOOPS_HEADER, rows), "--budgets", 8e17)
    for i, (d, K, wd, C, loss) in enumerate(rows + [[12, 2, 0.8, 1.0, 9.9]]):
        os.makedirs(tmp_path / "runs" / str(i))
        status = "complete" if i < len(rows) else "running"  # an unfinished run is ignored
        plan = dict(depth=d, passes_final=K, weight_decay=wd, data_constrained="fixed-wd")
        json.dump(dict(status=status, estimated_matrix_flops=C, final_val_loss=loss, plan=plan),
                  open(tmp_path / "runs" / str(i) / "result.json", "w"))
    assert run_json(capsys, "loops", "--runs-dir", tmp_path / "runs", "--budgets", 8e17) == csv_out


def test_lower_envelope_is_the_convex_pareto_frontier():
    # (3, 2.9) and (5, 2.2) are no new loss minima; (2, 2.6) lies below the chord from (1, 3) to (4, 2) in compute,
    # above it in log compute
    x, y = [4, 1, 3, 2, 5], [2.0, 3.0, 2.9, 2.6, 2.2]
    assert laws.lower_envelope(x, y).tolist() == [[1, 3.0], [2, 2.6], [4, 2.0]]
    assert laws.lower_envelope(x, y, log=True).tolist() == [[1, 3.0], [pytest.approx(4), 2.0]]
    assert laws.lower_envelope([], []).shape == (0, 2)


# ------------------------------------------------------------------------------------------------ replicates and noise
def replicate_ladders(tmp_path, sigma, seeds=3, seed=0, arms=None):
    """synthetic_ladders with `seeds` replicate runs per point, ln L = ln L_true + sigma z, in a seed column."""
    arms = arms or {"vanilla": (1.6, 0.11), "better": (1.55, 0.12)}
    rng, rows = np.random.default_rng(seed), []
    for arm, (A, g) in arms.items():
        for d in range(6, 22, 2):
            C = 1e18 * (d / 8) ** 4.5
            for s in range(seeds):
                rows.append([arm, d, C, (1.7 + A * (C / 1e18) ** -g) * math.exp(sigma * rng.standard_normal()), s])
    return write_csv(tmp_path / "reps.csv", ["arm", "depth", "compute_flops", "val_loss", "seed"], rows), rows


def test_replicates_pool_to_mean_and_pooled_sigma(tmp_path, capsys):
    path, rows = replicate_ladders(tmp_path, sigma=0.004)
    out = run_json(capsys, "ladders", path)
    by_point = {}
    for arm, d, C, L, s in rows:
        by_point.setdefault((arm, d), []).append(L)
    p = out["arms"]["better"]["points"][0]
    assert p["n"] == 3 and p["loss"] == pytest.approx(np.mean(by_point[("better", p["depth"])]), rel=1e-12)
    ss = sum(((np.log(v) - np.log(v).mean()) ** 2).sum() for v in by_point.values())
    assert out["noise"]["sigma"] == pytest.approx(math.sqrt(ss / (2 * len(by_point))), rel=1e-9)  # 2 dof per point
    assert out["noise"]["dof"] == 2 * len(by_point) == 32 and out["noise"]["source"] == "replicates"
    assert 0.0025 < out["noise"]["sigma"] < 0.0055
    text = run(capsys, "ladders", path, "--bootstrap", 5).out
    assert "pooled from seed replicates, 32 dof" in text and "include seed noise" in text


def test_weighted_shared_e_fit_is_weighted_least_squares():
    rng = np.random.default_rng(1)
    x = np.geomspace(1, 100, 7)
    loss = 1.7 + 1.6 * x ** -0.11 + 0.003 * rng.standard_normal(7)
    sd = 0.001 * np.arange(1, 8)
    r = laws.fit_shared_e(x, loss, 1.7, sd)
    slope, icpt = np.polyfit(np.log(x), np.log(loss - 1.7), 1, w=(loss - 1.7) / sd)  # w = 1 / sd of ln(L - E)
    assert r["gamma"] == pytest.approx(-slope, rel=1e-9) and r["A"] == pytest.approx(math.exp(icpt), rel=1e-9)
    unweighted = laws.fit_shared_e(x, loss, 1.7)
    assert r["gamma"] != pytest.approx(unweighted["gamma"], rel=1e-4)
    # known-noise standard error: exactly (X^T W X)^-1, independent of the residuals
    X = np.stack([np.ones(7), np.log(x)], 1)
    W = ((loss - 1.7) / sd) ** 2
    assert r["gamma_se"] == pytest.approx(math.sqrt(np.linalg.inv(X.T @ (W[:, None] * X))[1, 1]), rel=1e-9)


def test_parametric_bootstrap_matches_known_noise_errors(tmp_path, capsys):
    # 5 seeds per point (64 dof): the re-drawn-noise bootstrap spread of the reference gamma (E refitted every draw)
    # matches the linearised known-noise standard error of the free-E fit
    path, _ = replicate_ladders(tmp_path, sigma=0.002, seeds=5, arms={"vanilla": (1.6, 0.11)})
    out = run_json(capsys, "ladders", path, "--bootstrap", 300, "--anchor-depth", 6)
    v = out["arms"]["vanilla"]
    assert out["bootstrap"]["kind"] == "noise" and out["bootstrap"]["includes_seed_noise"]
    assert v["gamma_boot_se"] == pytest.approx(v["free_gamma_se"], rel=0.25)
    # and it scales with the noise: the same means with --noise 4x the pooled sigma give ~4x the spread
    big = run_json(capsys, "ladders", path, "--bootstrap", 300, "--anchor-depth", 6, "--noise",
                   4 * out["noise"]["sigma"])
    assert big["noise"]["source"] == "--noise"
    assert big["arms"]["vanilla"]["gamma_boot_se"] == pytest.approx(4 * v["gamma_boot_se"], rel=0.35)


def test_noise_flag_without_replicates_and_points_bootstrap_label(tmp_path, capsys):
    path, _ = synthetic_ladders(tmp_path, noise=0.002)
    plain = run(capsys, "ladders", path, "--bootstrap", 5).out
    assert "do not include run-to-run noise" in plain and "none given" in plain
    out = run_json(capsys, "ladders", path, "--bootstrap", 20, "--noise", 0.001)
    assert out["noise"] == dict(sigma=0.001, dof=0, source="--noise", scale=out["noise"]["scale"], replicated_points=0)
    assert out["bootstrap"]["includes_seed_noise"] and "reduced_chi2" in out["arms"]["better"]


def test_seed_runs_from_ladder_sh_names_pool(tmp_path, capsys):
    path, rows = replicate_ladders(tmp_path, sigma=0.003, seeds=2)
    for arm, d, C, L, s in rows:
        os.makedirs(tmp_path / "runs" / f"{arm}_d{d}_s{s}")
        json.dump(dict(status="complete", arch=arm, depth=d, estimated_training_flops=C, final_val_loss=L,
                       plan=dict(seed=s)), open(tmp_path / "runs" / f"{arm}_d{d}_s{s}" / "result.json", "w"))
    from_runs, from_csv = run_json(capsys, "ladders", "--runs-dir", tmp_path / "runs"), run_json(capsys, "ladders", path)
    assert from_runs["noise"] == from_csv["noise"] and from_runs["arms"]["better"]["gamma"] == from_csv["arms"]["better"]["gamma"]


def test_holdout_forecasts_the_held_point(tmp_path, capsys):
    path, _ = synthetic_ladders(tmp_path)
    out = run_json(capsys, "ladders", path, "--holdout", "better:20", "vanilla:6")
    (b, v) = sorted(out["held_out"], key=lambda h: h["arm"])
    assert b["depth"] == 20 and abs(b["residual"]) < 1e-4 and abs(v["residual"]) < 1e-4  # exact laws
    assert [p["depth"] for p in out["arms"]["better"]["points"]] == list(range(6, 20, 2))
    assert "held out better d20" in run(capsys, "ladders", path, "--holdout", "better:20").out


def test_fit_is_torch_free_and_loads_matplotlib_only_for_figures():
    code = ("import sys, fit, laws; assert fit.main(['ladders', sys.argv[1]]) == 0; "
            "assert 'torch' not in sys.modules and 'matplotlib.pyplot' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code, RELEASE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("E = 1.706433 "), r.stderr


# ------------------------------------------------------------------------------------------------ design
X = np.geomspace(1.0, 100.0, 8)  # compute in 1e18 FLOPs
LAWS = {"vanilla": (1.6, 0.11), "better": (1.55, 0.115)}


def test_simulated_spread_and_interval_coverage_match_the_known_variance_linear_fit():
    # E known: gamma is a weighted linear fit in log-log space with known noise, whose standard error is closed-form;
    # the simulated estimates spread by it and the analyst's interval gamma +- 1.96 se covers the truth 95 % of the time
    n = np.array([1, 1, 1, 1, 1, 1, 3, 3])
    points = {"vanilla": (X, n)}
    sigma = 0.002
    draws = laws.simulate(points, {"vanilla": LAWS["vanilla"]}, 1.7, "vanilla", sigma, 1500,
                             np.random.default_rng(0), fixed_E=True)
    gamma = draws["vanilla"]["gamma"]
    se = laws.analytic_gamma_se(X, n, 1.7, *LAWS["vanilla"], sigma)
    assert np.std(gamma) == pytest.approx(se, rel=0.07)
    assert np.mean(gamma) == pytest.approx(0.11, abs=3 * se / math.sqrt(1500) + 2e-5)
    assert draws["vanilla"]["gamma_se"] == pytest.approx(se, rel=0.01)  # the fit's own se is the closed form
    summary = laws.summarize(points, {"vanilla": LAWS["vanilla"]}, 1.7, "vanilla", sigma, draws)["vanilla"]
    assert summary["gamma_coverage"] == pytest.approx(0.95, abs=0.03) and summary["valid"] == 1500
    # the same plan with 4 seeds everywhere halves the error (variance of a mean of 4)
    assert laws.analytic_gamma_se(X, 4 * n, 1.7, *LAWS["vanilla"], sigma) == pytest.approx(se / 2)


def test_refitted_floor_widens_gamma_more_than_delta_gamma_and_the_printed_se_carries_it():
    # E refitted on the reference arm: gamma's spread more than doubles, delta-gamma's much less; the se with E held
    # fixed covers the true gamma far less than 95 %, the se carrying E's uncertainty (what fit.py ladders prints)
    # about 95 %, for gamma and for delta-gamma
    points = {a: (X, np.ones(8, int)) for a in LAWS}
    known = laws.summarize(points, LAWS, 1.7, "vanilla", 0.002, laws.simulate(
        points, LAWS, 1.7, "vanilla", 0.002, 300, np.random.default_rng(3), fixed_E=True))
    s = laws.summarize(points, LAWS, 1.7, "vanilla", 0.002, laws.simulate(
        points, LAWS, 1.7, "vanilla", 0.002, 300, np.random.default_rng(3)))
    assert s["better"]["gamma_ci_halfwidth"] > 2 * known["better"]["gamma_ci_halfwidth"]
    assert s["better"]["delta_gamma_ci_halfwidth"] < 0.5 * s["better"]["gamma_ci_halfwidth"]
    for arm in LAWS:
        assert s[arm]["gamma_coverage"] == pytest.approx(0.95, abs=0.04) and s[arm]["gamma_coverage_given_E"] < 0.6
        assert known[arm]["gamma_coverage"] == known[arm]["gamma_coverage_given_E"]  # nothing to carry with E known
    assert s["better"]["delta_gamma_coverage"] == pytest.approx(0.95, abs=0.04)
    assert 0 <= s["better"]["lower_floor"] < 0.2 and math.isnan(known["better"]["lower_floor"])
    assert 0 <= s["better"]["power"] <= s["better"]["detect_probability"] + 0.1


def test_detection_probability_tracks_the_effect():
    points = {a: (X, np.ones(8, int)) for a in LAWS}
    sim = lambda truth: laws.summarize(points, truth, 1.7, "vanilla", 0.002, laws.simulate(
        points, truth, 1.7, "vanilla", 0.002, 600, np.random.default_rng(2), fixed_E=True))["better"]
    null = sim({"vanilla": (1.6, 0.11), "better": (1.6, 0.11)})
    strong = sim(LAWS)
    assert null["detect_probability"] < 0.06
    # for a normal estimate with sd s = h / 1.96: P(estimate > h) = Phi(delta / s - 1.96)
    from scipy.stats import norm
    expected = norm.cdf(0.005 / (strong["delta_gamma_ci_halfwidth"] / 1.96) - 1.96)
    assert 0.5 < expected < 0.98 and strong["detect_probability"] == pytest.approx(expected, abs=0.04)
    assert null["delta_gamma_true"] == 0 and strong["delta_gamma_true"] == pytest.approx(0.005)


def test_design_specs_select_depths_and_seeds():
    plan = {(a, d): 1e18 * d for a in ("vanilla", "better") for d in range(6, 24, 2) if a == "vanilla" or d <= 18}
    x, n, ds = fit.apply_design(plan, "d6-18 x3@top2")["vanilla"]
    assert ds == list(range(6, 20, 2)) and list(n) == [1] * 5 + [3, 3] and list(x) == [1e18 * d for d in ds]
    top = fit.apply_design(plan, "d6-22 x3@top2")
    assert top["vanilla"][2][-1] == 22 and top["better"][2][-1] == 18 and list(top["better"][1][-2:]) == [3, 3]
    assert list(fit.apply_design(plan, "x2@8,10")["better"][1][:3]) == [1, 2, 2]
    with pytest.raises(fit.UsageError, match=r"asks for a depth no planned run has \(26\)"):
        fit.apply_design(plan, "d6-26")
    with pytest.raises(fit.UsageError, match="use 'd6-18'"):
        fit.apply_design(plan, "depths 6 to 18")


def test_design_cli_from_dry_run_lines_and_gpu_hours(tmp_path, capsys):
    lines = [json.dumps(dict(arch=a, depth=d, total_flops=1e18 * (d / 8) ** 4.5)) for a in LAWS for d in range(6, 22, 2)]
    (tmp_path / "plan.jsonl").write_text("\n".join(lines) + "\n")
    pilot = dict(E=1.7, arms={a: dict(A=A, gamma=g) for a, (A, g) in LAWS.items()})
    (tmp_path / "pilot.json").write_text(json.dumps(pilot))
    fit.main(["design", str(tmp_path / "plan.jsonl"), "--truth", str(tmp_path / "pilot.json"), "--noise", "0.002",
              "--design", "d6-16", "--design", "d6-20 x3@top2", "--sims", "40", "--mfu", "0.5", "--json"])
    out = json.loads(capsys.readouterr().out)
    small, big = out["designs"]
    assert small["runs"] == 12 and big["runs"] == 16 + 2 * 4
    flops = sum(1e18 * (d / 8) ** 4.5 for d in range(6, 18, 2)) * 2
    assert small["flops"] == pytest.approx(flops) and small["gpu_hours"] == pytest.approx(flops / (989e12 * 0.5) / 3600)
    assert big["arms"]["better"]["gamma_se_known_E"] < small["arms"]["better"]["gamma_se_known_E"]
    assert big["depths"]["better"] == {"6": 1, "8": 1, "10": 1, "12": 1, "14": 1, "16": 1, "18": 3, "20": 3}
    # a pilot of the reference arm alone: every other arm is the reference + --delta-gamma
    (tmp_path / "pilot.json").write_text(json.dumps(dict(E=1.7, arms=dict(vanilla=dict(A=1.6, gamma=0.11)))))
    fit.main(["design", str(tmp_path / "plan.jsonl"), "--truth", str(tmp_path / "pilot.json"), "--delta-gamma", "0.004",
              "--noise", "0.002", "--sims", "20"])
    text = capsys.readouterr().out
    assert "better" in text and "+0.0040" in text and "GPU-hours" in text
    assert "analyst's 95% intervals" in text and "lower E" in text


def test_release_pilot_designs_run(tmp_path, capsys):
    (tmp_path / "pilot.json").write_text(json.dumps(dict(E=1.706433, arms=dict(vanilla=dict(A=1.6354, gamma=0.111249)))))
    fit.main(["design", RELEASE, "--truth", str(tmp_path / "pilot.json"), "--delta-gamma", "0.0055", "--noise", "0.001",
              "--design", "x3@top2", "--sims", "20", "--json"])
    d = json.loads(capsys.readouterr().out)["designs"][0]
    assert d["depths"]["vanilla"] == {"6": 1, "8": 1, "10": 1, "12": 1, "14": 1, "16": 1, "18": 3, "20": 3}
    assert d["depths"]["untied_grow"]["18"] == 3 and d["runs"] == 58 + 8 * 2 * 2


def test_every_planned_ladder_and_loop_grid_is_one_recipe():
    # the runs ladder.sh plans for one arm differ only in what fit.py lets a ladder (or the loop grid) vary
    import arms
    import train
    plan = lambda argv: dict(plan=train.make_plan(train.parse_args(argv)).as_dict())
    for preset in ("paper", "cpu"):
        for arm in arms.ARMS:
            runs = train.ladder_runs(arm, preset, seeds=[0, 1], replicate_depths=[3 if preset == "cpu" else 8])
            if arm == "untied_grow" and preset == "paper":
                runs += train.ladder_runs(arm, "d26")
            laws.check_one_recipe([(name, plan(argv)) for name, argv in runs], arm)
    grid = train.ladder_runs("operator_1", "data-constrained")
    laws.check_one_recipe([(name, plan(argv)) for name, argv in grid], "grid", fit.LOOP_GRID_VARIED)
    # and a run with another recipe is told apart at any depth
    for flags, field in ((["--lr-multiplier", "2"], "matrix_lr x params_tpp^lr_exponent"), (["--tpp", "9"], "tpp"),
                         (["--width-per-depth", "192"], "width / depth"), (["--recipe", "operator_1"], "adam_betas")):
        runs = [("a", plan(["--arch", "loop_2", "--depth", "6"])), ("b", plan(["--arch", "loop_2", "--depth", "8", *flags]))]
        with pytest.raises(fit.UsageError, match=f"a and b: loop_2 with different {re.escape(field)} "):
            laws.check_one_recipe(runs, "loop_2")


def test_runs_of_one_pool_prepared_twice_fit_together(tmp_path, capsys):
    # the same pool prepared at two times (its manifest's created/finished differ) is one pool
    path, rows = synthetic_ladders(tmp_path)
    pool = dict(corpus="fineweb", created="2025-01-01T00:00:00", splits=dict(train=dict(sha256="a" * 64)))
    for i, (arm, d, C, L) in enumerate(rows):
        os.makedirs(tmp_path / "runs" / f"{arm}_d{d}")
        json.dump(dict(status="complete", arch=arm, depth=d, estimated_training_flops=C, final_val_loss=L,
                       plan=dict(arch=arm, depth=d, tpp=5, seed=0), data_manifest=dict(pool, created=f"day {i}")),
                  open(tmp_path / "runs" / f"{arm}_d{d}" / "result.json", "w"))
    assert run_json(capsys, "ladders", "--runs-dir", tmp_path / "runs")["arms"] == run_json(capsys, "ladders", path)["arms"]


def test_design_delta_gamma_changes_only_the_arms_it_names(tmp_path):
    """--delta-gamma ARM=DG moves that arm's true gamma; a bare DG only the planned arms the truth has no law for."""
    import argparse
    truth = tmp_path / "pilot.json"
    truth.write_text(json.dumps(dict(E=1.7, arms=dict(vanilla=dict(A=1.6, gamma=0.11), other=dict(A=1.5, gamma=0.12)))))
    args = lambda *dg: argparse.Namespace(truth=str(truth), reference_arm="vanilla",
                                          delta_gamma=[fit.arm_delta_gamma(d) for d in dg])
    _, laws_ = fit.true_laws(args("other=0.02"), ["vanilla", "other"])
    assert laws_ == {"vanilla": (1.6, 0.11), "other": (1.5, pytest.approx(0.13))}
    _, laws_ = fit.true_laws(args("0.005"), ["vanilla", "other", "new"])
    assert laws_["other"] == (1.5, 0.12) and laws_["new"] == (1.6, pytest.approx(0.115))
    for dg in ("0.005", "nope=0.01", "vanilla=0.01"):  # changes no arm, an arm not planned, the reference
        with pytest.raises(fit.UsageError, match="changes a planned arm"):
            fit.true_laws(args(dg), ["vanilla", "other"])


def test_an_arm_has_its_table_colour_and_an_unknown_arm_one_no_table_arm_uses():
    import arms
    assert laws.style("gated_1") == (arms.ARMS["gated_1"].label, arms.ARMS["gated_1"].color)
    assert laws.style("mine")[1] not in {arm.color for arm in arms.ARMS.values()}


def test_a_fit_discloses_its_footing_dof_unknown_intervals_and_bounds(tmp_path, capsys):
    """Three points per arm leave the floor's free-E fit 0 residual degrees of freedom and each shared-E law 1: the
    table says so, prints no ± or CI as if known (no degenerate [g, g]), the figure carries the warning, and no numpy
    warning leaks."""
    import warnings
    runs = tmp_path / "runs"
    laws_ = {"vanilla": (1.6, 0.11), "better": (1.55, 0.13)}
    for arm, (A, g) in laws_.items():
        for d in (1, 2, 3, 4, 5):
            C = 1e16 * d ** 4.5
            os.makedirs(runs / f"{arm}_d{d}")
            with open(runs / f"{arm}_d{d}" / "result.json", "w") as f:
                json.dump(dict(status="complete", arch=arm, depth=d, estimated_training_flops=C,
                               final_val_loss=1.7 + A * (C / 1e18) ** -g + 0.003 * (-1) ** d), f)
    three = [str(runs / f"{a}_d{d}") for a in laws_ for d in (1, 2, 3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail the fit
        out = run(capsys, "ladders", "--runs-dir", *three, "--anchor-depth", "2", "--bootstrap", 50, "--out", tmp_path / "f3").out
    assert "E = " in out and "± unknown (free-E fit of vanilla: 3 points, 0 dof)" in out
    assert "WARNING: the floor E is fitted on vanilla's 3 points with 3 parameters: 0 residual degrees" in out
    assert "WARNING: vanilla, better: too few points for A and gamma (residual degrees of freedom 1, 1)" in out
    assert not re.search(r"\[(-?[0-9.]+), \1\]", out), out  # no degenerate interval
    assert re.search(r"vanilla +3 +1 +0\.\d{4} ± unknown", out)
    got = run_json(capsys, "ladders", "--runs-dir", *three, "--anchor-depth", "2", "--bootstrap", 50)
    assert got["E_dof"] == 0 and got["E_se"] is None and got["arms"]["better"]["gamma_ci"] is None
    assert got["arms"]["better"]["dof"] == 1 and not got["arms"]["better"]["intervals_known"]
    five = run(capsys, "ladders", "--runs-dir", runs, "--anchor-depth", "2", "--bootstrap", 50).out
    assert "WARNING" not in five and re.search(r"E = [0-9.]+ ± [0-9.]+ \(free-E fit of vanilla: 5 points, 2 dof", five)
    assert re.search(r"better +5 +3 +0\.\d{4} ± 0\.\d{4} \[", five)
    # the floor on its bound is named: a ladder that bends the wrong way puts E at 0
    flat = write_csv(tmp_path / "flat.csv", ["arm", "depth", "compute_flops", "val_loss"],
                     [["vanilla", d, 1e16 * d ** 4.5, 3.0 * (1e16 * d ** 4.5 / 1e18) ** -0.05 * (1 + 0.002 * (-1) ** d)]
                      for d in range(1, 7)])
    assert "sits on its bound (0)" in run(capsys, "ladders", flat, "--anchor-depth", "2").out


def test_report_of_a_ladder_fits_its_runs_and_links_each_runs_report(tmp_path, capsys):
    """fit.py report RUNS_DIR: every run's report.md, and RUNS_DIR/report.md with the runs table, the fit of the arms
    with >= 3 complete depths (its table with CIs, Figure 3 in RUNS_DIR/fit) and links to the runs' reports."""
    path, rows, runs = complete_runs(tmp_path, evals=lambda arm, d, C, L: [dict(step=10, when="end", passes=1,
                                                                             val_loss=L)],
                                     plan=lambda arm, d, C, L: dict(arch=arm, depth=d, steps=10))
    out = run(capsys, "report", "--runs-dir", runs, "--bootstrap", 20).out
    assert "gamma ± se [CI]" in out and out.strip().endswith(f"wrote {runs}/report.md")
    report = (runs / "report.md").read_text()
    assert report.startswith(f"# Ladder report: {runs}") and "## Runs" in report and "## Fit" in report
    assert "--bootstrap 20 --out" in report and "![ladders](fit/fig3_ladders.png)" \
        in report and (runs / "fit" / "fig3_ladders.png").exists()
    assert re.search(r"better +8 +6  0\.1200 ± 0\.\d{4} \[", report), report
    run_report = (runs / "better_d10" / "report.md").read_text()
    assert "[better_d10](better_d10/report.md)" in report and "## Validation" in run_report and "| 10 | end | 1 |" \
        in run_report
    suggested = re.search(r"Not evaluated \(`python core_eval\.py (.*?)`\)", run_report).group(1)  # a command that runs
    assert core_eval.build_parser().parse_args(shlex.split(suggested)).checkpoint == os.path.join(
        runs, "better_d10", "checkpoints", "final")
    for d in range(6, 22, 2):  # a ladder without vanilla fits too, no flag added (the reference: its only arm)
        shutil.rmtree(runs / f"vanilla_d{d:02d}")
    run(capsys, "report", "--runs-dir", runs, "--bootstrap", 0)
    assert "(reference arm better, C0 = " in (runs / "report.md").read_text()


# ------------------------------------------------------------------------------------------------ runs, curves
@pytest.fixture(scope="module")
def ladder(pool, tmp_path_factory):
    """A small ladder: Vanilla d2 and Untied-Grow d2 complete (the latter grown at step 4), Vanilla d3 stopped."""
    runs = tmp_path_factory.mktemp("runs")
    assert train.main(tiny(pool, runs, "vanilla", "--run-name", "vanilla_d2", steps=8)) == 0
    assert train.main(tiny(pool, runs, "untied_grow", "--run-name", "untied_grow_d2", "--crossover-fractions", "0.5",
                           steps=8)) == 0
    assert train.main(tiny(pool, runs, "vanilla", "--run-name", "vanilla_d3", "--stop-after", "3", steps=8,
                           depth=3)) == 0
    return runs


def edit_result(run_dir, **changes):
    path = os.path.join(run_dir, "result.json")
    result = json.load(open(path))
    result.update(changes)
    json.dump(result, open(path, "w"))


def table(argv, capsys):
    assert fit.main(argv) == 0
    return capsys.readouterr().out


def hold_lock(path):
    """A process holding the exclusive flock on path, as a train.py writing its run does; returns once it holds it."""
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(path)],
                              stdout=subprocess.PIPE, text=True)
    if holder.stdout.readline().strip() != "held":
        holder.kill()
        raise AssertionError(f"no process could hold {path}")
    return holder


def test_runs_table_names_each_runs_state(ladder, tmp_path, capsys):
    """Complete, running (a process holds train.lock), stopped, resuming (stopped, and a process holds the lock),
    failed with its error, failed because the process died (result.json says running, nobody holds the lock)."""
    runs = tmp_path / "runs"
    shutil.copytree(ladder, runs)
    for name in ("running_d3", "died_d3", "nan_d3", "resuming_d3"):
        shutil.copytree(runs / "vanilla_d3", runs / name)
    edit_result(runs / "running_d3", status="running")
    edit_result(runs / "died_d3", status="running")
    edit_result(runs / "nan_d3", status="failed", error="non-finite loss at step 3")
    holders = [hold_lock(runs / name / "train.lock") for name in ("running_d3", "resuming_d3")]
    try:
        rows = {r["run"]: r for r in json.loads(table(["runs", "--runs-dir", str(runs), "--json"], capsys))["runs"]}
        text = table(["runs", "--runs-dir", str(runs)], capsys)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert {name: r["state"] for name, r in rows.items()} == dict(
        vanilla_d2="complete", untied_grow_d2="complete", vanilla_d3="stopped", running_d3="running", died_d3="failed",
        nan_d3="failed", resuming_d3="resuming")
    assert rows["resuming_d3"]["reason"] == "resuming a stopped run"
    assert "died" in rows["died_d3"]["reason"] and rows["nan_d3"]["reason"] == "non-finite loss at step 3"
    assert (rows["vanilla_d3"]["step"], rows["vanilla_d3"]["steps"]) == (3, 8)
    for name in ("vanilla_d2", "untied_grow_d2"):
        r = rows[name]
        assert (r["step"], r["steps"], r["eta_seconds"]) == (8, 8, None) and r["flops"] == r["flops_planned"] > 0
        assert r["val_loss"] == json.load(open(runs / name / "result.json"))["final_val_loss"] and r["wall_seconds"] > 0
    assert rows["vanilla_d3"]["flops"] < rows["vanilla_d3"]["flops_planned"]
    assert rows["running_d3"]["eta_seconds"] is not None and rows["vanilla_d3"]["eta_seconds"] is None
    lines = text.strip().splitlines()
    assert len(lines) == 2 + len(rows) and lines[0].split()[:6] == ["|", "run", "|", "state", "|", "step"]
    assert any(line.startswith("| running_d3 ") and " running " in line and " 3/8 " in line for line in lines)
    # every column of a row at one step: the stopped run at its step 3 shows the latest validation at or before it,
    # here the start's, labelled so (it read as divergence: 5.5 beside step 3); a complete run its last validation
    assert (rows["vanilla_d3"]["val_step"], rows["vanilla_d2"]["val_step"]) == (0, 8)
    assert any(line.startswith("| vanilla_d3 ") and " 3/8 " in line and " @0 (start) " in line for line in lines)


def test_curves_mark_growth_and_warmdown(ladder, tmp_path, capsys):
    out = tmp_path / "curves"
    assert fit.main(["curves", "--runs-dir", str(ladder), "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["curves_cpu_steps.pdf", "curves_cpu_steps.png"]
    assert os.path.getsize(out / "curves_cpu_steps.png") > 10_000
    plt = laws.pyplot()
    runs = [run for run in fit.read_runs([str(ladder)]) if run[1]]
    assert [r[0]["run"] for r in runs] == ["vanilla_d2", "vanilla_d3", "untied_grow_d2"]  # the arms table's order
    fig = fit.curves_figure(plt, runs, "steps")
    train_ax, val_ax = fig.axes
    markers = lambda ax, m: [line for line in ax.lines if line.get_marker() == m]
    assert len(markers(train_ax, "^")) == len(markers(val_ax, "^")) == 1  # Untied-Grow's growth, on both panels
    grown = markers(train_ax, "^")[0]
    assert list(grown.get_xdata()) == [json.load(open(ladder / "untied_grow_d2" / "result.json"))["growth_events"][0]
                                       ["step"]]
    warmdown = round(8 * (1 - json.load(open(ladder / "vanilla_d2" / "result.json"))["plan"]["warmdown_ratio"]))
    assert [list(m.get_xdata()) for m in markers(train_ax, "|")] == [[warmdown], [warmdown]]  # not the stopped d3
    lines = {line.get_label(): line for line in train_ax.lines if not line.get_label().startswith("_")}
    assert sorted(lines) == ["Untied-Grow d2", "Vanilla d2", "Vanilla d3 [stopped]"]
    assert len({line.get_color() for line in lines.values()}) == 3  # one hue per arm, depth by shade
    assert lines["Vanilla d3 [stopped]"].get_linestyle() == "--" and lines["Vanilla d2"].get_linestyle() == "-"
    fig.canvas.draw()
    for ax in (train_ax, val_ax):  # units on the y axis, plain numbers on its log ticks (no 6×10^0)
        assert ax.get_ylabel().endswith("(nats per token)")
        ticks = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels()]
        assert ticks and not any("times" in t or "×" in t or "^" in t for t in ticks), ticks
    assert "centred mean over 2% of each run's steps" in train_ax.get_title()
    raw = [r["loss"] for r in read_run(ladder, "vanilla_d2")[1]]
    assert list(lines["Vanilla d2"].get_ydata()) == pytest.approx(fit.smoothed(raw)) != raw
    twins = [(row, records, result) for row, records, result in runs[:1]] * 2  # two runs of one arm and depth
    twins[1] = (dict(twins[1][0], run="vanilla_d2_again"), *twins[1][1:])
    labels = [line.get_label() for line in fit.curves_figure(plt, twins, "steps").axes[0].lines]
    assert "Vanilla d2 (vanilla_d2)" in labels and "Vanilla d2 (vanilla_d2_again)" in labels
    assert fit.main(["curves", "--runs-dir", str(ladder), "--out", str(out), "--x", "flops"]) == 0
    assert (out / "curves_cpu_flops.png").exists()


def test_runs_table_shows_a_running_run_at_its_current_step(pool, tmp_path, capsys, monkeypatch):
    """trajectory.jsonl is written through at every logged step, not only at checkpoints: `fit.py runs` during the
    run (here from inside its step-4 write, no checkpoint before the end) shows it running at step 4."""
    seen, write = [], train.Progress.write

    def write_then_look(self, printed=True):
        write(self, printed)
        if self.state.step == 4:
            capsys.readouterr()
            assert fit.main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
            seen.append(json.loads(capsys.readouterr().out)["runs"][0])
    monkeypatch.setattr(train.Progress, "write", write_then_look)
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "live", "--log-every", "2", "--save-every", "0",
                           "--eval-every", "0", steps=8)) == 0
    assert [(r["state"], r["step"], r["steps"]) for r in seen] == [("running", 4, 8)]
    assert seen[0]["train_loss"] is not None and seen[0]["eta_seconds"] is not None
