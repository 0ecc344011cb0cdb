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

from arms import ARMS, DATA_CONSTRAINED, RELEASE_SERIES
from common import UsageError
from laws import (FIT, FitError, check_outputs, fit_free_e, fit_shared_e, jsonable, matched_multipliers,
                  note, pyplot, read_csv, save_figures)

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
        raise UsageError(f"{path}: not JSON ({e})")


def is_release_ladders(obj):
    """A release ladder file: {series: [{compute, loss, depth, ...}, ...]}."""
    return isinstance(obj, dict) and bool(obj) and all(
        isinstance(v, list) and v and all(isinstance(r, dict) and {"compute", "loss", "depth"} <= set(r) for r in v)
        for v in obj.values())


# The release's JSON layouts, recognised by their content; a command names the ones it reads when it refuses a file.
LAYOUTS = dict(
    ladders="the release's ladder series {series: [{compute, loss, depth}]} (appendix_ladders/*.json)",
    downstream="the release's downstream.json {series: [{compute, loss, depth, metrics, task_nll}]}",
    fineweb_edu="the release's FineWeb-Edu ladders {tasks, d26: {record}, arms: {arm: [{depth, compute_flops, val_loss, "
                "core_nll, core_accuracy, task_nll, task_accuracy}]}}",
)
EDU_HELD_OUT_ARM = "untied_grow"  # the FineWeb-Edu file's d26 record: the 7.4B Untied-Grow run no fit uses (Sec. 4.3)


def json_layout(obj):
    """-> "fineweb_edu", "downstream", "ladders" or None."""
    if isinstance(obj, dict) and isinstance(obj.get("arms"), dict) and "tasks" in obj:
        return "fineweb_edu"
    if is_release_ladders(obj):
        return "downstream" if all("metrics" in r for v in obj.values() for r in v) else "ladders"
    return None


def layout_error(path, reads, also=""):
    return UsageError(f"{path}: not a JSON layout this command reads; it reads {also}"
                      + "; ".join(LAYOUTS[k] for k in reads))


def read_layout(path, *layouts):
    """A release JSON file that must be in one of `layouts` (paper reads each of its files by its content)."""
    obj = read_json(path)
    if json_layout(obj) not in layouts:
        raise layout_error(path, layouts)
    return obj


def edu_records(path, obj):
    """The FineWeb-Edu layout -> (tasks, [(arm, record, origin, held_out)]): the ladder records of every arm, and the
    records beside "arms" and "tasks" (the d26 run: Untied-Grow's unless it names an "arm"), held out of every fit.
    Each record needs a whole depth > 0 and finite compute_flops, val_loss > 0."""
    tasks = obj["tasks"]
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise UsageError(f"{path}: 'tasks' must be a list of task names")
    out = [(RELEASE_SERIES.get(a, a), r, f"{path}:arms.{a}[{i}]", False) for a, recs in obj["arms"].items()
           for i, r in enumerate(recs if isinstance(recs, list) else [None])]
    if not out:
        raise UsageError(f"{path}: 'arms' holds no ladder records")
    out += [(r.get("arm", EDU_HELD_OUT_ARM), r, f"{path}:{k}", True) for k, r in obj.items()
            if k not in ("tasks", "arms") and isinstance(r, dict)]
    for arm, r, origin, _ in out:
        try:
            x, loss, depth = float(r["compute_flops"]), float(r["val_loss"]), r["depth"]
            assert isinstance(depth, int) and depth > 0 and math.isfinite(x) and x > 0 and math.isfinite(loss) \
                and loss > 0
        except (KeyError, TypeError, ValueError, AssertionError):
            raise UsageError(f"{origin}: needs a whole depth > 0 and finite compute_flops, val_loss > 0")
    return tasks, out


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


# ----------------------------------------------------------------------------------------------------- the look
# The release's appendix look (paper App. B-D): every arm in its arms-table colour and marker, an ablation in its
# family's colour told apart by marker, dash and a hollow face. APPENDIX_NAME: the appendix spells two arms unhyphenated.
APPENDIX_NAME = {"loop_grow": "Loop Grow", "untied_grow": "Untied Grow"}
INK, MUTED, GRID = "#22252A", "#68707C", "#DDE1E7"
#           release key: (label, family arm or colour, marker, line style, hollow)
VARIANTS = {"dep_nci": ("No Coda Inj.", "untied_2", "X", "-.", False),
            "dep_nonorm": ("Deep + Inj.", "deep_vanilla", "p", "--", False),
            "dep_noinject": ("Deep + Norm", "deep_vanilla", "v", ":", False),
            "k2_nci": ("No Coda Inj.", "loop_2", "X", "--", False),
            "k2_fixed_pc": ("NCI 2/C/3", "loop_2", "*", ":", False),
            "k1_1c2": ("1/C/2", "operator_1", "d", "-", False),
            "k1_van_recipe": ("Operator-1 Vanilla Recipe", "operator_1", "H", "-", True),
            "deeper_van": ("Deeper Vanilla", "deep_vanilla", "D", "-", True),
            "deeper_k1": ("Deeper Operator-1", "operator_1", "X", "-", True),
            "k2_grow_random": ("Rand. Loop", "loop_grow", "X", (0, (4, 2)), True),
            "deep_width": ("Deep Vanilla", "deep_vanilla", "h", "-", True),
            "dep_width": ("Untied-2", "untied_2", "D", "-", True),
            # Figure 16a compares Vanilla's recipes: distinct tab10 colours, GLR (van) stays grey
            "van_constant": ("Constant", "#1f77b4", "x", "-", False), "van_glr_om": ("GLR + OM", "#2ca02c", ">", "-", False),
            "van_glr_wd": ("GLR + WD", "#ff7f0e", "<", "-", False), "van_const_mup_om": ("muP OM", "#d62728", "v", "-", False),
            "van_mup_om": ("muP OM + GLR", "#9467bd", "s", "-", False), "van_wdr1": ("WDR1 + GLR", "#e377c2", "P", "-", False),
            # Figure 16f: the optimizers' colours, width-only hollow
            "muon": ("Muon", "#1f77b4", "o", "-", False), "adam": ("Adam", "#d62728", "s", "-", False)}


