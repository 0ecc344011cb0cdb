"""figures.py — the figures fit.py writes with --out: Figure 3 and Figure 2 (left) of arXiv 2609.19107, and the
expected CI half-widths of a ladder design against its GPU-hours.

  python fit.py ladders reference/fineweb_ladders.csv --out figures    # fig3_ladders.*, fig2_left.*
  python fit.py design plan.jsonl --truth pilot.json --noise 0.002 --out figures   # design_ci_vs_compute.*
fit.py and ladder_design.py import it only for --out, so that the fits themselves never load matplotlib.
"""
import os

import matplotlib
matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

from fit import ARM_STYLE, FIT, record_outputs

FIG2_ARMS = ("vanilla", "operator_1", "loop_2", "untied_2", "loop_grow", "untied_grow")
LADDER_FIGURES = ("fig3_ladders.png", "fig3_ladders.pdf", "fig2_left.png", "fig2_left.pdf")
DESIGN_FIGURE = ("design_ci_vs_compute.png", "design_ci_vs_compute.pdf")


def ladder_figures(data, fit, out_dir, xname):
    """Figure 3 (loss vs compute with an inset of the top budgets, multipliers, gamma vs log A) and Figure 2 (left)."""
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 10, "legend.fontsize": 7.5})
    record_outputs(out_dir, LADDER_FIGURES)
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


def design_figure(results, ref_arm, out_dir, gpu):
    """Expected CI half-width of gamma and of gamma - gamma_ref against each design's GPU-hours."""
    record_outputs(out_dir, DESIGN_FIGURE)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    arms = list(results[0]["arms"])
    for a in arms:
        label, color = ARM_STYLE.get(a, (a, None))
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
    paths = [os.path.join(out_dir, n) for n in DESIGN_FIGURE]
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths
