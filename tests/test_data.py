"""Tests for data.py: pool preparation (FineWeb split and de-dup and FineWeb-Edu against a local HTTP server that
answers as the Hugging Face Hub does, stdlib, local files, resume), the loader's world-size invariance, CLI errors."""
import hashlib, io, json, os, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import arms, data


FW = data.CORPORA["fineweb"]
EDU = data.CORPORA["fineweb-edu"]


class FakeHub(BaseHTTPRequestHandler):
    """The two Hub endpoints huggingface_hub uses here: a folder's tree listing and a file's resolve (HEAD + GET)."""
    files = {}         # "repo/revision/path" -> bytes
    listed_sha = {}    # key -> the sha256 the listing claims (default: the true one)
    log = []           # paths requested

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.do_GET(send_body=False)

    def do_GET(self, send_body=True):
        path = unquote(urlparse(self.path).path)
        self.log.append(path)
        if path.startswith("/api/datasets/"):
            repo, _, tail = path[len("/api/datasets/"):].partition("/tree/")
            revision, _, folder = tail.partition("/")
            entries = [dict(type="file", path=k[len(f"{repo}/{revision}/"):], size=len(v), oid="0" * 40,
                            lfs=dict(oid=self.listed_sha.get(k, hashlib.sha256(v).hexdigest()), size=len(v),
                                     pointerSize=134))
                       for k, v in self.files.items() if k.startswith(f"{repo}/{revision}/{folder}/")]
            body, headers = json.dumps(entries).encode(), {}
        else:
            repo, _, key_tail = path[len("/datasets/"):].partition("/resolve/")
            body = self.files.get(f"{repo}/{key_tail}")
            headers = {"ETag": f'"{hashlib.sha256(body or b"").hexdigest()}"', "X-Repo-Commit": key_tail.split("/")[0]}
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if send_body and body:
            self.wfile.write(body)


@pytest.fixture
def hub(monkeypatch):
    FakeHub.files, FakeHub.listed_sha, FakeHub.log = {}, {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    yield url
    server.shutdown()


def parquet_bytes(texts):
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": [f"doc{i}" for i in range(len(texts))], "text": texts}), buf)
    return buf.getvalue()


def byte_tokens(text):
    return [256] + list(text.encode("utf-8"))


def read_split(out, split):
    pool = data.load_pool(out, split, verify_hash=True)
    ends = list(pool.doc_starts[1:]) + [len(pool.tokens)]
    return [pool.tokens[a:b].tolist() for a, b in zip(pool.doc_starts, ends)], pool.manifest


def main_error(capsys, args, *words):
    """data.main in-process (the CLI's code path): exit 2 and one line, after any download progress lines."""
    capsys.readouterr()
    assert data.main(args) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if not l.startswith("downloading ")]
    assert len(lines) == 1 and lines[0].startswith("data.py: error:") and all(w in lines[0] for w in words), lines


# --- FineWeb / FineWeb-Edu preparation against the fake hub

def test_prepare_fake_fineweb_splits_and_dedups(hub, tmp_path):
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "ζeta", "theta", "iota", "kappa"]

    def doc(n):
        return " ".join(rng.choice(words, n))

    val0 = [doc(30) for _ in range(5)]
    val0[3] = "plain ascii words, so that characters are tokens: " + doc(20)
    val1 = [doc(30) for _ in range(3)]
    near = val0[2][:64] + " something else entirely"            # same first 64 body bytes -> duplicate
    not_quite = val0[3][:63] + "#" + val0[3][64:]                 # differs at body token 64 -> kept
    train0 = [doc(40), val0[1], doc(10)]
    train1 = [near, doc(25), not_quite]
    base = f"{FW['repo']}/{FW['revision']}"
    for name, texts in (("sample/10BT/000_00000.parquet", val0), ("sample/10BT/001_00000.parquet", val1),
                        ("sample/100BT/000_00000.parquet", train0), ("sample/100BT/000_00001.parquet", train1)):
        FakeHub.files[f"{base}/{name}"] = parquet_bytes(texts)
    val_budget = sum(len(byte_tokens(t)) for t in val0) - 7       # fits in shard 0; its last doc is truncated

    out = str(tmp_path / "fw")
    assert data.main(["prepare", "--corpus", "fineweb", "--tokenizer", "bytes", "--out", out, "--workers", "1",
                      "--val-tokens", str(val_budget)]) == 0

    val_docs, manifest = read_split(out, "val")
    assert val_docs == [byte_tokens(t) for t in val0[:-1]] + [byte_tokens(val0[-1])[:-7]]
    train_docs, _ = read_split(out, "train")
    assert train_docs == [byte_tokens(t) for t in (train0[0], train0[2], train1[1], not_quite)]
    assert manifest["status"] == "complete" and manifest["revision"] == FW["revision"]
    assert manifest["dedup_skipped_docs"] == 2
    assert manifest["splits"]["val"]["token_count"] == val_budget
    requested = {p for p in FakeHub.log if "datasets/" in p}  # huggingface_hub also asks /api/agent-harnesses
    assert all(FW["revision"] in p for p in requested), requested
    assert not any("001_00000" in p for p in requested)           # val was full: no needless download
    assert not os.path.exists(os.path.join(out, "downloads"))     # consumed shards are removed


