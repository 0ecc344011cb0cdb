"""fit.py — the paper's scaling-law fits, compute multipliers and figures, plus the Skaling L(N, D) law.

Subcommands (CSV column contracts in brackets; extra columns are ignored):
  ladders INPUT...   L(C) = E + A (C/1e18)^-gamma per arm, shared E from the reference arm (spec B.2-B.4), compute
                     multipliers, bootstrap CIs, per-arm free-E check, fitted pi(C), Figure 3 + Figure 2 (left).
                     INPUT = CSV [arm, depth, compute_flops, val_loss (+ training_seconds for --time)] or train.py runs:
                     a result.json, a run dir holding one, a runs dir (*/result.json) or a glob; incomplete runs skipped.
  surface DATA.csv   Chinchilla L = E + A/N^a + B/D^b and Skaling L = (A/N^a + B/D^b)^k + E  [N, D or compute, loss].
  downstream DATA.csv  spec B.6 CORE forecast  [arm, compute_flops, core, nll:<task>..., acc:<task>... (centered)].
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
"""
import argparse, csv, glob, json, math, os, sys, time

# The fits use tiny matrices: a threaded BLAS only adds contention (L-BFGS-B runs ~100x slower on a busy 2-core box).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
from scipy import optimize, stats

FIT = dict(
    c_ref=1e18, time_ref=3600.0,        # power-law x = C / c_ref (FLOPs) or time / 1 h with --time
    e_grid=600, e_grid_top=0.995,       # B.2 initialization grid for E: linspace(0, 0.995 min L, 600)
    huber_k=1.345, mad_to_sigma=0.67448975, min_f_scale=1e-6,  # robust refit f_scale = max(k MAD/0.6745, min)
    anchor_depth=8,                     # B.4: multipliers at the reference arm's budgets with depth >= 8; C0 at d8
    disagree_se=2.0,                    # flag an arm whose own free-E fit puts E > 2 stderrs from the shared E
    extrapolate_warn=10.0,              # warn when --extrapolate C exceeds 10x the largest measured compute
    ci=95.0, default_extrapolate_boot=200,
    inset_span=5.0,                     # Figure inset shows the top factor-5 of compute (2e19..1e20 on the paper)
    nll_min_scale=0.002, sigmoid_min_scale=0.005,  # B.6 Huber f_scale floors
    gpt3_targets=(0.329, 0.361, 0.385, 0.427),      # B.6 CORE of GPT-3 2.7B / 6.7B / 13B / 175B
)
# Surface-fit bounds (a = ln A, b = ln B, e = ln E): generous enough for N, D in raw counts, tight enough for L-BFGS-B.
SURFACE_BOUNDS = dict(a=(-10, 50), b=(-10, 50), alpha=(0.01, 2.0), beta=(0.01, 2.0), e=(-10, 3), k=(0.05, 5.0))
ARM_STYLE = {  # arm -> (label, colour) for figures
    "vanilla": ("Vanilla", "black"), "deep_vanilla": ("Deep Vanilla", "tab:gray"),
    "deep_vanilla_grow": ("Deep Vanilla Grow", "tab:brown"), "operator_1": ("Operator-1", "tab:blue"),
    "loop_2": ("Loop-2", "tab:cyan"), "loop_grow": ("Loop-Grow", "tab:green"),
    "untied_2": ("Untied-2", "tab:orange"), "untied_grow": ("Untied-Grow", "tab:red")}
FIG2_ARMS = ("vanilla", "operator_1", "loop_2", "untied_2", "loop_grow", "untied_grow")


class UsageError(Exception):
    """Unusable command-line input: one line on stderr, exit 2."""


class FitError(Exception):
    """One arm / group cannot be fitted; the others go on."""


def note(msg):
    print(f"fit.py: {msg}", file=sys.stderr)


