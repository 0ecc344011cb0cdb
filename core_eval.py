"""
core_eval.py - DCLM CORE evaluation (22 tasks) of a train.py checkpoint: CORE accuracy, answer NLL, the frozen
17-task filtered score, three few-shot seeds, and (optionally) the logit-lens KL effective depth.

Protocol: the paper's App. C.2 (arXiv 2609.19107), the DCLM CORE evaluator's rules (docs/recipe.md, "CORE").
Examples are shuffled with Random(1337), few-shot examples are drawn with Random(seed + index) excluding the item
itself, prompts get BOS prepended and are left-cropped to the model context; MC/schema pick the candidate with the
lowest mean token loss over its scoring region, LM items are correct only if every continuation token is the argmax;
answer NLL is the mean token loss over the full gold answer. Many examples run per forward, and an example's
candidates share one pass over their common prefix (--scoring).

    python core_eval.py --checkpoint runs/X/checkpoints/final                        # full suite, seeds 0 1 2
    python core_eval.py --checkpoint CKPT --bundle-dir ../shared/eval_bundle_partial --max-per-task 100 --seeds 0
    torchrun --nproc_per_node 8 core_eval.py --checkpoint CKPT                       # examples sharded over ranks
    python core_eval.py --checkpoint CKPT --effective-depth --data-dir data/stdlib  # + KL effective depth
    python core_eval.py --bench --bundle-dir ../shared/eval_bundle_partial          # examples/s per --scoring path

Without --bundle-dir the bundle is downloaded once (rank 0; the others wait) into .cache/eval_bundle next to this file,
extracted with zip-slip, size and file caps, and fingerprinted; every task row is checked before any task runs.
"""

import argparse, contextlib, csv, hashlib, json, math, os, random, shutil, sys, tempfile, time, zipfile

from arms import MAX_PASSES, SEEDS
from common import (ANY_NUMBER, TEXT, DownloadError, Parser, UsageError, answer_help, autocast, check_record,
                    cli_main_distributed, download, exit_process, integer, nullable, number, setup_distributed,
                    sha256_file, write_json)

# ------------------------------------------------------------------------------------------------------------------
# Protocol constants (paper App. C.2) and evaluator defaults

EVAL = dict(
    bundle_url="https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip",
    bundle_fingerprint="e908e4e0e145860290d46fb37c5d1bad52bbf22da843073ff0e6b6f624250e52",  # all 77 bundle files
    shuffle_seed=1337,          # example-order shuffle, every task
    seeds=[0, 1, 2],            # few-shot seeds (additive offsets to the example index)
    rows_per_forward=64,        # --batch-size default: sequences per forward
    # cap on padded tokens per forward, by device type: it bounds activation memory on GPU; on CPU small forwards
    # stay in cache (--bench at seq_len 128: 16 x 128 tokens per forward ran 1.3x faster than 64 x 128)
    tokens_per_forward=dict(cuda=16384, cpu=2048),
    examples_per_chunk=512,     # examples tokenized and held in memory at a time (per rank)
    lens_tokens=65536,          # --lens-tokens default: validation tokens for the logit lens
    kl_threshold=2.0,           # nats (paper Fig. 6)
)
SCORING = ("one_at_a_time", "batched", "shared")  # score_examples paths; the results are the same
EVAL_SCHEMA = {"core_metric": nullable(ANY_NUMBER), "checkpoint": TEXT}  # eval.json read back (check_out_path)
CORE_TASKS = [  # the 22 CORE tasks in core.yaml order
    "hellaswag_zeroshot", "jeopardy", "bigbench_qa_wikidata", "arc_easy", "arc_challenge", "copa", "commonsense_qa",
    "piqa", "openbook_qa", "lambada_openai", "hellaswag", "winograd", "winogrande", "bigbench_dyck_languages",
    "agi_eval_lsat_ar", "bigbench_cs_algorithms", "bigbench_operators", "bigbench_repeat_copy_logic", "squad", "coqa",
    "boolq", "bigbench_language_identification",
]
FILTER_EXCLUDED = {"bigbench_cs_algorithms", "bigbench_language_identification", "bigbench_repeat_copy_logic",
                   "boolq", "commonsense_qa"}
FILTERED_TASKS = sorted(set(CORE_TASKS) - FILTER_EXCLUDED)  # the frozen Vanilla-only 17-task subset
DEFAULT_BUNDLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "eval_bundle")


# ------------------------------------------------------------------------------------------------------------------
# Command line, here so that --help answers before torch loads (parse_args, at the end, checks what it parsed)

def build_parser():
    p = Parser(prog="core_eval.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", help="train.py checkpoint folder (runs/<name>/checkpoints/final), its model.pt, "
                   "or an older single-file final.pt")
    p.add_argument("--bundle-dir", default=DEFAULT_BUNDLE_DIR, help="extracted CORE bundle (downloaded if absent)")
    p.add_argument("--bundle-url", default=EVAL["bundle_url"])
    p.add_argument("--expect-fingerprint", default=EVAL["bundle_fingerprint"],
                   help="content fingerprint required of a complete 22-task bundle")
    p.add_argument("--seed", "--seeds", dest="seeds", type=integer(*SEEDS), nargs="+", default=EVAL["seeds"])
    p.add_argument("--max-per-task", type=examples_per_task, default=None,
                   help="keep the first N shuffled examples of each task, or all (default: all; --bench: 100)")
    p.add_argument("--passes", type=integer(1, MAX_PASSES), default=None,
                   help="evaluate at K passes (default: the checkpoint's)")
    p.add_argument("--batch-size", type=integer(1, 2 ** 20), default=EVAL["rows_per_forward"],
                   help="sequences per forward")
    p.add_argument("--scoring", choices=SCORING, default="shared",
                   help="one_at_a_time: one example per forward (the reference path); batched: many examples per\n"
                        "forward; shared: batched, and each example's common prefix runs once")
    p.add_argument("--out", default=None, help="output JSON (default: <run dir>/eval.json); an existing file is\n"
                   "replaced only by a repeat of its evaluation: the same checkpoint (and step), --seeds,\n"
                   "--max-per-task, --passes, --scoring, --batch-size, bundle and --effective-depth settings")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out whatever it holds")
    p.add_argument("--effective-depth", action="store_true", help="also compute the logit-lens KL effective depth")
    p.add_argument("--data-dir", default=None, help="token pool with a val split (for --effective-depth)")
    p.add_argument("--lens-tokens", type=integer(1, 2 ** 40), default=EVAL["lens_tokens"])
    p.add_argument("--kl-threshold", type=number("(0, inf)"), default=EVAL["kl_threshold"], help="nats")
    p.add_argument("--bench", action="store_true", help="print examples/s of the three --scoring paths")
    return p


