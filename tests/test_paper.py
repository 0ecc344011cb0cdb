"""Tests for paper.py and what fit.py reads through it: the release's formats (JSON series with short names, training
hours, EFLOP, the downstream file) on fixtures the tests write, the release's floor and anchor conventions, and
`fit.py paper` on the release copy in reference/ against the numbers the paper states."""
import csv
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
import pytest

import figlint
import fit
import laws
import paper
from refusals import assert_refused, run_in_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(REPO, "reference", "release")
DEPTHS = (6, 8, 10, 12, 14)
META = json.load(open(os.path.join(RELEASE, "appendix_ladders", "tasks.json")))
TASKS = META["tasks"]


def law(E, A, gamma, x):
    return E + A * (x / 1e18) ** -gamma


def release_ladders(scale=1.0, hours=False):
    """{series: [records]} as the release writes them: Vanilla and Loop-2 (k2) on E = 1.7 laws, compute ~ d^3; with
    hours, compute is training hours with a fixed 0.1 h overhead (so the time ladder's own floor is not 1.7)."""
    out = {}
    for series, (A, gamma, shift) in {"van": (1.6, 0.11, 1.0), "k2": (1.5, 0.12, 1.1)}.items():
        recs = []
        for d in DEPTHS:
            c = 1e18 * (d / 8) ** 3 * shift * scale
            recs.append(dict(compute=c / 1e21 + 0.1 if hours else c, loss=law(1.7, A, gamma, c), depth=d, parameters=1,
                             effective_depth=float(d), width=64 * d, tokens=1))
        out[series] = recs
    return out


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return str(path)


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def fit_json(capsys, *argv):
    assert fit.main([str(a) for a in argv] + ["--json"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_release_json_read_as_is_with_project_names(tmp_path, capsys):
    obj = release_ladders()
    got, _ = fit_json(capsys, "ladders", write(tmp_path / "ladders.json", obj))
    assert set(got["arms"]) == {"vanilla", "loop_2"}
    rows = [dict(arm={"van": "vanilla", "k2": "loop_2"}[s], depth=r["depth"], compute_flops=r["compute"],
                 val_loss=r["loss"]) for s, recs in obj.items() for r in recs]
    same, _ = fit_json(capsys, "ladders", write_csv(tmp_path / "same.csv", rows))
    assert got["E"] == pytest.approx(same["E"], rel=1e-12)
    assert got["arms"]["loop_2"]["gamma"] == pytest.approx(same["arms"]["loop_2"]["gamma"], rel=1e-12)
    assert got["E"] == pytest.approx(1.7, abs=1e-3)


def test_hours_with_time_keep_the_flop_floor(tmp_path, capsys):
    flops = write(tmp_path / "ladders.json", release_ladders())
    hours = write(tmp_path / "timing.json", release_ladders(hours=True))  # hours grow slower than FLOPs
    got, err = fit_json(capsys, "ladders", hours, "--time", "--floor-from", flops)
    E_flops = paper.floor_of(laws.ladder_data(paper.release_ladder_rows("x", json.load(open(flops)), False)))
    assert got["E"] == pytest.approx(E_flops, rel=1e-12) and "held fixed" in err
    first = got["arms"]["vanilla"]["points"][0]
    assert first["compute"] == pytest.approx(release_ladders(hours=True)["van"][0]["compute"] * 3600)
    refit, _ = fit_json(capsys, "ladders", hours, "--time", "--refit-floor")
    assert abs(refit["E"] - E_flops) > 1e-2  # the time ladder's own floor is another number


def test_reference_arm_keeps_vanilla_floor(tmp_path, capsys):
    obj = release_ladders()
    obj["k2"] = [dict(r, loss=r["loss"] + 0.05) for r in obj["k2"]]  # Loop-2's own floor is 1.75
    path = write(tmp_path / "ladders.json", obj)
    kept, _ = fit_json(capsys, "ladders", path, "--reference-arm", "loop_2")
    refit, _ = fit_json(capsys, "ladders", path, "--reference-arm", "loop_2", "--refit-floor")
    assert kept["E"] == pytest.approx(1.7, abs=1e-3) and refit["E"] == pytest.approx(1.75, abs=1e-3)
    assert kept["reference_arm"] == "loop_2"


def test_shared_anchor_averages_the_equivalent_runs(tmp_path, capsys):
    obj = release_ladders()
    obj["k2"] = [dict(r, compute=obj["van"][i]["compute"]) for i, r in enumerate(obj["k2"])]
    d8 = [r for r in obj["van"] + obj["k2"] if r["depth"] == 8]
    mean = np.mean([r["loss"] for r in d8])
    got, err = fit_json(capsys, "ladders", write(tmp_path / "l.json", obj), "--shared-anchor", 8)
    for arm in ("vanilla", "loop_2"):
        assert [p["loss"] for p in got["arms"][arm]["points"] if p["depth"] == 8] == [pytest.approx(mean)]
    assert "shared d8 anchor" in err


def test_eflop_loop_grid_equals_flops(tmp_path, capsys):
    rows = [dict(weight_decay=0.8, loops=K, depth=d, compute=0.3 * K * (d / 6) ** 3,
                 loss=3.3 + 0.6 * (d / 6) ** -1.2 + 0.05 * (K - 1 - 0.4 * d / 6) ** 2 / K)
            for K in (1, 2, 4, 8) for d in (6, 8, 10, 12, 14, 16)]
    write_csv(tmp_path / "release.csv", rows)
    write_csv(tmp_path / "project.csv", [dict(depth=r["depth"], loops=r["loops"], weight_decay=0.8,
                                              compute_flops=r["compute"] * 1e18, val_loss=r["loss"]) for r in rows])
    assert fit.main(["loops", str(tmp_path / "release.csv"), "--json"]) == 0
    a = capsys.readouterr().out
    assert fit.main(["loops", str(tmp_path / "project.csv"), "--json"]) == 0
    assert a == capsys.readouterr().out


def downstream_fixture(dip=0.0):
    """The release's downstream.json form: CORE answer NLL exactly 0.5 L - 0.2 on every checkpoint; Loop-2 reaches
    each Vanilla value of every metric at half Vanilla's compute. dip: Vanilla's full CORE at d10 lowered by this much
    (non-monotone, as the release's Vanilla CORE is between two depths)."""
    out = {}
    for series, shift in (("van", 1.0), ("k2", 0.5)):
        recs = []
        for d in DEPTHS:
            c = 1e18 * (d / 8) ** 3
            core = 0.1 * np.log(c / shift / 1e17)
            loss = 3.0 - core
            full = core - (dip if series == "van" and d == 10 else 0.0)
            recs.append(dict(compute=c, loss=loss, depth=d,
                             metrics=dict(full_core=full, answer_nll=0.5 * loss - 0.2, filtered_core=core,
                                          filtered_core_std=0.01),
                             task_nll={t: (1 + 0.1 * i) * loss + (0.01 * (i % 3) if shift < 1 else 0)  # Loop-2 offsets
                                       for i, t in enumerate(TASKS)}))
        out[series] = recs
    return out


def test_downstream_reader_and_figure(tmp_path):
    series = paper.downstream_series(write(tmp_path / "downstream.json", downstream_fixture()))
    assert set(series) == {"vanilla", "loop_2"} and set(series["loop_2"][0]["task_nll"]) == set(TASKS)
    made = paper.downstream_figures(paper.pyplot(), series, META)
    paper.pyplot().close("all")
    numbers, line = made["fig19a"][1], made["fig19b"][1]
    assert line["pooled_line"]["slope"] == pytest.approx(0.5) and line["pooled_line"]["intercept"] == pytest.approx(-0.2)
    assert set(numbers["multipliers_at_matched"]) == {"loss", "full_core", "answer_nll", "filtered_core"}
    for metric, per_arm in numbers["multipliers_at_matched"].items():
        assert per_arm["loop_2"]["compute"] == [r["compute"] for r in series["vanilla"] if r["depth"] >= 8]
        mult = [m for m in per_arm["loop_2"]["multiplier"] if np.isfinite(m)]
        assert mult and np.allclose(mult, 2.0, rtol=1e-6), metric  # inside Loop-2's range only: the rest is NaN


def test_downstream_reference_is_one_over_a_non_monotone_series(tmp_path):
    """Vanilla's full CORE dips at d10 below its d8 score: the smallest compute reaching its own d10 score lies
    between d6 and d8, which would draw Vanilla's multiplier over itself below 1 there. The reference arm is 1.0 at
    each of its own computes with depth >= 8, in every metric; the other arms are measured at those computes."""
    series = paper.downstream_series(write(tmp_path / "downstream.json", downstream_fixture(dip=0.075)))
    van = {r["depth"]: r for r in series["vanilla"]}
    assert van[10]["full_core"] < van[8]["full_core"]  # the fixture is non-monotone
    assert laws.compute_at_loss(np.array([r["compute"] for r in series["vanilla"]]),
                                 -np.array([r["full_core"] for r in series["vanilla"]]), -van[10]["full_core"]) \
        < van[8]["compute"]  # what the old rule took: a multiplier < 1 of Vanilla over itself
    numbers = paper.downstream_figures(paper.pyplot(), series, META)["fig19a"][1]
    paper.pyplot().close("all")
    for metric, per_arm in numbers["multipliers_at_matched"].items():
        assert per_arm["vanilla"]["multiplier"] == [1.0] * 4, metric
        assert per_arm["vanilla"]["compute"] == [van[d]["compute"] for d in (8, 10, 12, 14)]
    loop2 = numbers["multipliers_at_matched"]["full_core"]["loop_2"]["multiplier"]
    assert loop2[1] > 2.0  # at the dip Loop-2 needs less compute than at the trend: a larger multiplier there


def test_downstream_missing_metric_refused(tmp_path):
    bad = downstream_fixture()
    del bad["k2"][1]["metrics"]["answer_nll"]
    with pytest.raises(paper.UsageError, match="series 'k2'.*metrics"):
        paper.downstream_series(write(tmp_path / "downstream.json", bad))


@pytest.mark.parametrize("argv, obj, message", [
    (["ladders", "{d}/t.json"], release_ladders(hours=True), "compute is in training hours; pass --time"),
    (["ladders", "{d}/t.json", "--time"], release_ladders(hours=True), "pass --floor-from"),
    (["ladders", "{d}/t.json", "--time"], release_ladders(), "compute is in FLOPs; drop --time"),
    (["ladders", "{d}/t.json"], dict(release_ladders(), k1_glr=release_ladders()["van"], k1=release_ladders()["van"]),
     "are both operator_1"),
    (["ladders", "{d}/t.json", "--shared-anchor", "8"], release_ladders(), "different compute"),
])
def test_bad_release_inputs(tmp_path, argv, obj, message):
    assert_refused("fit.py", argv, tmp_path, message, files={"t.json": json.dumps(obj)}, runner=run_in_process)


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    """`fit.py paper` once on the release copy with a downstream.json fixture beside it (the copy lacks it), every
    figure linted (tests/figlint.py) -> (out folder, manifest, lint problems)."""
    tmp = tmp_path_factory.mktemp("paper")
    release = tmp / "release"
    shutil.copytree(RELEASE, release)
    write(release / paper.LADDERS / "downstream.json", downstream_fixture(dip=0.075))
    loop_grid_fixture(release / "loop_grid.csv")
    write(release / "fineweb_edu_ladders.json", fineweb_edu_fixture())
    with pytest.MonkeyPatch.context() as mp:
        problems = figlint.capture(mp, paper, pdf=False)
        assert fit.main(["paper", str(release), "--out", str(tmp / "out")]) == 0
    return tmp / "out", json.load(open(tmp / "out" / paper.MANIFEST)), problems


def test_paper_on_the_release(paper_run):
    """Every figure written and passing the figure lint (arm colours and markers from the arms table, display names),
    every figure of the paper either written or listed as skipped with its reason, every stated number within 1 % or
    explained, and the gallery: per figure its statement, image (or why not) and numbers."""
    out, manifest, problems = paper_run
    assert {"fig02", "fig04", "fig05", "fig06", "fig15a", "fig16e", "fig17", "fig18a", "fig19a", "fig19b", "fig19c", "fig20",
            "fig21", "fig23", "fig24"} <= set(problems)
    assert problems == {k: [] for k in problems}
    written = set(os.listdir(out))
    for fig_id in paper.CLAIMS:  # a figure exported as panels (fig10a-d) counts as drawn
        assert any(w.startswith(fig_id) for w in written) != (fig_id in manifest["skipped"]), fig_id
    assert "downstream" not in manifest["skipped"].get("fig19a", "")  # the fixture is read: drawn
    for span, per_arm in manifest["figures"]["fig19c"]["numbers"]["mean_residuals"].items():  # Vanilla's own line: 0
        assert np.allclose(per_arm["vanilla"], 0, atol=1e-12) and per_arm["loop_2"] == pytest.approx(
            [0.01 * (i % 3) for i in range(len(TASKS))], abs=1e-9), span  # Loop-2's designed offset per task
    page = open(out / paper.GALLERY).read()
    for fig_id in paper.CLAIMS:
        assert f"## {fig_id}" in page and paper.CLAIMS[fig_id]["section"] in page
        assert (f"![{fig_id}" in page) != (fig_id in manifest["skipped"])
    assert "| Untied-2 multiplier over Vanilla near 1e20 FLOPs | 1.344 | 1.34 | 0.3 % | App. B.1 |" in page
    rows = [r for fig_id, entry in manifest["figures"].items() for r in entry["stated"] if fig_id != "fig04"]
    assert len(rows) >= 20  # Figure 4's rows compare the fixture's numbers with the paper's: not explained
    assert all(r["rel_diff"] <= paper.TOLERANCE or r["explanation"] != "unexplained" for r in rows)
    e = {r["what"]: r for r in rows}
    assert e["shared floor E (Vanilla FLOP ladder)"]["ours"] == pytest.approx(1.7064, abs=1e-4)
    assert e["Operator-1 loss cost of Vanilla's recipe at d8"]["ours"] == pytest.approx(1.01e-2, abs=1e-4)
    assert "1.17–1.19×" in next(w for w in e if w.startswith("smallest of the three operator ablations"))


def test_fig18b_compares_the_corpora_with_cross_corpus_calibration(paper_run):
    """Figure 18b (App. C.1): Untied-Grow per corpus, its own loss and CORE NLL floors; the sigmoids and r fitted on
    both corpora's 14 records; FineWeb needs 1.52/1.60/1.62/1.51x FineWeb-Edu's compute at the GPT-3 scores."""
    got = paper_run[1]["figures"]["fig18b"]["numbers"]
    laws = [got["fits"][k][c][p] for k in ("val_loss", "core_nll") for c in ("fineweb", "fineweb_edu") for p in ("E", "gamma")]
    assert laws == pytest.approx([1.4736, 0.0977, 1.3451, 0.1056, 1.6430, 0.1992, 1.5035, 0.1827], abs=1e-4)  # E, γ
    assert got["ratio"] == pytest.approx(0.87104, abs=1e-5) and got["cmax"] == pytest.approx(8.91e21, rel=1e-3)
    assert list(got["crossing_ratio"].values()) == pytest.approx([1.52, 1.60, 1.62, 1.51], abs=0.005)


def series(manifest, fig_id, panel="panel"):
    return manifest["figures"][fig_id]["numbers"][panel]


def test_fig15c_floor_is_refitted_on_constant_recipe_vanilla(paper_run):
    """App. B.2: the constant recipes have their own floor (E = 2.2537 on constant.json's Vanilla), so Vanilla's
    law passes through its own points; the FLOP ladder's 1.7064 gave exponents 0.098-0.109 instead of 0.16-0.20."""
    fig = series(paper_run[1], "fig15c")
    assert fig["E"] == pytest.approx(2.2537, abs=2e-4)
    gammas = {k: round(v["gamma"], 4) for k, v in fig["series"].items()}
    assert gammas == dict(van=0.1644, k2=0.1895, dep=0.1804, k2_grow=0.1988, dep_grow=0.1901)  # no Operator-1
    assert fig["series"]["k2_grow"]["multipliers"][-1] == pytest.approx(2.156, abs=1e-3)


def test_fig16a_shares_the_d8_anchor_and_fits_through_it(paper_run):
    """Figure 16a: one d8 anchor (the mean of the two d8 runs) in every recipe, WDR1 (no d8 run) included, d6 dropped,
    exponents by regression through the anchor: muP OM (0.0977) above Constant (0.0974)."""
    fig = series(paper_run[1], "fig16a")["series"]
    gammas = {k: round(v["gamma"], 4) for k, v in fig.items()}
    assert gammas == dict(van_constant=0.0974, van=0.1106, van_glr_om=0.1115, van_glr_wd=0.1110, van_const_mup_om=0.0977,
                          van_mup_om=0.1085, van_wdr1=0.1106)
    wdr1 = fig["van_wdr1"]["multipliers"]
    assert len(wdr1) == 7 and wdr1[0] == 1.0 and wdr1[1:] == pytest.approx([0.999, 0.979, 0.987, 0.990, 1.006, 1.006],
                                                                            abs=1e-3)
    assert [m is None for m in fig["van_constant"]["multipliers"]] == [False] * 5 + [True] * 2


def test_fig16d_reference_keeps_loop_grows_d6_budget(paper_run):
    """Figure 16d: the reference is fixed Loop-Grow at all 7 of its points, d6 included."""
    fig = series(paper_run[1], "fig16d")["series"]
    assert len(fig["k2_grow"]["multipliers"]) == 7
    assert fig["van"]["multipliers"][:2] == pytest.approx([0.872, 0.828], abs=1e-3)
    assert fig["dep"]["multipliers"][0] is None and fig["dep_grow"]["multipliers"][-1] == pytest.approx(1.132, abs=1e-3)


def test_fig15a_columns_and_rows_are_the_releases():
    """Figure 15a: columns Untied-2, Loop-2, Operator-1; Deep Vanilla only in the Untied-2 column; multipliers on the
    top row, reducible loss below."""
    cols = paper.LADDER_FIGURES["fig15a"]
    assert [c["title"] for c in cols] == ["Untied-2", "Loop-2", "Operator-1"]
    assert ["deep_van" in c["groups"][0][1] for c in cols] == [True, False, False]
    fig = paper.ladder_figure(paper.pyplot(), cols, [paper.ladder_column(RELEASE, c) for c in cols])
    tops = sorted(fig.axes, key=lambda ax: -ax.get_position().y0)[:3]
    assert {ax.get_ylabel() for ax in tops} == {"Compute Multiplier"}
    paper.pyplot().close(fig)


def fineweb_edu_fixture():
    """The release's FineWeb-Edu layout with values of our own: Vanilla d6-d16 and Untied-Grow d6-d14 on E = 1.9 laws,
    two tasks whose NLL falls with compute and whose centered accuracy is a sigmoid of it, and the held-out d26
    Untied-Grow record exactly on its law."""
    tasks, d = ["arc_easy", "piqa"], {}
    laws = {"vanilla": (1.6, 0.11, range(6, 18, 2)), "untied_grow": (1.5, 0.12, range(6, 16, 2))}

    def record(arm, depth):
        A, gamma, _ = laws[arm]
        c = 1e18 * (depth / 8) ** 3
        loss = law(1.9, A, gamma, c)
        nll = {t: 0.5 * loss + 0.1 * i for i, t in enumerate(tasks)}
        acc = {t: float(1 / (1 + np.exp(4.0 * nll[t] - 5.0))) for t in tasks}
        return dict(depth=depth, compute_flops=c, val_loss=loss, core_nll=0.5 * loss, core_accuracy=0.9 * np.mean(
            list(acc.values())), task_nll=nll, task_accuracy=acc)
    d["arms"] = {arm: [record(arm, depth) for depth in depths] for arm, (_, _, depths) in laws.items()}
    return dict(tasks=tasks, d26=dict(record("untied_grow", 26), parameters=7_400_000_000, core_accuracy_std=0.0015), **d)


def test_fineweb_edu_layout_read_by_ladders_with_its_d26_held_out(tmp_path, capsys):
    path = write(tmp_path / "fineweb_edu_ladders.json", fineweb_edu_fixture())
    d26 = fineweb_edu_fixture()["d26"]
    got, err = fit_json(capsys, "ladders", path, "--holdout", "untied_grow:26", "--refit-floor")
    assert set(got["arms"]) == {"vanilla", "untied_grow"} and got["E"] == pytest.approx(1.9, abs=2e-3)
    assert 26 not in [p["depth"] for p in got["arms"]["untied_grow"]["points"]]  # never fitted
    [held] = got["held_out"]
    assert (held["arm"], held["depth"], held["compute"], held["loss"]) == ("untied_grow", 26, d26["compute_flops"],
                                                                          d26["val_loss"])
    assert abs(held["residual"]) < 5e-3  # on its law: the fits of d6-d16 forecast it
    alone, err = fit_json(capsys, "ladders", path, "--extrapolate", d26["compute_flops"], "--bootstrap", 0)
    assert alone["held_out"] == got["held_out"] and "held-out run" in err  # held out without being named
    assert alone["arms"]["untied_grow"]["gain_at_extrapolate"] > 1


def test_fineweb_edu_layout_read_by_downstream(tmp_path, capsys):
    path = write(tmp_path / "fineweb_edu_ladders.json", fineweb_edu_fixture())
    got, _ = fit_json(capsys, "downstream", path, "--targets", 0.3)
    assert got["tasks"] == ["arc_easy", "piqa"] and got["ratio"] == pytest.approx(0.9, abs=1e-6)
    assert set(got["arms"]) == {"vanilla", "untied_grow"}
    assert got["sigmoids"]["piqa"]["a"] == pytest.approx(4.0, abs=1e-3)


@pytest.mark.parametrize("argv, obj, message", [
    (["ladders", "{d}/t.json"], {"series": 1}, "not a JSON layout this command reads; it reads a train.py result.json"),
    (["downstream", "{d}/t.json"], downstream_fixture(), "not a JSON layout this command reads; it reads a CSV"),
    (["downstream", "{d}/t.json"], dict(fineweb_edu_fixture(), arms=dict(vanilla=[dict(
        fineweb_edu_fixture()["arms"]["vanilla"][0], task_accuracy={})])), "task_accuracy"),
    (["ladders", "{d}/t.json"], dict(fineweb_edu_fixture(), d26=dict(depth=26)), "t.json:d26: needs a whole depth"),
])
def test_json_a_command_cannot_use_is_one_line_naming_the_layouts(tmp_path, argv, obj, message):
    assert_refused("fit.py", argv, tmp_path, message, files={"t.json": json.dumps(obj)}, runner=run_in_process)


def test_paper_treats_a_repeated_depth_as_ladders_does(tmp_path, capsys):
    """A depth entry given twice in the release's ladders.json: a different result is refused (it moved the floor
    1.706 -> 1.42, reported only as "unexplained"), an exact repeat kept once with a warning, as in fit.py ladders."""
    release = tmp_path / "reference"
    shutil.copytree(os.path.join(REPO, "reference"), release)
    path = release / "release" / "appendix_ladders" / "ladders.json"
    ladders = json.load(open(path))
    series = next(name for name in ladders if paper.RELEASE_SERIES.get(name) == "vanilla")
    first = ladders[series][0]
    path.write_text(json.dumps(dict(ladders, **{series: ladders[series] + [dict(first, loss=first["loss"] + 0.05)]})))
    assert fit.main(["paper", str(release), "--out", str(tmp_path / "out")]) == 2
    assert "two different results for arm vanilla, depth" in capsys.readouterr().err
    rows = paper.release_ladder_rows("l.json", dict(ladders, **{series: ladders[series] + [first]}), False)
    once = paper.release_ladder_rows("l.json", ladders, False)
    data = laws.ladder_data(rows)
    assert "exactly; kept one" in capsys.readouterr().err
    assert all(np.array_equal(data["vanilla"][k], laws.ladder_data(once)["vanilla"][k]) for k in ("x", "loss"))


def loop_grid_fixture(path):
    """The release's loop_grid.csv layout (CRLF, compute in FLOPs) built from weight_decay.csv (the same grid in EFLOP),
    with K=1 runs at WD 1.0 and 1.4 made up (0.002 above the WD-1.2 run) as the layout has them."""
    rows = list(csv.DictReader(open(os.path.join(RELEASE, paper.REGIMES, "weight_decay.csv"))))
    made_up = [dict(r, weight_decay=w, loss=float(r["loss"]) + 0.002) for r in rows if r["loops"] == "1"
               and r["weight_decay"] == "1.2" for w in ("1.0", "1.4")]
    with open(path, "w", newline="") as f:
        f.write("depth,loops,weight_decay,compute_flops,val_loss\r\n")
        for r in sorted(rows + made_up, key=lambda r: (int(r["depth"]), int(r["loops"]), float(r["weight_decay"]))):
            f.write(f"{r['depth']},{r['loops']},{float(r['weight_decay']):g},{float(r['compute']) * 1e18:e},"
                    f"{float(r['loss']):.6f}\r\n")


def test_loop_grid_figures_and_optima_per_regime_and_control(paper_run, tmp_path, capsys):
    """Figures 2 (right) and 5 from loop_grid.csv (here the WD grid of weight_decay.csv in its layout): the 2.2x gain
    and K* rising from about 1.4 to 6.7 (Sec. 5); `fit.py loops` gives the same from the CSV and reads the regime
    tables: the optimal loop count per budget of each regime (Figure 21) and control (Figure 24)."""
    fig5 = paper_run[1]["figures"]["fig05"]["numbers"]
    assert fig5["gain"] == pytest.approx(2.21, abs=0.01)
    assert [round(c["best_loops"], 2) for c in fig5["cuts"]] == [1.43, 1.9, 2.31, 2.78, 3.31, 3.71, 4.44, 5.3, 6.69]
    loop_grid_fixture(tmp_path / "loop_grid.csv")
    got, _ = fit_json(capsys, "loops", tmp_path / "loop_grid.csv", "--out", tmp_path)
    assert got["gain_fixed_wd"] == pytest.approx(fig5["gain"], rel=1e-9) and (tmp_path / "fig05.png").exists()
    regimes = os.path.join(RELEASE, paper.REGIMES)
    got, _ = fit_json(capsys, "loops", os.path.join(regimes, "regimes.csv"))
    assert [round(o["best_loops"], 2) for o in got["optima"]["fresh"]] == [1.17, 1.42, 1.72, 1.70, 1.78, 1.91, 1.91,
                                                                           2.02, 2.13]
    got, _ = fit_json(capsys, "loops", os.path.join(regimes, "architectures.csv"))
    tied = got["optima"]["vanilla tied"]
    assert [o["interior"] for o in tied] == [False] + [True] * 4 and tied[0]["best_loops"] == 1.0
    assert round(tied[-1]["best_loops"], 2) == 4.93
    got, _ = fit_json(capsys, "loops", os.path.join(regimes, "hyperparameters.csv"))
    assert got["best_multiplier"]["u glr K=8"] == 0.5  # Untied GLR K=8: 3.1248, 3.1060, 3.1388, ... (App. D.3)


def test_figure4_sets_the_d26_forecast_beside_the_observed_run(paper_run):
    """Figure 4 from a FineWeb-Edu ladder file: the held-out d26 run's loss, CORE NLL and CORE beside their forecasts
    from the ladders (the fixture's d26 lies on its law: forecast = observed), next to the paper's 0.3865 and 0.384."""
    fig4 = paper_run[1]["figures"]["fig04"]
    d26 = fineweb_edu_fixture()["d26"]
    assert fig4["numbers"]["observed"]["core_accuracy"] == d26["core_accuracy"]
    assert fig4["numbers"]["forecast"]["loss"] == pytest.approx(d26["val_loss"], abs=1e-4)
    assert fig4["numbers"]["forecast"]["core_accuracy"] == pytest.approx(d26["core_accuracy"], abs=2e-3)
    assert fig4["numbers"]["ratio"] == pytest.approx(0.9, abs=1e-6)
    rows = {r["what"]: r for r in fig4["stated"]}
    assert rows["observed d26 CORE (7.4B Untied-Grow)"]["paper"] == 0.3865 and rows["forecast d26 CORE"]["paper"] == 0.384
    assert (paper_run[0] / "fig04.png").exists()


def test_fit_help_leaves_scipy_unloaded():
    """`fit.py --help` answers fast: paper.py imports scipy.optimize only where a fit uses it (issue 47)."""
    code = "import sys, fit; assert 'scipy.optimize' not in sys.modules, 'fit.py loads scipy.optimize at import'"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
