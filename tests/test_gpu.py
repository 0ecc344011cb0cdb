"""The GPU checks: `python -m pytest -m gpu -q` on a GPU machine (about 10 minutes on one H100; skipped without CUDA,
the 2-GPU comparison skipped with one GPU). What they run and print: docs/gpu.md."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch


import core_eval
import model
import train
from test_model import attention_backend_run
from test_core_eval import write_bundle
from test_parallel import agrees, distance
from test_train import ROOT, read_run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs CUDA: run python -m pytest -m gpu -q on a GPU machine")]
RUN = ["--arch", "untied_grow", "--depth", "4", "--preset", "cpu", "--steps", "200", "--crossover-fractions", "0.5",
       "--device", "cuda", "--log-every", "1"]  # compiled, bf16: CUDA's defaults


def show(capsys, line):
    with capsys.disabled():
        print(f"\n[gpu] {line}")


def train_py(args, gpus=1, wait=True):
    launch = [sys.executable, "train.py"] if gpus == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(gpus), "--standalone",
        "train.py"]
    proc = subprocess.Popen(launch + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return out


def run_of(runs, name):
    """A finished run as test_parallel.distance compares it: its losses and its final weights."""
    _, trajectory = read_run(runs, name)
    net, _ = train.load_checkpoint_model(os.path.join(str(runs), name, "checkpoints", "final"))
    return dict(losses=[t["loss"] for t in trajectory], weights={k: v.float() for k, v in net.state_dict().items()})


@pytest.fixture(scope="module")
def gpu_run(pool, tmp_path_factory):
    """Untied-Grow d4 on one GPU, compiled bf16, growth at step 100 of 200; the same run killed after step 120,
    resumed."""
    runs = tmp_path_factory.mktemp("gpu")
    args = RUN + ["--data-dir", pool, "--runs-dir", str(runs), "--save-every", "50"]
    train_py(args + ["--run-name", "full"])
    proc = train_py(args + ["--run-name", "cut"], wait=False)
    trajectory = os.path.join(runs, "cut", "trajectory.jsonl")
    while proc.poll() is None and (not os.path.exists(trajectory) or sum(1 for _ in open(trajectory)) < 120):
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    resumed = train_py(args + ["--run-name", "cut", "--resume"])
    return runs, int(re.search(r"resuming .* from step (\d+)", resumed).group(1))


def test_compiled_bf16_run_grows_saves_and_resumes_exactly_after_kill_9(gpu_run, capsys):
    runs, resumed = gpu_run
    full, t_full = read_run(runs, "full")
    cut, t_cut = read_run(runs, "cut")
    assert full["status"] == cut["status"] == "complete" and full["environment"]["compiled"]
    assert [e["step"] for e in full["growth_events"]] == [100] and all(math.isfinite(t["loss"]) for t in t_full)
    assert 100 <= resumed < 200 and len(t_cut) == 200  # killed after step 120, resumed from its last checkpoint
    assert t_cut[resumed]["loss"] == t_full[resumed]["loss"]  # the first step resumed: same weights, state, batch
    show(capsys, f"one GPU, compiled bf16 through growth: final val loss {full['final_val_loss']:.4f}; killed, resumed "
                 f"from step {resumed}: {cut['final_val_loss']:.4f}; last MFU {full['last_train_mfu']}")


def test_core_scores_on_pytorchs_default_attention(gpu_run, tmp_path, capsys):
    bundle = write_bundle(tmp_path / "bundle")
    final = os.path.join(gpu_run[0], "full", "checkpoints", "final")
    assert core_eval.main(["--checkpoint", final, "--bundle-dir", bundle, "--seed", "0", "--out",
                           str(tmp_path / "eval.json")]) == 0
    scores = json.loads((tmp_path / "eval.json").read_text())
    assert all(math.isfinite(v) for v in scores["losses"].values()) and 0 <= min(scores["results"].values())
    net, _ = train.load_checkpoint_model(final, device="cuda")
    net.set_attention("default")
    kernel = attention_backend_run(lambda: net.residual_stream(torch.zeros(2, 64, dtype=torch.long,
                                                                                 device="cuda")))
    show(capsys, f"CORE on default attention ({kernel}): {scores['core_metric']:.4f}")


class RandomTokens:
    """A loader of uniform random token ids (seeded per step): a step's cost without a pool."""
    steps_per_epoch = 10 ** 9

    def __init__(self, vocab_size, seq_len, batch_seqs):
        self.shape, self.vocab_size = (batch_seqs, seq_len + 1), vocab_size

    def batch(self, step, rank, world):
        return 1, torch.randint(0, self.vocab_size, self.shape, generator=torch.Generator().manual_seed(step))


def test_mfu_and_peak_memory_of_a_d12_step(capsys):
    """The paper's d12 vanilla shape compiled in bf16: 3 warm-up steps, then 5 timed."""
    args = train.parse_args(["--arch", "vanilla", "--depth", "12", "--total-batch-tokens", str(32 * 2048),
                             "--device-batch-size", "16", "--device", "cuda"])
    plan, device = train.make_plan(args), torch.device("cuda")
    loader = RandomTokens(plan.model_config.vocab_size, plan.seq_len, 32)
    training = train.start_training(train.new_run(args, plan, 16, 0, 1, device, loader))
    for step in range(8):
        if step == 3:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
        train.train_step(training)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / 5
    flops = model.flops_per_token(plan.model_config, 1) * plan.tokens_per_step
    mfu = flops / seconds / train.gpu_peak_flops(device) if train.gpu_peak_flops(device) else None
    peak = torch.cuda.max_memory_allocated() / 2 ** 30
    assert mfu is None or 0 < mfu < 1
    show(capsys, f"d12 vanilla on {torch.cuda.get_device_name()}: {seconds * 1e3:.0f} ms per step of "
                 f"{plan.tokens_per_step} tokens, MFU {mfu if mfu is None else f'{mfu:.1%}'}, peak {peak:.1f} GiB")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_2_gpus_train_as_one_within_the_noise_floor(pool, tmp_path, capsys):
    """FSDP2 on 2 GPUs against one, within the noise floor (tests/test_parallel.py)."""
    args = RUN + ["--data-dir", pool, "--runs-dir", str(tmp_path)]
    train_py(args + ["--run-name", "one", "--device-batch-size", "4"])
    train_py(args + ["--run-name", "split", "--device-batch-size", "8"])
    train_py(args + ["--run-name", "two", "--device-batch-size", "4"], gpus=2)
    one = run_of(tmp_path, "one")
    noise, two = distance(run_of(tmp_path, "split"), one), distance(run_of(tmp_path, "two"), one)
    show(capsys, f"2 GPUs vs one: {two:.3g} (noise floor {noise:.3g})")
    assert noise > 0 and agrees(run_of(tmp_path, "two"), one, noise)
