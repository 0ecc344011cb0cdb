"""Tests for plan.py: the plan against the release's per-run values (tests/data/spec_plans.csv) and its compute
column, the schedules, the micro-batch (the arms table's rule, the CUDA probe's halving) and the dry run's GPU-hours."""
import csv
import json
import math
import os
import types

import pytest
import torch

import arms
import plan as plan_lib
import train
from common import UsageError
from plan import lr_multiplier, passes_at, wsd_multiplier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_ROWS = list(csv.DictReader(open(os.path.join(ROOT, "tests", "data", "spec_plans.csv"))))
LADDER_ROWS = list(csv.DictReader(open(os.path.join(ROOT, "reference", "fineweb_ladders.csv"))))


def plan_for(*argv):
    return train.make_plan(train.parse_args(list(argv)))


# The plan and its schedules

@pytest.mark.parametrize("row", SPEC_ROWS, ids=lambda r: f"{r['arch']}_d{r['depth']}")
def test_plan_matches_spec_table(row):
    plan = plan_for("--arch", row["arch"], "--depth", row["depth"]).as_dict()
    for key in ("width", "heads", "mlp_hidden", "params_tpp", "params_stored", "steps", "train_token_limit",
                "flops_per_token_final"):
        assert plan[key] == int(row[key]), key
    assert plan["crossover_step"] == (int(row["crossover_step"]) if row["crossover_step"] else None)
    for key in ("matrix_lr", "embedding_lr", "unembedding_lr"):  # the table prints 6 significant figures
        assert float(f"{plan[key]:.6g}") == float(row[key]), key
    assert plan["total_flops"] == pytest.approx(float(row["total_flops"]), rel=1e-6)


def test_total_flops_match_all_58_release_ladder_rows():
    assert len(LADDER_ROWS) == 58
    for row in LADDER_ROWS:
        plan = plan_for("--arch", row["arm"], "--depth", row["depth"])
        assert plan.total_flops == pytest.approx(float(row["compute_flops"]), rel=1e-6), row


def test_worked_examples_exact():
    vanilla = plan_for("--arch", "vanilla", "--depth", "8")
    assert vanilla.embedding_lr == pytest.approx(0.01810193359836, rel=1e-12)
    assert vanilla.total_flops == 1_055_750_772_932_739_072
    grow = plan_for("--arch", "untied_grow", "--depth", "8")
    assert (grow.steps, grow.crossover_step) == (3341, 2372)
    assert grow.total_flops == 2_542_244_965_958_811_648
    # Deep Vanilla Grow (INFERRED schedule, docs/recipe.md)
    inferred = {6: (1334, 667), 8: (2330, 1165), 10: (3835, 1917), 12: (5729, 2864), 14: (8539, 4269),
                16: (12236, 6118), 18: (16349, 8174)}
    for d, expected in inferred.items():
        p = plan_for("--arch", "deep_vanilla_grow", "--depth", str(d))
        assert (p.steps, p.crossover_step) == expected


def test_data_constrained_plan():
    p = plan_for("--arch", "operator_1", "--depth", "8", "--data-constrained", "tuned-wd", "--passes", "4")
    assert p.steps == 1900 and p.epochs == 10 and p.train_token_limit == 100_000_000
    assert p.matrix_lr == 0.04 and p.weight_decay == 0.8 and p.passes_final == 4
    assert plan_for("--arch", "operator_1", "--depth", "12", "--data-constrained", "tuned-wd").weight_decay == 1.2
    assert plan_for("--arch", "operator_1", "--depth", "12", "--data-constrained", "fixed-wd").matrix_lr == 0.04


def test_wsd_schedule_examples():
    # Vanilla d8: S = 1962, W = 40, r = 0.6 -> decay from step 785, 0 on the last step.
    plan = plan_for("--arch", "vanilla", "--depth", "8")
    m = [lr_multiplier(i, plan) for i in range(plan.steps)]
    assert m[0] == 1 / 40 and m[39] == m[784] == m[785] == 1.0 and m[786] < 1.0 and m[-1] == 0.0
    op1 = plan_for("--arch", "operator_1", "--depth", "8")
    m = [lr_multiplier(i, op1) for i in range(op1.steps)]
    assert m[0] == 1.0 and m[471] == 1.0 and m[472] < 1.0 and m[-1] == 0.0


def test_growth_rewarm_and_passes():
    plan = plan_for("--arch", "untied_grow", "--depth", "8")
    c = plan.crossover_step
    assert lr_multiplier(c, plan) == 0.0
    assert lr_multiplier(c + 1, plan) == pytest.approx(wsd_multiplier(c + 1, 3341, 40, 1.0) / 40)
    assert lr_multiplier(c + 40, plan) == wsd_multiplier(c + 40, 3341, 40, 1.0)
    assert [passes_at(s, plan) for s in (0, c - 1, c, plan.steps - 1)] == [2, 2, 4, 4]


def test_staged_and_random_recurrence_plans():
    staged = plan_for("--arch", "untied_grow", "--depth", "8", "--pass-stages", "2", "4", "6",
                      "--crossover-fractions", "0.5", "0.75")
    s = staged.steps
    assert staged.crossover_steps == (math.floor(0.5 * s), math.floor(0.75 * s))
    assert staged.passes_final == 6 and staged.model_config.passes_initial == 2
    rand = plan_for("--arch", "loop_grow", "--depth", "8", "--random-passes", "2", "3", "4", "5", "6")
    after = [passes_at(i, rand) for i in range(rand.crossover_step, rand.steps)]
    assert set(after) == {2, 3, 4, 5, 6} and rand.passes_final == 4
    assert rand.total_flops != plan_for("--arch", "loop_grow", "--depth", "8").total_flops


