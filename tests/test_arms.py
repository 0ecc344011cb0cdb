"""Tests for arms.py: the paper's eight arms stay a fixed set, user arms live beside them, and invariants that every
registered arm (paper or user) must keep, each parametrized over the table so that a new arm is checked by adding
it: parameter counts and FLOPs against the real module, optimizer groups, loading checkpoints written before a field
existed, and growth's promise. A broken invariant fails naming the arm and what broke."""
import copy
import dataclasses
import json
import types

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import arms
import checkpoint
import model
import plan as plan_lib
import train
from model import GPT, config_for

# vocab 256 is a multiple of model.VOCAB_MULTIPLE: the accounting counts the padded lm_head rows in all three loss
# matmuls, while the chunked loss's two gradient matmuls use the real rows only
SHAPE = dict(width_per_depth=32, head_dim=16, seq_len=16, vocab_size=256, mlp_multiple=64)
DEPTH = 3
# ModelConfig's fields in the first release: every field added since must have a default (earlier checkpoints lack it)
FIRST_RELEASE_FIELDS = ("arch", "depth", "width", "n_head", "head_dim", "mlp_hidden", "vocab_size", "seq_len", "mode",
                        "n_prelude", "n_core", "n_coda", "passes", "passes_initial", "alpha", "recurrence_norm",
                        "coda_inject", "residual_multiplier", "output_multiplier", "wte_init_std", "uniform_init_scale",
                        "mlp_multiple")


def tiny(arch):
    return config_for(arch, DEPTH, **SHAPE)


def stages(cfg):
    return sorted({cfg.passes_initial, cfg.passes})


def random_model(cfg, seed=0, attention="auto"):
    """Every weight random (also the zero-initialised projections): no path is trivially zero."""
    torch.manual_seed(seed)
    net = GPT(cfg, attention=attention)
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
    with pytest.raises(dataclasses.FrozenInstanceError):
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


@pytest.mark.parametrize("arch", list(arms.ARMS))
def test_parameter_counts_are_the_modules_before_and_after_growth(arch):
    cfg = tiny(arch)
    net = random_model(cfg)
    stored = sum(p.numel() for p in net.parameters())
    assert model.params_stored(cfg) == stored, \
        f"{arch}: model.params_stored says {model.params_stored(cfg):,}, the module has {stored:,} parameters"
    for k in stages(cfg):
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
    for k in stages(cfg):
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
    argv = ["--arch", arch, "--depth", "2", "--preset", "cpu", "--steps", "4", *flags]
    if arms.ARMS[arch].grows:
        argv += ["--crossover-fractions", "0.5"]
    return train.make_plan(train.parse_args(argv))


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
@pytest.mark.parametrize("arch", list(arms.ARMS))
def test_every_parameter_is_in_exactly_one_optimizer_group_with_an_lr_and_wd_rule(arch, optimizer):
    plan = tiny_plan(arch, "--optimizer", optimizer)
    model.check_build(plan.model_config)  # train.py's check: every parameter in one group, each group with a row
    net = GPT(plan.model_config)
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
    assert len(seen) == len(group_of), f"{arch}: {len(group_of) - len(seen)} parameters in no optimizer"


def test_the_scalar_recipe_slot_scales_with_depth_and_defaults_to_the_embedding_lr():
    plan = tiny_plan("gated_1")
    assert plan.scalar_lr is None and plan.group_lr("scalar") == plan.embedding_lr
    given = tiny_plan("gated_1", "--scalar-lr", "0.1")
    assert given.group_lr("scalar") == pytest.approx(0.1 * given.embedding_lr / arms.ARMS["gated_1"].embedding_lr)


# The Plan's fields in the first release it was recorded with (the corpus's oldest, 5f42fca: tests/data/README.md)
PLAN_FIRST_RELEASE_FIELDS = (
    "arch", "depth", "preset", "tokenizer", "optimizer", "tpp", "lr_exponent", "tokens_per_step", "seq_len", "steps",
    "crossover_step", "crossover_steps", "crossover_fractions", "pass_stages", "random_passes", "train_tokens",
    "train_token_limit", "epochs", "val_tokens", "matrix_lr", "embedding_lr", "unembedding_lr", "weight_decay",
    "adam_betas", "adam_eps", "warmup_steps", "warmdown_ratio", "rewarm_steps", "data_constrained", "seed",
    "model_config")


