"""bench.py — step-time benchmark and GPU acceptance check of train.py's training step (train.py's flags apply too).

    python bench.py --depth 4                         # cpu preset: achieved GFLOP/s vs a matmul roofline, arm ratios
    python bench.py --bench-shape d6w384 --preset cpu
    python bench.py --gpu-check                       # one GPU: MFU, tok/s, memory vs model, ratios -> gpu_check.json
    python bench.py --compile-time --depth 8          # cold compile and step time, whole-model vs per-block compile

Both time train.py's own train_step on synthetic tokens (uniform random ids: no dataset, no network), with the
memory planner's micro-batch and torch.compile where a run would use it (CUDA; --compile on CPU). The bench runs
--bench-repeats repetitions of --bench-steps rounds, each round a roofline sample and one step of every arm (order
rotated), and prints medians, the optimizer steps' share of each step and the arm ratios with and without it; ratios
are the point, absolute numbers depend on the box.

    python -m pytest -q tests/test_bench.py
"""
import argparse
import contextlib
import math
import os
import random
import time
from statistics import median

import torch

import core_eval
import data
import model as model_lib
import train
from arms import BENCH_SHAPES, PRESETS
from common import UsageError, cli_main_distributed, exit_process, integer, setup_distributed, write_json
from plan import GIB, device_memory_plan, make_plan, memory_per_rank
from train import count_step, gpu_peak_flops, train_step, use_compile


BENCH_ARMS = ("vanilla", "operator_1", "loop_2", "untied_2")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def roofline_size(device):
    """The roofline's matrix size: 1024 on CPU, 4096 on CUDA, where a 1024^3 bf16 matmul is too small for the peak."""
    return 4096 if device.type == "cuda" else 1024


def matmul_roofline(device, size=None, calls=8, tries=5):
    """FLOP/s of a plain size^3 matmul loop (fp32 on CPU, bf16 on CUDA; size: roofline_size), best of `tries`: what
    this box can do."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = size or roofline_size(device)
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty_like(a)
    best = math.inf
    for _ in range(tries + 1):  # the first try warms up
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=out)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * size ** 3 * calls / best


class SyntheticLoader:
    """data.TrainLoader's batch() on uniform random token ids (seeded per step): the step's cost without a pool."""

    def __init__(self, vocab_size, seq_len, batch_seqs):
        self.vocab_size, self.seq_len, self.batch_seqs, self.steps_per_epoch = vocab_size, seq_len, batch_seqs, 10 ** 9

    def batch(self, step, rank, world):
        generator = torch.Generator().manual_seed(step)
        windows = torch.randint(0, self.vocab_size, (self.batch_seqs, self.seq_len + 1), generator=generator)
        per_rank = self.batch_seqs // world
        return 1, windows[rank * per_rank:(rank + 1) * per_rank]


def synthetic_plan(args, arch, depth, steps, crossover_step=None, total_batch_tokens=None):
    """make_plan for one timed arm: the preset's recipe at this depth, `steps` steps, growth forced at
    crossover_step, optionally another batch."""
    run_args = argparse.Namespace(**vars(args))
    run_args.arch, run_args.depth, run_args.steps = arch, depth, steps
    run_args.crossover_fractions = [crossover_step / steps] if crossover_step else None
    if total_batch_tokens:
        run_args.total_batch_tokens = total_batch_tokens
    return make_plan(run_args)


def synthetic_training(args, plan, device, random_init=False):
    """train.start_training for `plan` on one process, reading SyntheticLoader's batches at the memory planner's
    micro-batches; nothing is written to disk. random_init: every parameter N(0, 0.02), so that zero-initialised
    out-projections do not make a branch trivially cheap."""
    mem = device_memory_plan(args, plan, 1, device)
    loader = SyntheticLoader(plan.model_config.vocab_size, plan.seq_len, plan.tokens_per_step // plan.seq_len)
    training = train.start_training(train.new_run(args, plan, mem, 0, 1, device, loader))
    if random_init:
        for p in training.model.parameters():
            torch.nn.init.normal_(p, std=0.02)
    return training


class OptimizerClock:
    """train_step's optimizer_timer: adds the wall time of the optimizers' steps (synchronised on CUDA) to .seconds,
    so the bench splits a step into the model's forward and backward and the optimizer steps."""

    def __init__(self, device):
        self.device, self.seconds = device, 0.0

    def __enter__(self):
        synchronize(self.device)
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        synchronize(self.device)
        self.seconds += time.perf_counter() - self.start


