"""Tests for model.py: accounting, the CLI, the block and the boundary operator against hand-written math, passes, the
logit lens, packed prefix trees, attention backends, the init. Invariants over every arm: tests/test_arms.py."""
import csv
import dataclasses
import json
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

import arms
import model
import train
from model import GPT, config_for, describe
from test_arms import SHAPE, randomized
from test_arms import batch as tokens
from test_train import ROOT


def tiny(arch, depth=3, **overrides):
    return config_for(arch, depth, **{**SHAPE, **overrides})


def build(cfg, seed=0):  # every weight random (also the zero-initialised ones): no path is trivially 0
    return randomized(GPT(cfg), seed)


def attention_backend_run(fn):
    """The backend (several joined by +) of the attention kernels fn() runs, from the aten ops torch.profiler records
    (tests/test_gpu.py: also a compiled graph's, which decomposes math into matmuls: no fused kernel means math)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    ops = (re.fullmatch(r"aten::_scaled_dot_product_(?:(\w+?)_attention(?:_for_cpu)?|attention_(math))", e.name)
           for e in prof.events())
    return "+".join(sorted({op.group(1) or op.group(2) for op in ops if op})) or "math"


def run_blocks(net, blocks, x):
    for block in blocks:
        x = block(x, net.rope_cos[:x.size(1)], net.rope_sin[:x.size(1)])
    return x


# Accounting (the plans' counts against all 52 release rows: tests/test_plan.py)

def test_the_split_of_every_release_plan_and_the_worked_examples():
    rows = list(csv.DictReader(open(os.path.join(ROOT, "tests", "data", "spec_plans.csv"))))
    assert len(rows) == 52
    for row in rows:
        info = describe(config_for(row["arch"], int(row["depth"])))
        assert info["n_layer"] == int(row["n_layer"]), row
        assert row["prelude_core_coda"] in ("", f"{info['prelude']}/{info['core']}/{info['coda']}"), row
    ug = describe(config_for("untied_grow", 8))  # the release's worked examples (docs/recipe.md)
    assert ug["params_compute_active_initial"] == 192_806_912 and ug["params_compute_active"] == 269_877_248
    assert ug["matrix_flops_per_token_final"] == 1_619_263_488
    assert ug["flops_per_token_initial"] == describe(config_for("untied_2", 8))["flops_per_token_final"] == 1_295_321_088
    lg = describe(config_for("loop_grow", 8))
    assert lg["params_tpp"] == lg["params_stored"] == 205_783_040 and lg["executed_blocks_final"] == 14 + 3
    dvg, dv = describe(config_for("deep_vanilla_grow", 8)), describe(config_for("deep_vanilla", 8))
    assert dvg["params_tpp"] == dv["params_tpp"] == 244_318_208   # N = Deep Vanilla's (K = 2 stored count)
    assert dvg["flops_per_token_initial"] == dv["flops_per_token_final"]
    assert dvg["stored_blocks"] == 17 and (dvg["alpha"], dvg["recurrence_norm"], dvg["coda_inject"]) == (0.0, False, False)


def test_fixed_allocation_shapes_and_split_errors():
    cfg = config_for("loop_2", 12, prelude=2, coda=3)
    assert (cfg.n_prelude, cfg.n_core, cfg.n_coda) == (2, 7, 3)
    cfg = config_for("loop_2", 2, width_per_depth=64, head_dim=64, vocab_size=257, mlp_multiple=64)
    assert (cfg.width, cfg.n_head, cfg.mlp_hidden, cfg.padded_vocab) == (128, 2, 384, 320)
    assert model.ModelConfig(**dataclasses.asdict(cfg)) == cfg
    for kwargs in (dict(arch="nope", depth=8), dict(arch="loop_2", depth=5, prelude=2, coda=3),
                   dict(arch="vanilla", depth=8, prelude=1), dict(arch="loop_2", depth=3, head_dim=7),
                   dict(arch="loop_2", depth=3, head_dim=3, width_per_depth=3), dict(arch="vanilla", depth=3, passes=2),
                   dict(arch="loop_2", depth=3, passes_initial=3), dict(arch="vanilla", depth=3, boundary_gate=True)):
        with pytest.raises(ValueError):
            config_for(**kwargs)


# CLI (Table 2's numbers: python model.py --arch A --depth d [--json])

def test_cli_json_and_table(capsys):
    assert model.main(["--arch", "untied_grow", "--depth", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == describe(config_for("untied_grow", 8))
    assert model.main(["--arch", "loop_2", "--depth", "2", "--width-per-depth", "128", "--vocab-size", "257",
                       "--boundary", "norm_only", "--no-coda-inject"]) == 0
    out = capsys.readouterr().out
    cfg = config_for("loop_2", 2, width_per_depth=128, vocab_size=257, boundary="norm_only", coda_inject=False)
    assert f"{'params_stored':32s} {model.params_active(cfg, cfg.passes):,}\n" in out and f"{'alpha':32s} 0.0\n" in out


@pytest.mark.parametrize("args", [("--arch", "loop_2",), ("--arch", "loop_2", "--depth", "2", "--passes-initial", "3")])
def test_cli_errors_exit_2_with_one_line(args, capsys):  # more in tests/test_bad_inputs.py
    assert model.main([*args, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("model.py: error:"), err


def test_both_clis_take_the_same_model_flags():
    def flags(parser):
        group = next(g for g in parser._action_groups if g.title.startswith("model overrides"))
        return {s for action in group._group_actions for s in action.option_strings}
    assert flags(model.build_parser()) == flags(train.build_parser())
    assert {"--recurrence-norm", "--no-recurrence-norm", "--pass-stages", "--passes-initial", "--mlp-multiple",
            "--no-coda-inject", "--boundary", "--prelude", "--wte-init-std"} <= flags(model.build_parser())
    argv = ["--arch", "untied_grow", "--depth", "3", "--no-recurrence-norm", "--pass-stages", "2", "6",
            "--mlp-multiple", "64", "--preset", "cpu"]
    from_model = model.build_parser().parse_args(argv)
    cfg = model.config_from_args(from_model, arms.preset_from_args(from_model), 3, 257)
    assert cfg == train.make_plan(train.parse_args(argv)).model_config
    assert (cfg.recurrence_norm, cfg.passes_initial, cfg.passes, cfg.mlp_multiple) == (False, 2, 6, 64)


# The block, the boundary operator, passes and the logit lens

def test_block_matches_hand_written_math():
    """RMSNorm, RoPE with half-split pairs rotated by -theta (y1 = x1 cos + x2 sin, y2 = -x1 sin + x2 cos), QK-norm
    after RoPE, causal attention, SwiGLU, both branches scaled by the residual multiplier."""
    cfg = tiny("vanilla", depth=2)
    net = build(cfg)
    block, T, H, D = net.transformer.h[0], cfg.seq_len, cfg.n_head, cfg.head_dim
    x = torch.randn(2, T, cfg.width)

    def rms(t):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + torch.finfo(t.dtype).eps)

    angles = torch.outer(torch.arange(T, dtype=torch.float32), 10_000 ** (-torch.arange(D // 2) * 2 / D))
    cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]

    def rope(t):
        t1, t2 = t[..., :D // 2], t[..., D // 2:]
        return torch.cat((t1 * cos + t2 * sin, -t1 * sin + t2 * cos), -1)

    a, m = block.attn, block.mlp
    q, k, v = (lin(rms(x)).view(2, T, H, D) for lin in (a.c_q, a.c_k, a.c_v))
    q, k, v = rms(rope(q)).transpose(1, 2), rms(rope(k)).transpose(1, 2), v.transpose(1, 2)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    x1 = x + cfg.residual_multiplier * a.c_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, T, cfg.width))
    x2 = x1 + cfg.residual_multiplier * m.c_proj(F.silu(m.c_gate(rms(x1))) * m.c_fc(rms(x1)))
    assert torch.allclose(block(x, net.rope_cos[:T], net.rope_sin[:T]), x2, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("boundary,coda_inject", [("full", True), ("full", False), ("norm_only", True),
                                                  ("inject_only", True), ("inject_only", False), ("none", True)])
def test_the_boundary_operator_and_its_ablations_are_what_each_pass_hands_on(boundary, coda_inject):
    """Loop-2 at p/c/q = 1/1/1: the logit lens gives e (the prelude's output) and every block's output. The input of
    the second pass is N(h) + alpha*e of the first pass's output h, the coda's input the same of the second pass's
    (N = RMSNorm; norm_only drops alpha*e, inject_only drops N, none both; without coda injection the coda gets N(h)),
    as the release computes the paper's operator: after every pass. The ablation changes the config there only."""
    base, cfg = tiny("loop_2"), tiny("loop_2", boundary=boundary, coda_inject=coda_inject)
    normed, injected = boundary in ("full", "norm_only"), boundary in ("full", "inject_only")
    changed = {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(base, f.name)}
    assert changed == (set() if injected else {"alpha", "coda_inject"}) | (set() if normed else {"recurrence_norm"}) \
        | (set() if coda_inject else {"coda_inject"})
    net = build(cfg)
    _, (_, e, first, second, out) = net(tokens(cfg), return_hidden=True)

    def boundary_operator(h, last):
        h = F.rms_norm(h, (cfg.width,)) if normed else h
        return h + base.alpha * e if injected and (coda_inject or not last) else h
    core, coda = net.transformer.h[1], net.transformer.h[2]
    assert torch.allclose(run_blocks(net, [core], boundary_operator(first, last=False)), second, atol=1e-5)
    assert torch.allclose(run_blocks(net, [coda], boundary_operator(second, last=True)), out, atol=1e-5)


def untied_with_equal_cores(tied, passes):
    """An untied model of `passes` cores, each a copy of `tied`'s one core, with its prelude, coda, embedding and
    lm_head: what the tied model computes at `passes` passes, with K sets of weights."""
    untied = GPT(dataclasses.replace(tied.cfg, mode="untied", passes=passes, passes_initial=passes))
    untied.transformer.wte.load_state_dict(tied.transformer.wte.state_dict())
    untied.lm_head.load_state_dict(tied.lm_head.state_dict())
    h, t, p, q = untied.transformer.h, tied.transformer.h, tied.cfg.n_prelude, tied.cfg.n_coda
    pairs = [*zip(h[:p], t[:p]), *zip(h[::-1][:q], t[::-1][:q])]  # the prelude's and the coda's blocks
    for dst, src in pairs + [pair for r in range(passes) for pair in zip(untied.core_blocks(r), tied.core_blocks(0))]:
        dst.load_state_dict(src.state_dict())
    return untied


def test_test_time_passes_the_logit_lens_and_untied_cores():
    """A tied model at k passes (test-time k != K) is an untied one with k copies of its core; the logit lens holds
    the embedding and every executed block's output in fp32; a change to the last untied core changes the output."""
    cfg = tiny("loop_grow")
    net, idx = build(cfg), tokens(cfg)
    assert net.active_passes == 2
    for k in (1, 2, 3, 5):
        logits, hidden = net(idx, passes=k, return_hidden=True)
        assert len(hidden) == model.executed_blocks(cfg, k) + 1 and all(h.dtype == torch.float32 for h in hidden)
        assert torch.allclose(net.decode(hidden[-1]), logits)
        untied = untied_with_equal_cores(net, k)
        assert torch.allclose(logits, untied(idx), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        untied.core_blocks(4)[0].attn.c_q.weight.add_(0.1)
    assert not torch.allclose(untied(idx), logits, atol=1e-4)
    assert net.active_passes == 2
    net.set_passes(3)
    assert torch.allclose(net(idx), net(idx, passes=3))
    with pytest.raises(ValueError, match="the untied model runs 1 to 5 passes, got 6"):
        untied(idx, passes=6)


@pytest.mark.parametrize("arch", ["vanilla", "untied_2"])
def test_positions_and_mask_pack_a_prefix_tree(arch):
    """Two rows sharing a prefix, packed as prefix + tail A + tail B with A/B rotary positions and a mask that hides
    tail A from tail B: every packed position reproduces the logits of its row run alone (what core_eval batches)."""
    net = build(tiny(arch))
    prefix, tail_a, tail_b = [5, 6, 7, 8, 9], [10, 11, 12], [13, 14]
    packed, positions = torch.tensor([prefix + tail_a + tail_b]), torch.tensor([list(range(8)) + [5, 6]])
    branch = torch.tensor([0] * 5 + [1] * 3 + [2] * 2)
    mask = torch.ones(10, 10, dtype=torch.bool).tril() & ((branch[None] == 0) | (branch[None] == branch[:, None]))
    with torch.no_grad():
        packed_logits = net.decode(net.residual_stream(packed, positions=positions, attn_mask=mask[None, None]))[0]
        row_a, row_b = net(torch.tensor([prefix + tail_a]))[0], net(torch.tensor([prefix + tail_b]))[0]
        unmasked = net.decode(net.residual_stream(packed, positions=positions))[0]  # causal: B sees A
    assert torch.allclose(packed_logits[:8], row_a, atol=1e-5, rtol=1e-5)
    assert torch.allclose(packed_logits[8:], row_b[5:], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unmasked[8:], row_b[5:], atol=1e-3)


# Attention backends and the bf16 embedding

def test_auto_attention_puts_cudnn_first_only_where_its_lengths_are_safe():
    """Training's auto: cuDNN first for causal calls at a multiple of 128 positions; anything else (CORE's arbitrary
    lengths, its prefix-tree masks) PyTorch's own selection ([]), as "default" always; a name forces one backend."""
    backends, SDPBackend = model.attention_backends, torch.nn.attention.SDPBackend
    assert backends("auto", 2048, causal=True) == backends("auto", 128, causal=True) == model.SDPA_BACKENDS["auto"]
    assert model.SDPA_BACKENDS["auto"][0] == SDPBackend.CUDNN_ATTENTION
    assert backends("auto", 2047, causal=True) == backends("auto", 2048, causal=False) == []
    assert backends("default", 2048, causal=True) == [] and backends("math", 100, False) == [SDPBackend.MATH]
    assert tuple(model.SDPA_BACKENDS) == arms.ATTENTION_BACKENDS  # every --attention-backend name maps to SDPA's


@pytest.mark.parametrize("attention, ran", [("auto", "flash"), ("default", "flash"), ("math", "math")])
def test_attention_backend_is_the_kernel_that_runs(attention, ran):
    """On the CPU auto and default (PyTorch's choice) run the flash CPU kernel, math the math one, causal and with
    core_eval's attn_mask, to the same outputs (fp32 rounding)."""
    cfg = tiny("vanilla", depth=1)
    idx, mask = tokens(cfg), torch.ones(2, 1, cfg.seq_len, cfg.seq_len, dtype=torch.bool).tril()
    reference, net = build(cfg), GPT(cfg, attention=attention)
    net.load_state_dict(reference.state_dict())
    for attn_mask in (None, mask):
        assert attention_backend_run(lambda: net.residual_stream(idx, attn_mask=attn_mask)) == ran
        torch.testing.assert_close(net.residual_stream(idx, attn_mask=attn_mask), reference.residual_stream(idx))


def test_bf16_embedding_on_cuda_only_and_its_adam_moments():
    assert model.embedding_dtype("cuda") == torch.bfloat16 and model.embedding_dtype("cpu") == torch.float32
    cfg, idx, targets = tiny("operator_1"), tokens(tiny("operator_1")), tokens(tiny("operator_1")).roll(1)
    fp32, bf16 = build(cfg), GPT(cfg, dtype=torch.bfloat16)  # the embedding GPT(cfg, device="cuda") builds
    bf16.load_state_dict(fp32.state_dict())
    with torch.autocast("cpu", torch.bfloat16):
        losses = [net(idx, targets) for net in (fp32, bf16)]
    losses[1].backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=0)
    assert bf16.transformer.wte.weight.grad.dtype == torch.bfloat16  # and so AdamW's moments


# Construction on the device (drawn tensor by tensor on the CPU): the same weights as building on the CPU

def cpu_built_weights(cfg, seed):
    """The weights GPT(cfg) had when it was built on the CPU and then moved: the modules constructed in order (their
    default inits draw from the CPU generator and are overwritten), then the paper's init (App. A.1) in place."""
    torch.manual_seed(seed)
    C, H, Vp = cfg.width, cfg.mlp_hidden, cfg.padded_vocab
    wte = torch.nn.Embedding(Vp, C)
    shapes = [(C, C)] * 4 + [(C, H), (C, H), (H, C)]  # attn c_q c_k c_v c_proj, mlp c_gate c_fc c_proj
    blocks = [[torch.nn.Linear(*shape, bias=False) for shape in shapes] for _ in range(model.stored_blocks(cfg))]
    lm_head = torch.nn.Linear(C, Vp, bias=False)
    s = cfg.uniform_init_scale / math.sqrt(C)
    names = ("attn.c_q", "attn.c_k", "attn.c_v", "attn.c_proj", "mlp.c_gate", "mlp.c_fc", "mlp.c_proj")
    weights = {}
    with torch.no_grad():
        for i, block in enumerate(blocks):
            for name, linear in zip(names, block):
                linear.weight.zero_() if name.endswith("c_proj") else linear.weight.uniform_(-s, s)
                weights[f"transformer.h.{i}.{name}.weight"] = linear.weight
        weights["transformer.wte.weight"] = wte.weight.normal_(0.0, cfg.wte_init_std)
        weights["lm_head.weight"] = lm_head.weight.zero_()
    return weights, torch.get_rng_state()


@pytest.mark.parametrize("arch, options", [("deep_vanilla", {}), ("operator_1", dict(boundary="none")),
                                           ("loop_2", dict(prelude=0, coda=2)), ("untied_grow", {})])
def test_the_model_built_on_its_device_has_the_cpu_built_weights(arch, options):
    cfg = tiny(arch, depth=4, **options)
    expected, rng_after = cpu_built_weights(cfg, seed=7)
    torch.manual_seed(7)
    state = GPT(cfg, device="cpu").state_dict()
    assert torch.equal(torch.get_rng_state(), rng_after)  # the generator continues where it did
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
