"""The paper's Muon variant for the block matrices (arXiv 2609.19107, App. A, Table 1; the numerics are the authors'
release), on plain tensors (one process) or on FSDP2's DTensor shards (train.shard_model).

Muon, per matrix G (rows x cols = out x in): EMA momentum with a Nesterov blend, MuonEq-R row normalisation,
5-step Polar-Express, NorMuon-style second-moment rescaling that keeps the Frobenius norm,
LR x sqrt(max(1, rows/cols)), cautious decoupled weight decay at that same LR. The embedding and lm_head use
torch.optim.AdamW, whose math is exactly the release's (tests/test_muon.py checks it against the formula).

Before each step the caller sets every group's "lr" (base LR x schedule multiplier) and "momentum" (muon_momentum):

    opt = Muon(matrix_params, lr=0.02, weight_decay=0.1)
    for group in opt.param_groups:
        group["lr"], group["momentum"] = 0.02 * lr_multiplier, muon_momentum(step)
    opt.step()

A matrix without .grad at step() is stepped with a zero gradient, as the release does for dormant untied cores (it
injects explicit zeros): its momentum and second moment decay, and cautious weight decay shrinks it (update 0 counts
as agreeing in sign). Callers never need to create zero gradients.

Polar-Express precision (polar_express_dtype): "bf16" (the release), "fp32", or "auto" = bf16 where the parameters'
device multiplies bf16 natively (CUDA with bf16 support; CPUs with AVX512-BF16 or AMX-BF16), fp32 elsewhere, where
bf16 GEMMs are emulated and ~50x slower. Either way the iteration's output is rounded to bf16 and everything after
it (NorMuon, the bf16 scalars) is the release's. The two paths differ by about the bf16 iteration's own spread.

On FSDP2 shards (parameters that are DTensors sharded on dim 0 over the mesh's "shard" dimension, replicated over
"replicate" across nodes): FSDP2 has already averaged the gradients, and each rank holds whole rows of every matrix.
- Momentum buffers live on the local shard (DTensors like their parameters), and the momentum, the Nesterov blend and
  MuonEq-R's row normalisation act on the local rows only: no communication.
- Every matrix has one owner in the shard group (assign_owners: per shape round-robin, balanced by size, fixed for
  the optimizer's life), which alone keeps its NorMuon second moment. Per shape, the k-th moving matrix of every
  owner travels together: one all_to_all hands each owner the blended rows of its matrix from every rank, the owner
  runs Polar-Express and NorMuon on the whole matrix, and a second all_to_all returns each rank its rows of the update.
  Cautious weight decay and the update are then applied to the local shard. Inside one node only: across nodes the
  replicas compute the same update from the same averaged gradient.
- The math per matrix is that of one process: on CPU the update of a given gradient is bit-identical (the row norm
  is per row; Polar-Express and NorMuon see the whole matrix; a batch's matrices are independent, tested).
- state_dict() holds stable names: "state.<name>.momentum_buffer" (a DTensor: DCP writes each rank's rows and
  reshards on another world size), "state.<name>.second_moment" (a plain tensor, on its owner; DCP reads it on
  whichever rank owns it after a resume), "stepped" (which matrices have non-zero state; replicated).

Tests: python -m pytest -q tests/test_muon.py tests/test_parallel.py
"""
import math
import struct
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# Polar-Express coefficients and Muon constants of the authors' release
POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
POLAR_EXPRESS_SAFETY = 1.02  # X = U / (||U||_F * 1.02 + 1e-6)
POLAR_EXPRESS_EPS = 1e-6
ROW_NORM_MIN = 1e-7  # MuonEq-R: row norms clamped >= this
SECOND_MOMENT_BETA2 = 0.95  # NorMuon EMA; used as bf16(0.95) = 0.94921875 like the release's fused kernel
SECOND_MOMENT_MIN = 1e-10  # clamp for S and for the Frobenius-norm denominator
MOMENTUM_START, MOMENTUM_RAMP, MOMENTUM_RAMP_STEPS = 0.85, 0.10, 300  # mu(step) = 0.85 + 0.10 * min(step / 300, 1)
CPU_BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # /proc/cpuinfo flags of CPUs with native bf16 matmul
POLAR_EXPRESS_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def muon_momentum(step):
    """Muon momentum at 0-indexed optimizer step: 0.85 -> 0.95 linearly over 300 steps (not reset at growth)."""
    return MOMENTUM_START + MOMENTUM_RAMP * min(step / MOMENTUM_RAMP_STEPS, 1.0)


