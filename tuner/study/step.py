"""One trial of a study: the step every driver takes (the local loop, a PostgreSQL worker, the Ray driver).

    proposal = step.propose()                        ask Optuna; draw the configuration from the profile
    step.screen(proposal, launched, running)         launched before: told that result, no launch;
                                                     running on another worker: skipped
    step.learn_kv()                                  refit the feasibility model to every launch so far
    control = step.control_for(proposal, launched)   a speculative proposal's no-speculation twin,
                                                     asked as a trial of its own, to launch first
    step.refuse(proposal)                            a base that failed to start before, then the pre-launch
                                                     checks; a refusal is told, with its reason
    outcome = step.launch(proposal, ...)             run_trial (launch, gates, load), recorded and told

A driver composes these in its own loop (where its trials come from, where they run, when it
stops); the drivers differ only there. The Ray driver runs a trial on another node, so it takes
:meth:`TrialStep.begin` before it ships the trial and :meth:`TrialStep.record` when the result
comes back, where the others take :meth:`TrialStep.launch`.

A trial that could not launch, crashed, or missed an SLO is told to Optuna as COMPLETE with its
constraint margins (> 0 = violated) so the constrained sampler learns from it; it is never left out
as FAIL. FAIL is kept for trials the tuner itself abandoned (interrupted), which ``resume`` queues
again, and for trials a worker skipped.

A study never spins: the step counts the proposals told without a launch since the last launch
(duplicates, refusals) and raises :class:`~tuner.errors.SearchStalledError` after
:data:`MAX_DUPLICATES_IN_A_ROW` duplicates in a row (the space is exhausted) or
:data:`MAX_REFUSED_IN_A_ROW` proposals in a row without a launch (every proposal is refused: the error
names the commonest reason and what the feasibility model's KV figure rests on). Every driver takes
this step, so every driver stops the same way.

A proposal refused before launch launched nothing, so it gets no trial folder: its record is one
line of ``pruned.jsonl`` in the study folder (configuration, reason, rule, evidence) and its Optuna
trial (``pruned_log`` names the file).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner import store
from tuner.errors import NodeFaultError, SearchStalledError
from tuner.failures import START_FAILURES, FailureClass
from tuner.objective import Objective, constraint_names, failed_score
from tuner.search.feasibility import memory_args
from tuner.search.prelaunch import PreLaunch, Refusal
from tuner.search.profile import DRAFT_TOKENS_PARAM, HardwareProfile
from tuner.search.space import ServeConfig, build_config, suggest
from tuner.study.lessons import CONSTRAINTS_FILE, LeverConstraint, lever_named, node_fault_key, write_constraints
from tuner.study.storage import ask_fixed
from tuner.trial import TrialContext, TrialOutcome, run_trial

__all__ = ["MAX_DUPLICATES_IN_A_ROW", "MAX_REFUSED_IN_A_ROW", "PRUNED_LOG", "Proposal", "TrialStep", "learn_kv"]

log = logging.getLogger(__name__)

MAX_DUPLICATES_IN_A_ROW = 50
"""After this many proposals in a row that were launched already, the space counts as exhausted."""
MAX_REFUSED_IN_A_ROW = 200
"""After this many proposals in a row told without a launch (refused before launch, or duplicates), the
study stops: it spins. A sampled night's longest such run is far shorter (docs/feasibility.md, "A study
never spins")."""
PRUNED_LOG = "pruned.jsonl"
"""One line per proposal refused before launch, in the study folder (pandas: ``read_json(lines=True)``)."""
_BOOKKEEPING_ATTRS = frozenset({"trial_dir", "retry_of", "baseline", "control_for", "interrupted"})
"""Attributes about a trial's place in the study, not about its result: never copied to a duplicate."""
_SUMMARY_ATTRS = ("p95_ttft_ms", "p95_itl_ms", "p95_tpot_ms", "output_throughput", "request_throughput",
                  "request_goodput", "completed", "failed", "max_concurrency", "feasible_concurrencies",
                  "tokens_per_joule", "usd_per_mtok",
                  "gpu_power_mean_w", "gpu_energy_j",
                  # the server's own prompt and decode speeds, apart (llama-server's per-response timings)
                  "median_server_prompt_tok_s", "median_server_decode_tok_s")


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
    """Feed ``checks`` what every launched trial it has not seen yet taught: its logged KV capacity and,
    for one that ran out of memory (at start-up, or serving), a memory lesson.

    A worker calls this before each launch, so it also learns from the other workers' launches.
    """
    for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if "duplicate_of" in t.user_attrs or not t.user_attrs.get("launched", True):
            continue
        tokens = t.user_attrs.get("kv_cache_tokens")
        oom = t.user_attrs.get("failure_class") == FailureClass.OOM.value
        new_kv = isinstance(tokens, int) and t.number not in checks.observed_trials
        new_oom = oom and t.number not in checks.failed_trials
        if not (new_kv or new_oom):
            continue
        try:
            config = build_config(profile, t.params)
        except (KeyError, ValueError) as exc:  # params of an older profile: learn from the others
            log.warning("trial %d: its parameters no longer build a configuration (%s); it is not used by "
                        "the feasibility model", t.number, exc)
            checks.observed_trials.add(t.number)
            checks.failed_trials.add(t.number)
            continue
        if new_kv:
            checks.observe(config.args, tokens if isinstance(tokens, int) else None, t.number)
        if new_oom:
            checks.observe_failure(memory_args(config), FailureClass.OOM.value,
                                   started=t.user_attrs.get("ready_s") is not None, trial=t.number,
                                   evidence=str(t.user_attrs.get("reason", "")))


