"""ladder.sh: dry-run listings of the paper's ladders, idempotent CPU ladders, resume after a kill, bad input."""
import csv
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import arms
import plan as plan_lib
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_DEPTHS = {"vanilla": range(6, 21, 2), "operator_1": range(6, 21, 2)}


def ladder(*argv, env=None, **kwargs):
    return subprocess.run(["bash", "ladder.sh", *argv], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), **kwargs)


def launched(stdout):
    return [line for line in stdout.splitlines() if line.startswith("torchrun")]


def test_paper_dry_run_lists_58_runs_with_the_release_depths():
    r = ladder("all", "--dry-run")
    assert r.returncode == 0, r.stderr
    runs = launched(r.stdout)
    assert len(runs) == 58
    found = {}
    for line in runs:
        arch, depth = re.search(r"--arch (\w+) --depth (\d+)", line).groups()
        found.setdefault(arch, []).append(int(depth))
        assert "--nproc_per_node 8" in line
    assert len(found) == 8
    for arch, depths in found.items():
        assert depths == list(PAPER_DEPTHS.get(arch, range(6, 19, 2))), arch
    summary = r.stdout.strip().splitlines()[-1]
    assert summary.startswith("58 runs |") and "FLOPs" in summary and "GPU-hours" in summary
    total = float(re.search(r"\| ([0-9.e+]+) FLOPs", summary).group(1))
    release = sum(float(row["compute_flops"]) for row in csv.DictReader(open(os.path.join(ROOT, "reference",
                                                                                           "fineweb_ladders.csv"))))
    assert total == pytest.approx(release, rel=1e-3)  # printed with 4 significant figures


def test_data_constrained_and_d26_dry_runs():
    r = ladder("operator_1", "--preset", "data-constrained", "--dry-run")
    assert r.returncode == 0, r.stderr
    runs = launched(r.stdout)
    assert len(runs) == 2 * (5 + 7 + 7 + 7 + 6 + 3 + 1)
    assert sum("--data-constrained tuned-wd" in line for line in runs) == len(runs) // 2
    assert any("--depth 12 --passes 12" in line for line in runs)
    r = ladder("untied_grow", "--preset", "d26", "--dry-run", env=dict(MASTER_ADDR="10.0.0.1", NODE_RANK="1"))
    assert r.returncode == 0, r.stderr
    (line,) = launched(r.stdout)
    assert "--nnodes 2" in line and "--node_rank 1" in line and "--master_addr 10.0.0.1" in line
    assert "--depth 26" in line and "fineweb_edu" in line
    (run,) = [line for line in r.stdout.splitlines() if line.startswith("run untied_grow_d26:")]
    assert re.search(r"micro-batch 2 \| [0-9.e+]+ FLOPs \| ~[0-9,.]+ GPU-hours at [0-9.]+% MFU$", run), run
    assert "8 GPUs/node x 2 nodes" in r.stdout.splitlines()[-1]
    assert "an estimate at the MFU the release measured per width" in r.stdout.splitlines()[-1]


@pytest.mark.parametrize("argv, message", [
    (["nope", "--dry-run"], "unknown arch"),
    (["vanilla", "--preset", "huge", "--dry-run"], "unknown preset"),
    (["vanilla", "--depth", "6", "x", "--dry-run"], "argument --depth: must be a whole number in [1, 1024], got 'x'"),
    (["vanilla", "--depths", "6", "--dry-run"], "unknown option '--depths'"),
    (["vanilla", "--depth", "6", "6", "--dry-run"], "--depth names 6 twice"),
    (["vanilla", "--preset", "d26", "--dry-run"], "Untied-Grow only"),
])
def test_bad_input_is_one_line_exit_2(argv, message):
    r = ladder(*argv)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ladder.sh: error: "), r.stderr  # arms.py's checks too


def test_missing_torchrun_is_one_line_exit_2(tmp_path):
    (tmp_path / "python").symlink_to(sys.executable)  # python without the torchrun next to it
    r = ladder("vanilla", "--preset", "cpu", env=dict(PATH=f"{tmp_path}:/usr/bin:/bin"))
    assert r.returncode == 2 and "torchrun not found" in r.stderr, r.stderr


TINY = ["--width-per-depth", "16", "--head-dim", "16", "--seq-len", "32", "--total-batch-tokens", "256",
        "--val-tokens", "1024"]


