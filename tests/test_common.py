"""Tests for common.py: the CPU allocator setting of a run, torch-free imports, the process setup and the one-line
stop."""
import os, signal, subprocess, sys, time

import pytest

import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


KEEP_FREED_PROBE = """
import ctypes, sys, torch, common
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert common.keep_freed_cpu_memory()
a = torch.randn(2 ** 20)  # 4 MiB
kept = []
for step in range(6):
    saved = [a * 2.0 for _ in range(8)]  # a step's activations, freed together after its backward
    del saved
    kept.append(libc.mallinfo2().fordblks >> 20)  # MiB that glibc holds free for reuse
print(" ".join(map(str, kept)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_cpu_memory_holds_a_steps_freed_tensors_for_the_next():
    """glibc's own accounting (mallinfo2), not page faults: fault counts also move with the kernel's reclaim and the
    process's other allocations. By default glibc mmaps the first step's 4 MiB blocks (its threshold starts at
    128 KiB) and unmaps them when freed; kept, every step's 32 MiB stays in the heap for the next step."""
    kept = {mode: [int(f) for f in subprocess.run([sys.executable, "-c", KEEP_FREED_PROBE, mode], capture_output=True,
                                                  text=True, cwd=ROOT, check=True).stdout.split()]
            for mode in ("default", "keep")}
    assert kept["default"][0] < 32, kept
    assert min(kept["keep"]) >= 32, kept


def test_common_and_arms_import_without_torch():
    """arms.py and the fits import common.py; neither may pull in torch (the device functions import it when called)."""
    probe = "import sys, common, arms; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True)


def test_setup_distributed_turns_on_expandable_segments_unless_the_user_chose(monkeypatch):
    """The CUDA caching allocator reads PYTORCH_CUDA_ALLOC_CONF once, at its first allocation: setup_distributed, the
    first CUDA call of every entry point, sets expandable segments before it; a user's own setting is kept."""
    import torch
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert common.setup_distributed("cpu")[1:] == (1, torch.device("cpu"))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    common.setup_distributed("cpu")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"


def test_cli_main_turns_ctrl_c_and_sigterm_into_one_line(capsys):
    """A Ctrl-C (KeyboardInterrupt) or a SIGTERM inside a script's work: one line, exit 128 + n, the SIGTERM handler
    restored afterwards; a SIGTERM raises where the work is, so `with` blocks clean up (data.py's pool)."""
    def ctrl_c(argv):
        raise KeyboardInterrupt

    def sigterm(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return 0
    before = signal.getsignal(signal.SIGTERM)
    assert common.cli_main(ctrl_c, "x.py") == 130
    assert common.cli_main(sigterm, "x.py") == 143
    assert signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().err.splitlines() == ["x.py: stopped by SIGINT (Ctrl-C); run the same command again",
                                                    "x.py: stopped by SIGTERM; run the same command again"]
