"""Tests for core_eval.py (scoring and its bundle on disk): tiny bundles written here (all three task types, both
delimiters), a tiny random model standing in for a train.py checkpoint (train.py tests its checkpoints)."""

import copy, functools, hashlib, http.server, json, os, random, subprocess, sys, threading, zipfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

import core_eval, data, model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENC = data.get_tokenizer("bytes")
BOS = ENC.eot_token
CPU = torch.device("cpu")


def encode(text):
    return [BOS] + ENC.encode_ordinary(text)


# --- Fixtures: tiny bundles and a tiny random checkpoint

def mc_items(n, rng):
    ab = [(rng.randrange(10), rng.randrange(10)) for _ in range(n)]
    return [dict(query=f"Question: {a}+{b}?", choices=[str(a + b), str(a + b + 1), str(a * b + 2), "none"], gold=i % 4)
            for i, (a, b) in enumerate(ab)]


def schema_items(n, rng):
    names = ["Ann", "Bob", "Cy", "Dee"]
    return [dict(context_options=[f"{names[i % 4]} helped {names[(i + 1) % 4]}, so {names[i % 4]}",
                                  f"{names[i % 4]} helped {names[(i + 1) % 4]}, so {names[(i + 1) % 4]}"],
                 continuation=rng.choice(["was thanked.", "said thanks."]), gold=i % 2) for i in range(n)]


def lm_items(n, rng):
    return [dict(context=f" Count: {i} {i + 1} {i + 2}", continuation=f"{i + 3} {i + 4}") for i in range(n)]


TINY_TASKS = [  # label, type, shots, delimiter, baseline %, item maker, n items
    ("mc_fewshot", "multiple_choice", 2, "\nAnswer: ", 25, mc_items, 9),
    ("schema_zeroshot", "schema", 0, " ", 50, schema_items, 6),
    ("lm_fewshot", "language_modeling", 3, " ", 0, lm_items, 8),
    ("mc_zeroshot", "multiple_choice", 0, " ", 25, mc_items, 5),
]


def write_bundle(root, tasks=TINY_TASKS):
    rng = random.Random(0)
    os.makedirs(os.path.join(root, "eval_data", "tiny"), exist_ok=True)
    icl, meta = [], ["Eval Task,Task Category,Task Type,#shots,Random baseline"]
    for label, task_type, shots, delim, baseline, maker, n in tasks:
        with open(os.path.join(root, "eval_data", "tiny", f"{label}.jsonl"), "w") as f:
            f.writelines(json.dumps(item) + "\n" for item in maker(n, rng))
        spec = dict(label=label, dataset_uri=f"tiny/{label}.jsonl", num_fewshot=[shots], icl_task_type=task_type)
        if delim != " ":  # absent -> the default " "
            spec["continuation_delimiter"] = delim
        icl.append(spec)
        meta.append(f"{label},tiny,{task_type},{shots},{baseline}")
    with open(os.path.join(root, "core.yaml"), "w") as f:
        yaml.safe_dump(dict(icl_tasks=icl), f)
    with open(os.path.join(root, "eval_meta_data.csv"), "w") as f:
        f.write("\n".join(meta) + "\n")
    return str(root)


def tiny_model(arch="vanilla", depth=2, seq_len=128, seed=0):
    torch.manual_seed(seed)
    cfg = model.config_for(arch, depth, width_per_depth=32, head_dim=16, seq_len=seq_len, vocab_size=257)
    net = model.GPT(cfg)
    with torch.no_grad():  # the init zeroes out-projections and lm_head: make predictions differ
        for name, p in net.named_parameters():
            if "lm_head" in name or "c_proj" in name:
                p.normal_(0.0, 0.3 if "lm_head" in name else 0.05)
    return net.eval()


def fake_checkpoints(monkeypatch, nets):
    """core_eval's load_checkpoint_model on {path: net}: a copy of the net and the record train.py writes."""
    def load(path):
        if str(path) not in nets:
            raise ValueError(f"{path} holds no checkpoint")
        net = copy.deepcopy(nets[str(path)])
        return net, dict(tokenizer="bytes", step=7, model_config=dict(seq_len=net.cfg.seq_len))
    monkeypatch.setattr(core_eval, "load_checkpoint_model", load)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    run = root / "run"
    (run / "checkpoints" / "000010").mkdir(parents=True)
    return dict(bundle=write_bundle(root / "bundle"), net=tiny_model(), run=str(run), root=root)


