"""Predict, then verify: the performance model as the study's prior, corrected by every launch.

    table.py       a hardware profile's whole space as a table: every point, the pre-launch verdict,
                   the physics each launch runs (:func:`space_table`)
    steptime.py    the emulated node's step time for many launches at once (numpy; the same seconds
                   as :func:`tuner.perfmodel.step_time`)
    fluid.py       what a closed-loop benchmark measures on each launch: a wave model over the step time
    surface.py     an objective's value under its SLOs, through its ladder (:class:`ObjectiveModel`)
    correction.py  the correction factors refitted after each launch (backend, topology, speculation, node)
    guide.py       the prior's ranking and first picks (:class:`Predictor`); the corrected model's
                   next launch and the chance to beat the winner (:class:`Guide`)
    disagg.py      a prefill/decode layout's figures: two pools and the KV transfer between them (it
                   replaces those rows' figures in the wave model; issue 27)
    trust.py       each launch's residual against the uncertainty the model stated; when to stop trusting it
    explore.py     the next launch once the model is distrusted: a GP on the measurements around the model

Pure code below the study: no Optuna, no I/O. ``tuner.study.guided`` joins it to a study.
"""

from __future__ import annotations

import functools

from tuner.objective import Objective
from tuner.perfmodel import UnknownDeviceError
from tuner.predict import disagg as _disagg  # noqa: F401 - registers the prefill/decode model with the wave model
from tuner.predict.correction import Correction, Factor, Observation, factors_for, fit
from tuner.predict.fluid import Shape, WaveFigures, wave_bench
from tuner.predict.guide import Choice, Guide, Predictor, Ranked
from tuner.predict.surface import ObjectiveModel, PriorUnavailable, Surface, evaluate
from tuner.predict.table import SpaceTable, SpaceTooLarge, space_table
from tuner.search.checkpoints import Checkpoint
from tuner.search.profile import HardwareProfile

__all__ = [
    "Choice",
    "Correction",
    "Factor",
    "Guide",
    "ObjectiveModel",
    "Observation",
    "Predictor",
    "PriorUnavailable",
    "Ranked",
    "Shape",
    "SpaceTable",
    "SpaceTooLarge",
    "Surface",
    "WaveFigures",
    "evaluate",
    "factors_for",
    "fit",
    "predictor_for",
    "space_table",
    "wave_bench",
]


def predictor_for(profile: HardwareProfile, checkpoint: Checkpoint, objective: Objective, *, seed: int = 0
                  ) -> Predictor:
    """The model of a study on ``profile`` serving ``checkpoint`` under ``objective``.

    Raises :class:`PriorUnavailable`, with the reason, where the model cannot predict: a CPU or unknown
    node, a continuous or huge space, an objective that is not a throughput under a random workload.
    """
    return _cached(profile.model_dump_json(), checkpoint.model_dump_json(), objective.model_dump_json(), seed)


@functools.lru_cache(maxsize=4)
def _cached(profile_json: str, checkpoint_json: str, objective_json: str, seed: int) -> Predictor:
    profile = HardwareProfile.model_validate_json(profile_json)
    checkpoint = Checkpoint.model_validate_json(checkpoint_json)
    objective = Objective.model_validate_json(objective_json)
    if profile.hardware.accelerator == "cpu":
        raise PriorUnavailable(f"{profile.name} is a CPU profile; the performance model describes GPU nodes")
    model = ObjectiveModel.from_objective(objective)
    try:
        table = space_table(profile, checkpoint, objective.workload)
    except (SpaceTooLarge, UnknownDeviceError) as exc:
        raise PriorUnavailable(str(exc)) from exc
    return Predictor(table, model, seed=seed)
