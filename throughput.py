"""The predicted time of a training step: the bytes its collectives move over NVLink and over the network, the FLOPs
it computes, what of the communication backward cannot hide, and the MFU that leaves (docs/throughput.md). A
prediction from stated bandwidths (arms.CLUSTERS), not a measurement: no GPU has been lent to this project.

    python train.py --arch untied_grow --depth 26 --world-size 16 --dry-run     # the plan's "throughput"
    NNODES=2 bash ladder.sh untied_grow --preset d26 --dry-run                   # per run; GPU-hours from the model
    NIC_GBITS=200 MATMUL_EFFICIENCY=0.45 bash ladder.sh all --dry-run           # other links (Cluster's knobs)
    python docs/throughput_table.py     # the release's MFU per run (timing.json) beside the prediction
    python -m pytest -q tests/test_throughput.py

Traffic: FSDP2's collectives (train.shard_model) and Muon's exchanges (muon.py) in one step. Per micro-batch, inside each
node: the root's parameters (embedding, lm_head) all-gathered once, every executed block's all-gathered in its
forward and again in its backward (a looped core at every pass), its gradient reduce-scattered after each of its
backwards (fp32), the root's at backward's end; bf16 parameters on CUDA (MixedPrecisionPolicy), fp32 on CPU. Per
step: with several nodes (HSDP) the gradient shards all-reduced across nodes once (on the last micro-batch); Muon's
two all_to_alls per round (muon.rounds) inside the node; the step's loss (all-reduce). Not counted: the boundary
gates' all-reduce (a few bytes), the gradient norm of a logged step and validation.

Links: NCCL's ring algorithms, one ring per channel over all W = NODES x P ranks, node after node, with as many
channels as GPUs per node, each entering a node at another GPU and leaving it through that GPU's card. A ring
collective of n payload bytes sends (W-1)/W n per GPU (all-reduce 2 (W-1)/W n; a broadcast or reduce chain leaves one
link of each ring idle, which makes the same (W-1)/W n per GPU on average); of each GPU's channels one leaves the node,
so 1/P of that crosses the network (with NODES > 1) and the rest is NVLink. All-to-all and gather send point to point:
(W-1)/W n per GPU, (W-P)/W n of it to other nodes. Bytes are per GPU: its NVLink sends, and the node's network bytes
/ P. A collective takes the longer of its NVLink bytes at the NVLink rate and its node's network bytes at the node's
network rate (nics_per_node x nic_gbits), both at bus_efficiency; a gather counts its root's inflow. No latency term.
NCCL may pick tree or NVLS algorithms, which move fewer bytes over some links: the ring is the conservative case.

Time: FLOPs (model.flops_per_token, causal attention at half) / (peak x compute_efficiency: matmul_efficiency x
width / (width + elementwise_width), calibrated on the release's timing.json). FSDP2 prefetches the next block's
all-gather and reduce-scatters while backward goes on, so a micro-batch's collectives hide behind its compute except
for what exceeds it, its first all-gathers (root and first block) and its last reduce-scatter (the root's); the
cross-node all-reduce rides on the last micro-batch's backward the same way. Muon's step is exposed: each round's two
all_to_alls and the busiest owner's Polar-Express (5 x (4 l s^2 + 2 s^3) FLOPs per l x s matrix, s the short side);
the rest of the optimizer (elementwise) is not counted.
"""
import argparse
import json
import math
import os
import time
from collections import Counter, namedtuple
from dataclasses import asdict, replace
from fractions import Fraction

import torch

import muon
import plan as plan_lib
from arms import CLUSTERS, GPU_PEAK_FLOPS, Cluster, knob_fields
from common import UsageError, clock, number, whole_number_in
from model import GPT, executed_blocks, flops_per_token, params_per_block, stored_blocks

GB = 1e9
POLAR_EXPRESS_ITERATIONS = 5
RELEASE_TIMING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference", "release", "appendix_ladders",
                              "timing.json")
RELEASE_GPUS = 8  # each release run trained on one 8 x H100 node (issue 29)

# A collective of `nbytes` payload bytes per rank (its input; an all-gather's output) on the ranks of `group`: "world",
# "node" (the P ranks of a node: FSDP2's shard dimension) or "cross" (one rank per node: HSDP's replicate dimension).
Send = namedtuple("Send", "kind nbytes group")


