"""paper.py — the paper's figures from the authors' released measurements (arXiv 2609.19107 Sec. 6, App. B and D).

The release (reference/release/, its SOURCE.md says where it came from) stores ladders as JSON {series: [records]} with
short series names (arms.RELEASE_SERIES maps them), compute in FLOPs or, in timing.json, training hours; the regime
CSVs give compute in EFLOP or FLOPs. The readers here recognise each format by its content. `fit.py paper DIR --out
OUT` regenerates every figure these files support and writes OUT/paper_manifest.json: per figure the numbers it rests
on, the paper's stated number with its section, and the relative difference (an explanation where they differ > 1 %).
Fits follow the release's conventions (its appendix_ladders/README.md): the loss floor is fitted once on Vanilla's
FLOP ladder and shared; multipliers interpolate in log compute without extrapolation.
"""
import csv, json, math, os

import numpy as np

from arms import DATA_CONSTRAINED, RELEASE_SERIES
from common import UsageError
from laws import (FIT, FitError, check_outputs, compute_at_loss, fit_free_e, fit_ladders, jsonable, note,
                  pyplot, read_csv, save_figures, style)

UNITS = dict(hours_max=1e6, eflop_max=1e6)  # compute below this is hours (timing.json) / EFLOP (regime CSVs)
FLOOR_ARM = "vanilla"                        # the release fits the shared floor on Vanilla's FLOP ladder
TOLERANCE = 0.01                             # manifest: a stated number further than 1 % from ours needs a reason
MANIFEST = "paper_manifest.json"


# ------------------------------------------------------------------------------------------------------------ readers
def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror})")
    except ValueError as e:
        raise UsageError(f"{path}: not JSON ({e}); pass a release JSON file or a train.py run")


def is_release_ladders(obj):
    """A release ladder file: {series: [{compute, loss, depth, ...}, ...]}."""
    return isinstance(obj, dict) and bool(obj) and all(
        isinstance(v, list) and v and all(isinstance(r, dict) and {"compute", "loss", "depth"} <= set(r) for r in v)
        for v in obj.values())


def release_ladder_rows(path, obj, use_time):
    """(arm, depth, x, loss, seed, origin) rows of a release ladder file, series renamed by arms.RELEASE_SERIES; x is
    FLOPs, or seconds with use_time (the file must then hold training hours, and vice versa)."""
    rows, names = [], {}
    for series, records in obj.items():
        arm = RELEASE_SERIES.get(series, series)
        if arm in names:
            raise UsageError(f"{path}: series {names[arm]!r} and {series!r} are both {arm}; keep one of them")
        names[arm] = series
        for i, r in enumerate(records):
            try:
                x, loss, depth = float(r["compute"]), float(r["loss"]), r["depth"]
                assert isinstance(depth, int) and depth > 0 and math.isfinite(x) and x > 0 and math.isfinite(loss) \
                    and loss > 0
            except (TypeError, ValueError, AssertionError):
                raise UsageError(f"{path}: {series}[{i}]: needs a whole depth > 0 and finite compute, loss > 0")
            rows.append((arm, depth, x, loss, None, f"{path}:{series}[{i}]"))
    hours = max(r[2] for r in rows) < UNITS["hours_max"]
    if hours != bool(use_time):
        raise UsageError(f"{path}: compute is in {'training hours' if hours else 'FLOPs'}; "
                         + ("pass --time to fit it against training time (the floor then comes from --floor-from FLOP ladders, "
                                     "e.g. the release's ladders.json, or --refit-floor)" if hours else "drop --time (or give "
                                                                                          "the release's timing.json)"))
    return [(a, d, x * 3600.0 if hours else x, l, s, o) for a, d, x, l, s, o in rows]


def flops_column(c):
    """The regime CSVs' `compute`: EFLOP in weight_decay.csv and architectures.csv, FLOPs in regimes.csv -> FLOPs."""
    x = c["compute"]
    return x * 1e18 if x.max() < UNITS["eflop_max"] else x


