"""The paper's Muon variant for the block matrices (arXiv 2609.19107, App. A, Table 1; the numerics are the authors'
release) and its distributed transport, plus the gradient averaging train.py needs for the AdamW parameters.

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

Distributed (automatic when torch.distributed is initialised with world size > 1; gloo on CPU, NCCL on CUDA), the
release's ZeRO-2-style transport, same math:
- Ownership: every matrix has one owner rank (assign_owners: per shape round-robin, balanced by size), fixed for the
  optimizer's life. Only the owner keeps its momentum and second moment, and its averaged gradient at the step.
- Gradients: post-accumulate-grad hooks copy each finished gradient into a bucket (bucket_mb, default 256 MB) and
  free it; a full bucket is reduce-scattered asynchronously while backward goes on, and waited for before the next
  bucket is copied (one bucket in flight). A bucket holds "stacks" of one same-shape matrix per owner, laid out
  owner-major, so the reduce-scatter hands each owner exactly its own matrices (no padding); a matrix left without
  same-shape partners on the other ranks goes to its owner with dist.reduce. What an owner receives is added into one
  fp32 accumulator per owned matrix; other ranks' copies are dropped once their reduction is done.
- Hierarchical (node_size=P < world, nodes of P consecutive ranks; train.py with sharded gradients on several nodes):
  a bucket is reduce-scattered inside the node only (node_groups), laid out so that local rank l receives the node's
  sums of the chunks of ranks n*P + l of every node n (a single-owner bucket: reduced to the owner's local rank); they
  are added into one fp32 node-sum per matrix (1/P of the gradients). At step() each node-sum goes, among the ranks of
  one local rank, to its owner (reduce-scatter, or reduce), one bucket in flight, and is divided by the world size:
  the owner's averaged gradient, summed in another order. Per micro-batch nothing crosses a node.
  Hooks act only while `sync_grads` is True: set it False for all but the last micro-batch of an accumulation (the
  gradients then accumulate locally, like DDP's no_sync), or leave it True to reduce every micro-batch (about 1/world
  of the gradient memory, one reduce-scatter per micro-batch) and call finish_micro_batch() after every backward, so
  that each micro-batch's reductions are folded in and freed before the next. Whatever backward did not reduce,
  step() reduces. expect_gradients(params) names the matrices the coming backwards train (default: the last step's),
  so that no bucket waits for a matrix without a gradient (a dormant core at step 0, new cores after growth).
- Matrices without a gradient communicate nothing. With zero state (never stepped since construction or
  reset_state) their zero-gradient step is pure weight decay, which every rank applies to its replica locally. With
  non-zero state (e.g. a core skipped by random recurrence after training) the owner computes the zero-gradient
  update and sends the new weights with the others.
- Weights: each owner updates its matrices bucket by bucket; a bucket's new weights are all-gathered (or broadcast
  from the owner) asynchronously while the next bucket's updates are computed, and copied into the parameters before
  the next bucket is sent, so one gathered bucket exists at a time. All ranks end with identical weights: the update
  of one process with the rank-averaged gradient.
- state_dict() is this rank's shard, references to the live tensors (no copies), keyed by stable names: tensors
  "state.<name>.momentum_buffer" / "state.<name>.second_moment" of the owned matrices, plus the replicated
  "param_groups" and "stepped" (which matrices have non-zero state). Saved with torch.distributed.checkpoint every rank
  writes its own shard; load_state_dict() of a template filled by dcp.load works at any world size, and it still
  takes today's complete single-file state ({"state": {index: ...}, "param_groups": ...}), keeping what this rank owns.

Fixed reduction order (fixed_order=True on Muon and ReplicatedGrads; train.py --fixed-reduce-order): the summed
gradient is bit-identical on every power-of-two world size W. The caller runs global micro-batch k*W + r as rank r's
k-th, scales every loss by 1/M (M micro-batches per step in all) and calls finish_micro_batch() after every backward.
The sum is one canonical fold of the M micro-batch gradients in global order (fold(): a binary counter, then the
stack collapsed right to left). Every micro-batch's gradients go to their owners (sync_grads is ignored): scatter
buckets by all_to_all (each rank's chunk r to rank r, the bytes of a reduce-scatter), single-owner buckets by gather;
the owner sums the W leaves of a micro-batch time as a complete binary tree and pushes that subtree at level log2(W),
which leaves the counter exactly as pushing the W leaves one by one would, for any M / W (tests/test_muon.py checks
it). The owner keeps up to floor(log2(M / W)) + 1 partial sums of each owned matrix. ReplicatedGrads splits each
flat gradient into W equal chunks (zero-padded), all_to_all's them, folds chunk r on rank r, and wait() all-gathers
the folded chunks (the bytes of an all-reduce, the reduce-scatter half paid per micro-batch). With one process the
fold is local. Muon's batched update of same-shape matrices is bitwise independent of the batch's other matrices
on CPU (tested), so the update needs no change.

Tests: python -m pytest -q tests/test_muon.py
"""
import math
import struct
from collections import defaultdict

