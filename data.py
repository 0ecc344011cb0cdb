"""Token pools and the training/validation loaders (docs/recipe.md, "Data").

    python data.py prepare --corpus stdlib --tokenizer bytes --out data/stdlib   # offline, < 1 min
    python data.py prepare --corpus fineweb --out data/fineweb                   # GPT-2 tokens, downloads FineWeb
    python data.py prepare --corpus files --files 'corpus/**/*.jsonl' --tokenizer bytes --out data/mine

A pool holds per split `<split>.bin` (uint16 tokens, each document [BOS] + tokens), `<split>.docs.bin` (int64 offset
of each BOS) and `corpus.json` (settings, counts, sha256, progress: the same command resumes). Validation of stdlib and
files: a sha1 hash bucket (1 in 50) of the file names or texts. TrainLoader: what step s sees depends only on
(seed, s), never on the world size or micro-batch size, so a resume on any number of processes continues at the step.
"""
import collections, contextlib, fcntl, glob, hashlib, json, multiprocessing, multiprocessing.dummy, os, shutil, signal
import sys, sysconfig, time

from common import Parser, UsageError, answer_help, cli_main, exit_process, integer, sha256_file, write_json

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
CHECKPOINT_EVERY_S = 10.0          # min seconds between progress records in corpus.json (Hub shards: after each)
SIGNATURE_TOKENS = 64              # FineWeb de-dup: SHA-1 of the first <= 64 body tokens, uint32 LE
EPOCH_SEED_STRIDE, STAGE_SEED_STRIDE = 1_000_003, 101   # loader seeds: seed + epoch*1,000,003 + stage*101
SPLITS = ("train", "val")


def build_parser():
    parser = Parser(prog="data.py", description="Token pools: prepare.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenise a corpus into a pool directory")
    p.add_argument("--corpus", required=True, choices=CORPORA)
    p.add_argument("--out", help="pool directory (default: data/CORPUS, where train.py's presets read)")
    p.add_argument("--train-tokens", type=integer(1, 2 ** 48), help="train budget in tokens (default: corpus recipe)")
    p.add_argument("--val-tokens", type=integer(1, 2 ** 40), help="val budget in tokens (default: corpus recipe)")
    p.add_argument("--tokenizer", default="gpt2", choices=("gpt2", "bytes"), help="gpt2 (default) | bytes (offline)")
    p.add_argument("--files", help="glob of .txt/.jsonl/.parquet files for --corpus files")
    p.add_argument("--workers", type=integer(1, 1024), help="tokeniser processes (default: all CPUs)")
    return parser


if __name__ == "__main__":
    answer_help(build_parser)  # before torch, tiktoken and pyarrow load (2 s on 2 cores)

import numpy as np
import pyarrow.parquet as pq
import tiktoken
import torch
from huggingface_hub import HfApi, hf_hub_download


def get_tokenizer(name):
    """tiktoken Encoding: "gpt2" (downloads its vocab on first use) or "bytes" (offline, 256 bytes + BOS)."""
    if name == "bytes":
        # No merges: every UTF-8 byte is a token; the pattern matches every character (lossless), in pieces
        return tiktoken.Encoding(name="bytes", pat_str=r"(?s:.{1,4096})",
                                 mergeable_ranks={bytes([i]): i for i in range(256)},
                                 special_tokens={"<|endoftext|>": 256})
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # tiktoken fetches the vocab over the network; any failure means "not available"
        raise UsageError(f"cannot load tiktoken's {name} vocabulary ({type(e).__name__}); it is downloaded on first "
                        f"use, so run once with internet access or use --tokenizer bytes") from None


def token_byte_lengths(enc):
    """Bytes of each token id (0 for BOS/<|endoftext|>), for bits-per-byte."""
    return np.array([0 if i == enc.eot_token else len(enc.decode_single_token_bytes(i)) for i in range(enc.n_vocab)])


def _use_tokenizer(name, worker_process=False):
    global _encoder
    if worker_process:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the pool
    _encoder = get_tokenizer(name)


def _encode(text):
    return np.array([_encoder.eot_token] + _encoder.encode_ordinary(text), dtype=np.uint16)


def _hash_mod(key, every):
    return int.from_bytes(hashlib.sha1(key.encode("utf-8", "surrogatepass")).digest()[:8], "big") % every


