"""throughput.py: the collectives it predicts against what train_step sends on 2 and 4 gloo ranks (4 as 2 "nodes" x
2), its closed-form link bytes against rings walked edge by edge, the overlap rule, the d26 run, and the release's
MFU (timing.json with this project's FLOP count)."""
import json
import os
import sys
from collections import Counter
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist

import plan as plan_lib
import throughput
import train
from common import UsageError
from test_train import COLLECTIVES, LEDGER_ARGV, LEDGER_NODE_SIZE, LEDGER_RUNS, LEDGER_TRANSPORTS

KINDS = ("reduce_scatter_single", "all_gather_single", "all_reduce", "reduce", "broadcast", "all_to_all_single",
         "gather")
FIELD = {"reduce": "dst", "broadcast": "src", "gather": "dst"}  # the root's keyword (muon.py passes it by name)


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


def test_a_bucket_ready_with_another_in_flight_stalls_backward():
    """Backward of 3 blocks of 1 s, every collective 1 s. Buckets ready 1 s apart hide; two complete at once: backward
    waits 1 s for the first before copying the second (exposed although the stream has time), and at backward's end
    the second also ends 1 s after it: 2 s. An AdamW all-reduce does not stall backward but queues on the stream."""
    send = throughput.BackwardSend
    cost = lambda s: 1.0  # noqa: E731
    assert throughput.backward_exposed([send("reduce_scatter_single", 1, k, True) for k in (1, 2)], 0.0, 1.0, 3,
                                       cost) == 0.0
    assert throughput.backward_exposed([send("reduce_scatter_single", 1, 1, True)] * 2, 0.0, 1.0, 3, cost) == 1.0
    assert throughput.backward_exposed([send("reduce_scatter_single", 1, 3, True)] * 2, 0.0, 1.0, 3, cost) == 2.0
    assert throughput.backward_exposed([send("all_reduce", 1, 0, False), send("reduce_scatter_single", 1, 0, True)],
                                       0.0, 1.0, 3, cost) == 0.0
    assert throughput.backward_exposed([send("all_reduce", 1, 3, False)], 0.0, 1.0, 3, cost) == 1.0


@pytest.mark.parametrize("arch, passes", [("vanilla", 1), ("gated_1", 1), ("untied_grow", 2), ("untied_grow", 4)])
def test_adamw_gradients_are_what_a_backward_hands_replicated_grads(arch, passes):
    """The AdamW gradients (numel, bytes per element) a backward gives, in the order their hooks fire (the ones
    muon.ReplicatedGrads all-reduces); the gated arm's boundary gate too."""
    import model
    cfg = model.config_for(arch, 3, width_per_depth=16, head_dim=16, seq_len=16, vocab_size=257)
    net, fired = model.GPT(cfg), []
    for group in ("embedding", "unembedding", "scalar"):
        for p in net.param_groups()[group]:
            p.register_post_accumulate_grad_hook(lambda p: fired.append((p.numel(), p.element_size())))
    idx = torch.randint(0, 257, (2, 17), generator=torch.Generator().manual_seed(0))
    net(idx[:, :-1], targets=idx[:, 1:], passes=passes).backward()
    assert fired == throughput.adamw_gradients(cfg, passes, "cpu")


# ---------------------------------------------------------------------------------------------------------------
# What gloo moves: tiny Untied-Grow runs through growth (tests/test_train.py's ledger runs) on 4 ranks, then on 2

def counting(name, collective, sent):
    """collective, recording (name, payload bytes, root, the group's ranks): the full buffer (reduce-scatter's input,
    all-gather's output, all-to-all's input, what a gather's rank sends)."""
    def counted(*args, **kwargs):
        tensor = args[1] if name in ("reduce_scatter_single", "all_to_all_single") else args[0]
        group = kwargs.get("group")
        ranks = tuple(dist.get_process_group_ranks(group)) if group else tuple(range(dist.get_world_size()))
        sent.append((name, tensor.numel() * tensor.element_size(), kwargs.get(FIELD.get(name), 0), ranks))
        return collective(*args, **kwargs)
    return counted