def look(key, label=None, like=None):
    """(label, colour, marker, line style, hollow) of a release series key or an arm of the table; like: the key whose
    colour and marker it takes (Figure 16a's GLR, 16f's optimizers)."""
    arm = RELEASE_SERIES.get(key, key)
    if like or key in VARIANTS:
        name, family, marker, ls, hollow = VARIANTS[like or key]
        colour = ARMS[family].color if family in ARMS else family
        return label or name, colour, marker, ls, hollow
    if arm in ARMS:
        return label or APPENDIX_NAME.get(arm, ARMS[arm].label), ARMS[arm].color, ARMS[arm].marker, "-", False
    return label or key, "#3F4752", "o", "--", True  # a series the release does not name: grey, open


def appendix_rc(size):
    """The release's appendix fonts and axes (base, title, axis label, ticks, legend sizes) for plt.rc_context."""
    base, title, label, ticks, legend = size
    return ({"font.family": "DejaVu Sans", "font.size": base, "axes.titlesize": title,
                         "axes.titleweight": "bold", "axes.labelsize": label, "xtick.labelsize": ticks,
                         "ytick.labelsize": ticks, "legend.fontsize": legend, "axes.grid": True, "grid.color": GRID,
                         "grid.linewidth": 0.65, "grid.alpha": 0.65, "axes.axisbelow": True, "axes.edgecolor": MUTED,
                         "xtick.color": MUTED, "ytick.color": MUTED, "text.color": INK, "axes.labelcolor": INK,
                         "legend.frameon": False, "pdf.fonttype": 42})


LADDER_SIZE, APPENDIX_SIZE = (8, 9, 8, 7, 7), (9.5, 10.5, 10, 8.5, 8)
times = lambda v, _=None: f"{v:g}×"