@pytest.fixture
def ckpt(tiny, monkeypatch):
    fake_checkpoints(monkeypatch, {tiny["run"]: tiny["net"]})
    return tiny["run"]


# --- Rendering, sampling, regions

def test_prompt_strings_zero_and_few_shot():
    ex = [dict(query="Q: 1+1?", choices=["2", "3"], gold=0), dict(query="Q: 2+1?", choices=["4", "3"], gold=1)]
    item = dict(query="Q: 2+2?", choices=["4", "5"], gold=0)
    prompts, answer = core_eval.render("multiple_choice", item, ex, "\nAnswer: ")
    assert prompts == ["Q: 1+1?\nAnswer: 2\n\nQ: 2+1?\nAnswer: 3\n\nQ: 2+2?\nAnswer: 4",
                       "Q: 1+1?\nAnswer: 2\n\nQ: 2+1?\nAnswer: 3\n\nQ: 2+2?\nAnswer: 5"] and answer == "4"
    # whole MC prompt stripped, inner whitespace kept (language_identification style query ending in "Answer: ")
    item = dict(query="  Which?\nAnswer: ", choices=["A ", "B"], gold=1)
    prompts, _ = core_eval.render("multiple_choice", item, [], " ")
    assert prompts == ["Which?\nAnswer:  A", "Which?\nAnswer:  B"]

    sex = [dict(context_options=["Ann ran", "Bob ran"], continuation="fast.", gold=1)]
    sitem = dict(context_options=["The cat", "A bat"], continuation="sat down.", gold=0)
    assert core_eval.render("schema", sitem, [], " ") == (["The cat sat down.", "A bat sat down."], "sat down.")
    assert core_eval.render("schema", sitem, sex, " ")[0] == ["Bob ran fast.\n\nThe cat sat down.",
                                                              "Bob ran fast.\n\nA bat sat down."]

    lex = [dict(context=" Paris is in ", continuation="France"), dict(context="Rome is in", continuation="Italy")]
    litem = dict(context="Bern is in ", continuation="Switzerland")
    assert core_eval.render("language_modeling", litem, [], " ") == (["Bern is in", "Bern is in Switzerland"], None)
    assert core_eval.render("language_modeling", litem, lex, "\nAnswer: ")[0] == [
        "Paris is in\nAnswer: France\n\nRome is in\nAnswer: Italy\n\nBern is in\nAnswer:",
        "Paris is in\nAnswer: France\n\nRome is in\nAnswer: Italy\n\nBern is in\nAnswer: Switzerland"]


def test_fewshot_sampling_reproducible_and_excludes_item():
    n, shots = 12, 5
    for seed, idx in ((s, i) for s in (0, 1, 2) for i in range(n)):
        draw = core_eval.fewshot_indices(n, idx, shots, seed)
        assert draw == core_eval.fewshot_indices(n, idx, shots, seed) and idx not in draw and len(set(draw)) == shots
    # CPython's Random(seed + idx).sample over the pool without idx, in draw order
    assert core_eval.fewshot_indices(6, 2, 3, 1) == random.Random(3).sample([0, 1, 3, 4, 5], 3)
    assert core_eval.fewshot_indices(4, 0, 10, 0) == random.Random(0).sample([1, 2, 3], 3)  # min(k, n - 1)
    assert any(core_eval.fewshot_indices(n, i, shots, 0) != core_eval.fewshot_indices(n, i, shots, 1) for i in range(n))
    state = random.getstate()
    assert core_eval.fewshot_indices(n, 3, 0, 0) == [] and random.getstate() == state


def test_shuffle_and_subsample():
    items, expected = list(range(50)), list(range(50))
    random.Random(1337).shuffle(expected)
    assert core_eval.shuffled_items(items, None) == expected and items == list(range(50))
    assert core_eval.shuffled_items(items, 7) == expected[:7]


