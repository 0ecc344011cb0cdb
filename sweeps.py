"""sweeps.py — `python fit.py tpp | growth | lr | loops`: the optimum of a swept recipe knob, read off a quadratic's
vertex (arXiv 2609.19107 App. A.2.3, A.4): tokens per parameter per budget, the growth fraction rho per (depth, budget),
a hyperparameter's optimum vs model size (its drift exponent), and the loop count per budget with the loop-vs-size
frontiers (Figure 2 right, Figure 5).

  python fit.py tpp sweep.csv
  python fit.py loops loop_grid.csv --wd 0.8
"""
import glob, json, math, os

import numpy as np
from scipy import stats

from fit import FIT, FitError, UsageError, fnum, jsonable, note, read_csv, read_result_json


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
    c = read_csv(args.data, ["compute_flops", "tpp", "val_loss"], numeric=["compute_flops", "tpp", "val_loss"],
                 positive=["compute_flops", "tpp", "val_loss"])
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
    c = read_csv(args.data, ["depth", "compute_flops", "rho", "val_loss"], numeric=["depth", "compute_flops", "rho", "val_loss"],
                 positive=["depth", "compute_flops", "val_loss"])
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
    c = read_csv(args.data, ["params", "value", "val_loss"], numeric=["params", "value", "val_loss"],
                 positive=["params", "value", "val_loss"])
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
        r = read_result_json(path, ", ".join(LOOP_COLUMNS))
        if r["status"] == "complete" and "estimated_matrix_flops" in r:
            try:
                p = r["plan"]
                rows.append(tuple(float(v) for v in (p["depth"], p["passes_final"], p["weight_decay"],
                                                     r["estimated_matrix_flops"], r["final_val_loss"])))
            except (KeyError, TypeError, ValueError):
                raise UsageError(f"{path}: a complete run needs plan.depth, plan.passes_final, plan.weight_decay, "
                                 "estimated_matrix_flops and final_val_loss")
    if not rows:
        raise UsageError(f"{item}: no complete train.py runs (result.json) found")
    return {n: np.array(col, dtype=float) for n, col in zip(LOOP_COLUMNS, zip(*rows))}


def cmd_loops(args):
    c = read_csv(args.data, LOOP_COLUMNS, numeric=LOOP_COLUMNS,
                                                           positive=["depth", "loops", "compute_flops", "val_loss"]) if args.data.endswith(".csv") \
        else loop_grid_from_runs(args.data)
    at_wd = np.isclose(c["weight_decay"], args.wd)
    if not at_wd.any():
        raise UsageError(f"{args.data}: no rows at weight decay {args.wd} (have {sorted(set(c['weight_decay']))})")
    curves = {}
    for K in sorted(set(c["loops"][at_wd])):
        m = at_wd & (c["loops"] == K)
        o = np.argsort(c["compute_flops"][m])
        curves[K] = (c["compute_flops"][m][o], c["val_loss"][m][o])
    budgets = args.budgets or list(FIT["loop_budgets"])
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
