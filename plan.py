"""Everything one run needs decided before it touches data: the plan of `--arch A --depth d` (plus flags) as a frozen
Plan, the schedules that read it (paper App. A.3-A.4; docs/recipe.md), and the memory it needs per rank with the
largest micro-batch per pass stage that fits a GPU. Pure arithmetic on the table in arms.py and the accounting in
model.py; train.py trains a Plan, and `--dry-run` prints it with its "memory".

Memory: bytes per rank as pure functions of a ModelConfig. Activations are what eager autograd saves in this model's
forward (tests/test_plan.py measures it on CPU with saved_tensors_hooks); torch.compile saves less (it recomputes
pointwise ops), so the eager numbers are an upper bound for the compiled model. The model assumes train.py's regional
compilation (COMPILE_MODE): each block's backward hands its gradients to the transport as eager's does, so gradient
buckets are sent and freed while backward proceeds. Every formula names the tensors it counts; docs/memory_table.py
prints the tables of every paper run.

    python train.py --arch untied_grow --depth 8 --dry-run      # Plan.as_dict() plus its "memory"
    python -m pytest -q tests/test_plan.py
"""
import math
import os
import random
from dataclasses import asdict, dataclass, fields, replace

import torch

import arms
import data
import model as model_lib
import muon
from arms import ADAMW_MATRIX_LR, ARMS, DATA_CONSTRAINED, PRESETS
from common import UsageError, ranks_per_node
from model import (LOSS_CHUNK_ROWS, ROPE_TABLE_FACTOR, ModelConfig, embedding_dtype, executed_blocks, gates_stored,
                   params_per_block, params_stored, stored_blocks)


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
    scalar_lr: float = None      # the scalar parameters' LR (None: the embedding LR; added later, so a default)
    total_flops: int = 0

    @property
    def passes_final(self):
        return self.model_config.passes

    def group_lr(self, group):
        """The LR of a model.param_groups() group at this depth (its Plan field in arms.PARAM_GROUPS)."""
        lr = getattr(self, arms.PARAM_GROUPS[group][1])
        return self.embedding_lr if lr is None else lr

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
    stages = pass_stages(args, cfg)
    growth = len(stages) > 1
    check_train_knobs(args, cfg, growth, regime)
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
    if not 1 <= steps <= arms.MAX_STEPS:
        raise UsageError(f"the plan has {steps:,} steps, outside [1, {arms.MAX_STEPS:,}]; change --depth or --tpp, "
                         "or pass --steps")
    if not regime:
        token_limit = args.train_token_limit or steps * batch_tokens * 101 // 100
    crossovers = [math.floor(f * steps) for f in fractions]
    if any(not 1 <= c < steps for c in crossovers):
        raise UsageError(f"crossover steps {crossovers} must lie in [1, {steps}); use more --steps")

    # 5. LRs: the anchor depth's, scaled by (N(anchor) / N(d)) ** lr_exponent (App. A.4.4) and the preset's multiplier.
    anchor_cfg = model_lib.config_from_args(args, preset, preset.anchor_depth, vocab_size)
    lr_scale = preset.lr_multiplier * (model_lib.params_tpp(anchor_cfg) / n_tpp) ** recipe.lr_exponent
    adamw_default = args.optimizer == "adamw" and args.matrix_lr is None  # a given --matrix-lr is the AdamW one too
    matrix_lr = ADAMW_MATRIX_LR if adamw_default else recipe.matrix_lr

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
                data_constrained=args.data_constrained, seed=args.seed, model_config=cfg,
                scalar_lr=None if recipe.scalar_lr is None else recipe.scalar_lr * lr_scale)
    # 6. Compute: F(passes at the step) * tokens per step, summed over the steps.
    return replace(plan, total_flops=total_flops(plan))


def check_train_knobs(args, cfg, growth, regime):
    """Refuse a training flag the run would not use (recorded in the command line, yet not trained): growth's flags
    without growth, random passes a plain stack cannot run or beyond an untied model's cores, --tpp where the step
    count comes from the data-constrained grid's token budget."""
    given = [flag for flag, value in (("--crossover-fractions", args.crossover_fractions),
                                      ("--rewarm-steps", args.rewarm_steps)) if value is not None]
    if given and not growth:
        raise UsageError(f"{given[0]} does not apply to {args.arch}: this run does not grow (growth is "
                         "--passes-initial < --passes, or --pass-stages); drop the flag")
    if args.random_passes and cfg.mode == "plain":
        raise UsageError(f"--random-passes does not apply to {args.arch}: a plain stack runs exactly one pass")
    if args.random_passes and cfg.mode == "untied" and max(args.random_passes) > cfg.passes:
        raise UsageError(f"--random-passes {max(args.random_passes)} exceeds the {cfg.passes} cores {args.arch} "
                         "allocates (untied: one core per pass); pass at most --passes values")
    if args.tpp is not None and regime:
        raise UsageError("--tpp does not apply with --data-constrained: its steps come from the token budget "
                         "(--train-token-limit, --epochs); drop --tpp")


