"""Confirmation: after screening, relaunch the top-k with a longer workload, and pick the winner.

The screening trials rank candidates; the top-k are confirmed with a longer workload repeated inside
one launch (at the concurrency its screening ladder chose), and scored by a noise-robust statistic:

    robust score = median − k·MAD        (maximize; median + k·MAD when minimizing)

A candidate whose repeats disagree (spread larger than ``max_spread`` of the median) or whose any
repeat misses an SLO is rejected. The winner is the best *confirmed* candidate, not a lucky single
screening run. A speculative candidate is followed by its no-speculation control, so the winner's
speculative gain is measured under the same conditions. When every challenger confirmed is rejected, the
screening trials next in line are confirmed one at a time (:data:`NEXT_IN_LINE` at most), while they
screened above the best confirmed recipe (:meth:`ConfirmationPhase.next_in_line`). Verdicts are stored in
the Optuna study (``confirmations``), so a killed or resumed study keeps the ones already done and
confirms only the rest. :func:`judge` and :func:`pick_winner` are pure; :class:`ConfirmationPhase` runs the launches.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from pydantic import BaseModel, ConfigDict, Field

from tuner.failures import FailureClass
from tuner.objective import Objective
from tuner.search.profile import HardwareProfile
from tuner.search.space import ServeConfig, build_config
from tuner.study.clock import WALL, StudyClock
from tuner.study.progress import Progress, phase_reporter
from tuner.study.ranking import best_feasible_trial, feasible_trials
from tuner.trial import TrialContext, TrialOutcome

__all__ = ["ConfirmSpec", "Confirmation", "ConfirmationPhase", "RunTrial", "Winner", "close_to_lead",
           "following_in_line", "judge", "mad", "measured_noise", "pick_winner", "robust_score", "with_control",
           "within_noise"]

MAX_REPEATS_WHEN_DONE = 10
"""Repeats per candidate when screening ends early and the rest of the budget goes to confirmation."""
NEXT_IN_LINE = 2
"""Screening trials confirmed one at a time down the ranking once every challenger confirmed was rejected (a
value that screened high on an SLO's edge or on a lucky run is rejected; the next in line may hold)."""
INCUMBENT_BAND = 2.0
"""A baseline that screened within this many times :attr:`ConfirmSpec.noise` of the best baseline is confirmed
beside it: two recipes one screening run apart are told apart by confirmation, not by that run."""


class ConfirmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    top_k: int = Field(default=2, ge=0)
    repeats: int = Field(default=3, ge=1)
    workload_scale: float = Field(default=2.0, gt=0)
    """Confirmation runs send this many times the screening workload's prompts."""
    mad_k: float = Field(default=1.0, ge=0)
    max_spread: float = Field(default=0.25, gt=0)
    """Reject when (max − min) / median of the repeats exceeds this."""
    noise: float = Field(default=0.05, ge=0)
    """The relative noise of one screening value while no confirmation has measured it: a trial within
    this much of the last candidate is confirmed too (the winner must beat it by more than the noise)."""
    incumbent: bool = True
    """Confirm the best baseline that met the SLOs beside the candidates, when it is not one of them, and any
    baseline that screened close to it (:meth:`ConfirmationPhase.incumbents`): the winner then beats the
    recipe in confirmation, not in one screening run (a candidate that screened high once on a noisy node is
    not exported over a recipe it does not beat)."""


@dataclass(frozen=True)
class Confirmation:
    trial: int
    """The screening trial this confirms (Optuna number)."""
    config_key: str
    values: tuple[float, ...]
    median: float
    mad: float
    robust: float
    accepted: bool
    reason: str
    trial_dir: str
    speculative: bool
    control_of: int | None = None
    """Set when this run is the no-speculation control of a speculative candidate."""
    concurrency: int | None = None
    """The node concurrency the repeats ran at (None: the workload's own, no ladder)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation (unscaled)."""
    if not values:
        return float("nan")
    centre = statistics.median(values)
    return float(statistics.median(abs(v - centre) for v in values))


def robust_score(values: Sequence[float], *, k: float, maximize: bool) -> float:
    centre = statistics.median(values)
    spread = mad(values)
    return centre - k * spread if maximize else centre + k * spread


def judge(trial: int, config_key: str, values: Sequence[float], *, all_feasible: bool, spec: ConfirmSpec,
          maximize: bool, trial_dir: str, speculative: bool, failure: str | None = None,
          control_of: int | None = None, violations: str = "", concurrency: int | None = None) -> Confirmation:
    """Score one candidate's repeats and decide whether it is confirmed (``violations``: what a repeat missed)."""
    vals = tuple(float(v) for v in values)
    if failure is not None or not vals:
        return Confirmation(trial, config_key, vals, float("nan"), float("nan"), float("nan"), False,
                            failure or "no measurement", trial_dir, speculative, control_of, concurrency)
    centre = statistics.median(vals)
    spread = mad(vals)
    robust = robust_score(vals, k=spec.mad_k, maximize=maximize)
    rel = (max(vals) - min(vals)) / abs(centre) if centre else float("inf")
    if not all_feasible:
        accepted, reason = False, "a repeat missed an SLO" + (f": {violations}" if violations else "")
    elif len(vals) > 1 and rel > spec.max_spread:
        accepted, reason = False, f"repeats disagree: spread {rel:.0%} of the median > {spec.max_spread:.0%}"
    else:
        accepted, reason = True, f"confirmed: median {centre:.2f}, MAD {spread:.2f}, spread {rel:.0%}"
    return Confirmation(trial, config_key, vals, centre, spread, robust, accepted, reason, trial_dir,
                        speculative, control_of, concurrency)


def pick_winner(confirmations: Sequence[Confirmation], *, maximize: bool,
                incumbent: int | Collection[int] | None = None) -> Confirmation | None:
    """The accepted confirmation with the best robust score (median − k·MAD).

    ``incumbent``: the screening trial(s) of the recipe baselines. Of those confirmed and accepted, the one with
    the best median holds, and a challenger displaces it only when the challenger's robust score beats that
    median by more than its MAD (their spreads do not overlap): a win inside the node's noise keeps the recipe.
    """
    accepted = [c for c in confirmations if c.accepted]
    if not accepted:
        return None
    sign = 1.0 if maximize else -1.0
    best = max(accepted, key=lambda c: sign * c.robust)
    held_by = {incumbent} if isinstance(incumbent, int) else set(incumbent or ())
    holding = [c for c in accepted if c.trial in held_by and c.control_of is None]
    if not holding:
        return best
    held = max(holding, key=lambda c: sign * c.median)
    if best is held:
        return best
    return best if sign * best.robust > sign * held.median + held.mad else held


RunTrial = Callable[..., TrialOutcome]
"""``tuner.trial.run_trial``'s signature; passed in so the driver (and its tests) choose the runner."""


@dataclass(frozen=True)
class Winner:
    """What the study would export, and how far it was confirmed.

    ``status``: ``confirmed`` (its repeats agreed and met the SLOs), ``rejected`` (its confirmation ran
    and was rejected: ``confirmation`` holds the verdict and its repeats), or ``unconfirmed`` (it was
    never judged: confirmation off, out of time, or not run yet). Only a confirmed winner is exported
    without ``--accept-unconfirmed``, unless the study turned confirmation off (``--confirm-top-k 0``).
    """

    trial: int
    trial_dir: Path
    value: float
    confirmed: bool
    confirmation: Confirmation | None
    """This winner's own verdict (accepted, or rejected), if its confirmation ran."""
    all_confirmations: tuple[Confirmation, ...]
    confirmation_off: bool = False
    """The study asked for no confirmation (``top_k`` 0)."""

    @property
    def status(self) -> str:
        if self.confirmed:
            return "confirmed"
        return "rejected" if self.confirmation is not None else "unconfirmed"

    @property
    def control_status(self) -> str | None:
        """A speculative winner's no-speculation control in confirmation: ``confirmed``, ``rejected`` or
        ``not run`` (cut by its time box, or out of time); None when the winner was not confirmed as a
        speculative configuration. The speculative gain the export claims is confirmed only when both were."""
        if self.confirmation is None or not self.confirmation.speculative:
            return None
        control = next((c for c in self.all_confirmations if c.control_of == self.trial), None)
        if control is None:
            return "not run"
        return "confirmed" if control.accepted else "rejected"

    @property
    def rejected(self) -> tuple[Confirmation, ...]:
        """Every rejected confirmation of the study (each with its repeats)."""
        return tuple(c for c in self.all_confirmations if not c.accepted)

    @property
    def exportable_without_consent(self) -> bool:
        """A confirmed winner, or one from a study that asked for no confirmation."""
        return self.confirmed or (self.confirmation_off and self.confirmation is None)

    def describe(self, metric: str) -> str:
        """One line on how far the value is confirmed, with the repeats when a confirmation ran."""
        if self.confirmed and self.confirmation is not None:
            c = self.confirmation
            at = f" at concurrency {c.concurrency}" if c.concurrency else ""
            control = {"not run": "; its no-speculation control's confirmation did not run, so the speculative "
                                  "gain rests on screening",
                       "rejected": "; its no-speculation control's confirmation was rejected, so the speculative "
                                   "gain rests on screening"}.get(self.control_status or "", "")
            return (f"confirmed: median of {len(c.values)} repeats ({_repeats(c)} {metric}){at}, "
                    f"robust score {c.robust:.2f}{control}")
        if self.confirmation is not None:
            c = self.confirmation
            return (f"REJECTED in confirmation: repeats {_repeats(c)} {metric} ({c.reason}); "
                    f"{self.value:.2f} is its single screening run")
        if self.confirmation_off:
            return "UNCONFIRMED: confirmation was off (--confirm-top-k 0); a single screening run"
        others = f"; {len(self.rejected)} other candidate(s) rejected" if self.rejected else ""
        return f"UNCONFIRMED: its confirmation did not run (out of time, or not run yet){others}"

    def refusal(self, study: str, metric: str) -> str:
        """Why this winner is not exported without ``--accept-unconfirmed``, and what to do."""
        lines = [f"study {study!r}: no candidate was confirmed, so no launch file is written."]
        lines.append(f"Best screening trial: trial {self.trial}, {metric} = {self.value:.2f}; "
                     f"{self.describe(metric)}.")
        for c in self.rejected:
            if c is not self.confirmation:
                label = f"trial {c.trial}" + (f" (control of {c.control_of})" if c.control_of is not None else "")
                lines.append(f"Also rejected: {label}: repeats {_repeats(c)} ({c.reason}).")
        label = "labelled with its rejected repeats" if self.rejected else "labelled unconfirmed"
        lines.append(f"Fix: run more or longer confirmations (`dsv4-tune resume {study}` with a --budget), or "
                     f"export it anyway, {label}: `dsv4-tune export {study} --accept-unconfirmed`")
        return "\n".join(lines)


def _int_or_none(value: Any) -> int | None:
    return int(value) if value else None


def _repeats(c: Confirmation) -> str:
    return " / ".join(f"{v:.1f}" for v in c.values) if c.values else "none measured"


def measured_noise(confirmations: Sequence[Confirmation], *, default: float) -> float:
    """The largest relative spread ((max − min) / median) an accepted confirmation measured on this node,
    or ``default`` while none has: how far apart two screening values of one configuration can be."""
    spreads = [(max(c.values) - min(c.values)) / abs(c.median) for c in confirmations
               if c.accepted and len(c.values) > 1 and c.median]
    return max(spreads) if spreads else default


def within_noise(ranked_values: Sequence[float], top_k: int, noise: float) -> int:
    """How many of the ranked screening values go to confirmation: the ``top_k`` best, and every next one
    the last of them does not beat by more than ``noise`` (relative), one more at most (the reserve for
    confirmation is sized on ``top_k``). A winner chosen by less than the noise is no winner: with
    ``top_k`` 1 it and its runner-up are both confirmed. ``top_k`` 0 stays 0 (no confirmation)."""
    if top_k <= 0:
        return 0
    count = min(top_k, len(ranked_values))
    while count < min(top_k + 1, len(ranked_values)):
        last, following = ranked_values[count - 1], ranked_values[count]
        if abs(last - following) > noise * abs(last):
            break
        count += 1
    return count


def close_to_lead(ranked: Sequence[tuple[float, int]], noise: float) -> list[int]:
    """The recipes to confirm (``ranked``: (screening value, id), best first): the first and every other within
    :data:`INCUMBENT_BAND` × ``noise`` of it, relative."""
    if not ranked:
        return []
    lead = ranked[0][0]
    return [i for value, i in ranked if abs(value - lead) <= INCUMBENT_BAND * noise * abs(lead)]


def following_in_line(confirmations: Sequence[Confirmation], ranked: Sequence[tuple[float, int]],
                      recipes: Collection[int], *, maximize: bool) -> int | None:
    """The next screening trial to confirm once every challenger (a candidate that is not one of ``recipes``)
    confirmed so far was rejected (``ranked``: (screening value, id), best first): the best one not confirmed
    yet, when it screened better than the best confirmed recipe's median (one that did not cannot displace it).
    None: a challenger was accepted, none was confirmed yet, or no trial is left that could win."""
    challengers = [c for c in confirmations if c.control_of is None and c.trial not in recipes]
    if not challengers or any(c.accepted for c in challengers):
        return None
    sign = 1.0 if maximize else -1.0
    held = [sign * c.median for c in confirmations if c.accepted and c.trial in recipes and c.control_of is None]
    bar = max(held, default=-math.inf)
    judged = {c.trial for c in confirmations}
    for value, trial in ranked:
        if trial in judged or trial in recipes:
            continue
        return trial if sign * value > bar else None
    return None


def with_control(config: ServeConfig, trial: int) -> list[tuple[ServeConfig, int | None]]:
    """What confirming ``config`` (screening trial ``trial``) launches: it, and its no-speculation control after
    it when it speculates ((configuration, the trial it is the control of))."""
    return [(config, None)] + ([(config.control(), trial)] if config.is_speculative else [])


@dataclass
class ConfirmationPhase:
    """Confirms one study's top-k screening trials; ``path`` is the study folder."""

    path: Path
    spec: ConfirmSpec
    objective: Objective
    profile: HardwareProfile

    @property
    def maximize(self) -> bool:
        return self.objective.direction == "maximize"

    def confirmations(self, study: optuna.Study) -> list[Confirmation]:
        return [Confirmation(**{**c, "values": tuple(c["values"])}) for c in study.user_attrs.get("confirmations", [])]

    def candidates(self, study: optuna.Study) -> list[tuple[int, ServeConfig, int | None]]:
        """Top-k distinct feasible screening trials, then the incumbents (the best baseline that met the SLOs and
        any that screened close to it, :meth:`incumbents`), each speculative one followed by its control."""
        ranked = sorted(feasible_trials(study), key=lambda t: float(t.value or 0.0), reverse=self.maximize)
        noise = measured_noise(self.confirmations(study), default=self.spec.noise)
        top = ranked[: within_noise([float(t.value or 0.0) for t in ranked], self.spec.top_k, noise)]
        if top:
            taken = {t.number for t in top}
            top += [study.trials[n] for n in self.incumbents(study) if n not in taken]
        out: list[tuple[int, ServeConfig, int | None]] = []
        seen: set[str] = set()
        for t in top:
            for config, control_of in with_control(build_config(self.profile, t.params), t.number):
                if config.key() not in seen:
                    out.append((t.number, config, control_of))
                    seen.add(config.key())
        return out

    def incumbents(self, study: optuna.Study) -> list[int]:
        """The baselines to confirm beside the candidates, when the spec confirms them (trial numbers, best
        first): the best baseline that met the SLOs in screening, and every other that screened within
        :data:`INCUMBENT_BAND` × :attr:`ConfirmSpec.noise` of it (on a noisy node the better recipe can screen
        second)."""
        return close_to_lead([(float(t.value or 0.0), t.number) for t in self._baselines(study)], self.spec.noise)

    def next_in_line(self, study: optuna.Study) -> int | None:
        """The next screening trial to confirm once every challenger confirmed so far was rejected
        (:func:`following_in_line` over this study's feasible trials; None: none)."""
        ranked = sorted(feasible_trials(study), key=lambda t: float(t.value or 0.0), reverse=self.maximize)
        return following_in_line(self.confirmations(study), [(float(t.value or 0.0), t.number) for t in ranked],
                                 {t.number for t in self._baselines(study)}, maximize=self.maximize)

    def _baselines(self, study: optuna.Study) -> list[FrozenTrial]:
        """The baselines that met the SLOs in screening, best first (none when the spec confirms no incumbent)."""
        if not self.spec.incumbent:
            return []
        return [t for t in sorted(feasible_trials(study), key=lambda t: float(t.value or 0.0), reverse=self.maximize)
                if t.user_attrs.get("baseline")]

    def reserve_s(self, study: optuna.Study) -> float:
        """Wall time to keep for this phase when deciding whether to screen once more."""
        if self.spec.top_k == 0:
            return 0.0
        finished = [t for t in study.get_trials(deepcopy=False) if "duration_s" in t.user_attrs]
        if not finished:
            return 0.0
        launch = statistics.median(float(t.user_attrs.get("ready_s") or 0.0) for t in finished)
        load = statistics.median(max(0.0, float(t.user_attrs["duration_s"]) - float(t.user_attrs.get("ready_s") or 0.0))
                                 for t in finished)
        per_candidate = launch + load * self.spec.repeats * self.spec.workload_scale
        return per_candidate * self.planned  # controls of speculative candidates, roughly

    @property
    def planned(self) -> float:
        """Confirmation launches to plan for: the top-k, half as many controls again, and the incumbent (a second
        recipe that screened close to the first is not planned for: it is rare, and the reserve is a plan)."""
        return self.spec.top_k * 1.5 + (1.0 if self.spec.incumbent and self.spec.top_k else 0.0)

    def with_budget_for_repeats(self, study: optuna.Study, remaining_s: float | None) -> ConfirmationPhase:
        """This phase with more repeats per candidate, to fill ``remaining_s`` (``--stop-when-done``; at most 10)."""
        reserve = self.reserve_s(study)
        if remaining_s is None or reserve <= 0 or self.spec.top_k == 0:
            return self
        repeats = min(MAX_REPEATS_WHEN_DONE, max(self.spec.repeats, int(self.spec.repeats * remaining_s / reserve)))
        return dataclasses.replace(self, spec=self.spec.model_copy(update={"repeats": repeats}))

    def run(self, study: optuna.Study, ctx: TrialContext, run_trial: RunTrial, progress: Progress,
            on_progress: Callable[[Progress], None], should_stop: Callable[[], bool],
            deadline: float | None = None, clock: StudyClock = WALL) -> None:
        if self.spec.top_k == 0:
            return
        per_candidate_s = self.reserve_s(study) / self.planned
        done = {(c.trial, c.config_key) for c in self.confirmations(study)}
        todo = [(n, c, of) for n, c, of in self.candidates(study) if (n, c.key()) not in done]
        progress.stage, progress.confirm_planned, progress.confirm_done = "confirmation", len(todo), 0

        def time_for_one() -> bool:
            return deadline is None or clock.now() + per_candidate_s <= deadline

        def confirm(number: int, config: ServeConfig, control_of: int | None) -> None:
            screened = study.trials[number]
            concurrency = _int_or_none(screened.user_attrs.get("max_concurrency"))
            missed_slo = self._confirm_at(study, ctx, run_trial, number, config, control_of, concurrency,
                                          progress, on_progress, should_stop, stepped_down=False)
            fallback = self._fallback(screened, concurrency) if missed_slo else None
            if fallback is not None and not should_stop() and time_for_one():
                # The chosen step met its SLOs in screening but not in every repeat here: it sits on an
                # SLO's edge. The next step down that screening measured is confirmed instead
                # (once), so the export names an operating point that holds (docs/decisions.md).
                progress.events.append(f"confirm trial {number}: concurrency {concurrency} missed an SLO in a "
                                       f"repeat; confirming at {fallback}, the next step screening met its SLOs at")
                progress.confirm_planned += 1
                self._confirm_at(study, ctx, run_trial, number, config, control_of, fallback, progress, on_progress,
                                 should_stop, stepped_down=True)

        for number, config, control_of in todo:
            if should_stop():
                continue
            if not time_for_one():
                progress.events.append(f"no time left to confirm trial {number}; its result stays unconfirmed")
                progress.confirm_planned -= 1
                on_progress(progress)
                continue
            confirm(number, config, control_of)
        for _ in range(NEXT_IN_LINE):
            following = self.next_in_line(study)
            if following is None or should_stop():
                break
            if not time_for_one():
                progress.events.append(f"no time left to confirm trial {following}, the next in line")
                on_progress(progress)
                break
            progress.events.append(f"every challenger confirmed so far was rejected; confirming trial {following}, "
                                   "the next in line")
            pairs = with_control(build_config(self.profile, study.trials[following].params), following)
            progress.confirm_planned += len(pairs)
            for each, control_of in pairs:
                if not should_stop():
                    confirm(following, each, control_of)

    def _confirm_at(self, study: optuna.Study, ctx: TrialContext, run_trial: RunTrial, number: int,
                    config: ServeConfig, control_of: int | None, concurrency: int | None, progress: Progress,
                    on_progress: Callable[[Progress], None], should_stop: Callable[[], bool], *,
                    stepped_down: bool) -> bool:
        """One confirmation launch at ``concurrency`` (None: the workload's own); stores its verdict.

        ``stepped_down``: below the step screening chose (its folder then names the concurrency). Returns
        whether the verdict is a rejection only because a repeat missed an SLO.
        """
        suffix = "-control" if control_of is not None else ""
        at = f"-c{concurrency}" if stepped_down else ""
        tdir = self.path / "confirm" / f"{number:04d}{suffix}{at}"
        progress.trial_number = number
        progress.current = f"control of trial {number} (speculation off)" if control_of is not None else (
            f"trial {number}")
        progress.repeat = None
        progress.confirm_running = progress.confirm_done + 1
        progress.phase = f"confirm{suffix}"
        on_progress(progress)
        outcome = run_trial(self._context(ctx, concurrency), config, tdir, should_stop=should_stop,
                            repeats=self.spec.repeats,
                            on_phase=phase_reporter(progress, on_progress, f"confirm{suffix}"))
        if outcome.failure_class == FailureClass.INTERRUPTED.value:
            raise KeyboardInterrupt
        verdict = judge(number, config.key(), outcome.repeat_values, all_feasible=outcome.feasible, spec=self.spec,
                        maximize=self.maximize, trial_dir=str(tdir.relative_to(self.path)),
                        speculative=config.is_speculative,
                        failure=None if outcome.ok else f"{outcome.failure_class}: {outcome.reason[:200]}",
                        control_of=control_of, violations=outcome.reason[:300] if outcome.ok else "",
                        concurrency=concurrency)
        stored = list(study.user_attrs.get("confirmations", []))
        stored.append(verdict.to_json())
        study.set_user_attr("confirmations", stored)
        progress.confirm_done += 1
        progress.repeat = None
        progress.events.append(f"confirm trial {number}{suffix}{at}: {verdict.reason}")
        on_progress(progress)
        return outcome.ok and not outcome.feasible and bool(outcome.repeat_values)

    def _fallback(self, screened: FrozenTrial, concurrency: int | None) -> int | None:
        """The highest step below ``concurrency`` at which the screening ladder met every SLO, if any."""
        if concurrency is None or self.objective.ladder is None:
            return None
        met = [int(c) for c in screened.user_attrs.get("feasible_concurrencies") or () if int(c) < concurrency]
        return max(met, default=None)

    def _context(self, ctx: TrialContext, concurrency: int | None) -> TrialContext:
        """The longer workload, at one step of the screening ladder (not the whole ladder again)."""
        workload = self.objective.workload
        prompts = max(1, round(workload.num_prompts * self.spec.workload_scale))
        longer = workload.model_copy(update={"num_prompts": prompts})
        update: dict[str, Any] = {"workload": longer}
        if concurrency and self.objective.ladder is not None:
            update["ladder"] = self.objective.ladder.model_copy(update={"steps": (concurrency,)})
            update["workload"] = longer.model_copy(update={"concurrency": concurrency})
        return dataclasses.replace(ctx, objective=self.objective.model_copy(update=update))

    def winner(self, study: optuna.Study) -> Winner | None:
        """The best confirmed candidate, else the best feasible screening trial with its own verdict.

        A screening trial whose confirmation was rejected keeps that verdict (and its repeats): it is
        ``rejected``, never merely unconfirmed.
        """
        confirmations = self.confirmations(study)
        off = self.spec.top_k == 0
        chosen = pick_winner(confirmations, maximize=self.maximize,
                             incumbent=[t.number for t in self._baselines(study)])
        if chosen is not None:
            return Winner(trial=chosen.trial, trial_dir=self.path / chosen.trial_dir, value=chosen.median,
                          confirmed=True, confirmation=chosen, all_confirmations=tuple(confirmations),
                          confirmation_off=off)
        best = best_feasible_trial(study)
        if best is None or best.value is None:
            return None
        own = [c for c in confirmations if c.trial == best.number and c.control_of is None]
        return Winner(trial=best.number, trial_dir=self.path / str(best.user_attrs["trial_dir"]), value=best.value,
                      confirmed=False, confirmation=own[-1] if own else None,
                      all_confirmations=tuple(confirmations), confirmation_off=off)
