"""The distributed path (FSDP2, HSDP 2 x 2, Muon on shards) on gloo, in fp32 and CUDA's dtypes: 2 and 4 processes
against one through growth, the comparison (also tests/test_gpu.py's) shown to catch each injected defect; a tied
core's all-gathers; train.py under torchrun; ranks given different flags refused; --dist-timeout."""
import datetime
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.distributed as dist

import common
import muon
import train
from test_train import ROOT, read_run, tiny

ENV = dict(os.environ, OMP_NUM_THREADS="1")  # one intra-op thread: the thread count does not reorder CPU sums
DTYPES = ("float32", "bfloat16")
ARMS = [("untied_grow", "float32"), ("untied_grow", "bfloat16"), ("loop_grow", "bfloat16")]  # loop_grow: a tied core
STEPS, WINDOWS = 4, 8  # growth at step 2; 8 windows of 16 tokens per step
# A distributed run must end no farther from the one-process run than NOISE_FACTOR x the noise floor: how far the
# same one-process run ends at another micro-batch split (the same sum in another order). Measured on these runs:
# correct builds <= 1.3x the floor (fp32 and bf16), every defect >= 14x.
NOISE_FACTOR = 3.0


def distance(run, reference):
    """The largest relative difference over two runs' per-step losses and final weights (per tensor, Frobenius)."""
    losses = max(abs(a - b) / abs(b) for a, b in zip(run["losses"], reference["losses"]))
    weights = max(((run["weights"][k] - w).norm() / w.norm().clamp_min(1e-12)).item()
                  for k, w in reference["weights"].items())
    return max(losses, weights)


def agrees(run, reference, noise_floor):
    """Within NOISE_FACTOR x the noise floor (also tests/test_gpu.py's comparison)."""
    return distance(run, reference) <= NOISE_FACTOR * noise_floor


class Tokens:
    """Synthetic batches with data.TrainLoader's contract: rank r reads the r-th contiguous slice of step s's batch."""
    steps_per_epoch = STEPS

    def batch(self, step, rank=0, world_size=1):
        windows = torch.randint(0, 257, (WINDOWS, 17), generator=torch.Generator().manual_seed(step))
        per_rank = WINDOWS // world_size
        return 1, windows[rank * per_rank:(rank + 1) * per_rank]


def train_run(arch, dtype, world, rank, micro_batch=2, passes=None):
    """STEPS steps of a tiny `arch` -> {losses, weights} (gathered: a collective); with `passes`: the untrained
    Training."""
    args = train.parse_args(["--arch", arch, "--depth", "2", "--preset", "cpu", "--width-per-depth", "16",
                             "--head-dim", "16", "--seq-len", "16", "--total-batch-tokens", str(WINDOWS * 16),
                             "--steps", str(STEPS), "--warmup-steps", "0", "--compute-dtype", dtype, "--dist-timeout",
                             "5"] + (["--crossover-fractions", "0.5"] if arch.endswith("grow") else []))
    plan = train.make_plan(args)
    training = train.start_training(train.new_run(args, plan, micro_batch, rank, world, torch.device("cpu"), Tokens()))
    if passes:
        training.model.set_passes(passes)
        return training
    losses = []
    for _ in range(STEPS):
        losses.append(train.train_step(training)[0].item())
        training.state.step += 1
    weights = {k: muon.full(v).float() for k, v in training.model.state_dict().items()}
    return dict(losses=losses, weights=weights)