def group_of(ranks, world, per_node):
    """(the model's group name, its layout (nodes, GPUs per node)) of a collective on `ranks`."""
    if len(ranks) == world:
        return "world", (world // per_node, per_node)
    if len({r // per_node for r in ranks}) == 1:
        return "node", (1, len(ranks))
    return "cross", (len(ranks), 1)


def rank_links(sent, world, per_node):
    """{"nvlink", "network"}: one rank's share of the bytes its collectives put on the links, each collective's rings
    walked over its group (a group's root by its index there) and divided among the group's ranks."""
    links = Counter()
    for name, n, root, ranks in sent:
        _, layout = group_of(ranks, world, per_node)
        walk = walked(name, n, *layout, ranks.index(root) if name in FIELD else 0)
        links.update({k: v / len(ranks) for k, v in walk.items()})
    return links


def traffic_worker(rank, ports, out_dir):
    import bench
    torch.set_num_threads(1)
    sent = []
    for name in COLLECTIVES:
        setattr(dist, name, counting(name, getattr(dist, name), sent))
    for world, port in zip((4, 2), ports):
        if rank >= world:
            break
        os.environ["LOCAL_WORLD_SIZE"] = str(LEDGER_NODE_SIZE[world])
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        reports = {}
        for transport in [t for t in LEDGER_TRANSPORTS if (False, t) in LEDGER_RUNS[world]]:  # one order on all ranks
            args = train.parse_args(LEDGER_ARGV + ["--no-compile"] + LEDGER_TRANSPORTS[transport])
            plan = train.make_plan(args)
            mem = plan_lib.device_memory_plan(args, plan, world, torch.device("cpu"))
            run = train.new_run(args, plan, mem, rank, world, torch.device("cpu"),
                                bench.SyntheticLoader(plan.model_config.vocab_size, plan.seq_len, 8))
            training, steps = train.start_training(run), []
            for _ in range(plan.steps):
                sent.clear()
                loss, passes, _, _ = train.train_step(training)
                train.count_step(run, training.state, passes, seconds=1.0)
                steps.append((passes, list(sent)))
            reports[transport] = dict(steps=steps, zero2=mem.zero2, node_size=mem.node_size)
        torch.save(reports, os.path.join(out_dir, f"w{world}_rank{rank}.pt"))
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)  # gloo's teardown can abort an exiting process (tests/test_muon.py, transport_worker)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory, spawn_ranks):
    out_dir = tmp_path_factory.mktemp("traffic")
    spawn_ranks(traffic_worker, out_dir)
    return {world: [torch.load(out_dir / f"w{world}_rank{r}.pt", map_location="cpu") for r in range(world)]
            for world in (4, 2)}


@pytest.mark.parametrize("world", [4, 2])
def test_predicted_collectives_are_what_gloo_moved(traffic, world, monkeypatch):
    """Every step, through growth, with replicated, sharded (flat and, on 4 ranks as 2 nodes x 2, hierarchical) and
    fixed-order gradients: the collectives, payloads and groups the model predicts for each rank are exactly those
    train_step sent, and the bytes over each link are the rings walked over what was sent."""
    per_node = LEDGER_NODE_SIZE[world]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
    for transport, report in traffic[world][0].items():
        args = train.parse_args(LEDGER_ARGV + LEDGER_TRANSPORTS[transport])
        plan = train.make_plan(args)
        mem = plan_lib.device_memory_plan(args, plan, world, torch.device("cpu"))
        assert mem.zero2 == report["zero2"] == (transport in ("sharded", "hierarchical"))
        assert mem.node_size == report["node_size"] == (per_node if transport == "hierarchical" else None)
        for rank in range(world):
            for step, (passes, sent) in enumerate(traffic[world][rank][transport]["steps"]):
                stage = plan_lib.stage_index(step, plan)
                assert passes == plan.pass_stages[stage]
                moving, _, accumulation, synced = throughput.stage_transport(plan, mem, stage, passes,
                                                                             args.fixed_reduce_order)
                predicted = throughput.step_collectives(plan.model_config, passes, moving, world,
                                                        int(args.bucket_mb * 2 ** 20), accumulation, synced,
                                                        args.fixed_reduce_order, "cpu", mem.node_size,
                                                        rank % per_node)
                assert Counter((name, n, group_of(ranks, world, per_node)[0]) for name, n, _, ranks in sent) == \
                    predicted, (transport, rank, step)
                links = rank_links(sent, world, per_node)
                model = [sum(throughput.link_bytes(kind, n, world // per_node, per_node, group)[i] * count
                             for (kind, n, group), count in predicted.items()) for i in (0, 1)]
                assert (links["nvlink"], links["network"]) == tuple(model), (transport, rank, step)
                assert (links["network"] > 0) == (world == 4)


def test_hierarchical_gradients_cross_nodes_once_per_step(traffic):
    """4 gloo ranks as 2 nodes x 2, sharded gradients, 2 micro-batches per rank: every step the gradient reductions
    (reduce-scatter, reduce, all-reduce) of the hierarchical transport put at most 1/accumulation of the flat
    transport's bytes on the network, summed over the ranks; inside a micro-batch's backward nothing crosses."""
    accumulation = 8 // 4  # LEDGER_ARGV: 8 sequences per step, micro-batch 1
    reductions = ("reduce_scatter_single", "reduce", "all_reduce")
    network = {t: [sum(rank_links([s for s in sent if s[0] in reductions], 4, 2)["network"]
                       for rank in traffic[4] for sent in [rank[t]["steps"][step][1]])
                   for step in range(len(traffic[4][0][t]["steps"]))] for t in ("hierarchical", "sharded")}
    assert all(0 < h <= f / accumulation for h, f in zip(network["hierarchical"], network["sharded"])), network
    for rank in traffic[4]:
        for _, sent in rank["hierarchical"]["steps"]:
            muon = [group_of(ranks, 4, 2)[0] for name, _, _, ranks in sent if name == "reduce_scatter_single"]
            assert "world" not in muon and muon.count("cross") < muon.count("node") // accumulation + 1


# ---------------------------------------------------------------------------------------------------------------
# The paper's runs

def test_d26_on_two_nodes_reduces_every_micro_batch_over_the_network():
    """d26 on 2 x 8 H100 80GB: micro-batch 1 with sharded gradients, 16 synced micro-batches a step, each
    reduce-scattering the executed matrices' fp32 gradients (28.36 GB at K = 4) to their owners; 1/8 of a GPU's ring
    bytes cross the network; communication exposed, MFU below the matmul efficiency."""
    plan = train.make_plan(train.parse_args(["--arch", "untied_grow", "--depth", "26"]))
    mem = plan_lib.plan_micro_batches(plan, 16, plan_lib.H100_80GB_GIB)
    speed = throughput.predict(plan, mem, 2, 8)
    final = speed["stages"][-1]
    assert (final["passes"], final["micro_batch"], final["synced_micro_batches"]) == (4, 1, 16)
    sends = throughput.backward_sends(plan.model_config, 4, 16, plan_lib.BUCKET_BYTES)
    muon_bytes = sum(s.nbytes for s in sends if s.muon)
    cfg = plan.model_config
    assert muon_bytes == 4 * 53 * cfg.width * (4 * cfg.width + 3 * cfg.mlp_hidden)  # every executed matrix, fp32
    assert round(muon_bytes / 1e9, 2) == 28.36
    assert final["gb_per_step"]["network"] == pytest.approx(final["gb_per_step"]["nvlink"] / 7, rel=1e-3)
    assert 0 < final["seconds"]["exposed_communication"] < final["seconds"]["communication"]
    assert speed["mfu"] < 0.45 and speed["gpu_hours"] > 0
    one_node = throughput.predict(plan, plan_lib.plan_micro_batches(plan, 16, 1000), 1, 16)
    assert one_node["stages"][-1]["gb_per_step"]["network"] == 0


def test_d26_hierarchical_keeps_every_micro_batch_inside_its_node():
    """d26 on 2 x 8 with the hierarchical transport (the planner's choice on 2 nodes of 8): each micro-batch
    reduce-scatters the same 28.36 GB inside its node only, the node-sums cross the network once per step (a
    reduce-scatter of 1/8 of the bucket, or a single owner's reduce); fewer network bytes and a higher MFU than flat."""
    plan = train.make_plan(train.parse_args(["--arch", "untied_grow", "--depth", "26"]))
    hierarchical = plan_lib.plan_micro_batches(plan, 16, plan_lib.H100_80GB_GIB, node_size=8)
    flat = plan_lib.plan_micro_batches(plan, 16, plan_lib.H100_80GB_GIB)
    assert (hierarchical.node_size, flat.node_size) == (8, None) and hierarchical.zero2
    assert [s.micro_batch for s in hierarchical.stages] == [1, 1]
    every, last = throughput.synced_sends(plan.model_config, 4, 16, plan_lib.BUCKET_BYTES, node_size=8)
    assert {s.group for s in every} == {"node"} and round(sum(s.nbytes for s in every) / 1e9, 2) == 28.36
    assert {s.group for s in last if not s.muon} == {"world"}  # the AdamW all-reduces, once per step
    for local in range(8):
        cross = [s for s in throughput.step_sends(plan.model_config, 4, [], 16, plan_lib.BUCKET_BYTES, 16,
                                                  node_size=8, local_rank=local) if s.group == "cross"]
        assert cross and sum(s.nbytes for s in cross) < 28.36e9 / 8 * 1.5
    speeds = [throughput.predict(plan, mem, 2, 8) for mem in (hierarchical, flat)]
    assert [s["transport"] for s in speeds] == ["hierarchical", "flat"]
    (h, f) = (s["stages"][-1] for s in speeds)
    assert h["gb_per_step"]["network"] < f["gb_per_step"]["network"] / 8
    assert h["seconds"]["exposed_communication"] < f["seconds"]["exposed_communication"]
    assert speeds[1]["mfu"] < speeds[0]["mfu"] < 0.45


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
    assert [(s["passes"], s["steps"]) for s in speed["stages"]] == [(2, out["crossover_steps"][0]),
                                                                   (4, steps - out["crossover_steps"][0])]
    assert speed["validations"] == 2 + 2 + (steps - 1) // 10
    train_seconds = sum(s["steps"] * s["step_seconds"] for s in speed["stages"])
    assert speed["train_seconds"] == pytest.approx(train_seconds, rel=1e-3)
    assert speed["wall_seconds"] == pytest.approx(train_seconds + speed["validations"] * speed["validation_seconds"],
                                                  rel=1e-3)
    assert throughput.summary_line("untied_grow_d1", speed).startswith("cpu time untied_grow_d1: step ")
