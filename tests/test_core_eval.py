"""Tests for core_eval.py (scoring and its bundle on disk): tiny bundles written here (all three task types, both
delimiters), a tiny random model."""

import dataclasses
import functools
import hashlib
import http.server
import json
import os
import shutil
import random
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

import core_eval
import data
import model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENC = data.get_tokenizer("bytes")
BOS = ENC.eot_token
CPU = torch.device("cpu")


def encode(text):
    return [BOS] + ENC.encode_ordinary(text)


# ---------------------------------------------------------------------------------------------------------------------
# Fixtures: tiny bundles and a tiny random checkpoint

def mc_items(n, rng):
    items = []
    for i in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        choices = [str(a + b), str(a + b + 1), str(a * b + 2), "none"]
        items.append(dict(query=f"Question: {a}+{b}?", choices=choices, gold=i % 4))
    return items


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


def write_bundle(root, tasks=TINY_TASKS, task_type_override=None):
    rng = random.Random(0)
    os.makedirs(os.path.join(root, "eval_data", "tiny"), exist_ok=True)
    icl, meta = [], ["Eval Task,Task Category,Task Type,#shots,Random baseline"]
    for label, task_type, shots, delim, baseline, maker, n in tasks:
        with open(os.path.join(root, "eval_data", "tiny", f"{label}.jsonl"), "w") as f:
            f.writelines(json.dumps(item) + "\n" for item in maker(n, rng))
        spec = dict(label=label, dataset_uri=f"tiny/{label}.jsonl", num_fewshot=[shots],
                    icl_task_type=task_type_override or task_type)
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


def save_checkpoint(path, net):
    torch.save(dict(model_config=dataclasses.asdict(net.cfg), model=net.state_dict(),
                    passes=net.active_passes, tokenizer="bytes", step=0), path)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    bundle = write_bundle(root / "bundle")
    net = tiny_model()
    return dict(bundle=bundle, net=net, ckpt=save_checkpoint(root / "final.pt", net), root=root)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny matmuls: on a shared 2-core machine a second intra-op thread makes them ~30x slower, not faster
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_main(argv, capsys):
    code = core_eval.main(argv)
    return code, capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------------
# Rendering, sampling, regions

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
    for seed in (0, 1, 2):
        for idx in range(n):
            draw = core_eval.fewshot_indices(n, idx, shots, seed)
            assert draw == core_eval.fewshot_indices(n, idx, shots, seed)
            assert idx not in draw and len(set(draw)) == shots
    # CPython's Random(seed + idx).sample over the pool without idx, in draw order
    assert core_eval.fewshot_indices(6, 2, 3, 1) == random.Random(3).sample([0, 1, 3, 4, 5], 3)
    assert core_eval.fewshot_indices(4, 0, 10, 0) == random.Random(0).sample([1, 2, 3], 3)  # min(k, n - 1)
    assert any(core_eval.fewshot_indices(n, i, shots, 0) != core_eval.fewshot_indices(n, i, shots, 1) for i in range(n))
    state = random.getstate()
    assert core_eval.fewshot_indices(n, 3, 0, 0) == [] and random.getstate() == state


def test_shuffle_and_subsample():
    items = list(range(50))
    expected = list(range(50))
    random.Random(1337).shuffle(expected)
    assert core_eval.shuffled_items(items, None) == expected and items == list(range(50))
    assert core_eval.shuffled_items(items, 7) == expected[:7]


def test_kshot_tokens_match_rendered_prompt(tiny):
    task = next(t for t in core_eval.load_tasks(tiny["bundle"]) if t["label"] == "mc_fewshot")
    assert task["delimiter"] == "\nAnswer: " and task["shots"] == 2 and task["baseline"] == 25
    items = core_eval.shuffled_items(task["items"], None)
    encode_batch = lambda texts: [encode(t) for t in texts]
    built = core_eval.task_examples(task, items, 1, [4], encode_batch, 10_000)[0]
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
    def residual_stream(self, idx, positions=None, attn_mask=None):
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
    assert [s[0] for s in scores] == [1.0, 0.0, 1.0, 0.0]  # equal losses -> first index wins, gold is 1
    assert scores[0][1] == pytest.approx(0.0, abs=1e-6) and scores[1][1] == pytest.approx(20.0 / 3, rel=1e-5)
    assert scores[0][3] == 3.0  # bytes of the 3 gold tokens