def test_kshot_tokens_match_rendered_prompt(tiny):
    task = next(t for t in core_eval.load_tasks(tiny["bundle"]) if t["label"] == "mc_fewshot")
    assert task["delimiter"] == "\nAnswer: " and task["shots"] == 2 and task["baseline"] == 25
    items = core_eval.shuffled_items(task["items"], None)
    built = core_eval.task_examples(task, items, 1, [4], encode, 10_000)[0]
    shots = [items[j] for j in core_eval.fewshot_indices(len(items), 4, 2, 1)]
    expected = "\n\n".join([s["query"] + "\nAnswer: " + s["choices"][s["gold"]] for s in shots]
                           + [items[4]["query"] + "\nAnswer: " + items[4]["choices"][2]])
    assert ENC.decode(built["rows"][2][1:]) == expected and built["rows"][2][0] == BOS


def test_scoring_regions_and_answer_region_with_shared_prefix():
    item = dict(query="Capital?", choices=["Paris", "Parma", "Rome"], gold=1)
    prompts, answer = core_eval.render("multiple_choice", item, [], " ")
    ex = core_eval.build_example("multiple_choice", item, prompts, answer, encode, 1000)
    assert [tuple(r) for r in ex["regions"]] == [(10, 15), (10, 15), (10, 14)]  # BOS + "Capital? " shared by all
    item["choices"] = ["Paris", "Parma"]
    prompts, answer = core_eval.render("multiple_choice", item, [], " ")
    ex = core_eval.build_example("multiple_choice", item, prompts, answer, encode, 1000)
    assert ex["regions"] == [(13, 15), (13, 15)]          # accuracy: after the common prefix "Capital? Par"
    assert ex["gold_row"] == 1 and ex["gold_region"] == (10, 15)  # answer NLL: the full gold answer "Parma"

    item = dict(context_options=["The cat", "A bat"], continuation="sat down.", gold=0)
    prompts, answer = core_eval.render("schema", item, [], " ")
    ex = core_eval.build_example("schema", item, prompts, answer, encode, 1000)
    assert ex["regions"] == [(6, 18), (4, 16)]             # common suffix "at sat down." (12 bytes)
    assert ex["gold_region"] == (9, 18)                    # BOS + "The cat " | "sat down."

    item = dict(context="Bern is in", continuation="Switzerland")
    prompts, answer = core_eval.render("language_modeling", item, [], " ")
    ex = core_eval.build_example("language_modeling", item, prompts, answer, encode, 1000)
    assert ex["rows"] == [encode("Bern is in Switzerland")] and ex["regions"] == [(11, 23)]
    assert ex["gold_region"] == (11, 23)


def test_left_crop():
    item = dict(context="x" * 40, continuation="abc")
    prompts, answer = core_eval.render("language_modeling", item, [], " ")
    full = core_eval.build_example("language_modeling", item, prompts, answer, encode, 1000)
    cropped = core_eval.build_example("language_modeling", item, prompts, answer, encode, 16)
    crop = len(full["rows"][0]) - 16
    assert cropped["rows"][0] == full["rows"][0][crop:] and cropped["rows"][0][0] != BOS
    assert cropped["regions"][0] == (full["regions"][0][0] - crop, full["regions"][0][1] - crop) == (12, 16)
    assert not cropped["clipped"]
    # continuation longer than the context: scored on what fits and counted (the official evaluator asserts)
    tight = core_eval.build_example("language_modeling", item, prompts, answer, encode, 3)
    assert tight["regions"][0] == (1, 3) and tight["clipped"]


class NextByte(torch.nn.Module):
    """Fake model: always predicts next token = current token + 1 (its residual stream already holds the logits)."""
    def residual_stream(self, idx):
        return 20.0 * F.one_hot((idx + 1) % 257, 257).float()

    def decode(self, h):
        return h


def test_lm_all_token_rule_and_mc_ties():
    byte_lengths = torch.as_tensor(data.token_byte_lengths(ENC))
    right = dict(rows=[[BOS, 97, 98, 99, 100]], regions=[(2, 5)], gold_row=0, gold_region=(2, 5), label=0,
                 clipped=False)
    one_wrong = dict(right, rows=[[BOS, 97, 98, 99, 101]])
    context_wrong = dict(right, rows=[[BOS, 50, 97, 98, 99]], regions=[(3, 5)])  # miss before the region: ignored
    tie = dict(rows=[[BOS, 97, 200], [BOS, 97, 201]], regions=[(2, 3), (2, 3)], gold_row=1, gold_region=(2, 3),
               label=1, clipped=False)
    scores = core_eval.score_examples(NextByte(), [right, one_wrong, context_wrong, tie], BOS, byte_lengths, CPU)
    assert [s["correct"] for s in scores] == [1.0, 0.0, 1.0, 0.0]  # equal losses -> first index wins, gold is 1
    assert scores[0]["answer_nll"] == pytest.approx(0.0, abs=1e-6)
    assert scores[1]["answer_nll"] == pytest.approx(20.0 / 3, rel=1e-5)
    assert scores[0]["answer_bytes"] == 3.0  # bytes of the 3 gold tokens


