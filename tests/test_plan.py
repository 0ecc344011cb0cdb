"""Tests for plan.py: the plan against the release's per-run values (tests/data/spec_plans.csv) and its compute
column, the schedules; the memory model against what autograd saves on CPU (saved_tensors_hooks, unique storages) and
the CPU allocator's peak (torch.profiler's memory events), for training and for evaluation; the micro-batch planner's choices and errors; the first-contact
matrix (every entry point's plan on the GPUs a user has, at 1, 8 and 16 of them)."""
import csv
import io
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import arms
import bench
import core_eval
import model
import plan as plan_lib
import train
from common import UsageError
from model import config_for
from plan import GIB, lr_multiplier, passes_at, wsd_multiplier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_ROWS = list(csv.DictReader(open(os.path.join(ROOT, "tests", "data", "spec_plans.csv"))))
LADDER_ROWS = list(csv.DictReader(open(os.path.join(ROOT, "reference", "fineweb_ladders.csv"))))


def plan_for(*argv):
    return train.make_plan(train.parse_args(list(argv)))


def sig6(x):
    return float(f"{x:.6g}")


# ----------------------------------------------------------------------------------------------------------------------
# The plan and its schedules

@pytest.mark.parametrize("row", SPEC_ROWS, ids=lambda r: f"{r['arch']}_d{r['depth']}")
def test_plan_matches_spec_table(row):
    plan = plan_for("--arch", row["arch"], "--depth", row["depth"]).as_dict()
    for key in ("width", "heads", "mlp_hidden", "params_tpp", "params_stored", "steps", "train_token_limit",
                "flops_per_token_final"):
        assert plan[key] == int(row[key]), key
    assert plan["crossover_step"] == (int(row["crossover_step"]) if row["crossover_step"] else None)
    for key in ("matrix_lr", "embedding_lr", "unembedding_lr"):  # the table prints 6 significant figures
        assert sig6(plan[key]) == float(row[key]), key
    assert plan["total_flops"] == pytest.approx(float(row["total_flops"]), rel=1e-6)


def test_planner_picks_the_largest_fitting_micro_batch_for_every_spec_run():
    for row in SPEC_ROWS:
        plan = plan_for("--arch", row["arch"], "--depth", row["depth"])
        world = 16 if plan.depth == 26 else 8
        mem = plan_lib.plan_micro_batches(plan, world, arms.H100_80GB_GIB, per_node=8)
        for stage, passes in zip(mem.stages, plan_lib.memory_pass_stages(plan)):
            assert stage.passes == passes and 32 * 8 // world % stage.micro_batch == 0
            assert stage.bytes["required"] <= arms.H100_80GB_GIB * plan_lib.GIB
            bigger = 2 * stage.micro_batch
            if bigger <= 32 * 8 // world:
                assert plan_lib.memory_per_rank(plan.model_config, passes, bigger, world, 8)["required"] > \
                    arms.H100_80GB_GIB * plan_lib.GIB, row


def test_total_flops_match_all_58_release_ladder_rows():
    assert len(LADDER_ROWS) == 58
    for row in LADDER_ROWS:
        plan = plan_for("--arch", row["arm"], "--depth", row["depth"])
        assert plan.total_flops == pytest.approx(float(row["compute_flops"]), rel=1e-6), row


def test_worked_examples_exact():
    vanilla = plan_for("--arch", "vanilla", "--depth", "8")
    assert vanilla.embedding_lr == pytest.approx(0.01810193359836, rel=1e-12)
    assert vanilla.total_flops == 1_055_750_772_932_739_072
    grow = plan_for("--arch", "untied_grow", "--depth", "8")
    assert (grow.steps, grow.crossover_step) == (3341, 2372)
    assert grow.total_flops == 2_542_244_965_958_811_648
    # Deep Vanilla Grow (INFERRED schedule, docs/recipe.md)
    inferred = {6: (1334, 667), 8: (2330, 1165), 10: (3835, 1917), 12: (5729, 2864), 14: (8539, 4269),
                16: (12236, 6118), 18: (16349, 8174)}
    for d, expected in inferred.items():
        p = plan_for("--arch", "deep_vanilla_grow", "--depth", str(d))
        assert (p.steps, p.crossover_step) == expected


