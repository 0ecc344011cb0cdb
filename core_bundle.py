"""core_bundle.py — the DCLM CORE bundle on disk, for core_eval.py: downloaded and safely extracted, its content
fingerprint, and its tasks read from core.yaml, eval_meta_data.csv and each task's JSONL, every row checked against its
task type before any task runs (a bad row is one line naming file:line).

    python core_eval.py --checkpoint CKPT --bundle-dir ../shared/eval_bundle_partial   # an extracted bundle
    python core_eval.py --checkpoint CKPT       # downloads it once into .cache/eval_bundle next to core_eval.py
"""
import csv
import hashlib
import json
import os
import shutil
import tempfile
import zipfile

import yaml

from common import DownloadError, UsageError, download, sha256_file

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
    try:
        with open(os.path.join(bundle_dir, "core.yaml")) as f:
            config = yaml.safe_load(f)
        with open(os.path.join(bundle_dir, "eval_meta_data.csv"), newline="") as f:
            baselines = {row["Eval Task"]: float(row["Random baseline"]) for row in csv.DictReader(f)}
    except (OSError, yaml.YAMLError, KeyError, ValueError) as e:
        raise UsageError(f"bad CORE bundle in {bundle_dir}: cannot read core.yaml / eval_meta_data.csv ({e})")
    if not isinstance(config, dict) or not config.get("icl_tasks"):
        raise UsageError(f"bad CORE bundle in {bundle_dir}: core.yaml has no icl_tasks list")
    tasks = []
    for number, spec in enumerate(config["icl_tasks"], 1):
        missing = [k for k in ("label", "dataset_uri", "icl_task_type", "num_fewshot")
                   if not isinstance(spec, dict) or spec.get(k) in (None, "", [])]
        if missing:
            raise UsageError(f"bad CORE bundle: icl_tasks entry {number} of {bundle_dir}/core.yaml has no "
                             f"{', '.join(missing)}")
        label = spec.get("label")
        if spec.get("icl_task_type") not in TASK_TYPES:
            raise UsageError(f"task {label}: unknown icl_task_type {spec.get('icl_task_type')!r} "
                             f"(expected one of {', '.join(TASK_TYPES)})")
        if label not in baselines:
            raise UsageError(f"task {label}: no 'Random baseline' row in {bundle_dir}/eval_meta_data.csv")
        path = os.path.join(bundle_dir, "eval_data", spec["dataset_uri"])
        items = read_task_items(label, spec["icl_task_type"], path)
        if not isinstance(spec["num_fewshot"], list) or not isinstance(spec["num_fewshot"][0], int) \
                or spec["num_fewshot"][0] < 0:
            raise UsageError(f"task {label}: num_fewshot in {bundle_dir}/core.yaml must be a list like [10]")
        tasks.append(dict(label=label, type=spec["icl_task_type"], shots=int(spec["num_fewshot"][0]),
                          delimiter=spec.get("continuation_delimiter") or " ", baseline=baselines[label], items=items))
    return tasks


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
