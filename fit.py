"""fit.py — the paper's scaling-law fits, compute multipliers and figures, and the watching of train.py runs.

  python fit.py ladders reference/fineweb_ladders.csv --out figures --bootstrap 1000   # Figure 3, Figure 2 (left)
  python fit.py ladders --runs-dir runs/demo      # train.py runs; reference arm: vanilla, or --reference-arm
  python fit.py runs|curves|report --runs-dir runs/demo     # where each run stands; its curves; report.md
  python fit.py downstream --runs-dir runs/demo   # CORE forecast from the runs' eval.json (or a CSV)
  python fit.py design plan.jsonl --truth pilot.json --noise 0.002 --design d6-18 --design "d6-18 x3@top2"
  python fit.py surface grid.csv --form both      # Chinchilla / Skaling L(N, D)
  python fit.py tpp|growth|lr|loops DATA.csv      # the optimum of a swept recipe knob (App. A.2.3, A.4)
`python fit.py SUBCOMMAND -h` gives each one's inputs; docs/fits.md explains the fits. A subcommand is one cmd_NAME
function (its docstring is its -h) plus its lines in build_parser.
"""
import argparse, contextlib, io, json, math, os, re, sys

# The fits use tiny matrices: a threaded BLAS only adds contention (L-BFGS-B runs ~100x slower on a busy 2-core box).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np

import paper
from arms import FIGURE2_ARMS, GPU_PEAK_FLOPS
from common import Parser, UsageError, cli_main, clock, exit_process, integer, number, write_text
from laws import (FIT, arm_order, bootstrap_ladders, check_one_recipe, check_outputs, compute_optimal, drop_repeats,
                  fit_ladders, fit_surface, fitted_multiplier, fnum, footing, forecast, jsonable, ladder_data,
                  lower_envelope, mape, note, pyplot, read_csv, save_figures, simulate, style, summarize)


# ---------------------------------------------------------------------------------------------------- run folders
def run_dirs(items):
    """The run folders --runs-dir names: a run folder itself, else the runs one level below it."""
    is_run = lambda d: any(os.path.exists(os.path.join(d, f)) for f in ("result.json", "train.lock", "trajectory.jsonl"))
    found = []
    for item in items:
        if not os.path.isdir(item):
            raise UsageError(f"--runs-dir {item} is not a folder; pass a train.py run folder or a folder of them")
        found += [item] if is_run(item) else sorted(d for d in (os.path.join(item, n) for n in os.listdir(item))
                                                    if is_run(d))
    if not found:
        raise UsageError(f"no train.py runs in {' '.join(items)}; pass run folders or their RUNS_DIR")
    return found


def read_result(run_dir, name="result.json"):
    """RUN/name (result.json, core_eval.py's eval.json) as a dict, or None when there is none."""
    path = os.path.join(run_dir, name)
    return json.load(open(path)) if os.path.isfile(path) else None


def complete_runs(items):
    """[(run folder, result.json)] of the complete runs --runs-dir names; the others are named and skipped."""
    runs = [(d, read_result(d) or {}) for d in run_dirs(items)]
    for d, r in runs:
        if r.get("status") != "complete":
            note(f"skipping {d}: status {r.get('status')!r}, not complete")
    return [(d, r) for d, r in runs if r.get("status") == "complete"]


# ---------------------------------------------------------------------------------------------------- ladders
def release_rows(path, use_time, held):
    """The release's ladder JSON (paper.release_ladder_rows), or its FineWeb-Edu ladders, d26 added to `held`."""
    layout = paper.json_layout(obj := paper.read_json(path))
    if layout in ("ladders", "downstream"):
        return paper.release_ladder_rows(path, obj, use_time)
    if layout != "fineweb_edu":
        raise paper.layout_error(path, ("ladders", "downstream", "fineweb_edu"), "a train.py result.json (pass its run "
                                 "with --runs-dir); ")
    if use_time:
        raise UsageError(f"{path}: the FineWeb-Edu ladders hold no training time; drop --time")
    rows = []
    for arm, r, origin, held_out in paper.edu_records(path, obj)[1]:
        rows.append((arm, r["depth"], float(r["compute_flops"]), float(r["val_loss"]), None, origin))
        if held_out:
            held.append(f"{arm}:{r['depth']}")
            note(f"{origin}: {arm} d{r['depth']} is the release's held-out run: not fitted, its forecast printed")
    return rows


def load_ladders(inputs, runs_dirs, use_time, held=None):
    """Ladder CSVs, the release's JSON and complete train.py runs (one recipe per arm) -> laws.ladder_data (x: FLOPs,
    or seconds with --time)."""
    rows, xcol = [], "training_seconds" if use_time else "compute_flops"
    for path in inputs:
        if path.endswith(".json"):
            rows += release_rows(path, use_time, [] if held is None else held)
            continue
        need = ["depth", xcol, "val_loss"]
        c = read_csv(path, ["arm", *need], numeric=need + ["seed"], positive=need)
        for i, line in enumerate(c["_line"]):
            depth, seed = c["depth"][i], c["seed"][i] if "seed" in c else None
            if depth != int(depth) or seed not in (None, int(seed or 0)):
                raise UsageError(f"{path}:{line}: depth and seed must be whole numbers")
            rows.append((c["arm"][i], int(depth), c[xcol][i], c["val_loss"][i], seed, f"{path}:{line}"))
    runs = complete_runs(runs_dirs) if runs_dirs else []
    for arm in {r["arch"] for _, r in runs}:
        check_one_recipe([run for run in runs if run[1]["arch"] == arm], f"{arm} runs")
    x = "total_training_time_seconds" if use_time else "estimated_training_flops"
    rows += [(r["arch"], r["depth"], float(r[x]), float(r["final_val_loss"]), (r.get("plan") or {}).get("seed"), d)
             for d, r in runs]
    if not rows:
        raise UsageError("no ladder points: pass CSV files or --runs-dir")
    return ladder_data(rows, same_compute=not use_time)


def pooled_noise(data):
    """Relative run-to-run noise pooled over seed replicates: sigma^2 = sum (n_i - 1) var_i(ln L) / sum (n_i - 1)."""
    reps = [np.log(r) for d in data.values() for r in d["reps"] if len(r) > 1]
    dof = sum(len(r) - 1 for r in reps)
    return (math.sqrt(sum(((r - r.mean()) ** 2).sum() for r in reps) / dof), dof) if dof else (None, 0)


def hold_out(data, specs):
    """Remove ARM:DEPTH points from the fit -> their dict(arm, depth, compute, loss, n)."""
    held = []
    for i, spec in enumerate(specs):
        arm, _, depth = spec.rpartition(":")
        if not arm or not depth.isdigit():
            raise UsageError(f"--holdout {spec!r}: use ARM:DEPTH, e.g. untied_grow:18")
        if spec in specs[:i]:
            raise UsageError(f"--holdout names {spec} twice; name each point once")
        d = data.get(arm)
        at = np.flatnonzero(d["depth"] == int(depth)) if d else []
        if not len(at):
            raise UsageError(f"--holdout {spec}: no {arm} d{depth} point in the inputs")
        j = int(at[0])
        held.append(dict(arm=arm, depth=int(depth), compute=d["x"][j], loss=d["loss"][j], n=int(d["n"][j])))
        data[arm] = {k: np.delete(v, j) if isinstance(v, np.ndarray) else v[:j] + v[j + 1:] for k, v in d.items()}
    return held


def reference_arm(arms, named):
    """--reference-arm, else Vanilla if present, else the only arm, else one line saying how to name one."""
    arms = list(arms)
    if named and named not in arms:
        raise UsageError(f"--reference-arm {named} is not an arm of the inputs (arms: {', '.join(arms)})")
    if named or paper.FLOOR_ARM in arms or len(arms) == 1:
        return named or (paper.FLOOR_ARM if paper.FLOOR_ARM in arms else arms[0])
    raise UsageError(f"no {paper.FLOOR_ARM} in the inputs: name the arm the others are compared with, e.g. "
                     f"--reference-arm {arms[0]} (arms: {', '.join(arms)})")


def ladder_floor(args, data, ref):
    """The floor E held fixed, or None (fitted on the reference arm): with --time or another reference arm, Vanilla's
    FLOP-ladder floor (the inputs' or --floor-from's), as the release does, unless --refit-floor."""
    if args.shared_anchor:
        note(f"shared d{args.shared_anchor} anchor: every arm's d{args.shared_anchor} loss set to "
             f"{paper.share_anchor(data, args.shared_anchor):.6f}, the mean of the equivalent runs")
    if args.refit_floor or not (args.time or args.floor_from or ref != paper.FLOOR_ARM):
        return None
    if not args.floor_from and paper.FLOOR_ARM not in data:
        return None  # no Vanilla: the floor is the reference arm's own
    try:
        E = paper.floor_of(load_ladders(args.floor_from or args.inputs, [] if args.floor_from else args.runs_dir, False))
    except UsageError as e:
        if args.floor_from:
            raise
        raise UsageError(f"the floor is {paper.FLOOR_ARM}'s FLOP-ladder fit and the inputs give none ({e}); pass "
                         "--floor-from with FLOP ladders (the release's ladders.json for its timing.json) or --refit-floor")
    note(f"floor E = {E:.6f} from {paper.FLOOR_ARM}'s FLOP ladder, held fixed (--refit-floor fits it on {ref}'s "
         f"{'time ' if args.time else ''}ladder instead)")
    return E


