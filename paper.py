"""paper.py — the paper's figures (arXiv 2609.19107) from the authors' released measurements, in the release's look.

`fit.py paper DIR --out OUT` reads DIR/release/ laid out as the release's plotting data (reference/release/, whose
SOURCE.md says where it came from; loop_grid.csv, fineweb_edu_ladders.json and appendix_ladders/downstream.json are
drawn when present) and writes each figure as PNG + PDF, OUT/paper_manifest.json (per figure its numbers and each
number the text states beside ours) and the gallery OUT/README.md. Rules: the floor E is the free-floor fit of the
file's Vanilla, multipliers interpolate in log compute without extrapolation, loop grids linearly in compute (R4).
"""
import collections, itertools, json, math, os

import numpy as np

from arms import ARMS, DATA_CONSTRAINED, RELEASE_SERIES
from common import UsageError, write_text
from laws import (FIT, FitError, check_outputs, fit_free_e, fit_shared_e, jsonable, ladder_data, lower_envelope,
                  matched_multipliers, pyplot, read_csv, robust_lsq, save_figures)

FLOOR_ARM = "vanilla"                        # the release fits the shared floor on Vanilla's FLOP ladder
TOLERANCE = 0.01                             # manifest: a stated number further than 1 % from ours needs a reason
MANIFEST = "paper_manifest.json"


# ------------------------------------------------------------------------------------------------------------ readers
def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read it as JSON ({getattr(e, 'strerror', None) or e})")


# The release's JSON layouts, recognised by their content; a command names the ones it reads when it refuses a file.
LAYOUTS = dict(
    ladders="the release's ladder series {series: [{compute, loss, depth}]} (appendix_ladders/*.json)",
    downstream="the release's downstream.json {series: [{compute, loss, depth, metrics, task_nll}]}",
    fineweb_edu="the release's FineWeb-Edu ladders {tasks, d26: {record}, arms: {arm: [{depth, compute_flops, "
                "val_loss, core_nll, core_accuracy, task_nll, task_accuracy}]}}",
)
EDU_HELD_OUT_ARM = "untied_grow"  # the FineWeb-Edu file's d26 record: the 7.4B Untied-Grow run no fit uses (Sec. 4.3)


def json_layout(obj):
    if isinstance(obj, dict) and isinstance(obj.get("arms"), dict) and "tasks" in obj:
        return "fineweb_edu"
    if isinstance(obj, dict) and obj and all(isinstance(v, list) and v and all(  # {series: [{compute, loss, depth}]}
            isinstance(r, dict) and {"compute", "loss", "depth"} <= set(r) for r in v) for v in obj.values()):
        return "downstream" if all("metrics" in r for v in obj.values() for r in v) else "ladders"
    return None


def layout_error(path, reads, also=""):
    return UsageError(f"{path}: not a JSON layout this command reads; it reads {also}"
                      + "; ".join(LAYOUTS[k] for k in reads))


def read_layout(path, *layouts):
    obj = read_json(path)
    if json_layout(obj) not in layouts:
        raise layout_error(path, layouts)
    return obj


def edu_records(path, obj):
    """The FineWeb-Edu layout -> (tasks, [(arm, record, origin, held_out)]); records beside "arms" (the d26 run,
    Untied-Grow's unless it names an "arm") are held out of every fit."""
    if not isinstance(obj["tasks"], list) or not all(isinstance(t, str) for t in obj["tasks"]):
        raise UsageError(f"{path}: 'tasks' must be a list of task names")
    out = [(RELEASE_SERIES.get(a, a), r, f"{path}:arms.{a}[{i}]", False) for a, recs in obj["arms"].items()
           for i, r in enumerate(recs if isinstance(recs, list) else [None])]
    if not out:
        raise UsageError(f"{path}: 'arms' holds no ladder records")
    out += [(r.get("arm", EDU_HELD_OUT_ARM), r, f"{path}:{k}", True) for k, r in obj.items()
            if k not in ("tasks", "arms") and isinstance(r, dict)]
    for arm, r, origin, _ in out:
        point(r, "compute_flops", "val_loss", origin)
    return obj["tasks"], out


def point(r, x, loss, origin):
    """A ladder record's (x, loss, depth): a whole depth > 0, finite x > 0 and loss > 0, or one line saying so."""
    try:
        out = float(r[x]), float(r[loss]), r["depth"]
    except (KeyError, TypeError, ValueError):
        out = (math.nan, math.nan, None)
    if not (isinstance(out[2], int) and out[2] > 0 and all(math.isfinite(v) and v > 0 for v in out[:2])):
        raise UsageError(f"{origin}: needs a whole depth > 0 and finite {x}, {loss} > 0")
    return out


def release_ladder_rows(path, obj, use_time):
    """(arm, depth, x, loss, seed, origin) rows of a release ladder file; x: FLOPs, or seconds (use_time)."""
    rows, names = [], {}
    for series, records in obj.items():
        arm = RELEASE_SERIES.get(series, series)
        if arm in names:
            raise UsageError(f"{path}: series {names[arm]!r} and {series!r} are both {arm}; keep one of them")
        names[arm] = series
        for i, r in enumerate(records):
            x, loss, depth = point(r, "compute", "loss", f"{path}: {series}[{i}]")
            rows.append((arm, depth, x, loss, None, f"{path}:{series}[{i}]"))
    hours = max(r[2] for r in rows) < 1e6  # timing.json's training hours
    if hours and not use_time:
        raise UsageError(f"{path}: compute is in training hours; pass --time to fit it against training time (the "
                         "floor then comes from --floor-from FLOP ladders, e.g. the release's ladders.json, or "
                         "--refit-floor)")
    if use_time and not hours:
        raise UsageError(f"{path}: compute is in FLOPs; drop --time (or give the release's timing.json)")
    return [(a, d, x * 3600.0 if hours else x, l, s, o) for a, d, x, l, s, o in rows]


def share_anchor(data, depth):
    """Figure 16a's shared anchor: each arm's point at `depth` takes the mean of the distinct losses measured there."""
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


# ----------------------------------------------------------------------------------------------------- the look
# The release's appendix look (paper App. B-D): every arm in its arms-table colour and marker, an ablation in its
# family's colour told apart by marker, dash and a hollow face; the appendix spells the growth arms "Loop Grow".
INK, MUTED, GRID = "#22252A", "#68707C", "#DDE1E7"
LADDER_SIZE, APPENDIX_SIZE = (8, 9, 8, 7, 7), (9.5, 10.5, 10, 8.5, 8)
#           release key: (label, family arm or colour, marker, line style, hollow)
VARIANTS = {"dep_nci": ("No Coda Inj.", "untied_2", "X", "-.", False),
            "k2_nci": ("No Coda Inj.", "loop_2", "X", "--", False),
            "dep_nonorm": ("Deep + Inj.", "deep_vanilla", "p", "--", False),
            "k1_1c2": ("1/C/2", "operator_1", "d", "-", False),
            "dep_noinject": ("Deep + Norm", "deep_vanilla", "v", ":", False),
            "k2_fixed_pc": ("NCI 2/C/3", "loop_2", "*", ":", False),
            "k1_van_recipe": ("Operator-1 Vanilla Recipe", "operator_1", "H", "-", True),
            "deeper_van": ("Deeper Vanilla", "deep_vanilla", "D", "-", True),
            "deeper_k1": ("Deeper Operator-1", "operator_1", "X", "-", True),
            "k2_grow_random": ("Rand. Loop", "loop_grow", "X", (0, (4, 2)), True),
            "deep_width": ("Deep Vanilla", "deep_vanilla", "h", "-", True),
            "dep_width": ("Untied-2", "untied_2", "D", "-", True),
            # Figure 16a compares Vanilla's recipes: distinct tab10 colours, GLR (van) stays grey
            "van_constant": ("Constant", "#1f77b4", "x", "-", False),
            "van_glr_om": ("GLR + OM", "#2ca02c", ">", "-", False),
            "van_glr_wd": ("GLR + WD", "#ff7f0e", "<", "-", False),
            "van_const_mup_om": ("muP OM", "#d62728", "v", "-", False),
            "van_mup_om": ("muP OM + GLR", "#9467bd", "s", "-", False),
            "van_wdr1": ("WDR1 + GLR", "#e377c2", "P", "-", False),
            # Figure 16f: the optimizers' colours, width-only hollow
            "muon": ("Muon", "#1f77b4", "o", "-", False), "adam": ("Adam", "#d62728", "s", "-", False)}


def look(key, label=None, like=None):
    """(label, colour, marker, line style, hollow) of a release key or an arm; like: the key whose look it takes."""
    arm = RELEASE_SERIES.get(key, key)
    if like or key in VARIANTS:
        name, family, marker, ls, hollow = VARIANTS[like or key]
        return label or name, ARMS[family].color if family in ARMS else family, marker, ls, hollow
    if arm in ARMS:
        return label or ARMS[arm].label.replace("-Grow", " Grow"), ARMS[arm].color, ARMS[arm].marker, "-", False
    return label or key, "#3F4752", "o", "--", True  # a series the release does not name: grey, open


def appendix_rc(size):
    """The release's appendix fonts and axes (base, title, axis label, ticks, legend sizes) for plt.rc_context."""
    base, title, label, ticks, legend = size
    return {"font.family": "DejaVu Sans", "font.size": base, "axes.titlesize": title, "axes.titleweight": "bold",
            "axes.labelsize": label, "xtick.labelsize": ticks, "ytick.labelsize": ticks, "legend.fontsize": legend,
            "axes.grid": True, "grid.color": GRID, "grid.linewidth": 0.65, "grid.alpha": 0.65, "axes.axisbelow": True,
            "axes.edgecolor": MUTED, "xtick.color": MUTED, "ytick.color": MUTED, "text.color": INK,
            "axes.labelcolor": INK, "legend.frameon": False, "pdf.fonttype": 42}


def main_rc(size=(14, 17, 16, 14, 12)):
    """The main figures' look (Figs 2-6): the appendix fonts at main sizes, no grid, black spines."""
    return {**appendix_rc(size), "axes.grid": False, "axes.edgecolor": "black"}


def key(colour, marker="", ls="-", hollow=False, ms=4, lw=1.1):
    """A legend key: a line and marker with no data."""
    from matplotlib.lines import Line2D
    return Line2D([], [], color=colour, marker=marker, ls=ls, mfc="white" if hollow else colour, ms=ms, lw=lw)


def multiplier_axis(ax, plt, **rule):
    """A multiplier panel: ticks "1×", "1.1×" and a rule at 1."""
    ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.axhline(1.0, **(rule or dict(color=GRID, lw=0.9, zorder=0)))
    ax.set_ylabel("Compute Multiplier")


# ----------------------------------------------------------------------------------------------- ladder figures
LADDERS = "appendix_ladders"
REGIMES = "appendix_regimes"
RECURRENCE_YLIM = dict(k2=(-0.005, 0.06), dep=(-0.1, 2.0), k2_grow=(-0.005, 0.05), k2_grow_random=(-0.002, 0.03),
                       dep_grow=(-0.1, 2.3))  # Figure 17's fixed limits (Loop-2's k = 1 points fall outside)
# figure -> columns; a column: release file, groups [(reference key, [series])], and options: ref_depth (the
# reference's budgets start there, 8), anchor (a shared anchor depth, Figure 16a), ylim/yticks of the multiplier
# panel, title, legend "gamma" | "plain" | "pair" (width-only vs coupled, Figure 16e-f), labels {key: (label, like)}.
# A series is a release key; E is the free-floor fit (R1) of the file's Vanilla (timing.json: of ladders.json).
EIGHT = ["van", "deep_van", "deep_van_grow", "k1_glr", "k2", "k2_grow", "dep", "dep_grow"]  # the eight arms
FIG15A = dict(file="ladders", legend="plain", ylim=(0.95, 1.36), yticks=(1, 1.1, 1.2, 1.3))
LADDER_FIGURES = {
    "fig15a": [dict(FIG15A, title="Untied-2", groups=[("van", ["dep", "dep_nci", "dep_nonorm", "dep_noinject",
                                                               "deep_van", "van"])]),
               dict(FIG15A, title="Loop-2", groups=[("van", ["van", "k2", "k2_nci", "k2_fixed_pc"])]),
               dict(FIG15A, title="Operator-1", groups=[("van", ["van", "k1_1c2", "k1_glr"])])],
    "fig15b": [dict(file="timing", groups=[("van", EIGHT)])],
    "fig15c": [dict(file="constant", groups=[("van", ["van", "k2", "dep", "k2_grow", "dep_grow"])])],
    "fig16a": [dict(file="ladders", anchor=8, labels={"van": ("GLR", None)},
                    groups=[("van", ["van_constant", "van", "van_glr_om", "van_glr_wd", "van_const_mup_om",
                                     "van_mup_om", "van_wdr1"])])],
    "fig16b": [dict(file="ladders", groups=[("van", ["van", "k1_glr", "k1_van_recipe"])])],
    "fig16c": [dict(file="ladders", groups=[("van", ["van", "deep_van", "k1_glr", "deeper_van", "deeper_k1"])])],
    "fig16d": [dict(file="random", ref_depth=6, ylim=(0.73, 1.17), yticks=(0.75, 0.85, 0.95, 1.0, 1.05, 1.15),
                    groups=[("k2_grow", ["van", "k2", "dep", "k2_grow", "k2_grow_random", "dep_grow"])])],
    "fig16e": [dict(file="width_optimizer", legend="pair", keys=("Width", "Both"), ref_depth=6,
                    groups=[("deep_width", ["deep_width", "dep_width"]), ("deep_van", ["deep_van", "dep"])])],
    "fig16f": [dict(file="width_optimizer", legend="pair", keys=("Width, Deep Vanilla", "Both, Vanilla"),
                    labels={"van": ("Muon", "muon"), "van_adam": ("Adam", "adam"), "deep_width": ("Muon", "muon"),
                            "deep_width_adam": ("Adam", "adam")}, hollow={"deep_width", "deep_width_adam"},
                    groups=[("deep_width", ["deep_width", "deep_width_adam"]), ("van", ["van", "van_adam"])])],
}


def release_series(release, name):
    """A release ladder file as fit.py ladders reads it -> {key: dict(x, depth, loss)} (x: FLOPs, or timing's hours)."""
    obj = read_layout(os.path.join(release, LADDERS, name + ".json"), "ladders")
    data = ladder_data(release_ladder_rows(name + ".json", obj, name == "timing"))
    hours = 3600.0 if name == "timing" else 1.0
    return {s: dict(data[RELEASE_SERIES.get(s, s)], x=data[RELEASE_SERIES.get(s, s)]["x"] / hours) for s in obj}


def ladder_column(release, col):
    """E (R1 on the file's Vanilla; timing.json: ladders.json's), each series' exponent (R2, or through the shared
    anchor) and its multipliers (R3) over its group's reference."""
    data, timing, anchor = release_series(release, col["file"]), col["file"] == "timing", col.get("anchor")
    van = release_series(release, "ladders")["van"] if timing else data["van"]
    E, c_ref = fit_free_e(van["x"] / FIT["c_ref"], van["loss"])[2], 1.0 if timing else FIT["c_ref"]
    out = dict(E=E, unit="H" if timing else "C", series={}, anchor=None)
    if anchor:  # one point at the d8 compute, the mean of the two d8 runs of the plan (Constant and GLR)
        xa = float(data["van"]["x"][data["van"]["depth"] == anchor][0])
        La = float(np.mean([data[k]["loss"][data[k]["depth"] == anchor][0] for k in ("van_constant", "van")]))
        for k in [k for _, keys in col["groups"] for k in keys]:
            keep = data[k]["depth"] > anchor
            data[k] = {v: np.r_[a, data[k][v][keep]] for v, a in (("x", xa), ("loss", La), ("depth", anchor))}
        out["anchor"] = (xa, La)
    for ref, keys in col["groups"]:
        r = data[ref]
        at = r["depth"] >= col.get("ref_depth", FIT["anchor_depth"])
        for k in keys:
            d = data[k]
            if anchor:  # Figure 16a: regression of ln(L - E) - ln(L_a - E) on ln(C / C_a) through the anchor
                lx, y = np.log(d["x"][1:] / xa), np.log(d["loss"][1:] - E) - math.log(La - E)
                law = dict(gamma=-float(lx @ y / (lx @ lx)))
                law["A"] = (La - E) * (xa / c_ref) ** law["gamma"]
            else:
                law = fit_shared_e(d["x"] / c_ref, d["loss"], E)
            m = matched_multipliers(r["x"][at], r["loss"][at], d["x"], d["loss"], k == ref)
            out["series"][k] = dict(d, gamma=law["gamma"], A=law["A"], c_ref=c_ref, budgets=r["x"][at], multipliers=m)
    return out


def ladder_figures(plt, release):
    """Figures 15 and 16 -> {fig_id: (figure, per column E and each series' exponent and multipliers, checks)}."""
    out = {}
    for fig_id, columns in LADDER_FIGURES.items():
        fits = [ladder_column(release, col) for col in columns]
        numbers = {col.get("title", "panel"): dict(E=fit["E"], series={k: dict(
            gamma=s["gamma"], multipliers=s["multipliers"], final_multiplier=last(fit, k))
            for k, s in fit["series"].items()}) for col, fit in zip(columns, fits)}
        out[fig_id] = ladder_figure(plt, columns, fits), numbers, ladder_checks(fig_id, fits)
    return out


