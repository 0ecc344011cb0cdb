"""fit.py — the paper's scaling-law fits, compute multipliers and figures, and the watching of train.py runs.

  python fit.py ladders reference/fineweb_ladders.csv --out figures --bootstrap 1000   # Figure 3, Figure 2 (left)
  python fit.py ladders --runs-dir runs/demo                # train.py runs; reference arm: vanilla, or --reference-arm
  python fit.py runs --runs-dir runs/demo                   # one row per run: state, step, losses, FLOPs, wall time, ETA
  python fit.py curves --runs-dir runs/demo --x flops       # training and validation curves, one figure per ladder
  python fit.py report --runs-dir runs/demo                 # report.md of every run and of the ladder (runs, fit, curves)
  python fit.py downstream --runs-dir runs/demo             # CORE forecast from the runs' eval.json (or a CSV)
  python fit.py design plan.jsonl --truth pilot.json --noise 0.002 --design d6-18 --design "d6-18 x3@top2"
  python fit.py surface grid.csv --form both --sparse-l     # Chinchilla / Skaling L(N, D)
  python fit.py tpp|growth|lr|loops DATA.csv                # the optimum of a swept recipe knob (App. A.2.3, A.4)
`python fit.py SUBCOMMAND -h` gives each one's input columns; docs/fits.md explains the fits. A subcommand is one
cmd_NAME function (its docstring is its -h) plus its lines in build_parser.
"""
import argparse, contextlib, io, json, math, os, re, sys, time

# The fits use tiny matrices: a threaded BLAS only adds contention (L-BFGS-B runs ~100x slower on a busy 2-core box).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np

import paper
from common import Parser, UsageError, cli_main, clock, exit_process, write_text
from arms import FIGURE2_ARMS, GPU_PEAK_FLOPS
from laws import (FIT, SEED_MAX, FitError, arm_order, bootstrap_ladders, check_one_recipe, check_outputs,
                  compute_optimal, fit_ladders, fit_surface, fitted_multiplier, fnum, footing, forecast, jsonable, mape,
                  note, number, positive_float, pyplot, quad_vertex, read_csv, read_result_json, run_paths,
                  save_figures, simulate, style, summarize, drop_repeats)


# ---------------------------------------------------------------------------------------------------- ladders
def ladder_rows_from_runs(paths, use_time):
    """(arm, depth, x, loss, seed, origin, flags) of every complete run; one arm's runs must share one recipe."""
    rows, runs = [], {}
    key = "total_training_time_seconds" if use_time else "estimated_training_flops"
    for path in paths:
        r = read_result_json(path, "arm, depth, compute_flops, val_loss")
        if r["status"] != "complete":
            note(f"skipping {path}: status {r['status']!r}, not complete")
            continue
        rows.append((r["arch"], r["depth"], float(r[key]), float(r["final_val_loss"]), (r.get("plan") or {}).get("seed"),
                     path, tuple(r.get("schedule_notes") or ())))
        runs.setdefault(r["arch"], []).append((path, r))
    for arm, group in runs.items():
        check_one_recipe(group, f"{arm} runs")
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


def ladder_rows_from_json(path, use_time, held):
    """The release's ladder JSON (paper.release_ladder_rows), or its FineWeb-Edu ladders, d26 added to `held`."""
    obj = paper.read_json(path)
    layout = paper.json_layout(obj)
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


def pool_replicates(rows, replicates, use_time):
    """Rows of one (arm, depth) with distinct seeds (or --replicates) are seed replicates; exact repeats are dropped.
    -> {(arm, depth): (x, [losses], flags)}."""
    groups, points = {}, {}
    for row in rows:
        groups.setdefault(row[:2], []).append(row)
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


def load_ladders(inputs, runs_dirs, use_time, replicates=False, held=None, exclude_flagged=False):
    """Inputs -> {arm: dict(depth, x, loss, n, reps, flags)} sorted by x (FLOPs, or seconds with --time); loss is
    the mean of a point's n seed replicates reps."""
    rows, paths = [], []
    for item in inputs:
        if item.endswith(".json"):
            rows += ladder_rows_from_json(item, use_time, [] if held is None else held)
        else:
            rows += ladder_rows_from_csv(item, use_time)
    for item in runs_dirs:
        if not (found := run_paths(item)):
            raise UsageError(f"--runs-dir {item}: no train.py run (result.json) there")
        paths += found
    rows += ladder_rows_from_runs(paths, use_time)  # all together: runs of one arm from two folders are compared
    if not rows:
        raise UsageError("no ladder points: pass CSV files or --runs-dir")
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
    """Relative run-to-run noise pooled over seed replicates: sigma^2 = sum (n_i - 1) var_i(ln L) / sum (n_i - 1)."""
    ss = dof = 0.0
    for d in data.values():
        for reps in d["reps"]:
            if len(reps) > 1:
                ss += ((np.log(reps) - np.log(reps).mean()) ** 2).sum()
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
                         flags=[f for j, f in enumerate(d["flags"]) if j != i])
    return held


def reference_arm(data, named):
    """--reference-arm, else Vanilla if present, else the only arm, else one line saying how to name one."""
    if named:
        if named not in data:
            raise UsageError(f"--reference-arm {named} is not an arm of the inputs (arms: {', '.join(data)})")
        return named
    if paper.FLOOR_ARM in data or len(data) == 1:
        return paper.FLOOR_ARM if paper.FLOOR_ARM in data else next(iter(data))
    raise UsageError(f"no {paper.FLOOR_ARM} in the inputs: name the arm the others are compared with, e.g. "
                     f"--reference-arm {next(iter(data))} (arms: {', '.join(data)})")


def default_anchor(depths):
    """Multipliers from d8 on (the paper), or from the second depth of a shorter ladder (cpu d1 is all warmup)."""
    depths = sorted(set(int(d) for d in depths))
    return FIT["anchor_depth"] if FIT["anchor_depth"] in depths or max(depths) > FIT["anchor_depth"] \
        else depths[min(1, len(depths) - 1)]


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
        E = paper.floor_of(load_ladders(args.floor_from or args.inputs, [] if args.floor_from else args.runs_dir, False,
                                        args.replicates))
    except UsageError as e:
        if args.floor_from:
            raise
        raise UsageError(f"the floor is {paper.FLOOR_ARM}'s FLOP-ladder fit and the inputs give none ({e}); pass "
                         "--floor-from with FLOP ladders (the release's ladders.json for its timing.json) or --refit-floor")
    note(f"floor E = {E:.6f} from {paper.FLOOR_ARM}'s FLOP ladder, held fixed (--refit-floor fits it on {ref}'s "
         f"{'time ' if args.time else ''}ladder instead)")
    return E


def forecast_at(c, data, fit, reference_arm, c_ref, xname):
    """Every arm's forecast loss, gain and pi at compute c (--extrapolate), into fit["arms"]."""
    ref_law, ref_free = fit["arms"][reference_arm], fit["reference_free"]
    x = np.concatenate([d["x"] for d in data.values()])
    if not x.min() / FIT["extrapolate_warn"] <= c <= FIT["extrapolate_warn"] * x.max():
        note(f"warning: extrapolating to {c:.3g} {xname}, far outside the measured {x.min():.3g}..{x.max():.3g}; "
             "the CI assumes the power laws hold that far")
    for a, r in fit["arms"].items():
        r["forecast_loss"], r["gain_at_extrapolate"] = forecast(
            ref_free, None if a == reference_arm else r, c / c_ref)
        r["pi_at_extrapolate"] = float(fitted_multiplier(ref_law, r, c / c_ref))