def cmd_ladders(args):
    """Per arm L(C) = E + A (C/1e18)^-gamma with E fitted on the reference arm and shared (arXiv 2609.19107 Sec. 4.2),
compute multipliers, bootstrap CIs, the per-arm free-E check, forecasts at --extrapolate C (Figure 4), and with --out
Figure 3 + Figure 2 (left).
INPUTS: CSV [arm, depth, compute_flops, val_loss; optional seed, training_seconds (--time)], the authors' release JSON
(ladder series, downstream.json, or the FineWeb-Edu ladders, whose d26 record is held out), or --runs-dir: complete
train.py runs; the runs of one arm must share its recipe (arms table row, preset, data pool).
Reference arm: --reference-arm, else vanilla, else the only arm. Rows of one (arm, depth) with distinct seeds are seed
replicates: their spread is the run-to-run noise sigma (sd of ln val_loss of one run) that weights the fits and drives
a parametric bootstrap; --noise SIGMA gives it without replicates."""
    if args.out:
        check_outputs(args.out)
    marked = []
    data = load_ladders(args.inputs, args.runs_dir, args.time, marked)
    ref = reference_arm(data, args.reference_arm)
    held = hold_out(data, (args.holdout or []) + [s for s in dict.fromkeys(marked) if s not in (args.holdout or [])])
    xname, c_ref = ("s", FIT["time_ref"]) if args.time else ("FLOPs", FIT["c_ref"])
    sigma, dof = pooled_noise(data)
    source = "replicates" if sigma is not None else None
    if args.noise is not None:
        if sigma is not None:
            note(f"--noise {args.noise} replaces the replicates' pooled sigma {sigma:.5f} ({dof} dof)")
        sigma, dof, source = args.noise, 0, "--noise"
    depths = sorted(set(data[ref]["depth"]))  # multipliers from d8 on, or from a shorter ladder's second depth
    anchor = args.anchor_depth or (FIT["anchor_depth"] if depths[-1] >= FIT["anchor_depth"] else (depths[1:] or depths)[0])
    fit = fit_ladders(data, ref, c_ref, anchor, sigma, ladder_floor(args, data, ref))
    for warning in fit["warnings"]:
        note(warning)
    fit["noise"] = dict(sigma=sigma, dof=dof, source=source, scale="relative: sd of ln(val_loss) of one run",
                        replicated_points=int(sum((d["n"] > 1).sum() for d in data.values())))
    n_boot = args.bootstrap if args.bootstrap is not None else FIT["default_extrapolate_boot"] if args.extrapolate else 0
    if n_boot > 0:
        bootstrap_ladders(data, fit, n_boot, args.seed, args.extrapolate, (sigma, dof) if sigma is not None else None)
    fit["footing"] = footing(fit, sigma)
    if C := args.extrapolate:  # every arm's forecast loss and gain (Figure 4) and pi at compute C
        x = np.concatenate([d["x"] for d in data.values()])
        if not x.min() / FIT["extrapolate_warn"] <= C <= FIT["extrapolate_warn"] * x.max():
            note(f"warning: extrapolating to {C:.3g} {xname}, far outside the measured {x.min():.3g}..{x.max():.3g}; "
                 "the CI assumes the power laws hold that far")
        for a, r in fit["arms"].items():
            r["forecast_loss"], r["gain_at_extrapolate"] = forecast(fit["reference_free"], None if a == ref else r,
                                                                    C / c_ref)
            r["pi_at_extrapolate"] = float(fitted_multiplier(fit["arms"][ref], r, C / c_ref))
    for h in held:
        law = fit["arms"].get(h["arm"])
        h["forecast_loss"] = forecast(fit["reference_free"], None if h["arm"] == ref else law, h["compute"] / c_ref)[0] \
            if law else np.nan
        h["residual"] = h["loss"] - h["forecast_loss"]
    lines = [ladder_table(fit, xname)]
    if C:
        lines.append(f"\nat C = {C:.6g} {xname}: forecast loss L_arm(C); gain C_{ref}(L_arm(C)) / C (Figure 4's "
                     f"definition); pi(C) = C / C_arm(L_{ref}(C)) (shared-E laws)")
        lines += [f"  {a:<18} " + "  ".join(f"{name} {r[k]:.4f}{ci_text(r, k)}" for name, k in (
            ("loss", "forecast_loss"), ("gain", "gain_at_extrapolate"), ("pi", "pi_at_extrapolate"))) for a, r in fit["arms"].items()]
    lines += [f"held out {h['arm']} d{h['depth']} ({h['compute']:.4g} {xname}): loss {h['loss']:.4f}, forecast "
              f"{fnum(h['forecast_loss'])}, residual {fnum(h['residual'], '+.4f')}" for h in held]
    lines += [f"wrote {p}" for p in (ladder_figures(data, fit, args.out, xname) if args.out else [])]
    emit(args, dict(fit, x_unit=xname, extrapolate=args.extrapolate, held_out=held), lines)


def ci_text(r, key, fmt=".4f"):
    """' [lo, hi]' of a bootstrap CI, or '' when there is none."""
    c = r.get(f"{key}_ci")
    return f" [{fnum(c[0], fmt)}, {fnum(c[1], fmt)}]" if c else ""


def ladder_table(fit, xname):
    """The two ladder tables and what their intervals rest on; a ± or CI that laws.footing withheld reads "unknown"."""
    pm = lambda r, key, fmt=".4f": fnum(r[key], fmt) if r["intervals_known"] else "unknown"
    E_ci = f"  {FIT['ci']:.0f}% CI [{fit['E_ci'][0]:.4f}, {fit['E_ci'][1]:.4f}]" if fit.get("E_ci") else ""
    E_se = "" if "E_dof" not in fit else f" ± {'unknown' if fit['E_se'] is None else fnum(fit['E_se'])}" + (
        f" (free-E fit of {fit['reference_arm']}: {fit['E_dof'] + 3} points, {fit['E_dof']} dof"
        + (f"; on its bound {fit['E_bound']}" if fit["E_bound"] else "") + ")")
    lines = [f"E = {fit['E']:.6f}{E_se}{E_ci} (reference arm {fit['reference_arm']}, C0 = {fit['C0']:.6g} {xname})",
             f"{'arm':<18} {'points':>6} {'dof':>3}  {'gamma ± se [CI]':<33} {'log A@C0':>8} {'mult first':>10}  "
             "mult last [CI]"]
    for arm, r in fit["arms"].items():
        m = r["multipliers"]
        lines.append(f"{arm:<18} {len(r['points']):>6} {r['dof']:>3}  {r['gamma']:.4f} ± {pm(r, 'gamma_se')}"
                     f"{ci_text(r, 'gamma'):<17} {r['logA_C0']:>8.4f} {fnum(m[0]['multiplier'] if m else None, '.3f'):>10}"
                     f"  {fnum(r['final_multiplier'], '.3f')}{ci_text(r, 'final_multiplier', '.3f')}")
    lines += ["", f"{'arm':<18} {'gamma - ref ± se [CI]':<37} {'fitted pi at last [CI]':<24} own free-E fit: gamma, E "
                  f"(flag: E > {FIT['disagree_se']:.0f} se from shared)"]
    for arm, r in fit["arms"].items():
        dg = f"{r['delta_gamma']:+.4f} ± {pm(r, 'delta_gamma_se')}{ci_text(r, 'delta_gamma', '+.4f')}"
        free = (f"{r['free_gamma']:.4f} ± {pm(r, 'free_gamma_se')}, {r['free_E']:.3f} ± {pm(r, 'free_E_se', '.3f')}"
                + (f" (on its bound {r['free_E_bound']})" if r["free_E_bound"] else "")
                + ("  DISAGREES" if r["free_disagrees"] and r["intervals_known"] else "")) if "free_gamma" in r else "—"
        pi = f"{r['fitted_final_multiplier']:.3f}{ci_text(r, 'fitted_final_multiplier', '.3f')}"
        lines.append(f"{arm:<18} {dg:<37} {pi:<24} {free}")
    nz, b = fit["noise"], fit.get("bootstrap")
    src = f"pooled from seed replicates, {nz['dof']} dof" if nz["source"] == "replicates" else "given by --noise"
    lines += ["", *fit["footing"], "noise: none given (no seed replicates, no --noise); fits unweighted, gamma ± se from "
              "the residuals" if nz["sigma"] is None else f"noise: sigma = {nz['sigma']:.3g} relative (sd of ln L of one "
              f"run; {src}); fits weighted by it, gamma ± se from it; {nz['replicated_points']} points have replicates",
              f"se of gamma and of gamma - ref include the shared floor E's uncertainty (refitted on "
              f"{fit['reference_arm']}; first order); with E held fixed, gamma's se is --json's gamma_se_given_E"]
    if b:
        lines.append(f"CIs: {b['n']} " + ("parametric resamples re-drawing that noise (they include seed noise)"
                                         if b["includes_seed_noise"] else "resamples of points within each arm (they do "
                                         "not include run-to-run noise; seed replicates or --noise add it)"))
    return "\n".join(lines)


