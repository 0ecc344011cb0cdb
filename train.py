"""train.py — train one arm of the paper at one depth with that arm's compute-optimal recipe.

One dial: `--arch A --depth d` derives width, heads, split, tokens per parameter, steps, LRs and the growth step
(spec: shared/spec/architecture_training.md §2–§7). Runs on one CPU, one GPU, or under torchrun (NCCL on CUDA,
gloo on CPU, multi-node through the standard torchrun environment). Every optimizer step sees the same tokens
whatever the world size, so a run can be resumed on a different number of GPUs.

    python train.py --arch untied_grow --depth 8 --dry-run               # the plan as one JSON object
    torchrun --nproc_per_node 8 train.py --arch vanilla --depth 12       # a paper ladder run on FineWeb
    python train.py --arch operator_1 --depth 3 --preset cpu             # offline, byte-level stdlib corpus
    python train.py --arch operator_1 --depth 8 --passes 4 --data-constrained tuned-wd
    python train.py --bench --preset cpu                                 # step-time ratios between arms

Outputs go to <runs-dir>/<run-name>/: result.json, trajectory.jsonl, checkpoints/{latest,final}.pt.
Exit codes: 2 bad flags or inputs, 3 non-finite loss (the last good checkpoint is kept).
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import data
import model as model_lib
from model import Parser, UsageError
import muon

# ---------------------------------------------------------------------------------------------------------------
# The recipe table (spec §7.1). LRs are the values at the preset's anchor depth (d8 for the paper) and are scaled
# to depth d by LR(d) = LR(anchor) * (N(anchor) / N(d)) ** lr_exponent (spec §4.5). Architecture and init fields
# (mode, passes, alpha, boundary operator, multipliers, init scales) live in model.ARCHS, next to the model.
# crossover: per-depth fraction f of the steps run before growth (the paper's rho = 1 - f); default_crossover is
# the paper's constant prescription for depths the release did not run.
RECIPES = {
    "vanilla": dict(tpp=5, lr_exponent=0.8, matrix_lr=0.04, embedding_lr=0.01810193359836,
                    unembedding_lr=0.0045254833996, weight_decay=0.0707106781187, adam_betas=(0.8, 0.95),
                    adam_eps=1e-10, warmup_steps=40, warmdown_ratio=0.6),
    "deep_vanilla": dict(tpp=6, lr_exponent=0.7, matrix_lr=0.04, embedding_lr=0.0064,
                         unembedding_lr=0.002262741699796, weight_decay=0.1, adam_betas=(0.8, 0.99),
                         adam_eps=1e-8, warmup_steps=5, warmdown_ratio=0.8),
    "operator_1": dict(tpp=6, lr_exponent=0.6, matrix_lr=0.04, embedding_lr=0.03620386719676,
                       unembedding_lr=0.0032, weight_decay=0.05, adam_betas=(0.8, 0.98),
                       adam_eps=1e-10, warmup_steps=0, warmdown_ratio=0.8),
    "loop_2": dict(tpp=6, lr_exponent=0.6, matrix_lr=0.04, embedding_lr=0.0128,
                   unembedding_lr=0.0045254833996, weight_decay=0.05, adam_betas=(0.8, 0.95),
                   adam_eps=1e-10, warmup_steps=40, warmdown_ratio=1.0),
    "untied_2": dict(tpp=6, lr_exponent=0.6, matrix_lr=0.04, embedding_lr=0.0064, unembedding_lr=0.0064,
                     weight_decay=0.0707106781187, adam_betas=(0.8, 0.99), adam_eps=1e-8,
                     warmup_steps=40, warmdown_ratio=1.0),
    "loop_grow": dict(tpp=7, lr_exponent=0.5, matrix_lr=0.04, embedding_lr=0.0128,
                      unembedding_lr=0.0045254833996, weight_decay=0.05, adam_betas=(0.8, 0.95),
                      adam_eps=1e-10, warmup_steps=40, warmdown_ratio=1.0, rewarm_steps=40,
                      crossover={6: .75, 8: .82, 10: .86, 12: .85, 14: .86, 16: .88, 18: .87},
                      default_crossover=0.83),
    "untied_grow": dict(tpp=8, lr_exponent=0.6, matrix_lr=0.04, embedding_lr=0.0064, unembedding_lr=0.0064,
                        weight_decay=0.0707106781187, adam_betas=(0.8, 0.99), adam_eps=1e-8,
                        warmup_steps=40, warmdown_ratio=1.0, rewarm_steps=40,
                        crossover={6: .60, 8: .71, 10: .75, 12: .73, 14: .76, 16: .77, 18: .75, 26: .77},
                        default_crossover=0.70),
    # INFERRED (spec §2.4): the release has no script. Schedule (TPP 6 on Deep Vanilla's N, f = 0.5) reproduces the
    # paper's compute column; the optimizer recipe is Deep Vanilla's with matrix LR 0.036 and the Grow arms' 40-step
    # re-warm, an assumption.
    "deep_vanilla_grow": dict(tpp=6, lr_exponent=0.7, matrix_lr=0.036, embedding_lr=0.0064,
                              unembedding_lr=0.002262741699796, weight_decay=0.1, adam_betas=(0.8, 0.99),
                              adam_eps=1e-8, warmup_steps=5, warmdown_ratio=0.8, rewarm_steps=40,
                              crossover={}, default_crossover=0.5),
}
# Data-constrained loop grid (spec §7.1): Operator-1's training recipe (for any --arch, e.g. the untied and
# no-operator controls of Fig. 24), 100M unique tokens x 10 epochs unless overridden, LR not scaled with depth.
DATA_CONSTRAINED = {
    "fixed-wd": dict(weight_decay={}, default_weight_decay=0.8),
    "tuned-wd": dict(weight_decay={6: 0.4, 8: 0.8, 10: 0.8, 12: 1.2, 14: 1.2, 16: 1.6, 18: 1.6},
                     default_weight_decay=0.8),
}
DATA_CONSTRAINED_TOKENS, DATA_CONSTRAINED_EPOCHS = 100_000_000, 10
# --optimizer adamw (paper Fig. 16f): every group AdamW. The release gives no LRs for it; ours: matrix LR 0.004 at
# the anchor depth (10x below Muon's, the usual Muon/AdamW ratio), the arm's embedding/unembedding LRs, betas and WD.
ADAMW_MATRIX_LR = 0.004

# Presets: shapes, batch and data. "cpu" is small enough for a d2-d5 ladder in minutes on 2 cores. Its anchor depth
# and LR scale come from a sweep at the anchor depth (README "CPU preset"); LR exponents, TPP and growth fractions
# are the paper's.
PRESETS = {
    "paper": dict(width_per_depth=128, head_dim=128, seq_len=2048, mlp_multiple=256, total_batch_tokens=524_288,
                  device_batch_size=32, val_tokens=9_961_472, anchor_depth=8, lr_scale=1.0,
                  data_dir="data/fineweb", corpus="fineweb", tokenizer="gpt2", save_every=500, log_every=10),
    "cpu": dict(width_per_depth=16, head_dim=16, seq_len=128, mlp_multiple=16, total_batch_tokens=2048,
                device_batch_size=16, val_tokens=65_536, anchor_depth=3, lr_scale=2.0,
                data_dir="data/stdlib", corpus="stdlib", tokenizer="bytes", save_every=50, log_every=25),
}
H100_BF16_PEAK_FLOPS = 989e12
# Per-GPU micro-batch (sequences) the release used on 80 GB H100s (spec §7.2), by depth; deeper executed stacks of
# the growth arms need smaller ones. Memory only: the global batch and the math never change.
PAPER_DEVICE_BATCH = {"fixed": {6: 32, 8: 32, 10: 32, 12: 16, 14: 16, 16: 8, 18: 8, 20: 8},
                      "grow": {6: 32, 8: 32, 10: 16, 12: 16, 14: 8, 16: 8, 18: 4, 26: 2}}


# ---------------------------------------------------------------------------------------------------------------
# The plan: everything derived from --arch/--depth before touching data (spec §4.3–4.5).

def model_config(args, preset, depth, vocab_size):
    overrides = dict(width_per_depth=preset["width_per_depth"], head_dim=preset["head_dim"],
                     seq_len=preset["seq_len"], mlp_multiple=preset["mlp_multiple"], vocab_size=vocab_size)
    for name in ("prelude", "coda", "passes", "alpha", "boundary", "residual_multiplier", "output_multiplier",
                 "wte_init_std", "uniform_init_scale"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.no_coda_inject:
        overrides["coda_inject"] = False
    if args.pass_stages:
        overrides["passes_initial"], overrides["passes"] = args.pass_stages[0], args.pass_stages[-1]
    try:
        return model_lib.config_for(args.arch, depth, **overrides)
    except ValueError as e:
        raise UsageError(str(e))


def wsd_multiplier(step, steps, warmup, warmdown_ratio):
    """Warmup (i+1)/W, then stable, then linear decay reaching exactly 0 on the last step (spec §3.4)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    start = max(warmup, steps - round(warmdown_ratio * steps))
    if step < start:
        return 1.0
    return min(1.0, max(0.0, 1.0 - (step - start) / max(steps - start - 1, 1)))