def test_data_constrained_plan():
    p = plan_for("--arch", "operator_1", "--depth", "8", "--data-constrained", "tuned-wd", "--passes", "4")
    assert p.steps == 1900 and p.epochs == 10 and p.train_token_limit == 100_000_000
    assert p.matrix_lr == 0.04 and p.weight_decay == 0.8 and p.passes_final == 4
    assert plan_for("--arch", "operator_1", "--depth", "12", "--data-constrained", "tuned-wd").weight_decay == 1.2
    assert plan_for("--arch", "operator_1", "--depth", "12", "--data-constrained", "fixed-wd").matrix_lr == 0.04


def test_wsd_schedule_examples():
    # Vanilla d8: S = 1962, W = 40, r = 0.6 -> decay from step 785, 0 on the last step.
    plan = plan_for("--arch", "vanilla", "--depth", "8")
    m = [lr_multiplier(i, plan) for i in range(plan.steps)]
    assert m[0] == 1 / 40 and m[39] == 1.0 and m[784] == 1.0 and m[785] == 1.0 and m[786] < 1.0
    assert m[-1] == 0.0
    op1 = plan_for("--arch", "operator_1", "--depth", "8")
    m = [lr_multiplier(i, op1) for i in range(op1.steps)]
    assert m[0] == 1.0 and m[471] == 1.0 and m[472] < 1.0 and m[-1] == 0.0


def test_growth_rewarm_and_passes():
    plan = plan_for("--arch", "untied_grow", "--depth", "8")
    c = plan.crossover_step
    assert lr_multiplier(c, plan) == 0.0
    assert lr_multiplier(c + 1, plan) == pytest.approx(wsd_multiplier(c + 1, 3341, 40, 1.0) / 40)
    assert lr_multiplier(c + 40, plan) == wsd_multiplier(c + 40, 3341, 40, 1.0)
    assert [passes_at(s, plan) for s in (0, c - 1, c, plan.steps - 1)] == [2, 2, 4, 4]


def test_staged_and_random_recurrence_plans():
    staged = plan_for("--arch", "untied_grow", "--depth", "8", "--pass-stages", "2", "4", "6",
                      "--crossover-fractions", "0.5", "0.75")
    s = staged.steps
    assert staged.crossover_steps == (math.floor(0.5 * s), math.floor(0.75 * s))
    assert staged.passes_final == 6 and staged.model_config.passes_initial == 2
    rand = plan_for("--arch", "loop_grow", "--depth", "8", "--random-passes", "2", "3", "4", "5", "6")
    after = [passes_at(i, rand) for i in range(rand.crossover_step, rand.steps)]
    assert set(after) == {2, 3, 4, 5, 6} and rand.passes_final == 4
    assert rand.total_flops != plan_for("--arch", "loop_grow", "--depth", "8").total_flops


def test_data_constrained_plans_for_the_executed_depth():
    def micro(k):
        plan = plan_for("--arch", "operator_1", "--depth", "8", "--passes", str(k), "--data-constrained", "tuned-wd")
        assert plan.model_config.passes == k
        (stage,) = plan_lib.plan_micro_batches(plan, 8, arms.H100_80GB_GIB).stages
        return stage.micro_batch, stage.executed_blocks
    assert micro(1) == (32, 8) and micro(12) == (8, 41)


