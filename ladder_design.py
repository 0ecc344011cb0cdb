"""ladder_design.py — `python fit.py design`: how many depths and seeds a ladder needs, before GPU-hours are spent.

Simulates planned ladders many times under assumed true laws L = E + A (C/1e18)^-gamma and a relative run-to-run
noise sigma (each run's ln L gets sigma z), fits every simulated ladder as `fit.py ladders` does with that noise
known (E on the reference arm, weighted shared-E regressions), and reports per design the expected 95 % CI
half-width of each arm's gamma and of delta-gamma vs the reference arm, the probability that the interval excludes 0,
and the plan's FLOPs and GPU-hours.

  python train.py --arch vanilla --depth 6 8 10 12 14 16 18 20 22 --dry-run > plan.jsonl   # and the other arms
  python fit.py ladders reference/fineweb_ladders.csv --json > pilot.json
  python fit.py design plan.jsonl --truth pilot.json --noise 0.002 --design d6-18 --design "d6-18 x3@top2"
"""
import json, math, re, sys

import numpy as np

import fit
from arms import GPU_PEAK_FLOPS
from fit import FIT, UsageError, FitError

DESIGN_SPEC = re.compile(r"^(?:d(\d+)-(\d+))?\s*(?:x(\d+)(?:@(top\d+|[\d,]+))?)?$")