# ----------------------------------------------------------------------------------------------- ladder figures
LADDERS = "appendix_ladders"
REGIMES = "appendix_regimes"
# figure -> columns; a column: release file, groups [(reference key, [series])], and options: ref_depth (the
# reference's budgets start there, 8), anchor (a shared anchor depth, Figure 16a), ylim/yticks of the multiplier
# panel, title, legend "gamma" | "plain" | "pair" (width-only vs coupled, Figure 16e-f), labels {key: (label, like)}.
# A series is a release key; E is the free-floor fit (R1) of the file's Vanilla (timing.json: of ladders.json).
LADDER_FIGURES = {
    "fig15a": [dict(file="ladders", title="Untied-2", legend="plain", ylim=(0.95, 1.36), yticks=(1, 1.1, 1.2, 1.3),
                    groups=[("van", ["dep", "dep_nci", "dep_nonorm", "dep_noinject", "deep_van", "van"])]),
               dict(file="ladders", title="Loop-2", legend="plain", ylim=(0.95, 1.36), yticks=(1, 1.1, 1.2, 1.3),
                    groups=[("van", ["van", "k2", "k2_nci", "k2_fixed_pc"])]),
               dict(file="ladders", title="Operator-1", legend="plain", ylim=(0.95, 1.36), yticks=(1, 1.1, 1.2, 1.3),
                    groups=[("van", ["van", "k1_1c2", "k1_glr"])])],
    "fig15b": [dict(file="timing", groups=[("van", ["van", "deep_van", "deep_van_grow", "k1_glr", "k2", "k2_grow", "dep",
                                                    "dep_grow"])])],
    "fig15c": [dict(file="constant", groups=[("van", ["van", "k2", "dep", "k2_grow", "dep_grow"])])],
    "fig16a": [dict(file="ladders", anchor=8, labels={"van": ("GLR", None)},
                    groups=[("van", ["van_constant", "van", "van_glr_om", "van_glr_wd", "van_const_mup_om", "van_mup_om",
                                     "van_wdr1"])])],
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
WIDTH_ONLY = {"deep_width", "dep_width", "deep_width_adam"}


def release_series(release, name):
    """A release ladder file -> {key: dict(x, depth, loss)} sorted by compute (x: FLOPs, or hours in timing.json),
    read and checked as fit.py ladders reads it."""
    obj = read_layout(os.path.join(release, LADDERS, name + ".json"), "ladders")
    hours = name == "timing"
    data = series_data(release_ladder_rows(name + ".json", obj, hours))
    key = {RELEASE_SERIES.get(s, s): s for s in obj}
    return {key[a]: dict(d, x=d["x"] / 3600.0 if hours else d["x"]) for a, d in data.items()}


def through_anchor(x, loss, E, xa, La):
    """Figure 16a's exponent: regression of ln(L - E) - ln(L_a - E) on ln(C / C_a) through the anchor (no intercept)."""
    lx, y = np.log(x / xa), np.log(loss - E) - math.log(La - E)
    return -float(lx @ y / (lx @ lx))


def ladder_column(release, col):
    """Fit one column: E (R1 on the file's Vanilla), each series' exponent (R2, or through the shared anchor) and its
    multipliers (R3) over its group's reference. -> dict(E, unit, series {key: dict(x, loss, depth, gamma, A, budgets,
    multipliers, group)}, anchor)."""
    data = release_series(release, col["file"])
    floor_data = release_series(release, "ladders") if col["file"] == "timing" else data
    E = fit_free_e(floor_data["van"]["x"] / FIT["c_ref"], floor_data["van"]["loss"])[2]
    c_ref = 1.0 if col["file"] == "timing" else FIT["c_ref"]
    out, anchor = dict(E=E, unit="H" if col["file"] == "timing" else "C", series={}, anchor=None), col.get("anchor")
    if anchor:  # one point at the d8 compute, the mean of the two d8 runs of the plan (Constant and GLR)
        xa = float(data["van"]["x"][data["van"]["depth"] == anchor][0])
        La = float(np.mean([data[k]["loss"][data[k]["depth"] == anchor][0] for k in ("van_constant", "van")]))
        out["anchor"] = (xa, La)
        for k in [k for _, keys in col["groups"] for k in keys]:
            d, keep = data[k], data[k]["depth"] > anchor
            data[k] = dict(x=np.r_[xa, d["x"][keep]], loss=np.r_[La, d["loss"][keep]], depth=np.r_[anchor, d["depth"][keep]])
    for g, (ref, keys) in enumerate(col["groups"]):
        r = data[ref]
        at = r["depth"] >= col.get("ref_depth", FIT["anchor_depth"])
        for k in keys:
            d = data[k]
            if anchor:
                gamma = through_anchor(d["x"][1:], d["loss"][1:], E, *out["anchor"])
                A = (out["anchor"][1] - E) * (out["anchor"][0] / c_ref) ** gamma
            else:
                law = fit_shared_e(d["x"] / c_ref, d["loss"], E)
                gamma, A = law["gamma"], law["A"]
            m = matched_multipliers(r["x"][at], r["loss"][at], d["x"], d["loss"], k == ref)
            out["series"][k] = dict(d, gamma=gamma, A=A, c_ref=c_ref, budgets=r["x"][at], multipliers=m, group=g)
    return out


def ladder_figure(plt, fig_id, columns, fits):
    with plt.rc_context(appendix_rc(LADDER_SIZE)):
        return ladder_panels(plt, columns, fits)


def ladder_panels(plt, columns, fits):
    """The release's ladder panels: per column the reducible loss L - E (log-log, each series' law over its range and
    its points) and the multipliers over the group's reference (line and markers; NaN leaves a gap). One column: the
    two panels side by side; several (Figure 15a): multipliers on top, loss below, one legend above each column."""
    n = len(columns)
    width = 6.9 if n > 1 else 3.45
    side = 1.65 if n > 1 else width / 2 - 0.65
    rows = 2 if n > 1 else 1
    per_row = 2 if n > 1 or columns[0].get("legend") != "pair" else 1
    legend_rows = max(math.ceil(len(legend_entries(c, f)[0]) / per_row) for c, f in zip(columns, fits))
    band = 0.22 + 0.15 * legend_rows
    height = 0.40 + rows * side + (rows - 1) * 0.27 + band + 0.05
    fig = plt.figure(figsize=(width, height))
    pitch = width / (2 if n == 1 else n)
    box = lambda col, row: fig.add_axes([(0.59 + col * pitch) / width, (0.40 + row * (side + 0.27)) / height,
                                         side / width, side / height])
    for j, (col, fit) in enumerate(zip(columns, fits)):
        loss_ax, mult_ax = (box(0, 0), box(1, 0)) if n == 1 else (box(j, 0), box(j, 1))
        x_label = "Training time (h)" if fit["unit"] == "H" else "Compute (FLOPs)"
        for k, s in fit["series"].items():
            name, colour, marker, ls, hollow = series_look(col, k)
            face = "white" if hollow else colour
            xs = np.geomspace(s["x"].min(), s["x"].max(), 300)
            loss_ax.plot(xs, s["A"] * (xs / s["c_ref"]) ** -s["gamma"], ls=ls, lw=1.1, color=colour)
            own = slice(1, None) if fit["anchor"] else slice(None)
            loss_ax.plot(s["x"][own], s["loss"][own] - fit["E"], marker, ms=4, mew=0.6, color=colour, mfc=face, ls="none")
            ok = np.isfinite(s["multipliers"])
            mult_ax.plot(s["budgets"], np.where(ok, s["multipliers"], np.nan), ls=ls, marker=marker, ms=4, mew=0.6,
                         lw=1.1, color=colour, mfc=face)
        if fit["anchor"]:
            xa, La = fit["anchor"]
            loss_ax.plot([xa], [La - fit["E"]], "o", ms=4, color=ARMS["vanilla"].color, zorder=5)
            mult_ax.plot([xa], [1.0], "o", ms=4, color=ARMS["vanilla"].color, zorder=5)
        mult_ax.axhline(1.0, color=GRID, lw=0.9, zorder=0)
        loss_ax.set(xscale="log", yscale="log", ylabel="$L - E_{\\mathrm{Van}}$", title="Loss")
        mult_ax.set(xscale="log", ylabel="Compute Multiplier", title="Multiplier" if n == 1 else col["title"])
        if "ylim" in col:
            mult_ax.set_ylim(*col["ylim"])
            mult_ax.set_yticks(col["yticks"])
        mult_ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(times))
        loss_ax.set_xlabel(x_label)
        if n == 1:
            mult_ax.set_xlabel(x_label)
        else:
            mult_ax.tick_params(labelbottom=False)
            mult_ax.sharex(loss_ax)
        plain_log_axis(loss_ax.yaxis, plt)
        for ax in (loss_ax, mult_ax):
            log_axis(ax.xaxis, plt)
        handles, labels = legend_entries(col, fit)
        centre = (0.59 + j * pitch + side / 2) / width if n > 1 else 0.5
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(centre, 1.0), ncols=per_row,
                   handlelength=2.0, columnspacing=0.8, borderaxespad=0.2)
    return fig


def series_look(col, key):
    label, like = col.get("labels", {}).get(key, (None, None))
    name, colour, marker, ls, hollow = look(key, label, like)
    return name, colour, marker, ls, hollow or key in col.get("hollow", ()) or key in WIDTH_ONLY