def cluster_from_env(gpu="H100"):
    """arms.CLUSTERS[gpu] with each knob replaced by its environment variable (NIC_GBITS=200, ...) where set."""
    changes = {}
    for f in knob_fields(Cluster, "cluster"):
        name, text, bounds = f.name.upper(), os.environ.get(f.name.upper(), ""), f.metadata["range"]
        if text == "":
            continue
        if f.type is int:
            value, expected = whole_number_in(text, *bounds), f"a whole number in [{bounds[0]}, {bounds[1]}]"
        else:
            expected = f"a finite number in {bounds}"
            try:
                value = number(bounds)(text)
            except argparse.ArgumentTypeError:
                value = None
        if value is None:
            raise UsageError(f"environment variable {name} ({f.metadata['help']}) must be {expected}, got {text!r}")
        changes[f.name] = value
    return replace(CLUSTERS[gpu], **changes)


def layout(world, ranks_per_node):
    """(nodes, GPUs per node) of a dry run of `world` GPUs with NPROC_PER_NODE = ranks_per_node."""
    per_node = min(world, ranks_per_node)
    if world % per_node:
        raise UsageError(f"{world} GPUs are not a whole number of nodes of NPROC_PER_NODE={ranks_per_node} GPUs; "
                         "set NPROC_PER_NODE (the throughput model needs the nodes)")
    return world // per_node, per_node


# ----------------------------------------------------------------------------------------------------------------------
# Traffic: the collectives of one step, and the bytes each puts on the links

def micro_batch_sends(cfg, passes, per_node, device="cuda"):
    """FSDP2's collectives of one micro-batch inside a node (module docstring) -> [Send]. all_gather_into_tensor's
    payload is its output (the whole block), reduce_scatter_tensor's its input (the whole fp32 gradient)."""
    e, table, block = plan_lib.compute_bytes(device), 2 * cfg.padded_vocab * cfg.width, params_per_block(cfg)
    runs = executed_blocks(cfg, passes)
    return ([Send("all_gather_single", e * table, "node")] + [Send("all_gather_single", e * block, "node")] * 2 * runs
            + [Send("reduce_scatter_single", 4 * block, "node")] * runs
            + [Send("reduce_scatter_single", 4 * table, "node")])


def polar_express_flops(shape):
    """FLOPs of muon.polar_express on one matrix: per iteration the Gram matrix, its polynomial and the product."""
    long, short = max(shape), min(shape)
    return POLAR_EXPRESS_ITERATIONS * (4 * long * short ** 2 + 2 * short ** 3)


def muon_rounds(cfg, moving, per_node):
    """Muon's exchange rounds (muon.rounds) over the moving matrices -> [(payload bytes of each all_to_all, the busiest
    owner's Polar-Express FLOPs)]: a rank's input is its rows of the round's matrices, about one whole matrix."""
    shapes = plan_lib.block_matrix_shapes(cfg)
    owners = muon.assign_owners(shapes, per_node)
    return [(4 * math.prod(shapes[next(i for i in members if i is not None)]),
             max(polar_express_flops(shapes[i]) for i in members if i is not None))
            for members in muon.rounds(moving, shapes, owners, per_node)]


def step_sends(cfg, passes, moving, nodes, per_node, device="cuda"):
    """The collectives of a step besides the micro-batches': HSDP's all-reduce across nodes of the trained gradient
    shards (nodes > 1), Muon's all_to_alls (two per round), the loss's all-reduce -> [Send]."""
    shards = []
    if nodes > 1:
        table = plan_lib.shard_numel((cfg.padded_vocab, cfg.width), per_node)
        grads = stored_blocks(cfg, passes) * plan_lib.block_shard_numel(cfg, per_node) + 2 * table
        shards = [Send("all_reduce", 4 * grads, "cross")]
    exchanges = [Send("all_to_all_single", n, "node") for n, _ in muon_rounds(cfg, moving, per_node)] * 2 \
        if per_node > 1 else []
    return shards + exchanges + [Send("all_reduce", 4, "world")]


