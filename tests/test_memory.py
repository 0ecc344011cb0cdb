"""Tests for memory.py's memory model, planner, chunked loss and bf16 embedding: the predicted saved bytes against
what autograd really saves on CPU (saved_tensors_hooks, unique storages), the predicted peak against torch's
MemTracker, the chunked loss against F.cross_entropy, and the planner's choices and errors."""
import pytest
import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

import memory
import model
import muon
from memory import GIB
from model import config_for

SHAPES = {  # two small shapes with different width, heads, head_dim, T, vocab padding and batch
    "a": dict(depth=3, width_per_depth=32, head_dim=16, seq_len=64, vocab_size=300, mlp_multiple=64, batch=2),
    "b": dict(depth=4, width_per_depth=24, head_dim=24, seq_len=96, vocab_size=515, mlp_multiple=32, batch=3),
}
ARMS_AND_PASSES = [("vanilla", 1), ("operator_1", 3), ("loop_2", 2), ("loop_2", 3),
                   ("untied_grow", 2), ("untied_grow", 4)]
VIEW_OR_CAST = {"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
                "SliceBackward0", "UnsafeViewBackward0", "ExpandBackward0", "AsStridedBackward0"}


def shaped(arch, shape):
    s = dict(SHAPES[shape])
    batch, depth = s.pop("batch"), s.pop("depth")
    return config_for(arch, depth, **s), batch


def derived_from_weight(t):
    """True for a parameter's cast or view (autocast's cached bf16 weight), following single-input view/cast nodes."""
    fn = t.grad_fn
    while fn is not None and type(fn).__name__ in VIEW_OR_CAST:
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
    return fn is not None and type(fn).__name__ == "AccumulateGrad"


class SavedBytes:
    """Bytes of the unique storages autograd saves inside ctx(): activations and weight copies, parameters and
    buffers excluded (they are counted as parameters)."""

    def __init__(self, net):
        self.own = {t.untyped_storage().data_ptr() for t in [*net.parameters(), *net.buffers()]}
        self.activations, self.weights = {}, {}

    def pack(self, t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.own:
            (self.weights if derived_from_weight(t) else self.activations)[storage.data_ptr()] = storage.nbytes()
        return t

    def ctx(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def measure(cfg, passes, batch, autocast, chunked=True):
    torch.manual_seed(0)
    net = model.GPT(cfg)
    net.set_passes(passes)
    idx, targets = torch.randint(0, cfg.vocab_size, (2, batch, cfg.seq_len))
    trunk, head = SavedBytes(net), SavedBytes(net)
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        with trunk.ctx():
            h = net.residual_stream(idx)
        with head.ctx():
            loss = net.loss(h, targets) if chunked else \
                F.cross_entropy(net.decode(h).flatten(0, 1), targets.flatten(), ignore_index=-1)
    loss.backward()
    return sum(trunk.activations.values()), sum(trunk.weights.values()), sum(head.activations.values()), \
        max(head.activations.values())


def close(measured, predicted, tolerance=0.10):
    return abs(predicted - measured) <= tolerance * measured


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("arch,passes", ARMS_AND_PASSES)
def test_predicted_saved_bytes_match_autograd(arch, passes, shape, autocast):
    cfg, batch = shaped(arch, shape)
    activations, weight_copies, loss_path, _ = measure(cfg, passes, batch, autocast)
    assert close(activations, memory.activation_bytes(cfg, passes, batch, autocast))
    assert close(loss_path, memory.loss_path_bytes(cfg, batch, autocast)[0])
    assert weight_copies == memory.weight_copy_bytes(cfg, passes, autocast)


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_unchunked_loss_path_formula_and_what_chunking_saves(shape, autocast):
    cfg, batch = shaped("loop_2", shape)
    _, _, unchunked, unchunked_largest = measure(cfg, 2, batch, autocast, chunked=False)
    _, _, _, chunked_largest = measure(cfg, 2, batch, autocast)
    assert close(unchunked, memory.loss_path_bytes(cfg, batch, autocast, chunked=False)[0])
    logits_fp32 = batch * cfg.seq_len * cfg.vocab_size * 4
    assert unchunked_largest == logits_fp32  # the log-softmax kept for backward
    assert chunked_largest == cfg.padded_vocab * cfg.width * 4 < logits_fp32  # only d(loss)/d(lm_head) is that big


@pytest.mark.parametrize("chunked", [True, False])
def test_predicted_peak_bounds_the_measured_peak(chunked):
    """fwd+bwd without an optimizer: the prediction (its parameters, gradients, weight copies, activations and loss
    path) is an upper bound of MemTracker's peak, and not a loose one."""
    cfg = config_for("loop_2", 3, width_per_depth=32, head_dim=16, seq_len=64, vocab_size=8000, mlp_multiple=64)
    net = model.GPT(cfg)
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 4, cfg.seq_len))
    tracker = MemTracker()
    tracker.track_external(net)
    with tracker:
        loss = net(idx, targets) if chunked else F.cross_entropy(net(idx).flatten(0, 1), targets.flatten())
        loss.backward()
    measured = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    m = memory.memory_per_rank(cfg, 2, 4, device="cpu")
    loss_saved, loss_peak = memory.loss_path_bytes(cfg, 4, autocast=False, chunked=chunked)
    predicted = m["parameters"] + m["gradients"] + m["activations"] + loss_saved + \
        max(loss_peak - loss_saved, m["step_transient"] if chunked else 0)
    assert measured <= predicted <= 1.25 * measured


