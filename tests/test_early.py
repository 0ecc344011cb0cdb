"""The appendix-A figures (7-14) on the release's appendix_early/ data against the numbers the release prints (a
tolerance of half the printed last digit) and the text, and the figure lint; a perturbed input moves them."""
import functools, json, os, shutil

import numpy as np
import pytest

import core_eval, figlint, laws, paper

RELEASE_DIR = os.path.join(os.path.dirname(os.path.abspath(paper.__file__)), "reference", "release")

# (figure, path into its numbers, the release's values, their decimals): ours must round to them (half a unit).
RELEASE = [("fig07", ("allocation", "regret_vertex"), {6: 0.496, 7: 0.482, 8: 0.506, 9: 0.465, 10: 0.461}, 3),
           ("fig07", ("allocation", "frontier_cores"), {6: 3, 7: 4, 8: 5, 9: 4, 10: 5}, 0),
           ("fig07", ("loop_grow_rho_star",), {8: 0.182, 9: 0.165, 10: 0.163}, 3),
           ("fig07", ("stored_tpp_mean",), {"growth": 7.27, "controls": 6.39}, 2),
           ("fig08", ("k_star", "tied"), [1.103, 1.602, 1.410, 1.531, 1.699], 3),
           ("fig08", ("k_star", "untied"), [1.548, 1.681, 1.417, 1.353, 1.374], 3),
           ("fig10a", ("affine_slope",), 0.902, 3), ("fig10a", ("affine_intercept",), 0.216, 3),
           ("fig10b", ("affine_slope",), 0.883, 3), ("fig10b", ("affine_intercept",), 0.103, 3),
           ("fig10c", ("rho_star",), {8: 0.556, 9: 0.559, 10: 0.516}, 3),
           ("fig10c", ("loss_star",), {8: 3.1986, 9: 3.1210, 10: 3.0251}, 4),
           ("fig10d", ("mean_optimum", "k2"), {"growth": 6.97, "controls": 6.39}, 2),
           ("fig10d", ("mean_optimum", "dep"), {"growth": 8.97, "controls": 7.43}, 2),
           ("fig10d", ("ablation", "multipliers", "tpp8_rho0p30"), [1.004, 0.987, 0.990, 1.008, 0.994, 1.003], 3),
           ("fig10d", ("ablation", "multipliers", "tpp6_fitrho"), [0.956, 0.967, 0.975, 0.981, 0.975, 1.022], 3),
           ("fig10d", ("ablation", "multipliers", "tpp6_rho0p30"), [0.959, 0.966, 0.971, 0.982, 0.972, 1.008], 3),
           ("fig13", ("mean_rho_star",), {"Deep Vanilla Grow": 0.544, "Loop Grow": 0.170, "Untied Grow": 0.271}, 3)]


def differences(drawn):
    out = []
    for fig_id, path, want, decimals in RELEASE:
        ours = functools.reduce(lambda o, k: o[k], path, drawn[fig_id][1])
        if isinstance(want, dict):
            ours, want = [ours[k] for k in want], list(want.values())
        if not np.array_equal(np.round(ours, decimals), want):
            out.append(f"{fig_id} {path}: {ours} vs {want}")
    return out


@pytest.fixture(scope="module")
def drawn():
    return paper.early_figures(laws.pyplot(), RELEASE_DIR)


