"""fit.py — the paper's scaling-law fits, compute multipliers and figures, plus the Skaling L(N, D) law.

Subcommands (column contracts in brackets, in full under `python fit.py SUBCOMMAND -h`; extra columns are ignored):
  ladders INPUT...   L(C) = E + A (C/1e18)^-gamma per arm, E fitted on the reference arm and shared (arXiv 2609.19107
                     Sec. 4.2), compute multipliers, bootstrap CIs, per-arm free-E check, forecasts and gains at
                     --extrapolate C (Figure 4), Figure 3 + Figure 2 (left). Seed replicates are pooled: their spread is
                     the run-to-run noise that weights the fits and feeds a parametric bootstrap.
                     INPUT = CSV [arm, depth, compute_flops, val_loss (+ seed, training_seconds)] or train.py runs.
  design PLAN        simulate planned ladders under assumed laws and noise: CI half-widths of gamma and delta-gamma,
                     coverage and power of the intervals ladders prints, GPU-hours; compares designs.
  surface DATA.csv   Chinchilla L = E + A/N^a + B/D^b and Skaling L = (A/N^a + B/D^b)^k + E  [N, D or compute, loss].
  downstream DATA      CORE forecast (App. C.4)  [arm, compute_flops, core, nll:<task>..., acc:<task>... (centered)],
                     or the release's FineWeb-Edu ladders JSON.
  tpp DATA.csv       quadratic vertex of log loss vs log TPP per budget (App. A.4.2)  [compute_flops, tpp, val_loss].
  growth DATA.csv    quadratic in the post-growth fraction rho per (depth, budget) (A.2.3, A.4.3)  [depth, compute_flops,
                     rho, val_loss].
  lr DATA.csv        quadratic of log loss vs log value per size, then log optimum vs log N (A.4.4)  [params, value,
                     val_loss (+ hparam: several hyperparameters at once)].
  loops GRID.csv|RUNS  optimal loop count per budget and loop-vs-size frontiers (Fig 2 right, Fig 5)  [depth, loops,
                     weight_decay, compute_flops, val_loss].
  runs RUNS...       one row per train.py run: state (complete / running / stopped / failed, with the reason), step,
                     last train and val loss, FLOPs done / planned, wall time, ETA.
  curves RUNS...     training and validation loss against steps, tokens or FLOPs, one figure per ladder (preset),
                     growth and warmdown marked; with --x flops --frontier FIT.json the fitted L(C) overlaid.

  python fit.py ladders reference/fineweb_ladders.csv --out figures --bootstrap 1000
  python fit.py surface grid.csv --form both --sparse-l
Bad input: one line on stderr, exit 2. An arm/group that cannot be fitted is reported on one line and skipped.
--out never overwrites a file fit.py did not write: it records its outputs in OUT/fit_manifest.json.
"""
import argparse, contextlib, io, json, math, os, time

# The fits use tiny matrices: a threaded BLAS only adds contention (L-BFGS-B runs ~100x slower on a busy 2-core box).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
from scipy import optimize

import paper
import studies
import watch
from common import Parser, UsageError, cli_main, exit_process, write_text
from arms import FIGURE2_ARMS
from laws import (DEPTH_DERIVED, FIT, FitError, arm_order, bootstrap_ladders, check_one_recipe, check_outputs,
                  fit_ladders, fitted_multiplier, fnum, footing, forecast, jsonable, note, number, positive_float, pyplot,
                  read_csv, read_result_json, robust_lsq, run_paths, save_figures, style, SEED_MAX)



def ladder_rows_from_runs(paths, use_time):
    """(arm, depth, x, loss, seed, origin, flags) of every complete train.py result.json, flags its plan's
    schedule_notes (a warmup the run never finishes, ...); incomplete runs are skipped. The runs of one arm must share
    their recipe and data pool (laws.check_one_recipe)."""
    rows, runs = [], {}
    key = "total_training_time_seconds" if use_time else "estimated_training_flops"
    for path in paths:
        r = read_result_json(path, "arm, depth, compute_flops, val_loss")
        if r["status"] != "complete":
            note(f"skipping {path}: status {r['status']!r}, not complete")
            continue
        try:
            arm, depth, x, loss = r["arch"], r["depth"], float(r[key]), float(r["final_val_loss"])
            assert isinstance(arm, str) and isinstance(depth, int) and depth > 0
            assert math.isfinite(x) and x > 0 and math.isfinite(loss) and loss > 0
        except (KeyError, TypeError, ValueError, AssertionError):
            raise UsageError(f"{path}: a complete run needs arch, a whole depth, and finite {key} and "
                             "final_val_loss > 0")
        rows.append((arm, depth, x, loss, (r.get("plan") or {}).get("seed"), path, tuple(r.get("schedule_notes") or ())))
        runs.setdefault(arm, []).append((path, r))
    for arm, group in runs.items():
        check_one_recipe(group, DEPTH_DERIVED, f"{arm} runs")
    return rows


def ladder_rows_from_csv(path, use_time):
    xcol = "training_seconds" if use_time else "compute_flops"
    positive = ["depth", xcol, "val_loss"]
    c = read_csv(path, ["arm", "depth", xcol, "val_loss"], numeric=positive + ["seed"], positive=positive)
    rows = []
    for i, (arm, d, x, loss, line) in enumerate(zip(c["arm"], c["depth"], c[xcol], c["val_loss"], c["_line"])):
        seed = c["seed"][i] if "seed" in c else None
        if d != int(d) or (seed is not None and seed != int(seed)):
            raise UsageError(f"{path}:{line}: {'depth' if d != int(d) else 'seed'} must be a whole number")
        rows.append((arm, int(d), x, loss, None if seed is None else int(seed), f"{path}:{line}"))
    return rows


def pool_replicates(rows, replicates, use_time):
    """Group rows by (arm, depth). Rows with distinct seeds (seed column, or the plan's seed in result.json) are seed
    replicates; rows with one seed (or none) are duplicates: dropped with a warning when they agree exactly, seed
    replicates with --replicates, an error otherwise. -> {(arm, depth): (x, [losses], flags)}."""
    groups = {}
    for row in rows:
        groups.setdefault(row[:2], []).append(row)
    points = {}
    for (arm, depth), g in groups.items():
        kept = []
        for row in g:
            same = [k for k in kept if k[4] == row[4]]
            if same and all((k[2], k[3]) == (row[2], row[3]) for k in same):
                note(f"warning: {row[5]} repeats {same[0][5]} ({arm} d{depth}) exactly; kept one")
                continue
            if same and not replicates:
                raise UsageError(f"{row[5]} and {same[0][5]}: two different results for {arm} d{depth}; if they are "
                                 f"seed replicates pass --replicates (or a seed column), else remove one")
            kept.append(row)
        x = np.array([k[2] for k in kept])
        if not use_time and np.ptp(x) > FIT["replicate_compute_rtol"] * x.max():
            raise UsageError(f"{kept[0][5]} and {kept[int(np.argmax(x))][5]}: replicates of {arm} d{depth} have "
                             f"different compute ({x.min():.6g} vs {x.max():.6g}); they are not runs of one plan")
        flags = tuple(dict.fromkeys(f for k in kept for f in (k[6] if len(k) > 6 else ())))
        points[(arm, depth)] = (float(x.mean()), [k[3] for k in kept], flags)
    return points


