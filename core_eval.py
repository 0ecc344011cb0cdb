"""DCLM CORE evaluation (22 tasks) of a train.py checkpoint: CORE accuracy, answer NLL, the frozen 17-task filtered
score, few-shot seeds 0 1 2 (mean and population std), and the logit-lens KL effective depth. Protocol: the paper's
App. C.2 (docs/recipe.md, "CORE"). A new per-task metric is one entry of METRICS.

    python core_eval.py --checkpoint runs/X                                          # full suite -> runs/X/eval.json
    python core_eval.py --checkpoint CKPT --bundle-dir my/eval_bundle --max-per-task 100 --seed 0
    torchrun --nproc_per_node 8 core_eval.py --checkpoint CKPT                       # examples sharded over ranks
    python core_eval.py --checkpoint CKPT --effective-depth --data-dir data/stdlib  # + KL effective depth
"""
import argparse, csv, hashlib, json, math, os, random, re, sys, tempfile, time, urllib.request, zipfile
from statistics import fmean

from arms import MAX_PASSES, SEEDS
from common import (Parser, UsageError, answer_help, cli_main, exit_process, integer, number, setup_distributed,
                    sha256_file, write_json)

EVAL = dict(
    bundle_fingerprint="e908e4e0e145860290d46fb37c5d1bad52bbf22da843073ff0e6b6f624250e52",  # all 77 bundle files
    shuffle_seed=1337,          # example-order shuffle, every task
    tokens_per_forward=dict(cuda=16384, cpu=2048),  # padded: bounds GPU memory; small CPU forwards stay in cache
    examples_per_chunk=512,     # examples tokenized and held in memory at a time (per rank)
)
CORE_TASKS = """hellaswag_zeroshot jeopardy bigbench_qa_wikidata arc_easy arc_challenge copa commonsense_qa piqa
    openbook_qa lambada_openai hellaswag winograd winogrande bigbench_dyck_languages agi_eval_lsat_ar
    bigbench_cs_algorithms bigbench_operators bigbench_repeat_copy_logic squad coqa boolq
    bigbench_language_identification""".split()  # the 22 CORE tasks in core.yaml order
FILTERED_TASKS = sorted(set(CORE_TASKS) - {"bigbench_cs_algorithms", "bigbench_language_identification",  # the frozen
                                           "bigbench_repeat_copy_logic", "boolq", "commonsense_qa"})  # 17-task subset


def build_parser():
    p = Parser(prog="core_eval.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a train.py run folder, its checkpoints folder or a step folder")
    p.add_argument("--bundle-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache",
                   "eval_bundle"), help="extracted CORE bundle (absent: downloaded, fingerprint-checked)")
    p.add_argument("--bundle-url", default="https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip")
    p.add_argument("--seed", type=integer(*SEEDS), nargs="+", default=[0, 1, 2], help="few-shot seed(s)")
    p.add_argument("--max-per-task", type=integer(1, 10 ** 9), help="keep the first N shuffled examples of each task")
    p.add_argument("--passes", type=integer(1, MAX_PASSES), help="evaluate at K passes (default: the checkpoint's)")
    p.add_argument("--batch-size", type=integer(1, 2 ** 20), default=64, help="rows per forward (1: reference path)")
    p.add_argument("--out", help="output JSON (default: <run folder>/eval.json, or eval_passesK.json with --passes)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--effective-depth", action="store_true", help="also compute the logit-lens KL effective depth")
    p.add_argument("--data-dir", help="token pool with a val split (for --effective-depth)")
    p.add_argument("--lens-tokens", type=integer(1, 2 ** 40), default=65536, help="validation tokens for the lens")
    p.add_argument("--kl-threshold", type=number("(0, inf)"), default=2.0, help="nats (paper Fig. 6)")
    return p


if __name__ == "__main__":
    answer_help(build_parser)  # before torch loads (2-3 s on 2 cores)

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml

import data
from train import each_once, gather, load_checkpoint_model

