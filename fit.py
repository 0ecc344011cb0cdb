"""fit.py — the paper's scaling-law fits, compute multipliers and figures, plus the Skaling L(N, D) law.

Subcommands (column contracts in brackets, in full under `python fit.py SUBCOMMAND -h`; extra columns are ignored):
  ladders INPUT...   L(C) = E + A (C/1e18)^-gamma per arm, E fitted on the reference arm and shared (arXiv 2609.19107
                     Sec. 4.2), compute multipliers, bootstrap CIs, per-arm free-E check, forecasts and gains at
                     --extrapolate C (Figure 4), Figure 3 + Figure 2 (left). Seed replicates are pooled: their spread is
                     the run-to-run noise that weights the fits and feeds a parametric bootstrap.
                     INPUT = CSV [arm, depth, compute_flops, val_loss (+ seed, training_seconds)] or train.py runs.
  design PLAN        simulate planned ladders under assumed laws and noise: CI half-widths of gamma and delta-gamma,
                     detection probability, GPU-hours; compares designs (ladder_design.py).
  surface DATA.csv   Chinchilla L = E + A/N^a + B/D^b and Skaling L = (A/N^a + B/D^b)^k + E  [N, D or compute, loss].
  downstream DATA.csv  CORE forecast (App. C.4)  [arm, compute_flops, core, nll:<task>..., acc:<task>... (centered)].
  tpp DATA.csv       quadratic vertex of log loss vs log TPP per budget (App. A.4.2)  [compute_flops, tpp, val_loss].
  growth DATA.csv    quadratic in the post-growth fraction rho per (depth, budget) (A.2.3, A.4.3)  [depth, compute_flops,
                     rho, val_loss].
  lr DATA.csv        quadratic of log loss vs log value per size, then log optimum vs log N (A.4.4)  [params, value,
                     val_loss (+ hparam: several hyperparameters at once)].
  loops GRID.csv|RUNS  optimal loop count per budget and loop-vs-size frontiers (Fig 2 right, Fig 5)  [depth, loops,
                     weight_decay, compute_flops, val_loss].

  python fit.py ladders reference/fineweb_ladders.csv --out figures --bootstrap 1000
  python fit.py surface grid.csv --form both --sparse-l
Bad input: one line on stderr, exit 2. An arm/group that cannot be fitted is reported on one line and skipped.
--out never overwrites a file fit.py did not write: it records its outputs in OUT/fit_manifest.json.
"""
import argparse, csv, glob, importlib, json, math, os, sys, time

# The fits use tiny matrices: a threaded BLAS only adds contention (L-BFGS-B runs ~100x slower on a busy 2-core box).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
from scipy import optimize, stats

from cli import Parser, UsageError, cli_main, exit_process, write_json

FIT = dict(
    c_ref=1e18, time_ref=3600.0,        # power-law x = C / c_ref (FLOPs) or time / 1 h with --time
    e_grid=600, e_grid_top=0.995,       # E initialization grid: linspace(0, 0.995 min L, 600)
    huber_k=1.345, mad_to_sigma=0.67448975, min_f_scale=1e-6,  # robust refit f_scale = max(k MAD/0.6745, min)
    anchor_depth=8,                     # multipliers at the reference arm's budgets with depth >= 8; C0 at d8
    disagree_se=2.0,                    # flag an arm whose own free-E fit puts E > 2 stderrs from the shared E
    extrapolate_warn=10.0,              # warn when --extrapolate C exceeds 10x the largest measured compute
    ci=95.0, default_extrapolate_boot=200,
    replicate_compute_rtol=1e-6,        # seed replicates of one (arm, depth) must share the planned FLOPs
    inset_span=5.0,                     # Figure inset shows the top factor-5 of compute (2e19..1e20 on the paper)
    nll_min_scale=0.002, sigmoid_min_scale=0.005,  # App. C.4 Huber f_scale floors
    gpt3_targets=(0.329, 0.361, 0.385, 0.427),      # CORE of GPT-3 2.7B / 6.7B / 13B / 175B
    surface_delta=dict(chinchilla=1e-3, skaling=0.05),  # Huber delta on ln L: Hoffmann et al.; the Skaling paper
    # the release's five multi-epoch budgets (FLOPs without attention) at which the paper reads the loop grid
    loop_budgets=(0.846120e18, 1.419447e18, 2.381258e18, 3.994787e18, 6.701636e18),
)
MANIFEST = "fit_manifest.json"  # in every --out directory: the files fit.py wrote there (and may overwrite)
ARM_STYLE = {  # arm -> (label, colour) for figures
    "vanilla": ("Vanilla", "black"), "deep_vanilla": ("Deep Vanilla", "tab:gray"),
    "deep_vanilla_grow": ("Deep Vanilla Grow", "tab:brown"), "operator_1": ("Operator-1", "tab:blue"),
    "loop_2": ("Loop-2", "tab:cyan"), "loop_grow": ("Loop-Grow", "tab:green"),
    "untied_2": ("Untied-2", "tab:orange"), "untied_grow": ("Untied-Grow", "tab:red")}


class FitError(Exception):
    """One arm / group cannot be fitted; the others go on."""


def note(msg):
    print(f"fit.py: {msg}", file=sys.stderr)


