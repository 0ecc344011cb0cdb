"""The distributed layout of a run, applied to the model from outside (as torchtitan does): FSDP2 on a DeviceMesh.

One node: a 1-D mesh of its ranks, every block, and the root (embedding, lm_head) fully_shard'ed on it; several nodes:
HSDP, a (replicate = nodes, shard = ranks per node) mesh, so that parameters, gradients and optimizer state are
sharded inside a node and replicated across nodes. bf16 parameters in compute on CUDA (fp32 on CPU), gradients
reduced in fp32. Gradients are reduce-scattered inside the node every micro-batch and all-reduced across nodes once
per step (sync_micro_batch). The boundary gates (0-dim parameters, which FSDP2 cannot shard) stay replicated, their
gradients averaged by a hook. One process trains the plain model: nothing here runs.

    python -m pytest -q tests/test_parallel.py
"""
import datetime

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def build_mesh(world, per_node, device, timeout_minutes):
    """The run's DeviceMesh: 1-D ("shard") on one node, ("replicate", "shard") = (nodes, per_node) on several; every
    group it uses has the run's --dist-timeout (new_group's own default would be NCCL's 10 minutes)."""
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if per_node == world:
        return DeviceMesh.from_group(dist.group.WORLD, device.type, mesh_dim_names=("shard",))
    nodes, rank = world // per_node, dist.get_rank()
    shard = [dist.new_group(list(range(n * per_node, (n + 1) * per_node)), timeout=timeout) for n in range(nodes)]
    replicate = [dist.new_group(list(range(local, world, per_node)), timeout=timeout) for local in range(per_node)]
    return DeviceMesh.from_group([replicate[rank % per_node], shard[rank // per_node]], device.type,
                                 mesh=torch.arange(world).view(nodes, per_node),
                                 mesh_dim_names=("replicate", "shard"))


def shard_model(model, mesh):
    """fully_shard every block and then the root (embedding, lm_head) of `model` on `mesh`, in place -> model."""
    cuda = mesh.device_type == "cuda"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cuda else None, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    gates = set(model.boundary_gates)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=gates)
    for gate in gates:
        gate.register_post_accumulate_grad_hook(average_gradient)
    return model


def average_gradient(param):
    """A replicated parameter's accumulated gradient averaged over every rank after each backward (the earlier
    micro-batches' part is already the same everywhere, so averaging it again keeps it)."""
    dist.all_reduce(param.grad)
    param.grad.div_(dist.get_world_size())


def sync_micro_batch(model, last):
    """Before a micro-batch's backward: under HSDP the all-reduce across nodes runs on the step's last micro-batch
    only (the reduce-scatter inside the node runs on every one, freeing the unsharded gradients)."""
    if isinstance(model, FSDPModule):
        model.set_requires_all_reduce(last)


def full(t):
    """A DTensor's whole value on every rank (a collective), a plain tensor itself."""
    return t.full_tensor() if isinstance(t, DTensor) else t