def list_sources(corpus, files_glob=None):
    """Ordered list of sources: dicts with name, split and either path (local) or size and sha256 (a Hub file)."""
    recipe = CORPORA[corpus]
    if corpus in ("fineweb", "fineweb-edu"):
        def listing(folder):  # parquet files directly under folder at the pinned revision, sorted by path
            try:
                entries = HfApi(endpoint=os.environ.get("HF_ENDPOINT")).list_repo_tree(
                    recipe["repo"], path_in_repo=folder, revision=recipe["revision"], repo_type="dataset")
                files = sorted((e for e in entries if e.path.endswith(".parquet")), key=lambda e: e.path)
            except Exception as e:  # huggingface_hub's HTTP and connection errors: no network, endpoint or login
                raise UsageError(f"cannot list {recipe['repo']}@{recipe['revision']}/{folder} ({type(e).__name__}: "
                                f"{str(e).splitlines()[0]}); check the network, $HF_ENDPOINT and $HF_TOKEN") from None
            if not files:
                raise UsageError(f"no parquet files under {recipe['repo']}@{recipe['revision']}/{folder}")
            return [dict(name=e.path, sha256=e.lfs.sha256 if e.lfs else None) for e in files]
        train = listing(recipe["train_dir"])
        val, train = (listing(recipe["val_dir"]), train) if recipe["val_dir"] else (train[:1], train[1:])
        return [dict(f, split=split) for split, group in (("val", val), ("train", train)) for f in group]
    if corpus == "stdlib":
        root, names = sysconfig.get_paths()["stdlib"], []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
            names += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith(".py")]
        return [dict(name=n, path=os.path.join(root, n),
                     split="val" if _hash_mod(n, recipe["val_every"]) == 0 else "train") for n in sorted(names)]
    paths = sorted(os.path.abspath(p) for p in glob.glob(files_glob, recursive=True) if os.path.isfile(p))
    bad = [p for p in paths if not p.endswith((".txt", ".jsonl", ".parquet"))]
    if bad:
        raise UsageError(f"unsupported file {bad[0]}; --files must match only .txt, .jsonl or .parquet files")
    if not paths:
        raise UsageError(f"--files {files_glob!r} matches no files")
    return [dict(name=p, path=p, split="by-doc") for p in paths]


def fetch(source, corpus, workdir):
    """Download one Hub file at the pinned revision and check its sha256 (re-running prepare resumes a cut download)."""
    recipe = CORPORA[corpus]
    print(f"downloading {source['name']}", file=sys.stderr)
    path = hf_hub_download(recipe["repo"], source["name"], repo_type="dataset", revision=recipe["revision"],
                           local_dir=workdir, endpoint=os.environ.get("HF_ENDPOINT"))  # its errors are its own
    if source["sha256"] and sha256_file(path) != source["sha256"]:
        os.remove(path)
        raise UsageError(f"{source['name']} does not match its sha256 in the Hub's listing; re-run to download again")
    return path


def read_texts(path):
    """Documents of a file: .txt/.py one document, .jsonl the "text" field of each line, .parquet the "text" column."""
    if path.endswith(".parquet"):
        try:
            for batch in pq.ParquetFile(path).iter_batches(columns=["text"], batch_size=1024):
                yield from batch.column(0).to_pylist()
        except (KeyError, ValueError, OSError) as e:  # pyarrow reports a missing column / bad file this way
            raise UsageError(f"cannot read a 'text' column from {path}: {e}".splitlines()[0]) from None
    elif path.endswith(".jsonl"):
        with open(path, "rb") as f:  # binary: lines end at \n only, so line numbers are the editor's
            for line_no, line in enumerate(f, 1):
                if line.strip():
                    try:
                        text = json.loads(line)["text"]  # UTF-8 (a decode error is a ValueError)
                        assert isinstance(text, str)
                    except (ValueError, KeyError, TypeError, AssertionError):
                        raise UsageError(f"{path}:{line_no}: not a UTF-8 JSON object with a 'text' string") from None
                    yield text
    else:
        try:
            with open(path, encoding="utf-8") as f:
                yield f.read()
        except UnicodeDecodeError:  # the stdlib ships a few deliberately non-UTF-8 test files; skip them
            if not path.endswith(".py"):
                raise UsageError(f"{path} is not UTF-8 text") from None


def _paths(out, split):
    return os.path.join(out, f"{split}.bin"), os.path.join(out, f"{split}.docs.bin")


def read_manifest(data_dir):
    """A pool's corpus.json, or {} where there is none."""
    with contextlib.suppress(FileNotFoundError), open(os.path.join(data_dir, "corpus.json")) as f:
        return json.load(f)
    return {}


