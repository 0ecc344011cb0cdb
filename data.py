"""Token pools and the training/validation loaders (docs/recipe.md, "Data").

    python data.py prepare --corpus stdlib --tokenizer bytes --out data/stdlib   # offline, < 1 min
    python data.py prepare ... --if-missing    # no-op when --out already holds a complete pool
    python data.py prepare --corpus fineweb --out data/fineweb                   # GPT-2 tokens, downloads FineWeb
    python data.py prepare --corpus files --files 'corpus/**/*.jsonl' --tokenizer bytes --out data/mine
    python data.py verify data/stdlib          # check sizes and sha256 of a pool
    python data.py bench                       # tokenizer throughput, loader cost vs a tiny model step

A pool directory holds, per split ("train", "val"): `<split>.bin` (flat uint16 tokens, memory-mappable),
`<split>.docs.bin` (int64 offset of each document's BOS; the first is 0) and one `corpus.json` manifest
(corpus, revision, tokenizer, counts, sha256, sources, status). Every document is [BOS] + tokens, no EOS.
Pools are written incrementally with a checkpoint in corpus.json after each finished source, so a prepare
that was interrupted anywhere resumes from the last checkpoint when re-run; "status": "complete" is written last.
train.py records the token files whose sha256 it has checked in `verified.json` (check_pool_hashes).

Corpora: FineWeb / FineWeb-Edu at pinned Hugging Face revisions (endpoint from $HF_ENDPOINT, token from
$HF_TOKEN); "stdlib", the running interpreter's standard-library .py files (validation = files with
sha1(relative path) mod 50 == 0); "files", local .txt / .jsonl ("text" field) / .parquet ("text" column)
files (validation = documents with sha1(text) mod 50 == 0).

TrainLoader reproduces the release's packing (docs/recipe.md): what optimizer step s sees depends only on (seed, s), never on
the world size or micro-batch size, so resuming is just continuing at the step.
"""
import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import multiprocessing
import os
import signal
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

from common import (OBJECT, TEXT, Parser, UsageError, answer_help, check_record, cli_main, download, each, exit_process,
                    hf_auth_headers, hf_list, hf_url, integer, record_error, rule, sha256_file, whole, write_json)

# Corpus recipes (docs/recipe.md, "Data"). Budgets are in tokens (BOS included); None = everything the sources hold.
CORPORA = {
    "fineweb": dict(repo="HuggingFaceFW/fineweb", revision="9bb295ddab0e05d785b879661af7260fed5140fc",
                    val_dir="sample/10BT", train_dir="sample/100BT", dedup=True,
                    val_tokens=10_000_000, train_tokens=30_000_000_000),
    "fineweb-edu": dict(repo="HuggingFaceFW/fineweb-edu", revision="87f09149ef4734204d70ed1d046ddc9ca3f2b8f9",
                        val_dir=None, train_dir="sample/100BT", dedup=False,  # val = shard 0 of train_dir
                        val_tokens=10_200_000, train_tokens=40_000_000_000),
    "stdlib": dict(val_every=50, val_tokens=None, train_tokens=None),
    "files": dict(val_every=50, val_tokens=None, train_tokens=None),
}
BATCH_DOCS = 4096                  # documents tokenised per round of the worker pool
BATCH_CHARS = 64 << 20             # ... or fewer, if their text is longer than this
CHECKPOINT_EVERY_S = 10.0          # min seconds between manifest checkpoints (remote shards always checkpoint)
SIGNATURE_TOKENS = 64              # FineWeb de-dup: SHA-1 of the first <= 64 body tokens, uint32 LE
EPOCH_SEED_STRIDE, STAGE_SEED_STRIDE = 1_000_003, 101   # loader seeds: seed + epoch*1,000,003 + stage*101
MAX_WORKERS = 1024                 # --workers: tokeniser processes
SPLITS = ("train", "val")

# The pool records data.py and train.py read back, field -> rule (common.check_record; "name?": may be absent), each
# checked before its fields are used: a corpus.json of the wrong shape is one line naming the file and the field.
SHA256 = rule("a sha256 (64 hex digits)", lambda v: isinstance(v, str) and len(v) == 64 and
              all(c in "0123456789abcdef" for c in v))
SPLIT_RECORD = {"token_count": whole(0), "doc_count": whole(0)}
MANIFEST_SCHEMA = {"status": TEXT, "splits": OBJECT}  # any corpus.json, of a prepare running or complete
RESUMABLE_SCHEMA = {"sources": each(TEXT), "sources_done": whole(0), "dedup_skipped_docs": whole(0),
                    "splits": {s: SPLIT_RECORD for s in SPLITS}}  # an interrupted prepare that resumes
COMPLETE_SCHEMA = {"tokenizer": TEXT, "splits": {s: dict(SPLIT_RECORD, sha256=SHA256) for s in SPLITS}}
VERIFIED_SCHEMA = {f"{s}.bin?": rule("[size, mtime_ns, ctime_ns, sha256]", lambda v: isinstance(v, list) and len(v) == 4
                                     and all(isinstance(x, int) for x in v[:3]) and isinstance(v[3], str))
                   for s in SPLITS}  # verified.json, the pool's record of files already hashed


