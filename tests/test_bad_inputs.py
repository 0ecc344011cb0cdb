"""Bad input to train.py, model.py, data.py, core_eval.py, bench.py and ladder.sh: every case exits 2 with exactly
one line on stderr, no traceback, and leaves every file that existed before the call byte-identical (the contract
in tests/refusals.py). One case table per script, then the hostile-input classes of docs/reliability.md that are
values: 2 (every numeric flag and environment value has a declared range) and 5 (SLURM and ladder values); knobs
the arm would not use, and ladder.sh's pass-through flags. A case is (id, files to create under the case's
directory, argv with {d} for that directory, a phrase the message must contain). fit.py's cases are in
tests/test_bad_fit_inputs.py; damaged files and interrupted processes in tests/test_bad_state.py."""
import io, json, os, subprocess, sys

import pytest
import torch

import core_eval

from refusals import ROOT, run_in_process, assert_refused, TINY, RUN, PREP, bundle_files, EVAL


COMPLETE = json.dumps(dict(status="complete", arch="vanilla", depth=2))


def cases(table):
    return [pytest.param(*case[1:], id=case[0]) for case in table]


TRAIN_CASES = [
    ("steps-zero", {}, [*RUN, "--steps", "0"], "--steps: must be a whole number in [1, 10000000], got '0'"),
    ("save-every-negative", {}, [*RUN, "--save-every", "-1"], "--save-every: must be a whole number in [0,"),
    ("stop-after-zero", {}, [*RUN, "--stop-after", "0"], "--stop-after: must be a whole number in [1,"),
    ("attention-backend-cudnn-on-cpu", {}, [*RUN, "--device", "cpu", "--attention-backend", "cudnn"],
     "--attention-backend cudnn needs CUDA; on the CPU SDPA has only flash (its CPU kernel) and math"),
    ("attention-backend-unknown", {}, [*RUN, "--attention-backend", "fa3"], "argument --attention-backend: invalid"),
    ("alpha-nan", {}, ["--arch", "operator_1", "--depth", "2", "--alpha", "nan", "--dry-run"],
     "argument --alpha: must be a finite number"),
    ("matrix-lr-inf", {}, [*RUN, "--matrix-lr", "inf"], "argument --matrix-lr: must be a finite number"),
    ("crossover-nan", {}, ["--arch", "untied_grow", "--depth", "2", "--crossover-fractions", "nan", "--dry-run"],
     "must be a finite number"),
    ("run-name-with-slash", {}, [*RUN, "--run-name", "../escape"], "must be a plain folder name"),
    ("runs-dir-is-a-file", {"runs": "a file"}, RUN, "cannot create the run folder"),
    ("runs-dir-not-writable", {}, [*RUN, "--runs-dir", "/sys/scaling_exponents_runs"], "cannot create the run folder"),
    ("run-dir-is-a-file", {"runs/r": "a file"}, RUN, "cannot create the run folder"),
    ("foreign-run-dir", {"runs/r/notes.txt": "my notes"}, RUN, "already holds files (notes.txt"),
    ("existing-run-without-resume", {"runs/r/result.json": COMPLETE}, RUN, "already holds files (result.json"),
    ("explicit-data-dir-without-pool", {"typo/readme": "not a pool"}, [*RUN, "--data-dir", "{d}/typo"],
     "no pool in"),
    ("interrupted-pool", {"half/corpus.json": json.dumps(dict(status="running", splits={}))},
     [*RUN, "--data-dir", "{d}/half"], "is incomplete"),
]


@pytest.mark.parametrize("files, argv, message", cases(TRAIN_CASES))
def test_train_bad_input(tmp_path, pool_copy, files, argv, message):
    assert_refused("train.py", argv, tmp_path, message, files, runner=run_in_process)


