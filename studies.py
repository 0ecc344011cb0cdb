"""studies.py — the fits besides the ladders, one section each (run through fit.py):

  design PLAN     how many depths and seeds a ladder needs, before GPU-hours are spent: simulates planned ladders under
                  assumed true laws L = E + A (C/1e18)^-gamma and a relative run-to-run noise sigma (each run's ln L gets
                  sigma z), fits every simulated ladder as `fit.py ladders --noise` does (laws.fit_ladders, and with
                  --bootstrap its bootstrap), and reports per design the spread of each arm's gamma and delta-gamma
                  vs the reference arm (the 95 % CI half-width a design buys), the coverage and power of the
                  intervals fit.py ladders prints from one ladder, and the plan's FLOPs and GPU-hours; --out plots the
                  half-widths against GPU-hours.
  surface DATA    the Chinchilla L = E + A/N^a + B/D^b and Skaling L = (A/N^a + B/D^b)^k + E fits of L(N, D) (Huber on
                  ln L, L-BFGS-B from a grid of starts plus basin-hopping), cross-validated by regime (large N and/or
                  large D held out), compute-optimal N*(C), D*(C) on C = 6 N D, and the fit on the L-shaped subset.
  tpp | growth | lr | loops DATA   the optimum of a swept recipe knob, read off a quadratic's vertex (arXiv
                  2609.19107 App. A.2.3, A.4): tokens per parameter per budget, the growth fraction rho per (depth,
                  budget), a hyperparameter's optimum vs model size (its drift exponent), and the loop count per budget
                  with the loop-vs-size frontiers (Figure 2 right, Figure 5).

  python train.py --arch vanilla --depth 6 8 10 12 14 16 18 20 22 --dry-run > plan.jsonl   # and the other arms
  python fit.py ladders reference/fineweb_ladders.csv --json > pilot.json
  python fit.py design plan.jsonl --truth pilot.json --noise 0.002 --design d6-18 --design "d6-18 x3@top2"
  python fit.py surface grid.csv --form both --sparse-l
  python fit.py loops loop_grid.csv --wd 0.8
"""
import json, math, os, re, sys

import numpy as np
from scipy import optimize, stats

from arms import GPU_PEAK_FLOPS
from common import UsageError
import paper
from laws import (FIT, LOOP_GRID_VARIED, FitError, bootstrap_ladders, check_one_recipe, check_outputs,
                  drop_repeats, fit_ladders, fnum, jsonable, note, pyplot, read_csv, read_result_json, run_paths,
                  save_figures, style)

# ---------------------------------------------------------------------------------------------------- design
DESIGN_FIGURE = ("design_ci_vs_compute.png", "design_ci_vs_compute.pdf")
DESIGN_FORMS = "'d6-18' (depths 6..18), 'x3' (3 seeds everywhere), 'x3@top2' (at each arm's 2 largest depths), " \
               "'x3@16,18' (at those depths), combined as 'd6-18 x3@top2'"
MAX_SEEDS = 100  # seeds per planned point in a design spec


def read_plan(path):
    """Planned runs -> [(arm, depth, compute_flops, seeds, origin)] from a CSV [arm, depth, compute_flops (+ seeds)] or
    train.py --dry-run JSON lines [arch, depth, total_flops] ('-' = stdin)."""
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
    """{(arm, depth): (compute_flops, seeds)}. A run planned twice (in one plan or across plans) is kept once with a
    warning when both rows agree, and is an error naming both rows when they differ, as `fit.py ladders` treats
    repeated results."""
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
    """A --design spec -> (lo, hi, seeds, where) with where None (every depth), ('top', K) or a set of depths; a token
    that is not one of DESIGN_FORMS, or that names a depth no run plans, is refused quoting the token."""
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
    """A design spec ('' = the plan as given) on the plan -> {arm: (x, n, depths)}: 'dLO-HI' keeps depths LO..HI of
    every arm (clipped to what it plans), 'xS' gives S seeds to every point, 'xS@topK' to each arm's K largest depths,
    'xS@16,18' to those."""
    lo, hi, seeds, where = parse_design(spec, {d for _, d in plan})
    out = {}
    for arm in dict.fromkeys(a for a, _ in plan):
        ds = sorted(d for a, d in plan if a == arm and (lo is None or lo <= d <= hi))
        extra = set(ds) if where is None else set(ds[-where[1]:]) if isinstance(where, tuple) else where
        n = [seeds if seeds and d in extra else plan[(arm, d)][1] for d in ds]
        out[arm] = (np.array([plan[(arm, d)][0] for d in ds]), np.array(n), ds)
    return out


