import os
import socket
import sys

import pytest

# Tests import the flat scripts (model.py, train.py, ...) from the repository root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA (python -m pytest -m gpu -q on a GPU machine, docs/gpu.md); "
                                       "skipped without it")


@pytest.fixture
def free_port():
    """A free TCP port on 127.0.0.1 for torch.distributed rendezvous."""
    import common
    return common.free_port()


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
    data.prepare("stdlib", out, tokenizer="bytes", train_tokens=300_000, val_tokens=20_000)
    return out


@pytest.fixture
def pool_copy(pool, tmp_path):
    import shutil
    shutil.copytree(pool, tmp_path / "pool")
    return tmp_path / "pool"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import dataclasses
    import torch
    import model
    cfg = model.config_for("vanilla", 1, width_per_depth=16, head_dim=16, seq_len=64, vocab_size=257)
    net = model.GPT(cfg)
    path = tmp_path_factory.mktemp("ckpt") / "final.pt"
    torch.save(dict(model_config=dataclasses.asdict(cfg), model=net.state_dict(), passes=1, tokenizer="bytes",
                    step=0), path)
    return str(path)