import torch
import torch.distributed as dist

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
BUCKET_MB = 256  # the release's owner buckets at d26
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


def muon_direction(grad, momentum_buffer, second_moment, momentum, polar_express_dtype=torch.bfloat16):
    """Muon steps 1-5 (momentum, Nesterov blend, row norm, Polar-Express, NorMuon) for a batch of same-shape
    matrices; updates both buffers in place, returns the bf16 update.

    Numerics as in the release's fused kernel: gradient and momentum in the parameter dtype (fp32), beta2 is
    bf16(0.95) = 0.94921875; Polar-Express in polar_express_dtype (the release: bf16).
    """
    momentum_buffer.lerp_(grad, 1 - momentum)  # Mb <- mu Mb + (1 - mu) G
    blended = grad.lerp(momentum_buffer, momentum)  # U <- (1 - mu) G + mu Mb
    blended = blended / blended.norm(dim=-1, keepdim=True).clamp_min(ROW_NORM_MIN)
    return normuon_rescale(polar_express(blended, polar_express_dtype), second_moment,
                           bf16_scalar(SECOND_MOMENT_BETA2))


def apply_update(weight, update, lr, weight_decay):
    """Muon step 7 in place: W <- W - lr*update - lr*wd*W*(update*W >= 0), lr already scheduled and shape-scaled.

    Numerics follow the release's fused kernel where it is cheap to: lr and lr*wd are rounded to bf16, the bf16 update
    is upcast and subtracted from the fp32 weights (the products themselves are formed in fp32).
    """
    update = update.to(weight.dtype)
    decay_mask = update * weight >= 0  # cautious: decay only where the step already shrinks |W|, incl. update == 0
    weight.sub_(update * bf16_scalar(lr) + weight * decay_mask * bf16_scalar(lr * weight_decay))


def world_size():
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def node_groups(node_size):
    """(this rank's node group, its cross-node group) for nodes of node_size consecutive ranks: node n holds ranks
    n*P .. n*P + P - 1, and the cross-node group of local rank l the ranks n*P + l of every node. Every rank creates
    every group in the same order (torch.distributed.new_group's contract)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = [dist.new_group(list(range(n, n + node_size))) for n in range(0, world, node_size)]
    across = [dist.new_group(list(range(l, world, node_size))) for l in range(node_size)]
    return nodes[rank // node_size], across[rank % node_size]


def all_reduce_grads(params):
    """Average .grad over ranks in place, synchronously (sum then divide); no-op in one process."""
    n = world_size()
    grads = [p.grad for p in params if p.grad is not None]
    if n == 1 or not grads:
        return
    for g in grads:
        dist.all_reduce(g)
    torch._foreach_div_(grads, n)


def reset_state(optimizer, params):
    """Fresh optimizer state for params (all moments and step counts zeroed in place), e.g. the new cores after
    untied growth. Works for Muon and torch.optim.AdamW: zero state is what a never-stepped parameter starts from.
    Call it on every rank with the same params (Muon records on all ranks that their state is zero)."""
    for p in params:
        state = optimizer.state.get(p, {})
        for key, value in state.items():
            state[key] = value.zero_() if torch.is_tensor(value) else 0
    if isinstance(optimizer, Muon):
        for p in params:
            optimizer.stepped[optimizer.index[p]] = False


# ---------------------------------------------------------------------------------------------------------------------
# The fixed-order fold: the canonical sum of a step's micro-batch gradients (module docstring). A stack holds
# (level, partial sum of 2**level adjacent leaves) pairs, oldest first.

def push(stack, level, tensor):
    """Binary-counter step: push a partial sum at `level`; equal-level neighbours merge as left + right (into left)."""
    while stack and stack[-1][0] == level:
        tensor = stack.pop()[1].add_(tensor)
        level += 1
    stack.append((level, tensor))


def collapse(stack):
    """The stack's total, right to left: s0 + (s1 + (... + s_last)), in place into s0."""
    total = stack[-1][1]
    for _, left in reversed(stack[:-1]):
        total = left.add_(total)
    return total