def read_csv(path, required, numeric=(), positive=()):
    """Columns of a CSV as lists (numeric ones as float arrays) and "_line", each row's line in the file. A missing
    file or column, a non-numeric or non-finite value, or a value <= 0 in a `positive` column -> UsageError (file:line)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not part of the header
            reader = csv.DictReader(f)
            rows, lines = [], []
            for r in reader:
                rows.append(r)
                lines.append(reader.line_num)
            header = reader.fieldnames or []
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}")
    except (UnicodeDecodeError, csv.Error) as e:
        raise UsageError(f"{path}: not a UTF-8 CSV file ({e})")
    missing = [c for c in required if c not in header]
    if missing:
        raise UsageError(f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(required)})")
    cols = {c: [r[c] for r in rows] for c in header}
    for c in (c for c in numeric if c in cols):  # an optional numeric column may be absent
        values = []
        for v, line in zip(cols[c], lines):
            try:
                values.append(float(v))
            except (TypeError, ValueError):
                raise UsageError(f"{path}:{line}: column {c} is {v!r}, not a number")
            if not math.isfinite(values[-1]) or (c in positive and values[-1] <= 0):
                raise UsageError(f"{path}:{line}: column {c} is {v}; need a finite number" + (" > 0" if c in positive else ""))
        cols[c] = np.array(values)
    cols["_line"] = lines
    return cols


def check_outputs(out_dir, names):
    """Refuse, before any work, to write into a file path or over a file fit.py did not write (not in the manifest)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out {out_dir} is a file, not a directory; pass a directory")
    manifest = os.path.join(out_dir, MANIFEST)
    listed = []
    if os.path.exists(manifest):
        try:
            with open(manifest) as f:
                listed = json.load(f)["files"]
            assert isinstance(listed, list) and all(isinstance(n, str) for n in listed)
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            raise UsageError(f"{manifest} is not a fit.py manifest; move it away or pass another --out")
    for name in names:
        if os.path.exists(os.path.join(out_dir, name)) and name not in listed:
            raise UsageError(f"{os.path.join(out_dir, name)} exists and was not written by fit.py (not listed in "
                             f"{manifest}); move it away or pass another --out")
    return listed


def record_outputs(out_dir, names):
    """Create OUT and list `names` in its manifest (atomically) just before writing them."""
    listed = check_outputs(out_dir, names)
    manifest = os.path.join(out_dir, MANIFEST)
    try:
        os.makedirs(out_dir, exist_ok=True)
        write_json(manifest, dict(written_by="fit.py", files=sorted(set(listed) | set(names))))
    except OSError as e:
        raise UsageError(f"cannot write into --out {out_dir}: {e.strerror}")


def fnum(x, fmt=".4f"):
    return "—" if x is None or not np.isfinite(x) else format(x, fmt)


def jsonable(obj):
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj.item() if isinstance(obj, np.generic) else obj


# ---------------------------------------------------------------------------------------------------- ladders input
RESULT_KEYS = "status, arch, depth, estimated_training_flops, final_val_loss"


def read_result_json(path, table):
    """A train.py result.json as a dict; anything else -> UsageError saying what is expected (`table`: the CSV form)."""
    try:
        with open(path) as f:
            r = json.load(f)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}")
    except ValueError:
        r = None
    if not isinstance(r, dict) or "status" not in r:
        raise UsageError(f"{path} is not a train.py result.json (needs {RESULT_KEYS}); pass train.py run dirs, "
                         f"or a table as CSV [{table}]")
    return r


def ladder_rows_from_runs(paths, use_time):
    """(arm, depth, x, loss, seed, origin) of every complete train.py result.json; incomplete runs are skipped."""
    rows = []
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
        rows.append((arm, depth, x, loss, (r.get("plan") or {}).get("seed"), path))
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
    replicates with --replicates, an error otherwise. -> {(arm, depth): (x, [losses])}."""
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
        points[(arm, depth)] = (float(x.mean()), [k[3] for k in kept])
    return points


def load_ladders(inputs, use_time, replicates=False):
    """-> {arm: dict(depth, x, loss, n, reps)} sorted by x (compute FLOPs, or training seconds with --time); loss is the
    mean over a point's n seed replicates, reps their losses."""
    rows = []
    for item in inputs:
        if item.endswith(".csv"):
            rows += ladder_rows_from_csv(item, use_time)
            continue
        if os.path.isdir(item):
            own = os.path.join(item, "result.json")
            paths = [own] if os.path.exists(own) else sorted(glob.glob(os.path.join(item, "*", "result.json")))
        else:
            paths = sorted(glob.glob(item))
        if not paths:
            raise UsageError(f"{item}: no CSV, result.json or run directory found")
        rows += ladder_rows_from_runs(paths, use_time)
    if not rows:
        raise UsageError("no usable ladder points in the inputs")
    points = pool_replicates(rows, replicates, use_time)
    data = {}
    for arm in sorted({a for a, _ in points}, key=lambda a: (list(ARM_STYLE).index(a) if a in ARM_STYLE else 99, a)):
        pts = sorted((x, d, reps) for (a, d), (x, reps) in points.items() if a == arm)
        data[arm] = dict(x=np.array([p[0] for p in pts]), depth=np.array([p[1] for p in pts]),
                         loss=np.array([np.mean(p[2]) for p in pts]), n=np.array([len(p[2]) for p in pts]),
                         reps=[np.array(p[2]) for p in pts])
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
    for spec in specs:
        arm, _, depth = spec.rpartition(":")
        if not arm or not depth.isdigit():
            raise UsageError(f"--holdout {spec!r}: use ARM:DEPTH, e.g. untied_grow:18")
        d = data.get(arm)
        i = np.flatnonzero(d["depth"] == int(depth)) if d else []
        if not len(i):
            raise UsageError(f"--holdout {spec}: no {arm} d{depth} point in the inputs")
        i = int(i[0])
        held.append(dict(arm=arm, depth=int(depth), compute=d["x"][i], loss=d["loss"][i], n=int(d["n"][i])))
        keep = np.arange(len(d["x"])) != i
        data[arm] = dict(x=d["x"][keep], depth=d["depth"][keep], loss=d["loss"][keep], n=d["n"][keep],
                         reps=[r for j, r in enumerate(d["reps"]) if j != i])
    return held