def test_answer_nll_equals_manual_cross_entropy(tiny):
    net = tiny["net"]
    item = dict(query="Capital?", choices=["Paris", "Parma"], gold=1)
    prompts, answer = core_eval.render("multiple_choice", item, [], " ")
    ex = core_eval.build_example("multiple_choice", item, prompts, answer, encode, 128)
    byte_lengths = torch.as_tensor(data.token_byte_lengths(ENC))
    correct, nll, nats, nbytes, _ = core_eval.score_examples(net, [ex], BOS, byte_lengths, CPU)[0]
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


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation loop

def test_batched_and_shared_equal_one_at_a_time_and_zero_shot_reuse(tiny, monkeypatch):
    tasks = core_eval.load_tasks(tiny["bundle"])
    calls = []
    real = core_eval.task_examples
    def recording(task, items, seed, *args):
        calls.append((task["label"], seed))
        return real(task, items, seed, *args)
    monkeypatch.setattr(core_eval, "task_examples", recording)
    ref, counts, _ = core_eval.evaluate_tasks(tiny["net"], ENC, tasks, [0, 1, 2], None, 128, CPU,
                                              scoring="one_at_a_time", show_progress=False)
    assert calls.count(("schema_zeroshot", 0)) == 1 and ("schema_zeroshot", 1) not in calls
    assert [c for c in calls if c[0] == "lm_fewshot"] == [("lm_fewshot", s) for s in (0, 1, 2)]
    for label in ("schema_zeroshot", "mc_zeroshot"):
        assert ref[label][0] == ref[label][1] == ref[label][2]
    assert counts == {"mc_fewshot": 9, "schema_zeroshot": 6, "lm_fewshot": 8, "mc_zeroshot": 5}
    monkeypatch.setitem(core_eval.EVAL, "examples_per_chunk", 4)  # several chunks per task
    for scoring in ("batched", "shared"):
        fast, _, _ = core_eval.evaluate_tasks(tiny["net"], ENC, tasks, [0, 1, 2], None, 128, CPU, rows_per_forward=5,
                                              scoring=scoring, show_progress=False)
        for label in ref:
            for seed in (0, 1, 2):
                assert fast[label][seed][0] == ref[label][seed][0]  # accuracy: identical
                assert fast[label][seed][1:] == pytest.approx(ref[label][seed][1:], rel=1e-5)
    accs = [ref[label][s][0] for label in ref for s in (0, 1, 2)]
    assert len(set(accs)) > 1  # the random model does not predict everything equally


def test_common_prefix_len_matches_os_path_commonprefix():
    rng = random.Random(0)
    for _ in range(3000):
        base = [rng.randrange(3) for _ in range(rng.randrange(12))]
        seqs = [base[:rng.randrange(len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(4))]
                for _ in range(rng.randrange(1, 5))]
        assert core_eval.common_prefix_len(seqs) == len(os.path.commonprefix(seqs))


def test_prefix_tree_layout():
    mc = dict(rows=[[BOS, 1, 2, 3, 4], [BOS, 1, 2, 5]])
    lm = dict(rows=[[BOS, 7, 8]])
    unshared = dict(rows=[[BOS, 1], [BOS, 2]])  # only BOS in common: stays two plain rows
    tree, plain, row_a, row_b = core_eval.forward_units([mc, lm, unshared], share_prefix=True)
    assert tree["tokens"] == [BOS, 1, 2, 3, 4, 5] and tree["positions"] == [0, 1, 2, 3, 4, 3]
    assert tree["branch"] == [0, 0, 0, 1, 1, 2] and tree["layout"] == {(0, 0): (3, 3), (0, 1): (3, 5)}
    assert plain["branch"] is None and plain["layout"] == {(1, 0): (3, 0)}
    assert row_a["tokens"] == [BOS, 1] and row_b["layout"] == {(2, 1): (2, 0)}
    assert [len(u["tokens"]) for u in core_eval.forward_units([mc], share_prefix=False)] == [5, 4]


