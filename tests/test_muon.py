"""Tests for muon.py: its pieces against the release's formulas, full steps against a plain fp32 reference, no-grad =
zero gradient, Polar-Express precisions, ownership, and Muon on FSDP2 shards (2 and 4 gloo processes: one's bits)."""
import math
import os

import pytest
import torch
import torch.distributed as dist

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


def reference_polar_express(u):
    """X <- aX + X(bA + cA^2) with A = X^T X (tall) or X <- aX + (bA + cA^2)X with A = X X^T, in u's dtype."""
    x = u / (u.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)
    for a, b, c in SPEC_COEFFS:
        if x.size(-2) > x.size(-1):
            gram = x.mT @ x
            x = a * x + x @ (b * gram + c * gram @ gram)
        else:
            gram = x @ x.mT
            x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def reference_muon_step(weight, grad, state, lr, wd, mu, beta2=0.95):
    """The release's Muon for one matrix, plainly, in fp32 (no bf16 anywhere)."""
    rows, cols = weight.shape
    state["m"] = mu * state["m"] + (1 - mu) * grad
    u = (1 - mu) * grad + mu * state["m"]
    x = reference_polar_express(u / u.norm(dim=1, keepdim=True).clamp(min=1e-7))
    v = (x ** 2).mean(dim=1, keepdim=True) if rows >= cols else (x ** 2).mean(dim=0, keepdim=True)
    state["s"] = beta2 * state["s"] + (1 - beta2) * v
    scaled = x / torch.sqrt(torch.clamp(state["s"], min=1e-10))
    update = scaled * x.norm() / scaled.norm().clamp(min=1e-10)
    lr_s = lr * math.sqrt(max(1.0, rows / cols))
    mask = (update * weight >= 0).float()
    return weight - lr_s * update - lr_s * wd * weight * mask


def test_momentum_schedule():
    for step, momentum in ((0, 0.85), (150, 0.90), (299, 0.85 + 0.10 * 299 / 300), (300, 0.95), (5000, 0.95)):
        assert muon.muon_momentum(step) == pytest.approx(momentum, abs=1e-12)


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (32, 32)])
def test_normuon_rescaling_keeps_the_frobenius_norm_with_bf16_beta2(shape):
    """NorMuon on X = Polar-Express(U): S <- beta2 S + (1 - beta2) mean(X^2) with beta2 = bf16(0.95) = 0.94921875 (not
    0.95), the update X / sqrt(S) rescaled to X's Frobenius norm."""
    generator = torch.Generator().manual_seed(1)
    u = torch.randn(shape, generator=generator) * torch.rand(shape[0], 1, generator=generator) * 3
    initial = torch.rand(muon.second_moment_shape(shape), generator=generator) * 0.01
    second_moment = initial.clone()
    out, x = muon.orthogonalize(u, second_moment), muon.polar_express(u).float()
    assert out.dtype == torch.bfloat16 and abs(out.float().norm() / x.norm() - 1) < 5e-3
    v = (x ** 2).mean(dim=1 if shape[0] >= shape[1] else 0, keepdim=True)
    expected_s = 0.94921875 * initial + (1 - 0.94921875) * v
    assert second_moment.shape == expected_s.shape and torch.allclose(second_moment, expected_s, rtol=1e-5, atol=0)
    expected = x / expected_s.sqrt() * x.norm() / (x / expected_s.sqrt()).norm()
    assert relative_error(out.float(), expected) < 1e-2
    assert relative_error(out.float(), x) > 1e-2  # the rows/columns really were rescaled


def test_cautious_weight_decay_mask():
    """Signs of update and weight agree (or update == 0): decayed; they disagree: only the update moves it."""
    weight, new = torch.tensor([[1.0, -1.0, 2.0, -2.0, 3.0, -3.0]]), torch.tensor([[1.0, -1.0, 2.0, -2.0, 3.0, -3.0]])
    update = torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0, 0.0]]).bfloat16()
    muon.apply_update(new, update, 0.5, 0.25)  # exact in bf16, lr * wd = 0.125
    decayed = torch.tensor([[True, False, False, True, True, True]])
    assert torch.equal(new, weight - 0.5 * update.float() - 0.125 * weight * decayed)
    assert new[0, 4] == 3.0 * (1 - 0.125) and new[0, 1] == -1.5


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
    """Four steps (one at LR 0) on tall, wide and square matrices, two of one shape (one batch), against the plain fp32
    reference; a bf16 Polar-Express differs from fp32 by ~5 % (the large coefficients amplify rounding), hence 12 %."""
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
            for group in opt.param_groups:
                group["lr"], group["momentum"] = schedule(step % 4)
            opt.step()
        for a, b in zip(implicit, explicit):
            assert torch.equal(a.detach(), b.detach()), step
        for key in ("momentum_buffer", "second_moment"):
            assert torch.equal(opts[0].state[implicit[1]][key], opts[1].state[explicit[1]][key]), (step, key)
    assert opts[0].stepped == [True, False]  # reset at step 4, not stepped with a gradient since


def test_polar_express_dtype_by_hardware(monkeypatch):
    for avx512_bf16, amx, dtype in ((True, False, torch.bfloat16), (False, True, torch.bfloat16),
                                    (False, False, torch.float32)):  # the last one stays for the optimizer below
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        assert muon.resolve_polar_express_dtype("auto", "cpu") == dtype
        assert muon.resolve_polar_express_dtype("bf16", "cpu") == torch.bfloat16
        assert muon.resolve_polar_express_dtype("fp32", "cpu") == torch.float32
    params = make_matrices()[:1]
    assert muon.Muon(params, lr=0.02).polar_express_dtype == torch.float32
    assert muon.Muon(params, lr=0.02, polar_express_dtype="bf16").polar_express_dtype == torch.bfloat16