# ---------------------------------------------------------------------------------------------------- fits (Sec. 4.2)
def robust_lsq(resid, x0, bounds, min_scale, **kw):
    """Plain bounded least_squares, then the Huber refit with f_scale = max(1.345 MAD / 0.6745, min_scale)."""
    plain = optimize.least_squares(resid, x0, bounds=bounds, **kw)
    r = resid(plain.x)
    mad = np.median(np.abs(r - np.median(r)))
    f_scale = max(FIT["huber_k"] * mad / FIT["mad_to_sigma"], min_scale)
    return optimize.least_squares(resid, plain.x, bounds=bounds, loss="huber", f_scale=f_scale, **kw).x


def fit_free_e(x, loss, sd=None):
    """L = E + A x^-gamma with E free -> (A, gamma, E). sd: each point's noise (loss units) to weight the residuals by;
    None = unweighted, the paper's fit."""
    if len(x) < 3:
        raise FitError(f"fewer than 3 points ({len(x)})")
    sd = np.ones_like(loss) if sd is None else sd
    lx = np.log(x)
    grid = np.linspace(0.0, FIT["e_grid_top"] * loss.min(), FIT["e_grid"])
    y = np.log(loss[None, :] - grid[:, None])  # OLS of ln(L - E_j) on ln x for all 600 E_j at once (= np.polyfit deg 1)
    dx = lx - lx.mean()
    slope = (y - y.mean(1, keepdims=True)) @ dx / (dx @ dx)
    icpt = y.mean(1) - slope * lx.mean()
    A, g = np.exp(icpt), -slope
    sse = ((((grid[:, None] + A[:, None] * x[None, :] ** -g[:, None]) - loss[None, :]) / sd) ** 2).sum(1)
    sse[slope >= 0] = np.inf
    j = int(np.argmin(sse))
    if not np.isfinite(sse[j]):
        raise FitError("loss does not decrease with compute (no negative slope for any E)")
    resid = lambda p: (p[2] + p[0] * x ** -p[1] - loss) / sd
    bounds = ([0, 0, 0], [np.inf, np.inf, np.nextafter(loss.min(), 0)])
    return robust_lsq(resid, [A[j], g[j], grid[j]], bounds, FIT["min_f_scale"])


def free_e_check(x, loss, E_shared, sd=None):
    """This arm's own free-E fit, its linearised standard errors (from the residuals, or from sd when the noise is
    known), and whether its data reject the shared floor."""
    A, g, E = fit_free_e(x, loss, sd)
    w = np.ones_like(loss) if sd is None else sd
    J = np.stack([x ** -g, -A * x ** -g * np.log(x), np.ones_like(x)], 1) / w[:, None]  # d residual / d (A, gamma, E)
    dof = len(x) - 3
    r = (E + A * x ** -g - loss) / w
    cov = np.linalg.pinv(J.T @ J) * (1.0 if sd is not None else r @ r / dof if dof > 0 else np.nan)
    g_se, E_se = math.sqrt(cov[1, 1]), math.sqrt(cov[2, 2])
    return dict(free_A=A, free_gamma=g, free_gamma_se=g_se, free_E=E, free_E_se=E_se,
                free_disagrees=bool(abs(E - E_shared) > FIT["disagree_se"] * E_se) if np.isfinite(E_se) else None)


def fit_shared_e(x, loss, E, sd=None):
    """OLS of ln(L - E) on ln x -> dict(gamma, A, gamma_se, r2). With sd (each point's noise in loss units) it is weighted
    least squares with var ln(L - E) = (sd / (L - E))^2, gamma_se from that known noise, and reduced_chi2 (~1 when the
    noise explains the scatter around the law)."""
    if len(np.unique(x)) < 3:
        raise FitError(f"fewer than 3 distinct points ({len(np.unique(x))})")
    if loss.min() <= E:
        raise FitError(f"loss {loss.min():.4f} <= E = {E:.4f}; the shared floor is above this arm")
    lx, y = np.log(x), np.log(loss - E)
    if sd is None:
        reg = stats.linregress(lx, y)
        return dict(gamma=-reg.slope, A=math.exp(reg.intercept), gamma_se=reg.stderr, r2=reg.rvalue ** 2)
    w = ((loss - E) / sd) ** 2
    X = np.stack([np.ones_like(lx), lx], 1)
    cov = np.linalg.inv(X.T @ (w[:, None] * X))
    icpt, slope = cov @ (X.T @ (w * y))
    res = y - icpt - slope * lx
    return dict(gamma=-slope, A=math.exp(icpt), gamma_se=math.sqrt(cov[1, 1]),
                r2=1 - res @ res / ((y - y.mean()) @ (y - y.mean())), reduced_chi2=float(w @ res ** 2 / (len(x) - 2)))