def cmd_ladders(args):
    """Per arm L(C) = E + A (C/1e18)^-gamma with E fitted on the reference arm and shared (arXiv 2609.19107 Sec. 4.2),
compute multipliers, bootstrap CIs, the per-arm free-E check, forecasts at --extrapolate C (Figure 4), and with --out
Figure 3 + Figure 2 (left).
INPUTS: CSV [arm, depth, compute_flops, val_loss; optional seed, training_seconds (--time)] or the authors' release
JSON (ladder series, downstream.json, or the FineWeb-Edu ladders, whose d26 record is held out); --runs-dir: train.py
runs (incomplete ones skipped). The runs of one arm must share the arm's recipe (its row of the arms table and the
preset, what train.py's flags change) and data pool; what a depth derives is not compared.
Reference arm: --reference-arm, else vanilla if present, else the only arm. Several rows for one (arm, depth) with
distinct seeds are seed replicates: pooled, their spread is the run-to-run noise sigma (sd of ln val_loss of one run)
that weights the fits and drives a parametric bootstrap; --noise SIGMA gives it without replicates."""
    if args.out:
        check_outputs(args.out)
    marked = []
    data = load_ladders(args.inputs, args.runs_dir, args.time, args.replicates, marked, args.exclude_flagged)
    ref = reference_arm(data, args.reference_arm)
    if args.figure2_arms and not args.out:
        raise UsageError("--figure2-arms picks the arms of Figure 2, which only --out DIR draws; add --out")
    if stray := [a for a in args.figure2_arms or () if a not in data]:
        raise UsageError(f"--figure2-arms {stray[0]} is not an arm of the inputs (arms: {', '.join(data)})")
    named = args.holdout or []
    held = hold_out(data, named + [spec for spec in dict.fromkeys(marked) if spec not in named])
    xname, c_ref = ("s", FIT["time_ref"]) if args.time else ("FLOPs", FIT["c_ref"])
    sigma, dof = pooled_noise(data)
    source = "replicates" if sigma is not None else None
    if args.noise is not None:
        if sigma is not None:
            note(f"--noise {args.noise} replaces the replicates' pooled sigma {sigma:.5f} ({dof} dof)")
        sigma, dof, source = args.noise, 0, "--noise"
    E_known = ladder_floor(args, data, ref)
    t0 = time.perf_counter()
    fit = fit_ladders(data, ref, c_ref, args.anchor_depth or default_anchor(data[ref]["depth"]), sigma, E_known)
    t_fit = time.perf_counter() - t0
    for warning in fit["warnings"]:
        note(warning)
    fit["noise"] = dict(sigma=sigma, dof=dof, source=source, scale="relative: sd of ln(val_loss) of one run",
                        replicated_points=int(sum((d["n"] > 1).sum() for d in data.values())))
    n_boot = args.bootstrap if args.bootstrap is not None else (FIT["default_extrapolate_boot"] if args.extrapolate else 0)
    t0 = time.perf_counter()
    if n_boot > 0:
        bootstrap_ladders(data, fit, n_boot, args.seed, args.extrapolate, (sigma, dof) if sigma is not None else None)
    t_boot = time.perf_counter() - t0
    fit["footing"] = footing(fit, sigma)
    ref_free = fit["reference_free"]
    if args.extrapolate:
        forecast_at(args.extrapolate, data, fit, ref, c_ref, xname)
    for h in held:
        law = fit["arms"].get(h["arm"])
        h["forecast_loss"] = forecast(ref_free, None if h["arm"] == ref else law, h["compute"] / c_ref)[0] \
            if law else np.nan
        h["residual"] = h["loss"] - h["forecast_loss"]
    paths = ladder_figures(data, fit, args.out, xname, args.figure2_arms) if args.out else []
    if args.json:
        drop = ("free_gamma_E_cov", "floor_slope", "multipliers_all")
        obj = dict(E=fit["E"], reference_arm=ref, C0=fit["C0"], x_unit=xname, c_ref=c_ref, reference_free=ref_free,
                   noise=fit["noise"], errors=fit["errors"],
                   arms={a: {k: v for k, v in r.items() if k not in drop} for a, r in fit["arms"].items()},
                   **{k: fit[k] for k in ("E_ci", "E_se", "E_dof", "E_bound", "bootstrap", "footing") if k in fit})
        obj.update(dict(extrapolate=args.extrapolate) if args.extrapolate else {}, **dict(held_out=held) if held else {})
        print(json.dumps(jsonable(obj), allow_nan=False))
        return
    print(ladder_table(fit, xname))
    print("\n" + "\n".join(fit["footing"] + noise_lines(fit)))
    if args.extrapolate:
        c = lambda r, k: (lambda v: f" [{fnum(v[0], '.4f')}, {fnum(v[1], '.4f')}]" if v else "")(r.get(f"{k}_ci"))
        print(f"\nat C = {args.extrapolate:.6g} {xname}: forecast loss L_arm(C); gain C_{ref}(L_arm(C)) / C "
              f"(Figure 4's definition); pi(C) = C / C_arm(L_{ref}(C)) (shared-E laws)")
        for a, r in fit["arms"].items():
            print(f"  {a:<18} loss {r['forecast_loss']:.4f}{c(r, 'forecast_loss')}  gain {r['gain_at_extrapolate']:.4f}"
                  f"{c(r, 'gain_at_extrapolate')}  pi {r['pi_at_extrapolate']:.4f}{c(r, 'pi_at_extrapolate')}")
    for h in held:
        print(f"held out {h['arm']} d{h['depth']} ({h['compute']:.4g} {xname}): loss {h['loss']:.4f}, forecast "
              f"{fnum(h['forecast_loss'])}, residual {fnum(h['residual'], '+.4f')}")
    print(f"\nfit: {t_fit:.2f} s" + (f"; bootstrap {n_boot} resamples: {t_boot:.1f} s" if n_boot else ""))
    for p in paths:
        print(f"wrote {p}")


def ladder_table(fit, xname):
    """The two ladder tables; a ± or CI that laws.footing withheld reads "unknown"."""
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
    return lines


LADDER_FIGURES = ("fig3_ladders.png", "fig3_ladders.pdf", "fig2_left.png", "fig2_left.pdf")


def ladder_figures(data, fit, out_dir, xname, figure2_arms=None):
    """Figure 3 (loss vs compute with an inset of the top budgets, multipliers, gamma vs log A) and Figure 2 (left)."""
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


# ---------------------------------------------------------------------------------------------------- watching runs
def run_dirs(items):
    """The run folders --runs-dir names: itself if it is one, else the runs one level below."""
    is_run = lambda d: any(os.path.exists(os.path.join(d, f)) for f in ("result.json", "train.lock", "trajectory.jsonl"))
    found = []
    for item in items:
        if not os.path.isdir(item):
            raise UsageError(f"--runs-dir {item} is not a folder; pass a train.py run folder or a folder of them")
        below = sorted(os.path.join(item, d) for d in os.listdir(item) if os.path.isdir(os.path.join(item, d)))
        found += [item] if is_run(item) else [d for d in below if is_run(d)]
    if not found:
        raise UsageError(f"no train.py runs in {' '.join(items)} (no result.json, train.lock or trajectory.jsonl); "
                         "pass run folders or their RUNS_DIR")
    return found


def lock_held(run_dir):
    """Whether a process holds the run's lock (a train.py writing it now, on this host)."""
    import fcntl
    path = os.path.join(run_dir, "train.lock")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
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


def read_result(run_dir, name="result.json"):
    """RUN/name (result.json, core_eval.py's eval.json) as a dict, or None when there is none."""
    path = os.path.join(run_dir, name)
    return json.load(open(path)) if os.path.isfile(path) else None


def run_row(run_dir):
    """One row of the runs table, every column at the step the run reached, with the latest validation before it."""
    result, records, held = read_result(run_dir) or {}, read_trajectory(run_dir), lock_held(run_dir)
    plan, status = result.get("plan") or {}, result.get("status")
    state, reason = {"complete": "complete", "stopped": "stopped", "interrupted": "stopped"}.get(status, "failed"), \
        result.get("error")
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
                val_loss=val_loss, val_step=val_step,
                flops=result.get("estimated_training_flops") if finished else at.get("flops"),
                flops_planned=plan.get("total_flops"),
                wall_seconds=at.get("wall_seconds", result.get("wall_seconds")),
                eta_seconds=at.get("eta_seconds") if state == "running" else None)


def val_text(row):
    """The latest validation and its step: '2.3456 @50', the start's '5.5512 @0 (start)', or —."""
    if row["val_loss"] is None:
        return "—"
    return f"{row['val_loss']:.4f} @{row['val_step']}" + (" (start)" if row["val_step"] == 0 else "")


def hms(seconds):
    return "—" if seconds is None else clock(seconds)


def run_order(row):
    """Runs in the arms table's order, then by depth and folder name."""
    return arm_order(row["arch"] or ""), row["depth"] or 0, row["run"]


def cmd_runs(args):
    """One row per train.py run: its state (complete / running / stopped / failed, with the reason; running while a
train.py holds its train.lock on this host), the step it reached, the train loss there, the latest validation and
the step it was taken at, FLOPs done / planned, wall time and ETA."""
    rows = sorted((run_row(d) for d in run_dirs(args.runs_dir)), key=run_order)
    if args.json:
        print(json.dumps(jsonable(dict(runs=rows)), indent=2))
        return
    print(f"{'run':<24} {'state':<9} {'step':>13} {'train':>7} {'val @ step':>20} {'FLOPs done / planned':>21} "
          f"{'wall time':>10} {'ETA (wall)':>10}")
    for r in rows:
        step = f"{r['step'] or 0}/{r['steps'] or '?'}"
        print(f"{r['run']:<24} {r['state']:<9} {step:>13} {fnum(r['train_loss']):>7} "
              f"{val_text(r):>20} {fnum(r['flops'], '.2e') + ' / ' + fnum(r['flops_planned'], '.2e'):>21} "
              f"{hms(r['wall_seconds']):>10} {hms(r['eta_seconds']):>10}" + (f"  {r['reason']}" if r["reason"] else ""))


X_AXES = dict(steps=("step", "optimizer step", "linear"), tokens=("tokens", "training tokens", "log"),
              flops=("flops", "training FLOPs (the plan's accounting)", "log"))
SMOOTHING = 0.02  # the training loss drawn is its mean over a centred window of 2 % of the run's steps (>= 5)


def curve_runs(items):
    """[(row, records, result)] of every run with trajectory records, in run_order."""
    runs = [(run_row(d), read_trajectory(d), read_result(d) or {}) for d in run_dirs(items)]
    if not (runs := [r for r in runs if r[1]]):
        raise UsageError(f"no run in {' '.join(items)} has trajectory records yet; curves need trajectory.jsonl")
    return sorted(runs, key=lambda r: run_order(r[0]))


def shade(colour, depth, depths):
    """The arm's colour, lighter for shallower runs (the deepest full, the shallowest 75 % white)."""
    from matplotlib.colors import to_rgb
    rank, n = sorted(depths).index(depth), len(depths)
    lift = 0.75 * (n - 1 - rank) / (n - 1) if n > 1 else 0.0
    return tuple(c + (1 - c) * lift for c in to_rgb(colour))


def smoothed(values):
    """The centred moving mean (no lag, unlike an EMA on a falling loss), its window shrunk at the ends."""
    k = max(2, round(SMOOTHING * len(values) / 2))
    return [sum(values[max(0, i - k):i + k + 1]) / len(values[max(0, i - k):i + k + 1]) for i in range(len(values))]


