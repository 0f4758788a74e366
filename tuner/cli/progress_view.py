"""How a running study's progress is printed: one line per event, fitted to a terminal, whole when piped.

On a terminal every line is cut to its width (:meth:`~tuner.study.Progress.describe` drops the least
important parts first), so no line wraps into two. Piped to a file, every line is written whole and never
wrapped, one per event. Nothing is redrawn in place: no carriage return, no cursor movement, on either.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from tuner.study.clock import StudyClock
from tuner.study.progress import Progress, fit_line

__all__ = ["progress_printer"]


def progress_printer(out: Console, start: float, clock: StudyClock | None = None) -> Callable[[Progress], None]:
    """Progress lines on ``out``; with a node clock that runs faster than the wall (the emulated node), times
    are node time. A state already shown (the same stage, trial, phase and counts) is not shown again."""
    last: dict[str, object] = {}
    node = clock is not None and clock.time_scale != 1.0
    unit = "node min" if node else "min"
    origin = clock.now() if clock is not None else start

    def line(text: str, bold_prefix: str = "") -> None:
        width = out.width if out.is_terminal else None
        prefix = f"{bold_prefix} " if bold_prefix else ""
        fitted = fit_line([(text, 0)], None if width is None else max(1, width - len(prefix)))
        styled = f"[bold]{escape(bold_prefix)}[/] " if bold_prefix else ""
        out.print(styled + escape(fitted), soft_wrap=True, highlight=False)

    def show(p: Progress) -> None:
        state = (p.stage, p.trial_number, p.phase, p.launched, p.controls, p.repeat)
        if last.get("state") == state:
            return
        last["state"] = state
        now = clock.now() if clock is not None else time.time()
        elapsed = f"{(now - origin) / 60:.1f} {unit} elapsed"
        if (p.last and p.phase in ("done",)) or (p.phase == "launch" and p.events):
            line(f"  {p.events[-1]}" if p.events else "")
        width = out.width - len(p.study) - 1 if out.is_terminal else None
        line(p.describe(unit, width=width, elapsed=elapsed), bold_prefix=p.study)

    return show