# --- The CORE bundle: every row of every task is checked before any task runs (a bad row is one line: file:line)
ITEM_FIELDS = dict(multiple_choice=("query", "choices"), schema=("context_options", "continuation"),  # task type ->
                   language_modeling=("context", "continuation"))  # the fields of its rows


def ensure_bundle(bundle_dir, url, rank=0, world_size=1):
    """bundle_dir, else (rank 0) the zip from `url` extracted, its content fingerprint checked, renamed into place."""
    parent = os.path.dirname(os.path.abspath(bundle_dir))
    if rank == 0 and not os.path.exists(bundle_dir):
        os.makedirs(parent, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".eval_bundle_download.", dir=parent) as tmp:
            try:
                print(f"downloading {url}", file=sys.stderr)
                with zipfile.ZipFile(urllib.request.urlretrieve(url, os.path.join(tmp, "bundle.zip"))[0]) as zf:
                    zf.extractall(tmp)
            except (OSError, zipfile.BadZipFile) as e:
                raise UsageError(f"could not download and unzip the CORE bundle from {url} ({e}); pass --bundle-dir "
                                 "with an extracted bundle to run offline") from None
            extracted = os.path.join(tmp, "eval_bundle")
            if not os.path.isdir(extracted) or bundle_fingerprint(extracted) != EVAL["bundle_fingerprint"]:
                raise UsageError(f"the zip from {url} is not the CORE bundle (no eval_bundle/ folder, or its content "
                                 "fingerprint differs from the paper's); pass --bundle-dir with an extracted bundle")
            os.replace(extracted, bundle_dir)
    if world_size > 1:
        dist.barrier()
    return bundle_dir


def bundle_fingerprint(bundle_dir):
    """sha256 over (path relative to the bundle root, file sha256 hex) of every file, os.walk order, sorted names."""
    outer = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(bundle_dir):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            outer.update(os.path.relpath(path, bundle_dir).replace(os.sep, "/").encode() + sha256_file(path).encode())
    return outer.hexdigest()


def load_tasks(bundle_dir):
    """Read core.yaml + eval_meta_data.csv + each task's JSONL -> list of task dicts in core.yaml order."""
    meta = os.path.join(bundle_dir, "eval_meta_data.csv")
    try:
        with open(os.path.join(bundle_dir, "core.yaml")) as f:
            specs = yaml.safe_load(f)["icl_tasks"]
        with open(meta, newline="") as f:
            rows = [(row["Eval Task"], row["Random baseline"]) for row in csv.DictReader(f)]
        assert isinstance(specs, list) and specs
    except (OSError, UnicodeDecodeError, yaml.YAMLError, csv.Error, KeyError, TypeError, AssertionError) as e:
        raise UsageError(f"{bundle_dir} is not a readable CORE bundle: core.yaml with an icl_tasks list, "
                         f"eval_meta_data.csv ({type(e).__name__}: {e}); point --bundle-dir at the extracted "
                         "eval_bundle folder") from None
    tasks = []
    for index, spec in enumerate(specs, 1):
        try:
            label, uri, task_type = spec["label"], spec["dataset_uri"], spec["icl_task_type"]
            shots, delimiter = spec["num_fewshot"][0], spec.get("continuation_delimiter") or " "
            assert all(isinstance(v, str) for v in (label, uri, delimiter)) and type(shots) is int and shots >= 0
            assert task_type in ITEM_FIELDS
        except (KeyError, TypeError, IndexError, AssertionError):
            raise UsageError(f"icl_tasks entry {index} of {bundle_dir}/core.yaml needs label, dataset_uri, "
                             f"continuation_delimiter (text), num_fewshot (a list like [10]) and icl_task_type (one of "
                             f"{', '.join(ITEM_FIELDS)})") from None
        if any(t["label"] == label for t in tasks):  # a copy counts once in the scores, but made 23 tasks of 22
            raise UsageError(f"task {label}: named twice in {bundle_dir}/core.yaml (again in entry {index}); keep one")
        cells = [cell for name, cell in rows if name == label]
        try:
            (baseline,) = map(float, cells)  # a missing cell reads None
            assert 0 <= baseline < 100  # the centered score divides by 100 - baseline
        except (TypeError, ValueError, AssertionError):
            raise UsageError(f"task {label}: {meta} needs one 'Random baseline' row for it, a percentage in [0, 100) "
                             f"(found {cells})") from None
        tasks.append(dict(label=label, type=task_type, shots=shots, delimiter=delimiter, baseline=baseline,
                          items=read_task_items(label, task_type, f"{bundle_dir}/eval_data/{uri}")))
    return tasks