@pytest.mark.parametrize("cls, first_release", [(model.ModelConfig, FIRST_RELEASE_FIELDS),
                                                (plan_lib.Plan, PLAN_FIRST_RELEASE_FIELDS),
                                                (checkpoint.RunState, ())])
def test_every_persisted_field_added_after_the_first_release_has_a_default(cls, first_release):
    """docs/reliability.md's rule: a field of a record train.py writes (model_config, plan, a checkpoint's RunState),
    added after the first release, has a default (a value or a default_factory), and that default is what a record
    written before it reads as: plain JSON, not dataclasses.MISSING (the 5f42fca runs' resume failed on exactly that)."""
    defaults = checkpoint.field_defaults(cls)
    late = [f.name for f in dataclasses.fields(cls) if f.name not in first_release]
    undefaulted = [name for name in late if name not in defaults]
    assert not undefaulted, f"{cls.__name__}.{undefaulted[0]} was added after the first release without a default: " \
        "every earlier record would stop loading"
    assert json.loads(json.dumps({name: defaults[name] for name in late})) == {name: defaults[name] for name in late}


@pytest.mark.parametrize("arch", list(arms.ARMS))
def test_a_checkpoint_written_before_the_newer_fields_existed_still_loads(arch, tmp_path):
    cfg = tiny(arch)
    net = random_model(cfg)
    earlier = {k: v for k, v in dataclasses.asdict(cfg).items() if k in FIRST_RELEASE_FIELDS}
    path = tmp_path / "latest.pt"  # an earlier single-file checkpoint
    torch.save(dict(model=net.state_dict(), model_config=earlier, passes=cfg.passes_initial, tokenizer="bytes",
                    step=0), path)
    if any(getattr(cfg, f.name) != f.default for f in dataclasses.fields(cfg) if f.name not in FIRST_RELEASE_FIELDS):
        with pytest.raises(ValueError):  # a model the earlier code could not build (a gated one): refused, not guessed
            checkpoint.load_checkpoint_model(str(path))
        return
    loaded, record = checkpoint.load_checkpoint_model(str(path))
    assert loaded.cfg == cfg, f"{arch}: an earlier checkpoint loads as another model"
    idx = batch(cfg)
    assert torch.equal(loaded(idx), net.eval()(idx)), f"{arch}: an earlier checkpoint computes something else"


@pytest.mark.parametrize("arch", list(arms.ARMS))
def test_a_plan_recorded_before_the_newer_fields_existed_matches_its_command(arch):
    plan = tiny_plan(arch)
    recorded = plan.as_dict()
    late = {f.name for f in dataclasses.fields(plan) if f.default is not dataclasses.MISSING} - {"total_flops"}
    for name in late:
        recorded.pop(name)
    recorded["model_config"] = {k: v for k, v in recorded["model_config"].items() if k in FIRST_RELEASE_FIELDS}
    if any(getattr(plan.model_config, k) != f.default for f in dataclasses.fields(model.ModelConfig)
           if (k := f.name) not in FIRST_RELEASE_FIELDS):
        with pytest.raises(arms.UsageError, match="another run"):
            checkpoint.check_plan("result.json", recorded, plan)
    else:
        checkpoint.check_plan("result.json", recorded, plan)


@pytest.mark.parametrize("arch", arms.GROWTH_ARMS)
def test_growth_keeps_the_recipes_promise(arch):
    """Untied: the new cores (and their gates) start as stacked copies of the trained ones; tied: the same weights,
    now looped more often."""
    cfg = tiny(arch)
    net = random_model(cfg)
    idx = batch(cfg)
    for k in stages(cfg)[1:]:
        before = copy.deepcopy(net)
        old = net.active_passes
        net.grow(k)
        expected = copy.deepcopy(before)
        if cfg.mode == "untied":
            with torch.no_grad():
                for j in range(old, k):
                    for dst, src in zip(expected.core_blocks(j).parameters(), expected.core_blocks(j % old).parameters()):
                        dst.copy_(src)
                    if j < len(expected.boundary_gates):
                        expected.boundary_gates[j].copy_(expected.boundary_gates[j % old])
        else:
            assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), before.state_dict().values())), \
                f"{arch}: tied growth changed a weight"
        assert torch.equal(net(idx), expected(idx, passes=k)), \
            f"{arch}: the first forward after growth to {k} passes is not the recipe's promise"


def test_the_gated_operator_is_the_fixed_one_at_init_and_learns_its_gates():
    cfg = tiny("gated_1")
    fixed = dataclasses.replace(cfg, boundary_gate=False)
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
    assert torch.equal(GPT(cfg).boundary_gates[0].detach(), torch.tensor(cfg.alpha))