def shape_lr_factor(shape):
    """sqrt(max(1, rows/cols)): > 1 only for tall matrices (MLP c_gate / c_fc, H x C)."""
    rows, cols = shape[-2], shape[-1]
    return math.sqrt(max(1.0, rows / cols))


def bf16_scalar(x):
    """x rounded to bf16 precision (to fp32, then to nearest even on the top 16 bits, as torch rounds), as a Python
    float: the release's fused kernel casts its scalars to bf16. Plain arithmetic, not a tensor's .item(), so that a
    step asks nothing of the device (tests/test_train.py counts the syncs)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def cpu_flags():
    """The CPU feature flags of /proc/cpuinfo (empty where there is none). torch.backends.cpu.get_cpu_capability()
    only says AVX2/AVX512, not whether the CPU has bf16 dot products."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bf16_matmul(device):
    """Whether bf16 matrix products run natively (not emulated through fp32) on this device."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and bool(CPU_BF16_FLAGS & cpu_flags())


def resolve_polar_express_dtype(choice, device):
    """"auto" | "bf16" | "fp32" -> the torch dtype Polar-Express iterates in on `device`."""
    if choice == "auto":
        return torch.bfloat16 if native_bf16_matmul(device) else torch.float32
    if choice not in POLAR_EXPRESS_DTYPES:
        raise ValueError(f"polar_express_dtype must be auto, bf16 or fp32, got {choice!r}")
    return POLAR_EXPRESS_DTYPES[choice]


def polar_express(u, dtype=torch.bfloat16):
    """Approximate orthogonal polar factor of u (..., rows, cols): 5 Polar-Express iterations in `dtype` (the
    release: bf16, with the input cast before its Frobenius normalisation); returns bf16. Each iteration is 3 GEMMs:
    baddbmm forms b*A + c*A@A and a*X + X@B in the GEMM's accumulator: one rounding to `dtype` instead of three, and
    no separate elementwise passes over the matrices."""
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


def normuon_rescale(x, second_moment, beta2):
    """NorMuon rescaling of the orthogonalised update x (..., rows, cols), bf16.

    Updates second_moment (fp32, second_moment_shape) in place: S <- beta2 S + (1 - beta2) mean(x^2 over the reduced
    axis), then returns x / sqrt(max(S, 1e-10)) rescaled to x's Frobenius norm, in bf16.
    """
    reduce_dim = -1 if x.size(-2) >= x.size(-1) else -2
    xf = x.float()
    second_moment.lerp_(xf.square().mean(dim=reduce_dim, keepdim=True), 1 - beta2)
    scaled = xf * second_moment.clamp_min(SECOND_MOMENT_MIN).rsqrt()
    scaled_norm = scaled.norm(dim=(-2, -1), keepdim=True).clamp_min(SECOND_MOMENT_MIN)
    return (scaled * (xf.norm(dim=(-2, -1), keepdim=True) / scaled_norm)).bfloat16()


def blend(grad, momentum_buffer, momentum):
    """Muon steps 1-3, row by row: momentum (updated in place), Nesterov blend, MuonEq-R row normalisation. Gradient
    and momentum in the parameter dtype (fp32), as the release's fused kernel."""
    momentum_buffer.lerp_(grad, 1 - momentum)  # Mb <- mu Mb + (1 - mu) G
    blended = grad.lerp(momentum_buffer, momentum)  # U <- (1 - mu) G + mu Mb
    return blended / blended.norm(dim=-1, keepdim=True).clamp_min(ROW_NORM_MIN)


