"""One trial of a study: the step every driver takes (the local loop, a PostgreSQL worker, the Ray driver).

    proposal = step.propose()                        ask Optuna; draw the configuration from the profile
    step.screen(proposal, launched, running)         launched before: told that result, no launch;
                                                     running on another worker: skipped
    step.learn_kv()                                  refit the feasibility model to every launch so far
    control = step.control_for(proposal, launched)   a speculative proposal's no-speculation twin,
                                                     asked as a trial of its own, to launch first
    step.refuse(proposal)                            the pre-launch checks; a refusal is told, with its reason
    outcome = step.launch(proposal, ...)             run_trial (launch, gates, load), recorded and told

A driver composes these in its own loop (where its trials come from, where they run, when it
stops); the drivers differ only there. The Ray driver runs a trial on another node, so it takes
:meth:`TrialStep.begin` before it ships the trial and :meth:`TrialStep.record` when the result
comes back, where the others take :meth:`TrialStep.launch`.

A trial that could not launch, crashed, or missed an SLO is told to Optuna as COMPLETE with its
constraint margins (> 0 = violated) so the constrained sampler learns from it; it is never left out
as FAIL. FAIL is kept for trials the tuner itself abandoned (interrupted), which ``resume`` queues
again, and for trials a worker skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner import store
from tuner.backends.storage import ask_fixed
from tuner.failures import FailureClass
from tuner.objective import Objective, constraint_names, failed_score
from tuner.search.prelaunch import PreLaunch, Refusal
from tuner.search.profile import HardwareProfile
from tuner.search.space import ServeConfig, build_config, suggest
from tuner.trial import TrialContext, TrialOutcome, run_trial

__all__ = ["MAX_DUPLICATES_IN_A_ROW", "Proposal", "TrialStep", "learn_kv"]

log = logging.getLogger(__name__)

MAX_DUPLICATES_IN_A_ROW = 50
"""After this many proposals in a row that were launched already, the space counts as exhausted."""
_BOOKKEEPING_ATTRS = frozenset({"trial_dir", "retry_of", "baseline", "control_for", "interrupted"})
"""Attributes about a trial's place in the study, not about its result: never copied to a duplicate."""
_SUMMARY_ATTRS = ("p95_ttft_ms", "p95_itl_ms", "p95_tpot_ms", "output_throughput", "request_throughput",
                  "request_goodput", "completed", "failed", "max_concurrency", "tokens_per_joule", "usd_per_mtok",
                  "gpu_power_mean_w", "gpu_energy_j")


@dataclass(frozen=True)
class Proposal:
    """An asked Optuna trial and the configuration drawn for it."""

    trial: optuna.Trial
    config: ServeConfig

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def key(self) -> str:
        return self.config.key()


def learn_kv(ostudy: optuna.Study, profile: HardwareProfile, checks: PreLaunch) -> None:
    """Feed ``checks`` the logged KV capacity of every launched trial it has not seen yet.

    A worker calls this before each launch, so it also learns from the other workers' launches.
    """
    for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        tokens = t.user_attrs.get("kv_cache_tokens")
        if (not isinstance(tokens, int) or "duplicate_of" in t.user_attrs
                or t.number in checks.observed_trials):
            continue
        try:
            args = build_config(profile, t.params).args
        except (KeyError, ValueError) as exc:  # params of an older profile: learn from the others
            log.warning("trial %d: its parameters no longer build a configuration (%s); its KV "
                        "capacity is not used for the feasibility fit", t.number, exc)
            checks.observed_trials.add(t.number)
            continue
        checks.observe(args, tokens, t.number)


