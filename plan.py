"""Everything one run needs decided before it touches data: the Plan of `--arch A --depth d` (plus flags), the LR
schedule and passes that read it (paper App. A.3-A.4; docs/recipe.md) and its micro-batch. Pure arithmetic on arms.py's
table and model.py's accounting; train.py trains a Plan:

    python train.py --arch untied_grow --depth 8 --dry-run      # Plan.as_dict(), its micro-batch, GPU-hours
"""
import json
import math
import random
from dataclasses import asdict, dataclass, replace

import arms
import data
import model as model_lib
from arms import ADAMW_MATRIX_LR, ARMS, DATA_CONSTRAINED, PRESETS
from common import UsageError
from model import ModelConfig


@dataclass(frozen=True)
class Plan:
    """as_dict() is the --dry-run JSON and the "plan" of result.json and of checkpoints."""
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
    scalar_lr: float = None      # the scalar parameters' LR (None: the embedding LR)
    total_flops: int = 0

    @property
    def passes_final(self):
        return self.model_config.passes

    def group_lr(self, group):
        """The LR of a model.param_groups() group at this depth (its Plan field in arms.PARAM_GROUPS)."""
        lr = getattr(self, arms.PARAM_GROUPS[group][1])
        return self.embedding_lr if lr is None else lr

    def as_dict(self):  # model.describe's accounting, then these fields in this order; tuples as lists (JSON's)
        return dict(model_lib.describe(self.model_config), **json.loads(json.dumps(asdict(self))))


def make_plan(args):
    """The plan of one run: plain arithmetic, in numbered steps."""
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
    for flag, tokens in (("--total-batch-tokens", batch_tokens), ("--val-tokens", preset.val_tokens)):
        if tokens % seq_len:
            raise UsageError(f"{flag} {tokens} is not a multiple of the sequence length {seq_len}")

    # 3. Growth: the pass stages (--pass-stages, the arm's staged growth, or its initial and final passes) and one
    #    increasing fraction f of the steps before each growth (the paper's rho = 1 - f).
    staged = ARMS[args.arch].stages
    if staged and not args.pass_stages and (cfg.passes_initial, cfg.passes) != (staged[0], staged[-1]):
        raise UsageError(f"{args.arch} grows through the stages {'->'.join(map(str, staged))}: change them with "
                         "--pass-stages, not --passes or --passes-initial")
    stages = args.pass_stages or list(staged or sorted({cfg.passes_initial, cfg.passes}))
    growth = len(stages) > 1
    most, arch = max(args.random_passes or [0]), args.arch  # refuse a training flag the run would record, not use
    for wrong, problem in (
            (args.crossover_fractions and not growth, f"--crossover-fractions does not apply to {arch}: this run does "
                                                      "not grow (growth: --passes-initial < --passes, --pass-stages)"),
            (args.rewarm_steps is not None and not growth, f"--rewarm-steps does not apply to {arch}: no growth"),
            (most and cfg.mode == "plain",
             f"--random-passes does not apply to {arch}: a plain stack runs exactly one pass"),
            (cfg.mode == "untied" and most > cfg.passes,
             f"--random-passes {most} exceeds the {cfg.passes} cores {arch} allocates"),
            (args.tpp is not None and regime, "--tpp does not apply with --data-constrained: the token budget sets "
                                              "the steps"),
            (args.epochs and not regime, "--epochs does not apply without --data-constrained")):
        if wrong:
            raise UsageError(problem)
    default = recipe.crossover.get(depth, recipe.default_crossover) if growth else None  # staged growth: a tuple
    fractions = args.crossover_fractions or ([] if default is None else list(default) if isinstance(default, tuple)
                                             else [default])
    if len(fractions) != len(stages) - 1 or any(not 0 < f < 1 for f in fractions) or sorted(fractions) != fractions:
        example = " ".join(f"{(i + 1) / len(stages):.2f}" for i in range(len(stages) - 1))
        raise UsageError(f"growth {'->'.join(map(str, stages))} needs {len(stages) - 1} increasing "
                         f"--crossover-fractions in (0, 1), e.g. --crossover-fractions {example}")

    # 4. Steps: TPP * N / batch tokens; growth arms match the initial-K matrix-compute budget, with the K=2 step count
    #    left unrounded (App. A.3.2); the data-constrained grid repeats a fixed token budget for its epochs.
    n_tpp = model_lib.params_tpp(cfg)
    epochs = (args.epochs or regime.epochs) if regime else 1
    if regime:
        token_limit = args.train_token_limit or regime.train_tokens
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
    # 6. Compute (result.json's estimated_training_flops): F(passes at the step) * tokens per step, over the steps.
    if plan.random_passes:
        per_token = sum(model_lib.flops_per_token(cfg, passes_at(s, plan)) for s in range(steps))
    else:
        bounds = [0, *crossovers, steps]
        per_token = sum(model_lib.flops_per_token(cfg, k) * (b - a) for k, a, b in zip(stages, bounds, bounds[1:]))
    return replace(plan, total_flops=per_token * batch_tokens)


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
    """What the LR schedule cannot do in this run's steps: reported, not changed, so a run is the recipe it names."""
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


def stage_index(step, plan):  # the growth stage in force at an optimizer step (0 before the first growth)
    return sum(step >= c for c in plan.crossover_steps)


def stage_at(step, plan):  # the pass count of the growth stage in force at an optimizer step
    return plan.pass_stages[stage_index(step, plan)]


def passes_at(step, plan):
    """Passes at an optimizer step: the growth stage's, or after the last growth with --random-passes one drawn from
    a per-step seed (every rank and every resume agree)."""
    if plan.random_passes and step >= (plan.crossover_steps or [0])[-1]:
        return random.Random(plan.seed * 1_000_003 + step).choice(plan.random_passes)
    return stage_at(step, plan)


def device_batch_size(plan, world, device_type, given=None):
    """Sequences per micro-batch: the largest divisor of the sequences per rank up to --device-batch-size (`given`),
    else the preset's on CPU, else arms.device_batch (a CUDA run halves it while its largest stage does not fit)."""
    batch_seqs = plan.tokens_per_step // plan.seq_len
    if batch_seqs % world:
        raise UsageError(f"{batch_seqs} sequences per step do not split over {world} ranks")
    rank_seqs = batch_seqs // world
    if given and rank_seqs % given:
        raise UsageError(f"--device-batch-size {given} does not divide the {rank_seqs} sequences per rank "
                         f"({world} processes)")
    wanted = given or (PRESETS[plan.preset].device_batch_size if device_type == "cpu" else
                       arms.device_batch(plan.depth, max(plan.pass_stages + plan.random_passes)))
    return max(b for b in range(1, min(wanted, rank_seqs) + 1) if rank_seqs % b == 0)
