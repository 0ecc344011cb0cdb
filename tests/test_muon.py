"""Tests for muon.py: the Muon variant's pieces against the release's formulas, a full step against a plain fp32
reference, AdamW against its formula, state reset, the zero-LR re-warm step, no-grad = zero gradient, Polar-Express
precisions, ownership, and the distributed transport (1, 2 and 4 gloo processes through growth, byte counts, gradient
memory, sharded DCP checkpoints resumed on another world size)."""
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import muon

SPEC_COEFFS = [  # the release's coefficients, copied here so a typo in muon.py cannot hide
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]


def relative_error(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def reference_muon_step(weight, grad, state, lr, wd, mu, beta2=0.95):
    """The release's Muon for one matrix, plainly, in fp32 (no bf16 anywhere)."""
    rows, cols = weight.shape
    state["m"] = mu * state["m"] + (1 - mu) * grad
    u = (1 - mu) * grad + mu * state["m"]
    u = u / u.norm(dim=1, keepdim=True).clamp(min=1e-7)
    x = u / (u.norm() * 1.02 + 1e-6)
    for a, b, c in SPEC_COEFFS:
        if rows > cols:
            A = x.T @ x
            x = a * x + x @ (b * A + c * A @ A)
        else:
            A = x @ x.T
            x = a * x + (b * A + c * A @ A) @ x
    v = (x ** 2).mean(dim=1, keepdim=True) if rows >= cols else (x ** 2).mean(dim=0, keepdim=True)
    state["s"] = beta2 * state["s"] + (1 - beta2) * v
    scaled = x / torch.sqrt(torch.clamp(state["s"], min=1e-10))
    update = scaled * x.norm() / scaled.norm().clamp(min=1e-10)
    lr_s = lr * math.sqrt(max(1.0, rows / cols))
    mask = (update * weight >= 0).float()
    return weight - lr_s * update - lr_s * wd * weight * mask


def test_momentum_schedule():
    assert muon.muon_momentum(0) == pytest.approx(0.85, abs=1e-12)
    assert muon.muon_momentum(150) == pytest.approx(0.90, abs=1e-12)
    assert muon.muon_momentum(299) == pytest.approx(0.85 + 0.10 * 299 / 300, abs=1e-12)
    assert muon.muon_momentum(300) == pytest.approx(0.95, abs=1e-12)
    assert muon.muon_momentum(5000) == pytest.approx(0.95, abs=1e-12)


@pytest.mark.parametrize("shape", [(64, 64), (96, 32), (32, 96)])
def test_polar_express_is_near_orthogonal(shape):
    torch.manual_seed(0)
    k = min(shape)
    left, _ = torch.linalg.qr(torch.randn(shape[0], k))
    right, _ = torch.linalg.qr(torch.randn(shape[1], k))
    singular = torch.logspace(-2, 0, k)  # condition number 100, arbitrary overall scale
    out = muon.polar_express(7.0 * left @ torch.diag(singular) @ right.T)
    assert out.dtype == torch.bfloat16 and out.shape == shape
    sv = torch.linalg.svdvals(out.float())
    assert sv.min() > 0.75 and sv.max() < 1.25, (sv.min(), sv.max())
    assert relative_error(out.float(), left @ right.T) < 0.15  # and it is the polar factor, not any orthogonal matrix
    gaussian_sv = torch.linalg.svdvals(muon.polar_express(torch.randn(3 * k, k) if shape[0] > shape[1] else
                                                          torch.randn(k, 3 * k)).float())
    assert gaussian_sv.min() > 0.75 and gaussian_sv.max() < 1.25


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (32, 32)])
def test_second_moment_rescaling_preserves_frobenius_norm(shape):
    torch.manual_seed(1)
    x = (torch.randn(shape) * torch.rand(shape[0], 1) * 3).bfloat16()
    initial = torch.rand(muon.second_moment_shape(shape)) * 0.01
    second_moment = initial.clone()
    out = muon.normuon_rescale(x, second_moment, muon.bf16_scalar(0.95))
    assert out.dtype == torch.bfloat16
    assert abs(out.float().norm() / x.float().norm() - 1) < 5e-3
    beta2 = 0.94921875  # bf16(0.95), what the release's kernel effectively uses
    xf = x.float()
    v = (xf ** 2).mean(dim=1, keepdim=True) if shape[0] >= shape[1] else (xf ** 2).mean(dim=0, keepdim=True)
    expected_s = beta2 * initial + (1 - beta2) * v
    assert second_moment.shape == expected_s.shape
    assert torch.allclose(second_moment, expected_s, rtol=1e-5, atol=0)
    expected = xf / expected_s.sqrt()
    expected = expected * xf.norm() / expected.norm()
    assert relative_error(out.float(), expected) < 1e-2
    assert relative_error(out.float(), xf) > 1e-2  # the rows/columns really were rescaled