def analytic_gamma_se(x, n, E, A, gamma, sigma):
    """Standard error of gamma from the weighted linear fit of ln(L - E) on ln x with E known, to first order in
    sigma: var ln(L_i - E) = (sigma L_i / (L_i - E))^2 / n_i, x in c_ref units."""
    L = E + A * x ** -gamma
    w = n * ((L - E) / (sigma * L)) ** 2
    lx = np.log(x)
    return 1 / math.sqrt(w @ (lx - (w @ lx) / w.sum()) ** 2)


DRAWS = ("gamma", "gamma_se", "gamma_se_given_E", "delta_gamma", "delta_gamma_se", "lower_floor", "gamma_lo",
         "gamma_hi", "delta_gamma_lo", "delta_gamma_hi")  # per arm and simulated ladder; *_lo/hi: bootstrap CIs


def simulate(points, laws, E, ref_arm, sigma, sims, rng, fixed_E=False, bootstrap=0):
    """What `fit.py ladders --noise SIGMA [--bootstrap B]` reports on each of `sims` simulated ladders -> {arm: {key:
    (sims,) array}} for the keys in DRAWS (NaN where a fit fails). points: {arm: (x, n)} with x in c_ref units and n
    seeds per point; laws: {arm: (A, gamma)}. Each simulated run has ln L = ln(E + A x^-gamma) + sigma z, a point is
    the mean of its n runs, and the ladder goes through laws.fit_ladders (E refitted on ref_arm unless fixed_E) and,
    with bootstrap > 0, laws.bootstrap_ladders' parametric bootstrap, exactly as fit.py ladders runs them.
    lower_floor is 1 where the arm's own free-E fit rejects the shared floor in favour of a lower one (NaN with E
    known: no free-E fits)."""
    out = {a: {k: np.full(sims, np.nan) for k in DRAWS} for a in points}
    for s in range(sims):
        data = {}
        for a, (x, n) in points.items():
            A, g = laws[a]
            z = rng.standard_normal((len(x), int(n.max())))
            runs = (E + A * x ** -g)[:, None] * np.exp(sigma * z)
            loss = np.array([runs[i, :k].mean() for i, k in enumerate(n)])
            data[a] = dict(x=x, loss=loss, n=n, depth=np.arange(1, len(x) + 1))  # depth only picks multiplier budgets
        try:
            fit = fit_ladders(data, ref_arm, 1.0, 1, sigma, E if fixed_E else None)
        except UsageError:  # the reference arm's free-E fit failed on this draw
            continue
        if bootstrap:
            bootstrap_ladders(data, fit, bootstrap, int(rng.integers(2 ** 63)), noise=(sigma, 0))
        for a, r in fit["arms"].items():
            lower = np.nan if r.get("free_disagrees") is None else float(r["free_disagrees"] and r["free_E"] < fit["E"])
            values = dict(r, lower_floor=lower, gamma_lo=r.get("gamma_ci", [np.nan])[0],
                          gamma_hi=r.get("gamma_ci", [np.nan, np.nan])[1],
                          delta_gamma_lo=r.get("delta_gamma_ci", [np.nan])[0],
                          delta_gamma_hi=r.get("delta_gamma_ci", [np.nan, np.nan])[1])
            for k in DRAWS:
                out[a][k][s] = values[k]
    return out