def pass_stages(args, cfg):
    """The passes of each stage: --pass-stages, else the arm's stages (a staged growth's row), else its initial and
    final passes."""
    staged = ARMS[args.arch].stages
    if staged and not args.pass_stages and (cfg.passes_initial, cfg.passes) != (staged[0], staged[-1]):
        raise UsageError(f"{args.arch} grows through the stages {'->'.join(map(str, staged))}: change them with "
                         "--pass-stages, not --passes or --passes-initial")
    return args.pass_stages or list(staged or sorted({cfg.passes_initial, cfg.passes}))


def growth_fractions(flag, recipe, depth, stages):
    """--crossover-fractions, else the recipe's fraction at this depth; one increasing fraction in (0, 1) per growth."""
    fractions = flag
    if fractions is None and recipe.default_crossover is not None:
        default = recipe.crossover.get(depth, recipe.default_crossover)
        fractions = list(default) if isinstance(default, tuple) else [default]
    growths = len(stages) - 1
    if fractions is None or len(fractions) != growths or any(not 0 < f < 1 for f in fractions) \
            or sorted(fractions) != list(fractions):
        example = " ".join(f"{(i + 1) / (growths + 1):.2f}" for i in range(growths))
        raise UsageError(f"growth {'->'.join(map(str, stages))} needs {growths} increasing --crossover-fractions in "
                         f"(0, 1), e.g. --crossover-fractions {example}")
    return fractions


def total_flops(plan):
    """Sum over optimizer steps of F(L_step) * tokens per step (result.json's estimated_training_flops)."""
    cfg = plan.model_config
    if plan.random_passes:
        per_token = sum(model_lib.flops_per_token(cfg, passes_at(s, plan)) for s in range(plan.steps))
    else:
        bounds = [0, *plan.crossover_steps, plan.steps]
        per_token = sum(model_lib.flops_per_token(cfg, k) * (b - a)
                        for k, a, b in zip(plan.pass_stages, bounds, bounds[1:]))
    return per_token * plan.tokens_per_step


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


def schedule_notes(plan):
    """What the LR schedule cannot do in this run's steps: a warmup at least as long as the run (the LR never
    reaches its peak, and the decay to 0 never starts), a growth before the warmup ends, a re-warm that outlasts
    the run. The recipes' fixed 40 steps meet them only in tiny runs (the cpu preset's d1, and Loop-Grow's d2);
    they are reported, not changed, so a run is the recipe it names."""
    notes = []
    if plan.warmup_steps >= plan.steps:
        notes.append(f"warmup_steps {plan.warmup_steps} >= steps {plan.steps}: the LR peaks at "
                     f"{lr_multiplier(plan.steps - 1, plan):.3g} of its value and never decays")
    for crossover in plan.crossover_steps:
        if crossover < plan.warmup_steps:
            notes.append(f"growth at step {crossover} falls inside the {plan.warmup_steps}-step warmup")
        if plan.rewarm_steps and crossover + plan.rewarm_steps >= plan.steps:
            notes.append(f"the {plan.rewarm_steps}-step re-warm after growth at step {crossover} outlasts the "
                         f"{plan.steps}-step run")
    return notes


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


# ----------------------------------------------------------------------------------------------------------------------
# Memory per rank

GIB = 2 ** 30
# Outside the caching allocator (torch.cuda.mem_get_info sees them, max_memory_allocated does not), per rank. They are
# allowances the GPU smoke measures (bench.py --gpu-smoke: outside_allocator_over_predicted), not measurements.
CUDA_CONTEXT_BYTES = 3 * GIB // 4      # the CUDA context and its loaded kernel modules (0.5-0.7 GiB on an H100)
NCCL_BUFFER_BYTES = GIB // 2           # NCCL's channel and peer buffers, with several ranks and NVLS off
NCCL_NVLS_BYTES = GIB                  # NVLink SHARP's buffers on NVSwitch nodes, when NCCL_NVLS_ENABLE is not 0
# Inside the allocator but not in the memory model: what is left of the margin
WORKSPACE_BYTES = 7 * GIB // 4         # cuBLAS workspaces, compile autotuning
MEMORY_MARGIN_FRACTION = 0.10          # caching-allocator fragmentation, on top of the tracked peak


def nvls_enabled():
    """Whether NCCL may use NVLS: common.setup_distributed sets NCCL_NVLS_ENABLE=0 unless the environment sets it (the
    ~1 GiB per rank it binds is what d26 on 80 GB does not have); the planner reads the same variable."""
    return os.environ.get("NCCL_NVLS_ENABLE", "0") != "0"