@pytest.mark.parametrize("shape", [(48, 16), (16, 48)])
def test_muon_direction_uses_bf16_beta2(shape):
    # From zero state, S = (1 - beta2) * mean(X^2) and the returned update has X's Frobenius norm, so
    # sum(S) * (size of the reduced axis) / ||update||^2 = 1 - beta2 = 0.05078125 (bf16 beta2), not 0.05.
    torch.manual_seed(4)
    grad = torch.randn(shape)
    momentum_buffer, second_moment = torch.zeros(shape), torch.zeros(muon.second_moment_shape(shape))
    update = muon.muon_direction(grad, momentum_buffer, second_moment, momentum=0.9)
    reduced = shape[1] if shape[0] >= shape[1] else shape[0]
    ratio = (second_moment.sum() * reduced / update.float().square().sum()).item()
    assert ratio == pytest.approx(0.05078125, rel=3e-3)
    assert torch.allclose(momentum_buffer, 0.1 * grad)


def test_cautious_weight_decay_mask():
    weight = torch.tensor([[1.0, -1.0, 2.0, -2.0, 3.0, -3.0]])
    update = torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0, 0.0]]).bfloat16()
    lr, wd = 0.5, 0.25  # exact in bf16, lr * wd = 0.125
    new = weight.clone()
    muon.apply_update(new, update, lr, wd)
    # signs agree (or update == 0) -> decayed; signs disagree -> only the update moves it
    decayed = torch.tensor([[True, False, False, True, True, True]])
    expected = weight - lr * update.float() - lr * wd * weight * decayed
    assert torch.equal(new, expected)
    assert new[0, 4] == 3.0 * (1 - 0.125) and new[0, 1] == -1.5


def test_shape_lr_factor():
    assert muon.shape_lr_factor((4 * 64, 64)) == pytest.approx(2.0)
    assert muon.shape_lr_factor((int(8 / 3 * 768), 768)) == pytest.approx(math.sqrt(2048 / 768))
    assert muon.shape_lr_factor((64, 64)) == 1.0
    assert muon.shape_lr_factor((64, 4 * 64)) == 1.0


def make_matrices(seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(48, 16), (16, 48), (32, 32), (32, 32), (64, 16), (24, 24)]
    return [torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.1) for shape in shapes]


def make_grads(params, step, seed):
    generator = torch.Generator().manual_seed(1000 * step + seed)
    return [torch.randn(p.shape, generator=generator) * 0.01 for p in params]


def schedule(step):
    return 0.02 * (1.0, 0.7, 0.0, 0.5, 0.25)[step], muon.muon_momentum(100 * step)  # lr, momentum (LR 0 at step 2)


@pytest.mark.parametrize("polar_express_dtype", ["bf16", "fp32"])
def test_full_step_matches_reference(polar_express_dtype):
    """Four steps (one at LR 0) on tall, wide and square matrices, two of the same shape (updated as one batch), against
    the plain fp32 reference. A bf16 Polar-Express differs from fp32 by ~5 % (its rounding is amplified by the large
    coefficients; even a bf16 reimplementation that only normalises in fp32 first differs by that much), hence 12 %."""
    params = make_matrices()
    opt = muon.Muon(params, lr=0.02, weight_decay=0.1, polar_express_dtype=polar_express_dtype)
    reference_states = [dict(m=torch.zeros_like(p), s=torch.zeros(muon.second_moment_shape(p.shape))) for p in params]
    for step in range(4):
        lr, mu = schedule(step)
        before = [p.detach().clone() for p in params]
        grads = make_grads(params, step, seed=7)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        for group in opt.param_groups:
            group["lr"], group["momentum"] = lr, mu
        opt.step()
        for i, p in enumerate(params):
            expected = reference_muon_step(before[i], grads[i], reference_states[i], lr, 0.1, mu)
            assert torch.allclose(opt.state[p]["momentum_buffer"], reference_states[i]["m"], rtol=1e-5, atol=1e-9)
            assert relative_error(opt.state[p]["second_moment"], reference_states[i]["s"]) < 0.12, (step, i)
            if lr == 0:
                assert torch.equal(p.detach(), before[i])
            else:
                assert relative_error(p.detach() - before[i], expected - before[i]) < 0.12, (step, i)
    tall_step = params[0].detach() - before[0]  # last step of the 48 x 16 matrix vs the 16 x 48 one: sqrt(3) x larger
    assert tall_step.norm() / params[1].detach().sub(before[1]).norm() == pytest.approx(math.sqrt(3), rel=0.05)


def test_zero_lr_step_keeps_weights_but_updates_moments():
    params = make_matrices()[:3]
    before = [p.detach().clone() for p in params]
    opt = muon.Muon(params, lr=0.0, weight_decay=0.5, momentum=0.9)
    for p, g in zip(params, make_grads(params, 0, seed=3)):
        p.grad = g
    opt.step()
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)
        assert opt.state[p]["momentum_buffer"].abs().sum() > 0 and opt.state[p]["second_moment"].abs().sum() > 0
    embedding = torch.nn.Parameter(torch.randn(10, 4))
    before_embedding = embedding.detach().clone()
    adamw = torch.optim.AdamW([embedding], lr=0.0, weight_decay=0.5)
    embedding.grad = torch.randn(10, 4)
    adamw.step()
    assert torch.equal(embedding.detach(), before_embedding)
    assert adamw.state[embedding]["exp_avg"].abs().sum() > 0