def test_the_guides_registration_snippet_is_in_arms_py_and_registers_its_arms_alone(tmp_path):
    """docs/your_own_arm.md's ```python block is lines of arms.py's USER_ARMS (which may hold arms of your own
    besides); pasted into a throwaway copy of the scripts whose USER_ARMS is empty, it registers its arms alone:
    model.py and the ladder listing take them."""
    import os
    import re
    import shutil
    import subprocess
    import sys
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
# A user arm's mistakes, refused where it runs: `python train.py ...` in a throwaway copy of the scripts with one edit

@pytest.fixture
def scripts_copy(tmp_path):
    """edit(file, old, new) changes a copy of the scripts; run(*argv) runs one of them there -> (rc, stderr)."""
    import os
    import shutil
    import subprocess
    import sys
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

    def run(*argv):
        done = subprocess.run([sys.executable, *argv], cwd=tree, capture_output=True, text=True)
        return done.returncode, done.stderr
    return types.SimpleNamespace(edit=edit, run=run, tree=tree)


USER_ARMS_LINE = "USER_ARMS = {\n"
GROUPS_LINE = "unembedding=[self.lm_head.weight], scalar=list(self.boundary_gates))"
USER_ARM_MISTAKES = {  # what the user got wrong -> (edits, --arch, the refusal's words)
    "a parameter in no optimizer group": (
        [("model.py", "        self.cfg = cfg\n", "        self.cfg = cfg\n        self.extra = nn.Parameter(torch.zeros(()))\n")],
        "operator_1", "arm operator_1: parameter extra is in no group of model.param_groups()"),
    "a group without a PARAM_GROUPS row": (
        [("model.py", GROUPS_LINE, GROUPS_LINE[:-1] + ", gains=[])")],
        "vanilla", "arm vanilla: model.param_groups() has the group 'gains', which has no row in arms.PARAM_GROUPS"),
    "a knob config_for does not pass on": (
        [("arms.py", "    output_multiplier: float = knob(", "    my_knob: bool = knob(\"model\", False, help=\"x\")\n"
                                                               "    output_multiplier: float = knob("),
         ("model.py", "    boundary_gate: bool = False", "    my_knob: bool = False\n    boundary_gate: bool = False"),
         ("arms.py", USER_ARMS_LINE, USER_ARMS_LINE + '    "knobbed": derived("operator_1", label="K", color="k", '
                                                      "my_knob=True),\n")],
        "knobbed", "arm knobbed: its row asks my_knob=True but ModelConfig.my_knob is False"),
    "a model knob ModelConfig lacks": (
        [("arms.py", "    output_multiplier: float = knob(", "    my_knob: bool = knob(\"model\", False, help=\"x\")\n"
                                                               "    output_multiplier: float = knob(")],
        "vanilla", "arm vanilla: its row asks my_knob=False but ModelConfig has no field my_knob"),
    "a user arm named like a paper arm": (
        [("arms.py", USER_ARMS_LINE, USER_ARMS_LINE + '    "vanilla": derived("operator_1", label="V", color="k"),\n')],
        "vanilla", "USER_ARMS: 'vanilla' is a paper arm's name"),
    "a name that is no folder name": (
        [("arms.py", USER_ARMS_LINE, USER_ARMS_LINE + '    "../evil": derived("operator_1", label="E", color="k"),\n')],
        "vanilla", "USER_ARMS: the name '../evil' is not made of a-z, 0-9 and _ only"),
    "a misspelt base arm": (
        [("arms.py", USER_ARMS_LINE, USER_ARMS_LINE + '    "mine": derived("operater_1", label="M", color="k"),\n')],
        "mine", "USER_ARMS: derived('operater_1', ...): no paper arm 'operater_1'"),
    "a misspelt field": (
        [("arms.py", USER_ARMS_LINE, USER_ARMS_LINE + '    "mine": derived("operator_1", label="M", color="k", '
                                                      "alhpa=0.5),\n")],
        "mine", "USER_ARMS: derived('operator_1', ...): Arm has no field 'alhpa'"),
    "stages that do not increase": (
        [("arms.py", USER_ARMS_LINE, USER_ARMS_LINE + '    "mine": derived("loop_grow", label="M", color="k", '
                                                      "stages=(1, 4, 2)),\n")],
        "mine", "stages must be a tuple of 2 or more increasing pass counts"),
}