def outside_allocator_bytes(world_size, nvls=False):
    """{cuda_context, nccl_buffers}: the bytes a rank holds outside the caching allocator."""
    nccl = NCCL_BUFFER_BYTES + (NCCL_NVLS_BYTES if nvls else 0) if world_size > 1 else 0
    return dict(cuda_context=CUDA_CONTEXT_BYTES, nccl_buffers=nccl)


def block_matrix_shapes(cfg):
    """(rows, cols) of every stored block matrix in parameter order (the order Muon sees them)."""
    C, H = cfg.width, cfg.mlp_hidden
    return [(C, C), (C, C), (C, C), (C, C), (H, C), (H, C), (C, H)] * stored_blocks(cfg)


def backward_block_order(cfg, passes):
    """Stored block indices in the order one backward at `passes` runs them: the forward's prelude, the core of every
    pass and the coda, reversed (a tied core once per pass, dormant untied cores never; model.GPT's layout)."""
    p, c, q, stored = cfg.n_prelude, cfg.n_core, cfg.n_coda, stored_blocks(cfg)
    cores = [p + (r * c if cfg.mode == "untied" else 0) + j for r in range(passes) for j in range(c)]
    return [*range(p), *cores, *range(stored - q, stored)][::-1]


def executed_matrices(cfg, passes):
    """Indices, in Muon's parameter order, of the block matrices a forward at `passes` uses."""
    per_block = len(block_matrix_shapes(cfg)) // stored_blocks(cfg)
    return sorted({per_block * b + j for b in backward_block_order(cfg, passes) for j in range(per_block)})