def compute_at_loss(x, loss, target):
    """Smallest compute reaching `target` on improving segments (linear in loss, log in compute); NaN if none."""
    best = np.nan
    for x0, x1, l0, l1 in zip(x[:-1], x[1:], loss[:-1], loss[1:]):
        if l1 < l0 and l1 <= target <= l0:
            f = (target - l0) / (l1 - l0)
            best = np.nanmin([best, math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))])
    return best


def fitted_multiplier(ref, arm, x):
    """pi(C) = C / C_arm(L_ref(C)) from the two shared-E power laws (E cancels), x in c_ref units."""
    lx = np.log(x)
    return np.exp(lx - (math.log(arm["A"] / ref["A"]) + ref["gamma"] * lx) / arm["gamma"])


def forecast(ref_free, arm_law, x):
    """Figure 4 at x (c_ref units): the arm's forecast loss L_arm(x) and the gain C_ref(L_arm(x)) / x, C_ref inverting
    the reference arm's free-E law (the reference arm itself is forecast by that law, so its gain is 1)."""
    A, g, E = ref_free["A"], ref_free["gamma"], ref_free["E"]
    loss = E + (A if arm_law is None else arm_law["A"]) * x ** -(g if arm_law is None else arm_law["gamma"])
    return loss, ((loss - E) / A) ** (-1 / g) / x


def point_sd(d, sigma):
    """Each point's noise in loss units: relative sigma on one run, / sqrt(n) for the mean of n replicates."""
    return None if sigma is None else sigma * d["loss"] / np.sqrt(d["n"])


def fit_ladders(data, ref_arm, c_ref, anchor_depth=FIT["anchor_depth"], sigma=None):
    if ref_arm not in data:
        raise UsageError(f"reference arm {ref_arm!r} not in the data (arms: {', '.join(data)})")
    r = data[ref_arm]
    try:
        A_free, g_free, E = fit_free_e(r["x"] / c_ref, r["loss"], point_sd(r, sigma))
    except FitError as e:
        raise UsageError(f"reference arm {ref_arm}: {e}")
    keep = r["depth"] >= anchor_depth
    budgets, targets = r["x"][keep], r["loss"][keep]
    if not len(budgets):
        raise UsageError(f"reference arm {ref_arm} has no point with depth >= {anchor_depth}; "
                         "pass --anchor-depth (e.g. 3 for the cpu preset)")
    c0 = r["x"][r["depth"] == anchor_depth][0] if (r["depth"] == anchor_depth).any() else budgets[0]
    out = dict(E=E, reference_arm=ref_arm, C0=c0, c_ref=c_ref, budgets=budgets, targets=targets,
               last_budget_index=int(np.flatnonzero(keep)[-1]), reference_free=dict(A=A_free, gamma=g_free, E=E),
               arms={}, errors={})
    for arm, d in data.items():
        try:
            res = fit_shared_e(d["x"] / c_ref, d["loss"], E, point_sd(d, sigma))
        except FitError as e:
            out["errors"][arm] = str(e)
            note(f"arm {arm}: {e}; skipped")
            continue
        res["logA_C0"] = math.log(res["A"]) - res["gamma"] * math.log(c0 / c_ref)
        mult = [1.0] * len(budgets) if arm == ref_arm else \
            [b / compute_at_loss(d["x"], d["loss"], t) for b, t in zip(budgets, targets)]
        res["multipliers"] = [dict(compute=b, multiplier=m) for b, m in zip(budgets, mult) if np.isfinite(m)]
        if len(res["multipliers"]) < len(budgets):
            note(f"arm {arm}: no improving bracket at {len(budgets) - len(res['multipliers'])} of {len(budgets)} "
                 f"reference budgets; those multipliers are missing")
        res["final_multiplier"] = res["multipliers"][-1]["multiplier"] if res["multipliers"] else np.nan
        res["points"] = [dict(depth=int(dp), compute=x, loss=l, n=int(k)) for dp, x, l, k in
                         zip(d["depth"], d["x"], d["loss"], d["n"])]
        try:
            res.update(free_e_check(d["x"] / c_ref, d["loss"], E, point_sd(d, sigma)))
        except FitError as e:
            note(f"arm {arm}: free-E fit failed: {e}")
        out["arms"][arm] = res
    ref = out["arms"][ref_arm]
    for res in out["arms"].values():
        res["fitted_final_multiplier"] = float(fitted_multiplier(ref, res, budgets[-1] / c_ref))
    return out


