"""watch.py — reading a ladder of runs: the runs table, the training curves, a run's report.md (train.py writes
trajectory.jsonl, its progress lines and wandb itself). docs/trajectory.md has the record's fields.

    python fit.py runs runs/demo                     # one row per run: state, step, losses, FLOPs, wall time, ETA
    python fit.py curves runs/demo --out runs/demo/curves --x flops --frontier fit.json
Torch-free; the readers import laws (numpy, scipy, matplotlib) when called.
"""
import fcntl, json, os, sys

from common import RESULT_SCHEMA, TRAJECTORY_LINE, UsageError, clock, record_error, write_text

LOCK_FILE = "train.lock"  # checkpoint.run_lock holds it while a train.py writes the run


# ---------------------------------------------------------------------------------------------------------------------
# Reading run folders (fit.py runs | curves)

def run_dirs(items):
    """The run folders the inputs name: a folder holding a result.json, a train.lock or a trajectory.jsonl, else
    such folders one level below it."""
    is_run = lambda d: any(os.path.exists(os.path.join(d, f)) for f in ("result.json", LOCK_FILE, "trajectory.jsonl"))
    found = []
    for item in items:
        if not os.path.isdir(item):
            raise UsageError(f"{item} is not a folder; pass train.py run folders or a folder of them (RUNS_DIR)")
        below = sorted(os.path.join(item, d) for d in os.listdir(item) if os.path.isdir(os.path.join(item, d)))
        found += [item] if is_run(item) else [d for d in below if is_run(d)]
    if not found:
        raise UsageError(f"no train.py runs in {' '.join(items)} (no result.json, train.lock or trajectory.jsonl); "
                         "pass run folders or their RUNS_DIR")
    return found


def lock_held(run_dir):
    """Whether a process holds the run's lock (a train.py writing it now, on this host)."""
    path = os.path.join(run_dir, LOCK_FILE)
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def read_trajectory(run_dir):
    """trajectory.jsonl's records, each checked against train.py's TRAJECTORY_LINE: a line that breaks it is left out
    with one line on stderr (a torn last line of a live run silently). Runs written before the documented fields
    existed (step, loss, passes, lr_multiplier, epoch, tokens_per_second) read too."""
    path = os.path.join(run_dir, "trajectory.jsonl")
    records = []
    if not os.path.lexists(path) or not regular_or_said(path):
        return records
    for number, line in enumerate(open(path, errors="replace"), 1):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        error = record_error(record, TRAJECTORY_LINE)
        if error:
            print(f"fit.py: skipping {path}:{number}: {error.removeprefix('the record ')}", file=sys.stderr)
        else:
            records.append(record)
    return records


def read_result(run_dir, name="result.json"):
    """RUN/name as a dict: result.json checked against train.py's RESULT_SCHEMA, core_eval.py's eval.json as it is;
    None when there is none, or (said on stderr in one line) when it is no regular file, no JSON object or breaks the
    schema."""
    path = os.path.join(run_dir, name)
    if not os.path.lexists(path) or not regular_or_said(path):
        return None
    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = None
    error = "is not a JSON object" if not isinstance(result, dict) else \
        record_error(result, RESULT_SCHEMA) if name == "result.json" else None
    if error:
        print(f"fit.py: skipping {path}: {error.removeprefix('the record ')}", file=sys.stderr)
        return None
    return result


def regular_or_said(path):
    """Whether path is a regular file; if not (a FIFO would block open() forever), one line on stderr says so."""
    if os.path.isfile(path):
        return True
    print(f"fit.py: skipping {path}: not a regular file", file=sys.stderr)
    return False


def run_row(run_dir):
    """One row of the runs table: what the run folder says, its state checked against its lock."""
    result, records, held = read_result(run_dir), read_trajectory(run_dir), lock_held(run_dir)
    plan = result.get("plan") if result and isinstance(result.get("plan"), dict) else {}
    status = result.get("status") if result else None
    last = records[-1] if records else {}
    evals = [r for r in records if r.get("val_loss") is not None] or (result or {}).get("evals") or []
    state, reason = {None: "running" if held else "failed", "running": "running" if held else "failed",
                     "complete": "complete", "stopped": "stopped", "interrupted": "stopped",
                     "failed": "failed"}.get(status, "failed"), (result or {}).get("error")
    if state == "failed" and status in (None, "running"):
        reason = "no process holds its lock: the run died (killed?); ladder.sh or --resume continues it" \
            if result or records else "no result.json and no process holds its lock"
    if held and status in ("stopped", "interrupted", "failed"):  # a resume that has not yet written "running"
        state, reason = "resuming", f"resuming a {status} run"
    steps, flops_planned = plan.get("steps"), plan.get("total_flops")
    return dict(run=os.path.basename(os.path.normpath(run_dir)), path=run_dir,
                arch=(result or {}).get("arch", plan.get("arch")), depth=(result or {}).get("depth", plan.get("depth")),
                state=state, reason=reason, step=last.get("step", (result or {}).get("completed_steps")), steps=steps,
                train_loss=last.get("loss"), val_loss=evals[-1]["val_loss"] if evals else None,
                flops=last.get("flops", (result or {}).get("estimated_training_flops")), flops_planned=flops_planned,
                wall_seconds=last_value(records, "wall_seconds", (result or {}).get("wall_seconds")),
                eta_seconds=last_value(records, "eta_seconds") if state == "running" else None)


