"""laws.py — the math under fit.py: L(C) = E + A (C/1e18)^-gamma ladder fits (E from the reference arm's free-E fit,
shared by every arm; arXiv 2609.19107 Sec. 4.2), compute multipliers, forecasts, the bootstrap, the design simulator,
the Chinchilla/Skaling L(N, D) surface, and the CSV reader. `python fit.py` is the command line."""
import csv, json, math, os, sys, zlib
from dataclasses import fields

import numpy as np

from arms import ARMS, Arm, Preset
from common import UsageError

FIT = dict(
    c_ref=1e18, time_ref=3600.0,        # power-law x = C / c_ref (FLOPs) or time / 1 h with --time
    e_grid=600, e_grid_top=0.995,       # E initialization grid: linspace(0, 0.995 min L, 600)
    huber_k=1.345, mad_to_sigma=0.67448975, min_f_scale=1e-6,  # robust refit f_scale = max(k MAD/0.6745, min)
    anchor_depth=8,                     # multipliers at the reference arm's budgets with depth >= 8; C0 at d8
    disagree_se=2.0,                    # flag an arm whose own free-E fit puts E > 2 stderrs from the shared E
    min_dof=2,                          # residual degrees of freedom below which a fit's ± and CIs are not printed
    ci=95.0, default_extrapolate_boot=200, extrapolate_warn=10.0, design_min_converged=0.8,
    replicate_compute_rtol=1e-6,        # seed replicates of one (arm, depth) must share the planned FLOPs
    inset_span=5.0,                     # Figure inset shows the top factor-5 of compute (2e19..1e20 on the paper)
    nll_min_scale=0.002, sigmoid_min_scale=0.005,  # App. C.4 Huber f_scale floors
    gpt3_targets=(0.329, 0.361, 0.385, 0.427),      # CORE of GPT-3 2.7B / 6.7B / 13B / 175B
    surface_delta=dict(chinchilla=1e-3, skaling=0.05),  # Huber delta on ln L: Hoffmann et al.; the Skaling paper
    # the release's five multi-epoch budgets (FLOPs without attention) at which the paper reads the loop grid
    loop_budgets=(0.846120e18, 1.419447e18, 2.381258e18, 3.994787e18, 6.701636e18),
)
# an arm the table does not know (a CSV's own name) gets one of matplotlib's light tab20 shades, unused by the table
UNKNOWN_ARM_COLOURS = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")


def style(arm):
    """(label, colour) of an arm in every figure: its row of the arms table, else its name and a light shade."""
    shade = UNKNOWN_ARM_COLOURS[zlib.crc32(arm.encode()) % len(UNKNOWN_ARM_COLOURS)]
    return (ARMS[arm].label, ARMS[arm].color) if arm in ARMS else (arm, shade)


def arm_order(arm):
    """Sort key: the arms table's order, then the arms it does not know by name."""
    return (list(ARMS).index(arm), "") if arm in ARMS else (len(ARMS), arm)


class FitError(Exception):
    """One arm / group cannot be fitted; the others go on."""


def note(msg):
    print(f"fit.py: {msg}", file=sys.stderr)