def prepare(corpus, out, tokenizer="gpt2", train_tokens=None, val_tokens=None, files_glob=None, workers=None):
    """Build or resume the pool in `out` (never over anything else) source by source, within the token budgets; a
    resume truncates the files back to the counts corpus.json recorded after the last recorded source. -> manifest"""
    if (corpus == "files") != bool(files_glob):
        raise UsageError("--files GLOB is required with --corpus files and only allowed there "
                        "(e.g. --files 'texts/**/*.jsonl')")
    recipe, enc = CORPORA[corpus], get_tokenizer(tokenizer)  # fail early (gpt2 offline) before anything downloads
    identity = {"stdlib": dict(root=sysconfig.get_paths()["stdlib"], python=sys.version.split()[0]),
                "files": dict(files=files_glob)}.get(corpus) or dict(repo=recipe["repo"], revision=recipe["revision"])
    settings = dict(corpus=corpus, **identity, tokenizer=tokenizer, vocab_size=enc.n_vocab, bos_id=enc.eot_token,
                    dedup=recipe.get("dedup", False), budgets=dict(train=train_tokens or recipe["train_tokens"],
                                                                   val=val_tokens or recipe["val_tokens"]))
    try:
        os.makedirs(out, exist_ok=True)
        lock = open(os.path.join(out, "prepare.lock"), "a")
    except OSError as e:
        raise UsageError(f"cannot write to --out {out}: {e.strerror}; choose a writable directory") from None
    with lock:  # of two prepares of one pool started together, the second waits here, then finds it complete
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = read_manifest(out)
        if not old and set(os.listdir(out)) - {"prepare.lock"}:
            raise UsageError(f"{out} is not empty and holds no pool (no corpus.json); use a new or empty --out")
        differ = [k for k, v in settings.items() if old and old.get(k) != v]
        if differ:
            raise UsageError(f"{out} holds {'a complete' if old.get('status') == 'complete' else 'an unfinished'} "
                            f"pool with other settings ({', '.join(differ)}); use another --out or delete it first")
        if old.get("status") == "complete":
            print(f"{out}: pool already complete", file=sys.stderr)
            return old
        sources = list_sources(corpus, files_glob)
        if old.get("sources") == [s["name"] for s in sources]:
            print(f"{out}: resuming an interrupted prepare at source {old['sources_done'] + 1}", file=sys.stderr)
            manifest = old
        else:  # corpus.json first: a folder with pool files has one
            manifest = dict(status="running", **settings, dtype="uint16", sources=[s["name"] for s in sources],
                            sources_done=0, dedup_skipped_docs=0, splits={s: dict(token_count=0, doc_count=0)
                                                                          for s in SPLITS})
            write_json(os.path.join(out, "corpus.json"), manifest)
        write_pool(corpus, out, manifest, sources, workers or len(os.sched_getaffinity(0)))
    return manifest


