"""Tests for watch.py: the runs table (fit.py runs) over complete, running, stopped and failed runs, the training
curves (fit.py curves), and the optional wandb tracker (offline) with its one-line refusal when wandb is missing."""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import pytest

import fit
import laws
import train
import watch
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


# ---------------------------------------------------------------------------------------------------------------
# wandb, offline

def wandb_records(path):
    """The protobuf records of a .wandb file (the LevelDB log format: 32 KiB blocks of chunks, each with a 7-byte
    header crc32, length, type; FULL=1 and LAST=4 end a record), after its 7-byte ':W&B' file header."""
    from wandb.proto import wandb_internal_pb2
    data, pos, block, buffered = open(path, "rb").read(), 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (kind == 0 and length == 0):
            pos += left
            continue
        buffered += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buffered)
            buffered = b""
            yield record


def test_wandb_offline_logs_the_plan_the_records_and_the_result_and_resumes_the_same_run(pool, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is optional (pip install wandb): its offline test needs it")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    argv = tiny(pool, tmp_path, "gated_1", "--run-name", "w", "--log-every", "2", "--wandb", "ladder-test", steps=6)
    assert train.main(argv + ["--stop-after", "3"]) == 0
    run_id = (tmp_path / "w" / "wandb_id").read_text().strip()
    assert train.main(argv + ["--resume"]) == 0
    assert (tmp_path / "w" / "wandb_id").read_text().strip() == run_id
    files = sorted(glob.glob(str(tmp_path / "w" / "wandb" / "offline-run-*" / f"run-{run_id}.wandb")),
                   key=os.path.getmtime)
    assert len(files) == 2  # two invocations, one wandb run
    deadline = time.time() + 30  # wandb's service process writes the file out after finish() returns
    while time.time() < deadline and len({r.history.step.num for path in files for r in wandb_records(path)
                                          if r.WhichOneof("record_type") == "history"}) < 6:
        time.sleep(0.5)
    history, config, summary, runs, metrics = {}, {}, {}, [], {}
    for path in files:
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                history[items["_step"]] = items
            elif kind == "run":
                config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
                runs.append((record.run.run_group, record.run.display_name, list(record.run.tags)))
            elif kind == "metric":
                metrics[record.metric.name or record.metric.glob_name] = record.metric.step_metric
            elif kind == "summary":
                summary.update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in record.summary.update})
    _, trajectory = read_run(tmp_path, "w")
    assert sorted(history) == [r["step"] for r in trajectory] == list(range(1, 7))
    ladder = os.path.basename(tmp_path)  # grouped by the ladder (the runs folder), named uniquely within and across
    assert runs and all(run == (ladder, f"{ladder}/w", ["gated_1", "d2", "cpu"]) for run in runs), runs
    assert metrics == {"flops": "", "tokens": "", "train/*": "flops", "val/*": "flops"}  # the declared x-axes
    for r in trajectory:
        h = history[r["step"]]
        assert h["train/loss"] == r["loss"] and h["flops"] == r["flops"] and h["tokens"] == r["tokens"]
        assert "loss" not in h and "train/step" not in h
        if "scalars" in r:
            assert h["train/scalars/boundary_gates.0"] == r["scalars"]["boundary_gates.0"]
        if "val_loss" in r:
            assert h["val/loss"] == r["val_loss"] and h["val/bpb"] == r["val_bpb"]
    assert "val/loss" in history[6]
    assert config["arch"] == "gated_1" and config["steps"] == 6
    result = json.load(open(tmp_path / "w" / "result.json"))
    assert summary["status"] == "complete" and summary["final_val_loss"] == result["final_val_loss"]


def test_wandb_without_the_package_is_one_line_before_any_work(pool, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "x", "--wandb", "p", steps=2)) == 2
    monkeypatch.setenv("WANDB_PROJECT", "p")
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "x", steps=2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("needs the wandb package: pip install wandb" in line for line in err), err
    assert not (tmp_path / "x").exists()