def read_task_items(label, task_type, path):
    """A task's JSONL rows, each checked against its task type before any task runs: one line names file and line."""
    try:
        with open(path, "rb") as f:  # binary: lines end at \n only, so line numbers are the editor's
            lines = f.read().split(b"\n")
    except OSError as e:
        raise UsageError(f"task {label}: cannot read {path} ({e.strerror})") from None
    items, fields = [], ITEM_FIELDS[task_type]
    for line_no, line in enumerate(lines, 1):
        if line.strip():
            try:
                item = json.loads(line)  # UTF-8 (a decode error is a ValueError)
                values = [item[k] for k in fields]
                assert all(isinstance(t, str) for v in values for t in (v if isinstance(v, list) else [v]))
                gold, options = item.get("gold"), item.get("choices", item.get("context_options"))
                assert task_type == "language_modeling" or type(gold) is int and 0 <= gold < len(options)
            except (ValueError, KeyError, TypeError, AssertionError):
                hint = "" if task_type == "language_modeling" else ", gold an index into the options"
                raise UsageError(f"task {label}: {path}:{line_no}: not a {task_type} row (a JSON object with "
                                 f"{' and '.join(fields)} as text{hint})") from None
            items.append(item)
    if not items:
        raise UsageError(f"task {label}: {path} is empty")
    return items


# --- Few-shot sampling, prompt rendering, scoring regions (paper App. C.2)
def shuffled_items(items, max_per_task):
    """Copy, shuffle with Random(1337), keep the first max_per_task (None: all)."""
    items = list(items)
    random.Random(EVAL["shuffle_seed"]).shuffle(items)
    return items[:max_per_task]


def fewshot_indices(n, idx, shots, seed):
    pool = [i for i in range(n) if i != idx]
    return random.Random(seed + idx).sample(pool, min(shots, len(pool))) if shots else []


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


def build_example(task_type, item, prompts, answer, encode, max_len):
    """Tokenize (BOS first), find scoring regions, left-crop to max_len. Returns dict(rows=[token lists],
    regions=[(start, end)] per row, gold_row (the gold index), gold_region (start, end), clipped). A region [s, e) is
    scored by the losses at positions [s-1, e-1)."""
    prefix_len = lambda seqs: len(os.path.commonprefix(seqs))
    if task_type == "language_modeling":
        without, with_ = encode(prompts[0]), encode(prompts[1])
        if with_[:len(without)] != without or len(without) >= len(with_):
            raise UsageError(f"LM item {item.get('context', '')[:40]!r}: the context tokens are not a prefix of the "
                             "context+continuation tokens (tokenizer merges across the delimiter)")
        rows, regions, label = [with_], [(len(without), len(with_))], 0
        gold_region = regions[0]
    else:
        rows, label = [encode(p) for p in prompts], item["gold"]
        if task_type == "multiple_choice":  # the candidates differ after their common prefix
            regions = [(prefix_len(rows), len(r)) for r in rows]
        else:  # schema: the options differ before their common suffix
            suffix = prefix_len([r[::-1] for r in rows])
            regions = [(len(r) - suffix, len(r)) for r in rows]
        gold_prompt = prompts[label]
        if not answer or not gold_prompt.endswith(answer):
            raise UsageError(f"item {gold_prompt[-40:]!r}: the gold prompt does not end with its gold answer")
        gold_start = prefix_len([rows[label], encode(gold_prompt[:-len(answer)])])
        if gold_start >= len(rows[label]):
            raise UsageError(f"item {gold_prompt[-40:]!r}: empty gold-answer region")
        gold_region = (gold_start, len(rows[label]))
    # Left-crop. Deviation: the official evaluator asserts that the scored region survives the crop. A continuation
    # longer than the context (only seen with the bytes tokenizer and a short seq_len) is instead scored on its last
    # max_len - 1 tokens, and the example is counted in eval.json's `clipped`.
    crops = [max(0, len(row) - max_len) for row in rows]
    crop = lambda r, region: (max(1, region[0] - crops[r]), region[1] - crops[r])
    clipped = any(start - crops[r] < 1 for r, (start, _) in [*enumerate(regions), (label, gold_region)])
    return dict(rows=[row[c:] for row, c in zip(rows, crops)], regions=[crop(r, g) for r, g in enumerate(regions)],
                gold_row=label, gold_region=crop(label, gold_region), clipped=clipped)


