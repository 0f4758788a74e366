"""The model-guided study (``--prior model``): the performance model proposes, the launches verify.

:class:`GuidedSearch` joins the study's Optuna side to :mod:`tuner.predict`:

- :meth:`~GuidedSearch.enqueue_prior`: after the recipe baselines, the model's top few configurations
  (diverse: one per topology, MoE kernel, all2all and speculation class) are queued;
- :meth:`~GuidedSearch.before_ask`: when nothing is queued, the corrected model's next proposal
  (largest expected improvement) is queued, so ``TrialStep.propose`` asks it like any other trial;
- :meth:`~GuidedSearch.after_trial`: a finished trial's figures (or its failure class) refit the
  model's correction factors, and the stop estimate (the chance an untried configuration beats the
  winner by more than the noise) is recorded, in ``prediction.json`` and on the trial; so is the
  launch's residual against the uncertainty the model stated for it, and whether the model is still
  trusted (:mod:`tuner.predict.trust`). Once it is not, the guide's proposals are led by the
  measurements (:mod:`tuner.predict.explore`) and the report says after which launch.

Every driver takes it through the study's round (:mod:`tuner.study.round`): the local loop, each
PostgreSQL worker and the Ray driver; ``benchmarks/bench_search.py`` drives the same object with an
in-memory study. The view after each launch is kept in the study (:data:`VIEW_ATTR`), so a shared
study's ``prediction.json`` holds every worker's launches.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner import store
from tuner.failures import FailureClass
from tuner.objective import Objective
from tuner.predict import Guide, Predictor, PriorUnavailable, predictor_for
from tuner.search.checkpoints import Checkpoint
from tuner.search.profile import HardwareProfile
from tuner.search.space import build_config

__all__ = ["PREDICTION_FILE", "STOP_BELOW", "VIEW_ATTR", "GuidedSearch", "load_prediction", "prediction_section",
           "study_history"]

log = logging.getLogger(__name__)

PREDICTION_FILE = "prediction.json"
VIEW_ATTR = "model_view:"
"""Study user attribute prefix of the model's view after each launch (``model_view:000012``): kept in the
study, so that in a shared study every worker's launches are in one history, whoever learnt from them."""
STOP_BELOW = 0.05
"""``--stop-when-done`` ends screening once the chance to beat the winner falls below this."""
PRIOR_PICKS = 3
"""Configurations the prior queues after the baselines."""
MIN_LAUNCHES_BEFORE_STOP = 4


