"""train.py — train one arm of the paper at one depth with that arm's compute-optimal recipe.

One dial: `--arch A --depth d` derives width, heads, split, tokens per parameter, steps, LRs and the growth step
(plan.make_plan) from the arm's row of arms.ARMS (arXiv 2609.19107, App. A; docs/recipe.md). One CPU, one GPU, or
torchrun (FSDP2 on NCCL or gloo; HSDP across nodes). Every optimizer step sees the same tokens whatever the world size,
so a run resumes on any number of GPUs. On CUDA the micro-batch is measured: one forward and backward of the largest
stage, halved until it fits.

    python train.py --arch untied_grow --depth 8 --dry-run               # the plan as one JSON object
    torchrun --nproc_per_node 8 train.py --arch vanilla --depth 12       # a paper ladder run on FineWeb
    python train.py --arch operator_1 --depth 3 --preset cpu             # offline, byte-level stdlib corpus
    python train.py --arch operator_1 --depth 8 --passes 4 --data-constrained tuned-wd

Outputs go to <runs-dir>/<run-name>/: result.json, trajectory.jsonl, report.md, checkpoints/step_N/ (DCP folders; the
last is renamed checkpoints/final, what core_eval.py reads). --resume continues from the newest complete checkpoint.
Exit codes and the error policy: docs/reliability.md.
"""
import argparse, os, sys

from arms import (ARMS, ATTENTION_BACKENDS, CPU_ATTENTION_BACKENDS, CPU_LADDER_DEPTHS, DATA_CONSTRAINED,
                  DATA_CONSTRAINED_LOOPS, DEMO_ARMS, EVAL_COMPUTE_SHARE, GPU_PEAK_FLOPS, MAX_DEPTH, MAX_PASSES,
                  MAX_STEPS, PAPER_ARMS, PARAM_GROUPS, PRESETS, RELEASE_SERIES, SEEDS, USER_ARMS, Arm, Preset,
                  add_knob_flags, add_model_flags)
from common import DIST_TIMEOUT_MINUTES, Parser, UsageError, answer_help, cli_main, integer, number


def build_parser():
    """train.py's flags, torch-free so that `--help` answers before torch loads."""
    p = Parser(prog="train.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
               epilog="python train.py --ladder TARGET ...: the runs of `bash ladder.sh TARGET ...`, a line each "
                      "(--ladder --help);\npython train.py --ladder-dry-run ... < RUNS: that ladder's dry run")
    p.add_argument("--arch", choices=list(ARMS), required=True)
    p.add_argument("--depth", type=integer(1, MAX_DEPTH), nargs="+", required=True, help="several only with --dry-run")
    p.add_argument("--preset", choices=list(PRESETS), default="paper", help="paper or cpu")
    p.add_argument("--dry-run", action="store_true", help="print the plan (JSON, with GPU-hours) per depth and exit")
    run = p.add_argument_group("the run")
    run.add_argument("--steps", type=integer(1, MAX_STEPS), help="override the derived step count")
    run.add_argument("--run-name", help="default ARCH_dDEPTH")
    run.add_argument("--runs-dir", default=os.environ.get("RUNS_DIR", "runs"))
    run.add_argument("--data-dir", help="token pool from data.py (env DATA_DIR; preset default)")
    run.add_argument("--crossover-fractions", type=number("(0, 1)"), nargs="+", help="steps before each growth")
    run.add_argument("--stop-after", type=integer(1, MAX_STEPS), help="stop after N steps without changing the plan")
    run.add_argument("--save-every", type=integer(0, MAX_STEPS), help="checkpoint every N steps (0: only at the end)")
    run.add_argument("--log-every", type=integer(1, MAX_STEPS), help="print (fetch the losses) every N steps")
    run.add_argument("--eval-every", type=integer(0, MAX_STEPS), help="validate every N steps (0: at the start, end, "
                     f"each epoch, around a growth); default: <= {EVAL_COMPUTE_SHARE:.0%}% of the training compute")
    run.add_argument("--wandb", metavar="PROJECT", help="also log to wandb (env WANDB_PROJECT)")
    run.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    run.add_argument("--resume-or-start", action="store_true", help="--resume, or step 0 without a checkpoint")
    run.add_argument("--verify", action="store_true", help="hash the pool's token files against corpus.json first "
                     "(minutes for a FineWeb pool; do it once after copying a pool)")
    run.add_argument("--dist-timeout", type=number("[1, 1440]"), default=DIST_TIMEOUT_MINUTES, metavar="MINUTES",
                     help=f"how long a collective waits for the slowest rank (default {DIST_TIMEOUT_MINUTES})")
    device = p.add_argument_group("device")
    device.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    device.add_argument("--compute-dtype", choices=["bfloat16", "float32"], help="default: bfloat16 on CUDA only")
    device.add_argument("--device-batch-size", type=integer(1, 2 ** 30),
                        help="sequences per micro-batch (default: the preset's; on CUDA halved until it fits)")
    device.add_argument("--compile", action=argparse.BooleanOptionalAction, help="default: on CUDA")
    device.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                        help="SDPA's backends (auto: cudnn where seq_len %% 128 == 0); CPU: auto, default, flash, math")
    device.add_argument("--polar-express-dtype", choices=["auto", "bf16", "fp32"], default="auto", help="Muon's")
    device.add_argument("--peak-flops", type=number("(0, inf)"), help="per-GPU peak for MFU (default: the GPU's)")
    rec = p.add_argument_group("recipe overrides (LRs are anchor-depth values, scaled to --depth)")
    rec.add_argument("--optimizer", choices=["muon", "adamw"], default="muon")
    rec.add_argument("--recipe", choices=list(ARMS), help="train with another arm's recipe")
    rec.add_argument("--data-constrained", choices=list(DATA_CONSTRAINED))
    rec.add_argument("--tokenizer", choices=["gpt2", "bytes"])
    rec.add_argument("--seed", type=integer(*SEEDS), default=42)
    rec.add_argument("--train-token-limit", type=integer(1, 2 ** 48))
    rec.add_argument("--epochs", type=integer(1, MAX_STEPS), help="epochs over the token limit (--data-constrained)")
    add_knob_flags(rec, Arm, "train")
    add_knob_flags(rec, Preset, "train")
    rec.add_argument("--random-passes", type=integer(1, MAX_PASSES), nargs="+", help="after growth (App. B.4)")
    add_model_flags(p)
    return p


def each_once(flag, values):
    twice = next((v for i, v in enumerate(values or []) if v in values[:i]), None)
    if twice is not None:  # a value twice would plan one run twice (or sample one pass count twice as often)
        raise UsageError(f"{flag} names {twice} twice; give each value once")


# --- Ladders: the runs ladder.sh launches (python train.py --ladder lists them)

LADDER_PRESETS = ("paper", "cpu", "d26", "data-constrained")