def release_loop_grid(path):
    """The release's weight_decay.csv [weight_decay, loops, depth, compute (EFLOP), loss] as fit.py loops' columns, or
    None when the CSV is not in the release's form."""
    with open(path, newline="") as f:
        header = {h.strip() for h in next(csv.reader(f), [])}
    if not {"compute", "loss"} <= header or "compute_flops" in header:
        return None
    cols = ["depth", "loops", "weight_decay", "compute", "loss"]
    c = read_csv(path, cols, numeric=cols, positive=["depth", "loops", "compute", "loss"], key=["depth", "loops",
                                                                                              "weight_decay"])
    c["compute_flops"], c["val_loss"] = flops_column(c), c.pop("loss")
    return c


def series_data(rows):
    """Rows -> {arm: dict(x, depth, loss, n, reps)} sorted by x, the shape laws.fit_ladders takes (one run a point).
    A depth given twice is what fit.py ladders makes of it: an exact repeat kept once with a warning, two different
    results refused."""
    data, kept = {}, {}
    for row in rows:
        first = kept.setdefault(row[:2], row)
        if first is not row and (first[2], first[3]) != (row[2], row[3]):
            raise UsageError(f"{row[5]} and {first[5]}: two different results for {row[0]} d{row[1]}; remove one")
        if first is not row:
            note(f"warning: {row[5]} repeats {first[5]} ({row[0]} d{row[1]}) exactly; kept one")
    rows = list(kept.values())
    for arm in dict.fromkeys(r[0] for r in rows):
        pts = sorted((r[2], r[1], r[3]) for r in rows if r[0] == arm)
        data[arm] = dict(x=np.array([p[0] for p in pts]), depth=np.array([p[1] for p in pts]),
                         loss=np.array([p[2] for p in pts]), n=np.ones(len(pts), int),
                         reps=[np.array([p[2]]) for p in pts])
    return data


def share_anchor(data, depth):
    """Figure 16a's shared regression anchor: every arm's point at `depth` takes the mean of the distinct losses
    measured there (equivalent runs of one plan: their compute must agree)."""
    at = {a: int(np.flatnonzero(d["depth"] == depth)[0]) for a, d in data.items() if (d["depth"] == depth).any()}
    if len(at) < 2:
        raise UsageError(f"--shared-anchor {depth}: fewer than two arms have a d{depth} point")
    x = np.array([data[a]["x"][i] for a, i in at.items()])
    if np.ptp(x) > FIT["replicate_compute_rtol"] * x.max():
        raise UsageError(f"--shared-anchor {depth}: the d{depth} points have different compute ({x.min():.6g} vs "
                         f"{x.max():.6g}); they are not equivalent runs")
    mean = float(np.mean(sorted({float(data[a]["loss"][i]) for a, i in at.items()})))
    for a, i in at.items():
        data[a]["loss"][i] = mean
        data[a]["reps"][i] = np.array([mean])
    return mean


def floor_of(data, arm=FLOOR_ARM):
    """The shared floor E: the free-E fit of `arm`'s FLOP ladder (Sec. 4.2)."""
    if arm not in data:
        raise UsageError(f"the floor is fitted on {arm}'s FLOP ladder, and the floor inputs have no {arm} arm; pass "
                         "--floor-from with a FLOP ladder that has one, or --refit-floor")
    try:
        return fit_free_e(data[arm]["x"] / FIT["c_ref"], data[arm]["loss"])[2]
    except FitError as e:
        raise UsageError(f"floor arm {arm}: {e}")