def legend_entries(col, fit):
    """(handles, labels) of a column's legend: each series with its exponent ("Vanilla ($C^{-0.1112}$)"), or without
    (Figure 15a), or per family the width-only and coupled exponents and then the two face keys (Figure 16e-f)."""
    from matplotlib.lines import Line2D
    handles, labels, unit = [], [], fit["unit"]
    exponent = lambda k: f"${unit}^{{-{fit['series'][k]['gamma']:.4f}}}$"
    if col.get("legend") == "pair":
        width, both = col["groups"]
        for w, b in zip(width[1], both[1]):
            name, colour, marker, _, _ = series_look(col, b)
            handles.append(Line2D([], [], color=colour, marker=marker, ms=4, lw=1.1))
            labels.append(f"{name} (Width {exponent(w)}; Both {exponent(b)})")
        for key, face in zip(col["keys"], ("white", "#3F4752")):
            handles.append(Line2D([], [], color="#3F4752", marker="o", mfc=face, ms=4, lw=1.1))
            labels.append(key)
        return handles, labels
    for k in fit["series"]:
        name, colour, marker, ls, hollow = series_look(col, k)
        handles.append(Line2D([], [], color=colour, marker=marker, ls=ls, mfc="white" if hollow else colour, ms=4, lw=1.1))
        labels.append(name if col.get("legend") == "plain" else f"{name} ({exponent(k)})")
    return handles, labels


def log_axis(axis, plt, plain=False):
    """A log axis with one tick style (powers of ten, or plain decimals with plain=True): labelled decades, or 1-2-5
    (1-2-4 under one decade) ticks on shorter ranges; minor ticks unlabelled (their labels collide on short ranges)."""
    lo, hi = sorted(axis.get_view_interval())
    ticker = plt.matplotlib.ticker
    span = math.log10(hi / lo)
    if span < 2:
        axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 4.0) if span < 1 else (1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FormatStrFormatter("%g") if plain else
                             ticker.LogFormatterSciNotation(labelOnlyBase=False))
    axis.set_minor_formatter(ticker.NullFormatter())


def plain_log_axis(axis, plt):
    """A log axis over a narrow range (reducible loss 0.9-2) with plain decimal ticks at round values."""
    ticker = plt.matplotlib.ticker
    axis.set_major_locator(ticker.MaxNLocator(5))
    axis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axis.set_minor_formatter(ticker.NullFormatter())


def stated(what, ours, paper, section, why=None):
    """One manifest row: our number next to the paper's; `why` explains a difference over TOLERANCE."""
    rel = abs(ours - paper) / abs(paper) if paper else None
    row = dict(what=what, ours=ours, paper=paper, section=section, rel_diff=rel)
    if rel is not None and rel > TOLERANCE:
        row["explanation"] = why or "unexplained"
    return row


def last(fit, key):
    m = fit["series"][key]["multipliers"]
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
        name, color = look(arm)[:2]
        left.plot(x, y, "o-", ms=3, color=color, label=name)
    left.set(xscale="log", xlabel="training compute (FLOPs)", ylabel="KL effective depth", title="single-epoch ladders")
    left.legend(fontsize=7, frameon=False)
    for k, y in multi_curves.items():
        right.plot(mx, y, "o-", ms=3, label=k.replace("_", " "))
    right.set(xscale="log", xlabel="training compute (FLOPs)", ylabel="KL effective depth", title="multi-epoch (10 epochs)")
    right.legend(fontsize=7, frameon=False)
    for ax in (left, right):
        log_axis(ax.xaxis, plt)
    fig.tight_layout()
    last = lambda arm: float(curves[arm][1][np.argmax(curves[arm][0])])
    checks = [stated("Untied-2 KL effective depth at the top budget", last("untied_2"), 24, "Sec. 6"),
              stated("Deep Vanilla KL effective depth at the top budget", last("deep_vanilla"), 20, "Sec. 6")]
    checks += [stated(f"multi-epoch KL effective depth at the largest budget, {k.replace('_', ' ')}",
                      float(multi_curves[k][np.argmax(mx)]), v, "Sec. 6, Fig. 6 (right)", "the text rounds to whole "
                      "layers ('reaching 18 against 14 layers')") for k, v in (("scale_loop_count", 18),
                                                                              ("operator_1_tuned_wd", 14))
               if k in multi_curves]
    numbers = {arm: dict(compute=x.tolist(), effective_depth=y.tolist()) for arm, (x, y) in curves.items()}
    return fig, numbers, checks


