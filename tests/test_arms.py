"""Tests for arms.py and the invariants every arm meets, parametrised over every registered arm plus Mix-Grow
(tests/mix_arm.py), so that a new arm is checked by adding it: init, counts and FLOPs against the module, optimizer
groups, growth at every stage by the arm's own rule, the run's refusals in its dry runs, 2 processes against one."""
import contextlib
import io
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import arms
import mix_arm
import model
import train
from test_train import ROOT, read_run
from test_train import tiny as tiny_run

SHAPE = dict(width_per_depth=32, head_dim=16, seq_len=16, vocab_size=257, mlp_multiple=64)
EVERY_ARM = [*arms.ARMS, mix_arm.NAME]
GROWING = [name for name, arm in arms.ARMS.items() if (arm.passes_initial or arm.passes) < arm.passes] + [mix_arm.NAME]


@pytest.fixture
def with_mix_grow(monkeypatch):
    """Mix-Grow registered (arms.ARMS, model.GPT) for one test."""
    monkeypatch.setitem(arms.ARMS, mix_arm.NAME, mix_arm.ARM)
    monkeypatch.setattr(model, "GPT", mix_arm.MixGPT)


def tiny(arch):
    return model.config_for(arch, 3, **SHAPE)


def stages(arch):
    cfg = tiny(arch)
    return arms.ARMS[arch].stages or tuple(sorted({cfg.passes_initial, cfg.passes}))


def randomized(net, seed=0):
    """Every weight random (also the zero-initialised projections): no path is trivially zero."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
    return net


def batch(cfg):
    return torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(1))


def tiny_plan(arch, *flags):
    """A cpu-preset plan of `arch` at depth 2 with the arm's own growth fractions (one per growth)."""
    return train.make_plan(train.parse_args(["--arch", arch, "--depth", "2", "--preset", "cpu", "--steps", "10",
                                             *flags]))


def test_the_paper_arms_are_the_fixed_eight_and_user_arms_live_beside_them():
    assert list(arms.PAPER_ARMS) == ["vanilla", "deep_vanilla", "operator_1", "loop_2", "untied_2", "loop_grow",
                                     "untied_grow", "deep_vanilla_grow"]
    assert arms.ARMS == {**arms.PAPER_ARMS, **arms.USER_ARMS} and not set(arms.PAPER_ARMS) & set(arms.USER_ARMS)
    assert set(GROWING) & set(arms.PAPER_ARMS) == {"loop_grow", "untied_grow", "deep_vanilla_grow"}
    assert all(arms.ARMS[a].default_crossover is not None for a in GROWING[:-1])
    assert arms.FIGURE2_ARMS == ("vanilla", "operator_1", "loop_2", "untied_2", "loop_grow", "untied_grow")
    # the ladders: `all` is the paper's 58 runs whatever USER_ARMS holds; `user` runs the user arms
    assert len(train.ladder_runs("all")) == 58
    assert {argv[1] for _, argv in train.ladder_runs("user")} == set(arms.USER_ARMS)
    assert {argv[1] for _, argv in train.ladder_runs("demo", "cpu")} == set(arms.DEMO_ARMS)
    # a user arm inherits its base recipe, but not the release's growth fractions (tuned for the base's growth)
    loop3, base = arms.USER_ARMS["loop_3_grow"], arms.PAPER_ARMS["loop_grow"]
    assert (loop3.passes_initial, loop3.passes, loop3.crossover) == (1, 3, {})
    for name in ("matrix_lr", "embedding_lr", "lr_exponent", "tpp", "rewarm_steps", "default_crossover", "alpha"):
        assert getattr(loop3, name) == getattr(base, name), name
    for what in ("label", "color"):  # every arm its own in every figure
        values = [getattr(arm, what) for arm in arms.ARMS.values()]
        assert len(set(values)) == len(values), (what, values)


# Init, parameter counts and FLOPs: the module's own, at every pass stage