def frontier_laws(path):
    """{arm: (E, A, gamma, c_ref, (lowest, highest fitted compute))} from a `fit.py ladders --json` output."""
    try:
        fit = json.load(open(path))
        return {arm: (fit["E"], law["A"], law["gamma"], fit["c_ref"], (min(p["compute"] for p in law["points"]),
                max(p["compute"] for p in law["points"]))) for arm, law in fit["arms"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"--frontier {path} is not a `fit.py ladders --json` output (E, c_ref, arms.*.A/gamma/points);"
                         " write one with python fit.py ladders --runs-dir RUNS --json > fit.json") from None


def curves_figure(plt, runs, x_axis, frontier):
    """Training (smoothed) and validation loss of every run; ▲ at growth, | at the warmdown's start."""
    from matplotlib.ticker import FormatStrFormatter
    key, label, scale = X_AXES[x_axis]
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
    by_arm, seen = {}, {}
    for row, _, _ in runs:
        by_arm.setdefault(row["arch"], set()).add(row["depth"])
        seen[(row["arch"], row["depth"])] = seen.get((row["arch"], row["depth"]), -1) + 1
    drawn = {}
    for row, records, result in runs:
        arm, depth = row["arch"], row["depth"]
        twin = drawn[(arm, depth)] = drawn.get((arm, depth), -1) + 1
        colour = shade(style(arm)[1] if arm else "#777777", depth, by_arm[arm])
        if not (points := [r for r in records if r.get(key) is not None]):
            continue
        name = f"{style(arm)[0] if arm else row['run']} d{depth}" + (f" ({row['run']})" if seen[(arm, depth)] else "") \
            + ("" if row["state"] == "complete" else f" [{row['state']}]")
        line = dict(color=colour, ls=("-", ":", "-.")[twin % 3] if row["state"] == "complete" else "--")
        xs, ys = [r[key] for r in points], smoothed([r["loss"] for r in points])
        ax_train.plot(xs, [r["loss"] for r in points], color=colour, lw=0.5, alpha=0.25)
        ax_train.plot(xs, ys, lw=1.4, label=name, **line)
        vals = [r for r in points if r.get("val_loss") is not None]
        ax_val.plot([r[key] for r in vals], [r["val_loss"] for r in vals], marker="o", ms=3, lw=1, label=name, **line)
        plan, at = result.get("plan") or {}, {r["step"]: (r, y) for r, y in zip(points, ys)}
        for event in result.get("growth_events") or []:
            if event["step"] in at:
                grown, y = at[event["step"]]
                for ax, y in ((ax_train, y), (ax_val, grown.get("val_loss_after_growth"))):
                    if y is not None:
                        ax.plot(grown[key], y, "^", color=colour, ms=8, mec="black", mew=0.6)
        if start := at.get(round(plan.get("steps", 0) * (1 - plan.get("warmdown_ratio", 0)))) if plan.get(
                "warmdown_ratio") else None:
            ax_train.plot(start[0][key], start[1], "|", color=colour, ms=18, mew=2.5, mec="black")
    for arm, (E, A, gamma, c_ref, (lo, hi)) in (frontier or {}).items():
        if arm in by_arm:
            grid = [lo * (hi / lo) ** (i / 50) for i in range(51)]
            law = [E + A * (c / c_ref) ** -gamma for c in grid]
            ax_val.plot(grid, law, "--", color=style(arm)[1], lw=1.2, label=f"{style(arm)[0]} frontier (fitted range)")
            ax_val.plot([grid[0], grid[-1]], [law[0], law[-1]], "|", color=style(arm)[1], ms=12, mew=2)
    for ax, title in ((ax_train, f"training loss (centred mean over {SMOOTHING:.0%} of each run's steps, >= 5; raw "
                                 "faint)"), (ax_val, "validation loss")):
        ax.set_xscale(scale)
        if any(len(line.get_ydata()) for line in ax.lines):  # a run without a validation yet leaves its panel empty
            ax.set_yscale("log")
        ax.set(xlabel=label, ylabel=f"{title.split(' (')[0]} (nats per token)")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))
        ax.set_title(f"{title}\n▲ growth" + (", | warmdown start" if ax is ax_train else "")
                     + "; dashed: stopped or running", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    ax_val.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def draw_curves(runs, out, x_axis, frontier=None):
    """curves_figure of each ladder (the runs' preset) into out/curves_LADDER_X.{png,pdf} -> the paths written."""
    check_outputs(out)
    plt, ladders, paths = pyplot(), {}, []
    for run in runs:
        ladders.setdefault((run[2].get("plan") or {}).get("preset") or "runs", []).append(run)
    for ladder, members in ladders.items():
        fig = curves_figure(plt, members, x_axis, frontier)
        paths += save_figures(out, {f"curves_{ladder}_{x_axis}.{ext}": fig for ext in ("png", "pdf")}, dpi=120)
        plt.close(fig)
    return paths


def cmd_curves(args):
    """Training and validation loss of train.py runs against steps, tokens or FLOPs (docs/trajectory.md), one figure
per ladder (the runs' preset), one colour per arm, depth by shade, growth and warmdown marked. --frontier FIT.json (a
`fit.py ladders --json` output) overlays the fitted L(C) on a --x flops figure."""
    if args.frontier and args.x != "flops":
        raise UsageError("--frontier overlays L(C) on a FLOPs axis; add --x flops")
    frontier = frontier_laws(args.frontier) if args.frontier else None
    runs = curve_runs(args.runs_dir)
    written = draw_curves(runs, args.out or os.path.join(args.runs_dir[0], "curves"), args.x, frontier)
    if args.json:
        print(json.dumps(dict(written=written, runs=[dict(run=r[0]["run"], state=r[0]["state"]) for r in runs])))
        return
    print("\n".join(f"wrote {p}" for p in written))
    print(f"{len(runs)} runs: " + ", ".join(f"{r[0]['run']} ({r[0]['state']})" for r in runs))


REPORT_PLAN = ("arch", "preset", "depth", "width", "n_layer", "params_tpp", "params_stored", "steps", "tokens_per_step",
               "train_tokens", "total_flops", "pass_stages", "crossover_steps", "warmup_steps", "warmdown_ratio",
               "rewarm_steps", "matrix_lr", "embedding_lr", "weight_decay", "optimizer", "seed")


def markdown_table(header, rows):
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header)] + [f"| {' | '.join(map(str, r))} |" for r in rows]


def run_report(run_dir, curves=None):
    """report.md of one run: plan, environment, curves, validations, CORE (eval.json) and timings."""
    result, row = read_result(run_dir) or {}, run_row(run_dir)
    plan = result.get("plan") or {}
    num = lambda v: f"{v:.6g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)
    lines = [f"# {row['run']}", "", f"{row['arch']} d{row['depth']}, preset {plan.get('preset')}: **{row['state']}** "
             f"at step {row['step']}/{row['steps']}" + (f" ({row['reason']})" if row["reason"] else "") + ".", "",
             "## Plan", ""] + markdown_table(["field", "value"], [(f"`{k}`", num(plan[k])) for k in REPORT_PLAN
                                                                   if k in plan])
    lines += [""] + [f"- note: {n}" for n in result.get("schedule_notes") or []]
    env = dict(result.get("environment") or {}, world_size=result.get("world_size"), data_dir=result.get("data_dir"))
    lines += ["", "## Environment", ""] + markdown_table(["", ""], [(k, v) for k, v in env.items() if v is not None])
    lines += ["", "## Curves", "", f"![training and validation loss]({curves})" if curves else
              f"Drawn by `python fit.py report --runs-dir {run_dir}`."]
    lines += ["", "## Validation", ""] + markdown_table(
        ["step", "when", "passes", "val loss (nats/token)", "val bpb"],
        [(e["step"], e.get("when", ""), e.get("passes", ""), f"{e['val_loss']:.4f}", fnum(e.get("val_bpb")))
         for e in result.get("evals") or []])
    core = read_result(run_dir, "eval.json")
    lines += ["", "## CORE", "", f"CORE {core['core_metric']:.4f} ({core.get('checkpoint')})" if core else
              f"Not evaluated (`python core_eval.py --checkpoint {os.path.join(run_dir, 'checkpoints', 'final')}`)."]
    lines += ["", "## Timings", ""] + markdown_table(["", ""], [
        ("training time (wall time less validations and checkpoints)", hms(result.get("total_training_time_seconds"))),
        ("validation time", hms(result.get("eval_seconds"))), ("wall time (resumes added up)", hms(row["wall_seconds"])),
        ("training tokens / s", fnum(result.get("tokens_per_second"), ",.0f")), ("FLOPs done", fnum(row["flops"], ".4g"))])
    return "\n".join(lines) + "\n"


def write_run_report(run_dir, curves=None):
    """RUN/report.md (train.py at a run's end, fit.py report), replaced whole. -> its path."""
    write_text(os.path.join(run_dir, "report.md"), run_report(run_dir, curves))
    return os.path.join(run_dir, "report.md")


def cmd_report(args):
    """report.md of a run (--runs-dir RUN: its own, with its curves) or of a ladder (--runs-dir RUNS_DIR: every run's,
then RUNS_DIR/report.md with the runs table, the ladder fit of the arms with >= 3 complete depths with bootstrap CIs
and its figures in RUNS_DIR/fit, and the curves in RUNS_DIR/curves). The fit's reference arm follows fit.py ladders'
rule (--reference-arm, else vanilla, else the only arm)."""
    runs_dir, plt, table = args.runs_dir[0], pyplot(), None
    dirs, runs, written = run_dirs([runs_dir]), [], []
    for d in dirs:
        runs.append((run_row(d), read_trajectory(d), read_result(d) or {}))
        if runs[-1][1]:
            fig = curves_figure(plt, runs[-1:], "steps", None)
            save_figures(d, {"curves.png": fig}, dpi=80)
            plt.close(fig)
        written.append(write_run_report(d, "curves.png" if runs[-1][1] else None))
    if dirs != [runs_dir]:
        rows = [row for row, _, _ in sorted(runs, key=lambda run: run_order(run[0]))]
        lines = [f"# Ladder report: {runs_dir}", "", "## Runs", ""] + markdown_table(
            ["run", "state", "step", "val loss @ step", "FLOPs", "wall time", "report"],
            [(r["run"], r["state"], f"{r['step'] or 0}/{r['steps'] or '?'}", val_text(r), fnum(r["flops"], ".3e"),
              hms(r["wall_seconds"]), f"[report.md]({r['run']}/report.md)") for r in rows])
        complete = {}
        for r in rows:
            if r["state"] == "complete":
                complete.setdefault(r["arch"], set()).add(r["depth"])
        fitted = [a for a, d in complete.items() if len(d) >= 3]
        argv = ["ladders", "--runs-dir", *[r["path"] for r in rows if r["arch"] in fitted], "--bootstrap",
                str(args.bootstrap), "--out", os.path.join(runs_dir, "fit")] + \
            (["--reference-arm", args.reference_arm] if args.reference_arm else [])
        lines += ["", "## Fit", ""]
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
        curves = draw_curves([run for run in runs if run[1]], os.path.join(runs_dir, "curves"), "steps") \
            if any(run[1] for run in runs) else []
        lines += ["", "## Curves", ""] + [f"![curves](curves/{os.path.basename(p)})" for p in curves if p.endswith(".png")]
        write_text(os.path.join(runs_dir, "report.md"), "\n".join(lines) + "\n")
        written.append(os.path.join(runs_dir, "report.md"))
    if args.json:
        print(json.dumps(dict(written=written, fit_table=table)))
    else:
        print("\n".join(([table] if table else []) + [f"wrote {p}" for p in written]))