# --- the arms table: a row's values are checked as their flags are, at the import of every script
ROW_CASES = [  # (id, a USER_ARMS entry, the message's phrase)
    ("warmdown-ratio-two", '"bad": derived("loop_2", label="B", color="tab:olive", warmdown_ratio=2.0)',
     "USER_ARMS['bad']: warmdown_ratio must be a finite number in [0, 1], got '2.0' (as --warmdown-ratio)"),
    ("stages-with-a-bool", '"bad": derived("untied_grow", label="B", color="tab:olive", stages=(True, 2, 4))',
     "stages must be a tuple of 2 or more increasing pass counts, e.g. (1, 2, 4); got (True, 2, 4)"),
    ("adam-beta-above-one", '"bad": derived("vanilla", label="B", color="tab:olive", adam_betas=(1.5, 0.95))',
     "USER_ARMS['bad']: adam_betas must be a finite number in [0, 1), got '1.5' (as --adam-betas)"),
    ("integer-knob-as-float", '"bad": derived("loop_grow", label="B", color="tab:olive", rewarm_steps=2.5)',
     "rewarm_steps must be a whole number in [0, 10000000], got '2.5'"),
    ("colour", '"bad": derived("vanilla", label="B", color="tab:nocolour")',
     "USER_ARMS['bad']: color 'tab:nocolour' is not a matplotlib colour"),
    ("name-twice", '"loop_3": derived("loop_2", label="B", color="tab:olive", passes=5)',
     "USER_ARMS: 'loop_3' is given twice (the second would silently replace the first)"),
]