def bootstrap_ladders(data, fit, n, seed, extrapolate=None, noise=None):
    """CIs by refitting n re-drawn data sets: E on the reference arm, then every arm's gamma, its interpolated final
    multiplier, pi(C) and, at --extrapolate, the forecast loss and gain.
    noise=None: resample points within each arm with replacement (the reference arm's target loss at the last budget
    stays its measured value). noise=(sigma, dof): parametric — keep every point and re-draw its run-to-run noise,
    ln L* = ln L + s z / sqrt(n_i), with s^2 = sigma^2 chi2_dof / dof when sigma was estimated from replicates (dof > 0)
    and s = sigma for a given --noise; fits are weighted by sigma and targets are the re-drawn reference losses."""
    rng = np.random.default_rng(seed)
    arms, c_ref, ref_arm = list(fit["arms"]), fit["c_ref"], fit["reference_arm"]
    budget, last = fit["budgets"][-1], fit["last_budget_index"]
    sigma = noise[0] if noise else None
    pi_at = np.array([budget] + ([extrapolate] if extrapolate else [])) / c_ref
    keys = ("gamma", "final", "pi", "forecast", "gain")
    draws = {a: {k: np.full((n, len(pi_at)) if k == "pi" else n, np.nan) for k in keys} for a in arms}
    E_draws = np.full(n, np.nan)
    for b in range(n):
        if noise is None:
            idx = {a: np.sort(rng.integers(0, len(data[a]["x"]), len(data[a]["x"]))) for a in arms}
            pts = {a: dict(x=data[a]["x"][i], loss=data[a]["loss"][i], n=data[a]["n"][i]) for a, i in idx.items()}
            target = fit["targets"][-1]
        else:
            s = sigma * math.sqrt(rng.chisquare(noise[1]) / noise[1]) if noise[1] else sigma
            pts = {a: dict(x=data[a]["x"], n=data[a]["n"], loss=data[a]["loss"] * np.exp(
                s * rng.standard_normal(len(data[a]["x"])) / np.sqrt(data[a]["n"]))) for a in arms}
            target = pts[ref_arm]["loss"][last]
        laws = {}
        try:
            p = pts[ref_arm]
            A_free, g_free, E = fit_free_e(p["x"] / c_ref, p["loss"], point_sd(p, sigma))
        except FitError:
            continue
        ref_free = dict(A=A_free, gamma=g_free, E=E)
        for a in arms:
            p = pts[a]
            try:
                laws[a] = fit_shared_e(p["x"] / c_ref, p["loss"], E, point_sd(p, sigma))
            except FitError:
                continue
            draws[a]["gamma"][b] = laws[a]["gamma"]
            draws[a]["final"][b] = 1.0 if a == ref_arm else budget / compute_at_loss(p["x"], p["loss"], target)
            if extrapolate:
                draws[a]["forecast"][b], draws[a]["gain"][b] = forecast(ref_free, None if a == ref_arm else laws[a],
                                                                        extrapolate / c_ref)
        E_draws[b] = E
        if ref_arm in laws:
            for a in laws:
                draws[a]["pi"][b] = fitted_multiplier(laws[ref_arm], laws[a], pi_at)
    lo, hi = (100 - FIT["ci"]) / 2, 100 - (100 - FIT["ci"]) / 2

    def ci(v):
        v = v[np.isfinite(v)]
        return [float(np.percentile(v, lo)), float(np.percentile(v, hi))] if len(v) > 1 else [np.nan, np.nan]
    for a in arms:
        g = draws[a]["gamma"]
        fit["arms"][a].update(gamma_boot_se=float(np.nanstd(g)), gamma_ci=ci(g), bootstrap_valid=int(np.isfinite(g).sum()),
                              delta_gamma_ci=ci(g - draws[ref_arm]["gamma"]), final_multiplier_ci=ci(draws[a]["final"]),
                              fitted_final_multiplier_ci=ci(draws[a]["pi"][:, 0]))
        if extrapolate:
            fit["arms"][a].update(pi_at_extrapolate_ci=ci(draws[a]["pi"][:, 1]),
                                  forecast_loss_ci=ci(draws[a]["forecast"]), gain_at_extrapolate_ci=ci(draws[a]["gain"]))
    fit.update(E_ci=ci(E_draws), bootstrap=dict(n=n, seed=seed, ci=FIT["ci"], kind="noise" if noise else "points",
                                                includes_seed_noise=bool(noise)))