def ladder_runs(target, preset=None, depths=None, seeds=None, replicate_depths=None):
    """[(run name, train.py arguments)] of `bash ladder.sh TARGET ...` (target: an arm, all, user or demo)."""
    preset = preset or ("cpu" if target == "demo" else "paper")
    groups = dict(all=list(PAPER_ARMS), user=list(USER_ARMS), demo=list(DEMO_ARMS))
    archs = groups.get(target, [target])
    for bad, message in (
            (replicate_depths and not seeds, "--replicate-depths needs --seed, e.g. --seed 0 1 2"),
            (target not in (*ARMS, *groups), f"unknown arch '{target}' (one of: {' '.join([*ARMS, *groups])})"),
            (target == "demo" and preset != "cpu", f"the demo runs the cpu preset, not --preset {preset}"),
            (not archs, "there are no user arms yet: add one to USER_ARMS in arms.py (docs/your_own_arm.md)"),
            (preset == "d26" and archs != ["untied_grow"], "the d26 preset is Untied-Grow only"),
            (preset == "d26" and depths and list(depths) != [26],
             f"the d26 preset is the one run at depth 26, not --depth {' '.join(map(str, depths or []))}"),
            (preset == "data-constrained" and archs != ["operator_1"], "the data-constrained grid is Operator-1's")):
        if bad:
            raise UsageError(message)
    # every run names its train.py preset: ladder.sh refuses flags after -- that would override a run's arguments
    preset_args = ["--preset", "cpu" if preset == "cpu" else "paper"]
    runs = []  # (name, depth, arguments)
    for arch in archs:
        if preset in ("paper", "cpu"):
            runs += [(f"{arch}_d{d}", d, ["--arch", arch, "--depth", str(d), *preset_args])
                     for d in depths or (ARMS[arch].ladder_depths if preset == "paper" else CPU_LADDER_DEPTHS)]
        elif preset == "d26":
            runs.append(("untied_grow_d26", 26, ["--arch", "untied_grow", "--depth", "26", *preset_args]))
        else:
            runs += [(f"dc_{wd}_d{d}_k{k}", d, ["--arch", "operator_1", "--depth", str(d), "--passes", str(k),
                                                "--data-constrained", wd, *preset_args])
                     for wd in DATA_CONSTRAINED for d in depths or DATA_CONSTRAINED_LOOPS
                     for k in DATA_CONSTRAINED_LOOPS.get(d, ())]
    ladder_depths = sorted({depth for _, depth, _ in runs})
    if not runs:
        raise UsageError(f"the data-constrained grid has no depth {' '.join(map(str, depths))} (its depths: "
                         f"{' '.join(map(str, DATA_CONSTRAINED_LOOPS))})")
    stray = [d for d in replicate_depths or () if d not in ladder_depths]
    if stray:
        raise UsageError(f"--replicate-depths {' '.join(map(str, stray))} is not a depth of this ladder (its depths: "
                         f"{' '.join(map(str, ladder_depths))})")
    if not seeds:
        return [(name, run_args) for name, _, run_args in runs]
    return [(f"{name}_s{s}", run_args + ["--seed", str(s)]) for name, depth, run_args in runs
            for s in (seeds if not replicate_depths or depth in replicate_depths else seeds[:1])]


def print_ladder(argv):
    """python train.py --ladder TARGET [ladder.sh's options]: a line per run, its name and train.py arguments."""
    p = Parser(prog="train.py --ladder")
    p.add_argument("target", help="an arm, all, user or demo")
    p.add_argument("--preset", choices=LADDER_PRESETS, help="default: paper; demo: cpu")
    for flag, bounds in (("--depth", (1, MAX_DEPTH)), ("--seed", SEEDS), ("--replicate-depths", (1, MAX_DEPTH))):
        p.add_argument(flag, type=integer(*bounds), nargs="+", help="one or more, e.g. 6 8 10")
    args = p.parse_args(argv)
    for flag in ("depth", "seed", "replicate_depths"):
        each_once("--" + flag.replace("_", "-"), getattr(args, flag))
    for name, run_args in ladder_runs(args.target, args.preset, args.depth, args.seed, args.replicate_depths):
        print(name, *run_args)


if __name__ == "__main__" and sys.argv[1:2] == ["--ladder"]:  # torch-free: ladder.sh's listing
    sys.exit(cli_main(print_ladder, "train.py --ladder", sys.argv[2:]))
if __name__ == "__main__" and sys.argv[1:2] != ["--ladder-dry-run"]:
    answer_help(build_parser)  # before torch loads

import contextlib, csv, datetime, fcntl, functools, json, math, shutil, signal, time, types, warnings
from dataclasses import asdict, dataclass, field, fields

import numpy
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

import data
import model as model_lib
import muon
from common import (MAX_NODES, MAX_PROCESSES_PER_NODE, Interrupted, clock, exit_process, raise_interrupted,
                    setup_distributed, torchrun_env, uses_cuda, write_json, write_text)
from plan import device_batch_size, lr_multiplier, make_plan, passes_at, schedule_notes, stage_at, stage_index

warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def planned_micro_batch(plan, args, world):  # the preset's on the CPU, the arm's rule on GPUs (the probe may halve it)
    return device_batch_size(plan, world, "cpu" if plan.preset == "cpu" and args.device != "cuda" else "cuda",
                             args.device_batch_size)


def ladder_dry_run(argv):
    """python train.py --ladder-dry-run [-- train.py flags] < `train.py --ladder` lines: runs' GPU-hours."""
    p = Parser(prog="train.py --ladder-dry-run")
    p.add_argument("flags", nargs="*", help="train.py flags for every run, after --")
    p.add_argument("--gpus-per-node", type=integer(1, MAX_PROCESSES_PER_NODE), default=8)
    p.add_argument("--nodes", type=integer(1, MAX_NODES), default=1)
    p.add_argument("--mfu", type=number("(0, 1]"), help="GPU-hours at this MFU instead")
    args = p.parse_args(argv)
    world, flops, hours, runs = args.gpus_per_node * args.nodes, 0, 0.0, 0
    for line in sys.stdin:
        name, *run_args = line.split()
        try:
            run_args = parse_args(run_args + args.flags)
            plan = make_plan(run_args)
            model_lib.check_arm(plan.model_config, run_args.optimizer)
            batch = planned_micro_batch(plan, run_args, world)
        except UsageError as e:
            raise UsageError(f"{name}: {e}") from None
        estimate = gpu_hours_estimate(plan, args.mfu)
        flops, hours, runs = flops + plan.total_flops, hours + estimate["gpu_hours"], runs + 1
        print(f"run {name}: micro-batch {batch} | {plan.total_flops:.3e} FLOPs | ~{estimate['gpu_hours']:,.1f} "
              f"GPU-hours at {estimate['mfu']:.1%} MFU")
    how = (f"at {args.mfu:.0%} MFU" if args.mfu else "an estimate at the MFU the release measured per width; that "
           f"rule misses a width left out of it by up to {100 * leave_one_width_out_error():.1f} MFU points")
    print(f"{runs} runs | {flops:.3e} FLOPs | ~{hours:,.0f} GPU-hours of an H100 ({how}) | {args.gpus_per_node} "
          f"GPUs/node x {args.nodes} nodes: ~{hours / world:,.1f} hours")


