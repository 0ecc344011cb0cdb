"""train.py with a wrongly scaled sharded gradient transport, for tests/test_bench.py: under --shard-gradients rank
1's Muon gradients enter the reduction multiplied by the world size, as if only the other ranks divided by it (a
uniform scale of every gradient would be almost invisible: Muon's update is normalised, ~2e-7 relative in the losses). bench.py --gpu-smoke starts it in place of
train.py when a test sets bench.SMOKE_TRAINER to this file; nothing else reads it."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import muon  # noqa: E402
import train  # noqa: E402
from common import exit_process  # noqa: E402

if "--shard-gradients" in sys.argv:
    launch_reduce = muon.Muon._launch_reduce

    def rank_1_unscaled(self, bucket):
        if self.rank == 1:  # this rank's gradients enter the sum x world: the mean counts them world times
            params = self._params()
            for i in bucket.members:
                params[i].grad.mul_(self.world_size)
        return launch_reduce(self, bucket)
    muon.Muon._launch_reduce = rank_1_unscaled


if __name__ == "__main__":
    exit_process(train.main(sys.argv[1:]))