@pytest.mark.parametrize("arch", list(arms.ARMS))  # Mix-Grow's matrices are in no count: its own edit
def test_init_counts_and_flops_are_the_modules_at_every_stage(arch):
    """At init the logits are 0 (loss ln V) and only lm_head gets a gradient; params_stored is what the module holds,
    params_active what a step trains, at every stage; FLOPs are FlopCounterMode's: 6 x executed matrix parameters per
    token, and causal attention at (T+1)/2 keys per query, where the math kernel computes all T: 2T/(T+1) times ours."""
    cfg, T = tiny(arch), SHAPE["seq_len"]
    net, idx = model.GPT(cfg, attention="math"), batch(cfg)
    loss = net(idx, idx)
    assert loss.item() == pytest.approx(math.log(cfg.vocab_size), abs=1e-6), f"{arch}: initial logits are not 0"
    loss.backward()
    assert [n for n, p in net.named_parameters() if p.grad is not None and p.grad.any()] == ["lm_head.weight"], arch
    stored = sum(p.numel() for p in randomized(net).parameters())
    assert model.params_active(cfg, cfg.passes) == stored, f"{arch}: params_stored != module's {stored:,}"
    for k in stages(arch):
        if k > net.active_passes:
            net.grow(k)
        net.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as counter:
            net(idx, idx).backward()
        used = sum(p.numel() for p in net.parameters() if p.grad is not None)
        assert model.params_active(cfg, k) == used, f"{arch}: params_active({k}) {model.params_active(cfg, k):,} " \
            f"but {used:,} trained"
        assert sum(p.numel() for p in net.parameters()) == stored, f"{arch}: growth to {k} passes changed the count"
        counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
        matrix = model.matrix_flops_per_token(cfg, k) * idx.numel()
        attention = (model.flops_per_token(cfg, k) - model.matrix_flops_per_token(cfg, k)) * idx.numel()
        assert counts.get("aten.mm") == matrix, f"{arch}: at {k} passes the matmuls count {counts.get('aten.mm'):,} " \
            f"FLOPs, model.matrix_flops_per_token x tokens says {matrix:,}"
        assert counts.get("aten.bmm") * (T + 1) == attention * 2 * T, f"{arch}: at {k} passes attention counts " \
            f"{counts.get('aten.bmm'):,} FLOPs (full T x T), the accounting's causal {attention:,} x 2T/(T+1) differs"
        assert set(counts) == {"aten.mm", "aten.bmm"}, f"{arch}: uncounted FLOPs in {set(counts)}"
    assert model.params_tpp(cfg) == model.params_active(cfg, cfg.passes_initial), \
        f"{arch}: params_tpp (TPP, steps and LRs rest on it) is not the parameters in use at the initial passes"


@pytest.mark.parametrize("arch", EVERY_ARM)
@pytest.mark.usefixtures("with_mix_grow")
def test_every_parameter_is_in_exactly_one_optimizer_group_with_an_lr_and_wd_rule(arch):
    for optimizer in ("muon", "adamw"):
        plan = tiny_plan(arch, "--optimizer", optimizer)
        model.check_arm(plan.model_config, optimizer)  # the run's own check
        net = model.GPT(plan.model_config)
        group_of = {id(p): name for name, params in net.param_groups().items() for p in params}
        seen = {}
        for opt in train.build_optimizers(net, plan):
            for group in opt.param_groups:
                for p in group["params"]:
                    name = group_of[id(p)]
                    assert id(p) not in seen, f"{arch}: a {name} parameter is in two optimizer groups"
                    seen[id(p)] = name
                    assert group["lr"] == plan.group_lr(name) > 0, f"{arch}: {name} trains at LR {group['lr']}"
                    decays = arms.PARAM_GROUPS[name][2]
                    assert group["weight_decay"] == (plan.weight_decay if decays else 0.0), \
                        f"{arch}: {name} decays by {group['weight_decay']}, arms.PARAM_GROUPS says {decays}"
        assert len(seen) == len(group_of), f"{arch}: {len(group_of) - len(seen)} parameters in no {optimizer} optimizer"


def test_the_scalar_recipe_slot_scales_with_depth_and_defaults_to_the_embedding_lr():
    plan = tiny_plan("gated_1")
    assert plan.scalar_lr is None and plan.group_lr("scalar") == plan.embedding_lr
    given = tiny_plan("gated_1", "--scalar-lr", "0.1")
    assert given.group_lr("scalar") == pytest.approx(0.1 * given.embedding_lr / arms.ARMS["gated_1"].embedding_lr)


# Growth: after every stage, the model and its optimizer state are what the arm's own rule makes of them

