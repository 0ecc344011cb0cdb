"""A test-only user arm, kept here so that growth of a new per-pass parameter stays covered whatever USER_ARMS holds:
Mix-Grow, a learned d x d matrix M_r per injection point, and the learned gate g_r (h <- RMSNorm(h) + g_r M_r e, M_r
initialised to I and g_r to alpha: it starts as Untied-Grow's operator), on untied cores grown in stages 1 -> 2 -> 4. It is built the way
docs/your_own_arm.md builds one: a row, a parameter list on the model, its init and its use in GPT.inject.

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
        if not len(self.mix):
            return super().inject(h, e, r)
        return super().inject(h, e @ self.mix[min(r, len(self.mix) - 1)].T, r)


def register():
    """Mix-Grow as an arm of every script in this process (train.py builds model.GPT: MixGPT from here on)."""
    arms.ARMS[NAME] = ARM
    model.GPT = MixGPT


if __name__ == "__main__":  # each --next-separated run in turn, on the ranks torchrun started
    register()
    import common
    import train
    argv, code = sys.argv[1:], 0
    while argv and not code:
        here = argv.index("--next") if "--next" in argv else len(argv)
        code, argv = train.main(argv[:here]), argv[here + 1:]
        # the next run's process group on a store of its own (torchrun's, reused, can hang the third)
        os.environ.update(MASTER_PORT=str(int(os.environ.get("MASTER_PORT", 29500)) + 1),
                          TORCHELASTIC_USE_AGENT_STORE="False")
    common.exit_process(code)
