"""README's commands still run: every `python SCRIPT.py ...` and `bash ladder.sh ...` command in README.md and
docs/*.md names a script, subcommand and flags that exist (checked against the script's own -h), and every
`--dry-run` command among them runs as written (exit 0, nothing trained).

    python -m pytest -q tests/test_readme.py
"""
import functools
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("train.py", "model.py", "data.py", "core_eval.py", "fit.py")
SUBCOMMANDS = {"fit.py": ("ladders", "downstream", "design", "surface", "tpp", "growth", "lr", "loops", "paper", "runs", "curves", "report"),
               "data.py": ("prepare", "verify")}
COMMAND = re.compile(r"(?:[A-Z_]+=\S+ )*(?:python (?:%s)|bash ladder\.sh)[^`\n#]*" % "|".join(map(re.escape, SCRIPTS)))


def documented_commands():
    """(file, command) for every command in README.md and docs/*.md, from code blocks and inline code alike."""
    paths = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                                   if f.endswith(".md"))
    found = set()
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            for match in COMMAND.finditer(f.read()):
                command = match.group(0).strip().rstrip("`").strip()
                if "…" not in command and "|" not in command:  # placeholders, alternatives (a\|b)
                    found.add((path, command))
    return sorted(found)


PLACEHOLDERS = {"A": "untied_grow", "ARCH": "untied_grow", "ARM": "untied_grow", "d": "4", "D": "4", "GIB": "80"}  # `--arch A --depth d`, …


def split(command):
    """-> (env, argv) with env assignments in front peeled off and placeholders filled in."""
    words = [PLACEHOLDERS.get(w, w) for w in shlex.split(command)]
    if len(words) > 2 and words[-2] in (">", ">>"):  # `... --dry-run > plan.jsonl`: the output's file is the shell's
        words = words[:-2]
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


@functools.lru_cache(maxsize=None)
def help_text(*argv):
    out = subprocess.run([sys.executable, *argv, "-h"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{' '.join(argv)} -h failed: {out.stderr[-500:]}"
    return out.stdout


COMMANDS = documented_commands()


def test_readme_documents_commands():
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize("path,command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_documented_command_names_existing_flags(path, command):
    env, words = split(command)
    if words[0] == "bash":
        argv = words[:2]
        flags = [w for w in words[2:words.index("--")] if w.startswith("--")] if "--" in words else \
            [w for w in words[2:] if w.startswith("--")]
        text = subprocess.run(["bash", "ladder.sh", "-h"], cwd=ROOT, capture_output=True, text=True).stdout
    else:
        script = words[1]
        argv = [script]
        if script in SUBCOMMANDS and len(words) > 2 and not words[2].startswith("-") and not words[2].isupper():
            assert words[2] in SUBCOMMANDS[script], f"{path}: {command}: unknown subcommand {words[2]}"
            argv.append(words[2])
        flags = [w.split("=")[0] for w in words[2:] if w.startswith("--")]
        text = help_text(*argv)
    missing = [flag for flag in flags if flag not in text]
    assert not missing, f"{path}: `{command}` uses {missing}, not in `{' '.join(argv)} -h`"


DRY_RUNS = [(p, c) for p, c in COMMANDS if "--dry-run" in c]


@pytest.mark.parametrize("path,command", DRY_RUNS, ids=[c for _, c in DRY_RUNS])
def test_documented_dry_run_runs(path, command):
    env, words = split(command)
    argv = words if words[0] == "bash" else [sys.executable, *words[1:]]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0, f"{path}: `{command}` exited {out.returncode}: {out.stderr[-500:]}"
