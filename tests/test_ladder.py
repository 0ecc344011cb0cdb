"""ladder.sh: dry-run listings of the paper's ladders, one tiny CPU ladder stopped, killed, resumed and re-run, the
SLURM launch, signals. Bad input to ladder.sh is in tests/test_bad_inputs.py."""
import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import arms
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_DEPTHS = {"vanilla": range(6, 21, 2), "operator_1": range(6, 21, 2)}
TINY = ["--width-per-depth", "4", "--head-dim", "4", "--seq-len", "32", "--total-batch-tokens", "256",
        "--val-tokens", "1024", "--no-compile"]


def ladder(*argv, env=None, **kwargs):
    return subprocess.run(["bash", "ladder.sh", *argv], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), **kwargs)


def launched(stdout):
    return [line for line in stdout.splitlines() if line.startswith("torchrun")]


def fake_bin(tmp_path, **scripts):
    """PATH with bash stand-ins (srun, scontrol, torchrun) whose bodies are given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_paper_dry_run_lists_58_runs_with_the_release_depths():
    r = ladder("all", "--dry-run")
    assert r.returncode == 0, r.stderr
    found = {}
    for line in launched(r.stdout):
        arch, depth = re.search(r"--arch (\w+) --depth (\d+)", line).groups()
        found.setdefault(arch, []).append(int(depth))
        assert "--nproc_per_node 8" in line
    assert len(found) == 8 and sum(map(len, found.values())) == 58
    for arch, depths in found.items():
        assert depths == list(PAPER_DEPTHS.get(arch, range(6, 19, 2))), arch
    summary = r.stdout.strip().splitlines()[-1]
    assert summary.startswith("58 runs |") and "GPU-hours" in summary
    total = float(re.search(r"\| ([0-9.e+]+) FLOPs", summary).group(1))
    with open(os.path.join(ROOT, "reference", "fineweb_ladders.csv")) as f:
        release = sum(float(row["compute_flops"]) for row in csv.DictReader(f))
    assert total == pytest.approx(release, rel=1e-3)  # printed with 4 significant figures


def test_data_constrained_and_d26_dry_runs():
    r = ladder("operator_1", "--preset", "data-constrained", "--dry-run")
    assert r.returncode == 0, r.stderr
    runs = launched(r.stdout)
    assert len(runs) == 2 * (5 + 7 + 7 + 7 + 6 + 3 + 1)
    assert sum("--data-constrained tuned-wd" in line for line in runs) == len(runs) // 2
    assert any("--depth 12 --passes 12" in line for line in runs)
    r = ladder("untied_grow", "--preset", "d26", "--depth", "26", "--dry-run",  # its own depth: accepted
               env=dict(MASTER_ADDR="10.0.0.1", NODE_RANK="1", DATA_DIR="/data/my corpus", MFU="0.5"))
    assert r.returncode == 0, r.stderr
    (line,) = launched(r.stdout)
    assert "--nnodes 2" in line and "--node_rank 1" in line and "--master_addr 10.0.0.1" in line
    assert r"--depth 26" in line and r"--data-dir /data/my\ corpus --run-name" in line  # a path with a space
    (run,) = [line for line in r.stdout.splitlines() if line.startswith("run untied_grow_d26:")]
    assert re.search(r"micro-batch 2 \| [0-9.e+]+ FLOPs \| ~[0-9,.]+ GPU-hours at 50.0% MFU$", run), run
    assert "8 GPUs/node x 2 nodes" in r.stdout.splitlines()[-1]


def test_help_seed_replicates_and_demo_dry_runs(tmp_path):
    r = ladder("-h")
    assert r.returncode == 0 and r.stdout.startswith("usage: bash ladder.sh") and not r.stderr
    r = ladder("vanilla", "--preset", "cpu", "--depth", "1", "2", "3", "--seed", "0", "1", "2",
               "--replicate-depths", "2", "3", "--dry-run", "--", "--tpp", "3", "--verify")
    assert r.returncode == 0, r.stderr
    assert all(line.endswith(" --tpp 3 --verify") for line in launched(r.stdout))  # flags the ladder does not set
    names = [re.search(r"--run-name (\S+)", line).group(1) + " " + re.search(r"--seed (\d+)", line).group(1)
             for line in launched(r.stdout)]
    assert names == ["vanilla_d1_s0 0"] + [f"vanilla_d{d}_s{s} {s}" for d in (2, 3) for s in range(3)]
    r = ladder("demo", "--preset", "cpu", "--depth", "1", "2", "--dry-run",  # its own preset: accepted
               env=dict(RUNS_DIR=str(tmp_path), DATA_DIR=str(tmp_path / "d")))
    assert r.returncode == 0, r.stderr
    names = [re.search(r"--run-name (\S+) ", line).group(1) for line in launched(r.stdout)]
    assert names == [f"{arch}_d{d}" for arch in arms.DEMO_ARMS for d in (1, 2)]  # no --seed: no _sS suffix
    assert all("--seed" not in line for line in launched(r.stdout))
    runs = [line for line in r.stdout.splitlines() if line.startswith("run ")]  # the cpu preset's micro-batch
    assert len(runs) == 6 and all("micro-batch 16 |" in line for line in runs), runs
    assert r.stdout.strip().splitlines()[-1].startswith("6 runs |") and os.listdir(tmp_path) == []


def test_ladder_listing_comes_from_the_arms_table(monkeypatch, capsys):
    """ladder.sh launches what `train.py --ladder` prints, all of it from the arms table."""
    monkeypatch.setitem(arms.ARMS, "loop_2", dataclasses.replace(arms.ARMS["loop_2"], ladder_depths=(6, 30)))
    assert train.main(["--ladder", "loop_2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["loop_2_d6 --arch loop_2 --depth 6 --preset paper",
                                                    "loop_2_d30 --arch loop_2 --depth 30 --preset paper"]
    monkeypatch.setattr(train, "DATA_CONSTRAINED_LOOPS", {8: (5,)})  # the name train.py imported from arms.py
    assert train.main(["--ladder", "operator_1", "--preset", "data-constrained"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["dc_fixed-wd_d8_k5",
                                                                                  "dc_tuned-wd_d8_k5"]


def test_slurm_allocation_starts_one_ladder_per_node_with_its_rank_and_master(tmp_path):
    """In an sbatch allocation ladder.sh starts itself once per node (srun), rank and master from SLURM."""
    log = tmp_path / "calls.log"
    path = fake_bin(tmp_path,
                    scontrol=f'echo "scontrol $*" >> {log}\nprintf "gpu-a17\\ngpu-a18\\n"',
                    srun=f'echo "srun $*" >> {log}\nwhile [ "$1" != bash ]; do shift; done\n'
                         'for node in 0 1; do SLURM_STEP_ID=0 SLURM_NODEID=$node "$@" || exit 1; done',
                    torchrun=f'echo "torchrun $*" >> {log}\necho "done: fake run"')
    (tmp_path / "repo").symlink_to(ROOT)
    env = dict(os.environ, SLURM_JOB_NODELIST="gpu-a[17-18]", SLURM_NNODES="2", PATH=path, RUNS_DIR="runs",
               DATA_DIR="pool")
    env.pop("SLURM_STEP_ID", None)
    r = subprocess.run(["bash", "repo/ladder.sh", "untied_grow", "--preset", "d26"], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("srun --nodes 2 --ntasks-per-node 1 bash ") and calls[0].endswith(
        "ladder.sh untied_grow --preset d26")
    assert "scontrol show hostnames gpu-a[17-18]" in calls
    launches = [c for c in calls if c.startswith("torchrun")]
    assert len(launches) == 2
    for node, call in enumerate(launches):
        assert f"--nnodes 2 --node_rank {node} --master_addr gpu-a17" in call and "--depth 26" in call
        assert f"--data-dir {tmp_path}/pool --run-name untied_grow_d26 --runs-dir {tmp_path}/runs" in call
    assert (tmp_path / "runs" / "untied_grow_d26" / "train.log").exists()


FAKE_TORCHRUN = """# a torchrun that records its flight-recorder environment and its pid, then waits to be stopped
env | grep -E '^TORCH_(NCCL|FR)_' | sort > "$FAKE_DIR/env.txt"
echo $$ > "$FAKE_DIR/pid"
echo "step 1/10 | loss 5.5"
stop() {  # as the real one: its workers stopped, then exit 1
    kill $! 2>/dev/null; echo stopped > "$FAKE_DIR/stopped"; echo "train.py: stopped by SIGTERM at step 1" >&2; exit 1
}
trap stop TERM
sleep 120 & wait $!"""


def test_sigterm_stops_the_ladders_torchrun_which_had_the_flight_recorder_set(tmp_path):
    """SIGTERM reaches the ladder's torchrun, then exit 143; NCCL's flight recorder dumps into the run folder."""
    env = dict(os.environ, PATH=fake_bin(tmp_path, torchrun=FAKE_TORCHRUN), FAKE_DIR=str(tmp_path),
               RUNS_DIR=str(tmp_path / "runs"), TORCH_NCCL_TRACE_BUFFER_SIZE="500")
    proc = subprocess.Popen(["bash", "ladder.sh", "vanilla", "--preset", "cpu", "--depth", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (tmp_path / "pid").exists())
    time.sleep(0.3)  # the fake's trap is set
    child = int((tmp_path / "pid").read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert (tmp_path / "stopped").exists() and not os.path.exists(f"/proc/{child}")
    log = (tmp_path / "runs" / "vanilla_d1" / "train.log").read_text().splitlines()
    assert log == ["step 1/10 | loss 5.5", "train.py: stopped by SIGTERM at step 1"], log
    recorded = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines())
    trace = str(tmp_path / "runs" / "vanilla_d1" / "nccl_trace_rank_")
    expected = dict(TORCH_FR_BUFFER_SIZE="2000", TORCH_FR_DUMP_TEMP_FILE=trace, TORCH_NCCL_ASYNC_ERROR_HANDLING="1",
                    TORCH_NCCL_DEBUG_INFO_TEMP_FILE=trace, TORCH_NCCL_DUMP_ON_TIMEOUT="1",
                    TORCH_NCCL_TRACE_BUFFER_SIZE="500")
    assert {name: recorded.get(name) for name in expected} == expected


def test_missing_torchrun_is_one_line_exit_2(tmp_path):
    (tmp_path / "python").symlink_to(sys.executable)  # python without the torchrun next to it
    r = ladder("vanilla", "--preset", "cpu", env=dict(PATH=f"{tmp_path}:/usr/bin:/bin"))
    assert r.returncode == 2 and r.stderr.strip() == "ladder.sh: error: torchrun not found: pip install -r " \
                                                     "requirements.txt", r.stderr


# --- real training: one tiny ladder (d1, d2 of Vanilla, 32 steps each), stopped, killed, resumed, re-run ---
STEPS = 32


def tiny_ladder(pool):
    return ["vanilla", "--preset", "cpu", "--depth", "1", "2", "--", *TINY, "--steps", str(STEPS), "--save-every",
            "8", "--data-dir", pool]


def wait_for(condition, timeout=120):
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline:
        time.sleep(0.05)
    assert condition(), "timed out"


def start(runs_dir, pool):
    """The ladder as a terminal's foreground job: in its own session, so its process group is the test's to signal."""
    return subprocess.Popen(["bash", "ladder.sh", *tiny_ladder(pool)], cwd=ROOT,
                            env=dict(os.environ, RUNS_DIR=str(runs_dir)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def checkpointed(result_path, after=0):
    """result.json says the run is running with a checkpoint past step `after` (it is written after each save)."""
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return False
    return result["status"] == "running" and result["completed_steps"] > after


def kill_9(proc, runs_dir):
    """SIGKILL the ladder's group and every process whose command line names the runs folder (the test's own)."""
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(runs_dir).encode() in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    proc.wait()
    time.sleep(0.5)


def test_ladder_stopped_killed_resumed_and_rerun(pool, tmp_path):
    runs, d1, d2 = tmp_path, tmp_path / "vanilla_d1", tmp_path / "vanilla_d2"
    # Ctrl-C (SIGINT to the process group) while d2 trains: the ladder's one line, exit 130, d2 "stopped"
    proc = start(runs, pool)
    wait_for(lambda: checkpointed(d2 / "result.json"))
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1] == (f"ladder.sh: stopped by SIGINT during run vanilla_d2 (log: {d2}/"
                                            "train.log); run the same command again to continue")
    assert json.loads((d1 / "result.json").read_text())["status"] == "complete"
    result = json.loads((d2 / "result.json").read_text())
    assert result["status"] == "stopped" and result["reason"].startswith(("SIGINT at step", "SIGTERM at step")), result
    # the same command again: d1 skipped, d2 resumed; killed with -9 once it has checkpointed again
    stopped_at = result["completed_steps"]
    proc = start(runs, pool)
    wait_for(lambda: checkpointed(d2 / "result.json", after=stopped_at))
    kill_9(proc, runs)
    assert "skip vanilla_d1 (complete)" in proc.stdout.read()
    assert json.loads((d2 / "result.json").read_text())["status"] == "running"
    # and again: d2 resumed from its last checkpoint, ends with every step recorded once, then the ladder's report
    r = ladder(*tiny_ladder(pool), env=dict(RUNS_DIR=str(runs)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skip vanilla_d1 (complete)" in r.stdout and "run  vanilla_d2" in r.stdout
    resumed = [int(s) for s in re.findall(r"resuming .* from step (\d+)", (d2 / "train.log").read_text())]
    assert len(resumed) == 2 and stopped_at < resumed[1] < STEPS, resumed
    with open(d2 / "trajectory.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == list(range(1, STEPS + 1))
    assert json.loads((d2 / "result.json").read_text())["status"] == "complete"
    assert (d2 / "report.md").exists() and (d2 / "curves_cpu_steps.png").exists()
    report = (runs / "report.md").read_text()  # the ladder's: its runs, no fit from 2 depths, the curves
    assert f"report: {runs}/report.md" in r.stdout and "No fit: no arm has 3 complete depths" in report
    assert "[vanilla_d2](vanilla_d2/report.md)" in report and "![curves](curves/curves_cpu_steps.png)" in report
    # idempotent: a complete ladder run again launches nothing and rewrites no run
    stamp = os.path.getmtime(d2 / "result.json")
    again = ladder("vanilla", "--preset", "cpu", "--depth", "1", "2", env=dict(RUNS_DIR=str(runs)))
    assert again.returncode == 0 and again.stdout.count("skip vanilla_d") == 2 and "run  " not in again.stdout
    assert os.path.getmtime(d2 / "result.json") == stamp


def test_first_failing_run_stops_the_ladder_and_names_its_log(pool, tmp_path):
    r = ladder("vanilla", "--preset", "cpu", "--depth", "1", "2", "--", *TINY, "--total-batch-tokens", "100",
               "--data-dir", pool, env=dict(RUNS_DIR=str(tmp_path)))
    log = tmp_path / "vanilla_d1" / "train.log"
    assert r.returncode == 1 and f"run vanilla_d1 failed; see {log}" in r.stderr
    assert "not a multiple of the sequence length" in log.read_text()
    assert not (tmp_path / "vanilla_d2").exists()
