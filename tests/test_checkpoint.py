"""checkpoint.py: checkpoint folders (weights-only loading, old single files, refused pickles), a 2-process sharded
save that copies no optimizer state, and where loaded tensors land (map_location). Resume, recovery and the run
folder's refusals run train.py: they are in tests/test_train.py and tests/test_bad_state.py."""
import ast
import dataclasses
import glob
import json
import os
import warnings

import pytest
import torch

import checkpoint
import model
import muon
import train
from test_model import build, tiny as tiny_config, tokens
from test_train import tiny


def test_load_checkpoint_model_roundtrip(tmp_path):
    cfg = tiny_config("loop_grow")
    net = build(cfg)
    path = tmp_path / "final.pt"
    torch.save(dict(model_config=dataclasses.asdict(cfg), model=net.state_dict(), passes=4, tokenizer="bytes", step=7),
               path)
    loaded, ckpt = checkpoint.load_checkpoint_model(str(path))
    assert ckpt["step"] == 7 and loaded.active_passes == 4 and not loaded.training
    if os.path.exists("/proc/self/maps"):  # the weights were copied out of the memory-mapped file, which is let go
        assert str(path) not in open("/proc/self/maps").read()
    idx = tokens(cfg)
    assert torch.equal(loaded(idx), net(idx, passes=4))
    with pytest.raises(ValueError, match="does not exist"):
        checkpoint.load_checkpoint_model(str(tmp_path / "missing.pt"))
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError):
        checkpoint.load_checkpoint_model(str(tmp_path / "bad.pt"))
    torch.save(dict(model_config=dataclasses.asdict(cfg), model={}, passes=4), tmp_path / "empty.pt")
    with pytest.raises(ValueError):
        checkpoint.load_checkpoint_model(str(tmp_path / "empty.pt"))


