"""The prelude-core-coda transformer of the paper's arms, with exact parameter and FLOP accounting (arXiv 2609.19107,
Sec. 3 and App. A.1; docs/recipe.md): a prelude, a core applied K times (one 'tied' core looped, or K 'untied' cores)
and a coda, with the boundary operator h <- RMSNorm(h) + alpha*e between passes and before the coda. A 'plain' stack
is the same code with no prelude/coda, one pass and no operator. The per-arm numbers live in arms.py.

    python model.py --arch untied_grow --depth 8 --json      # shapes, parameter counts, FLOPs per token
    python model.py --arch loop_2 --depth 2 --preset cpu --vocab-size 257   # a small CPU shape
"""
import contextlib
import json
import math
import sys
from dataclasses import dataclass, field, make_dataclass, replace

import arms
from arms import ARMS, PRESETS, Arm, Preset, knob_fields
from common import Parser, UsageError, answer_help, cli_main, integer

GPT2_VOCAB = 50257


def build_parser():
    ap = Parser(prog="model.py", description="Shapes, parameter counts and FLOPs of one arm.")
    ap.add_argument("--arch", required=True, help=f"one of {', '.join(ARMS)}")
    ap.add_argument("--depth", type=integer(1, arms.MAX_DEPTH), required=True,
                    help="depth coordinate d (width = width_per_depth * d)")
    ap.add_argument("--preset", choices=list(PRESETS), default="paper", help="shapes (default paper)")
    ap.add_argument("--vocab-size", type=integer(1, 2 ** 20), default=GPT2_VOCAB,
                    help="the tokenizer's (GPT-2: 50257, bytes: 257)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    arms.add_model_flags(ap)
    return ap


if __name__ == "__main__":
    answer_help(build_parser)  # before torch loads

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

VOCAB_MULTIPLE = 64      # wte/lm_head rows are padded up to this; logits are sliced back to vocab_size
ROPE_BASE = 10_000
ROPE_TABLE_FACTOR = 10   # rotary tables cover 10 * seq_len positions (as the release does)
# --attention-backend: SDPA's backends in priority order ([]: PyTorch's choice). "auto" (training) puts cuDNN first,
# reported 1.7-2.3x faster than FlashAttention-2 on an H100, for causal calls of a multiple of 128 positions (older
# cuDNNs were wrong at other lengths), and is "default" elsewhere (CORE). Any other name forces that backend.
SDPA_BACKENDS = {"auto": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                          SDPBackend.MATH], "default": [], "cudnn": [SDPBackend.CUDNN_ATTENTION],
                 "flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
                 "math": [SDPBackend.MATH]}


def attention_backends(name, seq_len, causal):
    """The SDPA backends of an attention call of `seq_len` under --attention-backend `name` ([]: PyTorch's choice)."""
    return [] if name == "auto" and not (causal and seq_len % 128 == 0) else SDPA_BACKENDS[name]


@dataclass(kw_only=True)
class ModelShape:
    """What config_for derives from the depth, the preset and the arm's mode; ModelConfig adds the arm's knobs."""
    arch: str
    depth: int
    width: int
    n_head: int
    head_dim: int
    mlp_hidden: int
    mlp_multiple: int
    vocab_size: int          # the REAL vocab (50257 for GPT-2, 257 for the byte tokenizer)
    seq_len: int
    mode: str                # 'plain' (stack) | 'tied' (one core, looped) | 'untied' (K cores)
    n_prelude: int
    n_core: int
    n_coda: int

    def __post_init__(self):  # what an arm's row or flags may ask and config_for's arithmetic does not rule out
        for wrong, problem in (
                (self.head_dim % 2, f"head_dim must be even for RoPE, got {self.head_dim}"),
                (not 1 <= self.passes_initial <= self.passes,
                 f"need 1 <= passes_initial <= passes, got {self.passes_initial} and {self.passes}"),
                (self.mode == "plain" and self.passes != 1, "a plain stack runs one pass"),
                (self.boundary_gate and not gates_stored(self), "boundary_gate needs an injection (alpha != 0, and a "
                                                                "second pass or coda_inject)")):
            if wrong:
                raise ValueError(problem)

    @property
    def padded_vocab(self):
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


