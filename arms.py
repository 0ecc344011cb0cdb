"""The paper's table: every per-arm number (architecture, init, training recipe), the data-constrained grid and the
presets, as frozen dataclasses (arXiv 2609.19107, App. A.1 and A.4; docs/recipe.md says which numbers come from the
authors' release). Torch-free: model.py builds networks from it, plan.py plans runs from it.

A field made with knob() is also an override flag --field-name: "model" knobs of model.py and train.py, "train" knobs
of train.py. A new knob is one field; its declared range checks the flag and every arm's row alike.

    python arms.py      # the arm names, in the table's order
"""
import argparse
import ast
import collections
import math
import re
import sys
from dataclasses import MISSING, dataclass, field, fields, replace

from common import UsageError, integer, number

MAX_DEPTH, MAX_PASSES, MAX_STEPS = 1024, 256, 10 ** 7   # the ranges of --depth, of pass counts, of step counts
SEEDS = (0, 2 ** 63 - 1)                                 # train.py and ladder.sh --seed, core_eval.py --seeds


def knob(flag, default=MISSING, help=None, range=None):
    """A field that is also an override flag; range: (low, high) for a whole number, "(0, 1]" for a float."""
    return field(default=default, metadata=dict(flag=flag, help=help, range=range))


def knob_fields(cls, flag):
    return [f for f in fields(cls) if f.metadata.get("flag") == flag]


def knob_type(f):  # the argparse type of a knob field (a tuple knob: of each entry)
    return integer(*f.metadata["range"]) if f.type is int else number(f.metadata["range"])


