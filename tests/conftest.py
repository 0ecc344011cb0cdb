import os
import socket
import sys

import pytest

# Tests import the flat scripts (model.py, train.py, ...) from the repository root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def free_port():
    """A free TCP port on 127.0.0.1 for torch.distributed rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    """A small offline token pool (byte tokenizer, stdlib corpus) for short training runs."""
    import data
    out = str(tmp_path_factory.mktemp("pool"))
    data.prepare("stdlib", out, tokenizer="bytes", train_tokens=300_000, val_tokens=20_000)
    return out