def summarize(points, laws, E, ref_arm, sigma, draws):
    """Per arm, over the simulated ladders: the spread of the estimates (the CI half-width an oracle would quote:
    half the central 95 % range), the E-known analytic standard error, and how the analyst's 95 % intervals of one
    ladder do: coverage (how often gamma +- z se, or the bootstrap CI, contains the true value), power (how often the
    delta-gamma interval excludes 0 on the true side) and how often the arm's own free-E fit reads its difference as
    a lower floor. detect_probability is the oracle's power: the share of estimates beyond the spread's half-width."""
    z = stats.norm.ppf(0.5 + FIT["ci"] / 200)
    q = lambda v: (np.nanpercentile(v, 100 - (100 - FIT["ci"]) / 2) - np.nanpercentile(v, (100 - FIT["ci"]) / 2)) / 2
    arms = {}
    for a, (x, n) in points.items():
        d, g_true = draws[a], laws[a][1]
        ok = np.isfinite(d["gamma"])
        share = lambda hit: float(np.mean(hit[ok])) if ok.any() else np.nan
        booted = np.isfinite(d["gamma_lo"][ok]).any()
        r = dict(gamma_true=g_true, gamma_ci_halfwidth=q(d["gamma"]), valid=int(ok.sum()), sims=len(ok),
                 gamma_se_known_E=analytic_gamma_se(x, n, E, *laws[a], sigma),
                 gamma_coverage=share(np.abs(d["gamma"] - g_true) <= z * d["gamma_se"]),
                 gamma_coverage_given_E=share(np.abs(d["gamma"] - g_true) <= z * d["gamma_se_given_E"]))
        if booted:
            r["gamma_coverage_bootstrap"] = share((d["gamma_lo"] <= g_true) & (g_true <= d["gamma_hi"]))
        if a != ref_arm:
            true, dg, side = g_true - laws[ref_arm][1], d["delta_gamma"], 1 if g_true >= laws[ref_arm][1] else -1
            h = q(dg)
            r.update(delta_gamma_true=true, delta_gamma_ci_halfwidth=h, delta_gamma_mean=float(np.mean(dg[ok])),
                     detect_probability=share(dg * side > h),
                     delta_gamma_coverage=share(np.abs(dg - true) <= z * d["delta_gamma_se"]),
                     power=share(dg * side - z * d["delta_gamma_se"] > 0),
                     lower_floor=float(np.nanmean(d["lower_floor"])) if np.isfinite(d["lower_floor"]).any() else np.nan)
            if booted:
                lo, hi = d["delta_gamma_lo"], d["delta_gamma_hi"]
                r.update(delta_gamma_coverage_bootstrap=share((lo <= true) & (true <= hi)),
                         power_bootstrap=share(lo > 0 if side > 0 else hi < 0))
        arms[a] = r
    return arms


