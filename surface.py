"""surface.py — `python fit.py surface`: the Chinchilla L = E + A/N^a + B/D^b and Skaling L = (A/N^a + B/D^b)^k + E
fits of L(N, D) (Huber on ln L, L-BFGS-B from a grid of starts plus basin-hopping), cross-validated by regime (large N
and/or large D held out), compute-optimal N*(C), D*(C) on C = 6 N D, and the fit on the L-shaped subset.

  python fit.py surface grid.csv --form both --sparse-l
"""
import json, math

import numpy as np
from scipy import optimize

from fit import FIT, UsageError, fnum, jsonable, read_csv

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
    c = read_csv(args.data, ["N", "loss", have[0]], numeric=["N", "loss", have[0]], positive=["N", "loss", have[0]])
    N, L = c["N"], c["loss"]
    D = c["D"] if "D" in c else c["compute"] / (6 * N)
    dropped = []
    if args.drop_highest:  # e.g. Hoffmann et al. drop the 5 highest-loss runs before fitting
        order = np.argsort(-L, kind="stable")[:args.drop_highest]
        dropped = [dict(line=c["_line"][i], N=N[i], D=D[i], loss=L[i]) for i in order]
        keep = ~np.isin(np.arange(len(L)), order)
        N, D, L = N[keep], D[keep], L[keep]
    if len(L) < 7:
        raise UsageError(f"{args.data}: need >= 7 rows to fit, have {len(L)}" + (" after --drop-highest" if dropped else ""))
    forms = ["chinchilla", "skaling"] if args.form == "both" else [args.form]
    delta = {f: args.delta if args.delta is not None else FIT["surface_delta"][f] for f in forms}
    regimes = split_regimes(N, D, args.holdout)
    out = dict(delta=delta, dropped=dropped, regimes={k: int(v.sum()) for k, v in regimes.items()}, forms={})
    C = 6 * N * D
    budgets = args.budgets or list(10.0 ** np.arange(math.floor(np.log10(C.min())), math.ceil(np.log10(C.max())) + 1))
    folds = np.array_split(np.random.default_rng(args.seed).permutation(np.flatnonzero(regimes["interpolation"])),
                           args.folds)
    for form in forms:
        p = fit_surface(N, D, L, form, delta[form], args.hops, args.seed)
        r = dict(params=p, mape_all=mape(p, N, D, L), optimal=[compute_optimal(p, b) for b in budgets],
                 ratio_exponent=(p["alpha"] - p["beta"]) / (p["alpha"] + p["beta"]))
        cv = {k: [] for k in regimes}
        for fold in folds:
            train = regimes["interpolation"].copy()
            train[fold] = False
            pf = fit_surface(N[train], D[train], L[train], form, delta[form], args.hops, args.seed)
            for k, m in regimes.items():
                m = m.copy() if k != "interpolation" else np.isin(np.arange(len(L)), fold)
                cv[k].append(mape(pf, N[m], D[m], L[m]))
        r["cv_mape"] = {k: dict(mean=float(np.mean(v)), std=float(np.std(v))) for k, v in cv.items()}
        if args.sparse_l:
            sub = np.isclose(N, N.min(), rtol=1e-9) | np.isclose(D, D.min(), rtol=1e-9)
            ps = fit_surface(N[sub], D[sub], L[sub], form, delta[form], args.hops, args.seed)
            r["sparse_l"] = dict(n_fit=int(sub.sum()), params=ps, mape_rest=mape(ps, N[~sub], D[~sub], L[~sub]),
                                 mape_far_rest=mape(ps, N[~sub & regimes["far"]], D[~sub & regimes["far"]],
                                                    L[~sub & regimes["far"]]))
        out["forms"][form] = r
    if args.json:
        print(json.dumps(jsonable(out), allow_nan=False))
        return
    print(f"regimes (largest {args.holdout:.0%} of distinct N / D held out): {out['regimes']}; "
          f"{args.folds}-fold CV over the interpolation points"
          + (f"; dropped the {len(dropped)} highest-loss rows (lines {', '.join(str(d['line']) for d in dropped)})" if dropped else ""))
    for form, r in out["forms"].items():
        p = r["params"]
        print(f"\n{form} (Huber delta {delta[form]:g} on ln L): E={p['E']:.4f} A={p['A']:.4g} alpha={p['alpha']:.4f} B={p['B']:.4g} beta={p['beta']:.4f} "
              f"k={p['k']:.4f}  MAPE(all)={r['mape_all']:.3f}%")
        print("  CV MAPE %: " + ", ".join(f"{k} {v['mean']:.3f}±{v['std']:.3f}" for k, v in r["cv_mape"].items()))
        print(f"  D*/N* ~ C^{r['ratio_exponent']:+.3f}")
        for o in r["optimal"]:
            print(f"  C={o['compute']:.3g}: N*={o['N']:.4g} D*={o['D']:.4g} D*/N*={o['ratio']:.2f} L*={o['loss']:.4f}")
        if "sparse_l" in r:
            s = r["sparse_l"]
            print(f"  L-shaped subset ({s['n_fit']} points): MAPE rest {s['mape_rest']:.3f}%, far {fnum(s['mape_far_rest'], '.3f')}%")
