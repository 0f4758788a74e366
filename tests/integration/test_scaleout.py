"""Scale-out on the real engines: workers sharing a study on PostgreSQL, and the Ray backend on a local
Ray cluster (loopback, logical GPUs), with real vLLM (CPU build) trials run one at a time.

PostgreSQL and Ray come from ``scripts/ci_services.sh`` (started here if ``$DSV4_TUNE_STORAGE`` /
``$DSV4_RAY_ADDRESS`` are not set). vLLM launches: 3 for the workers (one killed), 2 for Ray (one trial: its
first attempt killed, its retry).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.conftest import REPO
from tuner.backends.node import REFERENCE_ATTR, NodeIdentity
from tuner.backends.worker import Worker, WorkerOptions, open_shared
from tuner.engines.process import PID_FILE, group_alive
from tuner.study.storage import make_storage, mask_url, resolve_storage_url

PROFILE = {
    "name": "cpu-scaleout",
    "description": "cpu profile for the scale-out tests",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1, "memory_per_device_gb": 1},
    "server": {"ready_timeout_s": 240, "fixed": {"max-model-len": 1024, "enforce-eager": True, "dtype": "bfloat16"},
               "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"}},
    "levers": {"max-num-seqs": {"choices": [4, 16]}, "enable-prefix-caching": {"choices": [True, False]}},
    "baselines": [
        {"name": "small", "values": {"max-num-seqs": 4, "enable-prefix-caching": True}},
        {"name": "large", "values": {"max-num-seqs": 16, "enable-prefix-caching": False}},
    ],
}
OBJECTIVE = {
    "name": "throughput-scaleout", "direction": "maximize", "metric": "output_throughput",
    "slos": {"p95_ttft_ms": 60000},
    "workload": {"input_len": 32, "output_len": 16, "num_prompts": 8, "concurrency": 4, "warmup_prompts": 1},
}


@pytest.fixture
def catalog(tmp_path: Path) -> dict[str, Path]:
    profile, objective = tmp_path / "cpu-scaleout.yaml", tmp_path / "throughput-scaleout.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    objective.write_text(yaml.safe_dump(OBJECTIVE))
    return {"profile": profile, "objective": objective, "runs": tmp_path / "runs"}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _password(url: str) -> str:
    from sqlalchemy.engine import make_url

    password = make_url(url).password
    assert password, "the CI database URL carries a password"
    return str(password)


def _files_with(root: Path, secret: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret in p.read_text(errors="replace")]


def _record(catalog: dict[str, Path], model: str, trials: int) -> object:
    from tuner.study import new_record

    return new_record(name="x", hw=str(catalog["profile"]), objective=str(catalog["objective"]), model=model,
                      server_cmd="vllm", port=None, trials=trials, budget_s=None, seed=0, slo_overrides={},
                      ready_timeout_s=None, guards=[])


# -- fast: PostgreSQL only, no server -----------------------------------------------------------------
def test_shared_study_travels_in_the_database_without_its_password(pg_url: str, catalog: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    from tuner.study import StudyRecord

    name = _name("pw")
    record = _record(catalog, "some-org/some-model", 2)
    assert isinstance(record, StudyRecord)
    storage = make_storage(pg_url, heartbeat_interval_s=2, grace_period_s=8)
    created = open_shared(name, catalog["runs"], storage, url=pg_url, create=record)
    assert created.record.storage == mask_url(pg_url)
    assert "***" in json.loads((catalog["runs"] / name / "study.json").read_text())["storage"]
    # another node, another runs dir: the study folder is rebuilt from the database
    other = tmp_path / "node2-runs"
    joined = open_shared(name, other, make_storage(pg_url), url=pg_url)
    assert joined.profile == created.profile and joined.objective == created.objective
    assert ((other / name / "hardware_profile.yaml").read_text()
            == (catalog["runs"] / name / "hardware_profile.yaml").read_text())
    secret = _password(pg_url)
    assert _files_with(tmp_path, secret) == []
    # the masked URL of study.json is completed from the environment, and only from there
    assert resolve_storage_url(joined.record.storage, env={"DSV4_TUNE_STORAGE": pg_url}) == pg_url
    with pytest.raises(Exception, match="masked"):
        resolve_storage_url(joined.record.storage, env={})


def test_a_worker_on_a_different_node_is_refused_or_labelled(pg_url: str, catalog: dict[str, Path]) -> None:
    from tuner.study import StudyRecord

    name = _name("node")
    record = _record(catalog, "some-org/some-model", 2)
    assert isinstance(record, StudyRecord)
    storage = make_storage(pg_url)
    study = open_shared(name, catalog["runs"], storage, url=pg_url, create=record)
    h200 = NodeIdentity(hostname="gpu-node-1", gpu_model="NVIDIA H200", gpu_count=8, driver="570.86.15",
                        vllm_version="0.32.0", cpu_model="Intel Xeon Platinum 8480+", cpu_count=224)
    study.optuna_study().set_user_attr(REFERENCE_ATTR, h200.to_json())
    env = {**os.environ, "DSV4_TUNE_STORAGE": pg_url, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "worker", "--study", name, "--runs-dir",
                           str(catalog["runs"]), "--worker-id", "odd"], capture_output=True, text=True,
                          timeout=120, env=env, check=False, cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu_model" in proc.stderr and "NVIDIA H200" in proc.stderr
    assert not (catalog["runs"] / name / "trials").exists(), "a refused worker launched something"
    assert _password(pg_url) not in proc.stdout + proc.stderr
    # --on-mismatch label: the node reports into a study of its own type
    here = Worker(study, WorkerOptions(worker_id="odd", on_mismatch="label"), url=pg_url).admit()
    assert here.record.name.startswith(f"{name}.") and here.record.name != name
    assert here.optuna_study().user_attrs["label_of"] == name
    assert NodeIdentity.from_json(here.optuna_study().user_attrs[REFERENCE_ATTR]).gpu_model != "NVIDIA H200"


# -- slow: real vLLM servers -----------------------------------------------------------------------------
def _wait_for(predicate: object, timeout_s: float, what: str, procs: list[subprocess.Popen[str]]) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        for proc in procs:
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                pytest.fail(f"process exited ({proc.returncode}) while waiting for {what}: {out[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def _holds_flock(path: Path, pid: int) -> bool:
    """``pid`` holds a flock on ``path`` (read from /proc/locks: taking the lock to test it could make the holder
    fail its own non-blocking attempt)."""
    if not path.exists():
        return False
    inode = str(path.stat().st_ino)
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4] == str(pid) and fields[5].endswith(f":{inode}"):
            return True
    return False


def _server_starting(pid_file: Path) -> bool:
    """The server beside ``pid_file`` has begun its start-up: vLLM has written its first log records."""
    log = pid_file.parent / "server.log"
    return log.is_file() and " INFO " in log.read_text(errors="replace")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.server
@pytest.mark.slow
def test_two_workers_share_a_study_and_a_dead_workers_trial_is_finished_by_the_other(
        pg_url: str, catalog: dict[str, Path], demo_model: Path, tmp_path: Path,
        procs: list[subprocess.Popen[str]]) -> None:
    name = _name("workers")
    runs = catalog["runs"]
    env = {**os.environ, "DSV4_TUNE_STORAGE": pg_url, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    common = [sys.executable, "-m", "tuner.cli", "worker", "--study", name, "--runs-dir", str(runs),
              "--launch-lock", str(tmp_path / "launch.lock"), "--heartbeat-interval", "2", "--grace-period", "8"]
    create = ["--hw", str(catalog["profile"]), "--objective", str(catalog["objective"]), "--model", str(demo_model),
              "--trials", "2", "--guards", "none"]

    def popen(args: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
        procs.append(proc)
        return proc

    worker_a = popen([*common, "--worker-id", "a", *create])
    first_pid = runs / name / "trials" / "0000" / PID_FILE
    _wait_for(first_pid.exists, 180, "worker a's first server", [worker_a])
    worker_b = popen([*common, "--worker-id", "b"])  # joins from the database; waits for the launch lock
    _wait_for(lambda: _holds_flock(runs / name / ".lock.b", worker_b.pid), 180,
              "worker b to join the study (its slot lock, .lock.b)", [worker_a, worker_b])
    server = json.loads(first_pid.read_text())
    assert server["tuner_pid"] == worker_a.pid
    worker_a.kill()  # SIGKILL mid-trial: no chance to tell, no chance to stop its server
    worker_a.wait(timeout=30)
    out_b, _ = worker_b.communicate(timeout=480)
    assert worker_b.returncode == 0, out_b[-4000:]
    assert _password(pg_url) not in out_b

    study = optuna.load_study(study_name=name, storage=pg_url)
    trials = {t.number: t for t in study.get_trials()}
    lost = trials[0]
    assert lost.state == TrialState.FAIL and lost.user_attrs["worker_id"] == "a"
    retries = [t for t in trials.values() if t.system_attrs.get("failed_trial") == 0]
    assert len(retries) == 1, {n: (t.state, t.system_attrs) for n, t in trials.items()}
    retry = retries[0]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["worker_id"] == "b"
    assert retry.params == lost.params and retry.user_attrs["ok"] is True
    launched = [t for t in trials.values() if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert len(launched) == 2 and {t.user_attrs["worker_id"] for t in launched} == {"b"}
    for t in launched:  # nothing lost: every launch has its records, its node, its constraints
        tdir = runs / name / str(t.user_attrs["trial_dir"])
        assert json.loads((tdir / "outcome.json").read_text())["ok"] is True
        assert t.user_attrs["node_fingerprint"] and t.constraints
    lost_dir = runs / name / "trials" / "0000"  # the lost trial's evidence stays (its log may still be empty)
    assert (lost_dir / "command.json").is_file() and (lost_dir / "server.log").is_file()
    assert not group_alive(int(server["pgid"])), "the dead worker's server was left running"
    assert len(study.user_attrs[REFERENCE_ATTR]) > 0
    # export works from any node that sees the runs dir and the database
    from tuner.export import export_best

    # the workers screened only (nothing confirmed yet), so the export must be asked for as unconfirmed
    best = export_best(open_shared(name, runs, make_storage(pg_url), url=pg_url), accept_unconfirmed=True)
    assert (best / "profile.yaml").is_file()
    assert _files_with(runs / name, _password(pg_url)) == []


@pytest.mark.server
@pytest.mark.slow
def test_ray_backend_reserves_a_node_per_trial_and_retries_a_lost_trial(
        ray_address: str, catalog: dict[str, Path], demo_model: Path, procs: list[subprocess.Popen[str]]) -> None:
    name = _name("ray")
    runs = catalog["runs"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    driver = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "run", "--backend", "ray", "--ray-address", ray_address,
         "--hw", str(catalog["profile"]), "--objective", str(catalog["objective"]), "--model", str(demo_model),
         "--trials", "1", "--study", name, "--runs-dir", str(runs), "--guards", "none", "--gpus-per-trial", "1",
         "--max-retries", "1", "--accept-unconfirmed"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    procs.append(driver)

    def first_server() -> Path | None:
        found = sorted((runs / name / "trials").glob(f"*/{PID_FILE}")) if (runs / name / "trials").is_dir() else []
        return found[0] if found else None

    _wait_for(lambda: first_server() is not None, 240, "the first Ray trial's server", [driver])
    pid_file = first_server()
    assert pid_file is not None
    _wait_for(lambda: _server_starting(pid_file), 240, "the first Ray trial's server to begin its start-up", [driver])
    server = json.loads(pid_file.read_text())
    assert server["tuner_pid"] != driver.pid, "the trial ran in the driver, not in a Ray worker"
    os.kill(int(server["tuner_pid"]), signal.SIGKILL)  # the Ray worker holding the trial dies mid-trial
    out, _ = driver.communicate(timeout=480)
    assert driver.returncode == 0, out[-5000:]

    study_dir = runs / name
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{study_dir / 'study.db'}")
    launched = [t for t in study.get_trials() if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert len(launched) == 1, [(t.number, t.state, t.user_attrs) for t in study.get_trials()]
    for t in launched:
        assert t.user_attrs["backend"] == "ray"
        assert len(t.user_attrs["ray_gpu_ids"]) == 1  # the placement group's one logical GPU
        assert set(t.constraints) == {"p95_ttft_ms", "failed_fraction", "trial_ran"}
        assert json.loads((study_dir / str(t.user_attrs["trial_dir"]) / "outcome.json").read_text())["ok"] is True
    retried = [t for t in launched if t.user_attrs["attempt"] == 2]
    assert len(retried) == 1, [t.user_attrs.get("attempt") for t in launched]
    lost_dir = study_dir / f"{retried[0].user_attrs['trial_dir']}.lost-1"
    assert (lost_dir / "server.log").is_file()
    assert not group_alive(int(server["pgid"])), "the lost attempt's server was left running"
    assert (study_dir / "best" / "profile.yaml").is_file()
    assert len((study_dir / "trials.csv").read_text().strip().splitlines()) >= 2  # header + the launch


# -- pure: no service ----------------------------------------------------------------------------------
def test_node_identity_compares_gpu_driver_and_vllm_but_not_the_hostname() -> None:
    a = NodeIdentity(hostname="n1", gpu_model="NVIDIA H200", gpu_count=8, driver="570.86.15", vllm_version="0.32.0",
                     cpu_model="Xeon", cpu_count=224)
    assert a.differences(NodeIdentity.from_json({**a.to_json(), "hostname": "n2", "cpu_model": "EPYC"})) == []
    other = NodeIdentity.from_json({**a.to_json(), "driver": "580.1", "vllm_version": "0.33.0"})
    diffs = other.differences(a)
    assert len(diffs) == 2 and diffs[0].startswith("driver") and diffs[1].startswith("vllm_version")
    assert other.fingerprint() != a.fingerprint()
    cpu = NodeIdentity(hostname="c", gpu_model=None, gpu_count=0, driver=None, vllm_version="0.32.0", cpu_model="A")
    assert cpu.differences(NodeIdentity.from_json({**cpu.to_json(), "cpu_model": "B"}))  # CPU serving: CPU counts


def test_storage_url_is_masked_and_only_completed_from_the_environment() -> None:
    url = "postgresql://tuner:s3cret@db:5432/dsv4"
    assert mask_url(url) == "postgresql://tuner:***@db:5432/dsv4"
    assert resolve_storage_url(None, env={"DSV4_TUNE_STORAGE": url}) == url
    assert resolve_storage_url(mask_url(url), env={"DSV4_TUNE_STORAGE": url}) == url
    with pytest.raises(Exception, match="masked"):
        resolve_storage_url(mask_url(url), env={"DSV4_TUNE_STORAGE": "postgresql://other:x@db/dsv4"})
    with pytest.raises(Exception, match="no storage"):
        resolve_storage_url(None, env={})


def test_gathered_artifacts_fill_only_missing_files(tmp_path: Path) -> None:
    from tuner.backends.ray import is_loopback, pack_folder, unpack_folder

    node = tmp_path / "node" / "0003"
    node.mkdir(parents=True)
    (node / "outcome.json").write_text('{"ok": true}')
    (node / "server.log").write_bytes(b"x" * 2_000_000)
    driver = tmp_path / "driver" / "0003"
    driver.mkdir(parents=True)
    (driver / "outcome.json").write_text("kept")
    assert unpack_folder(pack_folder(node), driver) == ["server.log"]
    assert (driver / "outcome.json").read_text() == "kept"
    assert (driver / "server.log").stat().st_size == 1_000_000  # the log's tail, capped
    assert is_loopback("127.0.0.1:6379") and is_loopback("localhost:6379")
    assert not is_loopback("10.0.0.1:6379") and not is_loopback("auto") and not is_loopback(None)
