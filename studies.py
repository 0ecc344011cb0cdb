"""studies.py — the loop grid (run through `python fit.py loops`): the optimal loop count per budget and the
loop-vs-size frontiers (Figure 2 right, Figure 5), from the release's loop_grid.csv or train.py --data-constrained runs.

  python fit.py loops loop_grid.csv --wd 0.8
"""
import math

import numpy as np

import paper
from common import UsageError
from laws import (FIT, FitError, check_one_recipe, drop_repeats, fnum, jsonable, note, pyplot, quad_vertex,
                  read_csv, read_result_json, run_paths, save_figures)
import json

LOOP_GRID_VARIED = ("passes", "passes_initial", "weight_decay")  # what the grid's runs vary beside the depth;
# its token budget (train_token_limit) is its recipe


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
LOOP_KEY = ["depth", "loops", "weight_decay"]  # one run of the grid


def loop_grid_from_runs(item):
    """The loop-grid columns from train.py runs (a runs dir or a glob of result.json), compute without attention
    as in the paper's loop_grid.csv."""
    paths = run_paths(item)
    rows, origins, runs = [], [], []
    for path in paths:
        r = read_result_json(path, ", ".join(LOOP_COLUMNS))
        if r["status"] == "complete" and "estimated_matrix_flops" in r:
            runs.append((path, r))
            try:
                p = r["plan"]
                rows.append(tuple(float(v) for v in (p["depth"], p["passes_final"], p["weight_decay"],
                                                     r["estimated_matrix_flops"], r["final_val_loss"])))
                origins.append(path)
            except (KeyError, TypeError, ValueError):
                raise UsageError(f"{path}: a complete run needs plan.depth, plan.passes_final, plan.weight_decay, "
                                 "estimated_matrix_flops and final_val_loss")
            if not p.get("data_constrained"):
                raise UsageError(f"{path} is not a loop-grid run (its plan's data_constrained is "
                                 f"{p.get('data_constrained')!r}); fit.py loops reads train.py --data-constrained runs "
                                 "(bash ladder.sh operator_1 --preset data-constrained), fit.py ladders the others")
    if not rows:
        raise UsageError(f"{item}: no complete train.py runs (result.json) found")
    check_one_recipe(runs, "loop-grid runs", LOOP_GRID_VARIED, ("train_token_limit",))
    return drop_repeats({n: np.array(col, dtype=float) for n, col in zip(LOOP_COLUMNS, zip(*rows))}, LOOP_KEY,
                        LOOP_COLUMNS, origins)


def regime_optima(args, header):
    """The release's regime tables: the optimal loop count per budget (R4) of each regime (regimes.csv) or control
    (architectures.csv: architecture, family), the rows of Figures 21 and 24; for hyperparameters.csv the best
    measured multiple of each knob's centre per family and K (Figure 23b)."""
    c, _ = paper.read_table(args.data)
    if "knob" in header:
        hp = c
        out = {f"{f} {k} K={K:g}": float(hp["multiplier"][m][np.argmin(hp["loss"][m])])
               for f, k, K in dict.fromkeys(zip(hp["family"], hp["knob"], hp["loops"]))
               for m in [(np.array(hp["family"]) == f) & (np.array(hp["knob"]) == k) & (hp["loops"] == K)]}
        return emit(args, dict(best_multiplier=out), [f"{g}: best at {v:g}x the centre" for g, v in out.items()])
    names = [" ".join(g) for g in zip(*[c[k] for k in (["regime"] if "regime" in header else ["architecture", "family"])])]
    budgets = args.budgets or (paper.FINE_BUDGETS if "regime" in header else paper.BUDGETS)
    out, lines = {}, []
    for g in dict.fromkeys(names):
        ladders = paper.grid_ladders(c, np.array(names) == g)
        out[g] = []
        for C in budgets:
            Ks, losses = paper.at_budget(ladders, C)
            if len(Ks):
                k, loss, interior, _ = paper.loop_optimum(Ks, losses)
                out[g].append(dict(compute=C, best_loops=k, best_loss=loss, interior=interior))
        lines.append(f"{g}: " + ", ".join(f"C={o['compute']:.3g} K*={o['best_loops']:.2f}" + ("" if o["interior"]
                                                                                             else " (measured)")
                                          for o in out[g]))
    emit(args, dict(optima=out), lines)


