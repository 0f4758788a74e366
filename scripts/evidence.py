"""Evidence is data: every table of figures in README.md and docs/ is rebuilt from a committed file.

A claim lives in ``docs/evidence/<claim>/``: small data files (JSON, CSV) and a ``tables.py`` that
turns them into markdown. ``tables.py`` defines ``TABLES: dict[str, Callable[[Path], str]]``; each
callable gets the claim's folder and returns the markdown (a table, a line, or a single figure).

A document embeds a table between two markers, which this script rewrites or checks::

    <!-- evidence: <claim>/<table> -->
    | what | figure |
    |---|---|
    | ... | ... |
    <!-- /evidence -->

A figure inside a sentence works the same way, on one line:
``throughput rose to <!-- evidence: claim/peak -->12,802<!-- /evidence --> tok/s``.

The check is strict about prose as well: a measured figure (a time, a rate, a ratio, a percentage)
outside a marker fails it, in README.md, ``docs/*.md``, ``docs/evidence/*.md`` and a claim folder's
``README.md`` (the other files of a claim folder, such as a study's ``report.md``, are its data). A
figure that is not a measurement (a flag's value, a configured limit or threshold, a spec, a
target) says so with a marker right before it: ``times out after <!-- not measured -->600 s``.
Figures in code (inline or a block) are commands and their output, and are not read.

    python scripts/evidence.py --check     # exit 1 and show what differs (run by the test suite)
    python scripts/evidence.py --write     # rewrite every marked block from its data
    python scripts/evidence.py --write docs/loadgen.md    # only these documents (others may be mid-edit)
    python scripts/evidence.py --list      # every marker, and the claim folders no document uses
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
EVIDENCE = REPO / "docs" / "evidence"
MARKER = re.compile(r"<!-- evidence: (?P<ref>[\w.\-]+/[\w.\-]+) -->(?P<body>.*?)<!-- /evidence -->", re.DOTALL)

Table = Callable[[Path], str]

NOT_MEASURED = "<!-- not measured -->"
"""Put right before a figure that is configured, not measured (a limit, a threshold, a flag's value, a spec)."""
_NUMBER = r"[~≈+−]?\d[\d,]*(?:\.\d+)?"
_UNIT = (r"(?:%"                                                     # a percentage
         r"|×(?! ?(?:<!-- not measured -->)?[A-Z0-9])|x(?![\w])"     # a ratio (not 4×GH200, 2 × 264 B)
         r"|[A-Za-z]+/(?:s|J)\b"                                      # a rate: tok/s, req/s, GB/s, tok/J
         r"|(?:ms|µs|us|ns|s|sec|seconds?|min|minutes?|h|hours?|days?)\b)")  # a time
_SPACE = "[ \u00a0]"  # within a line: a figure never spans two
FIGURE = re.compile(rf"(?<![\w.,/]){_NUMBER}(?:{_SPACE}?[–-]{_SPACE}?{_NUMBER})?{_SPACE}?{_UNIT}"
                    rf"(?:{_SPACE}{_NUMBER}{_SPACE}?(?:s|min)\b)?")       # 1 min 36 s is one figure
"""A measured figure's shape in prose: a number (or a range) with a unit of time, a rate, a ratio or ``%``."""
_CODE_SPAN = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))*`")  # may run over a line break, not a paragraph
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_LINK_TARGET = re.compile(r"\]\([^)\n]*\)")


class EvidenceError(Exception):
    """A marker names a claim or table that does not exist, or a table cannot be built."""


@dataclass(frozen=True)
class Block:
    doc: Path
    ref: str
    body: str
    inline: bool

    @property
    def claim(self) -> str:
        return self.ref.split("/", 1)[0]

    @property
    def table(self) -> str:
        return self.ref.split("/", 1)[1]


def documents(repo: Path = REPO) -> list[Path]:
    docs = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    return [d for d in docs if d.is_file()]


def blocks(doc: Path) -> Iterator[Block]:
    text = doc.read_text(encoding="utf-8")
    for match in MARKER.finditer(text):
        body = match.group("body")
        yield Block(doc=doc, ref=match.group("ref"), body=body, inline="\n" not in body)


def prose_documents(repo: Path = REPO) -> list[Path]:
    """The documents whose prose must back every measured figure: all but a claim folder's data files."""
    evidence = repo / "docs" / "evidence"
    return [d for d in documents(repo)
            if d.parent == evidence or not d.is_relative_to(evidence) or d.name == "README.md"]


def _blank(match: re.Match[str]) -> str:
    """The match's text as spaces (newlines kept), so offsets and line numbers stay where they were."""
    return re.sub(r"[^\n]", " ", match.group(0))


def _prose(text: str) -> str:
    """``text`` with everything that is not prose blanked: marked figures, code, comments, link targets.

    A ``NOT_MEASURED`` marker is kept, so :func:`unbacked` can see which figure it stands before.
    """
    text = MARKER.sub(_blank, text)
    text = _COMMENT.sub(lambda m: m.group(0) if m.group(0) == NOT_MEASURED else _blank(m), text)
    lines, fenced, previous_blank = text.split("\n"), False, True
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced, lines[i] = not fenced, ""
        elif fenced or (line.startswith("    ") and previous_blank):  # a fenced or an indented code block
            lines[i] = ""
        else:
            previous_blank = not line.strip()
            continue
        previous_blank = True
    text = "\n".join(lines)
    return _LINK_TARGET.sub(_blank, _CODE_SPAN.sub(_blank, text))


def unbacked(repo: Path = REPO) -> list[str]:
    """One message per measured figure in prose with no evidence marker (and per stray ``NOT_MEASURED``)."""
    problems: list[str] = []
    for doc in prose_documents(repo):
        text = _prose(doc.read_text(encoding="utf-8"))
        where = doc.relative_to(repo)
        for match in FIGURE.finditer(text):
            if text[:match.start()].rstrip(" ").endswith(NOT_MEASURED):
                continue
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"{where}:{line}: {match.group(0)!r} is a measured figure with no evidence marker. "
                            f"Fix: build it from its data (<!-- evidence: claim/name -->…<!-- /evidence -->, "
                            f"docs/evidence/<claim>/tables.py), withdraw it, or, if it is configured rather "
                            f"than measured, put {NOT_MEASURED} right before it")
        for marker in re.finditer(re.escape(NOT_MEASURED), text):
            after = text[marker.end():]
            if not FIGURE.match(after.lstrip(" ")):
                line = text.count("\n", 0, marker.start()) + 1
                problems.append(f"{where}:{line}: {NOT_MEASURED} is not followed by a figure. "
                                "Fix: put it right before the figure it is about, or remove it")
    return problems


def _load_tables(claim_dir: Path) -> dict[str, Table]:
    path = claim_dir / "tables.py"
    if not path.is_file():
        raise EvidenceError(f"{claim_dir.relative_to(REPO)}: no tables.py. Fix: add one that defines TABLES")
    spec = importlib.util.spec_from_file_location(f"_evidence_{claim_dir.name.replace('-', '_')}", path)
    if spec is None or spec.loader is None:
        raise EvidenceError(f"cannot import {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tables = getattr(module, "TABLES", None)
    if not isinstance(tables, dict):
        raise EvidenceError(f"{path.relative_to(REPO)} defines no TABLES dict. Fix: TABLES = {{'name': func}}")
    return tables


class Builder:
    """Builds each referenced table once, from ``docs/evidence/<claim>/``."""

    def __init__(self, evidence: Path = EVIDENCE) -> None:
        self.evidence = evidence
        self._tables: dict[str, dict[str, Table]] = {}

    def build(self, ref: str) -> str:
        claim, name = ref.split("/", 1)
        folder = self.evidence / claim
        if not folder.is_dir():
            raise EvidenceError(f"evidence {ref}: no folder docs/evidence/{claim}/")
        if claim not in self._tables:
            self._tables[claim] = _load_tables(folder)
        table = self._tables[claim].get(name)
        if table is None:
            known = ", ".join(sorted(self._tables[claim])) or "none"
            raise EvidenceError(f"evidence {ref}: docs/evidence/{claim}/tables.py has no table {name!r} "
                                f"(known: {known})")
        try:
            return table(folder).strip()
        except Exception as exc:  # the data is missing or does not hold what the table reads
            raise EvidenceError(f"evidence {ref}: docs/evidence/{claim}/tables.py failed on its data: "
                                f"{type(exc).__name__}: {exc}") from exc


def _render(block: Block, built: str) -> str:
    return built if block.inline else f"\n{built}\n"


def check(repo: Path = REPO) -> list[str]:
    """One message per marked block whose text differs from what its data builds, and per measured figure
    in prose that no marker backs (empty: all agree)."""
    builder = Builder(repo / "docs" / "evidence")
    problems: list[str] = []
    for doc in documents(repo):
        for block in blocks(doc):
            try:
                want = _render(block, builder.build(block.ref))
            except EvidenceError as exc:
                problems.append(f"{doc.relative_to(repo)}: {exc}")
                continue
            if block.body.strip() != want.strip():
                diff = "\n".join(difflib.unified_diff(block.body.strip().splitlines(), want.strip().splitlines(),
                                                      "in the document", "built from the data", lineterm=""))
                problems.append(f"{doc.relative_to(repo)}: {block.ref} differs from its data "
                                f"(fix: python scripts/evidence.py --write)\n{diff}")
    return problems + unbacked(repo)


def write(repo: Path = REPO, only: Sequence[Path] = ()) -> list[Path]:
    builder = Builder(repo / "docs" / "evidence")
    changed: list[Path] = []
    chosen = {p.resolve() for p in only}
    for doc in documents(repo):
        if chosen and doc.resolve() not in chosen:
            continue
        text = doc.read_text(encoding="utf-8")

        def replace(match: re.Match[str], doc: Path = doc) -> str:
            block = Block(doc=doc, ref=match.group("ref"), body=match.group("body"),
                          inline="\n" not in match.group("body"))
            return f"<!-- evidence: {block.ref} -->{_render(block, builder.build(block.ref))}<!-- /evidence -->"

        new = MARKER.sub(replace, text)
        if new != text:
            doc.write_text(new, encoding="utf-8")
            changed.append(doc)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--list", action="store_true")
    parser.add_argument("docs", nargs="*", type=Path, help="with --write: only these documents")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    if args.write:
        for doc in write(only=args.docs):
            print(f"rewrote {doc.relative_to(REPO)}")
        return 0
    used = set()
    for doc in documents():
        for block in blocks(doc):
            used.add(block.claim)
            print(f"{doc.relative_to(REPO)}: {block.ref}")
    for folder in sorted(p for p in EVIDENCE.iterdir() if p.is_dir()) if EVIDENCE.is_dir() else []:
        if (folder / "tables.py").is_file() and folder.name not in used:
            print(f"unused claim: docs/evidence/{folder.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
