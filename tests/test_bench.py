"""bench.py: achieved FLOP/s against the roofline, the arm ratios, the GPU acceptance check (--gpu-check) in its tiny
CPU mode (sections, time caps, skips), the GPU smoke run (--gpu-smoke) on 2 gloo processes, and its command line. Its
plans on real GPUs: tests/test_plan.py's first-contact matrix."""
import json
import math
import os
import types

import pytest
import torch

import arms
import bench
import model
import plan
import train


def test_bench_prints_achieved_flops_roofline_and_fraction_per_arm(capsys):
    args = bench.parse_args(["--depth", "2", "--bench-steps", "1", "--bench-repeats", "1"])
    results = bench.bench(args)
    out = capsys.readouterr().out
    roofline = float(out.split("roofline: ")[1].split(" GFLOP/s")[0].replace(",", "")) * 1e9
    assert roofline > 0
    for arch in bench.BENCH_ARMS:
        line = next(l for l in out.splitlines() if l.startswith(arch + " "))
        assert "GFLOP/s" in line and "% of roofline" in line
        r = results[arch]
        cfg = train.make_plan(argparse_with(bench.parse_args(["--depth", "2"]), arch=arch)).model_config
        assert r["flops_per_second"] == pytest.approx(model.flops_per_token(cfg, cfg.passes) * r["tokens_per_second"])
        assert 0 < r["roofline_fraction"] == pytest.approx(r["flops_per_second"] / roofline, rel=2e-3)
    assert "operator_1/vanilla = " in out and "untied_2/loop_2    = " in out and "not counted" in out


def test_bench_shape_d6w384_sets_depth_width_head_dim_and_vocab():
    args = bench.parse_args(["--bench-shape", "d6w384", "--preset", "cpu"])
    cfg = train.make_plan(argparse_with(args, arch="vanilla")).model_config
    assert (cfg.depth, cfg.width, cfg.head_dim, cfg.seq_len, cfg.vocab_size) == (6, 384, 64, 256, 50257)
    args = bench.parse_args(["--bench-shape", "d6w384", "--preset", "cpu", "--depth", "4"])
    assert args.depth == 4  # an explicit flag wins over the shape's


def argparse_with(args, **changes):
    return types.SimpleNamespace(**{**vars(args), **changes})