def ladder_figure(plt, columns, fits):
    """Per column the reducible loss L - E (each series' law and points) and the multipliers over the group's
    reference; one column: side by side; several (Figure 15a): multipliers on top, a legend above each column."""
    n = len(columns)
    width, side, rows = (6.9, 1.65, 2) if n > 1 else (3.45, 3.45 / 2 - 0.65, 1)
    per_row = 2 if n > 1 or columns[0].get("legend") != "pair" else 1
    legend_rows = max(math.ceil(len(legend_entries(c, f)[0]) / per_row) for c, f in zip(columns, fits))
    height = 0.40 + rows * side + (rows - 1) * 0.27 + 0.22 + 0.15 * legend_rows + 0.05
    pitch = width / (2 if n == 1 else n)
    with plt.rc_context(appendix_rc(LADDER_SIZE)):
        fig = plt.figure(figsize=(width, height))
        box = lambda col, row: fig.add_axes([(0.59 + col * pitch) / width, (0.40 + row * (side + 0.27)) / height,
                                             side / width, side / height])
        for j, (col, fit) in enumerate(zip(columns, fits)):
            loss_ax, mult_ax = (box(0, 0), box(1, 0)) if n == 1 else (box(j, 0), box(j, 1))
            x_label = "Training time (h)" if fit["unit"] == "H" else "Compute (FLOPs)"
            for k, s in fit["series"].items():
                _, colour, marker, ls, hollow = series_look(col, k)
                style = dict(marker=marker, ms=4, mew=0.6, color=colour, mfc="white" if hollow else colour)
                xs = np.geomspace(s["x"].min(), s["x"].max(), 300)
                loss_ax.plot(xs, s["A"] * (xs / s["c_ref"]) ** -s["gamma"], ls=ls, lw=1.1, color=colour)
                own = slice(1 if fit["anchor"] else 0, None)
                loss_ax.plot(s["x"][own], s["loss"][own] - fit["E"], ls="none", **style)
                mult_ax.plot(s["budgets"], s["multipliers"], ls=ls, lw=1.1, **style)
            if fit["anchor"]:
                for ax, y in ((loss_ax, fit["anchor"][1] - fit["E"]), (mult_ax, 1.0)):
                    ax.plot([fit["anchor"][0]], [y], "o", ms=4, color=ARMS["vanilla"].color, zorder=5)
            loss_ax.set(xscale="log", yscale="log", ylabel="$L - E_{\\mathrm{Van}}$", title="Loss", xlabel=x_label)
            mult_ax.set(xscale="log", title="Multiplier" if n == 1 else col["title"], xlabel=x_label if n == 1 else "",
                        **{k: col[k] for k in ("ylim", "yticks") if k in col})
            multiplier_axis(mult_ax, plt)
            if n > 1:
                mult_ax.tick_params(labelbottom=False)
                mult_ax.sharex(loss_ax)
            log_axis(loss_ax.yaxis, plt, plain=True, ticks=())
            for ax in (loss_ax, mult_ax):
                log_axis(ax.xaxis, plt)
            centre = (0.59 + j * pitch + side / 2) / width if n > 1 else 0.5
            fig.legend(*legend_entries(col, fit), loc="upper center", bbox_to_anchor=(centre, 1.0), ncols=per_row,
                       handlelength=2.0, columnspacing=0.8, borderaxespad=0.2)
    return fig


def series_look(col, k):
    name, colour, marker, ls, hollow = look(k, *col.get("labels", {}).get(k, (None, None)))
    return name, colour, marker, ls, hollow or k in col.get("hollow", ())


def legend_entries(col, fit):
    """(handles, labels): each series with its exponent, or without (Figure 15a), or per family the width-only and
    coupled exponents and then the two face keys (Figure 16e-f)."""
    exponent = lambda k: f"${fit['unit']}^{{-{fit['series'][k]['gamma']:.4f}}}$"
    if col.get("legend") == "pair":
        (_, width), (_, both) = col["groups"]
        handles = [key(*series_look(col, b)[1:3]) for b in both] + [key("#3F4752", "o", hollow=h) for h in (1, 0)]
        labels = [f"{series_look(col, b)[0]} (Width {exponent(w)}; Both {exponent(b)})" for w, b in zip(width, both)]
        return handles, labels + list(col["keys"])
    looks = {k: series_look(col, k) for k in fit["series"]}
    return [key(*lk[1:]) for lk in looks.values()], [
        lk[0] if col.get("legend") == "plain" else f"{lk[0]} ({exponent(k)})" for k, lk in looks.items()]


def log_axis(axis, plt, plain=False, ticks=None):
    """A log axis in powers of ten, or plain decimals: labelled decades, 1-2-5 ticks (1-2-4 under a decade) on shorter
    ranges, or `ticks` (empty: 5 round values); minor ticks unlabelled (their labels collide on short ranges)."""
    lo, hi = sorted(axis.get_view_interval())
    ticker, span = plt.matplotlib.ticker, math.log10(hi / lo)
    if ticks is not None:
        axis.set_major_locator(ticker.FixedLocator(ticks) if ticks else ticker.MaxNLocator(5))
    elif span < 2:
        axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 4.0) if span < 1 else (1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FormatStrFormatter("%g") if plain else
                             ticker.LogFormatterSciNotation(labelOnlyBase=False))
    axis.set_minor_formatter(ticker.NullFormatter())


def stated(what, ours, paper, section, why=None):
    """One manifest row: our number next to the paper's; `why` explains a difference over TOLERANCE."""
    rel = abs(ours - paper) / abs(paper) if paper else None
    row = dict(what=what, ours=ours, paper=paper, section=section, rel_diff=rel)
    if rel is not None and rel > TOLERANCE:
        row["explanation"] = why or "unexplained"
    return row


def last(fit, k):
    m = fit["series"][k]["multipliers"]
    return float(m[np.isfinite(m)][-1]) if np.isfinite(m).any() else math.nan


def ladder_checks(fig_id, fits):
    """The numbers the paper's text states for the ladder figures (Sec. 4.1-4.2, App. B)."""
    f = fits[0]
    if fig_id == "fig16b":
        d8 = {k: float(f["series"][k]["loss"][f["series"][k]["depth"] == 8][0]) for k in ("k1_glr", "k1_van_recipe")}
        return [stated("Operator-1 loss cost of Vanilla's recipe at d8", d8["k1_van_recipe"] - d8["k1_glr"], 7.8e-3,
                       "Sec. 4.1", "ladders.json's d8 points differ by this much; the text's 7.8e-3 is not what the "
                       "released d8 runs give")]
    if fig_id == "fig15a":
        return [stated("Untied-2 multiplier over Vanilla near 1e20 FLOPs", last(f, "dep"), 1.34, "App. B.1"),
                stated("Deep Vanilla multiplier over Vanilla, last budget ('a flat 1.08x')", last(f, "deep_van"), 1.08,
                       "Sec. 4.2")] + \
            [stated(f"{which} of the three operator ablations' multipliers near 1e20 FLOPs ('about 1.17–1.19×')",
                    pick(last(f, k) for k in ("dep_nci", "dep_nonorm", "dep_noinject")), paper, "App. B.1")
             for which, pick, paper in (("smallest", min, 1.17), ("largest", max, 1.19))]
    if fig_id == "fig16a":
        spread = max(abs(last(f, k) - 1) for k in ("van_glr_wd", "van_glr_om"))
        return [stated("largest change of the final multiplier from adding OM or WD scaling to GLR", spread, 0.03,
                       "App. B.2", "the text gives a bound ('at most about 3 %'), not a value")]
    return []


def figure3_checks(release):
    """Figure 3's and Sec. 4.2's numbers from ladders.json's eight arms -> (exponents, checks, the floor E)."""
    fit = ladder_column(release, dict(file="ladders", groups=[("van", EIGHT)]))
    m = lambda k, i: float(fit["series"][k]["multipliers"][i])
    checks = [stated("shared floor E (Vanilla FLOP ladder)", fit["E"], 1.7064, "Fig. 3 (printed in the panel)")] + [
        stated(f"{name} multiplier, {('first', 'last')[i]} budget", m(k, i), v, "Sec. 4.2, Fig. 3")
        for name, k, i, v in (("Operator-1", "k1_glr", 0, 1.12), ("Operator-1", "k1_glr", -1, 1.25),
                              ("Untied-Grow", "dep_grow", 0, 1.30), ("Untied-Grow", "dep_grow", -1, 1.55),
                              ("Untied-2", "dep", 0, 1.19), ("Untied-2", "dep", -1, 1.34))] + [
        stated(f"growth's multiplier over Untied-2, {('first', 'last')[i]} budget", m("dep_grow", i) / m("dep", i), v,
               "Sec. 4.2, Fig. 3") for i, v in ((0, 1.09), (-1, 1.16))]
    return {RELEASE_SERIES[k]: s["gamma"] for k, s in fit["series"].items()}, checks, fit["E"]


def effective_depth_figure(plt, release):
    """Figure 6: KL effective depth along the single-epoch ladders (7 arms) and in multi-epoch training."""
    obj = read_json(os.path.join(release, "effective_depth.json"))
    curves = {s: (np.array([r["compute_flops"] for r in recs]), np.array([r["effective_depth"] for r in recs]))
              for s, recs in obj["ladders"].items()}
    multi = obj["multi_epoch"]
    with plt.rc_context(main_rc()):
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.6))
        for arm in [a for a in ARMS if a in curves]:
            left.plot(*curves[arm], "o-", lw=2.2, ms=6.5, color=ARMS[arm].color, label=ARMS[arm].label)
        for k, label, colour in (("operator_1_tuned_wd", "Operator-1", "#0e0b2b"),
                                 ("scale_loop_count", "Scale Loop Count", "#fea973")):
            right.plot(multi["compute_flops"], multi[k], "o-", lw=2.2, ms=6.5, color=colour, label=label)
        for ax, title in ((left, "Single Epoch"), (right, "Multi-Epoch")):
            ax.set(xscale="log", title=title, xlabel="Compute (FLOPs)", ylabel="$L_{\\mathrm{eff}}^{\\mathrm{KL}}$")
            ax.legend(loc="upper left", fontsize=11)
        right.set(xlim=(multi["compute_flops"][0] / 1.25, multi["compute_flops"][-1] * 1.25), xticks=[1e18, 5e18],
                  xticklabels=["$10^{18}$", "$5\\times10^{18}$"])
        right.tick_params(axis="x", which="minor", labelbottom=False)
        fig.tight_layout()
    checks = [stated(f"{ARMS[a].label} KL effective depth at the top budget", float(curves[a][1][-1]), v, "Sec. 6")
              for a, v in (("untied_2", 24), ("untied_grow", 36), ("deep_vanilla", 20))]
    checks += [stated(f"multi-epoch KL effective depth at the largest budget, {label}", float(multi[k][-1]), v,
                      "Sec. 6, Fig. 6 (right)", "the text rounds to whole layers ('reaching 18 against 14 layers')")
               for k, label, v in (("scale_loop_count", "Scale Loop Count", 18),
                                   ("operator_1_tuned_wd", "Operator-1", 14))]
    return fig, {a: dict(compute=x, effective_depth=y) for a, (x, y) in curves.items()}, checks


def recurrence_figure(plt, release):
    """Figure 17: L(k) - L(K_train) per checkpoint against the evaluation recurrence k, one panel per architecture."""
    obj = read_json(os.path.join(release, LADDERS, "recurrence.json"))
    depth_colour = dict(zip(range(6, 21, 2), scale(plt, "viridis", 0.16, 0.78, 8)))
    numbers = {s: [] for s in obj}
    with plt.rc_context(appendix_rc(APPENDIX_SIZE)):
        fig, axes = plt.subplots(1, len(obj), figsize=(8.4, 2.6))
        for ax, (series, recs) in zip(axes, obj.items()):
            for r in recs:
                ce, K = {e["k"]: e["ce"] for e in r["exit_lens"]}, r["core_repetitions"]
                ks, delta = sorted(ce), [ce[k] - ce[K] for k in sorted(ce)]
                numbers[series].append(dict(depth=r["depth"], k_train=K, k=ks, delta=delta))
                ax.plot(ks, delta, "o-", lw=1.5, ms=4, color=depth_colour[r["depth"]], label=f"d{r['depth']}")
            ax.plot(K, 0, "*", ms=8, color=MUTED, mec="white", mew=0.4, label="$K_{\\mathrm{train}}$")
            ax.axhline(0, color="#A5ABB3", ls=(0, (2, 2)), lw=0.6)
            ax.set_ylim(*RECURRENCE_YLIM.get(series, ax.get_ylim()))
            ax.set_title("Random recur." if series == "k2_grow_random" else look(series)[0])
            ax.set_xlabel("Eval. recurrence $k$", fontsize=8)
            ax.xaxis.set_major_locator(plt.matplotlib.ticker.MaxNLocator(integer=True))
        axes[0].set_ylabel("$L(k)-L(K_{\\mathrm{train}})$")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncols=len(labels), fontsize=7)
        fig.tight_layout(rect=(0, 0, 1, 0.88))
    at8 = lambda s: [n["delta"][n["k"].index(8)] for n in numbers[s]]  # L(8) - L(4): both trained at K = 4
    at5 = sum(n["k"][int(np.argmin(n["delta"]))] == 5 for n in numbers["k2_grow_random"])
    rounds = "the text rounds to 1e-4: -0.00034 prints as -0.0003"
    checks = [stated(f"{name} Loop-Grow, L(8) - L(4), {which}", pick(at8(s)), v, "App. B.4", why)
              for name, s, which, pick, v, why in (("random-K", "k2_grow_random", "smallest", min, -0.0003, rounds),
                                                   ("random-K", "k2_grow_random", "largest", max, 0.0028, None),
                                                   ("fixed", "k2_grow", "smallest", min, 0.008, None),
                                                   ("fixed", "k2_grow", "largest", max, 0.042, None))]
    return fig, numbers, checks + [stated("random-K checkpoints with their minimum at k = 5 (of 7)", at5, 5,
                                          "App. B.4")]


# ----------------------------------------------------------------------------- loop grids (R4; Figs 2, 5, 21-24)
BUDGETS = np.array(FIT["loop_budgets"])
FINE_BUDGETS = np.sort(np.r_[BUDGETS, np.sqrt(BUDGETS[:-1] * BUDGETS[1:])])  # the base five and their midpoints
DEPTH_MARKERS = {4: "X", 6: "o", 8: "s", 10: "^", 12: "D", 14: "P", 16: "v", 18: "<"}
REGIME_INK, REGIME_MUTED = "#202020", "#666666"
REGIME_TABLES = {"weight_decay.csv": ["weight_decay"], "regimes.csv": ["regime"],
                 "architectures.csv": ["architecture", "family"]}
FIG2_DEPTHS = {1: range(6, 19), 2: range(6, 17), 3: range(6, 17), 4: range(6, 15), 6: range(4, 15), 8: range(8, 13, 2),
               12: range(8, 13, 2)}  # Figure 2's loop-grid cells (Loop-8 d14 left out)


def scale(plt, cmap, lo, hi, n):
    """n colours evenly spaced between lo and hi of a matplotlib colormap (the release's ordered scales)."""
    return [plt.matplotlib.colors.to_hex(c) for c in plt.get_cmap(cmap)(np.linspace(lo, hi, n))]


def log2_axis(ax, ticks, labels=None, lim=None):
    """A base-2 log x axis with ticks at `ticks` (labels: their %g), no minor labels."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, labels or [f"{t:g}" for t in ticks])
    ax.tick_params(axis="x", which="minor", labelbottom=False)
    if lim:
        ax.set_xlim(*lim)


def grid_ladders(c, mask, by="compute"):
    """{K: (compute or `by`, loss, depth)} of the cells in mask, each ladder in that column's order."""
    out = {}
    for K in sorted(set(c["loops"][mask])):
        m = mask & (c["loops"] == K)
        o = np.argsort(c[by][m])
        out[int(K)] = (c[by][m][o], c["loss"][m][o], c["depth"][m][o].astype(int))
    return out


def at_budget(ladders, C):
    """R4: each spanning ladder's loss at budget C, linear in compute between its bracketing models -> (Ks, losses)."""
    Ks = [K for K, (x, _, _) in ladders.items() if x[0] <= C <= x[-1]]
    return np.array(Ks, float), np.array([np.interp(C, *ladders[K][:2]) for K in Ks])


def quadratic(u, v):
    """Least-squares quadratic v(u) -> (coefficients, vertex u*, bracketed: convex with u* inside the measured u)."""
    coef = np.polyfit(u, v, 2)
    vertex = float(-coef[1] / (2 * coef[0]))
    return coef, vertex, bool(coef[0] > 0 and min(u) < vertex < max(u))


def loop_optimum(Ks, losses):
    """R4: quadratic of log loss on log K; the vertex K* (filled: curvature > 0 and K* strictly inside the measured
    K), else the measured K with the lowest loss. -> (K*, loss there, filled, coefficients or None)."""
    coef, k, filled = quadratic(np.log(Ks), np.log(losses)) if len(Ks) >= 3 else (None, None, False)
    if filled:
        return math.exp(k), math.exp(np.polyval(coef, k)), True, coef
    i = int(np.argmin(losses))
    return float(Ks[i]), float(losses[i]), False, coef


def optima_panel(ax, ladders, budgets, budget_colours, quadratic=True):
    """At each budget the R4 losses of the K ladders spanning it, their quadratic and optimum star (filled inside,
    hollow at the best measured K), or straight lines (quadratic=False) -> optima."""
    out = []
    for C, bc in zip(budgets, budget_colours):
        Ks, losses = at_budget(ladders, C)
        if not len(Ks):
            continue
        if not quadratic:
            ax.plot(Ks, losses, "o-", ms=5, lw=1.6, color=bc)
            out.append(dict(compute=C, loops=Ks.tolist(), loss=losses.tolist()))
            continue
        k, lk, filled, coef = loop_optimum(Ks, losses)
        ax.plot(Ks, losses, "o", ms=4, color=bc, label=f"{C / 1e18:.2g}")
        if coef is not None:
            ks = np.geomspace(Ks.min(), Ks.max(), 240)
            ax.plot(ks, np.exp(np.polyval(coef, np.log(ks))), lw=1.4, color=bc)
        ax.plot(k, lk, "*", ms=10, color=bc if filled else "white", mec="white" if filled else bc,
                mew=0.6 if filled else 1.0, zorder=5)
        out.append(dict(compute=C, best_loops=k, best_loss=lk, interior=filled))
    log2_axis(ax, sorted(ladders), lim=(0.86, max(ladders) * 1.12))
    ax.set_xlabel("Recurrence")
    ax.yaxis.set_major_formatter("{x:.2f}")
    return out


def delta_panel(ax, ladders, depths, colours):
    """L(K) - L(K=1) at every K measured at each depth."""
    for d, colour in zip(depths, colours):
        pts = dict(sorted((K, l) for K, (_, loss, dep) in ladders.items() for l, dd in zip(loss, dep) if dd == d))
        if 1 in pts and len(pts) > 1:
            ax.plot(list(pts), [l - pts[1] for l in pts.values()], marker=DEPTH_MARKERS[d], ms=4.8, lw=1.6,
                    color=colour, label=f"d{d}")
    ax.axhline(0, color=REGIME_MUTED, lw=0.8)
    log2_axis(ax, sorted(ladders))
    ax.set_xlabel("Recurrence")