def inject(defect, rank, monkeypatch):
    """One defect of a distributed build, on this rank (tests/test_gpu.py's comparison must catch each)."""
    batch = Tokens.batch
    if defect == "grads_x_world" and rank == 1:  # one rank's gradients x world before any reduction
        loss = train.model_lib.GPT.loss

        def doubled_in_backward(self, *args, **kwargs):
            out = loss(self, *args, **kwargs)
            return 2 * out - out.detach() if out.requires_grad else out
        monkeypatch.setattr(train.model_lib.GPT, "loss", doubled_in_backward)
    if defect == "rank0_data":  # every rank reads rank 0's windows
        monkeypatch.setattr(Tokens, "batch", lambda self, step, rank=0, world_size=1: batch(self, step, 0, world_size))
    if defect == "wrong_slice" and rank == 1:  # a rank reads its slice of the next step's batch
        monkeypatch.setattr(Tokens, "batch", lambda self, step, rank=0, world_size=1:
                            batch(self, step + 1, rank, world_size))
    if defect == "muon_local_shard":  # Polar-Express and NorMuon on each rank's rows, not the whole matrix
        monkeypatch.setattr(muon.Muon, "_orthogonalized", lambda self, moving, blended: {
            i: muon.orthogonalize(blended[i], torch.zeros(muon.second_moment_shape(blended[i].shape)),
                                  self.polar_express_dtype) for i in moving})
    if defect == "hsdp_no_all_reduce":  # HSDP never all-reduces across the nodes
        real = train.FSDPModule.set_requires_all_reduce
        monkeypatch.setattr(train.FSDPModule, "set_requires_all_reduce", lambda self, _, **kw: real(self, False, **kw))
    if defect == "growth_on_rank_0" and rank != 0:  # the stacking copy runs on rank 0 only
        grow = train.model_lib.GPT.grow

        def copy_nothing(self, passes):
            kept = {k: v.detach().clone() for k, v in self.state_dict().items()}
            overwritten = grow(self, passes)
            with torch.no_grad():
                for k, v in self.state_dict().items():
                    muon.local(v).copy_(muon.local(kept[k]))
            return overwritten
        monkeypatch.setattr(train.model_lib.GPT, "grow", copy_nothing)


DEFECTS = {2: ("grads_x_world", "rank0_data", "wrong_slice", "muon_local_shard", "growth_on_rank_0"),
           4: ("hsdp_no_all_reduce",)}


def all_gathers(training, micro):
    """The all-gathers one training micro-batch issues (FSDP2 gathers with all_gather_single)."""
    calls, real = Counter(), dist.all_gather_single
    dist.all_gather_single = lambda *a, **k: calls.update(["gather"]) or real(*a, **k)
    try:
        with train.autocast(training.model):
            loss = training.model(micro[:, :-1], targets=micro[:, 1:])
        loss.backward()
    finally:
        dist.all_gather_single = real
    training.model.zero_grad(set_to_none=True)
    return calls["gather"]


def worker(rank, ports, out_dir):
    """4 gloo ranks as HSDP 2 x 2, then 2 (FSDP2): each arm, dtype and defect; ranks 2 and 3 train the references."""
    torch.set_num_threads(1)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    results = {}
    for world, port in zip((4, 2), ports):
        if rank < world:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
            for arch, dtype in ARMS:
                results[arch, dtype, world, None] = train_run(arch, dtype, world, rank)
            for dtype in DTYPES:
                for defect in DEFECTS[world]:
                    with pytest.MonkeyPatch.context() as monkeypatch:
                        inject(defect, rank, monkeypatch)
                        results["untied_grow", dtype, world, defect] = train_run("untied_grow", dtype, world, rank)
            if world == 2:
                for passes in (1, 4):
                    training = train_run("loop_2", "bfloat16", world, rank, passes=passes)
                    results["gathers", passes] = all_gathers(training, Tokens().batch(0, rank, world)[1])
            dist.destroy_process_group()
        elif rank == world:
            for arch, dtype in ARMS:
                for micro_batch in (2, 4):
                    results[arch, dtype, 1, micro_batch] = train_run(arch, dtype, 1, 0, micro_batch)
        if rank in (0, world):
            torch.save(results, os.path.join(out_dir, f"rank{rank}_w{world}.pt"))
            results = {}
    os._exit(0)  # gloo's teardown can abort an exiting process


@pytest.fixture(scope="module")
def runs(tmp_path_factory, spawn_ranks):
    out = tmp_path_factory.mktemp("parallel")
    spawn_ranks(worker, out)
    merged = {}
    for name in os.listdir(out):
        merged.update(torch.load(out / name, weights_only=False))
    return merged


@pytest.mark.parametrize("arch, dtype", ARMS)
def test_2_and_4_processes_train_through_growth_as_one(runs, arch, dtype):
    """FSDP2 on 2 processes and HSDP on 4 end within the noise floor of one, in fp32 and CUDA's dtypes."""
    reference, noise = runs[arch, dtype, 1, 2], distance(runs[arch, dtype, 1, 4], runs[arch, dtype, 1, 2])
    assert noise > 0
    for world in (2, 4):
        assert agrees(runs[arch, dtype, world, None], reference, noise), (world, distance(
            runs[arch, dtype, world, None], reference), noise)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world, defect", [(w, d) for w, defects in DEFECTS.items() for d in defects])
