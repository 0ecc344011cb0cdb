"""Tests for model.py: accounting against the release's per-run values, the arm table and its CLI flags, init, boundary
operator, growth, logit lens, checkpoints."""
import csv
import dataclasses
import json
import math
import os
import weakref

import pytest
import torch
import torch.nn.functional as F

import arms
import model
from model import GPT, config_for, describe, executed_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_ROWS = list(csv.DictReader(open(os.path.join(ROOT, "tests", "data", "spec_plans.csv"))))
TINY = dict(width_per_depth=32, head_dim=16, seq_len=16, vocab_size=257, mlp_multiple=64)


def tiny(arch, depth=3, **overrides):
    return config_for(arch, depth, **{**TINY, **overrides})


def build(cfg, seed=0, randomize=True):
    """A model whose every weight (incl. the zero-initialized c_proj/lm_head) is random, so no path is trivially 0."""
    torch.manual_seed(seed)
    net = GPT(cfg)
    if randomize:
        with torch.no_grad():
            for p in net.parameters():
                p.normal_(0, 0.3)
    return net


def tokens(cfg, batch=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)


def run_blocks(net, blocks, x):
    T = x.size(1)
    for block in blocks:
        x = block(x, net.rope_cos[:T], net.rope_sin[:T])
    return x


def copy_block(dst, src):
    dst.load_state_dict(src.state_dict())


def untied_with_equal_cores(tied, passes):
    """An untied model of `passes` cores, each a copy of `tied`'s one core, with its prelude, coda, embedding and
    lm_head: what the tied model computes at `passes` passes, with K sets of weights."""
    untied = GPT(dataclasses.replace(tied.cfg, mode="untied", passes=passes, passes_initial=passes))
    untied.transformer.wte.load_state_dict(tied.transformer.wte.state_dict())
    untied.lm_head.load_state_dict(tied.lm_head.state_dict())
    pairs = [*zip(untied.prelude_blocks(), tied.prelude_blocks()), *zip(untied.coda_blocks(), tied.coda_blocks())]
    pairs += [pair for r in range(passes) for pair in zip(untied.core_blocks(r), tied.core_blocks(0))]
    for dst, src in pairs:
        copy_block(dst, src)
    return untied


# ----------------------------------------------------------------------------------------------------------------------
# Accounting against the release's 52 ladder plans (tests/data/spec_plans.csv)

@pytest.mark.parametrize("row", SPEC_ROWS, ids=[f"{r['arch']}-d{r['depth']}" for r in SPEC_ROWS])
def test_accounting_matches_spec_plans(row):
    info = describe(config_for(row["arch"], int(row["depth"])))
    for key in ("n_layer", "width", "heads", "mlp_hidden", "params_tpp", "params_stored", "flops_per_token_final"):
        assert info[key] == int(row[key]), key
    if row["prelude_core_coda"]:
        assert f"{info['prelude']}/{info['core']}/{info['coda']}" == row["prelude_core_coda"]


def test_spec_table_is_complete():
    assert len(SPEC_ROWS) == 52
    assert {r["arch"] for r in SPEC_ROWS} == set(arms.PAPER_ARMS) - {"deep_vanilla_grow"}


def test_worked_examples_and_growth_accounting():
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


def test_fixed_allocation_and_split_errors():
    cfg = config_for("loop_2", 12, prelude=2, coda=3)
    assert (cfg.n_prelude, cfg.n_core, cfg.n_coda) == (2, 7, 3)
    for kwargs in (dict(arch="nope", depth=8), dict(arch="loop_2", depth=0), dict(arch="loop_2", depth=5, prelude=2, coda=3),
                   dict(arch="vanilla", depth=8, prelude=1), dict(arch="loop_2", depth=3, head_dim=7)):
        with pytest.raises(ValueError):
            config_for(**kwargs)


def test_config_roundtrip_and_small_shapes():
    cfg = config_for("loop_2", 2, width_per_depth=64, head_dim=64, vocab_size=257, mlp_multiple=64)
    assert (cfg.width, cfg.n_head, cfg.mlp_hidden, cfg.padded_vocab) == (128, 2, 384, 320)
    assert model.ModelConfig(**dataclasses.asdict(cfg)) == cfg


