"""The prelude-core-coda transformer family of the paper (all eight arms) with exact parameter and FLOP accounting
 (arXiv 2609.19107, Sec. 3 and App. A.1; the numbers are collected in docs/recipe.md).

One network covers every arm: a prelude of blocks, a core of blocks applied K times (tied 'loop' or untied 'dep'),
and a coda, with the boundary operator h <- RMSNorm(h) + alpha*e between passes and before the coda. A plain stack
('none') is the same code path with no prelude/coda, one pass and no operator. The per-arm numbers live in arms.py.

    python model.py --arch untied_grow --depth 8 --json      # shapes, parameter counts, FLOPs per token
    python model.py --arch loop_2 --depth 2 --preset cpu --vocab-size 257   # a small CPU shape
"""
import json
import math
import os
import pickle
import sys
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import arms
import muon
from arms import ARMS, BOUNDARY_ABLATIONS, PRESETS, knob_fields
from cli import Parser, UsageError, cli_main, sha256_file

VOCAB_MULTIPLE = 64      # wte/lm_head rows are padded up to this; logits are sliced back to vocab_size
ROPE_BASE = 10_000
ROPE_TABLE_FACTOR = 10   # rotary tables cover 10 * seq_len positions (as the release does)
GPT2_VOCAB = 50257


@dataclass
class ModelConfig:
    arch: str
    depth: int
    width: int
    n_head: int
    head_dim: int
    mlp_hidden: int
    vocab_size: int          # the REAL vocab (50257 for GPT-2, 257 for the byte tokenizer)
    seq_len: int
    mode: str                # 'none' (plain stack) | 'loop' (tied core) | 'dep' (untied cores)
    n_prelude: int
    n_core: int
    n_coda: int
    passes: int              # final K
    passes_initial: int      # K before growth (== passes when there is no growth)
    alpha: float             # injection scale of the prelude output e at the boundary
    recurrence_norm: bool    # RMSNorm the state after every core pass
    coda_inject: bool        # also inject alpha*e after the last pass (before the coda)
    residual_multiplier: float
    output_multiplier: float
    wte_init_std: float
    uniform_init_scale: float
    mlp_multiple: int = 256

    def __post_init__(self):
        problems = []
        if self.mode not in ("none", "loop", "dep"):
            problems.append(f"mode must be none|loop|dep, got {self.mode!r}")
        if self.width != self.n_head * self.head_dim:
            problems.append(f"width {self.width} != n_head {self.n_head} * head_dim {self.head_dim}")
        if self.head_dim % 2:
            problems.append(f"head_dim must be even for RoPE, got {self.head_dim}")
        if min(self.n_prelude, self.n_coda) < 0 or self.n_core < 1:
            problems.append(f"need prelude >= 0, core >= 1, coda >= 0; got {self.n_prelude}/{self.n_core}/{self.n_coda}")
        if not 1 <= self.passes_initial <= self.passes:
            problems.append(f"need 1 <= passes_initial <= passes, got {self.passes_initial} and {self.passes}")
        if self.mode == "none" and (self.passes != 1 or self.n_prelude or self.n_coda or self.alpha or self.recurrence_norm):
            problems.append("a plain stack (mode none) has one pass, no prelude/coda and no boundary operator")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def padded_vocab(self):
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


# ----------------------------------------------------------------------------------------------------------------------
# Memory per rank: bytes, pure functions of a ModelConfig, for train.py's micro-batch planner and --dry-run.
# Activations are what eager autograd saves in this model's forward (tests/test_memory.py measures it on CPU with
# saved_tensors_hooks); torch.compile saves less (it recomputes pointwise ops), so the eager numbers are an upper
# bound for the compiled model. Every formula below names the tensors it counts.

GIB = 2 ** 30
LOSS_CHUNK_ROWS = 4096                 # rows of the (rows, vocab) fp32 logits alive at once in the chunked loss
ZERO2_BUCKET_BYTES = 256 * 2 ** 20     # one gradient bucket in flight in the owner-sharded (ZeRO-2) transport
MEMORY_MARGIN_BYTES = 3 * GIB          # CUDA context, cuBLAS/NCCL workspaces, compile autotuning
MEMORY_MARGIN_FRACTION = 0.10          # caching-allocator fragmentation, on top of the tracked peak