@functools.cache  # read once per process: a ladder's dry run prices every run with it
def release_mfu_by_width():
    """{width: mean MFU of the release's timed runs (Fig. 15b)}: measured, not modelled."""
    reference = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference")
    with open(os.path.join(reference, "fineweb_ladders.csv")) as f:
        flops = {(row["arm"], int(row["depth"])): float(row["compute_flops"]) for row in csv.DictReader(f)}
    by_width = {}
    for series, points in read_json(os.path.join(reference, "release", "appendix_ladders", "timing.json")).items():
        for p in points:
            peak_flop = 8 * GPU_PEAK_FLOPS["H100"] * p["compute"] * 3600
            by_width.setdefault(p["width"], []).append(flops[RELEASE_SERIES[series], p["depth"]] / peak_flop)
    return {width: sum(m) / len(m) for width, m in sorted(by_width.items())}


def mfu_at(width, table):
    """MFU at `width`: linear between the nearest widths of `table`, the nearest beyond its ends."""
    return float(numpy.interp(width, sorted(table), [table[w] for w in sorted(table)]))


def leave_one_width_out_error():
    """The largest miss of mfu_at on a width the release timed, predicted from the other widths."""
    table = release_mfu_by_width()
    return max(abs(mfu_at(w, {k: v for k, v in table.items() if k != w}) - table[w]) for w in table)


def gpu_hours_estimate(plan, mfu=None):
    """H100-hours of the plan's FLOPs at `mfu` (default: mfu_at its width), with that rule's leave-one-out miss."""
    mfu = mfu or mfu_at(plan.model_config.width, release_mfu_by_width())
    return dict(gpu_hours=round(plan.total_flops / (GPU_PEAK_FLOPS["H100"] * mfu) / 3600, 2),
                mfu=round(mfu, 4), leave_one_width_out_error=round(leave_one_width_out_error(), 4))


def gpu_peak_flops(device, given=None):
    """--peak-flops, else the detected GPU's dense bf16 peak; None off CUDA or when unknown."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return name and (given or next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None))


def use_compile(args, device):
    return args.compile if args.compile is not None else device.type == "cuda"


def compile_model(model, plan):
    """Regional compilation: each Block compiled (identical blocks share a graph per micro-batch shape and grad mode),
    the rest eager; a block's backward is its own autograd node, so Muon's hooks send its gradients early."""
    torch._dynamo.config.recompile_limit += 2 * (len(plan.pass_stages) + len(plan.random_passes) + 2)
    for block in model.transformer.h:
        block.compile(dynamic=False)


# --- The distributed layout (as torchtitan does it): FSDP2 on a DeviceMesh, 1-D on one node, on several HSDP
# (replicate = nodes, shard = ranks per node); one process trains the plain model. Then the optimizers and growth.

def build_mesh(world, per_node, device, timeout_minutes):
    timeout = datetime.timedelta(minutes=timeout_minutes)  # new_group's default would be NCCL's 10 minutes
    if per_node == world:
        return DeviceMesh.from_group(dist.group.WORLD, device.type, mesh_dim_names=("shard",))
    nodes, rank = world // per_node, dist.get_rank()
    shard = [dist.new_group(list(range(n * per_node, (n + 1) * per_node)), timeout=timeout) for n in range(nodes)]
    replicate = [dist.new_group(list(range(local, world, per_node)), timeout=timeout) for local in range(per_node)]
    return DeviceMesh.from_group([replicate[rank % per_node], shard[rank // per_node]], device.type,
                                 mesh=torch.arange(world).view(nodes, per_node), mesh_dim_names=("replicate", "shard"))


def shard_model(model, mesh):
    """FSDP2, parameters gathered in the compute dtype, gradients reduced in fp32: a group per block run once, the
    embedding's own (one dtype per group); the root keeps lm_head and a tied core, gathered once per micro-batch, not
    K times each way. 0-dim gates (FSDP2 cannot shard them) stay replicated, their gradients averaged by a hook."""
    policy = MixedPrecisionPolicy(param_dtype=model.transformer.wte.weight.dtype, reduce_dtype=torch.float32)
    replicated = {p for p in model.parameters() if p.ndim == 0}
    looped = set(model.core_blocks(0)) if model.cfg.mode == "tied" else set()
    for module in [block for block in model.transformer.h if block not in looped] + [model.transformer.wte]:
        fully_shard(module, mesh=mesh, mp_policy=policy, ignored_params=replicated)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=replicated)
    for p in replicated:
        p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad.div_(dist.get_world_size())))


def autocast(model):
    """bf16 autocast where the model computes in bf16 (its embedding's dtype), none in fp32."""
    dtype = model.transformer.wte.weight.dtype
    return torch.autocast(model.lm_head.weight.device.type, dtype=dtype, enabled=dtype != torch.float32)


def memory_in_use(device):
    """This process's peak memory: CUDA's allocator peaks and what the GPU holds outside it; the CPU's resident set."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return dict(max_memory_allocated=torch.cuda.max_memory_allocated(device),
                    max_memory_reserved=torch.cuda.max_memory_reserved(device), device_used=total - free,
                    outside_allocator=total - free - torch.cuda.memory_reserved(device))
    with open("/proc/self/status") as f:
        kib = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmHWM", "VmRSS")}
    return dict(max_rss=kib["VmHWM"] * 1024, rss=kib["VmRSS"] * 1024)


def gather(obj):
    """Every rank's obj, in rank order (a list of one on one process)."""
    out = [obj] * (dist.get_world_size() if dist.is_initialized() else 1)
    if dist.is_initialized():
        dist.all_gather_object(out, obj)
    return out


def build_optimizers(model, plan, polar_express_dtype="auto"):
    """Muon for arms.PARAM_GROUPS' muon groups, AdamW for the others (--optimizer adamw: for all)."""
    groups = {name: params for name, params in model.param_groups().items() if params}
    adam = sorted((name for name in groups if plan.optimizer == "adamw" or PARAM_GROUPS[name][0] == "adamw"),
                  key=lambda name: PARAM_GROUPS[name][0] == "muon")
    group = lambda name: dict(params=groups[name], lr=plan.group_lr(name), base_lr=plan.group_lr(name),
                              weight_decay=plan.weight_decay if PARAM_GROUPS[name][2] else 0.0)  # noqa: E731
    adamw = torch.optim.AdamW([group(name) for name in adam], betas=tuple(plan.adam_betas), eps=plan.adam_eps,
                              foreach=True)
    for p in (p for name in adam for p in groups[name]):  # all state up front: a checkpoint holds the state of a
        adamw.state[p] = dict(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),  # parameter no step has reached
                              exp_avg_sq=torch.zeros_like(p))  # yet (a later pass's)
    matrix_groups = [name for name in groups if name not in adam]
    if not matrix_groups:
        return [adamw]
    names = {p: name for name, p in model.named_parameters()}  # Muon's checkpoint keys
    matrix = muon.Muon([group(name) for name in matrix_groups], lr=plan.matrix_lr, weight_decay=plan.weight_decay,
                       polar_express_dtype=polar_express_dtype,
                       param_names=[names[p] for name in matrix_groups for p in groups[name]])
    return [matrix, adamw]