def test_shared_scoring_with_left_crops_on_a_looped_model(tiny):
    """Crops shift each row differently, so most few-shot rows stop sharing a prefix; the recurrent arm runs the
    mask through every pass. Both paths must still agree."""
    net = tiny_model("operator_1", depth=3, seq_len=48)
    tasks = core_eval.load_tasks(tiny["bundle"])
    by_label = {t["label"]: t for t in tasks}
    build = lambda label: core_eval.task_examples(by_label[label], by_label[label]["items"], 0, [0, 1, 2],
                                                  lambda texts: [encode(t) for t in texts], 48)
    assert any(len(row) == 48 for ex in build("mc_fewshot") for row in ex["rows"])  # left-cropped rows
    assert any(u["branch"] is not None for u in core_eval.forward_units(build("mc_zeroshot"), share_prefix=True))
    ref, _, clipped = core_eval.evaluate_tasks(net, ENC, tasks, [0], None, 48, CPU, scoring="one_at_a_time",
                                               show_progress=False)
    shared, _, _ = core_eval.evaluate_tasks(net, ENC, tasks, [0], None, 48, CPU, rows_per_forward=3,
                                            show_progress=False)
    assert sum(clipped.values()) == 0  # the crops keep every scoring region (no clipped examples)
    for label in ref:
        assert shared[label][0][0] == ref[label][0][0]
        assert shared[label][0][1:] == pytest.approx(ref[label][0][1:], rel=1e-5)


def test_aggregation_arithmetic():
    raw = {"a": {0: (0.5, 2.0, 1.0), 1: (0.7, 3.0, 2.0)}, "b": {0: (0.1, 1.0, float("nan")), 1: (0.3, 1.0, 1.0)}}
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

    raw22 = {t: {0: (0.2 + 0.01 * i, 3.0 - 0.1 * i, 1.0)} for i, t in enumerate(core_eval.CORE_TASKS)}
    base = {t: 25.0 for t in core_eval.CORE_TASKS}
    assert not core_eval.aggregate(raw22, base, [0])["complete_suite"]  # the fingerprint was not checked
    out = core_eval.aggregate(raw22, base, [0], verified=True)
    assert out["complete_suite"] and out["missing_tasks"] == [] and out["core_metric_label"] == "CORE-22"
    assert len(core_eval.FILTERED_TASKS) == 17 and "boolq" not in core_eval.FILTERED_TASKS
    kept = [i for i, t in enumerate(core_eval.CORE_TASKS) if t in core_eval.FILTERED_TASKS]
    assert out["core_metric_filtered"] == pytest.approx(np.mean([(0.2 + 0.01 * i - 0.25) / 0.75 for i in kept]))
    assert out["core_metric_std"] == 0.0
    raw22["copa"][0] = (0.5, float("inf"), 1.0)
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


# ---------------------------------------------------------------------------------------------------------------------
# Bundle: fingerprint, download, zip-slip

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


def test_download_and_zip_slip(tmp_path, http_dir, tiny):
    served, url = http_dir
    with zipfile.ZipFile(served / "good.zip", "w") as zf:
        for dirpath, _, names in os.walk(tiny["bundle"]):
            for name in names:
                path = os.path.join(dirpath, name)
                zf.write(path, "eval_bundle/" + os.path.relpath(path, tiny["bundle"]))
    target = tmp_path / "cache" / "eval_bundle"
    core_eval.ensure_bundle(str(target), f"{url}/good.zip")
    assert core_eval.bundle_fingerprint(target) == core_eval.bundle_fingerprint(tiny["bundle"])
    assert [t["label"] for t in core_eval.load_tasks(str(target))] == [t[0] for t in TINY_TASKS]
    assert sorted(os.listdir(tmp_path / "cache")) == ["eval_bundle"]  # temp download dir cleaned up

    for evil in ("eval_bundle/../../evil.txt", "/tmp/evil_abs.txt"):
        with zipfile.ZipFile(served / "evil.zip", "w") as zf:
            zf.writestr("eval_bundle/core.yaml", "icl_tasks: []\n")
            zf.writestr(evil, "pwned")
        with pytest.raises(core_eval.UsageError, match="unsafe zip member"):
            core_eval.ensure_bundle(str(tmp_path / "evil" / "eval_bundle"), f"{url}/evil.zip")
        assert not os.path.exists(tmp_path / "evil" / "eval_bundle") and not os.path.exists(tmp_path / "evil.txt")
    assert not os.path.exists("/tmp/evil_abs.txt")
    with pytest.raises(core_eval.UsageError, match="could not download"):
        core_eval.ensure_bundle(str(tmp_path / "missing" / "eval_bundle"), f"{url}/nothing.zip")


# ---------------------------------------------------------------------------------------------------------------------
# CLI: end to end, errors, passes, effective depth