def test_the_comparison_catches_each_defect(runs, world, defect, dtype):
    """Each defect (inject) ends the run outside the noise floor's tolerance, in fp32 and in CUDA's dtypes."""
    reference = runs["untied_grow", dtype, 1, 2]
    noise = distance(runs["untied_grow", dtype, 1, 4], reference)
    assert not agrees(runs["untied_grow", dtype, world, defect], reference, noise), \
        (distance(runs["untied_grow", dtype, world, defect], reference), noise)


def test_a_tied_core_is_gathered_once_however_many_passes(runs):
    """loop_2 on 2 processes: a micro-batch at 4 passes issues the all-gathers of one at 1 pass."""
    assert runs["gathers", 4] == runs["gathers", 1] > 0


def test_train_py_in_cudas_dtypes_grows_on_2_processes_and_resumes_on_1(pool, tmp_path, free_port):
    """torchrun train.py in bf16 on 2 processes through growth, stopped, resumed on one (DCP reshards)."""
    args = tiny(pool, tmp_path, "untied_grow", "--crossover-fractions", "0.5", "--compute-dtype", "bfloat16",
                "--run-name", "r", steps=6)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port), "train.py", *args, "--stop-after", "4"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_run(tmp_path, "r")[0]["world_size"] == 2
    assert train.main(args + ["--resume"]) == 0
    result, trajectory = read_run(tmp_path, "r")
    assert result["status"] == "complete" and result["world_size"] == 1 and len(result["growth_events"]) == 1
    assert len(trajectory) == 6 and all(0 < t["loss"] < 6 for t in trajectory)


def test_ranks_given_different_seeds_stop_with_one_line_each(pool, tmp_path, free_port):
    """Every rank must run rank 0's plan: ranks given different --seed stop before training, one line each, exit 2."""
    procs = []
    for rank in range(2):
        env = dict(ENV, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port))
        procs.append(subprocess.Popen([sys.executable, "train.py", *tiny(pool, tmp_path, "vanilla"), "--run-name", "r",
                                       "--seed", str(rank + 1)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err[-2000:]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "rank 1 would run another plan than rank 0 (seed: 2 on rank 1, 1 on rank 0)" \
            in lines[0], err
    assert not os.path.exists(os.path.join(tmp_path, "r", "trajectory.jsonl"))


def test_dist_timeout_reaches_the_process_group_and_every_group_of_the_mesh(monkeypatch):
    """--dist-timeout (minutes; default 30, not NCCL's 10): to init_process_group, and to HSDP's groups on 2 nodes of 4
    (not new_group's default)."""
    assert train.parse_args(["--arch", "vanilla", "--depth", "2"]).dist_timeout == 30
    calls, created = [], []
    monkeypatch.setattr(train, "setup_distributed", lambda *args: calls.append(args) or 1 / 0)
    args = train.parse_args(["--arch", "vanilla", "--depth", "2", "--dist-timeout", "45"])
    with pytest.raises(ZeroDivisionError):
        train.open_run(args, train.make_plan(args))
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: calls.append(kw))
    for name, value in dict(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="29500").items():
        monkeypatch.setenv(name, value)
    assert common.setup_distributed("cpu", 45) == (0, 2, torch.device("cpu"))
    assert calls == [("auto", 45), dict(device_id=None, timeout=datetime.timedelta(minutes=45))]
    monkeypatch.setattr(dist, "new_group", lambda ranks, timeout=None: created.append((ranks, timeout)) or len(created))
    monkeypatch.setattr(dist, "get_rank", lambda: 5)
    monkeypatch.setattr(train.DeviceMesh, "from_group", lambda groups, device, mesh, mesh_dim_names: (groups, mesh))
    groups, mesh = train.build_mesh(8, 4, torch.device("cpu"), 7)
    assert sorted(ranks for ranks, _ in created) == [[0, 1, 2, 3], [0, 4], [1, 5], [2, 6], [3, 7], [4, 5, 6, 7]]
    assert {timeout for _, timeout in created} == {datetime.timedelta(minutes=7)}
    assert mesh.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [created[g - 1][0] for g in groups] == [[1, 5], [4, 5, 6, 7]]  # rank 5: replicate with 1, shard node 1