def ladder_rows_from_json(path, use_time, held):
    """A JSON file read by its content: a train.py result.json (-> None: read with the runs), the release's ladder
    series or downstream.json (paper.release_ladder_rows), or its FineWeb-Edu ladders, whose held-out records (d26)
    are added to `held` as ARM:DEPTH; anything else is refused naming the layouts read."""
    obj = paper.read_json(path)
    layout = paper.json_layout(obj)
    if layout in ("ladders", "downstream"):
        return paper.release_ladder_rows(path, obj, use_time)
    if layout == "fineweb_edu":
        if use_time:
            raise UsageError(f"{path}: the FineWeb-Edu ladders hold no training time; drop --time")
        rows = []
        for arm, r, origin, held_out in paper.edu_records(path, obj)[1]:
            rows.append((arm, r["depth"], float(r["compute_flops"]), float(r["val_loss"]), None, origin))
            if held_out:
                held.append(f"{arm}:{r['depth']}")
                note(f"{origin}: {arm} d{r['depth']} is the release's held-out run: not fitted, its forecast printed")
        return rows
    if isinstance(obj, dict) and "status" in obj:
        return None
    raise paper.layout_error(path, ("ladders", "downstream", "fineweb_edu"), "a train.py result.json [status, arch, "
                             "depth, estimated_training_flops, final_val_loss]; ")


def load_ladders(inputs, use_time, replicates=False, held=None, exclude_flagged=False):
    """-> {arm: dict(depth, x, loss, n, reps, flags)} sorted by x (compute FLOPs, or training seconds with --time); loss
    is the mean over a point's n seed replicates, reps their losses, flags the notes of its runs' plans (left out with
    exclude_flagged). `held` (a list) receives the ARM:DEPTH of records the inputs mark as held out of every fit."""
    rows, paths = [], []
    for item in inputs:
        if item.endswith(".csv"):
            rows += ladder_rows_from_csv(item, use_time)
            continue
        if item.endswith(".json") and os.path.isfile(item):
            json_rows = ladder_rows_from_json(item, use_time, [] if held is None else held)
            if json_rows is not None:
                rows += json_rows
                continue
        found = run_paths(item)
        if not found:
            raise UsageError(f"{item}: no CSV, result.json or run directory found")
        paths += found
    rows += ladder_rows_from_runs(paths, use_time)  # all together: runs of one arm from two folders are compared
    if not rows:
        raise UsageError("no usable ladder points in the inputs")
    points = pool_replicates(rows, replicates, use_time)
    if exclude_flagged:
        for (arm, depth), (_, _, flags) in sorted(points.items()):
            if flags:
                note(f"--exclude-flagged: leaving out {arm} d{depth} ({'; '.join(flags)})")
        points = {k: p for k, p in points.items() if not p[2]}
    data = {}
    for arm in sorted({a for a, _ in points}, key=arm_order):
        pts = sorted((x, d, reps, flags) for (a, d), (x, reps, flags) in points.items() if a == arm)
        data[arm] = dict(x=np.array([p[0] for p in pts]), depth=np.array([p[1] for p in pts]),
                         loss=np.array([np.mean(p[2]) for p in pts]), n=np.array([len(p[2]) for p in pts]),
                         reps=[np.array(p[2]) for p in pts], flags=[p[3] for p in pts])
    return data


def pooled_noise(data):
    """Relative run-to-run noise from seed replicates: sigma^2 = sum_i (n_i - 1) s_i^2 / sum_i (n_i - 1), s_i^2 the
    sample variance of ln L over point i's replicates -> (sigma, dof); (None, 0) without replicates."""
    ss = dof = 0.0
    for d in data.values():
        for reps in d["reps"]:
            if len(reps) > 1:
                lr = np.log(reps)
                ss += ((lr - lr.mean()) ** 2).sum()
                dof += len(reps) - 1
    return (math.sqrt(ss / dof), int(dof)) if dof else (None, 0)


def hold_out(data, specs):
    """Remove ARM:DEPTH points from the fit -> their (arm, depth, x, loss, n)."""
    held = []
    for i, spec in enumerate(specs):
        arm, _, depth = spec.rpartition(":")
        if not arm or not depth.isdigit():
            raise UsageError(f"--holdout {spec!r}: use ARM:DEPTH, e.g. untied_grow:18")
        if spec in specs[:i]:
            raise UsageError(f"--holdout names {spec} twice; name each point once")
        d = data.get(arm)
        i = np.flatnonzero(d["depth"] == int(depth)) if d else []
        if not len(i):
            raise UsageError(f"--holdout {spec}: no {arm} d{depth} point in the inputs")
        i = int(i[0])
        held.append(dict(arm=arm, depth=int(depth), compute=d["x"][i], loss=d["loss"][i], n=int(d["n"][i])))
        keep = np.arange(len(d["x"])) != i
        data[arm] = dict(x=d["x"][keep], depth=d["depth"][keep], loss=d["loss"][keep], n=d["n"][keep],
                         reps=[r for j, r in enumerate(d["reps"]) if j != i],
                         flags=[f for j, f in enumerate(d.get("flags") or [()] * len(keep)) if j != i])
    return held


def ladder_table(fit, xname):
    """The two ladder tables: per arm its points (* flagged), residual degrees of freedom, gamma ± se [CI], ...; a ±
    or CI that laws.footing withheld reads "unknown"."""
    def ci(r, key, fmt):  # " [lo, hi]" when a bootstrap CI exists
        c = r.get(f"{key}_ci")
        return f" [{fnum(c[0], fmt)}, {fnum(c[1], fmt)}]" if c else ""
    pm = lambda r, key, fmt=".4f": fnum(r[key], fmt) if r.get("intervals_known", True) else "unknown"
    val = lambda r, key, fmt: fnum(r.get(key), fmt) + ci(r, key, fmt)
    E_ci = f"  {FIT['ci']:.0f}% CI [{fit['E_ci'][0]:.4f}, {fit['E_ci'][1]:.4f}]" if fit.get("E_ci") else ""
    E_se = "" if "E_dof" not in fit else f" ± {'unknown' if fit['E_se'] is None else fnum(fit['E_se'])}" + (
        f" (free-E fit of {fit['reference_arm']}: {fit['E_dof'] + 3} points, {fit['E_dof']} dof"
        + (f"; on its bound {fit['E_bound']}" if fit["E_bound"] else "") + ")")
    lines = [f"E = {fit['E']:.6f}{E_se}{E_ci} (reference arm {fit['reference_arm']}, C0 = {fit['C0']:.6g} {xname})",
             f"{'arm':<18} {'points':>6} {'dof':>3}  {'gamma ± se [CI]':<33} {'log A@C0':>8} {'mult first':>10}  "
             "mult last [CI]"]
    flagged = []
    for arm, r in fit["arms"].items():
        m, pts = r["multipliers"], r["points"]
        flagged += [f"{arm} d{p['depth']}: {'; '.join(p['flags'])}" for p in pts if p["flags"]]
        n_flag = sum(bool(p["flags"]) for p in pts)
        lines.append(f"{arm:<18} {f'{len(pts)} ({n_flag}*)' if n_flag else len(pts):>6} {r['dof']:>3}  "
                     f"{r['gamma']:.4f} ± {pm(r, 'gamma_se')}{ci(r, 'gamma', '.4f'):<17} "
                     f"{r['logA_C0']:>8.4f} {fnum(m[0]['multiplier'] if m else None, '.3f'):>10}  "
                     f"{val(r, 'final_multiplier', '.3f')}")
    lines += ["", f"{'arm':<18} {'gamma - ref ± se [CI]':<37} {'fitted pi at last [CI]':<24} own free-E fit: gamma, E "
                  f"(flag: E > {FIT['disagree_se']:.0f} se from shared)"]
    for arm, r in fit["arms"].items():
        d = r.get("delta_gamma_ci")
        dg = f"{r['delta_gamma']:+.4f} ± {pm(r, 'delta_gamma_se')}" + (f" [{d[0]:+.4f}, {d[1]:+.4f}]" if d else "")
        free = (f"{r['free_gamma']:.4f} ± {pm(r, 'free_gamma_se')}, {r['free_E']:.3f} ± {pm(r, 'free_E_se', '.3f')}"
                + (f" (on its bound {r['free_E_bound']})" if r.get("free_E_bound") else "")
                + ("  DISAGREES" if r["free_disagrees"] and r.get("intervals_known", True) else "")) if "free_gamma" in r else "—"
        lines.append(f"{arm:<18} {dg:<37} {val(r, 'fitted_final_multiplier', '.3f'):<24} {free}")
    if flagged:
        lines += ["", "* flagged points (their plans' schedule_notes; --exclude-flagged leaves them out):"]
        lines += [f"  {f}" for f in flagged]
    return "\n".join(lines)


