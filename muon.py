"""The paper's Muon variant for the block matrices (arXiv 2609.19107, App. A, Table 1; the numerics are the authors'
release), on plain tensors (one process) or on FSDP2's DTensor shards (train.shard_model).

Per matrix G (rows x cols = out x in): EMA momentum with a Nesterov blend, MuonEq-R row normalisation, 5-step
Polar-Express, NorMuon-style second-moment rescaling that keeps the Frobenius norm, LR x sqrt(max(1, rows/cols)),
cautious decoupled weight decay at that same LR. The caller sets every group's "lr" and "momentum" before each step.
A matrix without .grad is stepped with a zero gradient, as the release does for dormant untied cores.

On FSDP2's dim-0 shards each rank holds whole rows: momentum, the blend and MuonEq-R act on the local rows. Each
matrix has one owner, which alone keeps its second moment: one all_to_all hands each owner its matrix's rows, it
orthogonalises the matrix whole, a second all_to_all returns each rank its rows of the update (one process's bits).
"""
import math
import struct
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

# Polar-Express coefficients and Muon constants of the authors' release
POLAR_EXPRESS_COEFFS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))
POLAR_EXPRESS_SAFETY, POLAR_EXPRESS_EPS = 1.02, 1e-6  # X = U / (||U||_F * 1.02 + 1e-6)
ROW_NORM_MIN = 1e-7  # MuonEq-R: row norms clamped >= this
SECOND_MOMENT_BETA2 = 0.95  # NorMuon EMA; used as bf16(0.95) = 0.94921875 like the release's fused kernel
SECOND_MOMENT_MIN = 1e-10  # clamp for S and for the Frobenius-norm denominator
MOMENTUM_START, MOMENTUM_RAMP, MOMENTUM_RAMP_STEPS = 0.85, 0.10, 300  # mu(step) = 0.85 + 0.10 * min(step / 300, 1)


def muon_momentum(step):
    """Muon momentum at 0-indexed optimizer step: 0.85 -> 0.95 linearly over 300 steps (not reset at growth)."""
    return MOMENTUM_START + MOMENTUM_RAMP * min(step / MOMENTUM_RAMP_STEPS, 1.0)


