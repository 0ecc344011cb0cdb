"""The bad-input contract the tests/test_bad_*.py files share: a refused call exits 2 with exactly one line on
stderr, no traceback, and leaves every file that existed before it byte-identical; and the tiny runs, pools and
bundles their cases start from. Scripts with a main(argv) run in-process (fast: no interpreter start per case; an
uncaught exception fails the test just as a traceback would); the others as `python SCRIPT ...` subprocesses."""
import contextlib, importlib, io, json, os, subprocess, sys


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


TINY = ["--preset", "cpu", "--width-per-depth", "16", "--head-dim", "16", "--seq-len", "32", "--total-batch-tokens",
        "256", "--val-tokens", "1024", "--warmup-steps", "0", "--data-dir", "{d}/pool", "--runs-dir", "{d}/runs"]
RUN = ["--arch", "vanilla", "--depth", "2", *TINY, "--steps", "4", "--run-name", "r"]
PREP = ["prepare", "--corpus", "stdlib", "--tokenizer", "bytes", "--train-tokens", "1000", "--val-tokens", "1000"]


def bundle_files(rows=None, spec=None, prefix="b"):
    """A one-task bundle: an MC task whose rows are given as raw JSONL lines."""
    rows = rows or [json.dumps(dict(query=f"q{i}", choices=["x", "y"], gold=i % 2)) for i in range(4)]
    spec = spec or dict(label="t", dataset_uri="t.jsonl", num_fewshot=[0], icl_task_type="multiple_choice")
    import yaml
    return {f"{prefix}/core.yaml": yaml.safe_dump(dict(icl_tasks=[spec])),
            f"{prefix}/eval_meta_data.csv": "Eval Task,Random baseline\nt,50\n",
            f"{prefix}/eval_data/t.jsonl": "\n".join(rows) + "\n"}


EVAL = ["--checkpoint", "{ckpt}", "--bundle-dir", "{d}/b", "--seed", "0", "--out", "{d}/eval.json"]