def read_csv(path, required, numeric=(), positive=(), key=(), fraction=()):
    """A CSV a person hands in -> {column: list, or float array if numeric; "_line": each row's line}; anything wrong
    is one UsageError naming file:line. Rows repeating the `key` columns go through drop_repeats."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not part of the header
            reader = csv.DictReader(f)
            rows = [(reader.line_num, r) for r in reader]
            header = reader.fieldnames or []
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}")
    except (UnicodeDecodeError, csv.Error) as e:
        raise UsageError(f"{path}: not a UTF-8 CSV file ({e})")
    if twice := [c for i, c in enumerate(header) if c in header[:i]]:  # DictReader would keep the last silently
        raise UsageError(f"{path}: column {twice[0]} appears twice in the header; keep one")
    if missing := [c for c in required if c not in header]:
        raise UsageError(f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(required)})")
    cols = {c: [r[c] for _, r in rows] for c in header}
    cols["_line"] = [line for line, _ in rows]
    for c in (c for c in numeric if c in header):  # an optional numeric column may be absent
        for i, (v, line) in enumerate(zip(cols[c], cols["_line"])):
            try:
                cols[c][i] = float(v)
            except (TypeError, ValueError):
                cols[c][i] = math.nan
            x = cols[c][i]
            if not math.isfinite(x) or c in positive and x <= 0 or c in fraction and not 0 <= x <= 1:
                need = "a number in [0, 1]" if c in fraction else "a finite number" + (" > 0" if c in positive else "")
                raise UsageError(f"{path}:{line}: column {c} is {v!r}; need {need}")
        cols[c] = np.array(cols[c], dtype=float)
    if key:
        read = [c for c in dict.fromkeys([*required, *numeric]) if c in cols]
        cols = drop_repeats(cols, [c for c in key if c in cols], read, [f"{path}:{line}" for line in cols["_line"]])
    return cols


def drop_repeats(cols, key, compare, origins):
    """A measurement given twice (rows with equal `key` columns) is kept once with a warning when its `compare`
    columns agree, and is an error naming both rows when they differ."""
    first, keep = {}, []
    for i, origin in enumerate(origins):
        k = tuple(cols[c][i] for c in key)
        if k in first:
            j = first[k]
            what = ", ".join(f"{c} {v:g}" if isinstance(v, float) else f"{c} {v}" for c, v in zip(key, k) if v is not None)
            if any(cols[c][i] != cols[c][j] for c in compare):
                raise UsageError(f"{origin} and {origins[j]}: two different results for {what}; remove one")
            note(f"warning: {origin} repeats {origins[j]} ({what}) exactly; kept one")
            continue
        first[k] = i
        keep.append(i)
    return {c: [v[i] for i in keep] if isinstance(v, list) else v[np.array(keep, dtype=int)] for c, v in cols.items()}


def ladder_data(rows, same_compute=True):
    """Ladder rows (arm, depth, x, loss, seed, origin) -> {arm: dict(x, depth, loss, n, reps)} sorted by x. Rows of one
    (arm, depth) with distinct seeds are seed replicates (of one compute, unless not same_compute): the point is their
    mean loss; a repeated row counts once (drop_repeats)."""
    c = drop_repeats({k: list(v) for k, v in zip(("arm", "depth", "x", "loss", "seed", "origin"), zip(*rows))},
                     ["arm", "depth", "seed"], ["x", "loss"], [r[5] for r in rows])
    points, data = {}, {}
    for i, key in enumerate(zip(c["arm"], c["depth"])):
        points.setdefault(key, []).append(i)
    for (arm, depth), at in sorted(points.items(), key=lambda p: (arm_order(p[0][0]), c["x"][p[1][0]], p[0][1])):
        x, reps = np.array([c["x"][i] for i in at]), np.array([c["loss"][i] for i in at])
        if same_compute and np.ptp(x) > FIT["replicate_compute_rtol"] * x.max():
            raise UsageError(f"{c['origin'][at[0]]} and {c['origin'][at[-1]]}: replicates of {arm} d{depth} have "
                             f"different compute ({x.min():.6g} vs {x.max():.6g}); they are not runs of one plan")
        d = data.setdefault(arm, dict(x=[], depth=[], loss=[], n=[], reps=[]))
        for k, v in (("x", x.mean()), ("depth", depth), ("loss", reps.mean()), ("n", len(reps)), ("reps", reps)):
            d[k].append(v)
    return {arm: {k: v if k == "reps" else np.array(v) for k, v in d.items()} for arm, d in data.items()}


def check_outputs(out_dir):
    """--out must name a folder (made when missing); what fit.py writes there replaces its own earlier outputs."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out {out_dir} is a file, not a folder; pass a folder")


def save_figures(out_dir, figures, dpi):
    """Write {file name: matplotlib figure} into out_dir (the format from each name's extension) -> the paths."""
    os.makedirs(out_dir, exist_ok=True)
    for name, fig in figures.items():
        fig.savefig(os.path.join(out_dir, name), format=name.rsplit(".", 1)[1], dpi=dpi)
    return [os.path.join(out_dir, name) for name in figures]