def read_table(path):
    """A regime table of the release (REGIME_TABLES or hyperparameters.csv), known by its header -> (columns, name)."""
    header = set(read_csv(path, []))
    if "knob" in header:
        cols = ["loops", "multiplier", "loss"]
        return read_csv(path, ["family", "knob"] + cols, numeric=cols, positive=cols[1:]), "hyperparameters.csv"
    name = next((n for n, cols in REGIME_TABLES.items() if cols[0] in header), "weight_decay.csv")
    cols = ["compute", "loss", "depth", "loops"]
    wd = ["weight_decay"] if name == "weight_decay.csv" else []
    c = read_csv(path, REGIME_TABLES[name] + cols, numeric=cols + wd, positive=cols[:2])
    if c["compute"].max() < 1e6:  # EFLOP in weight_decay.csv and architectures.csv
        c["compute"] = c["compute"] * 1e18
    return c, name


def k1_best(c):
    """Operator-1 at its best weight decay (ties: the smaller) -> rows (compute, loss, weight decay, depth)."""
    rows = []
    for d in sorted(set(c["depth"][c["loops"] == 1])):
        m = np.flatnonzero((c["loops"] == 1) & (c["depth"] == d))
        j = m[np.lexsort((c["weight_decay"][m], c["loss"][m]))[0]]
        rows.append((c["compute"][j], c["loss"][j], c["weight_decay"][j], d))
    return np.array(rows)


def regime_grid(plt, columns, rows, width, height, k_colours, budgets, quadratic=True, frontier=None):
    """Figures 21, 22, 24: per column (titles, table, mask) loss vs compute, optima, (rows = 3) L(K) - L(1)."""
    n = len(columns)
    fig, axes = plt.subplots(rows, n, figsize=(width, height * rows + 1.3), squeeze=False)
    bcol = scale(plt, "inferno", 0.12, 0.82, len(budgets))
    dcol = scale(plt, "viridis", 0.16, 0.78, 7 if quadratic else 5)
    optima = {}
    for j, (titles, c, mask) in enumerate(columns):
        lad, ax = grid_ladders(c, mask), axes[0][j]
        for C, bc in zip(budgets, bcol):  # loss against compute, one line per K, the budgets dashed
            ax.axvline(C, color=bc, ls=(0, (2, 3)), lw=1.4, alpha=0.72, zorder=0)
        for K, (x, loss, depth) in lad.items():
            ax.plot(x, loss, color=k_colours[K], lw=1.6, label=f"K={K}")
            for xi, li, d in zip(x, loss, depth):
                ax.plot(xi, li, DEPTH_MARKERS.get(d, "o"), ms=5, color=k_colours[K], mec="white", mew=0.4)
        log2_axis(ax, [t * 1e18 for t in (0.5, 1, 2, 4, 8)], ["0.5", "1", "2", "4", "8"], (0.38e18, 13e18))
        ax.set_xlabel("Compute ($\\times10^{18}$ FLOPs)", loc="left")
        ax.yaxis.set_major_formatter("{x:.2f}")
        ax.margins(y=0.08)
        if frontier is not None:
            ax.plot(*frontier.T, ls=(0, (4, 2)), color=REGIME_INK, lw=1.8, zorder=6, label="Tied frontier")
        optima[titles[0]] = optima_panel(axes[1][j], lad, budgets, bcol, quadratic)
        if rows == 3:
            delta_panel(axes[2][j], lad, range(6, 15, 2), dcol[:5] if quadratic else dcol)
        for i, t in enumerate(titles[:rows]):
            axes[i][j].set_title(t)
    for i, label in enumerate(("Loss", "Loss (Interpolated)", "$L(K)-L(K=1)$")[:rows]):
        axes[i][0].set_ylabel(label)
    if rows == 3:  # one y range along the difference row, labelled once
        lo, hi = min(ax.get_ylim()[0] for ax in axes[2]), max(ax.get_ylim()[1] for ax in axes[2])
        for ax in axes[2]:
            ax.set(ylim=(lo, hi))
            ax.tick_params(labelleft=ax is axes[2][0])
        axes[2][0].legend(ncols=5, loc="lower left", bbox_to_anchor=(0, 1.12), fontsize=7)
    keys = [(key(c, lw=1.6), f"K={K}") for K, c in k_colours.items()] + \
        ([(key(REGIME_INK, ls=(0, (4, 2)), lw=1.8), "Tied frontier")] if frontier is not None else []) + \
        [(key(REGIME_MUTED, m, ls="none", ms=6), f"d{d}") for d, m in DEPTH_MARKERS.items()]
    fig.legend(*zip(*keys), loc="upper center", ncols=math.ceil(len(keys) / (1 if n > 3 else 2)), fontsize=7.5,
               columnspacing=0.8)
    total = height * rows + 1.3
    fig.subplots_adjust(left=0.65 / width, right=0.99, bottom=0.55 / total, top=1 - (0.75 if n > 3 else 0.95) / total,
                        wspace=0.3, hspace=0.75)
    return fig, optima


def regimes_figures(plt, release):
    """Figures 21-24 from the regime CSVs (paper App. D)."""
    wd, rg, ar, hp = [read_table(os.path.join(release, REGIMES, n))[0] for n in (*REGIME_TABLES, "hyperparameters.csv")]
    figures = {}
    with plt.rc_context({**appendix_rc(APPENDIX_SIZE), "axes.edgecolor": "black", "text.color": REGIME_INK}):
        magma7 = dict(zip((1, 2, 3, 4, 6, 8, 12), scale(plt, "magma", 0.08, 0.82, 7)))
        best = {int(d): float(w) for _, _, w, d in k1_best(wd)}
        at_best = np.array([w == best.get(int(d)) for w, d in zip(wd["weight_decay"], wd["depth"])])
        regime = np.array(rg["regime"])
        cols21 = [((title, f"{short} optima", f"{delta or short} difference to K1"), table, mask)
                  for title, short, delta, table, mask in (
                      ("Fresh data", "Fresh-data", "1B", rg, regime == "fresh"),
                      ("250M × 4 epochs", "250M × 4", None, rg, regime == "replay250m4"),
                      ("100M × 10 epochs", "100M × 10", None, rg, regime == "replay100m10"),
                      ("100M × 10, K1-opt. WD", "K1-opt. WD", None, wd, at_best))]
        fig, opt21 = regime_grid(plt, cols21, 3, 13.8, 2.05, magma7, FINE_BUDGETS)
        figures["fig21"] = (fig, dict(k1_best_weight_decay=best, optima=opt21),
                            [stated(f"best K=1 weight decay at d{d}", best[d], w, "App. D.3")
                             for d, w in DATA_CONSTRAINED["tuned-wd"].weight_decay.items() if d in best])
        wds = sorted(set(wd["weight_decay"]))
        cols22 = [((f"WD = {w:g}", f"WD = {w:g} optima", f"WD = {w:g}: Δ to K1"), wd, wd["weight_decay"] == w)
                  for w in wds]
        fig, opt22 = regime_grid(plt, cols22, 3, 14.65, 2.0, magma7, BUDGETS, quadratic=False)
        figures["fig22"] = (fig, dict(losses_at_budgets=opt22), [])
        magma9 = dict(zip((1, 2, 3, 4, 6, 8, 12, 16, 20), scale(plt, "magma", 0.08, 0.82, 9)))
        arch, fam = np.array(ar["architecture"]), np.array(ar["family"])
        cols24 = [((f"{name} scaling", f"{name} optima"), ar, (arch == a) & (fam == f)) for name, a, f in (
            ("Tied Vanilla", "vanilla", "tied"), ("Untied Vanilla", "vanilla", "untied"),
            ("Untied-2", "recurrent", "untied"))]
        tied = np.isclose(wd["weight_decay"], 0.8) & ~((wd["loops"] == 6) & (wd["depth"] == 4))  # from K1 d6 on
        front = lower_envelope(wd["compute"][tied], wd["loss"][tied], log=True)  # the tied boundary-operator frontier
        fig, opt24 = regime_grid(plt, cols24, 2, 10.35, 2.0, magma9, BUDGETS, frontier=front)
        figures["fig24"] = (fig, dict(optima=opt24, tied_frontier=front.tolist()), [])
        figures["fig23"] = sensitivity_figure(plt, wd, hp, magma7)
    return figures


def sensitivity_figure(plt, wd, hp, magma7):
    """Figure 23: (a) loss against weight decay per K at depths 6-16; (b) against each knob's multiple at d8."""
    fig = plt.figure(figsize=(14.65, 9.95))
    grid = fig.add_gridspec(3, 6, hspace=0.75, wspace=0.2, left=0.06, right=0.99, top=0.93, bottom=0.07)
    wds = sorted(set(wd["weight_decay"]))
    for j, d in enumerate(range(6, 17, 2)):
        ax = fig.add_subplot(grid[0, j])
        for K, (w, loss, _) in grid_ladders(wd, wd["depth"] == d, by="weight_decay").items():
            ax.plot(w, loss, "o-", ms=4.3, lw=1.6, color=magma7[K], label=f"K={K}")
        ax.set(yscale="log", title=f"Depth {d}", xlabel="Weight decay")
        ax.margins(y=0.08)
        if d >= 8:  # the top clipped at the lowest loss + 0.2: WD 0.05 at deep models leaves the panel
            ax.set_ylim(wd["loss"][wd["depth"] == d].min() - 0.016, wd["loss"][wd["depth"] == d].min() + 0.2)
        ax.set_yticks(np.geomspace(*ax.get_ylim(), 4), [f"{t:.2f}" for t in np.geomspace(*ax.get_ylim(), 4)])
        ax.tick_params(axis="y", which="minor", labelleft=False)
        log2_axis(ax, wds, ["" if w == 1.2 else f"{w:g}" for w in wds], (0.04, 1.8))  # a 1.2 label would collide
        ax.tick_params(axis="x", labelrotation=45)
        if j == 0:
            ax.set_ylabel("Loss")
            ax.legend(ncols=2, loc="upper right", fontsize=7)
    family, knob, optima = np.array(hp["family"]), np.array(hp["knob"]), {}
    for i, (fam, name) in enumerate((("k", "Tied"), ("u", "Untied"))):
        first = None
        for j, kn in enumerate(("glr", "wd", "om", "rm", "emb_alpha")):
            ax = fig.add_subplot(grid[1 + i, j], sharey=first)
            first = first or ax
            for K, colour, marker in ((2, "#3d0f71", "o"), (4, "#a1307e", "s"), (8, "#f66e5c", "D")):
                m = (family == fam) & (knob == kn) & (hp["loops"] == K)
                if m.any():
                    ax.plot(hp["multiplier"][m], hp["loss"][m], marker=marker, ms=5, lw=1.6, color=colour,
                            label=f"K={K}")
                    optima[f"{name} {kn} K={K}"] = float(hp["multiplier"][m][np.argmin(hp["loss"][m])])
            ax.axvline(1, color=REGIME_MUTED, ls=":", lw=0.8, alpha=0.85)
            log2_axis(ax, [0.25, 0.5, 1, 2, 4], ["0.25x", "0.5x", "1x", "2x", "4x"])
            ax.yaxis.set_major_formatter("{x:.2f}")
            ax.set(title=kn.upper(), xlabel="Multiple of center", ylabel=f"{name}\nLoss" if j == 0 else "")
            ax.tick_params(labelleft=j == 0)
            if i == 0 and j == 0:
                ax.legend(loc="upper center", fontsize=7)
    fig.text(0.045, 0.975, "(a) Weight-decay sensitivity · 100M tokens × 10 epochs", weight="bold", size=12)
    fig.text(0.045, 0.66, "(b) Hyperparameter sensitivity · depth 8 · fixed tokens: tied 1.235B, untied 1.466B",
             weight="bold", size=12)
    return fig, dict(best_measured_multiplier=optima), []


def clip(front, cap):
    """R4: the frontier's points up to and including the first at or beyond the cap."""
    past = np.flatnonzero(front[:, 0] >= cap)
    return front[:past[0] + 1] if len(past) else front


def read_loop_grid(path):
    """loop_grid.csv [depth, loops, weight_decay, compute_flops, val_loss] -> columns as the regime tables name them."""
    cols = ["depth", "loops", "weight_decay", "compute_flops", "val_loss"]
    c = read_csv(path, cols, numeric=cols, positive=["depth", "loops", "compute_flops", "val_loss"],
                 key=["depth", "loops", "weight_decay"])
    return dict(c, compute=c["compute_flops"], loss=c["val_loss"])


def loop_grid_figures(plt, c):
    """Figure 2 (right: the loop grid; Operator-1 at its best WD against scaling the loop count) and Figure 5 (cuts at
    matched compute, marginal gain, scaling recipes, and per (K, depth) the WD with the lowest loss)."""
    from matplotlib.legend_handler import HandlerTuple
    magma = dict(zip((1, 2, 3, 4, 6, 8, 12), scale(plt, "magma", 0.08, 0.82, 7)))
    k1, wd8, op1 = c["loops"] == 1, np.isclose(c["weight_decay"], 0.8), k1_best(c)
    with plt.rc_context(main_rc()):
        fig2, (top, bottom) = plt.subplots(2, 1, figsize=(6.5, 9), sharex=True)
        sel = np.array([int(d) in FIG2_DEPTHS.get(int(K), ()) for d, K in zip(c["depth"], c["loops"])])
        for K, (x, loss, _) in grid_ladders(c, sel & wd8).items():
            top.plot(x, loss, "o-", color=magma[K], lw=2.2, ms=6.5, label=str(K))
        top.set(title="Multi-Epoch", ylabel="Loss")
        top.legend(title="Loop count", ncols=7, loc="upper right", fontsize=9, columnspacing=0.6, handlelength=1.2)
        pool, end = sel & (c["compute"] >= op1[0, 0]), op1[-1, 0]
        front = clip(lower_envelope(c["compute"][pool & wd8], c["loss"][pool & wd8]), end)
        tuned = clip(lower_envelope(np.r_[c["compute"][pool], op1[:, 0]], np.r_[c["loss"][pool], op1[:, 1]]), end)
        loops_at = {(x, l): int(K) for x, l, K in zip(c["compute"], c["loss"], c["loops"])}
        keys = bottom.plot(op1[:, 0], op1[:, 1], "o-", color=magma[1], lw=2.2, ms=6.5, label="Operator-1")
        keys += bottom.plot(tuned[:, 0], tuned[:, 1], ls=(0, (4, 2.5)), color=REGIME_MUTED, lw=1.3, zorder=1,
                            label="Scale Loop Count, tuned WD")
        for i, ((x0, l0), (x1, l1)) in enumerate(zip(front[:-1], front[1:])):  # coloured by its right end's K
            bottom.plot([x0, x1], [l0, l1], color=magma[loops_at[x1, l1]], lw=2.2,
                        label=None if i else "Scale Loop Count")
        for x, l in front:
            bottom.plot(x, l, "o", color=magma[loops_at[x, l]], ms=6.5)
        target = op1[-1, 1]
        matched = float(np.interp(target, front[::-1, 1], front[::-1, 0]))  # linear in compute on the frontier
        gain = end / matched
        bottom.plot(matched, target, "x", color=REGIME_MUTED, ms=9)
        bottom.annotate("", (end, target), (matched, target), arrowprops=dict(arrowstyle="<->", color=REGIME_INK,
                                                                              lw=0.9))
        bottom.annotate(f"{gain:.1f}× compute\nefficiency gain", (math.sqrt(matched * end), target), xytext=(0, 40),
                        textcoords="offset points", ha="center", fontsize=11, bbox=dict(boxstyle="round", fc="white",
                                                                                        ec="#CCCCCC"))
        bottom.set(xlabel="Compute (FLOPs)", ylabel="Loss", xscale="log", xlim=(0.38e18, 12.5e18))
        bottom.set_xticks([5e17, 1e18, 2e18, 5e18, 1e19], ["$5\\times10^{17}$", "$10^{18}$", "$2\\times10^{18}$",
                                                           "$5\\times10^{18}$", "$10^{19}$"])
        bottom.tick_params(axis="x", which="minor", labelbottom=False)
        bottom.legend([keys[0], tuple(key(colour, lw=2.2) for colour in magma.values()), keys[1]],  # the 7 loop colours
                      ["Operator-1", "Scale Loop Count", "Scale Loop Count, tuned WD"], loc="upper right", fontsize=10,
                      handler_map={tuple: HandlerTuple(ndivide=None, pad=0)}, handlelength=3)
        fig2.tight_layout()
    with plt.rc_context(main_rc((10, 12, 11, 9, 8))):
        fig5, axes = plt.subplots(1, 4, figsize=(13, 3.9))
        six = np.isin(c["weight_decay"], (0.05, 0.2, 0.4, 0.8, 1.2, 1.6))
        cuts = optima_panel(axes[0], grid_ladders(c, six & wd8), FINE_BUDGETS, scale(plt, "inferno", 0.12, 0.82, 9))
        lo, hi = axes[0].get_ylim()
        axes[0].set(title="Matched-compute cuts", ylabel="Interpolated loss", xlabel="Loop count",
                    ylim=(lo, hi + 0.8 * (hi - lo)))  # room for the compute legend
        axes[0].legend(title="Compute ($10^{18}$ FLOPs)", ncols=3, loc="upper right", fontsize=7, title_fontsize=7,
                       columnspacing=0.6, handletextpad=0.2)
        delta_panel(axes[1], grid_ladders(c, six & wd8), range(6, 15, 2), scale(plt, "viridis", 0.16, 0.78, 5))
        axes[1].set(title="Marginal gain", ylabel="$L(K) - L(K{=}1)$", xlabel="Loop count")
        axes[1].legend(title="Depth", ncols=2, fontsize=8, title_fontsize=8)
        best_wd = {int(d): w for _, _, w, d in op1}
        tuned_cells = six & np.isclose(c["weight_decay"], [best_wd.get(int(d), -1) for d in c["depth"]])
        cap = c["compute"][k1 & wd8].max()
        log_front = lambda m: clip(lower_envelope(c["compute"][m], c["loss"][m], log=True), cap)
        recipes = [("Operator-1 · 0.8", grid_ladders(c, k1 & wd8)[1][:2]), ("Operator-1 · tuned", op1[:, :2].T),
                   ("Scale loops · 0.8", log_front(six & wd8 & ~((c["loops"] == 6) & (c["depth"] == 4))).T),
                   ("Scale loops · tuned", log_front(tuned_cells).T)]
        for (label, (x, y)), colour in zip(recipes, scale(plt, "magma", 0.12, 0.78, 4)):
            axes[2].plot(x, y, "o-", color=colour, lw=2.2, ms=5, label=label)
        axes[2].set(title="Scaling recipes", ylabel="Loss", xlabel="Compute (FLOPs)", xscale="log")
        axes[2].legend(title="Strategy · WD", fontsize=8, title_fontsize=8)
        ax, colours = axes[3], dict(zip((0.05, 0.2, 0.4, 0.8, 1.2, 1.6), scale(plt, "cividis", 0.08, 0.94, 6)))
        Ks, depths = (1, 2, 3, 4, 6, 8, 12), sorted(set(c["depth"][six & (c["depth"] <= 14) & (c["depth"] >= 6)]))
        heat_wd, image = {}, np.ones((len(Ks), len(depths), 3))
        for (i, K), (j, d) in itertools.product(enumerate(Ks), enumerate(depths)):
            m = six & (c["loops"] == K) & (c["depth"] == d)
            w = float(c["weight_decay"][m][np.argmin(c["loss"][m])]) if m.any() else None
            image[i, j] = plt.matplotlib.colors.to_rgb(colours[w] if w else "#ECEFF3")  # not trained: light grey
            ax.text(j, i, f"{w:g}" if w else "", ha="center", va="center", size=7.5, color="white" if w and w < 0.8
                    else "black")
            if w:
                heat_wd[f"K{K} d{int(d)}"] = w
        ax.imshow(image, aspect="auto")
        ax.set(title="Optimal WD", xlabel="Depth", ylabel="Loop count")
        ax.set_xticks(range(len(depths)), [f"d{int(d)}" for d in depths])
        ax.set_yticks(range(len(Ks)), ["Operator-1"] + [f"Loop-{K}" for K in Ks[1:]])
        ax.tick_params(length=0)
        ax.grid(False)
        fig5.tight_layout()
    numbers = dict(gain=gain, matched_compute=matched, operator_1_tuned=op1[:, :3].tolist(), cuts=cuts,
                   optimal_wd=heat_wd)
    checks = [stated("compute-efficiency gain of scaling the loop count at Operator-1 d18's loss", gain, 2.2,
                     "Sec. 5, Fig. 2", "the text rounds ('about 2.2x')")]
    if len(cuts) == len(FINE_BUDGETS):
        checks += [stated(f"optimal loop count at the {which} budget", cut["best_loops"], v, "Sec. 5, Fig. 5",
                          f"the text rounds ('about {v}')") for which, cut, v in (("smallest", cuts[0], 1.4),
                                                                                  ("largest", cuts[-1], 6.7))]
    return fig2, fig5, numbers, checks