def row_error(f, value):
    """Why `value` in an arm's row is not what --f-name would accept (None when it is)."""
    if f.type is bool:
        return None if type(value) is bool else f"must be True or False, got {value!r}"
    if f.type is tuple and not (isinstance(value, tuple) and len(value) == 2):
        return f"must be a tuple of two numbers, got {value!r}"
    try:
        for v in value if f.type is tuple else [value]:
            knob_type(f)(repr(v))
    except argparse.ArgumentTypeError as e:
        return str(e)


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One arm: architecture, init and training recipe. LRs are the anchor-depth (d8) values; train.py scales them to
    depth d by (N(anchor) / N(d)) ** lr_exponent (paper App. A.4.4)."""
    label: str                                   # name in figures and tables
    color: str                                   # its colour in every figure (matplotlib), one per arm
    marker: str                                  # its matplotlib marker in the appendix figures (paper App. B)
    mode: str                                    # 'plain' stack | 'tied' core (one, looped) | 'untied' cores
    deep: bool = False                           # Deep Vanilla: a plain stack of d + core(d) blocks
    passes: int = knob("model", help="core passes K (final K for growth arms)", range=(1, MAX_PASSES))
    passes_initial: int = knob("model", None, help="passes before growth (default: the arm's)", range=(1, MAX_PASSES))
    alpha: float = knob("model", help="injection scale of the boundary operator", range="(-inf, inf)")
    recurrence_norm: bool = knob("model", help="RMSNorm the state after every core pass")
    coda_inject: bool = knob("model", help="inject alpha*e after the last pass, before the coda")
    boundary_gate: bool = knob("model", False, help="learn one scalar g per injection point, initialised to alpha: "
                               "h <- RMSNorm(h) + g*e")
    output_multiplier: float = knob("model", range="(0, inf)")
    residual_multiplier: float = knob("model", range="(0, inf)")
    wte_init_std: float = knob("model", range="(0, inf)")
    uniform_init_scale: float = knob("model", range="[0, inf)")
    tpp: float = knob("train", help="tokens per parameter N (growth arms: N at the initial passes)", range="(0, inf)")
    lr_exponent: float = knob("train", range="[0, inf)")
    matrix_lr: float = knob("train", range="[0, inf)")
    embedding_lr: float = knob("train", range="[0, inf)")
    unembedding_lr: float = knob("train", range="[0, inf)")
    scalar_lr: float = knob("train", None, help="LR of the scalar parameters (boundary gates; default: the embedding "
                            "LR)", range="[0, inf)")
    weight_decay: float = knob("train", range="[0, inf)")
    adam_betas: tuple = knob("train", range="[0, 1)")
    adam_eps: float = knob("train", range="(0, inf)")
    warmup_steps: int = knob("train", range=(0, MAX_STEPS))
    warmdown_ratio: float = knob("train", range="[0, 1]")
    rewarm_steps: int = knob("train", 0, help="LR re-warm steps after each growth", range=(0, MAX_STEPS))
    crossover: dict = field(default_factory=dict)   # growth: per-depth fraction f of steps before growth (rho = 1-f)
    default_crossover: float = None                  # f at depths the release did not run (None: not a growth recipe);
    #                                                  staged growth: a tuple, one increasing f per growth
    stages: tuple = None                             # staged growth: the passes of each stage, e.g. (1, 2, 4)
    ladder_depths: tuple = (6, 8, 10, 12, 14, 16, 18)  # the release's ladder of this arm (ladder.sh's paper preset)
    figure2: bool = False                            # drawn in Figure 2 (left) by default (fit.py ladders --out)


SQRT2 = math.sqrt(2.0)
PAPER_ARMS = {  # the paper's eight: a fixed set (ladder.sh all, Figures 2-3, the release comparisons)
    "vanilla": Arm(
        label="Vanilla", color="#7f7f7f", marker="o", figure2=True,
        mode="plain", passes=1, alpha=0.0, recurrence_norm=False, coda_inject=False,
        output_multiplier=0.5, residual_multiplier=0.25, wte_init_std=0.01 / SQRT2, uniform_init_scale=0.0625,
        tpp=5, lr_exponent=0.8, matrix_lr=0.04, embedding_lr=0.01810193359836, unembedding_lr=0.0045254833996,
        weight_decay=0.0707106781187, adam_betas=(0.8, 0.95), adam_eps=1e-10, warmup_steps=40, warmdown_ratio=0.6,
        ladder_depths=(6, 8, 10, 12, 14, 16, 18, 20)),
    "deep_vanilla": Arm(
        label="Deep Vanilla", color="#8c564b", marker="h",
        mode="plain", deep=True, passes=1, alpha=0.0, recurrence_norm=False, coda_inject=False,
        output_multiplier=1.0, residual_multiplier=0.5, wte_init_std=0.005, uniform_init_scale=0.5,
        tpp=6, lr_exponent=0.7, matrix_lr=0.04, embedding_lr=0.0064, unembedding_lr=0.002262741699796,
        weight_decay=0.1, adam_betas=(0.8, 0.99), adam_eps=1e-8, warmup_steps=5, warmdown_ratio=0.8),
    "operator_1": Arm(
        label="Operator-1", color="#9467bd", marker="p", figure2=True,
        mode="tied", passes=1, alpha=1.0, recurrence_norm=True, coda_inject=True,
        output_multiplier=1.0, residual_multiplier=0.5, wte_init_std=0.08 * SQRT2, uniform_init_scale=1 / (2 * SQRT2),
        tpp=6, lr_exponent=0.6, matrix_lr=0.04, embedding_lr=0.03620386719676, unembedding_lr=0.0032,
        weight_decay=0.05, adam_betas=(0.8, 0.98), adam_eps=1e-10, warmup_steps=0, warmdown_ratio=0.8,
        ladder_depths=(6, 8, 10, 12, 14, 16, 18, 20)),
    "loop_2": Arm(
        label="Loop-2", color="#d62728", marker="^", figure2=True,
        mode="tied", passes=2, alpha=1 / SQRT2, recurrence_norm=True, coda_inject=True,
        output_multiplier=1.0, residual_multiplier=0.25, wte_init_std=0.02, uniform_init_scale=1 / (16 * SQRT2),
        tpp=6, lr_exponent=0.6, matrix_lr=0.04, embedding_lr=0.0128, unembedding_lr=0.0045254833996,
        weight_decay=0.05, adam_betas=(0.8, 0.95), adam_eps=1e-10, warmup_steps=40, warmdown_ratio=1.0),
    "untied_2": Arm(
        label="Untied-2", color="#1f77b4", marker="D", figure2=True,
        mode="untied", passes=2, alpha=1.0, recurrence_norm=True, coda_inject=True,
        output_multiplier=1.0, residual_multiplier=0.25, wte_init_std=0.01, uniform_init_scale=1 / (2 * SQRT2),
        tpp=6, lr_exponent=0.6, matrix_lr=0.04, embedding_lr=0.0064, unembedding_lr=0.0064,
        weight_decay=0.0707106781187, adam_betas=(0.8, 0.99), adam_eps=1e-8, warmup_steps=40, warmdown_ratio=1.0),
    "loop_grow": Arm(
        label="Loop-Grow", color="#ff7f0e", marker="P", figure2=True,
        mode="tied", passes=4, passes_initial=2, alpha=1 / SQRT2, recurrence_norm=True, coda_inject=True,
        output_multiplier=1.0, residual_multiplier=0.25, wte_init_std=0.02, uniform_init_scale=1 / (16 * SQRT2),
        tpp=7, lr_exponent=0.5, matrix_lr=0.04, embedding_lr=0.0128, unembedding_lr=0.0045254833996,
        weight_decay=0.05, adam_betas=(0.8, 0.95), adam_eps=1e-10, warmup_steps=40, warmdown_ratio=1.0,
        rewarm_steps=40, crossover={6: .75, 8: .82, 10: .86, 12: .85, 14: .86, 16: .88, 18: .87},
        default_crossover=0.83),
    "untied_grow": Arm(
        label="Untied-Grow", color="#17becf", marker="v", figure2=True,
        mode="untied", passes=4, passes_initial=2, alpha=1.0, recurrence_norm=True, coda_inject=True,
        output_multiplier=1.0, residual_multiplier=0.25, wte_init_std=0.01, uniform_init_scale=1 / (2 * SQRT2),
        tpp=8, lr_exponent=0.6, matrix_lr=0.04, embedding_lr=0.0064, unembedding_lr=0.0064,
        weight_decay=0.0707106781187, adam_betas=(0.8, 0.99), adam_eps=1e-8, warmup_steps=40, warmdown_ratio=1.0,
        rewarm_steps=40, crossover={6: .60, 8: .71, 10: .75, 12: .73, 14: .76, 16: .77, 18: .75, 26: .77},
        default_crossover=0.70),
    # No release script (docs/recipe.md, "Deep Vanilla Grow"): untied stacking growth 2->4 of a plain stack, alpha 0,
    # no recurrence norm. The schedule (TPP 6 on Deep Vanilla's N, f = 0.5) reproduces the release's compute column;
    # multipliers, init and optimizer recipe are ASSUMED: Deep Vanilla's, with matrix LR 0.036 and a 40-step re-warm.
    "deep_vanilla_grow": Arm(
        label="Deep Vanilla Grow", color="#bcbd22", marker="*",
        mode="untied", passes=4, passes_initial=2, alpha=0.0, recurrence_norm=False, coda_inject=False,
        output_multiplier=1.0, residual_multiplier=0.5, wte_init_std=0.005, uniform_init_scale=0.5,
        tpp=6, lr_exponent=0.7, matrix_lr=0.036, embedding_lr=0.0064, unembedding_lr=0.002262741699796,
        weight_decay=0.1, adam_betas=(0.8, 0.99), adam_eps=1e-8, warmup_steps=5, warmdown_ratio=0.8,
        rewarm_steps=40, default_crossover=0.5),
}


def refuse_table(message):
    """A mistake in USER_ARMS, found at import by every script: one line and exit 2."""
    print(f"arms.py: error: {message} (docs/your_own_arm.md)", file=sys.stderr)
    raise SystemExit(2)


def derived(base, **changes):
    """A user arm: paper arm `base`'s row with `changes` (its own label and color) but not the base's per-depth growth
    fractions (`crossover`). stages=(1, 2, 4): a staged growth (it sets passes_initial and passes)."""
    where = f"USER_ARMS: derived({base!r}, ...)"
    if base not in PAPER_ARMS:
        refuse_table(f"{where}: no paper arm {base!r}; derive from one of {', '.join(PAPER_ARMS)}")
    names = [f.name for f in fields(Arm)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        refuse_table(f"{where}: Arm has no field {unknown[0]!r}; its fields: {', '.join(names)}")
    stages = changes.get("stages")
    if stages is not None:
        if not (isinstance(stages, tuple) and len(stages) >= 2 and all(type(k) is int for k in stages)
                and list(stages) == sorted(set(stages)) and 1 <= stages[0] and stages[-1] <= MAX_PASSES):
            refuse_table(f"{where}: stages must be a tuple of 2 or more increasing pass counts, e.g. (1, 2, 4); "
                         f"got {stages!r}")
        if {"passes", "passes_initial"} & set(changes):
            refuse_table(f"{where}: stages {stages} set passes_initial and passes; drop those two")
        changes.update(passes_initial=stages[0], passes=stages[-1])
    return replace(PAPER_ARMS[base], crossover={}, figure2=False, **changes)


def check_user_arms(user_arms):
    """Each name given once, new and fit for a folder; each value what its flag accepts; each colour matplotlib's."""
    table = next(node.value for node in ast.parse(open(__file__).read()).body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "USER_ARMS")  # the literal: a key given twice is lost
    given = collections.Counter(getattr(key, "value", None) for key in getattr(table, "keys", []))
    for name in (name for name, n in given.items() if n > 1):
        refuse_table(f"USER_ARMS: {name!r} is given twice (the second would silently replace the first); rename one")
    from matplotlib.colors import is_color_like  # only here: the scripts that draw import matplotlib themselves
    for name, arm in user_arms.items():
        if name in PAPER_ARMS or not re.fullmatch(r"[a-z0-9_]+", str(name)):
            refuse_table(f"USER_ARMS: {name!r} must be a new name of a-z, 0-9 and _ (it names run folders and "
                         "ladder.sh targets), e.g. 'my_arm_2'")
        for f in fields(Arm):
            error = f.metadata.get("flag") and getattr(arm, f.name) is not None and row_error(f, getattr(arm, f.name))
            if error:
                refuse_table(f"USER_ARMS[{name!r}]: {f.name} {error} (as --{f.name.replace('_', '-')})")
        if not is_color_like(arm.color):
            refuse_table(f"USER_ARMS[{name!r}]: color {arm.color!r} is not a matplotlib colour; e.g. 'tab:purple'")