def per_pass_keys(net):
    """{state-dict key: (sequence, pass, rest)} of every per-pass tensor by the arm's declared layout: untied core
    block i is pass (i - prelude) // core; entry r of a list the model holds directly (gates, Mix-Grow's matrices) is
    the injection after pass r."""
    cfg, lists = net.cfg, {n for n, m in net.named_children() if isinstance(m, (nn.ParameterList, nn.ModuleList))}
    out = {}
    for key in net.state_dict():
        parts = key.split(".")
        if parts[0] in lists:
            out[key] = (parts[0], int(parts[1]), ".".join(parts[2:]))
        elif cfg.mode == "untied" and parts[:2] == ["transformer", "h"] and \
                0 <= int(parts[2]) - cfg.n_prelude < cfg.passes * cfg.n_core:
            i = int(parts[2]) - cfg.n_prelude
            out[key] = ("cores", i // cfg.n_core, f"{i % cfg.n_core}." + ".".join(parts[3:]))
    return out


def check_growth(arch, net, plan):
    """Grow net through every stage of `arch` with train.grow, each after random weights and a step of both
    optimizers (no tensor equal to another by chance, no state zero): untied, every per-pass tensor of a new pass
    is a copy of pass j mod old's with fresh optimizer state and every other tensor and state kept; tied, all kept."""
    optimizers = train.build_optimizers(net, plan)
    for k in plan.pass_stages[1:]:
        randomized(net, seed=k)
        net(batch(net.cfg), batch(net.cfg)).backward()
        for opt in optimizers:
            opt.step()
        old, before = net.active_passes, {key: t.clone() for key, t in net.state_dict().items()}
        states = {key: [t.clone() for t in opt.state[p].values() if torch.is_tensor(t)]
                  for key, p in net.named_parameters() for opt in optimizers if p in opt.state}
        train.grow(net, optimizers, k)
        layout = per_pass_keys(net)
        key_of = {where: key for key, where in layout.items()}
        copied = {key: key_of[(seq, j % old, rest)] for key, (seq, j, rest) in layout.items()
                  if net.cfg.mode == "untied" and old <= j < k}
        for key, value in net.state_dict().items():
            assert torch.equal(value, before[copied.get(key, key)]), f"{arch}: growth {old} -> {k} passes left " \
                f"{key} not {'a copy of ' + copied[key] if key in copied else 'as it was'} (the arm's rule)"
        for key, p in net.named_parameters():
            now = [t for opt in optimizers if p in opt.state for t in opt.state[p].values() if torch.is_tensor(t)]
            fresh = key in copied  # fresh: zero state (AdamW's of a never-stepped gate: none)
            expected = [torch.zeros_like(a) for a in now] if fresh else states.get(key, [])
            assert len(now) == len(expected) and all(map(torch.equal, now, expected)), \
                f"{arch}: growth {old} -> {k} passes {'kept' if fresh else 'changed'} the optimizer state of {key}"


class Forgetful(mix_arm.MixGPT):
    """Mix-Grow whose growth forgets its own matrices (it stacks the cores and gates only, as GPT.grow did before)."""

    def per_pass(self):
        return [seq for seq in super().per_pass() if seq[0][0] is not self.mix[0]]


@pytest.mark.parametrize("arch", GROWING + ["forgetful"])
@pytest.mark.usefixtures("with_mix_grow")
def test_growth_at_every_stage_is_the_arms_own_rule(arch, monkeypatch):
    """Every growing arm passes; Mix-Grow with a growth that forgets its own matrices fails at its first stage."""
    forgetful = arch == "forgetful"
    if forgetful:
        monkeypatch.setattr(model, "GPT", Forgetful)
    plan = tiny_plan(mix_arm.NAME if forgetful else arch)
    assert len(plan.pass_stages) == len(stages(mix_arm.NAME if forgetful else arch)) >= 2
    net = randomized(model.GPT(plan.model_config))
    with pytest.raises(AssertionError, match=r"growth 1 -> 2 passes left mix\.1 not a copy of mix\.0") if forgetful \
            else contextlib.nullcontext():
        check_growth(arch, net, plan)


# What the run refuses, its dry runs refuse: model.check_arm, before any folder exists

class LayerScale(mix_arm.MixGPT):
    """A per-block scale (0-dim, in every Block), with the groups its author may write by hand."""
    groups = None

    def __init__(self, cfg, device="cpu", **options):
        super().__init__(cfg, device, **options)
        for block in self.transformer.h:
            block.scale = nn.Parameter(torch.ones((), device=device))

    def param_groups(self):
        groups = super().param_groups()
        scales = [b.scale for b in self.transformer.h]
        if self.groups == "left out":
            groups["scalar"] = [p for p in groups["scalar"] if not any(p is s for s in scales)]
        elif self.groups == "in Muon's":
            groups["scalar"] = []
            groups["matrix"] += scales
        return groups


LAYER_SCALE_REFUSALS = {
    "left out": "train.py: error: arm layer_scale: model.param_groups() has parameter transformer.h.0.scale in no "
                "group: each must be in exactly one (docs/your_own_arm.md)",
    "in Muon's": "train.py: error: arm layer_scale: model.param_groups() puts transformer.h.0.scale (shape ()) in "
                 "group 'matrix', which Muon steps, and Muon takes 2-D matrices only: put it in group 'scalar' (AdamW)"}


@pytest.mark.parametrize("groups", list(LAYER_SCALE_REFUSALS))
@pytest.mark.usefixtures("with_mix_grow")
def test_the_run_and_both_dry_runs_refuse_an_arm_alike(groups, monkeypatch, capsys, tmp_path):
    """One line, exit 2, no run folder: from the run, its --dry-run and ladder.sh's dry run (which pipes `arms.py
    ladder` into train.py --ladder-dry-run)."""
    monkeypatch.setitem(arms.ARMS, "layer_scale", arms.derived("untied_grow", label="LS", color="k"))
    monkeypatch.setattr(model, "GPT", type("Scaled", (LayerScale,), dict(groups=groups)))
    argv = ["--arch", "layer_scale", "--depth", "2", "--preset", "cpu", "--runs-dir", str(tmp_path)]
    for extra in ([], ["--dry-run"]):
        assert train.main(argv + extra) == 2
        assert capsys.readouterr().err.strip().splitlines() == [LAYER_SCALE_REFUSALS[groups]]
    monkeypatch.setattr(sys, "stdin", io.StringIO("layer_scale_d2 " + " ".join(argv) + "\n"))
    assert train.main(["--ladder-dry-run"]) == 2
    assert capsys.readouterr().err.strip() == LAYER_SCALE_REFUSALS[groups].replace("error: ", "error: layer_scale_d2: ")
    assert not os.listdir(tmp_path)


@pytest.mark.usefixtures("with_mix_grow")
def test_a_new_parameter_joins_its_group_by_itself_and_a_vector_shows_in_the_trajectory(pool, tmp_path,
                                                                                        monkeypatch):
    """Without a hand-written group the per-block scale is a scalar (AdamW, no decay; before: Muon's, silently);
    a vector's entries are logged as NAME.i."""
    class Vector(mix_arm.MixGPT):
        def __init__(self, cfg, device="cpu", **options):
            super().__init__(cfg, device, **options)
            self.block_scales = nn.Parameter(torch.ones(3, device=device))
    groups = LayerScale(tiny("vanilla")).param_groups()
    assert [p.ndim for p in groups["scalar"]] == [0] * len(groups["scalar"]) and groups["scalar"]
    assert all(p.ndim == 2 for p in groups["matrix"])
    monkeypatch.setattr(model, "GPT", Vector)
    assert train.main(tiny_run(pool, tmp_path, "vanilla", "--run-name", "r", steps=2, depth=1)) == 0
    assert set(read_run(tmp_path, "r")[1][-1]["scalars"]) == {"block_scales.0", "block_scales.1", "block_scales.2"}


# Every growing arm on 2 gloo processes against one, and Mix-Grow killed (-9) and resumed

LOSS_RTOL = 2e-5  # tests/test_parallel.py: FSDP2's per-rank averages flip a bf16 rounding of a Muon update now and then


@pytest.mark.usefixtures("with_mix_grow")
def test_every_growing_arm_on_2_processes_trains_as_one_and_resumes_exactly(pool, tmp_path):
    """One torchrun launch of tests/mix_arm.py trains every growing arm on 2 gloo processes, then Mix-Grow ("cut")
    killed (-9) after a checkpoint past a growth and resumed by torchrun's restart (every run --resume-or-start). Each
    arm's losses equal one process's, trained here meanwhile; the resumed run ends on the uninterrupted one exactly."""
    args = {arch: tiny_run(pool, tmp_path, arch, "--resume-or-start", steps=8, depth=1) for arch in GROWING}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
              "--standalone", "tests/mix_arm.py"]
    for run in [a + ["--run-name", f"{arch}_2"] for arch, a in args.items()]:
        launch += [*run, "--next"]
    launch += [*args[mix_arm.NAME], "--run-name", "cut", "--save-every", "2"]
    done = subprocess.Popen(launch, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    trajectory = tmp_path / "cut" / "trajectory.jsonl"
    while done.poll() is None and not (trajectory.exists() and len(trajectory.read_text().splitlines()) >= 5):
        time.sleep(0.02)
    for entry in filter(str.isdigit, os.listdir("/proc")):  # torchrun's children: the workers
        with contextlib.suppress(OSError, ValueError):
            if int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1]) == done.pid:
                os.kill(int(entry), signal.SIGKILL)
    for arch, a in args.items():  # one process, meanwhile
        assert train.main(a + ["--run-name", f"{arch}_1"]) == 0
    out, err = done.communicate(timeout=600)
    assert done.returncode == 0 and f"resuming {tmp_path / 'cut'} from step" in out, err[-3000:]
    for arch in args:
        one, two = read_run(tmp_path, f"{arch}_1"), read_run(tmp_path, f"{arch}_2")
        assert two[0]["world_size"] == 2 and two[0]["growth_events"] == one[0]["growth_events"], arch
        assert len(one[0]["growth_events"]) == len(stages(arch)) - 1, arch
        assert [t["loss"] for t in two[1]] == pytest.approx([t["loss"] for t in one[1]], rel=LOSS_RTOL), arch
    full, again = read_run(tmp_path, f"{mix_arm.NAME}_2"), read_run(tmp_path, "cut")
    assert again[0]["status"] == "complete" and [t["loss"] for t in again[1]] == [t["loss"] for t in full[1]]
    assert again[0]["growth_events"] == full[0]["growth_events"]