class CodeOnLoad:
    """Unpickling this runs code (it writes a marker file): what a crafted checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def write_checkpoint_folder(folder, weights):
    """A checkpoint folder as train.py writes it, as far as checkpoint.load_checkpoint_model reads it."""
    from common import sha256_file
    os.makedirs(folder, exist_ok=True)
    torch.save(weights, os.path.join(folder, "model.pt"))
    files = {n: dict(size=os.path.getsize(os.path.join(folder, n)), sha256=sha256_file(os.path.join(folder, n)))
             for n in sorted(os.listdir(folder))}
    with open(os.path.join(folder, "MANIFEST.json"), "w") as f:
        json.dump(dict(files=files), f)


def test_load_checkpoint_model_reads_folders_and_old_files_weights_only(tmp_path):
    cfg = tiny_config("loop_grow")
    net = build(cfg)
    weights = dict(model_config=dataclasses.asdict(cfg), model=net.state_dict(), passes=4, tokenizer="bytes", step=7)
    final = tmp_path / "run" / "checkpoints" / "final"
    write_checkpoint_folder(str(final), weights)
    idx = tokens(cfg)
    for path in (final, final / "model.pt"):
        loaded, ckpt = checkpoint.load_checkpoint_model(str(path))
        assert ckpt["step"] == 7 and torch.equal(loaded(idx), net(idx, passes=4))
    # an old single-file checkpoint (train.py before checkpoint folders, and before the mode was called "tied") holds
    # only tensors and plain types too
    muon_opt = muon.Muon(list(net.transformer.h.parameters()), lr=0.02)
    adamw = torch.optim.AdamW([net.transformer.wte.weight], lr=0.01, betas=(0.8, 0.95))
    net(idx, targets=idx).backward()
    muon_opt.step(), adamw.step()
    old = dict(weights, model_config=dict(weights["model_config"], mode="loop"),
               optimizers=[muon_opt.state_dict(), adamw.state_dict()], rng=torch.get_rng_state(),
               plan=dict(arch="loop_grow", adam_betas=[0.8, 0.95], crossover_step=None, total_flops=10 ** 20),
               evals=[dict(step=0, val_loss=5.5, val_bpb=None)], growth_events=[], flops=0, train_seconds=1.5)
    torch.save(old, tmp_path / "final.pt")
    loaded, ckpt = checkpoint.load_checkpoint_model(str(tmp_path / "final.pt"))
    assert ckpt["evals"][0]["val_loss"] == 5.5 and loaded.cfg.mode == "tied"
    assert torch.equal(loaded(idx), net(idx, passes=4))
    # a run folder or checkpoints/ names what to pass
    with pytest.raises(ValueError, match=r"is a run folder .*; pass .*checkpoints/final$"):
        checkpoint.load_checkpoint_model(str(tmp_path / "run"))
    with pytest.raises(ValueError, match=r"is a folder of checkpoints .*; pass .*checkpoints/final$"):
        checkpoint.load_checkpoint_model(str(tmp_path / "run" / "checkpoints"))
    # content check: a flipped byte or a truncated file is reported as such
    data = bytearray((final / "model.pt").read_bytes())
    data[len(data) // 2] ^= 1
    (final / "model.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted: model.pt does not match its sha256"):
        checkpoint.load_checkpoint_model(str(final))
    (final / "model.pt").write_bytes(bytes(data[:100]))
    with pytest.raises(ValueError, match="truncated or corrupted: model.pt has 100 bytes"):
        checkpoint.load_checkpoint_model(str(final / "model.pt"))


def test_crafted_pickle_checkpoint_is_refused_without_running(tmp_path):
    marker = str(tmp_path / "marker")
    torch.save(CodeOnLoad(marker), tmp_path / "control.pt")
    torch.load(tmp_path / "control.pt", map_location="cpu", weights_only=False)  # the payload is real: it runs
    assert os.path.exists(marker)
    os.remove(marker)
    write_checkpoint_folder(str(tmp_path / "final"), CodeOnLoad(marker))  # with a matching manifest
    torch.save(dict(model_config={}, model=CodeOnLoad(marker)), tmp_path / "final.pt")
    for path in (tmp_path / "final", tmp_path / "final.pt"):
        with pytest.raises(ValueError, match="holds objects other than tensors and plain types"):
            checkpoint.load_checkpoint_model(str(path))
        assert not os.path.exists(marker)


def test_load_checkpoint_model_builds_the_model_on_its_device(tmp_path, monkeypatch):
    """core_eval on a GPU: the model is built on the GPU tensor by tensor as training built it (bf16 embedding), not
    as a CPU copy of every fp32 parameter (29 GB of host memory at d26) moved over afterwards."""
    cfg = tiny_config("vanilla")
    torch.save(dict(model_config=dataclasses.asdict(cfg), model=model.GPT(cfg).state_dict(), passes=1,
                    tokenizer="bytes", step=0), tmp_path / "final.pt")
    built_on = []
    monkeypatch.setattr(checkpoint, "GPT", lambda config, device="cpu", **kw: built_on.append(device) or model.GPT(config, **kw))
    checkpoint.load_checkpoint_model(str(tmp_path / "final.pt"), device="meta")
    assert built_on == ["meta"]


@pytest.mark.parametrize("seed", range(40))
def test_bytes_torch_save_did_not_write_are_refused_with_one_message(tmp_path, seed):
    """torch.load fails on foreign bytes with UnpicklingError, UnicodeDecodeError, IndexError, KeyError, EOFError or a
    zip RuntimeError, some after a "pickle protocol" warning on stderr: every one is the same refusal, and silent."""
    import random
    prefixes = [b"", b"X\x04\x00\x00\x00\xf8\xf8\xf8\xf8", b"\x80\x79", b"\x80\x02", b"PK\x03\x04"]
    path = tmp_path / "final.pt"
    path.write_bytes(prefixes[seed % len(prefixes)] + random.Random(seed).randbytes(seed * 50))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="is unreadable or holds objects other than tensors"):
            checkpoint.load_checkpoint_model(str(path))


def save_worker(rank, world, port, out_dir, plan_argv):
    """One rank of a 2-process save: the optimizer state's storages before and after save_checkpoint."""
    torch.set_num_threads(1)
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        plan = train.make_plan(train.parse_args(plan_argv))
        torch.manual_seed(0)
        net = model.GPT(plan.model_config)
        net.set_passes(plan.pass_stages[0])
        train.shard_model(net, train.build_mesh(world, world, torch.device("cpu"), 5))
        optimizers = train.build_optimizers(net, plan)
        x = torch.randint(0, 257, (2, plan.seq_len + 1), generator=torch.Generator().manual_seed(rank))
        net(x[:, :-1], targets=x[:, 1:]).backward()
        for opt in optimizers:
            opt.step()

        def storages():
            return sorted((muon.local(t).untyped_storage().data_ptr(), muon.local(t).untyped_storage().nbytes())
                          for opt in optimizers for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
        before = storages()
        if rank == 1:  # a stale directory listing (NFS on another node): meta.json, just written by rank 0, unseen
            walk = os.walk
            os.walk = lambda top: ((base, dirs, [f for f in files if f != "meta.json"]) for base, dirs, files in walk(top))
        checkpoint.save_checkpoint(os.path.join(out_dir, "latest"), net, optimizers, checkpoint.RunState(step=1), plan)
        torch.save(dict(before=before, after=storages(), owned=optimizers[0].state_bytes()),
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    os._exit(0)  # gloo teardown can abort in its worker thread (pytorch/pytorch#190489); results are on disk


def test_save_makes_no_copies_of_optimizer_state(pool, tmp_path, free_port):
    """After a 2-process (FSDP2) save each rank's optimizer state references exactly the storages it did before
    (Muon.state_dict and get_optimizer_state_dict hand DCP the live shards), and every rank wrote its own shards. The
    manifest lists every file although rank 1's listing of the folder misses one."""
    import torch.multiprocessing as mp
    argv = tiny(pool, tmp_path, "vanilla")
    mp.spawn(save_worker, args=(2, free_port, str(tmp_path), argv), nprocs=2, join=True)
    for rank in range(2):
        r = torch.load(os.path.join(tmp_path, f"rank{rank}.pt"), map_location="cpu", weights_only=True)
        assert r["before"] == r["after"] and r["owned"] > 0
    latest = os.path.join(tmp_path, "latest")
    checkpoint.verify_checkpoint(latest)  # complete, manifest written last
    on_disk = {os.path.relpath(os.path.join(base, f), latest) for base, _, files in os.walk(latest) for f in files}
    listed = json.load(open(os.path.join(latest, "MANIFEST.json")))["files"]
    assert set(listed) == on_disk - {"MANIFEST.json"}  # rank 0's listing, whatever rank 1's directory cache says
    for shards in (checkpoint.MODEL_SHARDS, checkpoint.OPTIMIZER_SHARDS):
        assert {f"{shards}/__0_0.distcp", f"{shards}/__1_0.distcp"} <= set(listed)
    weights, record = checkpoint.load_checkpoint_model(latest)  # no process group: DCP reads both ranks' shards
    assert record["step"] == 1 and weights.transformer.wte.weight.shape[0] == weights.cfg.padded_vocab


# ---------------------------------------------------------------------------------------------------------------------
# Where loaded tensors land

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_torch_load_names_where_its_tensors_land():
    """Without map_location torch.load restores each tensor on the device it was saved from: on 8 GPUs every rank
    would open a CUDA context on GPU 0 and put its copy there. The scripts, docs/ and the tests all pass it."""
    missing = []
    for path in sorted(glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "docs", "*.py"))
                       + glob.glob(os.path.join(ROOT, "tests", "*.py"))):
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch" \
                    and "map_location" not in {k.arg for k in node.keywords}:
                missing.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert missing == []