@pytest.mark.parametrize("entry, message", [c[1:] for c in ROW_CASES], ids=[c[0] for c in ROW_CASES])
def test_arms_table_row_checked_as_its_flags(tmp_path, entry, message):
    source = open(os.path.join(ROOT, "arms.py")).read()
    table = source.index("USER_ARMS = {") + len("USER_ARMS = {")
    (tmp_path / "arms.py").write_text(source[:table] + f"\n    {entry}," + source[table:])
    r = subprocess.run([sys.executable, "-c", "import arms"], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr[-2000:]
    assert lines[0].startswith("arms.py: error: ") and lines[0].endswith("(docs/your_own_arm.md)")


# ------------------------------------------------------------------------------------------------ model.py
MODEL_CASES = [
    ("alpha-nan", {}, ["--arch", "operator_1", "--depth", "8", "--alpha", "nan"], "--alpha: must be a finite number"),
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


def test_issue31_class5_meta_and_checkpoint_builds_draw_nothing(monkeypatch):
    """GPT(config_for('untied_grow', 26), device='meta') drew all 7.4 B values on the CPU (minutes, no sign of life);
    a meta build, and a build whose weights a checkpoint overwrites, now draw none and leave the generator alone."""
    import model
    monkeypatch.setattr(model.GPT, "init_weights", lambda self: pytest.fail("init_weights drew values"))
    state = torch.get_rng_state()
    net = model.GPT(model.config_for("untied_grow", 26), device="meta")
    assert net.lm_head.weight.is_meta and sum(p.numel() for p in net.parameters()) > 7e9
    model.GPT(model.config_for("vanilla", 2, vocab_size=256), draw_weights=False)
    assert torch.equal(torch.get_rng_state(), state)


def test_issue31_class4_arms_py_refuses_the_ladders_ladder_sh_refuses():
    """One rule for ladder.sh and the listing it reads: `python train.py --ladder demo --preset paper` listed runs that
    `bash ladder.sh demo --preset paper` refuses."""
    for argv in (["python", "train.py", "--ladder", "demo", "--preset", "paper"],
                 ["bash", "ladder.sh", "demo", "--preset", "paper", "--dry-run"]):
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == "", (argv, r.stdout)
        assert "the demo runs the cpu preset, not --preset paper" in r.stderr and len(r.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------------------------ data.py
OTHER_PREPARE = json.dumps(dict(schema_version=1, status="running", corpus="files", files="mine/*.txt",
                                tokenizer="bytes", splits={}, sources=[], sources_done=3))

DATA_CASES = [
    ("prepare-into-foreign-folder", {"mine/notes.txt": "my notes"}, [*PREP, "--out", "{d}/mine"],
     "is not empty and holds no pool"),
    ("prepare-over-another-unfinished-prepare", {"pool/corpus.json": OTHER_PREPARE, "pool/train.bin": b"\x01\x00"},
     [*PREP, "--out", "{d}/pool"], "holds an unfinished pool with other settings (corpus, "),
    ("files-all-empty", {"in/a.txt": "", "in/b.txt": ""},
     ["prepare", "--corpus", "files", "--files", "{d}/in/*.txt", "--tokenizer", "bytes", "--workers", "1",
      "--out", "{d}/out"], "hold no text"),
    ("jsonl-text-not-a-string", {"in/a.jsonl": '{"text": "a"}\n\n{"text": 5}\n'},
     ["prepare", "--corpus", "files", "--files", "{d}/in/*.jsonl", "--tokenizer", "bytes", "--workers", "1",
      "--out", "{d}/out"], "a.jsonl:3: not a UTF-8 JSON object with a 'text' string"),
    ("jsonl-line-after-a-carriage-return", {"in/a.jsonl": b'{"text": "a"}\n{"text": "b\rc"}\n{"text": "d"}\n'},
     ["prepare", "--corpus", "files", "--files", "{d}/in/*.jsonl", "--tokenizer", "bytes", "--workers", "1",
      "--out", "{d}/out"], "a.jsonl:2: not a UTF-8 JSON object"),
    ("jsonl-not-utf8", {"in/a.jsonl": b'{"text": "a"}\n{"text": "\xff"}\n'},
     ["prepare", "--corpus", "files", "--files", "{d}/in/*.jsonl", "--tokenizer", "bytes", "--workers", "1",
      "--out", "{d}/out"], "a.jsonl:2: not a UTF-8 JSON object"),
    ("negative-budget", {}, [*PREP, "--train-tokens=-5", "--out", "{d}/p"], "--train-tokens: must be a whole number"),
    ("unknown-corpus", {}, ["prepare", "--corpus", "wikipedia", "--out", "{d}/x"], "invalid choice"),
    ("no-corpus", {}, ["prepare", "--out", "{d}/x"], "--corpus"),
    ("files-match-nothing", {}, ["prepare", "--corpus", "files", "--files", "{d}/no/*", *PREP[3:5], "--out", "{d}/x"],
     "matches no files"),
    ("files-without-glob", {}, ["prepare", "--corpus", "files", "--out", "{d}/x"], "--files GLOB is required"),
    ("files-unsupported-type", {"in/a.csv": "a,b"}, ["prepare", "--corpus", "files", "--files", "{d}/in/*",
                                                     "--tokenizer", "bytes", "--out", "{d}/x"], "unsupported file"),
    ("out-under-a-file", {"a_file": "x"}, [*PREP, "--out", "{d}/a_file/pool"], "cannot write to --out"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_data_bad_input(tmp_path, files, argv, message):
    assert_refused("data.py", argv, tmp_path, message, files, runner=run_in_process)


# ------------------------------------------------------------------------------------------------ core_eval.py
@pytest.fixture
def checkpoint(tmp_path_factory, monkeypatch):
    """A folder that core_eval's load_checkpoint_model reads as a tiny random model (checkpoint.py has its own
    tests)."""
    import model
    net = model.GPT(model.config_for("vanilla", 1, width_per_depth=16, head_dim=16, seq_len=64, vocab_size=257))
    path, real = tmp_path_factory.mktemp("run"), core_eval.load_checkpoint_model  # real: for another folder
    monkeypatch.setattr(core_eval, "load_checkpoint_model",
                        lambda p: (net, dict(tokenizer="bytes", step=0)) if p == str(path) else real(p))
    return str(path)


def bundle_with(labels=("t",), meta=None, **spec):
    """bundle_files with one core.yaml entry per label (all reading t.jsonl) and the given eval_meta_data.csv."""
    import yaml
    files = bundle_files()
    entries = [dict(dict(label=label, dataset_uri="t.jsonl", num_fewshot=[0], icl_task_type="multiple_choice"), **spec)
               for label in labels]
    files["b/core.yaml"] = yaml.safe_dump(dict(icl_tasks=entries))
    files["b/eval_meta_data.csv"] = meta or "Eval Task,Random baseline\n" + "".join(f"{l},50\n" for l in set(labels))
    return files


GOOD_ROW = json.dumps(dict(query="q", choices=["x", "y"], gold=0))
CORE_EVAL_CASES = [  # (id, files, argv, message): all refused before any example runs
    ("core-yaml-names-a-task-twice", bundle_with(["t", "u", "t"]), EVAL, "task t: named twice in {d}/b/core.yaml (again "
                                                                         "in entry 3)"),
    ("core-22-plus-a-duplicate", bundle_with([*core_eval.CORE_TASKS, "arc_easy"]), EVAL,  # was a verified CORE-22
     "task arc_easy: named twice in"),
    ("core-22-not-the-papers-content", bundle_with(core_eval.CORE_TASKS), EVAL, "not the paper's"),
    ("meta-names-a-task-twice", bundle_with(meta="Eval Task,Random baseline\nt,50\nt,25\n"), EVAL,
     "task t: {d}/b/eval_meta_data.csv needs one 'Random baseline' row for it"),
    ("baseline-100", bundle_with(meta="Eval Task,Random baseline\nt,100\n"), EVAL, "a percentage in [0, 100) (found "
                                                                                    "['100'])"),
    ("baseline-nan", bundle_with(meta="Eval Task,Random baseline\nt,nan\n"), EVAL, "(found ['nan'])"),
    ("baseline-cell-missing", bundle_with(meta="Eval Task,Random baseline\nt\n"), EVAL, "(found [None])"),
    ("delimiter-not-text", bundle_with(continuation_delimiter=5), EVAL, "icl_tasks entry 1 of"),
    ("label-a-list-in-entry-2", bundle_with(["t", ["u"]], meta="Eval Task,Random baseline\nt,50\n"), EVAL,
     "icl_tasks entry 2 of"),  # the message named common.number (an argparse helper) where the index belonged
    ("core-yaml-without-dataset-uri", bundle_files(spec=dict(label="t", num_fewshot=[0], icl_task_type="schema")),
     EVAL, "icl_tasks entry 1 of {d}/b/core.yaml needs label, dataset_uri"),
    ("max-per-task-zero", bundle_files(), [*EVAL, "--max-per-task", "0"],
     "argument --max-per-task: must be a whole number in [1, 1000000000], got '0'"),
    ("kl-threshold-negative", bundle_files(), [*EVAL, "--kl-threshold=-1"],
     "argument --kl-threshold: must be a finite number in (0, inf)"),
    ("seed-twice", bundle_files(), [*EVAL, "--seed", "0", "0"], "--seed names 0 twice; give each value once"),
    ("gold-out-of-range", bundle_files([GOOD_ROW, json.dumps(dict(query="q", choices=["x", "y"], gold=7))]), EVAL,
     "task t: {d}/b/eval_data/t.jsonl:2: not a multiple_choice row (a JSON object with query and choices as text, "
     "gold an index into the options)"),
    ("row-missing-field", bundle_files([GOOD_ROW, GOOD_ROW, json.dumps(dict(query="q"))]), EVAL,
     "t.jsonl:3: not a multiple_choice row"),
    ("lm-continuation-not-text", bundle_files([json.dumps(dict(context="c", continuation=3))],
                                              spec=dict(label="t", dataset_uri="t.jsonl", num_fewshot=[0],
                                                        icl_task_type="language_modeling")), EVAL,
     "t.jsonl:1: not a language_modeling row (a JSON object with context and continuation as text)"),
    ("bad-json-line", bundle_files([GOOD_ROW, "", GOOD_ROW, "{not json"]), EVAL, "t.jsonl:4: not a multiple_choice"),
    ("out-is-a-directory", dict(bundle_files(), **{"eval.json/x": "x"}), EVAL, "not a file name in an existing folder"),
    ("effective-depth-pool-missing", bundle_files(), [*EVAL, "--effective-depth", "--data-dir", "{d}/nopool"],
     "no pool in"),
    ("checkpoint-missing", bundle_files(), ["--checkpoint", "{d}/nope", *EVAL[2:]], "{d}/nope holds no complete train.py checkpoint"),
    ("bundle-without-core-yaml", {"b/notes.txt": "x"}, EVAL, "is not a readable CORE bundle"),
    ("effective-depth-without-data-dir", bundle_files(), [*EVAL, "--effective-depth"], "needs --data-dir"),
    ("unknown-task-type", bundle_files(spec=dict(label="t", dataset_uri="t.jsonl", num_fewshot=[0],
                                                 icl_task_type="generation")), EVAL,
     "icl_task_type (one of multiple_choice, schema, language_modeling)"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in CORE_EVAL_CASES], ids=[c[0] for c in CORE_EVAL_CASES])
def test_core_eval_bad_input(tmp_path, checkpoint, files, argv, message, monkeypatch):
    monkeypatch.setattr(core_eval, "evaluate_tasks", lambda *a, **k: pytest.fail("the examples ran"))
    argv = [a.replace("{ckpt}", checkpoint) for a in argv]
    assert_refused("core_eval.py", argv, tmp_path, message.replace("{d}", str(tmp_path)), files, runner=run_in_process)
    assert any(f.startswith("eval.json") for f in files) or not os.path.exists(tmp_path / "eval.json")


# ------------------------------------------------------------------------------------------------ ladder.sh
def run_ladder(script, argv):
    r = subprocess.run(["bash", script, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stderr


LADDER_CASES = [
    ("unknown-arch", {}, ["nope"], "unknown arch 'nope'"),
    ("option-first", {}, ["--depth", "6"], "the first argument is ARCH"),
    ("depth-not-a-number", {}, ["vanilla", "--depth", "6", "x"], "argument --depth: must be a whole number in [1, 1024]"),
    ("depths-is-not-train-pys-name", {}, ["vanilla", "--depths", "6"], "unknown option '--depths'"),
    ("unknown-preset", {}, ["vanilla", "--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    ("replicates-without-seeds", {}, ["vanilla", "--replicate-depths", "16"], "--replicate-depths needs --seed"),
    ("seed-without-values", {}, ["vanilla", "--seed"], "--seed needs one or more values"),
    ("seed-negative", {}, ["vanilla", "--seed", "0", "-1"], "unknown option '-1'"),
    ("d26-of-another-arm", {}, ["vanilla", "--preset", "d26"], "Untied-Grow only"),
    # options a target would ignore: each was accepted and silently had no effect
    ("demo-paper-preset", {}, ["demo", "--preset", "paper"], "the demo runs the cpu preset, not --preset paper"),
    ("d26-depths", {}, ["untied_grow", "--preset", "d26", "--depth", "6", "8"],
     "the d26 preset is the one run at depth 26, not --depth 6 8"),
]


@pytest.mark.parametrize("files, argv, message", [c[1:] for c in LADDER_CASES], ids=[c[0] for c in LADDER_CASES])
def test_ladder_bad_input(tmp_path, files, argv, message):
    assert_refused("ladder.sh", [*argv, "--dry-run"], tmp_path, message, files, runner=run_ladder)

# --- numbers (every flag and environment value has a declared range), SLURM and ladder values, checked before work
DRY = ["--arch", "vanilla", "--depth", "8", "--dry-run"]
LADDER_DRY = ["--ladder-dry-run", "--gpus-per-node", "8"]

CLASS2_CASES = [  # (id, script, environment, argv, message)
    ("train-seed-beyond-int64", "train.py", {}, [*RUN, "--seed", str(2 ** 64)],
     "argument --seed: must be a whole number in [0, 9223372036854775807], got '18446744073709551616'"),
    ("train-depth-100000", "train.py", {}, ["--arch", "vanilla", "--depth", "100000", "--dry-run"],
     "argument --depth: must be a whole number in [1, 1024], got '100000'"),
    ("train-derived-steps-beyond-range", "train.py", {}, ["--arch", "vanilla", "--depth", "64", "--tpp", "1e6",
                                                         "--dry-run"], "steps, outside [1, 10,000,000]"),
    ("train-device-batch-size-not-clamped", "train.py", {}, [*DRY, "--device-batch-size", "1000000"],
     "--device-batch-size 1000000 does not divide the 256 sequences per rank"),
    ("train-rank-abc", "train.py", {"RANK": "abc"}, RUN, "environment variable RANK must be a whole number"),
    ("train-adam-beta-one", "train.py", {}, [*DRY, "--adam-betas", "0.9", "1"],
     "argument --adam-betas: must be a finite number in [0, 1), got '1'"),
    ("train-warmdown-ratio-two", "train.py", {}, [*DRY, "--warmdown-ratio", "2"], "argument --warmdown-ratio: must be"),
    ("train-weight-decay-negative", "train.py", {}, [*DRY, "--weight-decay=-1"], "argument --weight-decay: must be"),
    ("train-pass-stages-not-increasing", "train.py", {}, ["--arch", "untied_grow", "--depth", "8", "--pass-stages",
                                                         "2", "4", "3", "--crossover-fractions", "0.3", "0.6",
                                                         "--dry-run"], "--pass-stages must increase"),
    ("train-random-passes-twice", "train.py", {}, ["--arch", "loop_grow", "--depth", "8", "--random-passes", "2", "2",
                                                  "4", "--dry-run"], "--random-passes names 2 twice"),
    ("ladder-dry-run-mfu-five", "train.py", {}, [*LADDER_DRY, "--mfu", "5"], "argument --mfu: must be a finite "
                                                                             "number in (0, 1], got '5'"),
    ("ladder-dry-run-a-run-that-does-not-plan", "train.py", {}, [*LADDER_DRY, "--", "--device-batch-size", "3"],
     "a: --device-batch-size 3 does not divide the 32 sequences per rank"),
    ("ladder-dry-run-no-gpus", "train.py", {}, ["--ladder-dry-run", "--gpus-per-node", "0"],
     "argument --gpus-per-node: must be a whole number in [1, 1024]"),
    ("model-depth-100000", "model.py", {}, ["--arch", "vanilla", "--depth", "100000"], "argument --depth: must be"),
]


@pytest.mark.parametrize("script, env, argv, message", cases(CLASS2_CASES))
def test_class2_numbers_and_environment_values(tmp_path, pool_copy, monkeypatch, script, env, argv, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.stdin", io.StringIO("a --arch vanilla --depth 6\n"))  # --ladder-dry-run's runs
    assert_refused(script, argv, tmp_path, message, runner=run_in_process)
    assert not os.path.exists(tmp_path / "runs" / "r") and not os.path.exists(tmp_path / "p")


def test_class2_ranges_accept_their_bounds_and_all(capsys):
    """The declared ranges are not tighter than the values they name: the largest seed trains (here: plans)."""
    import train
    assert train.main([*DRY, "--seed", str(2 ** 63 - 1), "--adam-betas", "0", "0.999", "--warmdown-ratio", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["seed"] == 2 ** 63 - 1
    assert core_eval.build_parser().parse_args(["--checkpoint", "x", "--max-per-task", "7"]).max_per_task == 7


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
    ("depth-twice", ["vanilla", "--depth", "1", "1"], "--depth names 1 twice; give each value once"),
    ("seed-twice", ["vanilla", "--seed", "0", "0"], "--seed names 0 twice"),
    ("replicate-depth-not-in-depths", ["vanilla", "--depth", "6", "8", "--seed", "0", "1", "--replicate-depths", "8",
                                       "10"], "--replicate-depths 10 is not a depth of this ladder (its depths: 6 8)"),
    ("replicate-depth-not-in-the-preset", ["vanilla", "--seed", "0", "1", "--replicate-depths", "7"],
     "--replicate-depths 7 is not a depth of this ladder"),
    ("depth-zero", ["vanilla", "--depth", "0", "6"], "argument --depth: must be a whole number in [1, 1024], got '0'"),
    ("seed-beyond-int64", ["vanilla", "--seed", str(2 ** 64)], "argument --seed: must be a whole number"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in CLASS5_LIST_CASES], ids=[c[0] for c in CLASS5_LIST_CASES])
def test_class5_ladder_run_lists(tmp_path, argv, message):
    """What ladder.sh launches is what `python train.py --ladder` lists (ladder.sh passes its options through)."""
    target, *options = argv
    assert_refused("train.py", ["--ladder", target, *options], tmp_path, message, runner=run_in_process)


def test_class5_multi_node_run_needs_master_addr(tmp_path):
    """NNODES > 1 without MASTER_ADDR would point every node at its own 127.0.0.1: refused before torchrun starts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!/usr/bin/env bash\ntouch {tmp_path}/launched\n")
    (bin_dir / "torchrun").chmod(0o755)
    env = dict(NNODES="2", NODE_RANK="1", MASTER_ADDR=None, RUNS_DIR=str(tmp_path / "runs"),
               PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert_refused("ladder.sh", ["vanilla", "--preset", "cpu", "--depth", "1"], tmp_path, "NNODES=2 needs MASTER_ADDR",
                   runner=ladder_with(env))
    assert not (tmp_path / "launched").exists()


def test_class5_dry_run_into_a_closed_pipe_is_quiet(tmp_path):
    """The reader (head) leaves after the launch lines; the summary train.py prints then meets a closed pipe."""
    err = tmp_path / "err"
    r = subprocess.run(["bash", "-c", f'bash ladder.sh vanilla --preset cpu --depth 1 2 --dry-run 2>{err} '
                        '| head -n 2 >/dev/null; exit "${PIPESTATUS[0]}"'], cwd=ROOT, timeout=300)
    assert err.read_text() == "" and r.returncode == 141, (r.returncode, err.read_text())




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


@pytest.mark.parametrize("env, message", [
    (dict(MASTER_ADDR=None, MASTER_PORT=None), "WORLD_SIZE=2 needs MASTER_ADDR and MASTER_PORT"),
    (dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=None), "WORLD_SIZE=2 needs MASTER_PORT"),
    (dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="x"), "MASTER_PORT must be a whole number"),
    (dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", LOCAL_WORLD_SIZE="3"),
     "LOCAL_WORLD_SIZE=3 does not divide the world size 2")])
def test_train_torchrun_environment_without_its_rendezvous(tmp_path, pool_copy, monkeypatch, env, message):
    """WORLD_SIZE=2 RANK=0 without MASTER_ADDR was torch's ValueError traceback after the run folder existed."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    for name, value in env.items():
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    assert_refused("train.py", RUN, tmp_path, message, runner=run_in_process)
    assert not os.path.exists(tmp_path / "runs")


# --- ladder.sh: pass-through flags, options a target ignores, environment values, relative paths ---
def fake_torchrun(tmp_path):
    """PATH with a torchrun that only records that it was started (in tmp_path/launched)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!/usr/bin/env bash\necho \"$*\" >> {tmp_path}/launched\n")
    (bin_dir / "torchrun").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


CPU_LADDER = ["vanilla", "--preset", "cpu", "--depth", "1", "2"]
LADDER_PASS_THROUGH_CASES = [  # (id, ladder options, arguments after --, message): each overrode what a run is
    ("depth", CPU_LADDER, ["--depth", "3"], "'--depth' after --: ladder.sh sets --depth itself; use ladder.sh's own --depth, before --"),
    ("depth-equals", CPU_LADDER, ["--depth=3"], "'--depth=3' after --: ladder.sh sets --depth itself"),
    ("depth-abbreviated", CPU_LADDER, ["--dep", "3"], "'--dep' after -- clashes with --depth"),
    ("arch", CPU_LADDER, ["--arch", "loop_2"], "ladder.sh sets --arch itself; name the arch as the first argument"),
    ("seed-with-seeds", [*CPU_LADDER, "--seed", "0", "1"], ["--seed", "5"], "ladder.sh sets --seed itself; use ladder"),
    ("preset-of-a-paper-ladder", ["vanilla", "--depth", "6"], ["--preset=cpu"], "ladder.sh sets --preset itself"),
    ("run-name", CPU_LADDER, ["--run-name", "x"], "ladder.sh sets --run-name itself"),
    ("runs-dir", CPU_LADDER, ["--runs-dir", "{d}/elsewhere"], "ladder.sh sets --runs-dir itself; use RUNS_DIR"),
    ("resume", CPU_LADDER, ["--resume"], "'--resume' after -- clashes with --resume-or-start"),
    ("data-dir-of-d26", ["untied_grow", "--preset", "d26"], ["--data-dir={d}"], "sets --data-dir itself; use DATA_DIR"),
    ("passes-of-the-grid", ["operator_1", "--preset", "data-constrained", "--depth", "18"], ["--passes", "2"],
     "ladder.sh sets --passes itself"),
]


@pytest.mark.parametrize("options, extra, message", [c[1:] for c in LADDER_PASS_THROUGH_CASES],
                         ids=[c[0] for c in LADDER_PASS_THROUGH_CASES])
def test_ladder_refuses_pass_through_flags_it_sets(tmp_path, options, extra, message):
    """Arguments after -- come last on train.py's command line: one the ladder sets trained depth 3 under the name
    vanilla_d1, or ran outside RUNS_DIR where the next invocation could not resume it."""
    assert_refused("ladder.sh", [*options, "--dry-run", "--", *extra], tmp_path, message, runner=run_ladder)


def test_ladder_refuses_a_pass_through_flag_before_it_launches_anything(tmp_path):
    env = dict(RUNS_DIR=str(tmp_path / "runs"), PATH=fake_torchrun(tmp_path))
    assert_refused("ladder.sh", [*CPU_LADDER, "--", "--depth", "3"], tmp_path, "ladder.sh sets --depth itself",
                   runner=ladder_with(env))
    assert not (tmp_path / "launched").exists() and not (tmp_path / "runs").exists()


def test_ladder_names_mfu_not_the_flag_it_fills(tmp_path, value="5"):
    """MFU reaches train.py --ladder-dry-run as --mfu: the refusal named a flag the user never gave."""
    line = assert_refused("ladder.sh", ["vanilla", "--depth", "6", "--dry-run"], tmp_path,
                          f"environment variable MFU must be a finite number in (0, 1], got '{value}'",
                          runner=ladder_with(dict(MFU=value)))
    assert "--mfu" not in line


def test_ladder_names_runs_dir_it_cannot_create(tmp_path):
    """A RUNS_DIR that is a file: mkdir's own message and exit 1 before; one line naming RUNS_DIR now."""
    (tmp_path / "file").write_text("not a folder")
    env = dict(RUNS_DIR=str(tmp_path / "file"), PATH=fake_torchrun(tmp_path))
    assert_refused("ladder.sh", ["vanilla", "--preset", "cpu", "--depth", "1"], tmp_path,
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
    r = ladder_from_work("vanilla", "--preset", "cpu", "--depth", "1", RUNS_DIR=str(tmp_path / "runs"),
                         DATA_DIR="pool", PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "data_dir").read_text() == f"{work}/pool\n"


# ------------------------------------------------------------------------------------------------ issue 31, class 5
# slow start-up work says what it is doing: train.py says it compiles before the first step
def test_issue31_class5_compiled_run_says_it_compiles_before_the_first_step(tmp_path, pool_copy, monkeypatch, capsys):
    import train
    printed = []
    monkeypatch.setattr(train, "compile_model", lambda model, plan, whole=False: printed.append(
        capsys.readouterr().out) or model)  # stand-in: the blocks stay eager, the test stays fast
    argv = [a.replace("{d}", str(tmp_path)) for a in [*RUN, "--stop-after", "1", "--compile"]]
    assert train.main(argv) == 0
    out = capsys.readouterr().out
    assert printed and "compiling: torch.compile compiles the blocks" in out
    assert out.index("compiling:") < out.index("step 1/")