def test_the_gated_operator_is_the_fixed_one_at_init_and_learns_its_gates():
    cfg, idx = tiny("gated_1"), batch(tiny("gated_1"))
    gated, plain = randomized(model.GPT(cfg)), randomized(model.GPT(tiny("operator_1")))
    assert len(gated.boundary_gates) == model.gates_stored(cfg) == 1 and not torch.equal(gated(idx), plain(idx))
    gated.boundary_gates[0].data = model.GPT(cfg).boundary_gates[0].data  # as initialised: alpha
    assert gated.boundary_gates[0].item() == cfg.alpha and torch.equal(gated(idx), plain(idx))
    gated(idx, idx).backward()
    assert gated.boundary_gates[0].grad.abs() > 0


# The table's own mistakes, and docs/your_own_arm.md's edits on a copy of the scripts, run where a user runs them

@pytest.fixture
def scripts_copy(tmp_path):
    """edit(file, old, new) changes a copy of the scripts; run(*argv) runs python there -> (rc, stdout + stderr)."""
    for name in os.listdir(ROOT):
        if name.endswith(".py"):
            shutil.copy(os.path.join(ROOT, name), tmp_path / name)

    def edit(file, old, new):
        text = (tmp_path / file).read_text()
        assert old in text, f"{file} no longer holds {old!r}: update the test's edit"
        (tmp_path / file).write_text(text.replace(old, new, 1))

    def run(*argv):
        done = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr
    return edit, run


