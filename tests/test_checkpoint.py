"""checkpoint.py and train.py's run folder: DCP step folders (the newest complete one wins; a crash's leftovers never
shadow or delete the intact checkpoint), core_eval's weights from a run, its checkpoints or one step folder, a kill -9
and a stop signal that both resume to the uninterrupted run's bits, the one-writer lock, and a new run that never
writes into another run's folder. Resuming on another world size: tests/test_parallel.py."""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch


import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(pool, runs, name, *extra):
    """A 16-step growth run (crossover at step 8), logged every step, a checkpoint every 4 steps."""
    return ["--arch", "untied_grow", "--depth", "2", "--preset", "cpu", "--width-per-depth", "4", "--head-dim", "4",
            "--seq-len", "32", "--total-batch-tokens", "256", "--val-tokens", "1024", "--data-dir", pool,
            "--runs-dir", str(runs), "--run-name", name, "--steps", "16", "--warmup-steps", "0",
            "--crossover-fractions", "0.5", "--save-every", "4", "--log-every", "1", *extra]


def losses(run_dir):
    return [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "trajectory.jsonl"))]


def weights(path):
    return train.load_checkpoint_model(str(path))[0].state_dict()


@pytest.fixture(scope="module")
def full(pool, tmp_path_factory):
    """The uninterrupted run every interrupted one must match bit for bit."""
    runs = tmp_path_factory.mktemp("runs")
    assert train.main(tiny(pool, runs, "full")) == 0
    return runs / "full"


def test_load_checkpoint_model_reads_a_run_its_checkpoints_or_one_step_folder(full, tmp_path):
    final = full / "checkpoints" / "final"
    assert [os.path.basename(f) for f in train.complete_checkpoints(str(full / "checkpoints"))] == \
        ["step_000012", "final"]  # KEEP = 2: older ones deleted once newer ones were complete
    net, record = train.load_checkpoint_model(str(full))
    assert record["step"] == 16 and net.active_passes == record["passes"] == 4
    reference = weights(final)
    for path in (full, full / "checkpoints"):
        assert all(torch.equal(reference[k], v) for k, v in weights(path).items())
    older = weights(full / "checkpoints" / "step_000012")
    assert any(not torch.equal(reference[k], v) for k, v in older.items())
    with pytest.raises(ValueError, match="holds no complete train.py checkpoint"):
        train.load_checkpoint_model(str(tmp_path))


def test_a_crash_leftover_never_shadows_or_deletes_the_intact_checkpoint(pool, full, tmp_path):
    """Issue 47, 6: a leftover latest.tmp whose record claimed a higher step made recovery delete the intact latest.
    Now a .tmp folder (even a complete-looking one claiming step 15) and a step folder without DCP's .metadata (a
    partial copy claiming step 14) are never read: the run resumes from step 8 to the uninterrupted run's bits, the
    .tmp leftover goes at the next save, and the partial folder is left alone (not ours to delete)."""
    assert train.main(tiny(pool, tmp_path, "cut", "--stop-after", "8")) == 0
    ckpt = tmp_path / "cut" / "checkpoints"
    intact = ckpt / "step_000008"
    for name, step in (("step_000015.tmp", 15), ("step_000014", 14)):
        shutil.copytree(intact, ckpt / name)
        meta = json.load(open(ckpt / name / "meta.json"))
        json.dump(dict(meta, step=step, weights=dict(meta["weights"], step=step)), open(ckpt / name / "meta.json", "w"))
    os.remove(ckpt / "step_000014" / ".metadata")
    assert train.checkpoint_folder(str(tmp_path / "cut")) == str(intact)
    assert train.main(tiny(pool, tmp_path, "cut", "--resume")) == 0
    assert losses(tmp_path / "cut") == losses(full)
    assert sorted(os.listdir(ckpt)) == ["final", "step_000012", "step_000014"]
    assert all(torch.equal(weights(full)[k], v) for k, v in weights(tmp_path / "cut").items())


def start(pool, runs, name):
    proc = subprocess.Popen([sys.executable, "train.py", *tiny(pool, runs, name)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))
    trajectory = os.path.join(runs, name, "trajectory.jsonl")
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline and \
            (not os.path.exists(trajectory) or sum(1 for _ in open(trajectory)) < 5):
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    return proc


def test_kill_9_resumes_to_the_uninterrupted_runs_bits(pool, full, tmp_path):
    proc = start(pool, tmp_path, "killed")
    proc.kill()
    proc.communicate()
    step = train.read_run_state(train.checkpoint_folder(str(tmp_path / "killed"))).step
    assert 4 <= step < 16 and json.load(open(tmp_path / "killed" / "result.json"))["status"] == "running"
    assert train.main(tiny(pool, tmp_path, "killed", "--resume")) == 0
    assert losses(tmp_path / "killed") == losses(full)
    assert all(torch.equal(weights(full)[k], v) for k, v in weights(tmp_path / "killed").items())


def test_a_stop_signal_saves_records_stopped_and_resumes_exactly(pool, full, tmp_path):
    """SIGTERM (scancel, torchrun stopping its workers): the loop stops at the next logged step after a checkpoint of
    it; result.json says stopped and why; exit 143; --resume continues to the uninterrupted run's bits."""
    proc = start(pool, tmp_path, "stopped")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    result = json.load(open(tmp_path / "stopped" / "result.json"))
    step = result["completed_steps"]
    assert result["status"] == "stopped" and result["reason"] == f"SIGTERM at step {step}" and step < 16
    assert train.checkpoint_folder(str(tmp_path / "stopped")).endswith(f"step_{step:06d}")
    assert f"stopped (SIGTERM at step {step}); continue with --resume" in err
    assert train.main(tiny(pool, tmp_path, "stopped", "--resume")) == 0
    assert losses(tmp_path / "stopped") == losses(full)


def test_one_writer_per_run_the_second_is_told_who_writes(pool, tmp_path, capsys):
    os.makedirs(tmp_path / "r")
    with open(tmp_path / "r" / "train.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("PID 4242 on elsewhere\n")
        held.flush()
        assert train.main(tiny(pool, tmp_path, "r")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is being written by another train.py (PID 4242 on elsewhere)" in err
    assert os.listdir(tmp_path / "r") == ["train.lock"]


def test_a_new_run_never_writes_into_another_runs_folder(pool, tmp_path, capsys):
    os.makedirs(tmp_path / "r")
    (tmp_path / "r" / "notes.txt").write_text("someone's")
    assert train.main(tiny(pool, tmp_path, "r")) == 2
    assert "already holds files (notes.txt, ...); pass --resume" in capsys.readouterr().err
    assert train.main(tiny(pool, tmp_path, "r", "--resume")) == 2
    assert "has no complete checkpoint to resume from" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "r")) == ["notes.txt", "train.lock"]