def test_gpu_peak_lookup(monkeypatch):
    cuda = torch.device("cuda", 0)
    for name, peak in [("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                       ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200 NVL", 835e12),
                       ("Tesla T4", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert train.gpu_peak_flops(cuda) == peak
    assert train.gpu_peak_flops(cuda, 1e15) == 1e15 and train.gpu_peak_flops(torch.device("cpu")) is None


def test_a_compiled_models_weights_outlive_it_until_release_memory():
    """block.compile() keeps a compiled wrapper that refers back to the block: after the last reference to a compiled
    model goes, its weights stay (on a GPU, in the next gpu-check section's peak) until the garbage collector runs."""
    import weakref
    cfg = model.config_for("vanilla", 1, width_per_depth=16, head_dim=16, seq_len=16, vocab_size=257,
                           mlp_multiple=16)
    net = model.GPT(cfg)
    for block in net.transformer.h:
        block.compile(backend="eager")
    weight = weakref.ref(net.transformer.h[0].attn.c_q.weight)
    del net, block
    assert weight() is not None  # the cycle keeps it
    bench.release_memory(torch.device("cpu"))
    assert weight() is None


def test_gpu_check_tiny_cpu_mode_writes_every_section(tmp_path, monkeypatch):
    out = tmp_path / "gpu_check.json"
    released, release = [], bench.release_memory
    monkeypatch.setattr(bench, "release_memory", lambda device: (released.append(device), release(device)))
    assert bench.main(["--gpu-check", "--cpu-exercise", "--out", str(out)]) == 5  # incomplete: no GPU
    assert len(released) >= len(bench.GPU_CHECK["cpu"]["caps"])  # after every section, so the next one starts clean
    result = json.loads(out.read_text())
    assert result["errors"] == {} and list(result["skipped"]) == ["gpu"] and result["tokens"].startswith("synthetic")
    assert result["verdict"] == "incomplete" and result["misses"] == [] and "vanilla.mfu_causal_half" in \
        result["unmeasured"]
    sections = list(bench.GPU_CHECK["cpu"]["caps"])
    assert [key for key in result if key in sections] == sections  # written in the order they ran
    assert result["roofline"]["flops_per_second"] > 0
    for name, arch in [("vanilla", "vanilla"), ("untied_grow_eager", "untied_grow"), ("untied_grow", "untied_grow")]:
        run = result[name]
        assert run["arch"] == arch and run["steps_run"] == 3 and math.isfinite(run["final_loss"])
        assert run["tokens_per_second"] > 0 and run["step_seconds"] > 0 and run["predicted_peak_bytes"] > 0
        assert run["mfu_causal_half"] is None and run["mfu_full_attention"] is None  # CPU: no peak
        assert run["max_memory_allocated_bytes"] is None  # nor a CUDA allocator
        assert not run["stopped_at_cap"] and run["memory_snapshot"] is None  # snapshots are CUDA's
        assert run["attention_backend"] == "flash"  # auto's first backend a CPU runs: its flash kernel
        assert run["loss_seconds"] > 0 and 0 < run["loss_share"] < 1  # the loss's forward and backward in a step
    for name in ("untied_grow_eager", "untied_grow"):
        assert result[name]["growth_events"] == [dict(step=1, passes_from=2, passes_to=4, reset_parameters=14)]
    assert result["untied_grow"]["final_loss"] == pytest.approx(result["untied_grow_eager"]["final_loss"], rel=1e-5)
    ratios = result["ratios"]
    assert set(ratios["step_seconds"]) == set(bench.BENCH_ARMS)
    assert ratios["operator_1_over_vanilla"] > 0 and ratios["untied_2_over_loop_2"] > 0
    # a CPU's step-time ratios are recorded, not gated against the GPU's targets (they missed by chance on a busy host)
    assert {m: g["met"] for m, g in ratios["gates"].items()} == dict(operator_1_over_vanilla=None,
                                                                    untied_2_over_loop_2=None)
    assert "ratios.operator_1_over_vanilla" in result["unmeasured"]
    core = result["core_scoring"]
    assert core["source"] == "synthetic" and len(core["tasks"]) == 3 and core["attention"] == "default"
    assert core["max_nll_difference"] < 1e-4 and core["max_accuracy_difference"] == 0
    assert core["max_nll_difference_from_math"] < 1e-4 and set(core["differences_from_math"]) == set(
        bench.core_eval.SCORING)
    assert all(gate["met"] for gate in core["gates"].values())


def test_core_scoring_on_a_kernel_that_disagrees_with_math_is_missed(monkeypatch):
    """A fused attention kernel that is wrong (here: whenever SDPA may pick flash, its output 1 % too large) moves the
    answer NLLs away from the math backend's; the gate says missed and names the measurement."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def wrong_unless_math(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        return out * 1.01 if torch.backends.cuda.flash_sdp_enabled() else out  # sdpa_kernel([MATH]) disables flash
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", wrong_unless_math)
    args = bench.parse_args(["--gpu-check", "--cpu-exercise"])
    out = dict(device="cpu", errors={}, skipped={}, core_scoring=bench.check_core_scoring(args, torch.device("cpu"), 3))
    assert out["core_scoring"]["max_nll_difference"] < 1e-4  # the scoring paths agree with each other
    assert arms.gate("gpu_check", out, "fp32") == "missed"
    assert out["misses"] == ["core_scoring.max_nll_difference_from_math"]


def test_gpu_check_records_a_failed_section_and_goes_on_and_stops_a_section_at_its_cap(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(bench, "check_ratios", broken)
    monkeypatch.setattr(bench, "check_core_scoring", broken)
    recipe = bench.GPU_CHECK["cpu"]
    monkeypatch.setitem(bench.GPU_CHECK, "cpu", dict(recipe, steps=2, crossover_step=1,
                                                     caps=dict(recipe["caps"], untied_grow_eager=0)))
    out = tmp_path / "gpu_check.json"
    assert bench.main(["--gpu-check", "--cpu-exercise", "--out", str(out)]) == 1
    result = json.loads(out.read_text())
    assert result["verdict"] == "failed" and result["errors"] == {"ratios": "RuntimeError: out of memory", "core_scoring": "RuntimeError: out of memory"}
    assert result["ratios"] is None and result["vanilla"]["tokens_per_second"] > 0
    assert result["untied_grow_eager"]["stopped_at_cap"] and result["untied_grow_eager"]["steps_run"] == 1
    assert not result["untied_grow"]["stopped_at_cap"] and result["untied_grow"]["steps_run"] == 2


def test_gpu_check_skips_sections_past_its_time_budget(tmp_path, monkeypatch):
    monkeypatch.setitem(bench.GPU_CHECK, "cpu", dict(bench.GPU_CHECK["cpu"], budget_seconds=-1))
    out = tmp_path / "gpu_check.json"
    assert bench.main(["--gpu-check", "--cpu-exercise", "--out", str(out)]) == 5
    result = json.loads(out.read_text())
    assert result["verdict"] == "incomplete" and result["errors"] == {}
    assert list(result["skipped"]) == ["gpu", *bench.GPU_CHECK["cpu"]["caps"]]
    assert all(result[name] is None and "budget" in result["skipped"][name] for name in bench.GPU_CHECK["cpu"]["caps"])


def test_bench_rounds_interleave_a_roofline_sample_and_one_step_of_every_arm(monkeypatch):
    calls, real_timed_steps = [], bench.timed_steps
    monkeypatch.setattr(bench, "matmul_roofline", lambda device, **kw: calls.append("roofline") or 1e9)

    def logged(arm, steps, *timer):
        calls.append(arm.run.plan.model_config.arch)
        return real_timed_steps(arm, steps, *timer)
    monkeypatch.setattr(bench, "timed_steps", logged)
    args = bench.parse_args(["--depth", "2"])
    arms, repetitions = bench.interleaved_arms(args, torch.device("cpu"), 2, steps=3, repeats=2)
    assert calls[:4] == list(bench.BENCH_ARMS)  # the untimed warm-up step of each
    rounds = [calls[4 + 5 * k: 9 + 5 * k] for k in range(6)]
    assert len(calls) == 4 + 5 * 6
    for k, r in enumerate(rounds):  # each round: a roofline sample, then every arm once, the order rotated by one
        assert r[0] == "roofline" and r[1:] == list(bench.BENCH_ARMS[k % 4:] + bench.BENCH_ARMS[:k % 4])
    for rep in repetitions:
        assert rep["roofline"] == 1e9
        for arch in bench.BENCH_ARMS:  # the model part is the step less its timed optimizer steps
            assert 0 < rep[arch + " model"] < rep[arch]
    per_repetition = [r["untied_2"] / r["loop_2"] for r in repetitions]
    assert bench.step_ratios(repetitions)["untied_2_over_loop_2"] == pytest.approx(sum(per_repetition) / 2)  # median


@pytest.mark.parametrize("argv, message", [
    (["--bench-repeats", "0"], "--bench-repeats: must be a whole number in [1, 1000], got '0'"),
    (["--gpu-check", "--cpu-exercise", "--bundle-dir", "/nonexistent/bundle"], "not a directory"),
    (["--gpu-check", "--cpu-exercise", "--out", "README.md"], "already exists"),
    (["--dry-run"], "python train.py --arch A --depth D --dry-run"),
    (["--no-verify"], "--no-verify is for training runs (train.py); drop it for bench.py"),
    (["--gpu-check", "--cpu-exercise", "--memory-snapshots", "/nonexistent/dir"], "not a directory"),
    (["--gpu-check", "--cpu-exercise", "--device", "cuda"], "--cpu-exercise runs on the CPU; drop --device cuda"),
    (["--cpu-exercise"], "--cpu-exercise is read only by --gpu-check or --gpu-smoke"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert bench.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench.py: error:") and message in lines[0], lines



def test_compile_time_reports_whole_model_and_regional_compilation(monkeypatch, capsys):
    """--compile-time at a tiny shape (Dynamo's eager backend instead of inductor, which takes minutes per graph on 2
    cores): both modes from a cold cache through growth; the whole model compiles a graph per pass stage, the blocks
    share one and the loss's chunks another."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **dict(kw, backend="eager")))
    args = bench.parse_args(["--compile-time", "--depth", "1", "--seq-len", "32", "--total-batch-tokens", "128",
                             "--bench-steps", "1"])
    results = bench.compile_time(args)
    out = capsys.readouterr().out
    assert (results["whole"]["graphs"], results["regional"]["graphs"]) == (2, 2)
    for mode in ("whole", "regional"):
        r = results[mode]
        assert r["first_step_seconds"] > 0 and r["steady_step_seconds"] > 0 and r["steady_step_seconds_grown"] > 0
        assert r["compile_seconds"] == pytest.approx(r["first_step_seconds"] - r["steady_step_seconds"])
        assert math.isfinite(r["final_loss"]) and f"{mode:8s} | cold compile" in out
    assert "untied_grow d1" in out and "K (2, 4)" in out


@pytest.mark.parametrize("argv", [["--depth", "2"], ["--gpu-check", "--device", "cpu", "--preset", "cpu"]])
def test_torchrun_launch_is_refused_before_any_process_group(argv, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "8")  # what torchrun sets for each of 8 processes
    assert bench.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "runs in one process; start it with python, not torchrun" in lines[0], lines
    assert not torch.distributed.is_initialized()


def smoke_flags(monkeypatch):
    """train.py's --dist-timeout, passed only where its parser has it."""
    options = train.build_parser()._option_string_actions
    for name in ("SHORT_TIMEOUT",):
        if getattr(bench, name)[0] not in options:
            monkeypatch.setattr(bench, name, [])


SMOKE_ARGV = ["--gpu-smoke", "--cpu-exercise", "--device-batch-size", "2"]


def test_gpu_smoke_on_two_gloo_processes(tmp_path, monkeypatch):
    """--gpu-smoke as on a GPU node, on CPU: 2 torchrun processes with gloo at the cpu preset (4 micro-batches per
    rank, so the sharded transport reduces each one) start Untied-Grow and stop at step 2 with a checkpoint; both
    transports resume it through the growth at step 3 to the end; 2 torchrun "nodes" of 1 process run the same steps
    (their collectives cross the nodes: tests/smoke_defects.py's trace), and all three match the one-process
    reference; the one-GPU part is skipped, so the verdict is incomplete (exit 5), never passed."""
    smoke_flags(monkeypatch)
    monkeypatch.setattr(bench, "SMOKE_TRAINER", os.path.join("tests", "smoke_defects.py"))
    monkeypatch.setenv("SMOKE_DEFECT", "trace")
    monkeypatch.setenv("SMOKE_TRACE_DIR", str(tmp_path))
    out = tmp_path / "smoke"
    assert bench.main([*SMOKE_ARGV, "--out", str(out)]) == 5
    result = json.loads((out / "gpu_smoke.json").read_text())
    memory_gates = ["checks.memory_measured_over_predicted", "checks.outside_allocator_over_predicted"]
    assert result["verdict"] == "incomplete" and result["misses"] == [] and result["unmeasured"] == memory_gates
    assert result["processes"] == 2 and list(result["skipped"]) == ["gpu_check"] and result["errors"] == {}
    launches = result["launches"]
    assert list(launches) == ["start", "resume_default", "resume_sharded", "multinode", "reference"]
    assert all(launch["returncode"] == 0 and not launch["timed_out"] for launch in launches.values())
    assert "--stop-after 2" in launches["start"]["command"] and "--nproc_per_node 2" in launches["start"]["command"]
    assert "--nproc_per_node 1" in launches["reference"]["command"]
    assert launches["resume_sharded"]["command"].endswith("--resume")
    for node in (0, 1):
        assert f"--nnodes 2 --nproc_per_node 1 --node_rank {node} --master_addr 127.0.0.1" in \
            launches["multinode"]["command"]
    for name, run in result["runs"].items():
        assert run["status"] == "complete" and len(run["losses"]) == 6 and run["growth_events"][0]["step"] == 3
        assert run["world_size"] == (1 if name == "reference" else 2)
        assert run["memory"]["stages"][0]["accumulation"] == (8 if name == "reference" else 4)
    # the multi-node layout: one process per node, its collectives on groups whose ranks sit on both nodes
    ranks = [json.loads((tmp_path / f"multinode_rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["local_world_size"], r["world_size"], r["node"]) for r in ranks] == [("1", 2, "0"), ("1", 2, "1")]
    for r in ranks:  # on 2 nodes of 1 a group of 2 ranks is a cross-node group (an HSDP mesh's replicate groups too)
        crossing = [name for name, group in r["used"] if group == [0, 1]]
        assert "all_reduce" in crossing and [0, 1] in r["created"], r  # the loss's and HSDP's gradient all-reduce
        assert all(len(group) == 1 or group == [0, 1] for group in r["created"] + [g for _, g in r["used"]])
    # every rank's memory per pass stage and invocation (the CPU's resident set), beside the planner's for its ranks
    spans = lambda name: [(m["stage"], m["steps"]) for m in result["runs"][name]["memory_measured"]]
    assert spans("default") == spans("sharded") == [(0, [0, 2]), (0, [2, 3]), (1, [3, 6])]
    assert spans("multinode") == spans("reference") == [(0, [0, 3]), (1, [3, 6])]
    for name, run in result["runs"].items():
        for m in run["memory_measured"]:
            assert len(m["ranks"]) == m["world_size"] and all(r["max_rss"] >= r["rss"] > 0 for r in m["ranks"])
            assert m["predicted_outside_allocator_bytes"] == plan.CUDA_CONTEXT_BYTES + (
                plan.NCCL_BUFFER_BYTES if m["world_size"] > 1 else 0)
    default, sharded = result["runs"]["default"]["losses"], result["runs"]["sharded"]["losses"]
    assert default[:3] == sharded[:3]
    checks = result["checks"]
    assert checks["grew_at_step"] == [3, 3, 3, 3] and checks["first_resumed_loss_equal"]
    assert len(checks["gates"]) == len([t for t in arms.TARGETS if t.run == "gpu_smoke"])
    assert all(gate["met"] is (None if f"checks.{name}" in memory_gates else True)
               for name, gate in checks["gates"].items())
    assert checks["gates"]["multinode_weights_vs_reference"]["target"] == "<= 0.02"  # fp32's


@pytest.mark.parametrize("defect, caught", [
    ("grad_scale", ["default_vs_reference", "default_weights_vs_reference"]),
    ("rank0_data", ["default_vs_reference", "default_weights_vs_reference"])])
def test_gpu_smoke_catches_a_defect_every_rank_shares(defect, caught, tmp_path, monkeypatch):
    """tests/smoke_defects.py in place of train.py: rank 1's gradients x world before any reduction, or every rank
    reading rank 0's windows. Both ranks share the defect, so no comparison between distributed runs sees it (the
    smoke before the one-process reference said passed); the reference does, and the smoke says missed (exit 4).
    Two launches keep it short: the same steps on 2 processes and on one."""
    smoke_flags(monkeypatch)
    monkeypatch.setattr(bench, "SMOKE_TRAINER", os.path.join("tests", "smoke_defects.py"))
    monkeypatch.setattr(bench, "smoke_launches",
                        lambda: [("whole", (1, 2), "default", []), ("reference", (1, 1), "reference", [])])
    monkeypatch.setenv("SMOKE_DEFECT", defect)
    out = tmp_path / "smoke"
    assert bench.main([*SMOKE_ARGV, "--out", str(out)]) == 4
    result = json.loads((out / "gpu_smoke.json").read_text())
    assert result["verdict"] == "missed" and result["misses"] == [f"checks.{name}" for name in caught]
    gates = result["checks"]["gates"]
    assert gates["default_weights_vs_reference"]["value"] > 0.2  # ten times the tolerance
    assert gates["complete"]["met"] and gates["finite"]["met"] and gates["grew_at_crossover"]["met"]


def test_a_second_gpu_smoke_into_the_folder_another_one_is_using_is_refused(tmp_path, monkeypatch, capsys):
    """Two --gpu-smoke into one folder 0.5 s apart both passed the "not empty" check (the first had not written yet)
    and wrote over each other. Here the second starts while the first is in its runs: it is refused, one line."""
    out, started, second = tmp_path / "smoke", [], []

    def runs_while_another_starts(args, device, gpus, out_dir, out_record, path):
        if not started:
            started.append(out_dir)
            second.append(bench.main([*SMOKE_ARGV, "--out", str(out)]))
    monkeypatch.setattr(bench, "smoke_parts", runs_while_another_starts)
    bench.main([*SMOKE_ARGV, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert second == [2] and any("--out" in line and "not an empty folder" in line for line in err), err
    assert sorted(os.listdir(out)) == ["gpu_smoke.json", "gpu_smoke.md"]  # the first run's alone
