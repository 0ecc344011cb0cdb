"""bench.py — step-time benchmark and GPU acceptance check of train.py's training step (train.py's flags apply too).

    python bench.py --depth 4                         # cpu preset: achieved GFLOP/s vs a matmul roofline, arm ratios
    python bench.py --bench-shape d6w384 --preset cpu
    python bench.py --gpu-check                       # one GPU: MFU, tok/s, memory vs model, ratios -> gpu_check.json
    python bench.py --compile-time --depth 8          # cold compile and step time, whole-model vs per-block compile
    python bench.py --gpu-smoke                       # bash ladder.sh gpu-smoke: 2-GPU NCCL runs, then --gpu-check

Both time train.py's own train_step on synthetic tokens (uniform random ids: no dataset, no network), with the
memory planner's micro-batch and torch.compile where a run would use it (CUDA; --compile on CPU). The bench runs
--bench-repeats repetitions of --bench-steps rounds, each round a roofline sample and one step of every arm (order
rotated), and prints medians, the optimizer steps' share of each step and the arm ratios with and without it; ratios
are the point, absolute numbers depend on the box. --gpu-smoke is the first run on a new cluster (README, "GPU
acceptance"; docs/gpu_acceptance.md).

    python -m pytest -q tests/test_bench.py
"""
import argparse, contextlib, gc, json, math, os, random, shutil, sys, time
from statistics import median

from arms import (BENCH_ARMS, BENCH_SHAPES, GPU_CHECK_TRAINING, MFU_CONVENTIONS, PRESETS, SMOKE_DISTRIBUTED_RUNS,
                  TRAINING_RUN_FLAGS, gate, training_parser, verdict_markdown, verdict_summary)
from common import (Stopped, UsageError, answer_help, autocast, claim_empty_folder, cli_main_distributed, exit_process,
                    flight_recorder_env, free_port, integer, run_launches, setup_distributed, write_json, write_text)


# ----------------------------------------------------------------------------------------------------------------------
# Command line, first so that --help answers before torch loads: train.py's flags (shapes, recipe, memory, --device,
# --compile, --peak-flops) and the bench's own; parse_args (at the end) checks them

def build_parser():
    p = training_parser("bench.py", __doc__.split("\n\n")[0])
    perf = p.add_argument_group("benchmark and GPU acceptance check")
    perf.add_argument("--gpu-check", action="store_true",
                      help="on synthetic tokens: roofline, CORE scoring agreement, compiled vanilla d12, untied_grow "
                           "d8 eager and compiled (growth at step 8): MFU, tok/s, memory vs model; arm ratios at d8 "
                           "(--preset cpu: tiny)")
    perf.add_argument("--compile-time", action="store_true",
                      help="cold compile time and steady step time of untied_grow (--depth, default 8) through "
                           "growth, compiled whole-model vs per block (inductor; --preset cpu on CPU)")
    perf.add_argument("--bench-steps", type=integer(1, 10 ** 6), default=10,
                      help="rounds per repetition: a roofline sample and one step of every arm")
    perf.add_argument("--bench-repeats", type=integer(1, 1000), default=3,
                      help="interleaved repetitions (medians are printed)")
    perf.add_argument("--bench-shape", choices=list(BENCH_SHAPES), default=None,
                      help="d6w384: depth 6, width 384, head_dim 64, T 256, GPT-2 vocab (with --preset cpu)")
    perf.add_argument("--bundle-dir", default=None, help="CORE bundle for --gpu-check (default: synthetic tasks)")
    perf.add_argument("--gpu-smoke", action="store_true",
                      help="first run on a new cluster: untied_grow through growth on 2 processes (stopped, resumed two "
                           "ways) and on 2 nodes of 1, against one process; then --gpu-check (docs/gpu_acceptance.md)")
    perf.add_argument("--out", default=None, help="what --gpu-check writes, a JSON file (default gpu_check.json), or "
                      "--gpu-smoke, a new folder (default gpu_smoke)")
    perf.add_argument("--cpu-exercise", action="store_true",
                      help="--gpu-check / --gpu-smoke without a GPU: run their code path on the CPU (--device cpu, "
                           "--preset cpu by default; the tests use it); the verdict is then at best incomplete")
    perf.add_argument("--memory-snapshots", default=None, metavar="DIR",
                      help="--gpu-check on CUDA: the allocator's history of untied_grow d8 eager and compiled, one "
                           "pickle each (drop it on https://pytorch.org/memory_viz)")
    return p


if __name__ == "__main__":
    answer_help(build_parser)  # before torch loads (2-3 s on 2 cores)

import torch

import checkpoint
import core_eval
import data
import model as model_lib
import train
from plan import GIB, device_memory_plan, make_plan, memory_per_rank, stage_index
from train import count_step, gpu_peak_flops, train_step, use_compile


def single_process(device_flag, what):
    """The device of a one-process tool; a torchrun launch is refused before any process group starts."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError(f"{what} runs in one process; start it with python, not torchrun")
    return setup_distributed(device_flag)[2]


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

    def batch(self, step, rank, world, micro_batch=None):
        """As TrainLoader.batch: rank's contiguous slice, or with micro_batch its k-th micro-batch the (k*world+rank)-th."""
        generator = torch.Generator().manual_seed(step)
        windows = torch.randint(0, self.vocab_size, (self.batch_seqs, self.seq_len + 1), generator=generator)
        per_rank = self.batch_seqs // world
        if micro_batch is None:
            return 1, windows[rank * per_rank:(rank + 1) * per_rank]
        k, offset = torch.arange(per_rank).div(micro_batch, rounding_mode="floor"), torch.arange(per_rank) % micro_batch
        return 1, windows[(k * world + rank) * micro_batch + offset]


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