def write_pool(corpus, out, manifest, sources, workers):
    """Tokenise the sources from manifest's sources_done on, appending to the split files (see prepare)."""
    budget, workdir, val_every = manifest["budgets"], os.path.join(out, "downloads"), CORPORA[corpus].get("val_every")
    count = {s: manifest["splits"][s]["token_count"] for s in SPLITS}
    docs = {s: manifest["splits"][s]["doc_count"] for s in SPLITS}
    paths = {s: _paths(out, s) for s in SPLITS}  # (tokens, document starts) of each split
    files, val_signatures, pending, chars, t0 = {}, None, [], 0, time.time()  # pending: (split, text) to tokenise
    # FineWeb de-dup: a train document whose first 64 body tokens are a val document's is dropped
    signature = lambda tokens: hashlib.sha1(np.asarray(tokens[1:1 + SIGNATURE_TOKENS], dtype="<u4").tobytes()).digest()
    wants = lambda split: budget[split] is None or count[split] < budget[split]

    def add(split, tokens):
        nonlocal val_signatures
        if not wants(split):
            return
        if split == "train" and manifest["dedup"]:
            if val_signatures is None:  # val sources come first, so val is complete here
                for f in files.values():
                    f.flush()
                val, starts = (np.fromfile(p, dtype) for p, dtype in zip(paths["val"], (np.uint16, np.int64)))
                val_signatures = {signature(val[a:b]) for a, b in zip(starts, [*starts[1:], len(val)])}
            if signature(tokens) in val_signatures:
                manifest["dedup_skipped_docs"] += 1
                return
        tokens = tokens if budget[split] is None else tokens[:budget[split] - count[split]]  # the last is truncated
        files[paths[split][0]].write(tokens.tobytes())
        files[paths[split][1]].write(np.int64(count[split]).tobytes())
        count[split], docs[split] = count[split] + len(tokens), docs[split] + 1

    def tokenise_pending():  # on the workers, appended in order
        nonlocal chars
        for (split, _), tokens in zip(pending, processes.map(_encode, [text for _, text in pending])):
            add(split, tokens)
        pending.clear()
        chars = 0

    def record(sources_done, complete=False):
        for f in files.values():
            f.flush()
            if complete:
                os.fsync(f.fileno())
        for s in SPLITS:
            manifest["splits"][s].update(token_count=count[s], doc_count=docs[s])
            if complete:
                manifest["splits"][s]["sha256"] = sha256_file(paths[s][0])
        manifest.update(sources_done=sources_done, status="complete" if complete else "running")
        write_json(os.path.join(out, "corpus.json"), manifest)

    with contextlib.ExitStack() as stack:
        for s in SPLITS:
            for path, size in zip(paths[s], (2 * count[s], 8 * docs[s])):
                files[path] = stack.enter_context(open(path, "ab"))
                files[path].truncate(size)  # drop anything written after the last record
        if workers > 1:  # spawn, not fork: a fork of a process running torch's threads can hang
            pool = multiprocessing.get_context("spawn").Pool(workers, _use_tokenizer, (manifest["tokenizer"], True))
        else:  # one worker: a thread of this process
            pool = multiprocessing.dummy.Pool(1, _use_tokenizer, (manifest["tokenizer"],))
        processes = stack.enter_context(pool)
        last_record = time.time()
        for k in range(manifest["sources_done"], len(sources)):
            src, hub = sources[k], "path" not in sources[k]
            splits = SPLITS if src["split"] == "by-doc" else (src["split"],)
            if hub:
                tokenise_pending()  # the counts are up to date before deciding whether a shard is needed at all
            if not any(map(wants, SPLITS)):
                break
            for text in read_texts(fetch(src, corpus, workdir) if hub else src["path"]) \
                    if any(map(wants, splits)) else ():
                split = src["split"] if src["split"] != "by-doc" else \
                    "val" if _hash_mod(text, val_every) == 0 else "train"
                if wants(split):
                    pending.append((split, text))
                    chars += len(text)
                # early where the pending text may fill a budget: little text is tokenised only to be dropped
                if len(pending) >= BATCH_DOCS or chars >= min(
                        [budget[s] - count[s] for s in SPLITS if wants(s) and budget[s]], default=float("inf")):
                    tokenise_pending()
                    if not any(map(wants, splits)):
                        break
            if hub or time.time() - last_record > CHECKPOINT_EVERY_S:
                tokenise_pending()
                record(k + 1)  # source k is complete in the files
                last_record = time.time()
                if hub and os.path.exists(os.path.join(workdir, src["name"])):
                    os.remove(os.path.join(workdir, src["name"]))  # a consumed download
        tokenise_pending()
        if sum(count.values()) == sum(docs.values()):  # BOS only
            raise UsageError(f"the sources of {out} hold no text (every document is empty); point --files at "
                            "non-empty .txt/.jsonl/.parquet files")
        record(len(sources), complete=True)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"{out}: {corpus} complete: train {count['train']:,} tokens / {docs['train']:,} docs, val "
          f"{count['val']:,} tokens / {docs['val']:,} docs, {manifest['dedup_skipped_docs']} duplicates skipped; "
          f"{time.time() - t0:.1f}s", file=sys.stderr)


# tokens: uint16, memory-mapped; doc_starts: int64 offset of each document's BOS (the first is 0)
Pool = collections.namedtuple("Pool", "tokens doc_starts manifest split")


def load_pool(data_dir, split, verify_hash=False):
    """Memory-map one split of a complete pool; a missing, unfinished or corrupt pool is a UsageError."""
    manifest = read_manifest(data_dir)
    if not manifest:
        raise UsageError(f"no pool in {data_dir} (no corpus.json); run: python data.py prepare --out {data_dir} ...")
    if manifest.get("status") != "complete":
        raise UsageError(f"pool {data_dir} is incomplete; re-run the same prepare command to finish it")
    info, (tokens_path, docs_path) = manifest["splits"][split], _paths(data_dir, split)
    if verify_hash and sha256_file(tokens_path) != info["sha256"]:
        raise UsageError(f"{tokens_path} does not match its sha256 in corpus.json; the pool is corrupt, delete "
                        f"{data_dir} and prepare it again")
    mm = lambda path, dtype, n: np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
    return Pool(mm(tokens_path, np.uint16, info["token_count"]), mm(docs_path, np.int64, info["doc_count"]), manifest,
                split)


