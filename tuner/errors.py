"""One error tree for the whole tool.

Every message says what happened, where the evidence is (a file, a log), and what to do next.
Only the CLI turns these into exit codes and coloured text.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path


class TunerError(Exception):
    """Base of every error dsv4-tune raises on purpose."""


class CatalogError(TunerError):
    """A catalog file (hardware profile, objective, guard, checkpoint) is unreadable or invalid."""

    def __init__(self, file: Path | str, key: str, problem: str, fix: str) -> None:
        self.file = str(file)
        self.key = key
        self.problem = problem
        self.fix = fix
        where = f"{self.file}: {key}" if key else self.file
        super().__init__(f"{where}: {problem}. Fix: {fix}")


class UnknownNameError(TunerError):
    """A hardware profile, objective or guard name that is not in the catalog."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        listing = ", ".join(known) if known else "(none)"
        super().__init__(f"unknown {kind} {name!r}; known: {listing}. Or pass a path to a YAML file.")


class UsageError(TunerError):
    """A command-line value that cannot work (budget of 0, missing model path, ...)."""


class LaunchError(TunerError):
    """The server could not be started or did not become ready."""

    def __init__(self, message: str, *, failure_class: str, log_path: Path | None = None,
                 log_tail: str = "") -> None:
        self.failure_class = failure_class
        self.log_path = log_path
        self.log_tail = log_tail
        where = f" (log: {log_path})" if log_path else ""
        super().__init__(f"{message}{where}")


class PortInUseError(TunerError):
    """The port the user asked for is held by another process."""


class StudyError(TunerError):
    """A study cannot be created, resumed or exported."""


class StudyLockedError(StudyError):
    """Another tuner holds this study's lock."""


class NoFeasibleTrialError(StudyError):
    """Export was asked for, but no trial passed its gates and SLOs."""


class UnconfirmedWinnerError(StudyError):
    """Export was asked for, but no candidate was confirmed (and ``--accept-unconfirmed`` was not given)."""


class NodeFaultError(StudyError):
    """Launches that share no lever value failed with one message: the node's fault, not the flags'.

    The study stops with the message; ``dsv4-tune doctor`` checks the host and ``resume`` goes on once fixed.
    """


class SearchStalledError(StudyError):
    """The search cannot go on: its proposals were all launched before, or all refused before launch.

    ``kind`` is ``exhausted`` (the sampler only proposes configurations already told: the space is
    covered) or ``refused`` (every proposal is pruned or refused before launch: a study that spins).
    """

    def __init__(self, message: str, *, kind: str, counts: dict[str, int]) -> None:
        self.kind = kind
        self.counts = counts
        super().__init__(message)


class NodeMismatchError(StudyError):
    """This node differs from the study's reference node; its results would not be comparable."""


class LoadError(TunerError):
    """The load generator was given inputs it cannot use (a failed request is a record, not this)."""


class DiskFullError(TunerError):
    """A result could not be written: the filesystem is full (or over quota). Nothing was half-written."""

    def __init__(self, path: Path, cause: OSError) -> None:
        self.path = path
        free = _free_bytes(path)
        where = f"{free / 1e6:.1f} MB free" if free is not None else "free space unknown"
        super().__init__(
            f"disk full: {cause.strerror or cause} while writing {path} ({where}). Files already written "
            "and the study database are intact; the file being written was not half-written. Fix: free "
            "space on that filesystem (or use a --runs-dir on a larger one), then `dsv4-tune resume` the study")


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        with contextlib.suppress(OSError):
            if candidate.exists():
                return shutil.disk_usage(candidate).free
    return None


class ProfileRuleError(ValueError):
    """A cross-field rule a hardware profile breaks; ``load_profile`` turns it into a CatalogError at ``key``.

    A ``ValueError``, not a :class:`TunerError`: it is raised inside pydantic validators, which report
    only ValueError and AssertionError, and never leaves :func:`tuner.search.load_profile`.
    """

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(f"{key}: {problem}. Fix: {fix}")
