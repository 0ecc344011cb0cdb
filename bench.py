"""bench.py — step time of train.py's own training step: achieved FLOP/s and MFU per arm against a matmul roofline,
and the step-time ratios between arms (the boundary operator's cost, untying's cost).

    python bench.py --depth 4                         # cpu preset without CUDA: GFLOP/s vs the roofline, ratios
    python bench.py --depth 12 --preset paper         # on a GPU: MFU of each arm's step, compiled
    python bench.py --depth 2 --seq-len 64 --no-compile   # train.py's model, recipe and device flags apply too

Every step is train.py's train_step on random tokens, compiled where a run would be. Each round times a roofline sample
and one step of every arm (the order rotated); medians over rounds and repetitions. The ratios are the point: absolute
numbers depend on the box. The GPU checks of a new cluster are tests: python -m pytest -m gpu -q.
"""
import os
from statistics import median

from arms import BENCH_PAIRS, PRESETS
from common import Parser, UsageError, answer_help, integer

BENCH_ARMS = tuple(dict.fromkeys(arch for pair in BENCH_PAIRS for arch in pair))


def build_parser():
    p = Parser(prog="bench.py", description=__doc__.split("\n\n")[0],
               epilog="train.py's model, recipe and device flags apply too, e.g. --seq-len, --compile, --peak-flops")
    p.add_argument("--depth", type=integer(1, 1024), default=None, help="default: the preset's anchor depth")
    p.add_argument("--preset", choices=list(PRESETS), default=None, help="default: paper on CUDA, else cpu")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--device-batch-size", type=integer(1, 2 ** 30), default=None,
                   help="sequences per step of every arm (default: the smallest of the arms' micro-batches)")
    p.add_argument("--bench-steps", type=integer(1, 10 ** 6), default=10,
                   help="rounds per repetition: a roofline sample and one step of every arm")
    p.add_argument("--bench-repeats", type=integer(1, 1000), default=3, help="interleaved repetitions (medians)")
    return p


if __name__ == "__main__":
    answer_help(build_parser)  # before torch loads

import torch
import torch.utils.benchmark
from torch.utils.benchmark.utils.timer import timer as benchmark_timer

import model as model_lib
import train
from common import cli_main, exit_process, setup_distributed
from plan import device_batch_size