# Every "model" knob of Arm (passes, alpha, boundary_gate, ...) is a field of ModelConfig under its own name, with the
# arm's value: a new knob is one Arm field, and the model reads cfg.NAME.
ModelConfig = make_dataclass("ModelConfig", [(f.name, f.type, field(default=f.default))
                                             for f in knob_fields(Arm, "model")], bases=(ModelShape,), kw_only=True)


def embedding_dtype(device):
    """The release keeps the embedding table, and so its AdamW moments, in bf16 on CUDA; fp32 elsewhere."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


# The network

def norm(x):
    """Parameter-free RMSNorm over the last dim with F.rms_norm's default eps (machine epsilon of x's dtype)."""
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary(x, cos, sin):
    """RoPE, half-split pairs rotated by -theta as in the release: y1 = x1 cos + x2 sin, y2 = -x1 sin + x2 cos."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.c_q, self.c_k, self.c_v, self.c_proj = (nn.Linear(cfg.width, cfg.width, bias=False) for _ in range(4))

    def forward(self, x, cos, sin, attn_mask=None):
        B, T, C = x.shape
        q, k, v = (linear(x).view(B, T, self.n_head, self.head_dim) for linear in (self.c_q, self.c_k, self.c_v))
        q, k = norm(apply_rotary(q, cos, sin)), norm(apply_rotary(k, cos, sin))  # QK-norm after RoPE
        backends = attention_backends(self.attention, T, causal=attn_mask is None)  # GPT.set_attention's name
        with sdpa_kernel(backends, set_priority=True) if backends else contextlib.nullcontext():  # traced by
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),  # compile
                                               attn_mask=attn_mask, is_causal=attn_mask is None)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_gate, self.c_fc = (nn.Linear(cfg.width, cfg.mlp_hidden, bias=False) for _ in range(2))
        self.c_proj = nn.Linear(cfg.mlp_hidden, cfg.width, bias=False)

    def forward(self, x):
        return self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.residual_multiplier = cfg.residual_multiplier
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, attn_mask=None):
        # x is the fp32 residual stream; branch outputs (bf16 under autocast) are cast to fp32 before the add
        x = x + self.residual_multiplier * self.attn(norm(x), cos, sin, attn_mask).float()
        return x + self.residual_multiplier * self.mlp(norm(x)).float()


