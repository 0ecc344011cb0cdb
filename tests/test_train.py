"""train.py: flags, --dry-run, short CPU runs (growth, compilation, 2 gloo processes), the records; checkpoints (the
newest complete one wins, crash leftovers never read), kill -9 and SIGTERM resumed to the same bits, the run lock."""
import fcntl
import glob
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest
import torch

import arms
import model
import plan as plan_lib
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan_for(*argv):
    return train.make_plan(train.parse_args(list(argv)))


def test_dry_run_cli_prints_one_json_object():
    out = subprocess.run([sys.executable, "train.py", "--arch", "loop_grow", "--depth", "8", "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    for key in ("arch", "depth", "width", "heads", "tpp", "tokens_per_step", "steps", "crossover_step", "train_tokens",
                "train_token_limit", "matrix_lr", "embedding_lr", "unembedding_lr", "weight_decay", "total_flops",
                "params_tpp", "flops_per_token_final"):
        assert key in plan, key
    assert (plan["steps"], plan["crossover_step"]) == (2563, 2101)


@pytest.mark.parametrize("argv, message", [
    (["--arch", "nope", "--depth", "8", "--dry-run"], "argument --arch: invalid choice: 'nope'"),
    (["--arch", "operator_1", "--depth", "2", "--prelude", "2", "--coda", "1", "--dry-run"], "split"),
    (["--arch", "vanilla", "--depth", "2", "--preset", "cpu", "--total-batch-tokens", "1000", "--dry-run"], "multiple"),
    (["--arch", "vanilla", "--depth", "8", "--epochs", "3", "--dry-run"], "--data-constrained"),
    (["--arch", "vanilla", "--depth", "2", "--data-dir", "/nonexistent/pool", "--runs-dir", "/nonexistent/runs"],
     "prepare"),
    (["--arch", "vanilla", "--depth", "2", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    (["--depth", "2"], "the following arguments are required: --arch"),
    (["--arch", "vanilla", "--depth", "8", "--dist-timeout", "0", "--dry-run"],
     "argument --dist-timeout: must be a finite number in [1, 1440], got '0'"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert train.main(argv) == 2
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], stderr


# ---------------------------------------------------------------------------------------------------------------
# Short CPU runs on a small offline pool (byte tokenizer, tiny shapes).

def tiny(pool, runs, arch, *extra, steps=12, depth=2):
    return ["--arch", arch, "--depth", str(depth), "--preset", "cpu", "--width-per-depth", "4", "--head-dim", "4",
            "--seq-len", "32", "--total-batch-tokens", "256", "--val-tokens", "1024", "--data-dir", pool,
            "--runs-dir", str(runs), "--steps", str(steps), "--warmup-steps", "0", *extra]


def read_run(runs, name):
    run_dir = os.path.join(str(runs), name)
    result = json.load(open(os.path.join(run_dir, "result.json")))
    trajectory = [json.loads(line) for line in open(os.path.join(run_dir, "trajectory.jsonl"))]
    return result, trajectory


@pytest.mark.parametrize("arch", list(arms.ARMS))
def test_every_arm_trains_and_loss_drops(pool, tmp_path, arch):
    assert train.main(tiny(pool, tmp_path, arch, "--run-name", "r", "--crossover-fractions", "0.5")
                      if arch.endswith("grow") else tiny(pool, tmp_path, arch, "--run-name", "r")) == 0
    result, trajectory = read_run(tmp_path, "r")
    assert result["status"] == "complete" and len(trajectory) == 12
    assert result["evals"][0]["val_loss"] == pytest.approx(math.log(257), abs=1e-5)
    assert result["final_val_loss"] < result["evals"][0]["val_loss"] - 0.3
    assert trajectory[-1]["loss"] < trajectory[0]["loss"]
    assert result["estimated_training_flops"] == result["plan"]["total_flops"]
    assert os.path.isfile(os.path.join(tmp_path, "r", "checkpoints", "final", ".metadata"))


def test_resume_after_stop_is_bit_exact_and_a_tied_core_keeps_its_optimizer_state_through_growth(pool, tmp_path):
    """Loop-Grow stopped after its growth and resumed: the losses, validations and weights of an uninterrupted run."""
    base = tiny(pool, tmp_path, "loop_grow", "--crossover-fractions", "0.5", "--save-every", "4", steps=12)
    assert train.main(base + ["--run-name", "full"]) == 0
    assert train.main(base + ["--run-name", "cut", "--stop-after", "7"]) == 0
    assert train.main(base + ["--run-name", "cut", "--resume"]) == 0
    (full, full_traj), (cut, cut_traj) = read_run(tmp_path, "full"), read_run(tmp_path, "cut")
    assert [t["loss"] for t in cut_traj] == [t["loss"] for t in full_traj]
    assert cut["evals"] == full["evals"] and full["growth_events"][0]["step"] == 6
    a, b = (train.load_checkpoint_model(os.path.join(tmp_path, name))[0].state_dict() for name in ("full", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_non_finite_loss_exits_3_and_keeps_checkpoint(pool, tmp_path):
    args = tiny(pool, tmp_path, "vanilla", "--run-name", "nan", "--save-every", "2", "--unembedding-lr", "1e30",
                steps=12)
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert "non-finite" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert json.load(open(os.path.join(tmp_path, "nan", "result.json")))["status"] == "failed"
    latest = os.path.join(tmp_path, "nan", "checkpoints", "step_000002")
    assert "step 2" in r.stderr and latest in r.stderr  # blows up at step 2, after the step-2 checkpoint
    assert train.read_run_state(latest).step == 2


# ---------------------------------------------------------------------------------------------------------------
# Micro-batches in training; compilation.

def spy_on_forward(monkeypatch):
    """Records (training?, sequences, active passes) for every forward of every GPT."""
    calls, forward = [], model.GPT.forward

    def recording(self, idx, *args, **kwargs):  # validation asks for every target's loss (reduction="none")
        training = kwargs.get("targets") is not None and kwargs.get("reduction", "mean") == "mean"
        calls.append((training, idx.size(0), self.active_passes))
        return forward(self, idx, *args, **kwargs)
    monkeypatch.setattr(model.GPT, "forward", recording)
    return calls


def test_training_splits_each_step_by_its_stage_micro_batch(pool, tmp_path, monkeypatch):
    calls = spy_on_forward(monkeypatch)
    assert train.main(tiny(pool, tmp_path, "untied_grow", "--run-name", "m", "--crossover-fractions", "0.5",
                           "--device-batch-size", "4", "--save-every", "0", steps=4)) == 0
    training = [(b, k) for is_train, b, k in calls if is_train]
    assert training == [(4, 2)] * 4 + [(4, 4)] * 4  # 8 sequences per step: 2 micro-batches of 4 in every stage
    result, _ = read_run(tmp_path, "m")
    assert result["device_batch_size"] == [4, 4]
    assert [(s["micro_batch"], s["accumulation"]) for s in result["memory"]["stages"]] == [(4, 2), (4, 2)]


@pytest.fixture(scope="module")
def compiled_and_eager(pool, tmp_path_factory):
    """The same tiny growth run eager and compiled (aot_eager: CPU inductor is minutes per graph), graphs counted."""
    runs = tmp_path_factory.mktemp("compile")
    args = tiny(pool, runs, "untied_grow", "--crossover-fractions", "0.5", "--save-every", "0", steps=6)
    assert train.main(args + ["--run-name", "eager"]) == 0
    graphs, real_compile = [], torch.compile

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.registry.lookup_backend("aot_eager")(gm, example_inputs)
    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=counting, **kw))
        assert train.main(args + ["--run-name", "compiled", "--compile"]) == 0
    torch._dynamo.reset()
    return read_run(runs, "eager"), read_run(runs, "compiled"), graphs


def test_compiled_run_has_one_block_graph_for_training_and_one_for_eval(compiled_and_eager):
    """Regional compilation: one block graph per micro-batch shape and grad mode, whatever the depth or growth."""
    _, (result, trajectory), graphs = compiled_and_eager
    assert [t["passes"] for t in trajectory] == [2, 2, 2, 4, 4, 4] and result["environment"]["compiled"]
    assert result["environment"]["attention_backend"] == "auto"
    assert len(graphs) == 2  # one micro-batch of 8 in both stages: a training graph and an eval (no-grad) graph


def test_compiled_equals_eager(compiled_and_eager):
    (eager, eager_traj), (compiled, compiled_traj), _ = compiled_and_eager
    assert [t["loss"] for t in compiled_traj] == pytest.approx([t["loss"] for t in eager_traj], rel=1e-5)
    assert compiled["final_val_loss"] == pytest.approx(eager["final_val_loss"], rel=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Resuming; AdamW on shards

def test_resume_or_start_a_moved_pool_and_a_finished_run_not_retrained(pool, tmp_path):
    """--resume refuses a run without a checkpoint, --resume-or-start starts it; a moved pool resumes; a run killed
    between checkpoints/final and result.json is finished from final, not retrained."""
    moved = str(tmp_path / "moved_pool")
    shutil.copytree(pool, moved)
    args = tiny(pool, tmp_path, "vanilla", "--run-name", "r", steps=4)
    os.makedirs(os.path.join(tmp_path, "r"))
    result_path = os.path.join(tmp_path, "r", "result.json")
    json.dump(dict(status="running"), open(result_path, "w"))
    assert train.main(args + ["--resume"]) == 2
    assert train.main(args + ["--resume-or-start", "--stop-after", "2"]) == 0
    assert train.main([moved if a == pool else a for a in args] + ["--resume"]) == 0
    complete, trajectory = read_run(tmp_path, "r")
    assert complete["status"] == "complete" and complete["data_dir"] == moved and len(trajectory) == 4
    epoch_at = {0: 1, **{t["step"]: t["epoch"] for t in trajectory}}  # evals: 0, the epoch's end at 3, the end
    assert [e["epoch"] for e in complete["evals"]] == [epoch_at[e["step"]] for e in complete["evals"]] == [1, 1, 2]
    json.dump(dict(complete, status="running"), open(result_path, "w"))
    trajectory = open(os.path.join(tmp_path, "r", "trajectory.jsonl")).read()
    weights = open(os.path.join(tmp_path, "r", "checkpoints", "final", "__0_0.distcp"), "rb").read()
    assert train.main(args + ["--resume"]) == 0
    finished = json.load(open(result_path))
    assert finished["status"] == "complete" and finished["evals"] == complete["evals"]
    assert open(os.path.join(tmp_path, "r", "trajectory.jsonl")).read() == trajectory
    assert open(os.path.join(tmp_path, "r", "checkpoints", "final", "__0_0.distcp"), "rb").read() == weights
    assert train.main(args + ["--resume-or-start"]) == 0  # complete: nothing to do


def test_adamw_ablation_two_processes_equals_one(pool, tmp_path, free_port):
    """--optimizer adamw under torchrun: AdamW alone on FSDP2's shards (DTensors, foreach)."""
    args = tiny(pool, tmp_path, "untied_grow", "--crossover-fractions", "0.5", "--optimizer", "adamw",
                "--device-batch-size", "2", steps=8)
    for name, launch in (("one", []), ("two", ["-m", "torch.distributed.run", "--nproc_per_node", "2",
                                               "--master_port", str(free_port)])):
        r = subprocess.run([sys.executable, *launch, "train.py", *args, "--run-name", name], cwd=ROOT, text=True,
                           capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, r.stderr[-3000:]
    (result, one), (_, two) = read_run(tmp_path, "one"), read_run(tmp_path, "two")
    assert [t["loss"] for t in two] == pytest.approx([t["loss"] for t in one], rel=1e-5)
    assert two[-1]["loss"] < two[0]["loss"]
    muon_plan = train.make_plan(train.parse_args(tiny(pool, tmp_path, "untied_grow")))
    assert result["plan"]["matrix_lr"] / arms.ADAMW_MATRIX_LR == pytest.approx(
        muon_plan.matrix_lr / arms.ARMS["untied_grow"].matrix_lr)  # same depth scaling, AdamW's base LR
    import torch.distributed.checkpoint as dcp
    final = os.path.join(tmp_path, "two", "checkpoints", "final")
    keys = [k for k in dcp.FileSystemReader(final).read_metadata().state_dict_metadata if k.startswith("optimizer.")]
    assert keys and all(k.startswith("optimizer.adamw.") for k in keys)  # one AdamW for every group, no Muon


def test_schedule_notes_name_what_the_lr_schedule_cannot_do_in_a_tiny_run(capsys):
    """The dry run notes a warmup or re-warm that outlasts a tiny run; no run of the paper's ladders has a note."""
    notes = {}
    for arch in ("vanilla", "untied_grow"):
        assert train.main(["--arch", arch, "--depth", "1", "--preset", "cpu", "--dry-run"]) == 0
        notes[arch] = json.loads(capsys.readouterr().out)["schedule_notes"]
    assert notes["vanilla"] == ["warmup_steps 40 >= steps 33: the LR peaks at 0.825 of its value and never decays"]
    assert notes["untied_grow"] == ["growth at step 39 falls inside the 40-step warmup",
                                    "the 40-step re-warm after growth at step 39 outlasts the 56-step run"]
    for preset in ("paper", "d26", "data-constrained", "cpu"):
        target = dict(d26="untied_grow", **{"data-constrained": "operator_1"}).get(preset, "all")
        for name, argv in train.ladder_runs(target, preset):
            plan = train.make_plan(train.parse_args(argv))
            noted = preset == "cpu" and name in ("vanilla_d1", "loop_2_d1", "loop_grow_d1", "untied_grow_d1",
                                                 "deep_vanilla_grow_d1", "loop_grow_d2")
            assert bool(plan_lib.schedule_notes(plan)) == noted, (name, plan_lib.schedule_notes(plan))



# ---------------------------------------------------------------------------------------------------------------
# Checkpoints: one 16-step Untied-Grow run (growth at step 8, logged every step, saved every 4) that every interrupted
# one must match bit for bit.

def growth_run(pool, runs, name, *extra):
    return tiny(pool, runs, "untied_grow", "--run-name", name, "--crossover-fractions", "0.5", "--save-every", "4",
                "--log-every", "1", *extra, steps=16)


def weights(path):
    return train.load_checkpoint_model(str(path))[0].state_dict()


def same_run(runs, name, full):  # the same losses and final weights as the uninterrupted run
    assert [t["loss"] for t in read_run(runs, name)[1]] == [t["loss"] for t in read_run(full.parent, "full")[1]]
    assert all(torch.equal(weights(full)[k], v) for k, v in weights(runs / name).items())


@pytest.fixture(scope="module")
def full(pool, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    assert train.main(growth_run(pool, runs, "full")) == 0
    return runs / "full"


def test_load_checkpoint_model_reads_a_run_its_checkpoints_or_one_step_folder(full, tmp_path):
    ckpt = full / "checkpoints"
    assert [os.path.basename(f) for f in train.complete_checkpoints(str(ckpt))] == ["step_000012", "final"]  # KEEP
    net, record = train.load_checkpoint_model(str(full))
    assert record["step"] == 16 and net.active_passes == record["passes"] == 4
    for path in (full, ckpt):
        assert all(torch.equal(weights(ckpt / "final")[k], v) for k, v in weights(path).items())
    assert any(not torch.equal(weights(ckpt / "final")[k], v) for k, v in weights(ckpt / "step_000012").items())
    with pytest.raises(train.UsageError, match="holds no complete train.py checkpoint"):
        train.load_checkpoint_model(str(tmp_path))


def test_a_crash_leftover_never_shadows_or_deletes_the_intact_checkpoint(pool, full, tmp_path):
    """Issue 47, 6: a .tmp leftover (even one claiming step 15) and a step folder without .metadata are never read;
    the .tmp goes at the next save."""
    assert train.main(growth_run(pool, tmp_path, "cut", "--stop-after", "8")) == 0
    ckpt = tmp_path / "cut" / "checkpoints"
    for name, step in (("step_000015.tmp", 15), ("step_000014", 14)):
        shutil.copytree(ckpt / "step_000008", ckpt / name)
        meta = json.load(open(ckpt / name / "meta.json"))
        json.dump(dict(meta, step=step, weights=dict(meta["weights"], step=step)), open(ckpt / name / "meta.json", "w"))
    os.remove(ckpt / "step_000014" / ".metadata")
    assert train.complete_checkpoints(str(ckpt))[-1] == str(ckpt / "step_000008")
    assert train.main(growth_run(pool, tmp_path, "cut", "--resume")) == 0
    same_run(tmp_path, "cut", full)
    assert sorted(os.listdir(ckpt)) == ["final", "step_000012", "step_000014"]


def start(pool, runs, name):
    """train.py in a subprocess, once it has logged 5 steps."""
    proc = subprocess.Popen([sys.executable, "train.py", *growth_run(pool, runs, name)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))
    trajectory, deadline = os.path.join(runs, name, "trajectory.jsonl"), time.time() + 300
    while proc.poll() is None and time.time() < deadline and \
            (not os.path.exists(trajectory) or sum(1 for _ in open(trajectory)) < 5):
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    return proc


def test_kill_9_resumes_to_the_uninterrupted_runs_bits(pool, full, tmp_path):
    proc = start(pool, tmp_path, "killed")
    proc.kill()
    proc.communicate()
    step = train.read_run_state(train.complete_checkpoints(str(tmp_path / "killed" / "checkpoints"))[-1]).step
    assert 4 <= step < 16 and json.load(open(tmp_path / "killed" / "result.json"))["status"] == "running"
    assert train.main(growth_run(pool, tmp_path, "killed", "--resume")) == 0
    same_run(tmp_path, "killed", full)


def test_a_stop_signal_saves_records_stopped_and_resumes_exactly(pool, full, tmp_path):
    """SIGTERM: a checkpoint at the next logged step, result.json stopped (why), exit 143, --resume to the same bits."""
    proc = start(pool, tmp_path, "stopped")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    result = json.load(open(tmp_path / "stopped" / "result.json"))
    step = result["completed_steps"]
    assert result["status"] == "stopped" and result["reason"] == f"SIGTERM at step {step}" and step < 16
    assert train.complete_checkpoints(str(tmp_path / "stopped" / "checkpoints"))[-1].endswith(f"step_{step:06d}")
    assert f"stopped (SIGTERM at step {step}); continue with --resume" in err
    assert train.main(growth_run(pool, tmp_path, "stopped", "--resume")) == 0
    same_run(tmp_path, "stopped", full)


def test_one_writer_per_run_the_second_is_told_who_writes(pool, tmp_path, capsys):
    os.makedirs(tmp_path / "r")
    with open(tmp_path / "r" / "train.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("PID 4242 on elsewhere\n")
        held.flush()
        assert train.main(growth_run(pool, tmp_path, "r")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is being written by another train.py (PID 4242 on elsewhere)" in err
    assert os.listdir(tmp_path / "r") == ["train.lock"]


# ---------------------------------------------------------------------------------------------------------------
# Watching a run: periodic validation, trajectory.jsonl's documented fields (docs/trajectory.md), the host syncs.

EVERY_RECORD = {"step", "tokens", "flops", "lr_multiplier", "passes", "stage", "epoch", "loss", "tokens_per_second"}
LOGGED_RECORD = EVERY_RECORD | {"grad_norm", "scalars", "wall_seconds", "train_seconds", "eta_seconds"}


def test_eval_every_trajectory_has_the_documented_fields_and_resumes_bit_exact(pool, tmp_path):
    """--eval-every 4 around a growth at step 6: the validations, the documented fields, FLOPs; a stop at 7 resumes
    bit-exact."""
    base = tiny(pool, tmp_path, "untied_grow", "--crossover-fractions", "0.5", "--eval-every", "4", "--log-every",
                "2", "--save-every", "0", steps=12)
    assert train.main(base + ["--run-name", "full"]) == 0
    assert train.main(base + ["--run-name", "cut", "--stop-after", "7"]) == 0
    stopped, stopped_traj = read_run(tmp_path, "cut")
    assert stopped["status"] == "stopped" and stopped["final_val_loss"] is None and stopped["best_val_loss"] is None
    assert stopped["last_eval"] == stopped["evals"][-1] and stopped["last_eval"]["step"] == 6
    assert train.main(base + ["--run-name", "cut", "--resume"]) == 0
    full, traj = read_run(tmp_path, "full")
    cut, cut_traj = read_run(tmp_path, "cut")
    epochs = [e["step"] for e in full["evals"] if e["when"] == "epoch"]  # where the pool's epochs end
    assert [(e["step"], e["when"]) for e in full["evals"] if e["when"] != "epoch"] == [
            (0, "start"), (4, "periodic"), (6, "before growth"), (6, "after growth"), (8, "periodic"), (12, "end")]
    assert [(e["step"], e["passes"]) for e in full["evals"] if e["when"] in ("before growth", "after growth")] == \
        [(6, 2), (6, 4)]
    assert full["final_val_loss"] == full["evals"][-1]["val_loss"] and full["last_eval"] == full["evals"][-1]
    cfg = plan_for(*base).model_config
    flops = 0
    for record in traj:
        assert EVERY_RECORD <= set(record), record
        flops += model.flops_per_token(cfg, record["passes"]) * 256
        assert record["tokens"] == 256 * record["step"] and record["flops"] == flops
        assert (record["stage"], record["passes"]) == ((0, 2) if record["step"] <= 6 else (1, 4))
    assert traj[6]["lr_multiplier"] == 0.0 < traj[7]["lr_multiplier"]  # the re-warm after growth
    logged = [r for r in traj if "wall_seconds" in r]
    assert [r["step"] for r in logged] == sorted({1, 2, 4, 6, 7, 8, 10, 12, *epochs})
    assert all(LOGGED_RECORD <= set(r) and r["grad_norm"] > 0 for r in logged)
    at6 = next(r for r in traj if r["step"] == 6)
    assert (at6["val_passes"], at6["passes_after_growth"]) == (2, 4) and at6["val_loss_after_growth"] > 0
    assert [r["step"] for r in traj if "val_loss" in r] == sorted({e["step"] for e in full["evals"]} - {0})
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("tokens_per_second", "wall_seconds", "train_seconds",
                                                                 "eta_seconds")} for r in rs]
    assert strip(cut_traj) == strip(traj)  # losses, grad norms, val losses: the same bits
    assert [{k: e[k] for k in ("step", "val_loss", "passes", "when")} for e in cut["evals"]] == \
        [{k: e[k] for k in ("step", "val_loss", "passes", "when")} for e in full["evals"]]
    walls = [r["wall_seconds"] for r in cut_traj if "wall_seconds" in r]
    assert walls == sorted(walls) and cut["wall_seconds"] >= walls[-1] > stopped["wall_seconds"] > 0
    assert 0 < cut["eval_seconds"] < cut["wall_seconds"]


SYNCS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


def test_only_logged_steps_wait_for_the_device(pool, tmp_path, monkeypatch):
    """No .item(), .tolist(), float() of a tensor or cuda.synchronize in train_step or between steps; a logged step
    fetches once."""
    calls = []  # data.py's loader works on host tensors (an epoch's permutation): not the device's
    project = {os.path.join(ROOT, f) for f in os.listdir(ROOT) if f.endswith(".py") and f != "data.py"}

    def counted(name, original):
        def wrapper(*args, **kwargs):
            frame = sys._getframe(1)
            if frame.f_code.co_filename in project:
                stack, f = [], frame
                while f is not None:
                    stack.append(f.f_code.co_name)
                    f = f.f_back
                calls.append((name, stack))
            return original(*args, **kwargs)
        return wrapper
    for name in SYNCS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", counted("synchronize", torch.cuda.synchronize))
    argv = tiny(pool, tmp_path, "gated_1", "--run-name", "s", "--log-every", "5", "--eval-every", "0",
                "--save-every", "0", steps=12)
    assert train.main(argv) == 0
    in_loop = [(name, stack) for name, stack in calls if "train" in stack and "finish" not in stack
               and "validate" not in stack and "save_checkpoint" not in stack and "start_training" not in stack]
    assert not [c for c in in_loop if "train_step" in c[1]], in_loop
    fetches = [c for c in in_loop if "fetch" in c[1]]
    _, traj = read_run(tmp_path, "s")
    assert len(fetches) == len([r for r in traj if "wall_seconds" in r]) == 5  # steps 1, 3 (epoch), 5, 10, 12
    assert len(in_loop) == len(fetches), in_loop
    logged = [r for r in traj if "scalars" in r]  # a user arm's boundary gate (0-dim), logged by its parameter name
    assert len(logged) == 5 and all(set(r["scalars"]) == {"boundary_gates.0"} for r in logged)
    assert len({r["scalars"]["boundary_gates.0"] for r in logged}) >= 3  # it trains


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


def test_wandb_without_the_package_is_one_line(pool, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "x", "--wandb", "p", steps=2)) == 2
    assert not (tmp_path / "x").exists()  # refused before the run folder is made
    monkeypatch.setenv("WANDB_PROJECT", "p")
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "y", steps=2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("needs the wandb package: pip install wandb" in line for line in err), err