def read_plan(path):
    """Planned runs -> {(arm, depth): (compute_flops, seeds)} from a CSV [arm, depth, compute_flops (+ seeds)] or
    train.py --dry-run JSON lines [arch, depth, total_flops] ('-' = stdin)."""
    if path.endswith(".csv"):
        c = fit.read_csv(path, ["arm", "depth", "compute_flops"], numeric=["depth", "compute_flops", "seeds"],
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
            except (ValueError, KeyError, TypeError):
                raise UsageError(f"{path}:{i}: not a train.py --dry-run plan (a JSON object with arch, depth, "
                                 "total_flops per line); or pass a CSV [arm, depth, compute_flops]")
    plan = {}
    for arm, d, x, seeds, origin in rows:
        if d != int(d) or seeds != int(seeds) or not (math.isfinite(x) and x > 0):
            raise UsageError(f"{origin}: depth and seeds must be whole numbers and compute a finite number > 0")
        if (arm, int(d)) in plan:
            raise UsageError(f"{origin}: {arm} d{int(d)} is planned twice; list each (arm, depth) once")
        plan[(arm, int(d))] = (x, int(seeds))
    if not plan:
        raise UsageError(f"{path}: no planned runs")
    return plan


def apply_design(plan, spec):
    """A design spec on the plan -> {arm: (x, n, depths)}. Spec ('' = the plan as given): 'dLO-HI' keeps depths LO..HI of every arm (clipped to what
    it plans), 'xS' gives S seeds to every point, 'xS@topK' to each arm's K largest depths, 'xS@16,18' to those."""
    m = DESIGN_SPEC.match(spec.strip())
    if not m:
        raise UsageError(f"--design {spec!r}: use 'd6-18', 'd6-22', 'd6-18 x3@top2', 'd6-18 x3@16,18' or 'x3'")
    lo, hi, seeds, where = m.groups()
    depths = {d for _, d in plan}
    for end in (lo, hi):
        if end is not None and int(end) not in depths:
            raise UsageError(f"--design {spec!r}: no planned run has depth {end}; add it to the plan "
                             f"(e.g. train.py --dry-run --depth ... {end})")
    out = {}
    for arm in dict.fromkeys(a for a, _ in plan):
        ds = sorted(d for a, d in plan if a == arm and (lo is None or int(lo) <= d <= int(hi)))
        extra = set(ds) if where is None else set(ds[-int(where[3:]):]) if where.startswith("top") else \
            {int(v) for v in where.split(",") if v}
        n = [int(seeds) if seeds and d in extra else plan[(arm, d)][1] for d in ds]
        out[arm] = (np.array([plan[(arm, d)][0] for d in ds]), np.array(n), ds)
    return out


def analytic_gamma_se(x, n, E, A, gamma, sigma):
    """Standard error of gamma from the weighted linear fit of ln(L - E) on ln x with E known, to first order in
    sigma: var ln(L_i - E) = (sigma L_i / (L_i - E))^2 / n_i, x in c_ref units."""
    L = E + A * x ** -gamma
    w = n * ((L - E) / (sigma * L)) ** 2
    lx = np.log(x)
    return 1 / math.sqrt(w @ (lx - (w @ lx) / w.sum()) ** 2)


def simulate(points, laws, E, ref_arm, sigma, sims, rng, fixed_E=False):
    """gamma estimates {arm: (sims,)} (NaN where a fit fails) of `sims` simulated ladders. points: {arm: (x, n)} with x
    in c_ref units and n seeds per point; laws: {arm: (A, gamma)}. Each simulated run has ln L = ln(E + A x^-gamma)
    + sigma z; a point is the mean of its n runs; fits are weighted by sigma as `fit.py ladders --noise` does."""
    out = {a: np.full(sims, np.nan) for a in points}
    for s in range(sims):
        sim = {}
        for a, (x, n) in points.items():
            A, g = laws[a]
            z = rng.standard_normal((len(x), int(n.max())))
            runs = (E + A * x ** -g)[:, None] * np.exp(sigma * z)
            loss = np.array([runs[i, :k].mean() for i, k in enumerate(n)])
            sim[a] = (x, loss, sigma * loss / np.sqrt(n))
        try:
            E_hat = E if fixed_E else fit.fit_free_e(*sim[ref_arm])[2]
        except FitError:
            continue
        for a, (x, loss, sd) in sim.items():
            try:
                out[a][s] = fit.fit_shared_e(x, loss, E_hat, sd)["gamma"]
            except FitError:
                pass
    return out


def summarize(points, laws, E, ref_arm, sigma, draws):
    """Per arm: gamma CI half-width (half the central 95 % range of the simulated estimates), the E-known analytic
    standard error, and for the other arms delta-gamma's half-width, mean, and detection probability."""
    q = lambda v: (np.nanpercentile(v, 100 - (100 - FIT["ci"]) / 2) - np.nanpercentile(v, (100 - FIT["ci"]) / 2)) / 2
    arms = {}
    for a, (x, n) in points.items():
        r = dict(gamma_true=laws[a][1], gamma_ci_halfwidth=q(draws[a]), valid=int(np.isfinite(draws[a]).sum()),
                 gamma_se_known_E=analytic_gamma_se(x, n, E, *laws[a], sigma))
        if a != ref_arm:
            dg, true = draws[a] - draws[ref_arm], laws[a][1] - laws[ref_arm][1]
            h = q(dg)
            ok = dg[np.isfinite(dg)]
            r.update(delta_gamma_true=true, delta_gamma_ci_halfwidth=h, delta_gamma_mean=float(ok.mean()),
                     detect_probability=float(np.mean(ok * (1 if true >= 0 else -1) > h)))
        arms[a] = r
    return arms


def true_laws(args, arms):
    """{arm: (A, gamma)} and E from --truth PILOT.json (a `fit.py ladders --json` output) or --E/--gamma/--A."""
    if args.truth:
        try:
            with open(args.truth) as f:
                pilot = json.load(f)
            E, have = float(pilot["E"]), {a: (float(r["A"]), float(r["gamma"])) for a, r in pilot["arms"].items()}
        except OSError as e:
            raise UsageError(f"cannot read {args.truth}: {e.strerror}")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UsageError(f"{args.truth} is not a `fit.py ladders --json` output (needs E and arms with A, gamma)")
    elif None not in (args.E, args.gamma, args.A):
        E, have = args.E, {args.reference_arm: (args.A, args.gamma)}
    else:
        raise UsageError("give the true curves: --truth PILOT.json (from fit.py ladders --json) or --E, --gamma and --A")
    if args.reference_arm not in have:
        raise UsageError(f"reference arm {args.reference_arm!r} has no law in the truth (arms: {', '.join(have)})")
    laws = {}
    for a in arms:
        if a not in have and args.delta_gamma is None:
            raise UsageError(f"planned arm {a!r} has no law in the truth; pass --delta-gamma to model it as the "
                             f"reference arm with gamma + DG")
        A, g = have.get(a, have[args.reference_arm])
        laws[a] = (A, have[args.reference_arm][1] + args.delta_gamma) if args.delta_gamma is not None and \
            a != args.reference_arm else (A, g)
    return E, laws


def cmd_design(args):
    if args.noise is None:
        raise UsageError("--noise SIGMA is required: the relative run-to-run noise (sd of ln val_loss of one run), "
                         "e.g. the sigma fit.py ladders pools from seed replicates")
    if args.sims < 20:
        raise UsageError(f"--sims must be >= 20, got {args.sims}")
    if args.out:
        import figures  # matplotlib is loaded only when figures are asked for
        fit.check_outputs(args.out, figures.DESIGN_FIGURE)
    plan = {}
    for path in args.plan:
        for key, v in read_plan(path).items():
            if key in plan:
                raise UsageError(f"{path}: {key[0]} d{key[1]} is already planned in another plan file")
            plan[key] = v
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
                         args.fixed_E)
        flops = float(sum((x * n).sum() for x, n, _ in arms.values()))
        results.append(dict(design=spec, runs=int(sum(n.sum() for _, n, _ in arms.values())), flops=flops,
                            gpu_hours=flops / (peak * args.mfu) / 3600,
                            depths={a: dict(zip(map(int, ds), map(int, n))) for a, (_, n, ds) in arms.items()},
                            arms=summarize(points, laws, E, args.reference_arm, args.noise, draws)))
    paths = figures.design_figure(results, args.reference_arm, args.out, args.gpu) if args.out else []
    out = dict(noise=args.noise, E=E, reference_arm=args.reference_arm, fixed_E=args.fixed_E, sims=args.sims,
               seed=args.seed, gpu=args.gpu, peak_flops=peak, mfu=args.mfu, designs=results)
    if args.json:
        print(json.dumps(fit.jsonable(out), allow_nan=False))
        return
    print(f"sigma = {args.noise:g} relative (sd of ln L of one run); {args.sims} simulated ladders per design; "
          + ("E known" if args.fixed_E else f"E refitted on {args.reference_arm} in every simulation")
          + f"; GPU-hours at {args.mfu:.0%} MFU of {peak:.3g} FLOP/s ({args.gpu})")
    for r in results:
        print(f"\n{r['design']}: {r['runs']} runs, {r['flops']:.3e} FLOPs, {r['gpu_hours']:,.0f} GPU-hours")
        print(f"  {'arm':<18} {'gamma':>7} {'±CI95':>8} {'se(E known)':>11} {'dgamma':>8} {'±CI95':>8} {'P(detect)':>9}")
        for a, v in r["arms"].items():
            dg = f"{v['delta_gamma_true']:+8.4f} {v['delta_gamma_ci_halfwidth']:8.4f} {v['detect_probability']:9.2f}" \
                if "delta_gamma_true" in v else ""
            print(f"  {a:<18} {v['gamma_true']:7.4f} {v['gamma_ci_halfwidth']:8.4f} {v['gamma_se_known_E']:11.5f} {dg}")
    for p in paths:
        print(f"wrote {p}")