def embedding_dtype(device):
    """The release keeps the embedding table, and so its AdamW moments, in bf16 on CUDA; fp32 elsewhere."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


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
    chunked (GPT.loss): saved = final RMSNorm input 4C + rstd 4 and d(loss)/dx eC per token, d(loss)/d(lm_head)
    fp32 4*Vp*C; transient = the normed input 4C per token, the lm_head cast (2*Vp*C under autocast), one chunk's
    d(lm_head) product e*Vp*C, and per chunk row the logits (2Vp bf16 + 4V fp32 under autocast, 4Vp in fp32; the
    probabilities overwrite them) and the row's input cast and gradient (2eC).
    unchunked (F.cross_entropy on decode()): saved = final norm 4C + 4, lm_head input eC (its cast, or in fp32 the
    normed output), fp32 log-softmax 4V and int64 targets 8 per token; backward holds two more fp32 (tokens, V)."""
    C, V, Vp = cfg.width, cfg.vocab_size, cfg.padded_vocab
    tokens = micro_batch * cfg.seq_len
    e = 2 if autocast else 4
    if chunked:
        saved = tokens * (4 * C + 4 + e * C) + 4 * Vp * C
        rows = min(LOSS_CHUNK_ROWS, tokens)
        logits_row = 2 * Vp + 4 * V if autocast else 4 * Vp  # e-byte lm_head output, its fp32 slice (same in fp32)
        transient = tokens * 4 * C + (2 * Vp * C if autocast else 0) + e * Vp * C + rows * (logits_row + 2 * e * C)
        return saved, saved + transient
    saved = tokens * (4 * C + 4 + e * C + 4 * V + 8)
    return saved, saved + 2 * tokens * 4 * V


def weight_copy_bytes(cfg, passes, autocast=True):
    """bf16 copies of the executed block matrices that autocast caches in the forward and the backward keeps (a tied
    core is cast once; dormant untied cores are not executed). The lm_head cast is the loss path's."""
    return 2 * stored_blocks(cfg, passes) * params_per_block(cfg) if autocast else 0