def examples_per_task(text):
    """argparse type of --max-per-task: a whole number of examples, or the word all."""
    try:
        return None if text == "all" else integer(1, 10 ** 9)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a whole number in [1, {10 ** 9}] or all, got {text!r}") from None


if __name__ == "__main__":
    answer_help(build_parser)  # before torch loads (2-3 s on 2 cores)

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml

import data
import model
from checkpoint import CHECKPOINT_WEIGHTS, checkpoint_weights_path, load_checkpoint_model

# ------------------------------------------------------------------------------------------------------------------
# The bundle on disk: downloaded and safely extracted, its content fingerprint, and its tasks read from core.yaml,
# eval_meta_data.csv and each task's JSONL, every row checked against its task type before any task runs (a bad
# row is one line naming file:line)

TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
BUNDLE_MAX_BYTES = 1 << 30   # extraction caps: the real bundle is 77 files, well under 1 GiB unpacked
BUNDLE_MAX_FILES = 10_000


def safe_extract(zip_path, dest, max_bytes=BUNDLE_MAX_BYTES, max_files=BUNDLE_MAX_FILES):
    """Extract a zip, refusing members with absolute paths or '..' components (zip-slip) and archives that unpack to
    more than max_files files or max_bytes bytes (counted while writing, so lying headers do not help a zip bomb)."""
    with zipfile.ZipFile(zip_path) as zf:
        members = zf.infolist()
        for name in zf.namelist():
            parts = name.replace("\\", "/").split("/")
            if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":"):
                raise UsageError(f"refusing unsafe zip member {name!r} in {zip_path} (absolute path or '..')")
        if len(members) > max_files:
            raise UsageError(f"refusing {zip_path}: {len(members)} members, more than the cap of {max_files} for a "
                             "CORE bundle")
        written = 0
        for member in members:
            target = os.path.join(dest, member.filename)
            if member.is_dir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(member) as src, open(target, "wb") as out:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    if written > max_bytes:
                        raise UsageError(f"refusing {zip_path}: it unpacks to more than {max_bytes >> 20} MiB, the "
                                         "cap for a CORE bundle (a zip bomb?)")
                    out.write(chunk)