def task_examples(task, items, seed, indices, encode, max_len):
    """Render and tokenize the examples `indices` of one (task, seed)."""
    built = []
    for idx in indices:
        shots = [items[j] for j in fewshot_indices(len(items), idx, task["shots"], seed)]
        prompts, answer = render(task["type"], items[idx], shots, task["delimiter"])
        built.append(build_example(task["type"], items[idx], prompts, answer, encode, max_len))
    return built


# --- Forward passes and per-example scores (paper App. C.2)
@torch.no_grad()
def score_examples(net, examples, bos, byte_lengths, device, rows_per_forward=64):
    """-> per example: correct (0/1), answer_nll (mean nats over the gold answer's tokens), answer_nats and answer_bytes
    (nats over, and UTF-8 bytes of, its byte-carrying tokens), clipped (0/1). Each forward packs rows, longest first,
    up to rows_per_forward rows and tokens_per_forward padded tokens, and decodes logits only where a loss is scored."""
    first = {}  # every region ends where its row ends: a row is scored from its earliest region's start on
    for e, ex in enumerate(examples):
        for r, (start, _) in [*enumerate(ex["regions"]), (ex["gold_row"], ex["gold_region"])]:
            first[e, r] = min(start, first.get((e, r), start))
    length = lambda er: len(examples[er[0]]["rows"][er[1]])
    tokens_per_forward = EVAL["tokens_per_forward"]["cuda" if device.type == "cuda" else "cpu"]
    groups = []
    for er in sorted(first, key=length, reverse=True):  # a group's first row sets its padded length
        if not groups or len(groups[-1]) >= rows_per_forward or \
                (len(groups[-1]) + 1) * length(groups[-1][0]) > tokens_per_forward:
            groups.append([])
        groups[-1].append(er)
    scored = {}  # (example, row) -> (loss, hit, bytes) of each token from first[example, row] on
    for group in groups:
        T = max(map(length, group))
        x = torch.full((len(group), T), bos, dtype=torch.long)
        positions, targets = [], []  # the loss at position j scores token j + 1
        for i, (e, r) in enumerate(group):
            row = examples[e]["rows"][r]
            x[i, :len(row)] = torch.tensor(row)
            positions += range(i * T + first[e, r] - 1, i * T + len(row) - 1)
            targets += row[first[e, r]:]
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            h = net.residual_stream(x.to(device))
            logits = net.decode(h.flatten(0, 1)[torch.tensor(positions, device=device)]).float()
        targets = torch.tensor(targets, device=device)
        losses = F.cross_entropy(logits, targets, reduction="none").double().cpu()
        hits, nbytes = (logits.argmax(-1) == targets).cpu(), byte_lengths[targets.cpu()].double()
        sizes = [length(er) - first[er] for er in group]
        scored.update(zip(group, zip(losses.split(sizes), hits.split(sizes), nbytes.split(sizes))))
    results = []
    for e, ex in enumerate(examples):
        region = lambda r, start: [t[start - first[e, r]:] for t in scored[e, r]]  # tokens [start, end of row r)
        if len(ex["rows"]) == 1:  # LM: correct only if every continuation token is the argmax
            correct = bool(region(0, ex["regions"][0][0])[1].all())
        else:  # MC / schema: lowest mean loss over the candidate's region wins, ties -> first index
            means = [region(r, start)[0].mean().item() for r, (start, _) in enumerate(ex["regions"])]
            correct = min(range(len(means)), key=means.__getitem__) == ex["gold_row"]
        loss, _, nbytes = region(ex["gold_row"], ex["gold_region"][0])
        results.append(dict(correct=float(correct), answer_nll=loss.mean().item(), answer_bytes=nbytes.sum().item(),
                            answer_nats=(loss * (nbytes > 0)).sum().item(), clipped=float(ex["clipped"])))
    return results