def timed_steps(arm, steps, optimizer_timer=contextlib.nullcontext()):
    """`steps` more train_steps of `arm` (a train.Training) -> (per-step seconds: CUDA events on GPU, perf_counter on
    CPU; last loss)."""
    seconds, device, loss = [], arm.run.device, None
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        loss, passes, _, _ = train_step(arm, optimizer_timer)
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize(device)
            seconds.append(start.elapsed_time(end) / 1000)
        else:
            seconds.append(time.perf_counter() - t0)
        if not math.isfinite(loss):
            raise RuntimeError(f"non-finite loss {loss} at step {arm.state.step}")
        count_step(arm.run, arm.state, passes, seconds[-1])
    return seconds, loss


def interleaved_arms(args, device, depth, steps, repeats):
    """The four BENCH_ARMS at one shape, one micro-batch per step (--device-batch-size, else the planner's for a
    quarter of the device: all four stay resident), one untimed warm-up step each (compilation), then `repeats`
    repetitions of `steps` rounds. A round is one roofline sample and one step of every arm, the arm order rotated
    each round, so the arms and the roofline see the same state of a shared box (its speed drifts by tens of percent
    within minutes on a VM) -> (arms, per repetition {arch: median step seconds, "roofline": median FLOP/s})."""
    plan_args = argparse.Namespace(**vars(args))
    if device.type == "cuda" and not args.device_batch_size:
        total = args.gpu_memory or torch.cuda.get_device_properties(device).total_memory / GIB
        plan_args.gpu_memory = total / len(BENCH_ARMS)
    probe = synthetic_plan(plan_args, "vanilla", depth, 1)
    micro = device_memory_plan(plan_args, probe, 1, device).stages[0].micro_batch
    plan_args.device_batch_size = [micro]
    total_steps = 1 + repeats * steps  # the warm-up step and the timed ones
    arms = {arch: synthetic_training(plan_args, synthetic_plan(plan_args, arch, depth, total_steps,
                                                               total_batch_tokens=micro * probe.seq_len),
                                     device, random_init=True) for arch in BENCH_ARMS}
    for arm in arms.values():
        timed_steps(arm, 1)
    clocks = {arch: OptimizerClock(device) for arch in BENCH_ARMS}
    repetitions = []
    for rep in range(repeats):
        samples = {name: [] for name in (*BENCH_ARMS, *(a + " model" for a in BENCH_ARMS), "roofline")}
        for k in range(steps):
            samples["roofline"].append(matmul_roofline(device, tries=1))
            shift = (rep * steps + k) % len(BENCH_ARMS)
            for arch in BENCH_ARMS[shift:] + BENCH_ARMS[:shift]:
                before = clocks[arch].seconds
                seconds = timed_steps(arms[arch], 1, clocks[arch])[0][0]
                samples[arch].append(seconds)
                samples[arch + " model"].append(seconds - (clocks[arch].seconds - before))
        repetitions.append({name: median(values) for name, values in samples.items()})
    return arms, repetitions


def step_ratios(repetitions):
    """Operator-1/Vanilla and Untied-2/Loop-2 step-time ratios, of the whole step and of its model part (forward and
    backward: the step less the optimizer steps): the median over repetitions of each one's ratio."""
    ratio = lambda a, b, part="": median(r[a + part] / r[b + part] for r in repetitions)
    return dict(operator_1_over_vanilla=ratio("operator_1", "vanilla"),
                untied_2_over_loop_2=ratio("untied_2", "loop_2"),
                operator_1_over_vanilla_model=ratio("operator_1", "vanilla", " model"),
                untied_2_over_loop_2_model=ratio("untied_2", "loop_2", " model"))