def column(records, k, task=None):
    return np.array([r[k] if task is None else r[k][task] for r in records], float)


def sigmoid(nll, s, b):
    return 1 / (1 + np.exp(np.clip(s * nll - b, -700, 700)))


def fit_sigmoid(nll, acc):
    """App. C.4 (ii): accuracy = 1/(1 + exp(s NLL - b)), s in [0, 20], b in [-20, 20], Huber refined -> (s, b)."""
    m = np.clip(acc.mean(), 0.001, 0.999)
    return robust_lsq(lambda p: sigmoid(nll, *p) - acc, [1.0, math.log(m / (1 - m)) + np.median(nll)],
                      ([0, -20], [20, 20]), FIT["sigmoid_min_scale"])


def fit_task_nll(x, nll):
    """App. C.4 (i): task NLL = E + A x^-alpha, five starts, the best plain fit Huber refined -> (E, A, alpha)."""
    from scipy import optimize
    resid, bounds = lambda p: p[0] + p[1] * x ** -p[2] - nll, ([0, 0, 0.005], [nll.min() - 1e-8, 50, 2])
    E0 = nll.min() / 2
    best = min((optimize.least_squares(resid, [E0, max(0.01, (nll.max() - E0) * x.min() ** a), a], bounds=bounds,
                                       max_nfev=30000) for a in (0.05, 0.1, 0.2, 0.4, 0.8)), key=lambda r: r.cost)
    return robust_lsq(resid, best.x, bounds, FIT["nll_min_scale"], max_nfev=30000)


GPT3 = dict(zip(("2.7B", "6.7B", "13B", "175B"), FIT["gpt3_targets"]))  # CORE of the GPT-3 references
PANELS = (("val_loss", "Loss"), ("core_nll", "CORE NLL"), ("core_accuracy", "CORE accuracy"))


def forecast(series, tasks, shared_floor):
    """App. C.4's forecast of ladders {name: [records]}: loss laws (R1; R2 on the first's floor with shared_floor),
    CORE NLL laws, CORE accuracy = r x the mean of task sigmoids of task NLL laws; each series' GPT-3 crossings."""
    from scipy import optimize
    series = {s: sorted(recs, key=lambda r: r["compute"]) for s, recs in series.items()}
    x = {s: column(recs, "compute") / FIT["c_ref"] for s, recs in series.items()}
    laws_ = {k: {s: fit_free_e(x[s], column(recs, k)) for s, recs in series.items()} for k in ("val_loss", "core_nll")}
    E = laws_["val_loss"][next(iter(series))][2]
    for s, recs in list(series.items())[1:] if shared_floor else []:
        law = fit_shared_e(x[s], column(recs, "val_loss"), E)
        laws_["val_loss"][s] = (law["A"], law["gamma"], E)
    every = [r for recs in series.values() for r in recs]
    sig = {t: fit_sigmoid(column(every, "task_nll", t), column(every, "task_accuracy", t)) for t in tasks}
    f, F = np.mean([column(every, "task_accuracy", t) for t in tasks], axis=0), column(every, "core_accuracy")
    ratio = float(f @ F / (f @ f))
    task_law = {s: {t: fit_task_nll(x[s], column(recs, "task_nll", t)) for t in tasks} for s, recs in series.items()}

    def curve(s, key, C):
        z = np.asarray(C) / FIT["c_ref"]
        if key == "core_accuracy":
            return ratio * np.mean([sigmoid(l[0] + l[1] * z ** -l[2], *sig[t]) for t, l in task_law[s].items()], axis=0)
        A, gamma, E = laws_[key][s]
        return E + A * z ** -gamma
    cross = {(s, n): 10 ** optimize.brentq(lambda lc: curve(s, "core_accuracy", 10 ** lc) - v, 15, 40) for s in series
             for n, v in GPT3.items() if (curve(s, "core_accuracy", 1e15) - v) * (curve(s, "core_accuracy", 1e40) - v)
             < 0}
    return dict(series=series, x=x, laws=laws_, ratio=ratio, curve=curve, cross=cross,
                cmin=min(r["compute"] for r in every), cmax=max(cross.values()))


def forecast_panels(axes, fc, looks, size, seen=None):
    """Figures 4 and 18b: per series (looks {series: (name, colour, marker)}) each law solid, dashed on to Cmax; the
    GPT-3 lines and crossings. size: (line, marker, text, star); seen: {panel: a value the y range must show}."""
    lw, ms, text, star = size
    (first, second), cmin, cmax = looks, fc["cmin"], fc["cmax"]
    for ax, (k, title) in zip(axes, PANELS):
        for s, (name, colour, marker) in looks.items():
            C, y = column(fc["series"][s], "compute"), column(fc["series"][s], k)
            for lo, hi, ls in ((cmin if k == "core_accuracy" else C[0], C[-1], "-"), (C[-1], cmax, "--")):
                cs = np.geomspace(lo, hi, 300)
                ax.plot(cs, fc["curve"](s, k, cs), ls, color=colour, lw=lw)
            ax.plot(C, y, marker, color=colour, ms=ms, label=name)
        ends = [float(fc["curve"](s, k, cmax)) for s in looks] + ([seen[k]] if seen else [])
        top = max(float(column(fc["series"][s], k).max()) for s in looks)
        ax.set(xscale="log", xlim=(cmin / 1.35, cmax * 1.08), title=title, ylabel=title,
               ylim=(0.045, max(top, *ends, 0.427) + 0.04) if k == "core_accuracy" else (min(ends) - 0.1, top + 0.16))
    for n, v in GPT3.items():
        axes[2].axhline(v, ls="--", color=INK, lw=0.75, alpha=0.65)
        ratio = [(0.35, f"{fc['cross'][first, n] / fc['cross'][second, n]:.1f}×")] if (first, n) in fc["cross"] and (
            second, n) in fc["cross"] else []
        for at, label in [(0.02, n)] + ratio:
            axes[2].text(at, v, label, transform=axes[2].get_yaxis_transform(), size=text, va="center",
                         bbox=dict(fc="white", ec="none", pad=0.4))
    for (s, n), C in fc["cross"].items():
        axes[2].plot(C, GPT3[n], "*", ms=star, color=looks[s][1], mec="white", mew=0.5)


def extrapolation_figure(plt, path):
    """Figure 4 (Sec. 4.3): the FineWeb-Edu ladders forecast to the held-out d26 run, with the "1.8x" inset."""
    tasks, records = edu_records(path, read_layout(path, "fineweb_edu"))
    d26 = next(r for _, r, _, held in records if held)
    series = {}
    for arm, r, _, held in records:
        if not held:
            series.setdefault(arm, []).append(dict(r, compute=float(r["compute_flops"])))
    fc = forecast(series, tasks, shared_floor=True)
    C26 = float(d26["compute_flops"])
    fc["cmax"] = max(fc["cmax"], C26)
    (A_v, g_v, E), ug = fc["laws"]["val_loss"]["vanilla"], fc["laws"]["val_loss"]["untied_grow"]
    vanilla_at = lambda L: FIT["c_ref"] * ((L - E) / A_v) ** (-1 / g_v)  # Vanilla's compute reaching loss L
    gain = lambda C: vanilla_at(fc["curve"]("untied_grow", "val_loss", C)) / C
    predicted = {k: float(fc["curve"]("untied_grow", k, C26)) for k, _ in PANELS}
    cyan = ARMS["untied_grow"].color
    with plt.rc_context(main_rc()):
        fig, axes = plt.subplots(1, 3, figsize=(13, 4.5))
        forecast_panels(axes, fc, {a: (ARMS[a].label, ARMS[a].color, "o") for a in series}, (2.2, 6.5, 9, 11),
                        {k: d26[k] for k, _ in PANELS})
        for ax, (k, _) in zip(axes, PANELS):
            ax.plot([C26, C26], [predicted[k], d26[k]], ":", color=cyan, alpha=0.8)
            ax.errorbar(C26, d26[k], yerr=d26.get("core_accuracy_std") if k == "core_accuracy" else None, fmt="s", ms=8,
                        mfc="white", mec=cyan, mew=1.8, ecolor=cyan, capsize=2,
                        label=f"d26 ({d26.get('parameters', 0) / 1e9:.1f}B)" if k == "val_loss" else None)
            ax.set_xlabel("Compute (FLOPs)")
        axes[0].legend(loc="lower left", fontsize=10)
        inset = axes[0].inset_axes([0.5, 0.5, 0.47, 0.46])
        for a in series:
            cs = np.geomspace(C26 / 2.2, C26 * 3.4, 100)
            inset.plot(cs, fc["curve"](a, "val_loss", cs), "--", color=ARMS[a].color, lw=1.8)
        inset.plot(C26, d26["val_loss"], "s", mfc="white", mec=cyan, mew=1.8)
        inset.plot(C26, predicted["val_loss"], "x", color=cyan)
        inset.annotate("", (C26, predicted["val_loss"]), (vanilla_at(predicted["val_loss"]), predicted["val_loss"]),
                       arrowprops=dict(arrowstyle="<->", color=INK))
        inset.text(0.96, 0.93, f"{gain(C26):.1f}× compute\nefficiency gain", transform=inset.transAxes, ha="right",
                   va="top", size=9)
        inset.set(xscale="log", xticks=[], yticks=[])
        inset.minorticks_off()
        axes[0].indicate_inset_zoom(inset, edgecolor=REGIME_MUTED)
        fig.tight_layout()
    numbers = dict(forecast={k.replace("val_", ""): v for k, v in predicted.items()},
                   observed={k: d26[k] for k in (*predicted, "core_accuracy_std") if k in d26},
                   E=E, gamma=dict(vanilla=g_v, untied_grow=ug[1]), ratio=fc["ratio"], gain_at_d26=gain(C26),
                   crossings={f"{a} {n}": C for (a, n), C in fc["cross"].items()})
    return fig, numbers, [stated(what, ours, paper, "Sec. 4.3, Fig. 4") for what, ours, paper in (
        ("observed d26 CORE (7.4B Untied-Grow)", d26["core_accuracy"], 0.3865),
        ("forecast d26 CORE", predicted["core_accuracy"], 0.384),
        ("d26 loss: observed - forecast", d26["val_loss"] - predicted["val_loss"], -0.03),
        ("Untied-Grow's multiplier over Vanilla at the d26 compute", gain(C26), 1.8),
        ("the multiplier at 1e20 FLOPs", gain(1e20), 1.6), ("the multiplier at 1e25 FLOPs", gain(1e25), 2.7))]


CORPORA = {"fineweb": ("FineWeb", "#2ca02c", "v"), "fineweb_edu": ("FineWeb-Edu", "#1f77b4", "o")}
CORPUS_ROWS = (("val_loss", "Loss above floor, $L-E$", False), ("core_nll", "CORE NLL", False),
               ("core_accuracy", "CORE Accuracy", True))
FIG18A_MULTIPLIERS = (1.280, 1.342, 1.390, 1.433, 1.489, 1.536, 1.530)  # FineWeb-Edu, Vanilla d8-d20 (Fig. 18a)
FIG18A_STATED = [("fineweb", "vanilla", 0.1113), ("fineweb", "untied_grow", 0.1168), ("fineweb_edu", "vanilla", 0.1095),
                 ("fineweb_edu", "untied_grow", 0.1146)]  # App. C.1's exponents; Figure 20's titles and printed RMSEs:
FIG20_TASKS = dict(zip(("LSAT AR", "ARC Chal.", "ARC Easy", "Dyck", "Ops.", "Wikidata", "COPA", "CoQA", "HellaSwag",
                        "Hella ZS", "Jeopardy", "LAMBADA", "OpenBookQA", "PIQA", "SQuAD", "Winograd", "WinoGrande"),
                       (.026, .019, .015, .026, .009, .006, .034, .006, .003, .004, .007, .011, .015, .014, .009, .047,
                        .023)))


def corpus_figures(plt, release):
    """Figures 18a-b and 20 (App. C.1, C.4) from fineweb.json and fineweb_edu.json. 18a: per corpus loss above
    Vanilla's floor with OLS slopes, CORE NLL, CORE accuracy, and Untied-Grow's multiplier at Vanilla's records."""
    series = {c: {dict(Vanilla="vanilla").get(k, "untied_grow"): sorted([dict(  # in Figure 4's record keys
        r, val_loss=r["raw"]["val_loss"], core_nll=r["raw"]["core_loss"], core_accuracy=r["raw"]["core_metric"],
        task_nll=r["raw"]["losses"], task_accuracy=r["raw"]["centered_results"]) for r in v],
        key=lambda r: r["compute"])
        for k, v in read_json(os.path.join(release, LADDERS, f"{c}.json")).items()} for c in CORPORA}
    numbers = {c: {} for c in CORPORA}
    with plt.rc_context(appendix_rc(LADDER_SIZE)):
        fig, axes = plt.subplots(3, 3, figsize=(6.9, 7.0), sharex=True)
        for row, (metric, ylabel, higher) in zip(axes, CORPUS_ROWS):
            for ax, (corpus, (cname, ccolour, cmarker)) in zip(row, CORPORA.items()):
                arms = series[corpus]
                x = {a: column(recs, "compute") for a, recs in arms.items()}
                van, grow = column(arms["vanilla"], metric), column(arms["untied_grow"], metric)
                E = fit_free_e(x["vanilla"] / FIT["c_ref"], van)[2] if metric == "val_loss" else 0
                for i, (arm, recs) in enumerate(arms.items()):
                    name, colour, marker = look(arm)[:3]
                    y = column(recs, metric) - E
                    ax.plot(x[arm], y, marker + ("" if E else "-"), ms=4, lw=1.1, color=colour, mec="white", mew=0.6)
                    if E:  # OLS of ln(L - E) on ln C over the arm's range; its slope printed as the release does
                        slope, icpt = numbers[corpus][f"{arm} slope"] = np.polyfit(np.log(x[arm] / FIT["c_ref"]),
                                                                                    np.log(y), 1)
                        cs = np.geomspace(x[arm][0], x[arm][-1], 200)
                        ax.plot(cs, np.exp(icpt) * (cs / FIT["c_ref"]) ** slope, color=colour, lw=1.1)
                        ax.text(0.97, 0.95 - 0.115 * i, f"{name}: {slope:.5f}", transform=ax.transAxes, ha="right",
                                va="top", size=7, color=colour)
                m = numbers[corpus][f"{metric} multipliers"] = matched_multipliers(x["vanilla"], van, x["untied_grow"],
                                                                                   grow, False, higher)
                row[2].plot(x["vanilla"], m, cmarker + "-", ms=4, lw=1.1, color=ccolour, mec="white", mew=0.6)
                ax.set(title=cname, ylabel=ylabel if corpus == "fineweb" else None)
                if E:
                    numbers[corpus]["E"] = E
                    ax.set(yscale="log", ylim=(0.8, 2.45))
                    log_axis(ax.yaxis, plt, plain=True, ticks=(0.8, 1, 1.2, 1.5, 2, 2.4))
            row[1].sharey(row[0])
            multiplier_axis(row[2], plt, color=MUTED, ls="--", lw=0.8)
            row[2].set_title("Compute Multiplier")
        for ax, label in zip(axes[-1], ("Compute (FLOPs)", "Compute (FLOPs)", "Vanilla compute (FLOPs)")):
            ax.set(xscale="log", xlabel=label)
        looks = [look(a)[:3] for a in series["fineweb"]] + list(CORPORA.values())  # Vanilla, Untied-Grow, the corpora
        fig.legend([key(c, m) for _, c, m in looks], [n for n, _, _ in looks], loc="upper center", ncols=4)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
        tasks = read_json(os.path.join(release, LADDERS, "filter.json"))["selected_tasks"]
        fig20 = calibration_figure(plt, series["fineweb_edu"], tasks)
    checks = [stated(f"{c} Vanilla floor E", numbers[c]["E"], e, "App. C.1, Fig. 18a")
              for c, e in (("fineweb", 1.7064), ("fineweb_edu", 1.4492))]
    checks += [stated(f"{c} {a} loss exponent", -numbers[c][f"{a} slope"][0], s, "App. C.1")
               for c, a, s in FIG18A_STATED]
    checks += [stated(f"FineWeb-Edu loss multiplier at Vanilla d{d}", m, p, "Fig. 18a") for d, m, p in zip(
        range(8, 22, 2), numbers["fineweb_edu"]["val_loss multipliers"][1:], FIG18A_MULTIPLIERS)]
    return dict(fig18a=(fig, numbers, checks), fig18b=corpus_forecast_figure(plt, series, tasks), fig20=fig20)