@dataclass
class GuidedSearch:
    """The model-guided search of one study (see the module docstring)."""

    guide: Guide
    profile: HardwareProfile
    path: Path | None = None
    """The study folder (``prediction.json`` goes there); None in a benchmark."""
    seen: set[int] = field(default_factory=set)
    history: list[dict[str, Any]] = field(default_factory=list)
    spread: bool = True
    """Prior picks spread over topology × MoE kernel × batching (False: one per topology, MoE kernel and
    all2all class, as before issue 24; an ablation for the benchmark)."""

    @classmethod
    def build(cls, profile: HardwareProfile, checkpoint: Checkpoint | None, objective: Objective,
              path: Path | None = None, *, seed: int = 0, noise_sd: float = 0.03) -> GuidedSearch:
        """The guided search of a study; raises :class:`~tuner.predict.PriorUnavailable` with the reason."""
        if checkpoint is None:
            raise PriorUnavailable("the model needs a catalogued checkpoint (--checkpoint)")
        predictor = predictor_for(profile, checkpoint, objective, seed=seed)
        return cls(Guide(predictor, noise_sd=noise_sd, seed=seed), profile, path)

    @property
    def predictor(self) -> Predictor:
        return self.guide.predictor

    # -- points and trials ------------------------------------------------------------------------------
    def point_of(self, params: Mapping[str, Any]) -> int | None:
        try:
            key = build_config(self.profile, dict(params)).key()
        except (KeyError, ValueError):
            return None
        return self.predictor.table.index_of.get(key)

    def enqueue_prior(self, ostudy: optuna.Study) -> list[int]:
        """Choose the model's top few (once per study); they are asked after the baselines, one at a time.

        Recorded in the study (``prior_picks``), so a resumed or shared study takes the same ones.
        :meth:`before_ask` queues each when nothing else is queued, unless a launch since has shown it
        would fail the same way (the failure memory): then the corrected model chooses instead.
        """
        if ostudy.user_attrs.get("prior_picks") is not None:
            return []
        baselines = [p for p in (self.point_of(b.values) for b in self.profile.baselines) if p is not None]
        if self.spread:
            picks = self.predictor.spread_top(PRIOR_PICKS, exclude=baselines)
        else:
            picks = [p for p in self.predictor.diverse_top(PRIOR_PICKS + len(baselines)) if p not in baselines]
        picks = picks[:PRIOR_PICKS]
        ostudy.set_user_attr("prior_picks", [dict(self.predictor.table.params[p]) for p in picks])
        log.info("prior: %d configuration(s) predicted best, to follow the baselines", len(picks))
        return picks

    def _next_prior_pick(self, ostudy: optuna.Study) -> tuple[int, int] | None:
        """(rank, point) of the first prior pick not asked yet and not likely to fail; None when none is left."""
        asked = {self.point_of(t.params) for t in ostudy.get_trials(deepcopy=False)}
        for rank, params in enumerate(ostudy.user_attrs.get("prior_picks") or [], start=1):
            point = self.point_of(params)
            if point is None or point in asked:
                continue
            if self.guide.p_fail_of(point) > 0.5:
                log.info("prior: pick %d skipped, a launch since failed the same way", rank)
                continue
            return rank, point
        return None

    def before_ask(self, ostudy: optuna.Study) -> int | None:
        """Queue the next prior pick, else the corrected model's proposal, when nothing is queued; its point."""
        if ostudy.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return None
        self.catch_up(ostudy)
        pick = self._next_prior_pick(ostudy)
        if pick is not None:
            rank, point = pick
            ostudy.enqueue_trial(dict(self.predictor.table.params[point]),
                                 user_attrs={"prior_rank": rank,
                                             "predicted_value": self.predictor.prior_value(point)})
            return point
        exclude = [p for p in (self.point_of(t.params) for t in ostudy.get_trials(
            deepcopy=False, states=(TrialState.RUNNING,))) if p is not None]
        choice = self.guide.next_point(exclude)
        if choice is None:
            return None
        ostudy.enqueue_trial(dict(self.predictor.table.params[choice.point]),
                             user_attrs={"guided": True, "predicted_value": round(choice.predicted, 3),
                                         "expected_improvement": round(choice.expected_improvement, 3),
                                         "p_fail": round(choice.p_fail, 3), "led_by": choice.led_by})
        return choice.point

    def catch_up(self, ostudy: optuna.Study) -> None:
        """Observe every finished trial not seen yet (this worker's and others', resumed ones too)."""
        for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.number not in self.seen:
                self._observe(t)

    def _observe(self, t: FrozenTrial) -> None:
        self.seen.add(t.number)
        attrs = t.user_attrs
        if "duplicate_of" in attrs or attrs.get("launched") is False or attrs.get("confirmation_of") is not None:
            return
        point = self.point_of(t.params)
        if point is None:
            return
        failure = attrs.get("failure_class")
        figures = {"output_tok_s": _number(attrs.get("output_throughput")),
                   "ttft_p95_ms": _number(attrs.get("p95_ttft_ms")),
                   "itl_p95_ms": _number(attrs.get("p95_itl_ms"))}
        concurrency = attrs.get("max_concurrency")
        ran = failure in (None, "", FailureClass.SLO_VIOLATED.value, FailureClass.GUARD_FAILED.value)
        self.guide.observe(point, concurrency=int(concurrency) if ran and concurrency else None,
                           figures=figures if ran else None, value=t.value,
                           feasible=bool(attrs.get("feasible")), failure_class=failure or None)

    def after_trial(self, ostudy: optuna.Study, number: int) -> dict[str, Any]:
        """Observe trial ``number`` (and any other new ones); record the model's view of it and the stop estimate."""
        trial = ostudy.trials[number]
        point = self.point_of(trial.params)
        # What the model said before it saw this launch: the prior, and the prior as corrected so far.
        predicted = self.guide.predicted(point) if point is not None else None
        prior = self.predictor.prior_value(point) if point is not None else None
        seen_residuals = len(self.guide.trust.residuals)
        self.catch_up(ostudy)
        correction = self.guide.refit()
        trust = self.guide.trust
        # The stop estimate is the model's: once the model is distrusted it is neither used nor computed.
        chance = self.guide.chance_to_beat() if trust.trusted else None
        optimum = round(self.guide.predicted_optimum(), 2) if trust.trusted else None
        mine = [r.to_json() for r in trust.residuals[seen_residuals:] if r.point == point]
        entry = {"trial": number, "chance_to_beat": None if chance is None else round(chance, 4),
                 "best_value": self.guide.best_value, "predicted_optimum": optimum,
                 "measured": trial.value if trial.user_attrs.get("feasible") else None,
                 "feasible": bool(trial.user_attrs.get("feasible")),
                 "measured_output_tok_s": _number(trial.user_attrs.get("output_throughput")),
                 "failure_class": trial.user_attrs.get("failure_class"),
                 "predicted_corrected": round(predicted.value, 2) if predicted else None,
                 "predicted_prior": round(prior, 2) if prior is not None else None,
                 "launches": len(self.guide.launches), "correction": correction.table(),
                 "rms_log_error_before": round(correction.rms_before, 4),
                 "rms_log_error_after": round(correction.rms_after, 4),
                 "residual": mine[-1] if mine else None, "trusted": trust.trusted,
                 "distrust_at": trust.distrust_at, "distrust_why": trust.why or None,
                 "led_by": trial.user_attrs.get("led_by")}
        self.history.append(entry)
        ostudy.set_user_attr(f"{VIEW_ATTR}{number:06d}", entry)
        if self.path is not None:
            store.write_json(self.path / PREDICTION_FILE, {"history": study_history(ostudy),
                                                           "objective": self.predictor.objective.describe()})
        return entry

    def distrust_at(self) -> int | None:
        """The launch (1-based, in the guide's order) after which the model was no longer trusted; None: it still is."""
        return self.guide.trust.distrust_at

    def done(self) -> bool:
        """The night is won: enough launches, and the chance to beat the winner below :data:`STOP_BELOW`.

        Never while the model is distrusted: the stop estimate is the model's, and its errors are larger
        than it says."""
        if len(self.guide.launches) < MIN_LAUNCHES_BEFORE_STOP or not self.history or not self.guide.trust.trusted:
            return False
        chance = self.history[-1]["chance_to_beat"]
        return chance is not None and float(chance) < STOP_BELOW