def bf16_scalar(x):
    """x rounded to bf16 (via fp32, to nearest even) as the release's kernel casts scalars; no tensor, no sync."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return struct.unpack("<f", struct.pack("<I", (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000))[0]


def resolve_polar_express_dtype(choice, device):
    """auto | bf16 | fp32 -> the dtype Polar-Express iterates in on `device`; auto: bf16 (the release's) where bf16
    matrix products are native, fp32 where they are emulated (~50x slower). Either way its output is rounded to bf16."""
    if choice != "auto":
        return dict(bf16=torch.bfloat16, fp32=torch.float32)[choice]
    device = torch.device(device)
    native = (torch.cuda.is_bf16_supported(including_emulation=False) if device.type == "cuda" else
              device.type == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()))
    return torch.bfloat16 if native else torch.float32


def polar_express(u, dtype=torch.bfloat16):
    """Approximate orthogonal polar factor of u (..., rows, cols), in bf16: 5 Polar-Express iterations in `dtype`,
    3 GEMMs each (baddbmm adds in the GEMM's accumulator: one rounding to `dtype` instead of three)."""
    x = u.to(dtype).reshape(-1, *u.shape[-2:])  # baddbmm takes a batch of matrices
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * POLAR_EXPRESS_SAFETY + POLAR_EXPRESS_EPS)
    tall = x.size(-2) > x.size(-1)
    for a, b, c in POLAR_EXPRESS_COEFFS:
        gram = x.mT @ x if tall else x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b*gram + c*gram@gram in one GEMM
        x = torch.baddbmm(x, x, poly, beta=a) if tall else torch.baddbmm(x, poly, x, beta=a)  # a*x + x@poly
    return x.bfloat16().reshape(u.shape)


def second_moment_shape(shape):
    """NorMuon keeps one value per row when rows >= cols (mean over the last dim), else one per column."""
    rows, cols = shape[-2], shape[-1]
    return (*shape[:-2], rows, 1) if rows >= cols else (*shape[:-2], 1, cols)


def orthogonalize(blended, second_moment, polar_express_dtype=torch.bfloat16):
    """Muon steps 4-5 on whole matrices: x = Polar-Express, then NorMuon: S <- beta2 S + (1 - beta2) mean(x^2 over the
    reduced axis) in place; returns x / sqrt(max(S, 1e-10)) rescaled to x's Frobenius norm, in bf16."""
    x = polar_express(blended, polar_express_dtype).float()
    reduce_dim = -1 if x.size(-2) >= x.size(-1) else -2
    second_moment.lerp_(x.square().mean(dim=reduce_dim, keepdim=True), 1 - bf16_scalar(SECOND_MOMENT_BETA2))
    scaled = x * second_moment.clamp_min(SECOND_MOMENT_MIN).rsqrt()
    scaled_norm = scaled.norm(dim=(-2, -1), keepdim=True).clamp_min(SECOND_MOMENT_MIN)
    return (scaled * (x.norm(dim=(-2, -1), keepdim=True) / scaled_norm)).bfloat16()


def apply_update(weight, update, lr, weight_decay):
    """Muon step 7 in place: W <- W - lr*update - lr*wd*W*(update*W >= 0), lr and lr*wd rounded to bf16."""
    update = update.to(weight.dtype)
    decay_mask = update * weight >= 0  # cautious: decay only where the step already shrinks |W|, incl. update == 0
    weight.sub_(update * bf16_scalar(lr) + weight * decay_mask * bf16_scalar(lr * weight_decay))


def reset_state(optimizer, params):
    """Fresh state (Muon's or AdamW's: zeros, as never stepped) for those of params the optimizer holds, e.g. what an
    untied growth copied. Call it on every rank with the same params."""
    for p in params:
        state = optimizer.state.get(p, {})
        for key, value in state.items():
            state[key] = value.zero_() if torch.is_tensor(value) else 0
        if isinstance(optimizer, Muon) and p in optimizer.index:
            optimizer.stepped[optimizer.index[p]] = False


def assign_owners(shapes, world_size):
    """Owner rank of each matrix: the largest first, each to the least-loaded rank (the first of equals), so that the
    matrices of one shape, e.g. the cores a step moves, go round the ranks and every rank owns about as much."""
    owners, load = [0] * len(shapes), [0] * world_size
    for i in sorted(range(len(shapes)), key=lambda i: -math.prod(shapes[i])):  # stable: ties in parameter order
        owners[i] = min(range(world_size), key=load.__getitem__)
        load[owners[i]] += math.prod(shapes[i])
    return owners


def rounds(indices, shapes, owners, world):
    """The exchanges of one step: per shape, round k holds every owner's k-th of `indices` -> [[index or None]]."""
    by_shape, out = defaultdict(lambda: defaultdict(list)), []
    for i in indices:
        by_shape[tuple(shapes[i])][owners[i]].append(i)
    for per_owner in by_shape.values():
        for k in range(max(len(v) for v in per_owner.values())):
            out.append([per_owner[r][k] if k < len(per_owner[r]) else None for r in range(world)])
    return out


def local(t):  # a DTensor's local shard (a view: in-place changes reach the parameter), a plain tensor itself
    return t.to_local() if isinstance(t, DTensor) else t


def full(t):  # a DTensor's whole value on every rank (a collective), a plain tensor itself
    return t.full_tensor() if isinstance(t, DTensor) else t


class Muon(torch.optim.Optimizer):
    """The release's Muon variant for 2-D parameters (plain tensors, or FSDP2 DTensors on one mesh); group keys lr,
    weight_decay, momentum. state_dict() holds "state.<param_names[i]>.momentum_buffer" (DCP reshards it),
    "state.<name>.second_moment" (on its owner) and "stepped" (which matrices may have non-zero state)."""

    def __init__(self, params, lr, weight_decay=0.0, momentum=MOMENTUM_START, polar_express_dtype="auto",
                 param_names=None):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum))
        self.params = [p for group in self.param_groups for p in group["params"]]
        self.names = param_names or [str(i) for i in range(len(self.params))]
        p0 = self.params[0]  # FSDP2: the process group of the mesh dimension the DTensors are sharded over
        dims = [d for d, p in enumerate(p0.placements) if p.is_shard()] if isinstance(p0, DTensor) else []
        self.group = p0.device_mesh.get_group(dims[0]) if dims else None
        self.rank, self.world_size = (dist.get_rank(self.group), dist.get_world_size(self.group)) if dims else (0, 1)
        self.polar_express_dtype = resolve_polar_express_dtype(polar_express_dtype, local(p0).device)
        self.index = {p: i for i, p in enumerate(self.params)}
        self.group_of = [group for group in self.param_groups for _ in group["params"]]
        self.owners = assign_owners([p.shape for p in self.params], self.world_size)
        for i, p in enumerate(self.params):  # all state up front: its size is known and state_dict() never allocates
            self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            if self.owners[i] == self.rank:
                self.state[p]["second_moment"] = torch.zeros(second_moment_shape(p.shape), device=local(p).device)
        self.stepped = [False] * len(self.params)  # replicated: True once a matrix's state may be non-zero

    def lr(self, i):  # x sqrt(max(1, rows/cols)): > 1 only for tall matrices (MLP c_gate / c_fc, H x C)
        rows, cols = self.params[i].shape
        return self.group_of[i]["lr"] * math.sqrt(max(1.0, rows / cols))

    @torch.no_grad()
    def step(self):
        params = self.params
        moving = [i for i, p in enumerate(params) if p.grad is not None or self.stepped[i]]  # the same on every rank
        for i in sorted(set(range(len(params))) - set(moving)):  # zero gradient and state: update 0, only the decay
            w = local(params[i])
            w.sub_(w * bf16_scalar(self.lr(i) * self.group_of[i]["weight_decay"]))
        blended = {}
        for i in moving:  # steps 1-3, row by row on the local rows, in the parameter dtype
            p, mu = params[i], self.group_of[i]["momentum"]
            g = local(p.grad) if p.grad is not None else torch.zeros_like(local(p))
            local(self.state[p]["momentum_buffer"]).lerp_(g, 1 - mu)  # momentum: Mb <- mu Mb + (1 - mu) G
            u = g.lerp(local(self.state[p]["momentum_buffer"]), mu)  # Nesterov: U <- (1 - mu) G + mu Mb
            blended[i] = u / u.norm(dim=-1, keepdim=True).clamp_min(ROW_NORM_MIN)  # MuonEq-R
        updates = self._orthogonalized(moving, blended)
        for i in moving:
            apply_update(local(params[i]), updates[i], self.lr(i), self.group_of[i]["weight_decay"])
            self.stepped[i] = self.stepped[i] or params[i].grad is not None

    def _orthogonalized(self, moving, blended):
        """Steps 4-5 on whole matrices -> {index: this rank's rows of the bf16 update}: one process, a batch per
        shape; sharded, per round (rounds()) each owner gathers its matrix's rows and sends each rank its rows back."""
        params, out = self.params, {}
        if self.world_size == 1:
            by_shape = defaultdict(list)
            for i in moving:
                by_shape[id(self.group_of[i]), tuple(params[i].shape)].append(i)
            for batch in by_shape.values():
                second = torch.stack([self.state[params[i]]["second_moment"] for i in batch])
                update = orthogonalize(torch.stack([blended[i] for i in batch]), second, self.polar_express_dtype)
                for i, u, s in zip(batch, update.unbind(), second.unbind()):
                    out[i] = u
                    self.state[params[i]]["second_moment"].copy_(s)
            return out
        n = self.world_size
        for members in rounds(moving, [p.shape for p in params], self.owners, n):
            rows, cols = params[next(i for i in members if i is not None)].shape
            chunk = -(-rows // n)  # FSDP2's dim-0 shard: torch.chunk's, the last ranks' possibly short or empty
            pad = lambda x, rows: F.pad(x, (0, 0, 0, rows - x.shape[0]))  # noqa: E731 (zero rows appended)
            mine = members[self.rank]
            split_in = [chunk * cols if i is not None else 0 for i in members]
            split_out = [chunk * cols if mine is not None else 0] * n
            sends = torch.cat([pad(blended[i], chunk).reshape(-1) for i in members if i is not None])
            received = sends.new_empty(sum(split_out))
            dist.all_to_all_single(received, sends, split_out, split_in, group=self.group)
            back = received
            if mine is not None:
                update = orthogonalize(received.view(n * chunk, cols)[:rows], self.state[params[mine]]["second_moment"],
                                       self.polar_express_dtype)
                back = pad(update.float(), n * chunk).reshape(-1)
            returned = back.new_empty(sum(split_in))
            dist.all_to_all_single(returned, back, split_in, split_out, group=self.group)
            for k, i in enumerate(i for i in members if i is not None):
                rows_here = local(params[i]).shape[0]
                out[i] = returned[k * chunk * cols:(k + 1) * chunk * cols].view(chunk, cols)[:rows_here].bfloat16()
        return out

    def state_dict(self):
        """This rank's state (live tensors) under stable names, the groups' hyperparameters, the stepped flags."""
        groups = [dict({k: v for k, v in group.items() if k != "params"},
                       params=[self.names[self.index[p]] for p in group["params"]]) for group in self.param_groups]
        state_dict = dict(param_groups=groups, stepped=torch.tensor(self.stepped))
        for p, state in self.state.items():
            for key, tensor in state.items():
                state_dict[f"state.{self.names[self.index[p]]}.{key}"] = tensor
        return state_dict

    def load_state_dict(self, state_dict):
        """state_dict()'s layout, e.g. a template filled by dcp.load at any world size."""
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        for p, state in self.state.items():
            for key, tensor in state.items():
                saved = state_dict[f"state.{self.names[self.index[p]]}.{key}"]
                if saved is not tensor:
                    tensor.copy_(saved)
        self.stepped = [bool(s) for s in state_dict["stepped"].tolist()]