def persistent_bytes(cfg, world_size=1, zero2=False, device="cuda"):
    """Parameters, gradients and optimizer state per rank, and the largest owned same-shape group Muon stacks.
    Parameters: all stored blocks and lm_head fp32, the embedding in embedding_dtype(device), the rotary tables fp32.
    Gradients: zero2=False every rank holds every gradient (dormant untied cores get explicit zeros); zero2=True
    only the matrices it owns plus one bucket in flight, and the AdamW gradients in full. Muon: momentum fp32 and the
    NorMuon second moment for owned matrices (muon_owner_loads); AdamW: exp_avg and exp_avg_sq, replicated, in the
    parameter dtype."""
    C, Vp = cfg.width, cfg.padded_vocab
    emb = Vp * C * (2 if embedding_dtype(device) == torch.bfloat16 else 4)
    matrices = stored_blocks(cfg) * params_per_block(cfg)
    owned = max(muon_owner_loads(block_matrix_shapes(cfg), world_size), key=lambda o: sum(r * c for r, c in o))
    owned_numel = sum(r * c for r, c in owned)
    groups = {}
    for shape in owned:
        groups[shape] = groups.get(shape, 0) + shape[0] * shape[1]
    rotary = 2 * ROPE_TABLE_FACTOR * cfg.seq_len * (cfg.head_dim // 2) * 4
    matrix_grads = 4 * (owned_numel if zero2 else matrices) + (ZERO2_BUCKET_BYTES if zero2 else 0)
    return dict(
        parameters=4 * (matrices + Vp * C) + emb + rotary,
        gradients=matrix_grads + 4 * Vp * C + emb,
        muon_state=4 * sum(muon_state_numel(s) for s in owned),
        adamw_state=2 * (4 * Vp * C + emb),
        # Muon.step stacks one shape group (weights, grads, momentum and ~5 fp32-sized temporaries)
        optimizer_step=8 * 4 * max(groups.values(), default=0),
    )


def memory_per_rank(cfg, passes, micro_batch, world_size=1, zero2=False, device="cuda"):
    """Predicted bytes per rank of one training step at `passes` with micro-batches of `micro_batch` sequences (bf16
    autocast on CUDA, fp32 elsewhere, as train.py runs). 'peak' is what torch.cuda.max_memory_allocated should
    report; 'required' adds the margin. The step's peak is the larger of two moments: the end of the forward / start
    of the backward (weight copies, all activations, the loss path, and the larger of the loss transient and a
    backward working set of one block's activations plus two fp32 residual-stream gradients), and the Muon step."""
    autocast = torch.device(device).type == "cuda"
    parts = persistent_bytes(cfg, world_size, zero2, device)
    optimizer_step = parts.pop("optimizer_step")
    static = sum(parts.values())
    loss_saved, loss_peak = loss_path_bytes(cfg, micro_batch, autocast)
    tokens = micro_batch * cfg.seq_len
    backward_working = tokens * (block_activation_bytes_per_token(cfg, autocast) + 2 * 4 * cfg.width)
    parts.update(weight_copies=weight_copy_bytes(cfg, passes, autocast),
                 activations=activation_bytes(cfg, passes, micro_batch, autocast), loss_path=loss_saved,
                 step_transient=max(loss_peak - loss_saved, backward_working), optimizer_step=optimizer_step)
    training = parts["weight_copies"] + parts["activations"] + loss_saved + parts["step_transient"]
    peak = static + max(training, optimizer_step)
    margin = MEMORY_MARGIN_BYTES + round(MEMORY_MARGIN_FRACTION * peak)
    return dict(parts, peak=peak, margin=margin, required=peak + margin)


@dataclass
class StageMemory:
    passes: int
    executed_blocks: int
    micro_batch: int
    bytes: dict          # memory_per_rank at this micro-batch: the components, peak, margin, required


@dataclass
class MemoryPlan:
    gpu_memory_gib: float
    world_size: int
    zero2: bool
    stages: list         # one StageMemory per pass stage, in training order


def plan_memory(cfg, pass_stages, rank_sequences, gpu_memory_gib, world_size=1, zero2=False, device_batch=None,
                device="cuda"):
    """Micro-batch per pass stage: the largest divisor of rank_sequences (sequences per rank per optimizer step)
    whose required bytes fit in gpu_memory_gib, so it may drop at growth. Data-constrained runs pass their K: the
    executed depth p + K*c + q is what costs memory. device_batch (one int, or one per stage) is checked instead of
    chosen: one that does not divide or does not fit raises ValueError naming the largest that fits."""
    capacity = gpu_memory_gib * GIB
    divisors = [b for b in range(rank_sequences, 0, -1) if rank_sequences % b == 0]
    explicit = [device_batch] * len(pass_stages) if isinstance(device_batch, int) else device_batch
    if explicit is not None and len(explicit) != len(pass_stages):
        raise ValueError(f"device_batch needs one value per pass stage {list(pass_stages)}, got {list(explicit)}")
    stages = []
    for i, passes in enumerate(pass_stages):
        def need(b):
            return memory_per_rank(cfg, passes, b, world_size, zero2, device)
        fitting = next((b for b in divisors if need(b)["required"] <= capacity), None)
        where = f"{cfg.arch} d{cfg.depth} at K={passes} ({executed_blocks(cfg, passes)} executed blocks)"
        if explicit is None and fitting is None:
            raise ValueError(f"{where} does not fit {gpu_memory_gib:g} GiB per GPU even at micro-batch 1 (needs "
                             f"{need(1)['required'] / GIB:.1f} GiB); use more GPUs or the owner-sharded transport")
        choice = fitting if explicit is None else explicit[i]
        if explicit is not None:
            if not isinstance(choice, int) or choice < 1 or rank_sequences % choice:
                raise ValueError(f"micro-batch {choice!r} does not divide the {rank_sequences} sequences per rank")
            if need(choice)["required"] > capacity:
                largest = f"the largest that fits is {fitting}" if fitting else "none fits, not even 1"
                raise ValueError(f"micro-batch {choice} needs {need(choice)['required'] / GIB:.1f} GiB per GPU for "
                                 f"{where}, more than {gpu_memory_gib:g} GiB; {largest}")
        stages.append(StageMemory(passes, executed_blocks(cfg, passes), choice, need(choice)))
    return MemoryPlan(gpu_memory_gib, world_size, zero2, stages)


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over targets != -1 of logits = (x @ weight.T)[:, :vocab].float() * multiplier, i.e.
    F.cross_entropy(decode(h), targets, ignore_index=-1), without a (rows, vocab) fp32 tensor kept for backward:
    rows are processed chunk_rows at a time and each chunk's gradients for x and weight are formed right away, so
    backward only scales them. Same FLOPs as the unchunked path; the matmuls run in autocast's dtype if it is on."""

    @staticmethod
    def forward(ctx, x, weight, targets, vocab_size, multiplier, chunk_rows):
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        need_x, need_w = ctx.needs_input_grad[:2]
        valid = targets != -1
        count = valid.sum()
        safe_targets = targets.clamp(min=0)
        with torch.autocast(device, enabled=False):
            w = weight.to(dtype)
            grad_x = torch.empty(x.shape, dtype=dtype, device=x.device) if need_x else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if need_w else None
            total = torch.zeros((), dtype=torch.float32, device=x.device)
            for start in range(0, x.size(0), chunk_rows):
                rows = slice(start, start + chunk_rows)
                xs, t, ok = x[rows].to(dtype), safe_targets[rows, None], valid[rows, None]
                logits = (xs @ w.T)[:, :vocab_size].float().mul_(multiplier)
                lse = torch.logsumexp(logits, dim=-1, keepdim=True)
                total += ((lse - logits.gather(1, t)) * ok).sum()
                if need_x or need_w:  # d(mean CE)/d(logits) = (softmax - onehot) / count, then through * multiplier
                    grad = logits.sub_(lse).exp_().scatter_add_(1, t, -ok.float()).mul_(ok * (multiplier / count))
                    grad = grad.to(dtype)
                    if need_x:
                        grad_x[rows] = grad @ w[:vocab_size]
                    if need_w:
                        grad_w[:vocab_size] += grad.T @ xs
        ctx.save_for_backward(grad_x, grad_w)
        ctx.dtypes = (x.dtype, weight.dtype)
        return total / count

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        dx = None if grad_x is None else grad_x.to(x_dtype) * grad_loss
        dw = None if grad_w is None else (grad_w * grad_loss).to(w_dtype)
        return dx, dw, None, None, None, None


# ----------------------------------------------------------------------------------------------------------------------
# The network

def norm(x):
    """Parameter-free RMSNorm over the last dim with F.rms_norm's default eps (machine epsilon of x's dtype)."""
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary(x, cos, sin):
    """RoPE with half-split pairing (dim j with j + head_dim/2), rotation by -theta as in the release:
    y1 = x1 cos + x2 sin, y2 = -x1 sin + x2 cos. x: (B, T, heads, head_dim); cos/sin: (T or B, T, head_dim/2)."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.c_q = nn.Linear(cfg.width, cfg.width, bias=False)
        self.c_k = nn.Linear(cfg.width, cfg.width, bias=False)
        self.c_v = nn.Linear(cfg.width, cfg.width, bias=False)
        self.c_proj = nn.Linear(cfg.width, cfg.width, bias=False)

    def forward(self, x, cos, sin, attn_mask=None):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim)
        q, k = norm(apply_rotary(q, cos, sin)), norm(apply_rotary(k, cos, sin))  # QK-norm after RoPE
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=attn_mask, is_causal=attn_mask is None)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_gate = nn.Linear(cfg.width, cfg.mlp_hidden, bias=False)
        self.c_fc = nn.Linear(cfg.width, cfg.mlp_hidden, bias=False)
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
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.padded_vocab, cfg.width),
            h=nn.ModuleList(Block(cfg) for _ in range(stored_blocks(cfg))),
        ))
        self.lm_head = nn.Linear(cfg.width, cfg.padded_vocab, bias=False)
        half = cfg.head_dim // 2
        inv_freq = ROPE_BASE ** (-torch.arange(half, dtype=torch.float32) * 2 / cfg.head_dim)
        angles = torch.outer(torch.arange(ROPE_TABLE_FACTOR * cfg.seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)  # checkpoints hold parameters only
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.active_passes = cfg.passes_initial
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """Paper App. A.1 (docs/recipe.md, "Init"): every out-projection and lm_head zero (initial logits are exactly
        0), in-projections Uniform(-s, s) with s = uniform_init_scale / sqrt(C), embedding Normal(0, wte_init_std^2)."""
        s = self.cfg.uniform_init_scale / math.sqrt(self.cfg.width)
        for block in self.transformer.h:
            for linear in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_gate, block.mlp.c_fc):
                linear.weight.uniform_(-s, s)
            block.attn.c_proj.weight.zero_()
            block.mlp.c_proj.weight.zero_()
        self.transformer.wte.weight.normal_(0.0, self.cfg.wte_init_std)
        self.lm_head.weight.zero_()

    # block layout in transformer.h: prelude, core_1 .. core_K (dep) or the one core (loop), coda
    def prelude_blocks(self):
        return self.transformer.h[:self.cfg.n_prelude]

    def core_blocks(self, pass_index):
        start = self.cfg.n_prelude + (pass_index * self.cfg.n_core if self.cfg.mode == "dep" else 0)
        return self.transformer.h[start:start + self.cfg.n_core]

    def coda_blocks(self):
        return self.transformer.h[len(self.transformer.h) - self.cfg.n_coda:]

    def check_passes(self, k):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"passes must be an integer >= 1, got {k!r}")
        if self.cfg.mode == "none" and k != 1:
            raise ValueError("a plain stack runs exactly one pass")
        if self.cfg.mode == "dep" and k > self.cfg.passes:
            raise ValueError(f"an untied model can run at most its {self.cfg.passes} allocated cores, got passes={k}")

    def set_passes(self, k):
        self.check_passes(k)
        self.active_passes = k

    @torch.no_grad()
    def grow(self, new_passes):
        """Raise the pass count. Untied: new core j <- copy of core (j mod old) (stacking: C1 C2 -> C1 C2 C1 C2);
        returns the overwritten parameters so the caller can reset their optimizer state. Tied: returns []."""
        old = self.active_passes
        self.check_passes(new_passes)
        if new_passes <= old:
            raise ValueError(f"grow needs more passes than the active {old}, got {new_passes}")
        overwritten = []
        if self.cfg.mode == "dep":
            for j in range(old, new_passes):
                for dst_block, src_block in zip(self.core_blocks(j), self.core_blocks(j % old)):
                    for dst, src in zip(dst_block.parameters(), src_block.parameters()):
                        dst.copy_(src)
                        overwritten.append(dst)
        self.active_passes = new_passes
        return overwritten

    def param_groups(self):
        return dict(matrix=list(self.transformer.h.parameters()), embedding=[self.transformer.wte.weight],
                    unembedding=[self.lm_head.weight])

    def decode(self, h):
        """Final RMSNorm -> lm_head -> slice to the real vocab -> fp32 -> x output multiplier (also the logit lens)."""
        logits = self.lm_head(norm(h))[..., :self.cfg.vocab_size]
        return logits.float() * self.cfg.output_multiplier

    def forward(self, idx, targets=None, passes=None, return_hidden=False):
        hidden = [] if return_hidden else None
        h = self.residual_stream(idx, passes, hidden=hidden)
        out = self.decode(h) if targets is None else self.loss(h, targets)
        return (out, hidden) if return_hidden else out

    def to_device(self, device):
        """self.to(device) with the embedding table in embedding_dtype(device): bf16 on CUDA as the release keeps it
        (torch.optim.AdamW then keeps its moments in bf16 too), fp32 on CPU; every other parameter stays fp32."""
        self.to(device)
        self.transformer.wte.to(embedding_dtype(device))
        return self

    def loss(self, h, targets):
        """F.cross_entropy(decode(h), targets, ignore_index=-1), computed in chunks of rows (ChunkedCrossEntropy)."""
        return ChunkedCrossEntropy.apply(norm(h).flatten(0, 1), self.lm_head.weight, targets.reshape(-1),
                                         self.cfg.vocab_size, self.cfg.output_multiplier, LOSS_CHUNK_ROWS)

    def residual_stream(self, idx, passes=None, positions=None, attn_mask=None, hidden=None):
        """The final residual stream (B, T, C) that decode() turns into logits. positions (B, T): rotary positions
        (default 0..T-1); attn_mask (B, 1, T, T) bool, True = may attend (default causal); hidden: a list that
        collects the embedding and every executed block's output (the logit lens)."""
        cfg = self.cfg
        K = self.active_passes if passes is None else passes
        if passes is not None:
            self.check_passes(K)
        T = idx.size(1)
        cos, sin = (self.rope_cos[:T], self.rope_sin[:T]) if positions is None else \
            (self.rope_cos[positions], self.rope_sin[positions])

        def run(blocks, x):
            for block in blocks:
                x = block(x, cos, sin, attn_mask)
                if hidden is not None:
                    hidden.append(x)
            return x

        x = norm(self.transformer.wte(idx)).float()
        if hidden is not None:
            hidden.append(x)
        x = run(self.prelude_blocks(), x)
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
                x = x + cfg.alpha * e
        return run(self.coda_blocks(), x)


def split_depth(d):
    """Prelude/core/coda split of every paper script: d//3 each, remainder to the core first, then the coda."""
    base, rem = divmod(d, 3)
    return base, base + (rem >= 1), base + (rem >= 2)


def config_for(arch, depth, *, vocab_size=GPT2_VOCAB, prelude=None, coda=None, boundary="full", **overrides):
    """The ModelConfig of arm `arch` at depth coordinate d. Shape keywords (width_per_depth, head_dim, seq_len,
    mlp_multiple) default to the paper preset's; any other keyword overrides one of the arm's "model" knobs.

    prelude/coda fix those stages (core = depth - prelude - coda, paper Fig. 15a); boundary ablates the operator:
    norm_only drops the injection (alpha = 0), inject_only drops the recurrence norm, none drops both.
    """
    if arch not in ARMS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARMS)}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
    if boundary not in BOUNDARY_ABLATIONS:
        raise ValueError(f"boundary must be one of {'|'.join(BOUNDARY_ABLATIONS)}, got {boundary!r}")
    paper = PRESETS["paper"]
    sizes = {f.name: overrides.pop(f.name, getattr(paper, f.name)) for f in knob_fields(arms.Preset, "model")}
    sizes["vocab_size"] = vocab_size
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    unknown = set(overrides) - {f.name for f in knob_fields(arms.Arm, "model")}
    if unknown:
        raise ValueError(f"unknown override(s) {', '.join(sorted(unknown))}")
    arm = replace(ARMS[arch], **overrides)
    alpha, coda_inject, recurrence_norm = arm.alpha, arm.coda_inject, arm.recurrence_norm
    if boundary in ("norm_only", "none"):
        alpha, coda_inject = 0.0, False
    if boundary in ("inject_only", "none"):
        recurrence_norm = False

    width_per_depth, head_dim, mlp_multiple = sizes["width_per_depth"], sizes["head_dim"], sizes["mlp_multiple"]
    width = width_per_depth * depth
    if width % head_dim:
        raise ValueError(f"width {width} (= {width_per_depth} * depth {depth}) is not a multiple of head_dim {head_dim}")
    mlp_hidden = -(-(8 * width // 3) // mlp_multiple) * mlp_multiple
    p, c, q = split_depth(depth)
    if arm.mode == "none":
        if prelude is not None or coda is not None:
            raise ValueError(f"{arch} is a plain stack: --prelude/--coda do not apply")
        p, c, q = 0, depth + (c if arm.deep else 0), 0
    elif prelude is not None or coda is not None:
        p = p if prelude is None else prelude
        q = q if coda is None else coda
        c = depth - p - q
        if p < 0 or q < 0 or c < 1:
            raise ValueError(f"impossible split at depth {depth}: prelude {p} + coda {q} leaves core {c} (< 1)")
    final = arm.passes
    initial = final if arm.passes_initial is None else arm.passes_initial  # growth arms keep their low K
    if arm.mode == "none" and final != 1:
        raise ValueError(f"{arch} is a plain stack: passes must be 1, got {final}")
    if final < 1 or not 1 <= initial <= final:
        raise ValueError(f"need 1 <= passes_initial <= passes, got passes_initial {initial} and passes {final}")
    return ModelConfig(arch=arch, depth=depth, width=width, n_head=width // head_dim, head_dim=head_dim,
                       mlp_hidden=mlp_hidden, vocab_size=vocab_size, seq_len=sizes["seq_len"], mode=arm.mode,
                       n_prelude=p, n_core=c, n_coda=q, passes=final, passes_initial=initial, alpha=alpha,
                       recurrence_norm=recurrence_norm, coda_inject=coda_inject,
                       residual_multiplier=arm.residual_multiplier, output_multiplier=arm.output_multiplier,
                       wte_init_std=arm.wte_init_std, uniform_init_scale=arm.uniform_init_scale,
                       mlp_multiple=mlp_multiple)


# ----------------------------------------------------------------------------------------------------------------------
# Accounting (paper App. A.1, "Compute budget estimation"): pure functions of a ModelConfig, exact integers.

def params_per_block(cfg):
    return 4 * cfg.width ** 2 + 3 * cfg.width * cfg.mlp_hidden


def stored_blocks(cfg, passes=None):
    """Allocated blocks: untied cores are all allocated up front (dep = p + K_final*c + q)."""
    cores = (cfg.passes if passes is None else passes) if cfg.mode == "dep" else 1
    return cfg.n_prelude + cores * cfg.n_core + cfg.n_coda


def executed_blocks(cfg, passes):
    return cfg.n_prelude + passes * cfg.n_core + cfg.n_coda


def params_stored(cfg):
    return stored_blocks(cfg) * params_per_block(cfg) + 2 * cfg.padded_vocab * cfg.width


def params_tpp(cfg):
    """N for tokens-per-parameter and LR scaling: the stored count at the INITIAL pass count (growth arms)."""
    return stored_blocks(cfg, cfg.passes_initial) * params_per_block(cfg) + 2 * cfg.padded_vocab * cfg.width


def params_compute_active(cfg, passes):
    """Executed block parameters (a tied core counted per pass) plus the padded lm_head; no embedding."""
    return executed_blocks(cfg, passes) * params_per_block(cfg) + cfg.padded_vocab * cfg.width


def matrix_flops_per_token(cfg, passes):
    return 6 * params_compute_active(cfg, passes)


def flops_per_token(cfg, passes):
    # attention: 12 * heads * head_dim * kbar per executed block, kbar = (T+1)/2  ->  6 * C * (T+1), an exact integer
    attention = executed_blocks(cfg, passes) * 6 * cfg.n_head * cfg.head_dim * (cfg.seq_len + 1)
    return matrix_flops_per_token(cfg, passes) + attention


def describe(cfg):
    K0, K = cfg.passes_initial, cfg.passes
    return dict(
        arch=cfg.arch, depth=cfg.depth, mode=cfg.mode, n_layer=cfg.n_prelude + cfg.n_core + cfg.n_coda,
        width=cfg.width, heads=cfg.n_head, head_dim=cfg.head_dim, mlp_hidden=cfg.mlp_hidden,
        vocab_size=cfg.vocab_size, padded_vocab=cfg.padded_vocab, seq_len=cfg.seq_len,
        prelude=cfg.n_prelude, core=cfg.n_core, coda=cfg.n_coda, passes_initial=K0, passes_final=K,
        alpha=cfg.alpha, recurrence_norm=cfg.recurrence_norm, coda_inject=cfg.coda_inject,
        residual_multiplier=cfg.residual_multiplier, output_multiplier=cfg.output_multiplier,
        wte_init_std=cfg.wte_init_std, uniform_init_scale=cfg.uniform_init_scale,
        stored_blocks=stored_blocks(cfg), executed_blocks_initial=executed_blocks(cfg, K0),
        executed_blocks_final=executed_blocks(cfg, K), params_per_block=params_per_block(cfg),
        params_tpp=params_tpp(cfg), params_stored=params_stored(cfg),
        params_compute_active_initial=params_compute_active(cfg, K0), params_compute_active=params_compute_active(cfg, K),
        matrix_flops_per_token_initial=matrix_flops_per_token(cfg, K0),
        matrix_flops_per_token_final=matrix_flops_per_token(cfg, K),
        flops_per_token_initial=flops_per_token(cfg, K0), flops_per_token_final=flops_per_token(cfg, K),
    )


# ----------------------------------------------------------------------------------------------------------------------
# Devices and checkpoints (train.py and core_eval.py)

def setup_distributed(device_flag="auto"):
    """-> (rank, world size, device) from the torchrun environment: NCCL on CUDA, gloo on CPU, none for one process."""
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


def cli_main_distributed(run, prog, argv=None):
    """cli.cli_main for a script that may join a torchrun process group; the group is left on the way out."""
    try:
        return cli_main(run, prog, argv)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def autocast(device):
    """bf16 autocast on CUDA; plain fp32 on CPU."""
    return torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


CHECKPOINT_MANIFEST = "MANIFEST.json"  # {"files": {relative path: {"size", "sha256"}}}, written last by train.py
CHECKPOINT_WEIGHTS = "model.pt"  # model_config, passes, tokenizer, step and the fp32 weights: all core_eval reads


def verify_checkpoint(folder, only=None, share=(0, 1)):
    """Raise ValueError unless `folder` holds a complete train.py checkpoint: a manifest whose sizes and sha256 match
    every listed file (or only the listed file `only`; or, share=(rank, world), that rank's share of the files).
    A missing manifest means the save never finished."""
    manifest_path = os.path.join(folder, CHECKPOINT_MANIFEST)
    try:
        with open(manifest_path) as f:
            files = json.load(f)["files"]
    except FileNotFoundError:
        raise ValueError(f"checkpoint {folder} is incomplete (no {CHECKPOINT_MANIFEST}: its save did not finish)") \
            from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint {folder} has an unreadable {CHECKPOINT_MANIFEST} ({exc})") from None
    if not isinstance(files, dict) or not all(isinstance(w, dict) and {"size", "sha256"} <= w.keys()
                                              for w in files.values()):
        raise ValueError(f"checkpoint {folder} has an unreadable {CHECKPOINT_MANIFEST} (not a train.py manifest)")
    if only is not None and only not in files:
        raise ValueError(f"checkpoint {folder} is corrupted: its manifest does not list {only}")
    for rel, want in sorted(files.items())[share[0]::share[1]]:
        if only is not None and rel != only:
            continue
        path = os.path.join(folder, rel)
        size = os.path.getsize(path) if os.path.isfile(path) else None
        if size != want["size"]:
            raise ValueError(f"checkpoint {folder} is truncated or corrupted: {rel} has "
                             f"{'no file' if size is None else f'{size} bytes'}, the manifest says {want['size']}")
        if sha256_file(path) != want["sha256"]:
            raise ValueError(f"checkpoint {folder} is corrupted: {rel} does not match its sha256 in the manifest")


def checkpoint_weights_path(path):
    """The weights file to read for `path`: a checkpoint folder (its model.pt, after the manifest check), its
    model.pt, or an old single-file checkpoint (latest.pt/final.pt). A run folder or checkpoints/ is named as such."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, CHECKPOINT_WEIGHTS)):
            verify_checkpoint(path, only=CHECKPOINT_WEIGHTS)
            return os.path.join(path, CHECKPOINT_WEIGHTS)
        inner = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
        found = [os.path.join(inner, n) for n in ("final", "latest", "final.pt", "latest.pt")
                 if os.path.exists(os.path.join(inner, n))]
        what = "a run folder" if inner != path else "a folder of checkpoints" if found else "not a checkpoint folder"
        hint = f"pass {found[0]}" if found else "pass a checkpoint folder such as runs/NAME/checkpoints/final"
        raise ValueError(f"checkpoint {path} is {what} (no {CHECKPOINT_WEIGHTS}); {hint}")
    if not os.path.exists(path):
        raise ValueError(f"checkpoint {path} does not exist")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path) == CHECKPOINT_WEIGHTS and os.path.exists(os.path.join(folder, CHECKPOINT_MANIFEST)):
        verify_checkpoint(folder, only=CHECKPOINT_WEIGHTS)
    return path


def load_checkpoint_model(path, device="cpu"):
    """Rebuild a GPT from a train.py checkpoint -> (model in eval mode, its dict: model_config, passes, tokenizer,
    step, model). Reads only the weights (never optimizer state) with torch.load(weights_only=True): a pickle that
    would construct anything but tensors and plain types is rejected before it runs."""
    weights = checkpoint_weights_path(path)
    try:
        ckpt = torch.load(weights, map_location="cpu", weights_only=True)
        model = GPT(ModelConfig(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
        model.set_passes(int(ckpt["passes"]))
    except pickle.UnpicklingError:
        raise ValueError(f"checkpoint {weights} is not a usable model checkpoint: it is unreadable or holds objects "
                         "other than tensors and plain types (refused without running it)") from None
    except Exception as exc:  # truncation, missing keys, shape mismatch: all mean "not a usable checkpoint"
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"checkpoint {weights} is not a usable model checkpoint: {message}") from None
    return model.to(device).eval(), ckpt


# ----------------------------------------------------------------------------------------------------------------------
# Command line (its knob flags are generated from the arms table: arms.add_model_flags)

def config_from_args(args, preset, depth, vocab_size):
    shape = {f.name: getattr(preset, f.name) for f in knob_fields(arms.Preset, "model")}
    try:
        return config_for(args.arch, depth, vocab_size=vocab_size, **shape, **arms.model_overrides(args))
    except ValueError as e:
        raise UsageError(str(e)) from None


def build_parser():
    ap = Parser(prog="model.py", description="Shapes, parameter counts and FLOPs of one arm.")
    ap.add_argument("--arch", help=f"one of {', '.join(ARMS)}")
    ap.add_argument("--depth", type=int, help="depth coordinate d (width = width_per_depth * d)")
    ap.add_argument("--preset", choices=list(PRESETS), default="paper", help="shapes (default paper)")
    ap.add_argument("--vocab-size", type=int, default=GPT2_VOCAB, help="the tokenizer's (GPT-2: 50257, bytes: 257)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    arms.add_model_flags(ap)
    return ap


def run(argv):
    args = build_parser().parse_args(argv)
    if args.arch is None or args.depth is None:
        raise UsageError("--arch and --depth are required")
    info = describe(config_from_args(args, arms.preset_from_args(args), args.depth, args.vocab_size))
    if args.json:
        print(json.dumps(info))
        return
    for key, value in info.items():
        print(f"{key:32s} {value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{key:32s} {value}")


def main(argv=None):
    return cli_main(run, "model.py", argv)


if __name__ == "__main__":
    sys.exit(main())