# ---------------------------------------------------------------------------------------------------- downstream (App. C.4)
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


def downstream_columns_from_runs(runs_dirs):
    """downstream's columns from the complete runs that core_eval.py evaluated (result.json + eval.json)."""
    c = {"arm": [], "compute_flops": [], "core": [], "_line": []}
    for d in run_dirs(runs_dirs):
        result, ev = read_result(d) or {}, read_result(d, "eval.json")
        if result.get("status") != "complete" or not ev:
            continue
        for k, v in [("arm", result["arch"]), ("compute_flops", result["estimated_training_flops"]), ("_line", d),
                     ("core", ev["core_metric"])] + [(f"nll:{t}", v) for t, v in ev["losses"].items()] + \
                [(f"acc:{t}", v) for t, v in ev["centered_results"].items()]:
            c.setdefault(k, []).append(v)
    if not c["arm"]:
        raise UsageError(f"no complete run with an eval.json in {' '.join(runs_dirs)}: run core_eval.py on their "
                         "checkpoints first")
    return {k: v if k in ("arm", "_line") else np.array(v, dtype=float) for k, v in c.items()}


def cmd_downstream(args):
    """CORE forecast (App. C.4): per task NLL = E + A C^-alpha per arm, centered accuracy = sigmoid of the NLL, CORE =
r x the mean accuracy; the compute each arm needs for --targets, CORE --at budgets. DATA: a CSV [arm, compute_flops,
core, nll:<task>..., acc:<task>... (centered accuracy)], one row per checkpoint, or the release's FineWeb-Edu
ladders JSON (d26 not fitted); or --runs-dir: train.py runs with core_eval.py's eval.json."""
    from scipy import optimize
    if bool(args.data) == bool(args.runs_dir):
        raise UsageError("give the measurements: a DATA file or --runs-dir (runs with core_eval.py's eval.json)")
    args.data = args.data or " ".join(args.runs_dir)
    from_json = args.data.endswith(".json") or args.runs_dir
    c = downstream_columns_from_runs(args.runs_dir) if args.runs_dir else downstream_columns_from_json(args.data) \
        if from_json else read_csv(args.data, ["arm", "compute_flops", "core"], numeric=["compute_flops", "core"],
                                   positive=["compute_flops"])
    tasks = [k[4:] for k in c if k.startswith("nll:") and f"acc:{k[4:]}" in c]
    if lone := next((k for k in c if k[:4] in ("nll:", "acc:") and k[4:] not in tasks), None):
        other = ("acc:" if lone.startswith("nll:") else "nll:") + lone[4:]
        raise UsageError(f"{args.data}: column {lone} has no {other}; a task is an nll:<task>, acc:<task> pair: add "
                         "the other column or drop this one")
    if not tasks:
        raise UsageError(f"{args.data}: no task columns (need nll:<task> and acc:<task> pairs)")
    args.reference_arm = reference_arm(dict.fromkeys(c["arm"]), args.reference_arm)
    if not from_json:
        c = read_csv(args.data, [], numeric=[f"{p}:{t}" for t in tasks for p in ("nll", "acc")] + ["compute_flops", "core"],
                     positive=["compute_flops"] + [f"nll:{t}" for t in tasks], key=["arm", "compute_flops"])
    arm, x = np.array(c["arm"]), c["compute_flops"] / FIT["c_ref"]
    filtered = np.mean([c[f"acc:{t}"] for t in tasks], axis=0)
    sigmoid = paper.sigmoid
    sig = {t: paper.fit_sigmoid(c[f"nll:{t}"], c[f"acc:{t}"]) for t in tasks}
    r = float(filtered @ c["core"] / (filtered @ filtered))
    res = r * filtered - c["core"]
    out = dict(tasks=tasks, ratio=r, ratio_rmse=float(np.sqrt(np.mean(res ** 2))),
               ratio_r2=float(1 - res @ res / ((c["core"] - c["core"].mean()) ** 2).sum()),
               sigmoids={t: dict(a=s[0], b=s[1], rmse=float(np.sqrt(np.mean((sigmoid(c[f"nll:{t}"], *s)
                                                                              - c[f"acc:{t}"]) ** 2))))
                         for t, s in sig.items()}, arms={})
    for a in dict.fromkeys(c["arm"]):
        m = arm == a
        if m.sum() < 3:
            note(f"arm {a}: fewer than 3 points ({m.sum()}); skipped")
            continue
        laws = {t: paper.fit_task_nll(x[m], c[f"nll:{t}"][m]) for t in tasks}
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


# ---------------------------------------------------------------------------------------------------- design
DESIGN_FIGURE = ("design_ci_vs_compute.png", "design_ci_vs_compute.pdf")
DESIGN_FORMS = "'d6-18' (depths 6..18), 'x3' (3 seeds everywhere), 'x3@top2' (at each arm's 2 largest depths), " \
               "'x3@16,18' (at those depths), combined as 'd6-18 x3@top2'"
MAX_SEEDS = 100  # seeds per planned point in a design spec


def read_plan(path):
    """Planned runs -> [(arm, depth, compute_flops, seeds, origin)]."""
    if path.endswith(".csv"):
        c = read_csv(path, ["arm", "depth", "compute_flops"], numeric=["depth", "compute_flops", "seeds"],
                     positive=["depth", "compute_flops", "seeds"])
        rows = [(a, d, x, c["seeds"][i] if "seeds" in c else 1, f"{path}:{line}")
                for i, (a, d, x, line) in enumerate(zip(c["arm"], c["depth"], c["compute_flops"], c["_line"]))]
    else:
        try:
            text = sys.stdin.read() if path == "-" else open(path).read()
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}")
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                rows.append((r["arch"], r["depth"], float(r["total_flops"]), 1, f"{path}:{i}"))
                assert isinstance(r["arch"], str) and type(r["depth"]) is int
            except (ValueError, KeyError, TypeError, AssertionError):
                raise UsageError(f"{path}:{i}: not a train.py --dry-run plan (a JSON object with arch, a whole depth, "
                                 "total_flops per line); or pass a CSV [arm, depth, compute_flops]")
    for arm, d, x, seeds, origin in rows:
        if d != int(d) or d < 1 or seeds != int(seeds) or not 1 <= seeds <= MAX_SEEDS or not (math.isfinite(x) and x > 0):
            raise UsageError(f"{origin}: depth must be a whole number >= 1, seeds a whole number in [1, {MAX_SEEDS}] "
                             "and compute a finite number > 0")
    if not rows:
        raise UsageError(f"{path}: no planned runs")
    return rows


def plan_from_rows(rows):
    """{(arm, depth): (compute_flops, seeds)}; a run planned twice is kept once if both agree, else refused."""
    plan, origin = {}, {}
    for arm, d, x, seeds, where in rows:
        key = (arm, int(d))
        if key in plan:
            if plan[key] != (x, int(seeds)):
                raise UsageError(f"{where} and {origin[key]}: two different plans for {arm} d{int(d)}; remove one")
            note(f"warning: {where} repeats {origin[key]} ({arm} d{int(d)}) exactly; kept one")
            continue
        plan[key], origin[key] = (x, int(seeds)), where
    return plan


def parse_design(spec, depths):
    """A --design spec -> (lo, hi, seeds, where): where None (every depth), ('top', K) or a set of depths."""
    lo = hi = seeds = where = None
    for token in spec.split():
        bad = lambda why: UsageError(f"--design {spec!r}: {token!r} {why}")
        if m := re.fullmatch(r"d(\d+)-(\d+)", token):
            if lo is not None:
                raise bad("is a second depth range; give one")
            lo, hi = int(m[1]), int(m[2])
            if lo > hi:
                raise bad(f"runs backwards; write d{hi}-{lo}")
            for end in (lo, hi):
                if end not in depths:
                    raise bad(f"asks for depth {end}, but no planned run has depth {end}; add it to the plan (e.g. "
                              f"train.py --dry-run --depth ... {end})")
        elif m := re.fullmatch(r"x(\d+)(?:@top(\d+)|@(\d+(?:,\d+)*))?", token):
            if seeds is not None:
                raise bad("is a second seed count; give one")
            seeds = int(m[1])
            if not 1 <= seeds <= MAX_SEEDS:
                raise bad(f"asks for {seeds} seeds; give 1 to {MAX_SEEDS}")
            if m[2] is not None:
                where = ("top", int(m[2]))
                if where[1] < 1:
                    raise bad("needs topK with K >= 1 (the K largest depths of each arm)")
            elif m[3] is not None:
                where = {int(v) for v in m[3].split(",")}
                if missing := sorted(where - depths):
                    raise bad(f"names depth {', '.join(map(str, missing))}, but no planned run has it")
        else:
            raise bad(f"is not a design token; use {DESIGN_FORMS}")
    if isinstance(where, set) and lo is not None and (outside := sorted(d for d in where if not lo <= d <= hi)):
        raise UsageError(f"--design {spec!r}: seeds at depth {', '.join(map(str, outside))} lie outside d{lo}-{hi}")
    return lo, hi, seeds, where


def apply_design(plan, spec):
    """A design spec ('' = the plan as given) applied to the plan -> {arm: (x, seeds, depths)}."""
    lo, hi, seeds, where = parse_design(spec, {d for _, d in plan})
    out = {}
    for arm in dict.fromkeys(a for a, _ in plan):
        ds = sorted(d for a, d in plan if a == arm and (lo is None or lo <= d <= hi))
        extra = set(ds) if where is None else set(ds[-where[1]:]) if isinstance(where, tuple) else where
        n = [seeds if seeds and d in extra else plan[(arm, d)][1] for d in ds]
        out[arm] = (np.array([plan[(arm, d)][0] for d in ds]), np.array(n), ds)
    return out