def bench(args):
    """python bench.py: achieved FLOP/s per arm = model training FLOPs per token (model.flops_per_token: forward and
    backward, attention included; the optimizer steps' FLOPs NOT counted, their time is) x tokens / step time, against
    the roofline of the same rounds, and the step-time ratios Operator-1/Vanilla and Untied-2/Loop-2; every number is
    the median over the repetitions of that repetition's value."""
    rank, world, device = setup_distributed(args.device)
    if world > 1:
        raise UsageError("bench.py runs in one process; start it with python, not torchrun")
    depth = args.depth or PRESETS[args.preset].anchor_depth
    arms, repetitions = interleaved_arms(args, device, depth, args.bench_steps, args.bench_repeats)
    plan0 = arms["vanilla"].run.plan
    cfg0, micro = plan0.model_config, arms["vanilla"].run.micro_batches[0]
    dtype = "bf16" if device.type == "cuda" else "fp32"
    roofline = median(r["roofline"] for r in repetitions)
    print(f"bench: {args.preset} preset d{depth}, width {cfg0.width}, head_dim {cfg0.head_dim}, T {cfg0.seq_len}, "
          f"vocab {cfg0.vocab_size}, batch {micro}, {torch.get_num_threads()} threads, "
          f"{'compiled' if use_compile(args, device) else 'eager'}; medians of {args.bench_repeats} repetitions x "
          f"{args.bench_steps} rounds (one step of each arm and one roofline sample, interleaved)")
    print(f"roofline: {roofline / 1e9:,.1f} GFLOP/s ({dtype} loop of 8 {roofline_size(device)}^3 matmuls, median over "
          "the rounds)")
    peak = gpu_peak_flops(device, args.peak_flops)
    results = {}
    for arch, arm in arms.items():
        cfg = arm.run.plan.model_config
        flops_per_step = model_lib.flops_per_token(cfg, cfg.passes) * arm.run.plan.tokens_per_step
        dt = median(r[arch] for r in repetitions)
        achieved = flops_per_step / dt
        fraction = median(flops_per_step / r[arch] / r["roofline"] for r in repetitions)
        optimizer = dt - median(r[arch + " model"] for r in repetitions)
        results[arch] = dict(seconds=dt, optimizer_seconds=optimizer, tokens_per_second=arm.run.plan.tokens_per_step
                             / dt, flops_per_second=achieved, roofline_fraction=fraction)
        print(f"{arch:11s} | {1000 * dt:8.1f} ms/step ({1000 * optimizer:5.1f} optimizer) | "
              f"{results[arch]['tokens_per_second']:10,.0f} tok/s | {achieved / 1e9:8.1f} GFLOP/s | "
              f"{100 * fraction:5.1f}% of roofline" + (f" | mfu {100 * achieved / peak:.1f}%" if peak else ""))
    print("(model training FLOPs only: the Muon/AdamW steps' FLOPs are not counted, their time is)")
    ratios = step_ratios(repetitions)
    print(f"operator_1/vanilla = {ratios['operator_1_over_vanilla']:.3f} (target <= 1.02); forward+backward only "
          f"{ratios['operator_1_over_vanilla_model']:.3f}")
    print(f"untied_2/loop_2    = {ratios['untied_2_over_loop_2']:.3f} (target 1.00 +- 0.02); forward+backward only "
          f"{ratios['untied_2_over_loop_2_model']:.3f}")
    return dict(results, roofline_flops_per_second=roofline, **ratios)