def test_answer_nll_equals_manual_cross_entropy(tiny):
    net = tiny["net"]
    item = dict(query="Capital?", choices=["Paris", "Parma"], gold=1)
    prompts, answer = core_eval.render("multiple_choice", item, [], " ")
    ex = core_eval.build_example("multiple_choice", item, prompts, answer, encode, 128)
    byte_lengths = torch.as_tensor(data.token_byte_lengths(ENC))
    score = core_eval.score_examples(net, [ex], BOS, byte_lengths, CPU)[0]
    correct, nll, nats, nbytes = (score[k] for k in ("correct", "answer_nll", "answer_nats", "answer_bytes"))
    row = torch.tensor([ex["rows"][1]])
    with torch.no_grad():
        logp = F.log_softmax(net(row)[0].double(), -1)
    expected = [-logp[t - 1, row[0, t]].item() for t in range(10, 15)]  # "Parma", incl. the shared "Par"
    assert nll == pytest.approx(sum(expected) / 5, rel=1e-5) and nats == pytest.approx(sum(expected), rel=1e-5)
    assert nbytes == 5
    candidate_losses = []
    for r in ex["rows"]:  # accuracy: mean loss over the tokens after the common prefix "Capital? Par"
        with torch.no_grad():
            lp = F.log_softmax(net(torch.tensor([r]))[0].double(), -1)
        candidate_losses.append(np.mean([-lp[t - 1, r[t]].item() for t in range(13, 15)]))
    assert correct == float(np.argmin(candidate_losses) == 1)


# --- Evaluation loop

def test_batched_equals_one_row_per_forward_and_zero_shot_reuse(tiny, monkeypatch):
    tasks = core_eval.load_tasks(tiny["bundle"])
    calls = []
    real = core_eval.task_examples
    def recording(task, items, seed, *args):
        calls.append((task["label"], seed))
        return real(task, items, seed, *args)
    monkeypatch.setattr(core_eval, "task_examples", recording)
    ref = core_eval.evaluate_tasks(tiny["net"], ENC, tasks, [0, 1, 2], None, 128, CPU, rows_per_forward=1)
    assert calls.count(("schema_zeroshot", 0)) == 1 and ("schema_zeroshot", 1) not in calls
    assert [c for c in calls if c[0] == "lm_fewshot"] == [("lm_fewshot", s) for s in (0, 1, 2)]
    for label in ("schema_zeroshot", "mc_zeroshot"):
        assert ref[label][0] == ref[label][1] == ref[label][2]
    assert {label: ref[label][2]["examples"] for label in ref} == {"mc_fewshot": 9, "schema_zeroshot": 6,
                                                                  "lm_fewshot": 8, "mc_zeroshot": 5}
    monkeypatch.setitem(core_eval.EVAL, "examples_per_chunk", 4)  # several chunks per task
    fast = core_eval.evaluate_tasks(tiny["net"], ENC, tasks, [0, 1, 2], None, 128, CPU, rows_per_forward=5)
    for label in ref:
        for seed in (0, 1, 2):
            assert fast[label][seed]["results"] == ref[label][seed]["results"]  # accuracy: identical
            assert fast[label][seed]["losses"] == pytest.approx(ref[label][seed]["losses"], rel=1e-5)
    accs = [ref[label][s]["results"] for label in ref for s in (0, 1, 2)]
    assert len(set(accs)) > 1  # the random model does not predict everything equally


def scores_of(results, losses, bpbs):
    return dict(results=results, losses=losses, bpbs=bpbs, examples=10, clipped=0)


