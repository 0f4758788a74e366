"""Prefill/decode disaggregation (issue 27): the lever, its rules, the launch it builds, its metrics, its model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tuner.engines.emulated.scheduler import Group, Node
from tuner.engines.group import connector_problem, find_router, router_argv, router_problem
from tuner.errors import CatalogError
from tuner.load.buckets import context_edges, ttft_by_context
from tuner.load.generator import RequestRecord
from tuner.load.pools import MEMBER_LABEL, POOL_LABEL, PoolMetrics
from tuner.objective import Workload
from tuner.search import bind_checkpoint, build_config, check, load_checkpoint, load_profile
from tuner.search.pools import kv_transfer_config
from tuner.search.profile import DISAGG_PARAM, TOPOLOGY_PARAM
from tuner.search.space import FixedParams, suggest

LONG = Workload(kind="random", input_len=32768, output_len=1024, range_ratio=0.5, num_prompts=64, concurrency=64)


@pytest.fixture(scope="module")
def h200() -> Any:
    return bind_checkpoint(load_profile("h200x8"), load_checkpoint("0731"))


def _baseline(profile: Any, name: str) -> dict[str, Any]:
    return dict(next(b for b in profile.baselines if b.name == name).values)


def test_the_h200_profile_seeds_4p4d_beside_its_neighbours_and_the_aggregated_recipes(h200: Any) -> None:
    lever = h200.lever(DISAGG_PARAM)
    assert lever is not None and lever.choices == ["aggregated", "4p4d", "2p6d", "6p2d"]
    names = [b.name for b in h200.baselines]
    assert {"recipe-tp8", "recipe-dep", "pd-4p4d", "pd-2p6d", "pd-6p2d"} <= set(names)


def test_a_layout_launches_its_pools_on_their_own_gpus_with_their_own_seats(h200: Any) -> None:
    config = build_config(h200, {**_baseline(h200, "pd-4p4d"), "speculative.draft_tokens": 3})
    launch = config.disaggregation
    assert launch is not None and launch.layout == "4p4d" and launch.connector == "NixlConnector"
    prefill, decode = launch.pool("prefill")[0], launch.pool("decode")[0]
    assert prefill.gpus == (0, 1, 2, 3) and decode.gpus == (4, 5, 6, 7)
    assert prefill.args["tensor-parallel-size"] == 4 and prefill.args["max-num-seqs"] == 16
    assert decode.args["data-parallel-size"] == 4 and decode.args["enable-expert-parallel"] is True
    assert decode.args["max-num-seqs"] == 256 and decode.args["max-num-batched-tokens"] == 2048
    # speculation drafts on the decode pool only; the cudagraph rule sizes each pool's graphs by its own seats
    assert "speculative-config" in decode.args and "speculative-config" not in prefill.args
    assert decode.args["compilation-config"]["max_cudagraph_capture_size"] == 1024
    assert prefill.args["compilation-config"]["max_cudagraph_capture_size"] == 16
    control = config.control()
    assert control.disaggregation is not None
    assert all("speculative-config" not in m.args for m in control.disaggregation.members)
    assert control.key() != config.key()


def test_layouts_are_distinct_launches_and_aggregated_keys_do_not_move(h200: Any) -> None:
    keys = {name: build_config(h200, _baseline(h200, name)).key() for name in ("pd-4p4d", "pd-2p6d", "pd-6p2d")}
    assert len(set(keys.values())) == 3
    # an aggregated launch's identity is what it was before the lever existed (the studies' keys stay valid)
    assert build_config(h200, _baseline(h200, "recipe-dep")).key() == "4ce2907d3fba3944"


def test_a_layout_draws_no_topology_and_aggregated_draws_one(h200: Any) -> None:
    pd = suggest(h200, FixedParams({DISAGG_PARAM: "2p6d"}))
    assert TOPOLOGY_PARAM not in pd.params and "tensor-parallel-size" not in pd.args
    agg = suggest(h200, FixedParams({DISAGG_PARAM: "aggregated", TOPOLOGY_PARAM: "dp8-ep"}))
    assert agg.disaggregation is None and agg.args["data-parallel-size"] == 8


def test_feasibility_judges_each_pool_and_reports_the_decode_pools_knee(h200: Any) -> None:
    ok = check(h200, build_config(h200, _baseline(h200, "pd-4p4d")), load_checkpoint("0731"), LONG)
    assert ok.ok and ok.max_concurrency > 0 and ok.topology.dp == 4
    bad = _with_layouts(h200, {"1p7d": {"prefill": {"topology": "tp1"}, "decode": {"topology": "dp7-ep"}}})
    verdict = check(bad, build_config(bad, {DISAGG_PARAM: "1p7d"}), load_checkpoint("0731"), LONG)
    assert not verdict.ok and verdict.reason.startswith("prefill pool (tp1): does not fit")


def _with_layouts(profile: Any, layouts: dict[str, Any]) -> Any:
    data = profile.model_dump(by_alias=True, exclude_none=True)
    data["disaggregation"]["layouts"] = layouts
    data["baselines"] = []
    return type(profile).model_validate(data)


def _profile_file(tmp_path: Path, layouts: dict[str, Any]) -> Path:
    data = yaml.safe_load((Path(__file__).parents[2] / "search_spaces" / "h200x8.yaml").read_text())
    data["disaggregation"]["layouts"] = layouts
    data["baselines"] = [b for b in data["baselines"] if not b["name"].startswith("pd-")]
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_pools_that_do_not_sum_to_the_node_are_an_error_naming_the_fix(tmp_path: Path) -> None:
    path = _profile_file(tmp_path, {"4p2d": {"prefill": {"topology": "tp4"}, "decode": {"topology": "dp2-ep"}}})
    with pytest.raises(CatalogError) as caught:
        load_profile(str(path))
    text = str(caught.value)
    assert "disaggregation.layouts.4p2d" in text and "use 6 GPUs" in text and "the node has 8" in text
    assert "sum to hardware.device_count (8)" in text


def test_a_pool_topology_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    path = _profile_file(tmp_path, {"x": {"prefill": {"topology": "tp4"}, "decode": {"topology": "pp4"}}})
    with pytest.raises(CatalogError, match=r"disaggregation\.layouts\.x\.decode\.topology"):
        load_profile(str(path))


def test_each_member_gets_its_connector_role_and_the_router_fronts_them(h200: Any) -> None:
    launch = build_config(h200, _baseline(h200, "pd-4p4d")).disaggregation
    assert launch is not None
    prefill, decode = launch.members
    assert kv_transfer_config(launch, prefill) == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    example = type(launch)(layout="1p1d", connector="ExampleConnector", connector_config={}, router="vllm-router",
                           members=launch.members)
    assert kv_transfer_config(example, prefill, {"shared_storage_path": "/x"})["kv_role"] == "kv_producer"
    assert kv_transfer_config(example, decode)["kv_role"] == "kv_consumer"
    argv = router_argv("vllm-router", launch, {"prefill-0": "http://127.0.0.1:1", "decode-0": "http://127.0.0.1:2"},
                       host="127.0.0.1", port=3, metrics_port=4)
    assert "--vllm-pd-disaggregation" in argv
    assert argv[argv.index("--prefill") + 1] == "http://127.0.0.1:1"
    assert argv[argv.index("--decode") + 1] == "http://127.0.0.1:2"
    assert argv[argv.index("--port") + 1] == "3" and argv[argv.index("--host") + 1] == "127.0.0.1"


def test_a_missing_router_and_a_missing_connector_name_their_fix() -> None:
    problem = router_problem("no-such-router-27")
    assert problem is not None and "pip install vllm-router" in problem and "disaggregation.router" in problem
    missing = connector_problem("NixlConnector", [sys.executable, "-m", "vllm.entrypoints.cli.main"])
    if missing is not None:  # nixl is not installed in the test environment (a CPU host)
        assert "'nixl'" in missing and "pip install nixl" in missing and "disaggregation.connector" in missing
    assert connector_problem("ExampleConnector", [sys.executable, "-m", "x"]) is None


def _sample(name: str, pool: str, value: float, **labels: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]],
                                                                        float]:
    merged = {**labels, POOL_LABEL: pool, MEMBER_LABEL: f"{pool}-0", "engine": "0"}
    return (name, tuple(sorted(merged.items()))), value


def test_pool_metrics_read_each_pool_apart_and_the_transfer() -> None:
    from tuner.engines.vllm import VLLM_METRICS

    def page(scale: float) -> dict[Any, float]:
        items = [_sample("vllm:prompt_tokens_total", "prefill", 1000 * scale),
                 _sample("vllm:prompt_tokens_total", "decode", 1000 * scale),
                 _sample("vllm:generation_tokens_total", "prefill", 10 * scale),
                 _sample("vllm:generation_tokens_total", "decode", 500 * scale),
                 _sample("vllm:prefix_cache_queries_total", "decode", 1000 * scale),
                 _sample("vllm:prefix_cache_hits_total", "decode", 0),
                 _sample("vllm:num_preemptions_total", "decode", 0),
                 _sample("vllm:nixl_num_failed_transfers_total", "decode", 0),
                 _sample("vllm:external_prefix_cache_hits_total", "decode", 990 * scale),
                 _sample("vllm:nixl_xfer_time_seconds_count", "decode", 10 * scale),
                 _sample("vllm:nixl_xfer_time_seconds_sum", "decode", 0.05 * scale),
                 _sample("vllm:nixl_xfer_time_seconds_bucket", "decode", 10 * scale, le="0.01"),
                 _sample("vllm:nixl_xfer_time_seconds_bucket", "decode", 10 * scale, le="+Inf")]
        for pool, waited in (("prefill", 2.0), ("decode", 0.2)):
            items += [_sample("vllm:request_queue_time_seconds_bucket", pool, 0, le="0.3"),
                      _sample("vllm:request_queue_time_seconds_bucket", pool, 10 * scale if waited < 1 else 0,
                              le="0.5"),
                      _sample("vllm:request_queue_time_seconds_bucket", pool, 10 * scale, le="2.5"),
                      _sample("vllm:request_queue_time_seconds_bucket", pool, 10 * scale, le="+Inf"),
                      _sample("vllm:request_queue_time_seconds_count", pool, 10 * scale),
                      _sample("vllm:request_queue_time_seconds_sum", pool, waited * 10 * scale)]
        return dict(items)

    gauges = [dict([_sample("vllm:kv_cache_usage_perc", "prefill", 0.1),
                    _sample("vllm:kv_cache_usage_perc", "decode", 0.7),
                    _sample("vllm:num_requests_running", "decode", 40),
                    _sample("vllm:num_requests_waiting", "prefill", 9)])]
    window = PoolMetrics(VLLM_METRICS).window(page(1), page(2), gauges)
    assert window["facts"]["prompt_tokens"] == 1000 and window["facts"]["generation_tokens"] == 500
    assert window["facts"]["kv_usage_max"] == pytest.approx(0.7) and window["facts"]["waiting_max"] == 9
    assert window["queue"]["p95_prefill_queue_ms"] > window["queue"]["p95_queue_ms"]
    assert window["pools"]["prefill"]["facts"]["kv_usage_max"] == pytest.approx(0.1)
    transfer = window["transfer"]
    assert transfer["transfers"] == 10 and transfer["failed_transfers"] == 0
    assert transfer["mean_transfer_ms"] == pytest.approx(5.0) and transfer["external_prefix_cache_hits"] == 990


def test_ttft_per_context_bucket_splits_the_prompt_range() -> None:
    assert context_edges(LONG) == (27307, 38229)
    assert context_edges(Workload(kind="random", input_len=1024, output_len=8)) == ()
    records = [RequestRecord(ok=True, error="", prompt_tokens=n, output_tokens=4, start_s=0.0, ttft_s=t,
                             itl_s=(), e2e_s=t + 1) for n, t in ((20000, 1.0), (30000, 2.0), (45000, 4.0))]
    buckets = ttft_by_context(records, context_edges(LONG))
    assert [b["requests"] for b in buckets] == [1, 1, 1]
    assert [b["p95_ttft_ms"] for b in buckets] == [1000.0, 2000.0, 4000.0]


class _Quiet:
    def __init__(self) -> None:
        self.counts: dict[str, float] = {}

    def count(self, engine: int, name: str, amount: float, labels: Any = ()) -> None:
        self.counts[name] = self.counts.get(name, 0.0) + amount

    def observe(self, engine: int, name: str, value: float, weight: int) -> None:
        pass

    def gauge(self, engine: int, name: str, value: float) -> None:
        pass


def test_an_emulated_decode_member_receives_the_prompt_and_computes_only_its_last_token() -> None:
    from tuner.perfmodel import NOMINAL, EmulatedConfig, node_model, node_spec

    profile = load_profile("h200x8")
    config = EmulatedConfig.from_options({"data-parallel-size": 1, "tensor-parallel-size": 4, "block-size": 256,
                                          "max-num-batched-tokens": 2048, "kv-cache-dtype": "fp8"})
    model = node_model(profile, config, load_checkpoint("0731"), NOMINAL, node_spec(profile))
    observer = _Quiet()
    node = Node(model, 10_000, observer)
    remote = Group(1, 1, 30_000, 4, 0.0)
    remote.remote_tokens = 29_999
    node.submit(remote)
    step = node.plan(0.0)
    assert step is not None and step.batches[0].prefill_tokens == 1  # not 30,000: the KV came over the link
    node.apply(step)
    assert remote.first_token_v is not None and remote.computed == 30_000
    assert observer.counts["vllm:external_prefix_cache_hits"] == 29_999
    assert observer.counts["vllm:prefix_cache_hits"] == 0
    local = Group(2, 1, 30_000, 4, node.now_v)
    node.submit(local)
    step = node.plan(node.now_v)
    assert step is not None and step.batches[0].prefill_tokens > 1000  # a local prompt is prefilled in chunks


def test_the_prior_ranks_layouts_and_more_prefill_serves_more_prompts(h200: Any) -> None:
    from tuner.perfmodel import NOMINAL
    from tuner.predict import space_table
    from tuner.predict.disagg import pd_bench
    from tuner.predict.fluid import Shape
    from tuner.predict.steptime import coefficient_arrays

    small = _reduced(h200)
    table = space_table(small, load_checkpoint("0731"), LONG)
    assert table.physics.pd is not None and len(table.physics.pd.rows) == 3  # one row per layout
    pd_rows = table.physics.take(table.physics.pd.rows)
    figures, pools = pd_bench(pd_rows, coefficient_arrays(pd_rows, NOMINAL), Shape(32768, 1024, 64, 128))
    layouts = [table.physics.configs[int(r)] for r in table.physics.pd.rows]
    by_prefill = dict(zip([c.dp for c in layouts], pools.prefill_rate, strict=True))
    # 6p2d (decode dp2) has three times the prefill engines of 2p6d (decode dp6)
    assert by_prefill[2] > 2.0 * by_prefill[6]
    assert np.all(figures.itl_p95_ms < 200) and np.all(figures.output_tok_s > 0)
    # the wave model's figures of those rows are the layout model's (the overlay is registered)
    from tuner.predict import wave_bench
    via_wave = wave_bench(table.physics, coefficient_arrays(table.physics, NOMINAL), Shape(32768, 1024, 64, 128))
    assert np.allclose(via_wave.output_tok_s[table.physics.pd.rows], figures.output_tok_s)


def _reduced(profile: Any) -> Any:
    """h200x8 with one value per shared lever: the layouts and a few aggregated topologies."""
    data = profile.model_dump(by_alias=True, exclude_none=True)
    for lever in data["levers"].values():
        if lever.get("choices"):
            lever["choices"] = lever["choices"][:1]
            lever.pop("env_for", None)
    data["topology"] = {"choices": ["tp8", "dp8-ep"]}
    data["speculative"]["draft_tokens"]["choices"] = [0]
    data["baselines"] = []
    return type(profile).model_validate(data)


def test_export_writes_a_launch_for_every_member_and_the_routers_command(h200: Any, tmp_path: Path) -> None:
    import subprocess
    from types import SimpleNamespace

    from tuner.engines import VllmEngine
    from tuner.export import _write_pools

    config = build_config(h200, _baseline(h200, "pd-4p4d"))
    assert config.disaggregation is not None
    study = SimpleNamespace(profile=h200, engine=VllmEngine(),
                            record=SimpleNamespace(name="night", server_cmd="vllm"))
    _write_pools(tmp_path, study, config.to_json()["disaggregation"], "# head\n", "head", {"A": "1"},  # type: ignore[arg-type]
                 "deepseek-ai/DeepSeek-V4-Flash-0731", "dsv4")
    prefill = yaml.safe_load((tmp_path / "members" / "prefill-0.yaml").read_text())
    decode = yaml.safe_load((tmp_path / "members" / "decode-0.yaml").read_text())
    assert prefill["port"] == 8100 and prefill["tensor-parallel-size"] == 4
    assert prefill["kv-transfer-config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert decode["port"] == 8200 and decode["kv-transfer-config"]["kv_role"] == "kv_consumer"
    member_sh = (tmp_path / "members" / "decode-0.sh").read_text()
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in member_sh and '"$here/decode-0.yaml"' in member_sh
    router = (tmp_path / "router.sh").read_text()
    assert "--vllm-pd-disaggregation" in router and "--prefill http://127.0.0.1:8100" in router
    assert "--decode http://127.0.0.1:8200" in router and "--port 8000" in router
    serve = (tmp_path / "serve.sh").read_text()
    assert "members/prefill-0.sh" in serve and "members/decode-0.sh" in serve and "router.sh" in serve
    assert not (tmp_path / "profile.yaml").exists()
    for script in ("serve.sh", "router.sh", "members/prefill-0.sh"):
        subprocess.run(["bash", "-n", str(tmp_path / script)], check=True)


def test_a_baseline_without_a_layout_is_enqueued_as_one_server(h200: Any) -> None:
    """Enqueued with its values, a baseline's missing parameter is drawn by the sampler: a one-server recipe must
    say ``aggregated`` (a rehearsal launched recipe-tp8 as a random layout before it did)."""
    import optuna

    from tuner.study.storage import ask_fixed

    values = _baseline(h200, "recipe-tp8")
    assert values[DISAGG_PARAM] == "aggregated"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(5):
        config = suggest(h200, ask_fixed(study, values, {}))
        assert config.disaggregation is None and config.args["tensor-parallel-size"] == 8


def test_a_dead_members_line_is_its_error_not_its_shutdown_noise() -> None:
    from tuner.engines.group import last_line

    log = ("(Worker pid=1) ERROR [multiproc_executor.py:1063] RuntimeError: shape mismatch: value tensor of shape "
           "[608, 2, 128] cannot be broadcast\n(EngineCore pid=2) ERROR EngineCore encountered a fatal error.\n"
           "  warnings.warn('resource_tracker: There appear to be %d '\n")
    assert "RuntimeError: shape mismatch" in last_line(log)
    assert last_line("INFO ready\nINFO stopping\n") == "INFO stopping"


def test_doctor_names_a_missing_router_and_connector_before_the_night(tmp_path: Path) -> None:
    from tuner.search.preflight import Device, HostProbe, check_host

    gpus = [Device("NVIDIA H200", 141.0)] * 8
    bare = HostProbe(nvidia_devices=lambda: gpus, engine_version=lambda _e: "0.32.0",
                     hf_snapshot=lambda _r, _v: tmp_path, free_disk_gb=lambda _p: 1e4, port_free=lambda _p: True,
                     which=lambda _p: None, module_found=lambda _m: False)
    found = {m.check: m for m in check_host(load_profile("h200x8"), None, None, engine="vllm", runs_dir=tmp_path,
                                            port=None, probe=bare)}
    assert "vllm-router" in found["router"].problem and "pip install vllm-router" in found["router"].fix
    assert "NixlConnector" in found["connector"].problem and "pip install nixl" in found["connector"].fix
    ready = HostProbe(nvidia_devices=lambda: gpus, engine_version=lambda _e: "0.32.0",
                      hf_snapshot=lambda _r, _v: tmp_path, free_disk_gb=lambda _p: 1e4, port_free=lambda _p: True,
                      which=lambda p: f"/bin/{p}", module_found=lambda _m: True)
    checks = {m.check for m in check_host(load_profile("h200x8"), None, None, engine="vllm", runs_dir=tmp_path,
                                          port=None, probe=ready)}
    assert "router" not in checks and "connector" not in checks



def test_the_router_is_found_beside_this_python_when_the_venv_is_not_activated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the CI nights' h200x8 layout failed on a host that ran the venv's python without activating it
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    router = venv_bin / "vllm-router"
    router.write_text("#!/bin/sh\nexit 0\n")
    router.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_router("vllm-router") == str(router)
    assert router_problem("vllm-router") is None
    assert router_problem("no-such-router") is not None
    router.chmod(0o644)
    assert find_router("vllm-router") is None
