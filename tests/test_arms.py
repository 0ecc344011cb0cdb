"""Tests for arms.py and the checks every arm meets: the paper's eight stay a fixed set, user arms live beside them,
and invariants parametrised over every registered arm plus Mix-Grow (tests/mix_arm.py: a learned matrix per injection
point, staged growth 1 -> 2 -> 4), so that a new arm is checked by adding it: parameter counts and FLOPs against the
real module, optimizer groups, growth at every stage against the arm's own rule, the same refusals in the run and its
dry runs, and 2 processes against one. A broken invariant fails naming the arm and what broke."""
import io
import os
import re
import signal
import subprocess
import sys
import time
import types

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import arms
import checkpoint
import common
import mix_arm
import model
import train
from model import config_for
from test_train import ROOT, read_run
from test_train import tiny as tiny_run

# vocab 256 is a multiple of model.VOCAB_MULTIPLE: the accounting counts the padded lm_head rows in all three loss
# matmuls, while the chunked loss's two gradient matmuls use the real rows only
SHAPE = dict(width_per_depth=32, head_dim=16, seq_len=16, vocab_size=256, mlp_multiple=64)
DEPTH = 3
EVERY_ARM = [*arms.ARMS, mix_arm.NAME]
GROWING = [*arms.GROWTH_ARMS, mix_arm.NAME]


@pytest.fixture
def with_mix_grow(monkeypatch):
    """Mix-Grow registered (arms.ARMS, model.GPT) for one test."""
    monkeypatch.setitem(arms.ARMS, mix_arm.NAME, mix_arm.ARM)
    monkeypatch.setattr(model, "GPT", mix_arm.MixGPT)


def tiny(arch):
    return config_for(arch, DEPTH, **SHAPE)


def stages(arch):
    cfg = tiny(arch)
    return arms.ARMS[arch].stages or tuple(sorted({cfg.passes_initial, cfg.passes}))


def random_model(cfg, seed=0, attention="auto"):
    """Every weight random (also the zero-initialised projections): no path is trivially zero."""
    torch.manual_seed(seed)
    net = model.GPT(cfg, attention=attention)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
    return net


def batch(cfg, rows=2):
    return torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), generator=torch.Generator().manual_seed(1))


def test_the_paper_arms_are_the_fixed_eight_and_user_arms_live_beside_them():
    assert list(arms.PAPER_ARMS) == ["vanilla", "deep_vanilla", "operator_1", "loop_2", "untied_2", "loop_grow",
                                     "untied_grow", "deep_vanilla_grow"]
    assert arms.ARMS == {**arms.PAPER_ARMS, **arms.USER_ARMS} and not set(arms.PAPER_ARMS) & set(arms.USER_ARMS)
    assert {a for a in arms.PAPER_ARMS if arms.ARMS[a].grows} == {"loop_grow", "untied_grow", "deep_vanilla_grow"}
    assert set(arms.GROWTH_ARMS) == {name for name, arm in arms.ARMS.items() if arm.passes_initial is not None}
    assert all(arms.ARMS[a].default_crossover is not None for a in arms.GROWTH_ARMS)
    assert arms.FIGURE2_ARMS == ("vanilla", "operator_1", "loop_2", "untied_2", "loop_grow", "untied_grow")
    with pytest.raises(AttributeError):
        arms.ARMS["vanilla"].tpp = 1
    # the ladders: `all` is the paper's 58 runs whatever USER_ARMS holds; `user` runs the user arms
    assert len(train.ladder_runs("all")) == 58
    assert {argv[1] for _, argv in train.ladder_runs("user")} == set(arms.USER_ARMS)
    assert {argv[1] for _, argv in train.ladder_runs("demo", "cpu")} == set(arms.DEMO_ARMS)


def test_a_user_arm_inherits_its_base_recipe_but_not_the_release_growth_fractions():
    loop3 = arms.USER_ARMS["loop_3_grow"]
    base = arms.PAPER_ARMS["loop_grow"]
    assert (loop3.passes_initial, loop3.passes, loop3.crossover) == (1, 3, {})
    for name in ("matrix_lr", "embedding_lr", "lr_exponent", "tpp", "rewarm_steps", "default_crossover", "alpha"):
        assert getattr(loop3, name) == getattr(base, name), name


def test_every_arm_has_its_own_label_and_colour():
    labels = [arm.label for arm in arms.ARMS.values()]
    colours = [arm.color for arm in arms.ARMS.values()]
    assert len(set(labels)) == len(labels) and len(set(colours)) == len(colours), (labels, colours)