def grow(model, optimizers, passes):
    """GPT.grow; what it writes (untied: the stacking copies) gets fresh optimizer state (paper Sec. 3)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    overwritten = model.grow(passes)
    for opt in optimizers:
        muon.reset_state(opt, overwritten)
    return overwritten


# --- Checkpoints, the torchtitan way (docs/reliability.md): RUN/checkpoints/step_000120/ holds DCP's shards of the
# model and optimizers (resharded on load: any number of processes resumes it) and rank 0's meta.json. A save writes
# step_N.tmp, renamed once DCP's .metadata (written last) is there; the newest complete folder wins.

KEEP = 2  # complete checkpoints kept: the newest and the one before it (in case the newest turns out bad)


@dataclass
class RunState:
    """What changes as a run trains; a checkpoint's meta.json holds these fields at its top level."""
    step: int = 0
    evals: list = field(default_factory=list)
    growth_events: list = field(default_factory=list)
    flops: int = 0
    matrix_flops: int = 0        # without attention: the convention of the paper's data-constrained loop grid
    train_seconds: float = 0.0
    tokens: int = 0
    wall_seconds: float = 0.0    # every invocation's, from its first step (start-up excluded), resumes added
    eval_seconds: float = 0.0    # of that, in validations
    memory_measured: list = field(default_factory=list)  # every rank's peak memory, per invocation


def read_json(path):
    with open(path) as f:
        return json.load(f)


def complete_checkpoints(ckpt_dir):
    """The complete checkpoint folders in ckpt_dir, oldest first (final last)."""
    names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
    steps = sorted(int(n[5:]) for n in names if n.startswith("step_") and n[5:].isdigit())
    folders = [os.path.join(ckpt_dir, f"step_{s:06d}") for s in steps] + [os.path.join(ckpt_dir, "final")]
    return [f for f in folders if os.path.isfile(os.path.join(f, ".metadata"))]


def load_checkpoint_model(path, device="cpu"):
    """(GPT in eval mode, its weights record) of checkpoint `path`, or of the newest in a checkpoints or run folder."""
    found = [path] if os.path.isfile(os.path.join(path, ".metadata")) else \
        complete_checkpoints(path) or complete_checkpoints(os.path.join(path, "checkpoints"))
    if not found:
        raise UsageError(f"{path} holds no complete train.py checkpoint (a folder with DCP's .metadata): pass a run "
                         "folder, its checkpoints folder or one step folder")
    record = read_json(os.path.join(found[-1], "meta.json"))["weights"]
    model = model_lib.GPT(model_lib.ModelConfig(**record["model_config"]), device=device, draw_weights=False)
    dcp.load(dict(model=model.state_dict()), checkpoint_id=found[-1], no_dist=True)
    model.set_passes(int(record["passes"]))
    return model.eval(), record


def read_run_state(folder):
    meta = read_json(os.path.join(folder, "meta.json"))
    return RunState(**{f.name: meta[f.name] for f in fields(RunState)})


def optimizer_state(model, optimizers):
    """The optimizers' tensors by parameter name (references to the live ones), as DCP saves and loads them."""
    out = {}
    for opt in optimizers:
        if isinstance(opt, muon.Muon):
            out["muon"] = {k: v for k, v in opt.state_dict().items() if k != "param_groups"}
        else:
            out["adamw"] = get_optimizer_state_dict(model, opt)["state"]
    return out


def save_checkpoint(ckpt_dir, model, optimizers, state, plan):
    """Collective: step_N into ckpt_dir, then the complete ones past KEEP and any .tmp leftover removed."""
    folder = os.path.join(ckpt_dir, f"step_{state.step:06d}")
    tmp, world = folder + ".tmp", dist.get_world_size() if dist.is_initialized() else 1
    rank_0 = world == 1 or dist.get_rank() == 0
    if rank_0:
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed save's leftover: never complete, never read
        os.makedirs(tmp)
        matrix = [opt for opt in optimizers if isinstance(opt, muon.Muon)]
        plan_dict = plan.as_dict()
        write_json(os.path.join(tmp, "meta.json"), dict(
            plan=plan_dict, world_size=world, rng=torch.get_rng_state().tolist(),
            weights=dict(model_config=plan_dict["model_config"], passes=plan.passes_final, tokenizer=plan.tokenizer,
                         step=state.step),
            muon_param_groups=matrix[0].state_dict()["param_groups"] if matrix else [],
            **asdict(state)))
    if world > 1:
        dist.barrier()
    dcp.save(dict(model=get_model_state_dict(model), optimizer=optimizer_state(model, optimizers)),
             checkpoint_id=tmp, no_dist=world == 1)  # .metadata last, by rank 0, after every shard
    if rank_0:
        os.replace(tmp, folder)
        for old in complete_checkpoints(ckpt_dir)[:-KEEP] + [os.path.join(ckpt_dir, n) for n in os.listdir(ckpt_dir)
                                                             if n.endswith(".tmp")]:
            shutil.rmtree(old)
    if world > 1:
        dist.barrier()


def load_checkpoint(folder, model, optimizers):
    """Collective: the weights, optimizer and RNG state save_checkpoint wrote, at any world size -> RunState."""
    meta = read_json(os.path.join(folder, "meta.json"))
    tensors = dict(model=get_model_state_dict(model), optimizer=optimizer_state(model, optimizers))
    dcp.load(tensors, checkpoint_id=folder, no_dist=not dist.is_initialized())
    set_model_state_dict(model, tensors["model"])
    for opt in optimizers:
        if isinstance(opt, muon.Muon):
            opt.load_state_dict(dict(tensors["optimizer"]["muon"], param_groups=meta["muon_param_groups"]))
        else:
            groups = get_optimizer_state_dict(model, opt)["param_groups"]
            set_optimizer_state_dict(model, opt, dict(state=tensors["optimizer"]["adamw"], param_groups=groups))
    torch.set_rng_state(torch.tensor(meta["rng"], dtype=torch.uint8))
    return read_run_state(folder)


# --- A run: its folder (one writer at a time, never another run's), processes and data