# ----------------------------------------------------------------------------------------------------------------------
# Memory per rank and the micro-batch planner

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
    assert close(activations, plan_lib.activation_bytes(cfg, passes, batch, autocast))
    assert close(loss_path, plan_lib.loss_path_bytes(cfg, batch, autocast)[0])
    assert weight_copies == plan_lib.weight_copy_bytes(cfg, passes, autocast)


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_unchunked_loss_path_formula_and_what_chunking_saves(shape, autocast):
    cfg, batch = shaped("loop_2", shape)
    _, _, unchunked, unchunked_largest = measure(cfg, 2, batch, autocast, chunked=False)
    _, _, _, chunked_largest = measure(cfg, 2, batch, autocast)
    assert close(unchunked, plan_lib.loss_path_bytes(cfg, batch, autocast, chunked=False)[0])
    logits_fp32 = batch * cfg.seq_len * cfg.vocab_size * 4
    assert unchunked_largest == logits_fp32  # the log-softmax kept for backward
    assert chunked_largest == cfg.padded_vocab * cfg.width * 4 < logits_fp32  # only d(loss)/d(lm_head) is that big


def allocator_peak(fn):
    """(fn(), the most bytes the CPU allocator held at once while fn ran, above what it held before). torch.profiler's
    memory events see every allocation, the temporaries inside an aten op (logsumexp's) included, which tensor-level
    trackers (MemTracker, dispatch modes) do not."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU):
        live += nbytes
        peak = max(peak, live)
    return out, peak


@pytest.mark.parametrize("chunk_rows", [32, 4096], ids=["8-chunks", "1-chunk"])
def test_chunked_loss_peak_is_what_the_memory_model_counts(monkeypatch, chunk_rows):
    """The chunked loss's forward and backward (fp32, as on CPU) at a shape where the (rows, vocab) logits dominate:
    the allocator's peak is bounded by loss_path_bytes, and tightly. It caught the previous chunk's logits and
    probabilities still alive while the next chunk's were built (three chunks at once), and logsumexp's temporary."""
    monkeypatch.setattr(model, "LOSS_CHUNK_ROWS", chunk_rows)
    cfg = config_for("vanilla", 1, width_per_depth=32, head_dim=16, seq_len=64, vocab_size=8000, mlp_multiple=64)
    torch.manual_seed(0)
    net = model.GPT(cfg)
    h = torch.randn(4, cfg.seq_len, cfg.width, requires_grad=True)
    targets = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    _, measured = allocator_peak(lambda: net.loss(h, targets).backward())
    monkeypatch.setattr(plan_lib, "LOSS_CHUNK_ROWS", chunk_rows)
    _, predicted = plan_lib.loss_path_bytes(cfg, 4, autocast=False)
    assert measured <= predicted <= 1.05 * measured


@pytest.mark.parametrize("chunked", [True, False])
def test_predicted_peak_bounds_the_measured_peak(chunked):
    """fwd+bwd without an optimizer: the prediction (its parameters, gradients, weight copies, activations and loss
    path) is an upper bound of the allocator's peak, and not a loose one."""
    cfg = config_for("loop_2", 3, width_per_depth=32, head_dim=16, seq_len=64, vocab_size=8000, mlp_multiple=64)
    net = model.GPT(cfg)
    idx, targets = torch.randint(0, cfg.vocab_size, (2, 4, cfg.seq_len))

    def step():
        loss = net(idx, targets) if chunked else F.cross_entropy(net(idx).flatten(0, 1), targets.flatten())
        loss.backward()
    _, peak = allocator_peak(step)
    measured = peak + sum(p.numel() * p.element_size() for p in [*net.parameters(), *net.buffers()])
    m = plan_lib.memory_per_rank(cfg, 2, 4, device="cpu")
    loss_saved, loss_peak = plan_lib.loss_path_bytes(cfg, 4, autocast=False, chunked=chunked)
    predicted = m["parameters"] + m["rotary"] + m["gradients"] + m["activations"] + loss_saved + \
        max(loss_peak - loss_saved, m["step_transient"] if chunked else 0)
    assert measured <= predicted <= 1.25 * measured


EVAL_CHUNK_ROWS = 32  # the loss chunk for the evaluation tests: 16 chunks of the 512 rows of one batch