def noise_lines(fit):
    """What the standard errors and CIs include, in words."""
    nz, b = fit["noise"], fit.get("bootstrap")
    if nz["sigma"] is None:
        lines = ["noise: none given (no seed replicates, no --noise); fits unweighted, gamma ± se from the residuals"]
    else:
        src = f"pooled from seed replicates, {nz['dof']} dof" if nz["source"] == "replicates" else "given by --noise"
        lines = [f"noise: sigma = {nz['sigma']:.3g} relative (sd of ln L of one run; {src}); fits weighted by it, "
                 f"gamma ± se from it" + (f"; {nz['replicated_points']} points have replicates" if nz["replicated_points"] else "")]
    lines.append(f"se of gamma and of gamma - ref include the shared floor E's uncertainty (refitted on "
                 f"{fit['reference_arm']}; first order); with E held fixed, gamma's se is --json's gamma_se_given_E")
    if b:
        lines.append(f"CIs: {b['n']} " + ("parametric resamples re-drawing that noise (they include seed noise)"
                                         if b["includes_seed_noise"] else "resamples of points within each arm (they do "
                                         "not include run-to-run noise; seed replicates or --noise add it)"))
    return lines + contradiction_lines(fit)


def contradiction_lines(fit):
    """When the residuals contradict the given noise (laws.noise_check): the chi^2, and the intervals the residuals
    support (every ± times the Birge ratio) with the free-E flags at those intervals."""
    c = fit.get("noise_check")
    if not c or not c["contradicted"]:
        return []
    S, sigma = c["birge_ratio"], fit["noise"]["sigma"]
    worst = ", ".join(f"{a} {v:.3g}" for a, v in sorted(c["per_arm_reduced_chi2"].items(), key=lambda t: -t[1])[:3])
    lines = ["", f"WARNING: the residuals contradict the noise sigma = {sigma:.3g}: reduced chi^2 = {c['reduced_chi2']:.4g} "
                 f"over {c['dof']} dof (p = {c['p']:.2g}; contradicted when p < {c['p_threshold']:g}, here reduced "
                 f"chi^2 > {c['chi2_red_threshold']:.3g}); largest per arm: {worst}",
             f"  the ± above and the DISAGREES flags rest on that sigma. From the residuals (Birge ratio: every ± times "
             f"sqrt(reduced chi^2) = {S:.4g}, i.e. sigma ~ {sigma * S:.3g}; --noise {sigma * S:.3g} refits at it"
             + (", and its bootstrap re-draws that noise" if fit.get("bootstrap") else "") + "):",
             f"  {'arm':<18} {'gamma ± se':<18} {'gamma - ref ± se':<20} free-E flag"]
    for arm, r in fit["arms"].items():
        q = c["rescaled"][arm]
        flag = "—" if q["free_disagrees"] is None else "DISAGREES" if q["free_disagrees"] else "agrees"
        lines.append(f"  {arm:<18} {r['gamma']:.4f} ± {fnum(q['gamma_se'])}{'':<3} "
                     f"{r['delta_gamma']:+.4f} ± {fnum(q['delta_gamma_se']):<8} {flag}")
    return lines


LADDER_FIGURES = ("fig3_ladders.png", "fig3_ladders.pdf", "fig2_left.png", "fig2_left.pdf")


def ladder_figures(data, fit, out_dir, xname, figure2_arms=None):
    """Figure 3 (loss vs compute with an inset of the top budgets, multipliers, gamma vs log A) and Figure 2 (left) of
    figure2_arms (default: the arms table's FIGURE2_ARMS that were fitted, else every arm)."""
    plt = pyplot()
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10, "legend.fontsize": 7.5})
    E, c_ref = fit["E"], fit["c_ref"]
    xlabel = "training compute (FLOPs)" if xname == "FLOPs" else "training time (s)"

    def loss_panel(ax, arms):
        xmax = max(data[a]["x"].max() for a in arms)
        inset = ax.inset_axes([0.52, 0.5, 0.45, 0.45])
        for a in arms:
            label, color = style(a)
            r, d = fit["arms"][a], data[a]
            xs = np.geomspace(d["x"].min(), d["x"].max(), 100)
            flagged = np.array([bool(f) for f in d.get("flags") or [()] * len(d["x"])])
            for axis in (ax, inset):
                axis.plot(d["x"][~flagged], d["loss"][~flagged], "o", ms=3.5, color=color)
                axis.plot(d["x"][flagged], d["loss"][flagged], "o", ms=4.5, mfc="white", color=color)
                axis.plot(xs, E + r["A"] * (xs / c_ref) ** -r["gamma"], "-", lw=1.2, color=color,
                          label=f"{label} (γ={r['gamma']:.3f}, {r['dof']} dof)" if axis is ax else None)
        if any(f for a in arms for f in data[a].get("flags") or ()):
            ax.plot([], [], "o", ms=4.5, mfc="white", color="gray", label="flagged (schedule_notes)")
        E_se = "" if "E_dof" not in fit else " ± unknown" if fit["E_se"] is None else f" ± {fit['E_se']:.3f}"
        E_bound = f" (on its bound {fit['E_bound']})" if fit.get("E_bound") else ""
        ax.set(xscale="log", xlabel=xlabel, ylabel="validation loss", title=f"shared E = {E:.4f}{E_se}{E_bound}")
        paper.log_axis(ax.xaxis, plt)  # 1-2-4 ticks under a decade: minor labels collide
        ax.legend(loc="lower left", frameon=False)
        lo = xmax / FIT["inset_span"]
        sel = [l for a in arms for x, l in zip(data[a]["x"], data[a]["loss"]) if x >= lo]
        inset.set(xscale="log", xlim=(lo / 1.1, xmax * 1.1))
        if sel:
            inset.set_ylim(min(sel) - 0.01, max(sel) + 0.01)
        inset.tick_params(labelsize=7)
        inset.xaxis.set_minor_formatter(plt.NullFormatter())

    def mult_panel(ax, arms):
        best = None
        for a in arms:
            label, color = style(a)
            m = fit["arms"][a]["multipliers"]
            if m:
                ax.plot([p["compute"] for p in m], [p["multiplier"] for p in m], "o-", ms=3.5, color=color, label=label)
                if a != fit["reference_arm"] and (best is None or m[-1]["multiplier"] > best):
                    best = m[-1]["multiplier"]
        ax.set(xscale="log", xlabel=f"{fit['reference_arm']} {xlabel}", ylabel=f"multiplier over {fit['reference_arm']}")
        paper.log_axis(ax.xaxis, plt)
        if best is not None:
            twin = ax.twinx()
            twin.set_ylim(ax.get_ylim())
            twin.set_yticks([best], [f"{best:.2f}×"])
            twin.set_ylabel("best last multiplier", fontsize=8)
        ax.legend(loc="upper left", frameon=False)

    arms = list(fit["arms"])
    warning = footing_note(fit)
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
    fig.tight_layout(rect=(0, 0.06 if warning else 0, 1, 1))
    arms2 = [a for a in figure2_arms or FIGURE2_ARMS if a in fit["arms"]] or arms
    fig2, axes = plt.subplots(2, 1, figsize=(5.5, 7.5))
    loss_panel(axes[0], arms2)
    mult_panel(axes[1], arms2)
    fig2.tight_layout(rect=(0, 0.06 if warning else 0, 1, 1))
    for f in (fig, fig2) if warning else ():
        f.text(0.01, 0.01, warning, color="firebrick", fontsize=8, wrap=True)
    figures = {name: fig if name.startswith("fig3") else fig2 for name in LADDER_FIGURES}
    try:
        return save_figures(out_dir, figures, dpi=200)
    finally:
        plt.close(fig)
        plt.close(fig2)


