"""bench.py: achieved FLOP/s and MFU against the roofline, the arm ratios from interleaved rounds, its command line."""
import pytest
import torch

import bench
import model
import train


def test_bench_prints_achieved_flops_roofline_fraction_and_mfu_per_arm(capsys):
    args = bench.parse_args(["--depth", "1", "--bench-steps", "1", "--bench-repeats", "1", "--peak-flops", "1e12",
                             "--seq-len", "32", "--device-batch-size", "4"])
    results = bench.bench(args, torch.device("cpu"))
    out = capsys.readouterr().out
    roofline = float(out.split("roofline: ")[1].split(" GFLOP/s")[0].replace(",", "")) * 1e9
    for arch in bench.BENCH_ARMS:
        line = next(line for line in out.splitlines() if line.startswith(arch + " "))
        assert "GFLOP/s" in line and "% of roofline" in line and "| MFU " in line
        r = results[arch]
        cfg = train.make_plan(bench.plan_args(args, arch, 1)).model_config
        assert r["flops_per_second"] == pytest.approx(model.flops_per_token(cfg, cfg.passes) * r["tokens_per_second"])
        assert r["mfu"] == pytest.approx(r["flops_per_second"] / 1e12)
        assert 0 < r["roofline_fraction"] == pytest.approx(r["flops_per_second"] / roofline, rel=2e-3)
    assert "operator_1/vanilla = " in out and "untied_2/loop_2 = " in out and "T 32" in out


def test_bench_rounds_interleave_a_roofline_sample_and_one_step_of_every_arm(monkeypatch):
    calls, real_timed_step = [], bench.timed_step
    monkeypatch.setattr(bench, "matmul_roofline", lambda device: calls.append("roofline") or 1e9)

    def logged(arm):
        calls.append(arm.run.plan.model_config.arch)
        return real_timed_step(arm)
    monkeypatch.setattr(bench, "timed_step", logged)
    args = bench.parse_args(["--depth", "1", "--seq-len", "32", "--device-batch-size", "2"])
    arms, repetitions = bench.interleaved_arms(args, torch.device("cpu"), steps=2, repeats=2)
    assert all(arm.run.plan.tokens_per_step == 64 for arm in arms.values())  # one micro-batch of 2 per step
    assert calls[:4] == list(bench.BENCH_ARMS)  # the untimed warm-up step of each
    rounds = [calls[4 + 5 * k: 9 + 5 * k] for k in range(4)]
    assert len(calls) == 4 + 5 * 4
    for k, r in enumerate(rounds):  # each round: a roofline sample, then every arm once, the order rotated by one
        assert r[0] == "roofline" and r[1:] == list(bench.BENCH_ARMS[k % 4:] + bench.BENCH_ARMS[:k % 4])
    assert all(rep["roofline"] == 1e9 and all(rep[arch] > 0 for arch in bench.BENCH_ARMS) for rep in repetitions)
    per_repetition = [r["untied_2"] / r["loop_2"] for r in repetitions]
    assert bench.step_ratios(repetitions)["untied_2_over_loop_2"] == pytest.approx(sum(per_repetition) / 2)  # median


@pytest.mark.parametrize("argv, message", [
    (["--bench-repeats", "0"], "--bench-repeats: must be a whole number in [1, 1000], got '0'"),
    (["--tpp", "-1"], "argument --tpp: must be a finite number in (0, inf), got '-1'"),  # train.py's flags checked
    (["--resume"], "--resume is for training runs (train.py); drop it for bench.py"),  # was silently ignored
    (["--arch=loop_2"], "--arch is for training runs (train.py); drop it for bench.py"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert bench.main(["--preset", "cpu", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench.py: error:") and message in lines[0], lines


def test_torchrun_launch_is_refused_before_any_process_group(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "8")  # what torchrun sets for each of 8 processes
    assert bench.main(["--depth", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "runs in one process; start it with python, not torchrun" in lines[0], lines
    assert not torch.distributed.is_initialized()
