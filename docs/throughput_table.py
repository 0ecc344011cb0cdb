"""The table of docs/measurements.md's "Throughput": per release run, its training hours (timing.json, one 8 x H100
node), the MFU they give with this project's FLOP count, and the throughput model's predicted MFU and hours for the
same run on 1 node x 8 H100 80GB (the dry run's micro-batches; predicted, not measured).

    python docs/throughput_table.py > /tmp/throughput_table.md      # from the repository root
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plan  # noqa: E402
import throughput  # noqa: E402
import train  # noqa: E402
from arms import RELEASE_SERIES  # noqa: E402
from common import Parser, cli_main, exit_process  # noqa: E402


def run(argv):
    Parser(prog="docs/throughput_table.py", description=__doc__.split("\n\n")[0]).parse_args(argv)  # no options
    print("| run | release hours | release MFU | predicted MFU | predicted hours | predicted exposed communication |\n"
          "|---|---|---|---|---|---|")
    for series, depth, hours in throughput.release_timing():
        arch = RELEASE_SERIES[series]
        run_plan = train.make_plan(train.parse_args(["--arch", arch, "--depth", str(depth)]))
        mem = plan.plan_micro_batches(run_plan, throughput.RELEASE_GPUS, plan.H100_80GB_GIB)
        speed = throughput.predict(run_plan, mem, 1, throughput.RELEASE_GPUS)
        exposed = sum(s["steps"] * s["seconds"]["exposed_communication"] for s in speed["stages"]) / speed["seconds"]
        print(f"| {arch}_d{depth} | {hours:.3f} | {throughput.measured_mfu(run_plan.total_flops, hours):.1%} | "
              f"{speed['mfu']:.1%} | {speed['seconds'] / 3600:.3f} | {exposed:.1%} |")


def main(argv=None):
    return cli_main(run, "docs/throughput_table.py", argv)


if __name__ == "__main__":
    exit_process(main())