def last_value(records, key, default=None):
    return next((r[key] for r in reversed(records) if r.get(key) is not None), default)


def hms(seconds):
    return "—" if seconds is None else clock(seconds)


def run_order(row):
    """Runs in the arms table's order, then by depth and folder name."""
    import laws
    return laws.arm_order(row["arch"] or ""), row["depth"] or 0, row["run"]


def cmd_runs(args):
    import laws
    rows = sorted((run_row(d) for d in run_dirs(args.runs)), key=run_order)
    if args.json:
        print(json.dumps(laws.jsonable(dict(runs=rows)), indent=2))
        return
    print(f"{'run':<24} {'state':<9} {'step':>13} {'train':>7} {'val':>7} {'FLOPs done / planned':>21} "
          f"{'wall time':>10} {'ETA (wall)':>10}")
    for r in rows:
        step = f"{r['step'] or 0}/{r['steps'] or '?'}"
        flops = f"{laws.fnum(r['flops'], '.2e')} / {laws.fnum(r['flops_planned'], '.2e')}"
        print(f"{r['run']:<24} {r['state']:<9} {step:>13} {laws.fnum(r['train_loss']):>7} {laws.fnum(r['val_loss']):>7} "
              f"{flops:>21} {hms(r['wall_seconds']):>10} {hms(r['eta_seconds']):>10}"
              + (f"  {r['reason']}" if r["reason"] else ""))


# ---------------------------------------------------------------------------------------------------------------------
# Training curves

X_AXES = dict(steps=("step", "optimizer step", "linear"), tokens=("tokens", "training tokens", "log"),
              flops=("flops", "training FLOPs (the plan's accounting)", "log"))


def curve_runs(items):
    """[(row, records, result)] of every run with trajectory records, in run_order."""
    runs = []
    for d in run_dirs(items):
        records = read_trajectory(d)
        if records:
            runs.append((run_row(d), records, read_result(d) or {}))
    if not runs:
        raise UsageError(f"no run in {' '.join(items)} has trajectory records yet; curves need trajectory.jsonl")
    return sorted(runs, key=lambda r: run_order(r[0]))


def shade(colour, depth, depths):
    """The arm's colour, lighter for shallower runs: depth by shade (the deepest full, the shallowest 75 % white)."""
    from matplotlib.colors import to_rgb
    rank = sorted(depths).index(depth) if depth in depths else len(depths) - 1
    lift = 0.75 * (1 - (rank + 1) / len(depths)) * len(depths) / (len(depths) - 1) if len(depths) > 1 else 0.0
    return tuple(c + (1 - c) * lift for c in to_rgb(colour))


def frontier_laws(path):
    """{arm: (E, A, gamma, c_ref, (lowest, highest fitted compute) or None)} from a `fit.py ladders --json` output."""
    try:
        fit = json.load(open(path))
        span = lambda law: (min(p["compute"] for p in law["points"]), max(p["compute"] for p in law["points"])) \
            if law.get("points") else None
        return {arm: (fit["E"], law["A"], law["gamma"], fit["c_ref"], span(law)) for arm, law in fit["arms"].items()
                if law.get("gamma") is not None}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"--frontier {path} is not a `fit.py ladders --json` output (E, c_ref, arms.*.A/gamma); "
                         "write one with python fit.py ladders RUNS --json > fit.json") from None


SMOOTHING = 0.02  # the training loss drawn is its mean over a centred window of 2 % of the run's steps (>= 5)


def smoothed(values):
    """The centred moving mean (no lag, unlike an EMA on a falling loss), its window shrunk at the ends."""
    k = max(2, round(SMOOTHING * len(values) / 2))
    return [sum(values[max(0, i - k):i + k + 1]) / len(values[max(0, i - k):i + k + 1]) for i in range(len(values))]