def lr_multiplier(step, plan):
    """WSD times the post-growth re-warm: exactly 0 at each crossover step, back to 1 after rewarm_steps (§2.1)."""
    m = wsd_multiplier(step, plan["steps"], plan["warmup_steps"], plan["warmdown_ratio"])
    for crossover in plan["crossover_steps"]:
        if plan["rewarm_steps"] and step >= crossover:
            m *= min(1.0, (step - crossover) / plan["rewarm_steps"])
    return m


def stage_at(step, plan):
    """The growth stage's pass count in force at an optimizer step."""
    return plan["pass_stages"][sum(step >= c for c in plan["crossover_steps"])]


def passes_at(step, plan):
    """Passes for one optimizer step: the growth stage, or after the last growth (optionally) random recurrence,
    drawn from a per-step seed so every rank and every resume agrees."""
    if plan["random_passes"] and step >= (plan["crossover_steps"] or [0])[-1]:
        return random.Random(plan["seed"] * 1_000_003 + step).choice(plan["random_passes"])
    return stage_at(step, plan)


def make_plan(args):
    """The dry-run plan: shapes, N, steps, crossover, token limit, LRs, FLOPs. Pure arithmetic."""
    if args.arch not in RECIPES:
        raise UsageError(f"unknown --arch {args.arch!r}; choose one of {', '.join(RECIPES)}")
    if args.depth is None or args.depth < 1:
        raise UsageError("--depth must be a positive integer, e.g. --depth 8")
    preset = dict(PRESETS[args.preset])
    for name in ("seq_len", "total_batch_tokens", "val_tokens", "width_per_depth", "head_dim"):
        if getattr(args, name) is not None:
            preset[name] = getattr(args, name)
    tokenizer = args.tokenizer or preset["tokenizer"]
    # GPT-2's vocab size is known without tiktoken's download, so a dry run works offline.
    vocab_size = data.get_tokenizer(tokenizer).n_vocab if tokenizer != "gpt2" else 50257
    if args.recipe is not None and args.recipe not in RECIPES:
        raise UsageError(f"unknown --recipe {args.recipe!r}; choose one of {', '.join(RECIPES)}")
    recipe = dict(RECIPES[args.recipe or args.arch])  # --recipe: another arm's training recipe (paper Fig. 16b)
    if args.data_constrained:
        dc = DATA_CONSTRAINED[args.data_constrained]
        recipe = dict(RECIPES["operator_1"], lr_exponent=0.0,
                      weight_decay=dc["weight_decay"].get(args.depth, dc["default_weight_decay"]))
    for name in ("tpp", "lr_exponent", "matrix_lr", "embedding_lr", "unembedding_lr", "weight_decay", "adam_eps",
                 "warmup_steps", "warmdown_ratio", "rewarm_steps"):
        if getattr(args, name) is not None:
            recipe[name] = getattr(args, name)
    if args.adam_betas is not None:
        recipe["adam_betas"] = tuple(args.adam_betas)
    cfg = model_config(args, preset, args.depth, vocab_size)
    anchor = preset["anchor_depth"]
    seq_len, batch_tokens = preset["seq_len"], preset["total_batch_tokens"]
    if batch_tokens % seq_len:
        raise UsageError(f"--total-batch-tokens {batch_tokens} is not a multiple of the sequence length {seq_len}")
    if preset["val_tokens"] % seq_len:
        raise UsageError(f"--val-tokens {preset['val_tokens']} is not a multiple of the sequence length {seq_len}")

    stages = args.pass_stages or sorted({cfg.passes_initial, cfg.passes})
    growth = len(stages) > 1
    if growth:
        fractions = args.crossover_fractions
        if fractions is None:
            fractions = [recipe["crossover"].get(args.depth, recipe["default_crossover"])] if "crossover" in recipe \
                else None
        if fractions is None or len(fractions) != len(stages) - 1 or any(not 0 < f < 1 for f in fractions) \
                or sorted(fractions) != list(fractions):
            raise UsageError(f"growth {'->'.join(map(str, stages))} needs {len(stages) - 1} increasing "
                             "--crossover-fractions in (0, 1), e.g. --crossover-fractions 0.75")
    else:
        fractions = []
    n_tpp = model_lib.params_tpp(cfg)
    epochs = 1
    if args.data_constrained:
        token_limit = args.train_token_limit or DATA_CONSTRAINED_TOKENS
        epochs = args.epochs or DATA_CONSTRAINED_EPOCHS
        steps = epochs * ((token_limit // (seq_len + 1)) // (batch_tokens // seq_len))
    elif growth:
        # Growth arms match the initial-K matrix-compute budget, with the K=2 step count left unrounded (§4.3).
        m = [model_lib.matrix_flops_per_token(cfg, k) for k in stages]
        share = [b - a for a, b in zip([0.0] + fractions, fractions + [1.0])]
        steps = round(recipe["tpp"] * n_tpp / batch_tokens * m[0] / sum(s * mk for s, mk in zip(share, m)))
    else:
        steps = round(recipe["tpp"] * n_tpp / batch_tokens)
    if args.epochs and not args.data_constrained:
        raise UsageError("--epochs sets the data-constrained regime (with --data-constrained); a single-epoch run "
                         "ends at its step count")
    steps = args.steps or steps
    if steps < 1:
        raise UsageError(f"the plan has {steps} steps; raise --depth or --tpp, or pass --steps")
    if not args.data_constrained:
        token_limit = args.train_token_limit or steps * batch_tokens * 101 // 100
    crossovers = [math.floor(f * steps) for f in fractions]
    if any(not 1 <= c < steps for c in crossovers):
        raise UsageError(f"crossover steps {crossovers} must lie in [1, {steps}); use more --steps")

    anchor_cfg = model_config(args, preset, anchor, vocab_size) if anchor != args.depth else cfg
    lr_scale = (args.lr_multiplier or preset["lr_scale"]) \
        * (model_lib.params_tpp(anchor_cfg) / n_tpp) ** recipe["lr_exponent"]
    matrix_lr = ADAMW_MATRIX_LR if args.optimizer == "adamw" else recipe["matrix_lr"]
    plan = dict(model_lib.describe(cfg), arch=args.arch, preset=args.preset, tokenizer=tokenizer,
                optimizer=args.optimizer, tpp=recipe["tpp"], lr_exponent=recipe["lr_exponent"],
                tokens_per_step=batch_tokens, seq_len=seq_len, steps=steps,
                crossover_step=crossovers[0] if crossovers else None, crossover_steps=crossovers,
                crossover_fractions=fractions, pass_stages=stages, random_passes=args.random_passes or [],
                train_tokens=steps * batch_tokens, train_token_limit=token_limit, epochs=epochs,
                val_tokens=preset["val_tokens"],
                matrix_lr=matrix_lr * lr_scale, embedding_lr=recipe["embedding_lr"] * lr_scale,
                unembedding_lr=recipe["unembedding_lr"] * lr_scale, weight_decay=recipe["weight_decay"],
                adam_betas=list(recipe["adam_betas"]), adam_eps=recipe["adam_eps"],
                warmup_steps=recipe["warmup_steps"], warmdown_ratio=recipe["warmdown_ratio"],
                rewarm_steps=recipe.get("rewarm_steps", 0) if growth else 0,
                data_constrained=args.data_constrained, seed=args.seed, model_config=cfg.__dict__.copy())
    per_step = [model_lib.flops_per_token(cfg, passes_at(s, plan)) for s in range(steps)] \
        if plan["random_passes"] else None
    plan["total_flops"] = total_flops(plan, cfg, per_step)
    return plan, cfg, preset


def total_flops(plan, cfg, per_step=None):
    """Sum over optimizer steps of F(L_step) * tokens per step (result.json's estimated_training_flops)."""
    if per_step is None:
        bounds = [0] + plan["crossover_steps"] + [plan["steps"]]
        per_step = []
        for k, a, b in zip(plan["pass_stages"], bounds, bounds[1:]):
            per_step += [model_lib.flops_per_token(cfg, k)] * (b - a)
    return sum(per_step) * plan["tokens_per_step"]


# ---------------------------------------------------------------------------------------------------------------
# Distributed setup, optimizers, evaluation, checkpoints.

def default_device_batch(args, plan, preset):
    if args.preset != "paper":
        return preset["device_batch_size"]
    table = PAPER_DEVICE_BATCH["grow" if len(plan["pass_stages"]) > 1 else "fixed"]
    return table.get(args.depth, min(table.values()) if args.depth > max(table) else preset["device_batch_size"])


def setup_distributed(device_flag):
    use_cuda = torch.cuda.is_available() if device_flag == "auto" else device_flag == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is visible")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)
    return rank, world, device


def build_optimizers(model, plan):
    groups = model.param_groups()
    betas, eps, wd = tuple(plan["adam_betas"]), plan["adam_eps"], plan["weight_decay"]
    adam_groups = [dict(params=groups["embedding"], lr=plan["embedding_lr"], base_lr=plan["embedding_lr"]),
                   dict(params=groups["unembedding"], lr=plan["unembedding_lr"], base_lr=plan["unembedding_lr"])]
    if plan["optimizer"] == "adamw":
        adam_groups.append(dict(params=groups["matrix"], lr=plan["matrix_lr"], base_lr=plan["matrix_lr"]))
        return [torch.optim.AdamW(adam_groups, betas=betas, eps=eps, weight_decay=wd)]
    matrix = muon.Muon(groups["matrix"], lr=plan["matrix_lr"], weight_decay=wd)
    for group in matrix.param_groups:
        group["base_lr"] = plan["matrix_lr"]
    return [matrix, torch.optim.AdamW(adam_groups, betas=betas, eps=eps, weight_decay=wd)]


def grow(model, optimizers, passes):
    """Growth at the crossover step: untied cores get the stacking copy and fresh optimizer state (spec §2.3);
    a tied core just runs more passes and keeps its state."""
    overwritten = model.grow(passes)
    for opt in optimizers:
        muon.reset_state(opt, overwritten)
    return overwritten


@torch.no_grad()
def evaluate(model, val, passes, batch_size, token_bytes, rank, world, device):
    """Validation loss in nats per target token (and bits per byte), examples sharded over ranks (spec §5.4)."""
    model.eval()
    shard = val[rank * len(val) // world:(rank + 1) * len(val) // world]
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # CE, targets, CE over byte-bearing targets, bytes
    for i in range(0, len(shard), batch_size):
        window = shard[i:i + batch_size].to(device)
        with autocast(device):
            logits = model(window[:, :-1], passes=passes)
        ce = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten(), reduction="none").double()
        nbytes = token_bytes[window[:, 1:].flatten()].double()
        sums += torch.stack([ce.sum(), torch.tensor(ce.numel(), device=device, dtype=torch.float64),
                             (ce * (nbytes > 0)).sum(), nbytes.sum()])
    if world > 1:
        dist.all_reduce(sums)
    model.train()
    loss = (sums[0] / sums[1]).item()
    bpb = (sums[2] / (math.log(2) * sums[3])).item() if sums[3] > 0 else None
    return loss, bpb


def autocast(device):
    return torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


def atomic_write(path, write):
    tmp = f"{path}.tmp{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def write_json(path, obj):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(json.dumps(obj, indent=2) + "\n")
    atomic_write(path, write)


def save_checkpoint(path, model, optimizer_states, state, plan):
    ckpt = dict(model_config=plan["model_config"], passes=plan["passes_final"], tokenizer=plan["tokenizer"],
                model={k: v.detach().float().cpu() for k, v in model.state_dict().items()},
                optimizers=optimizer_states, rng=torch.get_rng_state(), plan=plan, **state)
    atomic_write(path, lambda tmp: torch.save(ckpt, tmp))


# ---------------------------------------------------------------------------------------------------------------
# Training.

def dry_run(args):
    for depth in args.depths:
        args.depth = depth
        plan, _, _ = make_plan(args)
        print(json.dumps({k: v for k, v in plan.items() if k != "model_config"}))
    return 0


def train(args):
    plan, cfg, preset = make_plan(args)
    rank, world, device = setup_distributed(args.device)
    master = rank == 0
    run_dir = os.path.join(args.runs_dir, args.run_name or f"{args.arch}_d{args.depth}")
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    latest = os.path.join(ckpt_dir, "latest.pt")
    result_path = os.path.join(run_dir, "result.json")
    if os.path.exists(result_path) and not args.resume:
        raise UsageError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-name")
    if args.resume and os.path.exists(result_path) and json.load(open(result_path)).get("status") == "complete":
        if master:
            print(f"{run_dir} is already complete; nothing to do")
        return 0

    data_dir = args.data_dir or os.environ.get("DATA_DIR") or preset["data_dir"]
    if master and args.preset == "cpu":
        data.ensure_pool(data_dir, corpus=preset["corpus"], tokenizer=plan["tokenizer"])
    if world > 1:
        dist.barrier()
    train_pool, val_pool = data.load_pool(data_dir, "train"), data.load_pool(data_dir, "val")
    if train_pool.manifest.get("tokenizer") != plan["tokenizer"]:
        raise UsageError(f"{data_dir} was tokenized with {train_pool.manifest.get('tokenizer')!r} but the plan "
                         f"uses {plan['tokenizer']!r}; pass --tokenizer or another --data-dir")
    batch_seqs = plan["tokens_per_step"] // plan["seq_len"]
    if batch_seqs % world:
        raise UsageError(f"{batch_seqs} sequences per step do not split over {world} ranks")
    rank_seqs = batch_seqs // world
    device_batch = min(args.device_batch_size or default_device_batch(args, plan, preset), rank_seqs)
    if rank_seqs % device_batch:
        raise UsageError(f"--device-batch-size {device_batch} does not divide the {rank_seqs} sequences per rank")
    loader = data.TrainLoader(train_pool, plan["seq_len"], batch_seqs, token_limit=plan["train_token_limit"],
                              seed=plan["seed"])
    val = data.val_windows(val_pool, plan["seq_len"], plan["val_tokens"])
    enc = data.get_tokenizer(plan["tokenizer"])
    token_bytes = torch.as_tensor(data.token_byte_lengths(enc), device=device)

    torch.manual_seed(plan["seed"])
    model = model_lib.GPT(cfg).to(device)
    model.set_passes(plan["pass_stages"][0])
    optimizers = build_optimizers(model, plan)
    state = dict(step=0, evals=[], growth_events=[], flops=0, matrix_flops=0, train_seconds=0.0, tokens=0)
    if args.resume and os.path.exists(latest):
        ckpt = torch.load(latest, map_location="cpu", weights_only=False)
        if ckpt["plan"] != plan:
            raise UsageError(f"{latest} was written with another plan; resume with the same flags")
        model.load_state_dict(ckpt["model"])
        for opt, opt_state in zip(optimizers, ckpt["optimizers"]):
            opt.load_state_dict(opt_state)
        torch.set_rng_state(ckpt["rng"])
        state = {k: ckpt[k] for k in state}
        model.set_passes(stage_at(state["step"] - 1, plan) if state["step"] else plan["pass_stages"][0])
        if master:
            print(f"resuming {run_dir} from step {state['step']}")
    traj_path = os.path.join(run_dir, "trajectory.jsonl")
    if master:
        os.makedirs(ckpt_dir, exist_ok=True)
        keep = [l for l in open(traj_path)][:state["step"]] if os.path.exists(traj_path) else []
        with open(traj_path, "w") as f:  # drop lines past the checkpoint we resume from
            f.writelines(keep)
    if args.compile and device.type == "cuda":
        model = torch.compile(model)
    raw_model = model._orig_mod if hasattr(model, "_orig_mod") else model
    env = dict(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda,
               device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               compiled=bool(args.compile and device.type == "cuda"))

    def result(status):
        return dict(status=status, arch=plan["arch"], depth=plan["depth"], plan=plan, world_size=world,
                    device_batch_size=device_batch, gradient_accumulation_steps=rank_seqs // device_batch,
                    data_dir=data_dir, environment=env,
                    data_manifest={k: v for k, v in train_pool.manifest.items() if k != "sources"},
                    completed_steps=state["step"], evals=state["evals"], growth_events=state["growth_events"],
                    final_val_loss=state["evals"][-1]["val_loss"] if state["evals"] else None,
                    best_val_loss=min((e["val_loss"] for e in state["evals"]), default=None),
                    final_val_bpb=state["evals"][-1]["val_bpb"] if state["evals"] else None,
                    estimated_training_flops=state["flops"], tokens_seen=state["tokens"],
                    # without attention: the convention of the paper's data-constrained loop grid (spec §4.1)
                    estimated_matrix_flops=state["matrix_flops"],
                    total_training_time_seconds=state["train_seconds"],
                    tokens_per_second=state["tokens"] / state["train_seconds"] if state["train_seconds"] else None,
                    last_train_mfu=mfu, final_checkpoint_path=os.path.join(ckpt_dir, "final.pt"))

    def run_eval(step):
        loss, bpb = evaluate(model, val, plan["passes_final"], device_batch, token_bytes, rank, world, device)
        state["evals"].append(dict(step=step, epoch=step // loader.steps_per_epoch + 1, val_loss=loss, val_bpb=bpb))
        if master:
            print(f"step {step}/{plan['steps']} | val loss {loss:.4f}" + (f" | val bpb {bpb:.4f}" if bpb else ""))

    mfu = None
    if master:
        write_json(result_path, result("running"))
    if state["step"] == 0 and not state["evals"]:
        run_eval(0)
    stop = min(plan["steps"], args.stop_after) if args.stop_after else plan["steps"]
    accum = rank_seqs // device_batch
    peak = args.peak_flops * world if device.type == "cuda" else None
    save_every = args.save_every if args.save_every is not None else preset["save_every"]
    log_every = args.log_every or preset["log_every"]
    matrix_params = raw_model.param_groups()["matrix"]
    adam_params = [p for opt in optimizers if isinstance(opt, torch.optim.AdamW)
                   for g in opt.param_groups for p in g["params"]]
    traj = open(traj_path, "a") if master else None
    while state["step"] < stop:
        step = state["step"]
        t0 = time.perf_counter()
        passes = passes_at(step, plan)
        if step in plan["crossover_steps"]:
            before = raw_model.active_passes
            target = stage_at(step, plan)
            overwritten = grow(raw_model, optimizers, target)
            state["growth_events"].append(dict(step=step, passes_from=before, passes_to=target,
                                               reset_parameters=len(overwritten)))
        raw_model.set_passes(passes)
        lrm = lr_multiplier(step, plan)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["base_lr"] * lrm
                if isinstance(opt, muon.Muon):
                    group["momentum"] = muon.muon_momentum(step)
        epoch, windows = loader.batch(step, rank, world)
        batch_loss = torch.zeros((), device=device)
        for micro in windows.split(device_batch):
            micro = micro.to(device, non_blocking=True)
            with autocast(device):
                loss = model(micro[:, :-1], targets=micro[:, 1:])
            (loss / accum).backward()
            batch_loss += loss.detach() / accum
        for p in matrix_params:  # dormant untied cores get an explicit zero gradient, as in the release (§2.3)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        muon.all_reduce_grads(adam_params)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        if world > 1:
            dist.all_reduce(batch_loss)
            batch_loss /= world
        batch_loss = batch_loss.item()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if not math.isfinite(batch_loss):
            if master:
                write_json(result_path, dict(result("failed"), error=f"non-finite loss at step {step}"))
            print(f"train.py: error: non-finite loss {batch_loss} at step {step}; the last good checkpoint "
                  f"is {latest}", file=sys.stderr)
            return 3
        flops_per_token = model_lib.flops_per_token(cfg, passes)
        state["step"] += 1
        state["flops"] += flops_per_token * plan["tokens_per_step"]
        state["matrix_flops"] += model_lib.matrix_flops_per_token(cfg, passes) * plan["tokens_per_step"]
        state["tokens"] += plan["tokens_per_step"]
        state["train_seconds"] += dt
        tok_s = plan["tokens_per_step"] / dt
        mfu = flops_per_token * tok_s / peak if peak else None
        if master:
            traj.write(json.dumps(dict(step=step + 1, loss=batch_loss, lr_multiplier=lrm, passes=passes,
                                       tokens_per_second=tok_s, epoch=epoch)) + "\n")
            if step % log_every == 0 or step + 1 == stop:
                eta = (plan["steps"] - step - 1) * state["train_seconds"] / max(state["step"], 1)
                print(f"step {step + 1}/{plan['steps']} | loss {batch_loss:.4f} | lrm {lrm:.3f} | passes {passes} | "
                      f"{tok_s:,.0f} tok/s" + (f" | mfu {100 * mfu:.1f}%" if mfu else "") + f" | eta {eta:.0f}s")
        done = state["step"] == plan["steps"]
        if done or state["step"] % loader.steps_per_epoch == 0:  # the end, and every epoch boundary
            run_eval(state["step"])
        if done or state["step"] == stop or (save_every and state["step"] % save_every == 0):
            optimizer_states = [opt.state_dict() for opt in optimizers]  # collective: distributed Muon gathers
            if master:
                traj.flush()
                save_checkpoint(latest, raw_model, optimizer_states, state, plan)
                write_json(result_path, result("running"))  # progress so far, for whoever watches the run
    if master:
        traj.close()
    if state["step"] == plan["steps"]:
        if master:
            os.replace(latest, os.path.join(ckpt_dir, "final.pt"))
            write_json(result_path, result("complete"))
            print(f"done: final val loss {state['evals'][-1]['val_loss']:.4f} | "
                  f"{state['flops']:.3e} FLOPs | {state['train_seconds']:.0f}s | {run_dir}")
    elif master:
        write_json(result_path, dict(result("stopped"), stopped_early=True))
        print(f"stopped after step {state['step']} (--stop-after); continue with --resume")
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Benchmark: training-step time per arm at one shape (ratios are the point; absolute numbers depend on the box).

def bench(args):
    preset = PRESETS[args.preset]
    rank, world, device = setup_distributed(args.device)
    depth = args.depth = args.depth or preset["anchor_depth"]
    seq_len = args.seq_len or preset["seq_len"]
    batch = args.device_batch_size or (8 if device.type == "cpu" else preset["device_batch_size"])
    times = {}
    for arch in ("vanilla", "operator_1", "loop_2", "untied_2"):
        args.arch = arch
        plan, cfg, _ = make_plan(args)
        torch.manual_seed(0)
        model = model_lib.GPT(cfg).to(device)
        for p in model.parameters():  # non-zero out-projections so every branch does real work
            torch.nn.init.normal_(p, std=0.02)
        optimizers = build_optimizers(model, plan)
        step_fn = torch.compile(model) if args.compile and device.type == "cuda" else model
        x = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), device=device)
        elapsed = []
        for i in range(args.bench_steps + 3):
            t0 = time.perf_counter()
            with autocast(device):
                loss = step_fn(x[:, :-1], targets=x[:, 1:])
            loss.backward()
            for opt in optimizers:
                opt.step()
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:
                elapsed.append(time.perf_counter() - t0)
        dt = sorted(elapsed)[len(elapsed) // 2]
        tok_s = batch * seq_len / dt
        mfu = model_lib.flops_per_token(cfg, cfg.passes) * tok_s / args.peak_flops if device.type == "cuda" else None
        times[arch] = dt
        print(f"{arch:11s} d{depth} | {1000 * dt:8.1f} ms/step | {tok_s:12,.0f} tok/s"
              + (f" | mfu {100 * mfu:.1f}%" if mfu is not None else ""))
    print(f"operator_1/vanilla = {times['operator_1'] / times['vanilla']:.3f} (target <= 1.02)")
    print(f"untied_2/loop_2    = {times['untied_2'] / times['loop_2']:.3f} (target 1.00 +- 0.02)")
    return 0


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default=None, help="one of " + ", ".join(RECIPES))
    p.add_argument("--depth", type=int, nargs="+", default=None, help="several depths only with --dry-run")
    p.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="paper (default) or cpu (default for --bench without CUDA)")
    p.add_argument("--dry-run", action="store_true", help="print the plan as one JSON object and exit")
    p.add_argument("--bench", action="store_true", help="time training steps of four arms and print ratios")
    p.add_argument("--bench-steps", type=int, default=10)
    run = p.add_argument_group("run control")
    run.add_argument("--run-name", default=None, help="default ARCH_dDEPTH")
    run.add_argument("--runs-dir", default=os.environ.get("RUNS_DIR", "runs"))
    run.add_argument("--data-dir", default=None, help="token pool from data.py (env DATA_DIR; preset default)")
    run.add_argument("--tokenizer", choices=["gpt2", "bytes"], default=None)
    run.add_argument("--steps", type=int, default=None, help="override the derived step count")
    run.add_argument("--stop-after", type=int, default=None, help="stop after N steps without changing the plan")
    run.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (0: only at the end)")
    run.add_argument("--resume", action="store_true")
    run.add_argument("--seed", type=int, default=42)
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    run.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA)")
    run.add_argument("--device-batch-size", type=int, default=None, help="sequences per micro-batch")
    run.add_argument("--total-batch-tokens", type=int, default=None, help="tokens per optimizer step")
    run.add_argument("--seq-len", type=int, default=None)
    run.add_argument("--val-tokens", type=int, default=None, help="validation target tokens (multiple of seq-len)")
    run.add_argument("--train-token-limit", type=int, default=None)
    run.add_argument("--epochs", type=int, default=None, help="epochs over the token limit (--data-constrained)")
    run.add_argument("--log-every", type=int, default=None)
    run.add_argument("--peak-flops", type=float, default=H100_BF16_PEAK_FLOPS, help="per-GPU peak for MFU")
    rec = p.add_argument_group("recipe overrides (LRs are anchor-depth values, scaled to --depth)")
    rec.add_argument("--optimizer", choices=["muon", "adamw"], default="muon")
    rec.add_argument("--recipe", default=None, help="train with another arm's recipe (default: the arm's own)")
    rec.add_argument("--data-constrained", choices=list(DATA_CONSTRAINED), default=None)
    for name, kind in (("tpp", float), ("lr-exponent", float), ("matrix-lr", float), ("embedding-lr", float),
                       ("unembedding-lr", float), ("weight-decay", float), ("adam-eps", float),
                       ("warmup-steps", int), ("warmdown-ratio", float), ("rewarm-steps", int)):
        rec.add_argument(f"--{name}", type=kind, default=None)
    rec.add_argument("--adam-betas", type=float, nargs=2, default=None)
    rec.add_argument("--lr-multiplier", type=float, default=None, help="multiplies all three LRs (preset default)")
    rec.add_argument("--pass-stages", type=int, nargs="+", default=None, help="growth stages, e.g. 2 4 6")
    rec.add_argument("--crossover-fractions", type=float, nargs="+", default=None,
                     help="fraction of steps before each growth (rho = 1 - f)")
    rec.add_argument("--random-passes", type=int, nargs="+", default=None,
                     help="after growth, sample passes uniformly from this set each step (paper B.4)")
    arch = p.add_argument_group("model overrides")
    arch.add_argument("--width-per-depth", type=int, default=None)
    arch.add_argument("--head-dim", type=int, default=None)
    arch.add_argument("--prelude", type=int, default=None, help="fixed prelude blocks (core takes the rest)")
    arch.add_argument("--coda", type=int, default=None, help="fixed coda blocks")
    arch.add_argument("--passes", type=int, default=None, help="core passes K (final K for growth arms)")
    arch.add_argument("--alpha", type=float, default=None, help="injection scale of the boundary operator")
    arch.add_argument("--boundary", choices=["full", "norm_only", "inject_only", "none"], default=None)
    arch.add_argument("--no-coda-inject", action="store_true")
    for name in ("residual-multiplier", "output-multiplier", "wte-init-std", "uniform-init-scale"):
        arch.add_argument(f"--{name}", type=float, default=None)
    args = p.parse_args(argv)
    if not args.bench and (args.arch is None or args.depth is None):
        p.error("--arch and --depth are required")
    args.preset = args.preset or ("cpu" if args.bench and not torch.cuda.is_available() else "paper")
    args.depths = args.depth or [None]
    if len(args.depths) > 1 and not args.dry_run:
        p.error("several --depth values need --dry-run; train one depth per run")
    args.depth = args.depths[0]
    return args


def main(argv=None):
    try:
        args = parse_args(argv)
        code = bench(args) if args.bench else dry_run(args) if args.dry_run else train(args)
    except (UsageError, data.DataError) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        code = 2
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    exit_code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # gloo can abort in its worker thread during interpreter shutdown (pytorch#190489): leave without it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    sys.exit(exit_code)