# The micro-batch: the arms table's rule, the preset's on CPU, the flag; on CUDA halved while the largest stage fails

@pytest.mark.parametrize("row", SPEC_ROWS, ids=lambda r: f"{r['arch']}_d{r['depth']}")
def test_micro_batch_rule_is_the_releases_device_batch(row):
    """The release's device batch per run (its run tables; d26: 2 after growth, the run's largest stage) on its 8 GPUs
    per node (d26: 2 nodes)."""
    plan = plan_for("--arch", row["arch"], "--depth", row["depth"])
    world = 16 if plan.depth == 26 else 8
    assert plan_lib.device_batch_size(plan, world, "cuda") == int(row["device_batch_cutoff"].split("/")[0].split()[0])


def test_micro_batch_on_cpu_from_the_flag_and_capped_at_the_sequences_per_rank():
    cpu = plan_for("--arch", "vanilla", "--depth", "2", "--preset", "cpu")  # 16 sequences per step
    assert plan_lib.device_batch_size(cpu, 1, "cpu") == arms.PRESETS["cpu"].device_batch_size == 16
    assert plan_lib.device_batch_size(cpu, 4, "cpu") == 4 and plan_lib.device_batch_size(cpu, 1, "cpu", 8) == 8
    with pytest.raises(UsageError, match="--device-batch-size 3 does not divide the 16 sequences per rank"):
        plan_lib.device_batch_size(cpu, 1, "cpu", 3)
    with pytest.raises(UsageError, match="16 sequences per step do not split over 3 ranks"):
        plan_lib.device_batch_size(cpu, 3, "cpu")


def fake_cuda_run(plan, batch, given=None):  # what probe_micro_batch reads of a train.Run, on the CPU
    return types.SimpleNamespace(plan=plan, world=1, master=True, device=torch.device("cpu"), memory=None,
                                 micro_batches=(batch,) * len(plan.pass_stages), args=types.SimpleNamespace(
                                     device_batch_size=given))


def test_probe_halves_the_micro_batch_on_out_of_memory_keeping_the_global_batch(monkeypatch, capsys):
    """A forward at more than 4 sequences raises torch.OutOfMemoryError (as CUDA's allocator would): 16 -> 8 -> 4, at
    the largest stage (K = 4 of untied_grow), the accumulation doubling each time; the peak is recorded."""
    plan = plan_for("--arch", "untied_grow", "--depth", "2", "--preset", "cpu")
    net = train.model_lib.GPT(plan.model_config)
    seen, forward = [], train.model_lib.GPT.forward

    def small_gpu(self, idx, *args, **kwargs):
        seen.append((idx.size(0), kwargs["passes"]))
        if idx.size(0) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return forward(self, idx, *args, **kwargs)
    monkeypatch.setattr(train.model_lib.GPT, "forward", small_gpu)
    for name in ("reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 3 * 2 ** 30)
    monkeypatch.setattr(train, "gather", lambda value: [value])
    run = fake_cuda_run(plan, 16)
    train.probe_micro_batch(run, net)
    assert seen == [(16, 4), (8, 4), (4, 4)] and run.micro_batches == (4, 4)
    assert run.memory["stages"] == [dict(passes=k, micro_batch=4, accumulation=4) for k in (2, 4)]
    assert run.memory["probe_peak_bytes"] == 3 * 2 ** 30 and "micro-batch 4" in capsys.readouterr().out
    assert all(p.grad is None for p in net.parameters())  # the probe trains nothing
    with pytest.raises(torch.OutOfMemoryError):  # --device-batch-size is the user's: never halved
        train.probe_micro_batch(fake_cuda_run(plan, 8, given=8), net)


# GPU-hours: FLOPs at the MFU the release measured at the run's width

def test_gpu_hours_at_the_releases_mfu_per_width_with_its_leave_one_width_out_error():
    table = train.release_mfu_by_width()
    assert sorted(table) == [128 * d for d in (6, 8, 10, 12, 14, 16, 18, 20)]
    assert all(0.3 < m < 0.6 for m in table.values())
    assert train.mfu_at(1024, table) == table[1024] and train.mfu_at(4096, table) == table[2560]
    assert train.mfu_at(1152, table) == pytest.approx((table[1024] + table[1280]) / 2)
    misses = [abs(train.mfu_at(w, {k: v for k, v in table.items() if k != w}) - table[w]) for w in table]
    assert train.leave_one_width_out_error() == max(misses) > 0
    plan = plan_for("--arch", "vanilla", "--depth", "12")
    estimate = train.gpu_hours_estimate(plan)
    assert estimate["gpu_hours"] == pytest.approx(plan.total_flops / (989e12 * table[1536]) / 3600, rel=1e-3)
    assert train.gpu_hours_estimate(plan, 0.5)["gpu_hours"] == pytest.approx(
        plan.total_flops / (989e12 * 0.5) / 3600, rel=1e-3)


def test_dry_run_prints_the_micro_batch_and_the_gpu_hour_estimate(capsys):
    assert train.main(["--arch", "untied_grow", "--depth", "12", "26", "--dry-run"]) == 0
    d12, d26 = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (d12["device_batch_size"], d26["device_batch_size"]) == (16, 2)
    assert d26["gpu_hours"]["gpu_hours"] > d12["gpu_hours"]["gpu_hours"] > 0
    assert d12["gpu_hours"]["leave_one_width_out_error"] == round(train.leave_one_width_out_error(), 4)