def run_lock(args):
    """One writer per run: rank 0 holds a flock on RUN/train.lock for its life -> the lock file (or None)."""
    if torchrun_env()[1] != 0:
        return None
    try:
        os.makedirs(args.run_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the run folder {args.run_dir} ({e.strerror}); pass another --runs-dir or "
                         "--run-name") from None
    lock = open(os.path.join(args.run_dir, "train.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        raise UsageError(f"{args.run_dir} is being written by another train.py ({lock.read().strip() or 'starting'}); "
                         "wait for it to finish or stop it first") from None
    lock.truncate(0)
    lock.write(f"PID {os.getpid()} on {os.uname().nodename}\n")
    lock.flush()
    return lock


def open_run(args, plan):
    """Processes, output folder and data of a run; None when --resume finds it complete."""
    rank, world, device = setup_distributed(args.device, args.dist_timeout)
    run_dir = args.run_dir
    # agree on the plan: every rank runs rank 0's in rank 0's folder (a rank given another --seed would train on)
    every = gather(dict(plan.as_dict(), run_folder=os.path.abspath(run_dir), resume=[args.resume, args.resume_or_start],
                        device_batch_size=args.device_batch_size))
    for r, theirs in enumerate(every):
        what = next((key for key in every[0] if theirs.get(key) != every[0][key]), None)
        if what is not None:
            raise UsageError(f"rank {r} would run another plan than rank 0 ({what}: {theirs.get(what)} on rank {r}, "
                             f"{every[0][what]} on rank 0): give every rank the same flags and environment")
    held = sorted(set(os.listdir(run_dir)) - {"train.lock", "train.log", "ladder.lock"})  # ladder.sh's files
    if held and not (args.resume or args.resume_or_start):  # a new run never writes into another run's folder
        raise UsageError(f"{run_dir} already holds files ({held[0]}, ...); pass --resume to continue its run, or "
                         "choose another --run-name or --runs-dir")
    result = read_json(os.path.join(run_dir, "result.json")) if "result.json" in held else {}
    found = complete_checkpoints(os.path.join(run_dir, "checkpoints"))
    resume_from = "complete" if result.get("status") == "complete" else found[-1] if found else None
    if resume_from is None and args.resume:
        raise UsageError(f"--resume: {run_dir} has no complete checkpoint to resume from; pass --resume-or-start to "
                         "start it at step 0")
    if resume_from:  # the run recorded there must be the one planned here: one line names the first difference
        where = run_dir if resume_from == "complete" else resume_from
        recorded = result["plan"] if resume_from == "complete" else read_json(os.path.join(where, "meta.json"))["plan"]
        requested = json.loads(json.dumps(plan.as_dict()))  # as JSON holds it: tuples as lists
        key = next((k for k in requested if recorded.get(k) != requested[k]), None)
        if key is not None:
            raise UsageError(f"{where} holds another run than this command plans: {key} {recorded.get(key)!r} there, "
                             f"{requested[key]!r} here; pass its flags, or another --run-name")
    preset = PRESETS[plan.preset]
    data_dir = args.data_dir or os.environ.get("DATA_DIR") or preset.data_dir
    if resume_from == "complete":
        if rank == 0:
            print(f"{run_dir} is already complete; nothing to do")
        return None
    batch = device_batch_size(plan, world, device.type, args.device_batch_size)  # before any data work
    if rank == 0 and plan.preset == "cpu" and data_dir == preset.data_dir and \
            data.read_manifest(data_dir).get("status") != "complete":  # only the default folder is prepared
        data.prepare(preset.corpus, data_dir, tokenizer=plan.tokenizer)
    if world > 1:
        dist.barrier()
    error = None  # the token files against their sha256 in corpus.json: local rank 0 hashes (a pool copy per node)
    try:
        verify = args.verify and int(os.environ.get("LOCAL_RANK", "0")) == 0
        train_pool, val_pool = (data.load_pool(data_dir, split, verify_hash=verify) for split in ("train", "val"))
    except UsageError as e:
        error = str(e)
    errors = [e for e in gather(error) if e]
    if errors:
        raise UsageError(errors[0])
    identity = lambda pool: {k: v.get("sha256") for k, v in (pool or {}).get("splits", {}).items()}  # noqa: E731
    if identity(result.get("data_manifest")) not in ({}, identity(train_pool.manifest)):  # a moved pool is the same
        raise UsageError(f"{run_dir} was trained on the pool {result.get('data_dir')!r}, not on {data_dir} (other "
                         "token sha256 in corpus.json); pass its pool (moved is fine) or another --run-name")
    if train_pool.manifest.get("tokenizer") != plan.tokenizer:
        raise UsageError(f"{data_dir} was tokenized with {train_pool.manifest.get('tokenizer')!r} but the plan "
                         f"uses {plan.tokenizer!r}; pass --tokenizer or another --data-dir")
    pool = {k: v for k, v in train_pool.manifest.items() if k != "sources"}  # result.json's record of the pool
    pool["splits"] = {name: dict(info, sha256_checked=args.verify) for name, info in pool["splits"].items()}
    loader = data.TrainLoader(train_pool, plan.seq_len, plan.tokens_per_step // plan.seq_len,
                              token_limit=plan.train_token_limit, seed=plan.seed)
    token_bytes = torch.as_tensor(data.token_byte_lengths(data.get_tokenizer(plan.tokenizer)), device=device)
    return new_run(args, plan, batch, rank, world, device, loader, run_dir=run_dir, data_dir=data_dir,
                   data_manifest=pool, val=data.val_windows(val_pool, plan.seq_len, plan.val_tokens),
                   resume_from=resume_from, token_bytes=token_bytes)


def new_run(args, plan, batch, rank, world, device, loader, run_dir="", resume_from=None, **data):
    """A run's fixed context in this process (tests/test_gpu.py's runs have no folder, data or val)."""
    peak, ckpt_dir = gpu_peak_flops(device, args.peak_flops), os.path.join(run_dir, "checkpoints")
    return types.SimpleNamespace(
        plan=plan, args=args, rank=rank, master=rank == 0, world=world, device=device, loader=loader,
        per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)),  # the mesh's shard dimension
        micro_batches=(batch,) * len(plan.pass_stages),  # sequences per micro-batch in each pass stage
        memory=memory_record(plan, batch, world), peak_flops=peak * world if peak else None,  # all ranks', for MFU
        environment=dict(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda,
                         device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                         compiled=use_compile(args, device), attention_backend=args.attention_backend),
        run_dir=run_dir, ckpt_dir=ckpt_dir, final=os.path.join(ckpt_dir, "final"),
        resume_from=resume_from, **data)  # resume_from: the checkpoint folder this invocation continues from


def memory_record(plan, batch, world, probe_peak_bytes=None):
    """result.json's "memory": each pass stage's micro-batch and accumulation, and on CUDA the probe's peak bytes."""
    accumulation = plan.tokens_per_step // plan.seq_len // world // batch
    return dict(stages=[dict(passes=k, micro_batch=batch, accumulation=accumulation) for k in plan.pass_stages],
                probe_peak_bytes=probe_peak_bytes)