def test_prepare_fake_fineweb_edu_uses_shard_0_for_validation(hub, tmp_path):
    shards = [["first shard doc one", "first shard doc two"], ["second shard"], ["third shard", "first shard doc one"]]
    for i, texts in enumerate(shards):
        FakeHub.files[f"{EDU['repo']}/{EDU['revision']}/sample/100BT/{i:03d}_00000.parquet"] = parquet_bytes(texts)
    out = str(tmp_path / "edu")
    assert data.main(["prepare", "--corpus", "fineweb-edu", "--tokenizer", "bytes", "--out", out,
                      "--workers", "1"]) == 0
    assert read_split(out, "val")[0] == [byte_tokens(t) for t in shards[0]]
    assert read_split(out, "train")[0] == [byte_tokens(t) for t in shards[1] + shards[2]]  # no de-dup for Edu


def test_a_hub_file_that_does_not_match_its_listed_sha256_is_one_line(hub, tmp_path, capsys):
    key = f"{EDU['repo']}/{EDU['revision']}/sample/100BT/000_00000.parquet"
    FakeHub.files[key] = parquet_bytes(["some text"])
    FakeHub.listed_sha[key] = "0" * 64
    main_error(capsys, ["prepare", "--corpus", "fineweb-edu", "--tokenizer", "bytes", "--out", str(tmp_path / "p")],
               "does not match its sha256")
    main_error(capsys, ["prepare", "--corpus", "fineweb", "--tokenizer", "bytes", "--out", str(tmp_path / "q")],
               "no parquet files under")


# --- Offline corpora, tokenizer, resume

def test_bytes_tokenizer_is_lossless_and_counts_bytes():
    enc = data.get_tokenizer("bytes")
    text = "héllo wörld 中文 🎉 \x00\t\r\n" + "".join(chr(c) for c in range(0x20, 0x3000, 7))
    ids = enc.encode_ordinary(text)
    assert ids == list(text.encode("utf-8")) and enc.decode(ids) == text
    assert enc.n_vocab == 257 and enc.eot_token == 256
    lengths = data.token_byte_lengths(enc)
    assert lengths[256] == 0 and (lengths[:256] == 1).all()


def test_gpt2_vocabulary_offline_is_one_line(tmp_path, capsys, monkeypatch):
    import tiktoken
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: (_ for _ in ()).throw(ConnectionError("offline")))
    main_error(capsys, ["prepare", "--corpus", "stdlib", "--out", str(tmp_path / "p")], "gpt2", "--tokenizer bytes")
    assert not (tmp_path / "p").exists()  # before anything is written


def test_prepare_stdlib_small_budget(tmp_path, capsys):
    out = str(tmp_path / "stdlib")
    assert data.main(["prepare", "--corpus", "stdlib", "--tokenizer", "bytes", "--out", out, "--train-tokens",
                      "200000"]) == 0
    train = data.load_pool(out, "train", verify_hash=True)
    val = data.load_pool(out, "val")
    assert len(train.tokens) == 200_000 and len(val.tokens) > 100_000   # val: every hash-selected file
    first_train = next(s for s in data.list_sources("stdlib") if s["split"] == "train")
    text = open(first_train["path"], encoding="utf-8").read()
    assert train.tokens[:1 + len(text.encode())].tolist()[:1000] == byte_tokens(text)[:1000]
    args = ["prepare", "--corpus", "stdlib", "--tokenizer", "bytes", "--out", out, "--train-tokens"]
    capsys.readouterr()
    assert data.main(args + ["200000"]) == 0
    assert "already complete" in capsys.readouterr().err
    main_error(capsys, args + ["300000"], "other settings")     # a finished pool is never overwritten
    assert data.load_pool(out, "train").manifest == train.manifest


def make_local_files(root):
    os.makedirs(root / "sub")
    texts = [f"document number {i}: " + "lorem ipsum " * (i % 7) for i in range(120)]
    (root / "a.txt").write_text("a whole text file is one document\nwith two lines")
    with open(root / "sub" / "b.jsonl", "w") as f:
        for t in texts[:60]:
            f.write(json.dumps({"text": t, "meta": 1}) + "\n")
    pq.write_table(pa.table({"text": texts[60:]}), root / "sub" / "c.parquet")
    return ["a whole text file is one document\nwith two lines"] + texts