def shard_numel(shape, shards):
    """Elements of the largest FSDP2 shard of a parameter: dim 0 split in torch.chunk's chunks of ceil(rows/S) rows
    (rank 0 always holds a full chunk)."""
    return -(-shape[0] // shards) * math.prod(shape[1:])


def block_shard_numel(cfg, shards):
    """Elements of one block's shard on the busiest rank (shards = the mesh's shard dimension; 1: the whole block)."""
    per_block = block_matrix_shapes(cfg)[:len(block_matrix_shapes(cfg)) // stored_blocks(cfg)]
    return sum(shard_numel(shape, shards) for shape in per_block)


def muon_state_numel(shape):
    """Momentum (rows x cols) plus the NorMuon second moment (one value per row if rows >= cols, else per column)."""
    rows, cols = shape
    return rows * cols + (rows if rows >= cols else cols)


def block_activation_bytes_per_token(cfg, autocast=True):
    """Bytes autograd saves per token in one executed Block (eager), e = bytes of the matmul dtype (bf16 under
    autocast). Per token, C = width, H = mlp_hidden, h = heads:
      2 residual RMSNorms (attention, MLP input): fp32 input 4C + rstd 4, each
      linear inputs: under autocast c_q, c_k, c_v, c_gate, c_fc each save their own bf16 cast of the normed input
        (5 * 2C); in fp32 the two normed inputs are shared (2 * 4C)
      QK-norm on q and k: an fp32 copy 4C + rstd 4h, each (CPU's composite rms_norm upcasts; CUDA's fused kernel may
        keep the bf16 input, 2C: the fp32 count is the bound)
      SDPA (flash on CUDA and on CPU): q, k, v, out in e bytes (4eC) + fp32 logsumexp 4h; c_proj's input is a view
      MLP: gate output, SiLU output, up output, their product: 4eH
    """
    C, H, h = cfg.width, cfg.mlp_hidden, cfg.n_head
    e = 2 if autocast else 4
    linear_inputs = 5 * 2 * C if autocast else 2 * 4 * C
    return 2 * (4 * C + 4) + linear_inputs + 2 * (4 * C + 4 * h) + (4 * e * C + 4 * h) + 4 * e * H


def activation_bytes(cfg, passes, micro_batch, autocast=True):
    """Bytes autograd saves for one micro-batch from the embedding to the last block (the loss path excluded):
    embedding (int64 ids 8 + its RMSNorm input 4C + rstd 4 per token), every executed block, the recurrence norm of
    each pass (its fp32 input 4C + rstd 4 per token; the injection saves nothing), and per executed block the bf16
    casts of the rotary tables for q and k under autocast (4 * T * head_dim bytes, independent of the batch)."""
    tokens = micro_batch * cfg.seq_len
    blocks = executed_blocks(cfg, passes)
    per_token = 8 + 4 * cfg.width + 4 + blocks * block_activation_bytes_per_token(cfg, autocast)
    if cfg.recurrence_norm:
        per_token += passes * (4 * cfg.width + 4)
    rotary = blocks * 4 * cfg.seq_len * cfg.head_dim if autocast else 0
    return tokens * per_token + rotary


def loss_path_bytes(cfg, micro_batch, autocast=True, chunked=True):
    """(saved, peak) bytes of the final norm, lm_head and cross-entropy for one micro-batch; peak adds the transient
    tensors of its forward and backward. V = vocab, Vp = padded vocab, R = LOSS_CHUNK_ROWS, e = matmul dtype bytes.
    chunked (GPT.loss, one chunk alive at a time): saved = final RMSNorm input 4C + rstd 4 and d(loss)/dx eC per
    token, d(loss)/d(lm_head) fp32 4*Vp*C; transient = the normed input 4C per token, the lm_head cast (2*Vp*C under
    autocast), and the larger of a chunk's two moments. At its logsumexp, per row: the fp32 logits (4V under autocast,
    whose e-byte product 2Vp + fp32 copy 4V came before; 4Vp in fp32: a view of the product) and logsumexp's own fp32
    temporary 4V, which no Python-level tracker sees (torch.profiler's allocator events do). At the probabilities'
    cast and its matmuls, per row: the logits the probabilities overwrite, their e-byte cast (2Vp under autocast:
    rows of the padded width) and the row's input cast and gradient (2eC), with the chunk's d(lm_head) product e*Vp*C
    (an upper bound of both moments: the fp32 logits are freed before the matmuls). Compiled chunks under autocast
    (GPT.compile_loss) fuse the elementwise work and hold less: the bf16 product and probabilities, 4Vp per row.
    unchunked (F.cross_entropy on decode()): saved = final norm 4C + 4, lm_head input eC (its cast, or in fp32 the
    normed output), fp32 log-softmax 4V and int64 targets 8 per token; backward holds two more fp32 (tokens, V)."""
    C, V, Vp = cfg.width, cfg.vocab_size, cfg.padded_vocab
    tokens = micro_batch * cfg.seq_len
    e = 2 if autocast else 4
    if chunked:
        saved = tokens * (4 * C + 4 + e * C) + 4 * Vp * C
        rows = min(LOSS_CHUNK_ROWS, tokens)
        logits_row = 4 * V if autocast else 4 * Vp
        at_logsumexp = rows * max(logits_row + 4 * V, 2 * Vp + 4 * V)
        at_matmuls = rows * (logits_row + (2 * Vp if autocast else 0) + 2 * e * C) + e * Vp * C
        transient = tokens * 4 * C + (2 * Vp * C if autocast else 0) + max(at_logsumexp, at_matmuls)
        return saved, saved + transient
    saved = tokens * (4 * C + 4 + e * C + 4 * V + 8)
    return saved, saved + 2 * tokens * 4 * V


def evaluation_bytes(cfg, passes, micro_batch, autocast=True):
    """Peak bytes one validation batch adds to the persistent bytes (train.evaluate: `micro_batch` windows at
    `passes`, no gradient, eager), e = matmul dtype bytes: the windows' int64 token ids, the weight copies autocast
    caches, and the larger of two moments. Inside a block, per token: the prelude output, the block's input, its
    stream after attention and its normed input (4C each), and the larger of the MLP's SiLU output, up-projection and
    product (3eH) and attention's q, k, v and a rotated copy (4eC) with the QK-norm's fp32 temporaries (8C). In the
    loss (model.token_losses), per token: the flat targets 8, the final stream and its normed copy (4C each) and the
    loss 4; and one chunk's fp32 logits and logsumexp's temporary ((4Vp + 4V) per row, which also covers the e-byte
    product and its fp32 copy) with the rows' input cast (eC under autocast), and the lm_head cast."""
    C, H, V, Vp = cfg.width, cfg.mlp_hidden, cfg.vocab_size, cfg.padded_vocab
    tokens = micro_batch * cfg.seq_len
    e = 2 if autocast else 4
    block = tokens * (16 * C + max(3 * e * H, 4 * e * C + 8 * C))
    rows = min(LOSS_CHUNK_ROWS, tokens)
    loss = tokens * (12 + 8 * C) + rows * (4 * Vp + 4 * V + (e * C if autocast else 0)) + \
        (2 * Vp * C if autocast else 0)
    token_ids = 8 * micro_batch * (cfg.seq_len + 1)
    return token_ids + weight_copy_bytes(cfg, passes, autocast) + max(block, loss)


def weight_copy_bytes(cfg, passes, autocast=True):
    """One process: the bf16 copies of the executed block matrices that autocast caches in the forward and the
    backward keeps (a tied core is cast once; dormant untied cores are not executed). The lm_head cast is the loss
    path's. Under FSDP2 the gathered parameters are already bf16 (gathered_bytes instead)."""
    return 2 * stored_blocks(cfg, passes) * params_per_block(cfg) if autocast else 0


def parameter_bytes(cfg, device="cuda", shards=1):
    """Bytes of the stored parameters on one rank (model.py's accounting: params_stored), the embedding in
    embedding_dtype(device), the rest fp32; shards > 1: FSDP2's shard of each (dim-0 padding), the boundary gates
    replicated. tests/test_plan.py checks it against the built module for every arm."""
    C, Vp = cfg.width, cfg.padded_vocab
    emb = embedding_dtype(device).itemsize
    table = shard_numel((Vp, C), shards)
    blocks = stored_blocks(cfg) * block_shard_numel(cfg, shards)
    assert shards > 1 or blocks + 2 * table + gates_stored(cfg) == params_stored(cfg)
    return 4 * (blocks + table + gates_stored(cfg)) + emb * table


def persistent_bytes(cfg, passes, world_size=1, per_node=None, device="cuda"):
    """What a rank keeps through the run at `passes`, in bytes. One process: the model's parameters; several: FSDP2's
    shards over the per_node ranks of a node (HSDP: replicated across nodes), dim-0 padded (parameter_bytes).
    Gradients: the shards of the trained parameters (a dormant untied core gets none), in the parameter dtype (FSDP2
    reduces in fp32 into them). Muon: momentum on every matrix's shard, the NorMuon second moment (one value per row or
    column) of the matrices this rank owns whole (muon.assign_owners in the shard group; the busiest rank). AdamW:
    exp_avg and exp_avg_sq of the embedding, lm_head and gates, sharded like them. Rotary tables fp32, replicated."""
    shards = per_node if world_size > 1 else 1
    C, Vp = cfg.width, cfg.padded_vocab
    emb = embedding_dtype(device).itemsize
    table = shard_numel((Vp, C), shards)
    block = block_shard_numel(cfg, shards)
    root = 4 * table + emb * table + 4 * gates_stored(cfg)
    shapes = block_matrix_shapes(cfg)
    owners = muon.assign_owners(shapes, shards)
    second = max(sum(muon_state_numel(shape) - math.prod(shape) for shape, r in zip(shapes, owners) if r == rank)
                 for rank in range(shards))
    return dict(parameters=parameter_bytes(cfg, device, shards),
                rotary=2 * ROPE_TABLE_FACTOR * cfg.seq_len * (cfg.head_dim // 2) * 4,
                gradients=4 * stored_blocks(cfg, passes) * block + root,
                muon_state=4 * (stored_blocks(cfg) * block + second),
                adamw_state=2 * root)


def compute_bytes(device):
    """Bytes per element of the compute dtype: bf16 on CUDA (autocast, FSDP2's MixedPrecisionPolicy, Polar-Express),
    fp32 on CPU."""
    return 2 if torch.device(device).type == "cuda" else 4


def gathered_bytes(cfg, world_size, device="cuda"):
    """FSDP2's unsharded parameters in a micro-batch (several processes), in the compute dtype (bf16 on CUDA,
    MixedPrecisionPolicy; fp32 on CPU): the root's embedding and lm_head from the forward's start to the backward's
    end, and two blocks at a time (the one running and the one prefetched, forward and backward; a block is
    resharded after its forward and re-gathered for its backward)."""
    if world_size == 1:
        return 0
    return compute_bytes(device) * (2 * cfg.padded_vocab * cfg.width + 2 * params_per_block(cfg))


def reduce_scatter_bytes(cfg, world_size, per_node, device="cuda"):
    """One block's gradient on its way to the shards (several processes): unsharded in the compute dtype, its fp32
    copy that the reduce-scatter sends (reduce_dtype; on CPU the gradient itself) and the 1/P it receives; and the
    root's unsharded gradients (embedding, lm_head), held until backward ends."""
    if world_size == 1:
        return 0
    e, n = compute_bytes(device), params_per_block(cfg)
    return e * n + (4 * n if e != 4 else 0) + 4 * (-(-n // per_node)) + e * 2 * cfg.padded_vocab * cfg.width


def muon_step_bytes(cfg, world_size, per_node, device="cuda"):
    """Muon.step's transients. One process: one shape group stacked (weights, gradients, momentum and about five
    fp32-sized temporaries). Sharded: one round of the largest shape (muon.rounds): the blended rows of the round's
    matrices (4 rows x cols), and on the owner the whole matrix received (4), Polar-Express's iterate and its next
    one (2 x 2 in bf16 on CUDA, 2 x 4 on CPU), NorMuon's fp32 copies (8), the bf16 update (2), its padded fp32 copy
    sent back (4) and this rank's rows returned."""
    shapes = block_matrix_shapes(cfg)
    if world_size == 1:
        groups = {}
        for shape in shapes:
            groups[shape] = groups.get(shape, 0) + math.prod(shape)
        return 8 * 4 * max(groups.values())
    pe = compute_bytes(device)
    largest = max(math.prod(shape) for shape in shapes)
    return (4 + 4 + 2 * pe + 8 + 2 + 4) * largest + 4 * largest // per_node


def memory_per_rank(cfg, passes, micro_batch, world_size=1, per_node=None, device="cuda", nvls=False):
    """Predicted bytes per rank of one training step at `passes` with micro-batches of `micro_batch` sequences (bf16
    autocast on CUDA, fp32 elsewhere, as train.py runs; FSDP2 on several processes: train.shard_model). 'peak' is what
    torch.cuda.max_memory_allocated should report; 'required' adds what the rank holds outside the allocator
    (cuda_context, nccl_buffers: nvls is NCCL's NVLS, nvls_enabled) and the margin (workspaces and fragmentation:
    WORKSPACE_BYTES and MEMORY_MARGIN_FRACTION of the peak). The step's peak is the largest of three moments: the end
    of the forward / start of the backward (the gathered parameters or, in one process, autocast's weight copies; all
    activations, the loss path, and the larger of the loss transient and a backward working set of one block's
    activations, two fp32 residual-stream gradients and the reduce-scatter in flight), the Muon step
    (muon_step_bytes), and a validation batch at this micro-batch and these passes (evaluation_bytes)."""
    per_node = per_node or world_size
    autocast = torch.device(device).type == "cuda"
    parts = persistent_bytes(cfg, passes, world_size, per_node, device)
    static = sum(parts.values())
    loss_saved, loss_peak = loss_path_bytes(cfg, micro_batch, autocast)
    tokens = micro_batch * cfg.seq_len
    block_saved = tokens * block_activation_bytes_per_token(cfg, autocast)
    reduce_scatter = reduce_scatter_bytes(cfg, world_size, per_node, device)
    parts.update(weight_copies=gathered_bytes(cfg, world_size, device) if world_size > 1 else
                 weight_copy_bytes(cfg, passes, autocast),
                 activations=activation_bytes(cfg, passes, micro_batch, autocast), loss_path=loss_saved,
                 step_transient=max(loss_peak - loss_saved, block_saved + tokens * 2 * 4 * cfg.width + reduce_scatter),
                 optimizer_step=muon_step_bytes(cfg, world_size, per_node, device), reduce_scatter=reduce_scatter,
                 evaluation=evaluation_bytes(cfg, passes, micro_batch, autocast and world_size == 1)
                 + gathered_bytes(cfg, world_size, device))
    training = parts["weight_copies"] + parts["activations"] + loss_saved + parts["step_transient"]
    peak = static + max(training, parts["optimizer_step"], parts["evaluation"])
    outside = outside_allocator_bytes(world_size, nvls)
    margin = WORKSPACE_BYTES + round(MEMORY_MARGIN_FRACTION * peak)
    return dict(parts, peak=peak, **outside, margin=margin, required=peak + sum(outside.values()) + margin)


@dataclass
class StageMemory:
    passes: int
    executed_blocks: int
    micro_batch: int
    bytes: dict          # memory_per_rank at this micro-batch: the components, peak, margin, required
    headroom: int = None  # the GPU's memory less the required bytes (None: an unbounded CPU run)


@dataclass
class MemoryPlan:
    gpu_memory_gib: float
    world_size: int
    per_node: int        # ranks per node: FSDP2's shard dimension (HSDP replicates across world_size / per_node nodes)
    stages: list         # one StageMemory per pass stage, in training order


def plan_memory(cfg, pass_stages, rank_sequences, gpu_memory_gib, world_size=1, per_node=None, micro_batches=None,
                device="cuda", nvls=False):
    """Micro-batch per pass stage: the largest divisor of rank_sequences (sequences per rank per optimizer step)
    whose required bytes fit in gpu_memory_gib, so it may drop at growth. Data-constrained runs pass their K: the
    executed depth p + K*c + q is what costs memory. micro_batches (one per stage, each a divisor of rank_sequences:
    requested_micro_batches) are checked instead of chosen: one that does not fit raises ValueError naming the
    largest that fits. nvls: NCCL's NVLS buffers (nvls_enabled)."""
    per_node = per_node or world_size
    capacity = gpu_memory_gib * GIB
    divisors = [b for b in range(rank_sequences, 0, -1) if rank_sequences % b == 0]
    stages = []
    for i, passes in enumerate(pass_stages):
        def need(b):
            return memory_per_rank(cfg, passes, b, world_size, per_node, device, nvls)
        fitting = next((b for b in divisors if need(b)["required"] <= capacity), None)
        where = f"{cfg.arch} d{cfg.depth} at K={passes} ({executed_blocks(cfg, passes)} executed blocks)"
        if micro_batches is None and fitting is None:
            raise ValueError(f"{where} does not fit {gpu_memory_gib:g} GiB per GPU even at micro-batch 1 (needs "
                             f"{need(1)['required'] / GIB:.1f} GiB); use more GPUs per node")
        choice = fitting if micro_batches is None else micro_batches[i]
        if need(choice)["required"] > capacity:
            largest = f"the largest that fits is {fitting}" if fitting else "none fits, not even 1"
            raise ValueError(f"micro-batch {choice} needs {need(choice)['required'] / GIB:.1f} GiB per GPU for "
                             f"{where}, more than {gpu_memory_gib:g} GiB; {largest}")
        headroom = None if math.isinf(capacity) else capacity - need(choice)["required"]
        stages.append(StageMemory(passes, executed_blocks(cfg, passes), choice, need(choice), headroom))
    return MemoryPlan(gpu_memory_gib, world_size, per_node, stages)


# ----------------------------------------------------------------------------------------------------------------------
# The micro-batch planner: the micro-batch of each pass stage. It depends on the world size and the device, so it is
# kept out of the Plan (a run resumes on another world size): result.json and the dry run hold it under "memory".

COMPILE_MODE = ("regional: torch.compile per block (train.compile_model), gradients ready block by block as in eager; "
                "activations as eager saves them, an upper bound for the compiled blocks")


def memory_pass_stages(plan):
    """The passes each stage is planned for; random recurrence (App. B.4) plans for its largest draw."""
    stages = list(plan.pass_stages)
    if plan.random_passes:
        stages[-1] = max(stages[-1], *plan.random_passes)
    return stages


def sequences_per_rank(plan, world):
    batch_seqs = plan.tokens_per_step // plan.seq_len
    if batch_seqs % world:
        raise UsageError(f"{batch_seqs} sequences per step do not split over {world} ranks")
    return batch_seqs // world


def requested_micro_batches(args, plan, world, device="cuda"):
    """The micro-batches this invocation asks for, one per pass stage, or None (the planner chooses them):
    --device-batch-size (one value, or one per stage; capped at the sequences per rank, which each must divide), else
    on CPU without --gpu-memory the preset's micro-batch (a CPU run is not fitted to host memory)."""
    rank_seqs, stages = sequences_per_rank(plan, world), memory_pass_stages(plan)
    wanted = args.device_batch_size
    if not wanted and device == "cpu" and not args.gpu_memory:
        wanted = [min(PRESETS[plan.preset].device_batch_size, rank_seqs)]  # the preset's default may exceed a step
    if not wanted:
        return None
    if len(wanted) not in (1, len(stages)):
        raise UsageError(f"--device-batch-size takes one value or one per pass stage {stages}")
    micro_batches = list(wanted) * (len(stages) // len(wanted))
    bad = next((b for b in micro_batches if rank_seqs % b), None)
    if bad:
        raise UsageError(f"--device-batch-size: micro-batch {bad} does not divide the {rank_seqs} sequences per rank "
                         f"({world} GPUs)")
    return micro_batches


def plan_micro_batches(plan, world, gpu_memory_gib, micro_batches=None, device="cuda", what="--device-batch-size",
                       per_node=None):
    """Per pass stage, the largest micro-batch (a divisor of the sequences per rank) that fits gpu_memory_gib, or a
    check that the given micro_batches fit (one per stage: requested_micro_batches; `what` names them in errors).
    per_node: ranks per node, FSDP2's shard dimension (default: one node of `world`). -> MemoryPlan; UsageError when
    nothing fits."""
    per_node = per_node or world
    batch_seqs = sequences_per_rank(plan, world) * world
    try:
        return plan_memory(plan.model_config, memory_pass_stages(plan), batch_seqs // world, gpu_memory_gib, world,
                           per_node, micro_batches, device, nvls_enabled())
    except ValueError as e:
        if micro_batches is not None:
            raise UsageError(f"{what}: {e} ({world} GPUs)") from None
    raise UsageError(f"{plan.arch} d{plan.depth} does not fit {gpu_memory_gib:g} GiB per GPU on {world} GPUs "
                     f"({per_node} per node), not even at micro-batch 1; use more GPUs per node")


def memory_report(mem, plan):
    """The "memory" of a dry run and of result.json: the layout, and per pass stage the micro-batch, the gradient
    accumulation and the predicted GiB per rank (memory_per_rank: eager, an upper bound for a compiled run, with the
    headroom left), and in bytes the peak and the allowance outside the allocator that a run's measured memory is
    gated against."""
    rank_seqs = plan.tokens_per_step // plan.seq_len // mem.world_size
    layout = "one process: the plain model" if mem.world_size == 1 else \
        f"FSDP2 over {mem.per_node} ranks" if mem.per_node == mem.world_size else \
        f"HSDP: FSDP2 over the {mem.per_node} ranks of a node, replicated over {mem.world_size // mem.per_node} nodes"
    return dict(gpu_memory_gib=None if math.isinf(mem.gpu_memory_gib) else round(mem.gpu_memory_gib, 2),
                world_size=mem.world_size, ranks_per_node=mem.per_node, sequences_per_rank=rank_seqs, layout=layout,
                compile=COMPILE_MODE, nccl_nvls=nvls_enabled() if mem.world_size > 1 else None,
                stages=[dict(passes=s.passes, executed_blocks=s.executed_blocks, micro_batch=s.micro_batch,
                             accumulation=rank_seqs // s.micro_batch, peak_bytes=s.bytes["peak"],
                             outside_allocator_bytes=s.bytes["cuda_context"] + s.bytes["nccl_buffers"],
                             gib={k: None if v is None else round(v / GIB, 2)
                                  for k, v in dict(s.bytes, headroom=s.headroom).items()})
                        for s in mem.stages])


def memory_line(name, mem, host):
    """The ladder dry run's memory line of run `name`: micro-batches, peak and headroom per rank per stage, what lies
    outside the allocator, the gradient layout and host memory per node (host_memory)."""
    parts = mem.stages[0].bytes
    nccl = f" + {parts['nccl_buffers'] / GIB:g} NCCL (NVLS {'on' if nvls_enabled() else 'off'})" \
        if parts["nccl_buffers"] else ""
    layout = "" if mem.world_size == 1 else f" | FSDP2 over {mem.per_node} ranks" + (
        f" x {mem.world_size // mem.per_node} nodes (HSDP)" if mem.per_node < mem.world_size else "")
    if math.isinf(mem.gpu_memory_gib):  # a CPU run
        device = " (fp32 on the CPU: no device memory to fit)"
    else:
        device = (f" + {parts['cuda_context'] / GIB:g} CUDA context{nccl} GiB outside the allocator | headroom "
                  + " -> ".join(f"{s.headroom / GIB:.1f}" for s in mem.stages) + f" GiB of {mem.gpu_memory_gib:.1f}")
    return (f"memory {name}: micro-batch " + " -> ".join(str(s.micro_batch) for s in mem.stages) + " | peak "
            + " -> ".join(f"{s.bytes['peak'] / GIB:.1f}" for s in mem.stages) + f" GiB per rank{device}{layout}"
            + f" | host {host['per_node_gib']:.0f} GiB per node ({host['resume_per_node_gib']:.0f} on resume)")


# Host memory at start-up: what the dry run predicts per node (ranks per node x one rank's bytes)

HOST_RUNTIME_BYTES = 3 * GIB        # per process: Python, torch, the CUDA and NCCL libraries and context (an allowance)
ASSUMED_TOKENS_PER_DOCUMENT = 500   # sizes the loader's per-document arrays; the dry run does not read the pool


def host_memory(plan, ranks_per_node, device="cuda"):
    """Predicted host RAM of one node at start-up: ranks_per_node times what one rank holds. model_init: GPT draws one
    fp32 tensor at a time on the host (the largest), plus the bf16 cast of the embedding on its way to a CUDA device;
    loader: TrainLoader's int64 arrays over the documents of the token limit (lengths, shuffled order, stream offsets,
    and two transients of that length while an epoch's order is built) and the window order; validation: the int64
    validation windows. A resume reads each rank's checkpoint shards into its own tensors (DCP): no host copy of the
    model. The pool's tokens are memory-mapped: page cache (not counted)."""
    cfg = plan.model_config
    C, Vp = cfg.width, cfg.padded_vocab
    emb = Vp * C * embedding_dtype(device).itemsize
    largest = max(Vp * C, *(rows * cols for rows, cols in block_matrix_shapes(cfg)))
    documents = plan.train_token_limit // ASSUMED_TOKENS_PER_DOCUMENT
    per_rank = dict(runtime=HOST_RUNTIME_BYTES, model_init=4 * largest + (emb if emb < 4 * Vp * C else 0),
                    loader=8 * (5 * documents + plan.train_token_limit // (plan.seq_len + 1)),
                    validation=8 * (plan.val_tokens // plan.seq_len) * (plan.seq_len + 1))
    return dict(ranks_per_node=ranks_per_node, per_rank_gib={k: round(v / GIB, 2) for k, v in per_rank.items()},
                per_node_gib=round(ranks_per_node * sum(per_rank.values()) / GIB, 1),
                resume_per_node_gib=round(ranks_per_node * sum(per_rank.values()) / GIB, 1),
                assumes=f"{ASSUMED_TOKENS_PER_DOCUMENT} tokens per document; {HOST_RUNTIME_BYTES / GIB:g} GiB per "
                        "process for Python, torch and the CUDA runtime")


def device_memory_plan(args, plan, world, device):
    """This process's micro-batches: on CUDA fitted to --gpu-memory (default the device's total memory); on CPU
    (fp32, host memory) requested_micro_batches, fitted to --gpu-memory if given. Several processes: FSDP2 over the
    ranks of a node (common.ranks_per_node)."""
    micro_batches = requested_micro_batches(args, plan, world, device.type)
    if device.type == "cuda":
        gpu = args.gpu_memory or torch.cuda.get_device_properties(device).total_memory / GIB
    else:
        gpu = args.gpu_memory or math.inf
    return plan_micro_batches(plan, world, gpu, micro_batches, device.type,
                              per_node=ranks_per_node(world) if world > 1 else 1)