# Your own arms, one line each (docs/your_own_arm.md): arms of every script and of the invariant tests (test_arms.py).
USER_ARMS = {
    "gated_1": derived("operator_1", label="Gated-1", color="tab:green", marker="s", boundary_gate=True),
    "loop_3": derived("loop_2", label="Loop-3", color="tab:pink", marker="<", passes=3),
    "loop_3_grow": derived("loop_grow", label="Loop-3-Grow", color="navy", marker=">", passes=3, passes_initial=1),
}
check_user_arms(USER_ARMS)
ARMS = {**PAPER_ARMS, **USER_ARMS}
FIGURE2_ARMS = tuple(name for name, arm in ARMS.items() if arm.figure2)
DEMO_ARMS = ("vanilla", "operator_1", "untied_grow")  # bash ladder.sh demo: their cpu ladders, then the fit
CPU_LADDER_DEPTHS = (1, 2, 3, 4)                      # every arm's ladder at the cpu preset (train.ladder_runs)


def device_batch(depth, passes):
    """Sequences per GPU per micro-batch at the paper preset, the release's on 80 GB GPUs (docs/recipe.md): by depth,
    halved two depths earlier for a core run more than twice."""
    rule = ((10, 32), (14, 16), (MAX_DEPTH, 8)) if passes <= 2 else ((8, 32), (12, 16), (16, 8), (18, 4),
                                                                      (MAX_DEPTH, 2))
    return next(batch for up_to, batch in rule if depth <= up_to)