def ladder_table(fit, xname):
    def ci(r, key, fmt):  # " [lo, hi]" when a bootstrap CI exists
        c = r.get(f"{key}_ci")
        return f" [{fnum(c[0], fmt)}, {fnum(c[1], fmt)}]" if c else ""
    val = lambda r, key, fmt: fnum(r.get(key), fmt) + ci(r, key, fmt)
    E_ci = f"  {FIT['ci']:.0f}% CI [{fit['E_ci'][0]:.4f}, {fit['E_ci'][1]:.4f}]" if "E_ci" in fit else ""
    lines = [f"E = {fit['E']:.6f}{E_ci} (reference arm {fit['reference_arm']}, C0 = {fit['C0']:.6g} {xname})",
             f"{'arm':<18} {'gamma ± se [CI]':<33} {'log A@C0':>8} {'mult first':>10}  mult last [CI]"]
    for arm, r in fit["arms"].items():
        m = r["multipliers"]
        lines.append(f"{arm:<18} {r['gamma']:.4f} ± {r['gamma_se']:.4f}{ci(r, 'gamma', '.4f'):<17} "
                     f"{r['logA_C0']:>8.4f} {fnum(m[0]['multiplier'] if m else None, '.3f'):>10}  "
                     f"{val(r, 'final_multiplier', '.3f')}")
    lines += ["", f"{'arm':<18} {'gamma - ref [CI]':<28} {'fitted pi at last [CI]':<24} own free-E fit: gamma, E (flag: "
                  f"E > {FIT['disagree_se']:.0f} se from shared)"]
    for arm, r in fit["arms"].items():
        d = r.get("delta_gamma_ci")
        dg = f"{r['gamma'] - fit['arms'][fit['reference_arm']]['gamma']:+.4f}" + (f" [{d[0]:+.4f}, {d[1]:+.4f}]" if d else "")
        free = (f"{r['free_gamma']:.4f} ± {fnum(r['free_gamma_se'])}, {r['free_E']:.3f} ± {fnum(r['free_E_se'], '.3f')}"
                + ("  DISAGREES" if r["free_disagrees"] else "")) if "free_gamma" in r else "—"
        lines.append(f"{arm:<18} {dg:<28} {val(r, 'fitted_final_multiplier', '.3f'):<24} {free}")
    return "\n".join(lines)


def noise_lines(fit):
    """What the standard errors and CIs include, in words."""
    nz, b = fit["noise"], fit.get("bootstrap")
    if nz["sigma"] is None:
        lines = ["noise: none given (no seed replicates, no --noise); fits unweighted, gamma ± se from the residuals"]
    else:
        src = f"pooled from seed replicates, {nz['dof']} dof" if nz["source"] == "replicates" else "given by --noise"
        lines = [f"noise: sigma = {nz['sigma']:.5f} relative (sd of ln L of one run; {src}); fits weighted by it, "
                 f"gamma ± se from it" + (f"; {nz['replicated_points']} points have replicates" if nz["replicated_points"] else "")]
    if b:
        lines.append(f"CIs: {b['n']} " + ("parametric resamples re-drawing that noise (they include seed noise)"
                                         if b["includes_seed_noise"] else "resamples of points within each arm (they do "
                                         "not include run-to-run noise; seed replicates or --noise add it)"))
    return lines


def positive_float(v):
    """argparse type: a finite float > 0."""
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {v!r}")
    return x


def cmd_ladders(args):
    if args.out:
        import figures  # matplotlib is loaded only when figures are asked for
        check_outputs(args.out, figures.LADDER_FIGURES)
    data = load_ladders(args.inputs, args.time, args.replicates)
    held = hold_out(data, args.holdout or [])
    xname, c_ref = ("s", FIT["time_ref"]) if args.time else ("FLOPs", FIT["c_ref"])
    sigma, dof = pooled_noise(data)
    source = "replicates" if sigma is not None else None
    if args.noise is not None:
        if sigma is not None:
            note(f"--noise {args.noise} replaces the replicates' pooled sigma {sigma:.5f} ({dof} dof)")
        sigma, dof, source = args.noise, 0, "--noise"
    t0 = time.perf_counter()
    fit = fit_ladders(data, args.reference_arm, c_ref, args.anchor_depth, sigma)
    t_fit = time.perf_counter() - t0
    fit["noise"] = dict(sigma=sigma, dof=dof, source=source, scale="relative: sd of ln(val_loss) of one run",
                        replicated_points=int(sum((d["n"] > 1).sum() for d in data.values())))
    n_boot = args.bootstrap if args.bootstrap is not None else (FIT["default_extrapolate_boot"] if args.extrapolate else 0)
    t_boot = None
    if n_boot > 0:
        t0 = time.perf_counter()
        bootstrap_ladders(data, fit, n_boot, args.seed, args.extrapolate, (sigma, dof) if sigma is not None else None)
        t_boot = time.perf_counter() - t0
    ref_law, ref_free = fit["arms"][args.reference_arm], fit["reference_free"]
    if args.extrapolate:
        x_max = max(d["x"].max() for d in data.values())
        if args.extrapolate > FIT["extrapolate_warn"] * x_max:
            note(f"warning: extrapolating to {args.extrapolate:.3g} {xname}, {args.extrapolate / x_max:.0f}x beyond "
                 f"the largest measured point ({x_max:.3g}); the CI assumes the power laws hold that far")
        for a, r in fit["arms"].items():
            r["forecast_loss"], r["gain_at_extrapolate"] = forecast(
                ref_free, None if a == args.reference_arm else r, args.extrapolate / c_ref)
            r["pi_at_extrapolate"] = float(fitted_multiplier(ref_law, r, args.extrapolate / c_ref))
    for h in held:
        law = fit["arms"].get(h["arm"])
        h["forecast_loss"] = forecast(ref_free, None if h["arm"] == args.reference_arm else law, h["compute"] / c_ref)[0] \
            if law else np.nan
        h["residual"] = h["loss"] - h["forecast_loss"]
    paths = figures.ladder_figures(data, fit, args.out, xname) if args.out else []
    if args.json:
        keep = ("gamma", "gamma_se", "A", "logA_C0", "r2", "reduced_chi2", "multipliers", "final_multiplier",
                "fitted_final_multiplier", "gamma_boot_se", "gamma_ci", "delta_gamma_ci", "final_multiplier_ci",
                "fitted_final_multiplier_ci", "bootstrap_valid", "free_E", "free_gamma", "free_A", "free_gamma_se",
                "free_E_se", "free_disagrees", "forecast_loss", "forecast_loss_ci", "gain_at_extrapolate",
                "gain_at_extrapolate_ci", "pi_at_extrapolate", "pi_at_extrapolate_ci", "points")
        obj = dict(E=fit["E"], reference_arm=fit["reference_arm"], C0=fit["C0"], x_unit=xname, c_ref=c_ref,
                   reference_free=ref_free, noise=fit["noise"],
                   arms={a: {k: r[k] for k in keep if k in r} for a, r in fit["arms"].items()}, errors=fit["errors"])
        obj.update({k: fit[k] for k in ("E_ci", "bootstrap") if k in fit})
        if args.extrapolate:
            obj["extrapolate"] = args.extrapolate
        if held:
            obj["held_out"] = held
        print(json.dumps(jsonable(obj), allow_nan=False))
        return
    print(ladder_table(fit, xname))
    print("\n" + "\n".join(noise_lines(fit)))
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