def read_csv(path, required, numeric=()):
    """Columns of a CSV as lists (numeric ones as float arrays); missing file/column -> UsageError."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}")
    header = rows[0].keys() if rows else []
    missing = [c for c in required if c not in header]
    if missing:
        raise UsageError(f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(required)})")
    cols = {c: [r[c] for r in rows] for c in header}
    for c in numeric:
        try:
            cols[c] = np.array([float(v) for v in cols[c]])
        except (TypeError, ValueError):
            raise UsageError(f"{path}: column {c} has a non-numeric value")
    return cols


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
def ladder_rows_from_runs(paths, use_time):
    rows = []
    for path in paths:
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            note(f"skipping {path}: unreadable ({e})")
            continue
        if r.get("status") != "complete":
            note(f"skipping {path}: status {r.get('status')!r}, not complete")
            continue
        key = "total_training_time_seconds" if use_time else "estimated_training_flops"
        try:
            rows.append((r["arch"], int(r["depth"]), float(r[key]), float(r["final_val_loss"])))
        except (KeyError, TypeError, ValueError):
            note(f"skipping {path}: needs arch, depth, {key}, final_val_loss")
    return rows


def load_ladders(inputs, use_time):
    """-> {arm: dict(depth, x, loss)} sorted by x (compute FLOPs, or training seconds with --time)."""
    rows = []
    for item in inputs:
        if item.endswith(".csv"):
            xcol = "training_seconds" if use_time else "compute_flops"
            c = read_csv(item, ["arm", "depth", xcol, "val_loss"], numeric=["depth", xcol, "val_loss"])
            rows += [(a, int(d), x, l) for a, d, x, l in zip(c["arm"], c["depth"], c[xcol], c["val_loss"])]
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
    data = {}
    for arm in sorted({r[0] for r in rows}, key=lambda a: (list(ARM_STYLE).index(a) if a in ARM_STYLE else 99, a)):
        pts = sorted((x, d, l) for a, d, x, l in rows if a == arm)
        data[arm] = dict(x=np.array([p[0] for p in pts]), depth=np.array([p[1] for p in pts]),
                         loss=np.array([p[2] for p in pts]))
    return data


# ---------------------------------------------------------------------------------------------------- B.2 - B.4
def robust_lsq(resid, x0, bounds, min_scale, **kw):
    """Plain bounded least_squares, then the Huber refit with f_scale = max(1.345 MAD / 0.6745, min_scale)."""
    plain = optimize.least_squares(resid, x0, bounds=bounds, **kw)
    r = resid(plain.x)
    mad = np.median(np.abs(r - np.median(r)))
    f_scale = max(FIT["huber_k"] * mad / FIT["mad_to_sigma"], min_scale)
    return optimize.least_squares(resid, plain.x, bounds=bounds, loss="huber", f_scale=f_scale, **kw).x


def fit_free_e(x, loss):
    """B.2: L = E + A x^-gamma with E free -> (A, gamma, E)."""
    if len(x) < 3:
        raise FitError(f"fewer than 3 points ({len(x)})")
    lx = np.log(x)
    grid = np.linspace(0.0, FIT["e_grid_top"] * loss.min(), FIT["e_grid"])
    y = np.log(loss[None, :] - grid[:, None])  # OLS of ln(L - E_j) on ln x for all 600 E_j at once (= np.polyfit deg 1)
    dx = lx - lx.mean()
    slope = (y - y.mean(1, keepdims=True)) @ dx / (dx @ dx)
    icpt = y.mean(1) - slope * lx.mean()
    A, g = np.exp(icpt), -slope
    sse = (((grid[:, None] + A[:, None] * x[None, :] ** -g[:, None]) - loss[None, :]) ** 2).sum(1)
    sse[slope >= 0] = np.inf
    j = int(np.argmin(sse))
    if not np.isfinite(sse[j]):
        raise FitError("loss does not decrease with compute (no negative slope for any E)")
    resid = lambda p: p[2] + p[0] * x ** -p[1] - loss
    bounds = ([0, 0, 0], [np.inf, np.inf, np.nextafter(loss.min(), 0)])
    return robust_lsq(resid, [A[j], g[j], grid[j]], bounds, FIT["min_f_scale"])


def free_e_check(x, loss, E_shared):
    """This arm's own free-E fit, its linearised standard errors, and whether its data reject the shared floor."""
    A, g, E = fit_free_e(x, loss)
    J = np.stack([x ** -g, -A * x ** -g * np.log(x), np.ones_like(x)], 1)  # d residual / d (A, gamma, E)
    dof = len(x) - 3
    r = E + A * x ** -g - loss
    cov = np.linalg.pinv(J.T @ J) * (r @ r / dof) if dof > 0 else np.full((3, 3), np.nan)
    g_se, E_se = math.sqrt(cov[1, 1]), math.sqrt(cov[2, 2])
    return dict(free_A=A, free_gamma=g, free_gamma_se=g_se, free_E=E, free_E_se=E_se,
                free_disagrees=bool(abs(E - E_shared) > FIT["disagree_se"] * E_se) if dof > 0 else None)