def cmd_loops(args):
    header = paper.csv_header(args.data) if args.data.endswith(".csv") else set()
    if header & {"regime", "architecture", "knob"}:
        return regime_optima(args, header)
    if not args.data.endswith(".csv"):
        c = loop_grid_from_runs(args.data)
    elif "compute" in header:  # the release's weight_decay.csv (compute in EFLOP)
        c = paper.read_table(args.data)[0]
        c["compute_flops"], c["val_loss"] = c["compute"], c["loss"]
    else:
        c = read_csv(args.data, LOOP_COLUMNS, numeric=LOOP_COLUMNS,
                     positive=["depth", "loops", "compute_flops", "val_loss"], key=LOOP_KEY)
    at_wd = np.isclose(c["weight_decay"], args.wd)
    if not at_wd.any():
        raise UsageError(f"{args.data}: no rows at weight decay {args.wd:g} (have "
                         f"{', '.join(f'{w:g}' for w in sorted(set(c['weight_decay'])))}); pass one of them as --wd")
    curves = {}
    for K in sorted(set(c["loops"][at_wd])):
        m = at_wd & (c["loops"] == K)
        o = np.argsort(c["compute_flops"][m])
        curves[K] = (c["compute_flops"][m][o], c["val_loss"][m][o])
    budgets = args.budgets or list(FIT["loop_budgets"])
    out, skipped = dict(weight_decay=args.wd, budgets=[]), []
    for C in budgets:  # loss of each K at C, linear in compute between neighbouring depths, no extrapolation
        Ks = [K for K, (x, _) in curves.items() if x[0] <= C <= x[-1]]
        losses = np.array([np.interp(C, *curves[K]) for K in Ks])
        try:
            xv, yv, inside = quad_vertex(np.log(Ks), np.log(losses))
            row = dict(compute=C, best_loops=math.exp(xv), best_loss=math.exp(yv), inside=inside)
        except FitError as e:
            skipped.append(f"budget {C:.3g}: {e} ({len(Ks)} loop counts cover it); skipped")
            continue
        if 1 in Ks:
            row["gap_to_k1"] = float(losses[Ks.index(1)] - row["best_loss"])
        out["budgets"].append(row)
    if not out["budgets"]:
        raise UsageError(f"{args.data}: no budget could be fitted at weight decay {args.wd:g}: each needs >= 3 loop "
                         f"counts whose runs span it (loop counts: {', '.join(f'{K:g}' for K in curves)}; budgets: "
                         f"{', '.join(f'{C:.3g}' for C in budgets)}); pass --budgets inside the grid")
    for line in skipped:
        note(line)
    k1 = c["loops"] == 1
    op1 = []  # Operator-1 at the best weight decay per depth
    for d in sorted(set(c["depth"][k1])):
        m = k1 & (c["depth"] == d)
        i = np.argmin(c["val_loss"][m])
        wds = c["weight_decay"][m]
        edge = len(set(wds)) > 1 and wds[i] in (wds.min(), wds.max())
        op1.append((c["compute_flops"][m][i], c["val_loss"][m][i], d, wds[i], edge,
                    f"d{d:g} (WD {wds[i]:g} of {wds.min():g}..{wds.max():g})"))
    op1.sort()
    if edges := [where for *_, edge, where in op1 if edge]:
        note(f"warning: Operator-1's best weight decay is at the edge of the swept grid at {', '.join(edges)}: the "
             "tuned optimum may lie beyond the grid, which would change the gains below")
    env_wd = lower_envelope(c["compute_flops"][at_wd], c["val_loss"][at_wd])
    env_all = lower_envelope(c["compute_flops"], c["val_loss"])
    if op1:
        C_op, L_op = op1[-1][:2]
        out["operator_1_tuned"] = [dict(compute=x, loss=y, depth=d, weight_decay=wd, wd_at_grid_edge=edge)
                                   for x, y, d, wd, edge, _ in op1]
        out["gain_fixed_wd"] = C_op / compute_at_loss_linear(env_wd, L_op)
        out["gain_all_wd"] = C_op / compute_at_loss_linear(env_all, L_op)
        out["frontier_fixed_wd"] = [dict(compute=x, loss=y) for x, y in env_wd if x <= C_op]
    if args.out:
        fig2, fig5, _, _ = paper.loop_grid_figures(pyplot(), dict(c, compute=c["compute_flops"], loss=c["val_loss"]))
        written = save_figures(args.out, {f"{n}.{e}": f for n, f in (("fig02", fig2), ("fig05", fig5))
                                          for e in ("png", "pdf")}, dpi=300)
        note("wrote " + ", ".join(written))
    emit(args, out, [f"C={b['compute']:.3g}: K*={b['best_loops']:.2f} loss*={b['best_loss']:.4f}"
                     + (f" gap to K=1 {b['gap_to_k1']:.4f}" if "gap_to_k1" in b else "") for b in out["budgets"]]
         + ([f"Operator-1 (best WD per depth) last point {C_op:.3g} FLOPs, loss {L_op:.4f}: loop scaling at WD {args.wd} "
             f"needs {fnum(out['gain_fixed_wd'], '.2f')}x less compute (all-WD frontier {fnum(out['gain_all_wd'], '.2f')}x)"]
            if op1 else []))


def emit(args, out, lines):
    print(json.dumps(jsonable(out), allow_nan=False) if args.json else "\n".join(lines))