def test_cli_errors(tmp_path, tiny, capsys):
    code, err = run_main(["--scoring", "fastest"], capsys)  # argparse errors too: one line, no usage block
    assert code == 2 and err.count("\n") == 1 and "invalid choice: 'fastest'" in err
    code, err = run_main(["--checkpoint", str(tmp_path / "nope.pt"), "--bundle-dir", tiny["bundle"]], capsys)
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    code, err = run_main(["--checkpoint", str(tmp_path / "junk.pt"), "--bundle-dir", tiny["bundle"]], capsys)
    assert code == 2 and err.count("\n") == 1 and "checkpoint" in err
    (tmp_path / "empty_bundle").mkdir()
    code, err = run_main(["--checkpoint", tiny["ckpt"], "--bundle-dir", str(tmp_path / "empty_bundle")], capsys)
    assert code == 2 and err.count("\n") == 1 and "core.yaml" in err
    bad = write_bundle(tmp_path / "bad", task_type_override="generation_task_with_answers")
    code, err = run_main(["--checkpoint", tiny["ckpt"], "--bundle-dir", bad], capsys)
    assert code == 2 and err.count("\n") == 1 and "unknown icl_task_type" in err
    full = write_bundle(tmp_path / "full", [(t, "multiple_choice", 1, " ", 25, mc_items, 3)
                                            for t in core_eval.CORE_TASKS])
    code, err = run_main(["--checkpoint", tiny["ckpt"], "--bundle-dir", full, "--out", str(tmp_path / "e.json")],
                         capsys)
    assert code == 2 and err.count("\n") == 1 and "fingerprint" in err and not (tmp_path / "e.json").exists()
    # with the matching fingerprint the complete suite runs and gets the CORE-22 label and the filtered score
    assert core_eval.main(["--checkpoint", tiny["ckpt"], "--bundle-dir", full, "--out", str(tmp_path / "e.json"),
                           "--expect-fingerprint", core_eval.bundle_fingerprint(full), "--seeds", "0"]) == 0
    out = json.loads((tmp_path / "e.json").read_text())
    assert out["complete_suite"] and out["core_metric_label"] == "CORE-22" and out["fingerprint_verified"]
    assert out["core_metric_filtered"] == pytest.approx(np.mean([out["centered_results"][t]
                                                                 for t in core_eval.FILTERED_TASKS]))