def cmd_downstream(args):
    c = read_csv(args.data, ["arm", "compute_flops", "core"], numeric=["compute_flops", "core"], positive=["compute_flops"])
    tasks = [k[4:] for k in c if k.startswith("nll:") and f"acc:{k[4:]}" in c]
    if not tasks:
        raise UsageError(f"{args.data}: no task columns (need nll:<task> and acc:<task> pairs)")
    c = read_csv(args.data, [], numeric=[f"{p}:{t}" for t in tasks for p in ("nll", "acc")] + ["compute_flops", "core"],
                 positive=["compute_flops"] + [f"nll:{t}" for t in tasks])
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
complete are skipped; any other JSON is an error. Losses and computes must be finite and > 0, depths whole.
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
(the output of `fit.py ladders ... --json`) or --E/--gamma/--A (every arm), with --delta-gamma DG setting every
other arm's gamma to the reference's + DG. Each --design SPEC selects from the plan: 'd6-18' (depths 6..18 of each
arm, clipped to what it plans), 'x3@top2' (3 seeds at each arm's two largest depths), 'x3@16,18', 'x3' (everywhere),
combined as 'd6-18 x3@top2'; without --design: the plan as given. Reports per design and arm the expected 95 % CI
half-width of gamma and of gamma - gamma_ref (half the central 95 % range of the simulated estimates), the
E-known analytic standard error, P(detect) = share of simulated ladders whose interval excludes 0 on the true
side, and the plan's FLOPs and GPU-hours; --out writes design_ci_vs_compute.{png,pdf}.""",
    surface="DATA.csv [N, D or compute (= 6 N D), loss]; all finite and > 0; >= 7 rows.",
    downstream="DATA.csv [arm, compute_flops, core, nll:<task>..., acc:<task>... (centered accuracy)], one row per "
               "checkpoint; nll:/acc: pairs define the tasks.",
    tpp="DATA.csv [compute_flops, tpp, val_loss], several tpp per budget.",
    growth="DATA.csv [depth, compute_flops, rho, val_loss], several rho per (depth, budget).",
    lr="DATA.csv [params, value, val_loss (+ hparam)], several values per size.",
    loops="GRID.csv [depth, loops, weight_decay, compute_flops, val_loss] (compute without attention, as the "
          "release's loop_grid.csv) or train.py runs (a runs dir or a glob of result.json).\nDefault budgets: the "
          "release's five, " + ", ".join(f"{b:.6e}" for b in FIT["loop_budgets"]) + " FLOPs.",
)