# ----------------------------------------------------------------------------------------------------- the figures
LADDERS = "appendix_ladders"
REGIMES = "appendix_regimes"
# figure -> panels (title, release file, series, reference series, options); options: time axis, shared d8 anchor
LADDER_FIGURES = {
    "fig15a": [("Untied-2 boundary ablations", "ladders", ("dep", "dep_nonorm", "dep_noinject", "dep_nci", "van"), "van", {}),
               ("Loop-2 coda and allocation", "ladders", ("k2", "k2_nci", "k2_fixed_pc", "van"), "van", {}),
               ("Operator-1 allocation", "ladders", ("k1_glr", "k1_1c2", "van"), "van", {})],
    "fig15b": [("training time", "timing", ("van", "deep_van", "deep_van_grow", "k1_glr", "k2", "k2_grow", "dep",
                                           "dep_grow"), "van", dict(time=True))],
    "fig15c": [("constant recipes", "constant", ("van", "k1", "k2", "k2_grow", "dep", "dep_grow"), "van", {})],
    "fig16a": [("Vanilla recipes", "ladders", ("van", "van_glr_wd", "van_glr_om", "van_constant", "van_const_mup_om",
                                              "van_mup_om", "van_wdr1"), "van", dict(anchor=8))],
    "fig16b": [("Operator-1 recipe", "ladders", ("van", "k1_glr", "k1_van_recipe"), "van", {})],
    "fig16c": [("shape", "ladders", ("van", "deep_van", "deeper_van", "k1_glr", "deeper_k1"), "van", {})],
    "fig16d": [("random recurrence", "random", ("k2_grow", "k2_grow_random", "dep_grow"), "k2_grow", {})],
    "fig16e": [("width-only vs coupled", "width_optimizer", ("deep_width", "dep_width", "deep_van", "dep"), "deep_width",
                {})],
    "fig16f": [("Adam vs Muon, width-only", "width_optimizer", ("deep_width", "deep_width_adam"), "deep_width", {}),
               ("Adam vs Muon, coupled", "width_optimizer", ("van", "van_adam"), "van", {})],
}


def stated(what, ours, paper, section, why=None):
    """One manifest row: our number next to the paper's; `why` explains a difference over TOLERANCE."""
    rel = abs(ours - paper) / abs(paper) if paper else None
    row = dict(what=what, ours=ours, paper=paper, section=section, rel_diff=rel)
    if rel is not None and rel > TOLERANCE:
        row["explanation"] = why or "unexplained"
    return row


def ladder_panel(release, panel, E_flops):
    """Fit one panel: (data, fit) with the shared Vanilla FLOP floor (on the time axis too, as the release does)."""
    title, name, series, ref, opts = panel
    obj = read_json(os.path.join(release, LADDERS, name + ".json"))
    use_time = bool(opts.get("time"))
    rows = [r for r in release_ladder_rows(name + ".json", obj, use_time)
            if r[0] in {RELEASE_SERIES.get(s, s) for s in series}]
    data = series_data(rows)
    if "anchor" in opts:
        share_anchor(data, opts["anchor"])
    fit = fit_ladders(data, RELEASE_SERIES.get(ref, ref), FIT["time_ref"] if use_time else FIT["c_ref"],
                      E_known=E_flops)
    return data, fit


def draw_ladders(plt, panels, results, xlabel_of):
    fig, axes = plt.subplots(2, len(panels), figsize=(4.6 * len(panels), 7), squeeze=False)
    for col, (panel, (data, fit)) in enumerate(zip(panels, results)):
        top, bottom = axes[0][col], axes[1][col]
        for arm, r in fit["arms"].items():
            name, color = style(arm)
            d = data[arm]
            xs = np.geomspace(d["x"].min(), d["x"].max(), 50)
            top.plot(d["x"], d["loss"] - fit["E"], "o", ms=3, color=color)
            top.plot(xs, r["A"] * (xs / fit["c_ref"]) ** -r["gamma"], "-", lw=1, color=color,
                     label=f"{name} (γ={r['gamma']:.3f})")
            m = r["multipliers"]
            if m:
                bottom.plot([p["compute"] for p in m], [p["multiplier"] for p in m], "o-", ms=3, color=color,
                            label=name)
        xl = xlabel_of(panel)
        top.set(xscale="log", yscale="log", xlabel=xl, ylabel=f"reducible loss (E = {fit['E']:.4f})", title=panel[0])
        bottom.set(xscale="log", xlabel=f"{style(fit['reference_arm'])[0]} {xl}",
                   ylabel=f"multiplier over {style(fit['reference_arm'])[0]}")
        top.legend(fontsize=6.5, frameon=False)
        bottom.legend(fontsize=6.5, frameon=False)
    fig.tight_layout()
    return fig


