"""The paper's Muon variant (spec §3.3) and the small distributed helpers train.py needs for its optimizers.

Muon, per matrix G (rows x cols = out x in): EMA momentum with a Nesterov blend, MuonEq-R row normalisation,
5-step Polar-Express in bf16, NorMuon-style second-moment rescaling that keeps the Frobenius norm,
LR x sqrt(max(1, rows/cols)), cautious decoupled weight decay at that same LR. The embedding and lm_head use
torch.optim.AdamW, whose math is exactly spec §3.2 (tests/test_muon.py checks it against the formula).

Before each step the caller sets every group's "lr" (base LR x schedule multiplier) and "momentum" (muon_momentum):

    opt = Muon(matrix_params, lr=0.02, weight_decay=0.1)
    for group in opt.param_groups:
        group["lr"], group["momentum"] = 0.02 * lr_multiplier, muon_momentum(step)
    opt.step()

Distributed (automatic when torch.distributed is initialised with world size > 1; gloo on CPU, NCCL on CUDA):
- Muon.step() itself averages the matrix gradients over ranks (all_reduce), so these gradients must NOT also be
  averaged elsewhere (no DDP wrapper on them; use all_reduce_grads() for the AdamW parameters). Every rank must see
  the same set of parameters with a gradient (.grad None is skipped on all ranks alike).
- Each rank computes the update only for the parameters it owns (greedy balance by size), then every owner broadcasts
  its updated parameters, so all ranks end with identical weights: the update of one process with the averaged gradient.
- Muon state (momentum, second moment) lives on the owning rank only. state_dict() is collective (call it on every
  rank) and returns the COMPLETE state on every rank, so rank 0 can write a single checkpoint; load_state_dict() takes
  such a complete state (from any world size, or from one process) and keeps only what this rank owns.

Tests: python -m pytest -q tests/test_muon.py
"""
import math
from collections import defaultdict

import torch
import torch.distributed as dist

# Spec §3.3 (the release's values)
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


def muon_momentum(step):
    """Muon momentum at 0-indexed optimizer step: 0.85 -> 0.95 linearly over 300 steps (not reset at growth)."""
    return MOMENTUM_START + MOMENTUM_RAMP * min(step / MOMENTUM_RAMP_STEPS, 1.0)


def shape_lr_factor(shape):
    """sqrt(max(1, rows/cols)): > 1 only for tall matrices (MLP c_gate / c_fc, H x C)."""
    rows, cols = shape[-2], shape[-1]
    return math.sqrt(max(1.0, rows / cols))


def bf16_scalar(x):
    """x rounded to bf16 precision, as a Python float (the release's fused kernel casts its scalars to bf16)."""
    return torch.tensor(x, dtype=torch.bfloat16).item()


def polar_express(u):
    """Approximate orthogonal polar factor of u (..., rows, cols): 5 Polar-Express iterations in bf16; returns bf16."""
    x = u.bfloat16()
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * POLAR_EXPRESS_SAFETY + POLAR_EXPRESS_EPS)
    tall = x.size(-2) > x.size(-1)
    for a, b, c in POLAR_EXPRESS_COEFFS:
        if tall:
            gram = x.mT @ x
            x = a * x + x @ (b * gram + c * (gram @ gram))
        else:
            gram = x @ x.mT
            x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x


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


def muon_direction(grad, momentum_buffer, second_moment, momentum):
    """Spec §3.3 steps 1-5 for a batch of same-shape matrices; updates both buffers in place, returns the bf16 update.

    Numerics as in the release's fused kernel: gradient and momentum in the parameter dtype (fp32), the Polar-Express
    input is cast to bf16 before its Frobenius normalisation, beta2 is bf16(0.95) = 0.94921875.
    """
    momentum_buffer.lerp_(grad, 1 - momentum)  # Mb <- mu Mb + (1 - mu) G
    blended = grad.lerp(momentum_buffer, momentum)  # U <- (1 - mu) G + mu Mb
    blended = blended / blended.norm(dim=-1, keepdim=True).clamp_min(ROW_NORM_MIN)
    return normuon_rescale(polar_express(blended), second_moment, bf16_scalar(SECOND_MOMENT_BETA2))


def apply_update(weight, update, lr, weight_decay):
    """Spec §3.3 step 7 in place: W <- W - lr*update - lr*wd*W*(update*W >= 0), lr already scheduled and shape-scaled.

    Numerics follow the release's fused kernel where it is cheap to: lr and lr*wd are rounded to bf16, the bf16 update
    is upcast and subtracted from the fp32 weights (the products themselves are formed in fp32).
    """
    update = update.to(weight.dtype)
    decay_mask = update * weight >= 0  # cautious: decay only where the step already shrinks |W|, incl. update == 0
    weight.sub_(update * bf16_scalar(lr) + weight * decay_mask * bf16_scalar(lr * weight_decay))