def test_the_guides_snippet_registers_its_arms_and_a_knob_a_loss_term_and_a_schedule_are_one_edit_each(scripts_copy):
    """docs/your_own_arm.md's ```python block is lines of arms.py's USER_ARMS; pasted alone into a copy's USER_ARMS it
    registers its arms in every script. The guide's other edits, each in its one place: a model knob is one Arm field
    (a row sets it, the config holds it, both CLIs' flag overrides it); a loss term is one line of GPT.loss; an LR
    schedule is plan.lr_multiplier's line (what every training step reads)."""
    edit, run = scripts_copy
    snippet = re.search(r"```python\n(.*?)```", open(os.path.join(ROOT, "docs", "your_own_arm.md")).read(), re.S)[1]
    source = open(os.path.join(ROOT, "arms.py")).read()
    start = source.index("USER_ARMS = {\n") + len("USER_ARMS = {\n")
    table = source[start:source.index("}\n", start)]
    assert all(line in table.splitlines() for line in snippet.splitlines()), \
        "docs/your_own_arm.md's snippet has a line that is not in arms.py's USER_ARMS"
    names = re.findall(r'^ *"([a-z0-9_]+)":', snippet, re.M)
    gated = next(name for name, line in zip(names, snippet.splitlines()) if "boundary_gate=True" in line)
    edit("arms.py", table, snippet + '    "mine": derived("untied_grow", label="Mine", color="k", mix_scale=0.5),\n')
    edit("arms.py", "    output_multiplier: float = knob(", '    mix_scale: float = knob("model", 1.0, help="scale of '
         'the injected matrix", range="(0, inf)")\n    output_multiplier: float = knob(')
    edit("model.py", "ignore_index=-1, reduction=reduction)", "ignore_index=-1, reduction=reduction) + 1.0")
    edit("plan.py", "m = wsd_multiplier(step, plan.steps, plan.warmup_steps, plan.warmdown_ratio)",
         "m = 0.5 * (1 + math.cos(math.pi * step / plan.steps))  # cosine")
    rc, out = run("-c", f"""import math, types, torch, arms, model, plan
print(*arms.ARMS)
args = model.build_parser().parse_args(["--arch", "mine", "--depth", "2", "--mix-scale", "3"])  # train.py's flags too
print(model.describe(model.config_for({gated!r}, 2))["scalar_params"], model.config_for("mine", 2).mix_scale,
      model.config_from_args(args, arms.PRESETS["cpu"], 2, 257).mix_scale)
cfg = model.config_for("vanilla", 1, width_per_depth=16, head_dim=16, seq_len=8, vocab_size=257)
print(model.GPT(cfg)(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)).item() - math.log(257))
print(plan.lr_multiplier(5, types.SimpleNamespace(steps=10, crossover_steps=())))  # a Plan's fields it reads
""")
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[0].split() == list(arms.PAPER_ARMS) + names + ["mine"] and lines[1] == "1 0.5 3.0"
    assert float(lines[2]) == pytest.approx(1.0)  # initial logits 0: ln V, plus the new term
    assert float(lines[3]) == pytest.approx(0.5)  # cos(pi/2)


