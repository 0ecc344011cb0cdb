"""The table of docs/measurements.md's "Throughput": per release run, its training hours (timing.json, one 8 x H100
node), the MFU they give with this project's FLOP count, and the throughput model's predicted MFU and hours for the
same run on 1 node x 8 H100 80GB (the dry run's micro-batches; predicted, not measured) and their difference in points.
The model's compute efficiency (arms.CLUSTERS) is fitted to these runs: every one within CALIBRATION_POINTS
(tests/test_throughput.py).

    python docs/throughput_table.py > /tmp/throughput_table.md      # from the repository root
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plan  # noqa: E402
import throughput  # noqa: E402
import train  # noqa: E402
from arms import H100_80GB_GIB, RELEASE_SERIES  # noqa: E402
from common import Parser, cli_main, exit_process  # noqa: E402

CALIBRATION_POINTS = 3.0  # every predicted MFU within this many points of the release's


def rows():
    """[(run, release hours, release MFU, predicted MFU, predicted hours, predicted exposed share)] per timed run."""
    out = []
    for series, depth, hours in throughput.release_timing():
        arch = RELEASE_SERIES[series]
        run_plan = train.make_plan(train.parse_args(["--arch", arch, "--depth", str(depth)]))
        mem = plan.plan_micro_batches(run_plan, throughput.RELEASE_GPUS, H100_80GB_GIB)
        speed = throughput.predict(run_plan, mem, 1, throughput.RELEASE_GPUS)
        exposed = sum(s["steps"] * s["seconds"]["exposed_communication"] for s in speed["stages"]) / speed["seconds"]
        out.append((f"{arch}_d{depth}", hours, throughput.measured_mfu(run_plan.total_flops, hours), speed["mfu"],
                    speed["seconds"] / 3600, exposed))
    return out


def run(argv):
    Parser(prog="docs/throughput_table.py", description=__doc__.split("\n\n")[0]).parse_args(argv)  # no options
    print("| run | release hours | release MFU | predicted MFU | points apart | predicted hours | predicted exposed "
          "communication |\n|---|---|---|---|---|---|---|")
    for name, hours, release, predicted, predicted_hours, exposed in rows():
        print(f"| {name} | {hours:.3f} | {release:.1%} | {predicted:.1%} | {100 * (predicted - release):+.1f} | "
              f"{predicted_hours:.3f} | {exposed:.1%} |")


def main(argv=None):
    return cli_main(run, "docs/throughput_table.py", argv)


if __name__ == "__main__":
    exit_process(main())