def panel_grid(plt, n, width, height):
    """n panels, at most 4 a row (readable at page width), spare cells hidden -> (figure, flat list of n axes)."""
    rows = math.ceil(n / 4)
    cols = math.ceil(n / rows)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def recurrence_figure(plt, release):
    """Figure 17: L(k) - L(K_train) per checkpoint."""
    obj = read_json(os.path.join(release, LADDERS, "recurrence.json"))
    fig, axes = panel_grid(plt, len(obj), 3.6, 3.4)
    numbers, at8 = {}, {}
    cmap = plt.get_cmap("viridis")
    for ax, (series, recs) in zip(axes, obj.items()):
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
            color = cmap(0.85 * (r["depth"] - min(depths)) / max(1, max(depths) - min(depths)))  # no pale yellow
            ax.plot(ks, delta, "o-", ms=3, color=color, label=f"d{r['depth']}")
            ax.plot([K], [0], "*", ms=9, color=color)
        ax.axhline(0, color="gray", lw=0.5)
        # symlog: linear within ±0.01, so the text's ~0.003 differences at k > K_train show beside the 0.46 at k = 1
        ax.set_yscale("symlog", linthresh=0.01, linscale=2)
        low = min(min(p["delta"]) for p in numbers[arm])
        ax.set_ylim(bottom=min(-0.002, 1.5 * low))
        lo, hi = ax.get_ylim()
        ax.set_yticks([t for t in (-0.1, -0.01, -0.005, 0, 0.005, 0.01, 0.1, 1) if lo <= t <= hi])
        ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_locator(plt.matplotlib.ticker.NullLocator())
        ax.set(xlabel="evaluation recurrence k", ylabel="L(k) − L(K_train)", title="Random recur." if series == "k2_grow_random" else look(series)[0])
        ax.xaxis.set_major_locator(plt.matplotlib.ticker.MaxNLocator(integer=True))
        ax.legend(fontsize=6, frameon=False, ncols=2)
    fig.tight_layout()
    checks = []
    if "Loop-Grow random K" in at8:
        r = at8["Loop-Grow random K"]
        checks += [stated("random-K Loop-Grow, L(8) - L(4), smallest", min(r), -0.0003, "App. B.4",
                          "the text rounds to 1e-4: -0.00034 prints as -0.0003"),
                   stated("random-K Loop-Grow, L(8) - L(4), largest", max(r), 0.0028, "App. B.4")]
    if "loop_grow" in at8:
        r = at8["loop_grow"]
        checks += [stated("fixed Loop-Grow, L(8) - L(4), smallest", min(r), 0.008, "App. B.4"),
                   stated("fixed Loop-Grow, L(8) - L(4), largest", max(r), 0.042, "App. B.4")]
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

    all_ks = sorted(set(wd["loops"]) | set(rg["loops"]) | set(ar["loops"]))
    k_colour = lambda K: cmap(all_ks.index(K) / len(all_ks))  # one colour per K in every panel

    def per_loops(ax, x, loss, loops, mask, title):
        for K in sorted(set(loops[mask])):
            m = mask & (loops == K)
            o = np.argsort(x[m])
            ax.plot(x[m][o], loss[m][o], "o-", ms=3, color=k_colour(K), label=f"K={K:g}")
        ax.set(xscale="log", xlabel="training compute (FLOPs)", ylabel="validation loss", title=title)
        log_axis(ax.xaxis, plt)
        ax.legend(fontsize=6, frameon=False)

    regimes = list(dict.fromkeys(rg["regime"]))
    fig21, axes = panel_grid(plt, len(regimes), 4, 3.6)
    for ax, name in zip(axes, regimes):
        per_loops(ax, rg_x, rg["loss"], rg["loops"], np.array(rg["regime"]) == name, name)
    fig21.tight_layout()
    wds = sorted(set(wd["weight_decay"]))
    fig22, axes = panel_grid(plt, len(wds), 3.6, 3.4)
    for ax, w in zip(axes, wds):
        per_loops(ax, wd_x, wd["loss"], wd["loops"], wd["weight_decay"] == w, f"weight decay {w:g}")
    fig22.tight_layout()
    depths = sorted(set(wd["depth"]))
    fig23, axes = panel_grid(plt, len(depths), 3.4, 3.2)
    best_wd = {}
    for ax, dp in zip(axes, depths):
        for K in sorted(set(wd["loops"])):
            m = (wd["depth"] == dp) & (wd["loops"] == K)
            if not m.any():
                continue
            o = np.argsort(wd["weight_decay"][m])
            ax.plot(wd["weight_decay"][m][o], wd["loss"][m][o], "o-", ms=3, color=k_colour(K), label=f"K={K:g}")
        m1 = (wd["depth"] == dp) & (wd["loops"] == 1)
        if m1.any():
            best_wd[int(dp)] = float(wd["weight_decay"][m1][np.argmin(wd["loss"][m1])])
        ax.set(xscale="log", xlabel="weight decay", ylabel="validation loss", title=f"d{dp:g}")
        log_axis(ax.xaxis, plt, plain=True)
        ax.legend(fontsize=6, frameon=False)
    fig23.tight_layout()
    groups = list(dict.fromkeys(zip(ar["architecture"], ar["family"])))
    fig24, axes = panel_grid(plt, len(groups), 4, 3.6)
    for ax, (a, f) in zip(axes, groups):
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
    """Figure 3's and Sec. 4.2's numbers from ladders.json's eight arms: the check that the readers and the shared
    floor reproduce the main text."""
    fit = ladder_column(release, dict(file="ladders", groups=[("van", ["van", "deep_van", "deep_van_grow", "k1_glr",
                                                                      "k2", "k2_grow", "dep", "dep_grow"])]))
    m = lambda k, i: float(fit["series"][k]["multipliers"][i])
    sec = "Sec. 4.2, Fig. 3"
    checks = [stated("shared floor E (Vanilla FLOP ladder)", E_flops, 1.7064, "Fig. 3 (printed in the panel)"),
              stated("Operator-1 multiplier, first budget", m("k1_glr", 0), 1.12, sec),
              stated("Operator-1 multiplier, last budget", m("k1_glr", -1), 1.25, sec),
              stated("Untied-Grow multiplier, first budget (1e18)", m("dep_grow", 0), 1.30, sec),
              stated("Untied-Grow multiplier, last budget (1e20)", m("dep_grow", -1), 1.55, sec),
              stated("Untied-2 multiplier, first budget", m("dep", 0), 1.19, sec),
              stated("Untied-2 multiplier, last budget", m("dep", -1), 1.34, sec),
              stated("growth's multiplier over Untied-2, first budget", m("dep_grow", 0) / m("dep", 0), 1.09, sec),
              stated("growth's multiplier over Untied-2, last budget", m("dep_grow", -1) / m("dep", -1), 1.16, sec)]
    return {RELEASE_SERIES[k]: s["gamma"] for k, s in fit["series"].items()}, checks


DOWNSTREAM_METRICS = ("full_core", "answer_nll", "filtered_core", "filtered_core_std")


def downstream_series(path):
    """The release's downstream.json: {series: [{compute, loss, depth, metrics {full_core, answer_nll, filtered_core,
    filtered_core_std}, task_nll {task: answer NLL}}]} (three seeds pooled) -> {arm: records sorted by compute}."""
    obj = read_layout(path, "downstream")
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


FIG19_METRICS = (("loss", "validation loss", False), ("full_core", "full CORE", True),
                 ("answer_nll", "CORE answer NLL", False), ("filtered_core", "filtered CORE", True))