def matmul_roofline(device):
    """FLOP/s of a size^3 matmul (fp32 on CPU, bf16 on CUDA), timed by torch.utils.benchmark: what this box can do."""
    size, dtype = (4096, torch.bfloat16) if device.type == "cuda" else (1024, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    timer = torch.utils.benchmark.Timer("a @ a", globals=dict(a=a), num_threads=torch.get_num_threads())
    return 2 * size ** 3 / timer.timeit(8).mean


class SyntheticLoader:
    """data.TrainLoader's batch() on uniform random token ids (seeded per step): the step's cost without a pool."""

    def __init__(self, vocab_size, seq_len, batch_seqs):
        self.vocab_size, self.seq_len, self.batch_seqs, self.steps_per_epoch = vocab_size, seq_len, batch_seqs, 10 ** 9

    def batch(self, step, rank, world):  # one process: rank 0 of 1 reads the whole step
        generator = torch.Generator().manual_seed(step)
        return 1, torch.randint(0, self.vocab_size, (self.batch_seqs, self.seq_len + 1), generator=generator)


def plan_args(args, arch, steps, batch=None):
    """train.py's parsed flags for one timed arm: `steps` steps, each one micro-batch of `batch` sequences."""
    argv = ["--arch", arch, "--depth", str(args.depth), "--preset", args.preset, "--device", args.device,
            "--steps", str(steps), *args.train_flags]
    argv += ["--total-batch-tokens", str(batch * args.seq_len), "--device-batch-size", str(batch)] if batch else []
    return train.parse_args(argv)


def timed_step(arm):
    """One more train_step of `arm` (a train.Training) -> its seconds (benchmark_timer synchronises the device)."""
    t0 = benchmark_timer()
    _, passes, _, _ = train.train_step(arm)
    seconds = benchmark_timer() - t0
    train.count_step(arm.run, arm.state, passes, seconds)
    return seconds


def interleaved_arms(args, device, steps, repeats):
    """The BENCH_ARMS on random tokens (train.py's start, nothing written, every parameter N(0, 0.02): no branch is
    cheap behind a zero out-projection), one micro-batch per step (--device-batch-size, else the smallest of theirs),
    and a warm-up step each; then `repeats` x `steps` rounds -> arms, [{arch: median seconds, "roofline": FLOP/s}]."""
    batch = args.device_batch_size or min(
        device_batch_size(train.make_plan(plan_args(args, arch, 1)), 1, device.type) for arch in BENCH_ARMS)
    arms = {}
    for arch in BENCH_ARMS:
        run_args = plan_args(args, arch, 1 + repeats * steps, batch)
        plan = train.make_plan(run_args)
        loader = SyntheticLoader(plan.model_config.vocab_size, plan.seq_len, batch)
        arms[arch] = train.start_training(train.new_run(run_args, plan, batch, 0, 1, device, loader))
        for p in arms[arch].model.parameters():
            torch.nn.init.normal_(p, std=0.02)
        timed_step(arms[arch])
    repetitions = []
    for rep in range(repeats):
        samples = {name: [] for name in (*BENCH_ARMS, "roofline")}
        for k in range(steps):
            samples["roofline"].append(matmul_roofline(device))
            shift = (rep * steps + k) % len(BENCH_ARMS)
            for arch in BENCH_ARMS[shift:] + BENCH_ARMS[:shift]:
                samples[arch].append(timed_step(arms[arch]))
        repetitions.append({name: median(values) for name, values in samples.items()})
    return arms, repetitions


def step_ratios(repetitions):
    """Each BENCH_PAIRS ratio of the step times: the median over repetitions."""
    return {f"{a}_over_{b}": median(r[a] / r[b] for r in repetitions) for a, b in BENCH_PAIRS}


def bench(args, device):
    """Achieved FLOP/s per arm = model.flops_per_token (forward and backward, causal attention at half; the optimizer
    steps' FLOPs not counted, their time is) x tokens / step time, beside the roofline and, with a peak, the MFU; then
    the BENCH_PAIRS ratios. Every number is a median over repetitions."""
    arms, repetitions = interleaved_arms(args, device, args.bench_steps, args.bench_repeats)
    plan0 = arms["vanilla"].run.plan
    cfg0, roofline = plan0.model_config, median(r["roofline"] for r in repetitions)
    print(f"bench: {args.preset} preset d{args.depth}, width {cfg0.width}, head_dim {cfg0.head_dim}, T {cfg0.seq_len}, "
          f"vocab {cfg0.vocab_size}, batch {plan0.tokens_per_step // plan0.seq_len}, {torch.get_num_threads()} "
          f"threads, {'compiled' if train.use_compile(arms['vanilla'].run.args, device) else 'eager'}; medians of "
          f"{args.bench_repeats} repetitions x {args.bench_steps} rounds")
    print(f"roofline: {roofline / 1e9:,.1f} GFLOP/s ({'bf16' if device.type == 'cuda' else 'fp32'} matmul loop)")
    peak, results = arms["vanilla"].run.args.peak_flops or train.gpu_peak_flops(device), {}
    for arch, arm in arms.items():
        cfg, tokens = arm.run.plan.model_config, arm.run.plan.tokens_per_step
        flops = model_lib.flops_per_token(cfg, cfg.passes) * tokens
        dt = median(r[arch] for r in repetitions)
        r = results[arch] = dict(seconds=dt, flops_per_second=flops / dt,
                                 tokens_per_second=tokens / dt, mfu=flops / dt / peak if peak else None,
                                 roofline_fraction=median(flops / rep[arch] / rep["roofline"] for rep in repetitions))
        print(f"{arch:11s} | {1000 * dt:8.1f} ms/step | {tokens / dt:10,.0f} tok/s"
              f" | {flops / dt / 1e9:8.1f} GFLOP/s | {100 * r['roofline_fraction']:5.1f}% of roofline"
              + (f" | MFU {r['mfu']:.1%}" if peak else ""))
    ratios = step_ratios(repetitions)
    for a, b in BENCH_PAIRS:
        print(f"{a}/{b} = {ratios[f'{a}_over_{b}']:.3f}")
    return dict(results, roofline_flops_per_second=roofline, **ratios)


def parse_args(argv):
    """bench.py's flags; the others are train.py's (checked by its parser), less those of a training run."""
    args, args.train_flags = build_parser().parse_known_args(argv)
    run_flags = {option for group in train.build_parser()._action_groups if group.title == "the run"
                 for action in group._group_actions for option in action.option_strings} | {"--arch", "--dry-run"}
    given = next((f.split("=")[0] for f in args.train_flags if f.split("=")[0] in run_flags), None)
    if given:
        raise UsageError(f"{given} is for training runs (train.py); drop it for bench.py")
    args.preset = args.preset or ("paper" if torch.cuda.is_available() and args.device != "cpu" else "cpu")
    args.depth = args.depth or PRESETS[args.preset].anchor_depth
    args.seq_len = train.make_plan(plan_args(args, "vanilla", 1)).seq_len  # and train.py's flags checked once
    return args


def run(argv):
    args = parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError("bench.py runs in one process; start it with python, not torchrun")
    bench(args, setup_distributed(args.device)[2])


def main(argv=None):
    return cli_main(run, "bench.py", argv)


if __name__ == "__main__":
    exit_process(main())