def ladder_figures(data, fit, out_dir, xname):
    """Figure 3 (loss vs compute with an inset of the top budgets, multipliers, gamma vs log A) and Figure 2 (left: the
    arms whose row in the arms table sets figure2), as PNG + PDF; a fit whose intervals are unknown says so on them."""
    plt = pyplot()
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10, "legend.fontsize": 7.5})
    E, c_ref = fit["E"], fit["c_ref"]
    xlabel = "training compute (FLOPs)" if xname == "FLOPs" else "training time (s)"

    def loss_panel(ax, arms):
        inset = ax.inset_axes([0.52, 0.5, 0.45, 0.45])
        for a in arms:
            label, color = style(a)
            r, d = fit["arms"][a], data[a]
            xs = np.geomspace(d["x"].min(), d["x"].max(), 100)
            for axis in (ax, inset):
                axis.plot(d["x"], d["loss"], "o", ms=3.5, color=color)
                axis.plot(xs, E + r["A"] * (xs / c_ref) ** -r["gamma"], "-", lw=1.2, color=color,
                          label=f"{label} (γ={r['gamma']:.3f}, {r['dof']} dof)" if axis is ax else None)
        E_se = "" if "E_dof" not in fit else " ± unknown" if fit["E_se"] is None else f" ± {fit['E_se']:.3f}"
        E_bound = f" (on its bound {fit['E_bound']})" if fit.get("E_bound") else ""
        ax.set(xscale="log", xlabel=xlabel, ylabel="validation loss", title=f"shared E = {E:.4f}{E_se}{E_bound}")
        paper.log_axis(ax.xaxis, plt)  # 1-2-4 ticks under a decade: minor labels collide
        ax.legend(loc="lower left", frameon=False)
        xmax = max(data[a]["x"].max() for a in arms)
        lo = xmax / FIT["inset_span"]
        top = [l for a in arms for x, l in zip(data[a]["x"], data[a]["loss"]) if x >= lo]
        inset.set(xscale="log", xlim=(lo / 1.1, xmax * 1.1), ylim=(min(top) - 0.01, max(top) + 0.01))
        inset.tick_params(labelsize=7)
        inset.xaxis.set_minor_formatter(plt.NullFormatter())

    def mult_panel(ax, arms):
        for a in (a for a in arms if fit["arms"][a]["multipliers"]):
            m = fit["arms"][a]["multipliers"]
            ax.plot([p["compute"] for p in m], [p["multiplier"] for p in m], "o-", ms=3.5, color=style(a)[1],
                    label=style(a)[0])
        ax.set(xscale="log", xlabel=f"{fit['reference_arm']} {xlabel}", ylabel=f"multiplier over {fit['reference_arm']}")
        paper.log_axis(ax.xaxis, plt)
        ax.legend(loc="upper left", frameon=False)

    arms = list(fit["arms"])
    fig, axes = plt.subplots(1, 3, figsize=(14.5, 4.2))
    loss_panel(axes[0], arms)
    mult_panel(axes[1], arms)
    for a in arms:  # a legend, not labels at the points: close arms (Loop-2, Operator-1) would print over each other
        r = fit["arms"][a]
        axes[2].errorbar(r["logA_C0"], r["gamma"], yerr=r["gamma_se"], fmt="o", ms=4, capsize=2, color=style(a)[1],
                         label=style(a)[0])
    axes[2].set(xlabel="log A at C0 (better →)", ylabel="exponent γ ± se (better ↑)")
    axes[2].invert_xaxis()
    axes[2].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig2, axes = plt.subplots(2, 1, figsize=(5.5, 7.5))
    arms2 = [a for a in FIGURE2_ARMS if a in fit["arms"]] or arms
    loss_panel(axes[0], arms2)
    mult_panel(axes[1], arms2)
    warnings = "\n".join(line for line in fit["footing"] if line.startswith("WARNING"))
    for f in (fig, fig2):
        f.tight_layout(rect=(0, 0.08 if warnings else 0, 1, 1))
        f.text(0.01, 0.01, warnings, color="firebrick", fontsize=7, wrap=True)
    return save_figures(out_dir, {f"{name}.{ext}": f for name, f in (("fig3_ladders", fig), ("fig2_left", fig2))
                                  for ext in ("png", "pdf")}, dpi=200)


# ---------------------------------------------------------------------------------------------------- watching runs
def lock_held(run_dir):
    """Whether a process holds the run's lock (a train.py writing it now, on this host)."""
    import fcntl
    try:
        with open(os.path.join(run_dir, "train.lock")) as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except FileNotFoundError:
        pass
    return False


def read_trajectory(run_dir):
    """trajectory.jsonl's records (docs/trajectory.md); the torn last line of a live run is left out."""
    path, records = os.path.join(run_dir, "trajectory.jsonl"), []
    for line in open(path) if os.path.isfile(path) else ():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    return records


def read_run(run_dir):
    """-> (row, trajectory records, result.json): row is where the run stands, every column at the step it reached,
    with the latest validation at or before it."""
    result, records = read_result(run_dir) or {}, read_trajectory(run_dir)
    plan, status, held = result.get("plan") or {}, result.get("status"), lock_held(run_dir)
    state = {"complete": "complete", "stopped": "stopped", "interrupted": "stopped"}.get(status, "failed")
    reason = result.get("error")
    if status in (None, "running"):
        state = "running" if held else "failed"
        reason = None if held else "no process holds its lock: the run died (killed?); ladder.sh or --resume " \
            "continues it" if result or records else "no result.json and no process holds its lock"
    elif held and state in ("stopped", "failed"):  # a resume that has not yet written "running"
        state, reason = "resuming", f"resuming a {status} run"
    finished = state not in ("running", "resuming") and "completed_steps" in result
    step = result["completed_steps"] if finished else records[-1]["step"] if records else None
    at = next((r for r in reversed(records) if r["step"] <= (step or 0)), {})
    evals = [(e["step"], e["val_loss"]) for e in result.get("evals") or []] + \
        [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    val_step, val_loss = max((e for e in evals if e[0] <= (step or 0)), default=(None, None))
    return dict(run=os.path.basename(os.path.normpath(run_dir)), path=run_dir, arch=result.get("arch", plan.get("arch")),
                depth=result.get("depth", plan.get("depth")), state=state, reason=reason, step=step,
                steps=plan.get("steps"), train_loss=at.get("loss") if at.get("step") == step else None,
                val_loss=val_loss, val_step=val_step, flops_planned=plan.get("total_flops"),
                flops=result.get("estimated_training_flops") if finished else at.get("flops"),
                wall_seconds=at.get("wall_seconds", result.get("wall_seconds")),
                eta_seconds=at.get("eta_seconds") if state == "running" else None), records, result


def read_runs(items):
    """read_run of every run --runs-dir names, in the arms table's order, then by depth and folder name."""
    return sorted(map(read_run, run_dirs(items)), key=lambda run: (arm_order(run[0]["arch"] or ""), run[0]["depth"] or 0,
                                                                   run[0]["run"]))


def val_text(row):
    """The latest validation and its step: '2.3456 @50', the start's '5.5512 @0 (start)', or —."""
    return "—" if row["val_loss"] is None else f"{row['val_loss']:.4f} @{row['val_step']}" + (
        " (start)" if row["val_step"] == 0 else "")


def runs_table(rows, link=False):
    """The runs as a markdown table (fit.py runs prints it; a ladder's report.md holds it, each run linked)."""
    return markdown_table(["run", "state", "step", "train", "val @ step", "FLOPs done / planned", "wall time", "ETA",
                           "why"], [(f"[{r['run']}]({r['run']}/report.md)" if link else r["run"], r["state"],
                                     f"{r['step'] or 0}/{r['steps'] or '?'}", fnum(r["train_loss"]), val_text(r),
                                     f"{fnum(r['flops'], '.2e')} / {fnum(r['flops_planned'], '.2e')}",
                                     clock(r["wall_seconds"]), clock(r["eta_seconds"]), r["reason"] or "") for r in rows])


def markdown_table(header, rows):
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header)] + [f"| {' | '.join(map(str, r))} |" for r in rows]


def cmd_runs(args):
    """One row per train.py run: its state (complete / running / stopped / resuming / failed, with the reason;
running while a train.py holds its train.lock on this host), the step it reached, the train loss there, the latest
validation and its step, FLOPs done / planned, wall time and ETA."""
    rows = [row for row, _, _ in read_runs(args.runs_dir)]
    print(json.dumps(jsonable(dict(runs=rows)), indent=2) if args.json else "\n".join(runs_table(rows)))


X_AXES = dict(steps=("step", "optimizer step", "linear"), tokens=("tokens", "training tokens", "log"),
              flops=("flops", "training FLOPs (the plan's accounting)", "log"))
SMOOTHING = 0.02  # the training loss drawn is its mean over a centred window of 2 % of the run's steps (>= 5)


def smoothed(values):
    """The centred moving mean (no lag, unlike an EMA on a falling loss), its window shrunk at the ends."""
    k = max(2, round(SMOOTHING * len(values) / 2))
    return [np.mean(values[max(0, i - k):i + k + 1]) for i in range(len(values))]