def multiplier_at(fit, arm, which):
    m = fit["arms"][arm]["multipliers"]
    return m[which]["multiplier"] if m else math.nan


def ladder_checks(fig_id, results, E_flops):
    """The paper's stated numbers for the ladder figures (Sec. 4.2, App. B)."""
    rows = []
    if fig_id == "fig16b":
        data = results[0][0]
        d8 = {a: float(data[a]["loss"][data[a]["depth"] == 8][0]) for a in ("operator_1", "Operator-1 (Vanilla recipe)")}
        rows.append(stated("Operator-1 loss cost of Vanilla's recipe at d8", d8["Operator-1 (Vanilla recipe)"] -
                           d8["operator_1"], 7.8e-3, "Sec. 4.1", "ladders.json's d8 points differ by this much; the "
                           "text's 7.8e-3 is not what the released d8 runs give"))
    if fig_id == "fig16a":
        fit = results[0][1]
        spread = max(abs(multiplier_at(fit, a, -1) - 1) for a in ("Vanilla GLR+WD", "Vanilla GLR+OM")
                     if a in fit["arms"] and fit["arms"][a]["multipliers"])
        rows.append(stated("largest change of the final multiplier from adding OM or WD scaling to GLR", spread, 0.03,
                           "App. B.2", "the text gives a bound ('at most about 3 %'), not a value"))
    return rows


def effective_depth_figure(plt, release):
    obj = read_json(os.path.join(release, "effective_depth.json"))
    try:
        ladders, multi = obj["ladders"], obj["multi_epoch"]
        curves = {RELEASE_SERIES.get(s, s): (np.array([r["compute_flops"] for r in recs]),
                                             np.array([r["effective_depth"] for r in recs])) for s, recs in ladders.items()}
        mx = np.array(multi["compute_flops"])
        multi_curves = {k: np.array(v) for k, v in multi.items() if k != "compute_flops"}
    except (KeyError, TypeError) as e:
        raise UsageError(f"effective_depth.json: missing or malformed field {e}; the release's file has 'ladders' and "
                         "'multi_epoch'")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for arm, (x, y) in curves.items():
        name, color = style(arm)
        left.plot(x, y, "o-", ms=3, color=color, label=name)
    left.set(xscale="log", xlabel="training compute (FLOPs)", ylabel="KL effective depth", title="single-epoch ladders")
    left.legend(fontsize=7, frameon=False)
    for k, y in multi_curves.items():
        right.plot(mx, y, "o-", ms=3, label=k.replace("_", " "))
    right.set(xscale="log", xlabel="training compute (FLOPs)", ylabel="KL effective depth", title="multi-epoch (10 epochs)")
    right.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    last = lambda arm: float(curves[arm][1][np.argmax(curves[arm][0])])
    checks = [stated("Untied-2 KL effective depth at the top budget", last("untied_2"), 24, "Sec. 6"),
              stated("Deep Vanilla KL effective depth at the top budget", last("deep_vanilla"), 20, "Sec. 6")]
    numbers = {arm: dict(compute=x.tolist(), effective_depth=y.tolist()) for arm, (x, y) in curves.items()}
    return fig, numbers, checks


