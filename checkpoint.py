"""A run's folder on disk: sharded checkpoints (save, verify, load, recover after a crash), the one-writer lock, and
where an invocation resumes from. train.py writes and resumes runs with it; core_eval.py reads weights with
load_checkpoint_model.

A checkpoint is a folder (checkpoints/latest, checkpoints/final) written by every rank through
torch.distributed.checkpoint (DCP), each rank its own shards: model/ (the weights, get_model_state_dict: FSDP2's
DTensor shards or a single process's tensors), optimizer/ (Muon's state by parameter name, AdamW's by
get_optimizer_state_dict), meta.json (RunState, plan, the weights' record: model_config, passes, tokenizer, step; RNG
state, args, Muon hyperparameters, micro-batches) and, written last, MANIFEST.json (size and sha256 of every file).
DCP reshards on load, so a checkpoint resumes on any number of processes, and load_checkpoint_model reads model/
without a process group. Format 2 (an earlier train.py: model.pt, muon/, adamw.pt) still resumes on one process and
loads in core_eval.py. Everything is tensors and plain types: every torch.load uses weights_only=True, and DCP's
metadata pickle goes through SafeMetadataReader.

    python -m pytest -q tests/test_checkpoint.py
"""
import contextlib
import fcntl
import json
import os
import pickle
import shutil
import socket
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

import muon
from arms import with_current_mode_names
from common import (EVAL_RECORD, FLAG, OBJECT, RESULT_SCHEMA, TRAJECTORY_LINE, UsageError, check_record,
                    check_regular_file, each, nullable, real, sha256_file, torchrun_ranks, whole, write_json, write_text)
from model import GPT, ModelConfig
from plan import schedule_notes

# DCP warns on every single-process save/load that it "assumes" one process: that is what one process means here
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


# ---------------------------------------------------------------------------------------------------------------------
# Reading a checkpoint's weights (core_eval.py, and train.py's resume)

CHECKPOINT_MANIFEST = "MANIFEST.json"  # {"files": {relative path: {"size", "sha256"}}}, written last by train.py
CHECKPOINT_WEIGHTS = "model.pt"  # format 2: model_config, passes, tokenizer, step and the fp32 weights
MODEL_SHARDS, OPTIMIZER_SHARDS = "model", "optimizer"  # format 3: DCP folders


