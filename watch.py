"""watch.py — what a run writes as it trains (trajectory.jsonl, the progress lines, an optional wandb run); fit.py
reads them (runs, curves, report). docs/trajectory.md has the record's fields.

    python train.py --arch vanilla --depth 3 --preset cpu --wandb my-project     # or WANDB_PROJECT=my-project
Torch-free: train.py fetches a run's numbers from the device and hands them over as Python values; the readers import
laws (numpy, scipy, matplotlib) when called, so that train.py's start-up does not pay for them.
"""
import fcntl, json, math, netrc, os, sys, time, urllib.parse, uuid

from common import RESULT_SCHEMA, TRAJECTORY_LINE, UsageError, clock, record_error, write_text

LOCK_FILE = "train.lock"  # checkpoint.run_lock holds it while a train.py writes the run


# ---------------------------------------------------------------------------------------------------------------------
# What a run writes while it trains (train.py)

class Progress:
    """trajectory.jsonl, the printed progress lines and the tracker. Finished steps wait (as device tensors, held by
    train.py) until a logged step fetches them together; training seconds are the wall time between those fetches
    minus validations and checkpoints, so the device's queue is timed, not the host's. The ETA (eta) prices what is
    left at measured rates: steps, validations and checkpoints ahead."""
    EMA_DECAY = 0.98  # per step: the last ~50 steps count

    def __init__(self, run, state, trajectory, cadence, tracker=None):
        import model, plan  # train.py has them loaded: the FLOPs per token of each pass count weigh the ETA's steps
        self.run, self.state, self.trajectory, self.cadence, self.tracker = run, state, trajectory, cadence, tracker
        self.pending, self.records, self.mark, self.flops_mark = [], [], time.perf_counter(), state.flops
        self.wall_start = self.mark - state.wall_seconds  # resumes add up
        self.cost = {k: model.flops_per_token(run.plan.model_config, k) for k in
                     {*run.plan.pass_stages, *run.plan.random_passes}}
        self.rate, self.warm, self.mfu, self.save_seconds, self.stage_at = None, False, None, [], plan.stage_at

    def add(self, record, loss):
        """A finished step: its record (plain values) and its loss (a device tensor, fetched later)."""
        self.pending.append((record, loss))

    def losses(self):
        return [loss for _, loss in self.pending]

    def fetched(self, losses, grad_norm, scalars):
        """The pending steps' losses, the last one's gradient norm (or None) and learned scalars ({name: value}),
        fetched by train.py -> the first step whose loss is not finite, or None."""
        now = time.perf_counter()
        seconds = (now - self.mark) / len(self.pending)
        self.state.train_seconds += now - self.mark
        self.mark = now
        for (record, _), loss in zip(self.pending, losses):
            self.records.append(dict(record, loss=loss, tokens_per_second=self.run.plan.tokens_per_step / seconds))
        self.records[-1].update({} if grad_norm is None else dict(grad_norm=grad_norm), scalars=scalars)
        peak, flops, self.flops_mark = self.run.peak_flops, self.state.flops - self.flops_mark, self.state.flops
        self.mfu = flops / (seconds * len(self.pending) * peak) if peak else None
        cost = sum(self.cost[r["passes"]] for r, _ in self.pending) / len(self.pending)
        self.advance_rate(seconds / cost, len(self.pending))
        self.pending = []
        return next((r["step"] for r in self.records if not math.isfinite(r["loss"])), None)

    def advance_rate(self, seconds_per_cost, steps):
        """The EMA of a step's seconds per FLOP per token of its passes: one rate across growth stages."""
        if not self.warm:  # the first interval of an invocation or after a growth: compiling, not training
            self.warm = True
            return
        weight = 1 - self.EMA_DECAY ** steps
        self.rate = seconds_per_cost if self.rate is None else (1 - weight) * self.rate + weight * seconds_per_cost

    def grew(self):
        self.warm = False

    def restart_clock(self, saved=False):
        """After a validation or a checkpoint (saved): their time is not training time."""
        now = time.perf_counter()
        if saved:
            self.save_seconds.append(now - self.mark)
        self.mark = now

    def eta(self):
        """Wall seconds to the invocation's last step (cadence.stop), or None before a step time is known: every step
        ahead at the FLOPs per token of its pass stage times the measured rate; every validation ahead (periodic,
        epoch, around growth, the end) at the measured seconds per validation and FLOP per token of its passes; every
        checkpoint ahead at the measured mean (none until one has been timed)."""
        plan, c, step, stages = self.run.plan, self.cadence, self.state.step, self.run.plan.pass_stages
        if self.rate is None:
            return None
        bounds = [0, *plan.crossover_steps, plan.steps]
        steps_cost = sum(self.cost[k] * max(0, min(b, c.stop) - max(a, step))
                         for k, a, b in zip(stages, bounds, bounds[1:]))
        ahead = lambda every: set(range((step // every + 1) * every, c.stop + 1, every)) if every else set()
        checks = {s for s in ahead(c.eval_every) | ahead(c.steps_per_epoch) | {*plan.crossover_steps, plan.steps}
                  if step < s <= c.stop}
        evals_passes = lambda s: plan.passes_final if s == plan.steps else self.stage_at(max(s - 1, 0), plan)
        evals = [evals_passes(s) for s in checks]
        evals += [self.stage_at(s, plan) for s in plan.crossover_steps if step < s <= c.stop]  # after the growth
        done = self.state.evals
        done_passes = [e.get("passes") or evals_passes(e["step"]) for e in done]  # older records: from their step
        eval_rate = self.state.eval_seconds / sum(self.cost.get(k, 0) for k in done_passes) if done else 0.0
        saves = len({s for s in ahead(c.save_every) | {c.stop} if step < s <= c.stop})
        save = sum(self.save_seconds) / len(self.save_seconds) if self.save_seconds else 0.0
        return self.rate * steps_cost + eval_rate * sum(self.cost[k] for k in evals) + saves * save

    def write(self, printed=True):
        """The fetched records into trajectory.jsonl and the tracker; `printed`: also the progress line."""
        run, state, last = self.run, self.state, self.records[-1]
        state.wall_seconds = time.perf_counter() - self.wall_start
        eta = self.eta()
        last.update(wall_seconds=state.wall_seconds, train_seconds=state.train_seconds, eta_seconds=eta)
        if run.master:
            self.trajectory.writelines(json.dumps(r) + "\n" for r in self.records)
            self.trajectory.flush()  # whole lines at every logged step: `fit.py runs` and `curves` see the run live
            if self.tracker:
                self.tracker.log(self.records)
            if printed:
                ends = time.strftime("%H:%M:%S %Z", time.localtime(time.time() + eta)) if eta is not None else ""
                print(f"step {state.step}/{run.plan.steps} | loss {last['loss']:.4f} | lrm {last['lr_multiplier']:.3f} "
                      f"| passes {last['passes']} | {last['tokens_per_second']:,.0f} tok/s"
                      + (f" | mfu {100 * self.mfu:.1f}%" if self.mfu else "")
                      + (f" | eta {clock(eta)} (ends ~{ends})" if eta is not None else ""), flush=True)
        self.records = []


class Wandb:
    """The optional experiment tracker: one wandb run per train.py run, grouped by its ladder (the runs folder's name)
    and named LADDER/RUN (unique across ladders), tagged with its arm, depth and preset; the plan as config; every
    trajectory record under train/ and val/ against the declared x-axes flops and tokens; the final result.json as the
    summary. A resumed run continues the same wandb run (its id is kept in the run folder's wandb_id)."""

    def __init__(self, project, run_dir, name, config):
        import wandb  # optional: check_tracker refused its absence before any work
        id_path = os.path.join(run_dir, "wandb_id")
        run_id = open(id_path).read().strip() if os.path.exists(id_path) else uuid.uuid4().hex[:8]
        ladder = os.path.basename(os.path.dirname(os.path.abspath(run_dir)))
        self.run = wandb.init(project=project, id=run_id, resume="allow", name=f"{ladder}/{name}", config=config,
                              dir=run_dir, group=ladder, tags=[config["arch"], f"d{config['depth']}", config["preset"]])
        for x in ("flops", "tokens"):
            self.run.define_metric(x)
        for namespace in ("train/*", "val/*"):
            self.run.define_metric(namespace, step_metric="flops")
        with open(id_path, "w") as f:
            f.write(run_id + "\n")

    def log(self, records):
        for r in records:
            self.run.log({k: v for k, v in flat_record(r).items() if v is not None}, step=r["step"])

    def finish(self, result_path):
        self.run.summary.update({k: v for k, v in json.load(open(result_path)).items()
                                 if isinstance(v, (int, float, str, bool))})
        self.run.finish()


def tracker_project(args):
    return getattr(args, "wandb", None) or os.environ.get("WANDB_PROJECT") or None


WANDB_OFFLINE_MODES = ("offline", "dryrun", "disabled")  # WANDB_MODE values that never reach the server


def check_tracker(args, run_dir):
    """--wandb (or WANDB_PROJECT): one line, before the run folder exists, for what wandb.init would refuse only
    after it: an empty project, a name wandb refuses (its rules: at most 128 characters, none of / \\ # ? % :), the
    package missing, no API key (WANDB_API_KEY or `wandb login`'s netrc entry) outside offline mode, and a
    run folder's wandb_id (kept for --resume) that is no wandb run id."""
    if getattr(args, "wandb", None) == "":
        raise UsageError("--wandb '' names no project; give one (--wandb my-project) or drop --wandb")
    project = tracker_project(args)
    if not project:
        return
    if len(project) > 128 or set(project) & set("/\\#?%:"):
        raise UsageError(f"--wandb {project!r} is no wandb project name: at most 128 characters, none of / \\ # ? % "
                         ":; pick another (WANDB_PROJECT too)")
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise UsageError(f"--wandb {project} needs the wandb package: pip install wandb (or drop --wandb and unset "
                         "WANDB_PROJECT)") from None
    if getattr(args, "dry_run", False):
        return
    if os.environ.get("WANDB_MODE", "online") not in WANDB_OFFLINE_MODES and not wandb_api_key():
        raise UsageError(f"--wandb {project}: no wandb API key (set WANDB_API_KEY or run `wandb login`); or log "
                         "offline with WANDB_MODE=offline and `wandb sync` the run folder's wandb/ later")
    id_path = os.path.join(run_dir, "wandb_id")
    if os.path.lexists(id_path):
        try:
            with open(id_path) as f:
                run_id = f.read(200).strip() if os.path.isfile(id_path) else None
        except (OSError, UnicodeDecodeError):
            run_id = None
        if not run_id or len(run_id) > 64 or set(run_id) & set(":;,#?/'") or any(c.isspace() for c in run_id):
            raise UsageError(f"{id_path} holds no wandb run id (the wandb run a resume continues); restore it, or "
                             "delete it to log the rest of the run to a new wandb run")


def wandb_api_key():
    """The key wandb would use: WANDB_API_KEY, else the netrc entry `wandb login` writes for WANDB_BASE_URL's host."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        entry = netrc.netrc(os.environ.get("NETRC")).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return entry[2] if entry else None


def open_tracker(args, run):
    project = tracker_project(args)
    if not project or not run.master:
        return None
    return Wandb(project, run.run_dir, os.path.basename(run.run_dir), run.plan.as_dict())


def flat_record(record):
    """A trajectory record for a tracker: the x-axes flops and tokens as they are, the validation fields under val/
    (val_loss -> val/loss, val_loss_after_growth -> val/loss_after_growth, passes_after_growth -> val/passes_after_growth),
    the learned scalars as train/scalars/NAME, everything else under train/."""
    out = {}
    for k, v in record.items():
        if k in ("flops", "tokens"):
            out[k] = v
        elif k.startswith("val_") or k.endswith("_after_growth"):
            out["val/" + k.removeprefix("val_")] = v
        elif k not in ("scalars", "step"):  # the step is wandb's own
            out["train/" + k] = v
    out.update({f"train/scalars/{k}": v for k, v in (record.get("scalars") or {}).items()})
    return out