@pytest.mark.parametrize("mistake", list(USER_ARM_MISTAKES))
def test_a_user_arms_mistake_is_one_line_from_train_py_before_the_run_folder(scripts_copy, mistake):
    """Each mistake a user following docs/your_own_arm.md can make is refused by `python train.py` itself (not only by
    the tests): one line naming the arm, exit 2, and no run folder. Before: a constant parameter trained with rc 0,
    a KeyError, the base arm trained silently, the paper's Vanilla replaced, a traceback at import."""
    edits, arch, message = USER_ARM_MISTAKES[mistake]
    for edit in edits:
        scripts_copy.edit(*edit)
    runs = scripts_copy.tree / "runs"
    rc, err = scripts_copy.run("train.py", "--arch", arch, "--depth", "1", "--preset", "cpu", "--steps", "2",
                               "--runs-dir", str(runs), "--data-dir", str(scripts_copy.tree / "pool"))
    assert (rc, len(err.strip().splitlines())) == (2, 1) and message in err, err
    assert not runs.exists()


def test_a_staged_growth_is_a_user_arms_row(scripts_copy):
    """stages=(1, 2, 4) with one fraction per growth: the plan grows 1 -> 2 -> 4 at those fractions; --passes on it is
    refused (its stages come from --pass-stages), and a wrong count of fractions names the count its example has."""
    scripts_copy.edit("arms.py", USER_ARMS_LINE, USER_ARMS_LINE + '    "loop_124": derived("loop_grow", label="L", '
                      'color="k", stages=(1, 2, 4), default_crossover=(0.4, 0.8)),\n')
    base = ("train.py", "--arch", "loop_124", "--depth", "2", "--preset", "cpu", "--steps", "10", "--dry-run")
    rc, err = scripts_copy.run(*base, "--crossover-fractions", "0.5")
    assert rc == 2 and "needs 2 increasing --crossover-fractions in (0, 1), e.g. --crossover-fractions 0.33 0.67" \
        in err, err
    rc, err = scripts_copy.run(*base, "--passes", "6")
    assert rc == 2 and "loop_124 grows through the stages 1->2->4: change them with --pass-stages" in err, err
    import subprocess
    import sys
    out = subprocess.run([sys.executable, *base], cwd=scripts_copy.tree, capture_output=True, text=True, check=True)
    planned = json.loads(out.stdout)
    assert (planned["pass_stages"], planned["crossover_steps"]) == ([1, 2, 4], [4, 8])


def test_a_vector_in_the_scalar_group_shows_in_the_trajectory(pool, tmp_path, monkeypatch):
    """A per-block scale vector registered in param_groups()["scalar"] is logged entry by entry (scalars NAME.i), not
    only the 0-dim gates."""
    import os
    from test_train import read_run, tiny
    build, groups = GPT.__init__, GPT.param_groups

    def with_scales(self, cfg, *args, **kwargs):
        build(self, cfg, *args, **kwargs)
        self.block_scales = torch.nn.Parameter(torch.ones(3, device=self.lm_head.weight.device))
    monkeypatch.setattr(GPT, "__init__", with_scales)
    monkeypatch.setattr(GPT, "param_groups", lambda self: dict(groups(self), scalar=[self.block_scales]))
    assert train.main(tiny(pool, tmp_path, "vanilla", "--run-name", "r", steps=2)) == 0
    scalars = read_run(tmp_path, "r")[1][-1]["scalars"]
    assert set(scalars) == {"block_scales.0", "block_scales.1", "block_scales.2"}, scalars
    assert os.path.exists(tmp_path / "r" / "result.json")


@pytest.mark.parametrize("argv", [("arms.py", "arms"), ("fit.py", "runs", "."), ("model.py", "--arch", "vanilla")])
def test_a_misspelt_base_arm_is_one_line_in_every_script(scripts_copy, argv):
    """The table is checked when arms.py is imported, so every script (not only train.py) says it in one line."""
    scripts_copy.edit("arms.py", USER_ARMS_LINE, USER_ARMS_LINE + '    "mine": derived("operater_1", label="M", '
                      'color="k"),\n')
    rc, err = scripts_copy.run(*argv)
    assert (rc, err.strip().splitlines()) == (2, [
        "arms.py: error: USER_ARMS: derived('operater_1', ...): no paper arm 'operater_1'; derive from one of "
        f"{', '.join(arms.PAPER_ARMS)} (docs/your_own_arm.md)"]), err