def fit_shared_e(x, loss, E):
    """B.3: OLS of ln(L - E) on ln x -> dict(gamma, A, gamma_se, r2)."""
    if len(np.unique(x)) < 3:
        raise FitError(f"fewer than 3 distinct points ({len(np.unique(x))})")
    if loss.min() <= E:
        raise FitError(f"loss {loss.min():.4f} <= E = {E:.4f}; the shared floor is above this arm")
    reg = stats.linregress(np.log(x), np.log(loss - E))
    return dict(gamma=-reg.slope, A=math.exp(reg.intercept), gamma_se=reg.stderr, r2=reg.rvalue ** 2)


def compute_at_loss(x, loss, target):
    """B.4: smallest compute reaching `target` on improving segments (linear in loss, log in compute); NaN if none."""
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


def fit_ladders(data, ref_arm, c_ref, anchor_depth=FIT["anchor_depth"]):
    if ref_arm not in data:
        raise UsageError(f"reference arm {ref_arm!r} not in the data (arms: {', '.join(data)})")
    r = data[ref_arm]
    try:
        A_free, g_free, E = fit_free_e(r["x"] / c_ref, r["loss"])
    except FitError as e:
        raise UsageError(f"reference arm {ref_arm}: {e}")
    keep = r["depth"] >= anchor_depth
    budgets, targets = r["x"][keep], r["loss"][keep]
    if not len(budgets):
        raise UsageError(f"reference arm {ref_arm} has no point with depth >= {anchor_depth}; "
                         "pass --anchor-depth (e.g. 3 for the cpu preset)")
    c0 = r["x"][r["depth"] == anchor_depth][0] if (r["depth"] == anchor_depth).any() else budgets[0]
    out = dict(E=E, reference_arm=ref_arm, C0=c0, c_ref=c_ref, budgets=budgets, targets=targets,
               reference_free=dict(A=A_free, gamma=g_free, E=E), arms={}, errors={})
    for arm, d in data.items():
        try:
            res = fit_shared_e(d["x"] / c_ref, d["loss"], E)
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
        try:
            res.update(free_e_check(d["x"] / c_ref, d["loss"], E))
        except FitError as e:
            note(f"arm {arm}: free-E fit failed: {e}")
        out["arms"][arm] = res
    ref = out["arms"][ref_arm]
    for res in out["arms"].values():
        res["fitted_final_multiplier"] = float(fitted_multiplier(ref, res, budgets[-1] / c_ref))
    return out


def bootstrap_ladders(data, fit, n, seed, extrapolate=None):
    """Resample points within each arm (with replacement), refit E on the reference arm, then every arm's gamma, its
    interpolated final multiplier (target fixed at the reference arm's measured loss at the last budget) and pi(C)."""
    rng = np.random.default_rng(seed)
    arms, c_ref, ref_arm = list(fit["arms"]), fit["c_ref"], fit["reference_arm"]
    budget, target = fit["budgets"][-1], fit["targets"][-1]
    pi_at = np.array([budget] + ([extrapolate] if extrapolate else [])) / c_ref
    draws = {a: dict(gamma=np.full(n, np.nan), final=np.full(n, np.nan), pi=np.full((n, len(pi_at)), np.nan)) for a in arms}
    E_draws = np.full(n, np.nan)
    for b in range(n):
        sample = {a: np.sort(rng.integers(0, len(data[a]["x"]), len(data[a]["x"]))) for a in arms}
        laws = {}
        try:
            ri = sample[ref_arm]
            E = fit_free_e(data[ref_arm]["x"][ri] / c_ref, data[ref_arm]["loss"][ri])[2]
            for a in arms:
                x, loss = data[a]["x"][sample[a]], data[a]["loss"][sample[a]]
                try:
                    laws[a] = fit_shared_e(x / c_ref, loss, E)
                except FitError:
                    continue
                draws[a]["gamma"][b] = laws[a]["gamma"]
                draws[a]["final"][b] = 1.0 if a == ref_arm else budget / compute_at_loss(x, loss, target)
        except FitError:
            continue
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
            fit["arms"][a]["extrapolate_ci"] = ci(draws[a]["pi"][:, 1])
    fit.update(E_ci=ci(E_draws), bootstrap=dict(n=n, seed=seed, ci=FIT["ci"]))


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