def test_offline_node_without_tiktokens_cache_is_one_line_naming_the_cache(tmp_path, tiny, capsys, monkeypatch):
    """A GPT-2 checkpoint on a node without network (the download fails at once) and with an empty tiktoken cache:
    one line, exit 2, naming TIKTOKEN_CACHE_DIR, the folder it looked in and how to fill it; nothing written."""
    import requests
    import tiktoken.registry

    def offline(url, *args, **kwargs):
        raise requests.ConnectionError(f"{url}: [Errno 101] Network is unreachable")
    monkeypatch.setattr(requests, "get", offline)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # nothing loaded earlier in this process
    cache = tmp_path / "empty_cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    net = tiny_model()
    torch.save(dict(model_config=dataclasses.asdict(net.cfg), model=net.state_dict(), passes=1, tokenizer="gpt2",
                    step=0), tmp_path / "gpt2.pt")
    out = tmp_path / "eval.json"
    code, err = run_main(["--checkpoint", str(tmp_path / "gpt2.pt"), "--bundle-dir", tiny["bundle"], "--out",
                          str(out)], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("core_eval.py: error:"), err
    assert "TIKTOKEN_CACHE_DIR" in err and str(cache) in err and "tiktoken.get_encoding('gpt2')" in err, err
    assert not out.exists() and os.listdir(cache) == []


def test_passes_for_tied_models(tmp_path):
    loop = save_checkpoint(tmp_path / "loop.pt", tiny_model("loop_2", 3))
    net, _ = core_eval.load_model(loop, CPU)
    assert net.active_passes == 2
    net, _ = core_eval.load_model(loop, CPU, passes=4)
    assert net.active_passes == 4
    vanilla = save_checkpoint(tmp_path / "v.pt", tiny_model())
    with pytest.raises(core_eval.UsageError, match="--passes 2"):
        core_eval.load_model(vanilla, CPU, passes=2)


def test_cli_one_process_equals_two_process_torchrun(tmp_path, tiny, monkeypatch, capsys, free_port):
    args = ["--checkpoint", tiny["ckpt"], "--bundle-dir", tiny["bundle"], "--seeds", "0", "1", "--batch-size", "4"]
    tokens = np.asarray(torch.randint(0, 256, (4 * 129,)), dtype=np.uint16)
    monkeypatch.setattr(core_eval.data, "load_pool", lambda data_dir, split: data.Pool(
        tokens, np.array([0]), {"split": split}, split))
    assert core_eval.main(args + ["--out", str(tmp_path / "one.json"), "--effective-depth", "--data-dir", "unused",
                           "--lens-tokens", "256"]) == 0
    stdout = capsys.readouterr().out
    assert "CORE-partial" in stdout and "kl_effective_depth" in stdout
    one = json.loads((tmp_path / "one.json").read_text())
    for key in ("core_metric", "core_loss", "core_metric_filtered", "core_metric_std", "results", "centered_results",
                "losses", "task_counts", "seeds", "complete_suite", "missing_tasks", "suite_fingerprint", "passes",
                "elapsed_seconds", "per_seed", "core_metric_per_seed", "kl_effective_depth", "kl_per_block"):
        assert key in one
    assert one["seeds"] == [0, 1] and one["passes"] == 1 and not one["complete_suite"]
    assert one["missing_tasks"] == core_eval.CORE_TASKS and one["core_metric_filtered"] is None
    assert one["suite_fingerprint"] == core_eval.bundle_fingerprint(tiny["bundle"])
    assert len(one["kl_per_block"]) == 2 and one["lens_tokens"] == 256

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port), "core_eval.py", *args, "--out", str(tmp_path / "two.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["world_size"] == 2 and two["task_counts"] == one["task_counts"]
    assert two["results"] == one["results"] and two["per_seed"]["1"]["results"] == one["per_seed"]["1"]["results"]
    assert two["core_metric"] == pytest.approx(one["core_metric"], abs=1e-12)
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
    assert two["core_loss"] == pytest.approx(one["core_loss"], rel=1e-5)


@pytest.mark.skipif(not os.environ.get("CORE_BUNDLE_DIR"), reason="set CORE_BUNDLE_DIR to a real CORE bundle")
def test_real_bundle_every_task(tmp_path, capsys):
    bundle = os.environ["CORE_BUNDLE_DIR"]
    ckpt = save_checkpoint(tmp_path / "final.pt", tiny_model(seq_len=256))
    assert core_eval.main(["--checkpoint", ckpt, "--bundle-dir", bundle, "--max-per-task", "20", "--seeds", "0",
                           "--out", str(tmp_path / "eval.json")]) == 0
    out = json.loads((tmp_path / "eval.json").read_text())
    labels = [t["label"] for t in core_eval.load_tasks(bundle)]
    assert list(out["results"]) == labels and all(out["task_counts"][t] == 20 for t in labels)
    assert out["complete_suite"] == (sorted(labels) == sorted(core_eval.CORE_TASKS))
    assert out["missing_tasks"] == [t for t in core_eval.CORE_TASKS if t not in labels]
    assert all(np.isfinite(out["losses"][t]) and 0 <= out["results"][t] <= 1 for t in labels)
    if not out["complete_suite"]:
        assert out["core_metric_filtered"] is None and out["core_metric_label"] != "CORE-22"


def test_checkpoint_folder_of_train_py(tmp_path, tiny, capsys):
    """The folder train.py writes (checkpoints/final: model.pt + MANIFEST.json + optimizer state core_eval never
    opens) gives the same scores as the weights in a single file; a run folder gets a message naming what to pass."""
    from common import sha256_file
    final = tmp_path / "run" / "checkpoints" / "final"
    final.mkdir(parents=True)
    shutil.copy(tiny["ckpt"], final / "model.pt")
    (final / "adamw.pt").write_bytes(b"optimizer state: never read by core_eval")
    files = {n: dict(size=os.path.getsize(final / n), sha256=sha256_file(final / n)) for n in ("model.pt", "adamw.pt")}
    (final / "MANIFEST.json").write_text(json.dumps(dict(files=files)))
    args = ["--bundle-dir", tiny["bundle"], "--seeds", "0"]
    assert core_eval.main(["--checkpoint", str(final), *args]) == 0
    from_folder = json.loads((tmp_path / "run" / "eval.json").read_text())  # runs/NAME/eval.json by default
    assert core_eval.main(["--checkpoint", tiny["ckpt"], *args, "--out", str(tmp_path / "single.json")]) == 0
    single = json.loads((tmp_path / "single.json").read_text())
    assert from_folder["centered_results"] == single["centered_results"]
    capsys.readouterr()
    for folder in (tmp_path / "run", tmp_path / "run" / "checkpoints"):
        code, err = run_main(["--checkpoint", str(folder), *args], capsys)
        assert code == 2 and err.count("\n") == 1 and f"pass {final}" in err, err
