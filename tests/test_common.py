"""Tests for common.py: resumable downloads against a local fake Hugging Face server (FakeHub, which test_data.py's
pool preparation uses too), and the CPU allocator setting of a run."""
import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest

import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------------------------------
# A fake Hugging Face Hub: tree API + resolve URLs with Range support, optional cut-offs and wrong sizes

class FakeHub(BaseHTTPRequestHandler):
    files = {}         # "repo/revision/path" -> bytes
    listed_size = {}   # key -> size the tree API claims (default: true size)
    cut_once = set()   # keys whose next download is cut off half-way
    log = []           # (path, Range header)

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = urlparse(self.path).path
        self.log.append((path, self.headers.get("Range")))
        if path.startswith("/api/datasets/"):
            repo, _, tail = path[len("/api/datasets/"):].partition("/tree/")
            revision, _, folder = tail.partition("/")
            prefix = f"{repo}/{revision}/{folder}/"
            entries = [dict(type="file", path=k[len(f"{repo}/{revision}/"):], size=self.listed_size.get(k, len(v)),
                            oid="0" * 40, lfs=dict(oid=hashlib.sha256(v).hexdigest(), size=len(v)))
                       for k, v in self.files.items() if k.startswith(prefix)]
            return self._send(200, json.dumps(entries).encode()) if entries else self._send(404, b"not found")
        repo, _, tail = path[len("/datasets/"):].partition("/resolve/")
        key = f"{repo}/{tail}"
        if key not in self.files:
            return self._send(404, b"not found")
        body, status, headers = self.files[key], 200, {}
        if self.headers.get("Range"):
            start = int(self.headers["Range"].split("=")[1].split("-")[0])
            status, headers = 206, {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"}
            body = body[start:]
        if key in self.cut_once:
            self.cut_once.discard(key)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[:len(body) // 2])  # then the connection closes early
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(status, body, headers)

    def _send(self, status, body, headers=()):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in dict(headers).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def hub(monkeypatch):
    FakeHub.files, FakeHub.listed_size, FakeHub.cut_once, FakeHub.log = {}, {}, set(), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(common, "HF_ENDPOINT", url)
    monkeypatch.setitem(common.DOWNLOAD, "backoff_s", 0.01)
    yield url
    server.shutdown()
    server.server_close()


# ------------------------------------------------------------------------------------------------------------
# Downloads

def test_download_resumes_after_cut_off(hub, tmp_path):
    payload = os.urandom(300_000)
    key = "o/r/rev/sample/000_00000.parquet"
    FakeHub.files[key] = payload
    FakeHub.cut_once.add(key)
    url = common.hf_url("o/r", "rev", "sample/000_00000.parquet")
    dest = str(tmp_path / "shard.parquet")
    common.download(url, dest, len(payload), hashlib.sha256(payload).hexdigest())
    assert open(dest, "rb").read() == payload
    assert not os.path.exists(dest + ".part")
    ranges = [r for p, r in FakeHub.log]
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int(ranges[1][len("bytes="):-1])  # what arrived before the cut (up to the last whole chunk)
    assert 0 < resumed_at <= len(payload) // 2


def test_download_of_an_interrupted_part_file_continues(hub, tmp_path, monkeypatch):
    payload = os.urandom(50_000)
    key = "o/r/rev/x.parquet"
    FakeHub.files[key] = payload
    dest = str(tmp_path / "x.parquet")
    open(dest + ".part", "wb").write(payload[:12_345])  # left behind by a killed process
    monkeypatch.setenv("HF_TOKEN", "secret")
    common.download(f"{hub}/datasets/o/r/resolve/rev/x.parquet", dest, len(payload))
    assert open(dest, "rb").read() == payload
    assert FakeHub.log == [("/datasets/o/r/resolve/rev/x.parquet", "bytes=12345-")]


def test_download_size_mismatch_fails_clearly(hub, tmp_path):
    key = "o/r/rev/y.parquet"
    FakeHub.files[key] = b"x" * 1000
    dest = str(tmp_path / "y.parquet")
    with pytest.raises(common.DownloadError, match="size mismatch.*1000 bytes.*1200"):
        common.download(f"{hub}/datasets/o/r/resolve/rev/y.parquet", dest, expected_size=1200)
    assert not os.path.exists(dest)


def test_download_wrong_sha256_is_not_kept(hub, tmp_path):
    FakeHub.files["o/r/rev/z.parquet"] = b"abc"
    dest = str(tmp_path / "z.parquet")
    with pytest.raises(common.DownloadError, match="sha256 mismatch"):
        common.download(f"{hub}/datasets/o/r/resolve/rev/z.parquet", dest, 3, "0" * 64)
    assert not os.path.exists(dest) and not os.path.exists(dest + ".part")


# ------------------------------------------------------------------------------------------------------------
# Devices

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
    import signal
    import time

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