def ladder_figures(data, fit, out_dir, xname):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10, "legend.fontsize": 7.5})
    os.makedirs(out_dir, exist_ok=True)
    E, c_ref = fit["E"], fit["c_ref"]
    style = lambda a: ARM_STYLE.get(a, (a, None))
    xlabel = "training compute (FLOPs)" if xname == "FLOPs" else "training time (s)"

    def loss_panel(ax, arms):
        xmax = max(data[a]["x"].max() for a in arms)
        inset = ax.inset_axes([0.52, 0.5, 0.45, 0.45])
        for a in arms:
            label, color = style(a)
            r, d = fit["arms"][a], data[a]
            xs = np.geomspace(d["x"].min(), d["x"].max(), 100)
            for axis in (ax, inset):
                axis.plot(d["x"], d["loss"], "o", ms=3.5, color=color)
                axis.plot(xs, E + r["A"] * (xs / c_ref) ** -r["gamma"], "-", lw=1.2, color=color,
                          label=f"{label} (γ={r['gamma']:.3f})" if axis is ax else None)
        ax.set(xscale="log", xlabel=xlabel, ylabel="validation loss", title=f"shared E = {E:.4f}")
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
        if best is not None:
            twin = ax.twinx()
            twin.set_ylim(ax.get_ylim())
            twin.set_yticks([best], [f"{best:.2f}×"])
        ax.legend(loc="upper left", frameon=False)

    def save(fig, name):
        fig.tight_layout()
        for ext in ("png", "pdf"):
            fig.savefig(os.path.join(out_dir, f"{name}.{ext}"), dpi=200)
        plt.close(fig)
        return [os.path.join(out_dir, f"{name}.{ext}") for ext in ("png", "pdf")]

    arms = list(fit["arms"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    loss_panel(axes[0], arms)
    mult_panel(axes[1], arms)
    for a in arms:
        r = fit["arms"][a]
        axes[2].plot(r["logA_C0"], r["gamma"], "o", color=style(a)[1])
        axes[2].annotate(style(a)[0], (r["logA_C0"], r["gamma"]), fontsize=8, xytext=(4, 3), textcoords="offset points")
    axes[2].set(xlabel="log A at C0 (better →)", ylabel="exponent γ (better ↑)")
    axes[2].invert_xaxis()
    paths = save(fig, "fig3_ladders")
    arms2 = [a for a in FIG2_ARMS if a in fit["arms"]] or arms
    fig, axes = plt.subplots(2, 1, figsize=(5.5, 7.5))
    loss_panel(axes[0], arms2)
    mult_panel(axes[1], arms2)
    return paths + save(fig, "fig2_left")


def cmd_ladders(args):
    data = load_ladders(args.inputs, args.time)
    xname, c_ref = ("s", FIT["time_ref"]) if args.time else ("FLOPs", FIT["c_ref"])
    t0 = time.perf_counter()
    fit = fit_ladders(data, args.reference_arm, c_ref, args.anchor_depth)
    t_fit = time.perf_counter() - t0
    n_boot = args.bootstrap if args.bootstrap is not None else (FIT["default_extrapolate_boot"] if args.extrapolate else 0)
    t_boot = None
    if n_boot > 0:
        t0 = time.perf_counter()
        bootstrap_ladders(data, fit, n_boot, args.seed, args.extrapolate)
        t_boot = time.perf_counter() - t0
    if args.extrapolate:
        x_max = max(d["x"].max() for d in data.values())
        if args.extrapolate > FIT["extrapolate_warn"] * x_max:
            note(f"warning: extrapolating to {args.extrapolate:.3g} {xname}, {args.extrapolate / x_max:.0f}x beyond "
                 f"the largest measured point ({x_max:.3g}); the CI assumes the power laws hold that far")
        ref = fit["arms"][args.reference_arm]
        for r in fit["arms"].values():
            r["extrapolate"] = dict(compute=args.extrapolate, multiplier=float(fitted_multiplier(ref, r, args.extrapolate / c_ref)),
                                    ci=r.pop("extrapolate_ci", [np.nan, np.nan]))
    paths = ladder_figures(data, fit, args.out, xname) if args.out else []
    if args.json:
        keep = ("gamma", "gamma_se", "A", "logA_C0", "r2", "multipliers", "final_multiplier", "fitted_final_multiplier",
                "gamma_boot_se", "gamma_ci", "delta_gamma_ci", "final_multiplier_ci", "fitted_final_multiplier_ci", "bootstrap_valid", "free_E", "free_gamma",
                "free_A", "free_gamma_se", "free_E_se", "free_disagrees", "extrapolate")
        obj = dict(E=fit["E"], reference_arm=fit["reference_arm"], C0=fit["C0"], x_unit=xname, c_ref=c_ref,
                   arms={a: {k: r[k] for k in keep if k in r} for a, r in fit["arms"].items()}, errors=fit["errors"])
        obj.update({k: fit[k] for k in ("E_ci", "bootstrap") if k in fit})
        print(json.dumps(jsonable(obj), allow_nan=False))
        return
    print(ladder_table(fit, xname))
    if args.extrapolate:
        print(f"\nfitted multiplier pi at {args.extrapolate:.3g} {xname}:")
        for a, r in fit["arms"].items():
            e = r["extrapolate"]
            print(f"  {a:<18} {e['multiplier']:.3f}  [{fnum(e['ci'][0], '.3f')}, {fnum(e['ci'][1], '.3f')}]")
    print(f"\nfit: {t_fit:.2f} s" + (f"; bootstrap {n_boot} resamples: {t_boot:.1f} s" if t_boot else ""))
    for p in paths:
        print(f"wrote {p}")


# ---------------------------------------------------------------------------------------------------- surface
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


def cmd_surface(args):
    c = read_csv(args.data, ["N", "loss"])
    have = [k for k in ("D", "compute") if k in c]
    if not have:
        raise UsageError(f"{args.data}: need a D or a compute column besides N and loss")
    c = read_csv(args.data, ["N", "loss", have[0]], numeric=["N", "loss", have[0]])
    N, L = c["N"], c["loss"]
    D = c["D"] if "D" in c else c["compute"] / (6 * N)
    if len(L) < 7 or (L <= 0).any() or (N <= 0).any() or (D <= 0).any():
        raise UsageError(f"{args.data}: need >= 7 rows with positive N, D and loss")
    forms = ["chinchilla", "skaling"] if args.form == "both" else [args.form]
    regimes = split_regimes(N, D, args.holdout)
    out = dict(delta=args.delta, regimes={k: int(v.sum()) for k, v in regimes.items()}, forms={})
    C = 6 * N * D
    budgets = args.budgets or list(10.0 ** np.arange(math.floor(np.log10(C.min())), math.ceil(np.log10(C.max())) + 1))
    folds = np.array_split(np.random.default_rng(args.seed).permutation(np.flatnonzero(regimes["interpolation"])),
                           args.folds)
    for form in forms:
        p = fit_surface(N, D, L, form, args.delta, args.hops, args.seed)
        r = dict(params=p, mape_all=mape(p, N, D, L), optimal=[compute_optimal(p, b) for b in budgets],
                 ratio_exponent=(p["alpha"] - p["beta"]) / (p["alpha"] + p["beta"]))
        cv = {k: [] for k in regimes}
        for fold in folds:
            train = regimes["interpolation"].copy()
            train[fold] = False
            pf = fit_surface(N[train], D[train], L[train], form, args.delta, args.hops, args.seed)
            for k, m in regimes.items():
                m = m.copy() if k != "interpolation" else np.isin(np.arange(len(L)), fold)
                cv[k].append(mape(pf, N[m], D[m], L[m]))
        r["cv_mape"] = {k: dict(mean=float(np.mean(v)), std=float(np.std(v))) for k, v in cv.items()}
        if args.sparse_l:
            sub = np.isclose(N, N.min(), rtol=1e-9) | np.isclose(D, D.min(), rtol=1e-9)
            ps = fit_surface(N[sub], D[sub], L[sub], form, args.delta, args.hops, args.seed)
            r["sparse_l"] = dict(n_fit=int(sub.sum()), params=ps, mape_rest=mape(ps, N[~sub], D[~sub], L[~sub]),
                                 mape_far_rest=mape(ps, N[~sub & regimes["far"]], D[~sub & regimes["far"]],
                                                    L[~sub & regimes["far"]]))
        out["forms"][form] = r
    if args.json:
        print(json.dumps(jsonable(out), allow_nan=False))
        return
    print(f"regimes (largest {args.holdout:.0%} of distinct N / D held out): {out['regimes']}; "
          f"{args.folds}-fold CV over the interpolation points")
    for form, r in out["forms"].items():
        p = r["params"]
        print(f"\n{form}: E={p['E']:.4f} A={p['A']:.4g} alpha={p['alpha']:.4f} B={p['B']:.4g} beta={p['beta']:.4f} "
              f"k={p['k']:.4f}  MAPE(all)={r['mape_all']:.3f}%")
        print("  CV MAPE %: " + ", ".join(f"{k} {v['mean']:.3f}±{v['std']:.3f}" for k, v in r["cv_mape"].items()))
        print(f"  D*/N* ~ C^{r['ratio_exponent']:+.3f}")
        for o in r["optimal"]:
            print(f"  C={o['compute']:.3g}: N*={o['N']:.4g} D*={o['D']:.4g} D*/N*={o['ratio']:.2f} L*={o['loss']:.4f}")
        if "sparse_l" in r:
            s = r["sparse_l"]
            print(f"  L-shaped subset ({s['n_fit']} points): MAPE rest {s['mape_rest']:.3f}%, far {fnum(s['mape_far_rest'], '.3f')}%")


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
    c = read_csv(args.data, ["arm", "compute_flops", "core"], numeric=["compute_flops", "core"])
    tasks = [k[4:] for k in c if k.startswith("nll:") and f"acc:{k[4:]}" in c]
    if not tasks:
        raise UsageError(f"{args.data}: no task columns (need nll:<task> and acc:<task> pairs)")
    c = read_csv(args.data, [], numeric=[f"{p}:{t}" for t in tasks for p in ("nll", "acc")] + ["compute_flops", "core"])
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


# ---------------------------------------------------------------------------------------------------- tpp / growth / lr / loops
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
    out = {}
    for key in dict.fromkeys(keys):
        m = np.array([k == key for k in keys])
        try:
            out[key] = quad_vertex(x[m], y[m])
            if not out[key][2]:
                note(f"{label} {key}: vertex outside the swept range (extrapolated)")
        except FitError as e:
            note(f"{label} {key}: {e}; skipped")
    return out


def cmd_tpp(args):
    c = read_csv(args.data, ["compute_flops", "tpp", "val_loss"], numeric=["compute_flops", "tpp", "val_loss"])
    v = grouped_vertices(list(c["compute_flops"]), np.log(c["tpp"]), np.log(c["val_loss"]), "budget")
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
    c = read_csv(args.data, ["depth", "compute_flops", "rho", "val_loss"], numeric=["depth", "compute_flops", "rho", "val_loss"])
    keys = [(int(d), C) for d, C in zip(c["depth"], c["compute_flops"])]
    v = grouped_vertices(keys, c["rho"], c["val_loss"], "depth/budget")
    if not v:
        raise UsageError(f"{args.data}: no (depth, budget) group could be fitted")
    out = dict(groups=[dict(depth=k[0], compute=k[1], rho=xv, loss=yv, inside=ins) for k, (xv, yv, ins) in v.items()])
    out["mean_rho"] = float(np.mean([g["rho"] for g in out["groups"]]))
    out["rho"] = round(out["mean_rho"], 1)  # A.4.3: average the fitted optima and round to one decimal
    emit(args, out, [f"d{g['depth']} C={g['compute']:.4g}: rho*={g['rho']:.3f} loss*={g['loss']:.4f}" for g in out["groups"]]
         + [f"mean rho* = {out['mean_rho']:.3f} -> rho = {out['rho']:.1f}"])


def cmd_lr(args):
    c = read_csv(args.data, ["params", "value", "val_loss"], numeric=["params", "value", "val_loss"])
    hp = c.get("hparam", ["lr"] * len(c["params"]))
    out, lines = {}, []
    for h in dict.fromkeys(hp):
        m = np.array([x == h for x in hp])
        v = grouped_vertices(list(c["params"][m]), np.log(c["value"][m]), np.log(c["val_loss"][m]), f"{h} size")
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


def loop_grid_from_runs(item):
    """The loop-grid columns from train.py runs (a runs dir or a glob of result.json), compute without attention
    as in the paper's loop_grid.csv."""
    paths = sorted(glob.glob(os.path.join(item, "*", "result.json")) if os.path.isdir(item) else glob.glob(item))
    rows = []
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        if r.get("status") == "complete" and "estimated_matrix_flops" in r:
            p = r["plan"]
            rows.append((p["depth"], p["passes_final"], p["weight_decay"], r["estimated_matrix_flops"],
                         r["final_val_loss"]))
    if not rows:
        raise UsageError(f"{item}: no complete train.py runs (result.json) found")
    return {n: np.array(col, dtype=float) for n, col in zip(LOOP_COLUMNS, zip(*rows))}


def cmd_loops(args):
    c = read_csv(args.data, LOOP_COLUMNS, numeric=LOOP_COLUMNS) if args.data.endswith(".csv") \
        else loop_grid_from_runs(args.data)
    at_wd = np.isclose(c["weight_decay"], args.wd)
    if not at_wd.any():
        raise UsageError(f"{args.data}: no rows at weight decay {args.wd} (have {sorted(set(c['weight_decay']))})")
    curves = {}
    for K in sorted(set(c["loops"][at_wd])):
        m = at_wd & (c["loops"] == K)
        o = np.argsort(c["compute_flops"][m])
        curves[K] = (c["compute_flops"][m][o], c["val_loss"][m][o])
    lo, hi = min(x[0] for x, _ in curves.values()), max(x[-1] for x, _ in curves.values())
    budgets = args.budgets or list(np.geomspace(lo, hi, 8)[1:-1])
    out = dict(weight_decay=args.wd, budgets=[])
    for C in budgets:  # loss of each K at C, linear in compute between neighbouring depths, no extrapolation
        Ks = [K for K, (x, _) in curves.items() if x[0] <= C <= x[-1]]
        losses = np.array([np.interp(C, *curves[K]) for K in Ks])
        try:
            xv, yv, inside = quad_vertex(np.log(Ks), np.log(losses))
            row = dict(compute=C, best_loops=math.exp(xv), best_loss=math.exp(yv), inside=inside)
        except FitError as e:
            note(f"budget {C:.3g}: {e} ({len(Ks)} loop counts cover it); skipped")
            continue
        if 1 in Ks:
            row["gap_to_k1"] = float(losses[Ks.index(1)] - row["best_loss"])
        out["budgets"].append(row)
    k1 = c["loops"] == 1
    op1 = []  # Operator-1 at the best weight decay per depth
    for d in sorted(set(c["depth"][k1])):
        m = k1 & (c["depth"] == d)
        i = np.argmin(c["val_loss"][m])
        op1.append((c["compute_flops"][m][i], c["val_loss"][m][i]))
    op1.sort()
    env_wd = lower_envelope(c["compute_flops"][at_wd], c["val_loss"][at_wd])
    env_all = lower_envelope(c["compute_flops"], c["val_loss"])
    if op1:
        C_op, L_op = op1[-1]
        out["operator_1_tuned"] = [dict(compute=x, loss=y) for x, y in op1]
        out["gain_fixed_wd"] = C_op / compute_at_loss_linear(env_wd, L_op)
        out["gain_all_wd"] = C_op / compute_at_loss_linear(env_all, L_op)
        out["frontier_fixed_wd"] = [dict(compute=x, loss=y) for x, y in env_wd if x <= C_op]
    emit(args, out, [f"C={b['compute']:.3g}: K*={b['best_loops']:.2f} loss*={b['best_loss']:.4f}"
                     + (f" gap to K=1 {b['gap_to_k1']:.4f}" if "gap_to_k1" in b else "") for b in out["budgets"]]
         + ([f"Operator-1 (best WD per depth) last point {C_op:.3g} FLOPs, loss {L_op:.4f}: loop scaling at WD {args.wd} "
             f"needs {fnum(out['gain_fixed_wd'], '.2f')}x less compute (all-WD frontier {fnum(out['gain_all_wd'], '.2f')}x)"]
            if op1 else []))


def emit(args, out, lines):
    print(json.dumps(jsonable(out), allow_nan=False) if args.json else "\n".join(lines))


# ---------------------------------------------------------------------------------------------------- CLI
class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser():
    p = Parser(prog="fit.py", description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ladders", help="per-arm power laws, multipliers, figures")
    s.add_argument("inputs", nargs="+", help="CSV files, result.json files, run dirs, runs dirs or globs")
    s.add_argument("--reference-arm", default="vanilla")
    s.add_argument("--anchor-depth", type=int, default=FIT["anchor_depth"],
                   help="multipliers at the reference budgets with depth >= this; C0 = its compute (8; cpu preset: 3)")
    s.add_argument("--out", help="write Figure 3 and Figure 2 (left) as PNG + PDF into this directory")
    s.add_argument("--bootstrap", type=int, help=f"resamples for CIs (default 0, or "
                                                 f"{FIT['default_extrapolate_boot']} with --extrapolate)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--time", action="store_true", help="use training time (seconds) instead of FLOPs")
    s.add_argument("--extrapolate", type=float, metavar="C", help="fitted multiplier pi(C) with its bootstrap CI")
    s = sub.add_parser("surface", help="Chinchilla / Skaling L(N, D) fits")
    s.add_argument("data")
    s.add_argument("--form", choices=["chinchilla", "skaling", "both"], default="both")
    s.add_argument("--delta", type=float, default=1e-3, help="Huber delta on ln L (1e-3 Chinchilla, 0.05 Skaling)")
    s.add_argument("--hops", type=int, default=100, help="basin-hopping iterations after the grid of starts")
    s.add_argument("--folds", type=int, default=5, help="CV folds over the interpolation points")
    s.add_argument("--holdout", type=float, default=0.25, help="fraction of distinct N (and D) values held out as 'large'")
    s.add_argument("--sparse-l", action="store_true", help="also fit on the L-shaped subset (min N or min D)")
    s.add_argument("--budgets", type=float, nargs="+", help="compute budgets for N*(C), D*(C)")
    s.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("downstream", help="spec B.6 CORE forecast")
    s.add_argument("data")
    s.add_argument("--reference-arm", default="vanilla")
    s.add_argument("--targets", type=float, nargs="+", default=list(FIT["gpt3_targets"]))
    s.add_argument("--at", type=float, nargs="*", default=[], help="compute budgets to forecast CORE at")
    for name, helptext in (("tpp", "optimal tokens per parameter"), ("growth", "optimal growth fraction"),
                           ("lr", "hyperparameter drift exponent"), ("loops", "optimal loop count and frontiers")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("data")
        if name == "loops":
            s.add_argument("--wd", type=float, default=0.8, help="fixed weight decay of the loop curves")
            s.add_argument("--budgets", type=float, nargs="+")
    for s in sub.choices.values():
        s.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


def main(argv=None):
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "bootstrap", None) is not None and args.bootstrap < 0:
            raise UsageError("--bootstrap must be >= 0")
        {"ladders": cmd_ladders, "surface": cmd_surface, "downstream": cmd_downstream, "tpp": cmd_tpp,
         "growth": cmd_growth, "lr": cmd_lr, "loops": cmd_loops}[args.cmd](args)
    except UsageError as e:
        print(f"fit.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