@pytest.mark.parametrize("make, words", [  # more in tests/test_bad_inputs.py: values checked as their flags
    (lambda: arms.check_user_arms({"vanilla": arms.USER_ARMS["gated_1"]}), "'vanilla' must be a new name of a-z, 0-9"),
    (lambda: arms.check_user_arms({"../x": arms.USER_ARMS["gated_1"]}), "'../x' must be a new name of a-z, 0-9"),
    (lambda: arms.derived("operator_1", label="M", color="k", alhpa=0.5), "derived('operator_1', ...): Arm has no "
                                                                          "field 'alhpa'"),
    (lambda: arms.derived("loop_grow", label="M", color="k", stages=(1, 4), passes=4), "stages (1, 4) set "
                                                                                       "passes_initial and passes")])
def test_a_mistake_in_the_table_is_one_line(make, words, capsys):
    with pytest.raises(SystemExit) as stop:
        make()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


@pytest.mark.parametrize("argv", [("arms.py", "arms"), ("fit.py", "runs", "."), ("model.py", "--arch", "vanilla")])
def test_a_misspelt_base_arm_is_one_line_in_every_script(scripts_copy, argv):
    """The table is checked when arms.py is imported, so every script (not only train.py) says it in one line."""
    edit, run = scripts_copy
    edit("arms.py", "USER_ARMS = {\n", 'USER_ARMS = {\n    "mine": derived("operater_1", label="M", color="k"),\n')
    rc, err = run(*argv)
    assert (rc, err.strip().splitlines()) == (2, [
        "arms.py: error: USER_ARMS: derived('operater_1', ...): no paper arm 'operater_1'; derive from one of "
        f"{', '.join(arms.PAPER_ARMS)} (docs/your_own_arm.md)"]), err


@pytest.mark.usefixtures("with_mix_grow")
def test_a_staged_growth_is_a_row_whose_fractions_and_passes_are_checked():
    plan = tiny_plan(mix_arm.NAME)  # stages (1, 2, 4) at 30 % and 60 % of 10 steps
    assert (list(plan.pass_stages), list(plan.crossover_steps)) == ([1, 2, 4], [3, 6])
    with pytest.raises(arms.UsageError, match=r"needs 2 increasing --crossover-fractions in \(0, 1\), e.g. "
                                              r"--crossover-fractions 0.33 0.67"):
        tiny_plan(mix_arm.NAME, "--crossover-fractions", "0.5")
    with pytest.raises(arms.UsageError, match="mix_grow grows through the stages 1->2->4: change them with --pass-s"):
        tiny_plan(mix_arm.NAME, "--passes", "6")