def download_bundle(url, bundle_dir):
    """Download the bundle zip into a temp dir next to bundle_dir, extract it safely, rename into place atomically."""
    parent = os.path.dirname(os.path.abspath(bundle_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".eval_bundle_download.", dir=parent)
    try:
        zip_path = os.path.join(tmp, "eval_bundle.zip")
        try:
            download(url, zip_path)  # resumes and retries a cut connection
        except DownloadError as e:
            raise UsageError(f"could not download the CORE bundle ({e}); pass --bundle-dir with an extracted bundle "
                             "to run offline") from None
        try:
            safe_extract(zip_path, os.path.join(tmp, "x"))
        except zipfile.BadZipFile:
            raise UsageError(f"{url} is not a zip file; pass --bundle-dir with an extracted bundle")
        extracted = os.path.join(tmp, "x", "eval_bundle")
        if not os.path.isfile(os.path.join(extracted, "core.yaml")):
            raise UsageError(f"the zip from {url} has no eval_bundle/core.yaml")
        staging = f"{bundle_dir}.tmp.{os.getpid()}"
        shutil.move(extracted, staging)
        os.replace(staging, bundle_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bundle_fingerprint(bundle_dir):
    """sha256 over (path relative to the bundle root, file sha256 hex) of every file, os.walk order, sorted names."""
    outer = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(bundle_dir):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            outer.update(os.path.relpath(path, bundle_dir).replace(os.sep, "/").encode("utf-8"))
            outer.update(sha256_file(path).encode("ascii"))
    return outer.hexdigest()


def load_tasks(bundle_dir):
    """Read core.yaml + eval_meta_data.csv + each task's JSONL -> list of task dicts in core.yaml order."""
    meta = os.path.join(bundle_dir, "eval_meta_data.csv")
    baselines = {}  # task -> [(line number, its 'Random baseline' text)], checked for the tasks core.yaml names
    try:
        with open(os.path.join(bundle_dir, "core.yaml")) as f:
            config = yaml.safe_load(f)
        with open(meta, newline="") as f:
            reader = csv.DictReader(f)
            for row in reader:
                baselines.setdefault(row.get("Eval Task"), []).append((reader.line_num, row.get("Random baseline")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, csv.Error) as e:
        raise UsageError(f"bad CORE bundle in {bundle_dir}: cannot read core.yaml / eval_meta_data.csv ({e})")
    if not isinstance(config, dict) or not config.get("icl_tasks"):
        raise UsageError(f"bad CORE bundle in {bundle_dir}: core.yaml has no icl_tasks list")
    tasks = []
    for index, spec in enumerate(config["icl_tasks"], 1):
        missing = [k for k in ("label", "dataset_uri", "icl_task_type", "num_fewshot")
                   if not isinstance(spec, dict) or spec.get(k) in (None, "", [])]
        if missing:
            raise UsageError(f"bad CORE bundle: icl_tasks entry {index} of {bundle_dir}/core.yaml has no "
                             f"{', '.join(missing)}")
        label, delimiter = spec["label"], spec.get("continuation_delimiter") or " "
        for key, value in dict(label=label, dataset_uri=spec["dataset_uri"], continuation_delimiter=delimiter).items():
            if not isinstance(value, str):
                raise UsageError(f"icl_tasks entry {number} of {bundle_dir}/core.yaml: {key} must be text, got "
                                 f"{value!r}")
        if any(t["label"] == label for t in tasks):  # a copy counts once in the scores, but made 23 tasks of 22
            raise UsageError(f"task {label}: named twice in {bundle_dir}/core.yaml (again in entry {number}); keep one")
        if spec.get("icl_task_type") not in TASK_TYPES:
            raise UsageError(f"task {label}: unknown icl_task_type {spec.get('icl_task_type')!r} "
                             f"(expected one of {', '.join(TASK_TYPES)})")
        baseline = task_baseline(label, baselines.get(label), meta)
        path = os.path.join(bundle_dir, "eval_data", spec["dataset_uri"])
        items = read_task_items(label, spec["icl_task_type"], path)
        if not isinstance(spec["num_fewshot"], list) or not isinstance(spec["num_fewshot"][0], int) \
                or spec["num_fewshot"][0] < 0:
            raise UsageError(f"task {label}: num_fewshot in {bundle_dir}/core.yaml must be a list like [10]")
        tasks.append(dict(label=label, type=spec["icl_task_type"], shots=int(spec["num_fewshot"][0]),
                          delimiter=delimiter, baseline=baseline, items=items))
    return tasks


def task_baseline(label, rows, path):
    """A task's random baseline in percent: one row, a number in [0, 100) (the centered score divides by 100 - it)."""
    if not rows:
        raise UsageError(f"task {label}: no 'Random baseline' row in {path}")
    if len(rows) > 1:
        raise UsageError(f"{path}:{rows[1][0]}: task {label} is named twice (lines {rows[0][0]} and {rows[1][0]}); "
                         "keep one row")
    line_no, text = rows[0]
    try:
        value = float(text)
    except (TypeError, ValueError):  # a cell that is missing or not a number
        value = math.nan
    if not 0 <= value < 100:  # nan and inf fail too
        raise UsageError(f"{path}:{line_no}: task {label}: 'Random baseline' {text!r} is not a percentage in [0, 100)")
    return value


ITEM_FIELDS = dict(multiple_choice=("query", "choices"), schema=("context_options", "continuation"),
                   language_modeling=("context", "continuation"))


def read_task_items(label, task_type, path):
    """A task's JSONL rows, each checked against its task type before any task runs: one line names file and line."""
    try:
        with open(path, "rb") as f:  # binary: lines end at \n only, so line numbers are the editor's
            lines = f.read().split(b"\n")
    except OSError as e:
        raise UsageError(f"task {label}: cannot read {path} ({e.strerror})") from None
    items = []
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"task {label}: {path}:{line_no}"
        try:
            item = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise UsageError(f"{where}: not a JSON object") from None
        if not isinstance(item, dict) or any(k not in item for k in ITEM_FIELDS[task_type]):
            raise UsageError(f"{where}: a {task_type} row needs {' and '.join(ITEM_FIELDS[task_type])}")
        options = item.get("choices" if task_type == "multiple_choice" else "context_options")
        texts = [item[k] for k in ITEM_FIELDS[task_type] if k not in ("choices", "context_options")]
        if not all(isinstance(t, str) for t in texts + (options if isinstance(options, list) else [])):
            raise UsageError(f"{where}: {', '.join(ITEM_FIELDS[task_type])} must be text")
        if task_type != "language_modeling":
            if not isinstance(options, list) or not options:
                raise UsageError(f"{where}: no answer options")
            gold = item.get("gold")
            if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(options):
                raise UsageError(f"{where}: gold {gold!r} is not an index into its {len(options)} options")
        items.append(item)
    if not items:
        raise UsageError(f"task {label}: {path} is empty")
    return items


def ensure_bundle(bundle_dir, url, rank=0, world_size=1):
    """Use bundle_dir if it exists, else download it on rank 0 while the other ranks wait."""
    error = None
    if rank == 0 and not os.path.exists(bundle_dir):
        try:
            download_bundle(url, bundle_dir)
        except UsageError as e:
            error = str(e)
    if world_size > 1:
        shared = [error]
        dist.broadcast_object_list(shared, src=0)  # doubles as the barrier
        error = shared[0]
    if error:
        raise UsageError(error)
    if not os.path.isfile(os.path.join(bundle_dir, "core.yaml")):
        raise UsageError(f"{bundle_dir} is not a CORE bundle (no core.yaml); point --bundle-dir at the extracted "
                         "eval_bundle folder or remove it to download again")
    return bundle_dir


def shuffled_items(items, max_per_task):
    """Copy, shuffle with Random(1337), keep the first max_per_task (None: all)."""
    items = list(items)
    random.Random(EVAL["shuffle_seed"]).shuffle(items)
    return items[:max_per_task]


# ------------------------------------------------------------------------------------------------------------------
# Few-shot sampling, prompt rendering, scoring regions (paper App. C.2)

def fewshot_indices(n, idx, shots, seed):
    if shots == 0:
        return []
    pool = [i for i in range(n) if i != idx]
    return random.Random(seed + idx).sample(pool, min(shots, len(pool)))


def render(task_type, item, examples, delimiter):
    """-> (prompt strings to tokenize, gold answer string or None). LM prompts are [without, with] the continuation."""
    D = delimiter
    if task_type == "multiple_choice":
        shots = [ex["query"] + D + ex["choices"][ex["gold"]] for ex in examples]
        prompts = ["\n\n".join(shots + [item["query"] + D + choice]).strip() for choice in item["choices"]]
        return prompts, item["choices"][item["gold"]]
    if task_type == "schema":
        shots = [ex["context_options"][ex["gold"]] + D + ex["continuation"] for ex in examples]
        prompts = ["\n\n".join(shots + [option + D + item["continuation"]]).strip()
                   for option in item["context_options"]]
        return prompts, item["continuation"]
    shots = [ex["context"].strip() + D + ex["continuation"] for ex in examples]
    prefix = "\n\n".join(shots + [item["context"].strip() + D])
    return [prefix.strip(), prefix + item["continuation"]], None


def common_prefix_len(seqs):
    """Length of the longest common prefix of token lists (bisection on C-level slice compares: these run on every
    row of every example, thousands of tokens long at GPT-2 context lengths)."""
    lo, hi = min(seqs), max(seqs)  # lexicographic extremes: every sequence shares their common prefix
    same, differ = 0, min(len(lo), len(hi)) + 1  # invariant: lo[:same] == hi[:same], lo[:differ] != hi[:differ]
    while differ - same > 1:
        mid = (same + differ) // 2
        if lo[same:mid] == hi[same:mid]:
            same = mid
        else:
            differ = mid
    return same


def build_example(task_type, item, prompts, answer, encode, max_len):
    """Tokenize (BOS first), find scoring regions, left-crop to max_len.

    Returns dict(rows=[token lists], regions=[(start, end)] per row, gold_row, gold_region (start, end) or None,
    label=gold index). A region [s, e) is scored by the losses at positions [s-1, e-1)."""
    if task_type == "language_modeling":
        without, with_ = encode(prompts[0]), encode(prompts[1])
        if with_[:len(without)] != without or len(without) >= len(with_):
            raise UsageError(f"LM item {item.get('context', '')[:40]!r}: the context tokens are not a prefix of the "
                             "context+continuation tokens (tokenizer merges across the delimiter)")
        rows, regions, gold_row, label = [with_], [(len(without), len(with_))], 0, 0
        gold_region = regions[0]
    else:
        rows = [encode(p) for p in prompts]
        if task_type == "multiple_choice":
            start = common_prefix_len(rows)
            regions = [(start, len(r)) for r in rows]
        else:
            suffix = common_prefix_len([r[::-1] for r in rows])
            regions = [(len(r) - suffix, len(r)) for r in rows]
        label = gold_row = item["gold"]
        gold_prompt = prompts[gold_row]
        if not answer or not gold_prompt.endswith(answer):
            raise UsageError(f"item {gold_prompt[-40:]!r}: the gold prompt does not end with its gold answer")
        gold_start = common_prefix_len([rows[gold_row], encode(gold_prompt[:-len(answer)])])
        if gold_start >= len(rows[gold_row]):
            raise UsageError(f"item {gold_prompt[-40:]!r}: empty gold-answer region")
        gold_region = (gold_start, len(rows[gold_row]))
    clipped = False
    for i, row in enumerate(rows):
        crop = max(0, len(row) - max_len)
        if crop:
            # Deviation: the official evaluator asserts that the scored region survives the crop. A continuation
            # longer than the context (only seen with the bytes tokenizer and a short seq_len) is instead scored on
            # its last max_len - 1 tokens, and the example is counted in the output's clipped_examples.
            rows[i] = row[crop:]
            clipped |= regions[i][0] - crop < 1 or (i == gold_row and gold_region[0] - crop < 1)
            regions[i] = (max(1, regions[i][0] - crop), regions[i][1] - crop)
            if i == gold_row:
                gold_region = (max(1, gold_region[0] - crop), gold_region[1] - crop)
    return dict(rows=rows, regions=regions, gold_row=gold_row, gold_region=gold_region, label=label, clipped=clipped)


def task_examples(task, items, seed, indices, encode_batch, max_len):
    """Render and tokenize the examples `indices` of one (task, seed); prompts are tokenized in one batch call."""
    rendered = []
    for idx in indices:
        examples = [items[j] for j in fewshot_indices(len(items), idx, task["shots"], seed)]
        prompts, answer = render(task["type"], items[idx], examples, task["delimiter"])
        context = prompts[items[idx]["gold"]][:-len(answer)] if answer else None
        rendered.append((prompts, answer, context))
    flat = [p for prompts, _, context in rendered for p in prompts + ([context] if context is not None else [])]
    tokens = iter(encode_batch(flat))
    built = []
    for (prompts, answer, context), idx in zip(rendered, indices):
        cache = {p: next(tokens) for p in prompts + ([context] if context is not None else [])}
        built.append(build_example(task["type"], items[idx], prompts, answer, cache.__getitem__, max_len))
    return built


# ------------------------------------------------------------------------------------------------------------------
# Forward passes and per-example metrics (paper App. C.2)

def forward_units(examples, share_prefix):
    """The sequences to run: one per row, or (share_prefix) one per multi-row example packed as a prefix tree: the
    rows' common prefix once, then each row's own tail. A tail token attends to the prefix and to its own tail, at
    the rotary position it has in its row, so every row sees exactly the context it has when run alone.
    unit["layout"][e, r] = (shared, base): position j of row r sits at packed index j if j < shared, else at
    base + j - shared."""
    units = []
    for e, ex in enumerate(examples):
        rows = ex["rows"]
        shared = common_prefix_len(rows) if share_prefix and len(rows) > 1 else 0
        if shared < 2:  # nothing beyond BOS in common
            units += [dict(example=e, tokens=row, positions=None, branch=None, layout={(e, r): (len(row), 0)})
                      for r, row in enumerate(rows)]
            continue
        unit = dict(example=e, tokens=list(rows[0][:shared]), positions=list(range(shared)), branch=[0] * shared,
                    layout={})
        for r, row in enumerate(rows):
            unit["layout"][e, r] = (shared, len(unit["tokens"]))
            unit["tokens"] += row[shared:]
            unit["positions"] += range(shared, len(row))
            unit["branch"] += [r + 1] * (len(row) - shared)
        units.append(unit)
    return units


def forward_groups(units, rows_per_forward, tokens_per_forward, one_example_per_forward):
    """Batches of units: one example per forward (the reference path), or units sorted by length and packed, trees
    and plain rows apart (plain rows keep the fast causal attention)."""
    if one_example_per_forward:
        groups = {}
        for unit in units:
            groups.setdefault(unit["example"], []).append(unit)
        return list(groups.values())
    key = lambda u: (u["branch"] is not None, len(u["tokens"]))
    groups, current = [], []
    for unit in sorted(units, key=key, reverse=True):  # longest first: current[0] sets the padded length
        if current and (len(current) >= rows_per_forward or key(unit)[0] != key(current[0])[0]
                        or (len(current) + 1) * len(current[0]["tokens"]) > tokens_per_forward):
            groups.append(current)
            current = []
        current.append(unit)
    return groups + [current] if current else groups


def scored_positions(examples):
    """Segments to sum losses over: per (example, row) its scoring region, per example its gold-answer region.
    -> {(e, r): [(segment, row position j, target token)]}: the loss at j scores token j + 1."""
    wanted, segment = {}, 0
    for e, ex in enumerate(examples):
        spans = [(r, ex["regions"][r]) for r in range(len(ex["rows"]))] + [(ex["gold_row"], ex["gold_region"])]
        for r, (s, t) in spans:
            row = ex["rows"][r]
            wanted.setdefault((e, r), []).extend((segment, j, row[j + 1]) for j in range(s - 1, t - 1))
            segment += 1
    return wanted, segment


@torch.no_grad()
def score_examples(net, examples, bos, byte_lengths, device, rows_per_forward=64, scoring="shared"):
    """-> per example (correct, gold mean nats, gold nats over byte-carrying tokens, gold bytes, clipped).

    scoring (SCORING): "one_at_a_time" is the reference path, the rows of one example per forward; "batched" packs
    rows of many examples per forward, sorted by length; "shared" (default) also runs each example's common prefix
    once (prefix trees). All three decode logits only where a loss is scored and give the same results."""
    wanted, n_segments = scored_positions(examples)
    sums = torch.zeros(5, n_segments, dtype=torch.float64)  # loss, tokens, hits, loss on byte tokens, bytes
    units = forward_units(examples, share_prefix=scoring == "shared")
    tokens_per_forward = EVAL["tokens_per_forward"]["cuda" if device.type == "cuda" else "cpu"]
    for group in forward_groups(units, rows_per_forward, tokens_per_forward, scoring == "one_at_a_time"):
        B, T = len(group), max(len(u["tokens"]) for u in group)
        x = torch.full((B, T), bos, dtype=torch.long)
        flat, targets, segments = [], [], []
        for i, unit in enumerate(group):
            x[i, :len(unit["tokens"])] = torch.tensor(unit["tokens"])
            for er, (shared, base) in unit["layout"].items():
                for segment, j, target in wanted[er]:
                    flat.append(i * T + (j if j < shared else base + j - shared))
                    targets.append(target)
                    segments.append(segment)
        positions = attn_mask = None
        if group[0]["branch"] is not None:  # prefix trees: see forward_units
            positions = torch.zeros(B, T, dtype=torch.long)
            branch = torch.zeros(B, T, dtype=torch.long)  # padding joins the prefix: nothing real comes after it
            for i, unit in enumerate(group):
                positions[i, :len(unit["tokens"])] = torch.tensor(unit["positions"])
                branch[i, :len(unit["tokens"])] = torch.tensor(unit["branch"])
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            same_branch = (branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None])
            attn_mask = (causal & same_branch)[:, None].to(device)
            positions = positions.to(device)
        with autocast(device):
            h = net.residual_stream(x.to(device), positions=positions, attn_mask=attn_mask)
            logits = net.decode(h.flatten(0, 1)[torch.tensor(flat, device=device)]).float()
        targets = torch.tensor(targets, device=device)
        losses = F.cross_entropy(logits, targets, reduction="none").double().cpu()
        hits = (logits.argmax(-1) == targets).double().cpu()
        nbytes = byte_lengths[targets.cpu()].double()
        segments = torch.tensor(segments)
        sums.index_add_(1, segments, torch.stack([losses, torch.ones_like(losses), hits, losses * (nbytes > 0),
                                                  nbytes]))
    results, segment = [], 0
    for ex in examples:
        n_rows = len(ex["rows"])
        region_loss = sums[0, segment:segment + n_rows] / sums[1, segment:segment + n_rows]
        if n_rows == 1:  # LM: correct only if every continuation token is the argmax
            correct = bool(sums[2, segment] == sums[1, segment])
        else:  # MC / schema: lowest mean loss over the candidate's region wins, ties -> first index
            candidates = region_loss.tolist()
            correct = min(range(n_rows), key=candidates.__getitem__) == ex["label"]
        gold = segment + n_rows
        results.append((float(correct), (sums[0, gold] / sums[1, gold]).item(), sums[3, gold].item(),
                        sums[4, gold].item(), float(ex["clipped"])))
        segment = gold + 1
    return results


def evaluate_tasks(net, enc, tasks, seeds, max_per_task, max_len, device, rows_per_forward=64, scoring="shared",
                   rank=0, world_size=1, show_progress=True):
    """-> ({label: {seed: (acc, nll, bpb)}}, {label: n_examples}, {label: clipped evaluations}).

    Examples are strided over ranks and all-reduced; zero-shot tasks run once (first seed) and are reused per seed.
    Each rank tokenizes and scores its examples in chunks, so memory stays bounded on the 10k-item tasks."""
    bos = enc.eot_token
    byte_lengths = torch.as_tensor(data.token_byte_lengths(enc), dtype=torch.long)
    encode_batch = lambda texts: [[bos] + t for t in enc.encode_ordinary_batch(texts)]
    raw, counts, clipped = {}, {}, {}
    for task in tasks:
        t0 = time.time()
        items = shuffled_items(task["items"], max_per_task)
        n = counts[task["label"]] = len(items)
        run_seeds = seeds if task["shots"] > 0 else seeds[:1]
        mine = list(range(rank, n, world_size))
        table = torch.zeros(len(run_seeds), n, 5, dtype=torch.float64)  # one score_examples tuple per example
        for s, seed in enumerate(run_seeds):
            for c in range(0, len(mine), EVAL["examples_per_chunk"]):
                chunk = mine[c:c + EVAL["examples_per_chunk"]]
                examples = task_examples(task, items, seed, chunk, encode_batch, max_len)
                scores = score_examples(net, examples, bos, byte_lengths, device, rows_per_forward, scoring)
                table[s, chunk] = torch.tensor(scores, dtype=torch.float64)
                if show_progress and rank == 0:
                    done = s * len(mine) + c + len(chunk)
                    print(f"\r{task['label']:<34} {done}/{len(run_seeds) * len(mine)} examples (rank 0)  "
                          f"{time.time() - t0:6.1f}s", end="", file=sys.stderr, flush=True)
        if show_progress and rank == 0:
            print(file=sys.stderr)
        if world_size > 1:  # every example lives on exactly one rank, so summing zeros elsewhere is exact
            table = table.to(device)
            dist.all_reduce(table)
            table = table.cpu()
        per_seed = {}
        for s, seed in enumerate(run_seeds):
            bpb = table[s, :, 2] / (math.log(2) * table[s, :, 3])  # NaN where the gold answer has no bytes
            per_seed[seed] = (table[s, :, 0].mean().item(), table[s, :, 1].mean().item(), bpb.mean().item())
        raw[task["label"]] = {seed: per_seed[seed if task["shots"] > 0 else seeds[0]] for seed in seeds}
        clipped[task["label"]] = int(table[:, :, 4].sum().item())
    return raw, counts, clipped


# ------------------------------------------------------------------------------------------------------------------
# Aggregation (paper App. C.2: centered accuracy, the 17-task filter, seeds)

def mean(values):
    return float(np.mean(list(values)))


def pstdev(values):  # population std over seeds (0 for one seed)
    return float(np.std(list(values)))


def finite_or_none(x):
    return x if x is not None and math.isfinite(x) else None


def aggregate(raw, baselines, seeds, verified=False):
    """raw {label: {seed: (acc, nll, bpb)}}, baselines {label: percent} -> the metric part of the output JSON.
    verified: the tasks are the 22 CORE tasks of a bundle whose fingerprint was checked (only then CORE-22)."""
    labels = list(raw)
    centered = lambda label, acc: (acc - baselines[label] / 100) / (1 - baselines[label] / 100)
    per_seed = {}
    for seed in seeds:
        per_seed[str(seed)] = dict(
            results={l: raw[l][seed][0] for l in labels}, losses={l: raw[l][seed][1] for l in labels},
            bpbs={l: finite_or_none(raw[l][seed][2]) for l in labels},
            centered_results={l: centered(l, raw[l][seed][0]) for l in labels})
    over_seeds = lambda field, label: [raw[label][seed][field] for seed in seeds]
    results = {l: mean(over_seeds(0, l)) for l in labels}
    losses = {l: mean(over_seeds(1, l)) for l in labels}
    bpbs = {l: mean(over_seeds(2, l)) for l in labels}
    bad = [l for l in labels if not math.isfinite(losses[l])]
    if bad:
        raise UsageError(f"non-finite answer NLL for task(s) {', '.join(bad)}; the model produced NaN/inf logits")
    centered_results = {l: centered(l, results[l]) for l in labels}
    finite_bpbs = [v for v in bpbs.values() if math.isfinite(v)]
    metric_per_seed = {str(s): mean(per_seed[str(s)]["centered_results"].values()) for s in seeds}
    complete = verified and sorted(labels) == sorted(CORE_TASKS)
    return dict(
        core_metric=mean(centered_results.values()),
        core_metric_label="CORE-22" if complete else f"CORE-partial ({len(labels)} tasks, not comparable to CORE-22)",
        core_loss=mean(losses.values()), core_bpb=mean(finite_bpbs) if finite_bpbs else None,
        core_metric_filtered=mean(centered_results[l] for l in FILTERED_TASKS) if complete else None,
        filtered_tasks=FILTERED_TASKS,
        core_metric_std=pstdev(metric_per_seed.values()),
        core_metric_per_seed=metric_per_seed,
        core_loss_per_seed={str(s): mean(per_seed[str(s)]["losses"].values()) for s in seeds},
        core_loss_dropped_tasks=[],
        results=results, centered_results=centered_results, losses=losses,
        bpbs={l: finite_or_none(v) for l, v in bpbs.items()},
        results_std={l: pstdev(over_seeds(0, l)) for l in labels},
        losses_std={l: pstdev(over_seeds(1, l)) for l in labels},
        bpbs_std={l: finite_or_none(pstdev(over_seeds(2, l))) for l in labels},
        per_seed=per_seed, seeds=list(seeds),
        complete_suite=complete, missing_tasks=[t for t in CORE_TASKS if t not in labels],
    )


# ------------------------------------------------------------------------------------------------------------------
# KL effective depth (paper Sec. 6): logit lens after every executed block

@torch.no_grad()
def kl_effective_depth(net, windows, threshold, device, rank=0, world_size=1):
    """-> (first block after the KL peak with KL(final || lens) <= threshold, per-block KL averaged over tokens)."""
    sums, tokens = None, 0
    for window in windows[rank::world_size]:
        x = window[:-1].unsqueeze(0).to(device)
        with autocast(device):
            logits, hidden = net(x, return_hidden=True)
        final = F.log_softmax(logits.float(), dim=-1)
        p_final = final.exp()
        kl = []
        for h in hidden[1:]:
            with autocast(device):
                lens = F.log_softmax(net.decode(h).float(), dim=-1)
            kl.append((p_final * (final - lens)).sum(-1).sum().double())
        kl = torch.stack(kl)
        sums = kl if sums is None else sums + kl
        tokens += x.numel()
    if world_size > 1:
        counts = torch.tensor([float(tokens)], dtype=torch.float64, device=device)
        dist.all_reduce(counts)
        tokens = counts.item()
        if sums is None:  # this rank got no window; contribute zeros of the right length
            sums = torch.zeros(model.executed_blocks(net.cfg, net.active_passes), dtype=torch.float64, device=device)
        dist.all_reduce(sums)
    curve = (sums / tokens).tolist()
    return effective_depth(curve, threshold), curve


def effective_depth(curve, threshold):
    """1-based index of the first block after the KL peak whose KL is <= threshold (the last block if none)."""
    peak = max(range(len(curve)), key=curve.__getitem__)
    return next((b + 1 for b in range(peak + 1, len(curve)) if curve[b] <= threshold), len(curve))


# ------------------------------------------------------------------------------------------------------------------
# Model loading, CLI

def load_model(checkpoint, device, passes=None):
    """The model weights only (model.pt of a checkpoint folder, or an old single-file checkpoint), never optimizer
    state; its attention on PyTorch's own SDPA choice (CORE's lengths are arbitrary: arms.ATTENTION_BACKENDS)."""
    try:
        net, ckpt = load_checkpoint_model(checkpoint, device=device)
        net.set_attention("default")
    except ValueError as e:
        raise UsageError(str(e).splitlines()[0] if str(e) else f"cannot load checkpoint {checkpoint}")
    bad = next((name for name, t in net.state_dict().items() if not torch.isfinite(t).all()), None)
    if bad:  # else NaN scores, refused only after the whole evaluation
        raise UsageError(f"checkpoint {checkpoint} holds non-finite weights (nan or inf in {bad}); evaluate an "
                         "earlier checkpoint of the run")
    if passes is not None:
        if passes < 1:
            raise UsageError(f"--passes must be >= 1, got {passes}")
        try:
            net.set_passes(passes)
        except (ValueError, AssertionError) as e:
            raise UsageError(f"--passes {passes} is not possible for this checkpoint ({e})")
    return net, ckpt


def get_encoding(name):
    """The tokenizer the checkpoint records. tiktoken reads GPT-2's vocabulary from its cache (TIKTOKEN_CACHE_DIR,
    else a folder in this node's temp dir) and downloads it on a miss: an offline node needs a filled cache."""
    try:
        return data.get_tokenizer(name)
    except data.DataError as e:
        if name != "gpt2":
            raise UsageError(f"cannot load the {name!r} tokenizer recorded in the checkpoint ({e})") from None
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") or \
            os.path.join(tempfile.gettempdir(), "data-gym-cache")
        raise UsageError(f"the checkpoint's 'gpt2' tokenizer is not in tiktoken's cache {cache} and could not be "
                         "downloaded (no network?); on a machine with internet run TIKTOKEN_CACHE_DIR=DIR python -c "
                         "\"import tiktoken; tiktoken.get_encoding('gpt2')\", then copy DIR here (or use a shared "
                         "folder) and set TIKTOKEN_CACHE_DIR=DIR") from None


def default_out(checkpoint, passes):
    path = os.path.abspath(checkpoint)
    if os.path.basename(path) == CHECKPOINT_WEIGHTS:  # runs/<name>/checkpoints/final/model.pt
        path = os.path.dirname(path)
    folder = os.path.dirname(path)
    if os.path.basename(folder) == "checkpoints":  # runs/<name>/checkpoints/final(.pt) -> runs/<name>/eval.json
        folder = os.path.dirname(folder)
    return os.path.join(folder, "eval.json" if passes is None else f"eval_passes{passes}.json")


def run_eval(args, out_path, rank, world_size, device):
    t0 = time.time()
    net, ckpt = load_model(args.checkpoint, device, args.passes)
    enc = get_encoding(ckpt.get("tokenizer", "gpt2"))
    vocab = ckpt["model_config"]["vocab_size"]
    if vocab != enc.n_vocab:  # fewer ids: an IndexError inside the first forward; more: scores over the wrong ids
        raise UsageError(f"checkpoint {args.checkpoint} has a vocabulary of {vocab} token ids but its tokenizer "
                         f"{ckpt.get('tokenizer', 'gpt2')!r} has {enc.n_vocab}; it was not written by train.py with "
                         "that tokenizer (its model_config or tokenizer was changed)")
    bundle_dir = ensure_bundle(args.bundle_dir, args.bundle_url, rank, world_size)
    tasks = load_tasks(bundle_dir)
    fingerprint = bundle_fingerprint(bundle_dir)
    verified = sorted(t["label"] for t in tasks) == sorted(CORE_TASKS)  # labels are unique (load_tasks)
    if verified and fingerprint != args.expect_fingerprint:
        raise UsageError(f"bundle {bundle_dir} has content fingerprint {fingerprint}, expected "
                         f"{args.expect_fingerprint}; re-download it (delete the folder) or remove extra files")
    max_len = ckpt["model_config"]["seq_len"]
    windows = lens_windows(args, max_len, ckpt["model_config"]["vocab_size"]) if args.effective_depth else None
    settings = dict(flag_settings(args), step=ckpt.get("step"), passes=net.active_passes, suite_fingerprint=fingerprint)
    check_out_path(out_path, args.overwrite, settings)  # a repeat is also of the same step, passes and bundle
    raw, counts, clipped = evaluate_tasks(net, enc, tasks, args.seeds, args.max_per_task, max_len, device,
                                          args.batch_size, args.scoring, rank=rank, world_size=world_size)
    out = aggregate(raw, {t["label"]: t["baseline"] for t in tasks}, args.seeds, verified)
    out.update(settings, task_counts=counts, num_examples=sum(counts.values()), shuffle_seed=EVAL["shuffle_seed"],
               vary_subsample=False, fingerprint_verified=out["complete_suite"],
               bundle_dir=os.path.abspath(bundle_dir), clipped_examples={label: n for label, n in clipped.items() if n},
               tokenizer=ckpt.get("tokenizer"), model_config=ckpt["model_config"], device=device.type,
               world_size=world_size)
    if args.effective_depth:
        depth, curve = kl_effective_depth(net, windows, args.kl_threshold, device, rank, world_size)
        out.update(kl_effective_depth=depth, kl_per_block=curve, kl_threshold=args.kl_threshold,
                   lens_tokens=len(windows) * max_len)
    out["elapsed_seconds"] = time.time() - t0
    return out


def lens_windows(args, max_len, vocab_size):
    """The --effective-depth validation windows, loaded (and checked) before the CORE evaluation starts."""
    try:
        pool = data.load_pool(args.data_dir, "val")
        windows = data.val_windows(pool, max_len, args.lens_tokens)
        data.check_token_range(args.data_dir, pool, vocab_size, windows.numel())
    except data.DataError as e:
        raise UsageError(f"--effective-depth: {e}") from None
    return windows


def flag_settings(args):
    """The flags that change an evaluation's numbers, as eval.json records them (run_eval adds step, passes and the
    bundle's fingerprint)."""
    lens = args.effective_depth and dict(data_dir=os.path.abspath(args.data_dir), lens_tokens=args.lens_tokens,
                                         kl_threshold=args.kl_threshold)
    return dict(checkpoint=os.path.abspath(args.checkpoint), seeds=list(args.seeds), max_per_task=args.max_per_task,
                scoring=args.scoring, batch_size=args.batch_size, effective_depth=lens or None)


def check_out_path(out_path, overwrite, settings):
    """Write only into an existing writable folder, and replace only core_eval's result of the same evaluation (the
    same checkpoint and `settings`), or anything with --overwrite: another evaluation's result is never lost."""
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):
        raise UsageError(f"--out {out_path}: its folder does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--out {out_path}: its folder is not writable (read-only filesystem or permissions)")
    if os.path.isdir(out_path):
        raise UsageError(f"--out {out_path} is a directory; pass a file name such as {out_path}/eval.json")
    if not os.path.exists(out_path) or overwrite:
        return
    try:
        with open(out_path) as f:
            previous = json.load(f)
    except (OSError, ValueError):
        previous = None
    if isinstance(previous, dict) and "core_metric" in previous:  # core_eval's: a field of the wrong type is named
        check_record(out_path, previous, EVAL_SCHEMA, "it is not a core_eval.py result: pass another --out or --overwrite")
    if not isinstance(previous, dict) or "core_metric" not in previous or previous["checkpoint"] != settings["checkpoint"]:
        raise UsageError(f"--out {out_path} exists and is not core_eval's result for this checkpoint; pass "
                         "another --out, or --overwrite to replace it")
    changed = [f"{key} {previous.get(key)!r} -> {value!r}" for key, value in settings.items()
               if previous.get(key) != value]
    if changed:
        raise UsageError(f"--out {out_path} holds core_eval's result for this checkpoint with other settings "
                         f"({'; '.join(changed)}); pass another --out, or --overwrite to replace it")


def save_elsewhere(out, out_path):
    """Keep the results of an evaluation whose --out cannot be written: in a file in the system's temporary folder,
    else on stdout. -> where, for the error message."""
    text = json.dumps(out, indent=2, allow_nan=False) + "\n"
    path = None
    try:
        fd, path = tempfile.mkstemp(prefix="core_eval-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return f"the results are saved in {path} (move it to {out_path} once there is room)"
    except OSError:
        if path:
            with contextlib.suppress(OSError):
                os.remove(path)
        print(text, end="")
        return "the results are printed on stdout"


def run_bench(args, device):
    """Examples/s of the three scoring paths on a small random model with the bytes tokenizer."""
    torch.manual_seed(0)
    # the shape of train.py's offline "cpu" preset at depth 4 (the checkpoints CORE-evaluated on CPU)
    cfg = model.config_for("vanilla", 4, width_per_depth=16, head_dim=16, seq_len=128, mlp_multiple=16, vocab_size=257)
    net = model.GPT(cfg, attention="default").to(device).eval()
    tasks = load_tasks(ensure_bundle(args.bundle_dir, args.bundle_url))
    enc, max_per_task, seeds = data.get_tokenizer("bytes"), args.max_per_task or 100, args.seeds[:1]
    n_examples = sum(min(len(t["items"]), max_per_task) for t in tasks)
    for scoring in SCORING:  # warm-up: first-call allocations and tokenizer start-up are not what is measured
        evaluate_tasks(net, enc, tasks[:2], seeds, 4, cfg.seq_len, device, args.batch_size, scoring,
                       show_progress=False)
    seconds = {scoring: math.inf for scoring in SCORING}
    for _ in range(3):  # interleaved repeats, best of three: a shared machine's noise only ever adds time
        for scoring in SCORING:
            t0 = time.time()
            evaluate_tasks(net, enc, tasks, seeds, max_per_task, cfg.seq_len, device, args.batch_size, scoring,
                           show_progress=False)
            seconds[scoring] = min(seconds[scoring], time.time() - t0)
    for scoring in SCORING:
        print(f"{scoring:>14}: {n_examples} examples in {seconds[scoring]:.2f}s = "
              f"{n_examples / seconds[scoring]:.1f} examples/s = {seconds['one_at_a_time'] / seconds[scoring]:.2f}x "
              f"one_at_a_time")
    print(f"(best of 3; vanilla d4 w64 seq_len 128, {len(tasks)} tasks x {max_per_task} examples, seed {seeds[0]}, "
          f"{torch.get_num_threads()} threads)")


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if len(set(args.seeds)) < len(args.seeds):  # a repeated seed would count twice in the mean over seeds
        p.error(f"--seeds names a seed twice ({' '.join(map(str, args.seeds))}); give each once")
    return args


def run(argv):
    args = parse_args(argv)
    if args.bench:
        return run_bench(args, torch.device("cpu"))
    if not args.checkpoint:
        raise UsageError("--checkpoint is required (or --bench)")
    try:  # before any work: a missing file, a run folder instead of its checkpoint, a failed manifest
        checkpoint_weights_path(args.checkpoint)
    except ValueError as e:
        raise UsageError(f"{e} (train.py writes runs/NAME/checkpoints/final)")
    if args.effective_depth and not args.data_dir:
        raise UsageError("--effective-depth needs --data-dir (a token pool with a val split)")
    out_path = args.out or default_out(args.checkpoint, args.passes)
    check_out_path(out_path, args.overwrite, flag_settings(args))
    rank, world_size, device = setup_distributed()
    out = run_eval(args, out_path, rank, world_size, device)
    if rank != 0:
        return
    try:
        write_json(out_path, out, allow_nan=False)
    except OSError as e:  # a full disk: the evaluation is done, keep its results
        raise UsageError(f"cannot write {out_path}: {e.strerror}; {save_elsewhere(out, out_path)}") from None
    label, filtered = out["core_metric_label"], out["core_metric_filtered"]
    print(f"{label}: core_metric {out['core_metric']:.4f} ± {out['core_metric_std']:.4f}  core_loss "
          f"{out['core_loss']:.4f}  core_metric_filtered {'n/a' if filtered is None else f'{filtered:.4f}'}  "
          f"({out['num_examples']} examples, {out['elapsed_seconds']:.1f}s)")
    if not out["complete_suite"]:
        print(f"partial suite: missing {', '.join(out['missing_tasks'])}")
    if "kl_effective_depth" in out:
        print(f"kl_effective_depth {out['kl_effective_depth']}  kl_per_block "
              + " ".join(f"{v:.2f}" for v in out["kl_per_block"]))
    print(f"wrote {out_path}")


def main(argv=None):
    return cli_main_distributed(run, "core_eval.py", argv)


if __name__ == "__main__":
    exit_process(main())