def anonymous_rss():
    """This process's resident anonymous memory in bytes (Linux): private copies, not page cache."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RssAnon from Linux's /proc")
def test_checkpoint_files_are_memory_mapped_not_copied(tmp_path):
    """At d26 each of a node's 8 ranks reads the 29 GB weights file on resume: memory-mapped, they share the page
    cache; read, they held 8 private copies (289 GiB per node). Loading 64 MB must not add 64 MB of private memory.
    Every torch.load in checkpoint.py goes through load_tensors."""
    path = tmp_path / "adamw.pt"
    torch.save([dict(exp_avg=torch.ones(16 * 2 ** 20))], path)
    before = anonymous_rss()
    loaded = checkpoint.load_tensors(str(path), map_location="cpu")
    assert anonymous_rss() - before < 16 * 2 ** 20
    assert loaded[0]["exp_avg"].sum().item() == 16 * 2 ** 20
    source = ast.parse(open(checkpoint.__file__).read())
    loaders = {f.name for f in ast.walk(source) if isinstance(f, ast.FunctionDef) for node in ast.walk(f)
               if isinstance(node, ast.Attribute) and node.attr == "load" and getattr(node.value, "id", "") == "torch"}
    assert loaders == {"load_tensors"}


def test_save_hands_dcp_the_live_weights(pool, tmp_path, monkeypatch):
    """DCP writes the weights from where they live: on a GPU it copies one storage at a time to the host; a dict of
    .cpu() copies held the whole fp32 model (29 GB at d26) in host memory at every save. The tensors handed to
    dcp.save are the parameters themselves, and save_checkpoint moves nothing."""
    plan = train.make_plan(train.parse_args(tiny(pool, tmp_path, "untied_grow")))
    net = model.GPT(plan.model_config)
    saved = {}
    real_save = checkpoint.dcp.save
    monkeypatch.setattr(checkpoint.dcp, "save", lambda state, storage_writer, **kw: (
        saved.setdefault(os.path.basename(storage_writer.path), state), real_save(state, storage_writer=storage_writer,
                                                                                 **kw)))
    checkpoint.save_checkpoint(str(tmp_path / "latest"), net, [], checkpoint.RunState(step=1), plan)
    weights = saved[checkpoint.MODEL_SHARDS]
    assert {k: v.data_ptr() for k, v in weights.items()} == {k: v.data_ptr() for k, v in net.state_dict().items()}
    source = ast.parse(open(checkpoint.__file__).read())
    save = next(f for f in ast.walk(source) if isinstance(f, ast.FunctionDef) and f.name == "save_checkpoint")
    assert not [n.lineno for n in ast.walk(save) if isinstance(n, ast.Attribute) and n.attr in ("cpu", "to")]


def test_resume_loads_every_tensor_onto_the_resuming_ranks_device(pool, tmp_path, monkeypatch):
    """A checkpoint written by rank 0 of a GPU run tags its tensors cuda:0. Written here with those tags, it resumes on
    a CPU-only machine only if every load maps them to the resuming rank's device; every optimizer state tensor then
    sits on its parameter's device, with the saved values."""
    plan = train.make_plan(train.parse_args(tiny(pool, tmp_path, "untied_grow", "--crossover-fractions", "0.5")))

    def trained_model():
        torch.manual_seed(0)
        net = model.GPT(plan.model_config)
        net.set_passes(plan.pass_stages[0])
        return net, train.build_optimizers(net, plan)
    net, optimizers = trained_model()
    x = torch.randint(0, 257, (2, plan.seq_len + 1), generator=torch.Generator().manual_seed(0))
    net(x[:, :-1], targets=x[:, 1:]).backward()
    for opt in optimizers:
        opt.step()
    folder = str(tmp_path / "latest")
    with monkeypatch.context() as m:  # what torch.save records for tensors saved from GPU 0
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        checkpoint.save_checkpoint(folder, net, optimizers, checkpoint.RunState(step=1), plan)
    resumed, resumed_optimizers = trained_model()
    state = checkpoint.load_checkpoint(folder, plan, resumed, resumed_optimizers, torch.device("cpu"))
    assert state.step == 1
    for opt, saved in zip(resumed_optimizers, optimizers):
        for p, p_saved in zip((p for g in opt.param_groups for p in g["params"]),
                              (p for g in saved.param_groups for p in g["params"])):
            for key, value in saved.state[p_saved].items():
                if torch.is_tensor(value) and value.dim():  # AdamW's step is a scalar on the CPU by design
                    assert opt.state[p][key].device == p.device and torch.equal(opt.state[p][key], value), key
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), net.parameters()))
    if os.path.exists("/proc/self/maps"):  # no state adopted from a memory-mapped file: the run keeps no file open
        assert folder not in open("/proc/self/maps").read()


