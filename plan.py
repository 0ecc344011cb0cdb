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
from common import UsageError, ranks_per_node, torchrun_ranks
from model import (LOSS_CHUNK_ROWS, ROPE_TABLE_FACTOR, ModelConfig, embedding_dtype, executed_blocks, gates_stored,
                   params_per_block, stored_blocks)


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
BUCKET_BYTES = int(muon.BUCKET_MB * 2 ** 20)  # Muon's gradient bucket (train.py --bucket-mb)
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


def muon_owner_loads(shapes, world_size):
    """Per rank, the shapes it owns under muon.assign_owners (the rule the optimizer itself uses)."""
    owned = [[] for _ in range(world_size)]
    for shape, rank in zip(shapes, muon.assign_owners(shapes, world_size)):
        owned[rank].append(shape)
    return owned


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


def gradient_buckets(cfg, world_size, bucket_bytes, indices):
    """The buckets Muon moves the block matrices `indices` in (muon.plan_buckets under muon.assign_owners) ->
    [(bucket, bytes)]."""
    shapes = block_matrix_shapes(cfg)
    buckets = muon.plan_buckets(indices, shapes, muon.assign_owners(shapes, world_size), world_size, bucket_bytes)
    return [(b, sum(4 * shapes[i][0] * shapes[i][1] for i in b.members)) for b in buckets]


def largest_bucket_bytes(cfg, passes, world_size, bucket_bytes):
    """The largest bucket Muon moves at `passes`: of the executed matrices' plan (backward, the step before growth)
    or of all matrices' (the step once every core has state)."""
    every = range(len(block_matrix_shapes(cfg)))
    return max(n for indices in (executed_matrices(cfg, passes), every)
               for _, n in gradient_buckets(cfg, world_size, bucket_bytes, indices))