def test_the_figures_carry_the_release_and_text_numbers_and_pass_the_lint(drawn):
    assert differences(drawn) == []
    assert {f: figlint.problems(fig, appendix=True) for f, (fig, _, _) in drawn.items()} == {f: [] for f in drawn}
    assert [c["what"] for _, _, checks in drawn.values() for c in checks if c.get("explanation") == "unexplained"] == []
    assert all(r["kl_effective_depth"] == core_eval.effective_depth([b["kl_to_final"] for b in r["block_lens"][1:]], 2)
               for r in paper.early(RELEASE_DIR, "grow_lens"))  # the release's KL depth is core_eval's (0: embedding)
    assert [len(drawn[f][1]["optima"]) for f in ("fig10a", "fig10b")] == [15, 9]  # bracketed optima per arm
    fig9, fig11, fig12, fig14a, fig14b = (drawn[f][1] for f in ("fig09", "fig11", "fig12", "fig14a", "fig14b"))
    for law, a, b, r2, points in (("Loop-2 expansion", 0.82, 0.15, 0.959, 17), ("Loop-2 TPP", 1.19, 0.85, 0.998, 17),
                                  ("Untied-2 expansion", 0.83, 0.15, 0.984, 18),
                                  ("Untied-2 TPP", 1.34, 0.74, 0.998, 18)):
        assert fig9[law]["a"] == pytest.approx(a, abs=5e-3) and fig9[law]["b"] == pytest.approx(b, abs=5e-3)
        assert fig9[law]["r2"] == pytest.approx(r2, abs=5e-4) and fig9[law]["points"] == points
    assert sorted(fig9["not_bracketed"]) == ["dep d10/B10", "dep d10/B8", "dep d11/B11", "loop d10/B10", "loop d10/B8",
                                             "loop d8/B13"]
    assert [name for name, chain in fig11.items() if chain["hollow"]] == ["Untied-2"]  # two Adam knobs adopted
    assert [c["ours"] for c in drawn["fig11"][2]] == [7, 6]  # every chain gains in round 2; Untied-2 tunes lowest
    for name, mean in dict(zip(fig12, (5.33, 5.66, 5.79, 6.39, 6.08))).items():
        assert fig12[name]["mean_tpp"] == pytest.approx(mean, abs=5e-3), name
    assert list(fig14a["centres"].values()) == pytest.approx([3.3283, 3.2425, 3.1575, 3.0990, 3.0436], abs=5e-5)
    assert fig14a["ylim"] == pytest.approx((3.0155, 3.4162), abs=5e-5) and fig14a["points"] == 212
    assert [fig14b[a]["beta"] for a in fig14b] == pytest.approx([0.78, 0.62, 0.58, 0.66, 0.60, 0.70], abs=5e-3)


def test_a_perturbed_run_moves_the_numbers(tmp_path):
    shutil.copytree(os.path.join(RELEASE_DIR, "appendix_early"), tmp_path / "appendix_early")
    growth = json.load(open(tmp_path / "appendix_early" / "growth.json"))  # Loop Grow's d8 at rho 0.4: 0.01 worse
    json.dump([dict(r, loss=r["loss"] + 0.01) if (r["arm"], r["depth"], r["budget"], r["rho"]) == ("k2", 8, 8.0, 0.4)
               else r for r in growth], open(tmp_path / "appendix_early" / "growth.json", "w"))
    moved = differences(paper.early_figures(laws.pyplot(), tmp_path))
    assert {m.split()[0] for m in moved} == {"fig07", "fig10a", "fig13"}, moved


def test_a_sweep_moved_in_the_data_moves_the_mean_optimal_tpp(drawn, monkeypatch):
    rows = paper.read_json(os.path.join(RELEASE_DIR, paper.EARLY, "tpp.json"))
    for r in rows:
        r["L"] -= 0.05 * (r["arm"] == "van" and r["tpp"] > 10)  # Vanilla's high-TPP models get better
    monkeypatch.setattr(paper, "read_json", lambda path: rows)
    moved = paper.figure12(laws.pyplot(), RELEASE_DIR)[1]["Vanilla"]["mean_tpp"]
    assert moved > drawn["fig12"][1]["Vanilla"]["mean_tpp"] + 0.5


def test_chain_tuning_adopts_a_setting_that_beats_the_incumbent_by_1e3_and_one_discrete_knob_only():
    run = lambda phase, loss, probe=False, knob="": dict(round="1", phase=phase, val_loss=loss, probe=str(probe),
                                                         knob=knob)
    chain = [run("glr", 3.0, True), run("glr", 2.9995), run("wd", 2.99, True), run("wd", 2.985),
             run("schedule", 2.98, knob="wdr"), run("adam", 2.98, True), run("adam", 2.97, knob="eps"),
             run("adam", 2.975, knob="beta2")]
    got = paper.incumbents(chain)
    assert (got[-1], got[0], got[6], got[9]) == (3.0, 3.0, 2.985, 2.98) and got[10] is None