def compile_time(args):
    """--compile-time: cold compilation and steady step time of Untied-Grow at --depth (default 8) on one process and
    synthetic tokens, compiled whole (torch.compile(model): a graph per pass stage, one backward node for every
    gradient) and regionally (train.compile_model: one graph the blocks share), each from cold caches (Dynamo reset,
    Inductor's caches off): --bench-steps + 1 steps before growth and as many after. compile_seconds is the first step
    less the steady one; growth_compile_seconds the same at the first step after growth (the whole model recompiles
    for the new pass count) -> {mode: numbers}."""
    rank, world, device = setup_distributed(args.device)
    if world > 1:
        raise UsageError("--compile-time runs in one process; start it with python, not torchrun")
    depth, steps = args.depth or 8, args.bench_steps
    plan = synthetic_plan(args, "untied_grow", depth, 2 * (steps + 1), crossover_step=steps + 1)
    eager_args = argparse.Namespace(**dict(vars(args), compile=False))  # compiled below, in each mode
    cfg, results = plan.model_config, {}
    print(f"compile-time: untied_grow d{depth}, width {cfg.width}, T {cfg.seq_len}, vocab {cfg.vocab_size}, "
          f"{plan.tokens_per_step // plan.seq_len} sequences per step, K {plan.pass_stages}, growth at step "
          f"{plan.crossover_step}, {torch.get_num_threads()} threads; cold caches per mode; medians of {steps} steps")
    for mode in ("whole", "regional"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        with torch._inductor.config.patch(force_disable_caches=True):
            arm = synthetic_training(eager_args, plan, device, random_init=True)
            arm.step_model = train.compile_model(arm.model, plan, whole=mode == "whole")
            seconds, loss = timed_steps(arm, 2 * (steps + 1))
        r = dict(first_step_seconds=seconds[0], steady_step_seconds=median(seconds[1:steps + 1]),
                 growth_step_seconds=seconds[steps + 1], steady_step_seconds_grown=median(seconds[steps + 2:]),
                 graphs=torch._dynamo.utils.counters["stats"]["unique_graphs"], final_loss=loss)
        r.update(compile_seconds=r["first_step_seconds"] - r["steady_step_seconds"],
                 growth_compile_seconds=r["growth_step_seconds"] - r["steady_step_seconds_grown"])
        results[mode] = r
        first, last = plan.pass_stages[0], plan.pass_stages[-1]
        print(f"{mode:8s} | cold compile {r['compile_seconds']:7.1f} s | at growth {r['growth_compile_seconds']:6.1f} "
              f"s | steady {1000 * r['steady_step_seconds']:8.1f} ms/step (K={first}), "
              f"{1000 * r['steady_step_seconds_grown']:8.1f} ms/step (K={last}) | {r['graphs']} graphs")
    torch._dynamo.reset()
    return results


GPU_CHECK = {  # per preset: the runs and their steps; "cpu" is the tiny mode the tests run
    "paper": dict(vanilla_depth=12, grow_depth=8, steps=30, crossover_step=10, ratio_depth=12, ratio_steps=5,
                  ratio_repeats=3, core_examples=40, budget_seconds=450),
    "cpu": dict(vanilla_depth=2, grow_depth=3, steps=3, crossover_step=1, ratio_depth=2, ratio_steps=2,
                ratio_repeats=1, core_examples=6, budget_seconds=600),
}  # budget_seconds: a section that would start later is skipped (recorded in "errors"), so the whole stays <= 8 min


def check_training(args, device, peak, arch, depth, steps, crossover_step=None):
    """`steps` training steps of one arm (compiled on CUDA) on synthetic tokens: step time, tokens/s, MFU, memory
    vs the memory model."""
    plan = synthetic_plan(args, arch, depth, steps, crossover_step)
    arm = synthetic_training(args, plan, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    seconds, loss = timed_steps(arm, steps)
    warm = seconds[2:] if len(seconds) > 3 else seconds  # the first steps compile (and grow)
    if crossover_step and len(seconds) > crossover_step + 3:  # after growth: the grown model's steady state
        warm = seconds[crossover_step + 2:]
    step_seconds = median(warm)
    flops_per_token = model_lib.flops_per_token(plan.model_config, arm.model.active_passes)
    predicted = max(memory_per_rank(plan.model_config, k, micro, device=device.type)["peak"]
                    for k, micro in zip(plan.pass_stages, arm.run.micro_batches))
    measured = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return dict(arch=arch, depth=depth, steps=steps, crossover_step=crossover_step, pass_stages=list(plan.pass_stages),
                growth_events=arm.state.growth_events, micro_batches=list(arm.run.micro_batches),
                tokens_per_step=plan.tokens_per_step, compiled=use_compile(args, device), final_loss=loss,
                wall_seconds=time.perf_counter() - t0, first_step_seconds=seconds[0], step_seconds=step_seconds,
                tokens_per_second=plan.tokens_per_step / step_seconds,
                mfu=flops_per_token * plan.tokens_per_step / step_seconds / peak if peak else None,
                max_memory_allocated_bytes=measured, predicted_peak_bytes=predicted,
                memory_measured_over_predicted=measured / predicted if measured else None)


def check_ratios(args, device, depth, steps, repeats):
    """The bench's step-time ratios Operator-1/Vanilla and Untied-2/Loop-2 at one shape."""
    arms, repetitions = interleaved_arms(args, device, depth, steps, repeats)
    return dict(depth=depth, micro_batch=arms["vanilla"].run.micro_batches[0],
                step_seconds={arch: median(r[arch] for r in repetitions) for arch in BENCH_ARMS},
                **step_ratios(repetitions))


def synthetic_core_tasks(n, seed=0):
    """Small CORE-format tasks of each type (multiple choice, schema, language modelling) with random words."""
    rng = random.Random(seed)
    word = lambda: "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6)))
    phrase = lambda k: " ".join(word() for _ in range(k))
    mc = [dict(query=phrase(6), choices=[phrase(2) for _ in range(4)], gold=rng.randrange(4)) for _ in range(n)]
    schema = [dict(context_options=[phrase(5) for _ in range(2)], continuation=phrase(3), gold=rng.randrange(2))
              for _ in range(n)]
    lm = [dict(context=phrase(8), continuation=phrase(2)) for _ in range(n)]
    return [dict(label=label, type=kind, shots=shots, delimiter=" ", baseline=baseline, items=items)
            for label, kind, shots, baseline, items in [("synthetic_mc", "multiple_choice", 2, 0.25, mc),
                                                        ("synthetic_schema", "schema", 1, 0.5, schema),
                                                        ("synthetic_lm", "language_modeling", 2, 0.0, lm)]]


def check_core_scoring(args, device, examples):
    """The three core_eval scoring paths on one model under the device's autocast (bf16 on CUDA): per task the
    largest accuracy and answer-NLL difference from the one-at-a-time reference path."""
    plan = synthetic_plan(args, "vanilla", GPU_CHECK[args.preset]["ratio_depth"], 1)
    torch.manual_seed(0)
    net = model_lib.GPT(plan.model_config, device=device).eval()
    for p in net.parameters():  # a random model with non-zero logits: ties would hide disagreements
        torch.nn.init.normal_(p, std=0.02)
    tasks = core_eval.load_tasks(args.bundle_dir) if args.bundle_dir else synthetic_core_tasks(examples)
    enc = data.get_tokenizer("bytes")  # offline; its ids are valid for any vocabulary >= 257
    scores = {s: core_eval.evaluate_tasks(net, enc, tasks, [0], examples, plan.seq_len, device, scoring=s,
                                          show_progress=False)[0] for s in core_eval.SCORING}
    reference = scores["one_at_a_time"]
    diffs = {s: {label: dict(accuracy=abs(per[0][0] - reference[label][0][0]),
                             nll=abs(per[0][1] - reference[label][0][1])) for label, per in scores[s].items()}
             for s in core_eval.SCORING if s != "one_at_a_time"}
    worst = max(d["nll"] for per in diffs.values() for d in per.values())
    return dict(tasks=[t["label"] for t in tasks], examples_per_task=examples, source="bundle" if args.bundle_dir
                else "synthetic", autocast="bf16" if device.type == "cuda" else "fp32", max_nll_difference=worst,
                max_accuracy_difference=max(d["accuracy"] for per in diffs.values() for d in per.values()),
                differences=diffs)


def check_summary(name, result):
    """One line per section: its headline numbers."""
    if name in ("vanilla", "untied_grow"):
        memory = result["max_memory_allocated_bytes"]
        return (f"{result['arch']} d{result['depth']}: {1000 * result['step_seconds']:.0f} ms/step, "
                f"{result['tokens_per_second']:,.0f} tok/s" + (f", MFU {100 * result['mfu']:.1f}%" if result["mfu"]
                                                                 else "")
                + (f", peak memory {memory / GIB:.1f} GiB" if memory else "")
                + f" (model predicts {result['predicted_peak_bytes'] / GIB:.1f} GiB)"
                + (f", growth {result['growth_events']}" if result["growth_events"] else ""))
    if name == "ratios":
        return (f"operator_1/vanilla = {result['operator_1_over_vanilla']:.3f} (target <= 1.02), untied_2/loop_2 = "
                f"{result['untied_2_over_loop_2']:.3f} (target 1.00 +- 0.02) at d{result['depth']}")
    if name == "core_scoring":
        return (f"{result['source']} tasks, {result['autocast']}: largest difference from one_at_a_time: accuracy "
                f"{result['max_accuracy_difference']:.4f}, answer NLL {result['max_nll_difference']:.2e}")
    return f"matmul roofline {result['flops_per_second'] / 1e9:,.1f} GFLOP/s"


def gpu_check(args):
    """--gpu-check: the sections of GPU_CHECK[preset] in order, each recorded (or its error); the JSON is rewritten
    after every section, so a run cut short still leaves what it measured."""
    rank, world, device = setup_distributed(args.device)
    if world > 1:
        raise UsageError("--gpu-check runs on one GPU; start it with python, not torchrun")
    peak = gpu_peak_flops(device, args.peak_flops)
    if device.type == "cuda" and peak is None:
        raise UsageError(f"unknown GPU {torch.cuda.get_device_name(device)!r}: pass its dense bf16 peak, e.g. "
                         "--peak-flops 989e12")
    if args.bundle_dir and not os.path.isdir(args.bundle_dir):
        raise UsageError(f"--bundle-dir {args.bundle_dir} is not a directory")
    if os.path.exists(args.gpu_check_out):
        raise UsageError(f"{args.gpu_check_out} already exists; pass another --gpu-check-out or move it away")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.gpu_check_out))):
        raise UsageError(f"the folder of --gpu-check-out {args.gpu_check_out} does not exist")
    recipe = GPU_CHECK[args.preset]
    out = dict(date=time.strftime("%Y-%m-%d"), device=torch.cuda.get_device_name(device) if device.type == "cuda"
               else "cpu", torch=torch.__version__, preset=args.preset, tokens="synthetic (uniform random ids)",
               peak_flops=peak, errors={})
    sections = dict(
        roofline=lambda: dict(flops_per_second=matmul_roofline(device, size=None if device.type == "cuda" else 512)),
        vanilla=lambda: check_training(args, device, peak, "vanilla", recipe["vanilla_depth"], recipe["steps"]),
        untied_grow=lambda: check_training(args, device, peak, "untied_grow", recipe["grow_depth"], recipe["steps"],
                                           recipe["crossover_step"]),
        ratios=lambda: check_ratios(args, device, recipe["ratio_depth"], recipe["ratio_steps"],
                                    recipe["ratio_repeats"]),
        core_scoring=lambda: check_core_scoring(args, device, recipe["core_examples"]))
    t0 = time.perf_counter()
    for name, section in sections.items():
        start = time.perf_counter()
        try:
            if start - t0 > recipe["budget_seconds"]:
                raise TimeoutError(f"skipped: the {recipe['budget_seconds']} s budget was spent")
            out[name] = section()
        except Exception as exc:  # a GPU minute is precious: record it and go on with the next section
            out[name] = None
            out["errors"][name] = f"{type(exc).__name__}: {exc}"
        print(f"gpu-check {name} ({time.perf_counter() - start:.0f}s): "
              + (check_summary(name, out[name]) if out[name] else out["errors"][name]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        out["total_seconds"] = time.perf_counter() - t0
        write_json(args.gpu_check_out, out)
    print(f"gpu-check: wrote {args.gpu_check_out}; {len(out['errors'])} section(s) failed")
    return 1 if out["errors"] else 0


# ----------------------------------------------------------------------------------------------------------------------
# Command line: train.py's flags (shapes, recipe, memory, --device, --compile, --peak-flops) and the bench's own

def parse_args(argv):
    p = train.build_parser("bench.py", __doc__.split("\n\n")[0])
    perf = p.add_argument_group("benchmark and GPU acceptance check")
    perf.add_argument("--gpu-check", action="store_true",
                      help="compiled vanilla d12 and untied_grow d8 (growth at step 10) on synthetic tokens: MFU, "
                           "tok/s, memory vs model, arm ratios, CORE scoring agreement (--preset cpu: tiny)")
    perf.add_argument("--compile-time", action="store_true",
                      help="cold compile time and steady step time of untied_grow (--depth, default 8) through "
                           "growth, compiled whole-model vs per block (inductor; --preset cpu on CPU)")
    perf.add_argument("--bench-steps", type=integer(1, 10 ** 6), default=10,
                      help="rounds per repetition: a roofline sample and one step of every arm")
    perf.add_argument("--bench-repeats", type=integer(1, 1000), default=3,
                      help="interleaved repetitions (medians are printed)")
    perf.add_argument("--bench-shape", choices=list(BENCH_SHAPES), default=None,
                      help="d6w384: depth 6, width 384, head_dim 64, T 256, GPT-2 vocab (with --preset cpu)")
    perf.add_argument("--gpu-check-out", default="gpu_check.json", help="the JSON --gpu-check writes")
    perf.add_argument("--bundle-dir", default=None, help="CORE bundle for --gpu-check (default: synthetic tasks)")
    args = p.parse_args(argv)
    if args.dry_run:
        raise UsageError("--dry-run plans a training run: python train.py --arch A --depth D --dry-run")
    if args.fixed_reduce_order:
        raise UsageError("--fixed-reduce-order is for training runs and their --dry-run; drop it for bench.py")
    args.preset = args.preset or ("cpu" if not args.gpu_check and not torch.cuda.is_available() else "paper")
    for name, value in BENCH_SHAPES.get(args.bench_shape, {}).items():  # explicit flags win over the shape's
        if getattr(args, name) is None:
            setattr(args, name, [value] if name == "depth" else value)
    return train.checked_args(p, args)


def run(argv):
    args = parse_args(argv)
    if args.gpu_check:
        return gpu_check(args)
    if args.compile_time:
        compile_time(args)
        return
    bench(args)


def main(argv=None):
    return cli_main_distributed(run, "bench.py", argv)


if __name__ == "__main__":
    exit_process(main())