def timed_steps(arm, steps, optimizer_timer=contextlib.nullcontext(), deadline=math.inf):
    """`steps` more train_steps of `arm` (a train.Training), fewer when one ends past `deadline` (perf_counter)
    -> (per-step seconds: CUDA events on GPU, perf_counter on CPU; last loss)."""
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
        loss = loss.item()
        if not math.isfinite(loss):
            raise RuntimeError(f"non-finite loss {loss} at step {arm.state.step}")
        count_step(arm.run, arm.state, passes, seconds[-1])
        if time.perf_counter() > deadline:
            break
    return seconds, loss


def bench_plans(args, device, depth, steps):
    """The plans of the four BENCH_ARMS at one shape with one micro-batch per step, the same for all four so that
    their steps do the same work: --device-batch-size, else the smallest of each arm's own largest micro-batch for a
    quarter of the device (all four stay resident; Loop-2 and Untied-2 execute more blocks than Vanilla at a depth)
    -> (their flags, {arch: plan})."""
    plan_args = argparse.Namespace(**vars(args))
    if device.type == "cuda" and not args.device_batch_size:
        total = args.gpu_memory or torch.cuda.get_device_properties(device).total_memory / GIB
        plan_args.gpu_memory = total / len(BENCH_ARMS)
    probes = [synthetic_plan(plan_args, arch, depth, 1) for arch in BENCH_ARMS]
    micro = min(device_memory_plan(plan_args, probe, 1, device).stages[0].micro_batch for probe in probes)
    plan_args.device_batch_size = [micro]
    batch_tokens = micro * probes[0].seq_len
    return plan_args, {arch: synthetic_plan(plan_args, arch, depth, steps, total_batch_tokens=batch_tokens)
                       for arch in BENCH_ARMS}