def evaluation_setup(monkeypatch, autocast, vocab_size=16000, width_per_depth=32):
    """A batch of 8 validation windows (512 targets) of a small model, by default with a large vocabulary (16,000 x
    width 64): full fp32 logits of the batch would be 4x the size of the lm_head and embedding together."""
    monkeypatch.setattr(model, "LOSS_CHUNK_ROWS", EVAL_CHUNK_ROWS)
    monkeypatch.setattr(plan_lib, "LOSS_CHUNK_ROWS", EVAL_CHUNK_ROWS)
    if autocast:
        monkeypatch.setattr(train, "autocast", lambda device: torch.autocast("cpu", torch.bfloat16))
    cfg = config_for("loop_2", 2, width_per_depth=width_per_depth, head_dim=16, seq_len=64, vocab_size=vocab_size,
                     mlp_multiple=64)
    torch.manual_seed(0)
    net = model.GPT(cfg)
    for p in net.parameters():  # non-zero logits
        torch.nn.init.normal_(p, std=0.02)
    windows = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len + 1))
    return cfg, net, windows, torch.ones(cfg.vocab_size, dtype=torch.long)


class LargestLogits(TorchDispatchMode):
    """The most rows of any fp32 (rows, >= vocab) tensor an op returns, parameters and their views excluded."""

    def __init__(self, vocab_size, net):
        super().__init__()
        self.vocab_size, self.rows = vocab_size, 0
        self.own = {p.untyped_storage().data_ptr() for p in net.parameters()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() and \
                    t.shape[-1] >= self.vocab_size and t.untyped_storage().data_ptr() not in self.own:
                self.rows = max(self.rows, t.numel() // t.shape[-1])
        return out


def test_evaluation_builds_no_fp32_logits_beyond_one_loss_chunk(monkeypatch):
    cfg, net, windows, token_bytes = evaluation_setup(monkeypatch, autocast=False)
    with LargestLogits(cfg.vocab_size, net) as largest:
        loss, bpb = train.evaluate(net, windows, 2, 8, token_bytes, 0, 1, torch.device("cpu"))
    assert largest.rows == EVAL_CHUNK_ROWS  # not the batch's 512
    with torch.no_grad():
        reference = F.cross_entropy(net(windows[:, :-1], passes=2).flatten(0, 1), windows[:, 1:].flatten()).item()
    assert loss == pytest.approx(reference, rel=1e-6) and bpb == pytest.approx(reference / math.log(2), rel=1e-6)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("vocab_size, width_per_depth", [(16000, 32), (257, 64)], ids=["loss", "block"])
def test_evaluation_memory_is_counted_by_the_memory_model(monkeypatch, autocast, vocab_size, width_per_depth):
    """What train.evaluate allocates besides the model's parameters and buffers (the allocator's peak) is bounded by
    the memory model's evaluation term, at a shape where the chunked loss is the peak and at one where a block is,
    and fits in the step the planner reserves at that micro-batch."""
    cfg, net, windows, token_bytes = evaluation_setup(monkeypatch, autocast, vocab_size, width_per_depth)
    _, measured = allocator_peak(lambda: train.evaluate(net, windows, 2, 8, token_bytes, 0, 1, torch.device("cpu")))
    m = plan_lib.memory_per_rank(cfg, 2, 8, device="cpu")
    assert measured + sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()]) <= m["peak"]
    evaluation = plan_lib.evaluation_bytes(cfg, 2, 8, autocast)
    assert measured <= evaluation <= 1.1 * measured
    assert m["evaluation"] == plan_lib.evaluation_bytes(cfg, 2, 8, autocast=False)