def curves_figure(plt, runs, x_axis, frontier):
    """Training loss (its centred mean, smoothed; the raw steps faint) and validation loss (dots and line) of every run against the x
    axis, one colour per arm, depth by shade; a stopped or running run dashed; two runs of one arm and depth told
    apart by their folder names; ▲ at growth, | at the warmdown's start; a fitted frontier dashed over the range it
    was fitted on, its ends marked."""
    import laws
    from matplotlib.ticker import FormatStrFormatter
    key, label, scale = X_AXES[x_axis]
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
    by_arm, seen, drawn = {}, {}, {}
    for row, records, _ in runs:
        by_arm.setdefault(row["arch"], set()).add(row["depth"])
        seen[(row["arch"], row["depth"])] = seen.get((row["arch"], row["depth"]), 0) + 1
    for row, records, result in runs:
        twin = drawn[(row["arch"], row["depth"])] = drawn.get((row["arch"], row["depth"]), -1) + 1
        arm, depth = row["arch"], row["depth"]
        colour = shade(laws.style(arm)[1] if arm else "#777777", depth, by_arm[arm])
        points = [r for r in records if r.get(key) is not None]
        if not points:
            continue
        name = f"{laws.style(arm)[0] if arm else row['run']} d{depth}" + (
            f" ({row['run']})" if seen[(arm, depth)] > 1 else "") + ("" if row["state"] == "complete" else
                                                                     f" [{row['state']}]")
        style = dict(color=colour, ls=("-", ":", "-.")[twin % 3] if row["state"] == "complete" else "--")
        xs, ys = [r[key] for r in points], smoothed([r["loss"] for r in points])
        ax_train.plot(xs, [r["loss"] for r in points], color=colour, lw=0.5, alpha=0.25)
        ax_train.plot(xs, ys, lw=1.4, label=name, **style)
        vals = [r for r in points if r.get("val_loss") is not None]
        ax_val.plot([r[key] for r in vals], [r["val_loss"] for r in vals], marker="o", ms=3, lw=1, label=name, **style)
        plan = result.get("plan") if isinstance(result.get("plan"), dict) else {}
        at = {r["step"]: (r, y) for r, y in zip(points, ys)}
        for event in result.get("growth_events") or []:
            if event.get("step") in at:
                grown, y = at[event["step"]]
                for ax, y in ((ax_train, y), (ax_val, grown.get("val_loss_after_growth"))):
                    if y is not None:
                        ax.plot(grown[key], y, "^", color=colour, ms=8, mec="black", mew=0.6)
        if plan.get("steps") and plan.get("warmdown_ratio"):
            start = at.get(round(plan["steps"] * (1 - plan["warmdown_ratio"])))
            if start:
                ax_train.plot(start[0][key], start[1], "|", color=colour, ms=18, mew=2.5, mec="black")
    for arm, (E, A, gamma, c_ref, span) in (frontier or {}).items():
        if arm in by_arm:
            finals = [row["flops"] for row, _, _ in runs if row["arch"] == arm and row["flops"]]
            lo, hi = span or (min(finals), max(finals))  # a fit written before points were in its JSON
            grid = [lo * (hi / lo) ** (i / 50) for i in range(51)]
            law = [E + A * (c / c_ref) ** -gamma for c in grid]
            ax_val.plot(grid, law, "--", color=laws.style(arm)[1], lw=1.2,
                        label=f"{laws.style(arm)[0]} frontier (fitted range)")
            ax_val.plot([grid[0], grid[-1]], [law[0], law[-1]], "|", color=laws.style(arm)[1], ms=12, mew=2)
    for ax, title in ((ax_train, f"training loss (centred mean over {SMOOTHING:.0%} of each run's steps, >= 5; raw faint)"),
                      (ax_val, "validation loss")):
        ax.set_xscale(scale)
        if any(len(line.get_ydata()) for line in ax.lines):  # a run without a validation yet leaves its panel empty
            ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel(f"{title.split(' (')[0]} (nats per token)")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))
        ax.set_title(f"{title}\n▲ growth" + (", | warmdown start" if ax is ax_train else "")
                     + "; dashed: stopped or running", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    ax_val.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def ladder_key(row, result):
    """Runs of one ladder share a preset (one figure per ladder)."""
    plan = result.get("plan") if isinstance(result.get("plan"), dict) else {}
    return plan.get("preset") or "runs"


def draw_curves(runs, out, x_axis, frontier=None):
    """curves_figure of each ladder among `runs` ([(row, records, result)]) into out/curves_LADDER_X.{png,pdf}
    -> the paths written."""
    import laws
    ladders = {}
    for run in runs:
        ladders.setdefault(ladder_key(run[0], run[2]), []).append(run)
    names = {f"curves_{ladder}_{x_axis}.{ext}": ladder for ladder in ladders for ext in ("png", "pdf")}
    laws.check_outputs(out, names)
    plt = laws.pyplot()
    figures = {}
    for ladder, members in ladders.items():
        fig = curves_figure(plt, members, x_axis, frontier)
        figures.update({name: fig for name, of in names.items() if of == ladder})
    return laws.save_figures(out, figures, dpi=120)


def cmd_curves(args):
    if args.frontier and args.x != "flops":
        raise UsageError("--frontier overlays L(C) on a FLOPs axis; add --x flops")
    frontier = frontier_laws(args.frontier) if args.frontier else None
    runs = curve_runs(args.runs)
    written = draw_curves(runs, args.out or os.path.join(args.runs[0], "curves"), args.x, frontier)
    if getattr(args, "json", False):
        print(json.dumps(dict(written=written, runs=[dict(run=r[0]["run"], state=r[0]["state"]) for r in runs])))
        return
    for path in written:
        print(f"wrote {path}")
    print(f"{len(runs)} runs: " + ", ".join(f"{r[0]['run']} ({r[0]['state']})" for r in runs))


# ---------------------------------------------------------------------------------------------------------------------
# report.md of a run (train.py at its end, `fit.py report` with the curves); a ladder's is fit.py's (cmd_report)

REPORT_PLAN = ("arch", "preset", "depth", "width", "n_layer", "params_tpp", "params_stored", "steps", "tokens_per_step",
               "train_tokens", "total_flops", "pass_stages", "crossover_steps", "warmup_steps", "warmdown_ratio",
               "rewarm_steps", "matrix_lr", "embedding_lr", "weight_decay", "optimizer", "seed")


def markdown_table(header, rows):
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header)] + [f"| {' | '.join(map(str, r))} |" for r in rows]