# Each group of model.param_groups() -> (optimizer, the Plan's LR field, weight decay?). Scalars (boundary gates) take
# AdamW at Plan.scalar_lr (default: the embedding LR) without weight decay, which would pull a gate to no injection.
PARAM_GROUPS = {"matrix": ("muon", "matrix_lr", True), "embedding": ("adamw", "embedding_lr", True),
                "unembedding": ("adamw", "unembedding_lr", True), "scalar": ("adamw", "scalar_lr", False)}
# --optimizer adamw (paper Fig. 16f): the release gives no matrix LR; ours is 0.004 at the anchor depth (Muon's / 10).
ADAMW_MATRIX_LR = 0.004


@dataclass(frozen=True)
class DataConstrained:
    """The multi-epoch loop grid (paper Sec. 5, App. D): Operator-1's recipe for any --arch (e.g. the untied and
    no-operator controls of Fig. 24), LR not scaled with depth, a fixed unique-token budget repeated for epochs."""
    weight_decay: dict                  # per depth
    default_weight_decay: float = 0.8
    recipe: str = "operator_1"
    train_tokens: int = 100_000_000
    epochs: int = 10


DATA_CONSTRAINED = {
    "fixed-wd": DataConstrained(weight_decay={}),
    "tuned-wd": DataConstrained(weight_decay={6: 0.4, 8: 0.8, 10: 0.8, 12: 1.2, 14: 1.2, 16: 1.6, 18: 1.6}),
}
# The grid's loop counts K per depth; every cell runs in both variants above
DATA_CONSTRAINED_LOOPS = {6: (1, 2, 3, 4, 6), 8: (1, 2, 3, 4, 6, 8, 12), 10: (1, 2, 3, 4, 6, 8, 12),
                          12: (1, 2, 3, 4, 6, 8, 12), 14: (1, 2, 3, 4, 6, 8), 16: (1, 2, 3), 18: (1,)}