def load_tensors(path, map_location, mmap=True):
    """torch.load(weights_only=True) of a file torch.save wrote -> its tensors and plain types, on map_location.
    mmap: a node's ranks resuming from the same file share its pages in the page cache instead of each reading a
    private copy (at d26 the weights file is 29 GB, on each of 8 ranks); for tensors the caller copies out of. Bytes
    torch.save did not write fail inside the unpickler in many ways (UnpicklingError, UnicodeDecodeError,
    IndexError, KeyError, EOFError, a zip RuntimeError, with a "pickle protocol" warning on stderr for some): all are
    one UnpicklingError here, so every caller refuses them with one message. A missing or unreadable file stays an
    OSError."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (OSError, pickle.UnpicklingError):
        raise
    except Exception as exc:
        raise pickle.UnpicklingError(f"{os.path.basename(path)} is not a file torch.save wrote "
                                     f"({type(exc).__name__})") from None


def verify_checkpoint(folder, only=None, share=(0, 1)):
    """Raise ValueError unless `folder` holds a complete train.py checkpoint: a manifest whose sizes and sha256 match
    every listed file (or only the listed file `only`; or, share=(rank, world), that rank's share of the files).
    A missing manifest means the save never finished."""
    manifest_path = os.path.join(folder, CHECKPOINT_MANIFEST)
    try:
        with open(manifest_path) as f:
            files = json.load(f)["files"]
    except FileNotFoundError:
        raise ValueError(f"checkpoint {folder} is incomplete (no {CHECKPOINT_MANIFEST}: its save did not finish)") \
            from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint {folder} has an unreadable {CHECKPOINT_MANIFEST} ({exc})") from None
    if not isinstance(files, dict) or not all(isinstance(w, dict) and {"size", "sha256"} <= w.keys()
                                              for w in files.values()):
        raise ValueError(f"checkpoint {folder} has an unreadable {CHECKPOINT_MANIFEST} (not a train.py manifest)")
    listed = lambda rel: only is None or rel == only or rel.startswith(only + "/")  # noqa: E731 (a file or a folder)
    if not any(map(listed, files)):
        raise ValueError(f"checkpoint {folder} is corrupted: its manifest does not list {only}")
    for rel, want in sorted(files.items())[share[0]::share[1]]:
        if not listed(rel):
            continue
        path = os.path.join(folder, rel)
        size = os.path.getsize(path) if os.path.isfile(path) else None
        if size != want["size"]:
            raise ValueError(f"checkpoint {folder} is truncated or corrupted: {rel} has "
                             f"{'no file' if size is None else f'{size} bytes'}, the manifest says {want['size']}")
        if sha256_file(path) != want["sha256"]:
            raise ValueError(f"checkpoint {folder} is corrupted: {rel} does not match its sha256 in the manifest")


def checkpoint_weights_path(path):
    """The weights to read for `path`: a checkpoint folder (its model/ shards, or format 2's model.pt, after the
    manifest check), its model.pt, or an old single-file checkpoint (latest.pt/final.pt). A run folder or
    checkpoints/ is named as such."""
    if os.path.isdir(path):
        if os.path.isdir(os.path.join(path, MODEL_SHARDS)):
            verify_checkpoint(path, only="meta.json")
            verify_checkpoint(path, only=MODEL_SHARDS)
            return os.path.join(path, MODEL_SHARDS)
        if os.path.isfile(os.path.join(path, CHECKPOINT_WEIGHTS)):
            verify_checkpoint(path, only=CHECKPOINT_WEIGHTS)
            return os.path.join(path, CHECKPOINT_WEIGHTS)
        inner = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
        found = [os.path.join(inner, n) for n in ("final", "latest", "final.pt", "latest.pt")
                 if os.path.exists(os.path.join(inner, n))]
        what = "a run folder" if inner != path else "a folder of checkpoints" if found else "not a checkpoint folder"
        hint = f"pass {found[0]}" if found else "pass a checkpoint folder such as runs/NAME/checkpoints/final"
        raise ValueError(f"checkpoint {path} is {what} (no {MODEL_SHARDS}/ or {CHECKPOINT_WEIGHTS}); {hint}")
    if not os.path.exists(path):
        raise ValueError(f"checkpoint {path} does not exist")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path) == CHECKPOINT_WEIGHTS and os.path.exists(os.path.join(folder, CHECKPOINT_MANIFEST)):
        verify_checkpoint(folder, only=CHECKPOINT_WEIGHTS)
    return path


def load_checkpoint_model(path, device="cpu"):
    """Rebuild a GPT from a train.py checkpoint -> (model in eval mode, its record: model_config, passes, tokenizer,
    step). Reads only the weights (never optimizer state): DCP's shards of any world size without a process group
    (their metadata through SafeMetadataReader), or format 2's model.pt with torch.load(weights_only=True); a pickle
    that would construct anything but tensors and plain types is rejected before it runs. The model is built on
    `device` as training built it (the embedding in embedding_dtype(device)) and loaded in place."""
    weights = checkpoint_weights_path(path)
    try:
        if os.path.isdir(weights):  # format 3: the record in meta.json, the weights from DCP's shards
            with open(os.path.join(os.path.dirname(weights), "meta.json")) as f:
                ckpt = dict(json.load(f)["weights"])
        else:
            ckpt = load_tensors(weights, map_location="cpu")
        ckpt["model_config"] = config = with_current_mode_names(ckpt["model_config"])
        model = GPT(ModelConfig(**config), device=device, draw_weights=False)  # every parameter is loaded below
        if os.path.isdir(weights):
            load_shards(weights, model.state_dict(), no_dist=True)  # the parameters themselves: loaded in place
        else:
            model.load_state_dict(ckpt.pop("model"))  # no mapping of the file outlives the call (a run may replace it)
        model.set_passes(int(ckpt["passes"]))
    except pickle.UnpicklingError:
        raise ValueError(f"checkpoint {weights} is not a usable model checkpoint: it is unreadable or holds objects "
                         "other than tensors and plain types (refused without running it)") from None
    except (Exception, dcp.api.CheckpointException) as exc:  # missing keys, shape mismatch: not a usable checkpoint
        exc = dcp_cause(exc)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"checkpoint {weights} is not a usable model checkpoint: {message}") from None
    return model.eval(), ckpt


# ---------------------------------------------------------------------------------------------------------------------
# Writing and resuming a checkpoint (collective under torchrun: every rank calls these)

@dataclass
class RunState:
    """What changes as a run trains; a checkpoint holds these fields at its top level."""
    step: int = 0
    evals: list = field(default_factory=list)
    growth_events: list = field(default_factory=list)
    flops: int = 0
    matrix_flops: int = 0        # without attention: the convention of the paper's data-constrained loop grid
    train_seconds: float = 0.0
    tokens: int = 0
    wall_seconds: float = 0.0    # every invocation's, from its first step (start-up excluded), resumes added
    eval_seconds: float = 0.0    # of that, in validations
    memory_measured: list = field(default_factory=list)  # train.record_memory: every rank's, per stage and invocation


def field_defaults(cls):
    """Every field of the dataclass cls that has a default, at it: a default_factory's called (docs/reliability.md:
    each persisted field added after the first release has one, so that a record written before it still reads)."""
    return {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(cls)
            if f.default is not MISSING or f.default_factory is not MISSING}


def run_state_of(meta):
    """The RunState a checkpoint's meta.json records; fields added since it was written at their defaults."""
    return RunState(**{**field_defaults(RunState), **{k: meta[k] for k in field_defaults(RunState) if k in meta}})


