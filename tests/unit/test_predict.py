"""The prediction room: the vectorised step time is the emulated node's, the wave model agrees with its
scheduler, the ladder chooses as the load generator does, the correction recovers a wrong constant,
and the prior's picks are diverse."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tuner.engines.emulated import BenchmarkShape, predict
from tuner.objective import Objective, Workload
from tuner.perfmodel import NOMINAL, EngineBatch, node_model, perturbed
from tuner.perfmodel import step_time as reference_step_time
from tuner.predict import ObjectiveModel, Observation, Predictor, fit, space_table, wave_bench
from tuner.predict.correction import factors_for
from tuner.predict.steptime import Batch, coefficient_arrays, step_time
from tuner.predict.surface import StepFigures, ladder
from tuner.predict.table import descending
from tuner.search import bind_checkpoint, build_config, load_checkpoint, load_profile

WORKLOAD = Workload(input_len=1024, output_len=1024, num_prompts=64, concurrency=2048)


@pytest.fixture(scope="module")
def gh200() -> tuple[object, object]:
    checkpoint = load_checkpoint("0731")
    profile = bind_checkpoint(load_profile("gh200x4"), checkpoint)
    return profile, space_table(profile, checkpoint, WORKLOAD)


def _objective(**ladder: object) -> Objective:
    return Objective.model_validate({
        "name": "t", "metric": "output_throughput", "slos": {"p95_ttft_ms": 120000, "p95_itl_ms": 1000},
        "workload": WORKLOAD.model_dump(), "ladder": {"steps": [512, 1024, 2048], "prompts_per_concurrency": 2,
                                                      **ladder}})


def test_the_table_holds_every_point_and_prunes_what_does_not_fit(gh200: tuple[object, object]) -> None:
    profile, table = gh200
    assert len(table) == 20736  # docs/search.md's space size for gh200x4
    assert table.prunable.any() and not table.prunable.all()
    # every baseline is a point, launchable, and has its physics
    for base in profile.baselines:  # type: ignore[attr-defined]
        point = table.index_of[build_config(profile, base.values).key()]  # type: ignore[arg-type]
        assert not table.prunable[point] and table.phys_of[point] >= 0


def test_the_vectorised_step_time_is_the_emulated_node_s(gh200: tuple[object, object]) -> None:
    profile, table = gh200
    checkpoint = load_checkpoint("0731")
    rng = random.Random(3)
    rows = rng.sample(range(len(table.physics)), 40)  # type: ignore[attr-defined]
    sub = table.physics.take(np.array(rows))  # type: ignore[attr-defined]
    for coeffs in (NOMINAL, perturbed(5, drop_backend_gain="humming", comm_factor={"all2all": 2.0})):
        ca = coefficient_arrays(sub, coeffs)
        for dec, pre, ctx in ((0, 0, 0), (1, 0, 300), (300, 0, 1500), (300, 4000, 1500), (1000, 0, 5000)):
            fast = Batch(decode_seqs=dec, decode_context_tokens=dec * ctx, decode_attended_tokens=dec * min(ctx, 2048),
                         prefill_seqs=4 if pre else 0, prefill_tokens=pre, prefill_attended_pairs=pre * 512.0)
            other = Batch(decode_seqs=dec, decode_context_tokens=dec * ctx, decode_attended_tokens=dec * min(ctx, 2048))
            for others in (None, other):
                got = step_time(sub, ca, fast, others).total_s
                for i, row in enumerate(rows):
                    cfg = table.physics.configs[row]  # type: ignore[attr-defined]
                    batches = [EngineBatch(decode_seqs=dec, decode_context_tokens=dec * ctx,
                                           decode_attended_tokens=dec * min(ctx, 2048), prefill_seqs=4 if pre else 0,
                                           prefill_tokens=pre, prefill_attended_pairs=pre * 512.0)]
                    rest = batches[0] if others is None else EngineBatch(
                        decode_seqs=dec, decode_context_tokens=dec * ctx, decode_attended_tokens=dec * min(ctx, 2048))
                    want = reference_step_time(node_model(profile, cfg, checkpoint, coeffs),  # type: ignore[arg-type]
                                               batches + [rest] * (cfg.dp - 1)).total_s
                    assert got[i] == pytest.approx(want, rel=1e-9), (cfg.topology_name, dec, pre, ctx)


def test_the_wave_model_agrees_with_the_scheduler_on_the_blog_s_launches(gh200: tuple[object, object]) -> None:
    """blog-dp4-ep at c2048 and blog-tp4 at c2048 (KV-bound, preempting): within 10 % on throughput."""
    profile, table = gh200
    checkpoint = load_checkpoint("0731")
    for name in ("blog-dp4-ep", "blog-tp4"):
        base = next(b for b in profile.baselines if b.name == name)  # type: ignore[attr-defined]
        point = table.index_of[build_config(profile, base.values).key()]  # type: ignore[arg-type]
        row = int(table.phys_of[point])
        sub = table.physics.take(np.array([row]))  # type: ignore[attr-defined]
        model = ObjectiveModel.from_objective(_objective())
        wave = wave_bench(sub, coefficient_arrays(sub, NOMINAL), model.shape(2048))
        sched = predict(profile, table.physics.configs[row], BenchmarkShape(1024, 1024, 2048, 4096),  # type: ignore[arg-type]
                        checkpoint=checkpoint)
        assert wave.output_tok_s[0] == pytest.approx(sched.output_tok_s, rel=0.10), name
        assert wave.ttft_p95_ms[0] == pytest.approx(sched.ttft_p95_ms, rel=0.35), name


def test_the_ladder_stops_at_a_broken_slo_and_reports_the_best_step_that_met_them() -> None:
    model = ObjectiveModel.from_objective(_objective())
    steps = StepFigures(value=np.array([[100.0, 150.0, 300.0], [100.0, 103.0, 200.0], [100.0, 90.0, 80.0]]),
                        concurrency=np.array([[512, 1024, 2048]] * 3),
                        figures={"ttft_p95_ms": np.array([[1e3, 2e3, 2e5], [1e3, 1e3, 1e3], [2e5, 1e3, 1e3]]),
                                 "itl_p95_ms": np.full((3, 3), 50.0), "tpot_mean_ms": np.full((3, 3), 50.0)})
    s = ladder(model, steps)
    assert s.chosen.tolist() == [1, 1, 0]  # an SLO breaks at 2048; no 5 % gain stops the ladder; first step fails
    assert s.feasible.tolist() == [True, True, False]
    assert s.value.tolist() == [150.0, 103.0, 100.0]


def test_the_correction_recovers_a_backend_slower_than_the_model_says(gh200: tuple[object, object]) -> None:
    _, table = gh200
    model = ObjectiveModel.from_objective(_objective())
    truth = perturbed(0, spread=0.0, drop_backend_gain="humming")  # only Humming is wrong: no faster than Marlin
    phys = table.physics  # type: ignore[attr-defined]
    humming = [r for r in range(len(phys)) if phys.moe_field[r] == "moe_mfu_humming" and phys.dp[r] == 4]
    marlin = [r for r in range(len(phys)) if phys.moe_field[r] == "moe_mfu_marlin" and phys.dp[r] == 4]
    rows = np.array(random.Random(1).sample(humming, 3) + random.Random(2).sample(marlin, 3))
    sub = phys.take(rows)
    figs = wave_bench(sub, coefficient_arrays(sub, truth), model.shape(2048))
    obs = [Observation(row=int(r), concurrency=2048, output_tok_s=float(figs.output_tok_s[i]),
                       ttft_p95_ms=float(figs.ttft_p95_ms[i]), itl_p95_ms=float(figs.itl_p95_ms[i]))
           for i, r in enumerate(rows)]
    correction = fit(phys, NOMINAL, model, obs, factors_for(phys))
    factors = {c["factor"]: c["multiplier"] for c in correction.table()}
    assert factors["backend:humming"] < 0.8 < factors["backend:marlin"]  # the missing gain is Humming's
    assert correction.rms_after < correction.rms_before / 3
    # Held-out Humming launches: the corrected model predicts them closer to the truth than the prior did.
    held = np.array(random.Random(7).sample(sorted(set(humming) - set(rows.tolist())), 20))
    sub = phys.take(held)
    true = wave_bench(sub, coefficient_arrays(sub, truth), model.shape(2048)).output_tok_s
    prior = wave_bench(sub, coefficient_arrays(sub, NOMINAL), model.shape(2048)).output_tok_s
    fixed = wave_bench(sub, coefficient_arrays(sub, correction.coefficients(NOMINAL)), model.shape(2048)).output_tok_s
    assert np.median(np.abs(np.log(fixed / true))) < np.median(np.abs(np.log(prior / true))) / 2


def test_the_prior_picks_are_diverse_and_rank_dp_ep_with_humming_first(gh200: tuple[object, object]) -> None:
    _, table = gh200
    predictor = Predictor(table, ObjectiveModel.from_objective(_objective()), pool_draws=2)  # type: ignore[arg-type]
    picks = predictor.diverse_top(3)
    params = [table.params[p] for p in picks]  # type: ignore[attr-defined]
    classes = {(q["topology"], {"auto": "marlin"}.get(str(q.get("moe-backend")), q.get("moe-backend")),
                q.get("all2all-backend"), q.get("speculative.draft_tokens", 0) > 0) for q in params}
    assert len(classes) == 3  # no two of one topology, kernel, all2all and speculation setting
    best = predictor.ranking(top=1)[0]
    assert best.params["topology"] == "dp4-ep" and best.params["moe-backend"] == "humming"
    # the blog's numbers, as the prior predicts them at c2048: TP4 < DP4 + EP < DP4 + EP + Humming
    assert best.value > 15000


def test_equal_values_rank_in_the_table_s_order_on_every_machine() -> None:
    # numpy's default sort reorders equal keys (and how depends on the CPU's SIMD sort): the first launch of a
    # study must not depend on the host that plans it
    values = np.tile(np.array([3.0, 1.0, 2.0, 3.0]), 5000)
    order = descending(values)
    assert np.all(np.diff(values[order]) <= 0)
    for v in (3.0, 2.0, 1.0):
        same = order[values[order] == v]
        assert np.all(np.diff(same) > 0)  # equal values: the earlier index first


def test_the_prior_s_first_pick_among_rows_it_values_alike_is_the_profile_s_first_choice(
        gh200: tuple[object, object]) -> None:
    _, table = gh200
    predictor = Predictor(table, ObjectiveModel.from_objective(_objective()), pool_draws=2)  # type: ignore[arg-type]
    s = predictor.prior_surface
    score = np.where(predictor.usable(s, predictor.base), s.value, -1.0)
    best = predictor.ranking(top=1)[0]
    tied = np.flatnonzero(score == score.max())
    assert tied.size > 1  # the model does not price every lever: rows that differ in one it does not are alike
    assert int(table.phys_of[best.point]) == int(tied.min())  # type: ignore[attr-defined]
