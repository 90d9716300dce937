"""The README and the documentation site's pages: every command block says whether it is run (``<!--
run -->`` on the line before it, or ``<!-- run: slow -->`` for a block that takes tens of seconds,
which plain ``pytest`` leaves out: each ``gfsim`` line is run here, in a scratch folder that sees
the repository's ``tests/``, ``docs/`` and ``experiments/``; ``HANG_S`` guards each against a hang
and is no timing) or not (``<!-- no-run: REASON -->``: each ``gfsim`` line's arguments are still
parsed by the command itself, and a script it names must exist); every relative link points at a
file that exists; no page reads outside the repository."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                     if ".api" not in p.parts)]
FENCE = re.compile(r"^```(\w*)")
TAG = re.compile(r"^<!-- (run(?:: slow)?|no-run: (.+)) -->$")
SHELL = ("bash", "sh", "shell", "console")
# A guard against a hang, not a timing: a page's command takes seconds on a quiet machine (the
# slowest, a docs page's tune or counterfactual, about 20 s; a page's Python blocks together
# about 30 s), and on a busy 2-core machine several times that; a 30 s limit per command failed
# five docs tests there.
HANG_S = 600


def blocks(page: Path):
    """(line, tag or None, commands) of each shell block: commands with continuations joined
    and comments dropped."""
    lines = page.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, j = i, i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if m.group(1) in SHELL:
            prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            tag = TAG.match(prev.strip())
            text = "\n".join(lines[start + 1:j]).replace("\\\n", " ")
            cmds = [c.split(" #")[0].strip() for c in text.split("\n")
                    if c.strip() and not c.strip().startswith("#")]
            yield start + 1, tag, cmds
        i = j + 1


ALL = [(p, line, tag, cmds) for p in PAGES for line, tag, cmds in blocks(p)]


def python_blocks(page: Path):
    """(line, code) of each ```python block tagged ``<!-- run -->``: a page's run blocks are
    one program, run in order (a later block uses what an earlier one made)."""
    lines = page.read_text().split("\n")
    out = []
    for i, line in enumerate(lines):
        if line.strip() == "```python":
            prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            if prev.strip() == "<!-- run -->":
                j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
                out.append((i + 1, "\n".join(lines[i + 1:j])))
    return out


PYTHON = [(p, python_blocks(p)) for p in PAGES if python_blocks(p)]


def _id(item):
    page, line = item[0], item[1]
    return f"{page.relative_to(ROOT)}:{line}"


def _gfsim_args(cmd: str) -> list[list[str]]:
    """The gfsim invocations of one shell line (``a && b`` split)."""
    out = []
    for part in re.split(r"\s*&&\s*", cmd):
        words = shlex.split(part)
        if words and words[0] == "gfsim":
            out.append(words[1:])
    return out


def test_every_command_block_is_tagged():
    untagged = [_id(b) for b in ALL if b[2] is None]
    assert untagged == [], "tag each with <!-- run --> or <!-- no-run: REASON -->"
    assert sum(b[2].group(1) == "run" for b in ALL) >= 5  # the tour, at least, runs


def _run_blocks():
    """The run blocks, each list of commands once: the README's tour is also the site's index
    page's, and the same commands run again in the same scratch layout check nothing new."""
    seen, out = set(), []
    for b in ALL:
        if b[2] and b[2].group(1).startswith("run") and tuple(b[3]) not in seen:
            seen.add(tuple(b[3]))
            slow = [pytest.mark.slow] if b[2].group(1) == "run: slow" else []
            out.append(pytest.param(b, id=_id(b), marks=slow))
    return out


RUN = _run_blocks()


@pytest.mark.parametrize("item", RUN)
def test_a_run_block_runs(item, tmp_path):
    for name in ("tests", "docs", "experiments"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "GFSIM_CACHE_DIR": str(tmp_path / ".cache")}
    for cmd in item[3]:
        for args in _gfsim_args(cmd):
            res = subprocess.run([sys.executable, "-m", "gfsim.cli.main", *args], cwd=tmp_path,
                                 capture_output=True, text=True, timeout=HANG_S, env=env)
            assert res.returncode == 0, (cmd, res.stdout[-800:], res.stderr[-800:])


@pytest.mark.parametrize("page, code", PYTHON, ids=lambda x: str(x.relative_to(ROOT))
                         if isinstance(x, Path) else "")
def test_a_pages_python_run_blocks_run_in_order(page, code, tmp_path):
    for name in ("tests", "docs", "experiments"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "GFSIM_CACHE_DIR": str(tmp_path / ".cache"), "MPLBACKEND": "Agg"}
    program = "\n\n".join(f"# {page.name}, line {line}\n{text}" for line, text in code)
    res = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True,
                         text=True, timeout=HANG_S, env=env)
    assert res.returncode == 0, (res.stdout[-1500:], res.stderr[-1500:])


def test_the_python_quickstart_runs_here():
    assert any(p.name == "python-quickstart.md" for p, _ in PYTHON)


@pytest.mark.parametrize("item", [b for b in ALL if b[2] and not b[2].group(1).startswith("run")],
                         ids=_id)
def test_a_block_not_run_still_parses(item):
    import typer

    from gfsim.cli.main import app

    root = typer.main.get_command(app)
    assert item[2].group(2).strip(), "say why the block is not run"
    for cmd in item[3]:
        for args in _gfsim_args(cmd):
            command, rest = root, list(args)
            while hasattr(command, "commands") and rest and rest[0] in command.commands:
                command, rest = command.commands[rest[0]], rest[1:]
            assert not hasattr(command, "commands"), (cmd, "not a command")
            command.make_context(f"gfsim {' '.join(args[:len(args) - len(rest)])}", rest)
        words = shlex.split(cmd.split("&&")[0]) if cmd else []
        for w in words:
            if re.match(r"^(experiments|scripts|tests/data|docs)/[\w./-]+$", w) and \
                    "*" not in w:
                assert (ROOT / w.split(":")[0]).exists(), (cmd, w)


def test_relative_links_point_at_files_and_nothing_reads_outside():
    broken = []
    for page in PAGES:
        text = page.read_text()
        assert "../shared" not in text and "/work/" not in text, page
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_no_file_in_the_repository_points_outside_it():
    out = subprocess.run(["git", "grep", "-l", "-e", "../shared", "-e", "/work/shared",
                          "--", ":!tests/test_docs.py"], cwd=ROOT, capture_output=True,
                         text=True)
    if out.returncode not in (0, 1):
        pytest.skip("not a git checkout")
    assert out.stdout.split() == []