class DataError(UsageError):
    """A problem with the inputs or a pool; the message is one line that says what to do."""


# ---------------------------------------------------------------------------------------------------------------
# Command line, here so that --help answers before torch loads (run, at the end, does what it parsed)

def build_parser():
    parser = Parser(prog="data.py", description="Token pools: prepare, verify, bench.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenise a corpus into a pool directory")
    p.add_argument("--corpus", required=True, help=" | ".join(CORPORA))
    p.add_argument("--out", default=None, help="pool directory (default: data/CORPUS, the folder train.py's presets "
                   "read: data/fineweb for paper, data/stdlib for cpu)")
    p.add_argument("--train-tokens", type=integer(1, 2 ** 48), help="train budget in tokens (default: corpus recipe)")
    p.add_argument("--val-tokens", type=integer(1, 2 ** 40), help="val budget in tokens (default: corpus recipe)")
    p.add_argument("--tokenizer", default="gpt2", help="gpt2 (default) | bytes (offline)")
    p.add_argument("--files", help="glob of .txt/.jsonl/.parquet files for --corpus files")
    p.add_argument("--workers", type=integer(1, MAX_WORKERS), help="tokeniser processes (default: all CPUs)")
    p.add_argument("--if-missing", action="store_true",
                   help="do nothing if --out already holds a complete pool (no settings check, no hashing)")
    v = sub.add_parser("verify", help="check a pool's sizes and sha256")
    v.add_argument("out", help="pool directory")
    b = sub.add_parser("bench", help="print tokeniser throughput and loader cost")
    b.add_argument("--tokenizer", default="bytes")
    b.add_argument("--workers", type=integer(1, MAX_WORKERS), default=os.cpu_count() or 1)
    b.add_argument("--seq-len", type=integer(1, 2 ** 16), default=512)
    b.add_argument("--batch-seqs", type=integer(1, 2 ** 12), default=32)
    b.add_argument("--steps", type=integer(1, 10 ** 4), default=20)
    return parser


if __name__ == "__main__":
    answer_help(build_parser)  # before torch, tiktoken and pyarrow load (2 s on 2 cores)

import numpy as np
import pyarrow.parquet as pq
import tiktoken
import torch
import torch.distributed as dist


# ---------------------------------------------------------------------------------------------------------------
# Tokenizers

def get_tokenizer(name):
    """tiktoken Encoding: "gpt2" (downloads its vocab on first use) or "bytes" (offline, 256 bytes + BOS)."""
    if name == "gpt2":
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception as e:  # tiktoken fetches the vocab over the network; any failure means "not available"
            raise DataError(f"cannot load tiktoken's gpt2 vocabulary ({type(e).__name__}); it is downloaded on "
                            f"first use, so run once with internet access or use --tokenizer bytes") from None
    if name == "bytes":
        # No merges, so every UTF-8 byte is its own token; the pattern only cuts text into pieces and matches
        # every character (tiktoken drops unmatched text), so encoding is lossless.
        return tiktoken.Encoding(name="bytes", pat_str=r"(?s:.{1,4096})",
                                 mergeable_ranks={bytes([i]): i for i in range(256)},
                                 special_tokens={"<|endoftext|>": 256})
    raise DataError(f"unknown tokenizer {name!r}; choose gpt2 or bytes")


def token_byte_lengths(enc):
    """Bytes of each token id (0 for BOS/<|endoftext|>), for bits-per-byte."""
    lengths = np.zeros(enc.n_vocab, dtype=np.int64)
    for i in range(enc.n_vocab):
        if i != enc.eot_token:
            lengths[i] = len(enc.decode_single_token_bytes(i))
    return lengths


_worker_enc = None


def _init_worker(tokenizer):
    """A tokenising worker: SIGTERM (the pool's terminate at its end) ends it quietly, SIGINT is its parent's to
    handle; the handlers a fork inherits (train.py's, which raise) would print a traceback per worker."""
    global _worker_enc
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_enc = get_tokenizer(tokenizer)


def _encode_docs(texts):
    """Worker: [BOS] + encode_ordinary(text) for each text, as uint16 arrays."""
    bos = _worker_enc.eot_token
    return [np.array([bos] + _worker_enc.encode_ordinary(t), dtype=np.uint16) for t in texts]


# ---------------------------------------------------------------------------------------------------------------
# Sources: an ordered list of files, each feeding "train", "val" or (split="by-doc") both by document hash

def _hash_mod(key, every):
    return int.from_bytes(hashlib.sha1(key.encode("utf-8", "surrogatepass")).digest()[:8], "big") % every


def corpus_settings(corpus, files_glob=None):
    """What identifies a pool's content besides tokenizer and budgets (compared when re-running prepare)."""
    if corpus not in CORPORA:
        raise DataError(f"unknown corpus {corpus!r}; choose one of {', '.join(CORPORA)}")
    if (corpus == "files") != bool(files_glob):
        raise DataError("--files GLOB is required with --corpus files and only allowed there "
                        "(e.g. --files 'texts/**/*.jsonl')")
    recipe = CORPORA[corpus]
    if corpus in ("fineweb", "fineweb-edu"):
        return dict(corpus=corpus, repo=recipe["repo"], revision=recipe["revision"])
    if corpus == "stdlib":
        return dict(corpus=corpus, root=sysconfig.get_paths()["stdlib"], python=sys.version.split()[0])
    return dict(corpus=corpus, files=files_glob)


