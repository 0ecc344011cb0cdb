"""Bad input across the scripts: every case must exit 2 with exactly one line on stderr, no traceback, and leave
every file that existed before the call byte-identical. One case table per script; each case is (id, files to
create under the case's directory, argv with {d} for that directory, a phrase the message must contain).
Scripts with a main(argv) run in-process (fast: no interpreter start per case; an uncaught exception fails the
test just as a traceback would); the others as `python SCRIPT ...` subprocesses."""
import contextlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys

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
    ("noise-zero", GOOD, ["ladders", "{d}/l.csv", "--noise", "0"], "--noise: must be a finite number > 0"),
    ("bootstrap-negative", GOOD, ["ladders", "{d}/l.csv", "--bootstrap=-5"], "--bootstrap must be >= 0"),
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
    import cli
    names = sorted(os.path.relpath(os.path.join(b, n), folder) for b, _, ns in os.walk(folder) for n in ns
                   if n != "MANIFEST.json")
    files = {n: dict(size=os.path.getsize(os.path.join(folder, n)), sha256=cli.sha256_file(os.path.join(folder, n)))
             for n in names}
    with open(os.path.join(folder, "MANIFEST.json"), "w") as f:
        json.dump(dict(files=files), f)


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def random_bytes(path):
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(os.urandom(size))


def edit_manifest_sha(latest):
    manifest = json.load(open(os.path.join(latest, "MANIFEST.json")))
    manifest["files"]["meta.json"]["sha256"] = "0" * 64
    with open(os.path.join(latest, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f)


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
    ("eval-random-bytes-file", lambda r, m: open(f"{r}/final.pt", "wb").write(os.urandom(4096)), "core_eval.py",
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
