"""A lint for the figures fit.py writes, on the matplotlib figures themselves (matplotlib's renderer extents):
no two tick labels, annotations or legend entries overlap, every axis that shows tick labels has a label, every
legend lists exactly the labelled lines that have data, at most 4 panels a row. `capture(monkeypatch, module)`
collects the figures a command hands to save_figures; `problems(fig)` lists what is wrong with one."""
import numpy as np

MAX_PANELS_A_ROW = 4
SLACK = 1.0  # pixels two extents may share before they count as overlapping (neighbours touch at low dpi)


def capture(monkeypatch, module):
    """Patch module.save_figures to lint every figure it is given before writing it (at a low dpi: the lint needs the
    figure, not a sharp file) -> {file stem: [problems]}, filled as the command runs."""
    found, real = {}, module.save_figures

    def lint_then_save(out_dir, figures, dpi):
        for name, fig in figures.items():
            stem = name.rsplit(".", 1)[0]
            if hasattr(fig, "canvas") and stem not in found:
                found[stem] = problems(fig)
        return real(out_dir, figures, dpi=30)
    monkeypatch.setattr(module, "save_figures", lint_then_save)
    return found


def overlaps(texts, renderer):
    """Pairs of texts (non-empty, visible) whose window extents overlap by more than SLACK pixels."""
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text().strip()]
    bad = []
    for i, (a, p) in enumerate(boxes):
        for b, q in boxes[i + 1:]:
            if min(p.x1, q.x1) - max(p.x0, q.x0) > SLACK and min(p.y1, q.y1) - max(p.y0, q.y0) > SLACK:
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


def problems(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    main = [ax for ax in fig.axes if ax.get_visible() and ax.axison and not is_inset(ax, fig)]
    rows = {}
    for ax in main:
        rows.setdefault(round(ax.get_position().y0, 2), set()).add(round(ax.get_position().x0, 2))
    if max((len(r) for r in rows.values()), default=0) > MAX_PANELS_A_ROW:
        out.append(f"{max(len(r) for r in rows.values())} panels in a row (at most {MAX_PANELS_A_ROW})")
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
            if labels and not axis.label.get_text() and not is_inset(ax, fig):
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
