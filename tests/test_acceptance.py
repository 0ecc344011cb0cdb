"""The GPU acceptance runs' verdicts (bench.py --gpu-check, --gpu-smoke) on synthetic measurements: every target of
arms.TARGETS missed in turn is `missed`, a part not run is `incomplete`, an error `failed`; the one-GPU smoke is never
`passed`; without a GPU they stop with one line unless --cpu-exercise; docs/gpu_acceptance.md lists the same targets;
MFU in both conventions, from post-growth steps; a stopped --gpu-smoke leaves no worker and no lock behind."""
import copy
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch

import arms
import bench
import common
import model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def passing(target, dtype):
    bound = arms.bound_for(target, dtype)
    if target.op == "within":
        return sum(bound) / 2
    return {">=": bound * 1.1, "<=": bound * 0.5, "is": bound}[target.op]


def missing(target, dtype):
    """Measurements that miss the target: one on each side of a two-sided one."""
    bound = arms.bound_for(target, dtype)
    if target.op == "within":
        return [bound[0] - 0.01, bound[1] + 0.01]
    return [{">=": bound * 0.9, "<=": bound * 1.1 + 1e-3, "is": not bound}[target.op]]


def synthetic(run, dtype="bf16"):
    """A run's JSON with every measurement of its targets on the passing side."""
    out = dict(errors={}, skipped={})
    for target in (t for t in arms.TARGETS if t.run == run):
        out.setdefault(target.section, {})[target.measurement] = passing(target, dtype)
    return out


@pytest.mark.parametrize("run", ["gpu_check", "gpu_smoke"])
def test_every_target_met_is_passed_and_each_one_missed_in_turn_is_missed(run):
    out = synthetic(run)
    assert arms.gate(run, out, "bf16") == "passed" and out["exit_code"] == 0 and out["unmeasured"] == []
    for target in (t for t in arms.TARGETS if t.run == run):
        for value in missing(target, "bf16"):
            one = synthetic(run)
            one[target.section][target.measurement] = value
            assert arms.gate(run, one, "bf16") == "missed", (target, value)
            assert one["exit_code"] == 4 and one["misses"] == [f"{target.section}.{target.measurement}"]
            assert one[target.section]["gates"][target.measurement]["met"] is False


def test_a_too_good_measurement_is_missed():
    """Every ratio is two-sided where a number too good means a wrong measurement: a --peak-flops below the GPU's
    makes the roofline exceed the peak and inflates MFU."""
    two_sided = {(t.section, t.measurement) for t in arms.TARGETS if t.op == "within"}
    assert {("roofline", "peak_fraction"), ("vanilla", "mfu_causal_half"), ("untied_grow", "mfu_causal_half"),
            ("ratios", "operator_1_over_vanilla")} <= two_sided
    assert all(t.bound[1] <= 1.0 for t in arms.TARGETS if t.measurement.endswith(("fraction", "over_predicted")))


def test_mfu_targets_are_the_calibrated_models_prediction_for_each_sections_shape():
    """arms.GPU_CHECK_MFU holds what throughput.py predicts for --gpu-check's compiled sections on one H100 80GB:
    their paper-preset shapes, the planner's micro-batches, the steps each section times (after growth)."""
    import plan
    import throughput
    args = bench.parse_args(["--gpu-check"])
    recipe = bench.GPU_CHECK["paper"]
    shapes = dict(vanilla=("vanilla", recipe["vanilla_depth"], None),
                  untied_grow=("untied_grow", recipe["grow_depth"], recipe["crossover_step"]))
    assert set(shapes) == set(arms.GPU_CHECK_MFU)
    for section, (arch, depth, crossover) in shapes.items():
        run_plan = bench.synthetic_plan(args, arch, depth, recipe["steps"], crossover, recipe["tokens_per_step"])
        mem = plan.plan_micro_batches(run_plan, 1, arms.H100_80GB_GIB)
        timed = throughput.predict(run_plan, mem, 1, 1)["stages"][-1]
        shape, mfu = arms.GPU_CHECK_MFU[section]
        assert mfu == pytest.approx(timed["mfu"], abs=5e-4) and f"micro-batch {timed['micro_batch']}" in shape
        target = next(t for t in arms.TARGETS if t.section == section and t.measurement == "mfu_causal_half")
        assert target.bound == pytest.approx((mfu - arms.MFU_MARGIN, mfu + arms.MFU_MARGIN), abs=1e-3)


def test_per_dtype_bounds_apply_the_runs_dtype():
    out = synthetic("gpu_smoke", "bf16")
    out["checks"]["default_vs_reference"] = 1e-4  # inside bf16's tolerance, outside fp32's
    assert arms.gate("gpu_smoke", copy.deepcopy(out), "bf16") == "passed"
    assert arms.gate("gpu_smoke", out, "fp32") == "missed"


def test_a_section_not_run_is_incomplete_an_error_failed_and_the_worst_wins():
    out = synthetic("gpu_check")
    out["ratios"], out["skipped"]["ratios"] = None, "not started: budget"
    assert arms.gate("gpu_check", out, "bf16") == "incomplete" and out["exit_code"] == 5
    assert out["unmeasured"] == ["ratios.operator_1_over_vanilla", "ratios.untied_2_over_loop_2"]
    out["vanilla"]["mfu_causal_half"] = 0.2
    assert arms.gate("gpu_check", out, "bf16") == "missed"  # a miss outranks a part not run
    out["errors"]["core_scoring"] = "RuntimeError: out of memory"
    assert arms.gate("gpu_check", out, "bf16") == "failed" and out["exit_code"] == 1
    out = synthetic("gpu_check")
    out["vanilla"]["mfu_causal_half"] = None  # not measured (no peak): never counted as met
    assert arms.gate("gpu_check", out, "bf16") == "incomplete"