@pytest.mark.parametrize("arch", list(arms.ARMS))
def test_parameter_bytes_are_the_built_modules_for_every_arm(arch):
    """plan.parameter_bytes (model.py's params_stored, the embedding in its device dtype) is the bytes of the
    parameters of the module built for every arm of arms.py's table, paper and user arms alike; and the matrix shapes
    the sharded terms use are the module's."""
    cfg = config_for(arch, 4, width_per_depth=16, head_dim=16, seq_len=16, vocab_size=257, mlp_multiple=16)
    net = model.GPT(cfg)
    assert plan_lib.parameter_bytes(cfg, "cpu") == sum(p.numel() * p.element_size() for p in net.parameters())
    bf16_embedding = model.GPT(cfg, device="meta")  # the dtype the CUDA build gives the embedding
    bf16_embedding.transformer.wte.weight.data = bf16_embedding.transformer.wte.weight.data.bfloat16()
    assert plan_lib.parameter_bytes(cfg, "cuda") == sum(p.numel() * p.element_size()
                                                        for p in bf16_embedding.parameters())
    assert [tuple(p.shape) for p in net.param_groups()["matrix"]] == plan_lib.block_matrix_shapes(cfg)


def test_state_per_rank_shrinks_with_the_shards():
    """FSDP2 divides parameters, gradients and optimizer state by the ranks of a node (up to dim-0 padding); HSDP's
    other nodes change nothing per rank; a dormant untied core has no gradient."""
    cfg = config_for("untied_grow", 18)
    one, eight, sixteen = (plan_lib.persistent_bytes(cfg, 4, w, min(w, 8)) for w in (1, 8, 16))
    assert eight == sixteen
    for key in ("parameters", "gradients", "adamw_state"):
        assert one[key] / 8 <= eight[key] <= one[key] / 8 * 1.01, key
    assert one["muon_state"] / 8 < eight["muon_state"] <= one["muon_state"] / 8 * 1.05
    assert plan_lib.persistent_bytes(cfg, 2)["gradients"] < one["gradients"]  # before growth: 2 of 4 cores trained
    assert one["parameters"] - plan_lib.persistent_bytes(cfg, 4, device="cpu")["parameters"] == \
        -2 * cfg.padded_vocab * cfg.width  # the bf16 embedding on CUDA


