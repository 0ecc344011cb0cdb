"""A lint for the figures fit.py writes, on the matplotlib figures themselves (matplotlib's renderer extents):
no two tick labels, annotations or legend entries overlap, every axis that shows tick labels has a label, every
legend lists exactly the labelled lines that have data, a legend entry is a display name (no raw key such as
"k2_nci" or "operator_1"), and an entry naming an arm of the arms table shows the table's colour (and, in the
appendix figures, its marker). `capture(monkeypatch, module)`
collects the figures a command hands to save_figures; `problems(fig)` lists what is wrong with one."""
import math
import re

import numpy as np
from matplotlib.colors import to_hex

import arms

SLACK = 1.0  # pixels two extents may share before they count as overlapping (neighbours touch at low dpi)


def capture(monkeypatch, module, pdf=True):
    """Patch module.save_figures to lint every figure it is given before writing it (at a low dpi, without the PDFs
    with pdf=False: the lint needs the figure, not a sharp file) -> {file stem: [problems]}, filled as the command runs."""
    found, real = {}, module.save_figures

    def lint_then_save(out_dir, figures, dpi):
        for name, fig in figures.items():
            stem = name.rsplit(".", 1)[0]
            if hasattr(fig, "canvas") and stem not in found:
                number = re.match(r"fig(\d+)", stem)
                found[stem] = problems(fig, appendix=bool(number) and int(number[1]) >= 7,
                                       arm_colours=stem not in LOOP_COUNT_FIGURES)
        return real(out_dir, {n: f for n, f in figures.items() if pdf or not n.endswith(".pdf")}, dpi=30)
    monkeypatch.setattr(module, "save_figures", lint_then_save)
    return found


def overlaps(texts, renderer):
    """Pairs of texts (non-empty, visible) whose window extents overlap by more than SLACK pixels."""
    texts = [t for t in texts if t.get_visible() and t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    bad = []
    for i, (a, p) in enumerate(boxes):
        for j, (b, q) in enumerate(boxes[i + 1:], i + 1):
            angle = math.radians(texts[i].get_rotation())
            if angle % (math.pi / 2) and texts[i].get_rotation() == texts[j].get_rotation():  # parallel slanted labels:
                (x0, y0), (x1, y1) = (t.get_transform().transform(t.get_position()) for t in (texts[i], texts[j]))
                gap = abs((y1 - y0) * math.cos(angle) - (x1 - x0) * math.sin(angle))  # apart across the baseline
                if gap < renderer.points_to_pixels(texts[i].get_fontsize()) - SLACK:
                    bad.append(f"{a!r} overlaps {b!r}")
            elif min(p.x1, q.x1) - max(p.x0, q.x0) > SLACK and min(p.y1, q.y1) - max(p.y0, q.y0) > SLACK:
                bad.append(f"{a!r} overlaps {b!r}")
    return bad


def has_data(artist):
    if hasattr(artist, "get_xydata"):
        xy = np.asarray(artist.get_xydata(), float)
    elif hasattr(artist, "get_offsets"):
        xy = np.asarray(artist.get_offsets(), float)
    elif hasattr(artist, "lines"):  # an errorbar container: its data line
        return artist.lines[0] is not None and has_data(artist.lines[0])
    else:
        return True
    return xy.size > 0 and np.isfinite(xy).all(axis=-1).any()


def is_inset(ax, fig):
    p = ax.get_position()
    return any(o is not ax and (q := o.get_position()).x0 <= p.x0 and p.x1 <= q.x1 and q.y0 <= p.y0 and p.y1 <= q.y1
               and (p.width, p.height) != (q.width, q.height) for o in fig.axes)


NAMES = {name: arm for key, arm in arms.ARMS.items() for name in (arm.label, arm.label.replace("-Grow", " Grow"))}
RAW_KEYS = set(arms.ARMS) | set(arms.RELEASE_SERIES)


def legend_names(legend, appendix, arm_colours=True):
    """A legend's entries: display names, and an arm's name drawn in its table colour (appendix: and marker)."""
    out = []
    for handle, text in zip(legend.legend_handles, legend.get_texts()):
        words = re.sub(r"\$[^$]*\$", "", text.get_text())
        if "_" in words or words.strip() in RAW_KEYS:
            out.append(f"legend entry {text.get_text()!r} is a raw key, not a display name")
        arm = NAMES.get(re.split(r" \(| ·", text.get_text())[0])
        if arm is None or not arm_colours or not hasattr(handle, "get_color"):
            continue
        if to_hex(handle.get_color()) != to_hex(arm.color):
            out.append(f"legend entry {text.get_text()!r} is drawn in {to_hex(handle.get_color())}, the arms table "
                       f"says {arm.color}")
        if appendix and handle.get_marker() not in (arm.marker, "None", "none", "", None):
            out.append(f"legend entry {text.get_text()!r} has marker {handle.get_marker()!r}, the arms table says "
                       f"{arm.marker!r}")
    return out


def row_label(ax, fig, name):
    """A grid's shared label: another panel of the same row (y) or column (x) carries it."""
    at = lambda a: round(a.get_position().y0 if name == "y" else a.get_position().x0, 2)
    return any(at(o) == at(ax) and (o.get_ylabel() if name == "y" else o.get_xlabel()) for o in fig.axes)


LOOP_COUNT_FIGURES = ("fig02", "fig05", "fig06")  # multi-epoch panels: "Operator-1" in K=1's colour, not the arm's


def problems(fig, appendix=False, arm_colours=True):
    """What is wrong with one figure; appendix: a figure of the paper's appendices (per-arm markers); arm_colours:
    legend entries naming an arm must show its table colour."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
        out += legend_names(legend, appendix, arm_colours)
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        where = ax.get_title() or ax.get_ylabel() or "an axes"
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if not axis.get_visible():
                continue
            ticks = axis._update_ticks()  # the ticks drawn: inside the view limits, major and minor
            labels = [t for tick in ticks for t in (tick.label1, tick.label2) if t.get_visible() and t.get_text()]
            out += [f"{where}: {name} ticks: {p}" for p in overlaps(labels, renderer)]
            if labels and not axis.label.get_text() and not is_inset(ax, fig) and not row_label(ax, fig, name) \
                    and not getattr(fig, f"_sup{name}label", None):  # one label for the whole figure
                out.append(f"{where}: the {name} axis has tick labels and no label")
        out += [f"{where}: texts: {p}" for p in overlaps(ax.texts, renderer)]
        legend = ax.get_legend()
        if legend is not None:
            shown = [t.get_text() for t in legend.get_texts()]
            handles, labels = ax.get_legend_handles_labels()
            drawn = [label for h, label in zip(handles, labels) if has_data(h)]
            if sorted(shown) != sorted(drawn):
                out.append(f"{where}: legend lists {sorted(set(shown) - set(drawn))} without a drawn line, leaves out "
                           f"drawn {sorted(set(drawn) - set(shown))}")
            out += [f"{where}: legend: {p}" for p in overlaps(legend.get_texts(), renderer)]
    return out
