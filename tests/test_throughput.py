"""throughput.py: FSDP2's and Muon's collectives per micro-batch and step (tests/test_parallel.py checks them against
what gloo is handed), its closed-form link bytes against rings walked edge by edge, the d26 run, and the release's
MFU (timing.json with this project's FLOP count)."""
import json
import os
import sys
from collections import Counter
from fractions import Fraction

import pytest
import torch

import arms
import model
import plan as plan_lib
import throughput
import train
from common import UsageError

KINDS = ("reduce_scatter_single", "all_gather_single", "all_reduce", "reduce", "broadcast", "all_to_all_single",
         "gather")


def walked(kind, n, nodes, per_node, root=0):
    """{"nvlink": bytes, "network": bytes} over every link of one collective, the module docstring's rings walked
    edge by edge: channel c enters each node at its GPU c + 1 and leaves it from GPU c; a ring collective sends each
    rank's chunk of n / channels along every edge (W - 1) times (all-reduce twice); a broadcast chains from the root,
    a reduce into it; all-to-all and gather send point to point."""
    world, links = nodes * per_node, Counter()

    def send(a, b, nbytes):
        links["network" if a // per_node != b // per_node else "nvlink"] += nbytes
    if kind in ("all_to_all_single", "gather"):
        for a in range(world):
            for b in range(world):
                if a != b and (kind == "all_to_all_single" or b == root):
                    send(a, b, Fraction(n, world) if kind == "all_to_all_single" else n)
        return links
    for c in range(per_node):
        ring = [k * per_node + (c + 1 + j) % per_node for k in range(nodes) for j in range(per_node)]
        at = ring.index(root)
        idle = (ring[at - 1], root) if kind == "broadcast" else (root, ring[(at + 1) % world])
        for a, b in zip(ring, ring[1:] + ring[:1]):
            if kind in ("broadcast", "reduce"):
                send(a, b, 0 if (a, b) == idle else Fraction(n, per_node))
            else:
                send(a, b, (2 if kind == "all_reduce" else 1) * (world - 1) * Fraction(n, per_node * world))
    return links


@pytest.mark.parametrize("nodes, per_node", [(1, 2), (2, 1), (2, 2), (1, 8), (2, 8), (3, 4)])
def test_link_bytes_are_the_rings_walked_edge_by_edge(nodes, per_node):
    world = nodes * per_node
    for kind in KINDS:
        for n in (4, 6144, 1_000_003):
            for root in {0, world - 1, world // 2}:
                nvlink, network = throughput.link_bytes(kind, n, nodes, per_node)
                links = walked(kind, n, nodes, per_node, root)
                assert (nvlink * world, network * world) == (links["nvlink"], links["network"]), (kind, n, root)


def test_a_micro_batch_is_fsdp2s_gathers_and_reduce_scatters():
    """Per micro-batch: the root gathered once, every executed block (a looped core at every pass) gathered in its
    forward and its backward and reduce-scattered after its backward (fp32), the root's reduce-scatter; bf16 gathers
    on CUDA. Per step: one process sends nothing but the loss; HSDP adds one all-reduce across nodes of the trained
    gradient shards; Muon two all_to_alls per round inside the node (tests/test_parallel.py checks these against the
    calls gloo gets)."""
    cfg = model.config_for("loop_grow", 8)
    block, table = model.params_per_block(cfg), 2 * cfg.padded_vocab * cfg.width
    for passes in (2, 4):
        runs = model.executed_blocks(cfg, passes)
        sends = throughput.micro_batch_sends(cfg, passes, 8)
        assert Counter((s.kind, s.nbytes) for s in sends) == Counter({
            ("all_gather_single", 2 * table): 1, ("all_gather_single", 2 * block): 2 * runs,
            ("reduce_scatter_single", 4 * block): runs, ("reduce_scatter_single", 4 * table): 1})
        assert {s.group for s in sends} == {"node"}
    moving = plan_lib.executed_matrices(cfg, 4)
    one_node, two_nodes = (throughput.step_sends(cfg, 4, moving, nodes, 8) for nodes in (1, 2))
    assert [s for s in two_nodes if s not in one_node] == [s for s in two_nodes if s.group == "cross"]
    (across,) = [s for s in two_nodes if s.group == "cross"]
    assert across.kind == "all_reduce" and across.nbytes == 4 * (
        model.stored_blocks(cfg, 4) * plan_lib.block_shard_numel(cfg, 8) + 2 * -(-cfg.padded_vocab // 8) * cfg.width)
    assert len([s for s in one_node if s.kind == "all_to_all_single"]) == 2 * len(throughput.muon_rounds(cfg, moving, 8))


def test_d26_on_two_nodes_plans_micro_batch_4_then_2_at_45_percent():
    """d26 on 2 x 8 H100 80GB under HSDP: micro-batch 4 then 2 (the release's), every micro-batch's traffic inside
    the node (NVLink), the network carries only the once-per-step all-reduce of a rank's gradient shard (~1/8 of
    the trained fp32 gradients); predicted MFU >= 45 %."""
    plan = train.make_plan(train.parse_args(["--arch", "untied_grow", "--depth", "26"]))
    mem = plan_lib.plan_micro_batches(plan, 16, arms.H100_80GB_GIB, per_node=8)
    assert [s.micro_batch for s in mem.stages] == [4, 2] and mem.stages[-1].headroom >= 2 * plan_lib.GIB
    speed = throughput.predict(plan, mem, 2, 8)
    cfg, final = plan.model_config, speed["stages"][-1]
    gradients = 4 * model.stored_blocks(cfg, 4) * plan_lib.block_shard_numel(cfg, 8)
    assert gradients / 1e9 < final["gb_per_step"]["network"] * 8 < 1.2 * gradients / 1e9 * 8
    assert 0 < final["seconds"]["exposed_communication"] < final["seconds"]["communication"]
    assert speed["mfu"] >= 0.45 and speed["layout"] == "HSDP"
    one_node = throughput.predict(plan, plan_lib.plan_micro_batches(plan, 16, 1000), 1, 16)
    assert one_node["stages"][-1]["gb_per_step"]["network"] == 0


def test_cluster_knobs_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("NIC_GBITS", "200")
    monkeypatch.setenv("NICS_PER_NODE", "4")
    cluster = throughput.cluster_from_env()
    assert (cluster.nic_gbits, cluster.nics_per_node, cluster.nvlink_gbs) == (200, 4, 450)
    for name, value in (("NICS_PER_NODE", "0"), ("BUS_EFFICIENCY", "1.5"), ("MATMUL_EFFICIENCY", "nan")):
        monkeypatch.setenv(name, value)
        with pytest.raises(UsageError, match=f"environment variable {name} "):
            throughput.cluster_from_env()
        monkeypatch.delenv(name)


def release_mfu(arch, depth, hours):
    plan = train.make_plan(train.parse_args(["--arch", arch, "--depth", str(depth)]))
    return throughput.measured_mfu(plan.total_flops, hours)


def test_anchor_the_release_mfu_from_its_hours_and_our_flops_and_the_model_calibrated_on_it():
    """timing.json's training hours on one 8 x H100 node and this project's FLOP count: Vanilla d6 37 %, d12 46.4 %,
    d20 49.6 % (issue 29); every one of the 58 runs is an arm of arms.RELEASE_SERIES, and the throughput model's
    compute efficiency (arms.CLUSTERS) predicts every one within 3 points (docs/throughput_table.py): narrow runs
    lower, not one constant for all."""
    import arms
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs"))
    import throughput_table
    timing = throughput.release_timing()
    assert len(timing) == 58
    hours = {(arms.RELEASE_SERIES[s], d): h for s, d, h in timing}
    assert len(hours) == 58 and set(arch for arch, _ in hours) == set(arms.PAPER_ARMS)
    got = {d: release_mfu("vanilla", d, hours["vanilla", d]) for d in (6, 12, 20)}
    assert (round(100 * got[6]), round(100 * got[12], 1), round(100 * got[20], 1)) == (37, 46.4, 49.6)
    rows = {name: (release, predicted) for name, _, release, predicted, *_ in throughput_table.rows()}
    assert len(rows) == 58 and throughput_table.CALIBRATION_POINTS == 3
    assert all(abs(predicted - release) <= 0.03 for release, predicted in rows.values()), rows
    assert rows["vanilla_d6"][1] < rows["vanilla_d12"][1] < rows["vanilla_d20"][1] and \
        rows["vanilla_d20"][1] - rows["vanilla_d6"][1] > 0.1
    with pytest.raises(UsageError):
        throughput.measured_mfu(1e18, 0.0)


def test_a_cpu_preset_dry_run_measures_this_cpu_instead_of_predicting_an_h100(capsys):
    """`--preset cpu --dry-run` printed H100 MFU and "2.93e-09 GPU-hours"; it now times a probe on this CPU: every
    pass stage's steps at its measured step time plus the validations (start, 2 around the growth, periodic, end)."""
    import train
    assert train.main(["--arch", "untied_grow", "--depth", "1", "--preset", "cpu", "--eval-every", "10",
                       "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    speed, steps = out["throughput"], out["steps"]
    assert "gpu_hours" not in speed and "mfu" not in speed and speed["measured"].startswith("on this CPU")
    assert out["memory"]["gpu_memory_gib"] is None and out["host_memory"]["ranks_per_node"] == 1  # no H100 planned
    assert [(s["passes"], s["steps"]) for s in speed["stages"]] == [(2, out["crossover_steps"][0]),
                                                                   (4, steps - out["crossover_steps"][0])]
    assert speed["validations"] == 2 + 2 + (steps - 1) // 10
    train_seconds = sum(s["steps"] * s["step_seconds"] for s in speed["stages"])
    assert speed["train_seconds"] == pytest.approx(train_seconds, rel=1e-3)
    assert speed["wall_seconds"] == pytest.approx(train_seconds + speed["validations"] * speed["validation_seconds"],
                                                  rel=1e-3)
    assert throughput.summary_line("untied_grow_d1", speed).startswith("cpu time untied_grow_d1: step ")


def test_the_cpu_probe_times_the_threads_torchrun_gives_the_run(monkeypatch):
    """torchrun sets OMP_NUM_THREADS=1 only where a node runs several ranks: ladder.sh's one cpu rank (and a plain
    python train.py) trains on every core, and the probe timed one thread, 31 % over the demo; 8 ranks: one each."""
    import train
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plan = train.make_plan(train.parse_args(["--arch", "vanilla", "--depth", "1", "--preset", "cpu"]))
    default = torch.get_num_threads()
    assert f", {default} threads)" in throughput.cpu_probe(plan, 0, per_node=1)["measured"]
    assert ", 1 threads)" in throughput.cpu_probe(plan, 0, per_node=8)["measured"]
    assert torch.get_num_threads() == default