@pytest.mark.parametrize("arch", list(arms.ARMS))  # Mix-Grow's matrices are in no count: its own edit
def test_parameter_counts_are_the_modules_before_and_after_growth(arch):
    cfg = tiny(arch)
    net = random_model(cfg)
    stored = sum(p.numel() for p in net.parameters())
    assert model.params_stored(cfg) == stored, \
        f"{arch}: model.params_stored says {model.params_stored(cfg):,}, the module has {stored:,} parameters"
    for k in stages(arch):
        if k > net.active_passes:
            net.grow(k)
        net.zero_grad(set_to_none=True)
        net(batch(cfg), batch(cfg)).backward()
        used = sum(p.numel() for p in net.parameters() if p.grad is not None)
        assert model.params_active(cfg, k) == used, f"{arch}: model.params_active at {k} passes says " \
            f"{model.params_active(cfg, k):,}, a forward and backward at {k} passes trains {used:,} parameters"
        assert sum(p.numel() for p in net.parameters()) == stored, f"{arch}: growth to {k} passes changed the count"
    assert model.params_tpp(cfg) == model.params_active(cfg, cfg.passes_initial), \
        f"{arch}: params_tpp (TPP, steps and LRs rest on it) is not the parameters in use at the initial passes"


@pytest.mark.parametrize("arch", list(arms.ARMS))
def test_flops_per_token_are_what_the_flop_counter_counts_at_every_pass_stage(arch):
    """Convention: 6 x (matrix parameters executed, lm_head included) per token for the matmuls of forward and
    backward, and causal attention at its (T+1)/2 average keys per query. FlopCounterMode counts every matmul, and
    the math attention kernel's full T x T score and value matmuls: 2T/(T+1) times our attention term."""
    cfg = tiny(arch)
    net = random_model(cfg, attention="math")  # the model's own backend choice: math, whose matmuls are counted
    idx = batch(cfg)
    tokens = idx.numel()
    for k in stages(arch):
        with FlopCounterMode(display=False) as counter:
            net(idx, idx, passes=k).backward()
        counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
        matrix = model.matrix_flops_per_token(cfg, k) * tokens
        attention = (model.flops_per_token(cfg, k) - model.matrix_flops_per_token(cfg, k)) * tokens
        assert counts.get("aten.mm") == matrix, f"{arch}: at {k} passes the matmuls count {counts.get('aten.mm'):,} " \
            f"FLOPs, model.matrix_flops_per_token x tokens says {matrix:,}"
        T = cfg.seq_len
        assert counts.get("aten.bmm") * (T + 1) == attention * 2 * T, f"{arch}: at {k} passes attention counts " \
            f"{counts.get('aten.bmm'):,} FLOPs (full T x T), the accounting's causal {attention:,} x 2T/(T+1) differs"
        assert set(counts) == {"aten.mm", "aten.bmm"}, f"{arch}: uncounted FLOPs in {set(counts)}"


def tiny_plan(arch, *flags):
    """A cpu-preset plan of `arch` at depth 2 with the arm's own growth fractions (one per growth)."""
    return train.make_plan(train.parse_args(["--arch", arch, "--depth", "2", "--preset", "cpu", "--steps", "10",
                                             *flags]))


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
@pytest.mark.parametrize("arch", EVERY_ARM)
@pytest.mark.usefixtures("with_mix_grow")
def test_every_parameter_is_in_exactly_one_optimizer_group_with_an_lr_and_wd_rule(arch, optimizer):
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
                _, _, decays = arms.PARAM_GROUPS[name]
                assert group["lr"] == plan.group_lr(name) > 0, f"{arch}: {name} trains at LR {group['lr']}"
                assert group["weight_decay"] == (plan.weight_decay if decays else 0.0), \
                    f"{arch}: {name} decays by {group['weight_decay']}, arms.PARAM_GROUPS says {decays}"
    assert len(seen) == len(list(net.parameters())), f"{arch}: {len(group_of) - len(seen)} parameters in no optimizer"


def test_the_scalar_recipe_slot_scales_with_depth_and_defaults_to_the_embedding_lr():
    plan = tiny_plan("gated_1")
    assert plan.scalar_lr is None and plan.group_lr("scalar") == plan.embedding_lr
    given = tiny_plan("gated_1", "--scalar-lr", "0.1")
    assert given.group_lr("scalar") == pytest.approx(0.1 * given.embedding_lr / arms.ARMS["gated_1"].embedding_lr)