def corpus_forecast_figure(plt, series, tasks):
    """Figure 18b (App. C.1): Untied-Grow on each corpus forecast as in Figure 4 (own floors, shared sigmoids)."""
    fc = forecast({c: series[c]["untied_grow"] for c in CORPORA}, tasks, shared_floor=False)
    with plt.rc_context(appendix_rc(LADDER_SIZE)):
        fig, axes = plt.subplots(3, 1, figsize=(2.3, 6.5), sharex=True)
        forecast_panels(axes, fc, CORPORA, (1.1, 4, 6, 7))
        for ax in axes:
            ax.set_box_aspect(1)
            ax.tick_params(axis="x", which="minor", labelbottom=False)
        axes[2].set_xlabel("Compute (FLOPs)")
        fig.legend([key(c, m) for _, c, m in CORPORA.values()] + [key(INK, ls="--", lw=0.75)],
                   [n for n, _, _ in CORPORA.values()] + ["GPT-3 capability level"], loc="upper center")
        fig.tight_layout(rect=(0, 0, 1, 0.92), h_pad=0.4)
    ratios = {n: fc["cross"]["fineweb", n] / fc["cross"]["fineweb_edu", n] for n in GPT3}
    fits = {k: {c: dict(E=law[2], gamma=law[1]) for c, law in per.items()} for k, per in fc["laws"].items()}
    checks = [stated(f"{which} FineWeb/FineWeb-Edu compute ratio at a GPT-3 score ('about 1.5–1.6×')",
                     pick(ratios.values()), v, "App. C.1", "the text rounds to one decimal")
              for which, pick, v in (("smallest", min, 1.5), ("largest", max, 1.6))]
    return fig, dict(fits=fits, ratio=fc["ratio"], crossing_ratio=ratios, cmax=fc["cmax"]), checks


def calibration_figure(plt, arms, tasks):
    """Figure 20 (App. C.4): per task the sigmoid of accuracy on NLL with its RMSE; the full/filtered CORE ratio r."""
    every, numbers, pink = [r for recs in arms.values() for r in recs], dict(rmse={}), "#e377c2"
    fig, axes = plt.subplots(4, 5, figsize=(6.9, 6.4), sharey=True)
    f, F = (np.array([r[k] for r in every]) for k in ("filtered_accuracy", "full_accuracy"))
    r = numbers["ratio"] = float(f @ F / (f @ f))
    numbers["ratio_rmse"] = float(np.sqrt(np.mean((r * f - F) ** 2)))
    for ax, task, title in zip([*axes.flat[:len(tasks)], axes.flat[-1]], [*tasks, None], [*FIG20_TASKS, "CORE ratio"]):
        points = lambda recs: (column(recs, "task_nll", task), column(recs, "task_accuracy", task)) if task else (
            column(recs, "filtered_accuracy"), column(recs, "full_accuracy"))
        if task:
            (x, y), (s, b) = points(every), fit_sigmoid(*points(every))
            fit, colour = (lambda v, s=s, b=b: sigmoid(v, s, b)), INK
            rmse = numbers["rmse"][task] = float(np.sqrt(np.mean((fit(x) - y) ** 2)))
            lo, hi, span, text = x.min(), x.max(), np.ptp(x), f"RMSE {rmse:.3f}"
            wide = (max(0, min(lo - 0.75 * span, (b / s if s > 0 else lo) - 0.5 * span)), hi + 0.5 * span)
            ax.invert_xaxis()  # high NLL on the left: accuracy rises to the right
        else:
            fit, colour, lo, hi, wide = (lambda v: r * v), pink, f.min(), f.max(), (0, 1)
            text = f"y = {r:.3f}x\nRMSE {numbers['ratio_rmse']:.3f}"
        for (a, c), ls in ((wide, "--"), ((lo, hi), "-")):
            ax.plot(np.linspace(a, c, 200), fit(np.linspace(a, c, 200)), ls, color=colour, lw=0.9)
        for arm, recs in arms.items():
            ax.plot(*points(recs), look(arm)[2], color=look(arm)[1] if task else pink, ms=4, mec="white", mew=0.4)
        ax.text(0.04, 0.95, text, transform=ax.transAxes, va="top", size=7, color=MUTED)
        ax.set(ylim=(-0.08, 1.02), yticks=(0, 0.25, 0.5, 0.75, 1))
        ax.set_title(title, color=colour)
        ax.xaxis.set_major_locator(plt.matplotlib.ticker.MaxNLocator(4))
    ax.set(xlim=(-0.02, 1.02), xticks=(0, 0.5, 1), xlabel="Filtered CORE")
    for blank in axes.flat[len(tasks):-1]:
        blank.set_visible(False)
    fig.supxlabel("CORE NLL", size=8)
    fig.supylabel("CORE accuracy", size=8)
    fig.legend([key(look(a)[1], look(a)[2], ls="") for a in arms] + [key(INK), key(pink)],
               ["Vanilla", "Untied Grow", "Shared sigmoid", "Full/filtered ratio"], loc="upper center", ncols=4)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig, numbers, [stated("full/filtered CORE ratio r (FineWeb-Edu)", r, 0.86912, "App. C.4")] + [
        stated(f"RMSE {t} (as printed, 3 decimals)", round(numbers["rmse"][t], 3), p, "Fig. 20")
        for t, p in zip(numbers["rmse"], FIG20_TASKS.values())]


DOWNSTREAM_METRICS = ("full_core", "answer_nll", "filtered_core", "filtered_core_std")
FIG19_METRICS = (("loss", "Loss", False), ("full_core", "CORE accuracy", True), ("answer_nll", "CORE NLL", False),
                 ("filtered_core", "Filtered tasks", True))
FIG19C_GROUPS = ("World knowledge", "Symbolic problem\nsolving", "Commonsense\nreasoning", "Language\nunderstanding",
                 "Reading\ncomprehension")


def downstream_series(path):
    """The release's downstream.json (LAYOUTS) -> {arm: records sorted by compute}."""
    out = {}
    for series, recs in read_layout(path, "downstream").items():
        try:
            out[RELEASE_SERIES.get(series, series)] = sorted([dict(
                compute=float(r["compute"]), loss=float(r["loss"]), depth=int(r["depth"]), task_nll=dict(r["task_nll"]),
                **{k: float(r["metrics"][k]) for k in DOWNSTREAM_METRICS}) for r in recs], key=lambda r: r["compute"])
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"{path}: series {series!r}: every record needs compute, loss, depth, metrics "
                             f"{{{', '.join(DOWNSTREAM_METRICS)}}} and task_nll {{task: NLL}} ({type(e).__name__} {e})")
    if FLOOR_ARM not in out:
        raise UsageError(f"{path}: no Vanilla series (van); the multipliers are over Vanilla")
    return out


def downstream_figures(plt, series, meta):
    """Figure 19a: per metric the curves against compute (loss: each arm's law) and the multipliers over Vanilla at its
    computes with depth >= 8; 19b: CORE answer NLL on validation loss, one pooled line and the residuals, both axes
    reversed as the paper draws them; 19c (meta: tasks.json): residual_figure."""
    col = lambda arm, k: np.array([r[k] for r in series[arm]])
    at = col(FLOOR_ARM, "depth") >= FIT["anchor_depth"]
    budgets, multipliers, laws_ = col(FLOOR_ARM, "compute")[at], {}, {}
    with plt.rc_context(appendix_rc(LADDER_SIZE)):
        fig_a, axes = plt.subplots(2, 4, figsize=(6.9, 4.3), sharex=True)
        for (metric, title, higher), top, bottom in zip(FIG19_METRICS, axes[0], axes[1]):
            for arm in series:
                name, color, marker = look(arm)[:3]
                x, y = col(arm, "compute"), col(arm, metric)
                if metric == "loss":  # each arm's free-floor law, compute in units of its own d8 run (App. C.3)
                    c8 = x[col(arm, "depth") == FIT["anchor_depth"]][0]
                    A, alpha, E = fit_free_e(x / c8, y)
                    cs = np.geomspace(x[0], x[-1], 300)
                    top.plot(cs, E + A * (cs / c8) ** -alpha, lw=0.9, color=color, label=name)
                    laws_[arm] = dict(E=E, A=A, alpha=alpha, c_d8=c8)
                top.errorbar(x, y, yerr=col(arm, "filtered_core_std") if metric == "filtered_core" else None,
                             fmt=marker + ("" if metric == "loss" else "-"), ms=3.5, lw=0.9, capsize=2.5, color=color)
                m = matched_multipliers(budgets, col(FLOOR_ARM, metric)[at], x, y, arm == FLOOR_ARM, higher)
                multipliers.setdefault(metric, {})[arm] = dict(compute=budgets.tolist(), multiplier=m.tolist())
                bottom.plot(budgets, m, marker + "-", ms=3.5, lw=0.9, color=color)
            top.set(xscale="log", yscale="log" if metric == "loss" else "linear", title=title,
                    ylabel="CORE accuracy" if higher else title)
            if metric == "loss":
                log_loss_axis(top, None)
            bottom.set(title=title, xlabel="Compute (FLOPs)")
            multiplier_axis(bottom, plt)
            bottom.tick_params(axis="x", which="minor", labelbottom=False)  # decades only: the panels are narrow
        fig_a.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncols=4, fontsize=6.5)
        fig_a.tight_layout(rect=(0, 0, 1, 0.9))
        fig_b, (line, resid) = plt.subplots(2, 1, figsize=(2.3, 4.6), sharex=True)
        loss, nll = (np.concatenate([col(a, k) for a in series]) for k in ("loss", "answer_nll"))
        slope, intercept = np.polyfit(loss, nll, 1)
        for arm in series:
            x, y, (name, color, marker) = col(arm, "loss"), col(arm, "answer_nll"), look(arm)[:3]
            line.plot(x, y, marker, ms=4, color=color, label=name)
            resid.plot(x, y - intercept - slope * x, marker, ms=4, color=color)
        ends = loss[[loss.argmin(), loss.argmax()]]
        line.plot(ends, intercept + slope * ends, "--", color=MUTED, lw=0.9, label="Pooled linear fit")
        resid.axhline(0, color=MUTED, ls="--", lw=0.9)
        line.set(title="Major variants", ylabel="CORE NLL")
        resid.set(title="Linear-fit residuals", xlabel="Validation loss", ylabel="NLL − linear prediction")
        line.invert_xaxis()  # the x axis is shared: invert it once
        for ax in (line, resid):
            ax.invert_yaxis()
        fig_b.legend(*line.get_legend_handles_labels(), loc="upper center", ncols=2, fontsize=5.5)
        fig_b.tight_layout(rect=(0, 0, 1, 0.85))
    pooled = dict(slope=float(slope), intercept=float(intercept), points=len(loss))
    return dict(fig19a=(fig_a, dict(multipliers_at_matched=multipliers, loss_laws=laws_), []),
                fig19b=(fig_b, dict(pooled_line=pooled), []), fig19c=residual_figure(plt, series, meta))


def residual_figure(plt, series, meta):
    """Figure 19c: each arm's mean residual from Vanilla's line of task NLL on loss, in the pooled range and its
    lower half."""
    tasks, arms = meta["tasks"], list(series)
    loss = np.concatenate([[r["loss"] for r in recs] for recs in series.values()])
    line = {t: np.polyfit([r["loss"] for r in series[FLOOR_ARM]], [r["task_nll"][t] for r in series[FLOOR_ARM]], 1)
            for t in tasks}
    group = {t: i for i, g in enumerate(meta["groups"].values()) for t in g}
    x = np.array([i + 0.8 * group[t] for i, t in enumerate(tasks)])
    means = {f"{loss.min():.3f}-{top:.3f}": {arm: [float(np.mean([r["task_nll"][t] - np.polyval(line[t], r["loss"])
                                                                  for r in recs if loss.min() <= r["loss"] <= top]))
                                                   for t in tasks] for arm, recs in series.items()}
             for top in (loss.max(), (loss.min() + loss.max()) / 2)}
    values = np.array([v for per in means.values() for v in per.values()])
    with plt.rc_context(appendix_rc(LADDER_SIZE)):
        fig, axes = plt.subplots(2, 1, figsize=(6.9, 5.6), sharex=True, sharey=True)
        for ax, (span, per), title in zip(axes, means.items(), ("All ladder points", "Lower-loss points")):
            for j, arm in enumerate(arms):
                ax.bar(x + (j - (len(arms) - 1) / 2) * 0.1, per[arm], 0.094, color=look(arm)[1], label=look(arm)[0])
            ax.axhline(0, color=MUTED, ls="--", lw=0.8)
            for b in x[1:][np.diff([group[t] for t in tasks]) > 0] - 0.9:
                ax.axvline(b, color=MUTED, lw=0.7, alpha=0.4)
            ax.set_title(f"{title} · validation loss {span.replace('-', '–')}")
        pad = 0.08 * np.ptp(values)
        axes[0].set_ylim(values.max() + pad, values.min() - pad)  # reversed: a lower NLL than Vanilla's line points up
        axes[1].set_xticks(x, [meta["labels"][t] for t in tasks], rotation=50, ha="right", rotation_mode="anchor")
        for i, (members, name) in enumerate(zip(meta["groups"].values(), FIG19C_GROUPS)):
            at = x[[tasks.index(t) for t in members]]
            axes[1].annotate(name, (at.max() + 0.3 if i == 4 else at.mean(), -0.95), size=7, weight="bold", va="top",
                             ha="right" if i == 4 else "center", xycoords=("data", "axes fraction"),
                             annotation_clip=False)
        fig.supxlabel("CORE task (Vanilla-filtered)", size=8)
        fig.supylabel("Mean (NLL − Vanilla loss fit), nats per token", size=8)
        fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncols=4)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig, dict(tasks=tasks, mean_residuals=means), []


# ------------------ appendix A: allocation, recurrence, growth, tuning, recipe sweeps (Figs 7-14, data appendix_early/)
EARLY = "appendix_early"
INFERNO, VIRIDIS, MAGMA = ("inferno", 0.12, 0.82), ("viridis", 0.16, 0.78), ("magma", 0.08, 0.82)  # budget, depth, K
ORDER_MARKERS = dict(zip(range(8, 15), "os^DvPX"))  # budgets d8-d14 and depths d8-d12
CORE_MARKERS, ANCHOR_MARKERS = dict(zip(range(2, 9), "os^Dv<P")), dict(zip(range(8, 13), "o^sDv"))  # Figs 7, 9
FLOP_TICKS = {5e17: "$5\\times10^{17}$", 1e18: "$10^{18}$", 2e18: "$2\\times10^{18}$", 5e18: "$5\\times10^{18}$",
              1e19: "$10^{19}$"}
FIG7_PANELS = [("Where should layers be allocated?", "Compute (FLOPs)", "Validation loss"),
               ("How much recurrence?", "Compute (FLOPs)", "Loss"),
               ("What should recurrence grow to?", "Target loop count $K$", "Validation loss"),
               ("When should we grow?", "$K=4$ training fraction $\\rho$", "Validation loss"),
               ("Frontier regret", "Core size / physical layers", "Regret to frontier ($\\times 10^{-3}$)"),
               ("Fixed-compute optima", "Recurrence", "Loss (Interpolated)"),
               ("KL effective depth $L_{\\mathrm{eff}}^{\\mathrm{KL}}$", "Target loop count $K$",
                "$L_{\\mathrm{eff}}^{\\mathrm{KL}}$"), ("Loop-2 TPP refit", "Initial stored TPP", "Validation loss")]
AFFINE = {"k2": ("Loop-Grow", 0.902, 0.216), "dep": ("Untied-Grow", 0.883, 0.103)}  # App. A.2.3: TPP law's a, b
MEAN_6T2C = {("k2", "controls"): 6.39, ("k2", "growth"): 6.97, ("dep", "controls"): 7.43, ("dep", "growth"): 8.97}
ABLATION = {"tpp8_rho0p30": ("TPP 8, $\\rho=0.30$", "#c3b369", "s"), "tpp6_fitrho": ("TPP 6, fitted $\\rho$", "#2f426d",
            "o"), "tpp6_rho0p30": ("TPP 6, $\\rho=0.30$", "#2f426d", "s")}  # a fixed rho is a hollow square
FAMILIES = (("loop", "k2"), ("dep", "dep"))  # Figure 9: tpl.json's tied (Loop-2) and untied (Untied-2) families
# Figure 9's relation panels: y, its label and ticks, the laws y = a x^b the text states (Loop-2, Untied-2), equation
RELATIONS = (("expansion", "$N_{c,K^\\star}/N_{c,1}$", [1, 1.1, 1.2, 1.3, 1.5, 2], ((0.82, 0.15), (0.83, 0.15)), 4),
             ("TPP", "$\\mathrm{TPP}_{K^\\star}$", [5, 7, 10, 15, 20, 30, 50, 70], ((1.19, 0.85), (1.34, 0.74)), 8))
ADOPT = 1e-3  # Figure 11: a setting is adopted when it beats the incumbent by 1e-3 (App. A.4.1)
PHASES = dict(glr="GLR", elrm="ELRM", hlrm="HLRM", rm="RM", om="OM", emb_alpha="$\\alpha_{\\mathrm{emb}}$", wd="WD",
              wte="WTE", uis="UIS", schedule="Schedule", adam="Adam")