def study_history(ostudy: optuna.Study) -> list[dict[str, Any]]:
    """The model's view after every launch the study learnt from (every worker's, every driver's), in trial order."""
    attrs = ostudy.user_attrs
    return [attrs[key] for key in sorted(key for key in attrs if key.startswith(VIEW_ATTR))]


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if out == out else None


def load_prediction(study_path: Path) -> dict[str, Any] | None:
    """``prediction.json`` of a study run with ``--prior model`` (None without one)."""
    path = study_path / PREDICTION_FILE
    if not path.is_file():
        return None
    data = store.read_json(path)
    return data if isinstance(data, dict) else None


def _percent(value: Any) -> str:
    return "—" if value is None else f"{float(value):.0%}"


def _fmt(value: Any, spec: str = ",.0f") -> str:
    return "—" if value is None else format(float(value), spec)


def prediction_section(study_path: Path, plot: Path | None = None) -> list[str]:
    """The report's "Predict, then verify" section: every launch predicted against measured, the fitted
    correction factors, and the stop estimate over the night (empty without ``--prior model``)."""
    data = load_prediction(study_path)
    if not data or not data.get("history"):
        return []
    history = data["history"]
    lines = ["## Predict, then verify (`--prior model`)", "",
             f"The performance model ranked the space before the first launch ({data.get('objective', '')}). "
             "After each launch it refitted its correction factors; *before launch* is what it predicted for a "
             "trial from the launches before it. *Chance to beat* is, after that launch, the model's "
             "probability that an untried configuration beats the best measured value by more than twice the "
             "noise: `--stop-when-done` stops below 5 %.", ""]
    if plot is not None:
        lines += [f"![predicted against measured]({plot.name})", ""]
    rows = []
    for h in history:
        measured = h.get("measured") if h.get("feasible") else h.get("measured_output_tok_s")
        predicted = h.get("predicted_corrected")
        ratio = (f"{float(measured) / float(predicted):.2f}" if measured and predicted else "—")
        what = "" if h.get("feasible") else (h.get("failure_class") or "infeasible")
        res = h.get("residual") or {}
        z = "—" if res.get("z") is None else f"{float(res['z']):+.1f}"
        if res.get("surprise"):
            z += " (expected to run)"
        sd = "—" if res.get("stated_sd") is None else f"±{float(res['stated_sd']):.0%}"
        trust = "model" if h.get("trusted", True) else "**measurements**"
        rows.append(f"| {h['trial']} | {_fmt(h.get('predicted_prior'))} | {_fmt(predicted)} | {_fmt(measured)} "
                    f"{what} | {ratio} | {sd} | {z} | {trust} | {_percent(h.get('chance_to_beat'))} |")
    lines += ["| trial | predicted, prior | predicted, before launch | measured | measured / predicted | "
              "stated sd | residual / stated sd | next launch led by | chance to beat |",
              "|---|---|---|---|---|---|---|---|---|", *rows, ""]
    distrusted = next((h for h in history if h.get("distrust_at") is not None), None)
    if distrusted is not None:
        why = distrusted.get("distrust_why") or "its residuals exceeded its stated sd"
        lines += [f"**The guide stopped trusting the model after launch {distrusted['distrust_at']}** (trial "
                  f"{distrusted['trial']}): {why}. "
                  "From then on the next launch was chosen by a GP on the measurements around the model "
                  "(`tuner/predict/explore.py`), and `--stop-when-done` does not stop on the model's estimate.", ""]
        spread = [str(h["trial"]) for h in history if h.get("led_by") == "spread"]
        if spread:
            lines += [f"Before the GP refined, the **second spread** measured what the model had no launch for "
                      f"(each competitive topology's speculative gain, and the topologies it never launched): "
                      f"trial{'s' if len(spread) > 1 else ''} {', '.join(spread)}.", ""]
    else:
        lines += ["The guide trusted the model throughout: its residuals stayed within about twice the uncertainty it "
                  "stated.", ""]
    last = history[-1]
    lines += [f"Correction factors after {last['launches']} launch(es) (measured / model speed of each part; "
              f"68 % interval). Throughput log error of the launches: RMS {last['rms_log_error_before']:.3f} "
              f"under the prior, {last['rms_log_error_after']:.3f} corrected.", "",
              "| factor | multiplier | interval | constants |", "|---|---|---|---|"]
    lines += [f"| {c['factor']} | {c['multiplier']} | {c['low']}–{c['high']} | {c['constants']} |"
              for c in last.get("correction", [])]
    return [*lines, ""]