def downstream_figures(plt, series):
    """Figure 19a: per metric (loss, full CORE, CORE answer NLL, filtered CORE ± its seed std) the curves against
    compute and, below, the multipliers over Vanilla at matched metric (laws.matched_multipliers: at Vanilla's own
    computes with depth >= the anchor depth, Vanilla exactly 1.0). Figure 19b: CORE answer NLL against validation loss
    with one equal-weight line pooled over every checkpoint (top) and the residuals from it (bottom)."""
    col = lambda arm, k: np.array([r[k] for r in series[arm]])
    at = col(FLOOR_ARM, "depth") >= FIT["anchor_depth"]
    budgets = col(FLOOR_ARM, "compute")[at]
    fig_a, axes = plt.subplots(2, 4, figsize=(15, 7))
    multipliers = {}
    for (key, label, higher), top, bottom in zip(FIG19_METRICS, axes[0], axes[1]):
        multipliers[key] = {}
        for arm in series:
            name, color, marker = look(arm)[:3]
            x, y = col(arm, "compute"), col(arm, key)
            if key == "filtered_core":
                top.errorbar(x, y, yerr=col(arm, "filtered_core_std"), fmt=marker + "-", ms=3, lw=1, capsize=2, color=color,
                             label=name)
            else:
                top.plot(x, y, marker + "-", ms=3, lw=1, color=color, label=name)
            m = matched_multipliers(budgets, col(FLOOR_ARM, key)[at], x, y, arm == FLOOR_ARM, higher)
            multipliers[key][arm] = dict(compute=budgets.tolist(), multiplier=m.tolist())
            ok = np.isfinite(m)
            if ok.any():
                bottom.plot(budgets[ok], m[ok], marker + "-", ms=3, lw=1, color=color, label=name)
        top.set(xscale="log", xlabel="training compute (FLOPs)", ylabel=label, title=label)
        if key == "loss":
            top.set_yscale("log")
            plain_log_axis(top.yaxis, plt)
        bottom.set(xscale="log", xlabel="Vanilla training compute (FLOPs)", ylabel=f"multiplier at matched {label}")
        for ax in (top, bottom):
            log_axis(ax.xaxis, plt)
    axes[0][0].legend(fontsize=6.5, frameon=False)
    fig_a.tight_layout()
    fig_b, (line, resid) = plt.subplots(2, 1, figsize=(5.5, 7), sharex=True)
    loss = np.concatenate([col(a, "loss") for a in series])
    nll = np.concatenate([col(a, "answer_nll") for a in series])
    slope, intercept = np.polyfit(loss, nll, 1)
    for arm in series:
        name, color, marker = look(arm)[:3]
        line.plot(col(arm, "loss"), col(arm, "answer_nll"), marker, ms=3, color=color, label=name)
        resid.plot(col(arm, "loss"), col(arm, "answer_nll") - (intercept + slope * col(arm, "loss")), marker, ms=3,
                   color=color)
    xs = np.linspace(loss.min(), loss.max(), 20)
    line.plot(xs, intercept + slope * xs, "k--", lw=1, label=f"pooled: {slope:.3f} L {intercept:+.3f}")
    resid.axhline(0, color="k", ls="--", lw=1)
    line.set(ylabel="CORE answer NLL")
    resid.set(xlabel="validation loss", ylabel="residual from the pooled line")
    line.invert_xaxis()  # both axes reversed as the paper draws them (the x axis is shared: invert it once)
    for ax in (line, resid):
        ax.invert_yaxis()
    line.legend(fontsize=6.5, frameon=False)
    fig_b.tight_layout()
    final = {k: {a: (lambda v: v[-1] if v else None)([m for m in r["multiplier"] if np.isfinite(m)])
                 for a, r in per.items()} for k, per in multipliers.items()}
    return fig_a, dict(multipliers_at_matched=multipliers, final_multiplier=final), fig_b, \
        dict(pooled_line=dict(slope=float(slope), intercept=float(intercept), points=len(loss)))


