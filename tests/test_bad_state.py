"""Bad state for train.py, core_eval.py, data.py and ladder.sh: damaged, crafted or mismatched files and interrupted
processes. Two writers on one run, orphaned workers and the run lock; damaged and crafted checkpoints; the
hostile-input classes of docs/reliability.md that are state: 1 (a full disk is one line in every writer, on a real
small filesystem where this process may mount one), 6 (what a checkpoint says about itself is cross-checked) and 7
(the pool's recorded hashes); recorded runs against the command, signals, checkpoints/final as a file. Refusals
follow tests/refusals.py's contract."""
import contextlib
import importlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from refusals import ROOT, snapshot, run_in_process, assert_refused, RUN, PREP, bundle_files, EVAL, private_tmpfs_mounts


def test_train_refuses_a_pool_with_flipped_bytes(tmp_path, pool_copy):
    # token id 0xffff >= the byte vocab (257): an IndexError inside the first step before; result.json never written
    with open(pool_copy / "train.bin", "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    assert_refused("train.py", RUN, tmp_path, "holds token id 65535 >= vocab size 257 at position 10",
                   runner=run_in_process)
    assert not (tmp_path / "runs" / "r" / "result.json").exists()


def test_train_refuses_a_locked_run(tmp_path, pool_copy):
    """The lock is held by another open file description (here: a child process), as a running trainer holds it."""
    os.makedirs(tmp_path / "runs" / "r")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write('PID 4242 on elsewhere'); f.flush(); "
                               "print('held', flush=True); time.sleep(60)", str(tmp_path / "runs" / "r" / "train.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_refused("train.py", RUN, tmp_path, "is being written by another train.py (PID 4242 on elsewhere)",
                       runner=run_in_process)
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------------------------------------ fault: two writers
def test_two_trainers_on_one_run_dir(tmp_path, pool):
    """The second trainer exits 2 naming the first one's PID; the first completes with steps 1..N in order."""
    args = [a.replace("{d}/pool", pool).replace("{d}", str(tmp_path)) for a in RUN[:-4]] + ["--steps", "30",
                                                                                              "--run-name", "r"]
    first = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    lock = tmp_path / "runs" / "r" / "train.lock"
    for _ in range(1200):  # until the first trainer holds the lock (torch import takes seconds)
        if lock.exists() and f"PID {first.pid}" in lock.read_text():
            break
        assert first.poll() is None, first.communicate()
        time.sleep(0.05)
    code, err = run_in_process("train.py", args)
    assert code == 2 and len(err.splitlines()) == 1 and f"(PID {first.pid} on " in err, err
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    steps = [json.loads(line)["step"] for line in open(tmp_path / "runs" / "r" / "trajectory.jsonl")]
    assert steps == list(range(1, 31))
    assert json.load(open(tmp_path / "runs" / "r" / "result.json"))["status"] == "complete"