@dataclass(frozen=True, kw_only=True)
class Preset:
    """Shapes, batch and data of a family of runs. 'cpu' runs a d1-d4 ladder in minutes on 2 cores; its anchor depth
    and LR scale come from a sweep (docs/cpu_preset.md), its LR exponents, TPP and growth fractions are the paper's."""
    width_per_depth: int = knob("model", help="width = width_per_depth * depth", range=(1, 2 ** 16))
    head_dim: int = knob("model", range=(2, 2 ** 12))
    seq_len: int = knob("model", range=(1, 2 ** 20))
    mlp_multiple: int = knob("model", help="MLP hidden size is rounded up to a multiple of this", range=(1, 2 ** 16))
    total_batch_tokens: int = knob("train", help="tokens per optimizer step", range=(1, 2 ** 30))
    val_tokens: int = knob("train", help="validation target tokens (multiple of --seq-len)", range=(1, 2 ** 40))
    device_batch_size: int              # CPU runs' micro-batch (on CUDA: device_batch's rule, then a probe)
    anchor_depth: int                   # the depth whose LRs the table gives
    lr_multiplier: float = knob("train", help="multiplies all three LRs (preset default)", range="(0, inf)")
    data_dir: str
    corpus: str
    tokenizer: str
    save_every: int
    log_every: int


PRESETS = {
    "paper": Preset(width_per_depth=128, head_dim=128, seq_len=2048, mlp_multiple=256, total_batch_tokens=524_288,
                    val_tokens=9_961_472, device_batch_size=32, anchor_depth=8, lr_multiplier=1.0,
                    data_dir="data/fineweb", corpus="fineweb", tokenizer="gpt2", save_every=500, log_every=10),
    "cpu": Preset(width_per_depth=16, head_dim=16, seq_len=128, mlp_multiple=16, total_batch_tokens=2048,
                  val_tokens=65_536, device_batch_size=16, anchor_depth=3, lr_multiplier=2.0, data_dir="data/stdlib",
                  corpus="stdlib", tokenizer="bytes", save_every=50, log_every=25),
}
# Dense bf16 peak FLOP/s per GPU (half NVIDIA's with-sparsity datasheet figure), for MFU (train.py) and GPU-hour
# estimates (ladder.sh, fit.py design). The first key the device name contains wins: the PCIe and NVL cards first.
GPU_PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12, "H100": 989e12, "H200": 989e12,
                  "A100": 312e12, "B200": 2250e12}
EVAL_COMPUTE_SHARE = 0.02  # train.py's default --eval-every: periodic validation costs at most 2 % of the training
BOUNDARY_ABLATIONS = ("full", "norm_only", "inject_only", "none")
# --attention-backend: SDPA's backends by name (model.SDPA_BACKENDS); on the CPU only flash and math exist
ATTENTION_BACKENDS = ("auto", "default", "cudnn", "flash", "efficient", "math")
CPU_ATTENTION_BACKENDS = ("auto", "default", "flash", "math")


# The authors' release (reference/release/, see its SOURCE.md) names its series with short names: the project's arm
# for each, or a descriptive label for a series that is no arm here (recipe, shape and boundary ablations).
RELEASE_SERIES = {
    **{arm: arm for arm in PAPER_ARMS},  # effective_depth.json spells the arms out
    "van": "vanilla", "k1": "operator_1", "k1_glr": "operator_1", "k2": "loop_2", "k2_grow": "loop_grow",
    "dep": "untied_2", "dep_grow": "untied_grow", "deep_van": "deep_vanilla", "deep_van_grow": "deep_vanilla_grow",
    "van_glr_wd": "Vanilla GLR+WD", "van_glr_om": "Vanilla GLR+OM", "van_grow": "Vanilla Grow", "van_wdr1":
    "Vanilla WDR 1", "van_constant": "Vanilla constant", "van_const_mup_om": "Vanilla constant+muP OM", "van_mup_om":
    "Vanilla muP OM + GLR", "van_adam": "Vanilla Adam", "k1_van_recipe": "Operator-1 (Vanilla recipe)", "k1_1c2":
    "Operator-1 1/C/2", "k2_nci": "Loop-2 NCI", "k2_fixed_pc": "Loop-2 2/C/3", "k2_grow_random": "Loop-Grow random K",
    "dep_nonorm": "Untied-2 no norm", "dep_noinject": "Untied-2 no inject", "dep_nci": "Untied-2 NCI", "deeper_van":
    "Deeper Vanilla", "deeper_k1": "Deeper Operator-1", "deep_width": "Deep Vanilla width-only", "deep_width_adam":
    "Deep Vanilla width-only Adam", "dep_width": "Untied-2 width-only"}