def interleaved_arms(args, device, depth, steps, repeats, deadline=math.inf):
    """The four BENCH_ARMS at one shape (bench_plans), one untimed warm-up step each (compilation), then `repeats`
    repetitions of `steps` rounds, or fewer when a round ends past `deadline` (perf_counter). A round is one roofline
    sample and one step of every arm, the arm order rotated each round, so the arms and the roofline see the same
    state of a shared box (its speed drifts by tens of percent within minutes on a VM) -> (arms, per repetition
    {arch: median step seconds, "roofline": median FLOP/s})."""
    plan_args, plans = bench_plans(args, device, depth, 1 + repeats * steps)  # the warm-up step and the timed ones
    arms = {arch: synthetic_training(plan_args, plan, device, random_init=True) for arch, plan in plans.items()}
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
            if time.perf_counter() > deadline:
                break
        repetitions.append({name: median(values) for name, values in samples.items()})
        if time.perf_counter() > deadline:
            break
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
    device = single_process(args.device, "bench.py")
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
    gradient) and regionally (train.compile_model: one graph the blocks share, one the loss's chunks share), each
    from cold caches (Dynamo reset, Inductor's caches off): --bench-steps + 1 steps before growth and as many after.
    compile_seconds is the first step less the steady one; growth_compile_seconds the same at the first step after
    growth (the whole model recompiles for the new pass count) -> {mode: numbers}."""
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


# --gpu-check per preset ("cpu" is the tiny mode the tests run). The sections run in this order, cheap and important
# first and the ratios' four cold compiles last, each within its own time cap in seconds (a training section stops at
# the first step boundary past it and says so); one whose cap would end past budget_seconds is skipped and listed
# under "skipped". The paper preset trains on 65,536 tokens per step, one rank's share of a ladder step on 8 GPUs.
GPU_CHECK = {
    "paper": dict(tokens_per_step=65_536, vanilla_depth=12, grow_depth=8, steps=20, crossover_step=8, ratio_depth=8,
                  ratio_steps=5, ratio_repeats=3, core_examples=40, budget_seconds=480,
                  caps=dict(roofline=15, core_scoring=45, vanilla=90, untied_grow_eager=45, untied_grow=120,
                            ratios=135)),
    "cpu": dict(tokens_per_step=None, vanilla_depth=2, grow_depth=3, steps=3, crossover_step=1, ratio_depth=2,
                ratio_steps=2, ratio_repeats=1, core_examples=6, budget_seconds=3600,
                caps=dict(roofline=300, core_scoring=300, vanilla=300, untied_grow_eager=300, untied_grow=300,
                          ratios=600)),
}


def gpu_check_plans(args, device):
    """Every training run of --gpu-check, planned and checked against the device's memory before any section runs
    -> {section: [(the flags it trains with, plan)]}; one that does not fit is a UsageError naming its section."""
    recipe = GPU_CHECK[args.preset]
    steps, tokens = recipe["steps"], recipe["tokens_per_step"]
    eager = argparse.Namespace(**dict(vars(args), compile=False))
    grow = synthetic_plan(args, "untied_grow", recipe["grow_depth"], steps, recipe["crossover_step"], tokens)
    runs = dict(vanilla=[(args, synthetic_plan(args, "vanilla", recipe["vanilla_depth"], steps,
                                               total_batch_tokens=tokens))],
                untied_grow_eager=[(eager, grow)], untied_grow=[(args, grow)])
    section = "ratios"
    try:
        ratio_args, ratio_plans = bench_plans(args, device, recipe["ratio_depth"],
                                              1 + recipe["ratio_repeats"] * recipe["ratio_steps"])
        runs["ratios"] = [(ratio_args, plan) for plan in ratio_plans.values()]
        for section, section_runs in runs.items():
            for run_args, plan in section_runs:
                device_memory_plan(run_args, plan, 1, device)
    except UsageError as e:
        raise UsageError(f"--gpu-check's {section} section does not fit this GPU: {e}") from None
    return runs


@contextlib.contextmanager
def memory_history(path):
    """Record the CUDA allocator's history while the block runs and write it to `path`, also when the block fails
    (out of memory, say). None: nothing is recorded."""
    if path:  # Python frames only: unwinding C++ stacks on every allocation slows the timed steps
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    try:
        yield
    finally:
        if path:
            torch.cuda.memory._dump_snapshot(path)
            torch.cuda.memory._record_memory_history(enabled=None)


def release_memory(device):
    """Free what the last section left (a compiled block and its wrapper refer to each other: only the garbage
    collector frees them), then the cached blocks, so that the next section's peak is its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def mfu(cfg, passes, tokens_per_second, peak):
    """MFU in both MFU_CONVENTIONS (None without a peak): causal attention at half (model.flops_per_token), or
    whole (nanoGPT / PaLM: 12 * C * T per token per block)."""
    full = (model_lib.matrix_flops_per_token(cfg, passes)
            + model_lib.executed_blocks(cfg, passes) * 12 * cfg.n_head * cfg.head_dim * cfg.seq_len)
    per_token = dict(causal_half=model_lib.flops_per_token(cfg, passes), full_attention=full)
    return {f"mfu_{name}": flops * tokens_per_second / peak if peak else None for name, flops in per_token.items()}


def timed_window(seconds, plan):
    """The steps whose median is a section's step time -> (first step, last step + 1, stage): after compilation (the
    first two steps) and, for a run that grows, after growth only (its first step recompiles), so that the grown
    model's FLOPs meet the grown model's step times; a run stopped before a step after growth reports the steps
    before it instead, as such."""
    n, crossover = len(seconds), plan.crossover_step
    if not crossover:
        return (2 if n > 3 else 0), n, "whole run"
    if n > crossover + 1:
        return (crossover + 2 if n > crossover + 2 else crossover + 1), n, "after growth"
    end = min(n, crossover)
    return (2 if end > 3 else 0), end, "before growth"


def attention_and_loss(arm, step_seconds, repeats=3):
    """After a section's steps, on one micro-batch of its last stage: the attention backend a forward of its blocks
    runs (model.attention_backend_run), and the loss's share of a step: the median of `repeats` timed forwards and
    backwards of GPT.loss alone (final norm, chunked cross-entropy and its matmuls, compiled as the run compiles it;
    two untimed first) on a random final stream, times the step's micro-batches, over the step's median time."""
    plan, device, model = arm.run.plan, arm.run.device, arm.model
    micro = arm.run.micro_batches[stage_index(arm.state.step - 1, plan)]
    idx = torch.randint(0, plan.model_config.vocab_size, (micro, plan.seq_len), device=device)
    h = torch.randn(micro, plan.seq_len, plan.model_config.width, device=device, requires_grad=True)
    with autocast(device):
        backend = model_lib.attention_backend_run(lambda: model.residual_stream(idx))
    seconds = []
    for _ in range(2 + repeats):
        synchronize(device)
        t0 = time.perf_counter()
        with autocast(device):
            loss = model.loss(h, idx)
        loss.backward()
        synchronize(device)
        seconds.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    loss_seconds = median(seconds[2:]) * (plan.tokens_per_step // (micro * plan.seq_len))
    return dict(attention_backend=backend, loss_seconds=loss_seconds, loss_share=loss_seconds / step_seconds)


def check_training(args, device, peak, plan, deadline, snapshot=None):
    """The plan's steps of one arm on synthetic tokens (compiled as args say), stopping at the first step that ends
    past `deadline`: step time, tokens/s, MFU in both conventions (of the steps timed_window picks, their count
    recorded), memory vs the memory model. snapshot: a file for the CUDA allocator's history of the whole section
    (torch.cuda.memory._dump_snapshot; drop it on https://pytorch.org/memory_viz)."""
    with memory_history(snapshot):
        arm = synthetic_training(args, plan, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        seconds, loss = timed_steps(arm, plan.steps, deadline=deadline)
    first, end, stage = timed_window(seconds, plan)
    step_seconds = median(seconds[first:end])
    passes = plan.pass_stages[0] if stage == "before growth" else arm.model.active_passes
    predicted = max(memory_per_rank(plan.model_config, k, micro, device=device.type)["peak"]
                    for k, micro in zip(plan.pass_stages, arm.run.micro_batches))
    measured = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return dict(arch=plan.arch, depth=plan.depth, steps=plan.steps, steps_run=len(seconds),
                stopped_at_cap=len(seconds) < plan.steps, crossover_step=plan.crossover_step,
                pass_stages=list(plan.pass_stages), growth_events=arm.state.growth_events,
                micro_batches=list(arm.run.micro_batches), tokens_per_step=plan.tokens_per_step,
                compiled=use_compile(args, device), final_loss=loss, wall_seconds=time.perf_counter() - t0,
                first_step_seconds=seconds[0], step_seconds=step_seconds,
                timed_window=dict(first_step=first, steps=end - first, stage=stage, passes=passes),
                tokens_per_second=plan.tokens_per_step / step_seconds,
                **mfu(plan.model_config, passes, plan.tokens_per_step / step_seconds, peak),
                max_memory_allocated_bytes=measured, predicted_peak_bytes=predicted,
                memory_measured_over_predicted=measured / predicted if measured else None, memory_snapshot=snapshot,
                **attention_and_loss(arm, step_seconds))


def check_ratios(args, device, depth, steps, repeats, deadline):
    """The bench's step-time ratios Operator-1/Vanilla and Untied-2/Loop-2 at one shape, its rounds stopping at the
    first that ends past `deadline`."""
    arms, repetitions = interleaved_arms(args, device, depth, steps, repeats, deadline)
    return dict(depth=depth, micro_batch=arms["vanilla"].run.micro_batches[0], repetitions_run=len(repetitions),
                stopped_at_cap=time.perf_counter() > deadline,
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
    """The three core_eval scoring paths on one model under the device's autocast (bf16 on CUDA) and --attention-backend
    (auto: PyTorch's choice, as core_eval scores): per task the largest accuracy and answer-NLL difference from the
    one-at-a-time path, and of each path from itself on SDPA's math backend (a wrong fused kernel shows there)."""
    plan = synthetic_plan(args, "vanilla", GPU_CHECK[args.preset]["ratio_depth"], 1)
    attention = "default" if args.attention_backend == "auto" else args.attention_backend
    torch.manual_seed(0)
    net = model_lib.GPT(plan.model_config, device=device, attention=attention).eval()
    for p in net.parameters():  # every layer's output O(1): ties would hide disagreements, and a wrong attention
        torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5 if p.dim() == 2 else 0.02)  # kernel moves the NLLs
    tasks = core_eval.load_tasks(args.bundle_dir) if args.bundle_dir else synthetic_core_tasks(examples)
    enc = data.get_tokenizer("bytes")  # offline; its ids are valid for any vocabulary >= 257
    score = lambda s: core_eval.evaluate_tasks(net, enc, tasks, [0], examples, plan.seq_len, device, scoring=s,
                                               show_progress=False)[0]
    scores = {s: score(s) for s in core_eval.SCORING}
    net.set_attention("math")
    on_math = {s: score(s) for s in core_eval.SCORING}
    differences = lambda a, b: {label: dict(accuracy=abs(per[0][0] - b[label][0][0]),
                                            nll=abs(per[0][1] - b[label][0][1])) for label, per in a.items()}
    diffs = {s: differences(scores[s], scores["one_at_a_time"]) for s in core_eval.SCORING if s != "one_at_a_time"}
    math_diffs = {s: differences(scores[s], on_math[s]) for s in core_eval.SCORING}
    worst = lambda table, key: max(d[key] for per in table.values() for d in per.values())
    return dict(tasks=[t["label"] for t in tasks], examples_per_task=examples, source="bundle" if args.bundle_dir
                else "synthetic", autocast="bf16" if device.type == "cuda" else "fp32", attention=attention,
                max_nll_difference=worst(diffs, "nll"), max_accuracy_difference=worst(diffs, "accuracy"),
                max_nll_difference_from_math=worst(math_diffs, "nll"),
                max_accuracy_difference_from_math=worst(math_diffs, "accuracy"),
                differences=diffs, differences_from_math=math_diffs)


def check_summary(name, result):
    """One line per section: its headline numbers."""
    if name in GPU_CHECK_TRAINING:
        memory = result["max_memory_allocated_bytes"]
        return (f"{result['arch']} d{result['depth']} {'compiled' if result['compiled'] else 'eager'}: "
                f"{1000 * result['step_seconds']:.0f} ms/step, "
                f"{result['tokens_per_second']:,.0f} tok/s" + (
                    f", MFU {100 * result['mfu_causal_half']:.1f}% (causal half; "
                    f"{100 * result['mfu_full_attention']:.1f}% counting attention whole)"
                    if result["mfu_causal_half"] else "")
                + f" over {result['timed_window']['steps']} steps ({result['timed_window']['stage']}); attention "
                  f"{result['attention_backend']}, loss {100 * result['loss_share']:.0f}% of the step"
                + (f", peak memory {memory / GIB:.1f} GiB" if memory else "")
                + f" (model predicts {result['predicted_peak_bytes'] / GIB:.1f} GiB)"
                + (f", growth {result['growth_events']}" if result["growth_events"] else "")
                + (f"; stopped at its time cap after {result['steps_run']} steps" if result["stopped_at_cap"] else ""))
    if name == "ratios":
        return (f"operator_1/vanilla = {result['operator_1_over_vanilla']:.3f} (target <= 1.02), untied_2/loop_2 = "
                f"{result['untied_2_over_loop_2']:.3f} (target 1.00 +- 0.02) at d{result['depth']}"
                + (f"; stopped at its time cap after {result['repetitions_run']} repetition(s)"
                   if result["stopped_at_cap"] else ""))
    if name == "core_scoring":
        return (f"{result['source']} tasks, {result['autocast']}, attention {result['attention']}: largest difference "
                f"from one_at_a_time: accuracy {result['max_accuracy_difference']:.4f}, answer NLL "
                f"{result['max_nll_difference']:.2e}; from SDPA's math backend: accuracy "
                f"{result['max_accuracy_difference_from_math']:.4f}, answer NLL "
                f"{result['max_nll_difference_from_math']:.2e}")
    return f"matmul roofline {result['flops_per_second'] / 1e9:,.1f} GFLOP/s"


SNAPSHOT_SECTIONS = ("untied_grow_eager", "untied_grow")  # --memory-snapshots: one file each


def require_gpu(args, device, what):
    """No GPU, no pretending: a GPU acceptance run on the CPU only when --cpu-exercise asks for its code path there
    (its verdict is then at best incomplete)."""
    if device.type != "cuda" and not args.cpu_exercise:
        why = "no CUDA device is visible" if not torch.cuda.is_available() else "--device cpu was passed"
        raise UsageError(f"{what} measures a GPU and {why}; run it on a GPU node, or pass --cpu-exercise to run its "
                         "code path on the CPU (verdict: incomplete)")


def gpu_check_outputs(args, device):
    """Refuse --gpu-check's outputs and inputs that would fail later -> {section: its memory snapshot file or None}."""
    if args.bundle_dir and not os.path.isdir(args.bundle_dir):
        raise UsageError(f"--bundle-dir {args.bundle_dir} is not a directory")
    if os.path.exists(args.out):
        raise UsageError(f"{args.out} already exists; pass another --out or move it away")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise UsageError(f"the folder of --out {args.out} does not exist")
    snapshots = {name: os.path.join(args.memory_snapshots, f"{name}.pickle") if args.memory_snapshots and
                 device.type == "cuda" else None for name in SNAPSHOT_SECTIONS}
    if args.memory_snapshots and not os.path.isdir(args.memory_snapshots):
        raise UsageError(f"--memory-snapshots {args.memory_snapshots} is not a directory")
    if any(path and os.path.exists(path) for path in snapshots.values()):
        raise UsageError(f"{args.memory_snapshots} already holds memory snapshots; pass another --memory-snapshots")
    return snapshots


def gates_summary(result):
    """'; targets: NAME VALUE (TARGET) met|MISSED|unmeasured, ...' of one gated section."""
    words = {True: "met", False: "MISSED", None: "unmeasured"}
    shown = lambda value: f"{value:.4g}" if isinstance(value, float) else str(value)
    return "; targets: " + ", ".join(f"{name} {shown(g['value'])} ({g['target']}) {words[g['met']]}"
                                     for name, g in result.get("gates", {}).items())


def gpu_check(args):
    """--gpu-check: the sections of GPU_CHECK[preset] in order, each within its time cap and recorded (or its error,
    or why it was skipped), each measurement gated against arms.TARGETS. Every training run is planned before
    the first section starts; the JSON is rewritten after every section, so a run cut short still leaves what it
    measured -> the verdict's exit code (arms.EXIT_CODES)."""
    device = single_process(args.device, "--gpu-check")
    require_gpu(args, device, "--gpu-check")
    peak = gpu_peak_flops(device, args.peak_flops)
    if device.type == "cuda" and peak is None:
        raise UsageError(f"unknown GPU {torch.cuda.get_device_name(device)!r}: pass its dense bf16 peak, e.g. "
                         "--peak-flops 989e12")
    snapshots = gpu_check_outputs(args, device)
    recipe = GPU_CHECK[args.preset]
    print("gpu-check: planning its training runs against this device's memory", flush=True)
    runs = gpu_check_plans(args, device)

    def training(name):
        (run_args, plan), = runs[name]
        return lambda deadline: check_training(run_args, device, peak, plan, deadline, snapshots.get(name))

    def roofline(deadline):
        flops = matmul_roofline(device, size=None if device.type == "cuda" else 512)
        return dict(flops_per_second=flops, peak_flops=peak, peak_fraction=flops / peak if peak else None)
    sections = dict(
        roofline=roofline, core_scoring=lambda deadline: check_core_scoring(args, device, recipe["core_examples"]),
        **{name: training(name) for name in GPU_CHECK_TRAINING},
        ratios=lambda deadline: check_ratios(args, device, recipe["ratio_depth"], recipe["ratio_steps"],
                                             recipe["ratio_repeats"], deadline))
    dtype = "bf16" if device.type == "cuda" else "fp32"
    out = dict(verdict=None, exit_code=None, misses=[], unmeasured=[], date=time.strftime("%Y-%m-%d"),
               device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", dtype=dtype,
               torch=torch.__version__, preset=args.preset, tokens="synthetic (uniform random ids)", peak_flops=peak,
               mfu_conventions=MFU_CONVENTIONS, caps_seconds=recipe["caps"],
               budget_seconds=recipe["budget_seconds"], errors={}, skipped={})
    if device.type != "cuda":
        out["skipped"]["gpu"] = "--cpu-exercise: the code path ran on the CPU; nothing was measured on a GPU"
    t0 = time.perf_counter()
    for name, cap in recipe["caps"].items():
        start = time.perf_counter()
        out[name] = None
        if start - t0 + cap > recipe["budget_seconds"]:
            out["skipped"][name] = (f"not started: {start - t0:.0f} s had passed and its {cap} s cap would end past "
                                    f"the {recipe['budget_seconds']} s budget")
        else:
            print(f"gpu-check {name}: starting (cap {cap} s; {start - t0:.0f} s of the {recipe['budget_seconds']} s "
                  "budget used)", flush=True)  # a section can take minutes (compiles), so say which one runs
            try:
                out[name] = sections[name](start + cap)
            except Exception as exc:  # a GPU minute is precious: record it and go on with the next section
                out["errors"][name] = f"{type(exc).__name__}: {exc}"
        gate("gpu_check", out, dtype)
        print(f"gpu-check {name} ({time.perf_counter() - start:.0f}s): " + (
            check_summary(name, out[name]) + gates_summary(out[name]) if out[name]
            else out["errors"].get(name) or out["skipped"][name]), flush=True)
        release_memory(device)
        out["total_seconds"] = time.perf_counter() - t0
        write_json(args.out, out)
    print(f"gpu-check: {verdict_summary(out, args.out)}")
    return out["exit_code"]


# ----------------------------------------------------------------------------------------------------------------------
# --gpu-smoke (bash ladder.sh gpu-smoke): Untied-Grow through growth at step 3 under torchrun (NCCL; gloo with --device
# cpu) in the layouts of smoke_launches, then --gpu-check; all in --out, summed up in gpu_smoke.json and .md.

GPU_SMOKE = {  # per preset: the run's depth, steps, validation tokens and the byte-level pool it trains on
    "paper": dict(depth=6, steps=6, val_tokens=262_144, train_tokens=3_300_000, launch_timeout=300),
    "cpu": dict(depth=2, steps=6, val_tokens=1024, train_tokens=20_000, launch_timeout=300),
}
SMOKE_PROCESSES = 2
SMOKE_TRAINER = "train.py"  # what torchrun starts; tests/smoke_defects.py is train.py with an injected defect
SHORT_TIMEOUT = ["--dist-timeout", "3"]  # train.py: minutes a collective may wait; a hang ends in minutes


def smoke_launch(name, argv, out_dir, timeout, nodes=1, per_node=SMOKE_PROCESSES, device=torch.device("cpu")):
    """train.py on `nodes` torchruns of `per_node` processes, node_rank 0, 1, ... at 127.0.0.1, each node seeing its
    own GPUs (nodes > 1: the multi-node layout), NCCL_DEBUG=WARN, the flight recorder in out_dir/NAME.nccl_trace_rank_*,
    all output in out_dir/NAME.log, stopped after `timeout` s or on a signal (common.run_launches) -> exit code (the
    first non-zero one), seconds, NCCL warnings, last line."""
    log = os.path.join(out_dir, f"{name}.log")
    env = dict(os.environ, NCCL_DEBUG="WARN", **flight_recorder_env(os.path.join(out_dir, f"{name}.nccl_trace_rank_")))
    port = str(free_port())  # the rendezvous; each node sees its own GPUs of those visible
    gpus = (os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(nodes * per_node)))).split(",")
    commands = [([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc_per_node",
                  str(per_node), "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", port,
                  SMOKE_TRAINER, *argv],
                 dict(env, CUDA_VISIBLE_DEVICES=",".join(gpus[node * per_node:(node + 1) * per_node]))
                 if device.type == "cuda" else env) for node in range(nodes)]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        codes, timed_out = run_launches(commands, f, timeout, os.path.dirname(os.path.abspath(__file__)))
    lines = open(log, errors="replace").read().splitlines()
    return dict(command=" && ".join(" ".join(command) for command, _ in commands),
                returncode=next((code for code in codes if code), 0), seconds=time.perf_counter() - t0,
                timed_out=timed_out, log=log, last_line=lines[-1] if lines else "",
                nccl_warnings=[l for l in lines if "NCCL WARN" in l])


def smoke_run(run_dir):
    """What a smoke run folder shows: status, growth, the losses of its steps, its final validation loss."""
    result = json.load(open(os.path.join(run_dir, "result.json")))
    losses = [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "trajectory.jsonl"))]
    keys = ("status", "world_size", "growth_events", "memory", "memory_measured", "final_val_loss")
    return dict({key: result[key] for key in keys}, losses=losses)