def link_bytes(kind, n, nodes, per_node, group="world"):
    """(NVLink, network) bytes per GPU of one collective of n payload bytes on nodes x per_node GPUs (the module
    docstring's rings), on all of them or on a group: a node's GPUs, or one GPU of each node. Exact Fractions."""
    nodes, per_node = {"world": (nodes, per_node), "node": (1, per_node), "cross": (nodes, 1)}[group]
    world = nodes * per_node
    if world == 1:
        return Fraction(0), Fraction(0)
    sent = Fraction((2 if kind == "all_reduce" else 1) * (world - 1) * n, world)
    if kind in ("all_to_all_single", "gather"):
        network = Fraction((world - per_node) * n, world)
    else:
        network = sent / per_node if nodes > 1 else Fraction(0)
    return sent - network, network


def seconds(kind, n, nodes, per_node, cluster, group="world"):
    """One collective's time: the longer of its NVLink and its node's network transfer at bus_efficiency (a node's
    P GPUs send alike: their cross-node groups at once)."""
    nvlink, network = link_bytes(kind, n, nodes, per_node, group)
    world = nodes * per_node
    port, node = (nvlink * world, network * world) if kind == "gather" else (nvlink, network * per_node)
    return max(float(port) / (cluster.nvlink_gbs * GB * cluster.bus_efficiency),
               float(node) / (cluster.nics_per_node * cluster.nic_gbits / 8 * GB * cluster.bus_efficiency))


# ----------------------------------------------------------------------------------------------------------------------
# Time: one step of a pass stage, and a whole run

def compute_efficiency(cfg, cluster):
    """The share of the peak a step's FLOPs run at for this shape: matmul_efficiency x width / (width +
    elementwise_width). A step's elementwise work (norms, rotary, activations, the fp32 residual stream, the loss's
    softmax) moves bytes ~ width per token, its matmuls FLOPs ~ width^2: narrow models spend more of a step on the
    former (calibrated on the release's timing.json: arms.CLUSTERS, docs/throughput_table.py)."""
    return cluster.matmul_efficiency * cfg.width / (cfg.width + cluster.elementwise_width)


def stage_step(cfg, passes, moving, micro_batch, accumulation, nodes, per_node, cluster, device="cuda"):
    """One step at `passes`: bytes per GPU per link, seconds (compute, optimizer, communication, exposed
    communication, step) and MFU. Numbered as plan.make_plan."""
    world, efficiency = nodes * per_node, compute_efficiency(cfg, cluster)
    rate = GPU_PEAK_FLOPS[cluster.gpu] * efficiency
    cost = lambda s: seconds(s.kind, s.nbytes, nodes, per_node, cluster, s.group)  # noqa: E731
    link = lambda s: link_bytes(s.kind, s.nbytes, nodes, per_node, s.group)  # noqa: E731
    # 1. Compute per micro-batch
    micro = flops_per_token(cfg, passes) * micro_batch * cfg.seq_len / rate
    # 2. The collectives: every micro-batch's (FSDP2), the step's (HSDP's all-reduce, Muon's exchanges, the loss)
    per_micro = micro_batch_sends(cfg, passes, per_node, device) if world > 1 else []
    step = step_sends(cfg, passes, moving, nodes, per_node, device) if world > 1 else []
    sends = per_micro * accumulation + step
    # 3. Bytes per GPU per link
    per_link = [sum(link(s)[i] for s in sends) for i in (0, 1)]
    # 4. Time: what a micro-batch's collectives do not hide (its first all-gathers, its last reduce-scatter, the rest
    # beyond its compute; the cross-node all-reduce on the last one), Muon's exchanges and Polar-Express after it.
    rounds = muon_rounds(cfg, moving, per_node) if world > 1 else \
        [(0, polar_express_flops(plan_lib.block_matrix_shapes(cfg)[i])) for i in moving]
    optimizer = sum(flops for _, flops in rounds) / rate
    exposed = 0.0
    if per_micro:
        fixed = sum(map(cost, per_micro[:2])) + cost(per_micro[-1])
        hidden = sum(map(cost, per_micro[2:-1]))
        cross = sum(cost(s) for s in step if s.group == "cross")
        exposed = fixed * accumulation + max(0.0, hidden - micro) * (accumulation - 1) + \
            max(0.0, hidden + cross - micro) + sum(cost(s) for s in step if s.group != "cross")
    total = accumulation * micro + optimizer + exposed
    return dict(passes=passes, micro_batch=micro_batch, accumulation=accumulation,
                gb_per_step=dict(nvlink=round(float(per_link[0]) / GB, 3), network=round(float(per_link[1]) / GB, 3)),
                seconds={k: float(f"{v:.5g}") for k, v in dict(
                    compute=accumulation * micro, optimizer=optimizer, communication=sum(map(cost, sends)),
                    exposed_communication=exposed, step=total).items()},
                compute_efficiency=round(efficiency, 4), mfu=round(accumulation * micro * efficiency / total, 4))