def recurrence_figure(plt, release):
    """Figure 17: L(k) - L(K_train) per checkpoint."""
    obj = read_json(os.path.join(release, LADDERS, "recurrence.json"))
    fig, axes = plt.subplots(1, len(obj), figsize=(3.4 * len(obj), 3.4), squeeze=False)
    numbers, at8 = {}, {}
    cmap = plt.get_cmap("viridis")
    for ax, (series, recs) in zip(axes[0], obj.items()):
        arm = RELEASE_SERIES.get(series, series)
        depths = [r["depth"] for r in recs]
        for r in recs:
            ce = {e["k"]: e["ce"] for e in r["exit_lens"]}
            K = r["core_repetitions"]
            if K not in ce:
                raise UsageError(f"recurrence.json: {series} d{r['depth']} has no exit at its trained recurrence {K}")
            ks = sorted(ce)
            delta = [ce[k] - ce[K] for k in ks]
            numbers.setdefault(arm, []).append(dict(depth=r["depth"], k_train=K, k=ks, delta=delta))
            if 8 in ce:
                at8.setdefault(arm, []).append(ce[8] - ce[K])
            color = cmap((r["depth"] - min(depths)) / max(1, max(depths) - min(depths)))
            ax.plot(ks, delta, "o-", ms=3, color=color, label=f"d{r['depth']}")
            ax.plot([K], [0], "*", ms=9, color=color)
        ax.axhline(0, color="gray", lw=0.5)
        ax.set(xlabel="evaluation recurrence k", ylabel="L(k) − L(K_train)", title=style(arm)[0])
        ax.legend(fontsize=6, frameon=False)
    fig.tight_layout()
    checks = []
    if "Loop-Grow random K" in at8:
        r = at8["Loop-Grow random K"]
        checks += [stated("random-K Loop-Grow, L(8) - L(4), smallest", min(r), -0.0003, "App. B.5",
                          "the text rounds to 1e-4: -0.00034 prints as -0.0003"),
                   stated("random-K Loop-Grow, L(8) - L(4), largest", max(r), 0.0028, "App. B.5")]
    if "loop_grow" in at8:
        r = at8["loop_grow"]
        checks += [stated("fixed Loop-Grow, L(8) - L(4), smallest", min(r), 0.008, "App. B.5"),
                   stated("fixed Loop-Grow, L(8) - L(4), largest", max(r), 0.042, "App. B.5")]
    return fig, numbers, checks


