"""llama-server's own word on a launch's flags, before a launch: its ``--help``.

llama-server has no dry-run parser, but its ``--help`` lists every option it takes, the allowed values
of the choice options, and the options a build has removed ("the argument has been removed. use ...").
:func:`validate_options` turns a launch's options into argv and checks each flag against that text: a
flag it does not list, or lists as removed, and a value outside a listed choice (``--cache-type-k``,
``--flash-attn``, ``--load-mode``, ``--spec-type``) are problems, each naming the flag and the fix. The
help is read once per program (about 0.1 s).

The text is that of the program dsv4-tune would start by default (``llama-server`` on PATH, else the
packaged build); with ``--engine-cmd`` naming another build, pass ``--prevalidate off`` or install that
build in its place.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tuner.engines.llamacpp.argv import DEFAULT_COMMAND, options_to_argv, resolve_llama_cmd
from tuner.errors import UsageError

__all__ = ["HelpText", "help_text", "validate_options"]

log = logging.getLogger(__name__)

_OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
_REMOVED = "the argument has been removed"
_DESC_COLUMN = 40


@dataclass(frozen=True)
class HelpText:
    """What ``llama-server --help`` says: the flags it takes, those it removed, and the choice lists."""

    flags: frozenset[str]
    removed: dict[str, str]
    choices: dict[str, tuple[str, ...]]


def parse_help(text: str) -> HelpText:
    """The option table of a ``--help`` text (entries start at column 0; descriptions are indented)."""
    entries: list[tuple[list[str], str, str]] = []
    for line in text.splitlines():
        if line.startswith("-"):
            # names and metavars fill the first 40 columns; a description starts there, or on the next line
            split = _DESC_COLUMN if len(line) > _DESC_COLUMN and line[_DESC_COLUMN - 2:_DESC_COLUMN] == "  " \
                else len(line)
            entries.append((_OPTION.findall(line[:split]), line[split:].strip(), line[:split]))
        elif entries and line.startswith(" "):
            names, desc, head = entries[-1]
            entries[-1] = (names, desc + " " + line.strip(), head)
    flags: set[str] = set()
    removed: dict[str, str] = {}
    choices: dict[str, tuple[str, ...]] = {}
    for names, desc, head in entries:
        for name in names:
            if _REMOVED in desc:
                removed[name] = desc.split(_REMOVED, 1)[1].strip(" .")
            else:
                flags.add(name)
        allowed = re.search(r"allowed values: ([\w, .+-]+?)(?:\s*\(default|$)", desc)
        listed = re.search(r"\[(\w+(?:\|[\w+]+)+)\]", head)
        values: tuple[str, ...] = ()
        if allowed:
            values = tuple(v.strip() for v in allowed.group(1).split(",") if v.strip())
        elif listed:
            values = tuple(listed.group(1).split("|"))
        modes = re.findall(r"- ([\w+-]+): ", desc)
        if not values and modes and any(n in ("--load-mode", "--reasoning-format") for n in names):
            values = tuple(modes)
        spec = re.search(r"--spec-type ([\w,-]+)", " ".join(names) + " " + desc)
        if spec and "--spec-type" in names:
            values = tuple(spec.group(1).split(","))
        default = re.search(r"\(default: ([\w+-]+)\)", desc)
        if values and default and default.group(1) not in values:
            values = (*values, default.group(1))
        if values:
            for name in names:
                choices[name] = values
    return HelpText(frozenset(flags), removed, choices)


@lru_cache(maxsize=4)
def help_text(program: str) -> HelpText:
    """``program --help``, parsed (one run per program and process)."""
    out = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=60, check=False,
                         stdin=subprocess.DEVNULL)
    text = out.stdout + out.stderr
    if "--ctx-size" not in text:
        raise UsageError(f"{program} --help did not list llama-server's options (exit code {out.returncode}). "
                         "Fix: point --engine-cmd at llama-server, or pass --prevalidate off")
    spec_line = re.search(r"^--spec-type (\S+)", text, re.M)
    parsed = parse_help(text)
    if spec_line:
        parsed.choices["--spec-type"] = tuple(spec_line.group(1).split(","))
    return parsed


def default_program() -> str | None:
    try:
        return resolve_llama_cmd(DEFAULT_COMMAND)[0]
    except UsageError as exc:
        log.warning("llama-server's own argument checks are off: %s", exc)
        return None


def validate_options(options: Mapping[str, Any], program: str | None = None) -> list[str]:
    """What llama-server's ``--help`` says is wrong with these options (empty: every flag and value listed)."""
    program = program or default_program()
    if program is None:
        return []
    known = help_text(program)
    argv = options_to_argv(options)
    problems: list[str] = []
    for i, word in enumerate(argv):
        if not word.startswith("-") or (i > 0 and argv[i - 1] in known.choices and not word.startswith("--")):
            continue
        if word in known.removed:
            problems.append(f"{word}: this llama-server removed it ({known.removed[word]})")
        elif word not in known.flags and not _is_value(argv, i, known):
            problems.append(f"{word}: not an option of this llama-server (its --help lists no such flag)")
        elif word in known.choices and i + 1 < len(argv) and argv[i + 1] not in known.choices[word]:
            values = argv[i + 1].split(",") if word == "--spec-type" else [argv[i + 1]]
            bad = [v for v in values if v not in known.choices[word]]
            if bad:
                problems.append(f"{word} {argv[i + 1]}: not one of {', '.join(known.choices[word])}")
    return problems


def _is_value(argv: list[str], i: int, known: HelpText) -> bool:
    """A word that starts with '-' but is the value of the flag before it (a negative number)."""
    return i > 0 and argv[i - 1].startswith("--") and re.fullmatch(r"-\d+(\.\d+)?", argv[i]) is not None