def probe_micro_batch(run, model):
    """On CUDA, before the first step: a forward and backward of the largest stage on fixed tokens, the micro-batch
    halved while it runs out of memory (--device-batch-size: never). The smallest over the ranks wins."""
    plan, cfg, batch = run.plan, run.plan.model_config, run.micro_batches[0]
    rank_seqs = plan.tokens_per_step // plan.seq_len // run.world
    passes = max(plan.pass_stages + plan.random_passes)
    while True:
        torch.cuda.reset_peak_memory_stats(run.device)
        tokens = torch.arange(batch * (plan.seq_len + 1), device=run.device).view(batch, -1) % cfg.vocab_size
        try:
            with autocast(model):
                loss = model(tokens[:, :-1], targets=tokens[:, 1:], passes=passes)
            loss.backward()
            break
        except torch.OutOfMemoryError:
            if batch == 1 or run.args.device_batch_size:
                raise
            batch = max(b for b in range(1, batch // 2 + 1) if rank_seqs % b == 0)
        finally:
            loss = None
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
    batches, peaks = zip(*gather((batch, torch.cuda.max_memory_allocated(run.device))))
    run.micro_batches = (min(batches),) * len(plan.pass_stages)  # the global batch stays, accumulation grows
    run.memory = memory_record(plan, min(batches), run.world, max(peaks))
    if run.master:
        print(f"micro-batch {min(batches)} (of {rank_seqs} sequences per rank and step): one forward and backward at "
              f"{passes} passes peaked at {max(peaks) / 2 ** 30:.1f} GiB per GPU", flush=True)


def start_training(run):
    """The model seeded, sharded, probed, restored, compiled -> Training: run, model, optimizers, state, grad_norm."""
    plan, args = run.plan, run.args
    torch.manual_seed(plan.seed)
    dtype = getattr(torch, args.compute_dtype or ("bfloat16" if run.device.type == "cuda" else "float32"))
    model = model_lib.GPT(plan.model_config, device=run.device, attention=args.attention_backend, dtype=dtype)
    model.set_passes(plan.pass_stages[0])
    if run.world > 1:
        shard_model(model, build_mesh(run.world, run.per_node, run.device, args.dist_timeout))
    if run.device.type == "cuda":
        probe_micro_batch(run, model)
    optimizers = build_optimizers(model, plan, args.polar_express_dtype)
    state = load_checkpoint(run.resume_from, model, optimizers) if run.resume_from else RunState()
    if run.resume_from:
        model.set_passes(stage_at(state.step - 1, plan) if state.step else plan.pass_stages[0])
        if run.master:
            print(f"resuming {run.run_dir} from step {state.step}")
    if use_compile(args, run.device):
        compile_model(model, plan)
        if run.master:  # the first step can take minutes: say why it is slow
            print("compiling: torch.compile compiles the blocks at the first step and each growth", flush=True)
    for note in schedule_notes(plan) if run.master and not state.step else []:
        print(f"note: {note}")
    return types.SimpleNamespace(run=run, model=model, optimizers=optimizers, state=state, grad_norm=None)


@torch.no_grad()
def validate(run, model, state, passes, when):
    """Validation loss (nats per target token) and bits per byte into state.evals, with its passes and why it ran. Every
    rank runs as many forwards (a sharded forward is collective): one short of a batch reruns one, drops its sums."""
    t0, val, batch_size = time.perf_counter(), run.val, run.micro_batches[-1]
    model.eval()
    starts = list(range(0, len(val), batch_size))
    sums = torch.zeros(4, dtype=torch.float64, device=run.device)  # CE, targets, CE over byte-bearing targets, bytes
    for k in range(run.rank, -(-len(starts) // run.world) * run.world, run.world):
        window = val[starts[k % len(starts)]:][:batch_size].to(run.device)
        with autocast(model):
            ce = model(window[:, :-1], targets=window[:, 1:], passes=passes, reduction="none").double()
        nbytes = run.token_bytes[window[:, 1:].flatten()].double()
        if k < len(starts):
            sums += torch.stack([ce.sum(), torch.tensor(ce.numel(), device=run.device, dtype=torch.float64),
                                 (ce * (nbytes > 0)).sum(), nbytes.sum()])
    if run.world > 1:
        dist.all_reduce(sums)
    model.train()
    ce, targets, byte_ce, nbytes = sums.tolist()
    loss, bpb = ce / targets, byte_ce / (math.log(2) * nbytes) if nbytes > 0 else None
    state.eval_seconds += time.perf_counter() - t0
    epoch = max(1, -(-state.step // run.loader.steps_per_epoch))  # of the last step trained
    state.evals.append(dict(step=state.step, epoch=epoch, val_loss=loss, val_bpb=bpb, passes=passes, when=when))
    if run.master:
        print(f"step {state.step}/{run.plan.steps} | val loss {loss:.4f}" + (f" | val bpb {bpb:.4f}" if bpb else "")
              + f" | passes {passes} ({when})")
    return state.evals[-1]


def grow_if_due(run, model, optimizers, state):
    """At a crossover step, grow once and record it -> whether it grew."""
    if state.step in run.plan.crossover_steps and all(e["step"] != state.step for e in state.growth_events):
        before, target = model.active_passes, stage_at(state.step, run.plan)
        state.growth_events.append(dict(step=state.step, passes_from=before, passes_to=target,
                                        reset_parameters=len(grow(model, optimizers, target))))
        return True
    return False


def train_step(training, measure=False):
    """One optimizer step -> (mean loss over ranks, left on the device; passes; epoch; LR multiplier)."""
    run, model, optimizers, state = training.run, training.model, training.optimizers, training.state
    step, plan = state.step, run.plan
    grow_if_due(run, model, optimizers, state)
    passes = passes_at(step, plan)
    model.set_passes(passes)
    lrm = lr_multiplier(step, plan)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * lrm
            if isinstance(opt, muon.Muon):
                group["momentum"] = muon.muon_momentum(step)
    epoch, windows = run.loader.batch(step, run.rank, run.world)
    if run.device.type == "cuda":  # from page-locked memory the copies below are asynchronous
        windows = windows.pin_memory()
    micros = windows.split(run.micro_batches[stage_index(step, plan)])
    step_loss = torch.zeros((), device=run.device)
    for k, micro in enumerate(micros):
        if isinstance(model, FSDPModule):  # HSDP: the all-reduce across nodes on the last micro-batch only
            model.set_requires_all_reduce(k == len(micros) - 1)  # (the reduce-scatter runs on each)
        micro = micro.to(run.device, non_blocking=True)
        with autocast(model):
            loss = model(micro[:, :-1], targets=micro[:, 1:])
        (loss / len(micros)).backward()
        step_loss += loss.detach() / len(micros)
    if measure:  # the L2 norm of the rank-averaged gradient the optimizers step on (nothing is clipped)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        training.grad_norm = muon.full(torch.nn.utils.get_total_norm(grads)).float()
    for opt in optimizers:  # a matrix without a gradient (a dormant core) gets Muon's zero-gradient step
        opt.step()
    model.zero_grad(set_to_none=True)
    if run.world > 1:
        dist.all_reduce(step_loss)
        step_loss /= run.world
    return step_loss, passes, epoch, lrm


def count_step(run, state, passes):
    """Advance the counters by one step."""
    cfg, tokens = run.plan.model_config, run.plan.tokens_per_step
    state.step += 1
    state.flops += model_lib.flops_per_token(cfg, passes) * tokens
    state.matrix_flops += model_lib.matrix_flops_per_token(cfg, passes) * tokens
    state.tokens += tokens


# --- The loop's records: result.json, trajectory.jsonl, the progress line, wandb

def write_result(run, state, status, mfu=None, **extra):
    """result.json, replaced whole: running, complete, stopped (with a reason) or failed (with an error)."""
    if not run.master:
        return
    evals, final = state.evals, status == "complete" and bool(state.evals)
    write_json(os.path.join(run.run_dir, "result.json"), dict(
        status=status, arch=run.plan.arch, depth=run.plan.depth, plan=run.plan.as_dict(),
        schedule_notes=schedule_notes(run.plan), world_size=run.world, device_batch_size=list(run.micro_batches),
        memory=run.memory, data_dir=run.data_dir, environment=run.environment, data_manifest=run.data_manifest,
        completed_steps=state.step, evals=evals, growth_events=state.growth_events,
        last_eval=evals[-1] if evals else None, final_val_loss=evals[-1]["val_loss"] if final else None,
        best_val_loss=min((e["val_loss"] for e in evals), default=None) if final else None,
        final_val_bpb=evals[-1]["val_bpb"] if final else None, estimated_training_flops=state.flops,
        estimated_matrix_flops=state.matrix_flops, total_training_time_seconds=state.train_seconds,
        wall_seconds=state.wall_seconds, eval_seconds=state.eval_seconds, memory_measured=state.memory_measured,
        tokens_per_second=state.tokens / state.train_seconds if state.train_seconds else None, last_train_mfu=mfu,
        **extra))


class Progress:
    """trajectory.jsonl, the progress line and wandb (--wandb PROJECT). Losses wait on the device until a logged step
    fetches them at once; training seconds run from `mark` (reset after validations and checkpoints) to a fetch."""

    def __init__(self, run, state, stop):
        self.run, self.state, self.stop, self.tracker, self.trajectory = run, state, stop, None, None
        path, project = os.path.join(run.run_dir, "trajectory.jsonl"), run.args.wandb or os.environ.get("WANDB_PROJECT")
        if run.master:  # cut back to the checkpoint resumed from, then appended to
            write_text(path, "".join(open(path).readlines()[:state.step] if os.path.exists(path) else []))
            self.trajectory = open(path, "a")
        if project and run.master:  # a wandb run per run, named LADDER/RUN, grouped by ladder; a resume continues it
            import wandb
            id_path = os.path.join(run.run_dir, "wandb_id")
            ladder = os.path.basename(os.path.dirname(os.path.abspath(run.run_dir)))
            run_id = open(id_path).read().strip() if os.path.exists(id_path) else os.urandom(4).hex()
            self.tracker = wandb.init(project=project, id=run_id, resume="allow", dir=run.run_dir, group=ladder,
                                      name=f"{ladder}/{os.path.basename(run.run_dir)}", config=run.plan.as_dict(),
                                      tags=[run.plan.arch, f"d{run.plan.depth}", run.plan.preset])
            for metric, x in (("flops", None), ("tokens", None), ("train/*", "flops"), ("val/*", "flops")):
                self.tracker.define_metric(metric, step_metric=x)
            write_text(id_path, run_id + "\n")
        self.pending, self.records, self.mfu = [], [], None  # pending: (record, its loss on the device)
        self.mark = self.start = time.perf_counter()
        self.wall_start, self.flops_start = self.start - state.wall_seconds, state.flops  # resumes add up

    def fetch(self, model, grad_norm):
        """One device->host transfer of the pending losses, gradient norm and scalars -> the first non-finite step."""
        scalar_ids = {id(p) for p in model.param_groups()["scalar"]}
        scalars = {name: p for name, p in model.named_parameters() if id(p) in scalar_ids}
        keys = [name if p.ndim == 0 else f"{name}.{i}" for name, p in scalars.items() for i in range(p.numel())]
        tensors = [loss for _, loss in self.pending] + [grad_norm] * (grad_norm is not None) + list(scalars.values())
        values = torch.cat([t.detach().float().reshape(-1) for t in tensors]).tolist()
        n, now = len(self.pending), time.perf_counter()
        seconds, self.mark = (now - self.mark) / n, now
        self.state.train_seconds += seconds * n
        for (record, _), loss in zip(self.pending, values):
            self.records.append(dict(record, loss=loss, tokens_per_second=self.run.plan.tokens_per_step / seconds))
        self.records[-1].update(dict(grad_norm=values[n]) if grad_norm is not None else {},
                                scalars=dict(zip(keys, values[n + (grad_norm is not None):])))
        flops = sum(model_lib.flops_per_token(self.run.plan.model_config, r["passes"]) for r, _ in self.pending)
        self.mfu = flops * self.run.plan.tokens_per_step / (seconds * n * self.run.peak_flops) \
            if self.run.peak_flops else None
        self.pending = []
        return next((r["step"] for r in self.records if not math.isfinite(r["loss"])), None)

    def write(self, printed=True):
        """The fetched records into trajectory.jsonl and wandb; `printed`: also the progress line."""
        run, plan, state, last = self.run, self.run.plan, self.state, self.records[-1]
        state.wall_seconds = time.perf_counter() - self.wall_start
        # the ETA: this invocation's wall time per FLOP so far times the FLOPs of the steps ahead, at their passes
        bounds, done = [0, *plan.crossover_steps, plan.steps], state.flops - self.flops_start
        ahead = sum(model_lib.flops_per_token(plan.model_config, k) * max(0, min(b, self.stop) - max(a, state.step))
                    for k, a, b in zip(plan.pass_stages, bounds, bounds[1:])) * plan.tokens_per_step
        eta = (time.perf_counter() - self.start) / done * ahead if done else None
        last.update(wall_seconds=state.wall_seconds, train_seconds=state.train_seconds, eta_seconds=eta)
        if run.master:
            self.trajectory.writelines(json.dumps(r) + "\n" for r in self.records)
            self.trajectory.flush()  # whole lines at every logged step: `fit.py runs` and `curves` see the run live
            for r in self.records if self.tracker else []:
                self.tracker.log(wandb_record(r), step=r["step"])
            if printed:
                print(f"step {state.step}/{plan.steps} | loss {last['loss']:.4f} | lrm {last['lr_multiplier']:.3f} "
                      f"| passes {last['passes']} | {last['tokens_per_second']:,.0f} tok/s"
                      + (f" | mfu {100 * self.mfu:.1f}%" if self.mfu else "")
                      + (f" | eta {clock(eta)}" if eta is not None else ""), flush=True)
        self.records = []


def wandb_record(record):
    """flops and tokens as they are, validations as val/X, the rest as train/X."""
    out = {f"train/scalars/{k}": v for k, v in record.get("scalars", {}).items()}
    for k, v in record.items():
        val = k.startswith("val_") or k.endswith("_after_growth")
        if k not in ("scalars", "step") and v is not None:
            out[k if k in ("flops", "tokens") else "val/" + k.removeprefix("val_") if val else "train/" + k] = v
    return out


# --- The training loop

STOP_SIGNALS = []  # the signals that asked this process to stop


def request_stop(signum, frame):
    """SIGINT or SIGTERM: stop at the next logged step, after a checkpoint (a second one stops at once)."""
    STOP_SIGNALS.append(signal.Signals(signum))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupted)


def train(args, plan):
    run = open_run(args, plan)
    if run is None:
        return 0
    if run.resume_from == run.final:  # trained to the end; only result.json was not written
        write_result(run, read_run_state(run.final), "complete")
        print(f"{run.run_dir} had finished training; wrote its result.json from {run.final}")
        return 0
    training = start_training(run)
    model, optimizers, state = training.model, training.optimizers, training.state
    handlers = {signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    STOP_SIGNALS.clear()
    # validations: by default at most EVAL_COMPUTE_SHARE of the training compute (a forward is a third of a training
    # step's FLOPs per token), and at the start, the end, each epoch and around a growth
    preset, epoch_steps = PRESETS[plan.preset], run.loader.steps_per_epoch
    stop = min(plan.steps, args.stop_after or plan.steps)
    log_every = args.log_every or preset.log_every
    save_every = preset.save_every if args.save_every is None else args.save_every
    eval_every = math.ceil(plan.val_tokens / (3 * EVAL_COMPUTE_SHARE * plan.tokens_per_step)) \
        if args.eval_every is None else args.eval_every
    validates = lambda s: (s == plan.steps or s % epoch_steps == 0 or s in plan.crossover_steps  # noqa: E731
                           or bool(eval_every) and s % eval_every == 0)
    saves = lambda s: s == plan.steps or s == stop or bool(save_every) and s % save_every == 0  # noqa: E731
    try:  # one way out for a stop or a failure: result.json says how the run ended
        write_result(run, state, "running")
        progress = Progress(run, state, stop)
        start_step = state.step
        if state.step == 0 and not state.evals:
            validate(run, model, state, plan.pass_stages[0], "start")
            progress.mark = time.perf_counter()
        while state.step < stop:
            s = state.step + 1  # the step after a growth logs too: its own interval holds the recompilation
            logged = s == 1 or s % log_every == 0 or s - 1 in plan.crossover_steps or validates(s) or saves(s)
            loss, passes, epoch, lrm = train_step(training, measure=logged)
            count_step(run, state, passes)
            progress.pending.append((dict(step=s, tokens=state.tokens, flops=state.flops, lr_multiplier=lrm,
                                          passes=passes, stage=stage_index(s - 1, plan), epoch=epoch), loss))
            if not logged:
                continue
            # the one place where a step's evals, growth, checkpoint and stop are decided
            bad = progress.fetch(model, training.grad_norm)
            if bad is not None:  # the last good checkpoint (saved only after its steps were found finite) stays
                progress.records = [r for r in progress.records if r["step"] <= bad]
                progress.write(printed=False)
                write_result(run, state, "failed", progress.mfu, error=f"non-finite loss at step {bad - 1}")
                kept = (complete_checkpoints(run.ckpt_dir) or ["none yet"])[-1]
                print(f"train.py: error: non-finite loss at step {bad - 1}; the last good checkpoint is {kept}",
                      file=sys.stderr)
                return 3
            if validates(s):  # periodic, epoch, end; around a growth: before it, grow, after it
                record = progress.records[-1]
                when = ("end" if s == plan.steps else "before growth" if s in plan.crossover_steps
                        else "epoch" if s % epoch_steps == 0 else "periodic")
                ev = validate(run, model, state, plan.passes_final if s == plan.steps else stage_at(s - 1, plan), when)
                record.update(val_loss=ev["val_loss"], val_bpb=ev["val_bpb"], val_passes=ev["passes"])
                if grow_if_due(run, model, optimizers, state):
                    ev = validate(run, model, state, stage_at(s, plan), "after growth")
                    record.update(val_loss_after_growth=ev["val_loss"], val_bpb_after_growth=ev["val_bpb"],
                                  passes_after_growth=ev["passes"])
                progress.mark = time.perf_counter()
            stopping = any(gather(bool(STOP_SIGNALS)))  # every rank stops at the same step
            if s == stop or stopping:  # every rank's peak memory in this invocation, before the checkpoint keeps it
                state.memory_measured.append(dict(steps=[start_step, s], world_size=run.world,
                                                  ranks=gather(memory_in_use(run.device))))
            progress.write(printed=True)
            if saves(s) or stopping:
                save_checkpoint(run.ckpt_dir, model, optimizers, state, plan)
                write_result(run, state, "running", progress.mfu)
                progress.mark = time.perf_counter()
            if stopping:
                raise Interrupted() if signal.SIGTERM in STOP_SIGNALS else KeyboardInterrupt()
        if run.master:
            progress.trajectory.close()
            if state.step == plan.steps:
                os.replace(complete_checkpoints(run.ckpt_dir)[-1], run.final)  # the step just saved
                write_result(run, state, "complete", progress.mfu)
                print(f"done: final val loss {state.evals[-1]['val_loss']:.4f} | {state.flops:.3e} FLOPs | train "
                      f"time {clock(state.train_seconds)}, wall time {clock(state.wall_seconds)} | {run.run_dir}")
            else:
                write_result(run, state, "stopped", progress.mfu, reason=f"--stop-after {state.step}")
                print(f"stopped after step {state.step} (--stop-after); continue with --resume")
            import fit  # the reader of runs writes their report.md
            fit.write_run_report(run.run_dir)
        if progress.tracker:
            result = read_json(os.path.join(run.run_dir, "result.json"))
            progress.tracker.summary.update({k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))})
            progress.tracker.finish()
    except KeyboardInterrupt as stop:  # SIGINT, or SIGTERM (Interrupted): the one stop path
        reason = f"{'SIGTERM' if isinstance(stop, Interrupted) else 'SIGINT'} at step {state.step}"
        with contextlib.suppress(OSError):
            write_result(run, state, "stopped", reason=reason)
        if run.master:
            print(f"train.py: stopped ({reason}); continue with --resume", file=sys.stderr)
        raise
    except BaseException as e:
        with contextlib.suppress(OSError):  # a full disk may refuse this too
            write_result(run, state, "failed", error=f"{type(e).__name__} at step {state.step}: {e}")
        raise
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return 0


# --- Command line (its flags: build_parser, at the top)

def parse_args(argv):
    p = build_parser()
    args = p.parse_args(argv)
    if args.run_name is not None and (args.run_name in ("", ".", "..") or "/" in args.run_name):
        p.error(f"--run-name {args.run_name!r} must be a plain folder name (no '/'); use --runs-dir for the parent")
    each_once("--depth", args.depth)
    each_once("--random-passes", args.random_passes)
    if len(args.depth) > 1 and not args.dry_run:
        p.error("several --depth values need --dry-run; train one depth per run")
    if args.attention_backend not in CPU_ATTENTION_BACKENDS and not (args.dry_run or uses_cuda(args.device)):
        p.error(f"--attention-backend {args.attention_backend} needs CUDA; on the CPU SDPA has only flash (its CPU "
                "kernel) and math")
    args.depths, args.depth = args.depth, args.depth[0]  # several only for --dry-run
    args.run_dir = os.path.join(args.runs_dir, args.run_name or f"{args.arch}_d{args.depth}")
    return args


def run_command(argv):
    args = parse_args(argv)
    plans = []
    for depth in args.depths:  # every depth's flags and arm checked before anything is printed or written
        args.depth = depth
        plans.append(make_plan(args))
        model_lib.check_arm(plans[-1].model_config, args.optimizer)
    if not args.dry_run:
        if args.wandb or os.environ.get("WANDB_PROJECT"):  # a missing package: one line, before the run folder exists
            try:
                import wandb  # noqa: F401
            except ImportError:
                raise UsageError("--wandb needs the wandb package: pip install wandb (or drop --wandb)") from None
        with run_lock(args) or contextlib.nullcontext():
            return train(args, plans[0])
    for plan in plans:  # the plan, its first micro-batch and GPU-hours
        out = {k: v for k, v in plan.as_dict().items() if k != "model_config"}
        print(json.dumps(dict(out, device_batch_size=planned_micro_batch(plan, args, 1),
                              gpu_hours=gpu_hours_estimate(plan), schedule_notes=schedule_notes(plan))))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ladder-dry-run"]:
        return cli_main(ladder_dry_run, "train.py", argv[1:])
    if argv[:1] == ["--ladder"]:
        return cli_main(print_ladder, "train.py", argv[1:])
    return cli_main(run_command, "train.py", argv)


if __name__ == "__main__":
    exit_process(main())