def footing_note(fit):
    """One line for the figures when laws.footing withheld intervals: the residual degrees of freedom, or None."""
    short = {a: r["dof"] for a, r in fit["arms"].items() if not r.get("intervals_known", True)}
    if not short:
        return None
    floor = f"floor E {fit['E_dof']}, " if fit.get("E_dof") is not None else ""
    return ("WARNING: too few points to know the uncertainty (residual degrees of freedom: " + floor
            + ", ".join(f"{a} {k}" for a, k in short.items()) + "); no ± or CI is known for these fits")


def ladder_floor(args, data):
    """The release's conventions: the shared --shared-anchor point, and the floor E held at vanilla's FLOP-ladder fit
    for --time and any --reference-arm (None: fit_ladders fits it on the reference arm, as --refit-floor asks)."""
    if args.shared_anchor:
        note(f"shared d{args.shared_anchor} anchor: every arm's d{args.shared_anchor} loss set to "
             f"{paper.share_anchor(data, args.shared_anchor):.6f}, the mean of the equivalent runs")
    E_known = None
    if args.reference_arm not in data:
        raise UsageError(f"reference arm {args.reference_arm!r} not in the data (arms: {', '.join(data)})")
    if not args.refit_floor and (args.time or args.floor_from or args.reference_arm != paper.FLOOR_ARM):
        try:
            E_known = paper.floor_of(load_ladders(args.floor_from or args.inputs, False, args.replicates))
        except UsageError as e:
            if args.floor_from:
                raise
            raise UsageError(f"the floor is {paper.FLOOR_ARM}'s FLOP-ladder fit and the inputs give none ({e}); pass "
                             "--floor-from with FLOP ladders (the release's ladders.json for its timing.json) or "
                             "--refit-floor")
        axis = "time ladder" if args.time else "ladder"
        note(f"floor E = {E_known:.6f} from {paper.FLOOR_ARM}'s FLOP ladder, held fixed (--refit-floor fits it on "
             f"{args.reference_arm}'s {axis} instead)")
    return E_known


def check_figure2_arms(figure2_arms, out, data):
    if figure2_arms and not out:
        raise UsageError("--figure2-arms picks the arms of Figure 2, which only --out DIR draws; add --out")
    stray = [a for a in figure2_arms or () if a not in data]
    if stray:
        raise UsageError(f"--figure2-arms {stray[0]} is not an arm of the inputs (arms: {', '.join(data)})")


def forecast_at(c, data, fit, reference_arm, c_ref, xname):
    """Every arm's forecast loss, gain and pi at compute c (--extrapolate), into fit["arms"]; a warning when c
    lies far outside the measured points."""
    ref_law, ref_free = fit["arms"][reference_arm], fit["reference_free"]
    x_max = max(d["x"].max() for d in data.values())
    x_min = min(d["x"].min() for d in data.values())
    if c > FIT["extrapolate_warn"] * x_max:
        note(f"warning: extrapolating to {c:.3g} {xname}, {c / x_max:.0f}x beyond "
             f"the largest measured point ({x_max:.3g}); the CI assumes the power laws hold that far")
    elif c < x_min / FIT["extrapolate_warn"]:
        note(f"warning: extrapolating to {c:.3g} {xname}, {x_min / c:.0f}x below "
             f"the smallest measured point ({x_min:.3g}); the CI assumes the power laws hold that far")
    for a, r in fit["arms"].items():
        r["forecast_loss"], r["gain_at_extrapolate"] = forecast(
            ref_free, None if a == reference_arm else r, c / c_ref)
        r["pi_at_extrapolate"] = float(fitted_multiplier(ref_law, r, c / c_ref))


def cmd_ladders(args):
    if args.out:
        check_outputs(args.out, LADDER_FIGURES)
    marked = []
    data = load_ladders(args.inputs, args.time, args.replicates, marked, args.exclude_flagged)
    check_figure2_arms(args.figure2_arms, args.out, data)
    named = args.holdout or []
    held = hold_out(data, named + [spec for spec in dict.fromkeys(marked) if spec not in named])
    xname, c_ref = ("s", FIT["time_ref"]) if args.time else ("FLOPs", FIT["c_ref"])
    sigma, dof = pooled_noise(data)
    source = "replicates" if sigma is not None else None
    if args.noise is not None:
        if sigma is not None:
            note(f"--noise {args.noise} replaces the replicates' pooled sigma {sigma:.5f} ({dof} dof)")
        sigma, dof, source = args.noise, 0, "--noise"
    E_known = ladder_floor(args, data)
    t0 = time.perf_counter()
    fit = fit_ladders(data, args.reference_arm, c_ref, args.anchor_depth, sigma, E_known)
    t_fit = time.perf_counter() - t0
    for warning in fit["warnings"]:
        note(warning)
    fit["noise"] = dict(sigma=sigma, dof=dof, source=source, scale="relative: sd of ln(val_loss) of one run",
                        replicated_points=int(sum((d["n"] > 1).sum() for d in data.values())))
    n_boot = args.bootstrap if args.bootstrap is not None else (FIT["default_extrapolate_boot"] if args.extrapolate else 0)
    t_boot = None
    if n_boot > 0:
        t0 = time.perf_counter()
        bootstrap_ladders(data, fit, n_boot, args.seed, args.extrapolate, (sigma, dof) if sigma is not None else None)
        t_boot = time.perf_counter() - t0
    fit["footing"] = footing(fit, sigma)
    ref_free = fit["reference_free"]
    if args.extrapolate:
        forecast_at(args.extrapolate, data, fit, args.reference_arm, c_ref, xname)
    for h in held:
        law = fit["arms"].get(h["arm"])
        h["forecast_loss"] = forecast(ref_free, None if h["arm"] == args.reference_arm else law, h["compute"] / c_ref)[0] \
            if law else np.nan
        h["residual"] = h["loss"] - h["forecast_loss"]
    paths = ladder_figures(data, fit, args.out, xname, args.figure2_arms) if args.out else []
    if args.json:
        keep = ("dof", "intervals_known", "gamma", "gamma_se", "gamma_se_given_E", "delta_gamma", "delta_gamma_se", "A", "logA_C0", "r2", "reduced_chi2", "multipliers", "final_multiplier",
                "fitted_final_multiplier", "gamma_boot_se", "gamma_ci", "delta_gamma_ci", "final_multiplier_ci",
                "fitted_final_multiplier_ci", "bootstrap_valid", "free_E", "free_gamma", "free_A", "free_gamma_se",
                "free_E_se", "free_E_bound", "free_disagrees", "forecast_loss", "forecast_loss_ci", "gain_at_extrapolate",
                "gain_at_extrapolate_ci", "pi_at_extrapolate", "pi_at_extrapolate_ci", "points")
        obj = dict(E=fit["E"], reference_arm=fit["reference_arm"], C0=fit["C0"], x_unit=xname, c_ref=c_ref,
                   reference_free=ref_free, noise=fit["noise"], noise_check=fit.get("noise_check"),
                   arms={a: {k: r[k] for k in keep if k in r} for a, r in fit["arms"].items()}, errors=fit["errors"])
        obj.update({k: fit[k] for k in ("E_ci", "E_se", "E_dof", "E_bound", "bootstrap", "footing") if k in fit})
        if args.extrapolate:
            obj["extrapolate"] = args.extrapolate
        if held:
            obj["held_out"] = held
        print(json.dumps(jsonable(obj), allow_nan=False))
        return
    print(ladder_table(fit, xname))
    print("\n" + "\n".join(fit["footing"] + noise_lines(fit)))
    if args.extrapolate:
        c = lambda r, k: (lambda v: f" [{fnum(v[0], '.4f')}, {fnum(v[1], '.4f')}]" if v else "")(r.get(f"{k}_ci"))
        print(f"\nat C = {args.extrapolate:.6g} {xname}: forecast loss L_arm(C); gain C_{args.reference_arm}(L_arm(C)) / C "
              f"(Figure 4's definition); pi(C) = C / C_arm(L_{args.reference_arm}(C)) (shared-E laws)")
        for a, r in fit["arms"].items():
            print(f"  {a:<18} loss {r['forecast_loss']:.4f}{c(r, 'forecast_loss')}  gain {r['gain_at_extrapolate']:.4f}"
                  f"{c(r, 'gain_at_extrapolate')}  pi {r['pi_at_extrapolate']:.4f}{c(r, 'pi_at_extrapolate')}")
    for h in held:
        print(f"held out {h['arm']} d{h['depth']} ({h['compute']:.4g} {xname}): loss {h['loss']:.4f}, forecast "
              f"{fnum(h['forecast_loss'])}, residual {fnum(h['residual'], '+.4f')}")
    print(f"\nfit: {t_fit:.2f} s" + (f"; bootstrap {n_boot} resamples: {t_boot:.1f} s" if t_boot else ""))
    for p in paths:
        print(f"wrote {p}")