@pytest.mark.parametrize("arch, passes", [("vanilla", 1), ("loop_2", 2), ("untied_grow", 2), ("untied_grow", 4)])
def test_backward_order_is_the_order_gradients_finish(arch, passes):
    """backward_block_order / executed_matrices, which plan Muon's moving matrices, are what an eager backward does:
    exactly those matrices get a gradient, each block's when its last run in backward ends (a tied core after its
    first pass, dormant untied cores never)."""
    cfg = config_for(arch, 4, width_per_depth=8, head_dim=8, seq_len=8, vocab_size=64, mlp_multiple=8)
    net = model.GPT(cfg)
    net.set_passes(passes)
    matrices = net.param_groups()["matrix"]
    per_block = len(matrices) // model.stored_blocks(cfg)
    finished = []
    for i, p in enumerate(matrices):
        p.register_post_accumulate_grad_hook(lambda _, i=i: finished.append(i))
    idx = torch.randint(0, 64, (2, 9))
    net(idx[:, :-1], targets=idx[:, 1:]).backward()
    assert sorted(finished) == plan_lib.executed_matrices(cfg, passes)
    order = plan_lib.backward_block_order(cfg, passes)
    last_runs = [b for k, b in enumerate(order) if k == max(j for j, c in enumerate(order) if c == b)]
    assert list(dict.fromkeys(i // per_block for i in finished)) == last_runs
    assert len(order) == model.executed_blocks(cfg, passes)


def test_memory_counts_fsdp2s_transients():
    """Under FSDP2 the peak holds two gathered blocks in bf16 and the root's tables instead of autocast's copies of
    every block, one block's gradient on its way to the shards, and Muon's owner round of the largest matrix; one
    process has autocast's copies and no reduce-scatter."""
    cfg = config_for("untied_grow", 26)
    sharded, alone = plan_lib.memory_per_rank(cfg, 4, 2, 16, 8), plan_lib.memory_per_rank(cfg, 4, 2)
    block, table = model.params_per_block(cfg), cfg.padded_vocab * cfg.width
    assert sharded["weight_copies"] == 2 * (2 * block + 2 * table)
    assert alone["weight_copies"] == 2 * model.stored_blocks(cfg, 4) * block and alone["reduce_scatter"] == 0
    assert sharded["reduce_scatter"] == 2 * block + 4 * block + 4 * -(-block // 8) + 2 * 2 * table
    assert sharded["optimizer_step"] > 26 * cfg.mlp_hidden * cfg.width  # the owner's whole H x C matrix and its copies
    static = sum(sharded[k] for k in ("parameters", "rotary", "gradients", "muon_state", "adamw_state"))
    assert sharded["peak"] == static + max(sharded["optimizer_step"], sharded["evaluation"], sum(
        sharded[k] for k in ("weight_copies", "activations", "loss_path", "step_transient")))


def test_planner_drops_micro_batch_at_growth_and_names_what_fits():
    cfg = config_for("untied_grow", 8)
    need = {(k, b): plan_lib.memory_per_rank(cfg, k, b)["required"] for k in (2, 4) for b in (2, 4)}
    assert need[2, 4] < need[4, 4] and need[4, 2] < need[4, 4]
    gib = (max(need[2, 4], need[4, 2]) + need[4, 4]) / 2 / GIB
    plan = plan_lib.plan_memory(cfg, [2, 4], 4, gib)
    assert [s.micro_batch for s in plan.stages] == [4, 2]
    assert [s.executed_blocks for s in plan.stages] == [11, 17]
    assert all(s.bytes["required"] <= gib * GIB for s in plan.stages)
    assert [s.micro_batch for s in plan_lib.plan_memory(cfg, [2, 4], 4, gib, micro_batches=[4, 2]).stages] == [4, 2]
    with pytest.raises(ValueError, match="micro-batch 4 needs .* the largest that fits is 2"):
        plan_lib.plan_memory(cfg, [2, 4], 4, gib, micro_batches=[4, 4])
    with pytest.raises(ValueError, match="even at micro-batch 1"):
        plan_lib.plan_memory(cfg, [2, 4], 4, 4.0)


def test_data_constrained_planning_uses_executed_depth():
    one, twelve = config_for("operator_1", 8, passes=1), config_for("operator_1", 8, passes=12)
    shallow, deep = plan_lib.plan_memory(one, [1], 32, 80), plan_lib.plan_memory(twelve, [12], 32, 80)
    assert deep.stages[0].executed_blocks == 2 + 12 * 3 + 3
    assert deep.stages[0].micro_batch < shallow.stages[0].micro_batch


def test_requested_micro_batches_come_from_the_flag_or_the_cpu_preset_and_are_checked_once():
    """--device-batch-size (or, on CPU without --gpu-memory, the preset's micro-batch) becomes one micro-batch per pass
    stage (only the preset's default is capped at the sequences per rank; a value the user gives is refused when it
    does not divide them); the planner then only checks that they fit."""
    def requested(*flags, world=8, device="cuda"):
        args = train.parse_args(["--arch", "untied_grow", "--depth", "8", *flags])
        return plan_lib.requested_micro_batches(args, train.make_plan(args), world, device)
    assert requested() is None and requested(device="cpu") == [32, 32]  # on CPU: the paper preset's 32
    assert requested("--device-batch-size", "8") == [8, 8] and requested("--device-batch-size", "16", "4") == [16, 4]
    with pytest.raises(train.UsageError, match="micro-batch 64 does not divide the 32 sequences per rank"):
        requested("--device-batch-size", "64")  # not silently clamped
    assert requested("--gpu-memory", "80", device="cpu") is None
    cpu = train.parse_args(["--arch", "vanilla", "--depth", "2", "--preset", "cpu"])
    cpu_default = arms.PRESETS["cpu"].device_batch_size
    assert plan_lib.requested_micro_batches(cpu, train.make_plan(cpu), 1, "cpu") == [cpu_default]
    with pytest.raises(train.UsageError, match="one value or one per pass stage"):
        requested("--device-batch-size", "8", "8", "8")
    with pytest.raises(train.UsageError, match="micro-batch 3 does not divide the 32 sequences per rank"):
        requested("--device-batch-size", "3")


def test_plan_micro_batches_says_what_does_not_fit():
    plan = plan_for("--arch", "untied_grow", "--depth", "26")
    mem = plan_lib.plan_micro_batches(plan, 16, arms.H100_80GB_GIB, per_node=8)
    assert [s.micro_batch for s in mem.stages] == [4, 2]  # the release's 4 -> 2 at growth
    with pytest.raises(UsageError, match="does not fit 20 GiB per GPU on 16 GPUs .8 per node., not even at micro"):
        plan_lib.plan_micro_batches(plan, 16, 20, per_node=8)


# ----------------------------------------------------------------------------------------------------------------------
# The first-contact matrix: on the GPUs a user has (memory as torch reports it: H100 80GB, H100 NVL, H200, B200) and at
# 1, 8 and 16 of them, every entry point's plan fits or stops with one line, before it touches data or a GPU.

GPUS_GIB = (79.65, 93.1, 140.4, 178.0)
WORLD_SIZES = (1, 8, 16)
LADDERS = [("all", "paper"), ("untied_grow", "d26"), ("operator_1", "data-constrained")]  # bash ladder.sh's runs
CUDA = torch.device("cuda")  # planning only: no CUDA call is made with --gpu-memory given


def planned(args, plan, world):
    """A run's memory plan as train.py makes it on `world` CUDA ranks (after its flags, before any data), or the
    UsageError it stops with, which must be one line."""
    try:
        mem = plan_lib.device_memory_plan(args, plan, world, CUDA)
    except UsageError as e:
        assert "\n" not in str(e), str(e)
        return e
    assert all(s.bytes["required"] <= args.gpu_memory * GIB for s in mem.stages)
    return mem


@pytest.fixture(scope="module")
def ladder_plans():
    """(name, flags, plan, final model config) of every run of `bash ladder.sh all`, `--preset d26` and
    `--preset data-constrained`."""
    runs = []
    for target, preset in LADDERS:
        for name, run_args in arms.ladder_runs(target, preset):
            args = train.parse_args(run_args)
            runs.append((name, args, train.make_plan(args)))
    return runs


def core_eval_peak(cfg, passes):
    """An upper bound of core_eval.py's bytes on CUDA (it plans nothing): fp32 weights as load_checkpoint_model keeps
    them, one forward of the tokens_per_forward cap without gradient (plan.evaluation_bytes), and its unchunked
    decode of up to every position's fp32 logits, log-softmax and its temporary."""
    weights = 4 * model.params_stored(cfg) + 4 * 2 * model.ROPE_TABLE_FACTOR * cfg.seq_len * (cfg.head_dim // 2)
    tokens = core_eval.EVAL["tokens_per_forward"]["cuda"]
    forward = plan_lib.evaluation_bytes(cfg, passes, tokens // cfg.seq_len)
    margin = plan_lib.CUDA_CONTEXT_BYTES + plan_lib.WORKSPACE_BYTES  # one process: no NCCL
    return weights + forward + 3 * tokens * 4 * cfg.vocab_size + margin


@pytest.mark.parametrize("gib", GPUS_GIB)
def test_first_contact_matrix(gib, ladder_plans):
    """ladder.sh's paper ladders, the d26 preset and the data-constrained grid fit or stop with one line at every
    world size, and fit where the README runs them (the ladders on 8 GPUs, d26 on 2 x 8); `python bench.py`,
    `python bench.py --gpu-check` (one GPU, every section) and core_eval.py (the largest final model of every ladder)
    fit one GPU of every size."""
    for world in WORLD_SIZES:
        for name, args, plan in ladder_plans:
            args.gpu_memory = gib
            mem = planned(args, plan, world)
            if world == 16 or (world == 8 and plan.depth < 26):
                assert isinstance(mem, plan_lib.MemoryPlan), f"{name} on {world} GPUs: {mem}"
    bench_args = bench.parse_args(["--preset", "paper", "--gpu-memory", str(gib)])
    ratio_args, plans = bench.bench_plans(bench_args, CUDA, arms.PRESETS["paper"].anchor_depth, 31)
    for arch, plan in plans.items():
        mem = planned(ratio_args, plan, 1)
        assert isinstance(mem, plan_lib.MemoryPlan), f"python bench.py, {arch}: {mem}"
    check_args = bench.parse_args(["--gpu-check", "--gpu-memory", str(gib)])
    for section, runs in bench.gpu_check_plans(check_args, CUDA).items():
        for section_args, plan in runs:
            mem = planned(section_args, plan, 1)
            assert isinstance(mem, plan_lib.MemoryPlan), f"--gpu-check {section}, {plan.arch}: {mem}"
    largest = max((plan.model_config for _, _, plan in ladder_plans), key=model.params_stored)
    assert core_eval_peak(largest, largest.passes) <= gib * GIB


def test_memory_outside_the_allocator_is_counted_term_by_term_and_the_headroom_reported(monkeypatch, capsys):
    """required = peak + the CUDA context + NCCL's buffers (several ranks only; NVLS's when NCCL_NVLS_ENABLE is not 0)
    + the margin (workspaces, fragmentation); every stage reports the headroom it leaves, and the d26 dry run on
    2 x 8 H100 80GB has some at both stages."""
    cfg = config_for("untied_grow", 8)
    one, eight = (plan_lib.memory_per_rank(cfg, 4, 8, world) for world in (1, 8))
    for parts in one, eight:
        assert parts["required"] == parts["peak"] + parts["cuda_context"] + parts["nccl_buffers"] + parts["margin"]
        assert parts["margin"] == plan_lib.WORKSPACE_BYTES + round(plan_lib.MEMORY_MARGIN_FRACTION * parts["peak"])
    assert one["cuda_context"] == eight["cuda_context"] == plan_lib.CUDA_CONTEXT_BYTES
    assert (one["nccl_buffers"], eight["nccl_buffers"]) == (0, plan_lib.NCCL_BUFFER_BYTES)
    nvls = plan_lib.memory_per_rank(cfg, 4, 8, 8, nvls=True)
    assert nvls["nccl_buffers"] == plan_lib.NCCL_BUFFER_BYTES + plan_lib.NCCL_NVLS_BYTES

    def d26(nvls_env, *flags):
        monkeypatch.setenv("NCCL_NVLS_ENABLE", nvls_env)
        train.main(["--arch", "untied_grow", "--depth", "26", "--world-size", "16", "--dry-run", *flags])
        return json.loads(capsys.readouterr().out)["memory"]

    off, on = d26("0"), d26("1")
    assert (off["nccl_nvls"], on["nccl_nvls"]) == (False, True)
    for stage in off["stages"]:
        gib = stage["gib"]
        assert gib["headroom"] == pytest.approx(off["gpu_memory_gib"] - gib["required"], abs=0.02) and gib["headroom"] > 0
        assert stage["outside_allocator_bytes"] == plan_lib.CUDA_CONTEXT_BYTES + plan_lib.NCCL_BUFFER_BYTES
    assert [s["gib"]["headroom"] - t["gib"]["headroom"] for s, t in zip(off["stages"], on["stages"])] == \
        pytest.approx([plan_lib.NCCL_NVLS_BYTES / GIB] * 2, abs=0.02)
    monkeypatch.delenv("NCCL_NVLS_ENABLE")  # unset: off, as common.setup_distributed sets it
    monkeypatch.setattr("sys.stdin", io.StringIO("untied_grow_d26 --arch untied_grow --depth 26\n"))
    train.main(["--ladder-dry-run", "--nodes", "2"])
    line = capsys.readouterr().out.splitlines()[0]
    assert "0.75 CUDA context + 0.5 NCCL (NVLS off) GiB outside the allocator | headroom " in line, line
