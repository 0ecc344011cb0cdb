"""Tests for watch.py: the runs table (fit.py runs) over complete, running, stopped and failed runs, the training
curves (fit.py curves), and the optional wandb tracker (offline) with its one-line refusal when wandb is missing."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import fit
import laws
import train
from test_train import read_run, tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    """Complete, running (a process holds train.lock), stopped, failed with its error, failed because the process
    died (result.json says running, nobody holds the lock), and a run written before the documented fields."""
    runs = tmp_path / "runs"
    shutil.copytree(ladder, runs)
    for name in ("running_d3", "died_d3", "nan_d3"):
        shutil.copytree(runs / "vanilla_d3", runs / name)
    edit_result(runs / "running_d3", status="running")
    edit_result(runs / "died_d3", status="running")
    edit_result(runs / "nan_d3", status="failed", error="non-finite loss at step 3")
    shutil.copytree(runs / "vanilla_d2", runs / "old_d2")
    with open(runs / "old_d2" / "trajectory.jsonl", "w") as f:  # the fields of runs written before this change
        for r in read_run(runs, "vanilla_d2")[1]:
            f.write(json.dumps({k: r[k] for k in ("step", "loss", "lr_multiplier", "passes", "tokens_per_second",
                                                  "epoch")}) + "\n")
    holder = hold_lock(runs / "running_d3" / "train.lock")
    try:
        rows = {r["run"]: r for r in json.loads(table(["runs", "--runs-dir", str(runs), "--json"], capsys))["runs"]}
        text = table(["runs", "--runs-dir", str(runs)], capsys)
    finally:
        holder.kill()
        holder.wait()
    assert {name: r["state"] for name, r in rows.items()} == dict(
        vanilla_d2="complete", untied_grow_d2="complete", old_d2="complete", vanilla_d3="stopped",
        running_d3="running", died_d3="failed", nan_d3="failed")
    assert "died" in rows["died_d3"]["reason"] and rows["nan_d3"]["reason"] == "non-finite loss at step 3"
    assert (rows["vanilla_d3"]["step"], rows["vanilla_d3"]["steps"]) == (3, 8)
    for name in ("vanilla_d2", "untied_grow_d2", "old_d2"):
        r = rows[name]
        assert (r["step"], r["steps"], r["eta_seconds"]) == (8, 8, None) and r["flops"] == r["flops_planned"] > 0
        assert r["val_loss"] == json.load(open(runs / name / "result.json"))["final_val_loss"] and r["wall_seconds"] > 0
    assert rows["vanilla_d3"]["flops"] < rows["vanilla_d3"]["flops_planned"]
    assert rows["running_d3"]["eta_seconds"] is not None and rows["vanilla_d3"]["eta_seconds"] is None
    lines = text.strip().splitlines()
    assert len(lines) == 1 + len(rows) and lines[0].split()[:3] == ["run", "state", "step"]
    assert any(line.startswith("running_d3") and " running " in line and " 3/8 " in line for line in lines)
    # every column of a row at one step: the stopped run at its step 3 shows the latest validation at or before it,
    # here the start's, labelled so (it read as divergence: 5.5 beside step 3); a complete run its last validation
    assert (rows["vanilla_d3"]["val_step"], rows["vanilla_d2"]["val_step"]) == (0, 8)
    assert any(line.startswith("vanilla_d3 ") and " 3/8 " in line and " @0 (start) " in line for line in lines)


def test_runs_refuses_a_folder_without_runs(tmp_path, capsys):
    assert fit.main(["runs", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no train.py runs" in err[0]


def test_curves_mark_growth_and_warmdown_and_overlay_the_frontier(ladder, tmp_path, capsys):
    out = tmp_path / "curves"
    assert fit.main(["curves", "--runs-dir", str(ladder), "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["curves_cpu_steps.pdf", "curves_cpu_steps.png"]
    assert os.path.getsize(out / "curves_cpu_steps.png") > 10_000
    plt = laws.pyplot()
    runs = fit.curve_runs([str(ladder)])
    assert [r[0]["run"] for r in runs] == ["vanilla_d2", "vanilla_d3", "untied_grow_d2"]  # the arms table's order
    fig = fit.curves_figure(plt, runs, "steps", None)
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
    fit_json = tmp_path / "fit.json"
    fit_json.write_text(json.dumps(dict(E=1.0, c_ref=1e9, arms=dict(vanilla=dict(A=2.0, gamma=0.1, points=[
        dict(compute=2e6), dict(compute=3e6)])))))
    fig = fit.curves_figure(plt, runs, "flops", fit.frontier_laws(str(fit_json)))
    frontier = [line for line in fig.axes[1].lines if line.get_label() == "Vanilla frontier (fitted range)"]
    assert len(frontier) == 1 and frontier[0].get_linestyle() == "--"
    assert (min(frontier[0].get_xdata()), max(frontier[0].get_xdata())) == pytest.approx((2e6, 3e6))
    twins = [(row, records, result) for row, records, result in runs[:1]] * 2  # two runs of one arm and depth
    twins[1] = (dict(twins[1][0], run="vanilla_d2_again"), *twins[1][1:])
    labels = [line.get_label() for line in fit.curves_figure(plt, twins, "steps", None).axes[0].lines]
    assert "Vanilla d2 (vanilla_d2)" in labels and "Vanilla d2 (vanilla_d2_again)" in labels
    assert fit.main(["curves", "--runs-dir", str(ladder), "--out", str(out), "--x", "flops", "--frontier", str(fit_json)]) == 0
    assert (out / "curves_cpu_flops.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["--frontier", "fit.json"], "add --x flops"),
    (["--x", "flops", "--frontier", "missing.json"], "is not a `fit.py ladders --json` output"),
])
def test_curves_refuse_bad_input_in_one_line(ladder, tmp_path, capsys, argv, message):
    assert fit.main(["curves", "--runs-dir", str(ladder), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_stopped_run_whose_lock_is_held_reads_resuming(ladder, tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(ladder, runs)
    holder = hold_lock(runs / "vanilla_d3" / "train.lock")
    try:
        rows = {r["run"]: r for r in json.loads(table(["runs", "--runs-dir", str(runs), "--json"], capsys))["runs"]}
    finally:
        holder.kill()
        holder.wait()
    assert (rows["vanilla_d3"]["state"], rows["vanilla_d3"]["reason"]) == ("resuming", "resuming a stopped run")


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