# ---------------------------------------------------------------------------------------------------- report.md
def cmd_report(args):
    """report.md of a run (DIR holds result.json: its own, with its curves) or of a ladder (DIR holds runs: every
    run's, then DIR/report.md with the runs table, the ladder fit with bootstrap CIs and its figures in DIR/fit, the
    curves in DIR/curves). The fit takes the arms with >= 3 complete depths."""
    dirs, plt, written, table = watch.run_dirs([args.dir]), pyplot(), [], None
    runs = []  # (row, records, result) of every run, as watch.curves_figure takes them
    for d in dirs:
        runs.append((watch.run_row(d), watch.read_trajectory(d), watch.read_result(d) or {}))
        if runs[-1][1]:
            fig = watch.curves_figure(plt, runs[-1:], "steps", None)
            save_figures(d, {"curves.png": fig}, dpi=80)
            plt.close(fig)
        written.append(watch.write_run_report(d, "curves.png" if runs[-1][1] else None))
    if dirs == [args.dir]:
        return report_done(args, written, table)
    runs.sort(key=lambda run: watch.run_order(run[0]))
    rows = [row for row, _, _ in runs]
    lines = [f"# Ladder report: {args.dir}", "", "## Runs", ""] + watch.markdown_table(
        ["run", "state", "step", "val loss", "FLOPs", "wall time", "report"],
        [(r["run"], r["state"], f"{r['step'] or 0}/{r['steps'] or '?'}", fnum(r["val_loss"]), fnum(r["flops"], ".3e"),
          watch.hms(r["wall_seconds"]), f"[report.md]({r['run']}/report.md)") for r in rows])
    complete = {}
    for r in rows:
        if r["state"] == "complete":
            complete.setdefault(r["arch"], set()).add(r["depth"])
    fitted = {a: sorted(d) for a, d in complete.items() if len(d) >= 3}
    lines += ["", "## Fit", ""]
    if fitted:
        ref = "vanilla" if "vanilla" in fitted else min(fitted, key=arm_order)
        depths = fitted[ref]
        anchor = FIT["anchor_depth"] if FIT["anchor_depth"] in depths else depths[1]  # d1 of a cpu ladder: truncated
        argv = ["ladders", *[r["path"] for r in rows if r["arch"] in fitted], "--reference-arm", ref,
                "--anchor-depth", str(anchor), "--bootstrap", str(args.bootstrap), "--out", os.path.join(args.dir, "fit")]
        text = io.StringIO()
        try:  # the table as `fit.py ladders` prints it, beside the command that prints it
            with contextlib.redirect_stdout(text):
                cmd_ladders(build_parser().parse_args(argv))
            table = "\n".join(l for l in text.getvalue().splitlines() if not l.startswith("wrote "))
            lines += [f"`python fit.py {' '.join(argv)}`", "", "```", table, "```", "",
                      "![ladders](fit/fig3_ladders.png)"]
        except UsageError as e:  # the runs are what they are: the report says why they do not fit
            note(f"no fit: {e}")
            lines.append(f"No fit: {e}")
    else:
        lines.append("No fit: no arm has 3 complete depths yet.")
    drawn = [run for run in runs if run[1]]
    curves = watch.draw_curves(drawn, os.path.join(args.dir, "curves"), "steps") if drawn else []
    lines += ["", "## Curves", ""] + [f"![curves](curves/{os.path.basename(p)})" for p in curves if p.endswith(".png")]
    path = os.path.join(args.dir, "report.md")
    write_text(path, "\n".join(lines) + "\n")
    report_done(args, written + [path], table)


def report_done(args, written, table):
    if args.json:
        print(json.dumps(dict(written=written, fit_table=table)))
        return
    print("\n".join(([table] if table else []) + [f"wrote {p}" for p in written]))


# ---------------------------------------------------------------------------------------------------- downstream (B.6)
def fit_task_nll(x, nll):
    """B.6.1: NLL = E + A x^-alpha, five starts, plain LSQ then Huber; -> (E, A, alpha)."""
    if len(x) < 3:
        raise FitError(f"fewer than 3 points ({len(x)})")
    resid = lambda p: p[0] + p[1] * x ** -p[2] - nll
    bounds = ([0, 0, 0.005], [nll.min() - 1e-8, 50, 2])
    best, E0 = None, 0.5 * nll.min()
    for a0 in (0.05, 0.1, 0.2, 0.4, 0.8):
        res = optimize.least_squares(resid, [E0, max(0.01, (nll.max() - E0) * x.min() ** a0), a0], bounds=bounds,
                                     max_nfev=30000)
        best = res if best is None or res.cost < best.cost else best
    return robust_lsq(resid, best.x, bounds, FIT["nll_min_scale"], max_nfev=30000)


def sigmoid(nll, a, b):
    return 1 / (1 + np.exp(np.clip(a * nll - b, -700, 700)))


def fit_sigmoid(nll, acc):
    m = np.clip(acc.mean(), 0.001, 0.999)
    x0 = [1.0, math.log(m / (1 - m)) + np.median(nll)]
    return robust_lsq(lambda p: sigmoid(nll, *p) - acc, x0, ([0, -20], [20, 20]), FIT["sigmoid_min_scale"])


