"""Bad input handed to fit.py (CSV, JSON, flags): one line, exit 2, no traceback, nothing that existed changed
(tests/refusals.py), and never a plausible-looking wrong number. The case table, then numeric flags out of range,
design specs, duplicated and conflicting rows, and inputs that were ignored, impossible or misnamed (mixed recipes or
pools, runs that are not a loop grid, a column named twice)."""
import contextlib
import importlib
import io
import json
import os

import pytest

from refusals import run_in_process, assert_refused


def ladder_csv(rows=(), header="arm,depth,compute_flops,val_loss", bom=False):
    """A small valid two-arm ladder, plus extra raw CSV rows."""
    lines = [header]
    for arm, A, g in (("vanilla", 1.6, 0.11), ("better", 1.55, 0.12)):
        for d in range(6, 22, 2):
            C = 1e18 * (d / 8) ** 4.5
            lines.append(f"{arm},{d},{C:.6e},{1.7 + A * (C / 1e18) ** -g:.6f}")
    return ("\ufeff" if bom else "") + "\n".join(lines + list(rows)) + "\n"


def with_row(i, row):
    """ladder_csv with data row i (0-based) replaced."""
    lines = ladder_csv().splitlines()
    lines[i + 1] = row
    return "\n".join(lines) + "\n"


def result_json(**kw):
    r = dict(status="complete", arch="vanilla", depth=8, estimated_training_flops=1e18, final_val_loss=3.0,
             plan=dict(seed=42))
    r.update(kw)
    return json.dumps(r)


GOOD = {"l.csv": ladder_csv()}
PLAN = "\n".join(json.dumps(dict(arch="vanilla", depth=d, total_flops=1e18 * d)) for d in (6, 8, 10, 12)) + "\n"
PILOT = json.dumps(dict(E=1.7, arms=dict(vanilla=dict(A=1.6, gamma=0.11))))

