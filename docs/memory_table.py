"""The tables of docs/memory.md: train.py's micro-batch planner for every paper run, the d26 preset and the
data-constrained grid, on an H100 80GB and an H200 141GB, next to the micro-batches of the authors' release scripts.

    python docs/memory_table.py > /tmp/memory_table.md      # from the repository root
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model  # noqa: E402
import plan  # noqa: E402
import train  # noqa: E402
from arms import ARMS, DATA_CONSTRAINED_LOOPS, H100_80GB_GIB, ladder_runs  # noqa: E402
from common import Parser, cli_main, exit_process  # noqa: E402

H200_141GB_GIB = 143771 / 1024  # what torch reports for an H200 141GB
GPUS_PER_NODE = 8  # the tables' nodes (ladder.sh's NPROC_PER_NODE): d26 runs on 2 of them
# The release scripts' micro-batches on 80 GB H100s (compiled, FlashAttention-3): per depth, and per (depth, K).
RELEASE_FIXED = {6: 32, 8: 32, 10: 32, 12: 16, 14: 16, 16: 8, 18: 8, 20: 8}
RELEASE_GROW = {6: 32, 8: 32, 10: 16, 12: 16, 14: 8, 16: 8, 18: 4, 26: "4→2"}
RELEASE_DC = {6: {k: 32 for k in DATA_CONSTRAINED_LOOPS[6]}, 8: {1: 32, 2: 32, 3: 32, 4: 32, 6: 32, 8: 16, 12: 8},
              10: {1: 32, 2: 32, 3: 32, 4: 16, 6: 16, 8: 8, 12: 8}, 12: {1: 32, 2: 16, 3: 16, 4: 16, 6: 8, 8: 8, 12: 8},
              14: {1: 16, 2: 16, 3: 16, 4: 8, 6: 8, 8: 4}, 16: {1: 16, 2: 8, 3: 8}, 18: {1: 8}}


def cell(run_plan, world, gpu):
    try:
        mem = plan.plan_micro_batches(run_plan, world, gpu, per_node=min(world, GPUS_PER_NODE))
    except train.UsageError:
        return "does not fit"
    return ("→".join(str(s.micro_batch) for s in mem.stages) + " (" +
            " → ".join(f"{s.bytes['peak'] / plan.GIB:.1f}" for s in mem.stages) +
            f"; {min(s.headroom for s in mem.stages) / plan.GIB:.1f})")


def row(name, argv, release, world=8):
    run_plan = train.make_plan(train.parse_args(argv + ["--dry-run"]))
    blocks = "→".join(str(model.executed_blocks(run_plan.model_config, k)) for k in plan.memory_pass_stages(run_plan))
    return (f"| {name} | {blocks} | {release} | {cell(run_plan, world, H100_80GB_GIB)} | "
            f"{cell(run_plan, world, H200_141GB_GIB)} |")


HEADER = ("| run | executed blocks | release micro-batch | 80 GB: micro-batch (peak; headroom GiB) | "
          "141 GB: micro-batch (peak; headroom GiB) |\n|---|---|---|---|---|")


def run(argv):
    Parser(prog="docs/memory_table.py", description=__doc__.split("\n\n")[0]).parse_args(argv)  # no options
    print("Paper ladders (`bash ladder.sh all --dry-run`, 8 GPUs, 32 sequences per rank):\n\n" + HEADER)
    for name, flags in ladder_runs("all"):
        arch, depth = flags[1], int(flags[3])  # --arch A --depth D
        grows = ARMS[arch].grows
        print(row(name, flags, (RELEASE_GROW if grows else RELEASE_FIXED)[depth]))
    print("\nd26 preset (`bash ladder.sh untied_grow --preset d26`, 2 nodes × 8 GPUs, 16 sequences per rank):\n\n" + HEADER)
    (name, flags), = ladder_runs("untied_grow", "d26")
    print(row(name, flags, RELEASE_GROW[26], world=16))
    print("\nData-constrained grid (`--arch operator_1 --passes K --data-constrained`; fixed-WD and tuned-WD cells alike, "
          "8 GPUs):\n\n" + HEADER)
    for d, loops in DATA_CONSTRAINED_LOOPS.items():
        for k in loops:
            print(row(f"dc_d{d}_k{k}", ["--arch", "operator_1", "--depth", str(d), "--passes", str(k),
                                        "--data-constrained", "fixed-wd"], RELEASE_DC[d][k]))


def main(argv=None):  # bad arguments: one line, exit 2; a closed pipe (`| head`) ends quietly
    return cli_main(run, "docs/memory_table.py", argv)


if __name__ == "__main__":
    exit_process(main())