def true_laws(args, arms):
    """{arm: (A, gamma)} and E: the pilot's (--truth) or --E/--gamma/--A; --delta-gamma [ARM=]DG sets an arm's true
    gamma to the reference's + DG (a bare DG: every planned arm the truth has no law for)."""
    given = [f"--{k}" for k in ("E", "gamma", "A") if getattr(args, k) is not None]
    if args.truth and given:
        raise UsageError(f"--truth {args.truth} gives the true curves and {'/'.join(given)} would be ignored; pass "
                         "either --truth or --E, --gamma and --A")
    if args.truth:
        try:
            pilot = json.load(open(args.truth))
            E, have = float(pilot["E"]), {a: (float(r["A"]), float(r["gamma"])) for a, r in pilot["arms"].items()}
            assert all(math.isfinite(v) and v > 0 for v in (E, *(v for law in have.values() for v in law)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, AssertionError):
            raise UsageError(f"{args.truth} is not a `fit.py ladders --json` output (needs E and arms with A, gamma, "
                             "all finite and > 0)")
    elif len(given) == 3:
        E, have = args.E, {args.reference_arm: (args.A, args.gamma)}
    else:
        raise UsageError("give the true curves: --truth PILOT.json (from fit.py ladders --json) or --E, --gamma and --A")
    ref = have.get(args.reference_arm)
    named = dict(args.delta_gamma or [])  # ARM=DG, and "" for a bare DG
    if ref is None or any(a and a not in arms or a == args.reference_arm for a in named) or \
            "" in named and all(a in have for a in arms):
        raise UsageError(f"--delta-gamma [ARM=]DG changes a planned arm ({', '.join(arms)}) other than the reference "
                         f"{args.reference_arm}, whose law the truth must give; a bare DG the arms the truth has no "
                         f"law for (it has: {', '.join(have)})")
    laws = {}
    for a in arms:
        dg = named.get(a, named.get("") if a not in have else None)
        if dg is None and a not in have:
            raise UsageError(f"planned arm {a!r} has no law in the truth; pass --delta-gamma DG (or {a}=DG) to model "
                             f"it as the reference arm with gamma + DG")
        laws[a] = (have.get(a, ref)[0], have[a][1] if dg is None else ref[1] + dg)
        if laws[a][1] <= 0:
            raise UsageError(f"--delta-gamma {dg:g} gives {a} a true gamma of {laws[a][1]:g}; it must stay > 0")
    return E, laws


def cmd_design(args):
    """How many depths and seeds a ladder needs, before GPU-hours are spent: simulates the planned ladders under assumed
true laws L = E + A (C/1e18)^-gamma and relative run-to-run noise (each run's ln L gets sigma z), fits each as `fit.py
ladders --noise` does, and reports per design and arm the 95 % CI half-width of gamma and of gamma - gamma_ref, the
E-known standard error, P(detect), the coverage and power of the intervals fit.py ladders prints, how often the free-E fit reads an advantage as a lower floor, and the plan's FLOPs and GPU-hours.
PLAN: train.py --dry-run JSON lines [arch, depth, total_flops] ('-' = stdin) or a CSV [arm, depth, compute_flops;
optional seeds]. True curves: --truth PILOT.json (`fit.py ladders --json`) or --E/--gamma/--A, with --delta-gamma."""
    if args.out:
        check_outputs(args.out, DESIGN_FIGURE)
    plan = plan_from_rows([row for path in args.plan for row in read_plan(path)])
    args.reference_arm = reference_arm(dict.fromkeys(a for a, _ in plan), args.reference_arm)
    E, laws = true_laws(args, dict.fromkeys(a for a, _ in plan))
    designs = {spec or "plan": apply_design(plan, spec) for spec in (args.design or [""])}
    peak = args.peak_flops or GPU_PEAK_FLOPS[args.gpu.upper()]
    results = []
    for spec, arms in designs.items():
        for a, (x, n, ds) in arms.items():
            if len(ds) < 3:
                raise UsageError(f"design {spec!r}: {a} has {len(ds)} planned depths; a fit needs >= 3")
        points = {a: (x / FIT["c_ref"], n) for a, (x, n, _) in arms.items()}
        draws = simulate(points, laws, E, args.reference_arm, args.noise, args.sims, np.random.default_rng(args.seed),
                         args.fixed_E)
        flops = float(sum((x * n).sum() for x, n, _ in arms.values()))
        results.append(dict(design=spec, runs=int(sum(n.sum() for _, n, _ in arms.values())), flops=flops,
                            gpu_hours=flops / (peak * args.mfu) / 3600,
                            depths={a: dict(zip(map(int, ds), map(int, n))) for a, (_, n, ds) in arms.items()},
                            arms=summarize(points, laws, E, args.reference_arm, args.noise, draws)))
        results[-1]["warnings"] = convergence_warnings(results[-1]["arms"])
        for w in results[-1]["warnings"]:
            note(f"warning: design {spec!r}: {w}")
    paths = design_figure(results, args.reference_arm, args.out, args.gpu) if args.out else []
    out = dict(noise=args.noise, E=E, reference_arm=args.reference_arm, fixed_E=args.fixed_E, sims=args.sims,
               seed=args.seed, gpu=args.gpu, peak_flops=peak, mfu=args.mfu, designs=results)
    if args.json:
        print(json.dumps(jsonable(out), allow_nan=False))
        return
    print("\n".join(design_table(out)))
    for p in paths:
        print(f"wrote {p}")


def design_table(out):
    """cmd_design's text: per design, the spread of the estimates, then how the analyst's intervals do."""
    from scipy import stats
    ref, pct = out["reference_arm"], f"{FIT['ci']:.0f}%"
    lines = [f"sigma = {out['noise']:g} relative (sd of ln L of one run); {out['sims']} simulated ladders per design "
             f"(asked; every number below rests on the arm's converged fits, column 'fits': converged/asked); "
             + ("E known" if out["fixed_E"] else f"E refitted on {ref} in every simulation")
             + f"; GPU-hours at {out['mfu']:.0%} MFU of {out['peak_flops']:.3g} FLOP/s ({out['gpu']})"]
    f = lambda v, key, fmt: format(v[key], fmt) if key in v else " " * len(format(0.0, fmt))
    for r in out["designs"]:
        lines += [f"\n{r['design']}: {r['runs']} runs, {r['flops']:.3e} FLOPs, {r['gpu_hours']:,.0f} GPU-hours",
                  f"  spread of the estimates ({pct} half-width) and the oracle's P(detect) (estimate beyond it):",
                  f"  {'arm':<18} {'fits':>9} {'gamma':>7} {'±CI95':>8} {'se(E known)':>11} {'dgamma':>8} {'±CI95':>8} "
                  f"{'P(detect)':>9}"]
        fits = {a: f"{v['valid']}/{v['sims']}" for a, v in r["arms"].items()}
        for a, v in r["arms"].items():
            lines.append(f"  {a:<18} {fits[a]:>9} {v['gamma_true']:7.4f} {fnum(v['gamma_ci_halfwidth'], '8.4f'):>8} "
                         f"{v['gamma_se_known_E']:11.5f} "
                         f"{f(v, 'delta_gamma_true', '+8.4f')} {f(v, 'delta_gamma_ci_halfwidth', '8.4f')} "
                         f"{f(v, 'detect_probability', '9.2f')}".rstrip())
        lines += [f"  the analyst's {pct} intervals from one ladder, as fit.py ladders prints them: estimate ± "
                  f"{stats.norm.ppf(0.5 + FIT['ci'] / 200):.2f} se"
                  + "; lower floor: the arm's own free-E fit rejects the shared E for a lower one",
                  f"  {'arm':<18} {'fits':>9} {'cover gamma':>11} {'(E fixed)':>9} {'cover dgamma':>12} {'power':>6}"
                  + f" {'lower floor':>11}"]
        for a, v in r["arms"].items():
            lines.append((f"  {a:<18} {fits[a]:>9} {fnum(v['gamma_coverage'], '11.3f'):>11} "
                          f"{fnum(v['gamma_coverage_given_E'], '9.3f'):>9} "
                          f"{f(v, 'delta_gamma_coverage', '12.3f')} {f(v, 'power', '6.2f')}"
                          + f" {f(v, 'lower_floor', '11.2f')}").rstrip())
        lines += [f"  WARNING: {w}" for w in r["warnings"]]
    return lines


def convergence_warnings(arms):
    """Arms whose simulated fits mostly failed: their numbers rest on the converged (not random) draws alone."""
    return [f"{a}: only {v['valid']} of {v['sims']} simulated fits converged (< {FIT['design_min_converged']:.0%}, "
            f"FIT['design_min_converged']); its coverage and power rest on those alone" for a, v in arms.items()
            if v["valid"] < FIT["design_min_converged"] * v["sims"]]


def design_figure(results, ref_arm, out_dir, gpu):
    """Expected CI half-width of gamma and of gamma - gamma_ref against each design's GPU-hours."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    arms = list(results[0]["arms"])
    for a in arms:
        label, color = style(a)
        for ax, key in zip(axes, ("gamma_ci_halfwidth", "delta_gamma_ci_halfwidth")):
            if key in results[0]["arms"][a]:
                pts = sorted((r["gpu_hours"], r["arms"][a][key]) for r in results)
                ax.plot(*zip(*pts), "o-", color=color, label=label)
        if a != ref_arm:
            axes[1].axhline(abs(results[0]["arms"][a]["delta_gamma_true"]), color=color, ls=":", lw=1)
    for r in results:
        for ax, key in zip(axes, ("gamma_ci_halfwidth", "delta_gamma_ci_halfwidth")):
            ys = [v[key] for v in r["arms"].values() if key in v]
            ax.annotate(r["design"], (r["gpu_hours"], max(ys)), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes[0].set(xscale="log", xlabel=f"plan GPU-hours ({gpu})", ylabel="expected 95% CI half-width of γ")
    axes[1].set(xscale="log", xlabel=f"plan GPU-hours ({gpu})", ylabel=f"expected 95% CI half-width of γ − γ_{ref_arm}",
                title="dotted: each arm's true |Δγ|")
    axes[0].legend(frameon=False, fontsize=8)
    fig.tight_layout()
    try:
        return save_figures(out_dir, dict.fromkeys(DESIGN_FIGURE, fig), dpi=150)
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------------- surface
COMPUTE_SLACK = 2.0  # measured FLOPs (attention, embeddings) stray tens of percent from 6 N D; a unit slip does not


def cmd_surface(args):
    """Chinchilla L = E + A/N^a + B/D^b and Skaling L = (A/N^a + B/D^b)^k + E fits of L(N, D) (Huber on ln L, L-BFGS-B
from a grid of starts plus basin-hopping), compute-optimal N*(C), D*(C) on C = 6 N D, and with --sparse-l the fit on
the L-shaped subset (smallest N or smallest D) scored on the rest. DATA.csv [N, D or compute (= 6 N D), loss], >= 7 rows; with
both D and compute, D is fitted and compute must lie within 2x of 6 N D."""
    c = read_csv(args.data, ["N", "loss"])
    have = [k for k in ("D", "compute") if k in c]
    if not have:
        raise UsageError(f"{args.data}: need a D or a compute column besides N and loss")
    c = read_csv(args.data, ["N", "loss", have[0]], numeric=["N", "loss", *have], positive=["N", "loss", *have],
                 key=["N", have[0]])
    N, L = c["N"], c["loss"]
    D = c["D"] if "D" in c else c["compute"] / (6 * N)
    if len(have) == 2:  # D is fitted; a compute column beside it must be the same runs' 6 N D, within COMPUTE_SLACK
        ratio = c["compute"] / (6 * N * D)
        if (bad := np.flatnonzero(np.abs(np.log(ratio)) > math.log(COMPUTE_SLACK))).size:
            i = int(bad[0])
            raise UsageError(f"{args.data}:{c['_line'][i]}: compute is {ratio[i]:.3g}x 6 N D; the fit uses D (C = 6 N "
                             f"D) and a compute column must agree within {COMPUTE_SLACK:g}x: fix its unit or drop it")
    dropped = []
    if args.drop_highest:  # e.g. Hoffmann et al. drop the 5 highest-loss runs before fitting
        order = np.argsort(-L, kind="stable")[:args.drop_highest]
        dropped = [dict(line=c["_line"][i], N=N[i], D=D[i], loss=L[i]) for i in order]
        keep = ~np.isin(np.arange(len(L)), order)
        N, D, L = N[keep], D[keep], L[keep]
    if len(L) < 7:
        raise UsageError(f"{args.data}: need >= 7 rows to fit, have {len(L)}" + (" after --drop-highest" if dropped else ""))
    forms = ["chinchilla", "skaling"] if args.form == "both" else [args.form]
    delta = {f: args.delta if args.delta is not None else FIT["surface_delta"][f] for f in forms}
    out = dict(delta=delta, dropped=dropped, forms={})
    C = 6 * N * D
    budgets = args.budgets or list(10.0 ** np.arange(math.floor(np.log10(C.min())), math.ceil(np.log10(C.max())) + 1))
    for form in forms:
        p = fit_surface(N, D, L, form, delta[form], args.hops, args.seed)
        r = dict(params=p, mape_all=mape(p, N, D, L), optimal=[compute_optimal(p, b) for b in budgets],
                 ratio_exponent=(p["alpha"] - p["beta"]) / (p["alpha"] + p["beta"]))
        if args.sparse_l:
            sub = np.isclose(N, N.min(), rtol=1e-9) | np.isclose(D, D.min(), rtol=1e-9)
            ps = fit_surface(N[sub], D[sub], L[sub], form, delta[form], args.hops, args.seed)
            r["sparse_l"] = dict(n_fit=int(sub.sum()), params=ps, mape_rest=mape(ps, N[~sub], D[~sub], L[~sub]))
        out["forms"][form] = r
    if args.json:
        print(json.dumps(jsonable(out), allow_nan=False))
        return
    print(f"{len(L)} points" + (f"; dropped the {len(dropped)} highest-loss rows (lines {', '.join(str(d['line']) for d in dropped)})" if dropped else ""))
    for form, r in out["forms"].items():
        p = r["params"]
        print(f"\n{form} (Huber delta {delta[form]:g} on ln L): E={p['E']:.4f} A={p['A']:.4g} alpha={p['alpha']:.4f} B={p['B']:.4g} beta={p['beta']:.4f} "
              f"k={p['k']:.4f}  MAPE(all)={r['mape_all']:.3f}%")
        print(f"  D*/N* ~ C^{r['ratio_exponent']:+.3f}")
        for o in r["optimal"]:
            print(f"  C={o['compute']:.3g}: N*={o['N']:.4g} D*={o['D']:.4g} D*/N*={o['ratio']:.2f} L*={o['loss']:.4f}")
        if "sparse_l" in r:
            s = r["sparse_l"]
            print(f"  L-shaped subset ({s['n_fit']} points): MAPE on the rest {s['mape_rest']:.3f}%")


# ---------------------------------------------------------------------------------------------------- sweeps
def grouped_vertices(keys, x, y, label):
    """quad_vertex of each group of rows with one key -> {key: vertex}; label(key) names a group in the notes."""
    out = {}
    for key in dict.fromkeys(keys):
        m = np.array([k == key for k in keys])
        try:
            out[key] = quad_vertex(x[m], y[m])
            if not out[key][2]:
                note(f"{label(key)}: vertex outside the swept range (extrapolated)")
        except FitError as e:
            note(f"{label(key)}: {e}; skipped")
    return out


def cmd_tpp(args):
    """Quadratic vertex of log loss vs log tokens-per-parameter per budget (App. A.4.2). DATA.csv [compute_flops, tpp,
val_loss], several tpp per budget."""
    from scipy import stats
    c = read_csv(args.data, ["compute_flops", "tpp", "val_loss"], numeric=["compute_flops", "tpp", "val_loss"],
                 positive=["compute_flops", "tpp", "val_loss"], key=["compute_flops", "tpp"])
    v = grouped_vertices(list(c["compute_flops"]), np.log(c["tpp"]), np.log(c["val_loss"]), lambda C: f"budget {C:.4g}")
    out = dict(budgets=[dict(compute=k, tpp=math.exp(xv), loss=math.exp(yv), inside=ins) for k, (xv, yv, ins) in v.items()])
    if not v:
        raise UsageError(f"{args.data}: no budget could be fitted")
    tpps = np.array([b["tpp"] for b in out["budgets"]])
    out["mean_tpp"] = float(tpps.mean())
    if len(v) >= 3:  # scale-shift test: log TPP* = a + beta log C, two-sided p of beta = 0
        reg = stats.linregress(np.log(list(v)), np.log(tpps))
        out["scale_shift"] = dict(beta=reg.slope, beta_se=reg.stderr, p_value=reg.pvalue)
    emit(args, out, [f"C={b['compute']:.4g}: TPP*={b['tpp']:.3f} loss*={b['loss']:.4f}" for b in out["budgets"]]
         + [f"mean TPP* = {out['mean_tpp']:.3f}"] + ([f"scale shift beta = {out['scale_shift']['beta']:+.4f} ± "
                                                    f"{out['scale_shift']['beta_se']:.4f} (p = {out['scale_shift']['p_value']:.3f})"]
                                                   if "scale_shift" in out else []))


def cmd_growth(args):
    """Quadratic in the post-growth fraction rho per (depth, budget) (App. A.2.3, A.4.3). DATA.csv [depth,
compute_flops, rho, val_loss], rho (the share of steps after growth) in [0, 1]."""
    c = read_csv(args.data, ["depth", "compute_flops", "rho", "val_loss"], numeric=["depth", "compute_flops", "rho", "val_loss"],
                 positive=["depth", "compute_flops", "val_loss"], fraction=["rho"],  # rho: the share of steps after growth
                 key=["depth", "compute_flops", "rho"])
    keys = [(int(d), C) for d, C in zip(c["depth"], c["compute_flops"])]
    v = grouped_vertices(keys, c["rho"], c["val_loss"], lambda k: f"d{k[0]} C={k[1]:.4g}")
    if not v:
        raise UsageError(f"{args.data}: no (depth, budget) group could be fitted")
    out = dict(groups=[dict(depth=k[0], compute=k[1], rho=xv, loss=yv, inside=ins) for k, (xv, yv, ins) in v.items()])
    out["mean_rho"] = float(np.mean([g["rho"] for g in out["groups"]]))
    out["rho"] = round(out["mean_rho"], 1)  # A.4.3: average the fitted optima and round to one decimal
    emit(args, out, [f"d{g['depth']} C={g['compute']:.4g}: rho*={g['rho']:.3f} loss*={g['loss']:.4f}" for g in out["groups"]]
         + [f"mean rho* = {out['mean_rho']:.3f} -> rho = {out['rho']:.1f}"])


def cmd_lr(args):
    """Quadratic of log loss vs log value per size, then log optimum vs log N: a hyperparameter's drift exponent
(App. A.4.4). DATA.csv [params, value, val_loss (+ hparam: several hyperparameters at once)]."""
    from scipy import stats
    c = read_csv(args.data, ["params", "value", "val_loss"], numeric=["params", "value", "val_loss"],
                 positive=["params", "value", "val_loss"], key=["hparam", "params", "value"])
    hp = c.get("hparam", ["lr"] * len(c["params"]))
    out, lines = {}, []
    for h in dict.fromkeys(hp):
        m = np.array([x == h for x in hp])
        v = grouped_vertices(list(c["params"][m]), np.log(c["value"][m]), np.log(c["val_loss"][m]),
                              lambda n: f"{h} N={n:.4g}")
        sizes = np.array(sorted(v))
        if len(sizes) < 2:
            note(f"{h}: fewer than 2 sizes with an optimum; no drift exponent")
            continue
        opt = np.array([v[s][0] for s in sizes])
        reg = stats.linregress(np.log(sizes), opt)
        out[h] = dict(optima=[dict(params=s, value=math.exp(o)) for s, o in zip(sizes, opt)], beta=reg.slope,
                      beta_se=reg.stderr if len(sizes) > 2 else np.nan,
                      anchor=dict(params=sizes[0], value=math.exp(reg.intercept + reg.slope * math.log(sizes[0]))))
        lines.append(f"{h}: optimum ∝ N^{reg.slope:+.3f} ± {fnum(out[h]['beta_se'], '.3f')}; "
                     + ", ".join(f"N={s:.3g}: {math.exp(o):.4g}" for s, o in zip(sizes, opt)))
    if not out:
        raise UsageError(f"{args.data}: no hyperparameter could be fitted")
    emit(args, out, lines)


def emit(args, out, lines):
    print(json.dumps(jsonable(out), allow_nan=False) if args.json else "\n".join(lines))


# ---------------------------------------------------------------------------------------------------- loops (Figures 2 right, 5)
LOOP_GRID_VARIED = ("passes", "passes_initial", "weight_decay")  # what the grid's runs vary beside the depth;
# its token budget (train_token_limit) is its recipe


def lower_envelope(x, y):
    """Lower convex envelope of the Pareto front (less compute, lower loss) in linear (compute, loss) space."""
    pts, best = [], np.inf
    for xi, yi in sorted(zip(x, y)):
        if yi < best:
            pts.append((xi, yi))
            best = yi
    hull = []
    for p in pts:
        while len(hull) >= 2 and (hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1]) - \
                (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) <= 0:
            hull.pop()
        hull.append(p)
    return np.array(hull)


def compute_at_loss_linear(env, target):
    """Compute where the (decreasing) envelope reaches `target`, linear in compute; NaN outside it."""
    if not len(env) or target < env[-1, 1] or target > env[0, 1]:
        return np.nan
    return float(np.interp(target, env[::-1, 1], env[::-1, 0]))


LOOP_COLUMNS = ["depth", "loops", "weight_decay", "compute_flops", "val_loss"]
LOOP_KEY = ["depth", "loops", "weight_decay"]  # one run of the grid


def loop_grid_from_runs(item):
    """The loop-grid columns from train.py runs (a runs dir or a glob of result.json), compute without attention
    as in the paper's loop_grid.csv."""
    paths = run_paths(item)
    rows, origins, runs = [], [], []
    for path in paths:
        r = read_result_json(path, ", ".join(LOOP_COLUMNS))
        if r["status"] == "complete" and "estimated_matrix_flops" in r:
            runs.append((path, r))
            p = r["plan"]
            rows.append((p["depth"], p["passes_final"], p["weight_decay"], r["estimated_matrix_flops"],
                         r["final_val_loss"]))
            origins.append(path)
            if not p.get("data_constrained"):
                raise UsageError(f"{path} is not a loop-grid run (its plan's data_constrained is "
                                 f"{p.get('data_constrained')!r}); fit.py loops reads train.py --data-constrained runs "
                                 "(bash ladder.sh operator_1 --preset data-constrained), fit.py ladders the others")
    if not rows:
        raise UsageError(f"{item}: no complete train.py runs (result.json) found")
    check_one_recipe(runs, "loop-grid runs", LOOP_GRID_VARIED, ("train_token_limit",))
    return drop_repeats({n: np.array(col, dtype=float) for n, col in zip(LOOP_COLUMNS, zip(*rows))}, LOOP_KEY,
                        LOOP_COLUMNS, origins)


def regime_optima(args, header):
    """The release's regime tables: the optimal loop count per budget (R4) of each regime (regimes.csv) or control
    (architectures.csv: architecture, family), the rows of Figures 21 and 24; for hyperparameters.csv the best
    measured multiple of each knob's centre per family and K (Figure 23b)."""
    c, _ = paper.read_table(args.data)
    if "knob" in header:
        hp = c
        out = {f"{f} {k} K={K:g}": float(hp["multiplier"][m][np.argmin(hp["loss"][m])])
               for f, k, K in dict.fromkeys(zip(hp["family"], hp["knob"], hp["loops"]))
               for m in [(np.array(hp["family"]) == f) & (np.array(hp["knob"]) == k) & (hp["loops"] == K)]}
        return emit(args, dict(best_multiplier=out), [f"{g}: best at {v:g}x the centre" for g, v in out.items()])
    names = [" ".join(g) for g in zip(*[c[k] for k in (["regime"] if "regime" in header else ["architecture", "family"])])]
    budgets = args.budgets or (paper.FINE_BUDGETS if "regime" in header else paper.BUDGETS)
    out, lines = {}, []
    for g in dict.fromkeys(names):
        ladders = paper.grid_ladders(c, np.array(names) == g)
        out[g] = []
        for C in budgets:
            Ks, losses = paper.at_budget(ladders, C)
            if len(Ks):
                k, loss, interior, _ = paper.loop_optimum(Ks, losses)
                out[g].append(dict(compute=C, best_loops=k, best_loss=loss, interior=interior))
        lines.append(f"{g}: " + ", ".join(f"C={o['compute']:.3g} K*={o['best_loops']:.2f}" + ("" if o["interior"]
                                                                                             else " (measured)")
                                          for o in out[g]))
    emit(args, dict(optima=out), lines)


def cmd_loops(args):
    """The loop grid (Figures 2 right, 5): at weight decay --wd, the loss of each loop count K at each budget
(interpolated between depths), the optimal K* from a quadratic in log K, and the compute Operator-1 (K = 1, its
weight decay tuned per depth) needs over the loop frontier."""
    header = paper.csv_header(args.data) if args.data.endswith(".csv") else set()
    if header & {"regime", "architecture", "knob"}:
        return regime_optima(args, header)
    if not args.data.endswith(".csv"):
        c = loop_grid_from_runs(args.data)
    elif "compute" in header:  # the release's weight_decay.csv (compute in EFLOP)
        c = paper.read_table(args.data)[0]
        c["compute_flops"], c["val_loss"] = c["compute"], c["loss"]
    else:
        c = read_csv(args.data, LOOP_COLUMNS, numeric=LOOP_COLUMNS,
                     positive=["depth", "loops", "compute_flops", "val_loss"], key=LOOP_KEY)
    at_wd = np.isclose(c["weight_decay"], args.wd)
    if not at_wd.any():
        raise UsageError(f"{args.data}: no rows at weight decay {args.wd:g} (have "
                         f"{', '.join(f'{w:g}' for w in sorted(set(c['weight_decay'])))}); pass one of them as --wd")
    curves = {}
    for K in sorted(set(c["loops"][at_wd])):
        m = at_wd & (c["loops"] == K)
        o = np.argsort(c["compute_flops"][m])
        curves[K] = (c["compute_flops"][m][o], c["val_loss"][m][o])
    budgets = args.budgets or list(FIT["loop_budgets"])
    out, skipped = dict(weight_decay=args.wd, budgets=[]), []
    for C in budgets:  # loss of each K at C, linear in compute between neighbouring depths, no extrapolation
        Ks = [K for K, (x, _) in curves.items() if x[0] <= C <= x[-1]]
        losses = np.array([np.interp(C, *curves[K]) for K in Ks])
        try:
            xv, yv, inside = quad_vertex(np.log(Ks), np.log(losses))
            row = dict(compute=C, best_loops=math.exp(xv), best_loss=math.exp(yv), inside=inside)
        except FitError as e:
            skipped.append(f"budget {C:.3g}: {e} ({len(Ks)} loop counts cover it); skipped")
            continue
        if 1 in Ks:
            row["gap_to_k1"] = float(losses[Ks.index(1)] - row["best_loss"])
        out["budgets"].append(row)
    if not out["budgets"]:
        raise UsageError(f"{args.data}: no budget could be fitted at weight decay {args.wd:g}: each needs >= 3 loop "
                         f"counts whose runs span it (loop counts: {', '.join(f'{K:g}' for K in curves)}; budgets: "
                         f"{', '.join(f'{C:.3g}' for C in budgets)}); pass --budgets inside the grid")
    for line in skipped:
        note(line)
    k1 = c["loops"] == 1
    op1 = []  # Operator-1 at the best weight decay per depth
    for d in sorted(set(c["depth"][k1])):
        m = k1 & (c["depth"] == d)
        i = np.argmin(c["val_loss"][m])
        wds = c["weight_decay"][m]
        edge = len(set(wds)) > 1 and wds[i] in (wds.min(), wds.max())
        op1.append((c["compute_flops"][m][i], c["val_loss"][m][i], d, wds[i], edge,
                    f"d{d:g} (WD {wds[i]:g} of {wds.min():g}..{wds.max():g})"))
    op1.sort()
    if edges := [where for *_, edge, where in op1 if edge]:
        note(f"warning: Operator-1's best weight decay is at the edge of the swept grid at {', '.join(edges)}: the "
             "tuned optimum may lie beyond the grid, which would change the gains below")
    env_wd = lower_envelope(c["compute_flops"][at_wd], c["val_loss"][at_wd])
    env_all = lower_envelope(c["compute_flops"], c["val_loss"])
    if op1:
        C_op, L_op = op1[-1][:2]
        out["operator_1_tuned"] = [dict(compute=x, loss=y, depth=d, weight_decay=wd, wd_at_grid_edge=edge)
                                   for x, y, d, wd, edge, _ in op1]
        out["gain_fixed_wd"] = C_op / compute_at_loss_linear(env_wd, L_op)
        out["gain_all_wd"] = C_op / compute_at_loss_linear(env_all, L_op)
        out["frontier_fixed_wd"] = [dict(compute=x, loss=y) for x, y in env_wd if x <= C_op]
    if args.out:
        fig2, fig5, _, _ = paper.loop_grid_figures(pyplot(), dict(c, compute=c["compute_flops"], loss=c["val_loss"]))
        written = save_figures(args.out, {f"{n}.{e}": f for n, f in (("fig02", fig2), ("fig05", fig5))
                                          for e in ("png", "pdf")}, dpi=300)
        note("wrote " + ", ".join(written))
    emit(args, out, [f"C={b['compute']:.3g}: K*={b['best_loops']:.2f} loss*={b['best_loss']:.4f}"
                     + (f" gap to K=1 {b['gap_to_k1']:.4f}" if "gap_to_k1" in b else "") for b in out["budgets"]]
         + ([f"Operator-1 (best WD per depth) last point {C_op:.3g} FLOPs, loss {L_op:.4f}: loop scaling at WD {args.wd} "
             f"needs {fnum(out['gain_fixed_wd'], '.2f')}x less compute (all-WD frontier {fnum(out['gain_all_wd'], '.2f')}x)"]
            if op1 else []))


# ---------------------------------------------------------------------------------------------------- CLI
MAX_RESAMPLES = 100_000  # bootstrap resamples, simulated ladders, basin hops: beyond this a run takes days
NOISE = number(float, 0, 1, True, True)  # relative noise: sd of ln(val_loss) of one run


def arm_delta_gamma(text):
    """--delta-gamma [ARM=]DG -> (ARM or "", DG), DG a finite number in (-1, 1)."""
    arm, _, value = text.rpartition("=")
    return arm, number(float, -1, 1, True, True)(value)


def build_parser():
    p = Parser(prog="fit.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name, func, helptext):
        s = sub.add_parser(name, help=helptext, description=func.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        s.set_defaults(func=func)
        s.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        return s
    runs_dir = lambda s, **kw: s.add_argument("--runs-dir", nargs="+", metavar="DIR", default=[], help="train.py run "
                                              "folders or folders of them (ladder.sh's RUNS_DIR)", **kw)
    reference = lambda s: s.add_argument("--reference-arm", help="the arm the others are compared with (default: "
                                         "vanilla, or the only arm)")
    resamples = number(int, 0, MAX_RESAMPLES)
    seed = number(int, 0, SEED_MAX)

    s = add("ladders", cmd_ladders, "per-arm power laws, multipliers, forecasts, figures")
    s.add_argument("inputs", nargs="*", metavar="CSV|JSON", help="ladder tables (see above)")
    runs_dir(s)
    reference(s)
    s.add_argument("--anchor-depth", type=number(int, 1), help="multipliers at the reference budgets from this depth "
                   "on; C0 = its compute (default 8, or the second depth of a shorter ladder)")
    s.add_argument("--out", help="write Figure 3 and Figure 2 (left) as PNG + PDF into this folder (default: none)")
    s.add_argument("--figure2-arms", nargs="+", metavar="ARM", help="the arms of Figure 2 (left) (default: the "
                   "paper's six that were fitted)")
    s.add_argument("--bootstrap", type=resamples, help=f"resamples for CIs (default 0, "
                   f"{FIT['default_extrapolate_boot']} with --extrapolate)")
    s.add_argument("--seed", type=seed, default=0, help="bootstrap seed")
    s.add_argument("--time", action="store_true", help="training time (s) instead of FLOPs on the x axis")
    s.add_argument("--floor-from", nargs="+", metavar="CSV|JSON", help="FLOP ladders to fit the shared floor on "
                   "(vanilla's), e.g. the release's ladders.json for its timing.json")
    s.add_argument("--refit-floor", action="store_true", help="fit the floor on the reference arm on the axis in use")
    s.add_argument("--shared-anchor", type=number(int, 1), metavar="DEPTH", help="average the equivalent runs at "
                   "this depth into one anchor shared by every arm (Figure 16a: 8)")
    s.add_argument("--extrapolate", type=positive_float, metavar="C", help="per arm at compute C: forecast loss, gain "
                   "C_ref(L_arm(C))/C (Figure 4) and pi(C), with CIs")
    s.add_argument("--holdout", nargs="+", metavar="ARM:DEPTH", help="leave these points out of the fit and print "
                   "their forecast, e.g. untied_grow:18")
    s.add_argument("--replicates", action="store_true", help="rows repeating an (arm, depth) are seed replicates")
    s.add_argument("--exclude-flagged", action="store_true", help="leave out the points whose plans carry "
                   "schedule_notes (marked * in the table)")
    s.add_argument("--noise", type=NOISE, metavar="SIGMA", help="relative run-to-run noise (sd of ln val_loss of one "
                   "run) when there are no replicates")

    s = add("runs", cmd_runs, "a table of train.py runs and where each stands")
    runs_dir(s, required=True)
    s = add("curves", cmd_curves, "training and validation curves of train.py runs")
    runs_dir(s, required=True)
    s.add_argument("--out", help="folder for curves_PRESET_X.{png,pdf} (default: the first --runs-dir's curves/)")
    s.add_argument("--x", choices=sorted(X_AXES), default="steps", help="the x axis (default: steps)")
    s.add_argument("--frontier", metavar="FIT.json", help="overlay the fitted L(C) of `fit.py ladders --json` "
                   "(needs --x flops)")
    s = add("report", cmd_report, "report.md of a run or of a ladder (its runs, fit and figures)")
    s.add_argument("--runs-dir", nargs=1, required=True, metavar="DIR", help="a run folder or a folder of runs")
    reference(s)
    s.add_argument("--bootstrap", type=resamples, default=200, help="resamples for the fit's CIs (default 200)")

    s = add("downstream", cmd_downstream, "CORE forecast (App. C.4)")
    s.add_argument("data", nargs="?", metavar="DATA", help="CSV or the release's FineWeb-Edu ladders JSON")
    runs_dir(s)
    reference(s)
    s.add_argument("--targets", type=number(float, 0, 1, True, True), nargs="+", default=list(FIT["gpt3_targets"]),
                   help="CORE scores in (0, 1) to find the compute for (GPT-3's four)")
    s.add_argument("--at", type=positive_float, nargs="*", default=[], help="compute budgets to forecast CORE at")

    s = add("design", cmd_design, "simulate planned ladders: CI widths, detection power, GPU-hours")
    s.add_argument("plan", nargs="+", help="train.py --dry-run JSON lines or CSV of planned computes ('-' = stdin)")
    s.add_argument("--noise", type=NOISE, metavar="SIGMA", required=True, help="relative run-to-run noise (sd of ln "
                   "val_loss of one run), e.g. what fit.py ladders pools from seed replicates")
    s.add_argument("--truth", metavar="PILOT.json", help="true curves: a `fit.py ladders --json` output")
    s.add_argument("--E", type=positive_float, help="true floor (with --gamma, --A: every arm's curve)")
    s.add_argument("--gamma", type=positive_float)
    s.add_argument("--A", type=positive_float, help="true A at C = 1e18 FLOPs")
    s.add_argument("--delta-gamma", type=arm_delta_gamma, action="append", metavar="[ARM=]DG", help="repeatable: ARM's "
                   "true gamma = the reference's + DG; a bare DG: every planned arm without a law in the truth")
    s.add_argument("--design", action="append", metavar="SPEC", help=f"repeatable: {DESIGN_FORMS}")
    reference(s)
    s.add_argument("--sims", type=number(int, 20, MAX_RESAMPLES), default=400, help="simulated ladders per design")
    s.add_argument("--seed", type=seed, default=0)
    s.add_argument("--fixed-E", action="store_true", help="fit gamma with the true E known (no E refit)")
    s.add_argument("--gpu", choices=["h100", "h200", "a100", "b200"], default="h100", help="peak bf16 FLOP/s for "
                   "GPU-hours")
    s.add_argument("--peak-flops", type=positive_float, help="overrides --gpu's peak")
    s.add_argument("--mfu", type=number(float, 0, 1, open_lo=True), default=0.4, help="model FLOPs utilisation (0.4)")
    s.add_argument("--out", help="write design_ci_vs_compute.{png,pdf} into this folder (default: none)")

    s = add("surface", cmd_surface, "Chinchilla / Skaling L(N, D) fits")
    s.add_argument("data")
    s.add_argument("--form", choices=["chinchilla", "skaling", "both"], default="both")
    s.add_argument("--delta", type=positive_float, help="Huber delta on ln L (default per form: "
                   f"{FIT['surface_delta']['chinchilla']:g} Chinchilla, {FIT['surface_delta']['skaling']:g} Skaling)")
    s.add_argument("--drop-highest", type=number(int, 0), default=0, metavar="N",
                   help="drop the N highest-loss rows before fitting (Hoffmann et al. drop 5)")
    s.add_argument("--hops", type=resamples, default=100, help="basin-hopping iterations")
    s.add_argument("--sparse-l", action="store_true", help="also fit on the L-shaped subset (min N or min D)")
    s.add_argument("--budgets", type=positive_float, nargs="+", help="compute budgets for N*(C), D*(C)")
    s.add_argument("--seed", type=seed, default=0)
    for name, func, helptext in (("tpp", cmd_tpp, "optimal tokens per parameter"),
                                 ("growth", cmd_growth, "optimal growth fraction"),
                                 ("lr", cmd_lr, "hyperparameter drift exponent")):
        add(name, func, helptext).add_argument("data")

    s = add("paper", paper.cmd_paper, "every paper figure from the authors' released measurements, with a manifest")
    s.add_argument("release", help="the release folder as reference/ holds it; every figure its files support is "
                   "written with paper_manifest.json and the gallery README.md, the others listed with the reason")
    s.add_argument("--out", default="figures/paper", help="figures, manifest and gallery (default: figures/paper)")
    s = add("loops", cmd_loops, "optimal loop count and frontiers")
    s.add_argument("data", help="GRID.csv [depth, loops, weight_decay, compute_flops, val_loss] (compute without "
                   "attention, as the release's loop_grid.csv), the release's regimes.csv, architectures.csv (optimal K "
                   "per regime / control) or hyperparameters.csv, or train.py --data-constrained runs (a runs dir or "
                   "a glob of result.json)")
    s.add_argument("--wd", type=number(float, 0), default=0.8, help="the weight decay of the loop curves (default "
                   "%(default)s)")
    s.add_argument("--budgets", type=positive_float, nargs="+", help="compute budgets (FLOPs); default: the "
                   "release's five, " + ", ".join(f"{b:.6e}" for b in FIT["loop_budgets"]))
    s.add_argument("--out", help="draw Figures 2 (right) and 5 of the loop grid into this folder (default: none)")
    return p


def run(argv):
    args = build_parser().parse_args(argv)
    args.func(args)


def main(argv=None):
    return cli_main(run, "fit.py", argv)


if __name__ == "__main__":
    exit_process(main())