def downstream_columns_from_json(path):
    """The release's FineWeb-Edu ladders as downstream's CSV columns: one row per ladder record (the held-out d26
    run left out), core = core_accuracy, nll:<task> / acc:<task> from task_nll / task_accuracy over `tasks`."""
    obj = paper.read_json(path)
    if paper.json_layout(obj) != "fineweb_edu":
        raise paper.layout_error(path, ("fineweb_edu",), "a CSV [arm, compute_flops, core, nll:<task>..., "
                                 "acc:<task>...] or ")
    tasks, records = paper.edu_records(path, obj)
    c = {"arm": [], "compute_flops": [], "core": [], "_line": []}
    for arm, r, origin, held_out in records:
        if held_out:
            continue
        try:
            row = {"core": float(r["core_accuracy"]), **{f"nll:{t}": float(r["task_nll"][t]) for t in tasks},
                   **{f"acc:{t}": float(r["task_accuracy"][t]) for t in tasks}}
            assert all(map(math.isfinite, row.values())) and all(row[f"nll:{t}"] > 0 for t in tasks)
        except (KeyError, TypeError, ValueError, AssertionError):
            raise UsageError(f"{origin}: needs a finite core_accuracy, and task_nll (> 0) and task_accuracy (centered) "
                             f"for every task in 'tasks'")
        c["arm"].append(arm)
        c["compute_flops"].append(float(r["compute_flops"]))
        c["_line"].append(origin)
        for k, v in row.items():
            c.setdefault(k, []).append(v)
    return {k: v if k in ("arm", "_line") else np.array(v) for k, v in c.items()}


def cmd_downstream(args):
    from_json = args.data.endswith(".json")
    c = downstream_columns_from_json(args.data) if from_json else \
        read_csv(args.data, ["arm", "compute_flops", "core"], numeric=["compute_flops", "core"], positive=["compute_flops"])
    tasks = [k[4:] for k in c if k.startswith("nll:") and f"acc:{k[4:]}" in c]
    if lone := next((k for k in c if k[:4] in ("nll:", "acc:") and k[4:] not in tasks), None):
        other = ("acc:" if lone.startswith("nll:") else "nll:") + lone[4:]
        raise UsageError(f"{args.data}: column {lone} has no {other}; a task is an nll:<task>, acc:<task> pair: add "
                         "the other column or drop this one")
    if not tasks:
        raise UsageError(f"{args.data}: no task columns (need nll:<task> and acc:<task> pairs)")
    if args.reference_arm not in c["arm"]:
        raise UsageError(f"reference arm {args.reference_arm!r} not in {args.data} (arms: "
                         f"{', '.join(dict.fromkeys(c['arm']))}); pass --reference-arm")
    if not from_json:
        c = read_csv(args.data, [], numeric=[f"{p}:{t}" for t in tasks for p in ("nll", "acc")] + ["compute_flops", "core"],
                     positive=["compute_flops"] + [f"nll:{t}" for t in tasks], key=["arm", "compute_flops"])
    arm, x = np.array(c["arm"]), c["compute_flops"] / FIT["c_ref"]
    filtered = np.mean([c[f"acc:{t}"] for t in tasks], axis=0)
    sig = {t: fit_sigmoid(c[f"nll:{t}"], c[f"acc:{t}"]) for t in tasks}
    r = float(filtered @ c["core"] / (filtered @ filtered))
    res = r * filtered - c["core"]
    out = dict(tasks=tasks, ratio=r, ratio_rmse=float(np.sqrt(np.mean(res ** 2))),
               ratio_r2=float(1 - res @ res / ((c["core"] - c["core"].mean()) ** 2).sum()),
               sigmoids={t: dict(a=s[0], b=s[1], rmse=float(np.sqrt(np.mean((sigmoid(c[f"nll:{t}"], *s)
                                                                              - c[f"acc:{t}"]) ** 2))))
                         for t, s in sig.items()}, arms={})
    for a in dict.fromkeys(c["arm"]):
        m = arm == a
        try:
            laws = {t: fit_task_nll(x[m], c[f"nll:{t}"][m]) for t in tasks}
        except FitError as e:
            note(f"arm {a}: {e}; skipped")
            continue
        core = lambda lc: r * np.mean([sigmoid(laws[t][0] + laws[t][1] * (10 ** lc / FIT["c_ref"]) ** -laws[t][2], *sig[t])
                                       for t in tasks])
        need = {}
        for target in args.targets:
            try:
                need[target] = 10 ** optimize.brentq(lambda lc: core(lc) - target, 15, 40)
            except ValueError:
                note(f"arm {a}: CORE {target} is not reached in [1e15, 1e40] FLOPs; missing")
                need[target] = np.nan
        out["arms"][a] = dict(nll_laws={t: dict(E=l[0], A=l[1], alpha=l[2]) for t, l in laws.items()},
                              compute_for_target=need, core_at={C: core(math.log10(C)) for C in args.at})
    if args.json:
        print(json.dumps(jsonable(out), allow_nan=False))
        return
    print(f"{len(tasks)} tasks; full/filtered ratio r = {r:.4f} (RMSE {out['ratio_rmse']:.4f}, R² {out['ratio_r2']:.4f})")
    ref = out["arms"].get(args.reference_arm)
    for a, o in out["arms"].items():
        print(f"{a}: " + ", ".join(f"CORE {t}: {fnum(C, '.3g')} FLOPs" + (f" (x{ref['compute_for_target'][t] / C:.2f})"
                                                                         if ref and a != args.reference_arm else "")
                                   for t, C in o["compute_for_target"].items())
              + "".join(f"; CORE@{C:.3g} = {v:.4f}" for C, v in o["core_at"].items()))


