"""The layout of the scripts: imports go one way (no module imports one that imports it back, at module level or
inside a function; no importlib, __import__ or sys.modules tricks), a handful of files none over 900 lines, and no
function over 80 lines outside plotting code."""
import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {os.path.basename(path)[:-3]: path for path in sorted(glob.glob(os.path.join(ROOT, "*.py")))}
MAX_SCRIPTS, MAX_LINES, MAX_FUNCTION_LINES = 14, 900, 80


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


def test_a_handful_of_scripts_none_too_long():
    assert len(SCRIPTS) <= MAX_SCRIPTS, f"{len(SCRIPTS)} top-level scripts: {', '.join(SCRIPTS)}"
    for name, path in SCRIPTS.items():
        with open(path) as f:
            lines = len(f.read().splitlines())
        assert lines <= MAX_LINES, f"{name}.py has {lines} lines"


def plots(function, module_tree):
    """Plotting code may run long: a function in a module that imports matplotlib, or that imports it itself."""
    return "matplotlib" in imported_modules(function) or any(
        isinstance(node, (ast.Import, ast.ImportFrom)) and "matplotlib" in imported_modules(node)
        for node in module_tree.body)


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_no_long_functions_outside_plotting(name):
    tree = parsed(name)
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES and not plots(node, tree)]
    assert not long, f"{name}.py: {', '.join(long)}"
