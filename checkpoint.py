"""A run's folder on disk: checkpoints the torchtitan way, where an invocation resumes from and the one-writer lock
(train.py); the weights of a checkpoint (load_checkpoint_model: core_eval.py).

RUN/checkpoints/step_000120/ is one checkpoint: torch.distributed.checkpoint (DCP) writes every rank's shards of the
model and the optimizers (DCP reshards on load: any number of processes resumes it) and rank 0 meta.json (RunState,
plan, RNG state). A save writes step_N.tmp and renames it once DCP's .metadata (written last) is there, so a step_N or
final/ (the last step's, renamed) with .metadata is complete; the newest complete one wins. Nothing else is read, and
no complete checkpoint is deleted before a newer complete one exists (KEEP are kept). docs/reliability.md.

    python -m pytest -q tests/test_checkpoint.py
"""
import fcntl
import json
import os
import shutil
import socket
import warnings
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

import muon
from common import UsageError, torchrun_env, write_json
from model import GPT, ModelConfig

warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

KEEP = 2  # complete checkpoints kept: the newest and the one before it (in case the newest turns out bad)


@dataclass
class RunState:
    """What changes as a run trains; a checkpoint's meta.json holds these fields at its top level."""
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


def complete_checkpoints(ckpt_dir):
    """The complete checkpoint folders in ckpt_dir, oldest first (final last)."""
    names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
    steps = sorted(int(n[5:]) for n in names if n.startswith("step_") and n[5:].isdigit())
    folders = [os.path.join(ckpt_dir, f"step_{s:06d}") for s in steps] + [os.path.join(ckpt_dir, "final")]
    return [f for f in folders if os.path.isfile(os.path.join(f, ".metadata"))]


def checkpoint_folder(path):
    """The checkpoint to read for `path`: a checkpoint folder itself, else the newest complete one in `path` (a
    checkpoints folder) or in path/checkpoints (a run folder). ValueError when there is none."""
    if os.path.isfile(os.path.join(path, ".metadata")):
        return path
    found = complete_checkpoints(path) or complete_checkpoints(os.path.join(path, "checkpoints"))
    if not found:
        raise ValueError(f"{path} holds no complete train.py checkpoint (a folder with DCP's .metadata); pass a run "
                         "folder or its checkpoints/final")
    return found[-1]


def read_meta(folder):
    with open(os.path.join(folder, "meta.json")) as f:
        return json.load(f)


def load_checkpoint_model(path, device="cpu"):
    """Rebuild a GPT from a train.py checkpoint (checkpoint_folder(path)) -> (model in eval mode, its record:
    model_config, passes, tokenizer, step). Reads the weights only, every rank's shards on this one process (DCP, no
    process group); the model is built on `device` as training built it and loaded in place."""
    folder = checkpoint_folder(path)
    record = read_meta(folder)["weights"]
    model = GPT(ModelConfig(**record["model_config"]), device=device, draw_weights=False)
    dcp.load(dict(model=model.state_dict()), checkpoint_id=folder, no_dist=True)
    model.set_passes(int(record["passes"]))
    return model.eval(), record


# ---------------------------------------------------------------------------------------------------------------------
# Writing and resuming a checkpoint (collective under torchrun: every rank calls these)

def optimizer_state(model, optimizers):
    """The optimizers' tensors as DCP saves and loads them, references to the live ones: Muon's by parameter name
    (Muon.state_dict; its hyperparameters go to meta.json), AdamW's by get_optimizer_state_dict (parameter names)."""
    out = {}
    for opt in optimizers:
        if isinstance(opt, muon.Muon):
            out["muon"] = {k: v for k, v in opt.state_dict().items() if k != "param_groups"}
        else:  # the hyperparameters come from the plan
            out["adamw"] = get_optimizer_state_dict(model, opt)["state"]
    return out


def save_checkpoint(ckpt_dir, model, optimizers, state, plan, micro_batches=None):
    """Collective: checkpoint step_N of state.step into ckpt_dir (written as step_N.tmp, renamed once complete), then
    the older ones past KEEP and any .tmp leftover removed -> the folder. Every rank writes its own shards (DCP)."""
    folder = os.path.join(ckpt_dir, f"step_{state.step:06d}")
    tmp, world = folder + ".tmp", dist.get_world_size() if dist.is_initialized() else 1
    rank_0 = world == 1 or dist.get_rank() == 0
    if rank_0:
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed save's leftover: never complete, never read
        os.makedirs(tmp)
        matrix = [opt for opt in optimizers if isinstance(opt, muon.Muon)]
        plan_dict = plan.as_dict()
        write_json(os.path.join(tmp, "meta.json"), dict(
            plan=plan_dict, world_size=world, rng=torch.get_rng_state().tolist(),
            weights=dict(model_config=plan_dict["model_config"], passes=plan.passes_final, tokenizer=plan.tokenizer,
                         step=state.step),
            muon_param_groups=matrix[0].state_dict()["param_groups"] if matrix else [],
            micro_batches=list(micro_batches) if micro_batches else None, **asdict(state)))
    if world > 1:
        dist.barrier()
    dcp.save(dict(model=get_model_state_dict(model), optimizer=optimizer_state(model, optimizers)),
             checkpoint_id=tmp, no_dist=not dist.is_initialized())  # .metadata last, by rank 0, after every shard
    if rank_0:
        os.replace(tmp, folder)
        for old in complete_checkpoints(ckpt_dir)[:-KEEP] + [os.path.join(ckpt_dir, n) for n in os.listdir(ckpt_dir)
                                                             if n.endswith(".tmp")]:
            shutil.rmtree(old)  # older complete ones only once a newer complete one exists
    if world > 1:
        dist.barrier()
    return folder


