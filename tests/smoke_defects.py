"""train.py with a defect every process shares, for tests/test_bench.py (bench.py --gpu-smoke starts it in place of
train.py when a test sets bench.SMOKE_TRAINER to this file; nothing else reads it). SMOKE_DEFECT names it:

    grad_scale   rank 1's gradients x world, before any reduction (a hook on its loss: every transport sums them)
    rank0_data   every rank reads rank 0's windows (the loader asked for rank 0's slice)
    trace        no defect: each rank writes the process groups it creates and those its collectives run on to
                 SMOKE_TRACE_DIR/<run name>_rank<R>.json (LOCAL_WORLD_SIZE, WORLD_SIZE and its node beside them)

Both defects sit above the gradient transport, so a run on one process cannot share them."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import data  # noqa: E402
import model  # noqa: E402
import train  # noqa: E402
from common import exit_process  # noqa: E402

DEFECT = os.environ.get("SMOKE_DEFECT")
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

if DEFECT == "grad_scale" and RANK == 1:
    forward = model.GPT.forward

    def loss_scaled_in_backward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if isinstance(out, torch.Tensor) and out.requires_grad and out.dim() == 0:  # a training loss: its gradient,
            out.register_hook(lambda grad: grad * WORLD)  # and so every one below it, x world
        return out
    model.GPT.forward = loss_scaled_in_backward

if DEFECT == "rank0_data":
    batch = data.TrainLoader.batch
    data.TrainLoader.batch = lambda self, step, rank=0, world_size=1: batch(self, step, 0, world_size)

if DEFECT == "trace":
    record = dict(local_world_size=os.environ.get("LOCAL_WORLD_SIZE"), world_size=WORLD,
                  node=os.environ.get("GROUP_RANK"), created=[], used=[])
    new_group = dist.new_group

    def traced_new_group(ranks=None, *args, **kwargs):
        group = new_group(ranks, *args, **kwargs)
        record["created"].append(sorted(ranks) if ranks is not None else list(range(dist.get_world_size())))
        return group
    dist.new_group = traced_new_group

    def traced(name, collective):
        def call(*args, group=None, **kwargs):
            ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            if [name, ranks] not in record["used"]:
                record["used"].append([name, ranks])
            return collective(*args, group=group, **kwargs)
        return call
    for name in ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single", "all_gather_into_tensor",
                 "all_gather_single", "broadcast", "reduce", "all_to_all_single", "gather"):
        if hasattr(dist, name):
            setattr(dist, name, traced(name, getattr(dist, name)))

if __name__ == "__main__":
    code = train.main(sys.argv[1:])
    if DEFECT == "trace":  # written before exit_process, which leaves with os._exit under torchrun
        run_name = sys.argv[sys.argv.index("--run-name") + 1]
        with open(os.path.join(os.environ["SMOKE_TRACE_DIR"], f"{run_name}_rank{RANK}.json"), "w") as f:
            json.dump(record, f)
    exit_process(code)