# ----------------------------------------------------------------------------------------------------------------------
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
        torch.manual_seed(k)
        with torch.no_grad():
            for p in net.parameters():
                p.normal_(0, 0.3)
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


@pytest.mark.parametrize("arch", GROWING)
@pytest.mark.usefixtures("with_mix_grow")
def test_growth_at_every_stage_is_the_arms_own_rule(arch):
    plan = tiny_plan(arch)
    assert len(plan.pass_stages) == len(stages(arch)) >= 2
    check_growth(arch, random_model(plan.model_config), plan)


class Forgetful(mix_arm.MixGPT):
    """Mix-Grow whose growth forgets its own matrices (it stacks the cores and gates only, as GPT.grow did before)."""

    def per_pass(self):
        return [seq for seq in super().per_pass() if seq[0][0] is not self.mix[0]]


@pytest.mark.usefixtures("with_mix_grow")
def test_the_growth_check_fails_an_arm_whose_growth_forgets_its_own_tensors(monkeypatch):
    monkeypatch.setattr(model, "GPT", Forgetful)
    plan = tiny_plan(mix_arm.NAME)
    with pytest.raises(AssertionError, match=r"growth 1 -> 2 passes left mix\.1 not a copy of mix\.0"):
        check_growth(mix_arm.NAME, random_model(plan.model_config), plan)


# ----------------------------------------------------------------------------------------------------------------------
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
    monkeypatch.setattr(model, "GPT", LayerScale)
    groups = model.GPT(tiny("vanilla")).param_groups()
    assert [p.ndim for p in groups["scalar"]] == [0] * len(groups["scalar"]) and groups["scalar"]
    assert all(p.ndim == 2 for p in groups["matrix"])
    monkeypatch.setattr(model, "GPT", Vector)
    assert train.main(tiny_run(pool, tmp_path, "vanilla", "--run-name", "r", steps=2)) == 0
    assert set(read_run(tmp_path, "r")[1][-1]["scalars"]) == {"block_scales.0", "block_scales.1", "block_scales.2"}


# ----------------------------------------------------------------------------------------------------------------------
# Every growing arm on 2 gloo processes against one, and Mix-Grow killed (-9) and resumed

LOSS_RTOL = 2e-5  # tests/test_parallel.py: FSDP2's per-rank averages flip a bf16 rounding of a Muon update now and then


def torchrun(port, *runs):
    """tests/mix_arm.py (train.py with Mix-Grow registered) on 2 gloo processes, the runs one after the other."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(port), os.path.join("tests", "mix_arm.py")]
    for run in runs:
        argv += [*run, "--next"]
    return subprocess.Popen(argv[:-1], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)


@pytest.mark.usefixtures("with_mix_grow")
def test_every_growing_arm_on_2_processes_trains_as_one_and_resumes_exactly(pool, tmp_path):
    args = {arch: tiny_run(pool, tmp_path, arch, "--save-every", "2", "--log-every", "1", steps=8, depth=1)
            for arch in GROWING}
    mix = args[mix_arm.NAME]
    done = torchrun(common.free_port(), *[a + ["--run-name", f"{arch}_2"] for arch, a in args.items()])
    cut = None
    for arch, a in args.items():  # one process, in this one, meanwhile
        assert train.main(a + ["--run-name", f"{arch}_1"]) == 0
    out, err = done.communicate(timeout=600)
    assert done.returncode == 0, err[-3000:]
    for arch in args:
        one, two = read_run(tmp_path, f"{arch}_1"), read_run(tmp_path, f"{arch}_2")
        assert two[0]["world_size"] == 2 and two[0]["growth_events"] == one[0]["growth_events"], arch
        assert len(one[0]["growth_events"]) == len(stages(arch)) - 1, arch
        assert [t["loss"] for t in two[1]] == pytest.approx([t["loss"] for t in one[1]], rel=LOSS_RTOL), arch
    cut = torchrun(common.free_port(), mix + ["--run-name", "cut"])
    trajectory, deadline = tmp_path / "cut" / "trajectory.jsonl", time.time() + 300
    while time.time() < deadline and cut.poll() is None and \
            (not trajectory.exists() or len(trajectory.read_text().splitlines()) < 5):
        time.sleep(0.02)
    for pid in process_tree(cut.pid):  # torchrun and its workers (each in a session of its own)
        os.kill(pid, signal.SIGKILL)
    cut.communicate()
    step = checkpoint.read_run_state(checkpoint.checkpoint_folder(str(tmp_path / "cut"))).step
    assert 2 <= step < 8, step
    resumed = torchrun(common.free_port(), mix + ["--run-name", "cut", "--resume"])
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()[-3000:]
    full, again = read_run(tmp_path, f"{mix_arm.NAME}_2"), read_run(tmp_path, "cut")
    assert again[0]["status"] == "complete" and [t["loss"] for t in again[1]] == [t["loss"] for t in full[1]]
    assert again[0]["growth_events"] == full[0]["growth_events"]


def process_tree(pid):
    """pid and its descendants, from /proc's parent links."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(entry)] = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    tree = [pid]
    for child, parent in sorted(parents.items()):
        if parent in tree:
            tree.append(child)
    return tree