def world_size():
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_mean(tensors):
    """Average tensors in place over all ranks (sum then divide: gloo has no AVG op)."""
    n = world_size()
    if n == 1 or not tensors:
        return
    for t in tensors:
        dist.all_reduce(t)
    torch._foreach_div_(tensors, n)


def all_reduce_grads(params):
    """Average .grad over ranks for the parameters not handled by Muon (the AdamW ones); no-op in one process."""
    all_reduce_mean([p.grad for p in params if p.grad is not None])


def reset_state(optimizer, params):
    """Fresh optimizer state for params (all moments and step counts zeroed in place), e.g. the new cores after
    untied growth. Works for Muon and torch.optim.AdamW: zero state is what a never-stepped parameter starts from."""
    for p in params:
        state = optimizer.state.get(p, {})
        for key, value in state.items():
            state[key] = value.zero_() if torch.is_tensor(value) else 0


class Muon(torch.optim.Optimizer):
    """The release's Muon variant for 2-D parameters. Group keys: lr (scheduled), weight_decay, momentum (scheduled).

    distributed: None = automatic (torch.distributed initialised with world size > 1); False = every rank computes
    every update from the gradients it has (e.g. already averaged by DDP). The module docstring has the contract.
    """

    def __init__(self, params, lr, weight_decay=0.0, momentum=MOMENTUM_START, distributed=None):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum))
        for p in self._params():
            if p.ndim != 2:
                raise ValueError(f"Muon takes matrices only, got a parameter of shape {tuple(p.shape)}")
        self.world_size = world_size() if distributed in (None, True) else 1
        self.rank = dist.get_rank() if self.world_size > 1 else 0

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    def _owners(self):
        """Parameter -> owning rank: largest first to the least-loaded rank (deterministic, the same on all ranks)."""
        load, owner = [0] * self.world_size, {}
        for p in sorted(self._params(), key=lambda p: -p.numel()):  # stable sort: ties keep parameter order
            rank = min(range(self.world_size), key=load.__getitem__)
            owner[p], load[rank] = rank, load[rank] + p.numel()
        return owner

    @staticmethod
    def _fresh_state(p):
        return {"momentum_buffer": torch.zeros_like(p),
                "second_moment": torch.zeros(second_moment_shape(p.shape), dtype=torch.float32, device=p.device)}

    def _state(self, p):
        if not self.state[p]:
            self.state[p].update(self._fresh_state(p))
        return self.state[p]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with_grad = [p for p in self._params() if p.grad is not None]
        owner = self._owners()
        if self.world_size > 1:
            all_reduce_mean([p.grad for p in with_grad])
        for group in self.param_groups:
            by_shape = defaultdict(list)  # same-shape matrices are updated as one batch; the math is per matrix
            for p in group["params"]:
                if p.grad is not None and owner[p] == self.rank:
                    by_shape[p.shape].append(p)
            for shape, params in by_shape.items():
                states = [self._state(p) for p in params]
                weights = torch.stack(params)
                momentum_buffers = torch.stack([s["momentum_buffer"] for s in states])
                second_moments = torch.stack([s["second_moment"] for s in states])
                update = muon_direction(torch.stack([p.grad for p in params]), momentum_buffers, second_moments,
                                        group["momentum"])
                apply_update(weights, update, group["lr"] * shape_lr_factor(shape), group["weight_decay"])
                for i, (p, s) in enumerate(zip(params, states)):
                    p.copy_(weights[i])
                    s["momentum_buffer"].copy_(momentum_buffers[i])
                    s["second_moment"].copy_(second_moments[i])
        if self.world_size > 1:
            self._broadcast_from_owners([(p, owner[p]) for p in with_grad])
        return loss

    def _broadcast_from_owners(self, tensors_and_owners):
        for tensor, owner in tensors_and_owners:
            dist.broadcast(tensor, src=owner)

    def state_dict(self):
        """Complete state on every rank. Distributed: collective (every rank must call it), owners broadcast their
        state; a parameter that never had state appears with zero buffers, which is exactly its fresh state."""
        state_dict = super().state_dict()
        if self.world_size == 1:
            return state_dict
        owner, full_state, transfers = self._owners(), {}, []
        for index, p in enumerate(self._params()):  # same numbering as torch.optim.Optimizer.state_dict
            state = self._state(p) if owner[p] == self.rank else self._fresh_state(p)
            full_state[index] = state
            transfers += [(state["momentum_buffer"], owner[p]), (state["second_moment"], owner[p])]
        self._broadcast_from_owners(transfers)
        state_dict["state"] = full_state
        return state_dict

    def load_state_dict(self, state_dict):
        """Load a complete state (from state_dict() of any world size); in distributed mode keep only the owned part."""
        super().load_state_dict(state_dict)
        for p in self.state:  # the base class casts floating state to the parameter's dtype; S stays fp32 here
            if "second_moment" in self.state[p]:
                self.state[p]["second_moment"] = self.state[p]["second_moment"].float()
        if self.world_size > 1:
            owner = self._owners()
            for p in [p for p in self.state if owner[p] != self.rank]:
                del self.state[p]