def test_the_smoke_takes_the_worst_of_its_own_checks_and_its_gpu_check():
    out = synthetic("gpu_smoke")
    out["parts"] = dict(gpu_check="missed")
    assert arms.gate("gpu_smoke", out, "bf16") == "missed" and out["exit_code"] == 4


def test_the_one_gpu_smoke_is_incomplete_never_passed(tmp_path, monkeypatch):
    """One GPU visible: the NCCL runs are skipped; even a --gpu-check that passed leaves the smoke incomplete."""
    def passed_check(args):
        (tmp_path / "gpu_check.json").write_text(json.dumps(dict(verdict="passed")))
        return 0
    monkeypatch.setattr(bench, "gpu_check", passed_check)
    out = dict(launches={}, runs={}, checks=None, parts={}, errors={}, skipped={})
    args = types.SimpleNamespace(out=None, memory_snapshots=None)
    bench.smoke_parts(args, torch.device("cuda", 0), 1, str(tmp_path), out, str(tmp_path / "gpu_smoke.json"))
    assert "NCCL was not started" in out["skipped"]["runs"] and out["parts"] == dict(gpu_check="passed")
    assert arms.gate("gpu_smoke", out, "bf16") == "incomplete" and out["exit_code"] == 5


def test_docs_list_the_targets_and_verdicts_of_the_table():
    docs = open(os.path.join(ROOT, "docs", "gpu_acceptance.md")).read()
    assert arms.targets_markdown() in docs and arms.verdicts_markdown() in docs, "run: python arms.py targets"
    assert len(set(arms.EXIT_CODES.values())) == len(arms.VERDICTS) and 2 not in arms.EXIT_CODES.values()


@pytest.mark.parametrize("mode", ["--gpu-check", "--gpu-smoke"])
def test_without_a_gpu_bench_stops_with_one_line_unless_asked_to_exercise_the_cpu(mode, tmp_path, monkeypatch,
                                                                                 capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert bench.main([mode]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{mode} measures a GPU and no CUDA device is visible" in lines[0] and \
        "--cpu-exercise" in lines[0], lines
    assert os.listdir(tmp_path) == []  # nothing written, nothing started


@pytest.mark.parametrize("target", ["gpu-check", "gpu-smoke"])
def test_without_a_gpu_ladder_sh_stops_with_one_line(target, tmp_path):
    r = subprocess.run(["bash", "ladder.sh", target], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "measures a GPU" in lines[0], r.stderr


def test_mfu_in_both_conventions():
    cfg = model.config_for("vanilla", 2, width_per_depth=32, head_dim=16, seq_len=64, vocab_size=257)
    got = bench.mfu(cfg, 1, tokens_per_second=1000.0, peak=1e9)
    extra = model.executed_blocks(cfg, 1) * cfg.n_head * cfg.head_dim * (12 * cfg.seq_len - 6 * (cfg.seq_len + 1))
    assert got["mfu_causal_half"] == pytest.approx(model.flops_per_token(cfg, 1) * 1000 / 1e9)
    assert got["mfu_full_attention"] - got["mfu_causal_half"] == pytest.approx(extra * 1000 / 1e9)
    assert bench.mfu(cfg, 1, 1000.0, None) == dict(mfu_causal_half=None, mfu_full_attention=None)
    assert set(got) == {f"mfu_{name}" for name in arms.MFU_CONVENTIONS}


def test_a_growth_sections_step_time_comes_from_steps_after_growth_only():
    grow = types.SimpleNamespace(crossover_step=8)
    assert bench.timed_window([1.0] * 20, grow) == (10, 20, "after growth")
    assert bench.timed_window([1.0] * 10, grow) == (9, 10, "after growth")  # one step after the growth step
    assert bench.timed_window([1.0] * 9, grow) == (2, 8, "before growth")  # cut at its cap: no mixed window
    assert bench.timed_window([1.0] * 5, types.SimpleNamespace(crossover_step=None)) == (2, 5, "whole run")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def locked(path):
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process tree from /proc")
def test_a_stopped_gpu_smoke_stops_its_torchrun_and_workers_and_releases_the_run_lock(tmp_path):
    out = tmp_path / "smoke"
    proc = subprocess.Popen([sys.executable, "bench.py", "--gpu-smoke", "--cpu-exercise", "--device-batch-size", "2",
                             "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lock, deadline = out / "runs" / "default" / "train.lock", time.time() + 120
    while not (lock.exists() and locked(lock)) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert lock.exists() and locked(lock), "the first launch never took its run lock"
    tree = common.process_tree(proc.pid)
    assert len(tree) >= 4  # bench.py, torchrun, two workers
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("bench.py: stopped by SIGTERM"), err
    assert not [pid for pid in tree if alive(pid)] and not locked(lock)
    result = json.loads((out / "gpu_smoke.json").read_text())
    assert result["verdict"] == "failed" and "SIGTERM" in result["errors"]["stopped"]