def fold(leaves):
    """The canonical sum of `leaves` in their order: each pushed at level 0, then collapsed (adds into the leaves)."""
    stack = []
    for leaf in leaves:
        push(stack, 0, leaf)
    return collapse(stack)


def tree_sum(leaves):
    """The sum of 2**L leaves as a complete binary tree, adjacent pairs level by level: what fold() computes for them.
    The leaves are left as they are (one leaf is returned itself)."""
    while len(leaves) > 1:
        leaves = [a + b for a, b in zip(leaves[0::2], leaves[1::2])]
    return leaves[0]


def leaf_level(world_size):
    """log2(world_size): the level at which one micro-batch time's W leaves enter the fold."""
    if world_size & (world_size - 1):
        raise ValueError(f"the fixed reduction order needs a power-of-two world size, got {world_size}")
    return world_size.bit_length() - 1


# ---------------------------------------------------------------------------------------------------------------------
# Ownership and buckets: pure functions of the matrix shapes, the same on every rank.

def assign_owners(shapes, world_size):
    """Owner rank of each matrix: per shape (largest first), round-robin in parameter order starting at the rank that
    keeps the largest per-rank load smallest. Round-robin makes any contiguous run of same-shape matrices (e.g. the
    blocks of the active cores) close to evenly owned, so the transport can pair them into reduce-scatter stacks."""
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


def per_rank_bytes(shapes, world_size, dtype_bytes=4):
    """Per rank (a list of dicts): Muon state bytes (momentum + second moment of the owned matrices) and owned-gradient
    bytes (the averaged gradients of the owned matrices, held from their reduction until step() ends). On top of
    these, backward holds each micro-batch's local gradients until their bucket is reduced (all of them when
    sync_grads is False), plus one bucket's copy in flight (plan.py counts both)."""
    out = [dict(state=0, owned_grads=0) for _ in range(world_size)]
    for shape, rank in zip(shapes, assign_owners(shapes, world_size)):
        out[rank]["state"] += dtype_bytes * (math.prod(shape) + math.prod(second_moment_shape(shape)))
        out[rank]["owned_grads"] += dtype_bytes * math.prod(shape)
    return out


class Bucket:
    """Matrices moved by one collective: chunks[r] lists the matrices owned by rank r, in flat-buffer order. scatter:
    every chunk has the same size (reduce-scatter / all-gather); otherwise only the owner's chunk is non-empty
    (reduce to / broadcast from the owner)."""

    def __init__(self, chunks, scatter):
        self.chunks, self.scatter = chunks, scatter
        self.members = [i for chunk in chunks for i in chunk]
        self.owner = next(r for r, chunk in enumerate(chunks) if chunk)


def plan_buckets(indices, shapes, owners, world_size, bucket_bytes, dtype_bytes=4):
    """Buckets moving the matrices `indices`, in the order backward finishes their gradients (last matrices first).

    Per shape, the k-th matrix of each owner form a stack; full stacks fill scatter buckets of about bucket_bytes;
    matrices without a partner on every rank get an owner bucket each.
    """
    items = []  # (readiness key, stack or single matrix, scatter?)
    by_shape = defaultdict(lambda: [[] for _ in range(world_size)])
    for i in indices:
        by_shape[tuple(shapes[i])][owners[i]].append(i)
    for per_owner in by_shape.values():
        full = min(len(owned) for owned in per_owner)
        items += [(min(stack), stack, True) for stack in zip(*(owned[:full] for owned in per_owner))]
        items += [(i, (i,), False) for owned in per_owner for i in owned[full:]]
    buckets, chunks, size = [], [[] for _ in range(world_size)], 0
    for _, members, scatter in sorted(items, key=lambda item: -item[0]):
        if not scatter:
            single = [[] for _ in range(world_size)]
            single[owners[members[0]]].append(members[0])
            buckets.append(Bucket(single, scatter=False))
            continue
        for i in members:
            chunks[owners[i]].append(i)
        size += dtype_bytes * sum(math.prod(shapes[i]) for i in members)
        if size >= bucket_bytes:
            buckets.append(Bucket(chunks, scatter=True))
            chunks, size = [[] for _ in range(world_size)], 0
    if size:
        buckets.append(Bucket(chunks, scatter=True))
    return buckets