def test_cpu_ladder_is_idempotent(pool, tmp_path):
    env = dict(RUNS_DIR=str(tmp_path), DATA_DIR=pool)
    first = ladder("vanilla", "--preset", "cpu", "--depth", "1", "2", "--", *TINY, "--steps", "4", "--data-dir", pool,
                   env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("run  vanilla_d") == 2
    for d in (1, 2):
        assert json.load(open(tmp_path / f"vanilla_d{d}" / "result.json"))["status"] == "complete"
        assert (tmp_path / f"vanilla_d{d}" / "report.md").exists() and (tmp_path / f"vanilla_d{d}" / "curves.png").exists()
    report = (tmp_path / "report.md").read_text()  # the ladder's: its runs, no fit from 2 depths, the curves
    assert f"report: {tmp_path}/report.md" in first.stdout and "No fit: no arm has 3 complete depths" in report
    assert "[report.md](vanilla_d2/report.md)" in report and "![curves](curves/curves_cpu_steps.png)" in report
    stamp = os.path.getmtime(tmp_path / "vanilla_d2" / "result.json")
    again = ladder("vanilla", "--preset", "cpu", "--depth", "1", "2", "--", *TINY, "--steps", "4", "--data-dir", pool,
                   env=env)
    assert again.returncode == 0 and again.stdout.count("skip vanilla_d") == 2 and "run  " not in again.stdout
    assert os.path.getmtime(tmp_path / "vanilla_d2" / "result.json") == stamp


def test_first_failing_run_stops_the_ladder(pool, tmp_path):
    r = ladder("vanilla", "--preset", "cpu", "--depth", "1", "2", "--", *TINY, "--total-batch-tokens", "100",
               "--data-dir", pool, env=dict(RUNS_DIR=str(tmp_path)))
    log = tmp_path / "vanilla_d1" / "train.log"
    assert r.returncode == 1 and f"run vanilla_d1 failed; see {log}" in r.stderr
    assert "not a multiple of the sequence length" in log.read_text()
    assert not (tmp_path / "vanilla_d2").exists()


def test_killed_run_is_resumed_by_the_next_invocation(pool, tmp_path):
    env = dict(RUNS_DIR=str(tmp_path), DATA_DIR=pool)
    argv = ["operator_1", "--preset", "cpu", "--depth", "2", "--", *TINY, "--steps", "40", "--save-every", "2",
            "--data-dir", pool]
    proc = subprocess.Popen(["bash", "ladder.sh", *argv], cwd=ROOT, env=dict(os.environ, **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    import checkpoint as checkpoint_lib
    complete = lambda: checkpoint_lib.complete_checkpoints(str(tmp_path / "operator_1_d2" / "checkpoints"))
    deadline = time.time() + 120
    while not complete() and time.time() < deadline:
        time.sleep(0.2)
    assert complete(), "no checkpoint appeared"
    # a hard crash: SIGKILL the ladder and every process of this run (torchrun puts its workers in their own session)
    os.killpg(proc.pid, signal.SIGKILL)
    subprocess.run(["pkill", "-9", "-f", str(tmp_path)])
    proc.wait()
    time.sleep(0.5)
    result = json.load(open(tmp_path / "operator_1_d2" / "result.json"))
    assert result["status"] == "running"
    r = ladder(*argv, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    log = open(tmp_path / "operator_1_d2" / "train.log").read()
    resumed = int(re.search(r"resuming .* from step (\d+)", log).group(1))
    assert 2 <= resumed < 40
    trajectory = [json.loads(line) for line in open(tmp_path / "operator_1_d2" / "trajectory.jsonl")]
    assert [t["step"] for t in trajectory] == list(range(1, 41))
    assert json.load(open(tmp_path / "operator_1_d2" / "result.json"))["status"] == "complete"


FAKE_TORCHRUN = """#!/usr/bin/env bash
# a torchrun that records its flight-recorder environment and its pid, then waits to be stopped
env | grep -E '^TORCH_(NCCL|FR)_' | sort > "$FAKE_DIR/env.txt"
echo $$ > "$FAKE_DIR/pid"
echo "step 1/10 | loss 5.5"
stop() {  # as the real one: its workers stopped, then its SignalException's traceback on stderr
    kill $! 2>/dev/null; echo stopped > "$FAKE_DIR/stopped"; echo "train.py: stopped by SIGTERM at step 1" >&2
    printf 'Traceback (most recent call last):\n  File "torchrun", line 8, in <module>\n    sys.exit(main())\n' >&2
    echo "torch.distributed.elastic.multiprocessing.api.SignalException: Process $$ got signal: 15" >&2; exit 1
}
trap stop TERM
sleep 120 & wait $!
"""


def test_a_stopped_ladder_stops_its_torchrun_which_had_the_flight_recorder_set(tmp_path):
    """SIGTERM to ladder.sh reaches its torchrun, which it waits for; the launch sets NCCL's flight recorder to dump
    into the run folder (a user's own setting wins)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path),
               RUNS_DIR=str(tmp_path / "runs"), TORCH_NCCL_TRACE_BUFFER_SIZE="500")
    proc = subprocess.Popen(["bash", "ladder.sh", "vanilla", "--preset", "cpu", "--depth", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not (tmp_path / "pid").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)  # the fake's trap is set
    child = int((tmp_path / "pid").read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert (tmp_path / "stopped").exists() and not os.path.exists(f"/proc/{child}")
    log = (tmp_path / "runs" / "vanilla_d1" / "train.log").read_text().splitlines()
    assert log == ["step 1/10 | loss 5.5", "train.py: stopped by SIGTERM at step 1",
                   "torchrun: stopped by signal 15 (its SignalException traceback left out)"], log
    recorded = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines())
    trace = str(tmp_path / "runs" / "vanilla_d1" / "nccl_trace_rank_")
    expected = dict(TORCH_FR_BUFFER_SIZE="2000", TORCH_FR_DUMP_TEMP_FILE=trace, TORCH_NCCL_ASYNC_ERROR_HANDLING="1",
                    TORCH_NCCL_DEBUG_INFO_TEMP_FILE=trace, TORCH_NCCL_DUMP_ON_TIMEOUT="1",
                    TORCH_NCCL_TRACE_BUFFER_SIZE="500")
    assert {name: recorded.get(name) for name in expected} == expected


def test_help_is_usage_and_exit_0():
    r = ladder("-h")
    assert r.returncode == 0 and r.stdout.startswith("usage: bash ladder.sh") and not r.stderr


def test_data_dir_with_spaces_stays_one_argument():
    r = ladder("untied_grow", "--preset", "d26", "--dry-run", env=dict(DATA_DIR="/data/my corpus"))
    assert r.returncode == 0, r.stderr
    (line,) = launched(r.stdout)
    assert r"--data-dir /data/my\ corpus --run-name" in line


def fake_slurm_bin(tmp_path):
    """Stand-ins for srun, scontrol and torchrun that record their arguments (one line per call) in calls.log;
    the fake srun starts its command once per node with that node's SLURM_NODEID, as srun does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    scripts = {
        "scontrol": f'echo "scontrol $*" >> {log}\n[ "$1 $2" = "show hostnames" ] && printf "gpu-a17\\ngpu-a18\\n"',
        "srun": f'echo "srun $*" >> {log}\nwhile [ "$1" != bash ]; do shift; done\n'
                'for node in 0 1; do SLURM_STEP_ID=0 SLURM_NODEID=$node "$@" || exit 1; done',
        "torchrun": f'echo "torchrun $*" >> {log}\necho "done: fake run"',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir, log


SLURM_ENV = dict(SLURM_JOB_NODELIST="gpu-a[17-18]", SLURM_NNODES="2", SLURM_JOB_ID="4242")


def test_slurm_allocation_sets_node_rank_and_master_from_scontrol(tmp_path):
    bin_dir, log = fake_slurm_bin(tmp_path)
    env = dict(SLURM_ENV, SLURM_STEP_ID="0", SLURM_NODEID="1", PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = ladder("untied_grow", "--preset", "d26", "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    (line,) = launched(r.stdout)
    assert "--nnodes 2 --node_rank 1 --master_addr gpu-a17" in line
    assert "scontrol show hostnames gpu-a[17-18]" in log.read_text()


def test_sbatch_script_starts_one_ladder_per_node_through_srun(tmp_path):
    bin_dir, log = fake_slurm_bin(tmp_path)
    env = dict(SLURM_ENV, PATH=f"{bin_dir}:{os.environ['PATH']}", RUNS_DIR=str(tmp_path / "runs"))
    r = ladder("untied_grow", "--preset", "d26", env=env)  # as an sbatch script calls it: no srun step yet
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("srun --nodes 2 --ntasks-per-node 1 bash ") and calls[0].endswith(
        "ladder.sh untied_grow --preset d26")
    launches = [c for c in calls if c.startswith("torchrun")]
    assert len(launches) == 2
    for node, call in enumerate(launches):
        assert f"--nnodes 2 --node_rank {node} --master_addr gpu-a17" in call and "--depth 26" in call


def test_seed_replicates_dry_run_names_and_seeds():
    r = ladder("vanilla", "--preset", "cpu", "--depth", "1", "2", "3", "--seed", "0", "1", "2", "--replicate-depths", "2", "3",
               "--dry-run")
    assert r.returncode == 0, r.stderr
    names = [(re.search(r"--run-name (\S+)", line).group(1), re.search(r"--seed (\d+)", line).group(1))
             for line in launched(r.stdout)]
    assert names == [("vanilla_d1_s0", "0")] + [(f"vanilla_d{d}_s{s}", str(s)) for d in (2, 3) for s in range(3)]
    plain = launched(ladder("vanilla", "--preset", "cpu", "--depth", "1", "--dry-run").stdout)
    assert "--run-name vanilla_d1 " in plain[0] + " " and "--seed" not in plain[0]  # today's names without --seed


@pytest.mark.parametrize("argv, message", [
    (["vanilla", "--seed", "0", "-1", "--dry-run"], "unknown option '-1'"),
    (["vanilla", "--replicate-depths", "8", "--dry-run"], "--replicate-depths needs --seed"),
    (["vanilla", "--seed", "0", "1", "--replicate-depths", "8", "y", "--dry-run"], "argument --replicate-depths: must be a whole number"),
    (["vanilla", "--seed"], "--seed needs one or more values"),
])
def test_bad_seed_options_are_one_line_exit_2(argv, message):
    r = ladder(*argv)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_ladder_listing_comes_from_the_arms_table(monkeypatch, capsys):
    """ladder.sh launches what `python train.py --ladder` prints, one "NAME ARGS" line per run, all of it from the
    table: a changed ladder depth or loop grid shows up in the listing."""
    monkeypatch.setitem(arms.ARMS, "loop_2", dataclasses.replace(arms.ARMS["loop_2"], ladder_depths=(6, 30)))
    assert train.main(["--ladder", "loop_2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["loop_2_d6 --arch loop_2 --depth 6 --preset paper",
                                                    "loop_2_d30 --arch loop_2 --depth 30 --preset paper"]
    monkeypatch.setattr(train, "DATA_CONSTRAINED_LOOPS", {8: (5,)})  # the name train.py imported from arms.py
    assert train.main(["--ladder", "operator_1", "--preset", "data-constrained"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["dc_fixed-wd_d8_k5", "dc_tuned-wd_d8_k5"]
    assert train.main(["--ladder", "demo", "--preset", "cpu", "--depth", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{arch}_d2 --arch {arch} --depth 2 --preset cpu"
                                                    for arch in arms.DEMO_ARMS]
    assert train.main(["--ladder", "operator_1", "--preset", "data-constrained", "--depth", "20"]) == 2
    assert "has no depth 20" in capsys.readouterr().err


def test_dry_run_summary_reads_the_runs_on_stdin(monkeypatch, capsys):
    """train.py --ladder-dry-run plans every run it reads (the flags after -- go to each): one line per run with its
    micro-batch, FLOPs and GPU-hours, then the ladder's total; a run that does not plan is one line naming it."""
    monkeypatch.setattr("sys.stdin", io.StringIO("a --arch vanilla --depth 6\nb --arch loop_2 --depth 8\n"))
    assert train.main(["--ladder-dry-run", "--gpus-per-node", "4", "--", "--tpp", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["run a", "run b"]
    plans = [train.make_plan(train.parse_args(argv)) for argv in (
        ["--arch", "vanilla", "--depth", "6", "--tpp", "10"], ["--arch", "loop_2", "--depth", "8", "--tpp", "10"])]
    assert lines[2].startswith(f"2 runs | {sum(p.total_flops for p in plans):.3e} FLOPs |")
    hours = [float(re.search(r"~([0-9.,]+) GPU-hours at", line).group(1)) for line in lines[:2]]
    assert hours == pytest.approx([train.gpu_hours_estimate(p)["gpu_hours"] for p in plans], abs=0.051)
    total = float(re.search(r"~([0-9.,]+) GPU-hours of an H100", lines[2]).group(1).replace(",", ""))
    assert total == pytest.approx(sum(hours), abs=0.51) and "4 GPUs/node x 1 nodes" in lines[2]
    monkeypatch.setattr("sys.stdin", io.StringIO("a --arch vanilla --depth 6\n"))
    assert train.main(["--ladder-dry-run", "--mfu", "0.5"]) == 0
    assert "at 50% MFU)" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("odd --arch vanilla --depth 6\n"))
    assert train.main(["--ladder-dry-run", "--", "--device-batch-size", "3"]) == 2
    assert "odd: --device-batch-size 3 does not divide the 32 sequences per rank" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # nothing piped in: was a ValueError traceback
    assert train.main(["--ladder-dry-run"]) == 2


def test_demo_dry_run_lists_the_cpu_ladders_of_the_demo_arms_and_trains_nothing(tmp_path):
    r = ladder("demo", "--depth", "1", "2", "--dry-run", env=dict(RUNS_DIR=str(tmp_path), DATA_DIR=str(tmp_path / "d")))
    assert r.returncode == 0, r.stderr
    names = [re.search(r"--run-name (\S+)", line).group(1) for line in launched(r.stdout)]
    assert names == [f"{arch}_d{d}" for arch in arms.DEMO_ARMS for d in (1, 2)]
    assert r.stdout.strip().splitlines()[-1].startswith("6 runs |") and os.listdir(tmp_path) == []
    runs = [line for line in r.stdout.splitlines() if line.startswith("run ")]  # the cpu preset's micro-batch
    assert len(runs) == 6 and all("micro-batch 16 |" in line for line in runs), runs
    assert "1 GPUs/node x 1 nodes" in r.stdout


def stop_a_ladder(pool, tmp_path, signum, group, started):
    """Start a CPU ladder in its own session (as a terminal's foreground job), wait until started() holds, then send
    signum to its process group (Ctrl-C in a terminal) or to ladder.sh alone (kill, scancel) -> (exit code, output)."""
    argv = ["operator_1", "--preset", "cpu", "--depth", "2", "--", *TINY, "--steps", "400", "--data-dir", pool]
    proc = subprocess.Popen(["bash", "ladder.sh", *argv], cwd=ROOT, env=dict(os.environ, RUNS_DIR=str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 120
    while not started() and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
    out = proc.communicate(timeout=120)[0]
    return proc.returncode, out


@pytest.mark.parametrize("signum, group", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_ctrl_c_or_sigterm_stops_a_training_ladder_with_one_line(pool, tmp_path, signum, group):
    """Ctrl-C printed train.py's one line followed by torchrun's 30-line traceback; now the ladder's own line, no
    traceback, exit 128 + n, and the run is recorded as stopped (the next invocation resumes it). On a Ctrl-C
    torchrun, in the terminal's process group, passes the SIGINT on to its workers, racing the SIGTERM ladder.sh
    stops it with: the record names whichever reached train.py first."""
    trajectory = tmp_path / "operator_1_d2" / "trajectory.jsonl"
    code, out = stop_a_ladder(pool, tmp_path, signum, group, lambda: trajectory.exists() and trajectory.stat().st_size)
    name = signal.Signals(signum).name
    assert code == 128 + signum and "Traceback" not in out, out
    assert out.strip().splitlines()[-1] == (f"ladder.sh: stopped by {name} during run operator_1_d2 (log: {tmp_path}/"
                                            "operator_1_d2/train.log); run the same command again to continue")
    result = json.load(open(tmp_path / "operator_1_d2" / "result.json"))
    recorded = ("SIGINT at step", "SIGTERM at step") if group else ("SIGTERM at step",)
    assert result["status"] == "stopped" and result["reason"].startswith(recorded), result["reason"]


def test_ctrl_c_while_ladder_sh_lists_its_runs_is_one_line(pool, tmp_path):
    """A Ctrl-C while Python was still importing (the runs' listing) printed a KeyboardInterrupt traceback."""
    t0 = time.time()
    code, out = stop_a_ladder(pool, tmp_path, signal.SIGINT, True, lambda: time.time() > t0 + 0.3)
    assert code == 130 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith("ladder.sh: stopped by SIGINT")


@pytest.mark.parametrize("name", ["ladder.lock", "result.json"])
def test_a_fifo_in_the_run_folder_is_one_line_not_a_hang(pool, tmp_path, name):
    """ladder.sh opened a FIFO ladder.lock for appending and waited forever for a reader; a FIFO result.json hung the
    train.py it started. Now: one line naming the file, exit 2, before anything runs."""
    (tmp_path / "vanilla_d1").mkdir()
    os.mkfifo(tmp_path / "vanilla_d1" / name)
    r = ladder("vanilla", "--preset", "cpu", "--depth", "1", "--", *TINY, "--steps", "2", "--data-dir", pool,
               env=dict(RUNS_DIR=str(tmp_path)), timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"ladder.sh: error: {tmp_path}/vanilla_d1/{name} is not a regular file; remove it (or choose another "
        "RUNS_DIR)"], r.stderr