# what each figure shows, in the paper's words (shortened), for the gallery page
CLAIMS = {
    "fig03": ("Sec. 4.2, Figure 3", "Model growth and the boundary operator improve the scaling exponent; untying improves "
             "only the constant. Untied-Grow's multiplier over Vanilla reaches 1.55x at 1e20 FLOPs."),
    "fig06": ("Sec. 6, Figure 6", "Growth and looping raise KL effective depth along the single-epoch ladders; in "
              "multi-epoch training scaling the loop count raises it faster than scaling depth (18 against 14 layers "
              "at the largest budget)."),
    "fig15a": ("App. B.1, Figure 15a", "Untied-2 reaches about 1.34x Vanilla near 1e20 FLOPs; norm only, injection only "
               "or no coda injection cut that to about 1.17x; Deep Vanilla, the same blocks without the operator, is a "
               "flat 1.08x. Loop-2 with a fixed prelude and coda (2/C/3) falls below 1 at the largest budgets."),
    "fig15b": ("App. B.1, Figure 15b", "Against recorded training time the growth variants keep increasing savings at "
               "matched loss; Untied-Grow gives the largest."),
    "fig15c": ("App. B.2, Figure 15c", "Constant base recipes favour the looped and grown models over Vanilla; in the "
               "long run Loop-Grow is the best constant recipe."),
    "fig16a": ("App. B.2, Figure 16a", "Adding output-multiplier or weight-decay scaling to GLR scaling changes Vanilla's "
               "multiplier by at most about 3 %; the muP output-multiplier rule without GLR scaling loses efficiency "
               "with scale."),
    "fig16b": ("Sec. 4.1, App. B.2, Figure 16b", "Vanilla's recipe on Operator-1 costs 7.8e-3 loss at d8 and turns its "
               "exponent improvement into a constant one."),
    "fig16c": ("App. B.3, Figure 16c", "Deep Vanilla gives a modest gain over Vanilla; the deeper 1:64 ladders do not "
               "consistently beat their default shapes, and Deeper Operator-1 loses Operator-1's rising advantage."),
    "fig16d": ("App. B.4, Figure 16d", "Random recurrence (K uniform in 2..6 after growth, evaluated at K = 4) is "
               "slightly worse than fixed Loop-Grow, the reference, at matched compute."),
    "fig16e": ("App. B.3, Figure 16e", "At executed depth 11 (width-only), Untied-2 stays more efficient than Deep "
               "Vanilla with a better constant, not exponent; each regime has its own Deep Vanilla reference."),
    "fig16f": ("App. B.5, Figure 16f", "Muon improves on Adam by a constant under width-only scaling; under coupled "
               "width/depth scaling its gain shrinks with scale."),
    "fig17": ("App. B.4, Figure 17", "At k = 8 random-K Loop-Grow's loss relative to k = 4 changes by -0.0003 to "
              "+0.0028, against +0.008 to +0.042 for fixed Loop-Grow."),
    "fig19a": ("App. C.3, Figure 19a", "The looped and grown variants improve downstream compute efficiency, most "
               "clearly on answer NLL and filtered CORE; full CORE is less smooth and its matched-score multipliers "
               "fluctuate."),
    "fig19b": ("App. C.3, Figure 19b", "One equal-weight line of CORE answer NLL against validation loss pools every "
               "checkpoint; Untied-Grow generally lies below it."),
    "fig21": ("App. D.1, Figure 21", "With fresh data or four epochs the preferred recurrence stays near one to two "
              "passes; with ten epochs higher recurrence postpones the upturn and the best recurrence rises with compute."),
    "fig22": ("App. D.2, Figure 22", "Weight decay moderates the preference for recurrence: low weight decay overfits "
              "more with model size and prefers more passes."),
    "fig23a": ("App. D.3, Figure 23a", "The preferred weight decay shifts with stored depth but varies little across "
               "tied recurrence."),
    "fig24": ("App. D.4, Figure 24", "Both plain-Transformer controls stay above the tied boundary-operator frontier; "
              "the untied operator family is better only at the two smallest budgets."),
}
# every figure of the paper with data (Figure 1 is a drawing); those this command does not draw, and why
CLAIMS.update({
    "fig02": ("Sec. 3, Figure 2", "Single epoch: every variant improves the exponent over Vanilla. Multi-epoch (100M "
              "tokens x 10): scaling the loop count beats scaling depth, about 2.2x compute at Operator-1 d18's loss."),
    "fig04": ("Sec. 4.3, Figure 4", "On FineWeb-Edu the held-out 7.4B d26 Untied-Grow run lands near its forecast "
              "(loss, CORE NLL, CORE accuracy); Untied-Grow needs about 1.8x less compute than Vanilla at its loss."),
    "fig05": ("Sec. 5, Figure 5", "Under 100M tokens x 10 epochs the optimal loop count rises from about 1.4 to about "
              "6.7 with compute; the preferred weight decay depends on depth."),
    "fig07": ("App. A.2, Figure 7", "Allocation, recurrence, growth-target and growth-timing sweeps."),
    "fig08": ("App. A.2, Figure 8", "With fresh data the optimal recurrence stays between 1.1 and 1.7 passes."),
    "fig09": ("App. A.2, Figure 9", "At fixed anchor size the optimal recurrence grows with tokens per parameter."),
    "fig10": ("App. A.2.3, Figure 10", "Growth timing: interior optima of the growth fraction."),
    "fig11": ("App. A.4, Figure 11", "Chain tuning at d8."),
    "fig12": ("App. A.4.2, Figure 12", "Iso-compute TPP bowls: optimal TPP about 5-6."),
    "fig13": ("App. A.4.3, Figure 13", "Fixed growth fraction per arm."),
    "fig14": ("App. A.4, Figure 14", "One-dimensional Vanilla sweeps and recipe slices across architectures."),
    "fig18": ("App. C.1, Figure 18", "FineWeb and FineWeb-Edu ladders transfer; Untied Grow's advantage holds."),
    "fig19c": ("App. C.3, Figure 19c", "Per-task residuals at matched validation loss."),
    "fig20": ("App. C.4, Figure 20", "Taskwise sigmoid calibration of CORE accuracy on CORE NLL (FineWeb-Edu)."),
    "fig23b": ("App. D.3, Figure 23b", "Hyperparameter sensitivity at depth 8, tied and untied."),
})
HELD_BACK = {"fig04": "fineweb_edu_ladders.json", "fig02": "loop_grid.csv", "fig05": "loop_grid.csv",
             "fig19a": f"{LADDERS}/downstream.json", "fig19b": f"{LADDERS}/downstream.json",
             "fig19c": f"{LADDERS}/downstream.json"}
NOT_DRAWN = {  # not drawn in this version, and why
    "fig02": "the left panel is `fit.py ladders --out` (figures/fig2_left.png); the right panels (loop grid) are not "
             "drawn yet",
    "fig03": "drawn by `fit.py ladders --out` (figures/fig3_ladders.png); its numbers are checked here",
    "fig04": "not drawn yet (the FineWeb-Edu extrapolation figure): `fit.py ladders FILE --extrapolate` and `fit.py "
             "downstream FILE` give its numbers",
    "fig05": "not drawn yet: `fit.py loops loop_grid.csv` gives K* per budget and the gain",
    **{f"fig{n:02d}": "not drawn yet (appendix_early/ data)" for n in range(7, 15)},
    "fig18": "not drawn yet (per-corpus ladders)", "fig19c": "not drawn yet", "fig20": "not drawn yet",
    "fig23b": "not drawn yet (hyperparameters.csv)",
}
GALLERY = "README.md"