def pyplot():
    """matplotlib.pyplot for writing files (Agg, no display), loaded only when a figure is asked for."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["figure.max_open_warning"] = 0  # `fit.py paper` holds every figure until it writes them
    return plt


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


# The recipe of a ladder: what the arms table's row and the preset set (every flag of train.py that changes one is a
# field of Arm or Preset), and the data pool. Runs fitted as one ladder must agree on it; what a depth derives
# (shapes, counts, steps, growth crossovers) is not compared, the LRs only depth-free (train.py scales them by
# N(d)^-lr_exponent), the width only per layer.
PER_DEPTH_FIELDS = {"label", "color", "figure2", "ladder_depths", "crossover", "default_crossover", "anchor_depth",
                    "device_batch_size", "save_every", "log_every", "data_dir"}
LRS = ("matrix_lr", "embedding_lr", "unembedding_lr", "scalar_lr")
RECIPE = {f.name for cls in (Arm, Preset) for f in fields(cls)} - PER_DEPTH_FIELDS - set(LRS) | {"arch", "optimizer"}


def recipe_of(r, varies=(), shared=()):
    """The recipe fields of a result.json's plan (less `varies`, plus `shared`), depth-free, and its data pool (less
    when it was prepared)."""
    plan = r.get("plan") or {}
    out = {k: v for k, v in plan.items() if k in (RECIPE - set(varies)) | set(shared)}
    if "depth" in plan and "width" in plan:
        out["width / depth"] = plan["width"] / plan["depth"]
    for lr in LRS:
        if plan.get(lr) is not None and "params_tpp" in plan:  # scalar_lr None: the embedding LR
            out[f"{lr} x params_tpp^lr_exponent"] = plan[lr] * plan["params_tpp"] ** plan["lr_exponent"]

    def flat(d, prefix):
        for k, v in d.items():
            if isinstance(v, dict):
                flat(v, f"{prefix}{k}.")
            elif k not in ("created", "finished", "sha256_checked"):
                out[prefix + k] = v
    flat(r.get("data_manifest") or {}, "data_manifest.")
    return out


def check_one_recipe(runs, what, varies=(), shared=()):
    """runs: [(path, result.json dict)] fitted together. Two that differ in a recipe field or the data pool ->
    UsageError naming both and the field; a field one run does not record is not compared."""
    number_ = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    same = lambda a, b: math.isclose(a, b, rel_tol=1e-9) if number_(a) and number_(b) else a == b
    short = lambda v: json.dumps(v, default=str)[:40]
    first = {}
    for path, r in runs:
        for k, v in recipe_of(r, varies, shared).items():
            seen, w = first.setdefault(k, (path, v))
            if not same(v, w):
                raise UsageError(f"{seen} and {path}: {what} with different {k} ({short(w)} vs {short(v)}); a ladder "
                                 "is one recipe on one data pool: pass only the runs of one")


# ---------------------------------------------------------------------------------------------------- fits (Sec. 4.2)
def robust_lsq(resid, x0, bounds, min_scale, **kw):
    """Plain bounded least_squares, then the Huber refit with f_scale = max(1.345 MAD / 0.6745, min_scale)."""
    from scipy import optimize
    plain = optimize.least_squares(resid, x0, bounds=bounds, **kw)
    r = resid(plain.x)
    mad = np.median(np.abs(r - np.median(r)))
    f_scale = max(FIT["huber_k"] * mad / FIT["mad_to_sigma"], min_scale)
    return optimize.least_squares(resid, plain.x, bounds=bounds, loss="huber", f_scale=f_scale, **kw).x


def fit_free_e(x, loss, sd=None):
    """L = E + A x^-gamma with E free -> (A, gamma, E). sd: each point's noise (loss units) to weight the residuals by;
    None = unweighted, the paper's fit."""
    if len(np.unique(x)) < 3:  # three parameters (a resample repeating a point): no slope and floor to place
        raise FitError(f"fewer than 3 points ({len(np.unique(x))} distinct)")
    sd = np.ones_like(loss) if sd is None else sd
    lx = np.log(x)
    grid = np.linspace(0.0, FIT["e_grid_top"] * loss.min(), FIT["e_grid"])
    y = np.log(loss[None, :] - grid[:, None])  # OLS of ln(L - E_j) on ln x for all 600 E_j at once (= np.polyfit deg 1)
    dx = lx - lx.mean()
    slope = (y - y.mean(1, keepdims=True)) @ dx / (dx @ dx)
    A, g = np.exp(y.mean(1) - slope * lx.mean()), -slope
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
    return dict(free_A=A, free_gamma=g, free_gamma_se=g_se, free_E=E, free_E_se=E_se, free_gamma_E_cov=cov[1, 2],
                free_disagrees=bool(abs(E - E_shared) > FIT["disagree_se"] * E_se) if np.isfinite(E_se) else None,
                free_E_bound=bound_of(E, loss))