# Figure 11's chains: tune.json's series "chain_<arm>" -> (its final recipe's key, a marker other than the arm's); the
# no-inject and no-norm Untied-2 chains are in the file but not drawn
CHAINS = {"chain_vanilla": ("van", None), "chain_deep_vanilla": ("van-d11", None), "chain_operator_1": ("k1", None),
          "chain_loop_2": ("k2", None), "chain_untied_2": ("dep", None), "chain_untied_2_no_coda_inject":
          ("dep-no-coda-inj", "P"), "chain_loop_2_no_coda_inject": ("k2-no-coda-inj", "*")}
TPP_ARMS = ("van", "deep_van", "k1", "k2", "dep")  # Figure 12's panels
ROUNDED_TPP = {"Vanilla": 5, "Operator-1": 6, "Loop-2": 6, "Untied-2": 6}  # the ladders' TPP (App. A.4.2)
KNOBS = dict(glr="GLR", elrm="ELRM", hlrm="HLRM", om="OM", rm="RM", wd="WD", wte="WTE init std", uis="UIS",
             warmup="Warmup", wdr="WDR", beta2="Adam $\\beta_2$", eps="Adam $\\epsilon$")  # Figure 14a's panels
CATEGORICAL = dict(warmup="Warmup steps", wdr="WDR", beta2="$\\beta_2$", eps="$\\epsilon$")  # x: position in the grid
ARCH_ROWS = (("Van", "K1"), ("K2", "Dep"), ("K2 Grow", "Dep Grow"))  # Figure 14b's rows
STATED_BETA = {"Vanilla": 0.78, "Operator-1": 0.62, "Loop-2": 0.58, "Untied-2": 0.66}  # Table 8, constant recipe GLR


def early(release, name):
    return read_json(os.path.join(release, EARLY, name + ".json"))


def ordered(plt, colours, keys):
    """{key: (colour, marker)} on one of the release's ordered scales (INFERNO: budgets, VIRIDIS: depths)."""
    return {k: (c, ORDER_MARKERS.get(k, "o")) for k, c in zip(keys, scale(plt, *colours, len(keys)))}


def draw_quadratic(ax, coef, u, colour, x=np.exp, y=np.exp, star=None, star_colour=None, ms=9, **kw):
    """Quadratic + star: the fit over the measured u at (x(u), y(fit)); a white-edged star at the vertex `star`."""
    us = np.linspace(min(u), max(u), 200)
    ax.plot(x(us), y(np.polyval(coef, us)), color=colour, **kw)
    if star is not None:
        ax.plot(x(star), y(np.polyval(coef, star)), "*", ms=ms, color=star_colour or colour, mec="white", mew=0.6,
                zorder=5)


def legend_band(fig, groups, centre=0.5, top=1.0):
    """Frameless figure legends [([(key, label)], ncols)] stacked from `top` down, centred on `centre` -> the bottom."""
    for entries, ncols in groups:
        rows = math.ceil(len(entries) / ncols)  # matplotlib fills columns first; the release's entries read by row
        entries = [entries[i * ncols + j] for j in range(ncols) for i in range(rows) if i * ncols + j < len(entries)]
        fig.legend(*zip(*entries), loc="upper center", bbox_to_anchor=(centre, top), ncols=ncols, columnspacing=0.9,
                   handlelength=1.8, borderaxespad=0.1)
        top -= (rows * 0.155 + 0.03) / fig.get_figheight()
    return top


def flop_axis(ax, ticks):
    """A log compute axis labelled at `ticks` as the release writes FLOPs."""
    ax.set_xscale("log")
    ax.set_xticks(ticks, [FLOP_TICKS[t] for t in ticks])
    ax.tick_params(axis="x", which="minor", labelbottom=False)


def grid(fig, rows, cols, x0, y0, w, h, gap, vgap, **share):
    """rows x cols panels of w x h inches, gaps in inches, the block's lower left corner at (x0, y0) inches."""
    W, H = fig.get_size_inches()
    return fig.add_gridspec(rows, cols, left=x0 / W, bottom=y0 / H, right=(x0 + cols * w + (cols - 1) * gap) / W,
                            top=(y0 + rows * h + (rows - 1) * vgap) / H, wspace=gap / w, hspace=vgap / h,
                            ).subplots(squeeze=False, **share)


def rho_fit(ax, rho, loss, colour, marker="o", ls="-", alpha=1.0, vline=False, star=True):
    """Loss against rho, the fraction of tokens after growing K=2 -> 4: runs, quadratic, star -> (rho*, L*) or None."""
    coef, v, bracketed = quadratic(rho, loss)
    draw_quadratic(ax, coef, rho, colour, np.asarray, np.asarray, v if bracketed and star else None, ms=10, ls=ls,
                   lw=1.35, alpha=alpha)
    ax.plot(rho, loss, marker, ms=4.5, color=colour, mec="white", mew=0.6, ls="none")
    if bracketed and vline:
        ax.axvline(v, color=colour, ls=":", lw=1.2)
    return (v, float(np.polyval(coef, v))) if bracketed else None


def growth_sweep(growth, *cell):  # cell: arm, depth, budget -> (rho, loss, rows) in rho order
    rows = sorted((r for r in growth if (r["arm"], r["depth"], r["budget"]) == cell), key=lambda r: r["rho"])
    return np.array([r["rho"] for r in rows]), np.array([r["loss"] for r in rows]), rows


def growth_timing_figure(plt, growth, counts, arm):
    """Figures 10a (Loop Grow), 10b (Untied Grow): rho sweeps per depth and budget; each optimum's TPP, E and rho*."""
    count = {(c["depth"], c["recurrence"]): c for c in counts if c["mode"] == ("loop" if arm == "k2" else "dep")}
    bcol, depths = dict(zip((8, 8.5, 9, 9.5, 10, 10.5), scale(plt, *INFERNO, 6))), ordered(plt, VIRIDIS, (8, 9, 10))
    fig, axes = plt.subplots(2, 3, figsize=(6.9, 4.75))
    optima = []
    for ax, d in zip(axes[0], depths):
        gain = count[d, 4]["active"] / count[d, 2]["active"] - 1  # extra compute-active parameters after growth
        for budget in sorted({r["budget"] for r in growth if (r["arm"], r["depth"]) == (arm, d)}):
            rho, loss, rows = growth_sweep(growth, arm, d, budget)
            complete = len(rho) == (5 if arm == "dep" and budget == d else 9)
            best = rho_fit(ax, rho, loss, bcol[budget], ls="-" if complete else "--")
            if best and rho[0] == 0:  # the rho = 0 run is the fixed-K=2 control at the same compute
                tpp = np.array([r["steps"] * r["batch"] for r in rows]) / count[d, 2]["stored"]
                optima.append(dict(depth=d, budget=budget, rho=best[0], complete=complete, tpp_k2=tpp[0], gain=gain,
                                   tpp=float(np.interp(best[0], rho, tpp)), expansion=1 + best[0] * gain))
        ax.set(title=f"$d={d}$", xlabel="$\\rho$", xlim=(-0.012, 0.412), xticks=np.linspace(0, 0.4, 5))
    x = np.array([o["tpp_k2"] for o in optima])
    a, b = np.polyfit(x, [o["tpp"] for o in optima], 1)  # the affine law TPP(rho*) = a TPP_K2 + b (App. A.2.3)
    for o in optima:
        o["affine_rho"] = (o["tpp_k2"] / (a * o["tpp_k2"] + b) - 1) / o["gain"]  # what the law implies (App. A.3.2)
    for d, (c, m) in depths.items():
        mine = sorted((o for o in optima if o["depth"] == d), key=lambda o: o["tpp_k2"])
        at = [o["tpp_k2"] for o in mine]
        for ax, y in zip(axes[1], ("tpp", "expansion", "rho")):
            ax.plot(at, [o[y] for o in mine], color=c, alpha=0.55, lw=1)
            ax.scatter(at, [o[y] for o in mine], 20, marker=m, ec=c, fc=[c if o["complete"] else "white" for o in mine],
                       label=f"$d={d}$" if y == "tpp" else None)  # an incomplete sweep's optimum is hollow
        axes[1][2].plot(at, [o["affine_rho"] for o in mine], "*", ms=7, color=INK,
                        label="Affine-fit $\\rho^\\star$" if d == 8 else None)
    xs = np.linspace(x.min(), x.max(), 100)
    axes[1][0].plot(xs, a * xs + b, color=INK, lw=1.2, label="Affine fit")
    axes[1][0].plot(xs, xs, ":", color=MUTED, lw=1.2, label="Identity")
    axes[1][1].plot(xs, xs / (a * xs + b), color=INK, lw=1.2, label="Affine-fit implication")
    for ax, title, y in zip(axes[1], ("TPP", "Expansion", "Growth"), ("$\\mathrm{TPP}_{K_{\\rho^\\star}}$",
                                                                      "$E_{K_{\\rho^\\star}}/E_2$", "$\\rho^\\star$")):
        ax.set(title=title, xlabel="$\\mathrm{TPP}_{K2}$", ylabel=y)
        ax.legend(loc="upper left" if title == "TPP" else "lower right", fontsize=6.5)
    axes[0][0].set_ylabel("Loss")
    fig.tight_layout(rect=(0, 0, 1, legend_band(fig, [([(key(c, "o"), f"$d={b:g}$") for b, c in bcol.items()], 6)])),
                     h_pad=0.8, w_pad=0.6)
    return fig, dict(optima=optima, affine_slope=float(a), affine_intercept=float(b)), [stated(
        f"{AFFINE[arm][0]} affine TPP law, {what}", float(ours), paper, "App. A.2.3") for what, ours, paper in zip(
        ("slope a", "intercept b"), (a, b), AFFINE[arm][1:])]


def fixed_fraction_figures(plt, diag):
    """Figure 13: each growth family's sweeps at budget = depth, their vertices and mean (the ladder's fixed rho); and
    Figure 10c: Deep Vanilla Grow's sweeps alone, with rho* and the loss there."""
    depths = ordered(plt, VIRIDIS, (8, 9, 10))
    fig, axes = plt.subplots(1, 3, figsize=(6.9, 2.95))
    means = {}
    for ax, (title, series) in zip(axes, diag.items()):
        fits = [rho_fit(ax, *s, *depths[d], alpha=0.75, vline=True, star=False) for d, s in series.items()]
        means[title] = float(np.mean([f[0] for f in fits if f]))
        ax.axvline(means[title], color=INK, ls="--", lw=1.1)
        ax.text(0.97, 0.95, f"Mean $\\rho^*={means[title]:.3f}$", transform=ax.transAxes, ha="right", va="top")
        top = 0.8 if title == "Deep Vanilla Grow" else 0.4
        lo, hi = min(l.min() for _, l in series.values()), max(l.max() for _, l in series.values())
        ax.set(xlim=(-0.03 * top, 1.03 * top), xticks=np.linspace(0, top, 5), xlabel="Growth fraction ($\\rho$)",
               title=title, ylim=(lo - 0.06 * (hi - lo), hi + 0.28 * (hi - lo)), box_aspect=1)
        ax.yaxis.set_major_locator(plt.matplotlib.ticker.MultipleLocator(0.05))
    axes[0].set_ylabel("Loss")
    keys = [(key(c, m, ms=4.5), f"d{d} budget / model") for d, (c, m) in depths.items()]
    fig.tight_layout(rect=(0, 0, 1, legend_band(fig, [(keys, 3)])))
    fig10c, axes = plt.subplots(1, 3, figsize=(6.9, 2.5))
    optima = {}
    for ax, (d, (rho, loss)), colour in zip(axes, diag["Deep Vanilla Grow"].items(), scale(plt, *INFERNO, 6)[::2]):
        optima[d] = rho_fit(ax, rho, loss, colour, ORDER_MARKERS[d], vline=True)
        ax.text(0.97, 0.95, "$\\rho^\\star=%.3f$\n$L^\\star=%.4f$" % optima[d], color=colour, transform=ax.transAxes,
                ha="right", va="top")
        ax.set(title=f"$d={d}$", xlabel="Growth fraction ($\\rho$)", xlim=(-0.025, 0.825),
               xticks=np.arange(0, 0.9, 0.2))
        ax.yaxis.set_major_formatter("{x:.3f}")
    axes[0].set_ylabel("Loss")
    fig10c.tight_layout()
    rho_star, loss_star = ({d: o[i] for d, o in optima.items()} for i in (0, 1))
    return dict(fig10c=(fig10c, dict(rho_star=rho_star, loss_star=loss_star), [
                    stated(f"Deep Vanilla Grow rho* at d{d}", rho_star[d], p, "App. A.2.3")
                    for d, p in zip(rho_star, (0.556, 0.559, 0.516))]),
                fig13=(fig, dict(mean_rho_star=means), [
                    stated(f"{t} mean rho*", means[t], p, "App. A.4.3")
                    for t, p in (("Deep Vanilla Grow", 0.544), ("Loop Grow", 0.170), ("Untied Grow", 0.271))]))


def sweep_panel(plt, ax, cells, x_key, colours):
    """Loss against a token-allocation x at budgets d8-d12, fixed-K controls and growth cells; mean optima dashed."""
    means = {}
    for part, word, line, alpha, y in (("controls", "Fixed", MUTED, 0.35, 0.86), ("growth", "Growth", INK, 1, 0.97)):
        optima = []
        for b, colour in zip(range(8, 13), colours):
            x, loss = np.array(sorted((r[x_key], r["loss"]) for r in cells[part] if r["budget"] == b)).T
            if part == "controls":
                ax.plot(x, loss, ":", color=colour, alpha=0.25)
                ax.plot(x, loss, "o", ms=4.5, mfc="none", color=colour, alpha=0.32)
            else:
                ax.plot(x, loss, "o", ms=4.5, color=colour, mec="white", mew=0.6, zorder=4)
            coef, v, bracketed = quadratic(np.log(x), np.log(loss)) if len(x) >= 3 else (None, None, False)
            optima += [math.exp(v)] * bracketed
            if bracketed and part == "growth":
                draw_quadratic(ax, coef, np.log(x), colour, star=v, ms=10, lw=1.35)
        means[part] = float(np.mean(optima))
        ax.axvline(means[part], color=line, ls="--", lw=1.1, alpha=alpha)
        ax.text(means[part] * 1.03, y, f"{word} {means[part]:.2f}", transform=ax.get_xaxis_transform(), va="top",
                fontsize=7.5, color=line)
    ax.set_xscale("log")
    log_axis(ax.xaxis, plt, plain=True)
    ax.yaxis.set_major_locator(plt.matplotlib.ticker.MultipleLocator(0.05))
    ax.yaxis.set_major_formatter("{x:.2f}")
    return means


def token_allocation_figure(plt, cells, ablation):
    """Figure 10d: loss against 6T^2/C with and without growth (Loop-2, Untied-2), and Untied Grow's ablation."""
    colours = scale(plt, *INFERNO, 5)
    fig, axes = plt.subplots(1, 3, figsize=(6.9, 2.9))
    means = {arm: sweep_panel(plt, ax, cells[arm], "six_t_squared_over_c", colours) for ax, arm in zip(axes, cells)}
    for ax, title in zip(axes, ("Loop-2", "Untied-2")):
        ax.set(title=title, xlabel="$6T^2/C$", ylim=(min(a.get_ylim()[0] for a in axes[:2]),
                                                     max(a.get_ylim()[1] for a in axes[:2])))
    axes[0].set_ylabel("Loss")
    base = sorted((r["depth"], float(r["scheduled_matrix_flops"]), r["validation_loss"]) for r in ablation
                  if r["ladder"] == "tpp8_fitrho" and 6 <= r["depth"] <= 16)
    out = {}
    for name, (label, colour, marker) in ABLATION.items():
        log_loss, log_c = np.log([(r["validation_loss"], float(r["scheduled_matrix_flops"])) for r in ablation
                                  if r["ladder"] == name]).T
        out[name] = []
        for _, c_base, l_base in base:
            i, j = np.argsort(abs(log_loss - math.log(l_base)))[:2]
            at = log_c[i] + (log_c[j] - log_c[i]) / (log_loss[j] - log_loss[i]) * (math.log(l_base) - log_loss[i])
            out[name].append(c_base / math.exp(at))
        axes[2].plot([b[1] for b in base], out[name], "-" + marker, ms=4.5, color=colour, label=label,
                     mfc="white" if marker == "s" else colour)
    axes[2].axhline(1, color=MUTED, ls=":", lw=1)
    every = [m for v in out.values() for m in v]
    axes[2].set(xscale="log", ylim=(min(every) - 0.005, max(every) + 0.025), title="Untied Grow",
                ylabel="Compute Multiplier", xlabel="Compute (FLOPs)")
    keys = [(key(c, "o"), f"$d={b}$") for b, c in zip(range(8, 13), colours)] + [
        (key(MUTED, "o", ":", hollow=True), "Fixed controls"), (key(INK, "*", ms=7), "Fit + optimum")]
    legend_band(fig, [(list(zip(*axes[2].get_legend_handles_labels())), 1)], 0.84)
    fig.tight_layout(rect=(0, 0, 1, legend_band(fig, [(keys, 3)], 0.36)))
    loss = {(r["ladder"], r["depth"]): r["validation_loss"] for r in ablation}
    change = [loss["tpp8_rho0p30", d] - loss["tpp8_fitrho", d] for d, _, _ in base]
    tpp6 = max(abs(1 - m) for k in ("tpp6_fitrho", "tpp6_rho0p30") for m in out[k])
    a24 = "App. A.2.4"
    return fig, dict(mean_optimum=means, ablation=dict(depths=[b[0] for b in base], multipliers=out)), [
        stated(f"mean optimal 6T^2/C, {arm} {part}", means[arm][part], p, a24)
        for (arm, part), p in MEAN_6T2C.items()] + [
        stated("loss change from rho = 0.30 instead of the fitted rho, smallest", min(change), -0.0009, a24),
        stated("loss change from rho = 0.30 instead of the fitted rho, largest", max(change), 0.0019, a24,
               "the text rounds to 1e-4: 0.00192 prints as 0.0019"),
        stated("largest compute change from reusing TPP 6 ('less than about 5%')", tpp6, 0.05, a24,
               "the text gives a bound, not a value")]