def hold_lock(path, text):
    """A child process holding the run lock, as a running trainer does."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write(sys.argv[2]); f.flush(); print('held', flush=True); "
                               "time.sleep(120)", str(path), text], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_ladder_refuses_a_run_being_trained(tmp_path):
    holder = hold_lock(tmp_path / "vanilla_d1" / "train.lock", "PID 4242 on elsewhere")
    try:
        r = subprocess.run(["bash", "ladder.sh", "vanilla", "--preset", "cpu", "--depth", "1"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, env=dict(os.environ, RUNS_DIR=str(tmp_path)))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "run vanilla_d1 is being trained by another process (PID 4242 on elsewhere)" in r.stderr
        assert not (tmp_path / "vanilla_d1" / "train.log").exists()
    finally:
        holder.kill()
        holder.wait()


def test_issue31_class4_two_identical_ladders_second_stops_and_writes_nothing(tmp_path):
    """Two identical ladder.sh commands on one RUNS_DIR: the second passed the train.lock check while the first's
    torchrun was still starting, appended its torchrun's output (a traceback) to the first run's train.log and exited
    1 with "run failed". A stand-in torchrun on PATH stays up until told to finish, so the race is certain."""
    bin_dir, flag = tmp_path / "bin", tmp_path / "hold"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f'#!/bin/bash\necho "stand-in torchrun $$"\nwhile [ -e {flag} ]; do sleep 0.05; '
                                      'done\necho "done: stand-in"\n')
    (bin_dir / "torchrun").chmod(0o755)
    flag.write_text("")
    env = dict(os.environ, RUNS_DIR=str(tmp_path / "runs"), PATH=f"{bin_dir}:{os.environ['PATH']}")
    command = ["bash", "ladder.sh", "vanilla", "--preset", "cpu", "--depth", "1"]
    log = tmp_path / "runs" / "vanilla_d1" / "train.log"
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if log.exists() and "stand-in torchrun" in log.read_text():
                break
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        second = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            _, err = second.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            flag.unlink()
            _, err = second.communicate()
        assert second.returncode == 2 and err.count("\n") == 1, (second.returncode, err)
        assert f"run vanilla_d1 is being trained by another ladder.sh (PID {first.pid} on " in err, err
        assert log.read_text().count("stand-in torchrun") == 1, log.read_text()
    finally:
        flag.unlink(missing_ok=True)
        first.communicate(timeout=120)
    assert first.returncode == 0 and log.read_text().count("stand-in torchrun") == 1


def test_orphaned_torchrun_worker_keeps_the_lock(tmp_path, pool, free_port):
    """torchrun killed with -9 (as when a ladder's process group is killed) leaves its worker running: the worker,
    not torchrun, holds the lock, so a re-run is refused instead of becoming a second writer."""
    import signal
    import time
    args = [a.replace("{d}/pool", pool).replace("{d}", str(tmp_path)) for a in RUN[:-4]] + ["--steps", "100000",
                                                                                              "--run-name", "r"]
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr",
                              "127.0.0.1", "--master_port", str(free_port), "train.py", *args], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    lock = tmp_path / "runs" / "r" / "train.lock"
    worker = None
    try:
        for _ in range(2400):
            if lock.exists() and lock.read_text().startswith("PID "):
                worker = int(lock.read_text().split()[1])
                break
            assert agent.poll() is None
            time.sleep(0.05)
        assert worker and worker != agent.pid
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        os.kill(worker, 0)  # the orphan is still alive ...
        code, err = run_in_process("train.py", [*args, "--resume"])
        assert code == 2 and f"(PID {worker} on " in err, err  # ... and a re-run is refused
    finally:
        agent.kill()
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


# ------------------------------------------------------------------------------------------------ train.py checkpoints
class CodeOnLoad:
    """Unpickling this runs code (writes a marker file): a crafted checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def tiny_run_argv(pool, *extra):
    return ["--arch", "vanilla", "--depth", "2", "--preset", "cpu", "--width-per-depth", "16", "--head-dim", "16",
            "--seq-len", "32", "--total-batch-tokens", "256", "--val-tokens", "1024", "--data-dir", pool,
            "--runs-dir", "{d}/runs", "--run-name", "r", "--steps", "4", "--warmup-steps", "0", *extra]


@pytest.fixture(scope="module")
def stopped_run(pool, tmp_path_factory):
    """A run stopped after step 2: checkpoints/latest holds model/ and optimizer/ (DCP), meta.json, MANIFEST.json."""
    d = str(tmp_path_factory.mktemp("stopped"))
    argv = [a.replace("{d}", d) for a in tiny_run_argv(pool, "--stop-after", "2")]
    assert run_in_process("train.py", argv)[0] == 0
    return os.path.join(d, "runs", "r")


def rehash(folder):
    """Rewrite a checkpoint's manifest for its current files (what a deliberate forger would do)."""
    import common
    names = sorted(os.path.relpath(os.path.join(b, n), folder) for b, _, ns in os.walk(folder) for n in ns
                   if n != "MANIFEST.json")
    files = {n: dict(size=os.path.getsize(os.path.join(folder, n)), sha256=common.sha256_file(os.path.join(folder, n)))
             for n in names}
    with open(os.path.join(folder, "MANIFEST.json"), "w") as f:
        json.dump(dict(files=files), f)


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def random_bytes(path, prefix=b"", size=None):
    """Overwrite PATH with as many seeded random bytes (after PREFIX): the same bytes on every run, so a case
    cannot pass or fail by the luck of the draw (torch.load fails in a different way for ~9% of random files)."""
    size = os.path.getsize(path) if size is None else size
    with open(path, "wb") as f:
        f.write(prefix + random.Random(0).randbytes(size - len(prefix)))


def edit_manifest_sha(latest):
    manifest = json.load(open(os.path.join(latest, "MANIFEST.json")))
    manifest["files"]["meta.json"]["sha256"] = "0" * 64
    with open(os.path.join(latest, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f)


def edit_meta(latest, **changes):
    """Change meta.json's fields and rehash: a checkpoint written in another reduction order, as far as resume sees."""
    path = os.path.join(latest, "meta.json")
    meta = json.load(open(path))
    meta.update(changes)
    with open(path, "w") as f:
        json.dump(meta, f)
    rehash(latest)


def crafted(path, marker):
    torch.save(CodeOnLoad(marker), path)


def crafted_metadata(path, marker):
    import pickle
    with open(path, "wb") as f:
        pickle.dump(CodeOnLoad(marker), f)


RESUME = ["--resume"]
L = "runs/r/checkpoints/latest"
# (id, mutation of the copied run (run dir, marker path), script, argv after the run's flags, message)
CHECKPOINT_CASES = [
    ("resume-truncated", lambda r, m: truncate(f"{r}/checkpoints/latest/model/__0_0.distcp"), "train.py", RESUME,
     "is truncated or corrupted: model/__0_0.distcp has"),
    ("resume-random-bytes", lambda r, m: random_bytes(f"{r}/checkpoints/latest/optimizer/__0_0.distcp"), "train.py",
     RESUME, "is corrupted: optimizer/__0_0.distcp does not match its sha256"),
    ("resume-random-bytes-rehashed", lambda r, m: (random_bytes(f"{r}/checkpoints/latest/optimizer/__0_0.distcp"),
                                                   rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "is unreadable or holds objects other than tensors"),
    ("resume-odd-protocol-bytes-rehashed", lambda r, m: (random_bytes(f"{r}/checkpoints/latest/model/__0_0.distcp",
                                                                      b"\x80\x79"),
                                                         rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "is unreadable or holds objects other than tensors"),
    ("resume-manifest-mismatch", lambda r, m: edit_manifest_sha(f"{r}/checkpoints/latest"), "train.py", RESUME,
     "is corrupted: meta.json does not match its sha256"),
    ("resume-save-never-finished", lambda r, m: os.remove(f"{r}/checkpoints/latest/MANIFEST.json"), "train.py",
     RESUME, "is incomplete (no MANIFEST.json"),
    ("resume-crafted-model-metadata", lambda r, m: (crafted_metadata(f"{r}/checkpoints/latest/model/.metadata", m),
                                                    rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "holds objects other than tensors and plain types"),
    ("resume-crafted-dcp-metadata", lambda r, m: (crafted_metadata(f"{r}/checkpoints/latest/optimizer/.metadata", m),
                                                  rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "holds objects other than tensors and plain types"),
    ("resume-no-checkpoint", lambda r, m: shutil.rmtree(f"{r}/checkpoints"), "train.py", RESUME,
     "has no checkpoint to resume from"),
    ("resume-old-single-file", lambda r, m: (shutil.rmtree(f"{r}/checkpoints/latest"),
                                             open(f"{r}/checkpoints/latest.pt", "wb").close()), "train.py", RESUME,
     "single-file checkpoint of an earlier train.py"),
    ("resume-short-trajectory", lambda r, m: open(f"{r}/trajectory.jsonl", "w").close(), "train.py", RESUME,
     "has 0 lines but the checkpoint is at step 2"),
    ("fresh-start-over-a-run", lambda r, m: os.remove(f"{r}/result.json"), "train.py", [], "already holds a run"),
    ("resume-a-fixed-order-run", lambda r, m: edit_meta(f"{r}/checkpoints/latest", fixed_reduce_order=True,
                                                        micro_batches=[8]), "train.py", RESUME,
     "was trained with --fixed-reduce-order, which this train.py no longer has"),
    ("eval-random-bytes-file", lambda r, m: random_bytes(f"{r}/final.pt", b"\x80\x79", size=4096), "core_eval.py",
     ["--checkpoint", "{d}/runs/r/final.pt"], "is not a usable model checkpoint"),
    ("eval-truncated", lambda r, m: truncate(f"{r}/checkpoints/latest/model/__0_0.distcp"), "core_eval.py",
     ["--checkpoint", "{d}/" + L], "is truncated or corrupted: model/__0_0.distcp has"),
    ("eval-crafted-pickle", lambda r, m: (crafted_metadata(f"{r}/checkpoints/latest/model/.metadata", m),
                                          rehash(f"{r}/checkpoints/latest")), "core_eval.py",
     ["--checkpoint", "{d}/" + L], "holds objects other than tensors and plain types"),
    ("eval-run-folder", lambda r, m: None, "core_eval.py", ["--checkpoint", "{d}/runs/r"],
     "is a run folder (no model/ or model.pt); pass"),
    ("eval-checkpoints-folder", lambda r, m: None, "core_eval.py", ["--checkpoint", "{d}/runs/r/checkpoints"],
     "is a folder of checkpoints (no model/ or model.pt); pass"),
]


@pytest.mark.parametrize("mutate, script, argv, message", [c[1:] for c in CHECKPOINT_CASES],
                         ids=[c[0] for c in CHECKPOINT_CASES])
def test_checkpoint_bad_input(pool, stopped_run, tmp_path, mutate, script, argv, message):
    run_dir, marker = os.path.join(tmp_path, "runs", "r"), os.path.join(tmp_path, "marker")
    shutil.copytree(stopped_run, run_dir)
    mutate(run_dir, marker)
    full = tiny_run_argv(pool) + argv if script == "train.py" else argv + ["--bundle-dir", "{d}/no-bundle"]
    assert_refused(script, full, tmp_path, message, runner=run_in_process)
    assert not os.path.exists(marker), "the crafted pickle ran"


def test_resume_of_a_complete_run_is_nothing_to_do(pool, tmp_path):
    """--resume on a complete run exits 0 with "nothing to do" on stdout and touches nothing (not exit 2: ladder.sh
    re-submitted after a failure is expected to pass over finished runs)."""
    argv = [a.replace("{d}", str(tmp_path)) for a in tiny_run_argv(pool)]
    assert run_in_process("train.py", argv)[0] == 0
    before = snapshot(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert importlib.import_module("train").main(argv + ["--resume"]) == 0
    assert "nothing to do" in out.getvalue() and snapshot(tmp_path) == before


# --- state: disk full, resume cross-checks, pool hashes (classes 1, 6, 7) ---
# Class 1: a full disk stops every writer with one line (exit 2), cleans its temporary files and keeps what it had.
# The real case runs in one subprocess in a private mount namespace (root), on small tmpfs folders that fill up:
# train.py (a checkpoint that no longer fits next to the last one), core_eval.py (no room for eval.json) and
# data.py prepare (no room for the pool, which then gets more room and resumes).
WRITERS_FULL_DISK_DRIVER = """
import contextlib, importlib, io, json, subprocess, sys
sys.path.insert(0, sys.argv[1])
results = []
for step in json.loads(sys.argv[2]):
    if step[0] == "grow":  # more room on a mount: what freeing space does
        subprocess.run(["mount", "-o", "remount,size=4m", step[1]], check=True)
        continue
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = importlib.import_module(step[0][:-3]).main(step[1])
        except BaseException as e:  # what escaped main(): a traceback in a real run
            code = f"raised {type(e).__name__}: {e}"
    results.append(dict(code=code, stdout=out.getvalue(), stderr=err.getvalue()))
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def full_disks(pool, checkpoint, tmp_path_factory):
    """Run the three writers on full tmpfs mounts -> (results per call, the mounts' files copied to `kept`)."""
    d = tmp_path_factory.mktemp("full")
    mounts = {name: d / "mnt" / name for name in ("train", "eval", "pool")}
    for m in mounts.values():
        m.mkdir(parents=True)
    if not private_tmpfs_mounts():
        pytest.skip("no private mount namespace here (needs root and unshare -m): the real full-disk case cannot run")
    for rel, content in bundle_files().items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(content)
    run = [a.replace("{d}/pool", pool).replace("{d}/runs", str(mounts["train"])) for a in RUN]
    prep = [*PREP[:-4], "--train-tokens", "300000", "--val-tokens", "20000", "--workers", "1"]
    steps = [("train.py", [*run, "--save-every", "1"]),
             ("core_eval.py", ["--checkpoint", checkpoint, "--bundle-dir", str(d / "b"), "--seeds", "0",
                               "--out", str(mounts["eval"] / "eval.json")]),
             ("data.py", [*prep, "--out", str(mounts["pool"] / "p")]), ("grow", str(mounts["pool"])),
             ("data.py", [*prep, "--out", str(mounts["pool"] / "p")])]
    # 900k: one tiny checkpoint (~580 KB) fits, a second one next to it does not
    script = (f"mount -t tmpfs -o size=900k tmpfs {mounts['train']} && mount -t tmpfs -o size=64k tmpfs "
              f"{mounts['eval']} && mount -t tmpfs -o size=128k tmpfs {mounts['pool']} && "
              f"(head -c 1M /dev/zero > {mounts['eval']}/filler 2>/dev/null; true) && "
              f"{sys.executable} -c '{WRITERS_FULL_DISK_DRIVER}' {ROOT} '{json.dumps(steps)}'; code=$?; "
              f"cp -a {d / 'mnt'}/. {d / 'kept'}/; exit $code")
    (d / "kept").mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1]), d / "kept"


def one_line_refusal(result, *phrases):
    """Exit 2 and one error line, the last on stderr (core_eval's progress lines may come before it)."""
    lines = result["stderr"].splitlines()
    errors = [line for line in lines if "error" in line.lower() or "Traceback" in line]
    assert result["code"] == 2 and errors == lines[-1:], result
    for phrase in phrases:
        assert phrase in lines[-1], lines[-1]
    return lines[-1]


def leftovers(folder):
    return sorted(os.path.relpath(os.path.join(base, n), folder) for base, dirs, names in os.walk(folder)
                  for n in dirs + names if ".tmp" in n)


def test_class1_train_disk_full_on_a_real_filesystem(full_disks):
    """torch.save's RuntimeError on a full disk was a traceback; result.json stayed "running", latest.tmp stayed."""
    (failed, *_), kept = full_disks
    one_line_refusal(failed, "at step 2: No space left on device", "checkpoints/latest is kept", "--resume")
    import checkpoint
    run_dir = kept / "train" / "r"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and "No space left on device" in result["error"]
    assert leftovers(run_dir) == []
    checkpoint.verify_checkpoint(str(run_dir / "checkpoints" / "latest"))  # complete: the step-1 checkpoint
    assert json.loads((run_dir / "checkpoints" / "latest" / "meta.json").read_text())["step"] == 1


def test_class1_train_disk_full_marks_the_result_failed(pool_copy, tmp_path, monkeypatch):
    """A trajectory line that cannot be written (ENOSPC injected at step 2) stops with one line; result.json says
    failed and the checkpoint of step 1 is kept."""
    import errno
    import data
    import watch
    write = watch.Progress.write

    def full_at_step_2(progress, *rest, **kw):
        if progress.state.step == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(progress, *rest, **kw)
    monkeypatch.setattr(watch.Progress, "write", full_at_step_2)
    data.check_pool_hashes(str(pool_copy))  # the copy's hashes recorded: a run then leaves the pool as it is
    line = assert_refused("train.py", [*RUN, "--save-every", "1"], tmp_path, "No space left on device",
                          runner=run_in_process)
    assert "step 2" in line and "--resume" in line
    result = json.loads((tmp_path / "runs" / "r" / "result.json").read_text())
    assert result["status"] == "failed" and "No space left on device" in result["error"]
    assert json.loads((tmp_path / "runs" / "r" / "checkpoints" / "latest" / "meta.json").read_text())["step"] == 1


def test_class1_core_eval_disk_full_keeps_the_results(full_disks):
    """A finished evaluation whose eval.json did not fit was lost in a traceback."""
    (_, evaluation, _, _), kept = full_disks
    line = one_line_refusal(evaluation, "No space left on device", "eval.json")
    saved = line.split("saved in ")[1].split()[0].rstrip(";,")
    results = json.load(open(saved))
    os.remove(saved)
    assert "core_metric" in results and results["checkpoint"].endswith("final.pt")
    assert not (kept / "eval" / "eval.json").exists() and leftovers(kept / "eval") == []


def test_class1_prepare_disk_full_then_resumes(full_disks):
    """data.py prepare on a full disk was a traceback; now one line, and the same command resumes with more room."""
    (_, _, failed, resumed), kept = full_disks
    one_line_refusal(failed, "No space left on device", "re-run the same command")
    assert resumed["code"] == 0, resumed
    assert leftovers(kept / "pool") == []
    import data
    for split in data.SPLITS:
        data.load_pool(str(kept / "pool" / "p"), split, verify_hash=True)


# Class 6: what a checkpoint says about itself is cross-checked (meta.json vs its weights record vs the plan vs the
# tokenizer).
def rewrite_weights(latest, **changes):
    path = os.path.join(latest, "meta.json")
    meta = json.load(open(path))
    meta["weights"].update(changes)
    with open(path, "w") as f:
        json.dump(meta, f)
    rehash(latest)


CLASS6_RESUME_CASES = [
    # meta.json's step 1 against the weights' step 2: resumed at step 1 with the weights of step 2, exit 0
    ("meta-step-disagrees-with-weights", lambda latest: edit_meta(latest, step=1),
     "meta.json says step 1 but the weights record holds step 2"),
    # the weights recorded another tokenizer than the plan's: resumed silently
    ("weights-tokenizer-disagrees-with-plan", lambda latest: rewrite_weights(latest, tokenizer="gpt2"),
     "the weights record was written for tokenizer 'gpt2' but the plan uses 'bytes'"),
    # a damaged (rehashed) DCP shard: DCP's CheckpointException (a BaseException) escaped as a traceback
    ("dcp-shard-damaged", lambda latest: (truncate(os.path.join(latest, "optimizer", "__0_0.distcp")),
                                          rehash(latest)),
     "is not usable: its shards do not load"),
]


@pytest.mark.parametrize("mutate, message", [c[1:] for c in CLASS6_RESUME_CASES],
                         ids=[c[0] for c in CLASS6_RESUME_CASES])
def test_class6_resume_cross_checks(pool, stopped_run, tmp_path, mutate, message):
    run_dir = os.path.join(tmp_path, "runs", "r")
    shutil.copytree(stopped_run, run_dir)
    mutate(os.path.join(run_dir, "checkpoints", "latest"))
    assert_refused("train.py", tiny_run_argv(pool, "--resume"), tmp_path, message, runner=run_in_process)


def test_class6_core_eval_vocabulary_disagrees_with_tokenizer(tmp_path, checkpoint):
    """A checkpoint of vocabulary 200 recorded with the byte tokenizer (257 ids): an IndexError inside the first
    task's forward before; now refused before the bundle is read."""
    import dataclasses
    import model
    cfg = model.config_for("vanilla", 1, width_per_depth=16, head_dim=16, seq_len=64, vocab_size=200)
    torch.save(dict(model_config=dataclasses.asdict(cfg), model=model.GPT(cfg).state_dict(), passes=1,
                    tokenizer="bytes", step=0), tmp_path / "final.pt")
    assert_refused("core_eval.py", [a.replace("{ckpt}", str(tmp_path / "final.pt")) for a in EVAL], tmp_path,
                   "has a vocabulary of 200 token ids but its tokenizer 'bytes' has 257", bundle_files(),
                   runner=run_in_process)


# Class 7: train.py checks the pool's recorded sha256 at start (hashed once, then recorded in the pool).
def test_class7_train_refuses_a_pool_corrupted_within_the_vocabulary(tmp_path, pool_copy):
    """Token 65 written over a byte token: in range, so the id check passes and the run trained on it before."""
    with open(pool_copy / "train.bin", "r+b") as f:
        f.seek(20)
        old = f.read(2)
        f.seek(20)
        f.write(bytes([(old[0] + 1) % 256, 0]))
    line = assert_refused("train.py", RUN, tmp_path, "train.bin does not match its sha256", runner=run_in_process)
    assert "--no-verify" in line
    assert not (tmp_path / "runs" / "r" / "result.json").exists()
    code, _ = run_in_process("train.py", [a.replace("{d}", str(tmp_path)) for a in [*RUN, "--stop-after", "1",
                                                                                  "--no-verify"]])
    assert code == 0


def test_class7_verified_pool_is_hashed_once_and_again_when_rewritten(tmp_path, pool_copy, monkeypatch):
    import data
    data.check_pool_hashes(str(pool_copy))  # hashes both splits and records them
    hashed = []
    monkeypatch.setattr(data, "sha256_file", lambda path: hashed.append(path) or "0" * 64)
    data.check_pool_hashes(str(pool_copy))
    assert hashed == []  # recorded: not hashed again
    stat = os.stat(pool_copy / "val.bin")
    with open(pool_copy / "val.bin", "r+b") as f:
        f.write(b"A\x00")
    os.utime(pool_copy / "val.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime
    with pytest.raises(data.DataError, match="val.bin does not match its sha256"):
        data.check_pool_hashes(str(pool_copy))


def test_issue31_class3_a_fifo_named_verified_json_does_not_block(tmp_path, pool_copy):
    """Records are opened only when they are regular files: open() of a FIFO waits forever for a writer."""
    (pool_copy / "verified.json").unlink(missing_ok=True)  # the shared pool may have been verified already
    os.mkfifo(pool_copy / "verified.json")
    code = f"import sys; sys.path.insert(0, {ROOT!r}); import data; data.check_pool_hashes({str(pool_copy)!r})"
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("check_pool_hashes blocked on a FIFO named verified.json")
    assert result.returncode == 0, result.stderr
    assert os.path.isfile(pool_copy / "verified.json")  # replaced by the record of the files it hashed


def test_issue31_class3_no_verify_is_recorded_and_the_sha256_not_presented_as_checked(tmp_path, pool_copy):
    """--no-verify on a pool corrupted within the vocabulary: result.json said nothing of the skipped check and
    carried corpus.json's sha256 as the pool's, as a verified run does."""
    with open(pool_copy / "train.bin", "r+b") as f:
        f.seek(20)
        old = f.read(2)
        f.seek(20)
        f.write(bytes([(old[0] + 1) % 256, 0]))
    argv = [a.replace("{d}", str(tmp_path)) for a in [*RUN, "--stop-after", "1"]]
    assert run_in_process("train.py", [*argv, "--no-verify"])[0] == 0
    result = json.loads((tmp_path / "runs" / "r" / "result.json").read_text())
    assert result["data_check"] == "skipped (--no-verify)"
    assert [s["sha256_checked"] for s in result["data_manifest"]["splits"].values()] == [False, False]


def test_issue31_class3_a_verified_start_says_so(tmp_path, pool_copy):
    argv = [a.replace("{d}", str(tmp_path)) for a in [*RUN, "--stop-after", "1"]]
    assert run_in_process("train.py", argv)[0] == 0
    result = json.loads((tmp_path / "runs" / "r" / "result.json").read_text())
    assert result["data_check"] == "verified"
    assert [s["sha256_checked"] for s in result["data_manifest"]["splits"].values()] == [True, True]


# Issue 31, class 2: what a run folder says about itself is checked against its declared schema (checkpoint.py's
# META_SCHEMA, RESULT_SCHEMA, TRAJECTORY_LINE) before use; valid JSON of the wrong shape, its manifest rehashed to
# match, reached an AttributeError, a ZeroDivisionError, a TypeError in write_result, or a "complete" result.json
# with NaN FLOPs.
def write_meta(latest, meta):
    with open(os.path.join(latest, "meta.json"), "w") as f:
        json.dump(meta, f)
    rehash(latest)


def write_run_file(run_dir, name, text):
    with open(os.path.join(run_dir, name), "w") as f:
        f.write(text)


def edit_trajectory_line(run_dir, index, **changes):
    path = os.path.join(run_dir, "trajectory.jsonl")
    lines = open(path).read().splitlines()
    lines[index] = json.dumps(dict(json.loads(lines[index]), **changes))
    write_run_file(run_dir, "trajectory.jsonl", "\n".join(lines) + "\n")


CLASS2_CASES = [  # (id, mutation of the copied run dir, flags after the run's own, message)
    ("meta-a-list", lambda r: write_meta(f"{r}/checkpoints/latest", [1, 2]), RESUME,
     "checkpoints/latest/meta.json must be an object, got a list of 2"),
    ("meta-micro-batch-a-string", lambda r: edit_meta(f"{r}/checkpoints/latest", micro_batches="8"), RESUME,
     'meta.json: field micro_batches must be a list, got "8"'),
    ("meta-micro-batch-zero", lambda r: edit_meta(f"{r}/checkpoints/latest", micro_batches=[0]), RESUME,
     "meta.json: field micro_batches[0] must be a whole number >= 1, got 0"),
    ("meta-growth-on-vanilla", lambda r: edit_meta(f"{r}/checkpoints/latest", growth_events=[
        dict(step=1, passes_from=1, passes_to=2)]), RESUME,  # was: all steps trained, then an IndexError, "running"
     "is inconsistent: it records growth at steps [1] but by step 2 the plan grows at no step"),
    ("meta-evals-a-string", lambda r: edit_meta(f"{r}/checkpoints/latest", evals="none"), RESUME,
     'meta.json: field evals must be a list, got "none"'),
    ("meta-negative-tokens", lambda r: edit_meta(f"{r}/checkpoints/latest", tokens=-512), RESUME,
     "meta.json: field tokens must be a whole number >= 0, got -512"),
    ("meta-flops-text", lambda r: edit_meta(f"{r}/checkpoints/latest", flops="1e9"), RESUME,
     'meta.json: field flops must be a finite number >= 0, got "1e9"'),
    ("meta-eval-loss-missing", lambda r: edit_meta(f"{r}/checkpoints/latest", evals=[dict(step=0)]), RESUME,
     "meta.json: field evals[0].val_loss is missing"),
    ("result-a-list", lambda r: write_run_file(r, "result.json", "[]"), RESUME, "result.json must be an object"),
    ("result-status-a-number", lambda r: write_run_file(r, "result.json", '{"status": 3}'), RESUME,
     "result.json: field status must be text, got 3"),
    ("trajectory-step-text", lambda r: edit_trajectory_line(r, 1, step="2"), RESUME,
     'trajectory.jsonl:2: field step must be a whole number >= 1, got "2"'),
    ("trajectory-loss-text", lambda r: edit_trajectory_line(r, 0, loss="low"), RESUME,
     'trajectory.jsonl:1: field loss must be a number (nan allowed), got "low"'),
    ("trajectory-a-list-line", lambda r: write_run_file(r, "trajectory.jsonl", "[1]\n[2]\n"), RESUME,
     "trajectory.jsonl:1 must be an object, got a list of 1"),
]


@pytest.mark.parametrize("mutate, extra, message", [c[1:] for c in CLASS2_CASES], ids=[c[0] for c in CLASS2_CASES])
def test_issue31_class2_run_records_checked_against_their_schema(pool, stopped_run, tmp_path, mutate, extra, message):
    run_dir = os.path.join(tmp_path, "runs", "r")
    shutil.copytree(stopped_run, run_dir)
    mutate(run_dir)
    assert_refused("train.py", tiny_run_argv(pool, *extra), tmp_path, message, runner=run_in_process)


def test_issue31_class2_trajectory_lines_may_carry_more_fields(pool, stopped_run, tmp_path):
    # fields no schema declares pass; documented ones (common.TRAJECTORY_LINE) only with their type
    run_dir = os.path.join(tmp_path, "runs", "r")
    shutil.copytree(stopped_run, run_dir)
    edit_trajectory_line(run_dir, 0, tokens=256, stage=0, scalars=dict(x=1), loss=None, note="a")
    argv = [a.replace("{d}", str(tmp_path)) for a in tiny_run_argv(pool, "--resume")]
    assert run_in_process("train.py", argv)[0] == 0


# A complete run was never compared with the command (ladder.sh then skipped a mislabelled run forever: "already
# complete; nothing to do", exit 0), and --resume with another --data-dir continued on another corpus.
@pytest.fixture(scope="module")
def complete_run(pool, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("complete"))
    assert run_in_process("train.py", [a.replace("{d}", d) for a in tiny_run_argv(pool)])[0] == 0
    return os.path.join(d, "runs", "r")


@pytest.fixture(scope="module")
def other_pool(tmp_path_factory):
    import data
    out = str(tmp_path_factory.mktemp("other_pool"))
    data.prepare("stdlib", out, tokenizer="bytes", train_tokens=50_000, val_tokens=5_000)
    return out


RECORDED_CASES = [  # (id, the run copied, flags after the run's own, message)
    ("complete-run-of-another-arch", "complete", ["--resume-or-start", "--arch", "untied_grow", "--depth", "3",
                                                  "--crossover-fractions", "0.5"],
     "runs/r holds another run than this command plans: arch 'vanilla' there, 'untied_grow' here"),
    ("complete-run-with-another-seed", "complete", ["--resume", "--seed", "7"], "seed 42 there, 7 here"),
    ("resume-with-another-lr", "stopped", ["--resume", "--matrix-lr", "0.05"],
     "checkpoints/latest holds another run than this command plans: matrix_lr"),
    ("resume-on-another-pool", "stopped", ["--resume", "--data-dir", "OTHER"], "was trained on the pool"),
    ("complete-run-on-another-pool", "complete", ["--resume-or-start", "--data-dir", "OTHER"],
     "was trained on the pool"),
]


@pytest.mark.parametrize("which, extra, message", [c[1:] for c in RECORDED_CASES], ids=[c[0] for c in RECORDED_CASES])
def test_train_compares_a_recorded_run_with_the_command(pool, complete_run, stopped_run, other_pool, tmp_path, which,
                                                        extra, message):
    shutil.copytree(complete_run if which == "complete" else stopped_run, tmp_path / "runs" / "r")
    line = assert_refused("train.py", tiny_run_argv(pool) + [other_pool if a == "OTHER" else a for a in extra],
                          tmp_path, message, runner=run_in_process)
    if "OTHER" in extra:
        assert repr(pool) in line and other_pool in line  # both pools named


@pytest.mark.parametrize("signum, code, resume", [(signal.SIGINT, 130, "--resume"),
                                                  (signal.SIGTERM, 143, "--resume-or-start")])
def test_train_signal_stops_with_one_line_and_an_interrupted_result(pool, tmp_path, signum, code, resume):
    """SIGINT was a KeyboardInterrupt traceback; after SIGINT or SIGTERM result.json still said "running"."""
    argv = [a.replace("{d}", str(tmp_path)) for a in tiny_run_argv(pool, "--save-every", "5")]
    argv[argv.index("--steps") + 1] = "1000"
    run_dir = tmp_path / "runs" / "r"
    proc = subprocess.Popen([sys.executable, "train.py", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    deadline = time.time() + 120
    while not (run_dir / "checkpoints" / "latest").is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signum)
    stderr = proc.communicate(timeout=120)[1]
    name = signal.Signals(signum).name
    assert proc.returncode == code and len(stderr.splitlines()) == 1, stderr
    assert f"train.py: stopped by {name} at step" in stderr and "--resume continues" in stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "interrupted" and result["error"].startswith(f"stopped by {name} at step")
    step = json.loads((run_dir / "checkpoints" / "latest" / "meta.json").read_text())["step"]
    assert run_in_process("train.py", argv + [resume, "--stop-after", str(step + 2)]) == (0, "")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "stopped" and result["completed_steps"] == step + 2


def test_train_resume_refuses_checkpoints_final_that_is_a_file(pool, stopped_run, tmp_path):
    """It trained to the end, then failed naming checkpoints/latest."""
    shutil.copytree(stopped_run, tmp_path / "runs" / "r")
    line = assert_refused("train.py", tiny_run_argv(pool, "--resume"), tmp_path, "is a file, not a checkpoint folder",
                          {"runs/r/checkpoints/final": "not a checkpoint"}, runner=run_in_process)
    assert "runs/r/checkpoints/final" in line