def test_the_gated_operator_is_the_fixed_one_at_init_and_learns_its_gates():
    cfg = tiny("gated_1")
    fixed = config_for("operator_1", DEPTH, **SHAPE)
    gated, plain = random_model(cfg), random_model(fixed)
    with torch.no_grad():
        for gate in gated.boundary_gates:
            gate.fill_(cfg.alpha)
    idx = batch(cfg)
    assert len(gated.boundary_gates) == model.gates_stored(cfg) == 1
    assert torch.equal(gated(idx), plain(idx))
    gated(idx, idx).backward()
    assert gated.boundary_gates[0].grad.abs() > 0
    with torch.no_grad():
        gated.boundary_gates[0].fill_(0.0)
    assert not torch.equal(gated(idx), plain(idx))
    assert torch.equal(model.GPT(cfg).boundary_gates[0].detach(), torch.tensor(cfg.alpha))


def test_the_guides_registration_snippet_is_in_arms_py_and_registers_its_arms_alone(tmp_path):
    """docs/your_own_arm.md's ```python block is lines of arms.py's USER_ARMS (which may hold arms of your own
    besides); pasted into a throwaway copy of the scripts whose USER_ARMS is empty, it registers its arms alone:
    model.py and the ladder listing take them."""
    import shutil
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    guide = open(os.path.join(root, "docs", "your_own_arm.md")).read()
    snippet = re.search(r"```python\n(.*?)```", guide, re.S).group(1)
    source = open(os.path.join(root, "arms.py")).read()
    start = source.index("USER_ARMS = {\n") + len("USER_ARMS = {\n")
    end = source.index("}\n", start)
    registered = source[start:end].splitlines()
    assert all(line in registered for line in snippet.splitlines()), \
        "docs/your_own_arm.md's snippet has a line that is not in arms.py's USER_ARMS"
    names = re.findall(r'^ *"([a-z0-9_]+)":', snippet, re.M)
    for name in os.listdir(root):
        if name.endswith(".py"):
            shutil.copy(os.path.join(root, name), tmp_path / name)
    (tmp_path / "arms.py").write_text(source[:start] + source[end:])  # no user arms
    run = lambda *argv: subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True)
    assert run("arms.py", "arms").stdout.split() == list(arms.PAPER_ARMS)
    assert run("train.py", "--ladder", "user").returncode == 2
    (tmp_path / "arms.py").write_text(source[:start] + snippet + source[end:])
    assert run("arms.py", "arms").stdout.split() == list(arms.PAPER_ARMS) + names
    gated = next(name for name in names if "boundary_gate=True" in snippet.splitlines()[names.index(name)])
    table = run("model.py", "--arch", gated, "--depth", "2", "--preset", "cpu", "--vocab-size", "257", "--json")
    assert table.returncode == 0 and '"scalar_params": 1' in table.stdout, table.stderr
    listing = run("train.py", "--ladder", "user", "--preset", "cpu").stdout.splitlines()
    assert len(listing) == len(names) * 4 and listing[0].startswith(f"{names[0]}_d1 --arch {names[0]}")


# ---------------------------------------------------------------------------------------------------------------------
# A copy of the scripts with one edit, run where a user runs them