FIT_CASES = [
    ("missing-input", {}, ["ladders", "{d}/nope"], "cannot read"),
    ("missing-runs", {}, ["ladders", "--runs-dir", "{d}/nope"], "/nope is not a folder"),
    ("no-input", {}, ["ladders"], "no ladder points: pass CSV files or --runs-dir"),
    ("missing-csv", {}, ["ladders", "{d}/nope.csv", "x.csv"], "cannot read"),
    ("missing-column", {"l.csv": "arm,depth,val_loss\nvanilla,8,3.0\n"}, ["ladders", "{d}/l.csv"], "missing column(s) compute_flops"),
    ("non-numeric-loss", {"l.csv": with_row(2, "vanilla,10,3e18,abc")}, ["ladders", "{d}/l.csv"], "l.csv:4: column val_loss is 'abc'"),
    ("nan-loss-reference", {"l.csv": with_row(0, "vanilla,6,4e17,nan")}, ["ladders", "{d}/l.csv"], "l.csv:2: column val_loss is 'nan'; need a finite number > 0"),
    ("negative-loss", {"l.csv": with_row(1, "vanilla,8,1e18,-3.0")}, ["ladders", "{d}/l.csv"], "l.csv:3: column val_loss is '-3.0'"),
    ("fractional-depth", {"l.csv": with_row(1, "vanilla,8.5,1e18,3.0")}, ["ladders", "{d}/l.csv"], "l.csv:3: depth and seed must be whole numbers"),
    ("conflicting-duplicate", {"l.csv": ladder_csv(["vanilla,8,1.000000e+18,3.1"])}, ["ladders", "{d}/l.csv"], "two different results for arm vanilla, depth 8;"),
    ("replicates-different-compute", {"l.csv": "arm,depth,compute_flops,val_loss,seed\nvanilla,8,1e18,3.0,0\nvanilla,8,2e18,3.1,1\n"},
     ["ladders", "{d}/l.csv"], "replicates of vanilla d8 have different compute"),
    ("extrapolate-zero", GOOD, ["ladders", "{d}/l.csv", "--extrapolate", "0"], "--extrapolate: must be a finite number in (0, inf)"),
    ("holdout-format", GOOD, ["ladders", "{d}/l.csv", "--holdout", "vanilla-8"], "use ARM:DEPTH"),
    ("holdout-twice", GOOD, ["ladders", "{d}/l.csv", "--holdout", "vanilla:6", "vanilla:6"], "names vanilla:6 twice"),
    ("holdout-missing-point", GOOD, ["ladders", "{d}/l.csv", "--holdout", "vanilla:26"], "no vanilla d26 point"),
    ("reference-arm-missing", GOOD, ["ladders", "{d}/l.csv", "--reference-arm", "nope"], "--reference-arm nope is not an arm of the inputs"),
    ("out-is-a-file", dict(GOOD, out="x"), ["ladders", "{d}/l.csv", "--out", "{d}/out"], "is a file, not a folder"),
    ("wrong-kind-json", {"edu.json": json.dumps(dict(tasks=[], arms={}))}, ["ladders", "{d}/edu.json"], "'arms' holds no ladder records"),
    ("not-utf8-csv", {"l.csv": b"arm,depth\n\xff\xfe\x00bad\n"}, ["ladders", "{d}/l.csv"], "not a UTF-8 CSV"),
    ("unknown-subcommand", {}, ["frobnicate"], "invalid choice"),
    ("runs-without-runs", {}, ["runs", "--runs-dir", "{d}"], "no train.py runs in"),
    ("time-without-column", GOOD, ["ladders", "{d}/l.csv", "--time"], "missing column(s) training_seconds"),
    ("reference-arm-too-few", {"l.csv": "arm,depth,compute_flops,val_loss\nvanilla,8,1e18,3.0\nvanilla,10,2e18,2.9\n"},
     ["ladders", "{d}/l.csv"], "reference arm vanilla: fewer than 3 points"),
    ("surface-negative-N", {"s.csv": "N,D,loss\n" + "".join(f"{-1 if i == 0 else 1e8 * (i + 1)},{1e9 * (i + 1)},3.0\n" for i in range(8))},
     ["surface", "{d}/s.csv"], "s.csv:2: column N is '-1'"),
    ("surface-delta-zero", {"s.csv": "N,D,loss\n1,1,1\n"}, ["surface", "{d}/s.csv", "--delta", "0"], "--delta: must be"),
    ("tpp-nan", {"t.csv": "compute_flops,tpp,val_loss\n1e18,5,nan\n"}, ["tpp", "{d}/t.csv"], "t.csv:2: column val_loss is 'nan'"),
    ("loops-negative-budget", {"g.csv": "depth,loops,weight_decay,compute_flops,val_loss\n4,1,0.8,1e17,3\n"},
     ["loops", "{d}/g.csv", "--budgets=-1"], "--budgets: must be"),
    ("design-no-noise", {"p.jsonl": PLAN, "pilot.json": PILOT}, ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json"], "the following arguments are required: --noise"),
    ("design-no-truth", {"p.jsonl": PLAN}, ["design", "{d}/p.jsonl", "--noise", "0.002"], "required: --truth"),
    ("design-bad-truth", {"p.jsonl": PLAN, "pilot.json": "{}"}, ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002"],
     "is not a `fit.py ladders --json` output"),
    ("design-bad-plan-line", {"p.jsonl": PLAN + "not json\n", "pilot.json": PILOT},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002"], "p.jsonl:5: not a train.py --dry-run plan"),
    ("design-bad-spec", {"p.jsonl": PLAN, "pilot.json": PILOT},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002", "--design", "six to 18"], "use 'd6-18'"),
    ("design-depth-not-planned", {"p.jsonl": PLAN, "pilot.json": PILOT},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002", "--design", "d6-22"], "asks for a depth no planned run has (22)"),
    ("design-arm-without-law", {"p.jsonl": PLAN.replace('"vanilla", "depth": 12', '"other", "depth": 12'), "pilot.json": PILOT},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002"], "planned arm 'other' has no law"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in FIT_CASES], ids=[c[0] for c in FIT_CASES])
def test_fit_bad_input(tmp_path, files, argv, message):
    assert_refused("fit.py", argv, tmp_path, message, files, runner=run_in_process)


def test_fit_bad_input_as_a_process(tmp_path):
    # the same contract through the interpreter: the one-line message really is all a user sees
    assert_refused("fit.py", ["ladders", "{d}/l.csv", "--extrapolate=-1"], tmp_path, "--extrapolate: must be", GOOD)


# --- numeric flags out of range, design specs, duplicated and conflicting rows ---
def surface_csv(rows=()):
    """A 4 x 4 (N, D) grid on a Chinchilla law, plus extra raw CSV rows."""
    grid = [f"{N:g},{D:g},{1.5 + 1000 / N ** 0.4 + 2000 / D ** 0.3:.6f}"
            for N in (1e8, 2e8, 4e8, 8e8) for D in (1e9, 2e9, 4e9, 8e9)]
    return "\n".join(["N,D,loss", *grid, *rows]) + "\n"


TWO_ARM_PLAN = PLAN + "".join(json.dumps(dict(arch="other", depth=d, total_flops=1e18 * d)) + "\n" for d in (6, 8, 10, 12))
FLAG_FILES = dict(GOOD, **{"s.csv": surface_csv(), "p.jsonl": PLAN, "p2.jsonl": TWO_ARM_PLAN, "pilot.json": PILOT})
SURFACE = ["surface", "{d}/s.csv"]
LADDERS = ["ladders", "{d}/l.csv"]
DESIGN = ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002"]
FIT_FLAG_RANGE_CASES = [
    ("surface-seed-negative", [*SURFACE, "--seed=-1"], "--seed: must be a whole number in [0, 4294967295], got '-1'"),
    ("ladders-anchor-depth-zero", [*LADDERS, "--anchor-depth", "0"], "--anchor-depth: must be a whole number in [1, 999]"),
    ("ladders-noise-above-one", [*LADDERS, "--noise", "1.5"], "--noise: must be a finite number in (0, 1), got '1.5'"),
    ("design-mfu-zero", [*DESIGN, "--mfu", "0"], "--mfu: must be a finite number in (0, 1], got '0'"),
    ("design-delta-gamma-makes-gamma-negative", ["design", "{d}/p2.jsonl", "--truth", "{d}/pilot.json", "--noise",
                                                 "0.002", "--delta-gamma=-0.5"], "gives other a true gamma of -0.39"),
    ("design-truth-gamma-nan", ["design", "{d}/p.jsonl", "--truth", "{d}/nan.json", "--noise", "0.002"],
     "all > 0)"),
    ("downstream-target-above-one", ["downstream", "{d}/l.csv", "--targets", "1.5"],
     "--targets: must be a finite number in (0, 1), got '1.5'"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in FIT_FLAG_RANGE_CASES], ids=[c[0] for c in FIT_FLAG_RANGE_CASES])
def test_class2_fit_numeric_flag_out_of_range(tmp_path, argv, message):
    files = dict(FLAG_FILES, **{"nan.json": PILOT.replace("0.11", "NaN")})
    assert_refused("fit.py", argv, tmp_path, message.replace("{d}", str(tmp_path)), files, runner=run_in_process)


FIT_DESIGN_SPEC_CASES = [
    ("top-zero", ["--design", "x3@top0"], "'x3@top0' needs topK with K >= 1"),
    ("depth-not-in-plan", ["--design", "x3@99"], "'x3@99' asks for a depth no planned run has (99)"),
    ("zero-seeds", ["--design", "x0"], "'x0' asks for seeds outside 1 to 100"),
    ("unknown-token", ["--design", "d6-12 y3"], "'d6-12 y3': use 'd6-18'"),
    ("two-ranges", ["--design", "d6-10 d8-12"], "'d6-10 d8-12': use 'd6-18'"),
    ("range-backwards", ["--design", "d12-6"], "'d12-6' has its depth range backwards"),
    ("seeds-outside-range", ["--design", "d6-8 x3@12"], "'d6-8 x3@12' puts seeds outside its depths"),
    ("delta-gamma-nan", ["--delta-gamma", "nan"], "--delta-gamma: must be a finite number in (-1, 1), got 'nan'"),
]


@pytest.mark.parametrize("extra, message", [c[1:] for c in FIT_DESIGN_SPEC_CASES], ids=[c[0] for c in FIT_DESIGN_SPEC_CASES])
def test_class3_fit_design_spec_refused(tmp_path, extra, message):
    assert_refused("fit.py", [*DESIGN, *extra], tmp_path, message, {"p.jsonl": PLAN, "pilot.json": PILOT},
                   runner=run_in_process)


@pytest.mark.parametrize("line, message", [
    ('{"arch": "vanilla", "depth": 0, "total_flops": 1e18}', "p.jsonl:5: not a train.py --dry-run plan"),
    ('{"arch": "vanilla", "depth": "14", "total_flops": 1e18}', "p.jsonl:5: not a train.py --dry-run plan"),
    ('{"arch": 7, "depth": 14, "total_flops": 1e18}', "p.jsonl:5: not a train.py --dry-run plan"),
    ('{"arch": "vanilla", "depth": 14, "total_flops": -1}', "p.jsonl:5: not a train.py --dry-run plan"),
], ids=["depth-zero", "depth-string", "arch-number", "negative-flops"])
def test_class3_fit_design_plan_lines_refused(tmp_path, line, message):
    assert_refused("fit.py", DESIGN, tmp_path, message, {"p.jsonl": PLAN + line + "\n", "pilot.json": PILOT},
                   runner=run_in_process)


def loop_grid_csv(rows=(), best_wd=lambda depth: 0.8):
    """A small loop grid (depths 4..10, loops 1/2/4, WD 0.4/0.8/1.6) whose loss is lowest at best_wd(depth)."""
    import math
    lines = ["depth,loops,weight_decay,compute_flops,val_loss"]
    for d in (4, 6, 8, 10):
        for K in (1, 2, 4):
            for wd in (0.4, 0.8, 1.6):
                C = d ** 2 * K * 1e16
                loss = 3.0 - 0.1 * math.log(d ** 2 * K) + 0.01 * (K - 2) ** 2 + 0.01 * math.log2(wd / best_wd(d)) ** 2
                lines.append(f"{d},{K},{wd},{C:g},{loss:.6f}")
    return "\n".join(lines + list(rows)) + "\n"


def sweep_csv(header, rows):
    return "\n".join([header] + [",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r) for r in rows]) + "\n"


TPP_ROWS = [(C, t, 1.1 + 0.05 * (t - o) ** 2 / o ** 2) for C, o in ((1e18, 5.0), (3e18, 5.5), (1e19, 6.0)) for t in (2.0, 3.5, 5.0, 8.0)]
GROWTH_ROWS = [(d, 1e18 * d, r, 3.0 + 0.1 * (r - 0.5) ** 2) for d in (8, 9) for r in (0.2, 0.4, 0.6, 0.8)]
LR_ROWS = [(n, v, 1.2 + 0.02 * (v / (0.04 * (n / 1e8) ** -0.7) - 1) ** 2) for n in (1e8, 2e8, 4e8) for v in (0.01, 0.02, 0.04, 0.08)]
DOWN_ROWS = [(arm, C, 0.3 * s, 3.0 * s * (C / 1e18) ** -0.1 + 1.0, 0.5 - 0.1 * s * (C / 1e18) ** -0.1)
             for arm, s in (("vanilla", 1.0), ("better", 0.9)) for C in (1e17, 1e18, 1e19, 1e20)]
# reader -> (file, its text, argv, the line repeated, that line with a different result)
FIT_READERS = {
    "loops": ("g.csv", loop_grid_csv(), ["loops", "{d}/g.csv", "--budgets", "8e17"], "6,2,0.8,7.2e+17,2.5",
              "6,2,0.8,7.2e+17,2.6"),
    "surface": ("s.csv", surface_csv(), ["surface", "{d}/s.csv", "--form", "chinchilla", "--hops", "0"],
                None, None),
    "tpp": ("t.csv", sweep_csv("compute_flops,tpp,val_loss", TPP_ROWS), ["tpp", "{d}/t.csv"], None, None),
    "growth": ("g.csv", sweep_csv("depth,compute_flops,rho,val_loss", GROWTH_ROWS), ["growth", "{d}/g.csv"], None, None),
    "lr": ("r.csv", sweep_csv("params,value,val_loss", LR_ROWS), ["lr", "{d}/r.csv"], None, None),
    "downstream": ("c.csv", sweep_csv("arm,compute_flops,core,nll:t,acc:t", DOWN_ROWS),
                   ["downstream", "{d}/c.csv", "--targets", "0.2"], None, None),
}


def repeated(reader, conflicting):
    """The reader's file with one of its rows given twice: identically, or with a different last value."""
    name, text, argv, _, _ = FIT_READERS[reader]
    lines = text.splitlines()
    row = lines[3]
    if conflicting:
        *rest, last = row.split(",")
        row = ",".join(rest + [f"{float(last) * 1.01:.6g}"])
    return name, "\n".join(lines + [row]) + "\n", lines[3], argv


@pytest.mark.parametrize("reader", FIT_READERS)
def test_class4_fit_conflicting_rows_are_an_error_naming_both(tmp_path, reader):
    name, text, _, argv = repeated(reader, conflicting=True)
    n = len(text.splitlines())
    line = assert_refused("fit.py", argv, tmp_path, f"{tmp_path}/{name}:{n} and {tmp_path}/{name}:4: two different "
                          "results for", {name: text}, runner=run_in_process)
    assert line.endswith("; remove one")


@pytest.mark.parametrize("reader", FIT_READERS)
def test_class4_fit_identical_rows_warn_and_count_once(tmp_path, reader):
    name, text, _, argv = repeated(reader, conflicting=False)
    once = tmp_path / "once"
    once.mkdir()
    (once / name).write_text(FIT_READERS[reader][1])
    (tmp_path / name).write_text(text)
    outputs = []
    for d in (once, tmp_path):
        code, (err, out) = run_in_process_with_stdout("fit.py", [a.replace("{d}", str(d)) for a in argv] + ["--json"])
        assert code == 0, err
        outputs.append((json.loads(out), err))
    (first, err_once), (second, err_twice) = outputs
    assert first == second and "repeats" not in err_once
    assert f"{tmp_path}/{name}:{len(text.splitlines())} repeats {tmp_path}/{name}:4" in err_twice
    assert "exactly; kept one" in err_twice


def run_in_process_with_stdout(script, argv):
    module = importlib.import_module(script[:-3])
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = module.main(argv)
    return code, (err.getvalue(), out.getvalue())


def test_loops_out_that_is_a_file_is_one_line(tmp_path):
    assert_refused("fit.py", ["loops", "{d}/g.csv", "--budgets", "8e17", "--out", "{d}/out"], tmp_path,
                   "is a file, not a folder", {"g.csv": loop_grid_csv(), "out": "x"}, runner=run_in_process)


def test_class4_fit_loops_runs_repeated_and_wd_edge_flagged(tmp_path, capsys):
    import fit
    grid = loop_grid_csv(best_wd=lambda d: 1.6 if d == 10 else 0.8)  # d10's tuned optimum sits at the grid's end
    (tmp_path / "g.csv").write_text(grid)
    assert fit.main(["loops", str(tmp_path / "g.csv"), "--budgets", "8e17", "--json"]) == 0
    out, err = capsys.readouterr()
    tuned = {t["depth"]: t for t in json.loads(out)["operator_1_tuned"]}
    assert tuned[10]["wd_at_grid_edge"] and tuned[10]["weight_decay"] == 1.6
    assert not any(tuned[d]["wd_at_grid_edge"] for d in (4, 6, 8))
    assert "edge of the swept grid at d10 (WD 1.6 of 0.4..1.6)" in err and "d8 (" not in err
    # the same grid as train.py runs: two result.json files for one grid point with different losses are refused
    for i, row in enumerate(grid.splitlines()[1:] + ["6,2,0.8,7.2e+17,2.6"]):
        d, K, wd, C, loss = (float(v) for v in row.split(","))
        os.makedirs(tmp_path / "runs" / str(i))
        with open(tmp_path / "runs" / str(i) / "result.json", "w") as f:
            json.dump(dict(status="complete", estimated_matrix_flops=C, final_val_loss=loss,
                           plan=dict(depth=int(d), passes_final=K, weight_decay=wd, data_constrained="fixed-wd")), f)
    assert fit.main(["loops", "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "two different results for depth 6, loops 2, weight_decay 0.8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fit.main(["loops", "-h"])
    assert "default 0.8" in capsys.readouterr().out


def ladder_runs(root, arm="vanilla", depths=range(6, 14, 2), **plan):
    """Complete train.py runs of one arm under ROOT (one folder per depth) on an exact law; plan: plan fields to
    change."""
    for d in depths:
        C = 1e18 * (d / 8) ** 4.5
        os.makedirs(os.path.join(root, f"{arm}_d{d}"))
        with open(os.path.join(root, f"{arm}_d{d}", "result.json"), "w") as f:
            f.write(result_json(arch=arm, depth=d, estimated_training_flops=C, estimated_matrix_flops=0.9 * C,
                                final_val_loss=1.7 + 1.6 * (C / 1e18) ** -0.11,
                                plan=dict(dict(seed=42, depth=d, passes_final=1, weight_decay=0.07,
                                               data_constrained=None), **plan)))


def loop_runs(root, **plan):
    """loop_grid_csv's grid as complete data-constrained train.py runs under ROOT; plan: plan fields to change."""
    for i, row in enumerate(loop_grid_csv().splitlines()[1:]):
        d, K, wd, C, loss = (float(v) for v in row.split(","))
        os.makedirs(os.path.join(root, str(i)))
        with open(os.path.join(root, str(i), "result.json"), "w") as f:
            f.write(result_json(arch="operator_1", depth=int(d), estimated_matrix_flops=C, final_val_loss=loss,
                                plan=dict(dict(depth=int(d), passes_final=K, weight_decay=wd, data_constrained="fixed-wd"),
                                          **plan)))


def with_column(text, name, value):
    """TEXT (a CSV) with one more column NAME holding VALUE in every row."""
    header, *rows = text.splitlines()
    return "\n".join([f"{header},{name}"] + [f"{r},{value}" for r in rows]) + "\n"


@pytest.mark.parametrize("name, text, argv, column", [
    ("l.csv", with_column(ladder_csv(), "val_loss", 9.9), ["ladders", "{d}/l.csv"], "val_loss"),
    ("s.csv", with_column(surface_csv(), "D", 1), ["surface", "{d}/s.csv"], "D"),
    ("g.csv", with_column(loop_grid_csv(), "loops", 1), ["loops", "{d}/g.csv"], "loops"),
], ids=["ladders", "surface", "loops"])
def test_fit_csv_column_named_twice_is_refused(tmp_path, name, text, argv, column):
    # csv.DictReader keeps the last of two columns with one name: the fit silently used the other numbers
    assert_refused("fit.py", argv, tmp_path, f"{name}: column {column} appears twice in the header; keep one",
                   {name: text}, runner=run_in_process)


def test_fit_loops_refuses_runs_that_are_not_a_loop_grid(tmp_path):
    # a vanilla ladder read as a loop grid printed "loop scaling needs 9.58x less compute" with exit 0
    ladder_runs(tmp_path / "runs")
    assert_refused("fit.py", ["loops", "--runs-dir", "{d}/runs"], tmp_path, "is not a loop-grid run (its plan's data_constrained is "
                   "None)", runner=run_in_process)


@pytest.mark.parametrize("grid", ["csv", "runs"])
def test_fit_loops_refuses_a_grid_where_no_budget_can_be_fitted(tmp_path, grid):
    # only K = 1 (or budgets outside the grid): every budget was skipped, yet the gains were printed with exit 0
    if grid == "csv":
        k1 = [r for r in loop_grid_csv().splitlines() if r.split(",")[1] in ("loops", "1")]
        (tmp_path / "g.csv").write_text("\n".join(k1) + "\n")
        argv = ["loops", "{d}/g.csv"]
    else:
        loop_runs(tmp_path / "runs")
        argv = ["loops", "--runs-dir", "{d}/runs", "--budgets", "1e30"]
    assert_refused("fit.py", argv, tmp_path, "no budget could be fitted at weight decay 0.8", runner=run_in_process)


POOL = dict(corpus="fineweb", tokenizer="gpt2", budgets=dict(train=10 ** 9, val=10 ** 7), created="2025-01-01T00:00:00",
            splits=dict(train=dict(token_count=10 ** 9, sha256="a" * 64), val=dict(token_count=10 ** 7, sha256="b" * 64)))


def planned_runs(root, runs, pool=POOL):
    """Complete runs under ROOT with train.py's real plans: runs = {name: train.py arguments}, the loss on a law."""
    import train
    for name, argv in runs.items():
        plan = train.make_plan(train.parse_args(argv)).as_dict()
        C = plan["total_flops"]
        os.makedirs(os.path.join(root, name))
        with open(os.path.join(root, name, "result.json"), "w") as f:
            f.write(result_json(arch=plan["arch"], depth=plan["depth"], plan=plan, data_manifest=pool,
                                estimated_training_flops=C, estimated_matrix_flops=0.9 * C,
                                final_val_loss=1.7 + 1.6 * (C / 1e18) ** -0.11 + 0.01 * plan["passes_final"]))


LADDER_RUNS = {f"vanilla_d{d}": ["--arch", "vanilla", "--depth", str(d), "--preset", "cpu"] for d in (1, 2, 3, 4)}
OTHER_POOL = dict(POOL, splits=dict(POOL["splits"], train=dict(token_count=10 ** 9, sha256="c" * 64)))


@pytest.mark.parametrize("extra, pool, field", [
    ([], OTHER_POOL, "data_manifest.splits.train.sha256"),
    (["--lr-multiplier", "30"], POOL, "matrix_lr x params_tpp^lr_exponent"),
    (["--tpp", "10"], POOL, "tpp"),
    (["--warmup-steps", "0"], POOL, "warmup_steps"),
], ids=["other-pool", "lr-multiplier", "tpp", "warmup"])
def test_fit_ladders_refuses_runs_of_one_arm_with_different_recipes_or_pools(tmp_path, extra, pool, field):
    # such a run was fitted into the arm's ladder as if it were one more depth
    planned_runs(tmp_path / "runs", LADDER_RUNS)
    planned_runs(tmp_path / "more", {"vanilla_d5": LADDER_RUNS["vanilla_d1"][:3] + ["5", "--preset", "cpu", *extra]},
                 pool)
    line = assert_refused("fit.py", ["ladders", "--runs-dir", "{d}/runs", "{d}/more"], tmp_path,
                          f"{tmp_path}/more/vanilla_d5: vanilla runs with different {field} (",
                          runner=run_in_process)
    assert line.startswith(f"fit.py: error: {tmp_path}/runs/vanilla_d1 and ") and "pass only the runs of one" in line


def test_fit_ladders_compares_the_recipe_not_what_a_depth_derives(tmp_path, capsys, monkeypatch):
    # an arm whose model describe() gains a field that grows with depth (a user's own per-pass tensors) fits its
    # ladder: only the arms table's and the preset's fields, the pool and the depth-free LRs must agree
    import fit
    import model
    describe = model.describe
    monkeypatch.setattr(model, "describe", lambda cfg: dict(describe(cfg), params_mix=cfg.depth * cfg.width ** 2))
    planned_runs(tmp_path / "runs", dict(LADDER_RUNS, vanilla_d5=LADDER_RUNS["vanilla_d1"][:3] + ["5", "--preset", "cpu"]))
    assert json.load(open(tmp_path / "runs" / "vanilla_d5" / "result.json"))["plan"]["params_mix"] > 0
    assert fit.main(["ladders", "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["arms"]["vanilla"]["dof"] == 3


def test_fit_loops_refuses_grid_runs_with_different_recipes(tmp_path):
    grid = {f"dc_{wd}_d{d}_k{k}": ["--arch", "operator_1", "--depth", str(d), "--passes", str(k), "--data-constrained",
                                   wd, "--preset", "cpu"] for wd in ("fixed-wd", "tuned-wd") for d in (2, 3) for k in (1, 2)}
    grid["dc_fixed-wd_d4_k1"] = grid["dc_fixed-wd_d2_k1"][:3] + ["4"] + grid["dc_fixed-wd_d2_k1"][4:] + [
        "--train-token-limit", "2000000"]
    planned_runs(tmp_path / "runs", grid)
    assert_refused("fit.py", ["loops", "--runs-dir", "{d}/runs"], tmp_path, "loop-grid runs with different train_token_limit",
                   runner=run_in_process)


GROWTH = "depth,compute_flops,rho,val_loss\n" + "".join(f"{d},{1e18 * d:g},{r},{3.0 + 0.1 * (r - 0.5) ** 2:.6f}\n"
                                                        for d in (8, 9) for r in (0.2, 0.4, 0.6, 0.8))
DOWNSTREAM = sweep_csv("arm,compute_flops,core,nll:t,acc:t", DOWN_ROWS)


IGNORED_CASES = [
    ("growth-rho-negative", {"g.csv": GROWTH.replace(",0.2,", ",-0.5,")}, ["growth", "{d}/g.csv"],
     "g.csv:2: column rho is '-0.5'; need a number in [0, 1]"),
    ("downstream-reference-arm-missing", {"c.csv": DOWNSTREAM}, ["downstream", "{d}/c.csv", "--reference-arm", "nosuch"],
     "--reference-arm nosuch is not an arm of the inputs (arms: vanilla, better)"),
    ("downstream-nll-without-acc", {"c.csv": with_column(DOWNSTREAM, "nll:b", 2.0)}, ["downstream", "{d}/c.csv"],
     "c.csv: column nll:b has no acc:b"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in IGNORED_CASES], ids=[c[0] for c in IGNORED_CASES])
def test_fit_ignored_or_impossible_inputs_are_refused(tmp_path, files, argv, message):
    assert_refused("fit.py", argv, tmp_path, message.replace("{d}", str(tmp_path)), files, runner=run_in_process)


def test_design_says_how_many_simulations_its_numbers_rest_on(tmp_path, capsys):
    # --noise 0.5: coverage 1.000 over the 7 of 20 simulated ladders whose fit converged, with no word of the 13
    import fit
    (tmp_path / "p.jsonl").write_text(PLAN)
    (tmp_path / "pilot.json").write_text(PILOT)
    argv = ["design", f"{tmp_path}/p.jsonl", "--truth", f"{tmp_path}/pilot.json", "--sims", "20", "--seed", "0"]
    assert fit.main([*argv, "--noise", "0.5"]) == 0
    out, err = capsys.readouterr()
    converged = int(next(line for line in out.splitlines() if line.startswith("| vanilla ")).split()[3][:-3])
    assert converged < 16 and f"WARNING: vanilla: only {converged} of 20 simulated fits converged (< 80%" in out
    assert "warning: design 'plan': vanilla: only" in err
    assert fit.main([*argv, "--noise", "0.002", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["designs"][0]["arms"]["vanilla"]["valid"] == 20 and "warning" not in err