def regimes_figures(plt, release):
    """Figures 21-24 from the regime CSVs: loss against compute per recurrence (21, 22, 24) and the weight-decay
    sweeps per stored depth (23a) with the K=1 best weight decay."""
    base = os.path.join(release, REGIMES)
    wd = read_csv(os.path.join(base, "weight_decay.csv"), ["weight_decay", "loops", "depth", "compute", "loss"],
                  numeric=["weight_decay", "loops", "depth", "compute", "loss"], positive=["compute", "loss"])
    rg = read_csv(os.path.join(base, "regimes.csv"), ["regime", "compute", "loss", "depth", "loops"],
                  numeric=["compute", "loss", "depth", "loops"], positive=["compute", "loss"])
    ar = read_csv(os.path.join(base, "architectures.csv"), ["architecture", "family", "compute", "loss", "depth",
                                                            "loops"], numeric=["compute", "loss", "depth", "loops"],
                  positive=["compute", "loss"])
    wd_x, rg_x, ar_x = flops_column(wd), flops_column(rg), flops_column(ar)
    cmap = plt.get_cmap("plasma")

    def per_loops(ax, x, loss, loops, mask, title):
        ks = sorted(set(loops[mask]))
        for i, K in enumerate(ks):
            m = mask & (loops == K)
            o = np.argsort(x[m])
            ax.plot(x[m][o], loss[m][o], "o-", ms=3, color=cmap(i / max(1, len(ks))), label=f"K={K:g}")
        ax.set(xscale="log", xlabel="training compute (FLOPs)", ylabel="validation loss", title=title)
        ax.legend(fontsize=6, frameon=False)

    regimes = list(dict.fromkeys(rg["regime"]))
    fig21, axes = plt.subplots(1, len(regimes), figsize=(4 * len(regimes), 3.6), squeeze=False)
    for ax, name in zip(axes[0], regimes):
        per_loops(ax, rg_x, rg["loss"], rg["loops"], np.array(rg["regime"]) == name, name)
    fig21.tight_layout()
    wds = sorted(set(wd["weight_decay"]))
    fig22, axes = plt.subplots(1, len(wds), figsize=(3.4 * len(wds), 3.4), squeeze=False)
    for ax, w in zip(axes[0], wds):
        per_loops(ax, wd_x, wd["loss"], wd["loops"], wd["weight_decay"] == w, f"weight decay {w:g}")
    fig22.tight_layout()
    depths = sorted(set(wd["depth"]))
    fig23, axes = plt.subplots(1, len(depths), figsize=(3 * len(depths), 3.2), squeeze=False)
    best_wd = {}
    for ax, dp in zip(axes[0], depths):
        for i, K in enumerate(sorted(set(wd["loops"]))):
            m = (wd["depth"] == dp) & (wd["loops"] == K)
            o = np.argsort(wd["weight_decay"][m])
            ax.plot(wd["weight_decay"][m][o], wd["loss"][m][o], "o-", ms=3, color=cmap(i / 6), label=f"K={K:g}")
        m1 = (wd["depth"] == dp) & (wd["loops"] == 1)
        if m1.any():
            best_wd[int(dp)] = float(wd["weight_decay"][m1][np.argmin(wd["loss"][m1])])
        ax.set(xscale="log", xlabel="weight decay", ylabel="validation loss", title=f"d{dp:g}")
        ax.legend(fontsize=6, frameon=False)
    fig23.tight_layout()
    groups = list(dict.fromkeys(zip(ar["architecture"], ar["family"])))
    fig24, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.6), squeeze=False)
    for ax, (a, f) in zip(axes[0], groups):
        mask = (np.array(ar["architecture"]) == a) & (np.array(ar["family"]) == f)
        per_loops(ax, ar_x, ar["loss"], ar["loops"], mask, f"{a}, {f}")
    fig24.tight_layout()
    paper_wd = DATA_CONSTRAINED["tuned-wd"].weight_decay  # App. D.3
    checks = [stated(f"best K=1 weight decay at d{d}", best_wd[d], w, "App. D.3") for d, w in paper_wd.items()
              if d in best_wd]
    return {"fig21": (fig21, dict(regimes=regimes), []), "fig22": (fig22, dict(weight_decays=wds), []),
            "fig23a": (fig23, dict(best_k1_weight_decay=best_wd), checks),
            "fig24": (fig24, dict(groups=[list(g) for g in groups]), [])}


def figure3_checks(release, E_flops):
    """Figure 3's caption numbers (Sec. 4.2) from ladders.json's main arms: the check that the readers and the
    shared floor reproduce the main text."""
    obj = read_json(os.path.join(release, LADDERS, "ladders.json"))
    main = {"van", "k1_glr", "k2", "k2_grow", "dep", "dep_grow", "deep_van", "deep_van_grow"}
    data = series_data([r for r in release_ladder_rows("ladders.json", obj, False) if r[5].split(":")[-1].split("[")[0]
                        in main])
    fit = fit_ladders(data, "vanilla", FIT["c_ref"], E_known=E_flops)
    m = lambda a, i: multiplier_at(fit, a, i)
    checks = [stated("shared floor E (Vanilla FLOP ladder)", E_flops, 1.7064, "Fig. 3 (printed in the panel)"),
              stated("Operator-1 multiplier, first budget", m("operator_1", 0), 1.12, "Sec. 4.2, Fig. 3"),
              stated("Operator-1 multiplier, last budget", m("operator_1", -1), 1.25, "Sec. 4.2, Fig. 3"),
              stated("Untied-Grow multiplier, last budget", m("untied_grow", -1), 1.55, "Sec. 4.2, Fig. 3")]
    gammas = {a: r["gamma"] for a, r in fit["arms"].items()}
    return gammas, checks


DOWNSTREAM_METRICS = ("full_core", "answer_nll", "filtered_core", "filtered_core_std")


