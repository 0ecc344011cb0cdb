"""The layout of the scripts: imports go one way (no module imports one that imports it back, at module level or
inside a function; no importlib, __import__ or sys.modules tricks), and one ratchet on the product's total lines."""
import argparse
import ast
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {os.path.basename(path)[:-3]: path for path in sorted(glob.glob(os.path.join(ROOT, "*.py")))}
MAX_PRODUCT_LINES = 7_000  # a ratchet: lower it when the product shrinks, never raise it


def parsed(name):
    with open(SCRIPTS[name]) as f:
        return ast.parse(f.read(), SCRIPTS[name])


def imported_modules(tree):
    """Top-level names of every module an import statement anywhere in `tree` names (functions included)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def import_graph():
    return {name: sorted(imported_modules(parsed(name)) & set(SCRIPTS) - {name}) for name in SCRIPTS}


def find_cycle(graph):
    """One import cycle as [a, b, ..., a], or None."""
    state = {}  # name -> "open" while on the DFS stack, "done" after

    def visit(name, path):
        state[name] = "open"
        for child in graph[name]:
            if state.get(child) == "open":
                return path[path.index(child):] + [child]
            if child not in state and (cycle := visit(child, path + [child])):
                return cycle
        state[name] = "done"
        return None
    for name in graph:
        if name not in state and (cycle := visit(name, [name])):
            return cycle
    return None


def test_find_cycle_finds_a_cycle_through_a_function_level_import():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    tree = ast.parse("import os\nfrom x.y import z\ndef f():\n    import train\n    from . import local\n")
    assert imported_modules(tree) == {"os", "x", "train"}


def test_imports_between_the_scripts_go_one_way():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_no_import_machinery(name):
    """Modules import each other plainly: no importlib, __import__ or sys.modules."""
    tree = parsed(name)
    found = [f"line {node.lineno}" for node in ast.walk(tree)
             if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "importlib" for a in node.names))
             or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "importlib")
             or (isinstance(node, ast.Name) and node.id == "__import__")
             or (isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name)
                 and node.value.id == "sys")]
    assert not found, f"{name}.py uses import machinery at {', '.join(found)}"


def test_the_product_stays_small():
    lines = sum(len(open(path).read().splitlines()) for path in SCRIPTS.values())
    assert lines <= MAX_PRODUCT_LINES, f"{lines} lines of product Python (the ratchet is {MAX_PRODUCT_LINES})"


def literal_lists(tree):
    """(line, values) of every tuple, list or set literal of constants, and of every dict literal's constant keys."""
    for node in ast.walk(tree):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) \
            else None
        if items and all(isinstance(item, ast.Constant) for item in items):
            yield node.lineno, [item.value for item in items]


def test_no_list_of_arms_or_depths_outside_arms_py():
    """Every list of arms (two or more arm names) or of ladder depths (three or more of the table's depths, rising)
    lives in arms.py: a user arm then reaches every script, and no script keeps a stale copy."""
    import arms
    names = set(arms.ARMS)
    depths = {d for arm in arms.ARMS.values() for d in arm.ladder_depths} | set(arms.CPU_LADDER_DEPTHS)
    found = []
    for name in SCRIPTS:
        if name == "arms":
            continue
        for line, values in literal_lists(parsed(name)):
            if sum(v in names for v in values if isinstance(v, str)) >= 2:
                found.append(f"{name}.py:{line} lists arms {values}")
            ints = [v for v in values if type(v) is int]
            if len(ints) == len(values) >= 3 and set(ints) <= depths and ints == sorted(set(ints)) and min(ints) >= 6:
                found.append(f"{name}.py:{line} lists depths {values}")
    with open(os.path.join(ROOT, "ladder.sh")) as f:
        for number, text in enumerate(f, 1):
            if not text.lstrip().startswith("#") and sum(re.search(rf"\b{n}\b", text) is not None for n in names) >= 2:
                found.append(f"ladder.sh:{number} lists arms")
    assert not found, "derive these from arms.py instead: " + "; ".join(found)


SAME_THING = {"--depths": "--depth", "--seeds": "--seed", "--output": "--out", "--output-dir": "--out",
              "--outdir": "--out", "--runs": "--runs-dir"}  # a synonym -> the one name every script uses


def options_of(parser):
    """(prog, {option string: action}) of a parser and of each of its subcommands."""
    yield parser.prog, parser._option_string_actions
    for action in parser._actions:
        for sub in (action.choices or {}).values() if isinstance(action, argparse._SubParsersAction) else ():
            yield from options_of(sub)


def flags_in_help(main, argv, capsys):
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", capsys.readouterr().out))


def test_one_cli_grammar_across_the_scripts(capsys):
    """The same thing has the same flag in every script: `--depth`, `--seed`, `--out`, `--runs-dir` (a plural or other
    spelling only beside it, as an alias); fit.py's --out is optional wherever it writes figures of runs; ladder.sh
    takes train.py's names too."""
    import core_eval, data, fit, model, train
    parsers = {"train.py": (train.main, []), "core_eval.py": (core_eval.main, []),
               "model.py": (model.main, [])}
    subcommands = next(a for a in fit.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    parsers.update({f"fit.py {sub}": (fit.main, [sub]) for sub in subcommands})
    for name, (main, argv) in parsers.items():
        flags = flags_in_help(main, argv, capsys)
        for synonym, canonical in SAME_THING.items():
            assert synonym not in flags or canonical in flags, f"{name} has {synonym} but not {canonical}"
    for argv in (["curves", "--runs-dir", "x"], ["ladders", "x"], ["loops", "x"]):
        assert fit.build_parser().parse_args(argv).out is None  # optional, a stated default
    for script, parser in dict(core_eval=core_eval.build_parser(), data=data.build_parser(),
                               fit=fit.build_parser(), model=model.build_parser(), train=train.build_parser()).items():
        for prog, options in options_of(parser):
            out = options.get("--out")
            assert out is None or not out.required and "default" in out.help, f"{prog} --out: optional, its default said"
    dry = subprocess.run(["bash", "ladder.sh", "vanilla", "--preset", "cpu", "--depth", "1", "--seed", "3",
                          "--runs-dir", "elsewhere", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr
    assert "--depth 1 --preset cpu --seed 3 --run-name vanilla_d1_s3 --runs-dir elsewhere" in dry.stdout


HEAVY_MODULES = ("torch", "scipy", "pyarrow", "tiktoken")
# the scripts that load torch (1.5-3 s on 2 cores) -> a bad value in front of --help
FAST_HELP = {"train.py": ["--depth", "0"], "core_eval.py": ["--passes", "0"],
             "data.py": ["prepare", "--workers", "0"], "model.py": ["--depth", "0"]}


@pytest.mark.parametrize("script", FAST_HELP)
def test_help_answers_before_torch_loads(script):
    """`--help` (and a subcommand's) prints from the torch-free arms.py and common.py (common.answer_help), the whole
    help; a bad flag in front of --help is still the one-line error, after the script has loaded."""
    argv = [script, *(["prepare"] if script == "data.py" else []), "--help"]
    r = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"usage: {script}"), r.stderr[-2000:]
    loaded = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert not loaded & set(HEAVY_MODULES), f"{script} --help loaded {sorted(loaded & set(HEAVY_MODULES))}"
    assert "--help" in r.stdout and FAST_HELP[script][-2] in r.stdout, r.stdout
    bad = subprocess.run([sys.executable, script, *FAST_HELP[script], "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "error" in bad.stderr, bad.stderr