def list_sources(corpus, files_glob=None):
    """Ordered list of sources: dicts with name, split and either path (local) or url, size, sha256."""
    recipe = CORPORA[corpus]
    if corpus in ("fineweb", "fineweb-edu"):
        repo, rev = recipe["repo"], recipe["revision"]
        train = hf_list(repo, rev, recipe["train_dir"])
        if recipe["val_dir"]:
            val = hf_list(repo, rev, recipe["val_dir"])
        else:
            val, train = train[:1], train[1:]
        return [dict(name=f["path"], url=hf_url(repo, rev, f["path"]), size=f["size"], sha256=f["sha256"],
                     split=split) for split, group in (("val", val), ("train", train)) for f in group]
    if corpus == "stdlib":
        root = sysconfig.get_paths()["stdlib"]
        names = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
            names += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith(".py")]
        return [dict(name=n, path=os.path.join(root, n),
                     split="val" if _hash_mod(n, recipe["val_every"]) == 0 else "train") for n in sorted(names)]
    paths = sorted(p for p in glob.glob(files_glob, recursive=True) if os.path.isfile(p))
    bad = [p for p in paths if not p.endswith((".txt", ".jsonl", ".parquet"))]
    if bad:
        raise DataError(f"unsupported file {bad[0]}; --files must match only .txt, .jsonl or .parquet files")
    if not paths:
        raise DataError(f"--files {files_glob!r} matches no files")
    return [dict(name=os.path.abspath(p), path=os.path.abspath(p), split="by-doc") for p in paths]


def read_texts(path):
    """Documents of a local file, in file order: .txt/.py = one document, .jsonl = "text" field per line,
    .parquet = "text" column."""
    if path.endswith(".parquet"):
        try:
            pf = pq.ParquetFile(path)
            for batch in pf.iter_batches(columns=["text"], batch_size=1024):
                yield from batch.column(0).to_pylist()
        except (KeyError, ValueError, OSError) as e:  # pyarrow reports a missing column / bad file this way
            raise DataError(f"cannot read a 'text' column from {path}: {e}".splitlines()[0]) from None
    elif path.endswith(".jsonl"):
        with open(path, "rb") as f:  # binary: lines end at \n only, so line numbers are the editor's
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    try:
                        text = json.loads(line.decode("utf-8"))["text"]
                    except UnicodeDecodeError:
                        raise DataError(f"{path}:{line_no}: not UTF-8 text") from None
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise DataError(f"{path}:{line_no}: not a JSON object with a 'text' field") from None
                    if not isinstance(text, str):
                        raise DataError(f"{path}:{line_no}: the 'text' field is not a string")
                    yield text
    else:
        with open(path, "rb") as f:
            raw = f.read()
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:  # the stdlib ships a few deliberately non-UTF-8 test files; skip them
            if not path.endswith(".py"):
                raise DataError(f"{path} is not UTF-8 text") from None


# ---------------------------------------------------------------------------------------------------------------
# Pool writing (incremental, checkpointed, resumable)

def _token_path(out, split):
    return os.path.join(out, f"{split}.bin")


def _docs_path(out, split):
    return os.path.join(out, f"{split}.docs.bin")


def _write_manifest(out, manifest):
    write_json(os.path.join(out, "corpus.json"), manifest)