def fixed_token_panels(plt, scaling_ax, optima_ax, family, budget_colours, coloured_slices=False):
    """1B-token ladders per K with the slices B1-B5; at each, every K's loss (R4) and the K* vertex -> optima, keys."""
    ladders = {int(K): list(zip(*sorted((r["compute"], r["loss"], r["depth"]) for r in rows)))
               for K, rows in family.items()}
    k_colours = dict(zip(ladders, scale(plt, *MAGMA, len(ladders))))
    for K, (x, loss, depth) in ladders.items():
        scaling_ax.plot(x, loss, color=k_colours[K], lw=1.4)
        for xi, li, d in zip(x, loss, depth):
            scaling_ax.plot(xi, li, DEPTH_MARKERS[d], ms=4.5, color=k_colours[K], mec="white", mew=0.4)
    optima, shown = [], []
    for C, c in zip(BUDGETS, budget_colours):
        scaling_ax.axvline(C, ls=(0, (2, 3)), zorder=0, **(dict(color=c, lw=1.6, alpha=0.8) if coloured_slices
                                                           else dict(color=MUTED, lw=0.8, alpha=0.35)))
        Ks, losses = at_budget(ladders, C)
        if len(Ks) == len(ladders):  # every K must reach the budget
            k_star, l_star, _, coef = loop_optimum(Ks, losses)
            draw_quadratic(optima_ax, coef, np.log(Ks), c, star=math.log(k_star), ms=8, lw=1.4)
            optima_ax.plot(Ks, losses, "o", ms=4, color=c)
            optima, shown = optima + [(k_star, l_star)], shown + [*losses, l_star]
    log2_axis(optima_ax, [1, 2, 3, 4, 6], lim=(0.88, 7.55))
    optima_ax.set_ylim(min(shown) - 0.018, max(shown) + 0.018)
    for ax in (scaling_ax, optima_ax):
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:.2f}".rstrip("0").rstrip("."))
    depths = sorted({d for _, _, dd in ladders.values() for d in dd})
    return optima, ([(key(c, lw=1.4), f"K={K}") for K, c in k_colours.items()],
                    [(key(MUTED, DEPTH_MARKERS[d], "none", ms=4.5), f"d{d}") for d in depths])


def fixed_token_figure(plt, fresh):
    """Figure 8: tied (Loop-2) and untied (Untied-2) recurrence at 1B tokens; the two share the K=1 ladder."""
    bcol = scale(plt, *INFERNO, 5)
    fig, axes = plt.subplots(1, 4, figsize=(13.8, 4.3))
    k_star = {}
    for (s_ax, o_ax), family, name in zip((axes[:2], axes[2:]), ("tied", "untied"), ("Loop-2", "Untied-2")):
        optima, (k_keys, d_keys) = fixed_token_panels(plt, s_ax, o_ax, fresh[family], bcol)
        k_star[family] = [o[0] for o in optima]
        flop_axis(s_ax, list(FLOP_TICKS))
        s_ax.set(title=f"{name} scaling", xlabel="Compute (FLOPs)", ylabel="Loss", xlim=(0.38e18, 10.7e18),
                 box_aspect=1)
        o_ax.set(title=f"{name} optima", xlabel="Recurrence", ylabel="Loss (Interpolated)", box_aspect=1)
    c_keys = [(key(c, lw=1.4), f"$C={C / 1e18:.2f}\\times10^{{18}}$") for C, c in zip(BUDGETS, bcol)]
    fig.tight_layout(rect=(0, 0, 1, legend_band(fig, [(k_keys, 5), (d_keys, 8), (c_keys, 5)])), w_pad=1.5)
    return fig, dict(k_star=k_star), [stated("largest K* at 1B tokens ('between one and two passes')", max(
        max(k) for k in k_star.values()), 2, "App. A.2.2", "the text gives a bound, not a value")]


def line_through(x, y):
    """Piecewise linear through the knots (x, y), extended linearly past both ends -> (slopes, function)."""
    x, y = x[np.argsort(x)], y[np.argsort(x)]
    s = np.diff(y) / np.diff(x)
    return s, lambda t: np.interp(t, x, y) + np.minimum(t - x[0], 0) * s[0] + np.maximum(t - x[-1], 0) * s[-1]


def allocation_panels(top, bottom, runs, colours):
    """Figure 7, left: loss against compute per depth (markers: core size) with the frontier, and regret to it."""
    log_c, losses, best_sum = np.log([r["compute"] for r in runs]), np.array([r["loss"] for r in runs]), -np.inf
    for chain in itertools.product(*[[i for i, r in enumerate(runs) if r["depth"] == d] for d in range(6, 11)]):
        slopes, at = line_through(log_c[list(chain)], losses[list(chain)])  # the tightest convex chain below all runs
        if np.all(np.diff(slopes) >= -1e-12) and np.all(at(log_c) <= losses + 1e-12) and at(log_c).sum() > best_sum:
            best, best_sum, frontier = chain, at(log_c).sum(), at
    vertices = {}
    for d, colour in zip(range(6, 11), colours):
        c, loss, core = np.array(sorted((r["compute"], r["loss"], d - r["shell"]) for r in runs if r["depth"] == d)).T
        top.plot(c, loss, color=colour, lw=1.3)
        for ci, li, k in zip(c, loss, core):
            top.plot(ci, li, CORE_MARKERS[k], ms=4.8, color=colour, mec="white", mew=0.4)
        regret = 1e3 * (loss - frontier(np.log(c)))
        coef, vertices[d], _ = quadratic(core / d, regret)
        bottom.plot(core / d, regret, "o", ms=3.5, color=colour)
        draw_quadratic(bottom, coef, core / d, colour, np.asarray, np.asarray, vertices[d], ls=(0, (1, 2)), lw=1.4)
    xs = np.geomspace(np.exp(log_c.min()) / 1.05, np.exp(log_c.max()) * 1.05, 100)
    top.plot(xs, frontier(np.log(xs)), dashes=(4, 3), lw=1.2, alpha=0.7, color="black")
    flop_axis(top, [5e17, 1e18, 2e18])
    bottom.axhline(0, color=MUTED, ls="--", lw=0.8)
    bottom.set(xlim=(0.18, 0.82), xticks=np.linspace(0.2, 0.8, 4))
    bottom.xaxis.set_major_formatter("{x:.1f}")
    return dict(frontier_cores={runs[i]["depth"]: runs[i]["depth"] - runs[i]["shell"] for i in best},
                regret_vertex=vertices)


def growth_target_panels(top, bottom, targets, lens, colours):
    """Figure 7, middle right: loss and KL effective depth against the growth target K (hollow: fixed K) per budget."""
    kl_depth, rising = {(r["budget"], r["target"]): r["kl_effective_depth"] for r in lens}, {}
    for B, colour in zip((2, 2.5, 3, 3.5, 4), colours):
        k, loss = zip(*sorted((r["target"], r["loss"]) for r in targets if r["budget"] == B))
        rising[B] = bool(np.all(np.diff([kl_depth[B, t] for t in k]) > 0))
        for ax, y in ((top, loss), (bottom, [kl_depth[B, t] for t in k])):
            ax.plot(k, y, color=colour, lw=2)
            ax.plot(k[k[0] == B:], y[k[0] == B:], "o", ms=5, color=colour, mec="white", mew=0.5, zorder=4)
            ax.plot(k[:k[0] == B], y[:k[0] == B], "o", ms=5, color=colour, mfc="white", mew=2, zorder=4)
    top.axhline(next(r["loss"] for r in targets if r["budget"] == 2), color=MUTED, ls=":", lw=1)
    top.yaxis.set_major_formatter("{x:.3f}")
    for ax in (top, bottom):
        log2_axis(ax, [2, 3, 4, 6, 8])
    best = {B: min((r["loss"], r["target"]) for r in targets if r["budget"] == B)[1] for B in rising if B > 2}
    return dict(kl_effective_depth={f"B{B:g} K{t}": v for (B, t), v in kl_depth.items()}, best_target=best,
                kl_rising=rising)


def allocation_figure(plt, release, fresh, loop_grow):
    """Figure 7, a column per decision: block allocation, recurrence, growth target, growth timing and its TPP."""
    fig, axes = plt.subplots(2, 4, figsize=(10.35, 5.85))
    viridis5, inferno5 = scale(plt, *VIRIDIS, 5), scale(plt, *INFERNO, 5)
    numbers = dict(allocation=allocation_panels(*axes[:, 0], early(release, "shell"), viridis5))
    optima, (k_keys, d_keys) = fixed_token_panels(plt, *axes[:, 1], fresh["tied"], inferno5, coloured_slices=True)
    target = numbers["growth_target"] = growth_target_panels(*axes[:, 2], early(release, "grow_targets"),
                                                             early(release, "grow_lens"), inferno5)
    numbers.update(stored_tpp_mean=sweep_panel(plt, axes[1, 3], early(release, "stored_tpp"), "tpp", inferno5),
                   loop_grow_rho_star={d: rho_fit(axes[0, 3], rho, loss, c)[0]
                                       for (d, (rho, loss)), c in zip(loop_grow.items(), inferno5)})
    for ax, (title, x, y) in zip(axes.flat, FIG7_PANELS):
        ax.set(title=title, xlabel=x, ylabel=y)
    axes[0, 3].set(xlim=(-0.012, 0.412), xticks=np.linspace(0, 0.4, 5))
    flop_axis(axes[0, 1], [5e17, 2e18, 1e19])
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / 5.85), h_pad=1.2, w_pad=0.8)
    dot = lambda c, **kw: key(c, "o", ms=4.5, **kw)
    bands = [[([(key(c, lw=1.3), f"d{d}") for d, c in zip(range(6, 11), viridis5)], 5),
              ([(key(MUTED, m, "none", ms=4.5), f"C={k}") for k, m in CORE_MARKERS.items()], 4)],
             [(k_keys, 5), (d_keys, 4), ([(key(MUTED, ls=(0, (2, 3))), "compute slice")], 1)],
             [([(dot(c, lw=2), f"$B={B:g}$") for B, c in zip((2, 2.5, 3, 3.5, 4), inferno5)], 3),
              ([(dot(MUTED, ls="none", hollow=True), "fixed K")], 1)],
             [([(dot(c), f"d{b}") for b, c in zip(range(8, 13), inferno5)], 3)]]
    for ax, groups in zip(axes[0], bands):
        legend_band(fig, groups, (ax.get_position().x0 + ax.get_position().x1) / 2)
    return fig, numbers, [
        stated("budgets where growing to K=4 gives the lowest loss (of 4)",
               sum(t == 4 for t in target["best_target"].values()), 4, "App. A.2.3"),
        stated("budgets where a larger target gives a larger KL effective depth (of 4)",
               sum(target["kl_rising"][B] for B in target["best_target"]), 4, "App. A.2.3"),
        stated("Loop Grow's refitted initial stored TPP (the mean optimum, rounded)",
               round(numbers["stored_tpp_mean"]["growth"]), 7, "App. A.4.3")]


def figure9(plt, release):
    """Figure 9: the loss above K=1 against k per family, anchor and budget; the optima's TPP and expansion laws."""
    budgets = early(release, "tpl_budgets")
    names = sorted(budgets, key=int)
    log_c = np.log([float(budgets[b]) for b in names])
    sweeps = collections.defaultdict(list)
    for r in sorted(early(release, "tpl"), key=lambda r: r["k"]):
        sweeps[r["family"], r["anchor"], int(names[np.argmin(abs(log_c - math.log(r["C"])))])].append(r)
    anchors, look_of = sorted({a for _, a, _ in sweeps}), ordered(plt, INFERNO, sorted(map(int, budgets)))
    fig = plt.figure(figsize=(13.8, 4.62))
    margin = grid(fig, 2, len(anchors), 0.75, 0.55, 1.52, 1.52, 0.12, 0.42, sharex=True, sharey="row")
    relation = grid(fig, 2, 2, 9.75, 0.55, 1.52, 1.52, 0.62, 0.42, sharex="col")
    optima, numbers, checks = collections.defaultdict(list), dict(not_bracketed=[]), []
    for (family, anchor, budget), rows in sorted(sweeps.items()):
        if len(rows) < 3:
            continue
        k, L, tpp, nc = (np.array([r[f] for r in rows], float) for f in ("k", "L", "tpp", "Nc"))
        coef, v, bracketed = quadratic(np.log(k), np.log(L))
        bracketed = bracketed and 0 < np.argmin(L) < len(L) - 1
        (c, m), ax = look_of[budget], margin[int(family == "dep"), anchors.index(anchor)]
        rel = lambda u: 1000 * (np.exp(u) - L[0])  # loss above k = 1, in 1e-3
        ax.plot(k, rel(np.log(L)), marker=m, ms=4.5, lw=1.4, color=c, mfc=c if bracketed else "white")
        if coef[0] > 0:
            draw_quadratic(ax, coef, np.log(k), c, y=rel, alpha=0.75, lw=1.2, star=v if bracketed else None)
        if bracketed:  # TPP at K* by log-log interpolation over k, N_c at K* linearly
            optima[family].append((anchor, tpp[0], np.interp(math.exp(v), k, nc) / nc[0],
                                   math.exp(np.interp(v, np.log(k), np.log(tpp)))))
        else:
            numbers["not_bracketed"].append(f"{family} d{anchor}/B{budget}")
    for row, (family, arm) in enumerate(FAMILIES):
        name, colour = look(arm)[:2]
        for ax, anchor in zip(margin[row], anchors):
            ax.axhline(0, color=INK, lw=1.1, alpha=0.6)
            log2_axis(ax, [1, 2, 3, 4, 6])
            ax.set(title=f"{name} · d{anchor}", ylim=(None, min(ax.get_ylim()[1], 50)))
        at, x, *ys = map(np.array, zip(*optima[family]))
        for ax, y, (what, label, ticks, paper_laws, equation) in zip(relation[row], ys, RELATIONS):
            for anchor in anchors:  # an anchor's optima, in budget order (rising TPP_K1)
                ax.plot(x[at == anchor], y[at == anchor], ls="--", alpha=0.4, color=colour)
                ax.plot(x[at == anchor], y[at == anchor], ANCHOR_MARKERS[anchor], ms=5, color=colour, mec="white")
            b, log_a = np.polyfit(np.log(x), np.log(y), 1)  # the power law y = a x^b, OLS in log-log
            r2 = 1 - np.sum((np.log(y) - log_a - b * np.log(x)) ** 2) / np.sum((np.log(y) - np.log(y).mean()) ** 2)
            ax.plot(np.sort(x), math.exp(log_a) * np.sort(x) ** b, color=INK, lw=1.3)
            ax.text(0.04, 0.96, f"$y = {math.exp(log_a):.2f} x^{{{b:.2f}}}$\n$R^2 = {r2:.3f}$", va="top",
                    transform=ax.transAxes, color=MUTED, fontsize=8.5)
            log2_axis(ax, [7, 15, 30, 70])
            ticks = [t for t in ticks if y.min() / 1.15 < t < y.max() * 1.15]
            ax.set(yscale="log", yticks=ticks, yticklabels=[f"{t:g}" for t in ticks], ylabel=label,
                   title=f"{name} {what}")
            ax.tick_params(axis="y", which="minor", labelleft=False)
            numbers[f"{name} {what}"] = dict(a=math.exp(log_a), b=b, r2=r2, points=len(x))
            checks += [stated(f"{name} {what} {v}", ours, paper, f"App. A, Eq. {equation}", "rounded in the text")
                       for v, ours, paper in zip("ab", (math.exp(log_a), b), paper_laws[row])]
    fig.supxlabel("Recurrence", x=(0.75 + 2.5 * 1.52 + 2 * 0.12) / 13.8, y=0.01, fontsize=10)
    fig.text((9.75 + 1.52 + 0.31) / 13.8, 0.01, "$\\mathrm{TPP}_{K1}$", ha="center", va="bottom", fontsize=10)
    fig.supylabel("Loss $-$ K1 loss ($10^{-3}$)", x=0.005, fontsize=10)
    legend_band(fig, [([(key(*look_of[b]), f"Budget d{b}") for b in look_of]
                       + [(key(MUTED, ANCHOR_MARKERS[a], "none"), f"Anchor d{a}") for a in anchors], 12)])
    return fig, numbers, checks


def incumbents(rows):
    """Figure 11: a chain's incumbent loss per phase -> {slot: loss or None}, slot -1 the start (round 1's GLR probe),
    11 (r - 1) + i round r's phase i. Adopted: a setting that beats the probe (or incumbent) by ADOPT, one knob only."""
    by = collections.defaultdict(list)
    for r in rows:
        by[int(r["round"]), r["phase"]].append((float(r["val_loss"]), r["probe"] == "True", r["knob"]))
    current = next(loss for loss, probe, _ in by[1, "glr"] if probe)
    out = {-1: current}
    for slot, (rnd, phase) in enumerate((rnd, phase) for rnd in (1, 2) for phase in PHASES):
        runs = by.get((rnd, phase))
        if not runs:  # Vanilla and Deep Vanilla have no injection weight to tune
            continue
        probe = [loss for loss, is_probe, _ in runs if is_probe]
        if phase in ("schedule", "adam"):
            base = probe[0] if probe else current
            best = {knob: min(l for l, p, k in runs if k == knob and not p) for _, p, knob in runs if not p}
            adopted = [b for b in best.values() if base - b > ADOPT]
            current = base if not adopted else adopted[0] if len(adopted) == 1 else None  # two: stacking untested
        else:
            low = min(loss for loss, _, _ in runs)
            current = probe[0] if probe[0] - low <= ADOPT else low
        out[slot] = current
    return out