def sharded_backward_bytes(cfg, passes, world_size, bucket_bytes, block_saved, fixed_order=False, node_size=None):
    """Gradient bytes beyond the owners' accumulators (or partial sums) during one micro-batch's backward when every
    bucket is sent as soon as it is complete (zero2, and always in the fixed order), net of the activations backward
    has already freed: the maximum over the backward of local gradients waiting for their bucket + the bucket being
    copied, or the one in flight with what it receives (muon.Muon waits for a bucket before it copies the next) -
    block_saved per executed block done. A bucket holds one same-shape matrix per rank, so it waits for the last of
    them: up to world_size blocks apart. block_saved=0 gives the gross bytes. In flight, for a bucket of n bytes:
    reduce-scatter n + n/W (hierarchical, inside a node of node_size = P ranks: n + n/P), reduce n; fixed order
    (fixed_order_in_flight_bytes) more."""
    shapes, order = block_matrix_shapes(cfg), backward_block_order(cfg, passes)
    per_block = len(shapes) // stored_blocks(cfg)
    last_run = {b: k for k, b in enumerate(order)}  # a tied core's gradients are complete after its first pass
    buckets = gradient_buckets(cfg, world_size, bucket_bytes, executed_matrices(cfg, passes))
    ready, waiting, in_flight, launched, peak = set(), 0, 0, 0, 0
    for k, block in enumerate(order):
        if last_run[block] != k:
            continue
        freed = k * block_saved
        for i in range(per_block * block, per_block * (block + 1)):
            ready.add(i)
            waiting += 4 * shapes[i][0] * shapes[i][1]
        peak = max(peak, waiting + in_flight - freed)
        while launched < len(buckets) and ready.issuperset(buckets[launched][0].members):
            bucket, n = buckets[launched]
            peak = max(peak, waiting + n - freed)  # the copy, before its gradients are dropped
            waiting, launched = waiting - n, launched + 1
            in_flight = fixed_order_in_flight_bytes(bucket, n, world_size) if fixed_order else \
                n + (n // (node_size or world_size) if bucket.scatter else 0)
            peak = max(peak, waiting + in_flight - freed)
    return peak


def fixed_order_in_flight_bytes(bucket, n, world_size):
    """The fixed reduction order's bytes for one bucket of n bytes in flight, on the rank that receives most
    (muon.Muon._launch_reduce, _push_leaves): an owner-sharded bucket is all-to-all'ed (sent n, received n) and its
    received chunks summed as a tree (first level n/2); a single-owner bucket is gathered (sent n; the owner receives
    W copies, and the tree's first level adds W/2)."""
    return n * 5 // 2 if bucket.scatter else n + world_size * n * 3 // 2


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
    """bf16 copies of the executed block matrices that autocast caches in the forward and the backward keeps (a tied
    core is cast once; dormant untied cores are not executed). The lm_head cast is the loss path's."""
    return 2 * stored_blocks(cfg, passes) * params_per_block(cfg) if autocast else 0


def persistent_bytes(cfg, world_size=1, zero2=False, device="cuda", partial_sums=0, node_size=None):
    """Parameters, gradients and optimizer state per rank, and the largest owned same-shape group Muon stacks.
    Parameters: all stored blocks and lm_head fp32, the embedding in embedding_dtype(device), the rotary tables fp32.
    Gradients: zero2=False every rank holds every gradient (dormant untied cores get explicit zeros); zero2=True
    one accumulator per matrix it owns, and the AdamW gradients in full (the buckets in flight: memory_per_rank);
    with node_size (the hierarchical transport, nodes of P ranks) one node-sum per matrix owned by a rank of its local
    rank on any node, 1/P of them (the busiest local rank's), which become the owned accumulators at the step.
    partial_sums > 0 (the fixed reduction order, muon.py; replaces both): that many partial sums of each owned matrix
    (the local gradients and buckets in flight: memory_per_rank), and of the AdamW gradients the full local one, its
    received chunks and partial_sums chunks of 1/W (with one process: partial_sums full copies of every gradient). Muon: momentum fp32 and the NorMuon second moment for
    owned matrices (muon_owner_loads); AdamW: exp_avg and exp_avg_sq, replicated, in the parameter dtype."""
    C, Vp = cfg.width, cfg.padded_vocab
    emb = Vp * C * (2 if embedding_dtype(device) == torch.bfloat16 else 4)
    matrices = stored_blocks(cfg) * params_per_block(cfg)
    owned = max(muon_owner_loads(block_matrix_shapes(cfg), world_size), key=lambda o: sum(r * c for r, c in o))
    owned_numel = sum(r * c for r, c in owned)
    groups = {}
    for shape in owned:
        groups[shape] = groups.get(shape, 0) + shape[0] * shape[1]
    rotary = 2 * ROPE_TABLE_FACTOR * cfg.seq_len * (cfg.head_dim // 2) * 4
    matrix_grads = 4 * (owned_numel if zero2 else matrices)
    if zero2 and node_size:
        loads = [sum(r * c for r, c in o) for o in muon_owner_loads(block_matrix_shapes(cfg), world_size)]
        matrix_grads = 4 * max(sum(loads[local::node_size]) for local in range(node_size))
    scalars = 4 * gates_stored(cfg)  # fp32, trained by AdamW (arms.PARAM_GROUPS)
    adamw_grads = 4 * Vp * C + emb + scalars
    if partial_sums and world_size == 1:
        matrix_grads, adamw_grads = 4 * matrices * partial_sums, adamw_grads * partial_sums
    elif partial_sums:
        matrix_grads = 4 * owned_numel * partial_sums
        adamw_grads = 2 * adamw_grads + adamw_grads * partial_sums // world_size
    return dict(
        parameters=4 * (matrices + Vp * C) + emb + rotary + scalars,
        gradients=matrix_grads + adamw_grads,
        muon_state=4 * sum(muon_state_numel(s) for s in owned),
        adamw_state=2 * (4 * Vp * C + emb + scalars),
        # Muon.step stacks one shape group (weights, grads, momentum and ~5 fp32-sized temporaries)
        optimizer_step=8 * 4 * max(groups.values(), default=0),
    )


def memory_per_rank(cfg, passes, micro_batch, world_size=1, zero2=False, device="cuda", partial_sums=0,
                    bucket_bytes=BUCKET_BYTES, nvls=False, node_size=None):
    """Predicted bytes per rank of one training step at `passes` with micro-batches of `micro_batch` sequences (bf16
    autocast on CUDA, fp32 elsewhere, as train.py runs). 'peak' is what torch.cuda.max_memory_allocated should
    report; 'required' adds what the rank holds outside the allocator (cuda_context, nccl_buffers: nvls is NCCL's
    NVLS, nvls_enabled) and the margin (workspaces and fragmentation: WORKSPACE_BYTES and MEMORY_MARGIN_FRACTION of
    the peak). The step's peak is the largest of three moments: the end of the forward /
    start of the backward (weight copies, all activations, the loss path, and the larger of the loss transient and a
    backward working set of one block's activations plus two fp32 residual-stream gradients plus the gradient buckets
    in flight), the Muon step (its stacked shape group plus the bucket of new weights being all-gathered), and a
    validation batch at this micro-batch and these passes (evaluation_bytes; a run evaluates at its last stage's).
    in_flight_gradients and muon_gather are the two transport terms, already inside step_transient and
    optimizer_step. The buckets in flight assume each block's gradients are complete when its backward ends (eager,
    or compiled per block: COMPILE_MODE). partial_sums: see persistent_bytes (0: the default reduction order);
    bucket_bytes: Muon's gradient bucket (train.py --bucket-mb); node_size: the hierarchical transport's ranks per
    node (zero2), whose step-end bucket across nodes (its node-sums' copy n/P and the owner's n/W) is less than the
    gathered bucket (muon_gather, n + n/W) the step already has."""
    autocast = torch.device(device).type == "cuda"
    parts = persistent_bytes(cfg, world_size, zero2, device, partial_sums, node_size)
    optimizer_step = parts.pop("optimizer_step")
    static = sum(parts.values())
    loss_saved, loss_peak = loss_path_bytes(cfg, micro_batch, autocast)
    tokens = micro_batch * cfg.seq_len
    block_saved = tokens * block_activation_bytes_per_token(cfg, autocast)
    backward_working = block_saved + tokens * 2 * 4 * cfg.width
    largest = largest_bucket_bytes(cfg, passes, world_size, bucket_bytes) if world_size > 1 else 0
    if zero2 or (partial_sums and world_size > 1):
        in_flight = sharded_backward_bytes(cfg, passes, world_size, bucket_bytes, block_saved, bool(partial_sums),
                                           node_size)
    else:  # one bucket's copy on top of the gradients it copies (one process: no transport)
        in_flight = largest
    muon_gather = largest + largest // world_size if world_size > 1 else 0  # the bucket gathered and this rank's part
    parts.update(weight_copies=weight_copy_bytes(cfg, passes, autocast),
                 activations=activation_bytes(cfg, passes, micro_batch, autocast), loss_path=loss_saved,
                 step_transient=max(loss_peak - loss_saved, backward_working + in_flight),
                 optimizer_step=optimizer_step + muon_gather, in_flight_gradients=in_flight, muon_gather=muon_gather,
                 evaluation=evaluation_bytes(cfg, passes, micro_batch, autocast))
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
    zero2: bool
    stages: list         # one StageMemory per pass stage, in training order
    shard_gradients: bool = False  # zero2 because --shard-gradients asked for it
    node_size: int = None          # zero2 on several nodes: the hierarchical transport's ranks per node (None: flat)


def plan_memory(cfg, pass_stages, rank_sequences, gpu_memory_gib, world_size=1, zero2=False, micro_batches=None,
                device="cuda", fixed_order=False, bucket_bytes=BUCKET_BYTES, nvls=False, node_size=None):
    """Micro-batch per pass stage: the largest divisor of rank_sequences (sequences per rank per optimizer step)
    whose required bytes fit in gpu_memory_gib, so it may drop at growth. Data-constrained runs pass their K: the
    executed depth p + K*c + q is what costs memory. micro_batches (one per stage, each a divisor of rank_sequences:
    requested_micro_batches) are checked instead of chosen: one that does not fit raises ValueError naming the
    largest that fits. fixed_order: the fixed reduction order's partial sums, floor(log2(micro-batches per rank)) + 1
    (muon.py). bucket_bytes: Muon's gradient bucket; nvls: NCCL's NVLS buffers (nvls_enabled); node_size: zero2's
    hierarchical transport (None: flat)."""
    capacity = gpu_memory_gib * GIB
    divisors = [b for b in range(rank_sequences, 0, -1) if rank_sequences % b == 0]
    stages = []
    for i, passes in enumerate(pass_stages):
        def need(b):
            partial_sums = (rank_sequences // b).bit_length() if fixed_order else 0  # floor(log2(n)) + 1
            return memory_per_rank(cfg, passes, b, world_size, zero2, device, partial_sums, bucket_bytes, nvls,
                                   node_size)
        fitting = next((b for b in divisors if need(b)["required"] <= capacity), None)
        where = f"{cfg.arch} d{cfg.depth} at K={passes} ({executed_blocks(cfg, passes)} executed blocks)"
        if micro_batches is None and fitting is None:
            raise ValueError(f"{where} does not fit {gpu_memory_gib:g} GiB per GPU even at micro-batch 1 (needs "
                             f"{need(1)['required'] / GIB:.1f} GiB); use more GPUs or the owner-sharded transport")
        choice = fitting if micro_batches is None else micro_batches[i]
        if need(choice)["required"] > capacity:
            largest = f"the largest that fits is {fitting}" if fitting else "none fits, not even 1"
            raise ValueError(f"micro-batch {choice} needs {need(choice)['required'] / GIB:.1f} GiB per GPU for "
                             f"{where}, more than {gpu_memory_gib:g} GiB; {largest}")
        headroom = None if math.isinf(capacity) else capacity - need(choice)["required"]
        stages.append(StageMemory(passes, executed_blocks(cfg, passes), choice, need(choice), headroom))
    return MemoryPlan(gpu_memory_gib, world_size, zero2, stages, node_size=node_size)


# ----------------------------------------------------------------------------------------------------------------------
# The micro-batch planner: the micro-batch of each pass stage. It depends on the world size and the device, so it is
# kept out of the Plan (a run resumes on another world size): result.json and the dry run hold it under "memory".

H100_80GB_GIB = 81559 / 1024   # GiB that torch reports for an H100 80GB: a dry run's default --gpu-memory
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


def plan_micro_batches(plan, world, gpu_memory_gib, micro_batches=None, device="cuda", fixed_order=False,
                       what="--device-batch-size", shard_gradients=False, bucket_mb=muon.BUCKET_MB, node_size=None):
    """Per pass stage, the largest micro-batch (a divisor of the sequences per rank) that fits gpu_memory_gib, or a
    check that the given micro_batches fit (one per stage: requested_micro_batches or a resumed run's; `what` names
    them in errors). Gradients stay replicated (reduced once per step) when that fits, else they are sharded over the
    ranks by the owner-sharded transport, which then reduces every micro-batch (zero2); shard_gradients
    (--shard-gradients) shards them on several ranks whether or not replicated ones fit. fixed_order: the fixed
    reduction order's gradient memory (always sharded, exchanged every micro-batch). bucket_mb: Muon's gradient bucket
    (--bucket-mb). node_size: ranks per node (transport_node_size); sharded gradients on several nodes of several
    ranks take the hierarchical transport where it fits. -> MemoryPlan; UsageError when nothing fits."""
    batch_seqs = sequences_per_rank(plan, world) * world
    transport = dict(fixed_order=fixed_order, shard_gradients=shard_gradients, bucket_mb=bucket_mb,
                     node_size=node_size)
    try:
        return fit_memory(plan, world, gpu_memory_gib, micro_batches, device, **transport)
    except ValueError as e:
        if micro_batches is not None:
            raise UsageError(f"{what}: {e} ({world} GPUs)") from None
    more = next((w for w in range(2 * world, batch_seqs + 1, world) if batch_seqs % w == 0
                 and fits(plan, w, gpu_memory_gib, device, **transport)), None)
    raise UsageError(f"{plan.arch} d{plan.depth} does not fit {gpu_memory_gib:g} GiB per GPU on {world} GPUs, not even "
                     "at micro-batch 1" + (" with sharded gradients; " if world > 1 else "; ") +
                     (f"it fits on {more} GPUs" if more else "no world size fits"))


def fit_memory(plan, world, gpu_memory_gib, micro_batches, device, fixed_order=False, shard_gradients=False,
               bucket_mb=muon.BUCKET_MB, node_size=None):
    """plan_memory with replicated gradients, else (several ranks) sharded ones: hierarchical on several nodes of
    node_size ranks, else flat -> MemoryPlan; raises the ValueError of the last layout tried. shard_gradients: sharded
    ones only. The fixed reduction order has one gradient layout of its own."""
    sharded = [(True, node_size)] if node_size and 1 < node_size < world and not fixed_order else []
    sharded.append((True, None))
    layouts = [(False, None)] if world == 1 or fixed_order else sharded if shard_gradients else [(False, None), *sharded]
    rank_seqs = plan.tokens_per_step // plan.seq_len // world
    for zero2, nodes_of in layouts:
        try:
            mem = plan_memory(plan.model_config, memory_pass_stages(plan), rank_seqs, gpu_memory_gib, world, zero2,
                              micro_batches, device, fixed_order, int(bucket_mb * 2 ** 20), nvls_enabled(), nodes_of)
            return replace(mem, shard_gradients=shard_gradients and zero2)
        except ValueError:
            if (zero2, nodes_of) == layouts[-1]:
                raise


def fits(plan, world, gpu_memory_gib, device, **transport):
    """Whether the planner finds micro-batches for `plan` on `world` GPUs of gpu_memory_gib."""
    try:
        fit_memory(plan, world, gpu_memory_gib, None, device, **transport)
    except ValueError:
        return False
    return True


def memory_report(mem, plan, fixed_order=False):
    """The "memory" of a dry run and of result.json: per pass stage the micro-batch, the gradient accumulation and
    the predicted GiB per rank (memory_per_rank: eager, an upper bound for a compiled run, with the headroom left),
    and in bytes the peak and the allowance outside the allocator that a run's measured memory is gated against."""
    rank_seqs = plan.tokens_per_step // plan.seq_len // mem.world_size
    why = "--shard-gradients" if mem.shard_gradients else \
        "the owner-sharded transport is required: replicated gradients do not fit"
    gradients = f"sharded over the ranks and reduced every micro-batch ({why})" if mem.zero2 else \
        "replicated, reduced once per step"
    transport = "flat" if mem.world_size > 1 else None
    if mem.node_size:
        transport = f"hierarchical: nodes of {mem.node_size} ranks"
        gradients = (f"sharded over the ranks ({why}): reduced inside each node every micro-batch into node-sums "
                     "(1/ranks per node of them), across nodes once per step")
    if fixed_order:
        gradients = ("fixed reduction order: sent to their owners every micro-batch; an owner keeps up to "
                     "floor(log2(accumulation)) + 1 partial sums of its matrices")
    return dict(gpu_memory_gib=None if math.isinf(mem.gpu_memory_gib) else round(mem.gpu_memory_gib, 2),
                world_size=mem.world_size, sequences_per_rank=rank_seqs,
                sync_every_micro_batch=mem.zero2 or fixed_order, gradients=gradients, transport=transport,
                node_size=mem.node_size, fixed_reduce_order=fixed_order,
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
    gradients = "" if not mem.zero2 else " | gradients sharded, " + (
        "reduced inside each node every micro-batch, across nodes once per step (hierarchical transport)"
        if mem.node_size else "reduced every micro-batch (owner-sharded transport)")
    return (f"memory {name}: micro-batch " + " -> ".join(str(s.micro_batch) for s in mem.stages) + " | peak "
            + " -> ".join(f"{s.bytes['peak'] / GIB:.1f}" for s in mem.stages)
            + f" GiB per rank + {parts['cuda_context'] / GIB:g} CUDA context{nccl} GiB outside the allocator"
            + " | headroom " + " -> ".join(f"{s.headroom / GIB:.1f}" for s in mem.stages)
            + f" GiB of {mem.gpu_memory_gib:.1f}{gradients}"
            + f" | host {host['per_node_gib']:.0f} GiB per node ({host['resume_per_node_gib']:.0f} on resume)")


# Host memory at start-up: what the dry run predicts per node (ranks per node x one rank's bytes)

HOST_RUNTIME_BYTES = 3 * GIB        # per process: Python, torch, the CUDA and NCCL libraries and context (an allowance)
ASSUMED_TOKENS_PER_DOCUMENT = 500   # sizes the loader's per-document arrays; the dry run does not read the pool


def host_memory(plan, ranks_per_node, device="cuda"):
    """Predicted host RAM of one node at start-up: ranks_per_node times what one rank holds. model_init: GPT draws one
    fp32 tensor at a time on the host (the largest), plus the bf16 cast of the embedding on its way to a CUDA device;
    loader: TrainLoader's int64 arrays over the documents of the token limit (lengths, shuffled order, stream offsets,
    and two transients of that length while an epoch's order is built) and the window order; validation: the int64
    validation windows. A resume also reads the weights file and the AdamW state, memory-mapped (checkpoint.
    load_tensors): page cache, one copy shared by the node's ranks. So are the pool's tokens (not counted)."""
    cfg = plan.model_config
    C, Vp = cfg.width, cfg.padded_vocab
    emb = Vp * C * (2 if embedding_dtype(device) == torch.bfloat16 else 4)
    largest = max(Vp * C, *(rows * cols for rows, cols in block_matrix_shapes(cfg)))
    documents = plan.train_token_limit // ASSUMED_TOKENS_PER_DOCUMENT
    per_rank = dict(runtime=HOST_RUNTIME_BYTES, model_init=4 * largest + (emb if emb < 4 * Vp * C else 0),
                    loader=8 * (5 * documents + plan.train_token_limit // (plan.seq_len + 1)),
                    validation=8 * (plan.val_tokens // plan.seq_len) * (plan.seq_len + 1))
    parts = persistent_bytes(cfg, device=device)
    resume = parts["parameters"] + parts["adamw_state"]
    return dict(ranks_per_node=ranks_per_node, per_rank_gib={k: round(v / GIB, 2) for k, v in per_rank.items()},
                per_node_gib=round(ranks_per_node * sum(per_rank.values()) / GIB, 1),
                resume_per_node_gib=round((ranks_per_node * sum(per_rank.values()) + resume) / GIB, 1),
                assumes=f"{ASSUMED_TOKENS_PER_DOCUMENT} tokens per document; {HOST_RUNTIME_BYTES / GIB:g} GiB per "
                        "process for Python, torch and the CUDA runtime")


def device_memory_plan(args, plan, world, device, recorded=None):
    """This process's micro-batches: on CUDA fitted to --gpu-memory (default the device's total memory); on CPU
    (fp32, host memory) requested_micro_batches, fitted to --gpu-memory if given. recorded: the micro-batches a
    resumed --fixed-reduce-order run started with, used instead."""
    if recorded:
        micro_batches = resumed_micro_batches(args, plan, world, recorded)
        what = f"the micro-batches {recorded} this --fixed-reduce-order run started with (bit-identity needs them)"
    else:
        micro_batches, what = requested_micro_batches(args, plan, world, device.type), "--device-batch-size"
    if device.type == "cuda":
        gpu = args.gpu_memory or torch.cuda.get_device_properties(device).total_memory / GIB
    else:
        gpu = args.gpu_memory or math.inf
    return plan_micro_batches(plan, world, gpu, micro_batches, device.type, args.fixed_reduce_order, what,
                              shard_gradients=args.shard_gradients, bucket_mb=args.bucket_mb,
                              node_size=transport_node_size(args, ranks_per_node(world) if world > 1 else 1))


def transport_node_size(args, per_node):
    """The ranks per node the hierarchical transport may use (plan_micro_batches), None with --flat-transport."""
    return None if args.flat_transport else per_node


def resumed_micro_batches(args, plan, world, recorded):
    """A --fixed-reduce-order run resumes with the micro-batches it started with, at any world size whose sequences
    per rank they divide: the same micro-batches are what makes the trajectory bit-identical."""
    rank_seqs = sequences_per_rank(plan, world)
    bad = [b for b in recorded if rank_seqs % b]
    if bad:
        raise UsageError(f"this --fixed-reduce-order run started with micro-batches {recorded}, which bit-identity "
                         f"needs, but {world} processes get {rank_seqs} sequences each, not a multiple of {bad[0]}; "
                         "resume on fewer processes")
    if len(recorded) != len(memory_pass_stages(plan)):
        raise UsageError(f"this --fixed-reduce-order run started with micro-batches {recorded} for another plan; "
                         "resume with the flags it started with")
    if args.device_batch_size and torchrun_ranks()[0] == 0 and \
            args.device_batch_size * (len(recorded) // len(args.device_batch_size)) != recorded:
        print(f"--device-batch-size {' '.join(map(str, args.device_batch_size))} is not used: a --fixed-reduce-order "
              f"run resumes with the micro-batches it started with, {recorded}")
    return recorded