def measured_over_predicted(runs, measured, predicted):
    """The largest ratio, over the runs' pass stages (train.record_memory) and ranks, of a rank's `measured` bytes to
    the stage's `predicted` ones; None where not measured (a CPU records its resident set, max_rss, instead)."""
    ratios = [rank[measured] / record[predicted] for r in runs.values() for record in r["memory_measured"]
              for rank in record["ranks"] if rank.get(measured) is not None]
    return max(ratios, default=None)


def relative_difference(losses, reference):
    """The largest relative difference of two loss lists; None when they differ in length (a run cut short)."""
    same = len(losses) == len(reference) and reference
    return max(abs(x - y) / abs(y) if y else abs(x - y) for x, y in zip(losses, reference)) if same else None


def weights_difference(runs_dir, name):
    """The largest ||w - w_ref|| / ||w_ref|| over the weight tensors of run `name`'s final checkpoint and the reference
    run's: a few steps' losses hardly see a wrongly weighted gradient (Muon's update is normalised), the weights do."""
    final = lambda run: checkpoint.load_checkpoint_model(os.path.join(runs_dir, run, "checkpoints", "final"),
                                                         "cpu")[0].state_dict()
    weights, reference = final(name), final("reference")
    return max(((weights[k].double() - w).norm() / w.norm().clamp_min(1e-30)).item()
               for k, w in ((k, v.double()) for k, v in reference.items()))