@pytest.fixture
def scripts_copy(tmp_path):
    """edit(file, old, new) changes a copy of the scripts; run(*argv) runs one of them there -> (rc, stderr)."""
    import shutil
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in os.listdir(root):
        if name.endswith(".py"):
            shutil.copy(os.path.join(root, name), tree / name)
    os.symlink(os.path.join(root, "reference"), tree / "reference")  # the release's timing: the dry run's GPU-hours

    def edit(file, old, new):
        text = (tree / file).read_text()
        assert old in text, f"{file} no longer holds {old!r}: update the test's edit"
        (tree / file).write_text(text.replace(old, new, 1))

    def run(*argv, stdout=False):
        done = subprocess.run([sys.executable, *argv], cwd=tree, capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr if stdout else done.stderr
    return types.SimpleNamespace(edit=edit, run=run, tree=tree)


# ----------------------------------------------------------------------------------------------------------------------
# The table's own mistakes, and docs/your_own_arm.md's edits

TABLE_MISTAKES = {
    "a paper arm's name": (lambda: arms.check_user_arms({"vanilla": arms.USER_ARMS["gated_1"]}),
                           "'vanilla' is a paper arm's name"),
    "no folder name": (lambda: arms.check_user_arms({"../evil": arms.USER_ARMS["gated_1"]}),
                       "the name '../evil' is not made of a-z, 0-9 and _ only"),
    "a misspelt field": (lambda: arms.derived("operator_1", label="M", color="k", alhpa=0.5),
                         "derived('operator_1', ...): Arm has no field 'alhpa'"),
    "stages that do not increase": (lambda: arms.derived("loop_grow", label="M", color="k", stages=(1, 4, 2)),
                                    "stages must be a tuple of 2 or more increasing pass counts"),
}


@pytest.mark.parametrize("mistake", list(TABLE_MISTAKES))
def test_a_mistake_in_the_table_is_one_line(mistake, capsys):
    make, words = TABLE_MISTAKES[mistake]
    with pytest.raises(SystemExit) as stop:
        make()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_a_staged_growth_is_a_row_whose_fractions_and_passes_are_checked(monkeypatch):
    monkeypatch.setitem(arms.ARMS, "loop_124", arms.derived("loop_grow", label="L", color="k", stages=(1, 2, 4),
                                                            default_crossover=(0.4, 0.8)))
    plan = tiny_plan("loop_124")
    assert (plan.pass_stages, plan.crossover_steps) == ((1, 2, 4), (4, 8)) or \
        (list(plan.pass_stages), list(plan.crossover_steps)) == ([1, 2, 4], [4, 8])
    with pytest.raises(arms.UsageError, match=r"needs 2 increasing --crossover-fractions in \(0, 1\), e.g. "
                                              r"--crossover-fractions 0.33 0.67"):
        tiny_plan("loop_124", "--crossover-fractions", "0.5")
    with pytest.raises(arms.UsageError, match="loop_124 grows through the stages 1->2->4: change them with "
                                              "--pass-stages"):
        tiny_plan("loop_124", "--passes", "6")


def test_a_new_model_knob_is_one_field_of_the_arm(scripts_copy):
    """docs/your_own_arm.md's knob edit, done on a copy: one Arm field and a row that sets it; the model's config
    holds the row's value, and both CLIs' flag overrides it."""
    scripts_copy.edit("arms.py", "    output_multiplier: float = knob(",
                      '    mix_scale: float = knob("model", 1.0, help="scale of the injected matrix", range="(0, inf)")'
                      "\n    output_multiplier: float = knob(")
    scripts_copy.edit("arms.py", "USER_ARMS = {\n", 'USER_ARMS = {\n    "mine": derived("untied_grow", label="Mine", '
                      'color="k", mix_scale=0.5),\n')
    rc, out = scripts_copy.run("-c", "import arms, model; p = model.build_parser(); print(model.config_for('mine', 2)"
                               ".mix_scale, model.config_from_args(p.parse_args(['--arch', 'mine', '--depth', '2', "
                               "'--mix-scale', '3']), arms.PRESETS['cpu'], 2, 257).mix_scale)", stdout=True)
    assert (rc, out.split()) == (0, ["0.5", "3.0"]), out


@pytest.mark.parametrize("argv", [("arms.py", "arms"), ("fit.py", "runs", "."), ("model.py", "--arch", "vanilla")])
def test_a_misspelt_base_arm_is_one_line_in_every_script(scripts_copy, argv):
    """The table is checked when arms.py is imported, so every script (not only train.py) says it in one line."""
    scripts_copy.edit("arms.py", "USER_ARMS = {\n", "USER_ARMS = {\n" + '    "mine": derived("operater_1", label="M", '
                      'color="k"),\n')
    rc, err = scripts_copy.run(*argv)
    assert (rc, err.strip().splitlines()) == (2, [
        "arms.py: error: USER_ARMS: derived('operater_1', ...): no paper arm 'operater_1'; derive from one of "
        f"{', '.join(arms.PAPER_ARMS)} (docs/your_own_arm.md)"]), err