class PoolWriter:
    """Appends documents to both splits with token budgets and (optionally) FineWeb signature de-dup."""

    def __init__(self, out, manifest, resume):
        self.out, self.manifest = out, manifest
        self.budget = manifest["budgets"]
        self.count = {s: manifest["splits"][s]["token_count"] for s in SPLITS}
        self.docs = {s: manifest["splits"][s]["doc_count"] for s in SPLITS}
        self.files = {}
        for s in SPLITS:
            for path, size in ((_token_path(out, s), 2 * self.count[s]), (_docs_path(out, s), 8 * self.docs[s])):
                f = open(path, "r+b" if resume else "w+b")
                f.truncate(size)  # drop anything written after the last checkpoint
                f.seek(size)
                self.files[path] = f
        self.buffered = {s: ([], []) for s in SPLITS}  # (token arrays, doc starts) not yet written
        self.val_signatures = None

    def wants(self, split):
        return self.budget[split] is None or self.count[split] < self.budget[split]

    def add(self, split, tokens):
        if not self.wants(split):
            return
        if split == "train" and self.manifest["dedup"]:
            if self.val_signatures is None:
                self.val_signatures = self._signatures("val")
            if _signature(tokens) in self.val_signatures:
                self.manifest["dedup_skipped_docs"] += 1
                return
        if self.budget[split] is not None:
            tokens = tokens[:self.budget[split] - self.count[split]]  # the last document is truncated
        self.buffered[split][0].append(tokens)
        self.buffered[split][1].append(self.count[split])
        self.count[split] += len(tokens)
        self.docs[split] += 1

    def _signatures(self, split):
        self.flush()
        pool = _open_arrays(self.out, split, self.count[split], self.docs[split])
        ends = np.append(pool[1][1:], len(pool[0]))
        return {_signature(pool[0][a:b]) for a, b in zip(pool[1], ends)}

    def flush(self):
        for s, (token_arrays, starts) in self.buffered.items():
            if starts:
                self.files[_token_path(self.out, s)].write(np.concatenate(token_arrays).tobytes())
                self.files[_docs_path(self.out, s)].write(np.array(starts, dtype=np.int64).tobytes())
                token_arrays.clear()
                starts.clear()
        for f in self.files.values():
            f.flush()

    def checkpoint(self, sources_done):
        self.flush()
        for s in SPLITS:
            self.manifest["splits"][s].update(token_count=self.count[s], doc_count=self.docs[s])
        self.manifest["sources_done"] = sources_done
        _write_manifest(self.out, self.manifest)

    def finish(self):
        self.checkpoint(len(self.manifest["sources"]))
        for f in self.files.values():
            os.fsync(f.fileno())
            f.close()
        for s in SPLITS:
            self.manifest["splits"][s]["sha256"] = sha256_file(_token_path(self.out, s))
        self.manifest.update(status="complete", finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
        _write_manifest(self.out, self.manifest)


def _signature(tokens):
    return hashlib.sha1(np.asarray(tokens[1:1 + SIGNATURE_TOKENS], dtype="<u4").tobytes()).digest()


_END_OF_SOURCE = object()   # stream markers: a source's documents are all yielded ...
_FLUSH = object()           # ... / write everything pending before the next download


def _documents(sources, first, writer, workdir, val_every):
    """(source index, split, text) in pool order, plus markers; skips sources whose splits are full."""
    for k in range(first, len(sources)):
        src = sources[k]
        splits = SPLITS if src["split"] == "by-doc" else (src["split"],)
        if "url" in src:
            yield _FLUSH  # so that writer.wants() below is exact and no needless shard is downloaded
        if any(writer.wants(s) for s in splits):
            if "url" in src:
                print(f"source {k + 1}/{len(sources)}: {src['name']}", file=sys.stderr)
                path = download(src["url"], os.path.join(workdir, src["name"].replace("/", "__")),
                                src["size"], src["sha256"], hf_auth_headers())
            else:
                path = src["path"]
            for text in read_texts(path):
                split = src["split"] if src["split"] != "by-doc" else \
                    ("val" if _hash_mod(text, val_every) == 0 else "train")
                if writer.wants(split):
                    yield k, split, text
        yield k, _END_OF_SOURCE, None


PREPARE_LOCK = "prepare.lock"  # in the pool folder: held (flock) by the process preparing it


@contextlib.contextmanager
def one_prepare_at_a_time(out):
    """Hold out/prepare.lock while preparing: of two train.py runs started together in a fresh clone (or a data.py
    prepare beside them), the second waits here, then finds the first one's pool complete (or resumes it). The kernel
    releases the lock of a process that dies."""
    with open(os.path.join(out, PREPARE_LOCK), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{out}: another process is preparing this pool; waiting for it", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _check_writable(out):
    try:
        os.makedirs(out, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        raise DataError(f"cannot write to --out {out}: {e.strerror}; choose a writable directory") from None


def _start_manifest(out, old, same, settings, names, workdir):
    """-> (manifest, resume): the interrupted prepare's manifest if its settings, sources and files still match, else
    a fresh "running" one (written before any pool file is recreated, with stale partial downloads removed)."""
    if same and old.get("sources") == names:
        check_record(os.path.join(out, "corpus.json"), old, RESUMABLE_SCHEMA, "delete the folder and prepare again",
                     DataError)
    resume = same and old.get("sources") == names and all(
        os.path.exists(p) and os.path.getsize(p) >= size for s in SPLITS for p, size in (
            (_token_path(out, s), 2 * old["splits"][s]["token_count"]),
            (_docs_path(out, s), 8 * old["splits"][s]["doc_count"])))
    if old is not None:
        print(f"{out}: {'resuming' if resume else 'restarting'} an interrupted prepare", file=sys.stderr)
    if resume:
        manifest = old
    else:
        manifest = dict(schema_version=1, status="running", **settings, dtype="uint16", sources=names,
                        sources_done=0, dedup_skipped_docs=0, created=time.strftime("%Y-%m-%dT%H:%M:%S"),
                        splits={s: dict(tokens_file=f"{s}.bin", docs_file=f"{s}.docs.bin", token_count=0,
                                        doc_count=0) for s in SPLITS})
        _write_manifest(out, manifest)
        if os.path.isdir(workdir):  # partial downloads may belong to other settings
            for name in os.listdir(workdir):
                os.remove(os.path.join(workdir, name))
    os.makedirs(workdir, exist_ok=True)
    return manifest, resume


def _refuse_foreign(out, old, settings):
    """A pool is created only where nothing is and resumed only under its own settings: anything else in `out` (a
    folder without corpus.json, another corpus's or budget's interrupted prepare) is refused, never overwritten."""
    if old is None:
        if os.path.isdir(out) and set(os.listdir(out)) - {PREPARE_LOCK}:
            raise DataError(f"{out} is not empty and holds no pool (no corpus.json); use a new or empty --out")
        return
    if not isinstance(old, dict) or "status" not in old or "splits" not in old:
        raise DataError(f"{out}/corpus.json is not a data.py pool manifest; use another --out")
    if old.get("status") != "complete" and any(old.get(k) != v for k, v in settings.items()):
        differ = ", ".join(f"{k} {old.get(k)!r}" for k, v in settings.items() if old.get(k) != v)
        raise DataError(f"{out} holds an unfinished prepare with other settings ({differ}); re-run that prepare to "
                        f"finish it, or use another --out")


def confirm_complete(out, old, same):
    """True when `out` already holds this complete pool (every file's hash checked); refuses one with other
    settings."""
    if old is None or old.get("status") != "complete":
        return False
    if not same:
        raise DataError(f"{out} already holds a complete {old.get('corpus')} pool with other settings; "
                        f"use another --out or delete it first")
    for split in SPLITS:
        load_pool(out, split, verify_hash=True)
    print(f"{out}: pool already complete and verified", file=sys.stderr)
    return True


def prepare(corpus, out, tokenizer="gpt2", train_tokens=None, val_tokens=None, files_glob=None, workers=None):
    """Build, resume or confirm the pool in `out`. Returns its finished manifest. A full disk stops it with one line
    (DataError); what was checkpointed stays, and the same command resumes from there once there is room."""
    try:
        with contextlib.ExitStack() as held:
            return _prepare(corpus, out, tokenizer, train_tokens, val_tokens, files_glob, workers, held)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DataError(f"cannot write the pool {out}: {e.strerror}; free space and re-run the same command (it "
                        "resumes from its last checkpoint)") from None


def _prepare(corpus, out, tokenizer, train_tokens, val_tokens, files_glob, workers, held):
    settings = corpus_settings(corpus, files_glob)
    enc = get_tokenizer(tokenizer)  # fail early (e.g. gpt2 offline) before anything is downloaded
    if enc.n_vocab > 1 << 16:
        raise DataError(f"tokenizer {tokenizer} has {enc.n_vocab} tokens; pools store uint16")
    _check_writable(out)
    held.enter_context(one_prepare_at_a_time(out))
    recipe = CORPORA[corpus]
    budgets = dict(train=train_tokens if train_tokens is not None else recipe["train_tokens"],
                   val=val_tokens if val_tokens is not None else recipe["val_tokens"])
    settings.update(tokenizer=tokenizer, vocab_size=enc.n_vocab, bos_id=enc.eot_token, budgets=budgets,
                    dedup=recipe.get("dedup", False))

    old = _read_manifest(out)
    _refuse_foreign(out, old, settings)
    same = old is not None and all(old.get(k) == v for k, v in settings.items())
    if confirm_complete(out, old, same):
        return old
    sources = list_sources(corpus, files_glob)
    workdir = os.path.join(out, "downloads")
    manifest, resume = _start_manifest(out, old, same, settings, [s["name"] for s in sources], workdir)
    writer = PoolWriter(out, manifest, resume)
    workers = workers or os.cpu_count() or 1
    n_groups = 4 * workers
    t0 = last_checkpoint = time.time()
    tokenized = 0
    pending, pending_chars = [], dict(train=0, val=0)

    def write_pending():
        nonlocal tokenized, last_checkpoint
        texts = [text for _, split, text in pending if split is not _END_OF_SOURCE]
        encoded = pool.map(_encode_docs, [texts[g::n_groups] for g in range(n_groups)])  # strided: balanced
        docs = iter([encoded[i % n_groups][i // n_groups] for i in range(len(texts))])
        for k, split, _ in pending:
            if split is not _END_OF_SOURCE:
                doc = next(docs)
                tokenized += len(doc)
                writer.add(split, doc)
            elif "url" in sources[k] or time.time() - last_checkpoint > CHECKPOINT_EVERY_S:
                writer.checkpoint(k + 1)
                last_checkpoint = time.time()
                shard = os.path.join(workdir, sources[k]["name"].replace("/", "__"))
                if os.path.exists(shard):  # consumed and checkpointed: not needed any more
                    os.remove(shard)
        pending.clear()
        pending_chars.update(train=0, val=0)

    def batch_full():
        # Flush early once a split's pending text could roughly fill its remaining budget, so that little text
        # is tokenised only to be dropped (efficiency only: the writer enforces the budgets exactly).
        near_budget = any(writer.wants(s) and budgets[s] is not None
                          and pending_chars[s] >= budgets[s] - writer.count[s] for s in SPLITS)
        return len(pending) >= BATCH_DOCS or sum(pending_chars.values()) >= BATCH_CHARS or near_budget

    with multiprocessing.get_context("fork").Pool(workers, _init_worker, (tokenizer,)) as pool:
        for item in _documents(sources, manifest["sources_done"], writer, workdir, recipe.get("val_every", 1)):
            if item is not _FLUSH:
                pending.append(item)
                if item[1] is not _END_OF_SOURCE:
                    pending_chars[item[1]] += len(item[2])
            if item is _FLUSH or batch_full():
                write_pending()
                if not any(writer.wants(s) for s in SPLITS):
                    break
        write_pending()
    if writer.count["train"] + writer.count["val"] == writer.docs["train"] + writer.docs["val"]:  # BOS tokens only
        raise DataError(f"the sources of {out} hold no text (every document is empty); point --files at non-empty "
                        f".txt/.jsonl/.parquet files")
    writer.finish()
    for name in os.listdir(workdir):  # e.g. the shard in which the budget ran out
        os.remove(os.path.join(workdir, name))
    os.rmdir(workdir)
    dt = time.time() - t0
    print(f"{out}: {corpus} complete: train {writer.count['train']:,} tokens / {writer.docs['train']:,} docs, "
          f"val {writer.count['val']:,} tokens / {writer.docs['val']:,} docs, {manifest['dedup_skipped_docs']} "
          f"duplicates skipped; {dt:.1f}s ({tokenized / max(dt, 1e-9) / 1e6:.1f}M tokens/s tokenised)",
          file=sys.stderr)
    return manifest


# ---------------------------------------------------------------------------------------------------------------
# Pool loading

@dataclass
class Pool:
    tokens: np.ndarray       # uint16, memory-mapped
    doc_starts: np.ndarray   # int64 offset of each document's BOS, first = 0
    manifest: dict
    split: str


def _read_manifest(data_dir):
    path = os.path.join(data_dir, "corpus.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path} is unreadable ({e}); delete the pool and prepare it again") from None
    return check_record(path, manifest, MANIFEST_SCHEMA, "it is not a data.py pool manifest: delete the pool and "
                        "prepare it again, or use another folder", DataError)


def _open_arrays(data_dir, split, token_count, doc_count):
    def mm(path, dtype, n):
        return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype=dtype)
    return mm(_token_path(data_dir, split), np.uint16, token_count), mm(_docs_path(data_dir, split), np.int64,
                                                                        doc_count)


def load_pool(data_dir, split, verify_hash=False):
    """Memory-map one split of a complete pool; any inconsistency is a DataError."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; choose train or val")
    manifest = _read_manifest(data_dir)
    fix = f"run: python data.py prepare --out {data_dir} ..."
    if manifest is None:
        raise DataError(f"no pool in {data_dir} (corpus.json missing); {fix}")
    if manifest.get("status") != "complete":
        raise DataError(f"pool {data_dir} is incomplete (status {manifest.get('status')!r}); re-run the same "
                        f"prepare command to finish it")
    check_record(os.path.join(data_dir, "corpus.json"), manifest, COMPLETE_SCHEMA,
                 f"delete {data_dir} and prepare it again", DataError)
    info = manifest["splits"][split]
    n_tokens, n_docs = info["token_count"], info["doc_count"]
    for path, size in ((_token_path(data_dir, split), 2 * n_tokens), (_docs_path(data_dir, split), 8 * n_docs)):
        actual = os.path.getsize(path) if os.path.exists(path) else None
        if actual != size:
            raise DataError(f"{path} has {actual} bytes but corpus.json says {size}; the pool is corrupt, "
                            f"delete {data_dir} and prepare it again")
    if verify_hash and sha256_file(_token_path(data_dir, split)) != info["sha256"]:
        raise DataError(f"{_token_path(data_dir, split)} does not match its sha256 in corpus.json; the pool is "
                        f"corrupt, delete {data_dir} and prepare it again")
    tokens, doc_starts = _open_arrays(data_dir, split, n_tokens, n_docs)
    if n_docs and (doc_starts[0] != 0 or doc_starts[-1] >= n_tokens or np.any(np.diff(doc_starts) <= 0)):
        raise DataError(f"{_docs_path(data_dir, split)} holds invalid document offsets; delete {data_dir} and "
                        f"prepare it again")
    return Pool(tokens, doc_starts, manifest, split)


VERIFIED = "verified.json"  # in a pool: {token file: [size, mtime_ns, ctime_ns, sha256]} of files that matched


def check_pool_hashes(data_dir):
    """Raise DataError unless every split's token file matches its sha256 in corpus.json. A file is hashed once: a
    match is recorded in <pool>/verified.json with the file's size, mtime and ctime (any write changes ctime, even one
    that restores mtime) and the sha256 it matched, and a file whose record still holds is not hashed again. A pool
    on a read-only filesystem is hashed at every call."""
    path = os.path.join(data_dir, VERIFIED)
    verified = {}
    if os.path.isfile(path):  # a regular file only: open() of a FIFO of that name would wait forever for a writer
        try:
            with open(path) as f:
                verified = json.load(f)
        except (OSError, ValueError):
            pass
    if record_error(verified, VERIFIED_SCHEMA):  # a cache this function rewrites: of the wrong shape, it counts as
        verified = {}                             # no record, and every file is hashed again
    records = {}
    for split in SPLITS:
        pool = load_pool(data_dir, split)  # a complete pool whose files have their recorded sizes
        stat = os.stat(_token_path(data_dir, split))
        name = os.path.basename(_token_path(data_dir, split))
        records[name] = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, pool.manifest["splits"][split]["sha256"]]
        if not isinstance(verified, dict) or verified.get(name) != records[name]:
            load_pool(data_dir, split, verify_hash=True)
    if records != verified:
        with contextlib.suppress(OSError):  # a read-only or full filesystem: hashed again next time
            write_json(path, records)


def ensure_pool(data_dir, corpus="stdlib", tokenizer="bytes"):
    """Prepare `data_dir` where nothing is, or finish an interrupted prepare of this same pool (train.py --preset cpu
    does this for its default folder); any other content is refused by prepare, never overwritten."""
    manifest = _read_manifest(data_dir)
    if manifest is None or manifest.get("status") != "complete":
        prepare(corpus, data_dir, tokenizer=tokenizer)
    for split in SPLITS:
        load_pool(data_dir, split)
    return data_dir


def check_token_range(data_dir, pool, vocab_size, n_tokens=None, chunk=1 << 26):
    """Every token id among the first n_tokens (all by default) is < vocab_size: a flipped byte would otherwise
    surface as an IndexError deep inside a training step. Under torch.distributed each rank reads its 1/world share
    and one all-reduce gives every rank the first bad position, so the ranks read the pool once between them (a d26
    run's 36 B tokens are 73 GB) and all stop with the same error."""
    n = len(pool.tokens) if n_tokens is None else min(int(n_tokens), len(pool.tokens))
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    end, first_bad = (rank + 1) * n // world, n
    for start in range(rank * n // world, end, chunk):
        block = np.asarray(pool.tokens[start:min(start + chunk, end)])
        if block.size and int(block.max()) >= vocab_size:
            first_bad = start + int(np.argmax(block >= vocab_size))
            break
    if world > 1:
        shared = torch.tensor(first_bad, device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(shared, op=dist.ReduceOp.MIN)
        first_bad = int(shared)
    if first_bad < n:
        raise DataError(f"{_token_path(data_dir, pool.split)} holds token id {int(pool.tokens[first_bad])} >= vocab "
                        f"size {vocab_size} at position {first_bad:,}; the pool is corrupt (python data.py verify "
                        f"{data_dir}), prepare it again")


# ---------------------------------------------------------------------------------------------------------------
# Loaders (docs/recipe.md, "Data")

def _permutation(n, seed):
    g = torch.Generator()
    g.manual_seed(seed % (2 ** 63 - 1))
    return torch.randperm(n, generator=g).numpy()


class TrainLoader:
    """Global batches of `batch_seqs` windows of seq_len + 1 tokens; batch(step, rank, world_size) is a pure
    function of (seed, step), so every world size and micro-batch split sees the same data at every step."""

    def __init__(self, pool, seq_len, batch_seqs, token_limit=None, seed=42):
        self.pool, self.seq_len, self.batch_seqs, self.seed = pool, seq_len, batch_seqs, seed
        self.window = seq_len + 1
        n = len(pool.tokens) if token_limit is None else min(int(token_limit), len(pool.tokens))
        starts = np.asarray(pool.doc_starts[:np.searchsorted(pool.doc_starts, n)], dtype=np.int64)
        self.doc_starts = starts
        self.doc_lengths = np.diff(np.append(starts, n))  # the prefix's last document may be truncated
        self.tokens_used = n
        self.n_windows = n // self.window
        self.steps_per_epoch = self.n_windows // batch_seqs
        if self.steps_per_epoch == 0:
            raise DataError(f"{n:,} tokens make {self.n_windows} windows of {self.window}, fewer than one batch of "
                            f"{batch_seqs}; use a larger pool or token limit, or a smaller batch")
        self.tokens_per_epoch = self.steps_per_epoch * batch_seqs * seq_len
        self._epoch = None

    def _order(self, epoch):
        if self._epoch != epoch:
            base = self.seed + epoch * EPOCH_SEED_STRIDE
            doc_order = _permutation(len(self.doc_starts), base + 0 * STAGE_SEED_STRIDE)
            stream_starts = np.concatenate(([0], np.cumsum(self.doc_lengths[doc_order])))
            kept = self.steps_per_epoch * self.batch_seqs
            window_order = _permutation(self.n_windows, base + 1 * STAGE_SEED_STRIDE)[:kept]
            self._epoch, self._cache = epoch, (doc_order, stream_starts, window_order)
        return self._cache

    def batch(self, step, rank=0, world_size=1):
        """(epoch, LongTensor[batch_seqs // world_size, seq_len + 1]): rank's contiguous slice of step's batch."""
        if self.batch_seqs % world_size:
            raise ValueError(f"batch_seqs {self.batch_seqs} is not divisible by world_size {world_size}")
        epoch = step // self.steps_per_epoch + 1
        doc_order, stream_starts, window_order = self._order(epoch)
        per_rank = self.batch_seqs // world_size
        base = (step % self.steps_per_epoch) * self.batch_seqs
        windows = window_order[base + rank * per_rank:base + (rank + 1) * per_rank]
        out = np.empty((per_rank, self.window), dtype=np.int64)
        # Gather each window from the documents it spans in the shuffled stream, never building that stream.
        for row, w in enumerate(windows):
            lo, hi = int(w) * self.window, (int(w) + 1) * self.window
            d = int(np.searchsorted(stream_starts, lo, side="right")) - 1
            pos = lo
            while pos < hi:
                doc = doc_order[d]
                offset = pos - stream_starts[d]
                take = min(hi - pos, self.doc_lengths[doc] - offset)
                src = self.doc_starts[doc] + offset
                out[row, pos - lo:pos - lo + take] = self.pool.tokens[src:src + take]
                pos += take
                d += 1
        return epoch, torch.from_numpy(out)


def val_windows(pool, seq_len, target_tokens):
    """First target_tokens // seq_len windows of seq_len + 1 tokens in file order: exactly
    n * seq_len target tokens."""
    n = target_tokens // seq_len
    need = n * (seq_len + 1)
    if n == 0 or need > len(pool.tokens):
        raise DataError(f"validation needs {need:,} tokens ({n} windows of {seq_len + 1}) but the {pool.split} "
                        f"pool has {len(pool.tokens):,}; lower the validation token target")
    return torch.from_numpy(np.asarray(pool.tokens[:need], dtype=np.int64)).view(n, seq_len + 1)


# ---------------------------------------------------------------------------------------------------------------
# Benchmark (printed, not a test)

def bench(tokenizer, workers, seq_len, batch_seqs, steps):
    texts = []
    for src in list_sources("stdlib"):
        texts += read_texts(src["path"])
        if sum(map(len, texts)) > 8 << 20:
            break
    t = time.time()
    _init_worker(tokenizer)
    n = sum(len(d) for d in _encode_docs(texts))
    one = n / (time.time() - t)
    with multiprocessing.get_context("fork").Pool(workers, _init_worker, (tokenizer,)) as processes:
        processes.map(_encode_docs, [texts[:1]] * workers)  # warm-up: workers build their tokenizer
        t = time.time()
        groups = processes.map(_encode_docs, [texts[i::workers * 4] for i in range(workers * 4)])
        n = sum(len(d) for group in groups for d in group)
        many = n / (time.time() - t)
    print(f"tokenise ({tokenizer}, {n / 1e6:.1f}M tokens of stdlib): 1 process {one / 1e6:.2f}M tokens/s; "
          f"{workers} workers {many / 1e6:.2f}M tokens/s = {many / workers / 1e6:.2f}M tokens/s per worker")

    rng = np.random.default_rng(0)
    lengths = rng.geometric(1 / 1000, size=50_000)  # FineWeb-like documents, ~1,000 tokens each
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    vocab = get_tokenizer(tokenizer).n_vocab
    pool = Pool(rng.integers(0, vocab, int(lengths.sum()), dtype=np.uint16), starts, {}, "train")

    def time_loader(seq, batch, world_size=1):
        loader = TrainLoader(pool, seq, batch)
        loader.batch(0)  # builds the epoch's permutations once, like the first step of a run
        t = time.time()
        for s in range(1, steps + 1):
            _, x = loader.batch(s, 0, world_size)
        return (time.time() - t) / steps, x

    paper_s = time_loader(2048, 256)[0]
    rank_s = time_loader(2048, 256, 8)[0]
    print(f"loader at the paper's shape 256x2049 ({pool.tokens.size / 1e6:.0f}M-token pool of ~1k-token docs): "
          f"{paper_s * 1e3:.2f} ms per global batch, {rank_s * 1e3:.2f} ms per rank slice on 8 GPUs")
    load_s, x = time_loader(seq_len, batch_seqs)

    import model  # only the benchmark needs the model; data.py is otherwise independent of it
    torch.manual_seed(0)
    cfg = model.config_for("vanilla", 2, width_per_depth=64, head_dim=64, seq_len=seq_len, vocab_size=vocab)
    gpt = model.GPT(cfg)
    step_times = []
    for _ in range(3):
        t = time.time()
        gpt(x[:, :-1], targets=x[:, 1:]).backward()
        step_times.append(time.time() - t)
    model_s = min(step_times)
    print(f"loader: {load_s * 1e3:.2f} ms per global batch of {batch_seqs}x{seq_len + 1}; model.py vanilla d2 "
          f"(width {cfg.width}) fwd+bwd on the same batch {model_s * 1e3:.0f} ms on {x.device.type} -> loader = "
          f"{100 * load_s / model_s:.2f}% of a step")


# ---------------------------------------------------------------------------------------------------------------
# CLI

def run(argv):
    args = build_parser().parse_args(argv)
    try:
        if args.command == "prepare":
            args.out = args.out or os.path.join("data", args.corpus)
            existing = _read_manifest(args.out) if args.if_missing and os.path.isdir(args.out) else None
            if existing and existing.get("status") == "complete":
                print(f"{args.out}: complete {existing.get('corpus')} pool exists; nothing to do", file=sys.stderr)
            else:
                prepare(args.corpus, args.out, args.tokenizer, args.train_tokens, args.val_tokens, args.files,
                        args.workers)
        elif args.command == "verify":
            for split in SPLITS:
                pool = load_pool(args.out, split, verify_hash=True)
                print(f"{args.out} {split}: {len(pool.tokens):,} tokens, {len(pool.doc_starts):,} docs, sha256 ok")
        else:
            bench(args.tokenizer, args.workers, args.seq_len, args.batch_seqs, args.steps)
    except KeyboardInterrupt:
        print("\ndata.py: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


def main(argv=None):
    return cli_main(run, "data.py", argv)


if __name__ == "__main__":
    exit_process(main())
