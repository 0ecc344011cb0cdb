"""Bad state a person hands train.py and ladder.sh: a pool whose bytes do not match its sha256, a run being trained
by another process (ladder.sh's locks), a recorded run that another command would continue (another plan or pool)."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from refusals import ROOT, run_in_process, assert_refused, RUN
from test_train import tiny


def flip(pool, in_vocabulary):
    """One token of train.bin changed: in the byte vocabulary (only the sha256 sees it) or out of it (0xffff)."""
    with open(pool / "train.bin", "r+b") as f:
        f.seek(20)
        old = f.read(2)
        f.seek(20)
        f.write(bytes([(old[0] + 1) % 256, 0]) if in_vocabulary else b"\xff\xff")


def test_train_with_verify_refuses_a_pool_corrupted_within_the_vocabulary_and_result_json_records_the_check(
        tmp_path, pool_copy):
    flip(pool_copy, in_vocabulary=True)  # every token id still valid: only the hash tells
    assert_refused("train.py", [*RUN, "--verify"], tmp_path, "train.bin does not match its sha256",
                   runner=run_in_process)
    assert not (tmp_path / "runs" / "r" / "result.json").exists()
    argv = [a.replace("{d}", str(tmp_path)) for a in [*RUN, "--stop-after", "1"]]
    assert run_in_process("train.py", argv)[0] == 0
    result = json.loads((tmp_path / "runs" / "r" / "result.json").read_text())
    assert [s["sha256_checked"] for s in result["data_manifest"]["splits"].values()] == [False, False]


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


def test_two_identical_ladders_the_second_stops_and_writes_nothing(tmp_path):
    """The second of two identical ladders stops before it writes into the first's train.log."""
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


def tiny_run_argv(pool, *extra):
    return tiny(pool, "{d}/runs", "vanilla", "--run-name", "r", *extra, steps=4)


@pytest.fixture(scope="module")
def stopped_run(pool, tmp_path_factory):
    """A run stopped after step 2: its checkpoint is checkpoints/step_000002."""
    d = str(tmp_path_factory.mktemp("stopped"))
    argv = [a.replace("{d}", d) for a in tiny_run_argv(pool, "--stop-after", "2", "--verify")]
    assert run_in_process("train.py", argv)[0] == 0
    return os.path.join(d, "runs", "r")


def test_a_verified_start_says_so(stopped_run):
    result = json.loads(open(os.path.join(stopped_run, "result.json")).read())
    assert [s["sha256_checked"] for s in result["data_manifest"]["splits"].values()] == [True, True]


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
    data.prepare("stdlib", out, tokenizer="bytes", train_tokens=50_000, val_tokens=5_000, workers=1)
    return out


RECORDED_CASES = [  # (id, the run copied, flags after the run's own, message)
    ("complete-run-of-another-arch", "complete", ["--resume-or-start", "--arch", "untied_grow", "--depth", "3",
                                                  "--crossover-fractions", "0.5"],
     "runs/r holds another run than this command plans: arch 'vanilla' there, 'untied_grow' here"),
    ("complete-run-with-another-seed", "complete", ["--resume", "--seed", "7"], "seed 42 there, 7 here"),
    ("resume-with-another-lr", "stopped", ["--resume", "--matrix-lr", "0.05"],
     "checkpoints/step_000002 holds another run than this command plans: matrix_lr"),
    ("resume-on-another-pool", "stopped", ["--resume", "--data-dir", "OTHER"], "was trained on the pool"),
]


@pytest.mark.parametrize("which, extra, message", [c[1:] for c in RECORDED_CASES], ids=[c[0] for c in RECORDED_CASES])
def test_train_compares_a_recorded_run_with_the_command(pool, complete_run, stopped_run, other_pool, tmp_path, which,
                                                        extra, message):
    shutil.copytree(complete_run if which == "complete" else stopped_run, tmp_path / "runs" / "r")
    line = assert_refused("train.py", tiny_run_argv(pool) + [other_pool if a == "OTHER" else a for a in extra],
                          tmp_path, message, runner=run_in_process)
    if "OTHER" in extra:
        assert repr(pool) in line and other_pool in line  # both pools named