class GPT(nn.Module):
    def __init__(self, cfg, device="cpu", draw_weights=True, attention="auto", dtype=None):
        """The network on `device`, the embedding in `dtype` (default embedding_dtype(device)). Built on the meta device
        and drawn tensor by tensor on the CPU (init_weights): the host never holds the model, and a seed gives the same
        weights on any device; nothing is drawn with draw_weights=False (a checkpoint's)."""
        super().__init__()
        self.cfg = cfg
        with torch.device("meta"):
            self.transformer = nn.ModuleDict(dict(  # h: prelude, core_1 .. core_K (untied) or the one core, coda
                wte=nn.Embedding(cfg.padded_vocab, cfg.width, dtype=dtype or embedding_dtype(device)),
                h=nn.ModuleList(Block(cfg) for _ in range(stored_blocks(cfg)))))
            self.lm_head = nn.Linear(cfg.width, cfg.padded_vocab, bias=False)
            # boundary_gates[r] scales the injection after pass r (the coda's after the last); empty without a gate
            self.boundary_gates = nn.ParameterList(nn.Parameter(torch.empty(())) for _ in range(gates_stored(cfg)))
        self.to_empty(device=device)
        inv_freq = ROPE_BASE ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        angles = torch.outer(torch.arange(ROPE_TABLE_FACTOR * cfg.seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("rope_cos", angles.cos().to(device), persistent=False)  # checkpoints hold parameters only
        self.register_buffer("rope_sin", angles.sin().to(device), persistent=False)
        self.active_passes = cfg.passes_initial
        self.set_attention(attention)
        if draw_weights and torch.device(device).type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """Paper App. A.1 (docs/recipe.md, "Init"): every out-projection and lm_head zero (initial logits are exactly
        0), in-projections Uniform(-s, s) with s = uniform_init_scale / sqrt(C), embedding Normal(0, wte_init_std^2),
        drawn from the CPU generator after the modules' default inits (drawn and thrown away, as a CPU build does)."""
        def drawn(param, draw):
            param.copy_(draw(torch.empty(param.shape, device="cpu")))

        for module in self.modules():  # construction order
            if isinstance(module, nn.Embedding):
                nn.init.normal_(torch.empty(module.weight.shape, device="cpu"))
            elif isinstance(module, nn.Linear):
                nn.init.kaiming_uniform_(torch.empty(module.weight.shape, device="cpu"), a=math.sqrt(5))
        s = self.cfg.uniform_init_scale / math.sqrt(self.cfg.width)
        for block in self.transformer.h:
            for linear in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_gate, block.mlp.c_fc):
                drawn(linear.weight, lambda t: t.uniform_(-s, s))
            block.attn.c_proj.weight.zero_(), block.mlp.c_proj.weight.zero_()
        drawn(self.transformer.wte.weight, lambda t: t.normal_(0.0, self.cfg.wte_init_std))
        self.lm_head.weight.zero_()
        for gate in self.boundary_gates:  # at alpha: the gated operator starts as the arm's fixed one
            gate.fill_(self.cfg.alpha)

    def core_blocks(self, pass_index):
        start = self.cfg.n_prelude + (pass_index * self.cfg.n_core if self.cfg.mode == "untied" else 0)
        return self.transformer.h[start:start + self.cfg.n_core]

    def check_passes(self, k):  # a tied core runs any number of passes, untied cores at most the ones allocated
        most = dict(plain=1, untied=self.cfg.passes).get(self.cfg.mode, math.inf)
        if not 1 <= k <= most:
            raise ValueError(f"the {self.cfg.mode} model runs 1 to {most} passes, got {k}")

    def set_attention(self, name):
        for block in self.transformer.h:
            block.attn.attention = name

    def set_passes(self, k):
        self.check_passes(k)
        self.active_passes = k

    def per_pass(self):
        """Every per-pass sequence, entry r holding pass r's parameters: the untied cores, and each nn.ParameterList /
        nn.ModuleList the model holds directly, entry r the injection after pass r (gates; docs/your_own_arm.md)."""
        lists = [[list(m.parameters()) if isinstance(m, nn.Module) else [m] for m in seq]
                 for seq in self.children() if isinstance(seq, (nn.ParameterList, nn.ModuleList))]
        if self.cfg.mode == "untied":
            lists.append([list(self.core_blocks(r).parameters()) for r in range(self.cfg.passes)])
        return lists

    @torch.no_grad()
    def grow(self, new_passes):
        """Raise the pass count. Untied (stacking, paper Sec. 3): entry j >= old of each per-pass sequence <- entry
        j mod old (C1 C2 -> C1 C2 C1 C2); returns what it wrote (for fresh optimizer state). Tied: reuses all, []."""
        old = self.active_passes
        self.set_passes(new_passes)
        written = []
        for seq in self.per_pass() if self.cfg.mode == "untied" else []:
            for j in range(old, min(new_passes, len(seq))):
                for dst, src in zip(seq[j], seq[j % old], strict=True):
                    dst.copy_(src)
                    written.append(dst)
        return written

    def param_groups(self):
        """Every parameter in one group (arms.PARAM_GROUPS: its optimizer, LR and decay) by where it lives and its
        shape: embedding, unembedding, every other matrix, every other tensor (gates, scales)."""
        groups = dict(matrix=[], embedding=[], unembedding=[], scalar=[])
        for name, p in self.named_parameters():
            group = "embedding" if name.startswith("transformer.wte.") else "unembedding" if \
                name.startswith("lm_head.") else "matrix" if p.ndim == 2 else "scalar"
            groups[group].append(p)
        return groups

    def decode(self, h):
        """Final RMSNorm -> lm_head -> slice to the real vocab -> fp32 -> x output multiplier (also the logit lens)."""
        logits = self.lm_head(norm(h))[..., :self.cfg.vocab_size]
        return logits.float() * self.cfg.output_multiplier

    def forward(self, idx, targets=None, passes=None, return_hidden=False, reduction="mean"):
        hidden = [] if return_hidden else None
        h = self.residual_stream(idx, passes, hidden=hidden)
        out = self.decode(h) if targets is None else self.loss(h, targets, reduction)
        return (out, hidden) if return_hidden else out

    def loss(self, h, targets, reduction="mean"):
        """Cross-entropy of decode(h) against targets (-1: none), mean or per target. A new loss term is one line."""
        return F.cross_entropy(self.decode(h).flatten(0, 1), targets.reshape(-1), ignore_index=-1, reduction=reduction)

    def residual_stream(self, idx, passes=None, positions=None, attn_mask=None, hidden=None):
        """The final residual stream (B, T, C). positions (B, T): rotary positions (default 0..T-1); attn_mask
        (B, 1, T, T), True = may attend (default causal); hidden collects the embedding and each block's output."""
        cfg, K, T = self.cfg, self.active_passes if passes is None else passes, idx.size(1)
        self.check_passes(K)
        cos, sin = (self.rope_cos[:T], self.rope_sin[:T]) if positions is None else \
            (self.rope_cos[positions], self.rope_sin[positions])
        keep = hidden.append if hidden is not None else lambda x: None

        def run(blocks, x):
            for block in blocks:
                x = block(x, cos, sin, attn_mask)
                keep(x)
            return x

        x = norm(self.transformer.wte(idx)).float()
        keep(x)
        x = run(self.transformer.h[:cfg.n_prelude], x)
        # Boundary operator as the authors' release computes it (docs/recipe.md): the first pass starts from the raw
        # prelude output e, and the operator runs AFTER every pass. The paper's Algorithm 1 writes h0 = 0 and applies
        # Norm(h) + alpha*e BEFORE every pass (and before the coda); the two agree except that there the first pass
        # sees alpha*e instead of e (identical for alpha = 1), and without coda injection the last pass is un-injected.
        e = x
        for r in range(K):
            x = run(self.core_blocks(r), x)
            if cfg.recurrence_norm:
                x = norm(x)
            if cfg.alpha != 0 and (r < K - 1 or cfg.coda_inject):
                x = self.inject(x, e, r)
        return run(self.transformer.h[len(self.transformer.h) - cfg.n_coda:], x)

    def inject(self, h, e, r):
        """The injection after pass r: h + alpha*e, or h + g_r*e with learned gates (beyond them, the last one's)."""
        gates = self.boundary_gates
        return h + (gates[min(r, len(gates) - 1)] if len(gates) else self.cfg.alpha) * e


def config_for(arch, depth, *, vocab_size=GPT2_VOCAB, prelude=None, coda=None, boundary="full", **overrides):
    """The ModelConfig of arm `arch` at depth d: shape keywords default to the paper preset's, others override the
    arm's "model" knobs. prelude/coda fix those stages (paper Fig. 15a); boundary ablates the operator: norm_only
    drops the injection (alpha = 0), inject_only the recurrence norm, none both."""
    if arch not in ARMS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARMS)}")
    shape = {f.name: overrides.pop(f.name, getattr(PRESETS["paper"], f.name)) for f in knob_fields(Preset, "model")}
    arm = replace(ARMS[arch], **overrides)
    knobs = {f.name: getattr(arm, f.name) for f in knob_fields(Arm, "model")}  # every model knob of the row
    knobs["passes_initial"] = arm.passes_initial or arm.passes
    if boundary in ("norm_only", "none"):
        knobs.update(alpha=0.0, coda_inject=False, boundary_gate=False)
    if boundary in ("inject_only", "none"):
        knobs["recurrence_norm"] = False
    width = shape.pop("width_per_depth") * depth
    if width % shape["head_dim"]:
        raise ValueError(f"width {width} at depth {depth} is no multiple of head_dim {shape['head_dim']}")
    base, rem = divmod(depth, 3)  # every paper script's split: d//3 each, the remainder to the core, then the coda
    p, c, q = base, base + (rem >= 1), base + (rem >= 2)
    if arm.mode == "plain":
        if prelude is not None or coda is not None:
            raise ValueError(f"{arch} is a plain stack: --prelude/--coda do not apply")
        p, c, q = 0, depth + (c if arm.deep else 0), 0
    elif prelude is not None or coda is not None:
        p, q = p if prelude is None else prelude, q if coda is None else coda
        c = depth - p - q
        if p < 0 or q < 0 or c < 1:
            raise ValueError(f"impossible split at depth {depth}: prelude {p} + coda {q} leaves core {c} (< 1)")
    mlp_hidden = -(-(8 * width // 3) // shape["mlp_multiple"]) * shape["mlp_multiple"]
    return ModelConfig(arch=arch, depth=depth, width=width, n_head=width // shape["head_dim"], mlp_hidden=mlp_hidden,
                       vocab_size=vocab_size, mode=arm.mode, n_prelude=p, n_core=c, n_coda=q, **shape, **knobs)


def check_arm(cfg, optimizer="muon"):
    """The run's (and its dry runs') check of an arm's model, before any folder exists: each parameter in one group of
    GPT.param_groups(), each group with an arms.PARAM_GROUPS row, only 2-D tensors in a group Muon steps."""
    net = GPT(cfg, device="meta")
    groups, names = net.param_groups(), {p: name for name, p in net.named_parameters()}
    where = f"arm {cfg.arch}: model.param_groups()"
    for group, params in groups.items():
        if group not in arms.PARAM_GROUPS:
            raise UsageError(f"{where} has the group {group!r}, which has no row in arms.PARAM_GROUPS "
                             f"({', '.join(arms.PARAM_GROUPS)}); add its optimizer, LR and weight decay there")
        for p in params if optimizer == "muon" and arms.PARAM_GROUPS[group][0] == "muon" else []:
            if p.ndim != 2:
                raise UsageError(f"{where} puts {names[p]} (shape {tuple(p.shape)}) in group {group!r}, which Muon "
                                 "steps, and Muon takes 2-D matrices only: put it in group 'scalar' (AdamW)")
    grouped = [id(p) for params in groups.values() for p in params]
    for p, name in names.items():
        if grouped.count(id(p)) != 1:
            raise UsageError(f"{where} has parameter {name} in {'two groups' if id(p) in grouped else 'no group'}: "
                             "each must be in exactly one (docs/your_own_arm.md)")


# Accounting (paper App. A.1, "Compute budget estimation"): pure functions of a ModelConfig, exact integers.

def params_per_block(cfg):
    return 4 * cfg.width ** 2 + 3 * cfg.width * cfg.mlp_hidden


def stored_blocks(cfg, passes=None):
    """Allocated blocks: untied cores are all allocated up front (p + K_final*c + q)."""
    cores = (passes or cfg.passes) if cfg.mode == "untied" else 1
    return cfg.n_prelude + cores * cfg.n_core + cfg.n_coda


def executed_blocks(cfg, passes):
    return cfg.n_prelude + passes * cfg.n_core + cfg.n_coda


def gates_stored(cfg):
    """Boundary gates: one per injection point (after every pass but the last; after the last with coda_inject)."""
    return cfg.passes - 1 + cfg.coda_inject if cfg.boundary_gate and cfg.alpha != 0 else 0


def params_active(cfg, passes):
    """Parameters a forward at `passes` uses, each once: blocks (a tied core once), embedding, lm_head, gates."""
    gates = min(gates_stored(cfg), passes - 1 + cfg.coda_inject)
    return stored_blocks(cfg, passes) * params_per_block(cfg) + 2 * cfg.padded_vocab * cfg.width + gates


def params_tpp(cfg):
    """N for tokens-per-parameter and LR scaling: the parameters in use at the INITIAL pass count (growth arms)."""
    return params_active(cfg, cfg.passes_initial)


def params_compute_active(cfg, passes):
    """Executed block parameters (a tied core counted per pass) plus the padded lm_head; no embedding."""
    return executed_blocks(cfg, passes) * params_per_block(cfg) + cfg.padded_vocab * cfg.width


def matrix_flops_per_token(cfg, passes):
    return 6 * params_compute_active(cfg, passes)


def flops_per_token(cfg, passes):
    # attention: 12 * heads * head_dim * kbar per executed block, kbar = (T+1)/2  ->  6 * C * (T+1), an exact integer
    attention = executed_blocks(cfg, passes) * 6 * cfg.n_head * cfg.head_dim * (cfg.seq_len + 1)
    return matrix_flops_per_token(cfg, passes) + attention


def describe(c):
    """One config's shapes, operator, init and exact counts (model.py's table, the Plan's record)."""
    K0, K = c.passes_initial, c.passes
    return dict(
        arch=c.arch, depth=c.depth, mode=c.mode, n_layer=c.n_prelude + c.n_core + c.n_coda, width=c.width,
        heads=c.n_head, head_dim=c.head_dim, mlp_hidden=c.mlp_hidden, vocab_size=c.vocab_size,
        padded_vocab=c.padded_vocab, seq_len=c.seq_len, prelude=c.n_prelude, core=c.n_core, coda=c.n_coda,
        passes_initial=K0, passes_final=K, alpha=c.alpha, recurrence_norm=c.recurrence_norm, coda_inject=c.coda_inject,
        boundary_gate=c.boundary_gate, scalar_params=gates_stored(c), residual_multiplier=c.residual_multiplier,
        output_multiplier=c.output_multiplier, wte_init_std=c.wte_init_std, uniform_init_scale=c.uniform_init_scale,
        stored_blocks=stored_blocks(c), executed_blocks_initial=executed_blocks(c, K0),
        executed_blocks_final=executed_blocks(c, K), params_per_block=params_per_block(c), params_tpp=params_tpp(c),
        params_stored=params_active(c, K), params_compute_active_initial=params_compute_active(c, K0),
        params_compute_active=params_compute_active(c, K), matrix_flops_per_token_initial=matrix_flops_per_token(c, K0),
        matrix_flops_per_token_final=matrix_flops_per_token(c, K), flops_per_token_initial=flops_per_token(c, K0),
        flops_per_token_final=flops_per_token(c, K))


# Command line (its knob flags are generated from the arms table: arms.add_model_flags)

def config_from_args(args, preset, depth, vocab_size):
    shape = {f.name: getattr(preset, f.name) for f in knob_fields(Preset, "model")}
    try:
        return config_for(args.arch, depth, vocab_size=vocab_size, **shape, **arms.model_overrides(args))
    except ValueError as e:
        raise UsageError(str(e)) from None


def run(argv):
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args, arms.preset_from_args(args), args.depth, args.vocab_size)
    check_arm(cfg)
    info = describe(cfg)
    if args.json:
        return print(json.dumps(info))
    for key, value in info.items():
        print(f"{key:32s} {value:,}" if type(value) is int else f"{key:32s} {value}")


def main(argv=None):
    return cli_main(run, "model.py", argv)


if __name__ == "__main__":
    sys.exit(main())