# ---------------------------------------------------------------------------------------------------------------------
# The optimizer.

class Muon(torch.optim.Optimizer):
    """The release's Muon variant for 2-D parameters. Group keys: lr (scheduled), weight_decay, momentum (scheduled).

    distributed: None = automatic (torch.distributed initialised with world size > 1); False = every rank computes
    every update from the gradients it has (e.g. already averaged by DDP). polar_express_dtype: auto | bf16 | fp32.
    bucket_mb: transport bucket size. param_names: stable checkpoint names (default: the parameter index).
    fixed_order: the world-size-invariant sum (call finish_micro_batch() after every backward). node_size: ranks
    per node of the hierarchical transport (None, one node or the fixed order: flat); every rank passes the same.
    The module docstring has the contract; set sync_grads before each backward when accumulating micro-batches.
    """

    def __init__(self, params, lr, weight_decay=0.0, momentum=MOMENTUM_START, distributed=None,
                 polar_express_dtype="auto", bucket_mb=BUCKET_MB, param_names=None, fixed_order=False,
                 node_size=None):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum))
        params = self._params()
        for p in params:
            if p.ndim != 2:
                raise ValueError(f"Muon takes matrices only, got a parameter of shape {tuple(p.shape)}")
        self.names = [str(i) for i in range(len(params))] if param_names is None else list(param_names)
        if len(self.names) != len(params) or len(set(self.names)) != len(params):
            raise ValueError(f"param_names must be {len(params)} distinct names, one per parameter")
        self.world_size = world_size() if distributed in (None, True) else 1
        self.rank = dist.get_rank() if self.world_size > 1 else 0
        self.polar_express_dtype = resolve_polar_express_dtype(polar_express_dtype, params[0].device)
        self.bucket_bytes = int(bucket_mb * 2 ** 20)
        self.index = {p: i for i, p in enumerate(params)}
        self.group_of = [g for g, group in enumerate(self.param_groups) for _ in group["params"]]
        self.owners = assign_owners([p.shape for p in params], self.world_size)
        self.owned = [p for i, p in enumerate(params) if self.owners[i] == self.rank]
        for p in self.owned:  # all owned state up front: its size is known and state_dict() never allocates
            self.state[p].update(momentum_buffer=torch.zeros_like(p), second_moment=torch.zeros(
                second_moment_shape(p.shape), dtype=torch.float32, device=p.device))
        self.stepped = [False] * len(params)  # replicated: True once a matrix's state may be non-zero
        self.sync_grads, self.fixed_order = True, fixed_order
        self.node_size = self.world_size  # flat: one node
        if node_size and node_size < self.world_size and not fixed_order:
            if self.world_size % node_size:
                raise ValueError(f"node_size {node_size} does not divide the world size {self.world_size}")
            self.node_size = node_size
            self._node_group, self._cross_group = node_groups(node_size)
        self._node_sums = {}  # hierarchical: index -> this node's sum of a matrix's gradients over the step's micro-batches
        self.measure_grad_norm, self.grad_sq = False, None  # grad_sq: the owned gradients' squared L2 norm (a step's)
        self._leaf_level = leaf_level(self.world_size) if fixed_order else None
        self._stacks = defaultdict(list)  # fixed order: index -> partial sums of an owned matrix's gradient
        self._plans = {}
        self._expected = self._plan(range(len(params)))  # the buckets hooks fill; re-planned from each step's grads
        self._next_bucket, self._ready, self._in_flight = 0, set(), []
        self._reduced, self._owned_grads = set(), {}  # matrices reduced this step; averaged grads of the owned ones
        if self.world_size > 1 or fixed_order:
            for p in params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    @property
    def hierarchical(self):
        return self.node_size < self.world_size

    def _send_order(self, bucket):
        """A bucket's matrices in its flat buffer: owner-major; hierarchical scatter: local-rank-major, so that the
        node's reduce-scatter hands local rank l the chunks of ranks n*P + l (n = 0, 1, ...)."""
        if not (self.hierarchical and bucket.scatter):
            return bucket.members
        p, world = self.node_size, self.world_size
        return [i for local in range(p) for r in range(local, world, p) for i in bucket.chunks[r]]

    def _node_share(self, bucket):
        """Hierarchical: the matrices whose node-sums this rank receives from a bucket, in the buffer's order."""
        p, local = self.node_size, self.rank % self.node_size
        if bucket.scatter:
            return [i for r in range(local, self.world_size, p) for i in bucket.chunks[r]]
        return bucket.members if bucket.owner % p == local else []

    def _plan(self, indices):
        key = tuple(indices)
        if key not in self._plans:
            shapes = [p.shape for p in self._params()]
            self._plans[key] = plan_buckets(key, shapes, self.owners, self.world_size, self.bucket_bytes)
        return self._plans[key]

    def owned_bytes(self):
        """Bytes this rank's Muon state holds (see per_rank_bytes for the gradients)."""
        return sum(t.numel() * t.element_size() for p in self.owned for t in self.state[p].values())

    # --- gradient reduction ----------------------------------------------------------------------------------------

    def _grad_ready(self, p):
        """Post-accumulate-grad hook: launch every complete bucket, strictly in plan order (the same on all ranks).
        Fixed order in one process: the gradient is the leaf, pushed at once."""
        if self.fixed_order and self.world_size == 1:
            push(self._stacks[self.index[p]], 0, p.grad)
            p.grad = None
            self._reduced.add(self.index[p])
            return
        if not (self.sync_grads or self.fixed_order):
            return
        self._ready.add(self.index[p])
        while self._next_bucket < len(self._expected) and \
                self._ready.issuperset(self._expected[self._next_bucket].members):
            self._launch_reduce(self._expected[self._next_bucket])
            self._next_bucket += 1
        if self._next_bucket == len(self._expected):  # every bucket went: the next synced backward starts over
            self._next_bucket, self._ready = 0, set()

    def _launch_reduce(self, bucket):
        """Copy a bucket's gradients into one buffer (freeing them) and send it; the previous bucket's reduction is
        waited for first, so one bucket is in flight at a time (plan.py counts it)."""
        self._finish_reductions()
        params = self._params()
        flat = torch.cat([params[i].grad.reshape(-1) for i in self._send_order(bucket)])
        for i in bucket.members:
            params[i].grad = None  # the bucket's copy replaces the gradient; non-owned ones are gone after the reduce
        received, node_sums = bucket.chunks[self.rank], False
        if self.fixed_order and bucket.scatter:  # out on rank r: its chunk of every rank, in rank order
            out = torch.empty_like(flat)
            work = dist.all_to_all_single(out, flat, async_op=True)
        elif self.fixed_order:
            out = [torch.empty_like(flat) for _ in range(self.world_size)] if self.rank == bucket.owner else None
            work = dist.gather(flat, out, dst=bucket.owner, async_op=True)
        elif self.hierarchical:  # inside the node only: to the local rank of each owner
            received, node_sums = self._node_share(bucket), True
            if bucket.scatter:
                out = flat.new_empty(flat.numel() // self.node_size)
                work = dist.reduce_scatter_single(out, flat, group=self._node_group, async_op=True)
            else:
                dst = self.rank - self.rank % self.node_size + bucket.owner % self.node_size
                out, work = flat, dist.reduce(flat, dst=dst, group=self._node_group, async_op=True)
        elif bucket.scatter:
            out = flat.new_empty(flat.numel() // self.world_size)
            work = dist.reduce_scatter_single(out, flat, async_op=True)
        else:
            out, work = flat, dist.reduce(flat, dst=bucket.owner, async_op=True)
        self._reduced.update(bucket.members)
        self._in_flight.append((received, out, work, node_sums))

    def _finish_reductions(self):
        """Wait for the buckets in flight and add what this rank received into its owned matrices' accumulators (one
        per matrix, the first micro-batch's reduced buffer), or hierarchically into its node-sums; the sent copies
        are dropped."""
        params = self._params()
        for received, out, work, node_sums in self._in_flight:
            work.wait()
            if self.fixed_order:
                self._push_leaves(received, out)
                continue
            offset = 0
            for i in received:
                grad = out[offset:offset + params[i].numel()].view_as(params[i])
                offset += params[i].numel()
                if node_sums:  # divided by the world size once, after the step's reduction across nodes
                    self._node_sums[i] = self._node_sums[i].add_(grad) if i in self._node_sums else grad
                elif i in self._owned_grads:  # reduced in an earlier micro-batch too
                    self._owned_grads[i].add_(grad, alpha=1 / self.world_size)
                else:
                    self._owned_grads[i] = grad.div_(self.world_size)
        self._in_flight = []

    def _push_leaves(self, owned, out):
        """Fixed order: the W leaves of one micro-batch time of the owned matrices (a bucket's received chunks, or the
        gathered matrix), summed as a tree and pushed at level log2(W) on each matrix's stack."""
        if not owned:
            return
        params = self._params()
        leaves = out if isinstance(out, list) else list(out.view(self.world_size, -1).unbind())
        folded, offset = tree_sum(leaves), 0
        for i in owned:
            push(self._stacks[i], self._leaf_level, folded[offset:offset + params[i].numel()].view_as(params[i]))
            offset += params[i].numel()

    def _reduce_leftovers(self):
        """Wait for backward's buckets and send whatever backward's hooks did not (a bucket plan made from another
        step's gradients, or sync_grads off) -> whether anything was left."""
        self._finish_reductions()
        left = [i for i, p in enumerate(self._params()) if p.grad is not None]  # the same on every rank
        for bucket in self._plan(left) if left else []:
            self._launch_reduce(bucket)
        self._finish_reductions()
        return bool(left)

    def finish_micro_batch(self):
        """After every micro-batch's backward. With sync_grads (and always in the fixed order) its gradients are
        reduced, folded into the owners' accumulators (or partial sums) and freed now, not held until step(): whatever
        the hooks did not send goes too, and the buckets are re-planned for the next micro-batches. Without sync_grads
        nothing happens: the gradients accumulate locally (as they do in one process)."""
        if not self.fixed_order and (self.world_size == 1 or not self.sync_grads):
            return
        if self._reduce_leftovers():  # the next micro-batches' hooks launch buckets of this step's gradients
            self._expected = self._plan(sorted(self._reduced))
        self._next_bucket, self._ready = 0, set()

    def expect_gradients(self, params):
        """The matrices the coming backwards give gradients to (e.g. without dormant cores, or after growth), so that
        hooks send every bucket as soon as it is complete; by default the last step's."""
        self._expected = self._plan(sorted(self.index[p] for p in params))
        self._next_bucket, self._ready = 0, set()

    def _reduce_grads(self):
        """Wait for backward's buckets, reduce whatever is left; returns the indices that had a gradient this step."""
        self._reduce_leftovers()
        if self.fixed_order:
            self._owned_grads = {i: collapse(stack) for i, stack in self._stacks.items()}
            self._stacks.clear()
        with_grad, self._reduced = sorted(self._reduced), set()
        if self.hierarchical:
            self._reduce_across_nodes(with_grad)
        self._next_bucket, self._ready = 0, set()
        self._expected = self._plan(with_grad)
        return with_grad

    def _reduce_across_nodes(self, indices):
        """Hierarchical, once per step: among the ranks of this local rank (one per node), the node-sums of the
        matrices `indices` go to their owners (reduce-scatter; reduce for a single owner), one bucket in flight, and
        land in the owners' accumulators divided by the world size."""
        for bucket in self._plan(indices):
            mine = self._node_share(bucket)
            if not mine:  # a single owner on another local rank
                continue
            self._finish_reductions()
            flat = torch.cat([self._node_sums.pop(i).reshape(-1) for i in mine])
            if bucket.scatter:
                out = flat.new_empty(flat.numel() * self.node_size // self.world_size)
                work = dist.reduce_scatter_single(out, flat, group=self._cross_group, async_op=True)
            else:
                out, work = flat, dist.reduce(flat, dst=bucket.owner, group=self._cross_group, async_op=True)
            self._in_flight.append((bucket.chunks[self.rank], out, work, False))
        self._finish_reductions()

    # --- the step ---------------------------------------------------------------------------------------------------

    def _update(self, indices, grads):
        """The full Muon update of the given (owned) matrices; a missing gradient counts as zero."""
        params, by_key = self._params(), defaultdict(list)
        for i in indices:  # same-shape matrices of a group are updated as one batch; the math is per matrix
            by_key[self.group_of[i], tuple(params[i].shape)].append(i)
        for (g, shape), batch in by_key.items():
            group = self.param_groups[g]
            states = [self.state[params[i]] for i in batch]
            weights = torch.stack([params[i] for i in batch])
            momentum_buffers = torch.stack([s["momentum_buffer"] for s in states])
            second_moments = torch.stack([s["second_moment"] for s in states])
            grad = torch.stack([grads[i] if i in grads else torch.zeros_like(params[i]) for i in batch])
            update = muon_direction(grad, momentum_buffers, second_moments, group["momentum"],
                                    self.polar_express_dtype)
            apply_update(weights, update, group["lr"] * shape_lr_factor(shape), group["weight_decay"])
            torch._foreach_copy_([params[i] for i in batch] + [s["momentum_buffer"] for s in states]
                                 + [s["second_moment"] for s in states],
                                 [*weights.unbind(), *momentum_buffers.unbind(), *second_moments.unbind()])

    def _decay_only(self, p):
        """The zero-gradient step of a matrix with zero state: update 0, so W <- W - lr_s*wd*W (mask all true)."""
        group = self.param_groups[self.group_of[self.index[p]]]
        p.sub_(p * bf16_scalar(group["lr"] * shape_lr_factor(p.shape) * group["weight_decay"]))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        if self.world_size > 1 or self.fixed_order:
            with_grad = self._reduce_grads()
            grads, self._owned_grads = self._owned_grads, {}
        else:
            grads = {i: p.grad for i, p in enumerate(params) if p.grad is not None}
            with_grad = sorted(grads)
        if self.measure_grad_norm:  # this rank's owned matrices: each matrix is owned by one rank
            norms = torch._foreach_norm([g.float() for g in grads.values()]) if grads else []
            self.grad_sq = torch.stack(norms).square().sum() if norms else torch.zeros((), device=params[0].device)
        has_grad = set(with_grad)
        moving = [i for i in range(len(params)) if i in has_grad or self.stepped[i]]
        for i in range(len(params)):
            if i not in has_grad and not self.stepped[i]:
                self._decay_only(params[i])  # on every rank alike: no communication
        if self.world_size == 1:
            self._update(moving, grads)
        else:
            self._update_and_gather(moving, grads)
        for i in with_grad:
            self.stepped[i] = True
        return loss

    def _update_and_gather(self, moving, grads):
        """Owners update bucket by bucket; each bucket's new weights travel while the next one's update is computed,
        and land in the parameters before the next bucket is sent: one gathered bucket exists at a time."""
        in_flight = None
        for bucket in self._plan(moving):
            self._update(bucket.chunks[self.rank], grads)
            if in_flight:
                self._land(*in_flight)
                in_flight = None  # its buffer is freed before the next one is allocated
            in_flight = self._send_weights(bucket)
        if in_flight:
            self._land(*in_flight)

    def _send_weights(self, bucket):
        """Start sending a bucket's new weights from their owners to every rank -> (bucket, buffer, work)."""
        params = self._params()
        if bucket.scatter:
            local = torch.cat([params[i].reshape(-1) for i in bucket.chunks[self.rank]])
            out = local.new_empty(local.numel() * self.world_size)
            return bucket, out, dist.all_gather_single(out, local, async_op=True)
        out = torch.cat([params[i].reshape(-1) for i in bucket.members])
        return bucket, out, dist.broadcast(out, src=bucket.owner, async_op=True)

    def _land(self, bucket, out, work):
        """Copy a gathered bucket's new weights into the matrices this rank does not own."""
        params, offset = self._params(), 0
        work.wait()
        for i in bucket.members:
            if self.owners[i] != self.rank:
                params[i].copy_(out[offset:offset + params[i].numel()].view_as(params[i]))
            offset += params[i].numel()

    # --- checkpoints ------------------------------------------------------------------------------------------------

    def state_dict(self):
        """This rank's shard (live tensors, no copies): the owned matrices' state under stable names, plus the
        replicated param_groups (hyperparameters) and stepped flags. Not collective."""
        groups = [dict({k: v for k, v in group.items() if k != "params"},
                       params=[self.names[self.index[p]] for p in group["params"]]) for group in self.param_groups]
        state_dict = dict(param_groups=groups, stepped=torch.tensor(self.stepped))
        for p in self.owned:
            for key, tensor in self.state[p].items():
                state_dict[f"state.{self.names[self.index[p]]}.{key}"] = tensor
        return state_dict

    def load_state_dict(self, state_dict):
        """Load a shard (state_dict() of any world size, e.g. a template filled by dcp.load, or all shards merged)
        or a complete single-process state ({"state": {index: {...}}, ...}); keeps only what this rank owns."""
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("optimizer state was saved for other parameter groups; resume with the same model")
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        complete = state_dict.get("state")
        for p in self.owned:
            i = self.index[p]
            for key, tensor in self.state[p].items():
                if complete is not None:
                    saved = complete.get(i, {}).get(key)
                else:
                    saved = state_dict.get(f"state.{self.names[i]}.{key}")
                    if saved is None:
                        raise ValueError(f"the optimizer state has no {key} for matrix {self.names[i]}")
                if saved is None:
                    tensor.zero_()
                elif saved is not tensor:
                    tensor.copy_(saved)
        if complete is not None:  # every rank sees every matrix: non-zero state means stepped
            self.stepped = [any(torch.is_tensor(t) and bool(t.any()) for t in complete.get(i, {}).values())
                            for i in range(len(self.names))]
        else:
            self.stepped = [bool(s) for s in state_dict["stepped"].tolist()]


class ReplicatedGrads:
    """Rank-averaged .grad for parameters every rank steps itself (the AdamW embedding and lm_head): each finished
    gradient is all-reduced asynchronously from its post-accumulate-grad hook while sync_grads is True (DDP's
    traffic, overlapped with the rest of backward); wait() completes them (and reduces any left) before the step.
    With sync_grads on several micro-batches, finish_micro_batch() after each backward averages its reductions into
    one buffer per parameter. fixed_order: the world-size-invariant sum of the module docstring (finish_micro_batch() after every backward;
    .grad is then the sum of the micro-batch gradients, the caller having scaled each loss by 1/M)."""

    def __init__(self, params, fixed_order=False):
        self.params, self.sync_grads, self._in_flight = list(params), True, []
        self.world_size, self.fixed_order = world_size(), fixed_order
        self._sums = {}  # parameter -> the averaged gradients of this step's reduced micro-batches, one buffer each
        self._leaf_level = leaf_level(self.world_size) if fixed_order else None
        self._stacks = defaultdict(list)  # fixed order: parameter -> partial sums of this rank's chunk
        if self.world_size > 1 or fixed_order:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, p):
        if self.fixed_order:
            self._send_chunks(p)
        elif self.sync_grads:
            grad, p.grad = p.grad, None  # a later backward accumulates afresh, not into the tensor in flight
            self._in_flight.append((p, grad, dist.all_reduce(grad, async_op=True)))

    def _send_chunks(self, p):
        """Fixed order: this micro-batch's gradient of p in W equal chunks (zero-padded), chunk r to rank r."""
        grad, p.grad = p.grad, None
        if self.world_size == 1:
            push(self._stacks[p], 0, grad)
            return
        flat = grad.reshape(-1)
        if flat.numel() % self.world_size:
            flat = torch.cat([flat, flat.new_zeros(-flat.numel() % self.world_size)])
        out = torch.empty_like(flat)
        self._in_flight.append((p, out, dist.all_to_all_single(out, flat, async_op=True)))

    def finish_micro_batch(self):
        """After every micro-batch's backward: its all-reduced gradients are averaged into one buffer per parameter
        (not kept one copy per micro-batch until wait()). Fixed order: this rank's chunk of each gradient from every
        rank, summed as a tree and pushed at level log2(W)."""
        for p, out, work in self._in_flight:
            work.wait()
            if self.fixed_order:
                push(self._stacks[p], self._leaf_level, tree_sum(list(out.view(self.world_size, -1).unbind())))
            else:
                out.div_(self.world_size)
                self._sums[p] = self._sums[p].add_(out) if p in self._sums else out
        self._in_flight = []

    def wait(self):
        if self.fixed_order:
            self._gather_sums()
            return
        if self.world_size == 1:
            return
        all_reduce_grads(self.params)  # gradients not reduced in backward (sync_grads False on the last one)
        self.finish_micro_batch()
        for p, total in self._sums.items():
            p.grad = total if p.grad is None else p.grad.add_(total)
        self._sums = {}

    def _gather_sums(self):
        """Fixed order: each rank's collapsed chunk, all-gathered into the full sum on every rank."""
        self.finish_micro_batch()
        pending = []
        for p, stack in self._stacks.items():  # in hook order: the same on every rank
            mine = collapse(stack)
            if self.world_size == 1:
                p.grad = mine
                continue
            full = mine.new_empty(mine.numel() * self.world_size)
            pending.append((p, full, dist.all_gather_single(full, mine, async_op=True)))
        for p, full, work in pending:
            work.wait()
            p.grad = full[:p.numel()].view_as(p)
        self._stacks.clear()