def build_parser():
    p = Parser(prog="fit.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    add = lambda name, helptext: sub.add_parser(name, help=helptext, description=f"{helptext}.\n\n{CONTRACTS[name]}",
                                                formatter_class=argparse.RawDescriptionHelpFormatter)
    s = add("ladders", "per-arm power laws, multipliers, forecasts, figures")
    s.add_argument("inputs", nargs="+", help="CSV files, result.json files, run dirs, runs dirs or globs")
    s.add_argument("--reference-arm", default="vanilla")
    s.add_argument("--anchor-depth", type=int, default=FIT["anchor_depth"],
                   help="multipliers at the reference budgets with depth >= this; C0 = its compute (8; cpu preset: 3)")
    s.add_argument("--out", help="write Figure 3 and Figure 2 (left) as PNG + PDF into this directory")
    s.add_argument("--bootstrap", type=int, help=f"resamples for CIs (default 0, or "
                                                 f"{FIT['default_extrapolate_boot']} with --extrapolate)")
    s.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    s.add_argument("--time", action="store_true", help="use training time (seconds) instead of FLOPs")
    s.add_argument("--extrapolate", type=positive_float, metavar="C",
                   help="per arm at compute C: forecast loss, gain C_ref(L_arm(C))/C (Figure 4) and pi(C), with CIs")
    s.add_argument("--holdout", nargs="+", metavar="ARM:DEPTH", help="leave these points out of every fit and "
                                                                      "report their forecast, e.g. untied_grow:18")
    s.add_argument("--replicates", action="store_true", help="rows repeating an (arm, depth) are seed replicates")
    s.add_argument("--noise", type=positive_float, metavar="SIGMA",
                   help="relative run-to-run noise (sd of ln val_loss of one run) when there are no replicates")
    s = add("design", "simulate planned ladders: CI widths, detection power, GPU-hours")
    s.add_argument("plan", nargs="+", help="train.py --dry-run JSON lines or CSV of planned computes ('-' = stdin)")
    s.add_argument("--noise", type=positive_float, metavar="SIGMA", help="relative run-to-run noise "
                                                                                    "(sd of ln val_loss of one run)")
    s.add_argument("--truth", metavar="PILOT.json", help="true curves: a `fit.py ladders --json` output")
    s.add_argument("--E", type=positive_float, help="true floor (with --gamma, --A: every arm's curve)")
    s.add_argument("--gamma", type=positive_float)
    s.add_argument("--A", type=positive_float, help="true A at C = 1e18 FLOPs")
    s.add_argument("--delta-gamma", type=float, metavar="DG", help="every other arm's true gamma = reference's + DG")
    s.add_argument("--design", action="append", metavar="SPEC", help="repeatable: 'd6-18', 'd6-22 x3@top2', ...")
    s.add_argument("--reference-arm", default="vanilla")
    s.add_argument("--sims", type=int, default=400, help="simulated ladders per design")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--fixed-E", action="store_true", help="fit gamma with the true E known (no E refit)")
    s.add_argument("--gpu", choices=["h100", "h200", "a100", "b200"], default="h100", help="peak dense bf16 "
                   "FLOP/s for GPU-hours (h100/h200 989e12, a100 312e12, b200 2250e12)")
    s.add_argument("--peak-flops", type=positive_float, help="overrides --gpu's peak")
    s.add_argument("--mfu", type=positive_float, default=0.4, help="model FLOPs utilisation (0.4)")
    s.add_argument("--out", help="write design_ci_vs_compute.{png,pdf} into this directory")
    s = add("surface", "Chinchilla / Skaling L(N, D) fits")
    s.add_argument("data")
    s.add_argument("--form", choices=["chinchilla", "skaling", "both"], default="both")
    s.add_argument("--delta", type=positive_float, help="Huber delta on ln L (default per form: "
                   f"{FIT['surface_delta']['chinchilla']:g} Chinchilla, {FIT['surface_delta']['skaling']:g} Skaling)")
    s.add_argument("--drop-highest", type=int, default=0, metavar="N",
                   help="drop the N highest-loss rows before fitting (Hoffmann et al. drop 5)")
    s.add_argument("--hops", type=int, default=100, help="basin-hopping iterations after the grid of starts")
    s.add_argument("--folds", type=int, default=5, help="CV folds over the interpolation points")
    s.add_argument("--holdout", type=float, default=0.25, help="fraction of distinct N (and D) values held out as 'large'")
    s.add_argument("--sparse-l", action="store_true", help="also fit on the L-shaped subset (min N or min D)")
    s.add_argument("--budgets", type=float, nargs="+", help="compute budgets for N*(C), D*(C)")
    s.add_argument("--seed", type=int, default=0)
    s = add("downstream", "CORE forecast (App. C.4)")
    s.add_argument("data")
    s.add_argument("--reference-arm", default="vanilla")
    s.add_argument("--targets", type=float, nargs="+", default=list(FIT["gpt3_targets"]))
    s.add_argument("--at", type=float, nargs="*", default=[], help="compute budgets to forecast CORE at")
    for name, helptext in (("tpp", "optimal tokens per parameter"), ("growth", "optimal growth fraction"),
                           ("lr", "hyperparameter drift exponent"), ("loops", "optimal loop count and frontiers")):
        s = add(name, helptext)
        s.add_argument("data")
        if name == "loops":
            s.add_argument("--wd", type=float, default=0.8, help="fixed weight decay of the loop curves")
            s.add_argument("--budgets", type=positive_float, nargs="+",
                           help="compute budgets (FLOPs); default: the release's five (above)")
    for s in sub.choices.values():
        s.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


# subcommand -> the module with its cmd_<subcommand>; the others import this one, so they are imported when used
SUBCOMMAND_MODULES = dict(ladders="fit", downstream="fit", design="ladder_design", surface="surface", tpp="sweeps",
                          growth="sweeps", lr="sweeps", loops="sweeps")


def run(argv):
    args = build_parser().parse_args(argv)
    for flag in ("bootstrap", "drop_highest", "anchor_depth"):
        if (getattr(args, flag, None) or 0) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 0")
    getattr(importlib.import_module(SUBCOMMAND_MODULES[args.cmd]), f"cmd_{args.cmd}")(args)


def main(argv=None):
    return cli_main(run, "fit.py", argv)


if __name__ == "__main__":
    sys.modules.setdefault("fit", sys.modules[__name__])  # `import fit` (its subcommand modules) gets this module
    exit_process(main())