def curves_figure(plt, runs, x_axis):
    """Training (smoothed, raw faint) and validation loss of every run: one colour per arm, shallower runs lighter, a
    stopped or running run dashed; ▲ at a growth, | at the warmdown's start."""
    from matplotlib.colors import to_rgb
    key, label, scale = X_AXES[x_axis]
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
    for row, records, result in runs:
        arm, depth = row["arch"], row["depth"]
        depths = sorted({r["depth"] for r, _, _ in runs if r["arch"] == arm})
        rank, n = depths.index(depth), len(depths)
        lift = 0.75 * (n - 1 - rank) / (n - 1) if n > 1 else 0.0  # the deepest full, the shallowest 75 % white
        colour = tuple(c + (1 - c) * lift for c in to_rgb(style(arm)[1] if arm else "#777777"))
        if not (points := [r for r in records if r.get(key) is not None]):
            continue
        twins = [r["run"] for r, _, _ in runs if (r["arch"], r["depth"]) == (arm, depth)]
        name = f"{style(arm)[0] if arm else row['run']} d{depth}" + (f" ({row['run']})" if len(twins) > 1 else "") \
            + ("" if row["state"] == "complete" else f" [{row['state']}]")
        line = dict(color=colour, ls=("-", ":", "-.")[twins.index(row["run"]) % 3] if row["state"] == "complete" else "--")
        xs, ys = [r[key] for r in points], smoothed([r["loss"] for r in points])
        ax_train.plot(xs, [r["loss"] for r in points], color=colour, lw=0.5, alpha=0.25)
        ax_train.plot(xs, ys, lw=1.4, label=name, **line)
        vals = [r for r in points if r.get("val_loss") is not None]
        ax_val.plot([r[key] for r in vals], [r["val_loss"] for r in vals], marker="o", ms=3, lw=1, label=name, **line)
        at = {r["step"]: (r, y) for r, y in zip(points, ys)}
        for event in result.get("growth_events") or []:
            grown, y = at.get(event["step"], ({}, None))
            for ax, y in ((ax_train, y), (ax_val, grown.get("val_loss_after_growth"))):
                if y is not None:
                    ax.plot(grown[key], y, "^", color=colour, ms=8, mec="black", mew=0.6)
        plan = result.get("plan") or {}
        if plan.get("warmdown_ratio") and (start := at.get(round(plan["steps"] * (1 - plan["warmdown_ratio"])))):
            ax_train.plot(start[0][key], start[1], "|", color=colour, ms=18, mew=2.5, mec="black")
    for ax, title in ((ax_train, f"training loss (centred mean over {SMOOTHING:.0%} of each run's steps, >= 5; raw "
                                 "faint)"), (ax_val, "validation loss")):
        ax.set_xscale(scale)
        if any(len(line.get_ydata()) for line in ax.lines):  # a run without a validation yet leaves its panel empty
            ax.set_yscale("log")
        ax.set(xlabel=label, ylabel=f"{title.split(' (')[0]} (nats per token)")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(plt.matplotlib.ticker.FormatStrFormatter("%.3g"))
        ax.set_title(f"{title}\n▲ growth" + (", | warmdown start" if ax is ax_train else "")
                     + "; dashed: stopped or running", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    ax_val.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def draw_curves(runs, out, x_axis):
    """curves_figure of each ladder (the runs' preset) into out/curves_LADDER_X.{png,pdf} -> the paths written."""
    check_outputs(out)
    plt, ladders, paths = pyplot(), {}, []
    for run in runs:
        if run[1]:  # a run without trajectory records has nothing to draw yet
            ladders.setdefault((run[2].get("plan") or {}).get("preset") or "runs", []).append(run)
    for ladder, members in ladders.items():
        fig = curves_figure(plt, members, x_axis)
        paths += save_figures(out, {f"curves_{ladder}_{x_axis}.{ext}": fig for ext in ("png", "pdf")}, dpi=120)
        plt.close(fig)
    return paths


def cmd_curves(args):
    """Training and validation loss of train.py runs against steps, tokens or FLOPs (docs/trajectory.md), one figure
per ladder (the runs' preset), one colour per arm, depth by shade, growth and warmdown marked."""
    runs = [run for run in read_runs(args.runs_dir) if run[1]]
    if not runs:
        raise UsageError(f"no run in {' '.join(args.runs_dir)} has trajectory records yet")
    for p in draw_curves(runs, args.out or os.path.join(args.runs_dir[0], "curves"), args.x):
        print(f"wrote {p}")


REPORT_PLAN = ("arch", "preset", "depth", "width", "n_layer", "params_tpp", "params_stored", "steps", "tokens_per_step",
               "train_tokens", "total_flops", "pass_stages", "crossover_steps", "warmup_steps", "warmdown_ratio",
               "rewarm_steps", "matrix_lr", "embedding_lr", "weight_decay", "optimizer", "seed")


def write_run_report(run_dir, curves=None, run=None):
    """RUN/report.md (train.py at a run's end, fit.py report) of one run: plan, environment, curves, validations,
    CORE (eval.json) and timings, replaced whole; run: read_runs' entry of it, if read already. -> its path."""
    (row, _, result), = [run] if run else read_runs([run_dir])
    plan = result.get("plan") or {}
    num = lambda v: f"{v:.6g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)
    env = dict(result.get("environment") or {}, world_size=result.get("world_size"), data_dir=result.get("data_dir"))
    core = read_result(run_dir, "eval.json")
    lines = [f"# {row['run']}", "", f"{row['arch']} d{row['depth']}, preset {plan.get('preset')}: **{row['state']}** "
             f"at step {row['step']}/{row['steps']}" + (f" ({row['reason']})" if row["reason"] else "") + ".", "",
             "## Plan", "", *markdown_table(["field", "value"], [(f"`{k}`", num(plan[k])) for k in REPORT_PLAN
                                                                  if k in plan]),
             "", *[f"- note: {n}" for n in result.get("schedule_notes") or []],
             "", "## Environment", "", *markdown_table(["", ""], [(k, v) for k, v in env.items() if v is not None]),
             "", "## Curves", "", f"![training and validation loss]({curves})" if curves else
             f"Drawn by `python fit.py report --runs-dir {run_dir}`.",
             "", "## Validation", "", *markdown_table(
                 ["step", "when", "passes", "val loss (nats/token)", "val bpb"],
                 [(e["step"], e.get("when", ""), e.get("passes", ""), f"{e['val_loss']:.4f}", fnum(e.get("val_bpb")))
                  for e in result.get("evals") or []]),
             "", "## CORE", "", f"CORE {core['core_metric']:.4f} ({core.get('checkpoint')})" if core else
             f"Not evaluated (`python core_eval.py --checkpoint {os.path.join(run_dir, 'checkpoints', 'final')}`).",
             "", "## Timings", "", *markdown_table(["", ""], [
                 ("training time (wall time less validations and checkpoints)",
                  clock(result.get("total_training_time_seconds"))),
                 ("validation time", clock(result.get("eval_seconds"))),
                 ("wall time (resumes added up)", clock(row["wall_seconds"])),
                 ("training tokens / s", fnum(result.get("tokens_per_second"), ",.0f")),
                 ("FLOPs done", fnum(row["flops"], ".4g"))])]
    write_text(os.path.join(run_dir, "report.md"), "\n".join(lines) + "\n")
    return os.path.join(run_dir, "report.md")


def cmd_report(args):
    """report.md of a run (--runs-dir RUN, with its curves) or of a ladder (--runs-dir RUNS_DIR: every run's, then
RUNS_DIR/report.md: the runs table, `fit.py ladders` of the arms with >= 3 complete depths (figures in RUNS_DIR/fit)
and the curves (RUNS_DIR/curves))."""
    runs_dir, table, runs, written = args.runs_dir[0], None, read_runs(args.runs_dir), []
    for run in runs:
        curves = draw_curves([run], run[0]["path"], "steps")  # none for a run without trajectory records yet
        written.append(write_run_report(run[0]["path"], os.path.basename(curves[0]) if curves else None, run))
    if [run[0]["path"] for run in runs] != [runs_dir]:
        rows = [row for row, _, _ in runs]
        lines = [f"# Ladder report: {runs_dir}", "", "## Runs", "", *runs_table(rows, link=True), "", "## Fit", ""]
        fitted = [a for a in dict.fromkeys(r["arch"] for r in rows)
                  if len({r["depth"] for r in rows if r["arch"] == a and r["state"] == "complete"}) >= 3]
        argv = ["ladders", "--runs-dir", *[r["path"] for r in rows if r["arch"] in fitted], "--bootstrap",
                str(args.bootstrap), "--out", os.path.join(runs_dir, "fit")] + \
            (["--reference-arm", args.reference_arm] if args.reference_arm else [])
        try:
            if not fitted:
                raise UsageError("no arm has 3 complete depths yet")
            with contextlib.redirect_stdout(io.StringIO()) as text:  # the table as `fit.py ladders` prints it
                cmd_ladders(build_parser().parse_args(argv))
            table = "\n".join(l for l in text.getvalue().splitlines() if not l.startswith("wrote "))
            lines += [f"`python fit.py {' '.join(argv)}`", "", "```", table, "```", "", "![ladders](fit/fig3_ladders.png)"]
            written.append(os.path.join(runs_dir, "fit"))
        except UsageError as e:  # the runs are what they are: the report says why they do not fit
            note(f"no fit: {e}")
            lines.append(f"No fit: {e}")
        curves = draw_curves(runs, os.path.join(runs_dir, "curves"), "steps")
        lines += ["", "## Curves", ""] + [f"![curves](curves/{os.path.basename(p)})" for p in curves if p.endswith(".png")]
        write_text(os.path.join(runs_dir, "report.md"), "\n".join(lines) + "\n")
        written.append(os.path.join(runs_dir, "report.md"))
    print("\n".join(([table] if table else []) + [f"wrote {p}" for p in written]))


# ---------------------------------------------------------------------------------------------------- downstream (App. C.4)
def downstream_columns(args):
    """The measurements -> ({arm, compute_flops, core, nll:<task>, acc:<task>: columns}, tasks): a CSV, the release's
    FineWeb-Edu ladders (its d26 run left out) or the complete runs with core_eval.py's eval.json."""
    if bool(args.data) == bool(args.runs_dir):
        raise UsageError("give the measurements: a DATA file or --runs-dir (runs with core_eval.py's eval.json)")
    row = lambda arm, C, core, nll, acc: dict(arm=arm, compute_flops=float(C), core=float(core),
                                              **{f"nll:{t}": float(v) for t, v in nll.items()},
                                              **{f"acc:{t}": float(v) for t, v in acc.items()})
    if args.data and not args.data.endswith(".json"):
        tasks = [k for k in read_csv(args.data, ["arm", "compute_flops", "core"]) if k[:4] in ("nll:", "acc:")]
        c = read_csv(args.data, [], numeric=["compute_flops", "core", *tasks], key=["arm", "compute_flops"],
                     positive=["compute_flops"] + [k for k in tasks if k.startswith("nll:")])
    else:
        if args.data:
            obj = paper.read_json(args.data)
            if paper.json_layout(obj) != "fineweb_edu":
                raise paper.layout_error(args.data, ("fineweb_edu",), "a CSV [arm, compute_flops, core, nll:<task>..., "
                                         "acc:<task>...] or ")
            tasks, records = paper.edu_records(args.data, obj)
            try:
                rows = [row(arm, r["compute_flops"], r["core_accuracy"], {t: r["task_nll"][t] for t in tasks},
                            {t: r["task_accuracy"][t] for t in tasks}) for arm, r, _, held_out in records if not held_out]
            except (KeyError, TypeError, ValueError):
                raise UsageError(f"{args.data}: every ladder record needs core_accuracy, and task_nll and "
                                 "task_accuracy for every task in 'tasks'")
        else:
            rows = [row(r["arch"], r["estimated_training_flops"], ev["core_metric"], ev["losses"], ev["centered_results"])
                    for d, r in complete_runs(args.runs_dir) if (ev := read_result(d, "eval.json"))]
            if not rows:
                raise UsageError("no complete run with an eval.json: run core_eval.py on their checkpoints first")
        c = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    tasks = [k[4:] for k in c if k.startswith("nll:") and f"acc:{k[4:]}" in c]
    if lone := next((k for k in c if k[:4] in ("nll:", "acc:") and k[4:] not in tasks), None):
        raise UsageError(f"{args.data}: column {lone} has no {'acc' if lone[:3] == 'nll' else 'nll'}:{lone[4:]}; a task "
                         "is an nll:<task>, acc:<task> pair")
    if not tasks:
        raise UsageError(f"{args.data or args.runs_dir[0]}: no task columns (need nll:<task> and acc:<task> pairs)")
    return c, tasks


def cmd_downstream(args):
    """CORE forecast (App. C.4): per task NLL = E + A C^-alpha per arm, centered accuracy = sigmoid of the NLL, CORE =
r x the mean accuracy; the compute each arm needs for --targets, CORE --at budgets. DATA: a CSV [arm, compute_flops,
core, nll:<task>..., acc:<task>...] or the release's FineWeb-Edu ladders JSON; or --runs-dir (with eval.json)."""
    from scipy import optimize
    c, tasks = downstream_columns(args)
    ref = reference_arm(dict.fromkeys(c["arm"]), args.reference_arm)
    arm, x, core = np.array(c["arm"]), c["compute_flops"] / FIT["c_ref"], c["core"]
    filtered = np.mean([c[f"acc:{t}"] for t in tasks], axis=0)
    sig = {t: paper.fit_sigmoid(c[f"nll:{t}"], c[f"acc:{t}"]) for t in tasks}
    r = float(filtered @ core / (filtered @ filtered))  # CORE = r x the filtered mean, least squares through 0
    res = r * filtered - core
    rmse = lambda t: float(np.sqrt(np.mean((paper.sigmoid(c[f"nll:{t}"], *sig[t]) - c[f"acc:{t}"]) ** 2)))
    out = dict(tasks=tasks, ratio=r, ratio_rmse=float(np.sqrt(np.mean(res ** 2))),
               ratio_r2=float(1 - res @ res / ((core - core.mean()) ** 2).sum()),
               sigmoids={t: dict(a=s[0], b=s[1], rmse=rmse(t)) for t, s in sig.items()}, arms={})
    for a in dict.fromkeys(c["arm"]):
        m = arm == a
        if m.sum() < 3:
            note(f"arm {a}: fewer than 3 points ({m.sum()}); skipped")
            continue
        laws = {t: paper.fit_task_nll(x[m], c[f"nll:{t}"][m]) for t in tasks}
        at = lambda lc: r * np.mean([paper.sigmoid(E + A * (10 ** lc / FIT["c_ref"]) ** -al, *sig[t])
                                     for t, (E, A, al) in laws.items()])
        need = {}
        for target in args.targets:
            try:
                need[target] = 10 ** optimize.brentq(lambda lc: at(lc) - target, 15, 40)
            except ValueError:
                note(f"arm {a}: CORE {target} is not reached in [1e15, 1e40] FLOPs; missing")
                need[target] = np.nan
        out["arms"][a] = dict(nll_laws={t: dict(E=l[0], A=l[1], alpha=l[2]) for t, l in laws.items()},
                              compute_for_target=need, core_at={C: at(math.log10(C)) for C in args.at})
    base, lines = out["arms"].get(ref), [f"{len(tasks)} tasks; full/filtered ratio r = {r:.4f} (RMSE "
                                         f"{out['ratio_rmse']:.4f}, R² {out['ratio_r2']:.4f})"]
    for a, o in out["arms"].items():
        lines.append(f"{a}: " + ", ".join(f"CORE {t}: {fnum(C, '.3g')} FLOPs" + (
            f" (x{base['compute_for_target'][t] / C:.2f})" if base and a != ref else "")
            for t, C in o["compute_for_target"].items()) + "".join(f"; CORE@{C:.3g} = {v:.4f}" for C, v in o["core_at"].items()))
    emit(args, out, lines)


# ---------------------------------------------------------------------------------------------------- design
DESIGN_FORMS = "'d6-18' (depths 6..18), 'x3' (3 seeds everywhere), 'x3@top2' (at each arm's 2 largest depths), " \
               "'x3@16,18' (at those depths), combined as 'd6-18 x3@top2'"
MAX_SEEDS = 100  # seeds per planned point in a design spec
DESIGN_COLUMNS = (("gamma", "gamma_true", ".4f"), ("spread", "gamma_ci_halfwidth", ".4f"),
                  ("se, E known", "gamma_se_known_E", ".5f"), ("dgamma", "delta_gamma_true", "+.4f"),
                  ("spread", "delta_gamma_ci_halfwidth", ".4f"), ("P(det)", "detect_probability", ".2f"),
                  ("cover", "gamma_coverage", ".3f"), ("E fix", "gamma_coverage_given_E", ".3f"),
                  ("cov dg", "delta_gamma_coverage", ".3f"), ("power", "power", ".2f"), ("lower E", "lower_floor", ".2f"))


def read_plan(paths):
    """Planned runs: train.py --dry-run JSON lines ('-' = stdin) or a CSV [arm, depth, compute_flops] (a ladder's
    table: its runs as the plan) -> {(arm, depth): compute_flops}."""
    plan, records = {}, []
    for path in paths:
        if path.endswith(".csv"):
            c = read_csv(path, ["arm", "depth", "compute_flops"], numeric=["depth", "compute_flops"])
            records += [(f"{path}:{line}", dict(arch=a, depth=int(d) if d % 1 == 0 else d, total_flops=x))
                        for a, d, x, line in zip(c["arm"], c["depth"], c["compute_flops"], c["_line"])]
            continue
        try:
            lines = (sys.stdin if path == "-" else open(path)).read().splitlines()
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}")
        records += [(f"{path}:{i}", line) for i, line in enumerate(lines, 1) if line.strip()]
    for where, r in records:
        try:
            r = json.loads(r) if isinstance(r, str) else r
            assert isinstance(r["arch"], str) and type(r["depth"]) is int and r["depth"] > 0 \
                and math.isfinite(r["total_flops"]) and r["total_flops"] > 0
        except (ValueError, KeyError, TypeError, AssertionError):
            raise UsageError(f"{where}: not a train.py --dry-run plan (a JSON object with arch, a whole depth > 0 "
                             "and total_flops > 0 per line) nor a CSV row [arm, depth, compute_flops]")
        if plan.setdefault((r["arch"], r["depth"]), r["total_flops"]) != r["total_flops"]:
            raise UsageError(f"{where}: a second, different plan for {r['arch']} d{r['depth']}; remove one")
    if not plan:
        raise UsageError(f"{' '.join(paths)}: no planned runs")
    return plan