def test_missing_grad_is_the_release_zero_gradient_step():
    """No .grad = the release's explicit zero gradient, bit for bit: pure decay while the state is zero (no state
    read or written), the full zero-gradient update once the state is non-zero; also after reset_state."""
    implicit, explicit = make_matrices()[:2], make_matrices()[:2]
    opts = [muon.Muon(params, lr=0.02, weight_decay=0.1) for params in (implicit, explicit)]
    for step in range(5):
        grads = make_grads(implicit, step, seed=11)
        for params in (implicit, explicit):
            params[0].grad = grads[0].clone()
            params[1].grad = grads[1].clone() if step == 2 else None  # params[1]: no grad, then one, then none again
        explicit[1].grad = explicit[1].grad if step == 2 else torch.zeros_like(explicit[1])
        if step == 4:
            for opt, params in zip(opts, (implicit, explicit)):
                muon.reset_state(opt, [params[1]])
        for opt in opts:
            set_step(opt, step % 4)
            opt.step()
        for a, b in zip(implicit, explicit):
            assert torch.equal(a.detach(), b.detach()), step
        for key in ("momentum_buffer", "second_moment"):
            assert torch.equal(opts[0].state[implicit[1]][key], opts[1].state[explicit[1]][key]), (step, key)
    assert opts[0].stepped == [True, False]  # reset at step 4, not stepped with a gradient since
    with pytest.raises(ValueError):
        muon.Muon([torch.nn.Parameter(torch.zeros(3))], lr=0.1)