def fit_shared_e(x, loss, E, sd=None):
    """OLS of ln(L - E) on ln x -> dict(gamma, A, gamma_se, r2). With sd (each point's noise in loss units) it is
    weighted least squares with var ln(L - E) = (sd / (L - E))^2, gamma_se from that known noise, and reduced_chi2
    (~1 when the noise explains the scatter around the law)."""
    if len(np.unique(x)) < 3:
        raise FitError(f"fewer than 3 points ({len(np.unique(x))} distinct)")
    if loss.min() <= E:
        raise FitError(f"loss {loss.min():.4f} <= E = {E:.4f}; the shared floor is above this arm")
    lx, y = np.log(x), np.log(loss - E)
    w = np.ones_like(y) if sd is None else ((loss - E) / sd) ** 2
    X = np.stack([np.ones_like(lx), lx], 1)
    cov = np.linalg.inv(X.T @ (w[:, None] * X))
    icpt, slope = cov @ (X.T @ (w * y))
    res = y - icpt - slope * lx
    chi2 = float(w @ res ** 2 / (len(x) - 2)) if len(x) > 2 else math.nan
    out = dict(gamma=-slope, A=math.exp(icpt), gamma_se=math.sqrt(cov[1, 1] * (chi2 if sd is None else 1.0)),
               r2=1 - res @ res / ((y - y.mean()) @ (y - y.mean())))
    return out if sd is None else dict(out, reduced_chi2=chi2)


def compute_at_loss(x, loss, target):
    """Smallest compute reaching `target` on improving segments (linear in loss, log in compute) or at a point that
    equals it (to 1e-12 relative); NaN if none: never extrapolated."""
    hits = x[np.abs(loss - target) <= 1e-12 * max(1.0, abs(target))]
    best = hits.min() if len(hits) else np.nan
    for x0, x1, l0, l1 in zip(x[:-1], x[1:], loss[:-1], loss[1:]):
        if l1 < l0 and l1 <= target <= l0:
            f = (target - l0) / (l1 - l0)
            best = np.nanmin([best, math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))])
    return best


def matched_multipliers(ref_x, ref_values, x, values, is_reference, higher_better=False):
    """The compute multiplier at each reference budget: budget / the smallest compute at which the arm's measured
    series reaches the reference's value there (NaN where none does). The reference arm is 1.0 by definition."""
    if is_reference:
        return np.ones(len(ref_x))
    sign = -1.0 if higher_better else 1.0
    return np.array([b / compute_at_loss(x, sign * np.asarray(values), sign * t) for b, t in zip(ref_x, ref_values)])


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


def bound_of(E, loss):
    """Where a free-E fit's floor sits on its bounds [0, lowest loss): "0", "the lowest loss" or None (inside)."""
    tol = 1e-6 * loss.min()
    return "0" if E <= tol else "the lowest loss" if E >= loss.min() - tol else None