def test_prepare_files_corpus_and_hash_split_on_two_worker_processes(tmp_path):
    """Two tokenising processes, started with spawn (a fork of this process, torch loaded, once hung in pytest)."""
    texts = make_local_files(tmp_path / "in")
    out = str(tmp_path / "out")
    assert data.main(["prepare", "--corpus", "files", "--files", str(tmp_path / "in" / "**" / "*.*"), "--tokenizer",
                      "bytes", "--out", out, "--workers", "2"]) == 0
    is_val = [data._hash_mod(t, 50) == 0 for t in texts]
    assert any(is_val) and not all(is_val)
    assert read_split(out, "train")[0] == [byte_tokens(t) for t, v in zip(texts, is_val) if not v]
    assert read_split(out, "val")[0] == [byte_tokens(t) for t, v in zip(texts, is_val) if v]


def test_interrupted_prepare_resumes_to_the_same_pool(tmp_path, monkeypatch):
    texts = make_local_files(tmp_path / "in")
    for i in range(6):
        (tmp_path / "in" / f"extra{i}.txt").write_text(texts[i] * 3)
    args = ["prepare", "--corpus", "files", "--files", str(tmp_path / "in" / "**" / "*.*"), "--tokenizer", "bytes",
            "--workers", "1"]
    assert data.main(args + ["--out", str(tmp_path / "clean")]) == 0

    monkeypatch.setattr(data, "CHECKPOINT_EVERY_S", 0.0)
    monkeypatch.setattr(data, "BATCH_DOCS", 1)
    real_read, calls = data.read_texts, []

    def dying_read(path):
        calls.append(path)
        if len(calls) == 5:
            raise KeyboardInterrupt  # killed in the middle of the run
        return real_read(path)

    monkeypatch.setattr(data, "read_texts", dying_read)
    out = str(tmp_path / "resumed")
    assert data.main(args + ["--out", out]) == 130  # interrupted
    manifest = json.load(open(os.path.join(out, "corpus.json")))
    assert manifest["status"] == "running" and manifest["sources_done"] == 4
    with open(os.path.join(out, "train.bin"), "ab") as f:
        f.write(b"\x01\x02garbage written after the last checkpoint")
    with pytest.raises(data.UsageError, match="incomplete"):
        data.load_pool(out, "train")
    monkeypatch.setattr(data, "read_texts", real_read)
    assert data.main(args + ["--out", out]) == 0
    assert len(os.listdir(tmp_path / "in")) == 8  # the sources are read, never touched
    for split in data.SPLITS:
        assert read_split(out, split)[0] == read_split(str(tmp_path / "clean"), split)[0]
        assert (json.load(open(os.path.join(out, "corpus.json")))["splits"][split]["sha256"]
                == json.load(open(tmp_path / "clean" / "corpus.json"))["splits"][split]["sha256"])


