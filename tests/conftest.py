import os
import socket
import sys

import pytest

# Tests import the flat scripts (model.py, train.py, ...) from the repository root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tests' models are tiny: one intra-op thread runs them faster than two, here and in the processes they start.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The same in this process where OMP_NUM_THREADS was already set (a second thread spins on ops this small)."""
    import torch
    torch.set_num_threads(1)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA (python -m pytest -m gpu -q on a GPU machine, docs/gpu.md); "
                                       "skipped without it")


@pytest.fixture
def free_port():
    """A free TCP port on 127.0.0.1 for torch.distributed rendezvous."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


@pytest.fixture(scope="session")
def spawn_ranks():
    """spawn(worker, out_dir, nprocs): torch.multiprocessing.spawn of worker(rank, ports, out_dir) on nprocs
    processes, with two free TCP ports for the process groups it starts one after the other."""
    import torch.multiprocessing as mp

    def spawn(worker, out_dir, nprocs=4):
        sockets = [socket.socket(), socket.socket()]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in sockets]
        for s in sockets:
            s.close()
        mp.spawn(worker, args=(ports, str(out_dir)), nprocs=nprocs, join=True)
    return spawn


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    """A small offline token pool (byte tokenizer, stdlib corpus) for short training runs."""
    import data
    out = str(tmp_path_factory.mktemp("pool"))
    data.prepare("stdlib", out, tokenizer="bytes", train_tokens=300_000, val_tokens=20_000, workers=1)
    return out


@pytest.fixture
def pool_copy(pool, tmp_path):
    import shutil
    shutil.copytree(pool, tmp_path / "pool")
    return tmp_path / "pool"


def write_checkpoint(folder, net, tokenizer="bytes"):
    """A weights-only checkpoint folder as train.py writes it, as far as checkpoint.load_checkpoint_model reads it:
    meta.json's "weights" record and the model's tensors (DCP) -> the folder."""
    import dataclasses
    import json
    import torch.distributed.checkpoint as dcp
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(dict(weights=dict(model_config=dataclasses.asdict(net.cfg), passes=net.active_passes,
                                    tokenizer=tokenizer, step=0)), f)
    dcp.save(dict(model=net.state_dict()), checkpoint_id=str(folder), no_dist=True)
    return str(folder)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import model
    cfg = model.config_for("vanilla", 1, width_per_depth=16, head_dim=16, seq_len=64, vocab_size=257)
    return write_checkpoint(tmp_path_factory.mktemp("run") / "checkpoints" / "final", model.GPT(cfg))