def figure11(plt, release):
    """Each architecture's tuning chain at d8: the incumbent loss after every phase of two rounds (App. A.4.1)."""
    tune = early(release, "tune")
    finals = {r["arm"]: float(r["val_loss"]) for r in tune if r["kind"] == "final"}
    numbers, entries = {}, []
    with plt.rc_context(appendix_rc((10.5, 11.5, 11, 9.5, 9.5))):
        fig = plt.figure(figsize=(5.0, 5.45))
        ax = grid(fig, 1, 1, 0.8, 1.15, 4.05, 3.2, 0, 0)[0, 0]
        for chain, (final, marker) in CHAINS.items():
            slots = incumbents([r for r in tune if r["series"] == chain and r["kind"] == "chain"])
            label, colour, arm_marker = look(chain.removeprefix("chain_").split("_no_")[0])[:3]
            label, marker = label + " No-Coda-Inj" * bool(marker), marker or arm_marker
            measured = {s: v for s, v in slots.items() if v is not None}  # round 2 goes on from round 1's last
            ax.plot(list(measured), list(measured.values()), marker=marker, ms=5.5, lw=1.3, color=colour)
            last, tuned = max(measured), measured[max(measured)]
            if slots[21] is None:  # the last phase improved with two knobs: the final recipe's run, hollow
                tuned = finals[final]
                ax.plot([last, 21], [measured[last], tuned], marker, ls="-", lw=1.3, ms=5.5, color=colour,
                        mfc="white", mew=1.2, markevery=[1])
            round1 = measured[max(s for s in measured if s < 11)]
            numbers[label] = dict(incumbents=slots, round1=round1, tuned=tuned, hollow=slots[21] is None)
            entries.append((key(colour, marker, ms=5.5, lw=1.3), label))
        ax.set_xticks(range(-1, 22), ["Initial", *PHASES.values(), *PHASES.values()], rotation=90)
        ax.axvline(10.5, color=MUTED, ls=":", lw=1)
        ax.xaxis.grid(False)
        top = ax.secondary_xaxis("top")
        top.set_xticks([5, 16], ["Round 1", "Round 2"])
        top.tick_params(length=0)
        ax.set(xlabel="Hyperparameter", ylabel="Loss", title="Chain tuning", xlim=(-1.6, 21.6))
        legend_band(fig, [(entries, 3)])
    best = numbers["Untied-2"]["tuned"]
    return fig, numbers, [
        stated("chains whose second round ends below their first (of 7)",
               sum(n["tuned"] < n["round1"] for n in numbers.values()), 7, "App. A.4.1, Figure 11"),
        stated("chains tuned to a higher loss than Untied-2 (of 6)", sum(n["tuned"] > best for n in numbers.values()),
               6, "App. A.4.1, Table 4")]


def log_loss_axis(ax, lim):
    """The appendix log-loss axis: every major and minor tick labelled with 2 decimals (lim None: as it is)."""
    ax.set(yscale="log", ylim=lim)
    ax.yaxis.set_major_formatter("{x:.2f}")
    ax.yaxis.set_minor_formatter("{x:.2f}")


def figure12(plt, release):
    """Per arm and budget a quadratic of log L in log TPP over five models: its vertex, the optimal TPP (App. A.4.2)."""
    rows = early(release, "tpp")
    tpps, losses = np.array([(r["tpp"], r["L"]) for r in rows]).T
    look_of, numbers = ordered(plt, INFERNO, sorted({r["budget"] for r in rows})), {}
    fig = plt.figure(figsize=(6.9, 2.2))
    axes = grid(fig, 1, 5, 0.62, 0.42, 1.18, 1.18, 0.07, 0, sharey=True)[0]
    for ax, arm in zip(axes, TPP_ARMS):
        vertices = []
        for b, (c, m) in look_of.items():
            u, L = np.array([(np.log(r["tpp"]), r["L"]) for r in rows if r["arm"] == arm and r["budget"] == b]).T
            coef, v, _ = quadratic(u, np.log(L))
            ax.plot(np.exp(u), L, m, ms=3.5, color=c)
            draw_quadratic(ax, coef, u, c, alpha=0.75, lw=1.1)
            ax.axvline(math.exp(v), color=c, ls=":", lw=0.9)
            vertices.append(math.exp(v))
        ax.axvline(np.mean(vertices), color=INK, ls="--", lw=1.0)
        ax.text(0.96, 0.95, f"$\\overline{{\\mathrm{{TPP}}^*}}={np.mean(vertices):.2f}$", transform=ax.transAxes,
                ha="right", va="top", fontsize=7.5)
        log2_axis(ax, [2, 5, 10, 20])
        log_loss_axis(ax, (losses.min() / 1.01, losses.max() * (losses.max() / losses.min()) ** 0.45))
        ax.set(xlim=(tpps.min() / 1.1, tpps.max() * 1.1), title=look(arm)[0], xlabel="TPP")
        numbers[look(arm)[0]] = dict(vertices=vertices, mean_tpp=float(np.mean(vertices)))
    axes[0].set_ylabel("Loss")
    legend_band(fig, [([(key(*look_of[b]), f"d{b} budget") for b in look_of], 5)])
    return fig, numbers, [stated(f"{name}: rounded mean TPP* (its ladder's TPP)", round(numbers[name]["mean_tpp"]),
                                 paper, "App. A.4.2") for name, paper in ROUNDED_TPP.items()]


def figure14a(plt, release):
    """Each (knob, depth) slice: the knob's runs at that depth and the depth's centre run (the fixed recipe)."""
    rows = early(release, "hyper1d")
    centres = {int(r["depth"]): r for r in rows if not r["knob"]}
    slices = collections.defaultdict(dict)
    for r in rows:
        if r["knob"]:
            slices[r["knob"], int(r["depth"])][float(r[r["knob"]])] = float(r["val_loss"])
    for (knob, depth), points in slices.items():
        points[float(centres[depth][knob])] = float(centres[depth]["val_loss"])
    look_of = ordered(plt, VIRIDIS, sorted(centres))
    losses = [loss for points in slices.values() for loss in points.values()]
    centre = {d: float(r["val_loss"]) for d, r in centres.items()}  # the fixed recipe's loss at each depth
    lo, hi = min(losses), min(max(losses), max(centre.values()) + 0.25)
    ylim = (lo - 0.04 * (hi - lo), hi + 0.04 * (hi - lo))  # no loss lies above it in the release's sweeps
    fig = plt.figure(figsize=(10.0, 4.5))
    for ax, knob in zip(grid(fig, 2, 6, 0.8, 0.5, 1.35, 1.35, 0.2, 0.78, sharey=True).flat, KNOBS):
        values = sorted({v for (k, _), points in slices.items() if k == knob for v in points})
        for depth in [d for d in sorted(centres) if (knob, d) in slices]:
            points = sorted(slices[knob, depth].items())
            x = [values.index(v) if knob in CATEGORICAL else v / float(centres[depth][knob]) for v, _ in points]
            c, m = look_of[depth]
            ax.plot(x, [loss for _, loss in points], marker=m, ms=4, lw=1.2, color=c)
            ax.axhline(centre[depth], color=c, ls="--", lw=0.9, alpha=0.55)
        if knob in CATEGORICAL:
            ax.set(xticks=range(len(values)), xticklabels=[f"{v:g}" for v in values], xlabel=CATEGORICAL[knob],
                   xlim=(-0.35, len(values) - 0.65))
        else:
            log2_axis(ax, [0.25, 0.5, 1, 2, 4], ["¼", "½", "1", "2", "4"], (0.2, 5))
            ax.set_xlabel("Multiple of center")
        log_loss_axis(ax, ylim)
        ax.tick_params(axis="y", colors="#111111")
        ax.set_title(KNOBS[knob])
    fig.supylabel("Loss", x=0.01, fontsize=10)
    legend_band(fig, [([(key(*look_of[d]), f"d{d}") for d in look_of] + [(key(MUTED, ls="--"), "Fixed recipe")], 6)])
    best_glr = {d: min(slices["glr", d], key=slices["glr", d].get) for d in sorted(centres)}
    return fig, dict(centres=centre, ylim=ylim, points=len(losses), best_glr=best_glr), [
        stated(f"Vanilla's preferred GLR at d{d}", glr, 0.04 if d <= 10 else 0.02, "App. A.4.4")
        for d, glr in best_glr.items()]


def figure14b(plt, release):
    """Figure 14b: quadratics of ln loss in log2 multiplier; beta (GLR ~ N^-beta): minus the OLS slope of the constant
    recipe's convex GLR vertices on log2(N_d / N_8) (App. A.4.4), or a growth architecture's adopted beta."""
    slices, numbers = early(release, "hyper_slices"), {}
    fig = plt.figure(figsize=(13.8, 5.75))
    axes = grid(fig, 3, 8, 0.7, 0.55, 1.52, 1.3, 0.1, 0.42, sharex=True, sharey="row")
    for (row, half), name in np.ndenumerate(ARCH_ROWS):
        arch, label, vertices = slices[name], look(name.lower().replace(" ", "_"))[0], {}
        colours = dict(zip(sorted(arch["parameters"], key=int), scale(plt, *VIRIDIS, 3)))
        N = arch["constant_parameters"]
        for ax, knob in zip(axes[row, 4 * half:], ("glr", "om", "rm", "wd")):
            for recipe, ls, scaled in (("scaled", "-", True), ("constant", "--", False)):
                for depth, points in ((arch[recipe] or {}).get(knob) or {}).items():
                    m = sorted(points, key=float)
                    x, loss, c = np.array(m, float), np.array([points[k] for k in m]), colours[depth]
                    coef, v, _ = quadratic(x, np.log(loss))
                    if recipe == "constant" and knob == "glr" and coef[0] > 0:
                        vertices[math.log2(N[depth] / N["8"])] = v
                    if depth == "8" and not scaled:  # the constant recipe's d8 is the scaled recipe's run
                        continue
                    ax.plot(2 ** x, loss, "o", ms=3.5, color=c, mfc=c if scaled else "white")
                    draw_quadratic(ax, coef, x, c, x=np.exp2, ls=ls, lw=1.1, star_colour=INK, ms=7,
                                   star=v if scaled and coef[0] > 0 else None)
            ax.axvline(1, color=MUTED, ls=":", lw=0.9)
            log2_axis(ax, [0.25, 0.5, 1, 2, 4], ["0.25×", "0.5×", "1×", "2×", "4×"], (2 ** -2.12, 2 ** 2.12))
            ax.set_title(f"{label} · GLR" if knob == "glr" else knob.upper())
            ax.yaxis.set_major_formatter("{x:.2f}")
        beta = -np.polyfit(list(vertices), list(vertices.values()), 1)[0] if vertices else arch["adopted_beta"]
        numbers[label] = dict(beta=beta, fitted=bool(vertices))
        axes[row, 4 * half].text(0.95, 0.94, f"$\\beta={beta:.2f}$", ha="right", va="top", bbox=dict(
            fc="white", ec="none", alpha=0.8), transform=axes[row, 4 * half].transAxes)
        axes[row, 0].set_ylabel("Loss")
    for ax in axes[2, 1::2]:  # neighbouring panels' end labels would touch
        ax.tick_params(labelbottom=False)
    fig.supxlabel("Multiplier", y=0.01, fontsize=10)
    legend_band(fig, [([(key(c, "o", "none"), f"d{d}") for d, c in colours.items()] + [
        (key(INK), "Scaled recipe"), (key(INK, ls="--"), "Constant"), (key(INK, "*", "none", ms=7), "Optimum")], 6)])
    return fig, numbers, [stated(f"{label}: constant-recipe GLR drift beta", numbers[label]["beta"], paper,
                                 "App. A.4.4, Table 8") for label, paper in STATED_BETA.items()]


def early_figures(plt, release):
    """Figures 7-14 from appendix_early/ -> {id: (figure, numbers, the text's numbers beside ours)}."""
    fresh, growth, counts = early(release, "fresh_data"), early(release, "growth"), early(release, "counts")
    deepvan = early(release, "deepvan_growth")
    dvg = {d: tuple(np.array([r[k] for r in deepvan if r["depth"] == d]) for k in ("rho", "loss")) for d in (8, 9, 10)}
    diag = {"Deep Vanilla Grow": dvg, **{title: {d: growth_sweep(growth, arm, d, d)[:2] for d in (8, 9, 10)}  # budget
                                        for title, arm in (("Loop Grow", "k2"), ("Untied Grow", "dep"))}}  # = depth
    with plt.rc_context(appendix_rc(APPENDIX_SIZE[:4] + (7,))):  # the release's legends here are size 7
        figures = dict(fig07=allocation_figure(plt, release, fresh, diag["Loop Grow"]),
                       fig08=fixed_token_figure(plt, fresh), fig10a=growth_timing_figure(plt, growth, counts, "k2"),
                       fig10b=growth_timing_figure(plt, growth, counts, "dep"), **fixed_fraction_figures(plt, diag),
                       fig10d=token_allocation_figure(plt, early(release, "token_allocation"),
                                                      early(release, "ablation")))
    with plt.rc_context(appendix_rc(APPENDIX_SIZE)):
        return dict(figures, fig09=figure9(plt, release), fig11=figure11(plt, release), fig12=figure12(plt, release),
                    fig14a=figure14a(plt, release), fig14b=figure14b(plt, release))


# every figure of the paper with data (Figure 1 is a drawing): where the text states it, and what it says (quoted)
CLAIMS = read_json(os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference", "paper_text.json"))
HELD_BACK = dict(fig04="fineweb_edu_ladders.json", fig02="loop_grid.csv", fig05="loop_grid.csv",
                 **{f"fig19{p}": f"{LADDERS}/downstream.json" for p in "abc"})
NOT_DRAWN = {"fig03": "drawn by `fit.py ladders --out` (figures/fig3_ladders.png); its numbers are checked here"}
GALLERY = "README.md"
DIFFERENCES = ("Panel sizes and legend bands approximate the release's inch layout (Figure 18b: square panels by "
               "aspect). Figure 2 is the release's right half (its left half: `fit.py ladders --out`). Figure 4's inset "
               "has no ticks, its legend keys no lines. Figure 5's inner legends are smaller than the release's 10 pt "
               "and its marginal-gain panel keeps matplotlib's y margins. Figure 7's regret quadratics span each "
               "depth's measured core fractions; Figure 9's minor ticks are matplotlib's; Figure 11 draws Operator-1 "
               "with the arms table's pentagon (the release: a square). Figure 19a's loss laws start from a 600-value "
               "floor grid (the release: 400); Figure 19c's group names have no brackets.")


def gallery(manifest):
    """The gallery page: per figure what the paper says, the image (or why not), each stated number beside ours."""
    lines = ["# The paper's figures from the authors' release", "",
             f"Written by `fit.py paper` from `{manifest['release']}`; rewritten on every run. Each figure: what the "
             "paper says it shows, the image, and each number the text states next to ours (difference relative to "
             f"the paper's; an explanation where it exceeds {TOLERANCE:.0%}). The numbers in full: "
             f"[{MANIFEST}]({MANIFEST}).", ""]
    for fig_id in sorted(set(manifest["figures"]) | set(manifest["skipped"])):
        skipped, rows = manifest["skipped"].get(fig_id), manifest["figures"].get(fig_id, {}).get("stated", [])
        claim = CLAIMS.get(fig_id) or CLAIMS[fig_id[:-1]]  # a panel exported alone (fig10a) takes its figure's
        lines += [f"## {fig_id}: {claim['section']}", "", f"> {claim['text']}", "",
                  f"Not drawn here: {skipped}." if skipped else f"![{fig_id}]({fig_id}.png)", ""]
        lines += ["| number | ours | paper | difference | where |", "|---|---:|---:|---:|---|"] * bool(rows)
        lines += [f"| {r['what']} | {r['ours']:.4g} | {r['paper']:.4g} | {100 * r['rel_diff']:.1f} %"
                  + (f" ({r['explanation']})" if "explanation" in r else "") + f" | {r['section']} |" for r in rows]
        lines += [""] * bool(rows)
    return "\n".join(lines + ["## Still different from the release", "", DIFFERENCES, ""])


def cmd_paper(args):
    release = args.release
    if os.path.isdir(os.path.join(release, "release")):  # `fit.py paper reference/`
        release = os.path.join(release, "release")
    if not os.path.isfile(os.path.join(release, LADDERS, "ladders.json")):
        raise UsageError(f"{args.release}: no {LADDERS}/ladders.json; pass the release folder (reference/ or "
                         "reference/release/)")
    check_outputs(args.out)
    held = {n: os.path.join(release, n) for n in set(HELD_BACK.values()) if os.path.isfile(os.path.join(release, n))}
    plt = pyplot()
    gammas, checks, E_flops = figure3_checks(release)
    try:
        made = dict(**ladder_figures(plt, release), fig06=effective_depth_figure(plt, release),
                    fig17=recurrence_figure(plt, release), **regimes_figures(plt, release),
                    **corpus_figures(plt, release), **early_figures(plt, release))
    except (KeyError, TypeError) as e:
        raise UsageError(f"{release}: a file is not laid out as the release's ({type(e).__name__} {e}); see "
                         "reference/release/SOURCE.md")
    if HELD_BACK["fig04"] in held:
        made["fig04"] = extrapolation_figure(plt, held[HELD_BACK["fig04"]])
    if HELD_BACK["fig02"] in held:
        fig2, fig5, numbers, checks5 = loop_grid_figures(plt, read_loop_grid(held[HELD_BACK["fig02"]]))
        made.update(fig02=(fig2, dict(gain=numbers["gain"]), checks5[:1]), fig05=(fig5, numbers, checks5[1:]))
    if HELD_BACK["fig19a"] in held:
        made.update(downstream_figures(plt, downstream_series(held[HELD_BACK["fig19a"]]),
                                       read_json(os.path.join(release, LADDERS, "tasks.json"))))
    figures = dict(fig03=dict(numbers=dict(gamma=gammas), stated=checks))
    figures.update({fig_id: dict(numbers=numbers, stated=checks) for fig_id, (_, numbers, checks) in made.items()})
    skipped = {f: NOT_DRAWN.get(f) or (f"needs {HELD_BACK[f]}, held back from the release copy (pass a folder that "
                                       "has it)" if f in HELD_BACK else "not drawn in this version")
               for f in CLAIMS if f not in made and f not in {m[:-1] for m in made}}
    manifest = jsonable(dict(release=os.path.normpath(release), floor_E=E_flops, tolerance=TOLERANCE, figures=figures,
                             skipped=skipped))
    paths = save_figures(args.out, {f"{f}.{e}": fig for f, (fig, _, _) in made.items() for e in ("png", "pdf")}, 300)
    plt.close("all")
    for name, text in ((MANIFEST, json.dumps(manifest, indent=1, allow_nan=False)), (GALLERY, gallery(manifest))):
        write_text(os.path.join(args.out, name), text)
    for fig_id, why in skipped.items():
        print(f"skipped {fig_id}: {why}")
    print(f"wrote {len(paths)} figure files to {args.out}, the numbers beside the paper's in {MANIFEST}, the gallery "
          f"{GALLERY}")