def smoke_checks(runs, steps, runs_dir):
    """The smoke's measurements (gated by arms.TARGETS): complete, grown, finite, bit-identical first resumed step, each
    distributed run's losses and final weights against the one-process reference, every rank's memory."""
    grown = [r["growth_events"][0]["step"] if r["growth_events"] else None for r in runs.values()]
    a, b = (runs.get(name, {}).get("losses", []) for name in ("default", "sharded"))
    compared = [name for name in SMOKE_DISTRIBUTED_RUNS if name in runs]  # a test may launch fewer
    return dict(
        complete=all(r["status"] == "complete" and len(r["losses"]) == steps for r in runs.values()),
        grew_at_step=grown, grew_at_crossover=all(step == steps // 2 for step in grown),
        finite=all(x is not None and math.isfinite(x) for r in runs.values()  # None: not complete (no final loss)
                   for x in r["losses"] + [r["final_val_loss"]]),
        first_resumed_loss_equal=len(a) > 2 and len(b) > 2 and a[2] == b[2] if "sharded" in runs else None,
        **{f"{name}_vs_reference": relative_difference(runs[name]["losses"], runs["reference"]["losses"])
           for name in compared},
        **{f"{name}_weights_vs_reference": weights_difference(runs_dir, name) for name in compared},
        memory_measured_over_predicted=measured_over_predicted(runs, "max_memory_allocated", "predicted_peak_bytes"),
        outside_allocator_over_predicted=measured_over_predicted(runs, "outside_allocator",
                                                                 "predicted_outside_allocator_bytes"))


def gpu_smoke_runs(args, device, out_dir, out):
    """The distributed part of --gpu-smoke (smoke_launches): fills out["launches"], out["runs"], out["checks"] (a launch
    that failed: out["errors"])."""
    recipe = GPU_SMOKE[args.preset]
    pool, runs_dir = os.path.join(out_dir, "pool"), os.path.join(out_dir, "runs")
    data.prepare("stdlib", pool, tokenizer="bytes", train_tokens=recipe["train_tokens"],
                 val_tokens=recipe["val_tokens"] + recipe["val_tokens"] // 64)  # + each window's extra target
    common = ["--arch", "untied_grow", "--depth", str(recipe["depth"]), "--preset", args.preset, "--tokenizer",
              "bytes", "--data-dir", pool, "--runs-dir", runs_dir, "--steps", str(recipe["steps"]),
              "--crossover-fractions", "0.5", "--save-every", "2", "--val-tokens", str(recipe["val_tokens"]),
              "--device", device.type, *SHORT_TIMEOUT,
              *(["--device-batch-size", *map(str, args.device_batch_size)] if args.device_batch_size else [])]
    for name, layout, run_name, argv in smoke_launches():  # layout: (nodes, processes per node)
        if name.startswith("resume") and out["launches"].get("start", {}).get("returncode") != 0:
            out["skipped"][name] = "not started: the start failed"
            continue
        out["launches"][name] = launch = smoke_launch(name, [*common, "--run-name", run_name, *argv], out_dir,
                                                      recipe["launch_timeout"], *layout, device)
        if launch["returncode"] != 0:
            out["errors"][name] = f"exit code {launch['returncode']}" + (
                " (timed out)" if launch["timed_out"] else "") + f"; see {launch['log']}"
        if name == "start" and launch["returncode"] == 0:  # the checkpoint both resumes continue
            shutil.copytree(os.path.join(runs_dir, "default"), os.path.join(runs_dir, "sharded"))
    if out["errors"] or out["skipped"]:
        return
    out["runs"] = {run_name: smoke_run(os.path.join(runs_dir, run_name)) for _, _, run_name, _ in smoke_launches()}
    out["checks"] = smoke_checks(out["runs"], recipe["steps"], runs_dir)


def smoke_launches():
    """[(launch, (nodes, processes per node), run folder, train.py flags)]: 2 processes stopped at step 2, resumed two
    ways; 2 "nodes" of 1 (every cross-node group made and used); ONE process, which no distributed defect can share."""
    pair, nodes = (1, SMOKE_PROCESSES), (SMOKE_PROCESSES, 1)
    return [("start", pair, "default", ["--stop-after", "2"]), ("resume_default", pair, "default", ["--resume"]),
            ("resume_sharded", pair, "sharded", ["--resume"]),
            ("multinode", nodes, "multinode", []), ("reference", (1, 1), "reference", [])]


def gpu_smoke(args):
    """--gpu-smoke: the distributed runs (gpu_smoke_runs), then on CUDA the one-GPU acceptance run with memory
    snapshots; a part the machine cannot run (fewer than 2 GPUs, no GPU) is listed under "skipped" and makes the
    verdict incomplete -> the verdict's exit code (arms.EXIT_CODES). A SIGTERM or SIGINT stops the launch in
    flight and its workers, is recorded, and ends bench.py with 128 + the signal."""
    out_dir = args.out
    device = single_process(args.device, "--gpu-smoke")
    require_gpu(args, device, "--gpu-smoke")
    if not claim_empty_folder(out_dir, "gpu_smoke.json"):  # atomic: of two runs into one folder, one gets it
        raise UsageError(f"--out {out_dir} already exists and is not an empty folder; pass another one")
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    dtype = "bf16" if device.type == "cuda" else "fp32"
    out = dict(verdict=None, exit_code=None, misses=[], unmeasured=[], date=time.strftime("%Y-%m-%d"),
               device=torch.cuda.get_device_name(device) if gpus else "cpu", gpus=gpus, dtype=dtype,
               torch=torch.__version__, nccl=str(torch.cuda.nccl.version()) if gpus else None, preset=args.preset,
               processes=SMOKE_PROCESSES, launches={}, runs={}, checks=None, gpu_check=None, parts={}, errors={},
               skipped={})
    path, t0 = os.path.join(out_dir, "gpu_smoke.json"), time.perf_counter()
    try:
        smoke_parts(args, device, gpus, out_dir, out, path)
    except Stopped as stop:
        out["errors"]["stopped"] = f"{stop} to bench.py: the launch in flight and its workers were stopped"
        raise
    finally:
        gate("gpu_smoke", out, dtype)
        out["total_seconds"] = time.perf_counter() - t0
        write_json(path, out)
        summary = verdict_markdown("gpu_smoke", out, path, f"gpu-smoke: {out['device']}, {out['gpus']} GPU(s), torch "
                                   f"{out['torch']}, {out['date']}", gpu_check=out.get("gpu_check") or {})
        write_text(os.path.join(out_dir, "gpu_smoke.md"), summary)
    print("gpu-smoke: " + verdict_summary(out, path, f" in {out['total_seconds']:.0f}s") + " and gpu_smoke.md")
    return out["exit_code"]


def smoke_parts(args, device, gpus, out_dir, out, path):
    """gpu_smoke's parts in order, the JSON rewritten after each: the distributed runs (skipped with fewer than 2 GPUs:
    only they need a second), then on CUDA --gpu-check into out_dir/gpu_check.json (its verdict under out["parts"])."""
    if device.type == "cuda" and gpus < SMOKE_PROCESSES:
        out["skipped"]["runs"] = f"{SMOKE_PROCESSES} GPUs needed, {gpus} visible: NCCL was not started"
    else:
        gpu_smoke_runs(args, device, out_dir, out)
    write_json(path, out)
    if device.type == "cuda":
        check_args = argparse.Namespace(**dict(vars(args), out=os.path.join(out_dir, "gpu_check.json"),
                                               memory_snapshots=out_dir))
        out["gpu_check_exit_code"] = gpu_check(check_args)
        out["gpu_check"] = json.load(open(check_args.out))
        out["parts"]["gpu_check"] = out["gpu_check"]["verdict"]
    else:
        out["skipped"]["gpu_check"] = "needs a CUDA device (--cpu-exercise: the code path ran on the CPU)"


# ----------------------------------------------------------------------------------------------------------------------
# Command line: the checks of build_parser's flags

MODES = {"gpu_smoke": "--gpu-smoke", "gpu_check": "--gpu-check", "compile_time": "--compile-time",
         "bench": "the step-time bench (no --gpu-smoke, --gpu-check or --compile-time)"}  # run()'s order
MODES_READING = dict(out=["gpu_check", "gpu_smoke"], memory_snapshots=["gpu_check"],
                     bundle_dir=["gpu_check", "gpu_smoke"], cpu_exercise=["gpu_check", "gpu_smoke"],
                     bench_repeats=["bench"],
                     bench_steps=["bench", "compile_time"])


def check_ignored_flags(parser, args):
    """Refuse a flag this invocation would ignore: train.py's flags of the training run itself (their group in
    arms.training_parser), a second mode, and a bench flag that only another mode reads (MODES_READING)."""
    run_flags = next(g for g in parser._action_groups if g.title == TRAINING_RUN_FLAGS)._group_actions
    for action in run_flags:
        if getattr(args, action.dest) != action.default:
            raise UsageError(f"{action.option_strings[0]} is for training runs (train.py); drop it for bench.py")
    modes = [mode for mode in MODES if getattr(args, mode, False)] or ["bench"]
    if len(modes) > 1:
        raise UsageError(f"{' and '.join(MODES[m] for m in modes)} are separate runs of bench.py; pass one")
    for action in parser._actions:
        readers = MODES_READING.get(action.dest)
        if readers and modes[0] not in readers and getattr(args, action.dest) != action.default:
            raise UsageError(f"{action.option_strings[0]} is read only by {' or '.join(MODES[m] for m in readers)}; "
                             "drop it for this run")


def parse_args(argv):
    p = build_parser()
    args = p.parse_args(argv)
    if args.dry_run:
        raise UsageError("--dry-run plans a training run: python train.py --arch A --depth D --dry-run")
    check_ignored_flags(p, args)
    if args.out is None:
        args.out = "gpu_smoke" if args.gpu_smoke else "gpu_check.json" if args.gpu_check else None
    if args.cpu_exercise:  # the code path on the CPU, at the tiny preset unless one is named
        if args.device == "cuda":
            raise UsageError("--cpu-exercise runs on the CPU; drop --device cuda (or --cpu-exercise)")
        args.device, args.preset = "cpu", args.preset or "cpu"
    args.preset = args.preset or ("cpu" if not (args.gpu_check or args.gpu_smoke) and not torch.cuda.is_available()
                                  else "paper")
    for name, value in BENCH_SHAPES.get(args.bench_shape, {}).items():  # explicit flags win over the shape's
        if getattr(args, name) is None:
            setattr(args, name, [value] if name == "depth" else value)
    return train.checked_args(p, args)


def run(argv):
    args = parse_args(argv)
    if args.gpu_smoke or args.gpu_check:
        return (gpu_smoke if args.gpu_smoke else gpu_check)(args)  # the verdict's exit code
    (compile_time if args.compile_time else bench)(args)


def main(argv=None):
    """bench.py's exit code: 0 passed, 1 failed, 4 missed, 5 incomplete (arms.EXIT_CODES), 2 a usage error, 128 +
    the signal when stopped by one."""
    try:
        return cli_main_distributed(run, "bench.py", argv)
    except Stopped as stop:
        print(f"bench.py: stopped by {stop}; the torchrun in flight and its workers were stopped and waited for",
              file=sys.stderr)
        return 128 + stop.signum


if __name__ == "__main__":
    exit_process(main())