def test_aggregation_arithmetic():
    raw = {"a": {0: scores_of(0.5, 2.0, 1.0), 1: scores_of(0.7, 3.0, 2.0)},
           "b": {0: scores_of(0.1, 1.0, float("nan")), 1: scores_of(0.3, 1.0, 1.0)}}
    out = core_eval.aggregate(raw, {"a": 25, "b": 0}, [0, 1])
    assert out["results"] == pytest.approx({"a": 0.6, "b": 0.2})
    assert out["centered_results"] == pytest.approx({"a": 0.35 / 0.75, "b": 0.2})
    assert out["core_metric"] == pytest.approx((0.35 / 0.75 + 0.2) / 2)
    assert out["core_metric_per_seed"] == pytest.approx({"0": (1 / 3 + 0.1) / 2, "1": (0.6 + 0.3) / 2})
    assert out["core_metric_std"] == pytest.approx(abs(0.45 - (1 / 3 + 0.1) / 2) / 2)  # population std
    assert out["core_loss"] == pytest.approx(1.75) and out["core_loss_per_seed"] == pytest.approx({"0": 1.5, "1": 2.0})
    assert out["results_std"] == pytest.approx({"a": 0.1, "b": 0.1}) and out["losses_std"]["b"] == 0.0
    assert out["bpbs"] == {"a": 1.5, "b": None} and out["core_bpb"] == 1.5 and out["per_seed"]["0"]["bpbs"]["b"] is None
    assert not out["complete_suite"] and out["core_metric_filtered"] is None and len(out["missing_tasks"]) == 22
    assert out["core_metric_label"] != "CORE-22"
    json.dumps(out, allow_nan=False)

    raw22 = {t: {0: scores_of(0.2 + 0.01 * i, 3.0 - 0.1 * i, 1.0)} for i, t in enumerate(core_eval.CORE_TASKS)}
    base = {t: 25.0 for t in core_eval.CORE_TASKS}
    assert not core_eval.aggregate(raw22, base, [0])["complete_suite"]  # the fingerprint was not checked
    out = core_eval.aggregate(raw22, base, [0], verified=True)
    assert out["complete_suite"] and out["missing_tasks"] == [] and out["core_metric_label"] == "CORE-22"
    assert len(core_eval.FILTERED_TASKS) == 17 and "boolq" not in core_eval.FILTERED_TASKS
    kept = [i for i, t in enumerate(core_eval.CORE_TASKS) if t in core_eval.FILTERED_TASKS]
    assert out["core_metric_filtered"] == pytest.approx(np.mean([(0.2 + 0.01 * i - 0.25) / 0.75 for i in kept]))
    assert out["core_metric_std"] == 0.0
    raw22["copa"][0] = scores_of(0.5, float("inf"), 1.0)
    with pytest.raises(core_eval.UsageError, match="copa"):
        core_eval.aggregate(raw22, base, [0], verified=True)


def test_effective_depth_rule_and_logit_lens():
    assert core_eval.effective_depth([1.0, 5.0, 3.0, 1.5, 0.2, 0.0], 2.0) == 4  # first <= 2 after the peak (block 2)
    assert core_eval.effective_depth([0.5, 4.0, 0.1, 0.0], 2.0) == 3            # blocks before the peak don't count
    assert core_eval.effective_depth([9.0, 3.0, 2.5, 0.0], 2.0) == 4
    net = tiny_model(depth=3)
    with torch.no_grad():  # blocks that write strongly, so the lens differs from the final output
        for name, p in net.named_parameters():
            if "c_proj" in name:
                p.mul_(20)
    windows = torch.randint(0, 256, (3, 33))
    depth, curve = core_eval.kl_effective_depth(net, windows, 2.0, CPU)
    assert len(curve) == 3 and curve[-1] == pytest.approx(0.0, abs=1e-5) and min(curve[:2]) > 1e-3
    assert depth == core_eval.effective_depth(curve, 2.0)


# --- METRICS

def test_a_new_metric_is_one_entry_of_METRICS(tiny, monkeypatch):
    """A metric added to METRICS reaches eval.json's tables (per task, per seed, std) with no other edit."""
    monkeypatch.setitem(core_eval.METRICS, "answer_nats", lambda scores: sum(s["answer_nats"] for s in scores))
    tasks = core_eval.load_tasks(tiny["bundle"])[:2]
    scores = core_eval.evaluate_tasks(tiny["net"], ENC, tasks, [0, 1], 4, 128, CPU)
    out = core_eval.aggregate(scores, {t["label"]: t["baseline"] for t in tasks}, [0, 1])
    assert set(out["answer_nats"]) == {"mc_fewshot", "schema_zeroshot"} and out["answer_nats"]["mc_fewshot"] > 0
    assert out["answer_nats_std"]["schema_zeroshot"] == 0.0  # zero-shot: the same under every seed
    assert out["per_seed"]["1"]["answer_nats"]["mc_fewshot"] == scores["mc_fewshot"][1]["answer_nats"]