def conditioned(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    k = min(shape)
    left, _ = torch.linalg.qr(torch.randn(shape[0], k, generator=generator))
    right, _ = torch.linalg.qr(torch.randn(shape[1], k, generator=generator))
    return left, right, 7.0 * left @ torch.diag(torch.logspace(-2, 0, k)) @ right.T  # condition number 100


@pytest.mark.parametrize("shape", [(64, 64), (96, 32), (32, 96)])
def test_polar_express_fp32_path_matches_bf16(shape):
    """Both precisions land in the same singular-value band, and the fp32 path differs from the bf16 one by no more
    than the bf16 iteration moves when its input moves by one bf16 rounding (the iteration amplifies rounding: both
    are ~4 %), so the fp32 path is the release's numerics to bf16 tolerance."""
    left, right, u = conditioned(shape, seed=0)
    outputs = {}
    for dtype in (torch.bfloat16, torch.float32):
        out = muon.polar_express(u, dtype)
        assert out.dtype == torch.bfloat16 and out.shape == shape
        sv = torch.linalg.svdvals(out.float())
        assert sv.min() > 0.75 and sv.max() < 1.25, (dtype, sv.min(), sv.max())
        assert relative_error(out.float(), left @ right.T) < 0.15
        outputs[dtype] = out.float()
    nudged = u * (1 + 2 ** -9 * torch.randn(shape, generator=torch.Generator().manual_seed(1)))
    bf16_spread = relative_error(muon.polar_express(nudged, torch.bfloat16).float(), outputs[torch.bfloat16])
    difference = relative_error(outputs[torch.float32], outputs[torch.bfloat16])
    assert difference < max(2 * bf16_spread, 0.02) and difference < 0.08, (difference, bf16_spread)


def test_polar_express_dtype_by_hardware(monkeypatch):
    monkeypatch.setattr(muon, "cpu_flags", lambda: {"avx2", "fma"})
    assert muon.resolve_polar_express_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(muon, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert muon.resolve_polar_express_dtype("auto", "cpu") == torch.bfloat16
    monkeypatch.setattr(muon, "cpu_flags", lambda: {"amx_bf16", "amx_tile"})
    assert muon.resolve_polar_express_dtype("auto", "cpu") == torch.bfloat16
    assert muon.resolve_polar_express_dtype("bf16", "cpu") == torch.bfloat16
    assert muon.resolve_polar_express_dtype("fp32", "cpu") == torch.float32
    monkeypatch.setattr(muon, "cpu_flags", lambda: set())
    params = make_matrices()[:1]
    assert muon.Muon(params, lr=0.02).polar_express_dtype == torch.float32
    assert muon.Muon(params, lr=0.02, polar_express_dtype="bf16").polar_express_dtype == torch.bfloat16
    with pytest.raises(ValueError):
        muon.Muon(params, lr=0.02, polar_express_dtype="fp16")


def test_adamw_is_the_formula():
    torch.manual_seed(2)
    weight = torch.nn.Parameter(torch.randn(6, 5))
    lr, wd, beta1, beta2, eps = 0.01, 0.1, 0.8, 0.95, 1e-3  # eps large enough to tell inside from outside the sqrt
    opt = torch.optim.AdamW([weight], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
    w, m, v = weight.detach().clone().double(), 0.0, 0.0
    for t in (1, 2, 3):
        grad = torch.randn(6, 5) * 1e-3
        weight.grad = grad.clone()
        opt.step()
        g = grad.double()
        w = w * (1 - lr * wd)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        w = w - (lr / (1 - beta1 ** t)) * m / (torch.sqrt(v / (1 - beta2 ** t)) + eps)
        assert torch.allclose(weight.detach().double(), w, rtol=1e-6, atol=1e-7)


def test_reset_state_gives_fresh_state():
    params = make_matrices()[:3]
    twin = torch.nn.Parameter(params[1].detach().clone())
    opt = muon.Muon(params, lr=0.02, weight_decay=0.1)
    for step in range(2):
        for p, g in zip(params, make_grads(params, step, seed=5)):
            p.grad = g
        opt.step()
    kept = opt.state[params[0]]["momentum_buffer"].clone()
    muon.reset_state(opt, [params[1]])
    assert all(t.abs().sum() == 0 for t in opt.state[params[1]].values())
    assert torch.equal(opt.state[params[0]]["momentum_buffer"], kept)
    # the next step of a reset parameter equals a never-stepped optimizer's step
    twin.data.copy_(params[1].detach())
    fresh = muon.Muon([twin], lr=0.02, weight_decay=0.1)
    grad = torch.randn(params[1].shape)
    params[1].grad, twin.grad = grad.clone(), grad.clone()
    params[0].grad = params[2].grad = None
    opt.step()
    fresh.step()
    assert torch.equal(params[1].detach(), twin.detach())

    weight = torch.nn.Parameter(torch.randn(5, 4))
    adamw = torch.optim.AdamW([weight], lr=0.01, weight_decay=0.1)
    for _ in range(3):
        weight.grad = torch.randn(5, 4)
        adamw.step()
    muon.reset_state(adamw, [weight])
    assert all(t.abs().sum() == 0 for t in adamw.state[weight].values())
    twin = torch.nn.Parameter(weight.detach().clone())
    fresh = torch.optim.AdamW([twin], lr=0.01, weight_decay=0.1)
    weight.grad = twin.grad = torch.randn(5, 4)
    adamw.step()
    fresh.step()
    assert torch.equal(weight.detach(), twin.detach())


# ---------------------------------------------------------------------------------------------------------------------
# The fixed-order fold (pure functions) and the batched update's independence of its batch partners.

def random_leaves(n, seed):
    """fp32 leaves spread over 6 orders of magnitude: their sums round differently in different orders."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 5, generator=generator) * 10.0 ** torch.randint(-3, 3, (3, 5), generator=generator)
            for _ in range(n)]


def test_fold_equals_the_fold_of_per_time_subtrees_at_any_world_size():
    """The owner's fold (rank r runs global micro-batch k*W + r; at time k the W leaves are summed as a tree and pushed
    at level log2 W) equals the fold of all M leaves one by one, bit for bit, for any M / W, also not a power of two;
    and the leaves are such that another order (left to right) gives other bits."""
    order_matters = False
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 40):
        leaves = random_leaves(m, seed=m)
        reference = muon.fold([leaf.clone() for leaf in leaves])
        for world in (1, 2, 4, 8):
            if m % world:
                continue
            stack = []
            for k in range(m // world):
                subtree = muon.tree_sum([leaf.clone() for leaf in leaves[k * world:(k + 1) * world]])
                muon.push(stack, muon.leaf_level(world), subtree)
            assert torch.equal(muon.collapse(stack), reference), (m, world)
        left_to_right = leaves[0].clone()
        for leaf in leaves[1:]:
            left_to_right += leaf
        order_matters |= not torch.equal(left_to_right, reference)
    assert order_matters
    assert [muon.leaf_level(w) for w in (1, 2, 4, 8, 16)] == [0, 1, 2, 3, 4]
    for world in (3, 6, 12):
        with pytest.raises(ValueError, match="power-of-two"):
            muon.leaf_level(world)


@pytest.mark.parametrize("polar_express_dtype", [torch.float32, torch.bfloat16])
def test_batched_update_is_independent_of_its_batch_partners_on_cpu(polar_express_dtype):
    """Muon._update stacks the owned same-shape matrices of a group, and which those are depends on the world size: on
    CPU a matrix's update, momentum, second moment and new weights are bitwise the same alone, with partners, and at
    another position in the batch (so the fixed reduction order needs no other batching)."""
    generator = torch.Generator().manual_seed(0)
    for shape in [(32, 32), (96, 32), (32, 96)]:
        grads, weights = (torch.randn(6, *shape, generator=generator) for _ in range(2))
        momenta = torch.randn(6, *shape, generator=generator)
        second = torch.rand(6, *muon.second_moment_shape(shape), generator=generator)

        def update(batch):
            momentum, moment, weight = momenta[batch].clone(), second[batch].clone(), weights[batch].clone()
            out = muon.muon_direction(grads[batch], momentum, moment, 0.9, polar_express_dtype)
            muon.apply_update(weight, out, 0.02, 0.1)
            return out, momentum, moment, weight
        alone = update([0])
        for batch in ([0, 1], [0, 1, 2], [0, 5, 3, 4, 1, 2], [2, 0]):
            position = batch.index(0)
            for a, b in zip(alone, update(batch)):
                assert torch.equal(a[0], b[position]), (shape, batch)


# ---------------------------------------------------------------------------------------------------------------------
# Ownership, buckets and byte accounting (pure functions).

def tiny_config():
    import model
    return model.config_for("untied_grow", 3, width_per_depth=8, head_dim=8, seq_len=16, vocab_size=64, mlp_multiple=8)


def test_ownership_is_balanced_and_the_bytes_function_matches_it():
    import model
    matrices = model.GPT(tiny_config()).param_groups()["matrix"]  # 6 blocks: prelude, 4 untied cores, coda
    shapes = [p.shape for p in matrices]
    for world in (1, 2, 4):
        owners = muon.assign_owners(shapes, world)
        load = [sum(math.prod(s) for s, r in zip(shapes, owners) if r == rank) for rank in range(world)]
        assert max(load) - min(load) <= max(math.prod(s) for s in shapes), (world, load)
        per_rank = muon.per_rank_bytes(shapes, world)
        assert sum(r["owned_grads"] for r in per_rank) == 4 * sum(p.numel() for p in matrices)
        assert [r["owned_grads"] for r in per_rank] == [4 * n for n in load]
    # before growth (cores 3 and 4 dormant) the active matrices still pair up into stacks: no owner-bucket fallback
    owners = muon.assign_owners(shapes, 2)
    active = [i for i in range(len(matrices)) if i // 7 not in (3, 4)]  # 7 matrices per block
    buckets = muon.plan_buckets(active, shapes, owners, 2, bucket_bytes=4 * 24 * 64 * 4)
    assert all(b.scatter for b in buckets) and sorted(i for b in buckets for i in b.members) == active
    assert len(buckets) > 1  # the bucket size splits them
    for b in buckets:
        assert len({sum(math.prod(shapes[i]) for i in chunk) for chunk in b.chunks}) == 1  # equal chunks


# ---------------------------------------------------------------------------------------------------------------------
# Distributed: model.GPT at a tiny Untied-Grow config trained through growth with 1, 2 and 4 gloo processes
# (micro-batch accumulation, sync only on the last micro-batch), sharded DCP checkpoints and byte counts.

GLOBAL_SEQS, STEPS, GROW_AT, SAVE_AT = 4, 7, 3, 4


def set_step(opt, step):
    for group in opt.param_groups:
        group["lr"], group["momentum"] = schedule(step % 5)


def build_run(fixed_order=False):
    import model
    torch.manual_seed(0)
    net = model.GPT(tiny_config())
    for p in net.parameters():  # non-zero out-projections, so weight decay and updates are visible everywhere
        torch.nn.init.normal_(p, std=0.05)
    groups = net.param_groups()
    names = [n for n, p in net.named_parameters() if n.startswith("transformer.h.")]
    opt = muon.Muon(groups["matrix"], lr=0.02, weight_decay=0.1, bucket_mb=0.02, param_names=names,
                    fixed_order=fixed_order)
    adam_params = groups["embedding"] + groups["unembedding"]
    adamw = torch.optim.AdamW(adam_params, lr=0.01, weight_decay=0.1)
    return net, opt, adamw, muon.ReplicatedGrads(adam_params, fixed_order=fixed_order)


def exact_grad(step, sequence, index, shape):
    """A per-sequence gradient on a coarse grid (k / 1024, |k| <= 8): sums and power-of-two means of such values are
    exact in fp32, so every world size averages to bit-identical gradients. (Real losses differ in the last bit with
    the summation order, and the update's bf16 rounding turns that into ~1e-5 weight differences within a few steps,
    which would test luck, not the transport.)"""
    generator = torch.Generator().manual_seed(100_000 * step + 1_000 * sequence + index)
    return torch.randint(-8, 9, shape, generator=generator).float() / 1024


def train_step(net, opt, adamw, replicated, step, rank, world, probe=None):
    """One step as train.py runs it: growth (copy cores, fresh state), micro-batches of one sequence with sync only on
    the last, ReplicatedGrads.wait, the optimizers. Blocks 3 and 4 (cores 3, 4) get no gradient before growth, block 4
    none on the last step (a 3-pass step: state but no gradient)."""
    if step == GROW_AT:
        muon.reset_state(opt, net.grow(4))
    skipped = (3, 4) if step < GROW_AT else (4,) if step == STEPS - 1 else ()
    matrices = opt.param_groups[0]["params"]
    trained = [(i, p) for i, p in enumerate(matrices) if i // 7 not in skipped]  # 7 matrices per block
    opt.expect_gradients([p for _, p in trained])  # as train.py does: no bucket waits for a dormant core
    trained += [(len(matrices) + k, p) for k, p in enumerate(replicated.params)]
    set_step(opt, step)
    mine = range(rank * GLOBAL_SEQS // world, (rank + 1) * GLOBAL_SEQS // world)
    for k, sequence in enumerate(mine):
        opt.sync_grads = replicated.sync_grads = k == len(mine) - 1  # communicate on the last micro-batch only
        loss = sum((p * exact_grad(step, sequence, i, p.shape)).sum() for i, p in trained) / len(mine)
        loss.backward()
    if probe is not None:
        probe["grads_after_backward"] = [p.grad is not None for p in matrices]
    replicated.wait()
    opt.step()
    adamw.step()
    net.zero_grad(set_to_none=True)


def count_collectives(counts, world):
    """Wrap the collectives muon.py calls; per-rank wire bytes of bandwidth-optimal (ring) algorithms."""
    factors = dict(reduce_scatter_single=(world - 1) / world, all_gather_single=(world - 1) / world,
                   all_reduce=2 * (world - 1) / world, reduce=1.0, broadcast=1.0,
                   all_to_all_single=(world - 1) / world, gather=1.0)  # all_to_all: keeps 1/world of its input
    for name, factor in factors.items():
        original = getattr(dist, name)

        def counted(*args, _original=original, _name=name, _factor=factor, **kwargs):
            tensor = args[1] if _name in ("reduce_scatter_single", "all_to_all_single") else args[0]  # full size
            counts.append((_name, tensor.numel() * tensor.element_size(), _factor))
            return _original(*args, **kwargs)
        setattr(dist, name, counted)


def storage_bytes(opt):
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for state in opt.state.values() for t in state.values()}
    return sum(storages.values())


def trajectory(rank, world, out_dir, counts):
    """Uninterrupted run (world 2 also saves a DCP checkpoint, counts bytes into `counts` and checks memory), then a
    run resumed from the 2-rank checkpoint at SAVE_AT."""
    import torch.distributed.checkpoint as dcp
    net, opt, adamw, replicated = build_run()
    report = dict(steps={})
    for step in range(STEPS):
        if step == SAVE_AT and world == 2:
            before = storage_bytes(opt)
            shard = opt.state_dict()
            assert all(t.untyped_storage().data_ptr() in {s.untyped_storage().data_ptr() for st in opt.state.values()
                                                           for s in st.values()}
                       for k, t in shard.items() if k.startswith("state."))
            dcp.save(dict(model=net.state_dict(), muon=shard), checkpoint_id=f"{out_dir}/ckpt")
            if rank == 0:
                torch.save(adamw.state_dict(), f"{out_dir}/adamw.pt")
            report.update(state_bytes_before=before, state_bytes_after=storage_bytes(opt),
                          predicted_state_bytes=muon.per_rank_bytes([p.shape for p in opt._params()], 2)[rank]["state"],
                          shard={k: v.clone() for k, v in shard.items() if k.startswith("state.")})
        start = len(counts)
        probe = {}
        train_step(net, opt, adamw, replicated, step, rank, world, probe)
        report["steps"][step] = dict(counts=counts[start:], grads_after_backward=probe["grads_after_backward"],
                                     grads_after_step=[p.grad is not None for p in opt._params()])
    report["final"] = {k: v.clone() for k, v in net.state_dict().items()}
    if world == 2:
        dist.barrier()
    net, opt, adamw, replicated = build_run()
    net.grow(4)  # SAVE_AT is after growth: the checkpoint holds the grown model
    state = dict(model=net.state_dict(), muon=opt.state_dict())
    dcp.load(state, checkpoint_id=f"{out_dir}/ckpt")
    opt.load_state_dict(state["muon"])
    adamw.load_state_dict(torch.load(f"{out_dir}/adamw.pt", map_location="cpu"))
    report["loaded"] = {k: v.clone() for k, v in opt.state_dict().items() if k.startswith("state.")}
    for step in range(SAVE_AT, STEPS):
        train_step(net, opt, adamw, replicated, step, rank, world)
    report["resumed"] = {k: v.clone() for k, v in net.state_dict().items()}
    return report


FIXED_SEQS = 8  # global micro-batches per step in the fixed-order runs: 8, 4 and 2 per rank on 1, 2 and 4 ranks


def random_grad(step, micro_batch, index, shape):
    """A per-micro-batch gradient of arbitrary fp32 values: unlike exact_grad, its sums depend on their order."""
    generator = torch.Generator().manual_seed(100_000 * step + 1_000 * micro_batch + index)
    return torch.randn(shape, generator=generator)


def fixed_trajectory(rank, world, counts):
    """train.py's --fixed-reduce-order step through growth: rank r runs global micro-batches k*W + r, every loss is
    scaled by 1/M, and finish_micro_batch follows every backward. -> final weights, and on 2 ranks the collectives of
    each micro-batch and of each step's end."""
    net, opt, adamw, replicated = build_run(fixed_order=True)
    report = dict(steps={})
    for step in range(STEPS):
        if step == GROW_AT:
            muon.reset_state(opt, net.grow(4))
        skipped = (3, 4) if step < GROW_AT else (4,) if step == STEPS - 1 else ()
        matrices = opt.param_groups[0]["params"]
        trained = [(i, p) for i, p in enumerate(matrices) if i // 7 not in skipped]
        trained += [(len(matrices) + k, p) for k, p in enumerate(replicated.params)]
        set_step(opt, step)
        marks = [len(counts)]
        for k in range(FIXED_SEQS // world):
            j = k * world + rank
            (sum((p * random_grad(step, j, i, p.shape)).sum() for i, p in trained) / FIXED_SEQS).backward()
            replicated.finish_micro_batch()
            opt.finish_micro_batch()
            marks.append(len(counts))
        replicated.wait()
        opt.step()
        adamw.step()
        net.zero_grad(set_to_none=True)
        report["steps"][step] = dict(micro_batches=[counts[a:b] for a, b in zip(marks, marks[1:])],
                                     end=counts[marks[-1]:])
    report["final"] = {k: v.clone() for k, v in net.state_dict().items()}
    return report


def transport_worker(rank, world, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        counts = []
        if world == 2:
            count_collectives(counts, world)
        report = trajectory(rank, world, out_dir, counts)
        report["fixed"] = fixed_trajectory(rank, world, counts)
        torch.save(report, f"{out_dir}/w{world}_rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown: gloo's worker thread can still be freeing a finished collective's tensors then, needs
    # the GIL and aborts the process (known torch issue, pytorch/pytorch#190489). All results are on disk by now.
    os._exit(0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import socket
    out_dir = tmp_path_factory.mktemp("transport")
    results = {}
    for world in (2, 4):  # 2 first: it writes the checkpoint the others resume from
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(transport_worker, args=(world, port, str(out_dir)), nprocs=world, join=True)
        results[world] = [torch.load(out_dir / f"w{world}_rank{r}.pt", map_location="cpu") for r in range(world)]
    results[1] = [dict(trajectory(0, 1, str(out_dir), []), fixed=fixed_trajectory(0, 1, []))]  # no process group
    return results


def assert_close_states(a, b, tol):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=tol, atol=tol), (k, (a[k] - b[k]).abs().max())


def test_1_2_4_processes_give_the_same_weights_through_growth(runs):
    reference = runs[1][0]["final"]
    for world in (2, 4):
        for r in range(world):
            assert all(torch.equal(runs[world][r]["final"][k], runs[world][0]["final"][k]) for k in reference)
        assert_close_states(runs[world][0]["final"], reference, 1e-6)
    initial = build_run()[0].state_dict()
    assert all(not torch.allclose(reference[k], initial[k], rtol=1e-3, atol=1e-4) for k in reference)  # all moved


def test_sharded_checkpoint_resumes_on_1_2_and_4_ranks(runs):
    saved = {k: v for r in runs[2] for k, v in r["shard"].items()}  # the union of the 2 ranks' shards
    assert set(runs[2][0]["shard"]).isdisjoint(runs[2][1]["shard"])
    assert {k for r in runs[1] for k in r["loaded"]} == set(saved)
    for world in (1, 2, 4):
        loaded = {k: v for r in runs[world] for k, v in r["loaded"].items()}
        assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved), world
        assert sum(len(r["loaded"]) for r in runs[world]) == len(saved)  # each rank keeps only what it owns
    for r in range(2):  # same world size: bit-identical to the uninterrupted run
        assert all(torch.equal(runs[2][r]["resumed"][k], runs[2][r]["final"][k]) for k in runs[2][r]["final"])
    for world in (1, 4):
        assert_close_states(runs[world][0]["resumed"], runs[2][0]["final"], 1e-6)
        for r in range(world):
            assert all(torch.equal(runs[world][r]["resumed"][k], runs[world][0]["resumed"][k])
                       for k in runs[world][0]["resumed"])


def test_save_keeps_optimizer_memory(runs):
    for r in runs[2]:
        assert r["state_bytes_after"] == r["state_bytes_before"] == r["predicted_state_bytes"]


def test_bytes_per_step_and_gradient_memory(runs):
    """Per step on 2 ranks: Muon's traffic <= 1.05 x (one reduce-scatter + one all-gather of the matrices it moves),
    counted as ring wire bytes; payloads say exactly which matrices moved: none of the dormant cores."""
    import model
    cfg = tiny_config()
    matrix_bytes = [4 * p.numel() for p in model.GPT(cfg).param_groups()["matrix"]]
    adam_bytes = 4 * 2 * cfg.padded_vocab * cfg.width
    cases = {1: ((3, 4), (3, 4)),  # before growth: cores 3 and 4 dormant (zero state): no gradient, no weights
             GROW_AT + 1: ((), ()),  # after growth: everything
             STEPS - 1: ((4,), ())}  # 3 passes: core 4 has state but no gradient: only its new weights travel
    for step, (no_grad_blocks, fixed_blocks) in cases.items():
        info = runs[2][0]["steps"][step]
        reduced = sum(n for i, n in enumerate(matrix_bytes) if i // 7 not in no_grad_blocks)
        gathered = sum(n for i, n in enumerate(matrix_bytes) if i // 7 not in fixed_blocks)
        muon_counts = [c for c in info["counts"] if c[0] != "all_reduce"]
        reduce_payload = sum(n for name, n, _ in muon_counts if name in ("reduce_scatter_single", "reduce"))
        gather_payload = sum(n for name, n, _ in muon_counts if name in ("all_gather_single", "broadcast"))
        assert (reduce_payload, gather_payload) == (reduced, gathered), step
        wire = sum(n * factor for _, n, factor in muon_counts)
        assert wire <= 1.05 * 0.5 * (reduced + gathered), (step, wire / (0.5 * (reduced + gathered)))
        assert sum(n for name, n, _ in info["counts"] if name == "all_reduce") == adam_bytes
        assert not any(info["grads_after_step"])
    # expect_gradients: the bucket plan matches the gradients, so all are reduced (and freed) during backward, also
    # at step 0 (dormant cores) and at the growth step (new cores)
    for step in range(STEPS):
        assert not any(runs[2][0]["steps"][step]["grads_after_backward"]), step


def test_fixed_order_1_2_4_processes_give_bit_identical_weights_through_growth(runs):
    """Order-sensitive gradients, 8 global micro-batches (8, 4, 2 per rank), growth and dormant cores: with the fixed
    reduction order every world size ends with the same weights to the bit (default order: 1e-6, see above)."""
    reference = runs[1][0]["fixed"]["final"]
    for world in (2, 4):
        for r in range(world):
            final = runs[world][r]["fixed"]["final"]
            assert all(torch.equal(final[k], reference[k]) for k in reference), (world, r)
    initial = build_run()[0].state_dict()
    assert all(not torch.equal(reference[k], initial[k]) for k in reference)


def test_fixed_order_bytes_per_micro_batch_and_step(runs):
    """On 2 ranks, per micro-batch: every trained gradient once (all_to_all / gather payloads = the trained matrices
    and the AdamW parameters; wire <= 1.05 x one reduce-scatter of them); per step: one all-gather of the weights that
    moved and of the AdamW gradients. Dormant cores: 0 bytes."""
    import model
    cfg = tiny_config()
    matrix_bytes = [4 * p.numel() for p in model.GPT(cfg).param_groups()["matrix"]]
    adam_bytes = 4 * 2 * cfg.padded_vocab * cfg.width  # padded_vocab * width is even: no chunk padding on 2 ranks
    cases = {1: ((3, 4), (3, 4)), GROW_AT + 1: ((), ()), STEPS - 1: ((4,), ())}  # as in the default-order test
    for step, (no_grad_blocks, fixed_blocks) in cases.items():
        info = runs[2][0]["fixed"]["steps"][step]
        reduced = sum(n for i, n in enumerate(matrix_bytes) if i // 7 not in no_grad_blocks) + adam_bytes
        gathered = sum(n for i, n in enumerate(matrix_bytes) if i // 7 not in fixed_blocks) + adam_bytes
        assert len(info["micro_batches"]) == FIXED_SEQS // 2
        for counts in info["micro_batches"]:
            assert {name for name, _, _ in counts} <= {"all_to_all_single", "gather"}, step
            assert sum(n for _, n, _ in counts) == reduced, step
            wire = sum(n * factor for _, n, factor in counts)
            assert wire <= 1.05 * 0.5 * reduced, (step, wire / (0.5 * reduced))
        assert {name for name, _, _ in info["end"]} <= {"all_gather_single", "broadcast"}, step
        assert sum(n for _, n, _ in info["end"]) == gathered, step


@pytest.mark.parametrize("shape", [(64, 64), (96, 32), (32, 96), (3, 48, 16)])
def test_polar_express_gemm_fused_iteration_is_the_papers_formula(shape):
    """The baddbmm iteration is X <- aX + X(bA + cA^2) with A = X^T X (tall) or X <- aX + (bA + cA^2)X with A = X X^T:
    in float64 it agrees with the formula written out to one final bf16 rounding."""
    u = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = u / (u.norm(dim=(-2, -1), keepdim=True) * muon.POLAR_EXPRESS_SAFETY + muon.POLAR_EXPRESS_EPS)
    for a, b, c in muon.POLAR_EXPRESS_COEFFS:
        if x.size(-2) > x.size(-1):
            gram = x.mT @ x
            x = a * x + x @ (b * gram + c * gram @ gram)
        else:
            gram = x @ x.mT
            x = a * x + (b * gram + c * gram @ gram) @ x
    out = muon.polar_express(u, torch.float64)
    assert out.shape == u.shape and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), x, rtol=2 ** -7, atol=1e-6)