def evaluate_tasks(net, enc, tasks, seeds, max_per_task, max_len, device, rows_per_forward=64, rank=0,
                   world_size=1):
    """-> {label: {seed: {metric: value}}} (METRICS). Examples are strided over ranks and gathered; zero-shot tasks run
    once (first seed), reused per seed. Each rank tokenizes and scores its examples in chunks (bounded memory)."""
    byte_lengths = torch.as_tensor(data.token_byte_lengths(enc), dtype=torch.long)
    encode = lambda text: [enc.eot_token] + enc.encode_ordinary(text)
    scores = {}
    for task in tasks:
        t0, label, items = time.time(), task["label"], shuffled_items(task["items"], max_per_task)
        run_seeds = seeds if task["shots"] > 0 else seeds[:1]
        mine, chunk, per_seed = list(range(rank, len(items), world_size)), EVAL["examples_per_chunk"], {}
        for s, seed in enumerate(run_seeds):
            results = []
            for c in range(0, len(mine), chunk):
                examples = task_examples(task, items, seed, mine[c:c + chunk], encode, max_len)
                results += score_examples(net, examples, enc.eot_token, byte_lengths, device, rows_per_forward)
                if rank == 0:  # progress
                    print(f"\r{label:<34} {s * len(mine) + len(results)}/{len(run_seeds) * len(mine)} examples "
                          f"(rank 0)  {time.time() - t0:6.1f}s", end="", file=sys.stderr, flush=True)
            if world_size > 1:  # rank r scored examples r, r + world_size, ...
                gathered = gather(results)
                results = [gathered[i % world_size][i // world_size] for i in range(len(items))]
            per_seed[seed] = results
        if rank == 0:
            print(file=sys.stderr)
        scores[label] = {seed: {name: metric(per_seed.get(seed, per_seed[seeds[0]]))
                                for name, metric in METRICS.items()} for seed in seeds}
    return scores


# --- Metrics and aggregation (paper App. C.2: centered accuracy, the 17-task filter, seeds)
# Per-task metrics: eval.json key -> function of one (task, seed)'s per-example scores (score_examples' dicts). A new
# metric is one entry; eval.json then has it per task (mean over seeds), as KEY_std (population std over seeds) and
# in per_seed. Non-finite values are written as null.
METRICS = dict(
    results=lambda scores: fmean(s["correct"] for s in scores),   # accuracy
    losses=lambda scores: fmean(s["answer_nll"] for s in scores),  # answer NLL, nats per token
    bpbs=lambda scores: fmean(s["answer_nats"] / (math.log(2) * s["answer_bytes"]) if s["answer_bytes"] else math.nan
                             for s in scores),                  # answer bits per byte (null where an answer has none)
    examples=len,                                               # examples scored
    clipped=lambda scores: sum(s["clipped"] for s in scores),    # scored on a cropped answer (see build_example)
)


def aggregate(scores, baselines, seeds, verified=False):
    """scores {label: {seed: {metric: value}}}, baselines {label: percent} -> the metric part of eval.json.
    verified: the tasks are the 22 CORE tasks of a bundle whose fingerprint was checked (only then CORE-22)."""
    labels = list(scores)
    bad = [label for label in labels if not all(math.isfinite(scores[label][s]["losses"]) for s in seeds)]
    if bad:
        raise UsageError(f"non-finite answer NLL for task(s) {', '.join(bad)}; the model produced NaN/inf logits")
    finite = lambda x: x if math.isfinite(x) else None
    centered = lambda acc, baseline: (acc - baseline / 100) / (1 - baseline / 100)  # 0 at chance, 1 all right
    scores = {label: {s: dict(v, centered_results=centered(v["results"], baselines[label])) for s, v in seeds_.items()}
              for label, seeds_ in scores.items()}
    out, per_seed = {}, {str(s): {} for s in seeds}
    for name in [*METRICS, "centered_results"]:
        values = {label: [scores[label][s][name] for s in seeds] for label in labels}
        out[name] = {label: finite(fmean(v)) for label, v in values.items()}
        out[f"{name}_std"] = {label: finite(float(np.std(v))) for label, v in values.items()}
        for i, s in enumerate(seeds):
            per_seed[str(s)][name] = {label: finite(v[i]) for label, v in values.items()}
    metric_per_seed = {str(s): fmean(per_seed[str(s)]["centered_results"].values()) for s in seeds}
    complete = verified and sorted(labels) == sorted(CORE_TASKS)
    bpbs = [v for v in out["bpbs"].values() if v is not None]
    return dict(
        out, per_seed=per_seed, seeds=list(seeds),
        core_metric=fmean(out["centered_results"].values()),
        core_metric_label="CORE-22" if complete else f"CORE-partial ({len(labels)} tasks, not comparable to CORE-22)",
        core_metric_std=float(np.std(list(metric_per_seed.values()))), core_metric_per_seed=metric_per_seed,
        core_metric_filtered=fmean(out["centered_results"][t] for t in FILTERED_TASKS) if complete else None,
        filtered_tasks=FILTERED_TASKS,
        core_loss=fmean(out["losses"].values()),
        core_loss_per_seed={str(s): fmean(per_seed[str(s)]["losses"].values()) for s in seeds},
        core_bpb=fmean(bpbs) if bpbs else None,
        complete_suite=complete, missing_tasks=[t for t in CORE_TASKS if t not in labels],
    )


# --- KL effective depth (paper Sec. 6): logit lens after every executed block
@torch.no_grad()
def kl_effective_depth(net, windows, threshold, device):
    """-> (first block after the KL peak with KL(final || lens) <= threshold, per-block KL averaged over tokens)."""
    sums = 0
    for window in windows:
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            logits, hidden = net(window[:-1].unsqueeze(0).to(device), return_hidden=True)
            final = F.log_softmax(logits.float(), dim=-1)
            # the logit lens: the final norm and unembedding applied after each executed block
            sums = sums + torch.stack([F.kl_div(F.log_softmax(net.decode(h).float(), dim=-1), final, log_target=True,
                                                reduction="sum").double() for h in hidden[1:]])
    curve = (sums / windows[:, :-1].numel()).tolist()
    return effective_depth(curve, threshold), curve


def effective_depth(curve, threshold):
    """1-based index of the first block after the KL peak whose KL is <= threshold (the last block if none)."""
    peak = max(range(len(curve)), key=curve.__getitem__)
    return next((b + 1 for b in range(peak + 1, len(curve)) if curve[b] <= threshold), len(curve))


# --- Model loading, CLI
def load_model(checkpoint, device, passes=None):
    """The weights of a train.py checkpoint (never optimizer state) on `device`, at `passes` (default: its own);
    attention on PyTorch's own SDPA choice (CORE's lengths are arbitrary: arms.ATTENTION_BACKENDS)."""
    net, record = load_checkpoint_model(checkpoint)
    net.to(device).eval().set_attention("default")
    try:
        net.set_passes(passes or net.active_passes)
    except (ValueError, AssertionError) as e:
        raise UsageError(f"--passes {passes} is not possible for this checkpoint ({e})") from None
    return net, record


def default_out(checkpoint, passes):
    """eval.json (eval_passesK.json) in the checkpoint's run folder: runs/NAME from runs/NAME[/checkpoints[/STEP]]."""
    path = re.sub(r"/checkpoints(/[^/]+)?$", "", os.path.abspath(checkpoint))
    return os.path.join(path, "eval.json" if passes is None else f"eval_passes{passes}.json")


def run(argv):
    args = build_parser().parse_args(argv)
    each_once("--seed", args.seed)  # a repeated seed would count twice in the mean over seeds
    if args.effective_depth and not args.data_dir:
        raise UsageError("--effective-depth needs --data-dir (a token pool with a val split)")
    out_path = args.out or default_out(args.checkpoint, args.passes)
    if not os.path.isdir(os.path.dirname(os.path.abspath(out_path))) or os.path.isdir(out_path):
        raise UsageError(f"--out {out_path}: not a file name in an existing folder")
    (rank, world_size, device), t0 = setup_distributed(), time.time()
    net, record = load_model(args.checkpoint, device, args.passes)
    enc = data.get_tokenizer(record.get("tokenizer", "gpt2"))
    bundle_dir = ensure_bundle(args.bundle_dir, args.bundle_url, rank, world_size)
    tasks, fingerprint = load_tasks(bundle_dir), bundle_fingerprint(bundle_dir)
    verified = sorted(t["label"] for t in tasks) == sorted(CORE_TASKS)  # labels are unique (load_tasks)
    if verified and fingerprint != EVAL["bundle_fingerprint"]:
        raise UsageError(f"bundle {bundle_dir} has content fingerprint {fingerprint}, not the paper's "
                         f"{EVAL['bundle_fingerprint']}; re-download it (delete the folder) or remove extra files")
    max_len = net.cfg.seq_len
    if args.effective_depth:  # the validation windows, loaded (and checked) before the CORE evaluation starts
        pool = data.load_pool(args.data_dir, "val")
        windows = data.val_windows(pool, max_len, args.lens_tokens)
        if pool.manifest.get("tokenizer") != record.get("tokenizer"):
            raise UsageError(f"--data-dir {args.data_dir} holds {pool.manifest.get('tokenizer')} tokens, the "
                             f"checkpoint reads {record.get('tokenizer')} tokens; pass a pool of its tokenizer")
    scores = evaluate_tasks(net, enc, tasks, args.seed, args.max_per_task, max_len, device, args.batch_size, rank,
                            world_size)
    out = aggregate(scores, {t["label"]: t["baseline"] for t in tasks}, args.seed, verified)
    out.update(checkpoint=os.path.abspath(args.checkpoint), step=record.get("step"), passes=net.active_passes,
               max_per_task=args.max_per_task, batch_size=args.batch_size,
               suite_fingerprint=fingerprint, bundle_dir=os.path.abspath(bundle_dir), shuffle_seed=EVAL["shuffle_seed"],
               num_examples=int(sum(out["examples"].values())), tokenizer=record.get("tokenizer"),
               model_config=record.get("model_config"), device=device.type, world_size=world_size)
    if args.effective_depth and rank == 0:  # 65k tokens by default: seconds, on one rank
        depth, curve = kl_effective_depth(net, windows, args.kl_threshold, device)
        out.update(kl_effective_depth=depth, kl_per_block=curve, kl_threshold=args.kl_threshold,
                   lens_tokens=len(windows) * max_len, data_dir=os.path.abspath(args.data_dir))
    out["elapsed_seconds"] = time.time() - t0
    if rank != 0:
        return
    write_json(out_path, out, allow_nan=False)
    if args.json:
        return print(json.dumps(out, indent=2))
    filtered = out["core_metric_filtered"]
    print(f"{out['core_metric_label']}: core_metric {out['core_metric']:.4f} ± {out['core_metric_std']:.4f}  core_loss "
          f"{out['core_loss']:.4f}  core_metric_filtered {'n/a' if filtered is None else f'{filtered:.4f}'}  "
          f"({out['num_examples']} examples, {out['elapsed_seconds']:.1f}s)")
    if not out["complete_suite"]:
        print(f"partial suite: missing {', '.join(out['missing_tasks'])}")
    if "kl_effective_depth" in out:
        print(f"kl_effective_depth {out['kl_effective_depth']}  kl_per_block "
              + " ".join(f"{v:.2f}" for v in out["kl_per_block"]))
    print(f"wrote {out_path}")


def main(argv=None):
    return cli_main(run, "core_eval.py", argv)


if __name__ == "__main__":
    exit_process(main())