def downstream_series(path):
    """The release's downstream.json: {series: [{compute, loss, depth, metrics {full_core, answer_nll, filtered_core,
    filtered_core_std}, task_nll {task: answer NLL}}]} (three seeds pooled) -> {arm: records sorted by compute}."""
    obj = read_json(path)
    if not isinstance(obj, dict) or not obj:
        raise UsageError(f"{path}: expected {{series: [records]}} as in the release's downstream.json")
    out = {}
    for series, recs in obj.items():
        arm = RELEASE_SERIES.get(series, series)
        try:
            rows = [dict(compute=float(r["compute"]), loss=float(r["loss"]), depth=int(r["depth"]),
                         **{k: float(r["metrics"][k]) for k in DOWNSTREAM_METRICS},
                         task_nll={str(t): float(v) for t, v in r["task_nll"].items()}) for r in recs]
            assert rows and all(r["compute"] > 0 and all(map(math.isfinite, (r["loss"], r["full_core"],
                                                                               r["answer_nll"]))) for r in rows)
        except (KeyError, TypeError, ValueError, AttributeError, AssertionError) as e:
            raise UsageError(f"{path}: series {series!r}: every record needs compute > 0, loss, depth, metrics "
                             f"{{{', '.join(DOWNSTREAM_METRICS)}}} and task_nll {{task: NLL}} ({type(e).__name__} {e})")
        if arm in out:
            raise UsageError(f"{path}: two series are {arm}; keep one")
        out[arm] = sorted(rows, key=lambda r: r["compute"])
    if FLOOR_ARM not in out:
        raise UsageError(f"{path}: no Vanilla series (van); the multipliers are over Vanilla")
    return out


def downstream_figure(plt, series):
    """Figure 19a-b: CORE and answer NLL against compute per arm, multipliers over Vanilla at matched CORE (the
    compute Vanilla needs for an arm's CORE, interpolated in log compute, never extrapolated), and one equal-weight
    line of answer NLL against validation loss pooled over every checkpoint with its residuals."""
    col = lambda arm, k: np.array([r[k] for r in series[arm]])
    ref_x, ref_core = col(FLOOR_ARM, "compute"), col(FLOOR_ARM, "full_core")
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    numbers = dict(multiplier_at_matched_core={})
    for arm in series:
        name, color = style(arm)
        x, core = col(arm, "compute"), col(arm, "full_core")
        axes[0][0].plot(x, core, "o-", ms=3, color=color, label=name)
        mult = [float(compute_at_loss(ref_x, -ref_core, -c) / xc) for xc, c in zip(x, core)]
        numbers["multiplier_at_matched_core"][arm] = dict(compute=x.tolist(), multiplier=mult)
        axes[1][0].plot(x, mult, "o-", ms=3, color=color, label=name)
        axes[0][1].plot(col(arm, "loss"), col(arm, "answer_nll"), "o", ms=3, color=color, label=name)
    loss = np.concatenate([col(a, "loss") for a in series])
    nll = np.concatenate([col(a, "answer_nll") for a in series])
    slope, intercept = np.polyfit(loss, nll, 1)
    numbers["pooled_line"] = dict(slope=float(slope), intercept=float(intercept), points=len(loss))
    xs = np.linspace(loss.min(), loss.max(), 20)
    axes[0][1].plot(xs, intercept + slope * xs, "k--", lw=1, label=f"pooled: {slope:.3f} L + {intercept:.3f}")
    for arm in series:
        axes[1][1].plot(col(arm, "loss"), col(arm, "answer_nll") - (intercept + slope * col(arm, "loss")), "o", ms=3,
                        color=style(arm)[1])
    axes[0][0].set(xscale="log", xlabel="training compute (FLOPs)", ylabel="CORE")
    axes[1][0].set(xscale="log", xlabel="training compute (FLOPs)", ylabel="multiplier over Vanilla at matched CORE")
    axes[0][1].set(xlabel="validation loss", ylabel="CORE answer NLL")
    axes[1][1].set(xlabel="validation loss", ylabel="residual from the pooled line")
    for ax in (axes[0][1], axes[1][1]):
        ax.invert_xaxis()
        ax.invert_yaxis()
    for ax in (axes[0][0], axes[0][1]):
        ax.legend(fontsize=6, frameon=False)
    fig.tight_layout()
    return fig, numbers