@pytest.fixture
def wandb_stub(monkeypatch, tmp_path):
    """An importable stand-in for the wandb package (the refusals come before wandb.init), online mode and no key:
    no WANDB_API_KEY and a netrc without wandb's host."""
    import types
    monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "netrc").write_text("machine example.org login me password secret\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))


@pytest.mark.parametrize("flags, env, message", [
    (["--wandb", ""], {}, "--wandb '' names no project; give one"),
    (["--wandb", "team/project"], {}, "--wandb 'team/project' is no wandb project name"),
    (["--wandb", "x" * 129], {}, "is no wandb project name: at most 128 characters"),
    ([], {"WANDB_PROJECT": "a:b"}, "--wandb 'a:b' is no wandb project name"),
    (["--wandb", "p"], {}, "--wandb p: no wandb API key (set WANDB_API_KEY or run `wandb login`); or log offline"),
    (["--wandb", "p"], {"WANDB_MODE": "online"}, "no wandb API key"),
])
def test_wandb_refusals_are_one_line_before_the_run_folder(pool, tmp_path, capsys, wandb_stub, monkeypatch, flags,
                                                            env, message):
    """What wandb.init refused only after the run folder existed (a 37-line traceback, the run left `running` at step
    0), or what trained without a word (--wandb ''): one line, exit 2, no run folder."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "x", *flags, steps=2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "x").exists()


def test_wandb_key_from_the_environment_or_netrc_or_offline_passes_the_check(tmp_path, wandb_stub, monkeypatch):
    args = train.parse_args(["--arch", "vanilla", "--depth", "2", "--runs-dir", str(tmp_path), "--dry-run"])
    args.dry_run, args.wandb = False, "p"
    run_dir = str(tmp_path / "r")
    with pytest.raises(watch.UsageError, match="no wandb API key"):
        watch.check_tracker(args, run_dir)
    monkeypatch.setenv("WANDB_MODE", "offline")
    watch.check_tracker(args, run_dir)
    monkeypatch.delenv("WANDB_MODE")
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password k3y\n")
    watch.check_tracker(args, run_dir)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    with pytest.raises(watch.UsageError, match="no wandb API key"):
        watch.check_tracker(args, run_dir)
    monkeypatch.setenv("WANDB_API_KEY", "k3y")
    watch.check_tracker(args, run_dir)


@pytest.mark.parametrize("content", [b"", b"a/b\n", b"\xff\xfe\n"])
def test_a_garbage_wandb_id_is_refused_on_resume_and_the_run_stays_stopped(pool, tmp_path, capsys, wandb_stub,
                                                                           monkeypatch, content):
    argv = tiny(pool, tmp_path, "vanilla", "--run-name", "w", "--save-every", "2", steps=4)
    assert train.main(argv + ["--stop-after", "2"]) == 0
    (tmp_path / "w" / "wandb_id").write_bytes(content)
    before = (tmp_path / "w" / "result.json").read_text()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert train.main(argv + ["--resume", "--wandb", "p"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "wandb_id holds no wandb run id" in err[0], err
    assert (tmp_path / "w" / "result.json").read_text() == before


def test_the_project_and_run_id_rules_are_wandbs_own():
    """watch.check_tracker's rules for project names and run ids against wandb.Settings' validators."""
    pytest.importorskip("wandb", reason="wandb is optional (pip install wandb): comparing with its rules needs it")
    import types
    import wandb
    for project in ("ok-project_1", "team/project", "a:b", "x" * 128, "x" * 129, "q?", "50%"):
        args = types.SimpleNamespace(wandb=project, dry_run=True)
        try:
            watch.check_tracker(args, "/nonexistent")
            ours = True
        except watch.UsageError:
            ours = False
        try:
            wandb.Settings(project=project)
            theirs = True
        except Exception:
            theirs = False
        assert ours == theirs, project


# ---------------------------------------------------------------------------------------------------------------------
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
    seen, write = [], watch.Progress.write

    def write_then_look(self, printed=True):
        write(self, printed)
        if self.state.step == 4:
            capsys.readouterr()
            assert fit.main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
            seen.append(json.loads(capsys.readouterr().out)["runs"][0])
    monkeypatch.setattr(watch.Progress, "write", write_then_look)
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "live", "--log-every", "2", "--save-every", "0",
                           "--eval-every", "0", steps=8)) == 0
    assert [(r["state"], r["step"], r["steps"]) for r in seen] == [("running", 4, 8)]
    assert seen[0]["train_loss"] is not None and seen[0]["eta_seconds"] is not None


def test_a_stop_before_the_first_checkpoint_does_not_offer_resume(pool, tmp_path, capsys, monkeypatch):
    """Ctrl-C at step 0 said `--resume continues from the last checkpoint`; there was none and --resume then failed."""
    def stop(*args):
        raise train.Stopped(2)
    monkeypatch.setattr(train, "validate", stop)
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "s", steps=4)) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train.py: stopped by SIGINT at step 0; run the same command again (no checkpoint yet: it starts "
                   "over)"], err


def test_eta_prices_the_steps_ahead_at_their_passes_and_the_validations_and_checkpoints_ahead(pool, tmp_path):
    """The ETA was (steps left) x (the current step time): blind to growth ahead, validations and checkpoints (163 s
    predicted vs 321 s taken). Untied-Grow grows 2 -> 4 passes at step 6 of 12; at step 2 with a measured rate, one
    validation timed and two checkpoints timed, the ETA is each part priced by hand."""
    from types import SimpleNamespace
    import model
    import plan as plan_lib
    args = train.parse_args(tiny(pool, tmp_path, "untied_grow", "--crossover-fractions", "0.5", steps=12))
    plan = plan_lib.make_plan(args)
    assert list(plan.crossover_steps) == [6] and list(plan.pass_stages) == [2, 4]
    cadence = train.Cadence(plan, stop=12, log_every=2, eval_every=4, save_every=5, steps_per_epoch=10 ** 6)
    state = SimpleNamespace(step=2, flops=0, wall_seconds=0.0, eval_seconds=3.0, evals=[dict(passes=2)])
    progress = watch.Progress(SimpleNamespace(plan=plan, peak_flops=None, master=True), state, None, cadence)
    c2, c4 = (model.flops_per_token(plan.model_config, k) for k in (2, 4))
    progress.rate, progress.save_seconds = 1e-8, [0.5, 1.5]
    steps = 1e-8 * (4 * c2 + 6 * c4)                          # steps 3..6 at 2 passes, 7..12 at 4
    validations = 3.0 / c2 * (c2 + c2 + c4 + c4 + c4)        # at 4; 6 before and after growth; 8; the end (12)
    checkpoints = 3 * 1.0                                     # at 5, 10 and the end
    assert progress.eta() == pytest.approx(steps + validations + checkpoints)
    state.step = 11
    assert progress.eta() == pytest.approx(1e-8 * c4 + 3.0 / c2 * c4 + 1.0)