def test_a_signal_inside_a_dcp_load_stays_a_signal(pool, tmp_path, monkeypatch):
    """A SIGTERM while DCP loads the Muon state reached resume inside a CheckpointException and was reported as a
    checkpoint that is "not usable" (exit 2), not as the stop it is."""
    plan = train.make_plan(train.parse_args(tiny(pool, tmp_path, "vanilla")))
    net = model.GPT(plan.model_config)
    optimizers = train.build_optimizers(net, plan)
    folder = str(tmp_path / "latest")
    checkpoint.save_checkpoint(folder, net, optimizers, checkpoint.RunState(step=1), plan)
    stopped = train.Stopped(15)

    def interrupted(*args, **kwargs):
        raise checkpoint.dcp.api.CheckpointException("load", {0: (stopped, None)})
    monkeypatch.setattr(checkpoint.dcp, "load", interrupted)
    with pytest.raises(train.Stopped) as caught:
        checkpoint.load_checkpoint(folder, plan, net, optimizers, torch.device("cpu"))
    assert caught.value is stopped


def test_resumed_adamw_keeps_its_step_counts_on_the_host(tmp_path, monkeypatch):
    """A fresh AdamW keeps each parameter's "step" on the host; loaded onto the GPU with the moments, every later step
    would wait for the device once per parameter (foreach AdamW reads the count with .item()). Saved as from GPU 0
    and loaded for parameters on another device (meta stands in for cuda here): the moments follow the parameters,
    the steps stay on the host with their values."""
    weight = torch.nn.Parameter(torch.ones(4, 3))
    opt = torch.optim.AdamW([weight], lr=0.1, foreach=True)
    weight.grad = torch.full_like(weight, 0.5)
    opt.step(), opt.step()
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save([opt.state_dict()], tmp_path / "adamw.pt")
    elsewhere = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
    resumed = torch.optim.AdamW([elsewhere], lr=0.1, foreach=True)
    checkpoint.load_adamw([resumed], str(tmp_path), torch.device("meta"))
    state = resumed.state[elsewhere]
    assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"
    assert state["step"].device.type == "cpu" and state["step"].item() == 2
