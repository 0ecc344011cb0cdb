"""A test-only user arm, so that growth of a new per-pass parameter stays covered whatever USER_ARMS holds: Mix-Grow,
h <- RMSNorm(h) + g_r M_r e with a learned d x d matrix M_r (initialised to I) and gate g_r (to alpha) per injection
point, on untied cores grown 1 -> 2 -> 4; built as docs/your_own_arm.md builds one.

    python -m torch.distributed.run --nproc_per_node 2 tests/mix_arm.py train.py-flags [--next train.py-flags ...]
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import arms  # noqa: E402
import model  # noqa: E402

NAME = "mix_grow"
ARM = arms.derived("untied_grow", label="Mix-Grow", color="#8c6d31", stages=(1, 2, 4), default_crossover=(0.3, 0.6),
                   boundary_gate=True)


class MixGPT(model.GPT):
    def __init__(self, cfg, device="cpu", draw_weights=True, **options):
        super().__init__(cfg, device, draw_weights=False, **options)
        injections = cfg.passes - 1 + cfg.coda_inject if cfg.arch == NAME else 0  # one per injection point
        self.mix = nn.ParameterList(nn.Parameter(torch.empty(cfg.width, cfg.width, device=device))
                                    for _ in range(injections))
        if draw_weights and torch.device(device).type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        super().init_weights()
        for m in getattr(self, "mix", ()):
            m.copy_(torch.eye(self.cfg.width))

    def inject(self, h, e, r):
        return super().inject(h, e @ self.mix[min(r, len(self.mix) - 1)].T if len(self.mix) else e, r)


if __name__ == "__main__":  # each --next-separated run in turn, on the ranks torchrun started
    arms.ARMS[NAME], model.GPT = ARM, MixGPT  # Mix-Grow an arm of every script here (train.py builds model.GPT)
    import common
    import train
    argv, code = sys.argv[1:], 0
    port = int(os.environ["MASTER_PORT"]) + 100 * int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    while argv and not code:
        # each run's process group on a new store hosted by rank 0: torchrun's own, reused across the runs and its
        # restarts, can hang a later run or hand it the address of a rank that is gone
        port += 1
        os.environ.update(MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="False")
        here = argv.index("--next") if "--next" in argv else len(argv)
        code, argv = train.main(argv[:here]), argv[here + 1:]
    common.exit_process(code)