def test_ownership_is_balanced_and_rounds_pair_one_matrix_per_owner():
    block = [(24, 24)] * 4 + [(64, 24), (64, 24), (24, 64)]  # attention q, k, v, o; MLP gate, fc, proj
    shapes = block * 6  # untied_grow: prelude, 4 untied cores, coda
    for world in (1, 2, 4):
        owners = muon.assign_owners(shapes, world)
        load = [sum(math.prod(s) for s, r in zip(shapes, owners) if r == rank) for rank in range(world)]
        assert max(load) - min(load) <= max(math.prod(s) for s in shapes), (world, load)
        active = [i for i in range(len(shapes)) if i // 7 not in (3, 4)]  # before growth: cores 3, 4 dormant
        rounds = muon.rounds(active, shapes, owners, world)
        assert sorted(i for r in rounds for i in r if i is not None) == active
        for members in rounds:
            assert len(members) == world and len({tuple(shapes[i]) for i in members if i is not None}) == 1
            assert all(owners[i] == r for r, i in enumerate(members) if i is not None)


SHAPES = [(6, 4), (6, 4), (5, 7), (9, 3), (9, 3), (9, 3), (2, 5)]  # rows not divisible by the shard count: padding


def shard_worker(rank, ports, out_dir):
    """On 4 gloo ranks (HSDP 2 x 2), then 2: Muon on FSDP2 shards and a plain one, the same gradients, 3 steps (the last
    without matrix 1's: the zero-gradient step with state; matrix 6 never gets one: decay only)."""
    from torch.distributed.tensor import distribute_tensor
    import train
    torch.set_num_threads(1)
    for world, port in zip((4, 2)[:2 if rank < 2 else 1], ports):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        mesh = train.build_mesh(world, 2, torch.device("cpu"), 5)
        generator = torch.Generator().manual_seed(0)
        start = [torch.randn(*shape, generator=generator) for shape in SHAPES]
        plain = [torch.nn.Parameter(w.clone()) for w in start]
        module = torch.nn.ParameterList([torch.nn.Parameter(w.clone()) for w in start])
        torch.distributed.fsdp.fully_shard(module, mesh=mesh)
        sharded = list(module)
        opts = [muon.Muon(params, lr=0.05, weight_decay=0.1, polar_express_dtype="fp32") for params in (plain, sharded)]
        assert opts[1].world_size == 2 and opts[0].world_size == 1
        for step in range(3):
            grads = [torch.randn(*shape, generator=generator) for shape in SHAPES]
            for i, (p, q, g) in enumerate(zip(plain, sharded, grads)):
                with_grad = i != 6 and not (step == 2 and i == 1)
                p.grad = g.clone() if with_grad else None
                q.grad = distribute_tensor(g.clone(), q.device_mesh, q.placements) if with_grad else None
            for opt in opts:
                for group in opt.param_groups:
                    group["momentum"] = 0.9
                opt.step()
        ours = [opts[1].state[q] for q in sharded]
        torch.save(dict(plain=[p.detach() for p in plain], sharded=[muon.full(q.detach()) for q in sharded],
                        momenta=[muon.full(s["momentum_buffer"]) for s in ours],
                        plain_momenta=[opts[0].state[p]["momentum_buffer"] for p in plain],
                        second={i: s["second_moment"] for i, s in enumerate(ours) if "second_moment" in s},
                        plain_second=[opts[0].state[p]["second_moment"] for p in plain]),
                   os.path.join(out_dir, f"w{world}_rank{rank}.pt"))
        dist.destroy_process_group()
    os._exit(0)  # gloo's teardown can abort an exiting process


def test_muon_on_fsdp2_shards_is_the_single_process_update_bit_for_bit(tmp_path, spawn_ranks):
    """Same gradients in, same bits out (weights, momenta, second moments), with dim-0 padding; each second moment
    lives on exactly one rank of a shard group."""
    spawn_ranks(shard_worker, tmp_path)
    for world in (4, 2):
        reports = [torch.load(tmp_path / f"w{world}_rank{r}.pt", map_location="cpu") for r in range(world)]
        for report in reports:
            for key, reference in (("sharded", "plain"), ("momenta", "plain_momenta")):
                assert all(torch.equal(a, b) for a, b in zip(report[key], report[reference])), (world, key)
            for i, second in report["second"].items():
                assert torch.equal(second, report["plain_second"][i])
        for node in range(world // 2):
            owned = [set(reports[r]["second"]) for r in (2 * node, 2 * node + 1)]
            assert owned[0].isdisjoint(owned[1]) and owned[0] | owned[1] == set(range(len(SHAPES)))


@pytest.mark.parametrize("shape", [(64, 64), (96, 32), (32, 96), (3, 48, 16)])
def test_polar_express_gemm_fused_iteration_is_the_papers_formula(shape):
    """The baddbmm iteration in float64 agrees with the formula written out, to one final bf16 rounding."""
    u = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = muon.polar_express(u, torch.float64)
    assert out.shape == u.shape and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference_polar_express(u), rtol=2 ** -7, atol=1e-6)