def fit_ladders(data, ref_arm, c_ref, anchor_depth=FIT["anchor_depth"], sigma=None, E_known=None):
    """The paper's ladder fit (Sec. 4.2): E from the reference arm's free-E fit (or E_known), every arm's shared-E
    law, its multipliers and its own free-E check, then gamma's se with E's uncertainty carried (floor_uncertainty).
    An arm that cannot be fitted is skipped and named in "warnings"."""
    r = data[ref_arm]
    try:
        A_free, g_free, E = fit_free_e(r["x"] / c_ref, r["loss"], point_sd(r, sigma)) if E_known is None else \
            (math.nan, math.nan, E_known)
    except FitError as e:
        raise UsageError(f"reference arm {ref_arm}: {e}")
    keep = r["depth"] >= anchor_depth
    budgets, targets = r["x"][keep], r["loss"][keep]
    if not len(budgets):
        raise UsageError(f"reference arm {ref_arm} has no point with depth >= {anchor_depth}; pass --anchor-depth")
    c0 = r["x"][r["depth"] == anchor_depth][0] if (r["depth"] == anchor_depth).any() else budgets[0]
    out = dict(E=E, reference_arm=ref_arm, C0=c0, c_ref=c_ref, budgets=budgets, targets=targets,
               last_budget_index=int(np.flatnonzero(keep)[-1]), reference_free=dict(A=A_free, gamma=g_free, E=E),
               arms={}, errors={}, warnings=[])
    for arm, d in data.items():
        x, sd = d["x"] / c_ref, point_sd(d, sigma)
        try:
            res = fit_shared_e(x, d["loss"], E, sd)
        except FitError as e:
            out["errors"][arm] = str(e)
            out["warnings"].append(f"arm {arm}: {e}; skipped")
            continue
        res["logA_C0"] = math.log(res["A"]) - res["gamma"] * math.log(c0 / c_ref)
        mult = matched_multipliers(budgets, targets, d["x"], d["loss"], arm == ref_arm)
        res["multipliers"] = [dict(compute=b, multiplier=m) for b, m in zip(budgets, mult) if np.isfinite(m)]
        if len(res["multipliers"]) < len(budgets):
            out["warnings"].append(f"arm {arm}: no improving bracket at {len(budgets) - len(res['multipliers'])} of "
                                   f"{len(budgets)} reference budgets; those multipliers are missing")
        res["final_multiplier"] = res["multipliers"][-1]["multiplier"] if res["multipliers"] else np.nan
        res["points"] = [dict(depth=int(dp), compute=c, loss=l, n=int(k)) for dp, c, l, k in
                         zip(d["depth"], d["x"], d["loss"], d["n"])]
        res["dof"] = len(x) - 2  # the shared-E law's residual degrees of freedom: A and gamma
        if E_known is None:
            try:
                res.update(free_e_check(x, d["loss"], E, sd))
            except FitError as e:
                out["warnings"].append(f"arm {arm}: free-E fit failed: {e}")
        out["arms"][arm] = res
    ref = out["arms"][ref_arm]
    for res in out["arms"].values():
        res["fitted_final_multiplier"] = float(fitted_multiplier(ref, res, budgets[-1] / c_ref))
    floor_uncertainty(out, data, sigma, known=E_known is not None)
    if E_known is None:  # the floor: the reference arm's free-E fit, three parameters
        out.update(E_se=ref.get("free_E_se", math.nan), E_dof=len(r["x"]) - 3, E_bound=bound_of(E, r["loss"]))
    return out


def footing(fit, sigma):
    """What a fit's intervals stand on -> warning lines. Without a given noise the se come from the residuals: a law
    with fewer than FIT["min_dof"] residual dof has none to estimate them from, so its ± and CIs are withheld (None)."""
    need, lines = FIT["min_dof"], []
    if E_short := sigma is None and fit.get("E_dof", need) < need:
        fit.update(E_se=None, E_ci=None)
        lines.append(f"WARNING: the floor E is fitted on {fit['reference_arm']}'s {fit['E_dof'] + 3} points with 3 "
                     f"parameters: {fit['E_dof']} residual degrees of freedom, so E's uncertainty, and with it every "
                     f"± and CI, is unknown and not printed; fit at least {need + 3} depths")
    for arm, r in fit["arms"].items():
        r["intervals_known"] = not (E_short or sigma is None and r["dof"] < need)
        if not r["intervals_known"]:
            r.update({k: None for k in r if k.endswith(("_ci", "_se"))})
    if short := [a for a, r in fit["arms"].items() if sigma is None and r["dof"] < need]:
        lines.append(f"WARNING: {', '.join(short)}: too few points for A and gamma (residual degrees of freedom "
                     f"{', '.join(str(fit['arms'][a]['dof']) for a in short)}); their ± and CIs are unknown and not "
                     f"printed (at least {need + 2} points)")
    if fit.get("E_bound"):
        lines.append(f"note: the floor E = {fit['E']:.6f} sits on its bound ({fit['E_bound']}) of "
                     f"{fit['reference_arm']}'s free-E fit: the data do not pin a floor, and E's ± is not an interval")
    return lines