class TrainLoader:
    """Global batches of `batch_seqs` windows of seq_len + 1 tokens; batch(step, rank, world_size) is a pure
    function of (seed, step), so every world size and micro-batch split sees the same data at every step.
    Each epoch shuffles the documents into one stream, cuts it into windows and shuffles the windows."""

    def __init__(self, pool, seq_len, batch_seqs, token_limit=None, seed=42):
        self.pool, self.seq_len, self.batch_seqs, self.seed, self.window = pool, seq_len, batch_seqs, seed, seq_len + 1
        n = len(pool.tokens) if token_limit is None else min(int(token_limit), len(pool.tokens))
        self.doc_starts = np.asarray(pool.doc_starts[:np.searchsorted(pool.doc_starts, n)], dtype=np.int64)
        self.doc_lengths = np.diff(np.append(self.doc_starts, n))  # the prefix's last document may be truncated
        self.n_windows, self.steps_per_epoch = n // self.window, n // self.window // batch_seqs
        if self.steps_per_epoch == 0:
            raise UsageError(f"{n:,} tokens make {self.n_windows} windows of {self.window}, fewer than one batch of "
                            f"{batch_seqs}; use a larger pool or token limit, or a smaller batch")
        self._epoch = None

    def batch(self, step, rank=0, world_size=1):
        """(epoch, LongTensor[batch_seqs // world_size, seq_len + 1]): rank's contiguous slice of step's batch."""
        epoch = step // self.steps_per_epoch + 1
        if self._epoch != epoch:  # this epoch's document order, stream offsets and window order
            seed = lambda stage: (self.seed + epoch * EPOCH_SEED_STRIDE + stage * STAGE_SEED_STRIDE) % (2 ** 63 - 1)
            doc_order = torch.randperm(len(self.doc_starts), generator=torch.Generator().manual_seed(seed(0))).numpy()
            stream_starts = np.concatenate(([0], np.cumsum(self.doc_lengths[doc_order])))
            window_order = torch.randperm(self.n_windows, generator=torch.Generator().manual_seed(seed(1))).numpy()
            self._epoch, self._order = epoch, (doc_order, stream_starts, window_order)
        doc_order, stream_starts, window_order = self._order
        per_rank = self.batch_seqs // world_size
        first = (step % self.steps_per_epoch) * self.batch_seqs + rank * per_rank
        out = np.empty((per_rank, self.window), dtype=np.int64)
        # Gather each window from the documents it spans in the shuffled stream, never building that stream.
        for row, w in enumerate(window_order[first:first + per_rank]):
            lo, hi = int(w) * self.window, (int(w) + 1) * self.window
            d, pos = int(np.searchsorted(stream_starts, lo, side="right")) - 1, lo
            while pos < hi:
                doc, offset = doc_order[d], pos - stream_starts[d]
                take = min(hi - pos, self.doc_lengths[doc] - offset)
                src = self.doc_starts[doc] + offset
                out[row, pos - lo:pos - lo + take] = self.pool.tokens[src:src + take]
                pos, d = pos + take, d + 1
        return epoch, torch.from_numpy(out)


def val_windows(pool, seq_len, target_tokens):
    """First target_tokens // seq_len windows of seq_len + 1 tokens in file order: exactly n * seq_len target tokens."""
    n = target_tokens // seq_len
    need = n * (seq_len + 1)
    if n == 0 or need > len(pool.tokens):
        raise UsageError(f"validation needs {need:,} tokens ({n} windows of {seq_len + 1}) but the {pool.split} pool "
                         f"has {len(pool.tokens):,}; ask for fewer (train.py --val-tokens, core_eval.py --lens-tokens)")
    return torch.from_numpy(np.asarray(pool.tokens[:need], dtype=np.int64)).view(n, seq_len + 1)


def run(argv):
    args = build_parser().parse_args(argv)
    prepare(args.corpus, args.out or os.path.join("data", args.corpus), args.tokenizer, args.train_tokens,
            args.val_tokens, args.files, args.workers)


def main(argv=None):
    return cli_main(run, "data.py", argv)


if __name__ == "__main__":
    exit_process(main())
