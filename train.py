"""train.py — train one arm of the paper at one depth with that arm's compute-optimal recipe.

One dial: `--arch A --depth d` derives width, heads, split, tokens per parameter, steps, LRs and the growth step
from the arm's row of arms.ARMS (arXiv 2609.19107, App. A; docs/recipe.md). Runs on one CPU, one GPU, or under
torchrun (NCCL on CUDA, gloo on CPU, multi-node through the standard torchrun environment). Every optimizer step
sees the same tokens whatever the world size, so a run can be resumed on a different number of GPUs.

    python train.py --arch untied_grow --depth 8 --dry-run               # the plan as one JSON object
    torchrun --nproc_per_node 8 train.py --arch vanilla --depth 12       # a paper ladder run on FineWeb
    python train.py --arch operator_1 --depth 3 --preset cpu             # offline, byte-level stdlib corpus
    python train.py --arch operator_1 --depth 8 --passes 4 --data-constrained tuned-wd
    python train.py --bench --depth 4                                    # GFLOP/s vs roofline, arm ratios
    python train.py --gpu-check                                          # GPU acceptance run -> gpu_check.json

Outputs go to <runs-dir>/<run-name>/: result.json, trajectory.jsonl, checkpoints/{latest,final}/ (folders: model.pt
holds the weights core_eval.py reads). --resume continues from checkpoints/latest; --resume-or-start also starts a
run that has none yet.
Exit codes: 2 bad flags or inputs, 3 non-finite loss (the last good checkpoint is kept).
"""
import argparse
import contextlib
import fcntl
import json
import math
import os
import pickle
import random
import shutil
import socket
import sys
import time
import warnings
from statistics import median
from dataclasses import asdict, dataclass, field, fields, replace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

import data
import model as model_lib
import muon
from cli import Parser, UsageError, atomic_write, exit_process, finite_float, sha256_file, write_json
import arms
from arms import ADAMW_MATRIX_LR, ARMS, DATA_CONSTRAINED, GPU_PEAK_FLOPS, PRESETS
from model import ModelConfig, autocast

# ---------------------------------------------------------------------------------------------------------------
# The plan: everything derived from --arch/--depth before touching data (paper App. A.3-A.4; docs/recipe.md).

@dataclass(frozen=True)
class Plan:
    """as_dict() is the --dry-run JSON and result.json's and the checkpoint's "plan": the model's accounting
    (model.describe) followed by these fields in this order."""
    arch: str
    depth: int
    preset: str
    tokenizer: str
    optimizer: str               # muon | adamw
    tpp: float
    lr_exponent: float
    tokens_per_step: int
    seq_len: int
    steps: int
    crossover_step: int          # the first growth step (None without growth)
    crossover_steps: tuple       # every growth step
    crossover_fractions: tuple
    pass_stages: tuple           # passes before the first, ..., after the last growth
    random_passes: tuple         # after the last growth, passes drawn from these each step (paper App. B.4)
    train_tokens: int
    train_token_limit: int       # the loader's prefix of the pool; epochs repeat it
    epochs: int
    val_tokens: int
    matrix_lr: float             # LRs at this depth
    embedding_lr: float
    unembedding_lr: float
    weight_decay: float
    adam_betas: tuple
    adam_eps: float
    warmup_steps: int
    warmdown_ratio: float
    rewarm_steps: int
    data_constrained: str        # None, fixed-wd or tuned-wd
    seed: int
    model_config: ModelConfig
    total_flops: int = 0

    @property
    def passes_final(self):
        return self.model_config.passes

    def as_dict(self):
        out = model_lib.describe(self.model_config)
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = asdict(value) if f.name == "model_config" else list(value) if isinstance(value, tuple) \
                else value
        return out