def floor_uncertainty(fit, data, sigma, known):
    """Carry the shared floor's uncertainty into every arm's gamma and delta-gamma (first order). An arm's gamma
    moves with E as s = d gamma / d E; E and the reference's gamma come from one free-E fit of the reference arm with
    covariance V (free_e_check), and the other arms' data are independent of it, so
      var gamma_arm = se_arm|E^2 + s^2 V_EE,      var gamma_ref = V_gg,
      var (gamma_arm - gamma_ref) = se_arm|E^2 + s^2 V_EE - 2 s V_gE + V_gg.
    gamma_se_given_E keeps the fit's own standard error with E held fixed; with E known (known=True) both agree."""
    ref_arm, c_ref = fit["reference_arm"], fit["c_ref"]
    ref = fit["arms"][ref_arm]
    V_EE, V_gE, V_gg = (0.0, 0.0, ref["gamma_se"] ** 2) if known else \
        (ref.get("free_E_se", math.nan) ** 2, ref.get("free_gamma_E_cov", math.nan), ref.get("free_gamma_se", math.nan) ** 2)
    for arm, res in fit["arms"].items():
        d = data[arm]
        x, loss, sd = d["x"] / c_ref, d["loss"], point_sd(d, sigma)
        h = 1e-4 * (loss.min() - fit["E"])
        s = (fit_shared_e(x, loss, fit["E"] + h, sd)["gamma"] - fit_shared_e(x, loss, fit["E"] - h, sd)["gamma"]) / (2 * h)
        se = res["gamma_se"]
        res.update(gamma_se_given_E=se, delta_gamma=res["gamma"] - ref["gamma"], floor_slope=s)
        if arm == ref_arm:
            res.update(gamma_se=math.sqrt(V_gg), delta_gamma_se=0.0)
        else:
            res.update(gamma_se=math.sqrt(se ** 2 + s ** 2 * V_EE),
                       delta_gamma_se=math.sqrt(max(se ** 2 + s ** 2 * V_EE - 2 * s * V_gE + V_gg, 0.0)))


def central(v):
    """The central FIT["ci"] % range [lo, hi] of the finite values of v (NaNs with fewer than two)."""
    v, tail = v[np.isfinite(v)], (100 - FIT["ci"]) / 2
    return [float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))] if len(v) > 1 else [np.nan, np.nan]


def bootstrap_ladders(data, fit, n, seed, extrapolate=None, noise=None):
    """CIs by refitting n re-drawn data sets: E on the reference arm, then every arm's gamma, its interpolated final
    multiplier, pi(C) and, at --extrapolate, the forecast loss and gain.
    noise=None: resample points within each arm with replacement (the reference arm's target loss at the last budget
    stays its measured value). noise=(sigma, dof): parametric — keep every point and re-draw its run-to-run noise,
    ln L* = ln L + s z / sqrt(n_i), with s^2 = sigma^2 chi2_dof / dof when sigma was estimated from replicates (dof > 0)
    and s = sigma for a given --noise; fits are weighted by sigma and targets are the re-drawn reference losses."""
    rng, sigma = np.random.default_rng(seed), noise[0] if noise else None
    arms, c_ref, ref_arm, budget = list(fit["arms"]), fit["c_ref"], fit["reference_arm"], fit["budgets"][-1]
    pi_at = np.array([budget] + ([extrapolate] if extrapolate else [])) / c_ref
    draws = {a: {k: np.full((n, len(pi_at)) if k == "pi" else n, np.nan) for k in ("gamma", "final", "pi", "forecast",
                                                                                  "gain")} for a in arms}
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
            target = pts[ref_arm]["loss"][fit["last_budget_index"]]
        try:
            p = pts[ref_arm]
            A_free, g_free, E = fit_free_e(p["x"] / c_ref, p["loss"], point_sd(p, sigma))
        except FitError:
            continue
        E_draws[b], laws = E, {}
        for a, p in pts.items():
            try:
                laws[a] = fit_shared_e(p["x"] / c_ref, p["loss"], E, point_sd(p, sigma))
            except FitError:
                continue
            draws[a]["gamma"][b] = laws[a]["gamma"]
            draws[a]["final"][b] = matched_multipliers([budget], [target], p["x"], p["loss"], a == ref_arm)[0]
            if extrapolate:
                draws[a]["forecast"][b], draws[a]["gain"][b] = forecast(
                    dict(A=A_free, gamma=g_free, E=E), None if a == ref_arm else laws[a], extrapolate / c_ref)
        if ref_arm in laws:
            for a in laws:
                draws[a]["pi"][b] = fitted_multiplier(laws[ref_arm], laws[a], pi_at)
    for a in arms:
        d, g = draws[a], draws[a]["gamma"]
        fit["arms"][a].update(gamma_boot_se=float(np.std(g[np.isfinite(g)])) if np.isfinite(g).sum() > 1 else np.nan,
                              gamma_ci=central(g), bootstrap_valid=int(np.isfinite(g).sum()),
                              delta_gamma_ci=central(g - draws[ref_arm]["gamma"]), final_multiplier_ci=central(d["final"]),
                              fitted_final_multiplier_ci=central(d["pi"][:, 0]))
        if extrapolate:
            fit["arms"][a].update(pi_at_extrapolate_ci=central(d["pi"][:, 1]), forecast_loss_ci=central(d["forecast"]),
                                  gain_at_extrapolate_ci=central(d["gain"]))
    fit.update(E_ci=central(E_draws), bootstrap=dict(n=n, seed=seed, ci=FIT["ci"], kind="noise" if noise else "points",
                                                includes_seed_noise=bool(noise)))