# ---------------------------------------------------------------------------------------------------- CLI
CONTRACTS = dict(  # each subcommand's input, shown by `python fit.py SUBCOMMAND -h`
    ladders="""INPUT: CSV files [arm, depth, compute_flops, val_loss; optional seed, training_seconds (--time)] and/or
train.py runs: a result.json, a run dir holding one, a runs dir (*/result.json) or a glob. Runs that are not
complete are skipped; the authors' release JSON is read as is, by its content: ladder series or downstream.json
({series: [{compute, loss, depth}]}, short series names as in arms.RELEASE_SERIES, compute in FLOPs or training
hours) and the FineWeb-Edu ladders ({tasks, d26: {record}, arms: {arm: [{depth, compute_flops, val_loss, ...}]}},
whose d26 record is held out of every fit and forecast, as --holdout does); any other JSON is an error. Losses and computes must be finite and > 0, depths whole.
The runs of one arm must share their data pool (data_manifest) and recipe: every plan field but the depth, what it
derives (shapes, steps, tokens, the depth-scaled LRs, growth crossovers) and the seed; two that differ are an error
naming both and the field (a run with another --lr-multiplier, --tpp or pool is another experiment).
Several rows for one (arm, depth): distinct seeds (seed column, or the plan's seed in result.json) are seed
replicates; exact copies are dropped with a warning; other duplicates are an error unless --replicates.
Replicates are pooled: the point is their mean, and the spread of ln L within points gives a pooled relative noise
sigma (with its degrees of freedom) that weights the fits and drives the bootstrap, which then re-draws that noise
(parametric) instead of resampling points; --noise SIGMA supplies sigma without replicates. sigma is relative: the
sd of ln(val_loss) of one run (0.002 = 0.2 %).
Multiplier CIs from resampling points are biased low at the last budget (dropping points from a convex curve can
only lower an interpolated multiplier); the parametric noise bootstrap and the fitted pi(C) do not have that bias.""",
    design="""PLAN: planned computes, one or more of: train.py --dry-run JSON lines [arch, depth, total_flops] (e.g.
`python train.py --arch vanilla --depth 6 8 10 12 14 16 18 20 22 --dry-run > plan.jsonl`, '-' reads stdin) or a CSV
[arm, depth, compute_flops; optional seeds] (reference/fineweb_ladders.csv works). True curves: --truth PILOT.json
(the output of `fit.py ladders ... --json`) or --E/--gamma/--A (every arm), with --delta-gamma ARM=DG setting
ARM's true gamma to the reference's + DG (a bare DG: every planned arm without a law in the truth). Each --design SPEC selects from the plan: 'd6-18' (depths 6..18 of each
arm, clipped to what it plans), 'x3@top2' (3 seeds at each arm's two largest depths), 'x3@16,18', 'x3' (everywhere),
combined as 'd6-18 x3@top2'; without --design: the plan as given. Reports per design and arm the expected 95 % CI
half-width of gamma and of gamma - gamma_ref (half the central 95 % range of the simulated estimates), the
E-known analytic standard error, P(detect) = share of simulated estimates beyond that half-width, and the plan's
FLOPs and GPU-hours. It also scores the intervals fit.py ladders would print from each simulated ladder (estimate
± 1.96 se; with --bootstrap B the parametric bootstrap CI): coverage of the true gamma and delta-gamma, power (the
delta-gamma interval excludes 0 on the true side), and how often the arm's own free-E fit reads its advantage as a
lower floor. --out writes design_ci_vs_compute.{png,pdf}.""",
    surface="DATA.csv [N, D or compute (= 6 N D), loss]; all finite and > 0; >= 7 rows. With both D and compute, D is "
            f"fitted and each row's compute must lie within {studies.COMPUTE_SLACK:g}x of 6 N D (attention and embedding FLOPs move it tens of "
            "percent; a unit slip is refused).",
    paper="""RELEASE: the folder holding the authors' release as reference/ does (release/appendix_ladders/*.json,
release/appendix_regimes/*.csv, release/effective_depth.json; and where present the files the release copy lacks:
release/loop_grid.csv, release/fineweb_edu_ladders.json, release/appendix_ladders/downstream.json). Writes every paper
figure those files support (2 right, 4, 5, 6, 15a-c, 16a-f, 17, 19a-b, 21-24) as PNG + PDF in the release's look,
paper_manifest.json (per figure its numbers and each number the paper states beside ours) and the gallery README.md;
the figures it cannot draw are listed with the reason.""",
    downstream="DATA.csv [arm, compute_flops, core, nll:<task>..., acc:<task>... (centered accuracy)], one row per "
               "checkpoint; nll:/acc: pairs define the tasks. Or the release's FineWeb-Edu ladders JSON {tasks, d26, "
               "arms: {arm: [{compute_flops, core_accuracy, task_nll, task_accuracy, ...}]}} (d26 is not fitted).",
    tpp="DATA.csv [compute_flops, tpp, val_loss], several tpp per budget.",
    growth="DATA.csv [depth, compute_flops, rho, val_loss], several rho per (depth, budget); rho, the fraction of the "
           "steps after growth (1 - the crossover fraction), in [0, 1].",
    lr="DATA.csv [params, value, val_loss (+ hparam)], several values per size.",
    loops="GRID.csv [depth, loops, weight_decay, compute_flops, val_loss] (compute without attention, as the "
          "release's loop_grid.csv), the release's regimes.csv, architectures.csv (optimal K per regime / control) or "
          "hyperparameters.csv, or train.py --data-constrained runs (a runs dir or a glob of result.json); a budget "
          "is fitted where >= 3 loop counts span it, and no budget fitted is an error.\nDefault budgets: the "
          "release's five, " + ", ".join(f"{b:.6e}" for b in FIT["loop_budgets"]) + " FLOPs.",
    runs="""RUNS: train.py run folders (holding result.json, train.lock or trajectory.jsonl) or folders of them (a
RUNS_DIR). A run is running while a train.py holds its train.lock (on this host); a result.json saying "running" with
no holder is a failed run (the process died: ladder.sh or --resume continues it).""",
    report="""DIR: a run folder (writes DIR/report.md and DIR/curves.png) or a folder of runs (also each run's, then
DIR/report.md with the runs table, `fit.py ladders` of the arms with >= 3 complete depths, reference arm vanilla if
fitted, anchor depth 8 or the reference's second depth, into DIR/fit, and the curves into DIR/curves).""",
    curves="""RUNS: as for runs; every run with trajectory.jsonl records is drawn (docs/trajectory.md), one colour per
arm, depth by shade (lighter: shallower), one figure per ladder (the runs' preset). --frontier FIT.json: the output of
`fit.py ladders RUNS --json`, drawn on the validation panel of a --x flops figure.""",
)


def arm_delta_gamma(text):
    """--delta-gamma [ARM=]DG -> (ARM or "", DG), DG a finite number in (-1, 1)."""
    arm, _, value = text.rpartition("=")
    return arm, number(float, -1, 1, True, True)(value)


MAX_RESAMPLES = 100_000  # bootstrap resamples, simulated ladders, basin hops: beyond this a run takes days
NOISE = number(float, 0, 1, True, True)  # relative noise: sd of ln(val_loss) of one run


def ladders_flags(s):
    s.add_argument("inputs", nargs="+", help="CSV files, result.json files, run dirs, runs dirs or globs")
    s.add_argument("--reference-arm", default="vanilla")
    s.add_argument("--anchor-depth", type=number(int, 1), default=FIT["anchor_depth"],
                   help="multipliers at the reference budgets with depth >= this; C0 = its compute (8; cpu preset: 3)")
    s.add_argument("--out", help="write Figure 3 and Figure 2 (left) as PNG + PDF into this directory (default: none, "
                   "tables only)")
    s.add_argument("--figure2-arms", nargs="+", metavar="ARM", help="the arms of Figure 2 (left), e.g. vanilla gated_1 "
                   "(default: the paper's six that were fitted)")
    s.add_argument("--bootstrap", type=number(int, 0, MAX_RESAMPLES), help=f"resamples for CIs (default 0, or "
                                                 f"{FIT['default_extrapolate_boot']} with --extrapolate)")
    s.add_argument("--seed", type=number(int, 0, SEED_MAX), default=0, help="bootstrap seed")
    s.add_argument("--time", action="store_true", help="use training time (seconds; the release's hours are "
                                                       "converted) instead of FLOPs")
    s.add_argument("--floor-from", nargs="+", metavar="INPUT", help="FLOP ladders to fit the shared floor on "
                   "(vanilla's), e.g. the release's ladders.json for its timing.json (default: the inputs)")
    s.add_argument("--refit-floor", action="store_true", help="fit the floor on --reference-arm on the axis in use "
                   "(default: vanilla's FLOP-ladder floor, kept for --time and any --reference-arm, as the release)")
    s.add_argument("--shared-anchor", type=number(int, 1), metavar="DEPTH", help="average the equivalent runs at "
                   "this depth into one anchor shared by every arm (Figure 16a: 8)")
    s.add_argument("--extrapolate", type=positive_float, metavar="C",
                   help="per arm at compute C: forecast loss, gain C_ref(L_arm(C))/C (Figure 4) and pi(C), with CIs")
    s.add_argument("--holdout", nargs="+", metavar="ARM:DEPTH", help="leave these points out of every fit and "
                                                                      "report their forecast, e.g. untied_grow:18")
    s.add_argument("--replicates", action="store_true", help="rows repeating an (arm, depth) are seed replicates")
    s.add_argument("--exclude-flagged", action="store_true", help="leave out the points whose run plans carry "
                   "schedule_notes (a warmup longer than the run: the cpu preset's d1), marked * in the table")
    s.add_argument("--noise", type=NOISE, metavar="SIGMA",
                   help="relative run-to-run noise (sd of ln val_loss of one run) when there are no replicates")