# --- Bundle: fingerprint, download (a local HTTP server), one-line errors

def test_fingerprint(tmp_path):
    files = {"zz.txt": b"top", "core.yaml": b"icl_tasks: []\n", "eval_data/b/x.jsonl": b"{}\n",
             "eval_data/a.jsonl": b"1"}
    for rel, content in files.items():
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        (tmp_path / rel).write_bytes(content)
    outer = hashlib.sha256()
    for rel in ("core.yaml", "zz.txt", "eval_data/a.jsonl", "eval_data/b/x.jsonl"):  # root files first, then sub-dirs
        outer.update(rel.encode() + hashlib.sha256(files[rel]).hexdigest().encode())
    assert core_eval.bundle_fingerprint(tmp_path) == outer.hexdigest()
    (tmp_path / ".DS_Store").write_bytes(b"")
    assert core_eval.bundle_fingerprint(tmp_path) != outer.hexdigest()


@pytest.fixture
def http_dir(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_download_installs_only_the_papers_bundle(tmp_path, http_dir, tiny, monkeypatch):
    served, url = http_dir
    for zip_name, extra in (("clean.zip", None), ("bundle.zip", "eval_bundle/../../evil.txt")):
        with zipfile.ZipFile(served / zip_name, "w") as zf:
            for dirpath, _, names in os.walk(tiny["bundle"]):
                for name in names:
                    zf.write(os.path.join(dirpath, name), "eval_bundle/" + os.path.relpath(os.path.join(dirpath, name),
                                                                                           tiny["bundle"]))
            if extra:
                zf.writestr(extra, "zipfile keeps members inside the target")
    target = tmp_path / "cache" / "eval_bundle"
    with pytest.raises(core_eval.UsageError, match="fingerprint differs"):  # not the paper's content: not installed
        core_eval.ensure_bundle(str(target), f"{url}/bundle.zip")
    assert os.listdir(tmp_path / "cache") == [] and not os.path.exists(tmp_path / "evil.txt")
    expected = core_eval.bundle_fingerprint(tiny["bundle"])
    monkeypatch.setitem(core_eval.EVAL, "bundle_fingerprint", expected)  # this zip's content is "the paper's"
    core_eval.ensure_bundle(str(target), f"{url}/clean.zip")
    assert core_eval.bundle_fingerprint(target) == expected and os.listdir(tmp_path / "cache") == ["eval_bundle"]
    assert [t["label"] for t in core_eval.load_tasks(str(target))] == [t[0] for t in TINY_TASKS]
    with pytest.raises(core_eval.UsageError, match="could not download"):
        core_eval.ensure_bundle(str(tmp_path / "missing" / "eval_bundle"), f"{url}/nothing.zip")


# --- CLI: end to end, errors, --out, passes, effective depth

def test_passes_for_tied_models(monkeypatch):
    fake_checkpoints(monkeypatch, {"loop": tiny_model("loop_2", 3), "vanilla": tiny_model()})
    assert core_eval.load_model("loop", CPU)[0].active_passes == 2
    assert core_eval.load_model("loop", CPU, passes=4)[0].active_passes == 4
    with pytest.raises(core_eval.UsageError, match="--passes 2"):
        core_eval.load_model("vanilla", CPU, passes=2)


def test_out_defaults_to_the_run_folder(tmp_path, tiny, ckpt):
    run = tiny["run"]
    for given in (run, f"{run}/checkpoints", f"{run}/checkpoints/000010"):
        assert core_eval.default_out(given, None) == os.path.join(run, "eval.json")
    assert core_eval.default_out(run, 3) == os.path.join(run, "eval_passes3.json")
    out = tmp_path / "e.json"
    out.write_text("{}")  # an output file: replaced
    assert core_eval.main(["--checkpoint", ckpt, "--bundle-dir", tiny["bundle"], "--seed", "1", "--max-per-task", "3",
                           "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    assert first["seeds"] == [1] and first["checkpoint"] == os.path.abspath(ckpt) and first["step"] == 7


TORCHRUN_MAIN = """import sys, torch
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
import core_eval, test_core_eval
torch.manual_seed(0)
net = test_core_eval.tiny_model()
core_eval.load_checkpoint_model = lambda path: (net, dict(tokenizer="bytes", step=7))
sys.exit(core_eval.main(sys.argv[1:]))
"""


def test_cli_one_process_equals_two_process_torchrun(tmp_path, tiny, ckpt, monkeypatch, capsys, free_port):
    args = ["--checkpoint", ckpt, "--bundle-dir", tiny["bundle"], "--seed", "0", "1", "--batch-size", "4"]
    tokens = np.asarray(torch.randint(0, 256, (4 * 129,)), dtype=np.uint16)
    pool = data.Pool(tokens, np.array([0]), {"tokenizer": "gpt2"}, "val")
    monkeypatch.setattr(core_eval.data, "load_pool", lambda data_dir, split: pool)
    assert core_eval.main(args + ["--effective-depth", "--data-dir", "gpt2_pool", "--lens-tokens", "256"]) == 2
    assert "--data-dir gpt2_pool holds gpt2 tokens, the checkpoint reads bytes tokens" in capsys.readouterr().err
    pool.manifest["tokenizer"] = "bytes"
    assert core_eval.main(args + ["--out", str(tmp_path / "one.json"), "--effective-depth", "--data-dir", "unused",
                           "--lens-tokens", "256"]) == 0
    stdout = capsys.readouterr().out
    assert "CORE-partial" in stdout and "kl_effective_depth" in stdout
    one = json.loads((tmp_path / "one.json").read_text())
    assert {"core_metric", "core_loss", "core_metric_std", "results", "centered_results", "losses", "bpbs", "clipped",
            "examples", "per_seed", "core_metric_per_seed", "elapsed_seconds", "kl_per_block"} <= set(one)
    assert one["seeds"] == [0, 1] and one["passes"] == 1 and not one["complete_suite"]
    assert one["missing_tasks"] == core_eval.CORE_TASKS and one["core_metric_filtered"] is None
    assert one["suite_fingerprint"] == core_eval.bundle_fingerprint(tiny["bundle"])
    assert len(one["kl_per_block"]) == 2 and one["lens_tokens"] == 256
    assert core_eval.main(args + ["--out", str(tmp_path / "j.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == one["results"]

    (tmp_path / "main.py").write_text(TORCHRUN_MAIN.format(repo=REPO, tests=os.path.join(REPO, "tests")))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port), str(tmp_path / "main.py"), *args, "--out", str(tmp_path / "two.json")]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["world_size"] == 2 and two["examples"] == one["examples"]
    assert two["results"] == one["results"] and two["per_seed"]["1"]["results"] == one["per_seed"]["1"]["results"]
    assert two["core_metric"] == pytest.approx(one["core_metric"], abs=1e-12)
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)


@pytest.mark.skipif(not os.path.isdir(os.environ.get("CORE_BUNDLE_DIR", "")), reason="CORE_BUNDLE_DIR: a real bundle")
def test_real_bundle_every_task(tmp_path, monkeypatch):
    bundle = os.environ["CORE_BUNDLE_DIR"]
    fake_checkpoints(monkeypatch, {str(tmp_path): tiny_model(seq_len=256)})
    assert core_eval.main(["--checkpoint", str(tmp_path), "--bundle-dir", bundle, "--max-per-task", "20", "--seed", "0",
                           "--out", str(tmp_path / "eval.json")]) == 0
    out = json.loads((tmp_path / "eval.json").read_text())
    labels = [t["label"] for t in core_eval.load_tasks(bundle)]
    assert list(out["results"]) == labels and all(out["examples"][t] == 20 for t in labels)
    assert out["complete_suite"] == (sorted(labels) == sorted(core_eval.CORE_TASKS))
    assert out["missing_tasks"] == [t for t in core_eval.CORE_TASKS if t not in labels]
    assert all(np.isfinite(out["losses"][t]) and 0 <= out["results"][t] <= 1 for t in labels)
    if not out["complete_suite"]:
        assert out["core_metric_filtered"] is None and out["core_metric_label"] != "CORE-22"