def reference_model(cfg, seed=1):
    torch.manual_seed(seed)
    net = model.GPT(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
    return net


@pytest.mark.parametrize("chunk_rows", [7, model.LOSS_CHUNK_ROWS])
def test_chunked_loss_equals_cross_entropy_fp32(monkeypatch, chunk_rows):
    monkeypatch.setattr(model, "LOSS_CHUNK_ROWS", chunk_rows)
    cfg = config_for("untied_grow", 3, width_per_depth=32, head_dim=16, seq_len=20, vocab_size=300, mlp_multiple=64)
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 3, cfg.seq_len))
    targets[0, :5] = -1
    targets[2, 7] = -1
    chunked, plain = reference_model(cfg), reference_model(cfg)
    loss = chunked(idx, targets)
    expected = F.cross_entropy(plain(idx).flatten(0, 1), targets.flatten(), ignore_index=-1)
    (3.0 * loss).backward()  # a non-unit upstream gradient, as with gradient accumulation
    (3.0 * expected).backward()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    for (name, p), q in zip(chunked.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(chunked(idx, targets), expected.detach(), rtol=1e-6, atol=1e-6)
    assert chunked(idx).shape == (3, cfg.seq_len, cfg.vocab_size)  # without targets: logits, as before


def test_chunked_loss_under_bf16_autocast_matches_unchunked():
    cfg = config_for("loop_2", 3, width_per_depth=32, head_dim=16, seq_len=20, vocab_size=300, mlp_multiple=64)
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 3, cfg.seq_len))
    chunked, plain = reference_model(cfg), reference_model(cfg)
    with torch.autocast("cpu", torch.bfloat16):
        loss = chunked(idx, targets)
        expected = F.cross_entropy(plain(idx).flatten(0, 1), targets.flatten())
    loss.backward()
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for p, q in zip(chunked.parameters(), plain.parameters()):  # one chunk: the same bf16 matmuls
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


def test_bf16_embedding_on_cuda_only_and_its_adam_moments():
    assert model.embedding_dtype("cuda") == torch.bfloat16 and model.embedding_dtype("cpu") == torch.float32
    cfg = config_for("operator_1", 3, width_per_depth=32, head_dim=16, seq_len=16, vocab_size=257, mlp_multiple=64)
    net = reference_model(cfg).to_device("cpu")
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 2, cfg.seq_len))
    with torch.autocast("cpu", torch.bfloat16):
        fp32_loss = net(idx, targets)
    net.transformer.wte.to(torch.bfloat16)  # what to_device("cuda") does to the embedding
    with torch.autocast("cpu", torch.bfloat16):
        loss = net(idx, targets)
    loss.backward()
    torch.testing.assert_close(loss, fp32_loss, rtol=2e-2, atol=0)
    opt = torch.optim.AdamW([net.transformer.wte.weight], lr=1e-3)
    opt.step()
    state = opt.state[net.transformer.wte.weight]
    assert net.transformer.wte.weight.grad.dtype == state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


@pytest.mark.parametrize("world", [1, 3, 8])
def test_owner_rule_on_shapes_matches_muon(world):
    cfg = config_for("untied_grow", 4, width_per_depth=16, head_dim=16, seq_len=16, vocab_size=257, mlp_multiple=16)
    params = model.GPT(cfg).param_groups()["matrix"]
    assert [tuple(p.shape) for p in params] == memory.block_matrix_shapes(cfg)
    owners = muon.assign_owners([tuple(p.shape) for p in params], world)
    expected = [sorted(tuple(p.shape) for p, o in zip(params, owners) if o == r) for r in range(world)]
    assert [sorted(o) for o in memory.muon_owner_loads(memory.block_matrix_shapes(cfg), world)] == expected
    per_rank = muon.per_rank_bytes(memory.block_matrix_shapes(cfg), world)
    assert [4 * sum(memory.muon_state_numel(s) for s in o) for o in memory.muon_owner_loads(
        memory.block_matrix_shapes(cfg), world)] == [r["state"] for r in per_rank]