def build_parser():
    p = Parser(prog="fit.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    add = lambda name, helptext: sub.add_parser(name, help=helptext, description=f"{helptext}.\n\n{CONTRACTS[name]}",
                                                formatter_class=argparse.RawDescriptionHelpFormatter)
    ladders_flags(add("ladders", "per-arm power laws, multipliers, forecasts, figures"))
    s = add("design", "simulate planned ladders: CI widths, detection power, GPU-hours")
    s.add_argument("plan", nargs="+", help="train.py --dry-run JSON lines or CSV of planned computes ('-' = stdin)")
    s.add_argument("--noise", type=NOISE, metavar="SIGMA", help="relative run-to-run noise (sd of ln val_loss of one "
                                                                     "run)")
    s.add_argument("--truth", metavar="PILOT.json", help="true curves: a `fit.py ladders --json` output")
    s.add_argument("--E", type=positive_float, help="true floor (with --gamma, --A: every arm's curve)")
    s.add_argument("--gamma", type=positive_float)
    s.add_argument("--A", type=positive_float, help="true A at C = 1e18 FLOPs")
    s.add_argument("--delta-gamma", type=arm_delta_gamma, action="append", metavar="[ARM=]DG",
                   help="repeatable: ARM's true gamma = the reference's + DG; a bare DG: every planned arm without a law "
                        "in the truth (with --E/--gamma/--A: every arm but the reference)")
    s.add_argument("--design", action="append", metavar="SPEC", help="repeatable: 'd6-18', 'd6-22 x3@top2', ...")
    s.add_argument("--reference-arm", default="vanilla")
    s.add_argument("--sims", type=number(int, 20, MAX_RESAMPLES), default=400, help="simulated ladders per design")
    s.add_argument("--seed", type=number(int, 0, SEED_MAX), default=0)
    s.add_argument("--fixed-E", action="store_true", help="fit gamma with the true E known (no E refit)")
    s.add_argument("--bootstrap", type=number(int, 0, MAX_RESAMPLES), default=0, metavar="B",
                   help="also score fit.py ladders' parametric bootstrap CI with B resamples per simulated ladder "
                        "(B refits each: slow; default 0, the standard-error intervals only)")
    s.add_argument("--gpu", choices=["h100", "h200", "a100", "b200"], default="h100", help="peak dense bf16 "
                   "FLOP/s for GPU-hours (h100/h200 989e12, a100 312e12, b200 2250e12)")
    s.add_argument("--peak-flops", type=positive_float, help="overrides --gpu's peak")
    s.add_argument("--mfu", type=number(float, 0, 1, open_lo=True), default=0.4,
                   help="model FLOPs utilisation, in (0, 1] (0.4)")
    s.add_argument("--out", help="write design_ci_vs_compute.{png,pdf} into this folder (default: none, tables only)")
    s = add("surface", "Chinchilla / Skaling L(N, D) fits")
    s.add_argument("data")
    s.add_argument("--form", choices=["chinchilla", "skaling", "both"], default="both")
    s.add_argument("--delta", type=positive_float, help="Huber delta on ln L (default per form: "
                   f"{FIT['surface_delta']['chinchilla']:g} Chinchilla, {FIT['surface_delta']['skaling']:g} Skaling)")
    s.add_argument("--drop-highest", type=number(int, 0), default=0, metavar="N",
                   help="drop the N highest-loss rows before fitting (Hoffmann et al. drop 5)")
    s.add_argument("--hops", type=number(int, 0, MAX_RESAMPLES), default=100,
                   help="basin-hopping iterations after the grid of starts")
    s.add_argument("--folds", type=number(int, 2), default=5,
                   help="CV folds over the interpolation points (2 .. their number)")
    s.add_argument("--holdout", type=number(float, 0, 1, True, True), default=0.25,
                   help="fraction in (0, 1) of distinct N (and D) values held out as 'large'")
    s.add_argument("--sparse-l", action="store_true", help="also fit on the L-shaped subset (min N or min D)")
    s.add_argument("--budgets", type=positive_float, nargs="+", help="compute budgets for N*(C), D*(C)")
    s.add_argument("--seed", type=number(int, 0, SEED_MAX), default=0)
    s = add("downstream", "CORE forecast (App. C.4)")
    s.add_argument("data")
    s.add_argument("--reference-arm", default="vanilla")
    s.add_argument("--targets", type=number(float, 0, 1, True, True), nargs="+", default=list(FIT["gpt3_targets"]),
                   help="CORE scores in (0, 1) to find the compute for (GPT-3's four)")
    s.add_argument("--at", type=positive_float, nargs="*", default=[], help="compute budgets to forecast CORE at")
    s = add("paper", "every paper figure from the authors' released measurements, with a manifest")
    s.add_argument("release", help="the release folder: reference/ (or reference/release/)")
    s.add_argument("--out", default="figures/paper", help="figures, manifest and gallery README.md (default: figures/paper)")
    for name, helptext in (("tpp", "optimal tokens per parameter"), ("growth", "optimal growth fraction"),
                           ("lr", "hyperparameter drift exponent"), ("loops", "optimal loop count and frontiers")):
        s = add(name, helptext)
        s.add_argument("data")
        if name == "loops":
            s.add_argument("--wd", type=number(float, 0), default=0.8, help="fixed weight decay of the loop curves "
                           "(default %(default)s; the reported loop-scaling gain depends on it)")
            s.add_argument("--budgets", type=positive_float, nargs="+",
                           help="compute budgets (FLOPs); default: the release's five (above)")
            s.add_argument("--out", help="draw Figures 2 (right) and 5 of the loop grid into this folder (default: none)")
    s = add("report", "report.md of a run or of a ladder (its runs, fit and figures)")
    s.add_argument("dir", help="a run folder, or a folder of runs (a ladder's RUNS_DIR)")
    s.add_argument("--bootstrap", type=number(int, 0, MAX_RESAMPLES), default=200, help="resamples for the fit's CIs "
                   "(default 200)")
    s = add("runs", "a table of train.py runs and where each stands")
    s.add_argument("runs", nargs="+", help="run folders or folders of them")
    s = add("curves", "training and validation curves of train.py runs")
    s.add_argument("runs", nargs="+", help="run folders or folders of them")
    s.add_argument("--out", help="directory for curves_PRESET_X.{png,pdf} (default: the first RUNS folder's curves/)")
    s.add_argument("--x", choices=sorted(watch.X_AXES), default="steps", help="the x axis (default: steps)")
    s.add_argument("--frontier", metavar="FIT.json", help="overlay the fitted L(C) of `fit.py ladders --json` "
                   "(needs --x flops)")
    for s in sub.choices.values():
        s.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


COMMANDS = dict(ladders=cmd_ladders, paper=paper.cmd_paper, downstream=cmd_downstream, design=studies.cmd_design, surface=studies.cmd_surface,
                tpp=studies.cmd_tpp, growth=studies.cmd_growth, lr=studies.cmd_lr, loops=studies.cmd_loops,
                runs=watch.cmd_runs, curves=watch.cmd_curves, report=cmd_report)


def run(argv):
    args = build_parser().parse_args(argv)
    COMMANDS[args.cmd](args)


def main(argv=None):
    return cli_main(run, "fit.py", argv)


if __name__ == "__main__":
    exit_process(main())