class JsonFile:
    """The manifest, written by laws.save_figures beside the figures (atomically, and listed as fit.py's)."""
    def __init__(self, obj):
        self.obj = obj

    def savefig(self, path, format, dpi):
        with open(path, "w") as f:
            json.dump(jsonable(self.obj), f, indent=1, allow_nan=False)


def cmd_paper(args):
    release = args.release
    if os.path.isdir(os.path.join(release, "release")):  # `fit.py paper reference/`
        release = os.path.join(release, "release")
    if not os.path.isfile(os.path.join(release, LADDERS, "ladders.json")):
        raise UsageError(f"{args.release}: no {LADDERS}/ladders.json; pass the release folder (reference/ or "
                         "reference/release/)")
    downstream = os.path.join(release, LADDERS, "downstream.json")
    ids = list(LADDER_FIGURES) + ["fig06", "fig17", "fig21", "fig22", "fig23a", "fig24"] + \
        (["fig19"] if os.path.isfile(downstream) else [])
    names = [f"{i}.{ext}" for i in ids for ext in ("png", "pdf")] + [MANIFEST]
    check_outputs(args.out, names)
    plt = pyplot()
    flops = read_json(os.path.join(release, LADDERS, "ladders.json"))
    E_flops = floor_of(series_data(release_ladder_rows("ladders.json", flops, False)))
    manifest, figures = dict(release=os.path.normpath(release), floor_E=E_flops, tolerance=TOLERANCE, figures={}), {}
    gammas, checks = figure3_checks(release, E_flops)
    manifest["figures"]["fig3 (from ladders.json)"] = dict(numbers=dict(gamma=gammas), stated=checks)
    for fig_id, panels in LADDER_FIGURES.items():
        results = [ladder_panel(release, p, E_flops) for p in panels]
        xl = lambda p: "training time (s)" if p[4].get("time") else "training compute (FLOPs)"
        figures[fig_id] = draw_ladders(plt, panels, results, xl)
        numbers = {p[0]: {a: dict(gamma=r["gamma"], final_multiplier=r["final_multiplier"],
                                  multipliers=[m["multiplier"] for m in r["multipliers"]])
                          for a, r in fit["arms"].items()} for p, (_, fit) in zip(panels, results)}
        manifest["figures"][fig_id] = dict(numbers=numbers, stated=ladder_checks(fig_id, results, E_flops))
    for fig_id, (fig, numbers, checks) in [("fig06", effective_depth_figure(plt, release)),
                                           ("fig17", recurrence_figure(plt, release))] + \
            list(regimes_figures(plt, release).items()):
        figures[fig_id] = fig
        manifest["figures"][fig_id] = dict(numbers=numbers, stated=checks)
    if os.path.isfile(downstream):
        figures["fig19"], numbers = downstream_figure(plt, downstream_series(downstream))
        manifest["figures"]["fig19"] = dict(numbers=numbers, stated=[])
    files = {f"{i}.{ext}": figures[i] for i in figures for ext in ("png", "pdf")}
    files[MANIFEST] = JsonFile(manifest)
    paths = save_figures(args.out, files, dpi=150)
    for fig in figures.values():
        plt.close(fig)
    rows = [(fid, r) for fid, entry in manifest["figures"].items() for r in entry["stated"]]
    for fid, r in rows:
        flag = "" if r["rel_diff"] is None or r["rel_diff"] <= TOLERANCE else f"  ({r['explanation']})"
        print(f"{fid:<24} {r['what']:<72} ours {r['ours']:.4g}  paper {r['paper']:.4g} ({r['section']})  "
              f"diff {100 * r['rel_diff']:.1f} %{flag}")
    for p in paths:
        print(f"wrote {p}")