def stage_steps(plan):
    """Counter of (stage index, passes) over the plan's optimizer steps (random recurrence: per drawn step)."""
    if plan.random_passes:
        return Counter((plan_lib.stage_index(s, plan), plan_lib.passes_at(s, plan)) for s in range(plan.steps))
    bounds = [0, *plan.crossover_steps, plan.steps]
    return Counter({(i, k): b - a for i, (k, a, b) in enumerate(zip(plan.pass_stages, bounds, bounds[1:]))})


def stage_transport(plan, mem, stage, passes):
    """(moving matrices, micro-batch, accumulation) of a step of pass stage `stage` at `passes` with mem's
    micro-batches for mem.world_size ranks. Moving: the matrices trained at these passes or earlier (they have
    state)."""
    cfg = plan.model_config
    earlier = [*plan.pass_stages[:stage + 1], passes]
    if stage == len(plan.pass_stages) - 1:
        earlier += plan.random_passes
    moving = sorted({m for k in earlier for m in plan_lib.executed_matrices(cfg, k)})
    micro_batch = mem.stages[stage].micro_batch
    return moving, micro_batch, plan.tokens_per_step // plan.seq_len // mem.world_size // micro_batch


def predict(plan, mem, nodes, per_node, cluster=None, device="cuda"):
    """The "throughput" of a dry run: per (stage, passes) one step of stage_step, and the run's seconds, GPU-hours
    and MFU. mem: the MemoryPlan (its micro-batches) for nodes x per_node GPUs; cluster: default
    arms.CLUSTERS["H100"] with the environment's changes."""
    cluster = cluster or cluster_from_env()
    stages, total = [], 0.0
    for (i, passes), steps in sorted(stage_steps(plan).items()):
        stage = stage_step(plan.model_config, passes, *stage_transport(plan, mem, i, passes), nodes, per_node,
                           cluster, device)
        stages.append(dict(stage, steps=steps))
        total += steps * stage["seconds"]["step"]
    return dict(predicted="predicted from stated bandwidths and efficiencies; not measured on a GPU",
                nodes=nodes, gpus_per_node=per_node,
                layout="HSDP" if nodes > 1 else "FSDP2" if per_node > 1 else "one process",
                cluster=asdict(cluster), stages=stages,
                seconds=float(f"{total:.5g}"), gpu_hours=float(f"{total * nodes * per_node / 3600:.4g}"),
                mfu=round(plan.total_flops / (nodes * per_node * GPU_PEAK_FLOPS[cluster.gpu] * total), 4))


def estimate(plan, mem, nodes, per_node, cluster=None, eval_every=0):
    """A dry run's "throughput": the GPU prediction (predict), or for the cpu preset the measured cpu_probe."""
    if plan.preset == "cpu":
        return cpu_probe(plan, eval_every, per_node)
    return predict(plan, mem, nodes, per_node, cluster)


def cpu_probe(plan, eval_every, per_node, steps=2):
    """The "throughput" of a cpu-preset dry run, measured on this machine as loaded now, not predicted: per pass stage
    `steps` optimizer steps on random tokens (forward and backward over the step's tokens, Muon on the block matrices,
    AdamW on the rest; the first left out as warm-up) and one forward of a step's tokens, a validation being
    val_tokens of it. The run's wall time: its steps at their stages' times plus its validations (the start, every
    eval_every steps, before and after each growth, the end) at the final passes; checkpoints not counted. Threads:
    the run's, by torchrun's rule: OMP_NUM_THREADS, else 1 where a node runs `per_node` > 1 ranks, else torch's
    default (every core: ladder.sh's one cpu rank, or python train.py)."""
    threads = torch.get_num_threads()
    if per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    try:
        return timed_probe(plan, eval_every, steps)
    finally:
        torch.set_num_threads(threads)


