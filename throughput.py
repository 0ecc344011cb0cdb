"""The predicted time of a training step: the bytes its collectives move over NVLink and over the network, the FLOPs
it computes, what of the communication backward cannot hide, and the MFU that leaves (docs/throughput.md). A
prediction from stated bandwidths (arms.CLUSTERS), not a measurement: no GPU has been lent to this project.

    python train.py --arch untied_grow --depth 26 --world-size 16 --dry-run     # the plan's "throughput"
    NNODES=2 bash ladder.sh untied_grow --preset d26 --dry-run                   # per run; GPU-hours from the model
    NIC_GBITS=200 MATMUL_EFFICIENCY=0.45 bash ladder.sh all --dry-run           # other links (Cluster's knobs)
    python docs/throughput_table.py     # the release's MFU per run (timing.json) beside the prediction
    python -m pytest -q tests/test_throughput.py

Traffic: every collective muon.py and train.py send in one step, derived from the transport's own functions
(plan.gradient_buckets on muon.plan_buckets / assign_owners, the MemoryPlan's replicated / sharded / fixed-order
choice, its micro-batches): per synced micro-batch (the last one with replicated gradients, every one with sharded
gradients or the fixed order) Muon's buckets (reduce-scatter, or reduce to a single owner; fixed order: all-to-all,
gather) and the AdamW gradients (all-reduce; fixed order: all-to-all of W padded chunks); per step Muon's new weights
(all-gather, broadcast), in the fixed order the AdamW sums (all-gather), and the step's loss (all-reduce; fixed
order: all-gather of the micro-batch losses). Hierarchical (sharded gradients on several nodes, the MemoryPlan's
node_size): Muon's buckets inside each node every micro-batch, the AdamW all-reduces on the last one only, and at the
step's end the node-sums across nodes (reduce-scatter or reduce on one rank per node). Not counted: the gradient norm
of a logged step (one 4-byte all-reduce) and validation. tests/test_throughput.py checks these against what gloo's
collectives move.

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
width / (width + elementwise_width), calibrated on the release's timing.json); forward 1/3, backward 2/3
of each micro-batch, backward spread over the loss and the executed blocks in proportion to their FLOPs. Overlap: one
communication stream, collectives in the order they are sent; a bucket goes when its last gradient is ready and
backward waits, before copying the next bucket, for the one in flight (muon.Muon); what is still in flight when a
micro-batch's backward ends is exposed (finish_micro_batch waits for it). In the step each owner's Polar-Express
(5 x (4 l s^2 + 2 s^3) FLOPs per l x s matrix, s the short side; the busiest owner per bucket) runs while the previous
bucket's new weights travel (Muon._update_and_gather); the rest of the optimizer (elementwise) is not counted.
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
from model import GPT, embedding_dtype, executed_blocks, flops_per_token, gates_stored, stored_blocks

GB = 1e9
MUON_REDUCE = {(False, True): "reduce_scatter_single", (False, False): "reduce", (True, True): "all_to_all_single",
               (True, False): "gather"}  # (fixed order, owner-sharded bucket) -> muon.Muon._launch_reduce's collective
POLAR_EXPRESS_ITERATIONS = 5
RELEASE_TIMING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference", "release", "appendix_ladders",
                              "timing.json")
RELEASE_GPUS = 8  # each release run trained on one 8 x H100 node (issue 29)

# A collective of `nbytes` payload bytes. In backward: sent once `after_blocks` executed blocks have finished their
# backward; muon: one of Muon's buckets (the next waits for it). In the step: sent after `flops` of Polar-Express.
# group: the ranks it runs on: "world", "node" (the P ranks of a node) or "cross" (one rank per node: the hierarchical
# transport, muon.node_groups).
BackwardSend = namedtuple("BackwardSend", "kind nbytes after_blocks muon group", defaults=("world",))
StepSend = namedtuple("StepSend", "kind nbytes flops muon group", defaults=("world",))


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

def adamw_gradients(cfg, passes, device):
    """(numel, bytes per element) of each AdamW gradient a backward at `passes` gives, in the order it finishes them:
    lm_head's (in the loss), the boundary gates it injects through, the embedding's (model.param_groups)."""
    table = cfg.padded_vocab * cfg.width
    gates = min(gates_stored(cfg), passes - 1 + cfg.coda_inject)
    return [(table, 4), *[(1, 4)] * gates, (table, torch.empty((), dtype=embedding_dtype(device)).element_size())]


def padded(numel, world):
    """ReplicatedGrads' fixed order sends W equal chunks: numel rounded up to a multiple of W."""
    return -(-numel // world) * world


def backward_sends(cfg, passes, world, bucket_bytes, fixed_order=False, device="cuda", node_size=None):
    """The collectives of one synced micro-batch's backward at `passes`, in the order they are sent: lm_head's
    all-reduce, Muon's buckets as backward completes them (plan.sharded_backward_bytes's walk; node_size: inside each
    node of the hierarchical transport), then the gates' and the embedding's all-reduces. -> [BackwardSend]"""
    if world == 1:
        return []
    kind = "all_to_all_single" if fixed_order else "all_reduce"
    adamw = [(padded(numel, world) if fixed_order else numel) * size
             for numel, size in adamw_gradients(cfg, passes, device)]
    group = "node" if node_size else "world"
    order = plan_lib.backward_block_order(cfg, passes)
    per_block = len(plan_lib.block_matrix_shapes(cfg)) // stored_blocks(cfg)
    last_run = {b: k for k, b in enumerate(order)}  # a tied core's gradients are complete after its first pass
    buckets = plan_lib.gradient_buckets(cfg, world, bucket_bytes, plan_lib.executed_matrices(cfg, passes))
    sends, ready, launched = [BackwardSend(kind, adamw[0], 0, False)], set(), 0
    for k, block in enumerate(order):
        if last_run[block] != k:
            continue
        ready.update(range(per_block * block, per_block * (block + 1)))
        while launched < len(buckets) and ready.issuperset(buckets[launched][0].members):
            bucket, n = buckets[launched]
            sends.append(BackwardSend(MUON_REDUCE[fixed_order, bucket.scatter], n, k + 1, True, group))
            launched += 1
    return sends + [BackwardSend(kind, n, len(order), False) for n in adamw[1:]]


def polar_express_flops(shape):
    """FLOPs of muon.polar_express on one matrix: per iteration the Gram matrix, its polynomial and the product."""
    long, short = max(shape), min(shape)
    return POLAR_EXPRESS_ITERATIONS * (4 * long * short ** 2 + 2 * short ** 3)


def step_sends(cfg, passes, moving, world, bucket_bytes, accumulation, fixed_order=False, device="cuda",
               node_size=None, local_rank=0):
    """The collectives local rank `local_rank` sends after the last backward, in order: in the fixed order the AdamW
    sums' all-gathers (ReplicatedGrads.wait); hierarchical (node_size), the node-sums across nodes, each waited for
    (Muon._reduce_across_nodes: a reduce-scatter of the bucket's 1/P, or a reduce by the owner's local rank); Muon's
    new weights bucket by bucket over the matrices that move (muon.Muon.step: those with a gradient or with state),
    the step's loss (train.step_loss). -> [StepSend]"""
    if world == 1:
        return []
    shapes = plan_lib.block_matrix_shapes(cfg)
    sends = [StepSend("all_gather_single", padded(numel, world) * size, 0, False)
             for numel, size in adamw_gradients(cfg, passes, device)] if fixed_order else []
    for bucket, n in plan_lib.gradient_buckets(cfg, world, bucket_bytes, plan_lib.executed_matrices(cfg, passes)) \
            if node_size else []:
        if bucket.scatter or bucket.owner % node_size == local_rank:
            sends.append(StepSend(MUON_REDUCE[False, bucket.scatter], n // node_size if bucket.scatter else n, 0,
                                  False, "cross"))
    for bucket, n in plan_lib.gradient_buckets(cfg, world, bucket_bytes, moving):
        flops = max(sum(polar_express_flops(shapes[i]) for i in chunk) for chunk in bucket.chunks)
        sends.append(StepSend("all_gather_single" if bucket.scatter else "broadcast", n, flops, True))
    loss = ("all_gather_single", 4 * accumulation * world) if fixed_order else ("all_reduce", 4)
    return sends + [StepSend(*loss, 0, False)]


def synced_sends(cfg, passes, world, bucket_bytes, fixed_order=False, device="cuda", node_size=None):
    """(a synced micro-batch's backward sends, the last one's): hierarchical, only the last sends the AdamW gradients."""
    last = backward_sends(cfg, passes, world, bucket_bytes, fixed_order, device, node_size)
    return [s for s in last if s.muon] if node_size else last, last


def step_collectives(cfg, passes, moving, world, bucket_bytes, accumulation, synced, fixed_order=False,
                     device="cuda", node_size=None, local_rank=0):
    """Counter of (collective, payload bytes, group) local rank `local_rank` sends in one step with `synced`
    micro-batches communicating; node_size: the hierarchical transport's ranks per node."""
    every, last = synced_sends(cfg, passes, world, bucket_bytes, fixed_order, device, node_size)
    sends = every * (synced - 1) + last
    sends += step_sends(cfg, passes, moving, world, bucket_bytes, accumulation, fixed_order, device, node_size,
                        local_rank)
    return Counter((s.kind, s.nbytes, s.group) for s in sends)


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

def backward_exposed(sends, head, block, blocks, cost):
    """Seconds a synced micro-batch's backward (head: the loss's part, then `blocks` of `block` seconds) lasts beyond
    its compute: backward waiting for a Muon bucket before copying the next, and the tail still in flight."""
    delay, free, muon_end = 0.0, 0.0, 0.0
    for s in sends:
        now = head + s.after_blocks * block + delay
        if s.muon and muon_end > now:
            delay, now = delay + muon_end - now, muon_end
        free = max(now, free) + cost(s)
        muon_end = free if s.muon else muon_end
    end = head + blocks * block
    return max(end + delay, free) - end


def step_end_seconds(sends, rate, cost):
    """(optimizer, exposed communication) seconds after the last backward: each bucket's Polar-Express, then its
    weights sent once the previous bucket's have landed; the others (AdamW sums, the loss) waited for."""
    t, free, muon_end, optimizer = 0.0, 0.0, 0.0, 0.0
    for s in sends:
        t += s.flops / rate
        optimizer += s.flops / rate
        if s.muon:
            t = max(t, muon_end)
        free = max(t, free) + cost(s)
        if s.muon:
            muon_end = free
        else:
            t = free
    return optimizer, max(t, muon_end) - optimizer


def compute_efficiency(cfg, cluster):
    """The share of the peak a step's FLOPs run at for this shape: matmul_efficiency x width / (width +
    elementwise_width). A step's elementwise work (norms, rotary, activations, the fp32 residual stream, the loss's
    softmax) moves bytes ~ width per token, its matmuls FLOPs ~ width^2: narrow models spend more of a step on the
    former (calibrated on the release's timing.json: arms.CLUSTERS, docs/throughput_table.py)."""
    return cluster.matmul_efficiency * cfg.width / (cfg.width + cluster.elementwise_width)


def stage_step(cfg, passes, moving, micro_batch, accumulation, synced, nodes, per_node, bucket_bytes, cluster,
               fixed_order=False, device="cuda", node_size=None):
    """One step at `passes`: bytes per GPU per link, seconds (compute, optimizer, communication, exposed
    communication, step) and MFU; node_size: the hierarchical transport's ranks per node. Numbered as
    plan.make_plan."""
    world, efficiency = nodes * per_node, compute_efficiency(cfg, cluster)
    rate = GPU_PEAK_FLOPS[cluster.gpu] * efficiency
    cost = lambda s: seconds(s.kind, s.nbytes, nodes, per_node, cluster, s.group)  # noqa: E731
    link = lambda s: link_bytes(s.kind, s.nbytes, nodes, per_node, s.group)  # noqa: E731
    # 1. Compute per micro-batch; backward is 2/3 of it: the loss (lm_head) first, then the executed blocks.
    tokens = micro_batch * cfg.seq_len
    micro = flops_per_token(cfg, passes) * tokens / rate
    head = 2 / 3 * 6 * cfg.padded_vocab * cfg.width * tokens / rate
    blocks = executed_blocks(cfg, passes)
    block = (2 / 3 * micro - head) / blocks
    # 2. The collectives of a synced micro-batch (hierarchical: the last one's apart) and of each local rank's step
    # end (hierarchical: a single owner's node-sums cross the network from its local rank only).
    every, last = synced_sends(cfg, passes, world, bucket_bytes, fixed_order, device, node_size)
    backward = every * (synced - 1) + last
    ends = [step_sends(cfg, passes, moving, world, bucket_bytes, accumulation, fixed_order, device, node_size, local)
            for local in range(node_size or 1)]
    # 3. Bytes per GPU per link: the mean over the local ranks.
    per_link = [sum(link(s)[i] for s in backward) + sum(link(s)[i] for end in ends for s in end) / len(ends)
                for i in (0, 1)]
    # 4. Time: compute, the synced micro-batches' exposed communication, the optimizer and the slowest step end.
    if world == 1:
        optimizer = sum(polar_express_flops(plan_lib.block_matrix_shapes(cfg)[i]) for i in moving) / rate
        end, end_exposed = ends[0], 0.0
    else:
        end = max(ends, key=lambda e: sum(step_end_seconds(e, rate, cost)))
        optimizer, end_exposed = step_end_seconds(end, rate, cost)
    exposed = (synced - 1) * backward_exposed(every, head, block, blocks, cost) + end_exposed + \
        backward_exposed(last, head, block, blocks, cost)
    step = accumulation * micro + optimizer + exposed
    sends = backward + end
    return dict(passes=passes, micro_batch=micro_batch, accumulation=accumulation, synced_micro_batches=synced,
                gb_per_step=dict(nvlink=round(float(per_link[0]) / GB, 3), network=round(float(per_link[1]) / GB, 3)),
                seconds={k: float(f"{v:.5g}") for k, v in dict(
                    compute=accumulation * micro, optimizer=optimizer, communication=sum(map(cost, sends)),
                    exposed_communication=exposed, step=step).items()},
                compute_efficiency=round(efficiency, 4), mfu=round(accumulation * micro * efficiency / step, 4))


def stage_steps(plan):
    """Counter of (stage index, passes) over the plan's optimizer steps (random recurrence: per drawn step)."""
    if plan.random_passes:
        return Counter((plan_lib.stage_index(s, plan), plan_lib.passes_at(s, plan)) for s in range(plan.steps))
    bounds = [0, *plan.crossover_steps, plan.steps]
    return Counter({(i, k): b - a for i, (k, a, b) in enumerate(zip(plan.pass_stages, bounds, bounds[1:]))})


def stage_transport(plan, mem, stage, passes, fixed_order=False):
    """(moving matrices, micro-batch, accumulation, synced micro-batches) of a step of pass stage `stage` at `passes`
    with mem's micro-batches for mem.world_size ranks. Moving: the matrices trained at these passes or earlier (they
    have state); synced: the micro-batches whose backward communicates (all with sharded gradients or the fixed
    order, else the last)."""
    cfg = plan.model_config
    earlier = [*plan.pass_stages[:stage + 1], passes]
    if stage == len(plan.pass_stages) - 1:
        earlier += plan.random_passes
    moving = sorted({m for k in earlier for m in plan_lib.executed_matrices(cfg, k)})
    micro_batch = mem.stages[stage].micro_batch
    accumulation = plan.tokens_per_step // plan.seq_len // mem.world_size // micro_batch
    return moving, micro_batch, accumulation, accumulation if (mem.zero2 or fixed_order) else 1


def predict(plan, mem, nodes, per_node, fixed_order=False, bucket_mb=None, cluster=None, device="cuda"):
    """The "throughput" of a dry run: per (stage, passes) one step of stage_step, and the run's seconds, GPU-hours
    and MFU. mem: the MemoryPlan (its micro-batches and gradient layout) for nodes x per_node GPUs; bucket_mb: Muon's
    buckets (default muon.BUCKET_MB); cluster: default arms.CLUSTERS["H100"] with the environment's changes."""
    cluster = cluster or cluster_from_env()
    bucket_bytes = plan_lib.BUCKET_BYTES if bucket_mb is None else int(bucket_mb * 2 ** 20)
    stages, total = [], 0.0
    for (i, passes), steps in sorted(stage_steps(plan).items()):
        transport = stage_transport(plan, mem, i, passes, fixed_order)
        stage = stage_step(plan.model_config, passes, *transport, nodes, per_node, bucket_bytes, cluster, fixed_order,
                           device, mem.node_size)
        stages.append(dict(stage, steps=steps))
        total += steps * stage["seconds"]["step"]
    return dict(predicted="predicted from stated bandwidths and efficiencies; not measured on a GPU",
                nodes=nodes, gpus_per_node=per_node, transport="hierarchical" if mem.node_size else "flat",
                cluster=asdict(cluster), stages=stages,
                seconds=float(f"{total:.5g}"), gpu_hours=float(f"{total * nodes * per_node / 3600:.4g}"),
                mfu=round(plan.total_flops / (nodes * per_node * GPU_PEAK_FLOPS[cluster.gpu] * total), 4))


def estimate(plan, mem, nodes, per_node, fixed_order=False, bucket_mb=None, cluster=None, eval_every=0):
    """A dry run's "throughput": the GPU prediction (predict), or for the cpu preset the measured cpu_probe."""
    if plan.preset == "cpu":
        return cpu_probe(plan, eval_every)
    return predict(plan, mem, nodes, per_node, fixed_order, bucket_mb, cluster)


def cpu_probe(plan, eval_every, steps=2):
    """The "throughput" of a cpu-preset dry run, measured on this machine as loaded now, not predicted: per pass stage
    `steps` optimizer steps on random tokens (forward and backward over the step's tokens, Muon on the block matrices,
    AdamW on the rest; the first left out as warm-up) and one forward of a step's tokens, a validation being
    val_tokens of it. The run's wall time: its steps at their stages' times plus its validations (the start, every
    eval_every steps, before and after each growth, the end) at the final passes; checkpoints not counted. Threads:
    OMP_NUM_THREADS, else 1, as torchrun (ladder.sh) starts each worker (on a busy CPU a second thread that waits for
    a descheduled one made a tiny step 1,000x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        return timed_probe(plan, eval_every, steps)
    finally:
        torch.set_num_threads(threads)


def timed_probe(plan, eval_every, steps):
    torch.manual_seed(plan.seed)
    model, groups = GPT(plan.model_config), None
    groups = model.param_groups()
    optimizers = [muon.Muon(groups["matrix"], lr=plan.matrix_lr, distributed=False),
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