def make_plan(args):
    """The plan of one run. Pure arithmetic, in numbered steps."""
    if args.depth is None or args.depth < 1:
        raise UsageError("--depth must be a positive integer, e.g. --depth 8")
    depth = args.depth

    # 1. The training recipe: the arm's own, another arm's (--recipe, paper Fig. 16b) or the data-constrained grid's
    #    (Operator-1's at a constant LR and the grid's weight decay); then the recipe flags.
    recipe = ARMS[args.recipe or args.arch]
    regime = DATA_CONSTRAINED.get(args.data_constrained)
    if regime:
        recipe = replace(ARMS[regime.recipe], lr_exponent=0.0,
                         weight_decay=regime.weight_decay.get(depth, regime.default_weight_decay))
    recipe = replace(recipe, **arms.given_knobs(args, arms.Arm, "train"))

    # 2. Shapes: the preset with its flags; the model at this depth. GPT-2's vocab size is known without tiktoken's
    #    download, so a dry run works offline.
    preset = arms.preset_from_args(args)
    tokenizer = args.tokenizer or preset.tokenizer
    vocab_size = data.get_tokenizer(tokenizer).n_vocab if tokenizer != "gpt2" else model_lib.GPT2_VOCAB
    cfg = model_lib.config_from_args(args, preset, depth, vocab_size)
    seq_len, batch_tokens = preset.seq_len, preset.total_batch_tokens
    if batch_tokens % seq_len:
        raise UsageError(f"--total-batch-tokens {batch_tokens} is not a multiple of the sequence length {seq_len}")
    if preset.val_tokens % seq_len:
        raise UsageError(f"--val-tokens {preset.val_tokens} is not a multiple of the sequence length {seq_len}")

    # 3. Growth: the pass stages and the fraction f of the steps before each growth (the paper's rho = 1 - f).
    stages = args.pass_stages or sorted({cfg.passes_initial, cfg.passes})
    growth = len(stages) > 1
    fractions = growth_fractions(args.crossover_fractions, recipe, depth, stages) if growth else []

    # 4. Steps: TPP * N / batch tokens; growth arms match the initial-K matrix-compute budget, with the K=2 step count
    #    left unrounded (App. A.3.2); the data-constrained grid repeats a fixed token budget for its epochs.
    n_tpp = model_lib.params_tpp(cfg)
    epochs = 1
    if args.epochs and not regime:
        raise UsageError("--epochs sets the data-constrained regime (with --data-constrained); a single-epoch run "
                         "ends at its step count")
    if regime:
        token_limit = args.train_token_limit or regime.train_tokens
        epochs = args.epochs or regime.epochs
        steps = epochs * ((token_limit // (seq_len + 1)) // (batch_tokens // seq_len))
    elif growth:
        m = [model_lib.matrix_flops_per_token(cfg, k) for k in stages]
        share = [b - a for a, b in zip([0.0] + fractions, fractions + [1.0])]
        steps = round(recipe.tpp * n_tpp / batch_tokens * m[0] / sum(s * mk for s, mk in zip(share, m)))
    else:
        steps = round(recipe.tpp * n_tpp / batch_tokens)
    steps = args.steps or steps
    if steps < 1:
        raise UsageError(f"the plan has {steps} steps; raise --depth or --tpp, or pass --steps")
    if not regime:
        token_limit = args.train_token_limit or steps * batch_tokens * 101 // 100
    crossovers = [math.floor(f * steps) for f in fractions]
    if any(not 1 <= c < steps for c in crossovers):
        raise UsageError(f"crossover steps {crossovers} must lie in [1, {steps}); use more --steps")

    # 5. LRs: the anchor depth's, scaled by (N(anchor) / N(d)) ** lr_exponent (App. A.4.4) and the preset's multiplier.
    anchor = preset.anchor_depth
    anchor_cfg = model_lib.config_from_args(args, preset, anchor, vocab_size) if anchor != depth else cfg
    lr_scale = preset.lr_multiplier * (model_lib.params_tpp(anchor_cfg) / n_tpp) ** recipe.lr_exponent
    matrix_lr = ADAMW_MATRIX_LR if args.optimizer == "adamw" else recipe.matrix_lr

    plan = Plan(arch=args.arch, depth=depth, preset=args.preset, tokenizer=tokenizer, optimizer=args.optimizer,
                tpp=recipe.tpp, lr_exponent=recipe.lr_exponent, tokens_per_step=batch_tokens, seq_len=seq_len,
                steps=steps, crossover_step=crossovers[0] if crossovers else None, crossover_steps=tuple(crossovers),
                crossover_fractions=tuple(fractions), pass_stages=tuple(stages),
                random_passes=tuple(args.random_passes or ()), train_tokens=steps * batch_tokens,
                train_token_limit=token_limit, epochs=epochs, val_tokens=preset.val_tokens,
                matrix_lr=matrix_lr * lr_scale, embedding_lr=recipe.embedding_lr * lr_scale,
                unembedding_lr=recipe.unembedding_lr * lr_scale, weight_decay=recipe.weight_decay,
                adam_betas=tuple(recipe.adam_betas), adam_eps=recipe.adam_eps, warmup_steps=recipe.warmup_steps,
                warmdown_ratio=recipe.warmdown_ratio, rewarm_steps=recipe.rewarm_steps if growth else 0,
                data_constrained=args.data_constrained, seed=args.seed, model_config=cfg)
    # 6. Compute: F(passes at the step) * tokens per step, summed over the steps.
    return replace(plan, total_flops=total_flops(plan))


def growth_fractions(flag, recipe, depth, stages):
    """--crossover-fractions, else the recipe's fraction at this depth; one increasing fraction in (0, 1) per growth."""
    fractions = flag
    if fractions is None and recipe.default_crossover is not None:
        fractions = [recipe.crossover.get(depth, recipe.default_crossover)]
    if fractions is None or len(fractions) != len(stages) - 1 or any(not 0 < f < 1 for f in fractions) \
            or sorted(fractions) != list(fractions):
        raise UsageError(f"growth {'->'.join(map(str, stages))} needs {len(stages) - 1} increasing "
                         "--crossover-fractions in (0, 1), e.g. --crossover-fractions 0.75")
    return fractions


def total_flops(plan):
    """Sum over optimizer steps of F(L_step) * tokens per step (result.json's estimated_training_flops)."""
    cfg = plan.model_config
    if plan.random_passes:
        per_step = [model_lib.flops_per_token(cfg, passes_at(s, plan)) for s in range(plan.steps)]
    else:
        bounds = [0, *plan.crossover_steps, plan.steps]
        per_step = []
        for k, a, b in zip(plan.pass_stages, bounds, bounds[1:]):
            per_step += [model_lib.flops_per_token(cfg, k)] * (b - a)
    return sum(per_step) * plan.tokens_per_step


def wsd_multiplier(step, steps, warmup, warmdown_ratio):
    """Warmup (i+1)/W, then stable, then linear decay reaching exactly 0 on the last step (docs/recipe.md)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    start = max(warmup, steps - round(warmdown_ratio * steps))
    if step < start:
        return 1.0
    return min(1.0, max(0.0, 1.0 - (step - start) / max(steps - start - 1, 1)))


def lr_multiplier(step, plan):
    """WSD times the post-growth re-warm: exactly 0 at each crossover step, back to 1 after rewarm_steps."""
    m = wsd_multiplier(step, plan.steps, plan.warmup_steps, plan.warmdown_ratio)
    for crossover in plan.crossover_steps:
        if plan.rewarm_steps and step >= crossover:
            m *= min(1.0, (step - crossover) / plan.rewarm_steps)
    return m


def stage_index(step, plan):
    """Which growth stage is in force at an optimizer step (0 before the first growth)."""
    return sum(step >= c for c in plan.crossover_steps)


def stage_at(step, plan):
    """The growth stage's pass count in force at an optimizer step."""
    return plan.pass_stages[stage_index(step, plan)]


def passes_at(step, plan):
    """Passes for one optimizer step: the growth stage, or after the last growth (optionally) random recurrence,
    drawn from a per-step seed so every rank and every resume agrees."""
    if plan.random_passes and step >= (plan.crossover_steps or [0])[-1]:
        return random.Random(plan.seed * 1_000_003 + step).choice(plan.random_passes)
    return stage_at(step, plan)


# ---------------------------------------------------------------------------------------------------------------
# Memory: the micro-batch of each pass stage, from model.py's memory model (README "Memory per GPU"). It depends on
# the world size and the device, so it is kept out of the Plan (a run resumes on another world size): result.json
# and the dry run hold it under "memory".

H100_80GB_GIB = 81559 / 1024   # GiB that torch reports for an H100 80GB: a dry run's default --gpu-memory


def memory_pass_stages(plan):
    """The passes each stage is planned for; random recurrence (App. B.4) plans for its largest draw."""
    stages = list(plan.pass_stages)
    if plan.random_passes:
        stages[-1] = max(stages[-1], *plan.random_passes)
    return stages


def plan_micro_batches(plan, world, gpu_memory_gib, device_batch=None, device="cuda"):
    """Per pass stage, the largest micro-batch (a divisor of the sequences per rank) that fits gpu_memory_gib, or a
    check of --device-batch-size (one value, or one per stage). Gradients stay replicated (reduced once per step)
    when that fits, else they are sharded over the ranks by the owner-sharded transport, which then reduces every
    micro-batch (zero2). -> model.MemoryPlan; UsageError when nothing fits."""
    batch_seqs = plan.tokens_per_step // plan.seq_len
    if batch_seqs % world:
        raise UsageError(f"{batch_seqs} sequences per step do not split over {world} ranks")
    rank_seqs, stages = batch_seqs // world, memory_pass_stages(plan)
    explicit = None
    if device_batch:
        if len(device_batch) not in (1, len(stages)):
            raise UsageError(f"--device-batch-size takes one value or one per pass stage {stages}")
        explicit = [min(b, rank_seqs) for b in device_batch] * (len(stages) // len(device_batch))
    mem = fit_memory(plan, world, gpu_memory_gib, explicit, device)
    if isinstance(mem, model_lib.MemoryPlan):
        return mem
    if explicit is not None:
        raise UsageError(f"--device-batch-size: {mem} ({world} GPUs)")
    more = next((w for w in range(2 * world, batch_seqs + 1, world) if batch_seqs % w == 0
                 and isinstance(fit_memory(plan, w, gpu_memory_gib, None, device), model_lib.MemoryPlan)), None)
    raise UsageError(f"{plan.arch} d{plan.depth} does not fit {gpu_memory_gib:g} GiB per GPU on {world} GPUs, not even "
                     "at micro-batch 1" + (" with sharded gradients; " if world > 1 else "; ") +
                     (f"it fits on {more} GPUs" if more else "no world size fits"))


def fit_memory(plan, world, gpu_memory_gib, explicit, device):
    """model.plan_memory with replicated gradients, else (several ranks) sharded ones -> MemoryPlan, or the
    ValueError of the last try."""
    rank_seqs = plan.tokens_per_step // plan.seq_len // world
    for zero2 in (False, True) if world > 1 else (False,):
        try:
            return model_lib.plan_memory(plan.model_config, memory_pass_stages(plan), rank_seqs, gpu_memory_gib,
                                         world, zero2, explicit, device)
        except ValueError as e:
            error = e
    return error


def memory_report(mem, plan):
    """The "memory" of a dry run and of result.json: per pass stage the micro-batch, the gradient accumulation and
    the predicted GiB per rank (model.memory_per_rank: eager, an upper bound for a compiled run)."""
    rank_seqs = plan.tokens_per_step // plan.seq_len // mem.world_size
    gradients = ("sharded over the ranks and reduced every micro-batch (the owner-sharded transport is required: "
                 "replicated gradients do not fit)" if mem.zero2 else "replicated, reduced once per step")
    return dict(gpu_memory_gib=None if math.isinf(mem.gpu_memory_gib) else round(mem.gpu_memory_gib, 2),
                world_size=mem.world_size, sequences_per_rank=rank_seqs, sync_every_micro_batch=mem.zero2,
                gradients=gradients,
                stages=[dict(passes=s.passes, executed_blocks=s.executed_blocks, micro_batch=s.micro_batch,
                             accumulation=rank_seqs // s.micro_batch,
                             gib={k: round(v / model_lib.GIB, 2) for k, v in s.bytes.items()}) for s in mem.stages])


def device_memory_plan(args, plan, world, device):
    """This process's micro-batches: on CUDA fitted to --gpu-memory (default the device's total memory); on CPU
    (fp32, host memory) the preset's micro-batch unless --device-batch-size or --gpu-memory is given."""
    if device.type == "cuda":
        gpu = args.gpu_memory or torch.cuda.get_device_properties(device).total_memory / model_lib.GIB
        return plan_micro_batches(plan, world, gpu, args.device_batch_size, "cuda")
    if args.gpu_memory:
        return plan_micro_batches(plan, world, args.gpu_memory, args.device_batch_size, "cpu")
    return plan_micro_batches(plan, world, math.inf, args.device_batch_size or [PRESETS[plan.preset].device_batch_size],
                              "cpu")


def dry_run(args):
    """One JSON line per --depth: the plan and its "memory" for --world-size GPUs of --gpu-memory GiB (CUDA)."""
    world = args.world_size or int(os.environ.get("NPROC_PER_NODE", 8)) * int(os.environ.get("NNODES", 1))
    for depth in args.depths:
        args.depth = depth
        plan = make_plan(args)
        mem = plan_micro_batches(plan, world, args.gpu_memory or H100_80GB_GIB, args.device_batch_size)
        out = {k: v for k, v in plan.as_dict().items() if k != "model_config"}
        print(json.dumps(dict(out, memory=memory_report(mem, plan))))
    return 0


def use_compile(args, device):
    """torch.compile by default on CUDA; --no-compile opts out; CPU stays eager unless --compile."""
    return args.compile if args.compile is not None else device.type == "cuda"


def compile_model(model, plan):
    """dynamic=False: the pass count (the int model.active_passes, or eval's passes argument) and the micro-batch
    are constants of a graph, so a run compiles one graph per pass stage and one for eval (plus one for a shorter
    last eval batch); random recurrence compiles one per pass value drawn, which the recompile limit allows."""
    graphs = len(plan.pass_stages) + len(plan.random_passes) + 2
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs)
    return torch.compile(model, dynamic=False)


# ---------------------------------------------------------------------------------------------------------------
# Optimizers, growth, evaluation, checkpoints

def build_optimizers(model, plan, polar_express_dtype="auto"):
    """Muon for the block matrices, AdamW for embedding and lm_head (--optimizer adamw: AdamW for all)."""
    groups = model.param_groups()
    betas, eps, wd = tuple(plan.adam_betas), plan.adam_eps, plan.weight_decay
    adam_groups = [dict(params=groups["embedding"], lr=plan.embedding_lr, base_lr=plan.embedding_lr),
                   dict(params=groups["unembedding"], lr=plan.unembedding_lr, base_lr=plan.unembedding_lr)]
    if plan.optimizer == "adamw":
        adam_groups.append(dict(params=groups["matrix"], lr=plan.matrix_lr, base_lr=plan.matrix_lr))
        return [torch.optim.AdamW(adam_groups, betas=betas, eps=eps, weight_decay=wd, foreach=True)]
    names = [f"transformer.h.{name}" for name, _ in model.transformer.h.named_parameters()]  # checkpoint keys
    matrix = muon.Muon(groups["matrix"], lr=plan.matrix_lr, weight_decay=wd, polar_express_dtype=polar_express_dtype,
                       param_names=names)
    for group in matrix.param_groups:
        group["base_lr"] = plan.matrix_lr
    return [matrix, torch.optim.AdamW(adam_groups, betas=betas, eps=eps, weight_decay=wd, foreach=True)]


def replicated_grads(optimizers):
    """Rank-averaged gradients for every AdamW parameter (muon.ReplicatedGrads; Muon reduces its own)."""
    return muon.ReplicatedGrads([p for opt in optimizers if isinstance(opt, torch.optim.AdamW)
                                 for group in opt.param_groups for p in group["params"]])


def grow(model, optimizers, passes):
    """Untied cores get the stacking copy and fresh optimizer state; a tied core keeps its state (paper Sec. 3)."""
    overwritten = model.grow(passes)
    for opt in optimizers:
        muon.reset_state(opt, overwritten)
    return overwritten


@torch.no_grad()
def evaluate(model, val, passes, batch_size, token_bytes, rank, world, device):
    """Validation loss in nats per target token (and bits per byte), examples sharded over ranks."""
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


@dataclass
class RunState:
    """What changes as a run trains; a checkpoint holds these fields at its top level."""
    step: int = 0
    evals: list = field(default_factory=list)
    growth_events: list = field(default_factory=list)
    flops: int = 0
    matrix_flops: int = 0        # without attention: the convention of the paper's data-constrained loop grid
    train_seconds: float = 0.0
    tokens: int = 0


# A checkpoint is a folder (checkpoints/latest, checkpoints/final): model.pt (weights, model_config, passes, tokenizer,
# step; rank 0), muon/ (torch.distributed.checkpoint: every rank writes the Muon state it owns), adamw.pt (the
# replicated AdamW state; rank 0), meta.json (RunState, plan, RNG state, args, Muon hyperparameters) and, written
# last, MANIFEST.json (size and sha256 of every file). Everything is tensors and plain types: every torch.load uses
# weights_only=True, and DCP's metadata pickle goes through SafeMetadataReader.

# DCP warns on every single-process save/load that it "assumes" one process: that is what one process means here
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


class SafeMetadataReader(dcp.FileSystemReader):
    """DCP's file reader with a safe .metadata: torch 2.13's FileSystemReader.read_metadata is a plain pickle.load
    (its tensor data is read with torch.load(weights_only=True)), so this one unpickles only DCP's metadata classes,
    and refuses non-tensor entries, which DCP's load planner would read with torch.load(weights_only=False)."""

    ALLOWED = {"torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                                         "ChunkStorageMetadata", "MetadataIndex", "StorageMeta",
                                                         "_MEM_FORMAT_ENCODING", "BytesStorageMetadata"},
               "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
               "torch.serialization": {"_get_layout"}, "torch": {"Size"}, "pathlib": {"PosixPath"},
               "collections": {"OrderedDict"}}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if name in SafeMetadataReader.ALLOWED.get(module, ()) or \
                    (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")

    def read_metadata(self, *args, **kwargs):
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            metadata = self.Unpickler(f).load()
        entries = getattr(metadata, "state_dict_metadata", None)
        if not isinstance(entries, dict) or not all(isinstance(v, dcp.metadata.TensorStorageMetadata)
                                                    for v in entries.values()):
            raise pickle.UnpicklingError("the metadata lists entries other than tensors")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp.metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def process():
    """(rank, world size) of this process."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def gather(obj):
    """Every rank's obj, in rank order (a list of one without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier():
    if dist.is_initialized():
        dist.barrier()


def write_manifest(folder):
    """Collective: every rank hashes its share of the files, rank 0 writes MANIFEST.json (last: it marks the
    checkpoint complete)."""
    rank, world = process()
    names = sorted(os.path.relpath(os.path.join(base, n), folder) for base, _, files in os.walk(folder) for n in files)
    mine = {rel: dict(size=os.path.getsize(os.path.join(folder, rel)), sha256=sha256_file(os.path.join(folder, rel)))
            for rel in names[rank::world]}
    parts = gather(mine)
    if rank == 0:
        write_json(os.path.join(folder, model_lib.CHECKPOINT_MANIFEST),
                   dict(files={k: v for part in parts for k, v in sorted(part.items())}))


def verify(folder):
    """Collective: the manifest check (model.verify_checkpoint), its files shared among the ranks -> UsageError on
    every rank when any share fails."""
    rank, world = process()
    try:
        model_lib.verify_checkpoint(folder, share=(rank, world))
        error = None
    except ValueError as e:
        error = str(e)
    errors = [e for e in gather(error) if e]
    if errors:
        raise UsageError(errors[0])


def save_checkpoint(folder, model, optimizers, state, plan, args=None):
    """Collective: write checkpoint `folder` into folder.tmp, then swap it in (folder -> folder.old, folder.tmp ->
    folder, remove folder.old); recover_checkpoints repairs a crash between the renames. No optimizer state is
    copied: Muon.state_dict() and AdamW.state_dict() hold references to the live tensors."""
    rank, world = process()
    tmp = folder + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    barrier()
    matrix = [opt for opt in optimizers if isinstance(opt, muon.Muon)]
    shard = {k: v for k, v in matrix[0].state_dict().items() if k != "param_groups"} if matrix else {}
    if matrix:
        dcp.save(dict(muon=shard), storage_writer=dcp.FileSystemWriter(os.path.join(tmp, "muon")), no_dist=world == 1)
    if rank == 0:
        plan_dict = plan.as_dict()
        torch.save(dict(model_config=plan_dict["model_config"], passes=plan.passes_final, tokenizer=plan.tokenizer,
                        step=state.step, model={k: v.detach().float().cpu() for k, v in model.state_dict().items()}),
                   os.path.join(tmp, model_lib.CHECKPOINT_WEIGHTS))
        torch.save([opt.state_dict() for opt in optimizers if isinstance(opt, torch.optim.AdamW)],
                   os.path.join(tmp, "adamw.pt"))
        muon_groups = [{k: v for k, v in g.items()} for g in matrix[0].state_dict()["param_groups"]] if matrix else []
        write_json(os.path.join(tmp, "meta.json"), dict(
            format=CHECKPOINT_FORMAT, plan=plan_dict, world_size=world, rng=torch.get_rng_state().tolist(),
            muon_param_groups=muon_groups, args=primitive_args(args), **asdict(state)))
    barrier()
    write_manifest(tmp)
    if rank == 0:
        if os.path.exists(folder):
            os.replace(folder, folder + ".old")
        os.replace(tmp, folder)
        shutil.rmtree(folder + ".old", ignore_errors=True)
        remove_dead_temp_files(os.path.dirname(folder))
    barrier()


CHECKPOINT_FORMAT = 2  # 1: the single-file latest.pt/final.pt of earlier versions (only core_eval reads those)


def primitive_args(args):
    """The command line as a dict of JSON primitives (for the record; the plan decides what a resume must match)."""
    if args is None:
        return {}
    return {k: v for k, v in vars(args).items()
            if v is None or isinstance(v, (bool, int, float, str)) or
            (isinstance(v, list) and all(isinstance(x, (bool, int, float, str)) for x in v))}


def load_checkpoint(folder, plan, model, optimizers):
    """Collective: restore weights, optimizer and RNG state written by save_checkpoint under the same plan, at any
    world size -> RunState. A checkpoint that fails its manifest, its plan or its loading is a UsageError."""
    verify(folder)
    meta = json.load(open(os.path.join(folder, "meta.json")))
    if meta.get("format") != CHECKPOINT_FORMAT or meta.get("plan") != json.loads(json.dumps(plan.as_dict())):
        raise UsageError(f"{folder} was written with another plan; resume with the same flags")
    try:
        weights = torch.load(os.path.join(folder, model_lib.CHECKPOINT_WEIGHTS), map_location="cpu",
                             weights_only=True)
        model.load_state_dict(weights["model"])
        for opt in optimizers:
            if isinstance(opt, muon.Muon):
                reader = SafeMetadataReader(os.path.join(folder, "muon"))
                reader.read_metadata()  # refuses a crafted pickle here, with its own message
                template = dict(muon={k: v for k, v in opt.state_dict().items() if k != "param_groups"})
                dcp.load(template, storage_reader=reader, no_dist=not dist.is_initialized())
                opt.load_state_dict(dict(template["muon"], param_groups=meta["muon_param_groups"]))
        adamw = [opt for opt in optimizers if isinstance(opt, torch.optim.AdamW)]
        for opt, saved in zip(adamw, torch.load(os.path.join(folder, "adamw.pt"), weights_only=True), strict=True):
            opt.load_state_dict(saved)
        torch.set_rng_state(torch.tensor(meta["rng"], dtype=torch.uint8))
        state = RunState(**{f.name: meta[f.name] for f in fields(RunState)})
    except pickle.UnpicklingError as e:
        detail = f" ({e})" if len(str(e)) < 120 else ""  # ours are short; torch's weights_only text is a page
        raise UsageError(f"checkpoint {folder} is unreadable or holds objects other than tensors and plain types"
                         f"{detail}; refused without running it") from None
    except Exception as e:  # missing files or keys, shapes of another model: not this run's checkpoint
        raise UsageError(f"checkpoint {folder} is not usable: {type(e).__name__}: "
                         f"{(str(e).strip().splitlines() or [''])[0][:200]}") from None
    model.set_passes(stage_at(state.step - 1, plan) if state.step else plan.pass_stages[0])
    return state


def read_run_state(folder):
    """The RunState of a checkpoint (after its manifest check), without loading any tensor."""
    verify(folder)
    meta = json.load(open(os.path.join(folder, "meta.json")))
    return RunState(**{f.name: meta[f.name] for f in fields(RunState)})


def checkpoint_step(folder):
    """The step of a complete checkpoint folder, None if it is not complete."""
    try:
        model_lib.verify_checkpoint(folder)
        return json.load(open(os.path.join(folder, "meta.json")))["step"]
    except (ValueError, OSError, KeyError, TypeError):
        return None


def recover_checkpoints(ckpt_dir):
    """Rank 0 at start: after a crash inside a save, keep the newest complete copy of latest/ and final/ (among X,
    X.old, X.tmp) as X and remove the other copies; remove temporary files of dead writers."""
    for name in ("latest", "final"):
        copies = [os.path.join(ckpt_dir, name + suffix) for suffix in ("", ".old", ".tmp")]
        present = [c for c in copies if os.path.isdir(c)]
        if present in ([], [copies[0]]):
            continue  # nothing interrupted: a lone folder is left as it is, even if incomplete (resume says so)
        steps = {c: checkpoint_step(c) for c in present}
        complete = [c for c in present if steps[c] is not None]
        best = max(complete, key=lambda c: (steps[c], c == copies[0])) if complete else None
        for c in present:
            if c != best and (best is not None or c == copies[2]):
                shutil.rmtree(c)
        if best is not None and best != copies[0]:
            os.replace(best, copies[0])
    remove_dead_temp_files(ckpt_dir)


def remove_dead_temp_files(folder):
    """Delete cli.atomic_write's leftovers (NAME.tmp<pid>) whose writer process no longer runs on this host."""
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        stem, sep, pid = name.rpartition(".tmp")
        if not (sep and stem and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            path = os.path.join(folder, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        except PermissionError:
            pass  # alive, another user's


# ---------------------------------------------------------------------------------------------------------------
# Training

@dataclass
class Run:
    """A run's fixed context: its plan, process, output paths and data."""
    plan: Plan
    rank: int
    world: int
    device: torch.device
    run_dir: str
    data_dir: str
    data_manifest: dict
    loader: data.TrainLoader
    val: torch.Tensor
    token_bytes: torch.Tensor
    micro_batches: tuple         # sequences per micro-batch in each pass stage (the memory plan's)
    sync_every_micro_batch: bool  # reduce gradients every micro-batch: the memory plan shards them (zero2)
    memory: dict                 # memory_report of the memory plan, for result.json
    environment: dict
    peak_flops: float            # of all ranks together, for MFU (None off CUDA)
    resume_from: str = None      # the checkpoint folder this invocation continues from (None: step 0)
    args: object = None          # the parsed command line (recorded in checkpoints)

    master = property(lambda self: self.rank == 0)
    ckpt_dir = property(lambda self: os.path.join(self.run_dir, "checkpoints"))
    latest = property(lambda self: os.path.join(self.ckpt_dir, "latest"))
    final = property(lambda self: os.path.join(self.ckpt_dir, "final"))
    result_path = property(lambda self: os.path.join(self.run_dir, "result.json"))
    trajectory_path = property(lambda self: os.path.join(self.run_dir, "trajectory.jsonl"))


def open_run(args, plan):
    """Processes, output folder and data of a run; None when --resume finds it complete."""
    rank, world, device = model_lib.setup_distributed(args.device)
    run_dir = run_dir_of(args)
    resume_from = resume_point(args, run_dir, rank)
    if resume_from == "complete":
        return None
    mem = device_memory_plan(args, plan, world, device)  # before any data work: a run that cannot fit stops here
    preset = PRESETS[plan.preset]
    data_dir = args.data_dir or os.environ.get("DATA_DIR") or preset.data_dir
    if rank == 0 and plan.preset == "cpu" and data_dir == preset.data_dir:  # only the default folder is prepared
        data.ensure_pool(data_dir, corpus=preset.corpus, tokenizer=plan.tokenizer)
    if world > 1:
        dist.barrier()
    train_pool, val_pool = data.load_pool(data_dir, "train"), data.load_pool(data_dir, "val")
    if train_pool.manifest.get("tokenizer") != plan.tokenizer:
        raise UsageError(f"{data_dir} was tokenized with {train_pool.manifest.get('tokenizer')!r} but the plan "
                         f"uses {plan.tokenizer!r}; pass --tokenizer or another --data-dir")
    check_pool_tokens(data_dir, train_pool, val_pool, plan)
    batch_seqs = plan.tokens_per_step // plan.seq_len
    loader = data.TrainLoader(train_pool, plan.seq_len, batch_seqs, token_limit=plan.train_token_limit,
                              seed=plan.seed)
    val = data.val_windows(val_pool, plan.seq_len, plan.val_tokens)
    token_bytes = torch.as_tensor(data.token_byte_lengths(data.get_tokenizer(plan.tokenizer)), device=device)
    environment = dict(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda,
                       device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       compiled=use_compile(args, device))
    return Run(plan=plan, rank=rank, world=world, device=device, run_dir=run_dir, data_dir=data_dir,
               data_manifest={k: v for k, v in train_pool.manifest.items() if k != "sources"}, loader=loader,
               val=val, token_bytes=token_bytes, micro_batches=tuple(s.micro_batch for s in mem.stages),
               sync_every_micro_batch=mem.zero2, memory=memory_report(mem, plan), environment=environment,
               peak_flops=peak * world if (peak := gpu_peak_flops(device, args.peak_flops)) else None,
               resume_from=resume_from,
               args=args)


def run_status(run_dir):
    """result.json's status (None when there is none yet)."""
    path = os.path.join(run_dir, "result.json")
    if not os.path.exists(path):
        return None
    try:
        return json.load(open(path))["status"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{path} is not a train.py result.json; move it away or choose another --run-name") \
            from None


def resume_point(args, run_dir, rank):
    """Where this invocation starts, never guessed: "complete" (nothing to do), a checkpoint folder (final/ when the
    run finished training but its result.json was not written), or None (step 0 of a new run). Refuses to start
    over an existing run, and --resume without a checkpoint (--resume-or-start starts such a run at step 0)."""
    status, ckpt_dir = run_status(run_dir), os.path.join(run_dir, "checkpoints")
    trajectory = os.path.join(run_dir, "trajectory.jsonl")  # empty files of a start killed at once do not count
    started = status is not None or (os.path.exists(trajectory) and os.path.getsize(trajectory) > 0) or \
        (os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir) != [])
    if not (args.resume or args.resume_or_start):
        if started:
            raise UsageError(f"{run_dir} already holds a run; pass --resume to continue it or choose another "
                             "--run-name")
        return None
    if status == "complete":
        if rank == 0:
            print(f"{run_dir} is already complete; nothing to do")
        return "complete"
    if rank == 0 and os.path.isdir(ckpt_dir):
        recover_checkpoints(ckpt_dir)
    barrier()
    for name in ("final", "latest"):
        if os.path.isdir(os.path.join(ckpt_dir, name)):
            return os.path.join(ckpt_dir, name)
    old = [n for n in ("final.pt", "latest.pt") if os.path.exists(os.path.join(ckpt_dir, n))]
    if old:
        raise UsageError(f"{os.path.join(ckpt_dir, old[0])} is a single-file checkpoint of an earlier train.py, "
                         "which cannot be resumed (core_eval.py still reads it); start the run again under another "
                         "--run-name")
    if args.resume:
        raise UsageError(f"--resume: {run_dir} has no checkpoint to resume from ({ckpt_dir}/latest); pass "
                         "--resume-or-start to start it at step 0")
    return None


def open_trajectory(run, step):
    """trajectory.jsonl cut back to the first `step` lines (the checkpoint resumed from), open for appending."""
    lines = open(run.trajectory_path).readlines() if os.path.exists(run.trajectory_path) else []
    if len(lines) < step:  # on every rank, so that all of them stop
        raise UsageError(f"{run.trajectory_path} has {len(lines)} lines but the checkpoint is at step {step}; "
                         "restore the file or start the run again under another --run-name")
    if not run.master:
        return None
    os.makedirs(run.ckpt_dir, exist_ok=True)
    if len(lines) > step:
        def write(tmp):
            with open(tmp, "w") as f:
                f.writelines(lines[:step])
        atomic_write(run.trajectory_path, write)
    return open(run.trajectory_path, "a")


def write_result(run, state, status, mfu=None, **extra):
    if not run.master:
        return
    evals = state.evals
    write_json(run.result_path, dict(  # the keys fit.py and the tests read
        status=status, arch=run.plan.arch, depth=run.plan.depth, plan=run.plan.as_dict(), world_size=run.world,
        device_batch_size=list(run.micro_batches), memory=run.memory,
        gradient_accumulation_steps=[s["accumulation"] for s in run.memory["stages"]], data_dir=run.data_dir,
        environment=run.environment, data_manifest=run.data_manifest, completed_steps=state.step, evals=evals,
        growth_events=state.growth_events, final_val_loss=evals[-1]["val_loss"] if evals else None,
        best_val_loss=min((e["val_loss"] for e in evals), default=None),
        final_val_bpb=evals[-1]["val_bpb"] if evals else None, estimated_training_flops=state.flops,
        tokens_seen=state.tokens, estimated_matrix_flops=state.matrix_flops,
        total_training_time_seconds=state.train_seconds,
        tokens_per_second=state.tokens / state.train_seconds if state.train_seconds else None,
        last_train_mfu=mfu, final_checkpoint_path=run.final, **extra))


def validate(run, model, state):
    loss, bpb = evaluate(model, run.val, run.plan.passes_final, run.micro_batches[-1], run.token_bytes, run.rank,
                         run.world, run.device)
    state.evals.append(dict(step=state.step, epoch=state.step // run.loader.steps_per_epoch + 1, val_loss=loss,
                            val_bpb=bpb))
    if run.master:
        print(f"step {state.step}/{run.plan.steps} | val loss {loss:.4f}" + (f" | val bpb {bpb:.4f}" if bpb else ""))


def grow_if_due(run, model, optimizers, state):
    """At a crossover step, grow to the next stage (before that step's forward) and record the event."""
    if state.step in run.plan.crossover_steps:
        before, target = model.active_passes, stage_at(state.step, run.plan)
        overwritten = grow(model, optimizers, target)
        state.growth_events.append(dict(step=state.step, passes_from=before, passes_to=target,
                                        reset_parameters=len(overwritten)))


def train_step(run, model, step_model, optimizers, replicated, state):
    """One optimizer step at state.step: growth if due, passes, LR and momentum, the accumulated micro-batches,
    gradient reduction, update. -> (mean loss over ranks, passes, epoch, LR multiplier).

    Gradients travel from backward's hooks (Muon: reduce-scatter to each matrix's owner; `replicated`: all-reduce of
    the AdamW parameters'), on the last micro-batch only, or on every one with run.sync_every_micro_batch."""
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
    micro_batch = run.micro_batches[stage_index(step, plan)]  # the memory plan's, changing at growth
    accumulation = len(windows) // micro_batch
    batch_loss = torch.zeros((), device=run.device)
    micros = windows.split(micro_batch)
    for k, micro in enumerate(micros):
        replicated.sync_grads = run.sync_every_micro_batch or k == len(micros) - 1
        for opt in optimizers:
            if isinstance(opt, muon.Muon):
                opt.sync_grads = replicated.sync_grads
        micro = micro.to(run.device, non_blocking=True)
        with autocast(run.device):
            loss = step_model(micro[:, :-1], targets=micro[:, 1:])
        (loss / accumulation).backward()
        batch_loss += loss.detach() / accumulation
    replicated.wait()
    for opt in optimizers:  # a matrix without a gradient (a dormant core) gets Muon's zero-gradient step
        opt.step()
    step_model.zero_grad(set_to_none=True)
    if run.world > 1:
        dist.all_reduce(batch_loss)
        batch_loss /= run.world
    return batch_loss.item(), passes, epoch, lrm


def count_step(run, state, passes, seconds):
    """Advance the counters by one finished step -> its model FLOPs utilization (None off CUDA)."""
    cfg, tokens = run.plan.model_config, run.plan.tokens_per_step
    flops_per_token = model_lib.flops_per_token(cfg, passes)
    state.step += 1
    state.flops += flops_per_token * tokens
    state.matrix_flops += model_lib.matrix_flops_per_token(cfg, passes) * tokens
    state.tokens += tokens
    state.train_seconds += seconds
    return flops_per_token * (tokens / seconds) / run.peak_flops if run.peak_flops else None


def log_step(run, trajectory, state, loss, lrm, passes, epoch, seconds, mfu, log_every, stop):
    if not run.master:
        return
    step, tok_s = state.step - 1, run.plan.tokens_per_step / seconds
    trajectory.write(json.dumps(dict(step=step + 1, loss=loss, lr_multiplier=lrm, passes=passes,
                                     tokens_per_second=tok_s, epoch=epoch)) + "\n")
    if step % log_every == 0 or step + 1 == stop:
        eta = (run.plan.steps - step - 1) * state.train_seconds / max(state.step, 1)
        print(f"step {step + 1}/{run.plan.steps} | loss {loss:.4f} | lrm {lrm:.3f} | passes {passes} | "
              f"{tok_s:,.0f} tok/s" + (f" | mfu {100 * mfu:.1f}%" if mfu else "") + f" | eta {eta:.0f}s")


def save(run, model, optimizers, state, trajectory, mfu):
    """Collective: checkpoints/latest (every rank writes its Muon shard), then result.json's progress. A save that
    cannot be written (disk full, a read-only or vanished folder) leaves the last good checkpoint as it was and stops
    the run with one line."""
    if run.master:
        trajectory.flush()
    try:
        save_checkpoint(run.latest, model, optimizers, state, run.plan, run.args)
    except (OSError, dcp.api.CheckpointException) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        if run.master:
            shutil.rmtree(run.latest + ".tmp", ignore_errors=True)
            with contextlib.suppress(OSError):
                write_result(run, state, "failed", mfu, error=f"checkpoint at step {state.step} not written: {reason}")
        kept = f"the last good checkpoint {run.latest} is kept" if os.path.isdir(run.latest) else "no checkpoint yet"
        raise UsageError(f"cannot write the checkpoint of step {state.step} into {run.ckpt_dir}: {reason}; {kept}. "
                         "Free space (or fix the folder) and continue with --resume") from None
    write_result(run, state, "running", mfu)  # progress so far, for whoever watches the run


def train(args):
    plan = make_plan(args)
    run = open_run(args, plan)
    if run is None:
        return 0
    if run.resume_from == run.final:  # trained to the end; only result.json was not written
        state = read_run_state(run.final)
        if run.master:
            write_result(run, state, "complete")
            print(f"{run.run_dir} had finished training; wrote its result.json from {run.final}")
        return 0
    torch.manual_seed(plan.seed)
    model = model_lib.GPT(plan.model_config).to_device(run.device)
    model.set_passes(plan.pass_stages[0])
    optimizers = build_optimizers(model, plan, args.polar_express_dtype)
    replicated = replicated_grads(optimizers)
    state = RunState()
    if run.resume_from:
        state = load_checkpoint(run.resume_from, plan, model, optimizers)
        if run.master:
            print(f"resuming {run.run_dir} from step {state.step}")
    trajectory = open_trajectory(run, state.step)
    step_model = compile_model(model, plan) if use_compile(args, run.device) else model
    write_result(run, state, "running")
    if state.step == 0 and not state.evals:
        validate(run, step_model, state)
    stop = min(plan.steps, args.stop_after) if args.stop_after else plan.steps
    save_every = args.save_every if args.save_every is not None else PRESETS[plan.preset].save_every
    log_every = args.log_every or PRESETS[plan.preset].log_every
    mfu = None
    while state.step < stop:
        t0 = time.perf_counter()
        loss, passes, epoch, lrm = train_step(run, model, step_model, optimizers, replicated, state)
        if run.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if not math.isfinite(loss):
            write_result(run, state, "failed", mfu, error=f"non-finite loss at step {state.step}")
            print(f"train.py: error: non-finite loss {loss} at step {state.step}; the last good checkpoint "
                  f"is {run.latest}", file=sys.stderr)
            return 3
        mfu = count_step(run, state, passes, seconds)
        log_step(run, trajectory, state, loss, lrm, passes, epoch, seconds, mfu, log_every, stop)
        # the one place where a step's eval, checkpoint and stop are decided
        done = state.step == plan.steps
        if done or state.step % run.loader.steps_per_epoch == 0:  # the end, and every epoch boundary
            validate(run, step_model, state)
        if done or state.step == stop or (save_every and state.step % save_every == 0):
            save(run, model, optimizers, state, trajectory, mfu)
    finish(run, state, trajectory, mfu)
    return 0


def finish(run, state, trajectory, mfu):
    if not run.master:
        return
    trajectory.close()
    if state.step == run.plan.steps:
        os.replace(run.latest, run.final)
        write_result(run, state, "complete", mfu)
        print(f"done: final val loss {state.evals[-1]['val_loss']:.4f} | "
              f"{state.flops:.3e} FLOPs | {state.train_seconds:.0f}s | {run.run_dir}")
    else:
        write_result(run, state, "stopped", mfu, stopped_early=True)
        print(f"stopped after step {state.step} (--stop-after); continue with --resume")


# ---------------------------------------------------------------------------------------------------------------
# Refusals before any long work: flag ranges, output folders, the pool's token ids, one writer per run

FLAG_MINIMUMS = dict(steps=1, stop_after=1, save_every=0, log_every=1, bench_steps=1, train_token_limit=1, epochs=1)
LOCK_FILE = "train.lock"             # in the run folder; holds "PID n on host" of the writer
FOREIGN_OK = (LOCK_FILE, "train.log")  # what may already be in a fresh run's folder (ladder.sh writes the log)


def check_flags(args):
    if args.bench and args.dry_run:
        raise UsageError("--bench and --dry-run are mutually exclusive; drop one")
    for name, low in FLAG_MINIMUMS.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    if args.peak_flops is not None and args.peak_flops <= 0:
        raise UsageError(f"--peak-flops must be > 0, got {args.peak_flops}")
    if args.random_passes and min(args.random_passes) < 1:
        raise UsageError(f"--random-passes must be >= 1, got {min(args.random_passes)}")
    if args.run_name is not None and (args.run_name in ("", ".", "..") or "/" in args.run_name):
        raise UsageError(f"--run-name {args.run_name!r} must be a plain folder name (no '/'); use --runs-dir for "
                         "the parent folder")


def run_dir_of(args):
    return os.path.join(args.runs_dir, args.run_name or f"{args.arch}_d{args.depth}")


def make_run_dir(run_dir):
    """The run folder exists and is writable after this, or a one-line error says why not."""
    for path, what in ((os.path.dirname(run_dir), "--runs-dir"), (run_dir, "the run folder")):
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"{what} {path} is a file, not a directory; pass another --runs-dir or --run-name")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the run folder {run_dir}: {e.strerror}; pass a writable --runs-dir") from None
    if not os.access(run_dir, os.W_OK):
        raise UsageError(f"the run folder {run_dir} is not writable (read-only filesystem or permissions); pass a "
                         "writable --runs-dir")


@contextlib.contextmanager
def run_lock(args):
    """One writer per run: rank 0 (the only rank that writes the run folder) holds an exclusive flock on
    <run dir>/train.lock for its whole life; the kernel drops it when the process dies, however it dies. A second
    train.py or ladder.sh on the same run stops here (exit 2) naming the holder, instead of interleaving checkpoints
    and trajectory lines. Taken before anything in the run folder is written. (flock is per host on most network
    filesystems: two nodes writing one run folder are not detected.)"""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    run_dir = run_dir_of(args)
    make_run_dir(run_dir)
    path = os.path.join(run_dir, LOCK_FILE)
    try:
        lock = open(path, "a+")
    except OSError as e:
        raise UsageError(f"cannot open the lock file {path}: {e.strerror}; pass a writable --runs-dir") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "a process that has not written its PID yet"
            raise UsageError(f"{run_dir} is being written by another train.py ({holder}); wait for it to finish or "
                             "stop that process first") from None
        lock.truncate(0)
        lock.write(f"PID {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        check_fresh_run_dir(run_dir, args.resume or args.resume_or_start)
        yield


def check_fresh_run_dir(run_dir, resume):
    """A new run (no --resume) goes only into an empty folder or one ladder.sh prepared: never over someone's files.
    (A folder with a result.json or a checkpoint is a started run, resume_point's case: continue it with --resume.)"""
    if resume or os.path.exists(os.path.join(run_dir, "result.json")) or \
            os.path.isdir(os.path.join(run_dir, "checkpoints", "latest")):
        return
    def ours_and_empty(name):  # what a run killed before its first result.json leaves behind
        path = os.path.join(run_dir, name)
        return name in ("checkpoints", "trajectory.jsonl") and (os.listdir(path) == [] if os.path.isdir(path)
                                                                 else os.path.getsize(path) == 0)
    foreign = sorted(name for name in os.listdir(run_dir) if name not in FOREIGN_OK and not ours_and_empty(name))
    if foreign:
        raise UsageError(f"{run_dir} is not empty ({foreign[0]}, ...) and holds no train.py run; choose another "
                         "--run-name or --runs-dir")


def check_pool_tokens(data_dir, train_pool, val_pool, plan):
    """Token ids of the pool prefix this run reads are < the model's vocab (a flipped byte is caught here)."""
    vocab = plan.model_config.vocab_size
    data.check_token_range(data_dir, train_pool, vocab, plan.train_token_limit)
    data.check_token_range(data_dir, val_pool, vocab, (plan.val_tokens // plan.seq_len) * (plan.seq_len + 1))


# ---------------------------------------------------------------------------------------------------------------
# Benchmark: training-step time per arm at one shape, achieved FLOP/s against a matmul roofline measured in the same
# run (ratios are the point; absolute numbers depend on the box).

BENCH_ARMS = ("vanilla", "operator_1", "loop_2", "untied_2")
BENCH_SHAPES = {  # --bench-shape: flags of a named shape on top of --preset
    "d6w384": dict(depth=6, width_per_depth=64, head_dim=64, seq_len=256, tokenizer="gpt2"),
}


def gpu_peak_flops(device, given=None):
    """--peak-flops, else the dense bf16 peak of the detected GPU (GPU_PEAK_FLOPS); None off CUDA or when unknown."""
    if device.type != "cuda" or given:
        return given if device.type == "cuda" else None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_roofline(device, size=1024, calls=8, tries=5):
    """FLOP/s of a plain size^3 matmul loop (fp32 on CPU, bf16 on CUDA), best of `tries`: what this box can do."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
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


def bench_arm(args, arch, device):
    """A randomly initialised arm at the bench shape with its optimizers and one fixed batch."""
    args.arch = arch
    plan = make_plan(args)
    cfg = plan.model_config
    torch.manual_seed(0)
    model = model_lib.GPT(cfg).to_device(device)
    for p in model.parameters():  # non-zero out-projections so every branch does real work
        torch.nn.init.normal_(p, std=0.02)
    optimizers = build_optimizers(model, plan)
    step_fn = torch.compile(model) if args.compile and device.type == "cuda" else model
    x = torch.randint(0, cfg.vocab_size, (args.bench_batch, plan.seq_len + 1), device=device)
    return dict(plan=plan, model=model, optimizers=optimizers, step_fn=step_fn, x=x)


def bench_steps(arm, device, steps):
    """Median seconds of `steps` full training steps (forward, backward, every optimizer step)."""
    elapsed = []
    for _ in range(steps):
        synchronize(device)
        t0 = time.perf_counter()
        with autocast(device):
            loss = arm["step_fn"](arm["x"][:, :-1], targets=arm["x"][:, 1:])
        loss.backward()
        for opt in arm["optimizers"]:
            opt.step()
        arm["model"].zero_grad(set_to_none=True)
        synchronize(device)
        elapsed.append(time.perf_counter() - t0)
    return sorted(elapsed)[len(elapsed) // 2]


def bench(args):
    """Four arms at one shape; `--bench-repeats` repetitions, arm order rotated each time, roofline re-measured
    each time; prints the medians. Achieved FLOP/s = model training FLOPs per token (model.flops_per_token: forward
    and backward, attention included; the optimizer steps' FLOPs NOT counted, their time is) x tokens / step time."""
    rank, world, device = model_lib.setup_distributed(args.device)
    args.depth = args.depth or PRESETS[args.preset].anchor_depth
    args.bench_batch = (args.device_batch_size or [8 if device.type == "cpu" else PRESETS[args.preset].device_batch_size])[0]
    arms_built = {arch: bench_arm(args, arch, device) for arch in BENCH_ARMS}
    for arm in arms_built.values():  # warm-up (first-call allocations, compilation) is not timed
        bench_steps(arm, device, 2)
    times, rooflines = {arch: [] for arch in BENCH_ARMS}, []
    for rep in range(args.bench_repeats):
        rooflines.append(matmul_roofline(device))
        for arch in BENCH_ARMS[rep % 4:] + BENCH_ARMS[:rep % 4]:
            times[arch].append(bench_steps(arms_built[arch], device, args.bench_steps))
    roofline = median(rooflines)
    cfg0 = arms_built["vanilla"]["plan"].model_config
    dtype = "bf16" if device.type == "cuda" else "fp32"
    print(f"bench: {args.preset} preset d{args.depth}, width {cfg0.width}, head_dim {cfg0.head_dim}, T {cfg0.seq_len}, "
          f"vocab {cfg0.vocab_size}, batch {args.bench_batch}, {torch.get_num_threads()} threads; medians of "
          f"{args.bench_repeats} interleaved repetitions x {args.bench_steps} steps")
    print(f"roofline: {roofline / 1e9:,.1f} GFLOP/s ({dtype} 1024^3 matmul loop, best of 5, median over repetitions)")
    peak = gpu_peak_flops(device, args.peak_flops)
    results = {}
    for arch, arm in arms_built.items():
        cfg, dt = arm["plan"].model_config, median(times[arch])
        tok_s = args.bench_batch * arm["plan"].seq_len / dt
        achieved = model_lib.flops_per_token(cfg, cfg.passes) * tok_s
        results[arch] = dict(seconds=dt, tokens_per_second=tok_s, flops_per_second=achieved,
                             roofline_fraction=achieved / roofline)
        print(f"{arch:11s} | {1000 * dt:8.1f} ms/step | {tok_s:10,.0f} tok/s | {achieved / 1e9:8.1f} GFLOP/s | "
              f"{100 * achieved / roofline:5.1f}% of roofline" + (f" | mfu {100 * achieved / peak:.1f}%" if peak else ""))
    print("(model training FLOPs only: the Muon/AdamW steps' FLOPs are not counted, their time is)")
    print(f"operator_1/vanilla = {results['operator_1']['seconds'] / results['vanilla']['seconds']:.3f} "
          "(target <= 1.02)")
    print(f"untied_2/loop_2    = {results['untied_2']['seconds'] / results['loop_2']['seconds']:.3f} "
          "(target 1.00 +- 0.02)")
    return results


# ---------------------------------------------------------------------------------------------------------------
# GPU acceptance check (--gpu-check): one command that measures what a first GPU session needs, on synthetic tokens
# (uniform random ids: no dataset, no network), each section recorded or its error recorded, then one JSON file.

GPU_CHECK = {  # per preset: the runs and their steps; "cpu" is the tiny mode the tests run
    "paper": dict(vanilla_depth=12, grow_depth=8, steps=30, crossover_step=10, ratio_depth=12, ratio_steps=5,
                  core_examples=40, budget_seconds=450),
    "cpu": dict(vanilla_depth=2, grow_depth=3, steps=3, crossover_step=1, ratio_depth=2, ratio_steps=2,
                core_examples=6, budget_seconds=600),
}  # budget_seconds: a section that would start later is skipped (recorded in "errors"), so the whole stays <= 8 min


class SyntheticLoader:
    """data.TrainLoader's batch() on uniform random token ids (seeded per step): the step's cost without a pool."""

    def __init__(self, vocab_size, seq_len, batch_seqs):
        self.vocab_size, self.seq_len, self.batch_seqs, self.steps_per_epoch = vocab_size, seq_len, batch_seqs, 10 ** 9

    def batch(self, step, rank, world):
        generator = torch.Generator().manual_seed(step)
        windows = torch.randint(0, self.vocab_size, (self.batch_seqs, self.seq_len + 1), generator=generator)
        per_rank = self.batch_seqs // world
        return 1, windows[rank * per_rank:(rank + 1) * per_rank]


def synthetic_run(args, plan, device, peak_flops=None):
    """A one-process Run over SyntheticLoader with the memory planner's micro-batches: what train_step needs,
    nothing written to disk."""
    seqs = plan.tokens_per_step // plan.seq_len
    mem = device_memory_plan(args, plan, 1, device)
    return Run(plan=plan, rank=0, world=1, device=device, run_dir="", data_dir="", data_manifest={},
               loader=SyntheticLoader(plan.model_config.vocab_size, plan.seq_len, seqs), val=None, token_bytes=None,
               micro_batches=tuple(s.micro_batch for s in mem.stages), sync_every_micro_batch=mem.zero2,
               memory=memory_report(mem, plan), environment={}, peak_flops=peak_flops)


def check_plan(args, arch, depth, steps, crossover_step=None, total_batch_tokens=None):
    """make_plan for one check run: the preset's recipe at this depth, `steps` steps, growth forced at crossover_step."""
    run_args = argparse.Namespace(**vars(args))
    run_args.arch, run_args.depth, run_args.steps = arch, depth, steps
    run_args.crossover_fractions = [crossover_step / steps] if crossover_step else None
    if total_batch_tokens:
        run_args.total_batch_tokens = total_batch_tokens
    return make_plan(run_args)


def timed_steps(run, model, step_model, optimizers, state):
    """train_step until the plan's end -> per-step seconds (CUDA events on GPU, perf_counter on CPU)."""
    seconds, replicated = [], replicated_grads(optimizers)
    while state.step < run.plan.steps:
        if run.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        loss, passes, _, _ = train_step(run, model, step_model, optimizers, replicated, state)
        if run.device.type == "cuda":
            end.record()
            torch.cuda.synchronize(run.device)
            seconds.append(start.elapsed_time(end) / 1000)
        else:
            seconds.append(time.perf_counter() - t0)
        if not math.isfinite(loss):
            raise RuntimeError(f"non-finite loss {loss} at step {state.step}")
        count_step(run, state, passes, seconds[-1])
    return seconds, loss


def check_training(args, device, peak, arch, depth, steps, crossover_step=None):
    """~steps compiled training steps of one arm on synthetic tokens: step time, tokens/s, MFU, memory vs model."""
    plan = check_plan(args, arch, depth, steps, crossover_step)
    run = synthetic_run(args, plan, device, peak)
    torch.manual_seed(plan.seed)
    model = model_lib.GPT(plan.model_config).to_device(device)
    model.set_passes(plan.pass_stages[0])
    optimizers = build_optimizers(model, plan)
    step_model = torch.compile(model) if device.type == "cuda" else model
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    state = RunState()
    t0 = time.perf_counter()
    seconds, loss = timed_steps(run, model, step_model, optimizers, state)
    warm = seconds[2:] if len(seconds) > 3 else seconds  # the first steps compile (and grow)
    if crossover_step and len(seconds) > crossover_step + 3:  # after growth: the grown model's steady state
        warm = seconds[crossover_step + 2:]
    step_seconds = median(warm)
    flops_per_token = model_lib.flops_per_token(plan.model_config, model.active_passes)
    predicted = max(model_lib.memory_per_rank(plan.model_config, k, micro, device=device.type)["peak"]
                    for k, micro in zip(plan.pass_stages, run.micro_batches))
    measured = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return dict(arch=arch, depth=depth, steps=steps, crossover_step=crossover_step, pass_stages=list(plan.pass_stages),
                growth_events=state.growth_events, micro_batches=list(run.micro_batches),
                tokens_per_step=plan.tokens_per_step, compiled=device.type == "cuda", final_loss=loss,
                wall_seconds=time.perf_counter() - t0, first_step_seconds=seconds[0], step_seconds=step_seconds,
                tokens_per_second=plan.tokens_per_step / step_seconds,
                mfu=flops_per_token * plan.tokens_per_step / step_seconds / peak if peak else None,
                max_memory_allocated_bytes=measured, predicted_peak_bytes=predicted,
                memory_measured_over_predicted=measured / predicted if measured else None)


def check_ratios(args, device, depth, steps):
    """Step-time ratios Operator-1/Vanilla and Untied-2/Loop-2 at one shape, one micro-batch per step (compiled on
    CUDA), arms interleaved after one warm-up each."""
    micro = device_memory_plan(args, check_plan(args, "vanilla", depth, 1), 1, device).stages[0].micro_batch
    one_micro_batch = argparse.Namespace(**dict(vars(args), device_batch_size=[micro]))
    seq_len = PRESETS[args.preset].seq_len if args.seq_len is None else args.seq_len
    times = {}
    for arch in BENCH_ARMS:
        plan = check_plan(args, arch, depth, steps + 1, total_batch_tokens=micro * seq_len)
        run = synthetic_run(one_micro_batch, plan, device)
        torch.manual_seed(0)
        model = model_lib.GPT(plan.model_config).to_device(device)
        for p in model.parameters():  # non-zero out-projections so every branch does real work
            torch.nn.init.normal_(p, std=0.02)
        optimizers = build_optimizers(model, plan)
        step_model = torch.compile(model) if device.type == "cuda" else model
        seconds, _ = timed_steps(run, model, step_model, optimizers, RunState())
        times[arch] = median(seconds[1:])
        del model, optimizers, step_model
    return dict(depth=depth, micro_batch=micro, step_seconds=times,
                operator_1_over_vanilla=times["operator_1"] / times["vanilla"],
                untied_2_over_loop_2=times["untied_2"] / times["loop_2"])


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
    import core_eval
    plan = check_plan(args, "vanilla", GPU_CHECK[args.preset]["ratio_depth"], 1)
    torch.manual_seed(0)
    net = model_lib.GPT(plan.model_config).to_device(device).eval()
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
    """One line per section: the numbers the issue asks for."""
    if name in ("vanilla", "untied_grow"):
        memory = result["max_memory_allocated_bytes"]
        return (f"{result['arch']} d{result['depth']}: {1000 * result['step_seconds']:.0f} ms/step, "
                f"{result['tokens_per_second']:,.0f} tok/s" + (f", MFU {100 * result['mfu']:.1f}%" if result["mfu"]
                                                                 else "")
                + (f", peak memory {memory / model_lib.GIB:.1f} GiB" if memory else "")
                + f" (model predicts {result['predicted_peak_bytes'] / model_lib.GIB:.1f} GiB)"
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
    rank, world, device = model_lib.setup_distributed(args.device)
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
        roofline=lambda: dict(flops_per_second=matmul_roofline(device, size=4096 if device.type == "cuda" else 512)),
        vanilla=lambda: check_training(args, device, peak, "vanilla", recipe["vanilla_depth"], recipe["steps"]),
        untied_grow=lambda: check_training(args, device, peak, "untied_grow", recipe["grow_depth"], recipe["steps"],
                                           recipe["crossover_step"]),
        ratios=lambda: check_ratios(args, device, recipe["ratio_depth"], recipe["ratio_steps"]),
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


# ---------------------------------------------------------------------------------------------------------------
# Command line

def build_parser():
    p = Parser(prog="train.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", choices=list(ARMS), default=None)
    p.add_argument("--depth", type=int, nargs="+", default=None, help="several depths only with --dry-run")
    p.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="paper (default) or cpu (default for --bench without CUDA)")
    p.add_argument("--dry-run", action="store_true", help="print the plan as one JSON object and exit")
    p.add_argument("--bench", action="store_true", help="time training steps of four arms and print ratios")
    p.add_argument("--bench-steps", type=int, default=10)
    perf = p.add_argument_group("benchmark and GPU acceptance check")
    perf.add_argument("--bench-repeats", type=int, default=3, help="interleaved repetitions (medians are printed)")
    perf.add_argument("--bench-shape", choices=list(BENCH_SHAPES), default=None,
                      help="d6w384: depth 6, width 384, head_dim 64, T 256, GPT-2 vocab (with --preset cpu)")
    perf.add_argument("--gpu-check", action="store_true",
                      help="compiled vanilla d12 and untied_grow d8 (growth at step 10) on synthetic tokens: MFU, "
                           "tok/s, memory vs model, arm ratios, CORE scoring agreement (--preset cpu: tiny)")
    perf.add_argument("--gpu-check-out", default="gpu_check.json", help="the JSON --gpu-check writes")
    perf.add_argument("--bundle-dir", default=None, help="CORE bundle for --gpu-check (default: synthetic tasks)")
    run = p.add_argument_group("run control")
    run.add_argument("--run-name", default=None, help="default ARCH_dDEPTH")
    run.add_argument("--runs-dir", default=os.environ.get("RUNS_DIR", "runs"))
    run.add_argument("--data-dir", default=None, help="token pool from data.py (env DATA_DIR; preset default)")
    run.add_argument("--tokenizer", choices=["gpt2", "bytes"], default=None)
    run.add_argument("--steps", type=int, default=None, help="override the derived step count")
    run.add_argument("--stop-after", type=int, default=None, help="stop after N steps without changing the plan")
    run.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (0: only at the end)")
    run.add_argument("--resume", action="store_true", help="continue from checkpoints/latest (an error without one)")
    run.add_argument("--resume-or-start", action="store_true",
                     help="--resume, or step 0 when the run has no checkpoint yet (ladder.sh)")
    run.add_argument("--polar-express-dtype", choices=["auto", "bf16", "fp32"], default="auto",
                     help="Muon's Polar-Express precision (auto: bf16 where the device multiplies bf16 natively)")
    run.add_argument("--seed", type=int, default=42)
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    run.add_argument("--train-token-limit", type=int, default=None)
    run.add_argument("--epochs", type=int, default=None, help="epochs over the token limit (--data-constrained)")
    run.add_argument("--log-every", type=int, default=None)
    run.add_argument("--peak-flops", type=finite_float, default=None,
                     help="per-GPU peak for MFU (default: the detected GPU's dense bf16 peak, GPU_PEAK_FLOPS)")
    rec = p.add_argument_group("recipe overrides (LRs are anchor-depth values, scaled to --depth)")
    rec.add_argument("--optimizer", choices=["muon", "adamw"], default="muon")
    rec.add_argument("--recipe", choices=list(ARMS), default=None, help="train with another arm's recipe")
    rec.add_argument("--data-constrained", choices=list(DATA_CONSTRAINED), default=None)
    arms.add_knob_flags(rec, arms.Arm, "train")
    arms.add_knob_flags(rec, arms.Preset, "train")
    rec.add_argument("--crossover-fractions", type=finite_float, nargs="+", default=None,
                     help="fraction of steps before each growth (rho = 1 - f)")
    rec.add_argument("--random-passes", type=int, nargs="+", default=None,
                     help="after growth, sample passes uniformly from this set each step (paper App. B.4)")
    mem = p.add_argument_group("memory and compilation (README \"Memory per GPU\")")
    mem.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                     help="GiB per GPU the micro-batch planner fits (default: the device's total on CUDA; "
                          f"{H100_80GB_GIB:.2f}, an H100 80GB as torch reports it, for --dry-run)")
    mem.add_argument("--world-size", type=int, default=None,
                     help="GPUs a --dry-run plans for (default NPROC_PER_NODE x NNODES from the environment, 8 x 1)")
    mem.add_argument("--device-batch-size", type=int, nargs="+", default=None,
                     help="sequences per micro-batch, one value or one per pass stage (default: the planner's)")
    mem.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                     help="torch.compile the model (default: on CUDA; CPU stays eager)")
    arms.add_model_flags(p)
    return p


def parse_args(argv):
    p = build_parser()
    args = p.parse_args(argv)
    if not (args.bench or args.gpu_check) and (args.arch is None or args.depth is None):
        p.error("--arch and --depth are required")
    check_flags(args)
    args.preset = args.preset or ("cpu" if args.bench and not torch.cuda.is_available() else "paper")
    if args.bench_steps < 1 or args.bench_repeats < 1:
        p.error("--bench-steps and --bench-repeats must be at least 1")
    for name, value in BENCH_SHAPES.get(args.bench_shape, {}).items():  # explicit flags win over the shape's
        if getattr(args, name) is None:
            setattr(args, name, [value] if name == "depth" else value)
    args.depths = args.depth or [None]
    if len(args.depths) > 1 and not args.dry_run:
        p.error("several --depth values need --dry-run; train one depth per run")
    args.depth = args.depths[0]
    if args.world_size is not None and (args.world_size < 1 or not args.dry_run):
        p.error("--world-size is a positive number of GPUs for --dry-run (torchrun sets it for training)")
    if args.gpu_memory is not None and args.gpu_memory <= 0:
        p.error("--gpu-memory must be a positive number of GiB, e.g. --gpu-memory 80")
    if args.device_batch_size and min(args.device_batch_size) < 1:
        p.error("--device-batch-size must be positive, e.g. --device-batch-size 16")
    return args


def run_command(argv):
    args = parse_args(argv)
    if args.gpu_check:
        return gpu_check(args)
    if args.bench:
        bench(args)
        return 0
    if args.dry_run:
        return dry_run(args)
    make_plan(args)  # bad flags are reported before the run folder is created
    with run_lock(args):
        return train(args)


def main(argv=None):
    return model_lib.cli_main_distributed(run_command, "train.py", argv)


if __name__ == "__main__":
    exit_process(main())
