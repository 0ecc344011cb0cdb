"""The plan of one run: everything `--arch A --depth d` (plus flags) derives before touching data, as a frozen Plan,
and the schedules that read it (paper App. A.3-A.4; docs/recipe.md). Pure arithmetic on the table in arms.py and the
accounting in model.py; train.py trains a Plan, and `--dry-run` prints it.

    python train.py --arch untied_grow --depth 8 --dry-run      # Plan.as_dict() plus its "memory"
    python -m pytest -q tests/test_train.py -k plan
"""
import math
import random
from dataclasses import asdict, dataclass, fields, replace

import arms
import data
import model as model_lib
from arms import ADAMW_MATRIX_LR, ARMS, DATA_CONSTRAINED
from common import UsageError
from model import ModelConfig


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
