"""The disk fills while results are written; the tuner is interrupted during export.

Disk full: the study's runs folder lives on a small tmpfs (``mount -t tmpfs``, needs root; without
it the test is skipped; the documented alternative is to point ``DSV4_FAULT_SMALL_FS`` at any small
filesystem you can write, e.g. a loop-mounted image or a USB stick). The stand-in
``tests/standins/fill_disk.py`` fills that filesystem during the trial's startup, so the tuner then
writes ``outcome.json`` and its Optuna records to a full disk.

Export: the interrupt is raised exactly where a signal would land between two files of the export
(SIGINT/SIGTERM reach the CLI as KeyboardInterrupt in the main thread, see cli.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tests.conftest import stand_in_checkpoint
from tests.faults.conftest import STANDINS, Tuner
from tuner import store

CPU_PROFILE = {
    "name": "cpu-fault-disk",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1, "memory_per_device_gb": 1},
    "server": {"ready_timeout_s": 30, "env": {"HF_HUB_OFFLINE": "1"}},
    "levers": {"max-num-seqs": {"choices": [4, 8]}},
    "baselines": [{"name": "a", "values": {"max-num-seqs": 4}}],
}


@contextlib.contextmanager
def _small_fs(base: Path) -> Iterator[Path]:
    given = os.environ.get("DSV4_FAULT_SMALL_FS")
    if given:
        path = Path(given) / f"dsv4-fault-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
        return
    mount = base / "small"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip()}); set DSV4_FAULT_SMALL_FS "
                    "to a small writable filesystem to run this test")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with _small_fs(tmp_path) as path:
        yield path


@pytest.fixture(scope="module")
def disk_full_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One study whose only trial fills the disk (stand-in fill_disk.py) before its results are written."""
    root = tmp_path_factory.mktemp("diskfull")
    (root / "cpu.yaml").write_text(yaml.safe_dump(CPU_PROFILE))
    stand_in_checkpoint(root / "model")
    with _small_fs(root) as fs:
        runs = fs / "runs"
        # --force: the pre-flight check rightly says a 6 MiB filesystem is too small for a night; this test
        # is about the disk filling up during a trial, after the check. The stand-in checkpoint is no model
        # vLLM's own argument checks could read: they are off (the server is a stand-in too).
        tuner = Tuner("--hw", str(root / "cpu.yaml"), "--trials", "1", "--study", "full", "--model",
                      str(root / "model"), "--vllm-cmd", f"{sys.executable} {STANDINS / 'fill_disk.py'}",
                      "--no-export", "--force", "--prevalidate", "off", runs=runs)
        rc = tuner.wait(120)
        filler = runs / "full/trials/0000/filler.bin"
        obs: dict[str, Any] = {"rc": rc, "out": " ".join(tuner.output.split()), "runs": runs,
                               "filled": filler.is_file(), "db": runs / "full/study.db"}
        con = sqlite3.connect(obs["db"])
        try:
            obs["integrity"] = con.execute("PRAGMA integrity_check").fetchone()[0]
        finally:
            con.close()
        obs["tmp_files"] = list(runs.rglob("*.tmp"))
        obs["bad_json"] = []
        for path in runs.rglob("*.json"):
            try:
                json.loads(path.read_text())
            except ValueError:
                obs["bad_json"].append(path)
        with contextlib.suppress(OSError):
            filler.unlink()
        obs["states"] = [t.state.name for t in optuna.load_study(
            study_name="full", storage=f"sqlite:///{obs['db']}").get_trials()]
        yield obs


def test_disk_full_during_a_trial_keeps_the_db_and_files_whole(disk_full_run: dict[str, Any]) -> None:
    run = disk_full_run
    assert run["filled"], "the fault did not happen: " + run["out"]
    assert run["integrity"] == "ok"
    assert run["tmp_files"] == [] and run["bad_json"] == []
    # with space again the study reads back; its trial is not COMPLETE, so `resume` re-runs it
    assert run["states"] in (["FAIL"], ["RUNNING"]), run["states"]
    assert run["rc"] != 0


def test_disk_full_error_names_the_file_and_the_fix(disk_full_run: dict[str, Any]) -> None:
    out = disk_full_run["out"]
    assert "disk full: No space left on device while writing" in out, out
    assert "trials/0000/outcome.json" in out and "resume" in out