def test_prepare_writes_where_the_cpu_preset_reads(tmp_path, monkeypatch):
    """prepare's --out defaults to data/CORPUS, the cpu preset's folder; a second prepare finds it complete."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(data.CORPORA["stdlib"], "train_tokens", 30_000)
    monkeypatch.setitem(data.CORPORA["stdlib"], "val_tokens", 5_000)
    out = arms.PRESETS["cpu"].data_dir
    data.prepare("stdlib", out, tokenizer="bytes")
    stamp = os.path.getmtime(os.path.join(out, "train.bin"))
    assert data.main(["prepare", "--corpus", "stdlib", "--tokenizer", "bytes"]) == 0  # the same pool: complete
    assert os.path.getmtime(os.path.join(out, "train.bin")) == stamp and out == os.path.join("data", "stdlib")
    assert len(data.load_pool(out, "val").tokens) == 5_000


# --- Loader

def synthetic_pool(n_docs=150, seed=0):
    rng = np.random.default_rng(seed)
    docs = [np.concatenate(([256], rng.integers(0, 256, rng.integers(1, 300)))) for _ in range(n_docs)]
    tokens = np.concatenate(docs).astype(np.uint16)
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]]).astype(np.int64)
    return data.Pool(tokens, starts, {}, "train")


def reference_epoch(pool, seq_len, batch, epoch, token_limit=None, seed=42):
    """The release's packing (docs/recipe.md, "Data") written the obvious (materialising) way."""
    n = len(pool.tokens) if token_limit is None else token_limit
    starts = pool.doc_starts[pool.doc_starts < n]
    ends = np.append(starts[1:], n)
    g = torch.Generator()
    g.manual_seed((seed + epoch * 1_000_003 + 0 * 101) % (2 ** 63 - 1))
    stream = np.concatenate([pool.tokens[starts[i]:ends[i]] for i in torch.randperm(len(starts), generator=g)])
    w = seq_len + 1
    windows = stream[:n // w * w].reshape(-1, w)
    g.manual_seed((seed + epoch * 1_000_003 + 1 * 101) % (2 ** 63 - 1))
    order = torch.randperm(len(windows), generator=g)[:len(windows) // batch * batch]
    return torch.from_numpy(windows[order.numpy()].astype(np.int64))


def test_loader_matches_the_release_packing_and_resumes_at_any_step():
    pool = synthetic_pool()
    loader = data.TrainLoader(pool, seq_len=16, batch_seqs=8, token_limit=len(pool.tokens) - 100)
    steps = loader.steps_per_epoch
    assert steps == (len(pool.tokens) - 100) // 17 // 8
    for epoch in (2, 1):  # epoch 2 first: a fresh loader (a resumed run) starts anywhere
        expected = reference_epoch(pool, 16, 8, epoch, token_limit=len(pool.tokens) - 100)
        got = [loader.batch((epoch - 1) * steps + s) for s in range(steps)]
        assert all(e == epoch for e, _ in got)
        assert torch.equal(torch.cat([b for _, b in got]), expected)
    assert not torch.equal(loader.batch(0)[1], loader.batch(steps)[1])   # epoch 2 packs differently
    assert not torch.equal(data.TrainLoader(pool, 16, 8, len(pool.tokens) - 100, seed=43).batch(0)[1],
                           loader.batch(0)[1])


def test_loader_is_independent_of_world_size_and_micro_batch():
    pool = synthetic_pool()
    loader = data.TrainLoader(pool, seq_len=32, batch_seqs=8, seed=7)
    for step in (0, 5, loader.steps_per_epoch + 3):
        full = loader.batch(step)[1]
        assert full.shape == (8, 33) and full.dtype == torch.int64
        for world in (2, 4):
            for micro in (1, 2):
                parts = [m for r in range(world) for m in loader.batch(step, r, world)[1].split(micro)]
                assert all(p.shape == (micro, 33) for p in parts)
                assert torch.equal(torch.cat(parts), full)


def test_loader_release_numbers_for_the_data_constrained_pool():
    tokens = np.broadcast_to(np.uint16(7), (150_000_000,))      # 150M-token pool without the memory
    starts = np.arange(0, 150_000_000, 1_000_000, dtype=np.int64)
    loader = data.TrainLoader(data.Pool(tokens, starts, {}, "train"), 2048, 256, token_limit=100_000_000)
    assert loader.n_windows == 48_804 and loader.steps_per_epoch == 190
    with pytest.raises(data.UsageError, match="fewer than one batch"):
        data.TrainLoader(data.Pool(tokens[:1000], starts[:1], {}, "train"), 2048, 256)


def test_val_windows_in_file_order_with_exact_token_count():
    pool = synthetic_pool()
    v = data.val_windows(pool, seq_len=64, target_tokens=1000)
    assert v.shape == (15, 65) and v[:, 1:].numel() == 15 * 64
    assert torch.equal(v.flatten(), torch.from_numpy(pool.tokens[:15 * 65].astype(np.int64)))
    assert torch.equal(v, data.val_windows(pool, 64, 1000))
    with pytest.raises(data.UsageError, match="validation needs"):
        data.val_windows(pool, 64, len(pool.tokens))


def test_the_hash_finds_a_flipped_token(tmp_path):
    make_local_files(tmp_path / "in")
    out = str(tmp_path / "pool")
    assert data.main(["prepare", "--corpus", "files", "--files", str(tmp_path / "in" / "**" / "*.*"), "--tokenizer",
                      "bytes", "--out", out]) == 0
    with open(os.path.join(out, "train.bin"), "r+b") as f:   # one flipped token
        f.seek(10)
        f.write(b"\xff\xff")
    data.load_pool(out, "train")                             # memory-mapped as it is ...
    with pytest.raises(data.UsageError, match="train.bin does not match its sha256"):  # ... the hash tells
        data.load_pool(out, "train", verify_hash=True)


def test_two_prepares_of_one_pool_started_together_both_get_the_pool(tmp_path, capsys):
    """Two train.py runs started together in a fresh clone both prepared data/stdlib: one was refused as incomplete,
    the other died in a FileNotFoundError. Now the second waits for the first's prepare.lock and uses its pool."""
    out, manifests = str(tmp_path / "pool"), []
    prepare = lambda: manifests.append(data.prepare("stdlib", out, "bytes", 200_000, 20_000, workers=1))
    threads = [threading.Thread(target=prepare) for _ in range(2)]  # flock: each open() of the lock file is its own
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(manifests) == 2 and manifests[0]["splits"] == manifests[1]["splits"]
    assert "already complete" in capsys.readouterr().err
    for split in data.SPLITS:
        assert len(data.load_pool(out, split, verify_hash=True).tokens) > 0