def gallery(manifest):
    """The gallery page: per figure the paper's statement (section), the image, every number the text states beside
    ours with the difference, and the figure's own fitted numbers (gamma and last multiplier per series)."""
    lines = ["# The paper's figures from the authors' release", "",
             f"Written by `fit.py paper` from `{manifest['release']}`; rewritten on every run. Each figure: what the "
             "paper says it shows, the image, and each number the text states next to ours (difference relative to "
             f"the paper's; an explanation where it exceeds {TOLERANCE:.0%}). Every fit shares the floor E = "
             f"{manifest['floor_E']:.4f}, fitted on Vanilla's FLOP ladder. The numbers in full: "
             f"[{MANIFEST}]({MANIFEST}).", ""]
    for key in sorted(set(manifest["figures"]) | set(manifest["skipped"])):
        section, claim = CLAIMS[key]
        lines += [f"## {key}: {section}", "", f"> {claim}", ""]
        if key in manifest["skipped"]:
            lines += [f"Not drawn here: {manifest['skipped'][key]}.", ""]
        if key not in manifest["figures"]:
            continue
        entry = manifest["figures"][key]
        if key not in manifest["skipped"]:
            lines += [f"![{key}]({key}.png)", ""]
        if entry["stated"]:
            lines += ["| number | ours | paper | difference | where |", "|---|---:|---:|---:|---|"]
            for r in entry["stated"]:
                diff = "—" if r["rel_diff"] is None else f"{100 * r['rel_diff']:.1f} %"
                why = f" ({r['explanation']})" if "explanation" in r else ""
                lines.append(f"| {r['what']} | {r['ours']:.4g} | {r['paper']:.4g} | {diff}{why} | {r['section']} |")
            lines.append("")
        else:
            lines += ["The text states no number for this figure.", ""]
        if key in LADDER_FIGURES:
            lines += ["| panel | series | exponent | last multiplier |", "|---|---|---:|---:|"]
            lines += [f"| {p} | {look(k)[0]} | {r['gamma']:.4f} | {r['final_multiplier']:.3f} |"
                      for p, per in entry["numbers"].items() for k, r in per["series"].items()]
            lines.append("")
        if "final_multiplier" in entry["numbers"]:
            lines += ["| metric | " + " | ".join(look(a)[0] for a in next(iter(entry["numbers"]["final_multiplier"].values())))
                      + " |", "|---|" + "---:|" * len(next(iter(entry["numbers"]["final_multiplier"].values())))]
            lines += [f"| last multiplier at matched {m.replace('_', ' ')} | "
                      + " | ".join("—" if v is None else f"{v:.3f}" for v in per.values()) + " |"
                      for m, per in entry["numbers"]["final_multiplier"].items()]
            lines.append("")
    return "\n".join(lines)


class TextFile:
    """The manifest and the gallery, written by laws.save_figures beside the figures (atomically, and listed as
    fit.py's)."""
    def __init__(self, text):
        self.text = text

    def savefig(self, path, format, dpi):
        with open(path, "w") as f:
            f.write(self.text)


def cmd_paper(args):
    release = args.release
    if os.path.isdir(os.path.join(release, "release")):  # `fit.py paper reference/`
        release = os.path.join(release, "release")
    if not os.path.isfile(os.path.join(release, LADDERS, "ladders.json")):
        raise UsageError(f"{args.release}: no {LADDERS}/ladders.json; pass the release folder (reference/ or "
                         "reference/release/)")
    downstream = os.path.join(release, LADDERS, "downstream.json")
    ids = list(LADDER_FIGURES) + ["fig06", "fig17", "fig21", "fig22", "fig23a", "fig24"] + \
        (["fig19a", "fig19b"] if os.path.isfile(downstream) else [])
    names = [f"{i}.{ext}" for i in ids for ext in ("png", "pdf")] + [MANIFEST, GALLERY]
    check_outputs(args.out, names)
    plt = pyplot()
    flops = read_layout(os.path.join(release, LADDERS, "ladders.json"), "ladders")
    E_flops = floor_of(series_data(release_ladder_rows("ladders.json", flops, False)))
    manifest, figures = dict(release=os.path.normpath(release), floor_E=E_flops, tolerance=TOLERANCE, figures={}), {}
    missing = {f: name for f, name in HELD_BACK.items() if not os.path.isfile(os.path.join(release, name))}
    manifest["skipped"] = {f: f"needs {missing[f]}, held back from the release copy (pass a folder that has it)"
                           if f in missing else NOT_DRAWN[f] for f in sorted(set(missing) | set(NOT_DRAWN))
                           if f in missing or f not in ids}
    gammas, checks = figure3_checks(release, E_flops)
    manifest["figures"]["fig03"] = dict(numbers=dict(gamma=gammas), stated=checks)
    for fig_id, columns in LADDER_FIGURES.items():
        fits = [ladder_column(release, col) for col in columns]
        figures[fig_id] = ladder_figure(plt, fig_id, columns, fits)
        numbers = {col.get("title", "panel"): dict(E=fit["E"], series={k: dict(
            gamma=s["gamma"], multipliers=s["multipliers"], final_multiplier=last(fit, k))
            for k, s in fit["series"].items()}) for col, fit in zip(columns, fits)}
        manifest["figures"][fig_id] = dict(numbers=numbers, stated=ladder_checks(fig_id, fits))
    for fig_id, (fig, numbers, checks) in [("fig06", effective_depth_figure(plt, release)),
                                           ("fig17", recurrence_figure(plt, release))] + \
            list(regimes_figures(plt, release).items()):
        figures[fig_id] = fig
        manifest["figures"][fig_id] = dict(numbers=numbers, stated=checks)
    if os.path.isfile(downstream):
        figures["fig19a"], numbers_a, figures["fig19b"], numbers_b = downstream_figures(plt, downstream_series(downstream))
        manifest["figures"]["fig19a"] = dict(numbers=numbers_a, stated=[])
        manifest["figures"]["fig19b"] = dict(numbers=numbers_b, stated=[])
    files = {f"{i}.{ext}": figures[i] for i in figures for ext in ("png", "pdf")}
    files[MANIFEST] = TextFile(json.dumps(jsonable(manifest), indent=1, allow_nan=False))
    files[GALLERY] = TextFile(gallery(jsonable(manifest)))
    paths = save_figures(args.out, files, dpi=300)
    for fig in figures.values():
        plt.close(fig)
    for fig_id, why in manifest["skipped"].items():
        print(f"skipped {fig_id}: {why}")
    rows = [(fid, r) for fid, entry in manifest["figures"].items() for r in entry["stated"]]
    for fid, r in rows:
        flag = "" if r["rel_diff"] is None or r["rel_diff"] <= TOLERANCE else f"  ({r['explanation']})"
        print(f"{fid:<24} {r['what']:<72} ours {r['ours']:.4g}  paper {r['paper']:.4g} ({r['section']})  "
              f"diff {100 * r['rel_diff']:.1f} %{flag}")
    for p in paths:
        print(f"wrote {p}")