# ---------------------------------------------------------------------------------------------------- design
def analytic_gamma_se(x, n, E, A, gamma, sigma):
    """Standard error of gamma from the weighted linear fit of ln(L - E) on ln x with E known, to first order in
    sigma: var ln(L_i - E) = (sigma L_i / (L_i - E))^2 / n_i, x in c_ref units."""
    L = E + A * x ** -gamma
    w = n * ((L - E) / (sigma * L)) ** 2
    lx = np.log(x)
    return 1 / math.sqrt(w @ (lx - (w @ lx) / w.sum()) ** 2)


DRAWS = ("gamma", "gamma_se", "gamma_se_given_E", "delta_gamma", "delta_gamma_se", "lower_floor")  # per arm, ladder


def simulate(points, laws, E, ref_arm, sigma, sims, rng, fixed_E=False):
    """What `fit.py ladders --noise SIGMA` reports on `sims` simulated ladders -> {arm: {key in DRAWS: (sims,) array}}.
    points: {arm: (x in c_ref units, seeds per point)}; laws: {arm: (A, gamma)}. Each run has ln L = ln(E + A x^-gamma)
    + sigma z, a point is the mean of its runs. lower_floor: the arm's free-E fit rejects the shared E for a lower one."""
    out = {a: {k: np.full(sims, np.nan) for k in DRAWS} for a in points}
    for s in range(sims):
        data = {}
        for a, (x, n) in points.items():
            A, g = laws[a]
            runs = (E + A * x ** -g)[:, None] * np.exp(sigma * rng.standard_normal((len(x), int(n.max()))))
            loss = np.array([runs[i, :k].mean() for i, k in enumerate(n)])
            data[a] = dict(x=x, loss=loss, n=n, depth=np.arange(1, len(x) + 1))  # depth only picks the budgets
        try:
            fit = fit_ladders(data, ref_arm, 1.0, 1, sigma, E if fixed_E else None)
        except UsageError:  # the reference arm's free-E fit failed on this draw
            continue
        for a, r in fit["arms"].items():
            lower = np.nan if r.get("free_disagrees") is None else float(r["free_disagrees"] and r["free_E"] < fit["E"])
            for k in DRAWS:
                out[a][k][s] = lower if k == "lower_floor" else r[k]
    return out


