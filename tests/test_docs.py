"""The README and the help say the same: every option of a run is in the README's table with
the help's default, and every option of ``python -m harness`` has its help text."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run_help() -> dict[str, str]:
    """``pytest collect_tests --help``: the run's options (its group) and their help text."""
    out = subprocess.run([sys.executable, "-m", "pytest", "collect_tests", "--help",
                          "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    group = out.split("collect-node-data: measure kernels on a GPU box:", 1)[1]
    group = group.split("\n\n", 1)[0]
    opts: dict[str, str] = {}
    name = None
    for line in group.splitlines():
        m = re.match(r"  (--[\w-]+)(?:=\S+)?\s*(.*)$", line)
        if m:
            name = m[1]
            opts[name] = m[2]
        elif name is not None:
            opts[name] += " " + line.strip()
    return opts


def _readme_options() -> dict[str, str]:
    """The README's options table: each option (a row may name several) → its default."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Options", 1)[1].split("\n\n", 2)[1]
    rows: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for name in re.findall(r"`(--[\w-]+)`", cells[0]):
            rows[name] = cells[1]
    return rows


def test_every_option_of_a_run_is_in_the_readme_with_the_helps_default() -> None:
    helped, documented = _run_help(), _readme_options()
    assert set(helped) == set(documented), (sorted(set(helped) - set(documented)),
                                            sorted(set(documented) - set(helped)))
    for name, text in helped.items():
        m = re.search(r"\(default:? ([\d.]+)[;)]", text)
        if m:  # a number: the README's default column says the same number
            numbers = re.findall(r"[\d.]+", documented[name])
            assert m[1] in numbers or f"{float(m[1]):g}" in numbers, (name, m[1], documented[name])


def test_the_timeout_default_is_said_alike_in_help_and_readme() -> None:
    from harness.collection import SLACK_PER_JOB_S

    helped, documented = _run_help(), _readme_options()
    said = f"{SLACK_PER_JOB_S:g} s per job and {SLACK_PER_JOB_S:g} s more"  # (jobs + 1) x 80 s
    assert said in helped["--timeout-s"] and said in documented["--timeout-s"]


def test_every_option_of_every_command_has_its_help() -> None:
    from harness.__main__ import build_parser

    def missing(name: str, parser: argparse.ArgumentParser) -> list[str]:
        out = []
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for cmd, p in a.choices.items():
                    out += missing(f"{name} {cmd}".strip(), p)
            if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip():
                out.append(f"{name}: {', '.join(a.option_strings) or a.dest}")
        return out

    parser = build_parser()
    assert missing("", parser) == []
    assert "plan" in parser.parse_args(["plan", "--card", "h200", "--budget-s", "60"]).command
