"""The documentation's commands and links, checked without a GPU.

For README.md and every docs/*.md: each command in a fenced code block (a line that starts with `autotile `,
`autotune `, `python -m autotile...` or `python -m pytest`, possibly after a `$ ` prompt) must run as written
as far as that can be told here:

- `autotile SUB ...` and `autotune ...` parse with the command's real parser (`build_parser`); argparse's
  SystemExit (an unknown subcommand or option, a missing or ill-typed argument) is a failure;
- `python -m autotile` is the `autotile` command itself, and `python -m autotile.tuning.survey` is
  `autotile survey`: both are parsed the same way;
- any other `python -m MODULE` must be importable as a module (`importlib.util.find_spec`) that runs as a
  program (a `__main__` guard, or a package's `__main__` module);
- `python -m pytest ...`: the test files and folders it names exist.

Every relative link of those pages (outside code blocks) must name an existing file, and a `#anchor` in a link
to a page must name one of its headings; README.md stays a first page (200 lines at most).
Nothing here runs a command: parsing only, so it needs neither a GPU nor CuPy, and takes a second or two.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

from autotile.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
COMMAND_START = re.compile(r"^(autotile|autotune)\s|^python -m (autotile\b|pytest\b)")
# A markdown link or image: [text](target) / ![alt](target), the target up to a space (a title may follow).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")

# Placeholders. A fenced command is meant to be copied and run, so most are written with real values; where a
# page keeps a placeholder (`--study-name NAME`, `<gpu>`) argparse reads it as text, which is what a user
# would type there, and the parse is just as telling. Two kinds would fail for the wrong reason and are
# substituted first: `<...>` (angle brackets mean "fill in", not shell redirection) becomes `x`, and an
# all-capitals word given to an option that takes a number (N, S, TRIALS, SECONDS: argparse's int/float)
# becomes `1`. An optional part written `[--seed S]` is prose, not a command, and is reported as a failure
# so that such a line moves out of the code block.
NUMERIC_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
ANGLE_PLACEHOLDER = re.compile(r"<[^<>]*>")


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO))


def _fenced_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line inside a fenced code block, continuation lines (`\\`) joined."""
    out: list[tuple[int, str]] = []
    inside = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            continue
        if pending is not None:
            line = pending[1] + " " + line.strip()
            number = pending[0]
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        out.append((number, line))
    return out


def commands(page: Path) -> list[tuple[int, str]]:
    """The commands a page shows in its code blocks: (line number, the command without a `$ ` prompt)."""
    found = []
    for number, line in _fenced_lines(page):
        text = line.strip()
        if text.startswith("$ "):
            text = text[2:].strip()
        if COMMAND_START.match(text):
            found.append((number, text))
    return found


def _argv(command: str) -> list[str]:
    """The words of a command as a shell would split them, comments dropped, `<...>` placeholders filled."""
    return shlex.split(ANGLE_PLACEHOLDER.sub("x", command), comments=True)