class TrialStep:
    """The trial step of one study: its folder, hardware profile, objective, Optuna study and context.

    ``prelaunch`` holds the pre-launch checks, with the KV capacity of the launches so far learnt.
    """

    def __init__(self, path: Path, profile: HardwareProfile, objective: Objective, ostudy: optuna.Study,
                 ctx: TrialContext, prelaunch: PreLaunch) -> None:
        self.path = path
        self.profile = profile
        self.objective = objective
        self.ostudy = ostudy
        self.ctx = ctx
        self.prelaunch = prelaunch

    # -- proposing -----------------------------------------------------------------------------------
    def propose(self, trial: optuna.Trial | None = None) -> Proposal:
        """Ask Optuna (or take ``trial``, already asked) and draw its configuration from the profile.

        A draw that raises fails the trial (told FAIL) before the error propagates.
        """
        trial = trial if trial is not None else self.ostudy.ask()
        try:
            config = suggest(self.profile, trial)
        except Exception:
            self.ostudy.tell(trial, state=TrialState.FAIL)
            raise
        return Proposal(trial, config)

    def screen(self, proposal: Proposal, launched: Mapping[str, int],
               running: Mapping[str, int] | None = None) -> str | None:
        """``"duplicate"``: launched before, told that result; ``"running"``: another worker runs it, skipped.

        None: the proposal goes on. ``launched`` maps configuration keys to the trial that took them
        (:func:`~tuner.study.ranking.launched_keys`); ``running``, to other workers' RUNNING trials.
        """
        if proposal.key in launched:
            self.tell_duplicate(proposal, launched[proposal.key])
            return "duplicate"
        if running and proposal.key in running:
            self.skip(proposal, f"running on another worker as trial {running[proposal.key]}")
            return "running"
        return None

    def tell_duplicate(self, proposal: Proposal, original: int) -> None:
        """A configuration already launched: reuse its result instead of launching it again."""
        first = self.ostudy.trials[original]
        for key, value in first.user_attrs.items():
            if key not in _BOOKKEEPING_ATTRS:
                proposal.trial.set_user_attr(key, value)
        proposal.trial.set_user_attr("duplicate_of", original)
        for name, margin in first.constraints.items():
            proposal.trial.set_constraint(name, margin)
        value = first.value if first.value is not None else failed_score(self.objective).value
        self.ostudy.tell(proposal.trial, value)

    def skip(self, proposal: Proposal, reason: str) -> None:
        """Leave a proposal to whoever runs it already: FAIL, with the reason as ``skipped``."""
        proposal.trial.set_user_attr("skipped", reason)
        self.ostudy.tell(proposal.trial, state=TrialState.FAIL)

    def learn_kv(self) -> None:
        """Refit the feasibility model to every launch the study holds (other workers' and resumed ones too)."""
        learn_kv(self.ostudy, self.profile, self.prelaunch)

    def control_for(self, proposal: Proposal, launched: Mapping[str, int],
                    running: Mapping[str, int] | None = None) -> Proposal | None:
        """A speculative proposal's no-speculation control, to launch before it; None when not needed.

        Not needed: the proposal does not speculate, or its control was launched already, or another
        worker runs it now (the proposal's equivalence gate then compares with the reference only). The
        control is created RUNNING with fixed parameters (:func:`~tuner.backends.storage.ask_fixed`),
        not queued and asked: in a shared study another worker could take a queued control, and the
        pair would land on two nodes.
        """
        if not proposal.config.is_speculative:
            return None
        control = proposal.config.control()
        if control.key() in launched:
            return None
        if running and control.key() in running:
            log.info("trial %d: its control runs on another worker as trial %d", proposal.number,
                     running[control.key()])
            return None
        trial = ask_fixed(self.ostudy, control.params, {"control_for": proposal.key})
        return Proposal(trial, suggest(self.profile, trial))

    # -- refusing before launch ------------------------------------------------------------------------
    def refuse(self, proposal: Proposal) -> Refusal | None:
        """The pre-launch checks (feasibility model, the engine's own argument checks); a refusal is told."""
        verdict = self.prelaunch.check(proposal.config, self.ctx)
        if verdict is not None:
            self.tell_pruned(proposal, verdict)
        return verdict

    def tell_pruned(self, proposal: Proposal, verdict: Refusal) -> None:
        """Record a configuration refused before launch; the sampler learns it is infeasible."""
        trial, config = proposal.trial, proposal.config
        tdir = store.trial_dir(self.path, trial.number)
        store.write_json(tdir / "config.json", config.to_json())
        score_ = failed_score(self.objective)
        store.write_json(tdir / "outcome.json", {
            "ok": False, "feasible": False, "launched": False, "failure_class": verdict.failure_class,
            "reason": verdict.reason, "value": score_.value, "constraints": list(score_.constraints),
            "evidence": verdict.evidence, "config_key": config.key(), "trial_dir": str(tdir)})
        trial.set_user_attr("trial_dir", str(tdir.relative_to(self.path)))
        trial.set_user_attr("config_key", config.key())
        trial.set_user_attr("launched", False)
        self._set_constraints(trial, score_.constraints)
        trial.set_user_attr("ok", False)
        trial.set_user_attr("feasible", False)
        trial.set_user_attr("failure_class", verdict.failure_class)
        trial.set_user_attr("reason", verdict.reason[:1000])
        self.ostudy.tell(trial, score_.value)

    # -- launching -------------------------------------------------------------------------------------
    def begin(self, proposal: Proposal) -> Path:
        """Mark the proposal as launching (its folder, key, speculation); return its trial folder."""
        tdir = store.trial_dir(self.path, proposal.number)
        proposal.trial.set_user_attr("trial_dir", str(tdir.relative_to(self.path)))
        proposal.trial.set_user_attr("config_key", proposal.key)
        proposal.trial.set_user_attr("speculative", proposal.config.is_speculative)
        return tdir

    def run_trial(self, ctx: TrialContext, config: ServeConfig, tdir: Path, **kwargs: Any) -> TrialOutcome:
        """:func:`tuner.trial.run_trial`, looked up at call time: tests replace ``tuner.study.step.run_trial``."""
        return run_trial(ctx, config, tdir, **kwargs)

    def launch(self, proposal: Proposal, *, should_stop: Callable[[], bool],
               on_phase: Callable[[str], None] | None = None) -> TrialOutcome:
        """Run the trial here (launch, gates, load), record and tell it, and learn its KV capacity.

        An interrupt (of the tuner, or of the trial by ``should_stop``) marks the trial interrupted and
        FAIL, then propagates as KeyboardInterrupt: ``resume`` queues the trial again.
        """
        tdir = self.begin(proposal)
        trial = proposal.trial
        try:
            outcome = self.run_trial(self.ctx, proposal.config, tdir, should_stop=should_stop, on_phase=on_phase)
        except BaseException:
            try:
                trial.set_user_attr("interrupted", True)
                trial.set_user_attr("failure_class", FailureClass.INTERRUPTED.value)
                self.ostudy.tell(trial, state=TrialState.FAIL)
            except Exception as book_exc:  # e.g. the disk is full: keep the first error, not this one
                log.warning("could not mark trial %d as interrupted (%s); `resume` re-runs it anyway",
                            trial.number, book_exc)
            raise
        if outcome.failure_class == FailureClass.INTERRUPTED.value:
            trial.set_user_attr("interrupted", True)
            trial.set_user_attr("failure_class", outcome.failure_class)
            self.ostudy.tell(trial, state=TrialState.FAIL)
            raise KeyboardInterrupt
        self.record(proposal.trial, outcome)
        self.prelaunch.observe(proposal.config.args, outcome.kv_cache_tokens, proposal.number)
        return outcome

    def interrupted(self, proposal: Proposal) -> None:
        """A proposal abandoned before its launch (its control's launch was interrupted): FAIL, re-queued on resume."""
        proposal.trial.set_user_attr("interrupted", True)
        self.ostudy.tell(proposal.trial, state=TrialState.FAIL)

    def record(self, trial: optuna.Trial, outcome: TrialOutcome) -> None:
        """Tell a launched trial's outcome: its value, its named constraints, and what the table shows."""
        self._set_constraints(trial, outcome.constraints)
        trial.set_user_attr("ok", outcome.ok)
        trial.set_user_attr("feasible", outcome.feasible)
        trial.set_user_attr("failure_class", outcome.failure_class)
        trial.set_user_attr("reason", outcome.reason[:1000])
        trial.set_user_attr("duration_s", round(outcome.duration_s, 2))
        trial.set_user_attr("ready_s", outcome.ready_s)
        if outcome.kv_cache_tokens is not None:
            trial.set_user_attr("kv_cache_tokens", outcome.kv_cache_tokens)
        client = outcome.server_metrics.get("client") or {}
        for flag in ("client_saturated", "client_starved"):  # the chosen step's load generator
            if client.get(flag):
                trial.set_user_attr(flag, True)
        for key in _SUMMARY_ATTRS:
            if key in outcome.summary:
                trial.set_user_attr(key, outcome.summary[key])
        self.ostudy.tell(trial, outcome.value)

    def _set_constraints(self, trial: optuna.Trial, margins: tuple[float, ...]) -> None:
        trial.set_user_attr("constraints", list(margins))
        for name, margin in zip(constraint_names(self.objective), margins, strict=True):
            trial.set_constraint(name, margin)