def apply_design(plan, spec):
    """A --design spec ('' = the plan as given) applied to the plan -> {arm: (x, seeds, depths)}."""
    m = re.fullmatch(r"\s*(?:d(\d+)-(\d+))?\s*(?:x(\d+)(?:@top(\d+)|@(\d+(?:,\d+)*))?)?\s*", spec)
    if not m:
        raise UsageError(f"--design {spec!r}: use {DESIGN_FORMS}")
    lo, hi, seeds, top, at = m.groups()
    planned = {d for _, d in plan}
    lo, hi = (int(lo), int(hi)) if lo else (min(planned), max(planned))
    at = {int(d) for d in at.split(",")} if at else set()
    problems = [(({lo, hi} | at) - planned, "asks for a depth no planned run has"),
                (lo > hi, "has its depth range backwards"),
                (seeds and not 1 <= int(seeds) <= MAX_SEEDS, f"asks for seeds outside 1 to {MAX_SEEDS}"),
                (top == "0", "needs topK with K >= 1"), (at - set(range(lo, hi + 1)), "puts seeds outside its depths")]
    for bad, why in problems:
        if bad:
            raise UsageError(f"--design {spec!r} {why}" + (f" ({', '.join(map(str, sorted(bad)))})"
                                                          if isinstance(bad, set) else ""))
    out = {}
    for arm in dict.fromkeys(a for a, _ in plan):
        ds = sorted(d for a, d in plan if a == arm and lo <= d <= hi)
        extra = set(ds[-int(top):]) if top else at or set(ds)
        n = [int(seeds) if seeds and d in extra else 1 for d in ds]
        out[arm] = (np.array([plan[(arm, d)] for d in ds]), np.array(n), ds)
    return out