def orthogonalize(blended, second_moment, polar_express_dtype=torch.bfloat16):
    """Muon steps 4-5 on whole matrices: Polar-Express, then NorMuon with beta2 = bf16(0.95) = 0.94921875 (the
    release's); updates second_moment in place, returns the bf16 update."""
    return normuon_rescale(polar_express(blended, polar_express_dtype), second_moment,
                           bf16_scalar(SECOND_MOMENT_BETA2))


def muon_direction(grad, momentum_buffer, second_moment, momentum, polar_express_dtype=torch.bfloat16):
    """Muon steps 1-5 for a batch of same-shape whole matrices; updates both buffers in place, returns the bf16
    update."""
    return orthogonalize(blend(grad, momentum_buffer, momentum), second_moment, polar_express_dtype)


def apply_update(weight, update, lr, weight_decay):
    """Muon step 7 in place: W <- W - lr*update - lr*wd*W*(update*W >= 0), lr already scheduled and shape-scaled.

    Numerics follow the release's fused kernel where it is cheap to: lr and lr*wd are rounded to bf16, the bf16 update
    is upcast and subtracted from the fp32 weights (the products themselves are formed in fp32).
    """
    update = update.to(weight.dtype)
    decay_mask = update * weight >= 0  # cautious: decay only where the step already shrinks |W|, incl. update == 0
    weight.sub_(update * bf16_scalar(lr) + weight * decay_mask * bf16_scalar(lr * weight_decay))


def reset_state(optimizer, params):
    """Fresh optimizer state for those of params the optimizer holds (all moments and step counts zeroed in place),
    e.g. what an untied growth copied. Works for Muon and torch.optim.AdamW: zero state is what a never-stepped
    parameter starts from. Call it on every rank with the same params (Muon records on all ranks that their state is
    zero)."""
    for p in params:
        state = optimizer.state.get(p, {})
        for key, value in state.items():
            state[key] = value.zero_() if torch.is_tensor(value) else 0
        if isinstance(optimizer, Muon) and p in optimizer.index:
            optimizer.stepped[optimizer.index[p]] = False


def assign_owners(shapes, world_size):
    """Owner rank of each matrix: per shape (largest first), round-robin in parameter order starting at the rank that
    keeps the largest per-rank load smallest, so that the matrices a step moves (e.g. the active cores) are close to
    evenly owned."""
    owners, load = [0] * len(shapes), [0] * world_size
    by_shape = defaultdict(list)
    for i, shape in enumerate(shapes):
        by_shape[tuple(shape)].append(i)
    for shape, indices in sorted(by_shape.items(), key=lambda item: -math.prod(item[0])):  # stable: ties in order
        numel, extra = math.prod(shape), len(indices) % world_size
        start = min(range(world_size),
                    key=lambda s: max([load[(s + k) % world_size] + numel for k in range(extra)] + [max(load)]))
        for j, i in enumerate(indices):
            owners[i] = (start + j) % world_size
            load[owners[i]] += numel
    return owners


def rounds(indices, shapes, owners, world):
    """The exchanges of one step: per shape (in first-appearance order), round k holds the k-th of `indices` of every
    owner -> [[index or None per owner rank]]."""
    by_shape, out = defaultdict(lambda: defaultdict(list)), []
    for i in indices:
        by_shape[tuple(shapes[i])][owners[i]].append(i)
    for per_owner in by_shape.values():
        for k in range(max(len(v) for v in per_owner.values())):
            out.append([per_owner[r][k] if k < len(per_owner[r]) else None for r in range(world)])
    return out