# Override flags generated from the knob fields

def add_knob_flags(group, cls, flag):
    """One --name flag per `flag` knob of cls, in its declared range; default None: the table's value."""
    for f in knob_fields(cls, flag):
        name, help = "--" + f.name.replace("_", "-"), f.metadata["help"]
        if f.type is bool:
            group.add_argument(name, action=argparse.BooleanOptionalAction, help=help)
        else:
            group.add_argument(name, type=knob_type(f), nargs=2 if f.type is tuple else None, help=help)


def given_knobs(args, cls, flag):
    """{field: value} of the `flag` knobs of cls that were given on the command line."""
    values = {f.name: getattr(args, f.name, None) for f in knob_fields(cls, flag)}
    return {name: tuple(v) if isinstance(v, list) else v for name, v in values.items() if v is not None}


def add_model_flags(parser):
    group = parser.add_argument_group("model overrides (the same flags in model.py and train.py)")
    add_knob_flags(group, Preset, "model")
    add_knob_flags(group, Arm, "model")
    group.add_argument("--prelude", type=integer(0, MAX_DEPTH), help="fixed prelude blocks (core: the rest)")
    group.add_argument("--coda", type=integer(0, MAX_DEPTH), help="fixed coda blocks")
    group.add_argument("--boundary", choices=BOUNDARY_ABLATIONS,
                       help="ablate the boundary operator (norm_only: no injection; inject_only: no norm)")
    group.add_argument("--pass-stages", type=integer(1, MAX_PASSES), nargs="+",
                       help="growth stages, e.g. 2 4 6 (sets --passes-initial and --passes)")


def model_overrides(args):
    """config_for's keywords (besides the shape) from the model flags of either CLI."""
    overrides = given_knobs(args, Arm, "model")
    overrides.update({k: getattr(args, k) for k in ("prelude", "coda", "boundary") if getattr(args, k) is not None})
    if args.pass_stages:
        if sorted(set(args.pass_stages)) != args.pass_stages:
            raise UsageError(f"--pass-stages must increase, e.g. 2 4 6; got {' '.join(map(str, args.pass_stages))}")
        if "passes" in overrides or "passes_initial" in overrides:
            raise UsageError("--pass-stages sets the passes; drop --passes / --passes-initial")
        overrides.update(passes_initial=args.pass_stages[0], passes=args.pass_stages[-1])
    if args.arch not in ARMS:  # config_for names the unknown arch
        return overrides
    # Refuse a boundary-operator flag the run would record but not use (config_for switches it off)
    arch, arm, boundary = args.arch, ARMS[args.arch], overrides.get("boundary")
    plain, no_injection = arm.mode == "plain", boundary in ("norm_only", "none")
    if plain and boundary is not None:
        raise UsageError(f"--boundary does not apply to {arch}: a plain stack has no boundary operator")
    why = f"{arch}, a plain stack" if plain else f"--boundary {boundary}"
    if overrides.get("alpha", 0.0) != 0.0 and (plain or no_injection):
        raise UsageError(f"--alpha {overrides['alpha']} does not apply with {why}: it injects nothing")
    if overrides.get("recurrence_norm") and (plain or boundary in ("inject_only", "none")):
        raise UsageError(f"--recurrence-norm does not apply with {why}: it has no recurrence norm")
    for flag in ("coda_inject", "boundary_gate"):
        if overrides.get(flag) and (plain or no_injection or overrides.get("alpha", arm.alpha) == 0):
            raise UsageError(f"--{flag.replace('_', '-')} does not apply with "
                             f"{why if plain or no_injection else 'alpha 0'}: nothing is injected")
    return overrides


def preset_from_args(args):
    """The --preset with its shape (and, in train.py, batch) knobs replaced by the flags given."""
    return replace(PRESETS[args.preset], **given_knobs(args, Preset, "model"), **given_knobs(args, Preset, "train"))


if __name__ == "__main__":  # bash ladder.sh -h lists them
    print(*ARMS)
