"""Bad input across the scripts: every case must exit 2 with exactly one line on stderr, no traceback, and leave
every file that existed before the call byte-identical. One case table per script; each case is (id, files to
create under the case's directory, argv with {d} for that directory, a phrase the message must contain).
Scripts with a main(argv) run in-process (fast: no interpreter start per case; an uncaught exception fails the
test just as a traceback would); the others as `python SCRIPT ...` subprocesses."""
import contextlib
import functools
import importlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot(directory):
    out = {}
    for base, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[path] = f.read()
    return out


def run_in_process(script, argv):
    module = importlib.import_module(script[:-3])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = module.main(argv)
        except SystemExit as e:  # argparse's -h/--version
            code = e.code
    return code, err.getvalue()


def run_subprocess(script, argv):
    r = subprocess.run([sys.executable, script, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    return r.returncode, r.stderr


def assert_refused(script, argv, directory, message, files=None, runner=run_subprocess):
    """Run SCRIPT with ARGV (in the repository root) and check the bad-input contract."""
    for rel, content in (files or {}).items():
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
    before = snapshot(directory)
    argv = [a.replace("{d}", str(directory)) for a in argv]
    code, stderr = runner(script, argv)
    lines = stderr.splitlines()
    assert code == 2, (code, stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert message in lines[0], lines[0]
    after = snapshot(directory)
    assert {p: after.get(p) for p in before} == before, "a pre-existing file changed"
    return lines[0]


# ------------------------------------------------------------------------------------------------ fit.py
def ladder_csv(rows=(), header="arm,depth,compute_flops,val_loss", bom=False):
    """A small valid two-arm ladder, plus extra raw CSV rows."""
    lines = [header]
    for arm, A, g in (("vanilla", 1.6, 0.11), ("better", 1.55, 0.12)):
        for d in range(6, 22, 2):
            C = 1e18 * (d / 8) ** 4.5
            lines.append(f"{arm},{d},{C:.6e},{1.7 + A * (C / 1e18) ** -g:.6f}")
    return ("\ufeff" if bom else "") + "\n".join(lines + list(rows)) + "\n"


def with_row(i, row):
    """ladder_csv with data row i (0-based) replaced."""
    lines = ladder_csv().splitlines()
    lines[i + 1] = row
    return "\n".join(lines) + "\n"


def result_json(**kw):
    r = dict(status="complete", arch="vanilla", depth=8, estimated_training_flops=1e18, final_val_loss=3.0,
             plan=dict(seed=42))
    r.update(kw)
    return json.dumps(r)


GOOD = {"l.csv": ladder_csv()}
PLAN = "\n".join(json.dumps(dict(arch="vanilla", depth=d, total_flops=1e18 * d)) for d in (6, 8, 10, 12)) + "\n"
PILOT = json.dumps(dict(E=1.7, arms=dict(vanilla=dict(A=1.6, gamma=0.11))))

FIT_CASES = [
    ("missing-input", {}, ["ladders", "{d}/nope"], "no CSV, result.json or run directory"),
    ("missing-csv", {}, ["ladders", "{d}/nope.csv", "x.csv"], "cannot read"),
    ("missing-column", {"l.csv": "arm,depth,val_loss\nvanilla,8,3.0\n"}, ["ladders", "{d}/l.csv"], "missing column(s) compute_flops"),
    ("non-numeric-loss", {"l.csv": with_row(2, "vanilla,10,3e18,abc")}, ["ladders", "{d}/l.csv"], "l.csv:4: column val_loss is 'abc'"),
    ("nan-loss-reference", {"l.csv": with_row(0, "vanilla,6,4e17,nan")}, ["ladders", "{d}/l.csv"], "l.csv:2: column val_loss is nan"),
    ("inf-compute", {"l.csv": with_row(9, "better,8,inf,3.0")}, ["ladders", "{d}/l.csv"], "l.csv:11: column compute_flops is inf"),
    ("negative-loss", {"l.csv": with_row(1, "vanilla,8,1e18,-3.0")}, ["ladders", "{d}/l.csv"], "l.csv:3: column val_loss is -3.0; need a finite number > 0"),
    ("zero-compute", {"l.csv": with_row(1, "vanilla,8,0,3.0")}, ["ladders", "{d}/l.csv"], "column compute_flops is 0"),
    ("fractional-depth", {"l.csv": with_row(1, "vanilla,8.5,1e18,3.0")}, ["ladders", "{d}/l.csv"], "l.csv:3: depth must be a whole number"),
    ("conflicting-duplicate", {"l.csv": ladder_csv(["vanilla,8,1.000000e+18,3.1"])}, ["ladders", "{d}/l.csv"], "two different results for vanilla d8"),
    ("replicates-different-compute", {"l.csv": ladder_csv(["vanilla,8,2e18,3.1"])}, ["ladders", "{d}/l.csv", "--replicates"], "different compute"),
    ("extrapolate-zero", GOOD, ["ladders", "{d}/l.csv", "--extrapolate", "0"], "--extrapolate: must be a finite number > 0"),
    ("extrapolate-negative", GOOD, ["ladders", "{d}/l.csv", "--extrapolate=-1e21"], "--extrapolate: must be"),
    ("extrapolate-nan", GOOD, ["ladders", "{d}/l.csv", "--extrapolate", "nan"], "--extrapolate: must be"),
    ("noise-zero", GOOD, ["ladders", "{d}/l.csv", "--noise", "0"], "--noise: must be a finite number in (0, 1)"),
    ("bootstrap-negative", GOOD, ["ladders", "{d}/l.csv", "--bootstrap=-5"], "--bootstrap: must be a whole number in [0, 100000]"),
    ("holdout-format", GOOD, ["ladders", "{d}/l.csv", "--holdout", "vanilla-8"], "use ARM:DEPTH"),
    ("holdout-missing-point", GOOD, ["ladders", "{d}/l.csv", "--holdout", "vanilla:26"], "no vanilla d26 point"),
    ("reference-arm-missing", GOOD, ["ladders", "{d}/l.csv", "--reference-arm", "nope"], "reference arm 'nope'"),
    ("out-is-a-file", dict(GOOD, out="x"), ["ladders", "{d}/l.csv", "--out", "{d}/out"], "is a file, not a directory"),
    ("out-foreign-figure", dict(GOOD, **{"figs/fig3_ladders.png": "mine"}), ["ladders", "{d}/l.csv", "--out", "{d}/figs"],
     "not written by fit.py"),
    ("out-bad-manifest", dict(GOOD, **{"figs/fit_manifest.json": "[1, 2]"}), ["ladders", "{d}/l.csv", "--out", "{d}/figs"],
     "is not a fit.py manifest"),
    ("wrong-kind-json", {"edu.json": json.dumps(dict(tasks=[], arms={}))}, ["ladders", "{d}/edu.json"], "is not a train.py result.json"),
    ("corrupt-result-json", {"runs/a/result.json": b"\x00\xff garbage"}, ["ladders", "{d}/runs"], "is not a train.py result.json"),
    ("result-json-nan-loss", {"runs/a/result.json": result_json(final_val_loss=float("nan"))}, ["ladders", "{d}/runs"],
     "final_val_loss > 0"),
    ("result-json-fractional-depth", {"runs/a/result.json": result_json(depth=8.5)}, ["ladders", "{d}/runs"], "a whole depth"),
    ("not-utf8-csv", {"l.csv": b"arm,depth\n\xff\xfe\x00bad\n"}, ["ladders", "{d}/l.csv"], "not a UTF-8 CSV"),
    ("unknown-subcommand", {}, ["frobnicate"], "invalid choice"),
    ("surface-negative-N", {"s.csv": "N,D,loss\n" + "".join(f"{-1 if i == 0 else 1e8 * (i + 1)},{1e9 * (i + 1)},3.0\n" for i in range(8))},
     ["surface", "{d}/s.csv"], "s.csv:2: column N is -1"),
    ("surface-drop-too-many", {"s.csv": "N,D,loss\n" + "".join(f"{1e8 * (i + 1)},{1e9 * (i + 1)},{3 - 0.1 * i}\n" for i in range(8))},
     ["surface", "{d}/s.csv", "--drop-highest", "3"], "after --drop-highest"),
    ("surface-delta-zero", {"s.csv": "N,D,loss\n1,1,1\n"}, ["surface", "{d}/s.csv", "--delta", "0"], "--delta: must be"),
    ("tpp-nan", {"t.csv": "compute_flops,tpp,val_loss\n1e18,5,nan\n"}, ["tpp", "{d}/t.csv"], "t.csv:2: column val_loss is nan"),
    ("loops-negative-budget", {"g.csv": "depth,loops,weight_decay,compute_flops,val_loss\n4,1,0.8,1e17,3\n"},
     ["loops", "{d}/g.csv", "--budgets=-1"], "--budgets: must be"),
    ("loops-wrong-kind-json", {"runs/a/result.json": "[]"}, ["loops", "{d}/runs"], "is not a train.py result.json"),
    ("design-no-noise", {"p.jsonl": PLAN, "pilot.json": PILOT}, ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json"], "--noise SIGMA is required"),
    ("design-no-truth", {"p.jsonl": PLAN}, ["design", "{d}/p.jsonl", "--noise", "0.002"], "give the true curves"),
    ("design-bad-truth", {"p.jsonl": PLAN, "pilot.json": "{}"}, ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002"],
     "is not a `fit.py ladders --json` output"),
    ("design-bad-plan-line", {"p.jsonl": PLAN + "not json\n", "pilot.json": PILOT},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002"], "p.jsonl:5: not a train.py --dry-run plan"),
    ("design-bad-spec", {"p.jsonl": PLAN, "pilot.json": PILOT},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002", "--design", "six to 18"], "use 'd6-18'"),
    ("design-depth-not-planned", {"p.jsonl": PLAN, "pilot.json": PILOT},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002", "--design", "d6-22"], "no planned run has depth 22"),
    ("design-arm-without-law", {"p.jsonl": PLAN.replace('"vanilla", "depth": 12', '"other", "depth": 12'), "pilot.json": PILOT},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002"], "planned arm 'other' has no law"),
    ("design-out-is-a-file", {"p.jsonl": PLAN, "pilot.json": PILOT, "out": "x"},
     ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002", "--out", "{d}/out"], "is a file"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in FIT_CASES], ids=[c[0] for c in FIT_CASES])
def test_fit_bad_input(tmp_path, files, argv, message):
    assert_refused("fit.py", argv, tmp_path, message, files, runner=run_in_process)


def test_fit_bad_input_as_a_process(tmp_path):
    # the same contract through the interpreter: the one-line message really is all a user sees
    assert_refused("fit.py", ["ladders", "{d}/l.csv", "--extrapolate=-1"], tmp_path, "--extrapolate: must be", GOOD)


# ------------------------------------------------------------------------------------------------ train.py
# {d}/pool is a fresh copy of the session's small stdlib pool, so the pool is part of what must stay byte-identical.
TINY = ["--preset", "cpu", "--width-per-depth", "16", "--head-dim", "16", "--seq-len", "32", "--total-batch-tokens",
        "256", "--val-tokens", "1024", "--warmup-steps", "0", "--data-dir", "{d}/pool", "--runs-dir", "{d}/runs"]
RUN = ["--arch", "vanilla", "--depth", "2", *TINY, "--steps", "4", "--run-name", "r"]
COMPLETE = json.dumps(dict(status="complete", arch="vanilla", depth=2))

TRAIN_CASES = [
    ("steps-zero", {}, [*RUN, "--steps", "0"], "--steps: must be a whole number in [1, 10000000], got '0'"),
    ("save-every-negative", {}, [*RUN, "--save-every", "-1"], "--save-every: must be a whole number in [0,"),
    ("stop-after-zero", {}, [*RUN, "--stop-after", "0"], "--stop-after: must be a whole number in [1,"),
    ("alpha-nan", {}, ["--arch", "operator_1", "--depth", "2", "--alpha", "nan", "--dry-run"],
     "argument --alpha: must be a finite number"),
    ("matrix-lr-inf", {}, [*RUN, "--matrix-lr", "inf"], "argument --matrix-lr: must be a finite number"),
    ("crossover-nan", {}, ["--arch", "untied_grow", "--depth", "2", "--crossover-fractions", "nan", "--dry-run"],
     "must be a finite number"),
    ("run-name-with-slash", {}, [*RUN, "--run-name", "../escape"], "must be a plain folder name"),
    ("runs-dir-is-a-file", {"runs": "a file"}, RUN, "is a file, not a directory"),
    ("runs-dir-not-writable", {}, [*RUN, "--runs-dir", "/sys/scaling_exponents_runs"], "cannot create the run folder"),
    ("run-dir-is-a-file", {"runs/r": "a file"}, RUN, "is a file, not a directory"),
    ("foreign-run-dir", {"runs/r/notes.txt": "my notes"}, RUN, "is not empty (notes.txt"),
    ("run-dir-with-a-foreign-trajectory", {"runs/r/trajectory.jsonl": '{"step": 1}\n'}, RUN,
     "is not empty (trajectory.jsonl"),
    ("existing-run-without-resume", {"runs/r/result.json": COMPLETE}, RUN, "already holds a run"),
    ("explicit-data-dir-without-pool", {"typo/readme": "not a pool"}, [*RUN, "--data-dir", "{d}/typo"],
     "no pool in"),
    ("interrupted-pool", {"half/corpus.json": json.dumps(dict(status="running", splits={}))},
     [*RUN, "--data-dir", "{d}/half"], "is incomplete"),
    ("fixed-reduce-order-on-3-processes", {}, ["--arch", "vanilla", "--depth", "2", "--fixed-reduce-order",
                                               "--dry-run", "--world-size", "3"],
     "--fixed-reduce-order needs a power-of-two number of processes, got 3"),
]


@pytest.fixture
def pool_copy(pool, tmp_path):
    import shutil
    shutil.copytree(pool, tmp_path / "pool")
    return tmp_path / "pool"


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in TRAIN_CASES], ids=[c[0] for c in TRAIN_CASES])
def test_train_bad_input(tmp_path, pool_copy, files, argv, message):
    assert_refused("train.py", argv, tmp_path, message, files, runner=run_in_process)


def test_train_refuses_a_pool_with_flipped_bytes(tmp_path, pool_copy):
    # token id 0xffff >= the byte vocab (257): an IndexError inside the first step before; result.json never written
    with open(pool_copy / "train.bin", "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    assert_refused("train.py", RUN, tmp_path, "holds token id 65535 >= vocab size 257 at position 10",
                   runner=run_in_process)
    assert not (tmp_path / "runs" / "r" / "result.json").exists()


def test_train_refuses_a_locked_run(tmp_path, pool_copy):
    """The lock is held by another open file description (here: a child process), as a running trainer holds it."""
    os.makedirs(tmp_path / "runs" / "r")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write('PID 4242 on elsewhere'); f.flush(); "
                               "print('held', flush=True); time.sleep(60)", str(tmp_path / "runs" / "r" / "train.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_refused("train.py", RUN, tmp_path, "is being written by another train.py (PID 4242 on elsewhere)",
                       runner=run_in_process)
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------------------------------------ model.py
MODEL_CASES = [
    ("alpha-nan", {}, ["--arch", "operator_1", "--depth", "8", "--alpha", "nan"], "--alpha: must be a finite number"),
    ("alpha-inf-json", {}, ["--arch", "operator_1", "--depth", "8", "--alpha=-inf", "--json"], "finite"),
    ("unknown-arch", {}, ["--arch", "nope", "--depth", "8"], "unknown arch 'nope'"),
    ("impossible-split", {}, ["--arch", "operator_1", "--depth", "3", "--prelude", "2", "--coda", "2"],
     "impossible split"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES])
def test_model_bad_input(tmp_path, files, argv, message):
    assert_refused("model.py", argv, tmp_path, message, files, runner=run_in_process)


def test_model_into_a_closed_pipe_is_quiet():
    r = subprocess.run("python model.py --arch vanilla --depth 8 | head -1", shell=True, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.stdout.startswith("arch") and r.stdout.count("\n") == 1
    assert r.stderr == "", r.stderr


# ------------------------------------------------------------------------------------------------ data.py
PREP = ["prepare", "--corpus", "stdlib", "--tokenizer", "bytes", "--train-tokens", "1000", "--val-tokens", "1000"]
OTHER_PREPARE = json.dumps(dict(schema_version=1, status="running", corpus="files", files="mine/*.txt",
                                tokenizer="bytes", splits={}, sources=[], sources_done=3))

DATA_CASES = [
    ("prepare-into-foreign-folder", {"mine/notes.txt": "my notes"}, [*PREP, "--out", "{d}/mine"],
     "is not empty and holds no pool"),
    ("prepare-over-another-unfinished-prepare", {"pool/corpus.json": OTHER_PREPARE, "pool/train.bin": b"\x01\x00"},
     [*PREP, "--out", "{d}/pool"], "holds an unfinished prepare with other settings (corpus 'files'"),
    ("corpus-json-not-a-manifest", {"pool/corpus.json": "[1, 2]"}, [*PREP, "--out", "{d}/pool"],
     "is not a data.py pool manifest"),
    ("files-all-empty", {"in/a.txt": "", "in/b.txt": ""},
     ["prepare", "--corpus", "files", "--files", "{d}/in/*.txt", "--tokenizer", "bytes", "--workers", "1",
      "--out", "{d}/out"], "hold no text"),
    ("jsonl-text-not-a-string", {"in/a.jsonl": '{"text": "a"}\n\n{"text": 5}\n'},
     ["prepare", "--corpus", "files", "--files", "{d}/in/*.jsonl", "--tokenizer", "bytes", "--workers", "1",
      "--out", "{d}/out"], "a.jsonl:3: the 'text' field is not a string"),
    ("jsonl-line-after-a-carriage-return", {"in/a.jsonl": b'{"text": "a"}\n{"text": "b\rc"}\n{"text": "d"}\n'},
     ["prepare", "--corpus", "files", "--files", "{d}/in/*.jsonl", "--tokenizer", "bytes", "--workers", "1",
      "--out", "{d}/out"], "a.jsonl:2: not a JSON object"),
    ("jsonl-not-utf8", {"in/a.jsonl": b'{"text": "a"}\n{"text": "\xff"}\n'},
     ["prepare", "--corpus", "files", "--files", "{d}/in/*.jsonl", "--tokenizer", "bytes", "--workers", "1",
      "--out", "{d}/out"], "a.jsonl:2: not UTF-8"),
    ("negative-budget", {}, [*PREP, "--train-tokens=-5", "--out", "{d}/p"], "--train-tokens: must be a whole number"),
    ("verify-missing-pool", {}, ["verify", "{d}/nothing"], "no pool in"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_data_bad_input(tmp_path, files, argv, message):
    assert_refused("data.py", argv, tmp_path, message, files, runner=run_in_process)


# ------------------------------------------------------------------------------------------------ core_eval.py
def bundle_files(rows=None, spec=None, prefix="b"):
    """A one-task bundle: an MC task whose rows are given as raw JSONL lines."""
    rows = rows or [json.dumps(dict(query=f"q{i}", choices=["x", "y"], gold=i % 2)) for i in range(4)]
    spec = spec or dict(label="t", dataset_uri="t.jsonl", num_fewshot=[0], icl_task_type="multiple_choice")
    import yaml
    return {f"{prefix}/core.yaml": yaml.safe_dump(dict(icl_tasks=[spec])),
            f"{prefix}/eval_meta_data.csv": "Eval Task,Random baseline\nt,50\n",
            f"{prefix}/eval_data/t.jsonl": "\n".join(rows) + "\n"}


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


GOOD_ROW = json.dumps(dict(query="q", choices=["x", "y"], gold=0))
EVAL = ["--checkpoint", "{ckpt}", "--bundle-dir", "{d}/b", "--seeds", "0", "--out", "{d}/eval.json"]
CORE_EVAL_CASES = [
    ("core-yaml-without-dataset-uri", bundle_files(spec=dict(label="t", num_fewshot=[0], icl_task_type="schema")),
     EVAL, "icl_tasks entry 1 of"),
    ("gold-out-of-range", bundle_files([GOOD_ROW, json.dumps(dict(query="q", choices=["x", "y"], gold=7))]), EVAL,
     "t.jsonl:2: gold 7 is not an index into its 2 options"),
    ("no-choices", bundle_files([json.dumps(dict(query="q", choices=[], gold=0))]), EVAL, "t.jsonl:1: no answer options"),
    ("row-missing-field", bundle_files([GOOD_ROW, GOOD_ROW, json.dumps(dict(query="q"))]), EVAL,
     "t.jsonl:3: a multiple_choice row needs query and choices"),
    ("lm-continuation-not-text", bundle_files([json.dumps(dict(context="c", continuation=3))],
                                              spec=dict(label="t", dataset_uri="t.jsonl", num_fewshot=[0],
                                                        icl_task_type="language_modeling")), EVAL,
     "t.jsonl:1: context, continuation must be text"),
    ("bad-json-line", bundle_files([GOOD_ROW, "", GOOD_ROW, "{not json"]), EVAL, "t.jsonl:4: not a JSON object"),
    ("foreign-eval-json", dict(bundle_files(), **{"eval.json": '{"mine": 1}'}), EVAL,
     "exists and is not core_eval's result"),
    ("out-is-a-directory", dict(bundle_files(), **{"eval.json/x": "x"}), EVAL, "is a directory"),
    ("effective-depth-pool-missing", bundle_files(), [*EVAL, "--effective-depth", "--data-dir", "{d}/nopool"],
     "--effective-depth: no pool in"),
    ("kl-threshold-nan", bundle_files(), [*EVAL, "--kl-threshold", "nan"], "must be a finite number"),
    ("lens-tokens-zero", bundle_files(), [*EVAL, "--lens-tokens", "0"], "--lens-tokens: must be a whole number"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in CORE_EVAL_CASES], ids=[c[0] for c in CORE_EVAL_CASES])
def test_core_eval_bad_input(tmp_path, checkpoint, files, argv, message):
    argv = [a.replace("{ckpt}", checkpoint) for a in argv]
    assert_refused("core_eval.py", argv, tmp_path, message, files, runner=run_in_process)


def test_core_eval_zip_caps(tmp_path):
    import zipfile
    import core_eval
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("eval_bundle/core.yaml", b"\0" * (3 << 20))  # 3 MiB of zeros: a few KiB compressed
    with pytest.raises(core_eval.UsageError, match="unpacks to more than 2 MiB"):
        core_eval.safe_extract(str(bomb), str(tmp_path / "x"), max_bytes=2 << 20)
    with pytest.raises(core_eval.UsageError, match="more than the cap of 0"):
        core_eval.safe_extract(str(bomb), str(tmp_path / "y"), max_files=0)
    core_eval.safe_extract(str(bomb), str(tmp_path / "z"), max_bytes=4 << 20)  # under the cap: extracted whole
    assert os.path.getsize(tmp_path / "z" / "eval_bundle" / "core.yaml") == 3 << 20


# ------------------------------------------------------------------------------------------------ ladder.sh
def run_ladder(script, argv):
    r = subprocess.run(["bash", script, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stderr


LADDER_CASES = [
    ("unknown-arch", {}, ["nope"], "unknown arch 'nope'"),
    ("option-first", {}, ["--depths", "6"], "the first argument is ARCH"),
    ("depth-not-a-number", {}, ["vanilla", "--depths", "6 x"], "--depths must be whole numbers, got 'x'"),
    ("unknown-preset", {}, ["vanilla", "--preset", "huge"], "unknown preset 'huge'"),
    ("replicates-without-seeds", {}, ["vanilla", "--replicate-depths", "16"], "--replicate-depths needs --seeds"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in LADDER_CASES], ids=[c[0] for c in LADDER_CASES])
def test_ladder_bad_input(tmp_path, files, argv, message):
    assert_refused("ladder.sh", argv, tmp_path, message, files, runner=run_ladder)


# ------------------------------------------------------------------------------------------------ fault: two writers
def test_two_trainers_on_one_run_dir(tmp_path, pool):
    """The second trainer exits 2 naming the first one's PID; the first completes with steps 1..N in order."""
    args = [a.replace("{d}/pool", pool).replace("{d}", str(tmp_path)) for a in RUN[:-4]] + ["--steps", "30",
                                                                                              "--run-name", "r"]
    first = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    lock = tmp_path / "runs" / "r" / "train.lock"
    for _ in range(1200):  # until the first trainer holds the lock (torch import takes seconds)
        if lock.exists() and f"PID {first.pid}" in lock.read_text():
            break
        assert first.poll() is None, first.communicate()
        import time
        time.sleep(0.05)
    code, err = run_in_process("train.py", args)
    assert code == 2 and len(err.splitlines()) == 1 and f"(PID {first.pid} on " in err, err
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    steps = [json.loads(line)["step"] for line in open(tmp_path / "runs" / "r" / "trajectory.jsonl")]
    assert steps == list(range(1, 31))
    assert json.load(open(tmp_path / "runs" / "r" / "result.json"))["status"] == "complete"


def hold_lock(path, text):
    """A child process holding the run lock, as a running trainer does."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write(sys.argv[2]); f.flush(); print('held', flush=True); "
                               "time.sleep(120)", str(path), text], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_ladder_refuses_a_run_being_trained(tmp_path):
    holder = hold_lock(tmp_path / "vanilla_d1" / "train.lock", "PID 4242 on elsewhere")
    try:
        r = subprocess.run(["bash", "ladder.sh", "vanilla", "--preset", "cpu", "--depths", "1"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, env=dict(os.environ, RUNS_DIR=str(tmp_path)))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "run vanilla_d1 is being trained by another process (PID 4242 on elsewhere)" in r.stderr
        assert not (tmp_path / "vanilla_d1" / "train.log").exists()
    finally:
        holder.kill()
        holder.wait()


def test_orphaned_torchrun_worker_keeps_the_lock(tmp_path, pool, free_port):
    """torchrun killed with -9 (as when a ladder's process group is killed) leaves its worker running: the worker,
    not torchrun, holds the lock, so a re-run is refused instead of becoming a second writer."""
    import signal
    import time
    args = [a.replace("{d}/pool", pool).replace("{d}", str(tmp_path)) for a in RUN[:-4]] + ["--steps", "100000",
                                                                                              "--run-name", "r"]
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr",
                              "127.0.0.1", "--master_port", str(free_port), "train.py", *args], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    lock = tmp_path / "runs" / "r" / "train.lock"
    worker = None
    try:
        for _ in range(2400):
            if lock.exists() and lock.read_text().startswith("PID "):
                worker = int(lock.read_text().split()[1])
                break
            assert agent.poll() is None
            time.sleep(0.05)
        assert worker and worker != agent.pid
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        os.kill(worker, 0)  # the orphan is still alive ...
        code, err = run_in_process("train.py", [*args, "--resume"])
        assert code == 2 and f"(PID {worker} on " in err, err  # ... and a re-run is refused
    finally:
        agent.kill()
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


# ------------------------------------------------------------------------------------------------ train.py checkpoints
class CodeOnLoad:
    """Unpickling this runs code (writes a marker file): a crafted checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def tiny_run_argv(pool, *extra):
    return ["--arch", "vanilla", "--depth", "2", "--preset", "cpu", "--width-per-depth", "16", "--head-dim", "16",
            "--seq-len", "32", "--total-batch-tokens", "256", "--val-tokens", "1024", "--data-dir", pool,
            "--runs-dir", "{d}/runs", "--run-name", "r", "--steps", "4", "--warmup-steps", "0", *extra]


@pytest.fixture(scope="module")
def stopped_run(pool, tmp_path_factory):
    """A run stopped after step 2: checkpoints/latest holds model.pt, muon/ (DCP), adamw.pt, meta.json, MANIFEST.json."""
    d = str(tmp_path_factory.mktemp("stopped"))
    argv = [a.replace("{d}", d) for a in tiny_run_argv(pool, "--stop-after", "2")]
    assert run_in_process("train.py", argv)[0] == 0
    return os.path.join(d, "runs", "r")


def rehash(folder):
    """Rewrite a checkpoint's manifest for its current files (what a deliberate forger would do)."""
    import common
    names = sorted(os.path.relpath(os.path.join(b, n), folder) for b, _, ns in os.walk(folder) for n in ns
                   if n != "MANIFEST.json")
    files = {n: dict(size=os.path.getsize(os.path.join(folder, n)), sha256=common.sha256_file(os.path.join(folder, n)))
             for n in names}
    with open(os.path.join(folder, "MANIFEST.json"), "w") as f:
        json.dump(dict(files=files), f)


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def random_bytes(path, prefix=b"", size=None):
    """Overwrite PATH with as many seeded random bytes (after PREFIX): the same bytes on every run, so a case
    cannot pass or fail by the luck of the draw (torch.load fails in a different way for ~9% of random files)."""
    size = os.path.getsize(path) if size is None else size
    with open(path, "wb") as f:
        f.write(prefix + random.Random(0).randbytes(size - len(prefix)))


def edit_manifest_sha(latest):
    manifest = json.load(open(os.path.join(latest, "MANIFEST.json")))
    manifest["files"]["meta.json"]["sha256"] = "0" * 64
    with open(os.path.join(latest, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f)


def edit_meta(latest, **changes):
    """Change meta.json's fields and rehash: a checkpoint written in another reduction order, as far as resume sees."""
    path = os.path.join(latest, "meta.json")
    meta = json.load(open(path))
    meta.update(changes)
    with open(path, "w") as f:
        json.dump(meta, f)
    rehash(latest)


def crafted(path, marker):
    torch.save(CodeOnLoad(marker), path)


def crafted_metadata(path, marker):
    import pickle
    with open(path, "wb") as f:
        pickle.dump(CodeOnLoad(marker), f)


RESUME = ["--resume"]
L = "runs/r/checkpoints/latest"
# (id, mutation of the copied run (run dir, marker path), script, argv after the run's flags, message)
CHECKPOINT_CASES = [
    ("resume-truncated", lambda r, m: truncate(f"{r}/checkpoints/latest/model.pt"), "train.py", RESUME,
     "is truncated or corrupted: model.pt has"),
    ("resume-random-bytes", lambda r, m: random_bytes(f"{r}/checkpoints/latest/muon/__0_0.distcp"), "train.py",
     RESUME, "is corrupted: muon/__0_0.distcp does not match its sha256"),
    ("resume-random-bytes-rehashed", lambda r, m: (random_bytes(f"{r}/checkpoints/latest/adamw.pt"),
                                                   rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "is unreadable or holds objects other than tensors"),
    # bytes torch.load fails on with a UnicodeDecodeError (a short BINUNICODE string that is not utf-8), and with a
    # "pickle protocol 121" warning on stderr before its UnpicklingError: both reached the user unlike the rest
    ("resume-undecodable-bytes-rehashed", lambda r, m: (random_bytes(f"{r}/checkpoints/latest/adamw.pt",
                                                                     b"X\x04\x00\x00\x00\xf8\xf8\xf8\xf8"),
                                                        rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "is unreadable or holds objects other than tensors"),
    ("resume-odd-protocol-bytes-rehashed", lambda r, m: (random_bytes(f"{r}/checkpoints/latest/model.pt", b"\x80\x79"),
                                                         rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "is unreadable or holds objects other than tensors"),
    ("resume-manifest-mismatch", lambda r, m: edit_manifest_sha(f"{r}/checkpoints/latest"), "train.py", RESUME,
     "is corrupted: meta.json does not match its sha256"),
    ("resume-save-never-finished", lambda r, m: os.remove(f"{r}/checkpoints/latest/MANIFEST.json"), "train.py",
     RESUME, "is incomplete (no MANIFEST.json"),
    ("resume-crafted-model-pickle", lambda r, m: (crafted(f"{r}/checkpoints/latest/model.pt", m),
                                                  rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "holds objects other than tensors and plain types"),
    ("resume-crafted-dcp-metadata", lambda r, m: (crafted_metadata(f"{r}/checkpoints/latest/muon/.metadata", m),
                                                  rehash(f"{r}/checkpoints/latest")), "train.py", RESUME,
     "holds objects other than tensors and plain types"),
    ("resume-no-checkpoint", lambda r, m: shutil.rmtree(f"{r}/checkpoints"), "train.py", RESUME,
     "has no checkpoint to resume from"),
    ("resume-old-single-file", lambda r, m: (shutil.rmtree(f"{r}/checkpoints/latest"),
                                             open(f"{r}/checkpoints/latest.pt", "wb").close()), "train.py", RESUME,
     "single-file checkpoint of an earlier train.py"),
    ("resume-short-trajectory", lambda r, m: open(f"{r}/trajectory.jsonl", "w").close(), "train.py", RESUME,
     "has 0 lines but the checkpoint is at step 2"),
    ("fresh-start-over-a-run", lambda r, m: os.remove(f"{r}/result.json"), "train.py", [], "already holds a run"),
    ("resume-in-the-fixed-reduce-order", lambda r, m: None, "train.py", [*RESUME, "--fixed-reduce-order"],
     "was written without --fixed-reduce-order; resume without it too"),
    ("resume-a-fixed-order-run-without-it", lambda r, m: edit_meta(f"{r}/checkpoints/latest", fixed_reduce_order=True,
                                                                   micro_batches=[8]), "train.py", RESUME,
     "was written with --fixed-reduce-order; resume with it too"),
    ("resume-fixed-order-micro-batch-not-dividing", lambda r, m: edit_meta(
        f"{r}/checkpoints/latest", fixed_reduce_order=True, micro_batches=[3]), "train.py",
     [*RESUME, "--fixed-reduce-order"], "8 sequences each, not a multiple of 3; resume on fewer processes"),
    ("resume-fixed-order-micro-batch-not-fitting", lambda r, m: edit_meta(
        f"{r}/checkpoints/latest", fixed_reduce_order=True, micro_batches=[8]), "train.py",
     [*RESUME, "--fixed-reduce-order", "--gpu-memory", "0.01"],
     "the micro-batches [8] this --fixed-reduce-order run started with (bit-identity needs them): micro-batch 8 needs"),
    ("eval-random-bytes-file", lambda r, m: random_bytes(f"{r}/final.pt", b"\x80\x79", size=4096), "core_eval.py",
     ["--checkpoint", "{d}/runs/r/final.pt"], "is not a usable model checkpoint"),
    ("eval-truncated", lambda r, m: truncate(f"{r}/checkpoints/latest/model.pt"), "core_eval.py",
     ["--checkpoint", "{d}/" + L], "is truncated or corrupted: model.pt has"),
    ("eval-crafted-pickle", lambda r, m: (crafted(f"{r}/checkpoints/latest/model.pt", m),
                                          rehash(f"{r}/checkpoints/latest")), "core_eval.py",
     ["--checkpoint", "{d}/" + L + "/model.pt"], "holds objects other than tensors and plain types"),
    ("eval-run-folder", lambda r, m: None, "core_eval.py", ["--checkpoint", "{d}/runs/r"],
     "is a run folder (no model.pt); pass"),
    ("eval-checkpoints-folder", lambda r, m: None, "core_eval.py", ["--checkpoint", "{d}/runs/r/checkpoints"],
     "is a folder of checkpoints (no model.pt); pass"),
]


@pytest.mark.parametrize("mutate, script, argv, message", [c[1:] for c in CHECKPOINT_CASES],
                         ids=[c[0] for c in CHECKPOINT_CASES])
def test_checkpoint_bad_input(pool, stopped_run, tmp_path, mutate, script, argv, message):
    run_dir, marker = os.path.join(tmp_path, "runs", "r"), os.path.join(tmp_path, "marker")
    shutil.copytree(stopped_run, run_dir)
    mutate(run_dir, marker)
    full = tiny_run_argv(pool) + argv if script == "train.py" else argv + ["--bundle-dir", "{d}/no-bundle"]
    assert_refused(script, full, tmp_path, message, runner=run_in_process)
    assert not os.path.exists(marker), "the crafted pickle ran"


def test_resume_of_a_complete_run_is_nothing_to_do(pool, tmp_path):
    """--resume on a complete run exits 0 with "nothing to do" on stdout and touches nothing (not exit 2: ladder.sh
    re-submitted after a failure is expected to pass over finished runs)."""
    argv = [a.replace("{d}", str(tmp_path)) for a in tiny_run_argv(pool)]
    assert run_in_process("train.py", argv)[0] == 0
    before = snapshot(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert importlib.import_module("train").main(argv + ["--resume"]) == 0
    assert "nothing to do" in out.getvalue() and snapshot(tmp_path) == before


# --- state: disk full, resume cross-checks, pool hashes (issue 23) ---
# Class 1: a full disk stops every writer with one line (exit 2), cleans its temporary files and keeps what it had.
# The real case runs in one subprocess in a private mount namespace (root), on small tmpfs folders that fill up:
# train.py (a checkpoint that no longer fits next to the last one), core_eval.py (no room for eval.json) and
# data.py prepare (no room for the pool, which then gets more room and resumes).
WRITERS_FULL_DISK_DRIVER = """
import contextlib, importlib, io, json, subprocess, sys
sys.path.insert(0, sys.argv[1])
results = []
for step in json.loads(sys.argv[2]):
    if step[0] == "grow":  # more room on a mount: what freeing space does
        subprocess.run(["mount", "-o", "remount,size=4m", step[1]], check=True)
        continue
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = importlib.import_module(step[0][:-3]).main(step[1])
        except BaseException as e:  # what escaped main(): a traceback in a real run
            code = f"raised {type(e).__name__}: {e}"
    results.append(dict(code=code, stdout=out.getvalue(), stderr=err.getvalue()))
print(json.dumps(results))
"""


@functools.cache
def private_tmpfs_mounts():
    """Whether this process may mount a small tmpfs in a private mount namespace (root and unshare -m): what the
    real full-disk cases of train.py, core_eval.py, data.py and fit.py need."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    with tempfile.TemporaryDirectory() as directory:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {directory}"],
                               capture_output=True, text=True)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def full_disks(pool, checkpoint, tmp_path_factory):
    """Run the three writers on full tmpfs mounts -> (results per call, the mounts' files copied to `kept`)."""
    d = tmp_path_factory.mktemp("full")
    mounts = {name: d / "mnt" / name for name in ("train", "eval", "pool")}
    for m in mounts.values():
        m.mkdir(parents=True)
    if not private_tmpfs_mounts():
        pytest.skip("no private mount namespace here (needs root and unshare -m): the real full-disk case cannot run")
    for rel, content in bundle_files().items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(content)
    run = [a.replace("{d}/pool", pool).replace("{d}/runs", str(mounts["train"])) for a in RUN]
    prep = [*PREP[:-4], "--train-tokens", "300000", "--val-tokens", "20000", "--workers", "1"]
    steps = [("train.py", [*run, "--save-every", "1"]),
             ("core_eval.py", ["--checkpoint", checkpoint, "--bundle-dir", str(d / "b"), "--seeds", "0",
                               "--out", str(mounts["eval"] / "eval.json")]),
             ("data.py", [*prep, "--out", str(mounts["pool"] / "p")]), ("grow", str(mounts["pool"])),
             ("data.py", [*prep, "--out", str(mounts["pool"] / "p")])]
    # 900k: one tiny checkpoint (~580 KB) fits, a second one next to it does not
    script = (f"mount -t tmpfs -o size=900k tmpfs {mounts['train']} && mount -t tmpfs -o size=64k tmpfs "
              f"{mounts['eval']} && mount -t tmpfs -o size=128k tmpfs {mounts['pool']} && "
              f"(head -c 1M /dev/zero > {mounts['eval']}/filler 2>/dev/null; true) && "
              f"{sys.executable} -c '{WRITERS_FULL_DISK_DRIVER}' {ROOT} '{json.dumps(steps)}'; code=$?; "
              f"cp -a {d / 'mnt'}/. {d / 'kept'}/; exit $code")
    (d / "kept").mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1]), d / "kept"


def one_line_refusal(result, *phrases):
    """Exit 2 and one error line, the last on stderr (core_eval's progress lines may come before it)."""
    lines = result["stderr"].splitlines()
    errors = [line for line in lines if "error" in line.lower() or "Traceback" in line]
    assert result["code"] == 2 and errors == lines[-1:], result
    for phrase in phrases:
        assert phrase in lines[-1], lines[-1]
    return lines[-1]


def leftovers(folder):
    return sorted(os.path.relpath(os.path.join(base, n), folder) for base, dirs, names in os.walk(folder)
                  for n in dirs + names if ".tmp" in n)


def test_class1_train_disk_full_on_a_real_filesystem(full_disks):
    """torch.save's RuntimeError on a full disk was a traceback; result.json stayed "running", latest.tmp stayed."""
    (failed, *_), kept = full_disks
    one_line_refusal(failed, "at step 2: No space left on device", "checkpoints/latest is kept", "--resume")
    import checkpoint
    run_dir = kept / "train" / "r"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and "No space left on device" in result["error"]
    assert leftovers(run_dir) == []
    checkpoint.verify_checkpoint(str(run_dir / "checkpoints" / "latest"))  # complete: the step-1 checkpoint
    assert json.loads((run_dir / "checkpoints" / "latest" / "meta.json").read_text())["step"] == 1


def test_class1_train_disk_full_marks_the_result_failed(pool_copy, tmp_path, monkeypatch):
    """A trajectory line that cannot be written (ENOSPC injected at step 2) stops with one line; result.json says
    failed and the checkpoint of step 1 is kept."""
    import errno
    import data
    import train
    log_step = train.log_step

    def full_at_step_2(run, trajectory, state, *rest):
        if state.step == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return log_step(run, trajectory, state, *rest)
    monkeypatch.setattr(train, "log_step", full_at_step_2)
    data.check_pool_hashes(str(pool_copy))  # the copy's hashes recorded: a run then leaves the pool as it is
    line = assert_refused("train.py", [*RUN, "--save-every", "1"], tmp_path, "No space left on device",
                          runner=run_in_process)
    assert "step 2" in line and "--resume" in line
    result = json.loads((tmp_path / "runs" / "r" / "result.json").read_text())
    assert result["status"] == "failed" and "No space left on device" in result["error"]
    assert json.loads((tmp_path / "runs" / "r" / "checkpoints" / "latest" / "meta.json").read_text())["step"] == 1


def test_class1_core_eval_disk_full_keeps_the_results(full_disks):
    """A finished evaluation whose eval.json did not fit was lost in a traceback."""
    (_, evaluation, _, _), kept = full_disks
    line = one_line_refusal(evaluation, "No space left on device", "eval.json")
    saved = line.split("saved in ")[1].split()[0].rstrip(";,")
    results = json.load(open(saved))
    os.remove(saved)
    assert "core_metric" in results and results["checkpoint"].endswith("final.pt")
    assert not (kept / "eval" / "eval.json").exists() and leftovers(kept / "eval") == []


def test_class1_prepare_disk_full_then_resumes(full_disks):
    """data.py prepare on a full disk was a traceback; now one line, and the same command resumes with more room."""
    (_, _, failed, resumed), kept = full_disks
    one_line_refusal(failed, "No space left on device", "re-run the same command")
    assert resumed["code"] == 0, resumed
    assert leftovers(kept / "pool") == []
    import data
    for split in data.SPLITS:
        data.load_pool(str(kept / "pool" / "p"), split, verify_hash=True)


# Class 6: what a checkpoint says about itself is cross-checked (meta.json vs model.pt vs the plan vs the tokenizer).
def rewrite_weights(latest, **changes):
    path = os.path.join(latest, "model.pt")
    weights = torch.load(path, map_location="cpu", weights_only=True)
    weights.update(changes)
    torch.save(weights, path)
    rehash(latest)


CLASS6_RESUME_CASES = [
    # meta.json's step 1 against model.pt's 2: resumed at step 1 with the weights of step 2, exit 0
    ("meta-step-disagrees-with-weights", lambda latest: edit_meta(latest, step=1),
     "meta.json says step 1 but model.pt holds step 2"),
    # model.pt recorded another tokenizer than the plan's: resumed silently
    ("weights-tokenizer-disagrees-with-plan", lambda latest: rewrite_weights(latest, tokenizer="gpt2"),
     "model.pt was written for tokenizer 'gpt2' but the plan uses 'bytes'"),
    # a damaged (rehashed) DCP shard: DCP's CheckpointException (a BaseException) escaped as a traceback
    ("dcp-shard-damaged", lambda latest: (truncate(os.path.join(latest, "muon", "__0_0.distcp")), rehash(latest)),
     "is not usable: muon/"),
]


@pytest.mark.parametrize("mutate, message", [c[1:] for c in CLASS6_RESUME_CASES],
                         ids=[c[0] for c in CLASS6_RESUME_CASES])
def test_class6_resume_cross_checks(pool, stopped_run, tmp_path, mutate, message):
    run_dir = os.path.join(tmp_path, "runs", "r")
    shutil.copytree(stopped_run, run_dir)
    mutate(os.path.join(run_dir, "checkpoints", "latest"))
    assert_refused("train.py", tiny_run_argv(pool, "--resume"), tmp_path, message, runner=run_in_process)


def test_class6_core_eval_vocabulary_disagrees_with_tokenizer(tmp_path, checkpoint):
    """A checkpoint of vocabulary 200 recorded with the byte tokenizer (257 ids): an IndexError inside the first
    task's forward before; now refused before the bundle is read."""
    import dataclasses
    import model
    cfg = model.config_for("vanilla", 1, width_per_depth=16, head_dim=16, seq_len=64, vocab_size=200)
    torch.save(dict(model_config=dataclasses.asdict(cfg), model=model.GPT(cfg).state_dict(), passes=1,
                    tokenizer="bytes", step=0), tmp_path / "final.pt")
    assert_refused("core_eval.py", [a.replace("{ckpt}", str(tmp_path / "final.pt")) for a in EVAL], tmp_path,
                   "has a vocabulary of 200 token ids but its tokenizer 'bytes' has 257", bundle_files(),
                   runner=run_in_process)


# Class 7: train.py checks the pool's recorded sha256 at start (hashed once, then recorded in the pool).
def test_class7_train_refuses_a_pool_corrupted_within_the_vocabulary(tmp_path, pool_copy):
    """Token 65 written over a byte token: in range, so the id check passes and the run trained on it before."""
    with open(pool_copy / "train.bin", "r+b") as f:
        f.seek(20)
        old = f.read(2)
        f.seek(20)
        f.write(bytes([(old[0] + 1) % 256, 0]))
    line = assert_refused("train.py", RUN, tmp_path, "train.bin does not match its sha256", runner=run_in_process)
    assert "--no-verify" in line
    assert not (tmp_path / "runs" / "r" / "result.json").exists()
    code, _ = run_in_process("train.py", [a.replace("{d}", str(tmp_path)) for a in [*RUN, "--stop-after", "1",
                                                                                  "--no-verify"]])
    assert code == 0


def test_class7_verified_pool_is_hashed_once_and_again_when_rewritten(tmp_path, pool_copy, monkeypatch):
    import data
    data.check_pool_hashes(str(pool_copy))  # hashes both splits and records them
    hashed = []
    monkeypatch.setattr(data, "sha256_file", lambda path: hashed.append(path) or "0" * 64)
    data.check_pool_hashes(str(pool_copy))
    assert hashed == []  # recorded: not hashed again
    stat = os.stat(pool_copy / "val.bin")
    with open(pool_copy / "val.bin", "r+b") as f:
        f.write(b"A\x00")
    os.utime(pool_copy / "val.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime
    with pytest.raises(data.DataError, match="val.bin does not match its sha256"):
        data.check_pool_hashes(str(pool_copy))

# --- numbers, environment values, SLURM and ladder values (issue 23: classes 2 and 5) ---
# Class 2: every numeric flag and environment variable has a declared range, checked where it is parsed
# (common.integer, common.number, common.env_integer; the knobs' ranges in arms.py). Class 5: ladder.sh's SLURM and
# environment values, and its run lists (arms.py ladder), are checked before anything runs.
DRY = ["--arch", "vanilla", "--depth", "8", "--dry-run"]
LADDER_DRY = ["--ladder-dry-run", "--gpus-per-node", "8"]

CLASS2_CASES = [  # (id, script, environment, argv, message)
    ("train-seed-beyond-int64", "train.py", {}, [*RUN, "--seed", str(2 ** 64)],
     "argument --seed: must be a whole number in [0, 9223372036854775807], got '18446744073709551616'"),
    ("train-seed-negative", "train.py", {}, [*DRY, "--seed=-1"], "argument --seed: must be a whole number in [0,"),
    ("train-depth-100000", "train.py", {}, ["--arch", "vanilla", "--depth", "100000", "--dry-run"],
     "argument --depth: must be a whole number in [1, 1024], got '100000'"),
    ("train-derived-steps-beyond-range", "train.py", {}, ["--arch", "vanilla", "--depth", "64", "--tpp", "1e6",
                                                         "--dry-run"], "steps, outside [1, 10,000,000]"),
    ("train-steps-beyond-range", "train.py", {}, [*DRY, "--steps", str(10 ** 12)], "argument --steps: must be"),
    ("train-gpu-memory-inf", "train.py", {}, [*DRY, "--gpu-memory", "inf"],
     "argument --gpu-memory: must be a finite number in (0, 65536], got 'inf'"),
    ("train-device-batch-size-not-clamped", "train.py", {}, [*DRY, "--device-batch-size", "1000000"],
     "micro-batch 1000000 does not divide the 32 sequences per rank"),
    ("train-nproc-per-node-abc", "train.py", {"NPROC_PER_NODE": "abc"}, DRY,
     "environment variable NPROC_PER_NODE must be a whole number in [1, 1024], got 'abc'"),
    ("train-nproc-per-node-zero", "train.py", {"NPROC_PER_NODE": "0"}, DRY, "NPROC_PER_NODE must be a whole number"),
    ("train-nnodes-abc", "train.py", {"NNODES": "two"}, DRY, "environment variable NNODES must be"),
    ("train-rank-abc", "train.py", {"RANK": "abc"}, RUN, "environment variable RANK must be a whole number"),
    ("train-adam-beta-one", "train.py", {}, [*DRY, "--adam-betas", "0.9", "1"],
     "argument --adam-betas: must be a finite number in [0, 1), got '1'"),
    ("train-warmdown-ratio-two", "train.py", {}, [*DRY, "--warmdown-ratio", "2"], "argument --warmdown-ratio: must be"),
    ("train-weight-decay-negative", "train.py", {}, [*DRY, "--weight-decay=-1"], "argument --weight-decay: must be"),
    ("train-pass-stages-not-increasing", "train.py", {}, ["--arch", "untied_grow", "--depth", "8", "--pass-stages",
                                                         "2", "4", "3", "--crossover-fractions", "0.3", "0.6",
                                                         "--dry-run"], "--pass-stages must increase"),
    ("train-random-passes-twice", "train.py", {}, ["--arch", "loop_grow", "--depth", "8", "--random-passes", "2", "2",
                                                  "4", "--dry-run"], "--random-passes names a value twice"),
    ("ladder-dry-run-mfu-five", "train.py", {}, [*LADDER_DRY, "--mfu", "5"], "argument --mfu: must be a finite "
                                                                             "number in (0, 1], got '5'"),
    ("ladder-dry-run-no-gpus", "train.py", {}, ["--ladder-dry-run", "--gpus-per-node", "0"],
     "argument --gpus-per-node: must be a whole number in [1, 1024]"),
    ("model-depth-100000", "model.py", {}, ["--arch", "vanilla", "--depth", "100000"], "argument --depth: must be"),
    ("data-train-tokens-zero", "data.py", {}, [*PREP[:-4], "--train-tokens", "0", "--val-tokens", "1000", "--out",
                                               "{d}/p"], "argument --train-tokens: must be a whole number in [1,"),
]


@pytest.mark.parametrize("script, env, argv, message", [c[1:] for c in CLASS2_CASES], ids=[c[0] for c in CLASS2_CASES])
def test_class2_numbers_and_environment_values(tmp_path, pool_copy, monkeypatch, script, env, argv, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.stdin", io.StringIO("a --arch vanilla --depth 6\n"))  # --ladder-dry-run's runs
    assert_refused(script, argv, tmp_path, message, runner=run_in_process)
    assert not os.path.exists(tmp_path / "runs" / "r") and not os.path.exists(tmp_path / "p")


CLASS2_CORE_EVAL_CASES = [  # (id, flags added to a valid evaluation of a one-task bundle, message)
    ("max-per-task-zero", ["--max-per-task", "0"],
     "argument --max-per-task: must be a whole number in [1, 1000000000] or all, got '0'"),
    ("max-per-task-negative", ["--max-per-task=-5"], "argument --max-per-task: must be"),
    ("kl-threshold-negative", ["--kl-threshold=-1"], "argument --kl-threshold: must be a finite number in (0, inf)"),
    ("seed-twice", ["--seeds", "0", "0"], "--seeds names a seed twice"),
]


@pytest.mark.parametrize("flags, message", [c[1:] for c in CLASS2_CORE_EVAL_CASES],
                         ids=[c[0] for c in CLASS2_CORE_EVAL_CASES])
def test_class2_core_eval_numbers(tmp_path, checkpoint, flags, message):
    argv = [a.replace("{ckpt}", checkpoint) for a in EVAL] + flags
    assert_refused("core_eval.py", argv, tmp_path, message, bundle_files(), runner=run_in_process)
    assert not os.path.exists(tmp_path / "eval.json")


def test_class2_ranges_accept_their_bounds_and_all(capsys):
    """The declared ranges are not tighter than the values they name: the largest seed trains (here: plans), and
    --max-per-task all is the whole suite."""
    import core_eval
    import train
    assert train.main([*DRY, "--seed", str(2 ** 63 - 1), "--adam-betas", "0", "0.999", "--warmdown-ratio", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["seed"] == 2 ** 63 - 1
    assert core_eval.parse_args(["--max-per-task", "all"]).max_per_task is None
    assert core_eval.parse_args(["--max-per-task", "7"]).max_per_task == 7


def ladder_with(env):
    """A runner for assert_refused: ladder.sh with these environment variables set (None: unset)."""
    def run(script, argv):
        environment = {k: v for k, v in dict(os.environ, **env).items() if v is not None}
        r = subprocess.run(["bash", script, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=environment)
        return r.returncode, r.stderr
    return run


def fake_scontrol(tmp_path, hosts):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\nprintf '%s' '" + "".join(h + "\n" for h in hosts) + "'\n")
    (bin_dir / "scontrol").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


SLURM_STEP = dict(SLURM_JOB_NODELIST="gpu-a[17-18]", SLURM_NNODES="2", SLURM_STEP_ID="0", SLURM_NODEID="1")
CLASS5_ENV_CASES = [  # (id, hosts scontrol lists, environment, message); all are dry runs
    ("slurm-nnodes-not-a-number", ["gpu-a17", "gpu-a18"], dict(SLURM_STEP, SLURM_NNODES="abc"),
     "environment variable SLURM_NNODES must be a whole number in [1, 65536], got 'abc'"),
    ("slurm-nodeid-beyond-the-nodes", ["gpu-a17", "gpu-a18"], dict(SLURM_STEP, SLURM_NODEID="2"),
     "environment variable SLURM_NODEID must be a whole number in [0, 1], got '2'"),
    ("slurm-nodeid-not-a-number", ["gpu-a17", "gpu-a18"], dict(SLURM_STEP, SLURM_NODEID="x"),
     "SLURM_NODEID must be a whole number"),
    ("scontrol-lists-no-hosts", [], SLURM_STEP, "listed 0 hosts but SLURM_NNODES is 2"),
    ("node-rank-beyond-the-nodes", [], dict(NNODES="2", NODE_RANK="2"),
     "environment variable NODE_RANK must be a whole number in [0, 1], got '2'"),
    ("master-port-not-a-port", [], dict(NNODES="2", MASTER_PORT="http"), "environment variable MASTER_PORT must be"),
]


@pytest.mark.parametrize("hosts, env, message", [c[1:] for c in CLASS5_ENV_CASES], ids=[c[0] for c in CLASS5_ENV_CASES])
def test_class5_slurm_and_environment_values(tmp_path, hosts, env, message):
    env = dict(env, PATH=fake_scontrol(tmp_path, hosts))
    assert_refused("ladder.sh", ["vanilla", "--dry-run"], tmp_path, message, runner=ladder_with(env))


CLASS5_LIST_CASES = [
    ("depth-twice", ["vanilla", "--depths", "1 1"], "--depths names 1 twice ('1 1'): that plans one run twice"),
    ("seed-twice", ["vanilla", "--seeds", "0 0"], "--seeds names 0 twice"),
    ("replicate-depth-not-in-depths", ["vanilla", "--depths", "6 8", "--seeds", "0 1", "--replicate-depths", "8 10"],
     "--replicate-depths 10 is not a depth of this ladder (its depths: 6 8)"),
    ("replicate-depth-not-in-the-preset", ["vanilla", "--seeds", "0 1", "--replicate-depths", "7"],
     "--replicate-depths 7 is not a depth of this ladder"),
    ("depth-zero", ["vanilla", "--depths", "0 6"], "--depths must be whole numbers, got '0' (each in [1, 1024])"),
    ("seed-beyond-int64", ["vanilla", "--seeds", str(2 ** 64)], "--seeds must be whole numbers"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in CLASS5_LIST_CASES], ids=[c[0] for c in CLASS5_LIST_CASES])
def test_class5_ladder_run_lists(tmp_path, argv, message):
    """What ladder.sh launches is what `python arms.py ladder` lists (ladder.sh passes its options through)."""
    target, *options = argv
    assert_refused("arms.py", ["ladder", target, *options], tmp_path, message, runner=run_in_process)


def test_class5_multi_node_run_needs_master_addr(tmp_path):
    """NNODES > 1 without MASTER_ADDR would point every node at its own 127.0.0.1: refused before torchrun starts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!/usr/bin/env bash\ntouch {tmp_path}/launched\n")
    (bin_dir / "torchrun").chmod(0o755)
    env = dict(NNODES="2", NODE_RANK="1", MASTER_ADDR=None, RUNS_DIR=str(tmp_path / "runs"),
               PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert_refused("ladder.sh", ["vanilla", "--preset", "cpu", "--depths", "1"], tmp_path, "NNODES=2 needs MASTER_ADDR",
                   runner=ladder_with(env))
    assert not (tmp_path / "launched").exists()


def test_class5_dry_run_into_a_closed_pipe_is_quiet(tmp_path):
    """The reader (head) leaves after the launch lines; the summary train.py prints then meets a closed pipe."""
    err = tmp_path / "err"
    r = subprocess.run(["bash", "-c", f'bash ladder.sh vanilla --preset cpu --depths "1 2" --dry-run 2>{err} '
                        '| head -n 2 >/dev/null; exit "${PIPESTATUS[0]}"'], cwd=ROOT, timeout=300)
    assert err.read_text() == "" and r.returncode == 141, (r.returncode, err.read_text())


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_class5_signal_stops_the_ladder_with_its_code(tmp_path, signum, code):
    """A torchrun that exits 1 when stopped (as the real one does), started by ladder.sh in the background (where
    SIGINT is ignored): the ladder stops it and exits 128 + the signal's number."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!/usr/bin/env bash\ntrap 'touch {tmp_path}/stopped; exit 1' TERM\n"
                                      f"echo $$ > {tmp_path}/started\nwhile true; do sleep 0.1; done\n")
    (bin_dir / "torchrun").chmod(0o755)
    proc = subprocess.Popen(["bash", "ladder.sh", "vanilla", "--preset", "cpu", "--depths", "1"], cwd=ROOT,
                            env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RUNS_DIR=str(tmp_path)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "started").exists() and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signum)
        assert proc.wait(timeout=10) == code
        assert (tmp_path / "stopped").exists(), "the training process was not stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):  # a torchrun left behind
            os.kill(int((tmp_path / "started").read_text()), signal.SIGKILL)

# --- fit.py (issue 23) ---
# class 1 (disk full), class 2 (numeric flags out of range), class 3 (design specs), class 4 (duplicated and
# conflicting rows). Each case runs fit.py in-process unless it needs its own filesystem.
FIT_FULL_DISK_DRIVER = """
import contextlib, io, json, os, sys
sys.path.insert(0, os.getcwd())
import fit
mnt, csv = sys.argv[1], sys.argv[2]
def run(out):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = fit.main(["ladders", csv, "--out", out])
    return code, err.getvalue()
def listing(d):
    return {n: open(os.path.join(d, n), "rb").read().hex() for n in sorted(os.listdir(d))} if os.path.isdir(d) else None
first = run(os.path.join(mnt, "figs"))
fs = os.statvfs(mnt)
assert fs.f_blocks * fs.f_frsize <= 16 * 2 ** 20, f"{mnt} is not the small tmpfs this test fills"
with open(os.path.join(mnt, "filler"), "wb", buffering=0) as f:  # fill the filesystem to the last byte
    try:
        while True:
            f.write(b"\\0" * 4096)
    except OSError:
        pass
before = listing(os.path.join(mnt, "figs"))
again, fresh = run(os.path.join(mnt, "figs")), run(os.path.join(mnt, "new"))
print(json.dumps(dict(first=first, again=again, fresh=fresh, same=listing(os.path.join(mnt, "figs")) == before,
                      names=sorted(before), new=listing(os.path.join(mnt, "new")))))
"""


@pytest.mark.skipif(not private_tmpfs_mounts(), reason="needs root and unshare for a private tmpfs")
def test_class1_fit_out_on_a_real_full_filesystem(tmp_path):
    # a 1 MiB tmpfs in a private mount namespace: the first --out fits, then the disk is filled; rewriting the figures
    # and writing into a fresh directory both stop with one line, leaving the earlier files and manifest as they were
    (tmp_path / "l.csv").write_text(ladder_csv())
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f'mount -t tmpfs -o size=1m tmpfs "{mnt}" && exec "{sys.executable}" -c "$0" "{mnt}" "{tmp_path}/l.csv"'
    r = subprocess.run(["unshare", "-m", "sh", "-c", script, FIT_FULL_DISK_DRIVER], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["first"][0] == 0 and out["names"] == sorted(["fit_manifest.json", "fig3_ladders.png", "fig3_ladders.pdf",
                                                            "fig2_left.png", "fig2_left.pdf"])
    for code, err in (out["again"], out["fresh"]):
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("fit.py: error: cannot write into --out") and "No space left on device" in err, err
    assert out["same"] and out["new"] in (None, {}), "a partial file or manifest was left behind"


def test_class1_fit_out_disk_full_inside_a_figure_write(tmp_path, monkeypatch):
    # the same contract where no tmpfs can be mounted: ENOSPC raised after half of the second file is written
    import errno
    from matplotlib.figure import Figure
    save, calls = Figure.savefig, []

    def full_disk(self, path, **kw):
        calls.append(path)
        if len(calls) == 2:
            open(path, "wb").write(b"half a figure")
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(self, path, **kw)
    monkeypatch.setattr(Figure, "savefig", full_disk)
    line = assert_refused("fit.py", ["ladders", "{d}/l.csv", "--out", "{d}/figs"], tmp_path,
                          "No space left on device", GOOD, runner=run_in_process)
    assert line.startswith("fit.py: error: cannot write into --out") and not os.path.exists(tmp_path / "figs")


def surface_csv(rows=()):
    """A 4 x 4 (N, D) grid on a Chinchilla law, plus extra raw CSV rows."""
    grid = [f"{N:g},{D:g},{1.5 + 1000 / N ** 0.4 + 2000 / D ** 0.3:.6f}"
            for N in (1e8, 2e8, 4e8, 8e8) for D in (1e9, 2e9, 4e9, 8e9)]
    return "\n".join(["N,D,loss", *grid, *rows]) + "\n"


TWO_ARM_PLAN = PLAN + "".join(json.dumps(dict(arch="other", depth=d, total_flops=1e18 * d)) + "\n" for d in (6, 8, 10, 12))
FLAG_FILES = dict(GOOD, **{"s.csv": surface_csv(), "p.jsonl": PLAN, "p2.jsonl": TWO_ARM_PLAN, "pilot.json": PILOT})
SURFACE = ["surface", "{d}/s.csv"]
LADDERS = ["ladders", "{d}/l.csv"]
DESIGN = ["design", "{d}/p.jsonl", "--truth", "{d}/pilot.json", "--noise", "0.002"]
SEED_RANGE = "must be a whole number in [0, 9223372036854775807]"
FIT_FLAG_RANGE_CASES = [
    ("surface-folds-zero", [*SURFACE, "--folds", "0"], "--folds: must be a whole number >= 2, got '0'"),
    ("surface-folds-one", [*SURFACE, "--folds", "1"], "--folds: must be a whole number >= 2, got '1'"),
    ("surface-folds-negative", [*SURFACE, "--folds=-2"], "--folds: must be a whole number >= 2, got '-2'"),
    ("surface-folds-more-than-points", [*SURFACE, "--folds", "100"], "--folds 100: {d}/s.csv has 9 interpolation points"),
    ("surface-holdout-nan", [*SURFACE, "--holdout", "nan"], "--holdout: must be a finite number in (0, 1), got 'nan'"),
    ("surface-holdout-two", [*SURFACE, "--holdout", "2"], "--holdout: must be a finite number in (0, 1), got '2'"),
    ("surface-seed-negative", [*SURFACE, "--seed=-1"], f"--seed: {SEED_RANGE}, got '-1'"),
    ("surface-hops-negative", [*SURFACE, "--hops=-3"], "--hops: must be a whole number in [0, 100000], got '-3'"),
    ("surface-budgets-nan", [*SURFACE, "--budgets", "nan"], "--budgets: must be a finite number > 0, got 'nan'"),
    ("surface-delta-inf", [*SURFACE, "--delta", "inf"], "--delta: must be a finite number > 0"),
    ("surface-drop-highest-negative", [*SURFACE, "--drop-highest=-1"], "--drop-highest: must be a whole number >= 0"),
    ("ladders-anchor-depth-zero", [*LADDERS, "--anchor-depth", "0"], "--anchor-depth: must be a whole number >= 1"),
    ("ladders-bootstrap-huge", [*LADDERS, "--bootstrap", "10000000"], "--bootstrap: must be a whole number in [0, 100000]"),
    ("ladders-bootstrap-fraction", [*LADDERS, "--bootstrap", "2.5"], "--bootstrap: must be a whole number"),
    ("ladders-seed-beyond-int64", [*LADDERS, "--seed", str(2 ** 64)], f"--seed: {SEED_RANGE}"),
    ("ladders-noise-above-one", [*LADDERS, "--noise", "1.5"], "--noise: must be a finite number in (0, 1), got '1.5'"),
    ("ladders-noise-inf", [*LADDERS, "--noise", "inf"], "--noise: must be a finite number in (0, 1)"),
    ("design-mfu-zero", [*DESIGN, "--mfu", "0"], "--mfu: must be a finite number in (0, 1], got '0'"),
    ("design-delta-gamma-beyond-one", [*DESIGN, "--delta-gamma", "5"], "--delta-gamma: must be a finite number in (-1, 1)"),
    ("design-delta-gamma-makes-gamma-negative", ["design", "{d}/p2.jsonl", "--truth", "{d}/pilot.json", "--noise",
                                                 "0.002", "--delta-gamma=-0.5"], "gives other a true gamma of -0.39"),
    ("design-sims-few", [*DESIGN, "--sims", "5"], "--sims: must be a whole number in [20, 100000], got '5'"),
    ("design-sims-huge", [*DESIGN, "--sims", "100000000"], "--sims: must be a whole number in [20, 100000]"),
    ("design-seed-negative", [*DESIGN, "--seed=-1"], f"--seed: {SEED_RANGE}"),
    ("design-peak-flops-zero", [*DESIGN, "--peak-flops", "0"], "--peak-flops: must be a finite number > 0"),
    ("design-noise-nan", [*DESIGN[:-1], "nan"], "--noise: must be a finite number in (0, 1)"),
    ("design-E-negative", ["design", "{d}/p.jsonl", "--E=-1", "--gamma", "0.1", "--A", "1", "--noise", "0.002"],
     "--E: must be a finite number > 0"),
    ("design-gamma-inf", ["design", "{d}/p.jsonl", "--E", "1", "--gamma", "inf", "--A", "1", "--noise", "0.002"],
     "--gamma: must be a finite number > 0"),
    ("design-truth-gamma-nan", ["design", "{d}/p.jsonl", "--truth", "{d}/nan.json", "--noise", "0.002"],
     "all finite and > 0"),
    ("downstream-target-above-one", ["downstream", "{d}/l.csv", "--targets", "1.5"],
     "--targets: must be a finite number in (0, 1), got '1.5'"),
    ("downstream-at-zero", ["downstream", "{d}/l.csv", "--at", "0"], "--at: must be a finite number > 0"),
    ("loops-wd-negative", ["loops", "{d}/l.csv", "--wd=-1"], "--wd: must be a finite number >= 0, got '-1'"),
    ("loops-wd-nan", ["loops", "{d}/l.csv", "--wd", "nan"], "--wd: must be a finite number >= 0, got 'nan'"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in FIT_FLAG_RANGE_CASES], ids=[c[0] for c in FIT_FLAG_RANGE_CASES])
def test_class2_fit_numeric_flag_out_of_range(tmp_path, argv, message):
    files = dict(FLAG_FILES, **{"nan.json": PILOT.replace("0.11", "NaN")})
    assert_refused("fit.py", argv, tmp_path, message.replace("{d}", str(tmp_path)), files, runner=run_in_process)


def test_class2_fit_flag_ranges_accept_their_ends(tmp_path, capsys):
    # the declared ends are inclusive where the message says so: --mfu 1, --folds 2, --drop-highest 0, --bootstrap 0
    (tmp_path / "p.jsonl").write_text(PLAN)
    (tmp_path / "pilot.json").write_text(PILOT)
    (tmp_path / "s.csv").write_text(surface_csv())
    import fit
    assert fit.main(["design", f"{tmp_path}/p.jsonl", "--truth", f"{tmp_path}/pilot.json", "--noise", "0.002",
                     "--mfu", "1", "--sims", "20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mfu"] == 1.0
    assert fit.main(["surface", f"{tmp_path}/s.csv", "--form", "chinchilla", "--hops", "0", "--folds", "2",
                     "--drop-highest", "0", "--json"]) == 0


FIT_DESIGN_SPEC_CASES = [
    ("top-zero", ["--design", "x3@top0"], "'x3@top0' needs topK with K >= 1"),
    ("depth-not-in-plan", ["--design", "x3@99"], "'x3@99' names depth 99, but no planned run has it"),
    ("zero-seeds", ["--design", "x0"], "'x0' asks for 0 seeds; give 1 to 100"),
    ("too-many-seeds", ["--design", "x1000"], "'x1000' asks for 1000 seeds"),
    ("unknown-token", ["--design", "d6-12 y3"], "'y3' is not a design token; use 'd6-18'"),
    ("empty-depth-list", ["--design", "x3@"], "'x3@' is not a design token"),
    ("range-backwards", ["--design", "d12-6"], "'d12-6' runs backwards; write d6-12"),
    ("range-end-not-planned", ["--design", "d6-22"], "'d6-22' asks for depth 22, but no planned run has depth 22"),
    ("two-ranges", ["--design", "d6-10 d8-12"], "'d8-12' is a second depth range"),
    ("two-seed-counts", ["--design", "x3 x2@8"], "'x2@8' is a second seed count"),
    ("seeds-outside-range", ["--design", "d6-8 x3@12"], "seeds at depth 12 lie outside d6-8"),
    ("delta-gamma-nan", ["--delta-gamma", "nan"], "--delta-gamma: must be a finite number in (-1, 1), got 'nan'"),
    ("mfu-five", ["--mfu", "5"], "--mfu: must be a finite number in (0, 1], got '5'"),
]


@pytest.mark.parametrize("extra, message", [c[1:] for c in FIT_DESIGN_SPEC_CASES], ids=[c[0] for c in FIT_DESIGN_SPEC_CASES])
def test_class3_fit_design_spec_refused(tmp_path, extra, message):
    assert_refused("fit.py", [*DESIGN, *extra], tmp_path, message, {"p.jsonl": PLAN, "pilot.json": PILOT},
                   runner=run_in_process)


@pytest.mark.parametrize("line, message", [
    ('{"arch": "vanilla", "depth": 0, "total_flops": 1e18}', "p.jsonl:5: depth must be a whole number >= 1"),
    ('{"arch": "vanilla", "depth": "14", "total_flops": 1e18}', "p.jsonl:5: not a train.py --dry-run plan"),
    ('{"arch": 7, "depth": 14, "total_flops": 1e18}', "p.jsonl:5: not a train.py --dry-run plan"),
    ('{"arch": "vanilla", "depth": 14, "total_flops": -1}', "p.jsonl:5: depth must be a whole number >= 1, seeds"),
], ids=["depth-zero", "depth-string", "arch-number", "negative-flops"])
def test_class3_fit_design_plan_lines_refused(tmp_path, line, message):
    assert_refused("fit.py", DESIGN, tmp_path, message, {"p.jsonl": PLAN + line + "\n", "pilot.json": PILOT},
                   runner=run_in_process)


def test_class3_fit_design_specs_give_the_seeds_they_name(tmp_path, capsys):
    import fit
    (tmp_path / "p.jsonl").write_text(TWO_ARM_PLAN.replace('"other", "depth": 12', '"other", "depth": 14'))
    (tmp_path / "pilot.json").write_text(PILOT)
    assert fit.main([*(a.replace("{d}", str(tmp_path)) for a in DESIGN), "--delta-gamma", "0.004", "--sims", "20",
                     "--design", "x3@top1", "--design", "d6-10 x2@8,10", "--json"]) == 0
    top1, ranged = json.loads(capsys.readouterr().out)["designs"]
    assert top1["depths"] == {"vanilla": {"6": 1, "8": 1, "10": 1, "12": 3}, "other": {"6": 1, "8": 1, "10": 1, "14": 3}}
    assert ranged["depths"] == {"vanilla": {"6": 1, "8": 2, "10": 2}, "other": {"6": 1, "8": 2, "10": 2}}


def loop_grid_csv(rows=(), best_wd=lambda depth: 0.8):
    """A small loop grid (depths 4..10, loops 1/2/4, WD 0.4/0.8/1.6) whose loss is lowest at best_wd(depth)."""
    import math
    lines = ["depth,loops,weight_decay,compute_flops,val_loss"]
    for d in (4, 6, 8, 10):
        for K in (1, 2, 4):
            for wd in (0.4, 0.8, 1.6):
                C = d ** 2 * K * 1e16
                loss = 3.0 - 0.1 * math.log(d ** 2 * K) + 0.01 * (K - 2) ** 2 + 0.01 * math.log2(wd / best_wd(d)) ** 2
                lines.append(f"{d},{K},{wd},{C:g},{loss:.6f}")
    return "\n".join(lines + list(rows)) + "\n"


def sweep_csv(header, rows):
    return "\n".join([header] + [",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r) for r in rows]) + "\n"


TPP_ROWS = [(C, t, 1.1 + 0.05 * (t - o) ** 2 / o ** 2) for C, o in ((1e18, 5.0), (3e18, 5.5), (1e19, 6.0)) for t in (2.0, 3.5, 5.0, 8.0)]
GROWTH_ROWS = [(d, 1e18 * d, r, 3.0 + 0.1 * (r - 0.5) ** 2) for d in (8, 9) for r in (0.2, 0.4, 0.6, 0.8)]
LR_ROWS = [(n, v, 1.2 + 0.02 * (v / (0.04 * (n / 1e8) ** -0.7) - 1) ** 2) for n in (1e8, 2e8, 4e8) for v in (0.01, 0.02, 0.04, 0.08)]
DOWN_ROWS = [(arm, C, 0.3 * s, 3.0 * s * (C / 1e18) ** -0.1 + 1.0, 0.5 - 0.1 * s * (C / 1e18) ** -0.1)
             for arm, s in (("vanilla", 1.0), ("better", 0.9)) for C in (1e17, 1e18, 1e19, 1e20)]
# reader -> (file, its text, argv, the line repeated, that line with a different result)
FIT_READERS = {
    "loops": ("g.csv", loop_grid_csv(), ["loops", "{d}/g.csv", "--budgets", "8e17"], "6,2,0.8,7.2e+17,2.5",
              "6,2,0.8,7.2e+17,2.6"),
    "surface": ("s.csv", surface_csv(), ["surface", "{d}/s.csv", "--form", "chinchilla", "--hops", "0", "--folds", "2"],
                None, None),
    "tpp": ("t.csv", sweep_csv("compute_flops,tpp,val_loss", TPP_ROWS), ["tpp", "{d}/t.csv"], None, None),
    "growth": ("g.csv", sweep_csv("depth,compute_flops,rho,val_loss", GROWTH_ROWS), ["growth", "{d}/g.csv"], None, None),
    "lr": ("r.csv", sweep_csv("params,value,val_loss", LR_ROWS), ["lr", "{d}/r.csv"], None, None),
    "downstream": ("c.csv", sweep_csv("arm,compute_flops,core,nll:t,acc:t", DOWN_ROWS),
                   ["downstream", "{d}/c.csv", "--targets", "0.2"], None, None),
}


def repeated(reader, conflicting):
    """The reader's file with one of its rows given twice: identically, or with a different last value."""
    name, text, argv, _, _ = FIT_READERS[reader]
    lines = text.splitlines()
    row = lines[3]
    if conflicting:
        *rest, last = row.split(",")
        row = ",".join(rest + [f"{float(last) * 1.01:.6g}"])
    return name, "\n".join(lines + [row]) + "\n", lines[3], argv


@pytest.mark.parametrize("reader", FIT_READERS)
def test_class4_fit_conflicting_rows_are_an_error_naming_both(tmp_path, reader):
    name, text, _, argv = repeated(reader, conflicting=True)
    n = len(text.splitlines())
    line = assert_refused("fit.py", argv, tmp_path, f"{tmp_path}/{name}:{n} and {tmp_path}/{name}:4: two different "
                          "results for", {name: text}, runner=run_in_process)
    assert line.endswith("; remove one")


@pytest.mark.parametrize("reader", FIT_READERS)
def test_class4_fit_identical_rows_warn_and_count_once(tmp_path, reader):
    name, text, _, argv = repeated(reader, conflicting=False)
    once = tmp_path / "once"
    once.mkdir()
    (once / name).write_text(FIT_READERS[reader][1])
    (tmp_path / name).write_text(text)
    outputs = []
    for d in (once, tmp_path):
        code, (err, out) = run_in_process_with_stdout("fit.py", [a.replace("{d}", str(d)) for a in argv] + ["--json"])
        assert code == 0, err
        outputs.append((json.loads(out), err))
    (first, err_once), (second, err_twice) = outputs
    assert first == second and "repeats" not in err_once
    assert f"{tmp_path}/{name}:{len(text.splitlines())} repeats {tmp_path}/{name}:4" in err_twice
    assert "exactly; kept one" in err_twice


def run_in_process_with_stdout(script, argv):
    module = importlib.import_module(script[:-3])
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = module.main(argv)
    return code, (err.getvalue(), out.getvalue())


def test_class4_fit_surface_drop_highest_drops_distinct_runs(tmp_path, capsys):
    # a repeated high-loss run counts once, so --drop-highest 2 removes the two highest distinct runs
    import fit
    text = surface_csv(["1e+08,1e+09,9.0", "2e+08,1e+09,8.0", "1e+08,1e+09,9.0"])
    (tmp_path / "s.csv").write_text(text)
    assert fit.main(["surface", str(tmp_path / "s.csv"), "--form", "chinchilla", "--hops", "0", "--folds", "2",
                     "--drop-highest", "2", "--json"]) == 2
    assert "two different results for N 1e+08, D 1e+09" in capsys.readouterr().err  # the grid already has that (N, D)
    (tmp_path / "s.csv").write_text(surface_csv(["1e+09,1e+09,9.0", "2e+09,1e+09,8.0", "1e+09,1e+09,9.0"]))
    assert fit.main(["surface", str(tmp_path / "s.csv"), "--form", "chinchilla", "--hops", "0", "--folds", "2",
                     "--drop-highest", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert sorted(d["loss"] for d in json.loads(out)["dropped"]) == [8.0, 9.0] and "exactly; kept one" in err


def test_class4_fit_loops_runs_repeated_and_wd_edge_flagged(tmp_path, capsys):
    import fit
    grid = loop_grid_csv(best_wd=lambda d: 1.6 if d == 10 else 0.8)  # d10's tuned optimum sits at the grid's end
    (tmp_path / "g.csv").write_text(grid)
    assert fit.main(["loops", str(tmp_path / "g.csv"), "--budgets", "8e17", "--json"]) == 0
    out, err = capsys.readouterr()
    tuned = {t["depth"]: t for t in json.loads(out)["operator_1_tuned"]}
    assert tuned[10]["wd_at_grid_edge"] and tuned[10]["weight_decay"] == 1.6
    assert not any(tuned[d]["wd_at_grid_edge"] for d in (4, 6, 8))
    assert "edge of the swept grid at d10 (WD 1.6 of 0.4..1.6)" in err and "d8 (" not in err
    # the same grid as train.py runs: two result.json files for one grid point with different losses are refused
    for i, row in enumerate(grid.splitlines()[1:] + ["6,2,0.8,7.2e+17,2.6"]):
        d, K, wd, C, loss = (float(v) for v in row.split(","))
        os.makedirs(tmp_path / "runs" / str(i))
        with open(tmp_path / "runs" / str(i) / "result.json", "w") as f:
            json.dump(dict(status="complete", estimated_matrix_flops=C, final_val_loss=loss,
                           plan=dict(depth=d, passes_final=K, weight_decay=wd, data_constrained="fixed-wd")), f)
    assert fit.main(["loops", str(tmp_path / "runs")]) == 2
    assert "two different results for depth 6, loops 2, weight_decay 0.8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fit.main(["loops", "-h"])
    assert "default 0.8" in capsys.readouterr().out


def test_class4_fit_design_plans_repeated_across_files(tmp_path):
    line = json.dumps(dict(arch="vanilla", depth=8, total_flops=2e18))
    files = {"p.jsonl": PLAN, "q.jsonl": line + "\n", "pilot.json": PILOT}
    assert_refused("fit.py", ["design", "{d}/p.jsonl", "{d}/q.jsonl", *DESIGN[2:]], tmp_path, f"{tmp_path}/q.jsonl:1 and {tmp_path}/p.jsonl:2: two "
                   "different plans for vanilla d8", files, runner=run_in_process)


# --- fit.py: glob characters in paths, mixed recipes or pools, runs that are not a loop grid, duplicate columns,
# ignored or impossible inputs, messages that misname the problem
def ladder_runs(root, arm="vanilla", depths=range(6, 14, 2), **plan):
    """Complete train.py runs of one arm under ROOT (one folder per depth) on an exact law; plan: plan fields to
    change."""
    for d in depths:
        C = 1e18 * (d / 8) ** 4.5
        os.makedirs(os.path.join(root, f"{arm}_d{d}"))
        with open(os.path.join(root, f"{arm}_d{d}", "result.json"), "w") as f:
            f.write(result_json(arch=arm, depth=d, estimated_training_flops=C, estimated_matrix_flops=0.9 * C,
                                final_val_loss=1.7 + 1.6 * (C / 1e18) ** -0.11,
                                plan=dict(dict(seed=42, depth=d, passes_final=1, weight_decay=0.07,
                                               data_constrained=None), **plan)))


def loop_runs(root, **plan):
    """loop_grid_csv's grid as complete data-constrained train.py runs under ROOT; plan: plan fields to change."""
    for i, row in enumerate(loop_grid_csv().splitlines()[1:]):
        d, K, wd, C, loss = (float(v) for v in row.split(","))
        os.makedirs(os.path.join(root, str(i)))
        with open(os.path.join(root, str(i), "result.json"), "w") as f:
            f.write(result_json(arch="operator_1", depth=int(d), estimated_matrix_flops=C, final_val_loss=loss,
                                plan=dict(dict(depth=d, passes_final=K, weight_decay=wd, data_constrained="fixed-wd"),
                                          **plan)))


@pytest.mark.parametrize("command, runs", [("ladders", ladder_runs), ("loops", loop_runs)])
def test_fit_glob_characters_in_a_run_folder_name_are_literal(tmp_path, command, runs):
    # 'exp[12]' is a folder name, not the character class [12]: its sibling exp1 must not be read in its place
    runs(tmp_path / "g" / "exp1")
    os.makedirs(tmp_path / "g" / "exp[12]")
    assert_refused("fit.py", [command, "{d}/g/exp[12]"], tmp_path, "exp[12]", runner=run_in_process)


def with_column(text, name, value):
    """TEXT (a CSV) with one more column NAME holding VALUE in every row."""
    header, *rows = text.splitlines()
    return "\n".join([f"{header},{name}"] + [f"{r},{value}" for r in rows]) + "\n"


@pytest.mark.parametrize("name, text, argv, column", [
    ("l.csv", with_column(ladder_csv(), "val_loss", 9.9), ["ladders", "{d}/l.csv"], "val_loss"),
    ("s.csv", with_column(surface_csv(), "D", 1), ["surface", "{d}/s.csv"], "D"),
    ("g.csv", with_column(loop_grid_csv(), "loops", 1), ["loops", "{d}/g.csv"], "loops"),
    ("p.csv", with_column("arm,depth,compute_flops\nvanilla,8,1e18\n", "arm", "other"),
     ["design", "{d}/p.csv", "--E", "1.7", "--gamma", "0.1", "--A", "1", "--noise", "0.01"], "arm"),
], ids=["ladders", "surface", "loops", "design"])
def test_fit_csv_column_named_twice_is_refused(tmp_path, name, text, argv, column):
    # csv.DictReader keeps the last of two columns with one name: the fit silently used the other numbers
    assert_refused("fit.py", argv, tmp_path, f"{name}: column {column} appears twice in the header; keep one",
                   {name: text}, runner=run_in_process)


def test_fit_loops_refuses_runs_that_are_not_a_loop_grid(tmp_path):
    # a vanilla ladder read as a loop grid printed "loop scaling needs 9.58x less compute" with exit 0
    ladder_runs(tmp_path / "runs")
    assert_refused("fit.py", ["loops", "{d}/runs"], tmp_path, "is not a loop-grid run (its plan's data_constrained is "
                   "None)", runner=run_in_process)


@pytest.mark.parametrize("grid", ["csv", "runs"])
def test_fit_loops_refuses_a_grid_where_no_budget_can_be_fitted(tmp_path, grid):
    # only K = 1 (or budgets outside the grid): every budget was skipped, yet the gains were printed with exit 0
    if grid == "csv":
        k1 = [r for r in loop_grid_csv().splitlines() if r.split(",")[1] in ("loops", "1")]
        (tmp_path / "g.csv").write_text("\n".join(k1) + "\n")
        argv = ["loops", "{d}/g.csv"]
    else:
        loop_runs(tmp_path / "runs")
        argv = ["loops", "{d}/runs", "--budgets", "1e30"]
    assert_refused("fit.py", argv, tmp_path, "no budget could be fitted at weight decay 0.8", runner=run_in_process)


POOL = dict(corpus="fineweb", tokenizer="gpt2", budgets=dict(train=10 ** 9, val=10 ** 7), created="2025-01-01T00:00:00",
            splits=dict(train=dict(token_count=10 ** 9, sha256="a" * 64), val=dict(token_count=10 ** 7, sha256="b" * 64)))


def planned_runs(root, runs, pool=POOL):
    """Complete runs under ROOT with train.py's real plans: runs = {name: train.py arguments}, the loss on a law."""
    import train
    for name, argv in runs.items():
        plan = train.make_plan(train.parse_args(argv)).as_dict()
        C = plan["total_flops"]
        os.makedirs(os.path.join(root, name))
        with open(os.path.join(root, name, "result.json"), "w") as f:
            f.write(result_json(arch=plan["arch"], depth=plan["depth"], plan=plan, data_manifest=pool,
                                estimated_training_flops=C, estimated_matrix_flops=0.9 * C,
                                final_val_loss=1.7 + 1.6 * (C / 1e18) ** -0.11 + 0.01 * plan["passes_final"]))


LADDER_RUNS = {f"vanilla_d{d}": ["--arch", "vanilla", "--depth", str(d), "--preset", "cpu"] for d in (1, 2, 3, 4)}
OTHER_POOL = dict(POOL, splits=dict(POOL["splits"], train=dict(token_count=10 ** 9, sha256="c" * 64)))


@pytest.mark.parametrize("extra, pool, field", [
    ([], OTHER_POOL, "data_manifest.splits.train.sha256"),
    (["--lr-multiplier", "30"], POOL, "matrix_lr x params_tpp^lr_exponent"),
    (["--tpp", "10"], POOL, "tpp"),
    (["--warmup-steps", "0"], POOL, "warmup_steps"),
], ids=["other-pool", "lr-multiplier", "tpp", "warmup"])
def test_fit_ladders_refuses_runs_of_one_arm_with_different_recipes_or_pools(tmp_path, extra, pool, field):
    # such a run was fitted into the arm's ladder as if it were one more depth
    planned_runs(tmp_path / "runs", LADDER_RUNS)
    planned_runs(tmp_path / "more", {"vanilla_d5": LADDER_RUNS["vanilla_d1"][:3] + ["5", "--preset", "cpu", *extra]},
                 pool)
    line = assert_refused("fit.py", ["ladders", "{d}/runs", "{d}/more", "--anchor-depth", "3"], tmp_path,
                          f"{tmp_path}/more/vanilla_d5/result.json: vanilla runs with different {field} (",
                          runner=run_in_process)
    assert line.startswith(f"fit.py: error: {tmp_path}/runs/vanilla_d1/result.json and ") and "fit them separately" in line


def test_fit_loops_refuses_grid_runs_with_different_recipes(tmp_path):
    grid = {f"dc_{wd}_d{d}_k{k}": ["--arch", "operator_1", "--depth", str(d), "--passes", str(k), "--data-constrained",
                                   wd, "--preset", "cpu"] for wd in ("fixed-wd", "tuned-wd") for d in (2, 3) for k in (1, 2)}
    grid["dc_fixed-wd_d4_k1"] = grid["dc_fixed-wd_d2_k1"][:3] + ["4"] + grid["dc_fixed-wd_d2_k1"][4:] + [
        "--train-token-limit", "2000000"]
    planned_runs(tmp_path / "runs", grid)
    assert_refused("fit.py", ["loops", "{d}/runs"], tmp_path, "loop-grid runs with different train_token_limit",
                   runner=run_in_process)


GROWTH = "depth,compute_flops,rho,val_loss\n" + "".join(f"{d},{1e18 * d:g},{r},{3.0 + 0.1 * (r - 0.5) ** 2:.6f}\n"
                                                        for d in (8, 9) for r in (0.2, 0.4, 0.6, 0.8))
DOWNSTREAM = sweep_csv("arm,compute_flops,core,nll:t,acc:t", DOWN_ROWS)


def surface_with_compute(factor):
    """surface_csv with a compute column of FACTOR x 6 N D."""
    header, *rows = surface_csv().splitlines()
    return "\n".join([f"{header},compute"] + [f"{r},{factor * 6 * float(r.split(',')[0]) * float(r.split(',')[1]):g}"
                                              for r in rows]) + "\n"


IGNORED_CASES = [
    ("design-truth-and-E", {"p.jsonl": PLAN, "pilot.json": PILOT}, [*DESIGN, "--E", "99", "--gamma", "5", "--A", "1e-9"],
     "--truth {d}/pilot.json gives the true curves and --E/--gamma/--A would be ignored"),
    ("design-truth-and-A", {"p.jsonl": PLAN, "pilot.json": PILOT}, [*DESIGN, "--A", "2"], "and --A would be ignored"),
    ("growth-rho-negative", {"g.csv": GROWTH.replace(",0.2,", ",-0.5,")}, ["growth", "{d}/g.csv"],
     "g.csv:2: column rho is -0.5; it is a fraction, need a number in [0, 1]"),
    ("growth-rho-above-one", {"g.csv": GROWTH.replace(",0.8,", ",1.5,")}, ["growth", "{d}/g.csv"],
     "g.csv:5: column rho is 1.5; it is a fraction"),
    ("downstream-reference-arm-missing", {"c.csv": DOWNSTREAM}, ["downstream", "{d}/c.csv", "--reference-arm", "nosuch"],
     "reference arm 'nosuch' not in {d}/c.csv (arms: vanilla, better)"),
    ("downstream-nll-without-acc", {"c.csv": with_column(DOWNSTREAM, "nll:b", 2.0)}, ["downstream", "{d}/c.csv"],
     "c.csv: column nll:b has no acc:b"),
    ("downstream-acc-without-nll", {"c.csv": with_column(DOWNSTREAM, "acc:c", 0.1)}, ["downstream", "{d}/c.csv"],
     "c.csv: column acc:c has no nll:c"),
    ("surface-compute-100x-6ND", {"s.csv": surface_with_compute(100)},
     ["surface", "{d}/s.csv"], "s.csv:2: compute is 100x 6 N D; the fit uses D"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in IGNORED_CASES], ids=[c[0] for c in IGNORED_CASES])
def test_fit_ignored_or_impossible_inputs_are_refused(tmp_path, files, argv, message):
    assert_refused("fit.py", argv, tmp_path, message.replace("{d}", str(tmp_path)), files, runner=run_in_process)


def test_fit_holdout_named_twice_says_so(tmp_path):
    # the point exists; the message said "no vanilla d6 point in the inputs"
    assert_refused("fit.py", ["ladders", "{d}/l.csv", "--holdout", "vanilla:6", "vanilla:6"], tmp_path,
                   "--holdout names vanilla:6 twice; name each point once", GOOD, runner=run_in_process)


# --- core_eval and bench: duplicate tasks, baselines, settings of an earlier eval.json, flags bench.py ignores
def bundle_with(labels=("t",), meta=None, **spec):
    """bundle_files with one core.yaml entry per label (all reading t.jsonl) and the given eval_meta_data.csv."""
    import yaml
    files = bundle_files()
    entries = [dict(dict(label=label, dataset_uri="t.jsonl", num_fewshot=[0], icl_task_type="multiple_choice"), **spec)
               for label in labels]
    files["b/core.yaml"] = yaml.safe_dump(dict(icl_tasks=entries))
    files["b/eval_meta_data.csv"] = meta or "Eval Task,Random baseline\n" + "".join(f"{l},50\n" for l in set(labels))
    return files


CORE_EVAL_LATE_CASES = [
    ("core-yaml-names-a-task-twice", bundle_with(["t", "u", "t"]), "task t: named twice in"),
    ("meta-names-a-task-twice", bundle_with(meta="Eval Task,Random baseline\nt,50\nt,25\n"),
     "eval_meta_data.csv:3: task t is named twice"),
    ("baseline-100", bundle_with(meta="Eval Task,Random baseline\nt,100\n"), "task t: 'Random baseline' '100' is not"),
    ("baseline-nan", bundle_with(meta="Eval Task,Random baseline\nt,nan\n"), "'Random baseline' 'nan' is not"),
    ("baseline-negative", bundle_with(meta="Eval Task,Random baseline\nt,-5\n"), "'Random baseline' '-5' is not"),
    ("baseline-not-a-number", bundle_with(meta="Eval Task,Random baseline\nt,abc\n"), "eval_meta_data.csv:2: task t"),
    ("baseline-cell-missing", bundle_with(meta="Eval Task,Random baseline\nt\n"), "eval_meta_data.csv:2: task t"),
    ("delimiter-not-text", bundle_with(continuation_delimiter=5), "continuation_delimiter must be text"),
    ("dataset-uri-not-text", bundle_with(dataset_uri=["t.jsonl"]), "dataset_uri must be text"),
    ("label-a-list", bundle_with([["t"]], meta="Eval Task,Random baseline\nt,50\n"), "label must be text"),
]


@pytest.mark.parametrize("files, message", [c[1:] for c in CORE_EVAL_LATE_CASES],
                         ids=[c[0] for c in CORE_EVAL_LATE_CASES])
def test_core_eval_bundle_refused_before_the_model_runs(tmp_path, checkpoint, files, message, monkeypatch):
    import core_eval
    monkeypatch.setattr(core_eval, "evaluate_tasks", lambda *a, **k: pytest.fail("the examples ran"))
    assert_refused("core_eval.py", [a.replace("{ckpt}", checkpoint) for a in EVAL], tmp_path, message, files,
                   runner=run_in_process)


def test_core_eval_duplicate_entry_does_not_pass_the_fingerprint(tmp_path, checkpoint):
    """The 22 CORE labels plus a second arc_easy: 23 entries skipped the fingerprint check and were reported as a
    verified CORE-22 suite."""
    import core_eval
    files = bundle_with([*core_eval.CORE_TASKS, "arc_easy"])
    assert_refused("core_eval.py", [a.replace("{ckpt}", checkpoint) for a in EVAL], tmp_path,
                   "task arc_easy: named twice in", files, runner=run_in_process)


def test_core_eval_checkpoint_with_nan_weights_refused_before_the_bundle(tmp_path, checkpoint):
    weights = torch.load(checkpoint, map_location="cpu", weights_only=True)
    next(iter(weights["model"].values())).view(-1)[0] = float("nan")
    torch.save(weights, tmp_path / "nan.pt")
    assert_refused("core_eval.py", [a.replace("{ckpt}", str(tmp_path / "nan.pt")) for a in EVAL], tmp_path,
                   "holds non-finite weights", bundle_files(), runner=run_in_process)


def test_core_eval_replaces_only_a_repeat_of_the_same_evaluation(tmp_path, checkpoint):
    argv = [a.replace("{ckpt}", checkpoint).replace("{d}", str(tmp_path)) for a in EVAL]
    for rel, content in bundle_files().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    assert run_in_process("core_eval.py", argv)[0] == 0
    first = json.loads((tmp_path / "eval.json").read_text())
    assert first["batch_size"] == 64 and first["seeds"] == [0] and first["max_per_task"] is None
    for flags, message in ((["--max-per-task", "2"], "max_per_task None -> 2"), (["--seeds", "1"], "seeds [0] -> [1]"),
                           (["--scoring", "batched"], "scoring 'shared' -> 'batched'")):
        assert_refused("core_eval.py", argv + flags, tmp_path, message, runner=run_in_process)
    with open(tmp_path / "b" / "eval_data" / "t.jsonl", "a") as f:  # the same folder, another bundle
        f.write(GOOD_ROW + "\n")
    assert_refused("core_eval.py", argv, tmp_path, "suite_fingerprint", runner=run_in_process)
    assert run_in_process("core_eval.py", argv + ["--overwrite"])[0] == 0
    assert run_in_process("core_eval.py", argv)[0] == 0  # a repeat replaces its own result
    assert json.loads((tmp_path / "eval.json").read_text())["task_counts"] == {"t": 5}


@pytest.fixture
def no_bench_runs(monkeypatch):
    import bench
    for mode in ("bench", "compile_time", "gpu_check", "gpu_smoke"):
        monkeypatch.setattr(bench, mode, lambda *a, **k: pytest.fail("the bench ran"))


BENCH_IGNORED_FLAGS = [["--resume"], ["--resume-or-start"], ["--runs-dir", "elsewhere"], ["--run-name", "x"],
                       ["--data-dir", "data/x"], ["--no-verify"], ["--stop-after", "3"], ["--save-every", "5"],
                       ["--log-every", "2"], ["--dist-timeout", "5"], ["--fixed-reduce-order"],
                       ["--arch", "loop_2"], ["--steps", "7"], ["--crossover-fractions", "0.5"]]


@pytest.mark.parametrize("flags", BENCH_IGNORED_FLAGS, ids=[f[0] for f in BENCH_IGNORED_FLAGS])
def test_bench_refuses_training_run_flags_it_ignores(tmp_path, flags, no_bench_runs):
    assert_refused("bench.py", ["--preset", "cpu", "--depth", "1", *flags], tmp_path,
                   f"{flags[0]} is for training runs (train.py); drop it for bench.py", runner=run_in_process)


@pytest.mark.parametrize("flags, message", [
    (["--memory-snapshots", "{d}/snap.pickle"], "--memory-snapshots is read only by --gpu-check;"),
    (["--gpu-check-out", "{d}/g.json"], "--gpu-check-out is read only by --gpu-check"),
    (["--gpu-smoke-dir", "{d}/smoke"], "--gpu-smoke-dir is read only by --gpu-smoke"),
    (["--bundle-dir", "{d}/b"], "--bundle-dir is read only by --gpu-check or --gpu-smoke"),
    (["--bench-repeats", "2", "--compile-time"], "--bench-repeats is read only by the step-time bench"),
    (["--gpu-check", "--compile-time"], "--gpu-check and --compile-time are separate runs of bench.py; pass one"),
])
def test_bench_refuses_its_own_flags_outside_their_mode(tmp_path, flags, message, no_bench_runs):
    assert_refused("bench.py", ["--preset", "cpu", "--depth", "1", *flags], tmp_path, message, runner=run_in_process)


# --- train.py: knobs that do not apply to the arm, resume and complete runs against the plan and pool, torchrun
# environment, signals, checkpoints/final as a file
# A knob that changes nothing in the arm was accepted and recorded in the plan (alpha 0.0 planned for --alpha 5; a
# 3-pass memory stage and inflated FLOPs for --random-passes on vanilla, then a traceback after the run folder existed).
KNOB_CASES = [  # (id, argv, message)
    ("alpha-with-boundary-none", ["--arch", "operator_1", "--depth", "2", "--boundary", "none", "--alpha", "5"],
     "--alpha 5.0 does not apply with --boundary none"),
    ("coda-inject-on-vanilla", ["--arch", "vanilla", "--depth", "2", "--coda-inject"],
     "--coda-inject does not apply with vanilla, a plain stack"),
    ("boundary-on-vanilla", ["--arch", "vanilla", "--depth", "2", "--boundary", "none"],
     "--boundary does not apply to vanilla"),
    ("recurrence-norm-with-inject-only", ["--arch", "loop_2", "--depth", "2", "--boundary", "inject_only",
                                          "--recurrence-norm"], "--recurrence-norm does not apply with --boundary"),
    ("coda-inject-with-alpha-0", ["--arch", "operator_1", "--depth", "2", "--alpha", "0", "--coda-inject"],
     "--coda-inject does not apply with alpha 0"),
    ("crossover-fractions-without-growth", ["--arch", "vanilla", "--depth", "2", "--crossover-fractions", "0.5"],
     "--crossover-fractions does not apply to vanilla: this run does not grow"),
    ("rewarm-steps-without-growth", ["--arch", "loop_2", "--depth", "2", "--rewarm-steps", "5"],
     "--rewarm-steps does not apply to loop_2"),
    ("random-passes-on-vanilla", ["--arch", "vanilla", "--depth", "2", "--random-passes", "2", "3"],
     "--random-passes does not apply to vanilla: a plain stack runs exactly one pass"),
    ("random-passes-beyond-untied-cores", ["--arch", "untied_2", "--depth", "2", "--random-passes", "2", "3"],
     "--random-passes 3 exceeds the 2 cores untied_2 allocates"),
    ("tpp-with-data-constrained", ["--arch", "operator_1", "--depth", "2", "--data-constrained", "fixed-wd", "--tpp",
                                   "3"], "--tpp does not apply with --data-constrained"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in KNOB_CASES], ids=[c[0] for c in KNOB_CASES])
def test_train_refuses_a_knob_that_does_not_apply_to_the_arm(tmp_path, pool_copy, argv, message):
    assert_refused("train.py", [*argv, "--dry-run"], tmp_path, message, runner=run_in_process)
    assert_refused("train.py", [*argv, *TINY, "--steps", "4", "--run-name", "r"], tmp_path, message,
                   runner=run_in_process)
    assert not os.path.exists(tmp_path / "runs")


def test_train_knobs_that_apply_are_planned(capsys):
    """The ablations as the README writes them still plan, and --matrix-lr is honoured under --optimizer adamw."""
    import train
    for argv in (["--arch", "loop_2", "--boundary", "norm_only", "--no-coda-inject"],
                 ["--arch", "operator_1", "--boundary", "none", "--alpha", "0"],
                 ["--arch", "loop_grow", "--random-passes", "2", "3", "4", "5", "6"],
                 ["--arch", "untied_grow", "--random-passes", "2", "4"]):
        assert train.main([*argv, "--depth", "8", "--dry-run"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    plans = []
    for lr in ("0.004", "0.01"):
        assert train.main(["--arch", "vanilla", "--depth", "8", "--optimizer", "adamw", "--matrix-lr", lr,
                           "--dry-run"]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[1]["matrix_lr"] == pytest.approx(2.5 * plans[0]["matrix_lr"])


# A complete run was never compared with the command (ladder.sh then skipped a mislabelled run forever: "already
# complete; nothing to do", exit 0), and --resume with another --data-dir continued on another corpus.
@pytest.fixture(scope="module")
def complete_run(pool, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("complete"))
    assert run_in_process("train.py", [a.replace("{d}", d) for a in tiny_run_argv(pool)])[0] == 0
    return os.path.join(d, "runs", "r")


@pytest.fixture(scope="module")
def other_pool(tmp_path_factory):
    import data
    out = str(tmp_path_factory.mktemp("other_pool"))
    data.prepare("stdlib", out, tokenizer="bytes", train_tokens=50_000, val_tokens=5_000)
    return out


RECORDED_CASES = [  # (id, the run copied, flags after the run's own, message)
    ("complete-run-of-another-arch", "complete", ["--resume-or-start", "--arch", "untied_grow", "--depth", "3",
                                                  "--crossover-fractions", "0.5"],
     "runs/r holds another run than this command plans: arch 'vanilla' there, 'untied_grow' here"),
    ("complete-run-with-another-seed", "complete", ["--resume", "--seed", "7"], "seed 42 there, 7 here"),
    ("resume-with-another-lr", "stopped", ["--resume", "--matrix-lr", "0.05"],
     "checkpoints/latest holds another run than this command plans: matrix_lr"),
    ("resume-on-another-pool", "stopped", ["--resume", "--data-dir", "OTHER"], "was trained on the pool"),
    ("complete-run-on-another-pool", "complete", ["--resume-or-start", "--data-dir", "OTHER"],
     "was trained on the pool"),
]


@pytest.mark.parametrize("which, extra, message", [c[1:] for c in RECORDED_CASES], ids=[c[0] for c in RECORDED_CASES])
def test_train_compares_a_recorded_run_with_the_command(pool, complete_run, stopped_run, other_pool, tmp_path, which,
                                                        extra, message):
    shutil.copytree(complete_run if which == "complete" else stopped_run, tmp_path / "runs" / "r")
    line = assert_refused("train.py", tiny_run_argv(pool) + [other_pool if a == "OTHER" else a for a in extra],
                          tmp_path, message, runner=run_in_process)
    if "OTHER" in extra:
        assert repr(pool) in line and other_pool in line  # both pools named


@pytest.mark.parametrize("env, message", [
    (dict(MASTER_ADDR=None, MASTER_PORT=None), "WORLD_SIZE=2 needs MASTER_ADDR and MASTER_PORT"),
    (dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=None), "WORLD_SIZE=2 needs MASTER_PORT"),
    (dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="x"), "MASTER_PORT must be a whole number")])
def test_train_torchrun_environment_without_its_rendezvous(tmp_path, pool_copy, monkeypatch, env, message):
    """WORLD_SIZE=2 RANK=0 without MASTER_ADDR was torch's ValueError traceback after the run folder existed."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    for name, value in env.items():
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    assert_refused("train.py", RUN, tmp_path, message, runner=run_in_process)
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.parametrize("signum, code, resume", [(signal.SIGINT, 130, "--resume"),
                                                  (signal.SIGTERM, 143, "--resume-or-start")])
def test_train_signal_stops_with_one_line_and_an_interrupted_result(pool, tmp_path, signum, code, resume):
    """SIGINT was a KeyboardInterrupt traceback; after SIGINT or SIGTERM result.json still said "running"."""
    argv = [a.replace("{d}", str(tmp_path)) for a in tiny_run_argv(pool, "--save-every", "5")]
    argv[argv.index("--steps") + 1] = "1000"
    run_dir = tmp_path / "runs" / "r"
    proc = subprocess.Popen([sys.executable, "train.py", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    deadline = time.time() + 120
    while not (run_dir / "checkpoints" / "latest").is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signum)
    stderr = proc.communicate(timeout=120)[1]
    name = signal.Signals(signum).name
    assert proc.returncode == code and len(stderr.splitlines()) == 1, stderr
    assert f"train.py: stopped by {name} at step" in stderr and "--resume continues" in stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "interrupted" and result["error"].startswith(f"stopped by {name} at step")
    step = json.loads((run_dir / "checkpoints" / "latest" / "meta.json").read_text())["step"]
    assert run_in_process("train.py", argv + [resume, "--stop-after", str(step + 2)]) == (0, "")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "stopped" and result["completed_steps"] == step + 2


def test_train_resume_refuses_checkpoints_final_that_is_a_file(pool, stopped_run, tmp_path):
    """It trained to the end, then failed naming checkpoints/latest."""
    shutil.copytree(stopped_run, tmp_path / "runs" / "r")
    line = assert_refused("train.py", tiny_run_argv(pool, "--resume"), tmp_path, "is a file, not a checkpoint folder",
                          {"runs/r/checkpoints/final": "not a checkpoint"}, runner=run_in_process)
    assert "runs/r/checkpoints/final" in line


# --- ladder.sh: pass-through flags, options a target ignores, environment values, relative paths ---
def fake_torchrun(tmp_path):
    """PATH with a torchrun that only records that it was started (in tmp_path/launched)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!/usr/bin/env bash\necho \"$*\" >> {tmp_path}/launched\n")
    (bin_dir / "torchrun").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


CPU_LADDER = ["vanilla", "--preset", "cpu", "--depths", "1 2"]
LADDER_PASS_THROUGH_CASES = [  # (id, ladder options, arguments after --, message): each overrode what a run is
    ("depth", CPU_LADDER, ["--depth", "3"], "'--depth' after --: ladder.sh sets --depth itself; use --depths"),
    ("depth-equals", CPU_LADDER, ["--depth=3"], "'--depth=3' after --: ladder.sh sets --depth itself"),
    ("depth-abbreviated", CPU_LADDER, ["--dep", "3"], "'--dep' after -- clashes with --depth"),
    ("arch", CPU_LADDER, ["--arch", "loop_2"], "ladder.sh sets --arch itself; name the arch as the first argument"),
    ("seed-with-seeds", [*CPU_LADDER, "--seeds", "0 1"], ["--seed", "5"], "ladder.sh sets --seed itself; use --seeds"),
    ("preset", CPU_LADDER, ["--preset", "paper"], "ladder.sh sets --preset itself"),
    ("preset-of-a-paper-ladder", ["vanilla", "--depths", "6"], ["--preset=cpu"], "ladder.sh sets --preset itself"),
    ("run-name", CPU_LADDER, ["--run-name", "x"], "ladder.sh sets --run-name itself"),
    ("runs-dir", CPU_LADDER, ["--runs-dir", "{d}/elsewhere"], "ladder.sh sets --runs-dir itself; use RUNS_DIR"),
    ("resume", CPU_LADDER, ["--resume"], "'--resume' after -- clashes with --resume-or-start"),
    ("data-dir-of-d26", ["untied_grow", "--preset", "d26"], ["--data-dir={d}"], "sets --data-dir itself; use DATA_DIR"),
    ("passes-of-the-grid", ["operator_1", "--preset", "data-constrained", "--depths", "18"], ["--passes", "2"],
     "ladder.sh sets --passes itself"),
]


@pytest.mark.parametrize("options, extra, message", [c[1:] for c in LADDER_PASS_THROUGH_CASES],
                         ids=[c[0] for c in LADDER_PASS_THROUGH_CASES])
def test_ladder_refuses_pass_through_flags_it_sets(tmp_path, options, extra, message):
    """Arguments after -- come last on train.py's command line: one the ladder sets trained depth 3 under the name
    vanilla_d1, or ran outside RUNS_DIR where the next invocation could not resume it. Refused in a dry run and
    before a real run launches anything."""
    assert_refused("ladder.sh", [*options, "--dry-run", "--", *extra], tmp_path, message, runner=run_ladder)
    env = dict(RUNS_DIR=str(tmp_path / "runs"), PATH=fake_torchrun(tmp_path))
    assert_refused("ladder.sh", [*options, "--", *extra], tmp_path, message, runner=ladder_with(env))
    assert not (tmp_path / "launched").exists() and not (tmp_path / "runs").exists()


def test_ladder_passes_other_flags_through(tmp_path):
    """Flags the ladder does not set still reach every run (a --seed without --seeds sets the ladder's seed)."""
    r = subprocess.run(["bash", "ladder.sh", *CPU_LADDER, "--dry-run", "--", "--tpp", "3", "--seed=5", "--no-verify"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    runs = [line for line in r.stdout.splitlines() if line.startswith("torchrun")]
    assert len(runs) == 2 and all(line.endswith(" --tpp 3 --seed=5 --no-verify") for line in runs), runs


LADDER_IGNORED_OPTION_CASES = [  # (id, argv, message): each option was accepted and silently had no effect
    ("demo-paper-preset", ["demo", "--dry-run", "--preset", "paper"], "the demo runs the cpu preset, not --preset paper"),
    ("demo-d26-preset", ["demo", "--preset", "d26"], "the demo runs the cpu preset, not --preset d26"),
    ("d26-depths", ["untied_grow", "--preset", "d26", "--depths", "6 8", "--dry-run"],
     "the d26 preset is the one run at depth 26, not --depths 6 8"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in LADDER_IGNORED_OPTION_CASES],
                         ids=[c[0] for c in LADDER_IGNORED_OPTION_CASES])
def test_ladder_refuses_options_its_target_ignores(tmp_path, argv, message):
    env = dict(RUNS_DIR=str(tmp_path / "runs"), DATA_DIR=str(tmp_path / "data"), PATH=fake_torchrun(tmp_path))
    assert_refused("ladder.sh", argv, tmp_path, message, runner=ladder_with(env))
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()  # the demo's data not prepared


def test_ladder_accepts_the_options_its_target_uses():
    """The demo's own preset and d26's own depth are what those targets run: accepted."""
    for argv, run in ((["demo", "--preset", "cpu", "--depths", "1"], "--depth 1 --preset cpu"),
                      (["untied_grow", "--preset", "d26", "--depths", "26"], "--depth 26 --preset paper")):
        r = subprocess.run(["bash", "ladder.sh", *argv, "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0 and run in r.stdout, r.stderr


@pytest.mark.parametrize("value", ["abc", "5", "0"])
def test_ladder_names_mfu_not_the_flag_it_fills(tmp_path, value):
    """MFU reaches train.py --ladder-dry-run as --mfu: the refusal named a flag the user never gave."""
    line = assert_refused("ladder.sh", ["vanilla", "--depths", "6", "--dry-run"], tmp_path,
                          f"environment variable MFU must be a finite number in (0, 1], got '{value}'",
                          runner=ladder_with(dict(MFU=value)))
    assert "--mfu" not in line


def test_ladder_names_runs_dir_it_cannot_create(tmp_path):
    """A RUNS_DIR that is a file: mkdir's own message and exit 1 before; one line naming RUNS_DIR now."""
    (tmp_path / "file").write_text("not a folder")
    env = dict(RUNS_DIR=str(tmp_path / "file"), PATH=fake_torchrun(tmp_path))
    assert_refused("ladder.sh", ["vanilla", "--preset", "cpu", "--depths", "1"], tmp_path,
                   f"environment variable RUNS_DIR: cannot create the run folder {tmp_path}/file/vanilla_d1 (Not a "
                   "directory)", runner=ladder_with(env))
    assert not (tmp_path / "launched").exists()


def launch_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith("torchrun")]


def test_ladder_takes_relative_paths_from_the_callers_directory(tmp_path):
    """ladder.sh cds to the repository: a relative RUNS_DIR, DATA_DIR or --data-dir from elsewhere landed there.
    The defaults stay under the repository (README: runs/, data/...)."""
    work = tmp_path / "work"
    work.mkdir()
    script = os.path.join(ROOT, "ladder.sh")

    def ladder_from_work(*argv, **env):
        return subprocess.run(["bash", script, *argv], cwd=work, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, **env))
    r = ladder_from_work("untied_grow", "--preset", "d26", "--dry-run", RUNS_DIR="rel", DATA_DIR="pool")
    assert r.returncode == 0, r.stderr
    assert f"--data-dir {work}/pool --run-name untied_grow_d26 --runs-dir {work}/rel" in r.stdout
    r = ladder_from_work(*CPU_LADDER, "--dry-run", "--", "--data-dir", "x", "--data-d=y", "--tpp", "3")
    assert r.returncode == 0, r.stderr
    assert all(line.endswith(f"--runs-dir runs --data-dir {work}/x --data-d={work}/y --tpp 3")
               for line in launch_lines(r.stdout)), r.stdout
    r = ladder_from_work("untied_grow", "--preset", "d26", "--dry-run", RUNS_DIR="", DATA_DIR="")
    assert "--data-dir data/fineweb_edu --run-name untied_grow_d26 --runs-dir runs" in r.stdout, r.stderr
    # train.py reads DATA_DIR itself (presets other than d26): it gets the caller's folder
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f'#!/usr/bin/env bash\necho "$DATA_DIR" > {tmp_path}/data_dir\n')
    (bin_dir / "torchrun").chmod(0o755)
    r = ladder_from_work("vanilla", "--preset", "cpu", "--depths", "1", RUNS_DIR=str(tmp_path / "runs"),
                         DATA_DIR="pool", PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "data_dir").read_text() == f"{work}/pool\n"


def test_ladder_under_slurm_from_another_directory(tmp_path):
    """srun started `bash $0` after the cd, so `bash repo/ladder.sh` from outside the repository failed on every node;
    each copy now runs the script by its full path from the caller's directory, so paths resolve as in the first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for name, body in {
        "scontrol": 'printf "gpu-a17\\ngpu-a18\\n"',
        "srun": 'while [ "$1" != bash ]; do shift; done\n'
                'for node in 0 1; do SLURM_STEP_ID=0 SLURM_NODEID=$node "$@" || exit 1; done',
        "torchrun": f'echo "$*" >> {log}',
    }.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "repo").symlink_to(ROOT)
    env = dict(os.environ, SLURM_JOB_NODELIST="gpu-a[17-18]", SLURM_NNODES="2", RUNS_DIR="runs", DATA_DIR="pool",
               PATH=f"{bin_dir}:{os.environ['PATH']}")
    env.pop("SLURM_STEP_ID", None)
    r = subprocess.run(["bash", "repo/ladder.sh", "untied_grow", "--preset", "d26"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all(f"--data-dir {tmp_path}/pool --run-name untied_grow_d26 --runs-dir "
                                   f"{tmp_path}/runs" in call for call in calls), calls
    assert (tmp_path / "runs" / "untied_grow_d26" / "train.log").exists()