def test_state_per_rank_shrinks_with_world_size_and_zero2():
    cfg = config_for("untied_grow", 18)
    one, eight = memory.persistent_bytes(cfg, 1), memory.persistent_bytes(cfg, 8)
    sharded = memory.persistent_bytes(cfg, 8, zero2=True)
    assert eight["parameters"] == one["parameters"] and eight["gradients"] == one["gradients"]
    assert one["muon_state"] / 8 <= eight["muon_state"] <= one["muon_state"] / 8 * 1.1
    assert sharded["gradients"] < eight["gradients"] / 2 and sharded["muon_state"] == eight["muon_state"]
    assert one["parameters"] - memory.persistent_bytes(cfg, 1, device="cpu")["parameters"] == \
        -2 * cfg.padded_vocab * cfg.width  # the bf16 embedding on CUDA


def test_fixed_reduce_order_partial_sums():
    """The fixed reduction order's owner keeps floor(log2(micro-batches per rank)) + 1 partial sums of its matrices:
    W times the default gradients' bytes at one process, 1/W of them per sum (plus two buckets) at W ranks; the
    default (partial_sums=0) is today's number."""
    cfg = config_for("untied_grow", 12)
    matrices = 4 * model.stored_blocks(cfg) * model.params_per_block(cfg)
    adamw = 4 * cfg.padded_vocab * cfg.width + 2 * cfg.padded_vocab * cfg.width  # lm_head fp32, bf16 embedding
    default = memory.persistent_bytes(cfg, 8)
    assert default == memory.persistent_bytes(cfg, 8, partial_sums=0) and default["gradients"] == matrices + adamw
    assert memory.persistent_bytes(cfg, 1, partial_sums=3)["gradients"] == 3 * (matrices + adamw)
    owned = 4 * max(sum(r * c for r, c in o) for o in memory.muon_owner_loads(memory.block_matrix_shapes(cfg), 8))
    assert memory.persistent_bytes(cfg, 8, partial_sums=3)["gradients"] == \
        3 * owned + 2 * memory.ZERO2_BUCKET_BYTES + 2 * adamw + 3 * adamw // 8
    need = {b: memory.memory_per_rank(cfg, 4, b, 8, partial_sums=(32 // b).bit_length()) for b in (4, 16)}
    plan = memory.plan_memory(cfg, [2, 4], 32, 200, world_size=8, device_batch=[4, 16], fixed_order=True)
    assert [s.bytes for s in plan.stages[1:]] == [need[16]]  # 2 micro-batches per rank: 2 partial sums
    assert need[4]["gradients"] - need[16]["gradients"] == 2 * owned + 2 * adamw // 8  # 8 per rank: 4 sums


def test_planner_drops_micro_batch_at_growth_and_names_what_fits():
    cfg = config_for("untied_grow", 8)
    need = {(k, b): memory.memory_per_rank(cfg, k, b)["required"] for k in (2, 4) for b in (2, 4)}
    assert need[2, 4] < need[4, 4] and need[4, 2] < need[4, 4]
    gib = (max(need[2, 4], need[4, 2]) + need[4, 4]) / 2 / GIB
    plan = memory.plan_memory(cfg, [2, 4], 4, gib)
    assert [s.micro_batch for s in plan.stages] == [4, 2]
    assert [s.executed_blocks for s in plan.stages] == [11, 17]
    assert all(s.bytes["required"] <= gib * GIB for s in plan.stages)
    assert [s.micro_batch for s in memory.plan_memory(cfg, [2, 4], 4, gib, device_batch=[4, 2]).stages] == [4, 2]
    with pytest.raises(ValueError, match="micro-batch 4 needs .* the largest that fits is 2"):
        memory.plan_memory(cfg, [2, 4], 4, gib, device_batch=4)
    with pytest.raises(ValueError, match="does not divide the 4 sequences"):
        memory.plan_memory(cfg, [2, 4], 4, gib, device_batch=3)
    with pytest.raises(ValueError, match="even at micro-batch 1"):
        memory.plan_memory(cfg, [2, 4], 4, 4.0)


def test_data_constrained_planning_uses_executed_depth():
    one, twelve = config_for("operator_1", 8, passes=1), config_for("operator_1", 8, passes=12)
    shallow, deep = memory.plan_memory(one, [1], 32, 80), memory.plan_memory(twelve, [12], 32, 80)
    assert deep.stages[0].executed_blocks == 2 + 12 * 3 + 3
    assert deep.stages[0].micro_batch < shallow.stages[0].micro_batch