def true_laws(args, arms):
    """{arm: (A, gamma)} and E from --truth PILOT.json (a `fit.py ladders --json` output) or --E/--gamma/--A."""
    given = [f"--{k}" for k in ("E", "gamma", "A") if getattr(args, k) is not None]
    if args.truth and given:
        raise UsageError(f"--truth {args.truth} gives the true curves and {'/'.join(given)} would be ignored; pass "
                         "either --truth or --E, --gamma and --A")
    if args.truth:
        try:
            with open(args.truth) as f:
                pilot = json.load(f)
            E, have = float(pilot["E"]), {a: (float(r["A"]), float(r["gamma"])) for a, r in pilot["arms"].items()}
            assert all(math.isfinite(v) and v > 0 for v in (E, *(v for law in have.values() for v in law)))
        except OSError as e:
            raise UsageError(f"cannot read {args.truth}: {e.strerror}")
        except (ValueError, KeyError, TypeError, AttributeError, AssertionError):
            raise UsageError(f"{args.truth} is not a `fit.py ladders --json` output (needs E and arms with A, gamma, "
                             "all finite and > 0)")
    elif None not in (args.E, args.gamma, args.A):
        E, have = args.E, {args.reference_arm: (args.A, args.gamma)}
    else:
        raise UsageError("give the true curves: --truth PILOT.json (from fit.py ladders --json) or --E, --gamma and --A")
    if args.reference_arm not in have:
        raise UsageError(f"reference arm {args.reference_arm!r} has no law in the truth (arms: {', '.join(have)})")
    named = dict(args.delta_gamma or [])  # ARM=DG, and "" for a bare DG: the arms without a law in the truth
    unplanned = [a for a in named if a and a not in arms]
    if unplanned:
        raise UsageError(f"--delta-gamma {unplanned[0]}={named[unplanned[0]]:g} names an arm the plan does not run "
                         f"(planned: {', '.join(arms)})")
    if args.reference_arm in named:
        raise UsageError(f"--delta-gamma {args.reference_arm}=... names the reference arm, whose gamma the others' "
                         "are relative to; name the other arms")
    lawless = [a for a in arms if a not in have and a not in named]
    if "" in named and not lawless:
        raise UsageError(f"--delta-gamma {named['']:g} applies to the planned arms without a law in the truth, and "
                         "every planned arm has one; name the arm it should change: --delta-gamma ARM=DG")
    laws = {}
    for a in arms:
        dg = named.get(a, named.get("") if a not in have else None)
        if a not in have and dg is None:
            raise UsageError(f"planned arm {a!r} has no law in the truth; pass --delta-gamma DG (or {a}=DG) to model "
                             f"it as the reference arm with gamma + DG")
        A = have.get(a, have[args.reference_arm])[0]
        laws[a] = (A, have[a][1] if dg is None else have[args.reference_arm][1] + dg)
        if laws[a][1] <= 0:
            raise UsageError(f"--delta-gamma {dg:g} gives {a} a true gamma of {laws[a][1]:g}; it must stay > 0")
    return E, laws


def cmd_design(args):
    if args.noise is None:
        raise UsageError("--noise SIGMA is required: the relative run-to-run noise (sd of ln val_loss of one run), "
                         "e.g. the sigma fit.py ladders pools from seed replicates")
    if args.out:
        check_outputs(args.out, DESIGN_FIGURE)
    plan = plan_from_rows([row for path in args.plan for row in read_plan(path)])
    E, laws = true_laws(args, dict.fromkeys(a for a, _ in plan))
    designs = {spec or "plan": apply_design(plan, spec) for spec in (args.design or [""])}
    if args.reference_arm not in next(iter(designs.values())):
        raise UsageError(f"reference arm {args.reference_arm!r} is not in the plan")
    peak = args.peak_flops or GPU_PEAK_FLOPS[args.gpu.upper()]
    results = []
    for spec, arms in designs.items():
        for a, (x, n, ds) in arms.items():
            if len(ds) < 3:
                raise UsageError(f"design {spec!r}: {a} has {len(ds)} planned depths; a fit needs >= 3")
        points = {a: (x / FIT["c_ref"], n) for a, (x, n, _) in arms.items()}
        draws = simulate(points, laws, E, args.reference_arm, args.noise, args.sims, np.random.default_rng(args.seed),
                         args.fixed_E, args.bootstrap)
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
               bootstrap=args.bootstrap, seed=args.seed, gpu=args.gpu, peak_flops=peak, mfu=args.mfu, designs=results)
    if args.json:
        print(json.dumps(jsonable(out), allow_nan=False))
        return
    print("\n".join(design_table(out)))
    for p in paths:
        print(f"wrote {p}")


def design_table(out):
    """cmd_design's text: per design, the spread of the estimates, then how the analyst's intervals do."""
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
        boot = out["bootstrap"] > 0
        lines += [f"  the analyst's {pct} intervals from one ladder, as fit.py ladders prints them: estimate ± "
                  f"{stats.norm.ppf(0.5 + FIT['ci'] / 200):.2f} se" + (f" and the {out['bootstrap']}-resample "
                                                                        "bootstrap" if boot else "")
                  + "; lower floor: the arm's own free-E fit rejects the shared E for a lower one",
                  f"  {'arm':<18} {'fits':>9} {'cover gamma':>11} {'(E fixed)':>9} {'cover dgamma':>12} {'power':>6}"
                  + (f" {'boot: gamma':>11} {'dgamma':>7} {'power':>6}" if boot else "") + f" {'lower floor':>11}"]
        for a, v in r["arms"].items():
            lines.append((f"  {a:<18} {fits[a]:>9} {fnum(v['gamma_coverage'], '11.3f'):>11} "
                          f"{fnum(v['gamma_coverage_given_E'], '9.3f'):>9} "
                          f"{f(v, 'delta_gamma_coverage', '12.3f')} {f(v, 'power', '6.2f')}"
                          + (f" {v['gamma_coverage_bootstrap']:11.3f} {f(v, 'delta_gamma_coverage_bootstrap', '7.3f')} "
                             f"{f(v, 'power_bootstrap', '6.2f')}" if boot else "")
                          + f" {f(v, 'lower_floor', '11.2f')}").rstrip())
        lines += [f"  WARNING: {w}" for w in r["warnings"]]
    return lines