def local(t):
    """A DTensor's local shard (a view: in-place changes reach the parameter), a plain tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def full(t):
    """A DTensor's whole value on every rank (a collective), a plain tensor itself."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_group(param):
    """(process group, rank in it, its size) of the mesh dimension a DTensor parameter is sharded over; (None, 0, 1)
    for a plain tensor or a replicated one."""
    if not isinstance(param, DTensor):
        return None, 0, 1
    dims = [d for d, placement in enumerate(param.placements) if placement.is_shard()]
    if not dims:
        return None, 0, 1
    group = param.device_mesh.get_group(dims[0])
    if dist.get_world_size(group) == 1:  # HSDP with one rank per node: whole matrices everywhere
        return None, 0, 1
    return group, dist.get_rank(group), dist.get_world_size(group)


class Muon(torch.optim.Optimizer):
    """The release's Muon variant for 2-D parameters (plain tensors, or FSDP2 DTensors all on one mesh). Group keys:
    lr (scheduled), weight_decay, momentum (scheduled). polar_express_dtype: auto | bf16 | fp32. param_names: stable
    checkpoint names (default: the parameter index)."""

    def __init__(self, params, lr, weight_decay=0.0, momentum=MOMENTUM_START, polar_express_dtype="auto",
                 param_names=None):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum))
        params = self._params()
        for p in params:
            if p.ndim != 2:
                raise ValueError(f"Muon takes matrices only, got a parameter of shape {tuple(p.shape)}")
        self.names = [str(i) for i in range(len(params))] if param_names is None else list(param_names)
        if len(self.names) != len(params) or len(set(self.names)) != len(params):
            raise ValueError(f"param_names must be {len(params)} distinct names, one per parameter")
        self.group, self.rank, self.world_size = shard_group(params[0])
        self.polar_express_dtype = resolve_polar_express_dtype(polar_express_dtype, local(params[0]).device)
        self.index = {p: i for i, p in enumerate(params)}
        self.group_of = [g for g, group in enumerate(self.param_groups) for _ in group["params"]]
        self.owners = assign_owners([p.shape for p in params], self.world_size)
        for i, p in enumerate(params):  # all state up front: its size is known and state_dict() never allocates
            self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            if self.owners[i] == self.rank:
                self.state[p]["second_moment"] = torch.zeros(second_moment_shape(p.shape), dtype=torch.float32,
                                                             device=local(p).device)
        self.stepped = [False] * len(params)  # replicated: True once a matrix's state may be non-zero

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    def state_bytes(self):
        """Bytes of this rank's Muon state (local momentum rows, owned second moments)."""
        return sum(local(t).numel() * local(t).element_size() for s in self.state.values() for t in s.values())

    def _decay_only(self, i):
        """The zero-gradient step of a matrix with zero state: update 0, so W <- W - lr_s*wd*W (mask all true)."""
        p = self._params()[i]
        group = self.param_groups[self.group_of[i]]
        w = local(p)
        w.sub_(w * bf16_scalar(group["lr"] * shape_lr_factor(p.shape) * group["weight_decay"]))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        with_grad = [i for i, p in enumerate(params) if p.grad is not None]  # the same on every rank
        has_grad = set(with_grad)
        for i in range(len(params)):
            if i not in has_grad and not self.stepped[i]:
                self._decay_only(i)
        moving = [i for i in range(len(params)) if i in has_grad or self.stepped[i]]
        blended = {}
        for i in moving:  # steps 1-3 on the local rows
            p = params[i]
            g = local(p.grad) if p.grad is not None else torch.zeros_like(local(p))
            momentum = self.param_groups[self.group_of[i]]["momentum"]
            blended[i] = blend(g, local(self.state[p]["momentum_buffer"]), momentum)
        updates = self._orthogonalized(moving, blended)
        for i in moving:
            group = self.param_groups[self.group_of[i]]
            apply_update(local(params[i]), updates[i], group["lr"] * shape_lr_factor(params[i].shape),
                         group["weight_decay"])
        for i in with_grad:
            self.stepped[i] = True
        return loss

    def _orthogonalized(self, moving, blended):
        """Steps 4-5 on whole matrices -> {index: this rank's rows of the bf16 update}. One process: per shape as one
        batch. Sharded: round by round (rounds()), each owner gathers its matrix's rows by all_to_all, orthogonalizes
        it and sends every rank its rows back."""
        params = self._params()
        if self.group is None:
            by_shape, out = defaultdict(list), {}
            for i in moving:
                by_shape[self.group_of[i], tuple(params[i].shape)].append(i)
            for batch in by_shape.values():
                second = torch.stack([self.state[params[i]]["second_moment"] for i in batch])
                update = orthogonalize(torch.stack([blended[i] for i in batch]), second, self.polar_express_dtype)
                for i, u, s in zip(batch, update.unbind(), second.unbind()):
                    out[i] = u
                    self.state[params[i]]["second_moment"].copy_(s)
            return out
        out, n = {}, self.world_size
        for members in rounds(moving, [p.shape for p in params], self.owners, n):
            rows, cols = params[next(i for i in members if i is not None)].shape
            chunk = -(-rows // n)  # FSDP2's dim-0 shard: torch.chunk's, the last ranks' possibly short or empty
            mine = members[self.rank]
            split_in = [chunk * cols if i is not None else 0 for i in members]
            split_out = [chunk * cols if mine is not None else 0] * n
            sends = torch.cat([pad_rows(blended[i], chunk).reshape(-1) for i in members if i is not None])
            received = sends.new_empty(sum(split_out))
            dist.all_to_all_single(received, sends, split_out, split_in, group=self.group)
            if mine is not None:
                whole = received.view(n * chunk, cols)[:rows]
                update = orthogonalize(whole, self.state[params[mine]]["second_moment"], self.polar_express_dtype)
                back = pad_rows(update.float(), n * chunk).reshape(-1)
            else:
                back = received
            returned = back.new_empty(sum(split_in))
            dist.all_to_all_single(returned, back, split_in, split_out, group=self.group)
            offset = 0
            for i in members:
                if i is not None:
                    local_rows = local(params[i]).shape[0]
                    out[i] = returned[offset:offset + chunk * cols].view(chunk, cols)[:local_rows].bfloat16()
                    offset += chunk * cols
        return out

    # --- checkpoints ------------------------------------------------------------------------------------------------

    def state_dict(self):
        """This rank's state (live tensors, no copies) under stable names, plus the replicated param_groups
        (hyperparameters) and stepped flags. Not collective."""
        groups = [dict({k: v for k, v in group.items() if k != "params"},
                       params=[self.names[self.index[p]] for p in group["params"]]) for group in self.param_groups]
        state_dict = dict(param_groups=groups, stepped=torch.tensor(self.stepped))
        for p, state in self.state.items():
            for key, tensor in state.items():
                state_dict[f"state.{self.names[self.index[p]]}.{key}"] = tensor
        return state_dict

    def load_state_dict(self, state_dict):
        """Load state_dict()'s layout (e.g. a template filled by dcp.load, at any world size)."""
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("optimizer state was saved for other parameter groups; resume with the same model")
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        for p, state in self.state.items():
            for key, tensor in state.items():
                saved = state_dict.get(f"state.{self.names[self.index[p]]}.{key}")
                if saved is None:
                    raise ValueError(f"the optimizer state has no {key} for matrix {self.names[self.index[p]]}")
                if saved is not tensor:
                    tensor.copy_(saved)
        self.stepped = [bool(s) for s in state_dict["stepped"].tolist()]


def pad_rows(x, rows):
    """x (r, cols) with zero rows appended up to `rows`."""
    return x if x.shape[0] == rows else torch.cat([x, x.new_zeros(rows - x.shape[0], x.shape[1])])