def run_report(run_dir, curves=None):
    """report.md of one run as markdown: the plan (its main fields and schedule notes), the environment, the curves
    (`curves`: the figure's file name beside report.md, drawn by `fit.py report`), every validation, CORE when
    core_eval.py wrote eval.json, and the timings (training time vs wall time)."""
    result, row = read_result(run_dir) or {}, run_row(run_dir)
    plan = result.get("plan") if isinstance(result.get("plan"), dict) else {}
    num = lambda v: f"{v:.6g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)
    lines = [f"# {row['run']}", "", f"{row['arch']} d{row['depth']}, preset {plan.get('preset')}: **{row['state']}** "
             f"at step {row['step']}/{row['steps']}" + (f" ({row['reason']})" if row["reason"] else "") + ".", "",
             "## Plan", ""] + markdown_table(["field", "value"], [(f"`{k}`", num(plan[k])) for k in REPORT_PLAN
                                                                   if k in plan])
    lines += [""] + [f"- note: {n}" for n in result.get("schedule_notes") or []]
    env = dict(result.get("environment") or {}, world_size=result.get("world_size"), data_dir=result.get("data_dir"))
    lines += ["", "## Environment", ""] + markdown_table(["", ""], [(k, v) for k, v in env.items() if v is not None])
    lines += ["", "## Curves", "", f"![training and validation loss]({curves})" if curves else
              f"Drawn by `python fit.py report {run_dir}`."]
    evals = result.get("evals") or []
    lines += ["", "## Validation", ""] + markdown_table(
        ["step", "when", "passes", "val loss (nats/token)", "val bpb"],
        [(e["step"], e.get("when", ""), e.get("passes", ""), f"{e['val_loss']:.4f}",
          "—" if e.get("val_bpb") is None else f"{e['val_bpb']:.4f}") for e in evals])
    core = read_result(run_dir, "eval.json")
    final = os.path.join(run_dir, "checkpoints", "final")
    lines += ["", "## CORE", "", f"CORE {core['core_metric']:.4f} ({core.get('checkpoint')})" if core and isinstance(
        core.get("core_metric"), (int, float)) else f"Not evaluated (`python core_eval.py --checkpoint {final}`)."]
    tokens_per_second = result.get("tokens_per_second")
    lines += ["", "## Timings", ""] + markdown_table(["", ""], [
        ("training time (wall time less validations and checkpoints)", hms(result.get("total_training_time_seconds"))),
        ("validation time", hms(result.get("eval_seconds"))), ("wall time (resumes added up)", hms(row["wall_seconds"])),
        ("training tokens / s", "—" if not tokens_per_second else f"{tokens_per_second:,.0f}"),
        ("FLOPs done", f"{row['flops']:.4g}" if row["flops"] else "—")])
    return "\n".join(lines) + "\n"


def write_run_report(run_dir, curves=None):
    """RUN/report.md, replaced whole (a watcher never reads half of one). It is derived from the run's files: one that
    cannot be written is a warning, never a failed run."""
    try:
        write_text(os.path.join(run_dir, "report.md"), run_report(run_dir, curves))
    except OSError as e:
        print(f"warning: cannot write {os.path.join(run_dir, 'report.md')}: {e.strerror or e}; `python fit.py report "
              f"{run_dir}` writes it later")
    return os.path.join(run_dir, "report.md")