def convergence_warnings(arms):
    """One line per arm whose simulated fits converged in fewer than FIT["design_min_converged"] of the ladders: its
    numbers are over the converged ones only, which are not a random sample of the ladders (a noisy draw fails
    more often), so its coverage and power can be far from what one real ladder gets."""
    return [f"{a}: only {v['valid']} of {v['sims']} simulated fits converged (< {FIT['design_min_converged']:.0%}, "
            f"FIT['design_min_converged']); its numbers rest on those {v['valid']} alone, which are not a random "
            "sample of the ladders (the failed draws are not random): its coverage and power may not be one ladder's" for a, v in arms.items()
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
# Surface-fit bounds (a = ln A, b = ln B, e = ln E): generous enough for N, D in raw counts, tight enough for L-BFGS-B.
SURFACE_BOUNDS = dict(a=(-10, 50), b=(-10, 50), alpha=(0.01, 2.0), beta=(0.01, 2.0), e=(-10, 3), k=(0.05, 5.0))


def surface_objective(theta, lnN, lnD, logL, delta, skaling):
    """Huber(delta) of ln L_hat - ln L and its gradient; theta = (a, b, alpha, beta, e[, k]) with A, B, E in logs."""
    a, b, al, be, e = theta[:5]
    k = theta[5] if skaling else 1.0
    u1, u2 = a - al * lnN, b - be * lnD
    s = np.logaddexp(u1, u2)  # ln(A/N^alpha + B/D^beta)
    pred = np.logaddexp(k * s, e)
    p = np.exp(k * s - pred)  # share of the reducible term in L_hat
    w1 = np.exp(u1 - s)
    r = pred - logL
    h = np.where(np.abs(r) <= delta, 0.5 * r ** 2, delta * (np.abs(r) - 0.5 * delta))
    dr = np.clip(r, -delta, delta)
    ds = dr * p * k
    grad = [ds @ w1, ds @ (1 - w1), -(ds * w1) @ lnN, -(ds * (1 - w1)) @ lnD, dr @ (1 - p)]
    if skaling:
        grad.append((dr * p) @ s)
    return h.sum() / delta ** 2, np.array(grad) / delta ** 2  # /delta^2: O(1) values so L-BFGS-B's tolerances bite


def surface_predict(params, N, D):
    return (params["A"] / N ** params["alpha"] + params["B"] / D ** params["beta"]) ** params.get("k", 1.0) + params["E"]


def fit_surface(N, D, L, form, delta, hops, seed):
    """L-BFGS-B from a grid of starts, then basin-hopping from the best start."""
    skaling = form == "skaling"
    names = ["a", "b", "alpha", "beta", "e"] + (["k"] if skaling else [])
    bounds = [SURFACE_BOUNDS[n] for n in names]
    lnN, lnD, logL = np.log(N), np.log(D), np.log(L)
    fun = lambda th: surface_objective(th, lnN, lnD, logL, delta, skaling)
    local = dict(method="L-BFGS-B", jac=True, bounds=bounds)  # grid starts and hops: default tolerances
    best = None
    for al in (0.1, 0.3, 0.6):
        for be in (0.1, 0.3, 0.6):
            for E0 in (0.5 * L.min(), 0.9 * L.min()):
                for k in ((0.5, 1.0) if skaling else (1.0,)):
                    half = (np.median(L) - E0) ** (1 / k) / 2  # each inner term's share at the grid's median (N, D)
                    x0 = [math.log(half) + al * np.median(lnN), math.log(half) + be * np.median(lnD), al, be,
                          math.log(E0)] + ([k] if skaling else [])
                    res = optimize.minimize(fun, np.clip(x0, *np.array(bounds).T), **local)
                    if best is None or res.fun < best.fun:
                        best = res
    if hops:
        res = optimize.basinhopping(fun, best.x, niter=hops, rng=np.random.default_rng(seed),
                                    minimizer_kwargs=local)
        best = res if res.fun < best.fun else best
    best = optimize.minimize(fun, best.x, **local, options=dict(ftol=1e-15, gtol=1e-9, maxiter=10000))  # polish
    th = dict(zip(names, best.x))
    return dict(A=math.exp(th["a"]), B=math.exp(th["b"]), alpha=th["alpha"], beta=th["beta"], E=math.exp(th["e"]),
                k=th.get("k", 1.0), objective=float(best.fun))


def compute_optimal(p, C):
    """Closed form on C = 6 N D (the outer power k does not move the minimum): N* = G (C/6)^(b/(a+b))."""
    a, b = p["alpha"], p["beta"]
    G = (a * p["A"] / (b * p["B"])) ** (1 / (a + b))
    N = G * (C / 6) ** (b / (a + b))
    D = C / 6 / N
    return dict(compute=C, N=N, D=D, ratio=D / N, loss=float(surface_predict(p, N, D)))


def mape(p, N, D, L):
    return float(100 * np.mean(np.abs(surface_predict(p, N, D) - L) / L)) if len(L) else np.nan


def split_regimes(N, D, frac):
    """Regimes of the (N, D) grid: the largest ceil(frac * #distinct N) N values are 'large N', same for D.
    interpolation = neither large (the only points ever fitted in CV), extrapolate_N = large N only,
    extrapolate_D = large D only, far = both large."""
    def large(v):
        v = np.round(np.log(v), 9)  # D = C / 6N carries rounding noise
        u = np.unique(v)
        return v > u[-max(1, math.ceil(frac * len(u))) - 1] if len(u) > 1 else np.zeros(len(v), bool)
    bn, bd = large(N), large(D)
    return dict(interpolation=~bn & ~bd, extrapolate_N=bn & ~bd, extrapolate_D=~bn & bd, far=bn & bd)


COMPUTE_SLACK = 2.0  # measured FLOPs (attention, embeddings) stray tens of percent from 6 N D; a unit slip does not


def cmd_surface(args):
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
    regimes = split_regimes(N, D, args.holdout)
    if args.folds > regimes["interpolation"].sum():
        raise UsageError(f"--folds {args.folds}: {args.data} has {regimes['interpolation'].sum()} interpolation points "
                         f"(--holdout {args.holdout:g}); pass --folds <= that or a smaller --holdout")
    out = dict(delta=delta, dropped=dropped, regimes={k: int(v.sum()) for k, v in regimes.items()}, forms={})
    C = 6 * N * D
    budgets = args.budgets or list(10.0 ** np.arange(math.floor(np.log10(C.min())), math.ceil(np.log10(C.max())) + 1))
    folds = np.array_split(np.random.default_rng(args.seed).permutation(np.flatnonzero(regimes["interpolation"])),
                           args.folds)
    for form in forms:
        p = fit_surface(N, D, L, form, delta[form], args.hops, args.seed)
        r = dict(params=p, mape_all=mape(p, N, D, L), optimal=[compute_optimal(p, b) for b in budgets],
                 ratio_exponent=(p["alpha"] - p["beta"]) / (p["alpha"] + p["beta"]))
        cv = {k: [] for k in regimes}
        for fold in folds:
            train = regimes["interpolation"].copy()
            train[fold] = False
            pf = fit_surface(N[train], D[train], L[train], form, delta[form], args.hops, args.seed)
            for k, m in regimes.items():
                m = m.copy() if k != "interpolation" else np.isin(np.arange(len(L)), fold)
                cv[k].append(mape(pf, N[m], D[m], L[m]))
        r["cv_mape"] = {k: dict(mean=float(np.mean(v)), std=float(np.std(v))) for k, v in cv.items()}
        if args.sparse_l:
            sub = np.isclose(N, N.min(), rtol=1e-9) | np.isclose(D, D.min(), rtol=1e-9)
            ps = fit_surface(N[sub], D[sub], L[sub], form, delta[form], args.hops, args.seed)
            r["sparse_l"] = dict(n_fit=int(sub.sum()), params=ps, mape_rest=mape(ps, N[~sub], D[~sub], L[~sub]),
                                 mape_far_rest=mape(ps, N[~sub & regimes["far"]], D[~sub & regimes["far"]],
                                                    L[~sub & regimes["far"]]))
        out["forms"][form] = r
    if args.json:
        print(json.dumps(jsonable(out), allow_nan=False))
        return
    print(f"regimes (largest {args.holdout:.0%} of distinct N / D held out): {out['regimes']}; "
          f"{args.folds}-fold CV over the interpolation points"
          + (f"; dropped the {len(dropped)} highest-loss rows (lines {', '.join(str(d['line']) for d in dropped)})" if dropped else ""))
    for form, r in out["forms"].items():
        p = r["params"]
        print(f"\n{form} (Huber delta {delta[form]:g} on ln L): E={p['E']:.4f} A={p['A']:.4g} alpha={p['alpha']:.4f} B={p['B']:.4g} beta={p['beta']:.4f} "
              f"k={p['k']:.4f}  MAPE(all)={r['mape_all']:.3f}%")
        print("  CV MAPE %: " + ", ".join(f"{k} {v['mean']:.3f}±{v['std']:.3f}" for k, v in r["cv_mape"].items()))
        print(f"  D*/N* ~ C^{r['ratio_exponent']:+.3f}")
        for o in r["optimal"]:
            print(f"  C={o['compute']:.3g}: N*={o['N']:.4g} D*={o['D']:.4g} D*/N*={o['ratio']:.2f} L*={o['loss']:.4f}")
        if "sparse_l" in r:
            s = r["sparse_l"]
            print(f"  L-shaped subset ({s['n_fit']} points): MAPE rest {s['mape_rest']:.3f}%, far {fnum(s['mape_far_rest'], '.3f')}%")


# ---------------------------------------------------------------------------------------------------- sweeps
def quad_vertex(x, y):
    """Vertex of a least-squares quadratic y(x) -> (x*, y*, inside the measured range?)."""
    if len(np.unique(x)) < 3:
        raise FitError(f"fewer than 3 distinct points ({len(np.unique(x))})")
    c2, c1, c0 = np.polyfit(x, y, 2)
    if c2 <= 0:
        raise FitError("no interior minimum (curvature <= 0)")
    xv = -c1 / (2 * c2)
    return xv, c0 - c1 ** 2 / (4 * c2), bool(x.min() <= xv <= x.max())


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
            try:
                p = r["plan"]
                rows.append(tuple(float(v) for v in (p["depth"], p["passes_final"], p["weight_decay"],
                                                     r["estimated_matrix_flops"], r["final_val_loss"])))
                origins.append(path)
            except (KeyError, TypeError, ValueError):
                raise UsageError(f"{path}: a complete run needs plan.depth, plan.passes_final, plan.weight_decay, "
                                 "estimated_matrix_flops and final_val_loss")
            if not p.get("data_constrained"):
                raise UsageError(f"{path} is not a loop-grid run (its plan's data_constrained is "
                                 f"{p.get('data_constrained')!r}); fit.py loops reads train.py --data-constrained runs "
                                 "(bash ladder.sh operator_1 --preset data-constrained), fit.py ladders the others")
    if not rows:
        raise UsageError(f"{item}: no complete train.py runs (result.json) found")
    check_one_recipe(runs, LOOP_GRID_VARIED, "loop-grid runs")
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


def emit(args, out, lines):
    print(json.dumps(jsonable(out), allow_nan=False) if args.json else "\n".join(lines))