def test_disk_full_error_is_not_masked_by_the_database(disk_full_run: dict[str, Any]) -> None:
    out = disk_full_run["out"]
    assert disk_full_run["rc"] == 1 and "Traceback" not in out and "error: disk full" in out, out


def test_store_turns_a_full_disk_into_a_clear_error(small_fs: Path) -> None:
    target = small_fs / "trials/0000/outcome.json"
    target.parent.mkdir(parents=True)
    filler = small_fs / "filler.bin"
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as fh:
        while True:
            fh.write(b"\0" * 65536)
    with pytest.raises(store.DiskFullError) as info:
        store.write_json(target, {"big": "x" * 200_000})
    message = str(info.value)
    assert "disk full" in message and str(target) in message and "resume" in message
    assert not target.exists() and list(small_fs.rglob("*.tmp")) == []
    filler.unlink()
    store.write_json(target, {"ok": True})
    assert json.loads(target.read_text()) == {"ok": True}


# -- interrupted export ----------------------------------------------------------------------------
def _study_with_two_winners(tmp_path: Path) -> Any:
    from tuner.study import ConfirmSpec, Study, StudyRecord

    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(CPU_PROFILE))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    # confirmation off: these trials are told by hand, so the export needs no --accept-unconfirmed
    study = Study.create(StudyRecord(name="exp", hw=str(tmp_path / "cpu.yaml"), objective="throughput",
                                     model=str(model), trials=2, confirm=ConfirmSpec(top_k=0)), tmp_path / "runs")
    ostudy = study.optuna_study()
    for number, (seqs, value) in enumerate(((4, 100.0), (8, 200.0))):
        trial = ostudy.ask({"max-num-seqs": optuna.distributions.CategoricalDistribution([4, 8])})
        tdir = store.trial_dir(study.path, number)
        args = {"max-num-seqs": seqs, "max-model-len": 1024}
        store.write_json(tdir / "config.json", {"args": args, "env": {}, "params": {"max-num-seqs": seqs}})
        store.write_json(tdir / "command.json", {"argv": ["vllm", "serve"], "env": {"HF_HUB_OFFLINE": "1"}})
        store.write_json(tdir / "outcome.json", {"ok": True, "summary": {"output_throughput": value}})
        trial.set_user_attr("trial_dir", str(tdir.relative_to(study.path)))
        trial.set_user_attr("feasible", True)
        trial.set_user_attr("constraints", [0.0])
        if number == 0:
            ostudy.tell(trial, value)
            from tuner.export import export_best

            export_best(study)
        else:
            ostudy.tell(trial, value)
    return study


def _interrupt_on_write(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    real = store.write_text
    calls = {"n": 0}

    def write_text(path: Path, text: str, *, mode: int | None = None) -> None:
        calls["n"] += 1
        if calls["n"] == nth:
            raise KeyboardInterrupt("signal 15")  # what cli.py's SIGTERM handler raises
        real(path, text, mode=mode)

    monkeypatch.setattr(store, "write_text", write_text)


def test_interrupted_export_leaves_no_partial_file_and_can_be_redone(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.export import export_best

    study = _study_with_two_winners(tmp_path)
    _interrupt_on_write(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        export_best(study)
    monkeypatch.undo()
    best = study.path / "best"
    assert list(best.rglob("*.tmp")) == [] and list(best.rglob(".*")) == []
    for name in ("profile.yaml", "identity.json"):
        assert (best / name).stat().st_size > 0
    con = sqlite3.connect(study.path / "study.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()
    export_best(study)  # a second export after the interrupt completes
    assert json.loads((best / "identity.json").read_text())["trial"] == 1
    assert yaml.safe_load((best / "profile.yaml").read_text())["max-num-seqs"] == 8


def test_interrupted_export_never_mixes_two_winners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.export import export_best

    study = _study_with_two_winners(tmp_path)
    _interrupt_on_write(monkeypatch, 2)  # after profile.yaml, before serve.sh
    with pytest.raises(KeyboardInterrupt):
        export_best(study)
    best = study.path / "best"
    profile_seqs = yaml.safe_load((best / "profile.yaml").read_text())["max-num-seqs"]
    identity_trial = json.loads((best / "identity.json").read_text())["trial"]
    assert (profile_seqs, identity_trial) in ((4, 0), (8, 1)), (profile_seqs, identity_trial)