def load_checkpoint(folder, plan, model, optimizers):
    """Collective: restore the weights, optimizer and RNG state save_checkpoint wrote under the same plan, at any
    world size (DCP reshards) -> RunState (the caller sets the model's passes for its step)."""
    meta = read_meta(folder)
    check_plan(folder, meta["plan"], plan)
    tensors = dict(model=get_model_state_dict(model), optimizer=optimizer_state(model, optimizers))
    dcp.load(tensors, checkpoint_id=folder, no_dist=not dist.is_initialized())
    set_model_state_dict(model, tensors["model"])
    for opt in optimizers:
        if isinstance(opt, muon.Muon):
            opt.load_state_dict(dict(tensors["optimizer"]["muon"], param_groups=meta["muon_param_groups"]))
        else:
            groups = get_optimizer_state_dict(model, opt)["param_groups"]
            set_optimizer_state_dict(model, opt, dict(state=tensors["optimizer"]["adamw"], param_groups=groups))
    torch.set_rng_state(torch.tensor(meta["rng"], dtype=torch.uint8))
    return read_run_state(folder, meta)


def read_run_state(folder, meta=None):
    meta = meta or read_meta(folder)
    return RunState(**{f.name: meta[f.name] for f in fields(RunState)})


def check_plan(where, recorded, plan):
    """The plan `where` (result.json or a checkpoint's meta.json) records must be `plan`, or one line names the first
    differing field. Compared: the Plan's fields, what the run trains; not total_flops (accounting, derived)."""
    requested = json.loads(json.dumps(plan.as_dict()))
    for key in [f.name for f in fields(plan) if f.name != "total_flops"]:
        have, want = recorded.get(key, "nothing"), requested[key]
        if key == "model_config" and isinstance(have, dict):
            key, have, want = next(((f"model_config.{k}", have.get(k, "nothing"), v) for k, v in want.items()
                                    if have.get(k, "nothing") != v), (key, have, want))
        if have != want:
            raise UsageError(f"{where} holds another run than this command plans: {key} {have!r} there, {want!r} "
                             "here; pass that run's own flags, or another --run-name for this one")


# ---------------------------------------------------------------------------------------------------------------------
# The run folder: where an invocation starts, one writer at a time

LADDER_FILES = ("train.lock", "train.log", "ladder.lock")  # what a new run's folder may hold (ladder.sh's log, lock)


def read_result(run_dir):
    path = os.path.join(run_dir, "result.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def check_same_pool(run_dir, data_dir, manifest):
    """A run continues only on the pool it trained on (the same token sha256 in corpus.json; the path may change)."""
    identity = lambda pool: {k: v.get("sha256") for k, v in (pool or {}).get("splits", {}).items()}  # noqa: E731
    result = read_result(run_dir) or {}
    recorded = identity(result.get("data_manifest"))
    if recorded and recorded != identity(manifest):
        raise UsageError(f"{run_dir} was trained on the pool {result.get('data_dir')!r}, and {data_dir} is another "
                         "pool (other token sha256 in its corpus.json); pass --data-dir with the run's pool (moved "
                         "is fine), or another --run-name")


def resume_point(args, run_dir):
    """Where this invocation starts: "complete" (nothing to do), the newest complete checkpoint folder, or None (step
    0 of a new run). A new run goes only into an empty folder (or one ladder.sh prepared): never over another run's
    files. --resume without a checkpoint is refused; --resume-or-start starts such a run at step 0."""
    result = read_result(run_dir) if os.path.isdir(run_dir) else None
    if not (args.resume or args.resume_or_start):
        held = sorted(set(os.listdir(run_dir)) - set(LADDER_FILES)) if os.path.isdir(run_dir) else []
        if held:
            raise UsageError(f"{run_dir} already holds files ({held[0]}, ...); pass --resume to continue its run, or "
                             "choose another --run-name or --runs-dir")
        return None
    if result and result["status"] == "complete":
        return "complete"
    found = complete_checkpoints(os.path.join(run_dir, "checkpoints"))
    if found:
        return found[-1]
    if args.resume:
        raise UsageError(f"--resume: {run_dir} has no complete checkpoint to resume from; pass --resume-or-start to "
                         "start it at step 0")
    return None


def run_dir_of(args):
    return os.path.join(args.runs_dir, args.run_name or f"{args.arch}_d{args.depth}")


def run_lock(args):
    """One writer per run: rank 0 (the only rank that writes the run folder) takes an exclusive flock on
    RUN/train.lock for its whole life (the kernel drops it when the process dies, however it dies) -> the open lock
    file (None on other ranks). A second train.py on the same run stops here naming the holder."""
    if torchrun_env()[1] != 0:
        return None
    run_dir = run_dir_of(args)
    try:
        os.makedirs(run_dir, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        path = next((p for p in (run_dir, args.runs_dir) if os.path.isfile(p)), run_dir)
        raise UsageError(f"{path} is a file, not a directory; pass another --runs-dir or --run-name") from None
    except OSError as e:
        raise UsageError(f"cannot create the run folder {run_dir} ({e.strerror}); pass another --runs-dir") from None
    lock = open(os.path.join(run_dir, "train.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        raise UsageError(f"{run_dir} is being written by another train.py ({lock.read().strip() or 'starting'}); "
                         "wait for it to finish or stop it first") from None
    lock.truncate(0)
    lock.write(f"PID {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    return lock