def arm_delta_gamma(text):
    """--delta-gamma [ARM=]DG -> (ARM or "", DG), DG a finite number in (-1, 1)."""
    arm, _, value = text.rpartition("=")
    return arm, number("(-1, 1)")(value)


def true_laws(args, arms):
    """{arm: (A, gamma)} and E from --truth (a `fit.py ladders --json` output); --delta-gamma [ARM=]DG sets an arm's
    true gamma to the reference's + DG (a bare DG: every planned arm the truth has no law for)."""
    try:
        pilot = json.load(open(args.truth))
        E, have = float(pilot["E"]), {a: (float(r["A"]), float(r["gamma"])) for a, r in pilot["arms"].items()}
        assert all(math.isfinite(v) and v > 0 for v in (E, *(v for law in have.values() for v in law)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, AssertionError):
        raise UsageError(f"{args.truth} is not a `fit.py ladders --json` output (E, arms with A, gamma; all > 0)")
    ref, named = have.get(args.reference_arm), dict(args.delta_gamma or [])  # named: ARM=DG, and "" for a bare DG
    if ref is None or any(a and a not in arms or a == args.reference_arm for a in named) or \
            "" in named and all(a in have for a in arms):
        raise UsageError(f"--delta-gamma [ARM=]DG changes a planned arm ({', '.join(arms)}) but the reference "
                         f"{args.reference_arm}, whose law the truth must give; a bare DG the arms it has no law for "
                         f"(it has: {', '.join(have)})")
    laws = {}
    for a in arms:
        dg = named.get(a, named.get("") if a not in have else None)
        if dg is None and a not in have:
            raise UsageError(f"planned arm {a!r} has no law in the truth; pass --delta-gamma {a}=DG")
        laws[a] = (have.get(a, ref)[0], have[a][1] if dg is None else ref[1] + dg)
        if laws[a][1] <= 0:
            raise UsageError(f"--delta-gamma {dg:g} gives {a} a true gamma of {laws[a][1]:g}; it must stay > 0")
    return E, laws


def cmd_design(args):
    """How many depths and seeds a ladder needs, before GPU-hours are spent: simulates the planned ladders under the
true laws of --truth (`fit.py ladders --json` of a pilot; --delta-gamma for the arms it has no law for) and relative
run-to-run noise (each run's ln L gets sigma z), fits each as `fit.py ladders --noise` does, and reports per design
and arm the 95 % CI half-width of gamma and of gamma - gamma_ref, the E-known standard error, P(detect), the coverage
and power of the intervals fit.py ladders prints, how often the free-E fit reads an advantage as a lower floor, and
the plan's FLOPs and H100-hours. PLAN: train.py --dry-run JSON lines ('-' = stdin) or a CSV [arm, depth,
compute_flops], one seed per run unless a --design says more."""
    plan = read_plan(args.plan)
    ref = args.reference_arm = reference_arm(dict.fromkeys(a for a, _ in plan), args.reference_arm)
    E, laws = true_laws(args, dict.fromkeys(a for a, _ in plan))
    peak, results = GPU_PEAK_FLOPS["H100"], []
    for spec in args.design or [""]:
        name, arms = spec or "plan", apply_design(plan, spec)
        if short := [a for a, (_, _, ds) in arms.items() if len(ds) < 3]:
            raise UsageError(f"design {name!r}: {short[0]} has fewer than 3 planned depths; a fit needs 3")
        points = {a: (x / FIT["c_ref"], n) for a, (x, n, _) in arms.items()}
        draws = simulate(points, laws, E, ref, args.noise, args.sims, np.random.default_rng(args.seed), args.fixed_E)
        summary = summarize(points, laws, E, ref, args.noise, draws)
        warnings = [f"{a}: only {v['valid']} of {v['sims']} simulated fits converged (< {FIT['design_min_converged']:.0%}"
                    "); its numbers rest on those alone" for a, v in summary.items()
                    if v["valid"] < FIT["design_min_converged"] * v["sims"]]
        for w in warnings:
            note(f"warning: design {name!r}: {w}")
        flops = float(sum((x * n).sum() for x, n, _ in arms.values()))
        results.append(dict(design=name, runs=int(sum(n.sum() for _, n, _ in arms.values())), flops=flops,
                            gpu_hours=flops / (peak * args.mfu) / 3600, arms=summary, warnings=warnings,
                            depths={a: dict(zip(map(int, ds), map(int, n))) for a, (_, n, ds) in arms.items()}))
    if args.json:
        return emit(args, dict(noise=args.noise, E=E, reference_arm=ref, fixed_E=args.fixed_E, sims=args.sims,
                               seed=args.seed, mfu=args.mfu, designs=results), [])
    print(f"sigma = {args.noise:g} relative; {args.sims} simulated ladders per design; " + ("E known" if args.fixed_E
          else f"E refitted on {ref}") + f"; H100-hours at {args.mfu:.0%} MFU. fits: converged/asked; spread: 95% "
          "half-width of the estimates; P(det): an estimate beyond it; cover (E fix, dg), power: of the analyst's 95% "
          "intervals; lower E: the arm's own free-E fit rejects the shared E for a lower one")
    for r in results:  # the reference arm has no delta columns: —
        print(f"\n{r['design']}: {r['runs']} runs, {r['flops']:.3e} FLOPs, {r['gpu_hours']:,.0f} GPU-hours", *markdown_table(
            ["arm", "fits", *(name for name, _, _ in DESIGN_COLUMNS)], [(a, f"{v['valid']}/{v['sims']}", *(
                fnum(v.get(key), fmt) for _, key, fmt in DESIGN_COLUMNS)) for a, v in r["arms"].items()]),
              *(f"WARNING: {w}" for w in r["warnings"]), sep="\n")


# ---------------------------------------------------------------------------------------------------- surface
def cmd_surface(args):
    """Chinchilla L = E + A/N^a + B/D^b and Skaling L = (A/N^a + B/D^b)^k + E fits of L(N, D) (Huber on ln L, L-BFGS-B
from a grid of starts plus basin-hopping), compute-optimal N*(C), D*(C) on C = 6 N D, and with --sparse-l the fit on
the L-shaped subset (smallest N or smallest D) scored on the rest. DATA.csv [N, D or compute (= 6 N D), loss], >= 7
rows; D is used where both are given."""
    cols = ["N", "D", "compute", "loss"]
    c = read_csv(args.data, ["N", "loss"], numeric=cols, positive=cols, key=["N", "D", "compute"])
    if "D" not in c and "compute" not in c:
        raise UsageError(f"{args.data}: need a D or a compute column besides N and loss")
    N, L = c["N"], c["loss"]
    D = c["D"] if "D" in c else c["compute"] / (6 * N)
    if len(L) < 7:
        raise UsageError(f"{args.data}: need >= 7 rows to fit, have {len(L)}")
    forms = ["chinchilla", "skaling"] if args.form == "both" else [args.form]
    delta = {f: args.delta or FIT["surface_delta"][f] for f in forms}
    C = 6 * N * D
    budgets = args.budgets or list(10.0 ** np.arange(math.floor(np.log10(C.min())), math.ceil(np.log10(C.max())) + 1))
    out, lines = dict(delta=delta, forms={}), [f"{len(L)} points"]
    for form in forms:
        p = fit_surface(N, D, L, form, delta[form], args.hops, args.seed)
        r = out["forms"][form] = dict(params=p, mape_all=mape(p, N, D, L), optimal=[compute_optimal(p, b) for b in budgets],
                                      ratio_exponent=(p["alpha"] - p["beta"]) / (p["alpha"] + p["beta"]))
        lines += [f"\n{form} (Huber delta {delta[form]:g} on ln L): E={p['E']:.4f} A={p['A']:.4g} alpha={p['alpha']:.4f} "
                  f"B={p['B']:.4g} beta={p['beta']:.4f} k={p['k']:.4f}  MAPE(all)={r['mape_all']:.3f}%",
                  f"  D*/N* ~ C^{r['ratio_exponent']:+.3f}"] + [
            f"  C={o['compute']:.3g}: N*={o['N']:.4g} D*={o['D']:.4g} D*/N*={o['ratio']:.2f} L*={o['loss']:.4f}"
            for o in r["optimal"]]
        if args.sparse_l:
            sub = np.isclose(N, N.min(), rtol=1e-9) | np.isclose(D, D.min(), rtol=1e-9)
            ps = fit_surface(N[sub], D[sub], L[sub], form, delta[form], args.hops, args.seed)
            r["sparse_l"] = dict(n_fit=int(sub.sum()), params=ps, mape_rest=mape(ps, N[~sub], D[~sub], L[~sub]))
            lines.append(f"  L-shaped subset ({sub.sum()} points): MAPE on the rest {r['sparse_l']['mape_rest']:.3f}%")
    emit(args, out, lines)


# ---------------------------------------------------------------------------------------------------- sweeps
def sweep_optima(c, group, knob, log):
    """The vertex of paper.quadratic of val_loss in `knob` (both in logs with log=True) per group of rows sharing the
    `group` columns -> {group values: (knob*, loss*)}; a group without an interior minimum is skipped."""
    keys, f = list(zip(*(c[g] for g in group))), np.log if log else np.asarray
    out = {}
    for key in dict.fromkeys(keys):
        m = np.array([k == key for k in keys])
        where = ", ".join(f"{g} {v:.4g}" if isinstance(v, float) else f"{g} {v}" for g, v in zip(group, key))
        x, y = f(c[knob][m]), f(c["val_loss"][m])
        coef, xv, inside = paper.quadratic(x, y) if len(np.unique(x)) >= 3 else ((0,), None, False)
        if coef[0] <= 0:
            note(f"{where}: no interior minimum (needs >= 3 distinct values and curvature > 0); skipped")
            continue
        if not inside:
            note(f"{where}: vertex outside the swept range (extrapolated)")
        yv = float(np.polyval(coef, xv))
        out[key] = (math.exp(xv), math.exp(yv)) if log else (xv, yv)
    if not out:
        raise UsageError("no group of rows could be fitted (each needs >= 3 distinct values with a minimum)")
    return out


def emit(args, out, lines):
    print(json.dumps(jsonable(out), allow_nan=False) if args.json else "\n".join(lines))


def cmd_tpp(args):
    """Quadratic vertex of log loss vs log tokens-per-parameter per budget (App. A.4.2). DATA.csv [compute_flops, tpp,
val_loss], several tpp per budget."""
    from scipy import stats
    cols = ["compute_flops", "tpp", "val_loss"]
    v = sweep_optima(read_csv(args.data, cols, numeric=cols, positive=cols, key=cols[:2]), cols[:1], "tpp", log=True)
    out = dict(budgets=[dict(compute=k[0], tpp=t, loss=loss) for k, (t, loss) in v.items()])
    tpps = np.array([t for t, _ in v.values()])
    out["mean_tpp"] = float(tpps.mean())
    lines = [f"C={b['compute']:.4g}: TPP*={b['tpp']:.3f} loss*={b['loss']:.4f}" for b in out["budgets"]]
    lines.append(f"mean TPP* = {out['mean_tpp']:.3f}")
    if len(v) >= 3:  # scale-shift test: log TPP* = a + beta log C, two-sided p of beta = 0
        reg = stats.linregress(np.log([k[0] for k in v]), np.log(tpps))
        out["scale_shift"] = dict(beta=reg.slope, beta_se=reg.stderr, p_value=reg.pvalue)
        lines.append(f"scale shift beta = {reg.slope:+.4f} ± {reg.stderr:.4f} (p = {reg.pvalue:.3f})")
    emit(args, out, lines)


def cmd_growth(args):
    """Quadratic in the post-growth fraction rho per (depth, budget) (App. A.2.3, A.4.3). DATA.csv [depth,
compute_flops, rho, val_loss], rho (the share of steps after growth) in [0, 1]."""
    cols = ["depth", "compute_flops", "rho", "val_loss"]
    c = read_csv(args.data, cols, numeric=cols, positive=["depth", "compute_flops", "val_loss"], fraction=["rho"],
                 key=cols[:3])
    out = dict(groups=[dict(depth=int(d), compute=C, rho=rho, loss=loss)
                       for (d, C), (rho, loss) in sweep_optima(c, cols[:2], "rho", log=False).items()])
    out["mean_rho"] = float(np.mean([g["rho"] for g in out["groups"]]))
    out["rho"] = round(out["mean_rho"], 1)  # A.4.3: average the fitted optima and round to one decimal
    emit(args, out, [f"d{g['depth']} C={g['compute']:.4g}: rho*={g['rho']:.3f} loss*={g['loss']:.4f}"
                     for g in out["groups"]] + [f"mean rho* = {out['mean_rho']:.3f} -> rho = {out['rho']:.1f}"])


def cmd_lr(args):
    """Quadratic of log loss vs log value per size, then log optimum vs log N: a hyperparameter's drift exponent
(App. A.4.4). DATA.csv [params, value, val_loss (+ hparam: several hyperparameters at once)]."""
    from scipy import stats
    cols = ["params", "value", "val_loss"]
    c = read_csv(args.data, cols, numeric=cols, positive=cols, key=["hparam", "params", "value"])
    c.setdefault("hparam", ["lr"] * len(c["params"]))
    v = sweep_optima(c, ["hparam", "params"], "value", log=True)
    out, lines = {}, []
    for h in dict.fromkeys(h for h, _ in v):
        sizes = np.array(sorted(n for g, n in v if g == h))
        if len(sizes) < 2:
            note(f"{h}: fewer than 2 sizes with an optimum; no drift exponent")
            continue
        opt = np.log([v[h, n][0] for n in sizes])
        reg = stats.linregress(np.log(sizes), opt)
        out[h] = dict(optima=[dict(params=n, value=math.exp(o)) for n, o in zip(sizes, opt)], beta=reg.slope,
                      beta_se=reg.stderr if len(sizes) > 2 else np.nan,
                      anchor=dict(params=sizes[0], value=math.exp(reg.intercept + reg.slope * math.log(sizes[0]))))
        lines.append(f"{h}: optimum ∝ N^{reg.slope:+.3f} ± {fnum(out[h]['beta_se'], '.3f')}; "
                     + ", ".join(f"N={n:.3g}: {math.exp(o):.4g}" for n, o in zip(sizes, opt)))
    if not out:
        raise UsageError(f"{args.data}: no hyperparameter has optima at 2 sizes")
    emit(args, out, lines)


# ---------------------------------------------------------------------------------------------------- loops (Figures 2 right, 5)
LOOP_GRID_VARIED = ("passes", "passes_initial", "weight_decay")  # what the grid's runs vary beside the depth


def loop_optima(ladders, budgets, need=1):
    """R4 at each budget: the loss of each loop count K whose ladder spans it (linear in compute between depths), the
    optimal K* of a quadratic in (log K, log L) (paper.loop_optimum; else the best measured K, interior False)."""
    out = []
    for C in budgets:
        Ks, losses = paper.at_budget(ladders, C)
        if len(Ks) >= need:
            k, loss, interior, _ = paper.loop_optimum(Ks, losses)
            out.append(dict(compute=C, best_loops=k, best_loss=loss, interior=interior, **(
                dict(gap_to_k1=float(losses[Ks == 1][0] - loss)) if 1 in Ks else {})))
    return out


def cmd_loops(args):
    """The loop grid (Figures 2 right, 5): at weight decay --wd, the loss of each loop count K at each budget
(interpolated between depths), the optimal K* from a quadratic in log K, and the compute Operator-1 (K = 1, weight
decay tuned per depth) needs over the loop frontier. The grid: a CSV or train.py --data-constrained runs (one recipe).
The release's regimes.csv, architectures.csv: K* per regime or control (Figures 21, 24); hyperparameters.csv: each
knob's best multiple (Figure 23b)."""
    if bool(args.data) == bool(args.runs_dir):
        raise UsageError("give the loop grid: a CSV or --runs-dir (train.py --data-constrained runs)")
    if args.out:
        check_outputs(args.out)
    if args.runs_dir:
        runs = complete_runs(args.runs_dir)
        for d, r in runs:
            if not r["plan"].get("data_constrained"):
                raise UsageError(f"{d} is not a loop-grid run (its plan's data_constrained is "
                                 f"{r['plan'].get('data_constrained')!r}); fit.py loops reads --data-constrained runs")
        if not runs:
            raise UsageError(f"{' '.join(args.runs_dir)}: no complete train.py runs")
        check_one_recipe(runs, "loop-grid runs", LOOP_GRID_VARIED, ("train_token_limit",))
        names = ["depth", "loops", "weight_decay", "compute", "loss"]  # compute without attention, as loop_grid.csv
        rows = [(r["plan"]["depth"], r["plan"]["passes_final"], r["plan"]["weight_decay"], r["estimated_matrix_flops"],
                 r["final_val_loss"]) for _, r in runs]
        c = drop_repeats({n: np.array(col, dtype=float) for n, col in zip(names, zip(*rows))}, names[:3], names,
                         [d for d, _ in runs])
    elif set(read_csv(args.data, [])) & {"compute", "knob"}:  # the release's tables
        c, name = paper.read_table(args.data)
        if name == "hyperparameters.csv":
            best = {f"{f} {k} K={K:g}": float(c["multiplier"][m][np.argmin(c["loss"][m])])
                    for f, k, K in dict.fromkeys(zip(c["family"], c["knob"], c["loops"]))
                    for m in [(np.array(c["family"]) == f) & (np.array(c["knob"]) == k) & (c["loops"] == K)]}
            return emit(args, dict(best_multiplier=best), [f"{g}: best at {v:g}x the centre" for g, v in best.items()])
        if name != "weight_decay.csv":
            groups = [" ".join(g) for g in zip(*[c[k] for k in paper.REGIME_TABLES[name]])]
            budgets = args.budgets or (paper.FINE_BUDGETS if name == "regimes.csv" else paper.BUDGETS)
            optima = {g: loop_optima(paper.grid_ladders(c, np.array(groups) == g), budgets) for g in dict.fromkeys(groups)}
            return emit(args, dict(optima=optima), [f"{g}: " + ", ".join(f"C={o['compute']:.3g} K*={o['best_loops']:.2f}"
                                                                        + ("" if o["interior"] else " (measured)")
                                                                        for o in opt) for g, opt in optima.items()])
    else:
        c = paper.read_loop_grid(args.data)
    at_wd = np.isclose(c["weight_decay"], args.wd)
    if not at_wd.any():
        raise UsageError(f"{args.data}: no rows at weight decay {args.wd:g} (have "
                         f"{', '.join(f'{w:g}' for w in sorted(set(c['weight_decay'])))}); pass one of them as --wd")
    budgets = args.budgets or list(FIT["loop_budgets"])
    out = dict(weight_decay=args.wd, budgets=loop_optima(paper.grid_ladders(c, at_wd), budgets, need=3))
    if not out["budgets"]:
        raise UsageError(f"{args.data}: no budget could be fitted at weight decay {args.wd:g}: each needs >= 3 loop "
                         f"counts whose runs span it; pass --budgets inside the grid")
    op1 = []  # Operator-1 (K = 1) at the best weight decay per depth
    for C, loss, w, d in paper.k1_best(c):
        wds = c["weight_decay"][(c["loops"] == 1) & (c["depth"] == d)]
        op1.append(dict(compute=C, loss=loss, depth=d, weight_decay=w,
                        wd_at_grid_edge=bool(len(set(wds)) > 1 and w in (wds.min(), wds.max()))))
        if op1[-1]["wd_at_grid_edge"]:
            note(f"warning: Operator-1's best weight decay is at the edge of the swept grid at d{d:g} (WD {w:g} of "
                 f"{wds.min():g}..{wds.max():g}): the tuned optimum may lie beyond the grid, and so the gains below")
    lines = [f"C={b['compute']:.3g}: K*={b['best_loops']:.2f} loss*={b['best_loss']:.4f}"
             + (f" gap to K=1 {b['gap_to_k1']:.4f}" if "gap_to_k1" in b else "") for b in out["budgets"]]
    if op1:
        last = max(op1, key=lambda o: o["compute"])

        def matched(env):  # compute where the (decreasing) frontier reaches Operator-1's last loss, linear in compute
            inside = len(env) and env[-1, 1] <= last["loss"] <= env[0, 1]
            return last["compute"] / np.interp(last["loss"], env[::-1, 1], env[::-1, 0]) if inside else np.nan
        env_wd = lower_envelope(c["compute"][at_wd], c["loss"][at_wd])
        out.update(operator_1_tuned=op1, gain_fixed_wd=matched(env_wd),
                   gain_all_wd=matched(lower_envelope(c["compute"], c["loss"])),
                   frontier_fixed_wd=[dict(compute=x, loss=y) for x, y in env_wd if x <= last["compute"]])
        lines.append(f"Operator-1 (best WD per depth) last point {last['compute']:.3g} FLOPs, loss {last['loss']:.4f}: "
                     f"loop scaling at WD {args.wd} needs {fnum(out['gain_fixed_wd'], '.2f')}x less compute (all-WD "
                     f"frontier {fnum(out['gain_all_wd'], '.2f')}x)")
    if args.out:
        fig2, fig5, _, _ = paper.loop_grid_figures(pyplot(), c)
        lines += [f"wrote {p}" for p in save_figures(args.out, {f"{n}.{e}": f for n, f in (("fig02", fig2), ("fig05", fig5))
                                                                for e in ("png", "pdf")}, dpi=300)]
    emit(args, out, lines)


# ---------------------------------------------------------------------------------------------------- CLI
def build_parser():
    p = Parser(prog="fit.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    positive, resamples, seed, depth = number("(0, inf)"), integer(0, 100_000), integer(0, 2 ** 32 - 1), integer(1, 999)
    noise = number("(0, 1)")  # relative noise: sd of ln(val_loss) of one run

    def add(func, helptext, *common):
        s = sub.add_parser(func.__name__[4:], help=helptext, description=func.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        s.set_defaults(func=func)
        if func not in (cmd_curves, cmd_report, paper.cmd_paper):  # those write files
            s.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        if "runs" in common:
            s.add_argument("--runs-dir", nargs="+", metavar="DIR", default=[], required="required" in common,
                           help="train.py run folders or folders of them (ladder.sh's RUNS_DIR)")
        if "reference" in common:
            s.add_argument("--reference-arm", help="the arm the others are compared with (default: vanilla, or the "
                           "only arm)")
        return s.add_argument

    arg = add(cmd_ladders, "per-arm power laws, multipliers, forecasts, figures", "runs", "reference")
    arg("inputs", nargs="*", metavar="CSV|JSON", help="ladder tables (see above)")
    arg("--anchor-depth", type=depth, help="multipliers from this depth on (default 8, or a shorter "
        "ladder's second depth)")
    arg("--out", help="write Figure 3 and Figure 2 (left) into this folder (default: none)")
    arg("--bootstrap", type=resamples, help=f"resamples for CIs (default 0, {FIT['default_extrapolate_boot']} with "
        "--extrapolate)")
    arg("--seed", type=seed, default=0, help="bootstrap seed")
    arg("--time", action="store_true", help="training time (s) instead of FLOPs on the x axis")
    arg("--floor-from", nargs="+", metavar="CSV|JSON", help="FLOP ladders to fit the shared floor on (vanilla's)")
    arg("--refit-floor", action="store_true", help="fit the floor on the reference arm on the axis in use")
    arg("--shared-anchor", type=depth, metavar="DEPTH", help="one anchor depth for every arm (Fig. 16a: 8)")
    arg("--extrapolate", type=positive, metavar="C", help="forecast loss, gain (Figure 4) and pi at compute C")
    arg("--holdout", nargs="+", metavar="ARM:DEPTH", help="leave points out of the fit, print their forecast")
    arg("--noise", type=noise, metavar="SIGMA", help="relative run-to-run noise (sd of ln val_loss of one run)")
    add(cmd_runs, "a table of train.py runs and where each stands", "runs", "required")
    arg = add(cmd_curves, "training and validation curves of train.py runs", "runs", "required")
    arg("--out", help="folder for curves_PRESET_X.{png,pdf} (default: the first --runs-dir's curves/)")
    arg("--x", choices=sorted(X_AXES), default="steps", help="the x axis (default: steps)")
    arg = add(cmd_report, "report.md of a run or of a ladder (its runs, fit and figures)", "reference")
    arg("--runs-dir", nargs=1, required=True, metavar="DIR", help="a run folder or a folder of runs")
    arg("--bootstrap", type=resamples, default=200, help="resamples for the fit's CIs (default 200)")
    arg = add(cmd_downstream, "CORE forecast (App. C.4)", "runs", "reference")
    arg("data", nargs="?", metavar="DATA", help="CSV or the release's FineWeb-Edu ladders JSON")
    arg("--targets", type=noise, nargs="+", default=list(FIT["gpt3_targets"]), help="CORE scores to find the compute "
        "for (default: GPT-3's four)")
    arg("--at", type=positive, nargs="*", default=[], help="compute budgets to forecast CORE at")
    arg = add(cmd_design, "simulate planned ladders: CI widths, detection power, GPU-hours", "reference")
    arg("plan", nargs="+", help="train.py --dry-run JSON lines ('-' = stdin) or CSV of planned computes")
    arg("--noise", type=noise, metavar="SIGMA", required=True, help="relative run-to-run noise (sd of ln val_loss)")
    arg("--truth", metavar="PILOT.json", required=True, help="true curves: a `fit.py ladders --json` output")
    arg("--delta-gamma", type=arm_delta_gamma, action="append", metavar="[ARM=]DG", help="ARM's true gamma = the "
        "reference's + DG; a bare DG: every arm the truth has no law for")
    arg("--design", action="append", metavar="SPEC", help=f"repeatable: {DESIGN_FORMS}")
    arg("--sims", type=integer(20, 100_000), default=400, help="simulated ladders per design")
    arg("--seed", type=seed, default=0)
    arg("--fixed-E", action="store_true", help="fit gamma with the true E known")
    arg("--mfu", type=number("(0, 1]"), default=0.4, help="H100 model FLOPs utilisation (0.4)")
    arg = add(cmd_surface, "Chinchilla / Skaling L(N, D) fits")
    arg("data")
    arg("--form", choices=["chinchilla", "skaling", "both"], default="both")
    arg("--delta", type=positive, help="Huber delta on ln L (default per form: 1e-3 Chinchilla, 0.05 Skaling)")
    arg("--hops", type=resamples, default=100, help="basin-hopping iterations")
    arg("--sparse-l", action="store_true", help="also fit on the L-shaped subset (min N or min D)")
    arg("--budgets", type=positive, nargs="+", help="compute budgets for N*(C), D*(C)")
    arg("--seed", type=seed, default=0)
    add(cmd_tpp, "optimal tokens per parameter")("data")
    add(cmd_growth, "optimal growth fraction")("data")
    add(cmd_lr, "hyperparameter drift exponent")("data")
    arg = add(cmd_loops, "optimal loop count and frontiers", "runs")
    arg("data", nargs="?", help="GRID.csv [depth, loops, weight_decay, compute_flops, val_loss] (compute without "
        "attention), or the release's weight_decay, regimes, architectures or hyperparameters CSV")
    arg("--wd", type=number("[0, inf)"), default=0.8, help="the weight decay of the loop curves (default 0.8)")
    arg("--budgets", type=positive, nargs="+", help="compute budgets (FLOPs; default the release's five)")
    arg("--out", help="draw Figures 2 (right) and 5 of the loop grid into this folder (default: none)")
    arg = add(paper.cmd_paper, "every paper figure from the authors' released measurements, with a manifest")
    arg("release", help="the release folder as reference/ holds it")
    arg("--out", default="figures/paper", help="figures, manifest and gallery (default: figures/paper)")
    return p


def run(argv):
    args = build_parser().parse_args(argv)
    args.func(args)


def main(argv=None):
    return cli_main(run, "fit.py", argv)


if __name__ == "__main__":
    exit_process(main())