def _numeric_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings, in `parser` and all its subcommands, whose argument argparse converts to a number."""
    found: set[str] = set()
    for action in parser._actions:
        if action.type in (int, float):
            found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _numeric_options(sub)
    return found


def _fill_numbers(words: list[str], numeric: set[str]) -> list[str]:
    out = list(words)
    for i in range(1, len(out)):
        if out[i - 1] in numeric and NUMERIC_PLACEHOLDER.match(out[i]):
            out[i] = "1"
    return out


def _parse_autotile(argv: list[str]) -> str | None:
    """None where `autotile ARGV` parses with the real parser, else why not (argparse's own last line)."""
    parser = build_parser()
    argv = _fill_numbers(argv, _numeric_options(parser))
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0 and {"--version", "--help", "-h"} & set(argv):
            return None  # `autotile --version` or `--help` prints and exits 0: that is what it is for
        lines = said.getvalue().strip().splitlines()
        return f"the parser refused `autotile {shlex.join(argv)}`: {lines[-1] if lines else f'exit {exc.code}'}"
    return None


def _runnable_module(name: str) -> str | None:
    """None where `python -m NAME` finds a module that runs as a program, else why not."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as exc:
        return f"no module {name} ({exc})"
    if spec is None:
        return f"no module {name}"
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        return None if importlib.util.find_spec(name + ".__main__") else f"package {name} has no __main__"
    if spec.origin and spec.origin.endswith(".py") and name.startswith("autotile"):
        if "__name__ == \"__main__\"" not in Path(spec.origin).read_text(encoding="utf-8"):
            return f"module {name} does nothing when run (no `if __name__ == \"__main__\":`)"
    return None


def check_command(command: str) -> str | None:
    """None where the command is fine as far as can be told without a GPU, else what is wrong."""
    try:
        words = _argv(command)
    except ValueError as exc:
        return f"the shell could not split it: {exc}"
    if any(w.startswith("[") for w in words):
        return "it holds an optional part in [brackets]: write it out, or move it to the prose"
    if words[0] == "autotile":
        return _parse_autotile(words[1:])
    if words[0] == "autotune":  # `autotune ARGS` is `autotile tune ARGS` (autotile.cli.main.autotune_main)
        return _parse_autotile(["tune", *words[1:]])
    module, args = words[2], words[3:]
    if module == "autotile":
        return _parse_autotile(args)
    if module == "autotile.tuning.survey":
        return _runnable_module(module) or _parse_autotile(["survey", *args])
    if module == "pytest":
        missing = [a for a in args if not a.startswith("-") and a.startswith("tests")
                   and not (REPO / a.split("::")[0]).exists()]
        return f"no such test path: {', '.join(missing)}" if missing else None
    return _runnable_module(module)


def _all_commands() -> list:
    return [pytest.param(_rel(page), number, command, id=f"{_rel(page)}:{number}")
            for page in PAGES for number, command in commands(page)]


def test_pages_exist_and_show_commands():
    assert (REPO / "README.md").exists()
    assert len(PAGES) > 1, "no docs/*.md pages found"
    assert _all_commands(), "no commands found in any code block: the extraction is broken"


@pytest.mark.parametrize(("page", "line", "command"), _all_commands())
def test_command_runs_as_written(page, line, command):
    problem = check_command(command)
    assert problem is None, f"{page}:{line}: `{command}`: {problem}"


def test_placeholders_and_brackets_are_told_apart():
    # The checker itself: a stale subcommand or option fails, filled placeholders pass.
    assert check_command("autotile tune matmul --shape 4096x4096x4096 --trials 100") is None
    assert check_command("autotile tune matmul --shape 1x1x1 --trials N --seed S") is None
    assert check_command("autotile report-study --storage journal:x --study-name NAME --out <dir>/") is None
    assert check_command("autotune matmul --shape 1x1x1 --devices all") is None
    assert check_command("autotile tune matmul --no-such-option") is not None
    assert check_command("autotile no-such-command") is not None
    assert check_command("python -m autotile.no_such_module") is not None
    assert check_command("python -m autotile.cli.tune") is not None  # importable, but runs nothing
    assert check_command("python -m autotile.cli.bench --random 100 --seed 0") is None
    assert check_command("python -m autotile.cli.bench [--seed S]") is not None


def _prose(page: Path) -> str:
    """The page with its code blocks blanked (line numbers kept): a `[x](y)` in code is not a link."""
    lines, inside = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        fence = bool(FENCE.match(line))
        lines.append("" if inside or fence else line)
        inside = inside != fence
    return "\n".join(lines)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens, and
    -1, -2, ... on repeats."""
    seen: dict[str, int] = {}
    for line in _prose(page).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_point_to_files(page):
    broken = []
    text = _prose(page)
    for match in LINK.finditer(text):
        target = match.group(1)
        number = text.count("\n", 0, match.start()) + 1
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:: not checked here (no network)
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{_rel(page)}:{number}: ({target}) -> {path} does not exist")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{_rel(page)}:{number}: ({target}) -> no heading #{anchor} in {path.name}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_a_first_page():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"