def timed_probe(plan, eval_every, steps):
    torch.manual_seed(plan.seed)
    model = GPT(plan.model_config)
    groups = model.param_groups()
    optimizers = [muon.Muon(groups["matrix"], lr=plan.matrix_lr),
                  torch.optim.AdamW([p for name, ps in groups.items() if name != "matrix" for p in ps], lr=1e-4)]
    tokens = torch.randint(0, plan.model_config.vocab_size, (plan.tokens_per_step // plan.seq_len, plan.seq_len + 1))
    stages, train = [], 0.0
    for (_, passes), count in sorted(stage_steps(plan).items()):
        model.set_passes(passes)
        for _ in range(steps):
            t0 = time.perf_counter()
            model(tokens[:, :-1], targets=tokens[:, 1:]).backward()
            for opt in optimizers:
                opt.step()
            model.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - t0
        stages.append(dict(passes=passes, steps=count, step_seconds=float(f"{seconds:.4g}")))
        train += count * seconds
    model.set_passes(plan.passes_final)
    with torch.no_grad():
        t0 = time.perf_counter()
        model(tokens[:, :-1], targets=tokens[:, 1:])
        validation = (time.perf_counter() - t0) * plan.val_tokens / plan.tokens_per_step
    validations = 2 + 2 * len(plan.crossover_steps) + ((plan.steps - 1) // eval_every if eval_every else 0)
    return dict(measured=f"on this CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads), {steps - 1} timed "
                         f"step(s) per pass stage after a warm-up; checkpoints not counted", stages=stages,
                validation_seconds=float(f"{validation:.4g}"), validations=validations,
                train_seconds=float(f"{train:.4g}"), wall_seconds=float(f"{train + validations * validation:.4g}"))


def figure(x):
    """x to about 3 significant figures, without an exponent: 964, 4.17, 0.0737."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def summary_line(name, prediction):
    """ladder.sh --dry-run's line for one run (stages joined by ->)."""
    if "wall_seconds" in prediction:  # cpu_probe
        return (f"cpu time {name}: step {' -> '.join(figure(s['step_seconds']) for s in prediction['stages'])} s, "
                f"validation {figure(prediction['validation_seconds'])} s x {prediction['validations']} | train "
                f"{clock(prediction['train_seconds'])}, wall {clock(prediction['wall_seconds'])} (measured probe)")

    def each(get):
        return " -> ".join(get(s) if isinstance(get(s), str) else figure(get(s)) for s in prediction["stages"])
    time = {k: each(lambda s, k=k: s["seconds"][k]) for k in ("communication", "exposed_communication", "optimizer",
                                                               "step")}
    return (f"throughput {name}: micro-batch {each(lambda s: str(s['micro_batch']))} | GB per GPU per step: NVLink "
            f"{each(lambda s: s['gb_per_step']['nvlink'])}, network {each(lambda s: s['gb_per_step']['network'])} | "
            f"communication {time['communication']} s, exposed {time['exposed_communication']} s, optimizer "
            f"{time['optimizer']} s, step {time['step']} s | predicted MFU {prediction['mfu']:.1%} | "
            f"{figure(prediction['gpu_hours'])} GPU-hours")


# ----------------------------------------------------------------------------------------------------------------------
# The anchor: the release's training hours per run (Fig. 15b) and this project's FLOP count give its MFU

def release_timing(path=RELEASE_TIMING):
    """[(release series, depth, training hours)] of the release's timing.json (58 runs)."""
    with open(path) as f:
        timing = json.load(f)
    return [(series, point["depth"], point["compute"]) for series, points in timing.items() for point in points]


def measured_mfu(total_flops, hours, gpus=RELEASE_GPUS, peak=GPU_PEAK_FLOPS["H100"]):
    """MFU of a run of total_flops that trained `hours` on `gpus` GPUs of `peak` FLOP/s."""
    if not (math.isfinite(hours) and hours > 0):
        raise UsageError(f"a run's training hours must be a positive number, got {hours!r}")
    return total_flops / (gpus * peak * hours * 3600)