class SafeMetadataReader(dcp.FileSystemReader):
    """DCP's file reader with a safe .metadata: torch 2.13's FileSystemReader.read_metadata is a plain pickle.load
    (its tensor data is read with torch.load(weights_only=True)), so this one unpickles only DCP's metadata classes,
    and refuses non-tensor entries, which DCP's load planner would read with torch.load(weights_only=False)."""

    ALLOWED = {"torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                                         "ChunkStorageMetadata", "MetadataIndex", "StorageMeta",
                                                         "_MEM_FORMAT_ENCODING", "BytesStorageMetadata"},
               "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
               "torch.serialization": {"_get_layout"}, "torch": {"Size"}, "pathlib": {"PosixPath"},
               "collections": {"OrderedDict"}}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if name in SafeMetadataReader.ALLOWED.get(module, ()) or \
                    (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")

    def read_metadata(self, *args, **kwargs):
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            metadata = self.Unpickler(f).load()
        entries = getattr(metadata, "state_dict_metadata", None)
        if not isinstance(entries, dict) or not all(isinstance(v, dcp.metadata.TensorStorageMetadata)
                                                    for v in entries.values()):
            raise pickle.UnpicklingError("the metadata lists entries other than tensors")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp.metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def process():
    """(rank, world size) of this process."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def gather(obj):
    """Every rank's obj, in rank order (a list of one without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier():
    if dist.is_initialized():
        dist.barrier()


def write_manifest(folder):
    """Collective: every rank hashes its share of the files rank 0 lists (another node's listing of a shared
    filesystem may be stale), rank 0 writes MANIFEST.json (last: it marks the checkpoint complete)."""
    rank, world = process()
    names = gather(sorted(os.path.relpath(os.path.join(base, n), folder) for base, _, files in os.walk(folder)
                          for n in files) if rank == 0 else None)[0]
    mine = {rel: dict(size=os.path.getsize(os.path.join(folder, rel)), sha256=sha256_file(os.path.join(folder, rel)))
            for rel in names[rank::world]}
    parts = gather(mine)
    on_rank_0(lambda: write_json(os.path.join(folder, CHECKPOINT_MANIFEST),
                                 dict(files={k: v for part in parts for k, v in sorted(part.items())})))


def on_rank_0(write):
    """Collective: rank 0 runs write() while the other ranks wait. An OSError there (a full disk, a read-only or
    vanished folder) is raised on every rank, so that no rank waits forever for one that has stopped."""
    error = None
    if process()[0] == 0:
        try:
            write()
        except OSError as e:
            error = e
    reasons = gather(None if error is None else (error.errno, error.strerror or str(error)))
    if error is not None:
        raise error
    if reasons[0] is not None:
        raise OSError(*reasons[0])


def dcp_cause(exc):
    """The first failing rank's exception inside DCP's CheckpointException (a BaseException, not an Exception, whose
    text is every rank's whole traceback); any other exception as it is. DCP catches BaseException, so a signal
    (train.py's Stopped, KeyboardInterrupt) that lands inside it comes back wrapped: it is re-raised as itself, a
    stop and not a failed read or write."""
    if isinstance(exc, dcp.api.CheckpointException) and exc.failures:
        cause = min(exc.failures.items())[1][0]  # {rank: (exception, its stack)}
        if not isinstance(cause, Exception):
            raise cause
        return cause
    return exc


def failure_reason(exc):
    """One line for a failed write or read: an OSError's reason, or the type and first line of the error (inside
    DCP's CheckpointException: the first failing rank's)."""
    exc = dcp_cause(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def verify(folder):
    """Collective: the manifest check (verify_checkpoint), its files shared among the ranks -> UsageError on
    every rank when any share fails."""
    rank, world = process()
    try:
        verify_checkpoint(folder, share=(rank, world))
        error = None
    except ValueError as e:
        error = str(e)
    errors = [e for e in gather(error) if e]
    if errors:
        raise UsageError(errors[0])


def optimizer_state(model, optimizers):
    """The optimizers' state as DCP saves and loads it, references to the live tensors: Muon's by parameter name
    (Muon.state_dict; its hyperparameters go to meta.json), AdamW's by get_optimizer_state_dict (parameter names)."""
    out = {}
    for opt in optimizers:
        if isinstance(opt, muon.Muon):
            out["muon"] = {k: v for k, v in opt.state_dict().items() if k != "param_groups"}
        else:  # the hyperparameters come from the plan; DCP holds tensors only (SafeMetadataReader)
            out["adamw"] = get_optimizer_state_dict(model, opt)["state"]
    return out


def save_checkpoint(folder, model, optimizers, state, plan, args=None, micro_batches=None):
    """Collective: write checkpoint `folder` into folder.tmp, then swap it in (folder -> folder.old, folder.tmp ->
    folder, remove folder.old); recover_checkpoints repairs a crash between the renames. Every rank writes its own
    shards of the weights and the optimizer state (DCP); nothing is copied or gathered. meta.json records the
    micro-batches per pass stage. A write that fails on any rank (a full disk) raises on every rank (OSError, or
    DCP's CheckpointException) and leaves `folder` as it was (the caller removes folder.tmp; recover_checkpoints does
    after a crash)."""
    world = process()[1]
    tmp = folder + ".tmp"

    def start():
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    on_rank_0(start)
    for name, tensors in ((MODEL_SHARDS, get_model_state_dict(model)), (OPTIMIZER_SHARDS, optimizer_state(model, optimizers))):
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(os.path.join(tmp, name)), no_dist=world == 1)
    matrix = [opt for opt in optimizers if isinstance(opt, muon.Muon)]

    def write_meta():
        plan_dict = plan.as_dict()
        muon_groups = [{k: v for k, v in g.items()} for g in matrix[0].state_dict()["param_groups"]] if matrix else []
        write_json(os.path.join(tmp, "meta.json"), dict(
            format=CHECKPOINT_FORMAT, plan=plan_dict, world_size=world, rng=torch.get_rng_state().tolist(),
            weights=dict(model_config=plan_dict["model_config"], passes=plan.passes_final, tokenizer=plan.tokenizer,
                         step=state.step),
            muon_param_groups=muon_groups, args=primitive_args(args),
            micro_batches=list(micro_batches) if micro_batches else None, **asdict(state)))
    on_rank_0(write_meta)
    write_manifest(tmp)

    def swap_in():
        if os.path.exists(folder):
            os.replace(folder, folder + ".old")
        os.replace(tmp, folder)
        shutil.rmtree(folder + ".old", ignore_errors=True)
        remove_dead_temp_files(os.path.dirname(folder))
    on_rank_0(swap_in)


CHECKPOINT_FORMAT = 3  # 2: model.pt + muon/ + adamw.pt (resumes on one process); 1: latest.pt/final.pt (core_eval)

# A checkpoint's meta.json, field -> rule (common.check_record; "name?": may be absent; the run records' schemas are in
# common.py), checked before any field is used: a record of the wrong shape (edited, its manifest rehashed) is one
# line naming the file and field.
META_SCHEMA = {  # a checkpoint's meta.json (save_checkpoint writes it)
    "format": whole(1), "plan": OBJECT, "world_size": whole(1), "rng": each(whole(0, 255)),
    "muon_param_groups": each(OBJECT), "args?": OBJECT, "fixed_reduce_order?": FLAG, "weights?": OBJECT,
    "micro_batches?": nullable(each(whole(1))), "step": whole(0), "evals": each(EVAL_RECORD),
    "growth_events": each({"step": whole(0)}), "flops": real(0), "matrix_flops": real(0), "train_seconds": real(0),
    "tokens": whole(0), "wall_seconds?": real(0), "eval_seconds?": real(0), "memory_measured?": each(OBJECT)}
CHECKPOINT_FIX = "resume from an intact checkpoint or start the run again under another --run-name"


def read_meta(folder):
    """A checkpoint's meta.json, checked against META_SCHEMA (the caller has checked it against the manifest)."""
    path = os.path.join(folder, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} is unreadable ({e}); {CHECKPOINT_FIX}") from None
    return check_record(path, meta, META_SCHEMA, CHECKPOINT_FIX)


def primitive_args(args):
    """The command line as a dict of JSON primitives (for the record; the plan decides what a resume must match)."""
    if args is None:
        return {}
    return {k: v for k, v in vars(args).items()
            if v is None or isinstance(v, (bool, int, float, str)) or
            (isinstance(v, list) and all(isinstance(x, (bool, int, float, str)) for x in v))}


def load_checkpoint(folder, plan, model, optimizers, device):
    """Collective: restore weights, optimizer and RNG state written by save_checkpoint under the same plan, at any
    world size (DCP reshards) -> RunState (the caller sets the model's passes for its step). Format 2 (an earlier
    train.py) resumes on one process. A checkpoint that fails its manifest, its plan, its own records
    (check_self_consistent) or its loading is a UsageError."""
    verify(folder)
    meta = read_meta(folder)
    fmt = meta.get("format")
    if fmt not in (2, CHECKPOINT_FORMAT):
        raise UsageError(f"{folder} was written by another checkpoint format ({fmt!r}); start the run again under "
                         "another --run-name")
    check_resumable(folder, process()[1])
    check_plan(folder, meta.get("plan"), plan)
    try:
        if fmt == 2:
            load_format_2(folder, meta, plan, model, optimizers, device)
        else:
            check_self_consistent(folder, meta.get("weights") or {}, meta, plan)
            weights = get_model_state_dict(model)
            load_shards(os.path.join(folder, MODEL_SHARDS), weights)
            set_model_state_dict(model, weights)
            tensors = optimizer_state(model, optimizers)
            load_shards(os.path.join(folder, OPTIMIZER_SHARDS), tensors)
            for opt in optimizers:
                if isinstance(opt, muon.Muon):
                    opt.load_state_dict(dict(tensors["muon"], param_groups=meta["muon_param_groups"]))
                else:
                    groups = get_optimizer_state_dict(model, opt)["param_groups"]
                    set_optimizer_state_dict(model, opt, dict(state=tensors["adamw"], param_groups=groups))
        torch.set_rng_state(torch.tensor(meta["rng"], dtype=torch.uint8))
        state = run_state_of(meta)
    except UsageError:
        raise
    except (Exception, dcp.api.CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        # missing files or keys, another model's shapes, a damaged DCP shard: not this run's checkpoint
        cause = dcp_cause(e)
        if isinstance(cause, pickle.UnpicklingError):
            detail = f" ({cause})" if len(str(cause)) < 120 else ""  # ours are short; torch's weights_only is a page
            raise UsageError(f"checkpoint {folder} is unreadable or holds objects other than tensors and plain types"
                             f"{detail}; refused without running it") from None
        where = "its shards do not load: " if cause is not e else ""
        raise UsageError(f"checkpoint {folder} is not usable: {where}{failure_reason(cause)}") from None
    return state


def load_shards(path, template, no_dist=None):
    """dcp.load into `template` in place (its tensors are the live ones), the metadata read safely first; no_dist
    (default: no process group) reads every shard on this process alone."""
    reader = SafeMetadataReader(path)
    reader.read_metadata()  # refuses a crafted pickle here, with its own message
    dcp.load(template, storage_reader=reader, no_dist=not dist.is_initialized() if no_dist is None else no_dist)


def load_format_2(folder, meta, plan, model, optimizers, device):
    """An earlier train.py's checkpoint, on one process: model.pt's weights, muon/ (DCP), adamw.pt."""
    weights = load_tensors(os.path.join(folder, CHECKPOINT_WEIGHTS), map_location="cpu")
    check_self_consistent(folder, weights, meta, plan, CHECKPOINT_WEIGHTS)
    model.load_state_dict(weights["model"])
    for opt in optimizers:
        if isinstance(opt, muon.Muon):
            template = dict(muon={k: v for k, v in opt.state_dict().items() if k != "param_groups"})
            load_shards(os.path.join(folder, "muon"), template)
            opt.load_state_dict(dict(template["muon"], param_groups=meta["muon_param_groups"]))
    load_adamw([opt for opt in optimizers if isinstance(opt, torch.optim.AdamW)], folder, device)


def load_adamw(optimizers, folder, device):
    """AdamW's state from adamw.pt: the moments onto their parameters' device (load_state_dict moves them there from
    the host), each "step" kept on the host, where a fresh AdamW has it: a step count on the GPU costs an .item()
    sync per parameter in every later step. On CPU AdamW adopts the loaded tensors as its state: mapped, they would
    keep the file open all run (on NFS its deletion at the next save then leaves latest.old behind, and the save
    after that fails); elsewhere the file is mapped and the steps copied out of it."""
    saved_all = load_tensors(os.path.join(folder, "adamw.pt"), map_location="cpu", mmap=device.type != "cpu")
    for opt, saved in zip(optimizers, saved_all, strict=True):
        for state in saved["state"].values():
            state["step"] = state["step"].clone()
        opt.load_state_dict(saved)


def check_self_consistent(folder, weights, meta, plan, source="the weights record"):
    """What the weights' record (meta.json's "weights"; format 2: model.pt, `source`) says about itself must agree
    with meta.json and the plan: a checkpoint put together from two
    saves, or edited and rehashed, would otherwise resume at the wrong step, or under another model's record."""
    fix = "resume from an intact checkpoint or start the run again under another --run-name"
    step = meta.get("step")
    if weights.get("step") != step:
        raise UsageError(f"checkpoint {folder} is inconsistent: meta.json says step {step!r} but {source} holds step "
                         f"{weights.get('step')!r}; {fix}")
    if not isinstance(step, int) or not 0 <= step <= plan.steps:
        raise UsageError(f"checkpoint {folder} is inconsistent: step {step!r} is outside the plan's 0..{plan.steps}; "
                         f"{fix}")
    grown, before = [e["step"] for e in meta.get("growth_events", [])], [c for c in plan.crossover_steps if c < step]
    if grown not in (before, before + [step] if step in plan.crossover_steps else before):
        raise UsageError(f"checkpoint {folder} is inconsistent: it records growth at steps {grown} but by step {step} "
                         f"the plan grows at {before or 'no step'}; {fix}")
    for key, planned in (("tokenizer", plan.tokenizer), ("passes", plan.passes_final)):
        if weights.get(key) != planned:
            raise UsageError(f"checkpoint {folder} is inconsistent: {source} was written for {key} "
                             f"{weights.get(key)!r} but the plan uses {planned!r}; {fix}")
    config, planned = with_added_fields(weights.get("model_config"), ModelConfig), plan.as_dict()["model_config"]
    differ = [k for k in planned if not isinstance(config, dict) or config.get(k) != planned[k]]
    if differ:
        have = config.get(differ[0]) if isinstance(config, dict) else config
        raise UsageError(f"checkpoint {folder} is inconsistent: {source} holds another model than the plan's "
                         f"({differ[0]} {have!r}, planned {planned[differ[0]]!r}); {fix}")


def check_resumable(folder, world):
    """On resume, before any long work: refused in one line, a run recorded with --fixed-reduce-order (retired with
    the home-made gradient transport, whose fixed summation order it needed), and on several processes a checkpoint
    of format 2 (an earlier train.py's replicated weights). A meta.json that fails the manifest is left to
    load_checkpoint's check."""
    try:
        verify_checkpoint(folder, only="meta.json")
    except ValueError:
        return
    meta = read_meta(folder)
    if meta.get("fixed_reduce_order"):
        raise UsageError(f"{folder} was trained with --fixed-reduce-order, which this train.py no longer has (FSDP2 "
                         "sums gradients in its own order); its weights still load in core_eval.py, and the run "
                         "continues only under the train.py that started it")
    if meta.get("format") == 2 and world > 1:
        raise UsageError(f"{folder} was written by an earlier train.py (checkpoint format 2), which resumes on one "
                         "process only: continue it once without torchrun (the run's flags with --resume --stop-after "
                         f"{meta['step'] + 1}); the checkpoint that writes resumes on any number of processes")


def read_run_state(folder):
    """The RunState of a checkpoint (after its manifest check), without loading any tensor."""
    verify(folder)
    return run_state_of(read_meta(folder))


def checkpoint_step(folder):
    """The step of a complete checkpoint folder, None if it is not complete."""
    try:
        verify_checkpoint(folder)
        return read_meta(folder)["step"]
    except (ValueError, UsageError):
        return None


def recover_checkpoints(ckpt_dir):
    """Rank 0 at start: after a crash inside a save, keep the newest complete copy of latest/ and final/ (among X,
    X.old, X.tmp) as X and remove the other copies; remove temporary files of dead writers."""
    for name in ("latest", "final"):
        copies = [os.path.join(ckpt_dir, name + suffix) for suffix in ("", ".old", ".tmp")]
        present = [c for c in copies if os.path.isdir(c)]
        if present in ([], [copies[0]]):
            continue  # nothing interrupted: a lone folder is left as it is, even if incomplete (resume says so)
        steps = {c: checkpoint_step(c) for c in present}
        complete = [c for c in present if steps[c] is not None]
        best = max(complete, key=lambda c: (steps[c], c == copies[0])) if complete else None
        for c in present:
            if c != best and (best is not None or c == copies[2]):
                shutil.rmtree(c)
        if best is not None and best != copies[0]:
            os.replace(best, copies[0])
    remove_dead_temp_files(ckpt_dir)


def remove_dead_temp_files(folder):
    """Delete common.atomic_write's leftovers (NAME.tmp<pid>) whose writer process no longer runs on this host."""
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        stem, sep, pid = name.rpartition(".tmp")
        if not (sep and stem and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            path = os.path.join(folder, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        except PermissionError:
            pass  # alive, another user's


# ---------------------------------------------------------------------------------------------------------------------
# The run folder: where an invocation starts, one writer at a time, result.json and trajectory.jsonl

def read_result(run_dir):
    """result.json as a dict (None when there is none yet)."""
    path = os.path.join(run_dir, "result.json")
    fix = "move it away or choose another --run-name"
    check_regular_file(path, fix)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, ValueError):
        raise UsageError(f"{path} is not a train.py result.json; {fix}") from None
    return check_record(path, result, RESULT_SCHEMA, fix)


def run_status(run_dir):
    """result.json's status (None when there is none yet)."""
    result = read_result(run_dir)
    return result["status"] if result else None


def with_added_fields(record, cls):
    """A plan or model_config (cls: Plan or ModelConfig) as a run recorded it, in today's terms: the core modes'
    earlier names (arms.with_current_mode_names), and every field of cls added since the record was written at its
    default, which is what the earlier code ran (each field added after the first release has one, so that earlier
    runs resume, load and match their command: tests/test_arms.py)."""
    record = with_current_mode_names(record)
    if not isinstance(record, dict):
        return record
    return {**field_defaults(cls), **record}


def check_plan(where, recorded, plan):
    """The plan `where` (a run's result.json or a checkpoint's meta.json) records must be `plan`, or one line names
    the first differing field and both values. Compared: the Plan's fields, what the run trains; not the accounting
    derived from them (parameter and FLOP counts), so that an accounting fix leaves finished runs finished."""
    requested = json.loads(json.dumps(plan.as_dict()))
    recorded = with_added_fields(recorded, type(plan)) if isinstance(recorded, dict) else {}
    for key in [f.name for f in fields(plan) if f.name != "total_flops"]:
        have, want = recorded.get(key, "nothing"), requested[key]
        if key == "model_config" and isinstance(have, dict):
            have = with_added_fields(have, ModelConfig)
            key, have, want = next(((f"model_config.{k}", have.get(k, "nothing"), v) for k, v in want.items()
                                    if have.get(k, "nothing") != v), (key, have, want))
        if have != want:
            raise UsageError(f"{where} holds another run than this command plans: {key} {have!r} there, {want!r} "
                             "here; pass that run's own flags, or another --run-name for this one")


def check_recorded_plan(run_dir, resume_from, plan):
    """Before any long work: what the run recorded (a complete run's result.json, else the checkpoint's meta.json)
    is this command's plan. An unreadable meta.json is left to load_checkpoint's manifest check."""
    if resume_from == "complete":
        check_plan(run_dir, read_result(run_dir).get("plan"), plan)
        return
    with contextlib.suppress(ValueError):
        verify_checkpoint(resume_from, only="meta.json")
        meta = read_meta(resume_from)
        if meta.get("format") in (2, CHECKPOINT_FORMAT):
            check_plan(resume_from, meta.get("plan"), plan)


def pool_identity(manifest):
    """A pool's identity wherever it lies: the sha256 of each split's tokens in its corpus.json (data.py), as
    result.json's data_manifest also records it. {} for no record."""
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    if not isinstance(splits, dict):
        return {}
    return {name: info.get("sha256") if isinstance(info, dict) else None for name, info in sorted(splits.items())}


def check_same_pool(run_dir, data_dir, manifest):
    """A run continues only on the pool it trained on (same token hashes; the path may change): result.json records
    the pool of every invocation, each checked here before it wrote."""
    result = read_result(run_dir) or {}
    recorded = pool_identity(result.get("data_manifest"))
    if recorded and recorded != pool_identity(manifest):
        raise UsageError(f"{run_dir} was trained on the pool {result.get('data_dir')!r}, and {data_dir} is another "
                         f"pool (other token sha256 in its corpus.json); pass --data-dir with the run's pool (moved "
                         "is fine), or another --run-name")


def resume_point(args, run_dir, rank):
    """Where this invocation starts, never guessed: "complete" (nothing to do), a checkpoint folder (final/ when the
    run finished training but its result.json was not written), or None (step 0 of a new run). Refuses to start
    over an existing run, and --resume without a checkpoint (--resume-or-start starts such a run at step 0)."""
    status, ckpt_dir = run_status(run_dir), os.path.join(run_dir, "checkpoints")
    trajectory = os.path.join(run_dir, "trajectory.jsonl")  # empty files of a start killed at once do not count
    started = status is not None or (os.path.exists(trajectory) and os.path.getsize(trajectory) > 0) or \
        (os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir) != [])
    if not (args.resume or args.resume_or_start):
        if started:
            raise UsageError(f"{run_dir} already holds a run; pass --resume to continue it or choose another "
                             "--run-name")
        return None
    if status == "complete":
        return "complete"
    for name in ("final", "latest"):  # else training would end in an error at the last step's save or rename
        path = os.path.join(ckpt_dir, name)
        if os.path.lexists(path) and not os.path.isdir(path):
            raise UsageError(f"{path} is a file, not a checkpoint folder; move it away, then resume")
    if rank == 0 and os.path.isdir(ckpt_dir):
        recover_checkpoints(ckpt_dir)
    barrier()
    for name in ("final", "latest"):
        if os.path.isdir(os.path.join(ckpt_dir, name)):
            return os.path.join(ckpt_dir, name)
    old = [n for n in ("final.pt", "latest.pt") if os.path.exists(os.path.join(ckpt_dir, n))]
    if old:
        raise UsageError(f"{os.path.join(ckpt_dir, old[0])} is a single-file checkpoint of an earlier train.py, "
                         "which cannot be resumed (core_eval.py still reads it); start the run again under another "
                         "--run-name")
    if args.resume:
        raise UsageError(f"--resume: {run_dir} has no checkpoint to resume from ({ckpt_dir}/latest); pass "
                         "--resume-or-start to start it at step 0")
    return None


LOCK_FILE = "train.lock"             # in the run folder; holds "PID n on host" of the writer
FOREIGN_OK = (LOCK_FILE, "train.log", "ladder.lock")  # what may be in a fresh run's folder (ladder.sh's log, lock)


def run_dir_of(args):
    return os.path.join(args.runs_dir, args.run_name or f"{args.arch}_d{args.depth}")


def make_run_dir(run_dir):
    """The run folder exists and is writable after this, or a one-line error says why not."""
    for path, what in ((os.path.dirname(run_dir), "--runs-dir"), (run_dir, "the run folder")):
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"{what} {path} is a file, not a directory; pass another --runs-dir or --run-name")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the run folder {run_dir}: {e.strerror}; pass a writable --runs-dir") from None
    if not os.access(run_dir, os.W_OK):
        raise UsageError(f"the run folder {run_dir} is not writable (read-only filesystem or permissions); pass a "
                         "writable --runs-dir")


@contextlib.contextmanager
def run_lock(args):
    """One writer per run: rank 0 (the only rank that writes the run folder) holds an exclusive flock on
    <run dir>/train.lock for its whole life; the kernel drops it when the process dies, however it dies. A second
    train.py or ladder.sh on the same run stops here (exit 2) naming the holder, instead of interleaving checkpoints
    and trajectory lines. Taken before anything in the run folder is written. (flock is per host on most network
    filesystems: two nodes writing one run folder are not detected.)"""
    if torchrun_ranks()[0] != 0:
        yield
        return
    run_dir = run_dir_of(args)
    make_run_dir(run_dir)
    path = os.path.join(run_dir, LOCK_FILE)
    try:
        lock = open(path, "a+")
    except OSError as e:
        raise UsageError(f"cannot open the lock file {path}: {e.strerror}; pass a writable --runs-dir") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "a process that has not written its PID yet"
            raise UsageError(f"{run_dir} is being written by another train.py ({holder}); wait for it to finish or "
                             "stop that process first") from None
        try:  # unbuffered: a full disk fails here, not again when the file is closed
            lock.truncate(0)
            os.write(lock.fileno(), f"PID {os.getpid()} on {socket.gethostname()}\n".encode())
        except OSError as e:
            raise UsageError(f"cannot write the lock file {path}: {e.strerror}; free space or pass a writable "
                             "--runs-dir") from None
        check_fresh_run_dir(run_dir, args.resume or args.resume_or_start)
        yield


def check_fresh_run_dir(run_dir, resume):
    """A new run (no --resume) goes only into an empty folder or one ladder.sh prepared: never over someone's files.
    (A folder with a result.json or a checkpoint is a started run, resume_point's case: continue it with --resume.)"""
    if resume or os.path.exists(os.path.join(run_dir, "result.json")) or \
            os.path.isdir(os.path.join(run_dir, "checkpoints", "latest")):
        return
    def ours_and_empty(name):  # what a run killed before its first result.json leaves behind
        path = os.path.join(run_dir, name)
        return name in ("checkpoints", "trajectory.jsonl") and (os.listdir(path) == [] if os.path.isdir(path)
                                                                 else os.path.getsize(path) == 0)
    foreign = sorted(name for name in os.listdir(run_dir) if name not in FOREIGN_OK and not ours_and_empty(name))
    if foreign:
        raise UsageError(f"{run_dir} is not empty ({foreign[0]}, ...) and holds no train.py run; choose another "
                         "--run-name or --runs-dir")


@dataclass
class Run:
    """A run's fixed context: its plan, process, batches, output paths and data (train.new_run builds it)."""
    plan: object                 # plan.Plan
    rank: int
    world: int
    device: torch.device
    loader: object               # data.TrainLoader (or bench.SyntheticLoader)
    micro_batches: tuple         # sequences per micro-batch in each pass stage (the memory plan's)
    per_node: int                # ranks per node: the mesh's shard dimension (train.build_mesh)
    memory: dict                 # memory_report of the memory plan, for result.json
    environment: dict
    peak_flops: float            # of all ranks together, for MFU (None off CUDA)
    args: object                 # the parsed command line (recorded in checkpoints)
    run_dir: str = ""            # the folder, data and validation windows ("" and None for bench.py's runs)
    data_dir: str = ""
    data_manifest: dict = field(default_factory=dict)
    data_check: str = None       # "verified" or "skipped (--no-verify)": whether the pool's sha256 were checked
    val: torch.Tensor = None
    token_bytes: torch.Tensor = None
    resume_from: str = None      # the checkpoint folder this invocation continues from (None: step 0)

    master = property(lambda self: self.rank == 0)
    ckpt_dir = property(lambda self: os.path.join(self.run_dir, "checkpoints"))
    latest = property(lambda self: os.path.join(self.ckpt_dir, "latest"))
    final = property(lambda self: os.path.join(self.ckpt_dir, "final"))
    result_path = property(lambda self: os.path.join(self.run_dir, "result.json"))
    trajectory_path = property(lambda self: os.path.join(self.run_dir, "trajectory.jsonl"))


def open_trajectory(run, step):
    """trajectory.jsonl cut back to the first `step` lines (the checkpoint resumed from), open for appending; the
    lines kept are checked against TRAJECTORY_LINE."""
    lines = open(run.trajectory_path).readlines() if os.path.exists(run.trajectory_path) else []
    fix = "restore the file or start the run again under another --run-name"
    if len(lines) < step:  # on every rank, so that all of them stop
        raise UsageError(f"{run.trajectory_path} has {len(lines)} lines but the checkpoint is at step {step}; {fix}")
    for number, line in enumerate(lines[:step], 1):
        try:
            record = json.loads(line)
        except ValueError:
            raise UsageError(f"{run.trajectory_path}:{number} is not a JSON line; {fix}") from None
        check_record(f"{run.trajectory_path}:{number}", record, TRAJECTORY_LINE, fix)
    if not run.master:
        return None
    os.makedirs(run.ckpt_dir, exist_ok=True)
    if len(lines) > step:
        write_text(run.trajectory_path, "".join(lines[:step]))
    return open(run.trajectory_path, "a")


def write_result(run, state, status, mfu=None, **extra):
    """result.json: the run's plan, environment and progress; the final_* numbers only once it is complete (a
    running, stopped or failed run's last validation is last_eval)."""
    if not run.master:
        return
    evals, final = state.evals, status == "complete" and bool(state.evals)
    write_json(run.result_path, dict(  # the keys fit.py and the tests read
        status=status, arch=run.plan.arch, depth=run.plan.depth, plan=run.plan.as_dict(),
        schedule_notes=schedule_notes(run.plan), world_size=run.world, device_batch_size=list(run.micro_batches),
        memory=run.memory,
        gradient_accumulation_steps=[s["accumulation"] for s in run.memory["stages"]], data_dir=run.data_dir,
        environment=run.environment, data_manifest=run.data_manifest, data_check=run.data_check,
        completed_steps=state.step, evals=evals, growth_events=state.growth_events,
        last_eval=evals[-1] if evals else None, final_val_loss=evals[-1]["val_loss"] if final else None,
        best_val_loss=min((e["val_loss"] for e in evals), default=None) if final else None,
        final_val_bpb=evals[-1]["val_bpb"] if final else None, estimated_training_flops=state.flops,
        tokens_seen=state.tokens, estimated_matrix_flops=state.matrix_flops,
        total_training_time_seconds=state.train_seconds, wall_seconds=state.wall_seconds,
        eval_seconds=state.eval_seconds, memory_measured=state.memory_measured,
        tokens_per_second=state.tokens / state.train_seconds if state.train_seconds else None,
        last_train_mfu=mfu, final_checkpoint_path=run.final, **extra))