# ----------------------------------------------------------------------------------------------------------------------
# CLI

def test_cli_json_and_table(capsys):
    assert model.main(["--arch", "untied_grow", "--depth", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == describe(config_for("untied_grow", 8))
    assert model.main(["--arch", "loop_2", "--depth", "2", "--width-per-depth", "128", "--vocab-size", "257",
                       "--boundary", "norm_only", "--no-coda-inject"]) == 0
    out = capsys.readouterr().out
    assert "params_stored" in out and "alpha                            0.0" in out


@pytest.mark.parametrize("args", [("--arch", "nope", "--depth", "8"), ("--arch", "loop_2", "--depth", "0"),
                                  ("--arch", "loop_2", "--depth", "6", "--prelude", "3", "--coda", "3")])
def test_cli_errors_exit_2_with_one_line(args, capsys):
    assert model.main([*args, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("model.py: error:")


def model_flags(parser):
    group = next(g for g in parser._action_groups if g.title.startswith("model overrides"))
    return {s for action in group._group_actions for s in action.option_strings}


def test_both_clis_take_the_same_model_flags():
    import train
    flags = model_flags(model.build_parser())
    assert flags == model_flags(train.build_parser())
    assert {"--recurrence-norm", "--no-recurrence-norm", "--pass-stages", "--passes-initial", "--mlp-multiple",
            "--no-coda-inject", "--boundary", "--prelude", "--wte-init-std"} <= flags
    argv = ["--arch", "untied_grow", "--depth", "3", "--no-recurrence-norm", "--pass-stages", "2", "6",
            "--mlp-multiple", "64", "--preset", "cpu"]
    from_model = model.build_parser().parse_args(argv)
    from_train = train.parse_args(argv)
    cfg = model.config_from_args(from_model, arms.preset_from_args(from_model), 3, 257)
    assert cfg == train.make_plan(from_train).model_config
    assert (cfg.recurrence_norm, cfg.passes_initial, cfg.passes, cfg.mlp_multiple) == (False, 2, 6, 64)


# ----------------------------------------------------------------------------------------------------------------------
# Forward, init, boundary operator

@pytest.mark.parametrize("arch", list(arms.ARMS))
def test_initial_loss_is_ln_vocab(arch):
    cfg = tiny(arch)
    net = build(cfg, randomize=False)
    idx = tokens(cfg)
    logits = net(idx)
    assert logits.shape == (2, cfg.seq_len, 257) and logits.dtype == torch.float32
    assert torch.all(logits == 0)
    assert abs(net(idx, targets=idx).item() - math.log(257)) < 1e-6
    assert net.lm_head.weight.shape[0] == 320 and net.transformer.wte.weight.shape[0] == 320
    s = cfg.uniform_init_scale / math.sqrt(cfg.width)
    c_q = net.transformer.h[0].attn.c_q.weight
    assert c_q.abs().max() <= s and c_q.abs().max() > 0.9 * s
    assert torch.all(net.transformer.h[0].mlp.c_proj.weight == 0)


def test_only_lm_head_gets_gradient_at_init():
    cfg = tiny("operator_1")
    net = build(cfg, randomize=False)
    net(tokens(cfg), targets=tokens(cfg, seed=2)).backward()
    assert net.lm_head.weight.grad.abs().sum() > 0
    assert all(p.grad is None or torch.all(p.grad == 0) for n, p in net.named_parameters() if n != "lm_head.weight")


def test_rotary_convention_half_split():
    x = torch.zeros(1, 2, 1, 8)
    x[0, :, 0, 0] = 1.0                           # x1 of the first pair (dims 0 and 4)
    angles = torch.outer(torch.arange(2.0), 10_000 ** (-torch.arange(4.0) * 2 / 8))
    y = model.apply_rotary(x, angles.cos(), angles.sin())
    assert torch.allclose(y[0, 1, 0, 0], torch.cos(torch.tensor(1.0)))
    assert torch.allclose(y[0, 1, 0, 4], -torch.sin(torch.tensor(1.0)))  # y2 = -x1 sin + x2 cos
    assert torch.equal(y[0, 0, 0], x[0, 0, 0])


def test_block_matches_hand_written_math():
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

    a = block.attn
    xn = rms(x)
    q, k, v = (m(xn).view(2, T, H, D).transpose(1, 2) for m in (a.c_q, a.c_k, a.c_v))
    q, k = rms(rope(q.transpose(1, 2)).transpose(1, 2)), rms(rope(k.transpose(1, 2)).transpose(1, 2))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, T, cfg.width)
    x1 = x + cfg.residual_multiplier * a.c_proj(y)
    m = block.mlp
    x2 = x1 + cfg.residual_multiplier * m.c_proj(F.silu(m.c_gate(rms(x1))) * m.c_fc(rms(x1)))
    assert torch.allclose(block(x, net.rope_cos[:T], net.rope_sin[:T]), x2, atol=1e-4, rtol=1e-4)


def test_operator_1_is_coda_of_norm_core_plus_e():
    cfg = tiny("operator_1")
    net = build(cfg)
    idx = tokens(cfg)
    x = F.rms_norm(net.transformer.wte(idx), (cfg.width,))
    e = run_blocks(net, net.prelude_blocks(), x)
    h = F.rms_norm(run_blocks(net, net.core_blocks(0), e), (cfg.width,)) + e
    logits = net.lm_head(F.rms_norm(run_blocks(net, net.coda_blocks(), h), (cfg.width,)))[..., :257] * 1.0
    assert torch.allclose(net(idx), logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("passes", [1, 2, 3])
def test_untied_cores_copied_equal_compute_what_the_tied_core_does(passes):
    loop = build(tiny("loop_2"))
    untied = untied_with_equal_cores(loop, passes)
    idx = tokens(loop.cfg)
    assert len(untied.transformer.h) == 2 + passes and len(loop.transformer.h) == 3  # p/c/q = 1/1/1
    assert torch.allclose(untied(idx), loop(idx, passes=passes), atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        untied.core_blocks(passes - 1)[0].attn.c_q.weight.add_(0.1)  # the last pass's core only
    assert not torch.allclose(untied(idx), loop(idx, passes=passes), atol=1e-4)


ABLATIONS = [("full", True), ("full", False), ("norm_only", True), ("inject_only", True), ("inject_only", False),
             ("none", True)]


@pytest.mark.parametrize("boundary,coda_inject", ABLATIONS)
def test_boundary_ablations_change_only_what_they_name(boundary, coda_inject):
    base = tiny("loop_2")
    cfg = tiny("loop_2", boundary=boundary, coda_inject=coda_inject)
    changed = {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(base, f.name)}
    expected = set()
    if boundary in ("norm_only", "none"):
        expected |= {"alpha", "coda_inject"}
    if boundary in ("inject_only", "none"):
        expected |= {"recurrence_norm"}
    if not coda_inject:
        expected |= {"coda_inject"}
    assert changed == expected


@pytest.mark.parametrize("boundary,coda_inject", ABLATIONS)
def test_boundary_operator_is_what_each_pass_hands_on(boundary, coda_inject):
    """Loop-2 at p/c/q = 1/1/1: the logit lens gives e (the prelude's output) and every block's output. The input of
    the second pass is N(h) + alpha*e of the first pass's output h, the coda's input the same of the second pass's
    (N = RMSNorm; norm_only drops alpha*e, inject_only drops N, none both; without coda injection the coda gets N(h)),
    as the release computes the paper's operator: after every pass."""
    cfg = tiny("loop_2", boundary=boundary, coda_inject=coda_inject)
    net = build(cfg)
    _, (_, e, first, second, out) = net(tokens(cfg), return_hidden=True)
    normed, injected = boundary in ("full", "norm_only"), boundary in ("full", "inject_only")

    def boundary_operator(h, last):
        h = F.rms_norm(h, (cfg.width,)) if normed else h
        return h + tiny("loop_2").alpha * e if injected and (coda_inject or not last) else h
    core, coda = net.transformer.h[1], net.transformer.h[2]
    assert torch.allclose(run_blocks(net, [core], boundary_operator(first, last=False)), second, atol=1e-5)
    assert torch.allclose(run_blocks(net, [coda], boundary_operator(second, last=True)), out, atol=1e-5)


def test_gradients_reach_every_pass():
    for arch in ("loop_2", "untied_grow"):
        cfg = tiny(arch)
        net = build(cfg)
        net.set_passes(cfg.passes)
        idx = tokens(cfg)
        loss, hidden = net(idx, targets=tokens(cfg, seed=3), return_hidden=True)
        for h in hidden:
            h.retain_grad()
        loss.backward()
        assert all(h.grad.abs().sum() > 0 for h in hidden)
        assert all(p.grad.abs().sum() > 0 for p in net.parameters())  # untied: every core's weights


def test_passes_override_and_logit_lens():
    cfg = tiny("loop_grow")
    net = build(cfg)
    idx = tokens(cfg)
    assert net.active_passes == 2
    for k in (1, 2, 3, 5):  # test-time k != K for a tied model: its core once more per pass
        logits, hidden = net(idx, passes=k, return_hidden=True)
        assert len(hidden) == executed_blocks(cfg, k) + 1 and all(h.dtype == torch.float32 for h in hidden)
        assert torch.allclose(net.decode(hidden[-1]), logits)
        assert torch.allclose(logits, untied_with_equal_cores(net, k)(idx), atol=1e-5, rtol=1e-5)
    assert net.active_passes == 2
    net.set_passes(3)
    assert torch.allclose(net(idx), net(idx, passes=3))
    untied = build(tiny("untied_2"))
    with pytest.raises(ValueError):
        untied(idx, passes=3)
    assert len(untied(idx, return_hidden=True)[1]) == executed_blocks(untied.cfg, 2) + 1


@pytest.mark.parametrize("arch", ["vanilla", "operator_1", "untied_2"])
def test_positions_and_mask_pack_a_prefix_tree(arch):
    """Two rows sharing a prefix, packed as prefix + tail A + tail B with A/B rotary positions and a mask that hides
    tail A from tail B: every packed position reproduces the logits of its row run alone (what core_eval batches)."""
    cfg = tiny(arch)
    net = build(cfg)
    prefix, tail_a, tail_b = [5, 6, 7, 8, 9], [10, 11, 12], [13, 14]
    packed = torch.tensor([prefix + tail_a + tail_b])
    positions = torch.tensor([list(range(8)) + [5, 6]])
    branch = torch.tensor([0] * 5 + [1] * 3 + [2] * 2)
    mask = torch.ones(10, 10, dtype=torch.bool).tril() & ((branch[None] == 0) | (branch[None] == branch[:, None]))
    with torch.no_grad():
        packed_logits = net.decode(net.residual_stream(packed, positions=positions, attn_mask=mask[None, None]))[0]
        row_a, row_b = net(torch.tensor([prefix + tail_a]))[0], net(torch.tensor([prefix + tail_b]))[0]
    assert torch.allclose(packed_logits[:8], row_a, atol=1e-5, rtol=1e-5)
    assert torch.allclose(packed_logits[8:], row_b[5:], atol=1e-5, rtol=1e-5)
    unmasked = net.decode(net.residual_stream(packed, positions=positions))[0].detach()  # causal: B sees A
    assert not torch.allclose(unmasked[8:], row_b[5:], atol=1e-3)


# ----------------------------------------------------------------------------------------------------------------------
# The chunked loss and the bf16 embedding

def reference_model(cfg, seed=1):
    torch.manual_seed(seed)
    net = model.GPT(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
    return net


def test_auto_attention_puts_cudnn_first_only_where_its_lengths_are_safe():
    """Training's auto: cuDNN first for causal calls at a multiple of 128 positions; anything else (CORE's arbitrary
    lengths, its prefix-tree masks) PyTorch's own selection ([]), as "default" always; a name forces one backend."""
    backends = model.attention_backends
    assert backends("auto", 2048, causal=True) == backends("auto", 128, causal=True) == model.CUDNN_FIRST
    assert model.CUDNN_FIRST[0] == torch.nn.attention.SDPBackend.CUDNN_ATTENTION
    assert backends("auto", 2047, causal=True) == backends("auto", 2048, causal=False) == []
    assert backends("default", 2048, causal=True) == []
    assert backends("math", 100, causal=False) == [torch.nn.attention.SDPBackend.MATH]
    assert tuple(model.SDPA_BACKENDS) == arms.ATTENTION_BACKENDS  # every --attention-backend name maps to SDPA's


@pytest.mark.parametrize("attention, ran", [("auto", "flash"), ("default", "flash"), ("flash", "flash"),
                                            ("math", "math")])
def test_attention_backend_is_the_kernel_that_runs(attention, ran):
    """GPT(attention=...) sets SDPA's backend: on the CPU auto, default (PyTorch's choice) and flash run the flash CPU
    kernel, math the math one, causal and with core_eval's attn_mask, to the same outputs (fp32 rounding)."""
    cfg = config_for("vanilla", 1, width_per_depth=32, head_dim=16, seq_len=16, vocab_size=257, mlp_multiple=64)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 1, cfg.seq_len, cfg.seq_len, dtype=torch.bool).tril()
    reference, net = reference_model(cfg), GPT(cfg, attention=attention)
    net.load_state_dict(reference.state_dict())
    for attn_mask in (None, mask):
        assert model.attention_backend_run(lambda: net.residual_stream(idx, attn_mask=attn_mask)) == ran
        torch.testing.assert_close(net.residual_stream(idx, attn_mask=attn_mask), reference.residual_stream(idx),
                                   rtol=1e-5, atol=1e-5)


def test_bf16_embedding_on_cuda_only_and_its_adam_moments():
    assert model.embedding_dtype("cuda") == torch.bfloat16 and model.embedding_dtype("cpu") == torch.float32
    cfg = config_for("operator_1", 3, width_per_depth=32, head_dim=16, seq_len=16, vocab_size=257, mlp_multiple=64)
    net = reference_model(cfg)
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 2, cfg.seq_len))
    with torch.autocast("cpu", torch.bfloat16):
        fp32_loss = net(idx, targets)
    net.transformer.wte.to(torch.bfloat16)  # what GPT(cfg, device="cuda") builds
    with torch.autocast("cpu", torch.bfloat16):
        loss = net(idx, targets)
    loss.backward()
    torch.testing.assert_close(loss, fp32_loss, rtol=2e-2, atol=0)
    opt = torch.optim.AdamW([net.transformer.wte.weight], lr=1e-3)
    opt.step()
    state = opt.state[net.transformer.wte.weight]
    assert net.transformer.wte.weight.grad.dtype == state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


# ----------------------------------------------------------------------------------------------------------------------
# Construction on the device: the same weights as building on the CPU, with about one tensor on the host

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


@pytest.mark.parametrize("arch, options", [
    ("vanilla", {}), ("deep_vanilla", {}), ("operator_1", dict(boundary="none")), ("loop_2", dict(prelude=0, coda=2)),
    ("untied_grow", {}), ("untied_grow", dict(boundary="norm_only")), ("deep_vanilla_grow", {})])
def test_the_model_built_on_its_device_has_the_cpu_built_weights(arch, options):
    cfg = tiny(arch, depth=4, **options)
    expected, rng_after = cpu_built_weights(cfg, seed=7)
    torch.manual_seed(7)
    net = GPT(cfg, device="cpu")
    assert torch.equal(torch.get_rng_state(), rng_after)  # the generator continues where it did
    state = net.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


class LiveHostBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Peak bytes of CPU tensors alive at once, counting those created while the mode is on."""

    def __init__(self):
        super().__init__()
        self.live, self.peak = {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.untyped_storage().data_ptr():
                key = t.untyped_storage().data_ptr()
                if key not in self.live:
                    self.live[key] = t.untyped_storage().nbytes()
                    weakref.finalize(t, self.live.pop, key, None)
        self.peak = max(self.peak, sum(self.live.values()))
        return out


def test_building_for_another_device_holds_about_one_tensor_on_the_host():
    """The meta device stands in for a GPU: the parameters live off the host, which holds one drawn tensor at a time
    (plus the small rotary tables), not the model."""
    cfg = tiny("untied_grow", depth=4)
    with LiveHostBytes() as host:
        net = GPT(cfg, device="meta")
    assert {p.device.type for p in net.parameters()} == {"meta"}
    largest = max(4 * p.numel() for p in net.parameters())
    rotary = 4 * net.rope_cos.numel()
    assert host.peak <= largest + 4 * rotary
    assert host.peak < sum(4 * p.numel() for p in net.parameters()) / 10