@dataclass
class _Idle:
    """Proposals told without a launch since the last launch: how many, of which kind, and an example of each."""

    told: int = 0
    duplicates_in_a_row: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    examples: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Kind → (trial number, reason) of its latest proposal."""


class TrialStep:
    """The trial step of one study: its folder, hardware profile, objective, Optuna study and context.

    ``prelaunch`` holds the pre-launch checks, with the KV capacity of the launches so far learnt.
    """

    def __init__(self, path: Path, profile: HardwareProfile, objective: Objective, ostudy: optuna.Study,
                 ctx: TrialContext, prelaunch: PreLaunch, probed: tuple[LeverConstraint, ...] = ()) -> None:
        self.path = path
        self.profile = profile
        self.objective = objective
        self.ostudy = ostudy
        self.ctx = ctx
        self.prelaunch = prelaunch
        self.idle = _Idle()
        self.start_failures: dict[str, tuple[int, str, str]] = {}
        """Base configuration key → (trial, failure class, reason) of a launch of it that never became ready."""
        self.probed: list[LeverConstraint] = list(probed)
        """Lever values a host probe rules out before any launch (:func:`~tuner.study.lessons.probed_constraints`)."""
        self.constraints: dict[tuple[str, str], LeverConstraint] = {}
        """(lever, value) → the hard constraint a probe or a deterministic start failure taught."""
        self.finished_before = frozenset(t.number for t in ostudy.get_trials(deepcopy=False) if t.state.is_finished())
        """Trials told before this session (a resumed study's): only the others can end it as a node fault.
        (Not a count of trials: the baselines the study enqueued are numbered before this session's first launch.)"""
        self._learn_start_failures()  # a resumed study's, and the other workers' so far

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
            self._not_launched(proposal, "duplicate", f"the configuration of trial {launched[proposal.key]}")
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
        """Teach the pre-launch checks every launch the study holds (other workers' and resumed ones too):
        the KV refit, memory lessons, and which base configurations failed to start."""
        learn_kv(self.ostudy, self.profile, self.prelaunch)
        self._learn_start_failures()

    def _learn_start_failures(self) -> None:
        launches = [t for t in self.ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if "duplicate_of" not in t.user_attrs and t.user_attrs.get("launched", True)
                    and t.user_attrs.get("ready_s") is None]
        constraints = {(c.lever, c.value): c for c in self.probed}
        by_message: dict[str, list[optuna.trial.FrozenTrial]] = {}
        for t in launches:
            failure, reason = str(t.user_attrs.get("failure_class", "")), str(t.user_attrs.get("reason", ""))
            learned = lever_named(self.profile, t.params, failure, reason)
            if learned is not None:
                constraints.setdefault((learned.lever, learned.value),
                                       LeverConstraint(learned.lever, learned.value, failure, reason, t.number))
                continue
            key = node_fault_key(failure, reason)
            if key is not None:
                by_message.setdefault(key, []).append(t)
        self.start_failures = {}  # rebuilt: a failure found to be the node's no longer marks its base
        node_faults = {t.number for group in by_message.values() if len(group) > 1
                       and len({self._key_of(t) for t in group}) > 1 for t in group}
        for t in launches:
            if t.number not in node_faults:
                self._note_start_failure(t.number, t.params, t.user_attrs)
        if constraints != self.constraints or not (self.path / CONSTRAINTS_FILE).is_file():
            self.constraints = constraints
            write_constraints(self.path, constraints.values())
        this_session = sorted(n for n in node_faults if n not in self.finished_before)
        if len(this_session) >= 2:
            first = self.ostudy.trials[this_session[0]]
            raise NodeFaultError(
                f"trials {', '.join(map(str, this_session))} share no lever value and failed to start with the same "
                f"message: {first.user_attrs.get('reason', '')}. This is the node's fault, not the flags': the "
                "study stopped. Fix: `dsv4-tune doctor --hw " + self.profile.name + "` checks the host; then "
                "`dsv4-tune resume <study>` goes on")

    def _key_of(self, t: optuna.trial.FrozenTrial) -> str:
        return str(t.user_attrs.get("config_key") or sorted(t.params.items()))

    def lever_refused(self, config: ServeConfig) -> Refusal | None:
        """A refusal when ``config`` holds a lever value a probe or an earlier start failure ruled out."""
        for (lever, value), c in sorted(self.constraints.items()):
            if lever in config.params and str(config.params[lever]) == value:
                return Refusal(c.failure_class, f"not launched: learned constraint: {c.describe()}",
                               {"lever": lever, "value": value, "trial": c.trial}, rule="learned_constraint")
        return None

    def _note_start_failure(self, number: int, params: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        """Remember a launch that never became ready because of its flags, by its base (speculation off)."""
        failure = attrs.get("failure_class")
        if attrs.get("ready_s") is not None or failure not in {c.value for c in START_FAILURES}:
            return
        try:
            config = build_config(self.profile, params)
        except (KeyError, ValueError):
            return
        for base in self.base_keys(config):
            self.start_failures.setdefault(base, (number, str(failure), str(attrs.get("reason", ""))))

    def base_keys(self, config: ServeConfig) -> set[str]:
        """The keys of ``config``'s base: its control (its flags, speculation off) and what the same levers
        give with no draft tokens (a CUDA-graph ceiling derived for 1+k differs between the two)."""
        keys = {config.control().key()}
        if DRAFT_TOKENS_PARAM in config.params:
            with contextlib.suppress(KeyError, ValueError):
                keys.add(build_config(self.profile, {**config.params, DRAFT_TOKENS_PARAM: 0}).key())
        return keys

    def needs_control(self, proposal: Proposal, launched: Mapping[str, int],
                      running: Mapping[str, int] | None = None) -> bool:
        """Whether :meth:`control_for` would launch a control before ``proposal`` (asks nothing of the study)."""
        if not proposal.config.is_speculative:
            return False
        key = proposal.config.control().key()
        return key not in launched and not (running and key in running)

    def control_for(self, proposal: Proposal, launched: Mapping[str, int],
                    running: Mapping[str, int] | None = None) -> Proposal | None:
        """A speculative proposal's no-speculation control, to launch before it; None when not needed.

        Not needed: the proposal does not speculate, or its control was launched already, or another
        worker runs it now (the proposal's equivalence gate then compares with the reference only). The
        control is created RUNNING with fixed parameters (:func:`~tuner.study.storage.ask_fixed`),
        not queued and asked: in a shared study another worker could take a queued control, and the
        pair would land on two nodes.
        """
        if not self.needs_control(proposal, launched, running):
            control_key = proposal.config.control().key() if proposal.config.is_speculative else ""
            if running and control_key in running:
                log.info("trial %d: its control runs on another worker as trial %d", proposal.number,
                         running[control_key])
            return None
        control = proposal.config.control()
        trial = ask_fixed(self.ostudy, control.params, {"control_for": proposal.key})
        return Proposal(trial, suggest(self.profile, trial))

    # -- refusing before launch ------------------------------------------------------------------------
    def refuse(self, proposal: Proposal) -> Refusal | None:
        """Refuse before launch, telling the refusal: a base configuration that failed to start before (the
        twin of a control that hung is not launched), then the pre-launch checks (feasibility model, what
        out-of-memory launches taught, the engine's own argument checks).

        Raises :class:`~tuner.errors.SearchStalledError` once :data:`MAX_REFUSED_IN_A_ROW` proposals in
        a row went without a launch (after telling this one).
        """
        verdict = (self.lever_refused(proposal.config) or self.base_failed(proposal.config)
                   or self.prelaunch.check(proposal.config, self.ctx))
        if verdict is not None:
            self.tell_pruned(proposal, verdict)
            self._not_launched(proposal, verdict.rule or verdict.failure_class, verdict.reason)
        return verdict

    def base_failed(self, config: ServeConfig) -> Refusal | None:
        """A refusal when ``config``'s base (its flags with speculation off) failed to start before.

        The base's own failure (its class and reason) is the refusal's: the same flags fail the same way
        with a draft model on top, and a hang costs the start-up watchdog's time again.
        """
        base = next((key for key in sorted(self.base_keys(config)) if key in self.start_failures), None)
        if base is None:
            return None
        number, failure, reason = self.start_failures[base]
        what = "its control (the same flags, speculation off)" if config.is_speculative else "the same flags"
        return Refusal(failure, f"not launched: {what} failed to start as trial {number} ({failure}): {reason}",
                       {"base_trial": number, "base_key": base}, rule="base_failed_to_start")

    def tell_pruned(self, proposal: Proposal, verdict: Refusal) -> None:
        """Record a configuration refused before launch; the sampler learns it is infeasible.

        It launched nothing, so it gets no folder: one line of :data:`PRUNED_LOG` holds its configuration,
        reason, rule and evidence, and its Optuna trial the rest (``launched`` false).
        """
        trial, config = proposal.trial, proposal.config
        score_ = failed_score(self.objective)
        line = {"number": trial.number, "time": round(time.time(), 3), "config": config.to_json(),
                "failure_class": verdict.failure_class, "rule": verdict.rule, "reason": verdict.reason,
                "evidence": verdict.evidence, "value": score_.value, "constraints": list(score_.constraints)}
        store.append_line(self.path / PRUNED_LOG, json.dumps(line, sort_keys=True, default=str))
        trial.set_user_attr("pruned_log", PRUNED_LOG)
        trial.set_user_attr("config_key", config.key())
        trial.set_user_attr("launched", False)
        self._set_constraints(trial, score_.constraints)
        trial.set_user_attr("ok", False)
        trial.set_user_attr("feasible", False)
        trial.set_user_attr("failure_class", verdict.failure_class)
        trial.set_user_attr("refused_by", verdict.rule)
        trial.set_user_attr("reason", verdict.reason[:1000])
        self.ostudy.tell(trial, score_.value)

    # -- the stop rule -------------------------------------------------------------------------------
    def _not_launched(self, proposal: Proposal, kind: str, reason: str) -> None:
        """Count a proposal told without a launch; raise once the study spins (see the module docstring)."""
        idle = self.idle
        idle.told += 1
        idle.duplicates_in_a_row = idle.duplicates_in_a_row + 1 if kind == "duplicate" else 0
        idle.kinds[kind] += 1
        idle.examples[kind] = (proposal.number, reason)
        counts = dict(idle.kinds.most_common())
        if idle.duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
            raise SearchStalledError(
                f"the search space is exhausted: the sampler proposed {idle.duplicates_in_a_row} configurations "
                "in a row that were told before (launched or refused). Fix: nothing, if the trials so far cover "
                "the space; else widen the hardware profile's levers", kind="exhausted", counts=counts)
        if idle.told >= MAX_REFUSED_IN_A_ROW:
            raise SearchStalledError(self._stall_message(), kind="refused", counts=counts)

    def _stall_message(self) -> str:
        idle = self.idle
        tally = ", ".join(f"{kind} ×{n}" for kind, n in idle.kinds.most_common())
        refusals = [(kind, n) for kind, n in idle.kinds.most_common() if kind != "duplicate"]
        lead = refusals[0][0] if refusals else "duplicate"
        number, reason = idle.examples[lead]
        text = (f"the study stopped: the last {idle.told} proposals were all told without a launch ({tally}), so "
                f"it would spin. Commonest reason, as trial {number} was told: {reason}")
        if self.prelaunch.checkpoint is not None:
            text += f". The feasibility model's KV figure: {self.prelaunch.kv_basis()}"
        fixes = {
            "kv_capacity": "if the fitted KV bytes/token is wrong, look at the launched trials' logged KV capacity "
                           "(trials.csv, kv_cache_tokens) and their server.log; if it is right, the node holds less "
                           "KV than the space assumes: lower max-model-len or widen gpu-memory-utilization",
            "memory": "the weights do not fit the topologies the space offers: offer more parallelism (TP/EP) or "
                      "a smaller checkpoint",
            "learned_oom": "the launches that ran out of memory cover the space: offer lower "
                           "gpu-memory-utilization or max-num-batched-tokens values",
            "base_failed_to_start": "the base configurations fail to start: see those trials' server.log",
            "engine_args": "the engine refuses the space's flags: fix the lever values (`dsv4-tune plan`)",
        }
        fix = fixes.get(lead, "narrow the hardware profile's space to configurations that can launch "
                              "(`dsv4-tune plan` shows what the model prunes)")
        return f"{text}. Fix: {fix}; every refusal is in {self.path / PRUNED_LOG}"

    # -- launching -------------------------------------------------------------------------------------
    def begin(self, proposal: Proposal) -> Path:
        """Mark the proposal as launching (its folder, key, speculation); return its trial folder."""
        self.idle = _Idle()  # a launch ends a run of proposals told without one
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
        self.learn_from(proposal, outcome)
        return outcome

    def learn_from(self, proposal: Proposal, outcome: TrialOutcome) -> None:
        """What this launch teaches the pre-launch checks: its KV capacity, an out-of-memory, a failed start."""
        self.prelaunch.observe(proposal.config.args, outcome.kv_cache_tokens, proposal.number)
        self.prelaunch.observe_failure(memory_args(proposal.config), outcome.failure_class,
                                       started=outcome.ready_s is not None, trial=proposal.number,
                                       evidence=outcome.reason)
        self._learn_start_failures()  # this launch (told by now), with what it shares with the others

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