def summarize(points, laws, E, ref_arm, sigma, draws):
    """Per arm, over the simulated ladders: the spread of the estimates (the CI half-width an oracle would quote:
    half the central 95 % range), the E-known analytic standard error, and how the analyst's 95 % intervals of one
    ladder do: coverage (how often gamma +- z se contains the true value), power (how often the delta-gamma interval
    excludes 0 on the true side) and how often the arm's own free-E fit reads its difference as a lower floor.
    detect_probability is the oracle's power: the share of estimates beyond the spread's half-width."""
    from scipy import stats
    z = stats.norm.ppf(0.5 + FIT["ci"] / 200)
    q = lambda v: (central(v)[1] - central(v)[0]) / 2
    arms = {}
    for a, (x, n) in points.items():
        d, g_true = draws[a], laws[a][1]
        ok = np.isfinite(d["gamma"])
        share = lambda hit: float(np.mean(hit[ok])) if ok.any() else np.nan
        r = dict(gamma_true=g_true, gamma_ci_halfwidth=q(d["gamma"]), valid=int(ok.sum()), sims=len(ok),
                 gamma_se_known_E=analytic_gamma_se(x, n, E, *laws[a], sigma),
                 gamma_coverage=share(np.abs(d["gamma"] - g_true) <= z * d["gamma_se"]),
                 gamma_coverage_given_E=share(np.abs(d["gamma"] - g_true) <= z * d["gamma_se_given_E"]))
        if a != ref_arm:
            true, dg, side = g_true - laws[ref_arm][1], d["delta_gamma"], 1 if g_true >= laws[ref_arm][1] else -1
            h = q(dg)
            r.update(delta_gamma_true=true, delta_gamma_ci_halfwidth=h, delta_gamma_mean=float(np.mean(dg[ok])),
                     detect_probability=share(dg * side > h),
                     delta_gamma_coverage=share(np.abs(dg - true) <= z * d["delta_gamma_se"]),
                     power=share(dg * side - z * d["delta_gamma_se"] > 0),
                     lower_floor=float(np.nanmean(d["lower_floor"])) if np.isfinite(d["lower_floor"]).any() else np.nan)
        arms[a] = r
    return arms


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
    from scipy import optimize
    skaling = form == "skaling"
    names = ["a", "b", "alpha", "beta", "e"] + (["k"] if skaling else [])
    bounds = [SURFACE_BOUNDS[n] for n in names]
    lnN, lnD, logL = np.log(N), np.log(D), np.log(L)
    fun = lambda th: surface_objective(th, lnN, lnD, logL, delta, skaling)
    local = dict(method="L-BFGS-B", jac=True, bounds=bounds)  # grid starts and hops: default tolerances
    best = None
    for al, be, E0, k in ((al, be, E0, k) for al in (0.1, 0.3, 0.6) for be in (0.1, 0.3, 0.6)
                          for E0 in (0.5 * L.min(), 0.9 * L.min()) for k in ((0.5, 1.0) if skaling else (1.0,))):
        half = (np.median(L) - E0) ** (1 / k) / 2  # each inner term's share at the grid's median (N, D)
        x0 = [math.log(half) + al * np.median(lnN), math.log(half) + be * np.median(lnD), al, be, math.log(E0), k]
        res = optimize.minimize(fun, np.clip(x0[:len(names)], *np.array(bounds).T), **local)
        best = res if best is None or res.fun < best.fun else best
    if hops:
        res = optimize.basinhopping(fun, best.x, niter=hops, rng=np.random.default_rng(seed), minimizer_kwargs=local)
        best = res if res.fun < best.fun else best
    best = optimize.minimize(fun, best.x, **local, options=dict(ftol=1e-15, gtol=1e-9, maxiter=10000))  # polish
    th = dict(zip(names, best.x))
    return dict(A=math.exp(th["a"]), B=math.exp(th["b"]), alpha=th["alpha"], beta=th["beta"], E=math.exp(th["e"]),
                k=th.get("k", 1.0), objective=float(best.fun))


def compute_optimal(p, C):
    """Closed form on C = 6 N D (the outer power k does not move the minimum): N* = G (C/6)^(b/(a+b))."""
    a, b = p["alpha"], p["beta"]
    N = (a * p["A"] / (b * p["B"])) ** (1 / (a + b)) * (C / 6) ** (b / (a + b))
    D = C / 6 / N
    return dict(compute=C, N=N, D=D, ratio=D / N, loss=float(surface_predict(p, N, D)))


def mape(p, N, D, L):
    return float(100 * np.mean(np.abs(surface_predict(p, N, D) - L) / L)) if len(L) else np.nan


# ---------------------------------------------------------------------------------------------------- frontiers
def lower_envelope(x, y, log=False):
    """The compute frontier: the Pareto points (new loss minima in compute order), then their lower convex hull, in
    (compute, loss), or in (log compute, loss) with log=True -> an (n, 2) array of (compute, loss); (0, 2) if empty."""
    pts, best = [], np.inf
    for xi, yi in sorted(zip(x, y)):
        if yi < best:
            pts.append((math.log(xi) if log else xi, yi))
            best = yi
    hull = []
    for p in pts:
        while len(hull) >= 2 and (hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1]) - \
                (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) <= 0:
            hull.pop()
        hull.append(p)
    h = np.array(hull).reshape(-1, 2)
    return np.c_[np.exp(h[:, 0]) if log else h[:, 0], h[:, 1]]
