"""The committed trained fixture (the shipped demo model): its files match its manifest, and it was trained
on today's probes and answers; the demo model is written out from it and checked.

Nothing trains here: the fixture is generated once by ``scripts/make_fixture.py build`` and committed, so
the suite does not depend on a training run converging on the CPU at hand (issue 15, finding 13).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tuner.demo_model import MANIFEST_NAME, SHIPPED_DIR, file_sha256, verify_model_dir, write_demo_model
from tuner.errors import UsageError


def test_every_committed_file_matches_the_manifest() -> None:
    manifest = verify_model_dir(SHIPPED_DIR)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(manifest["files"])
    shipped = {p.name for p in SHIPPED_DIR.iterdir()}
    assert shipped == set(manifest["files"]) | {MANIFEST_NAME}  # nothing unlisted ships either
    training = manifest["training"]
    assert training["bf16_min_margin"] >= training["environment"]["recipe"]["min_margin"]
    assert manifest["files"]["model.safetensors"]["bytes"] < 6_000_000


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="rendering the probes needs vLLM's encoder")
def test_the_fixture_was_trained_on_todays_probes_and_answers() -> None:
    from transformers import AutoTokenizer

    from tests.fixtures.trained_model import FIXTURE_GUARDS, examples_sha256, training_examples
    from tuner.catalog import resolve

    trained_on = verify_model_dir(SHIPPED_DIR)["trained_on"]
    stale = "was trained on other {}: run `python scripts/make_fixture.py build` and commit tuner/demo/"
    assert trained_on["guards"] == {g: file_sha256(resolve("guards", g)) for g in FIXTURE_GUARDS}, stale.format(
        "probes")
    assert trained_on["answers"] == file_sha256(Path(__file__).parents[1] / "fixtures" / "answers.py"), stale.format(
        "answers")
    examples = training_examples(AutoTokenizer.from_pretrained(SHIPPED_DIR))
    assert trained_on["examples_sha256"] == examples_sha256(examples), stale.format("token ids")


def test_the_demo_model_is_written_out_and_checked(tmp_path: Path) -> None:
    out = write_demo_model(tmp_path / "demo")
    assert verify_model_dir(out) == verify_model_dir(SHIPPED_DIR)
    assert write_demo_model(out) == out  # a verified copy is reused
    with (out / "model.safetensors").open("r+b") as fh:  # one flipped byte is found
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(UsageError, match=r"model\.safetensors has sha256"):
        verify_model_dir(out)
    assert write_demo_model(out) == out and verify_model_dir(out)  # and rewritten


def test_a_folder_holding_other_files_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a copy of the demo model"):
        write_demo_model(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_missing_or_broken_manifest_says_how_to_fix_it(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(SHIPPED_DIR, copy)
    (copy / MANIFEST_NAME).write_text("{")
    with pytest.raises(UsageError, match=r"make_fixture\.py build"):
        verify_model_dir(copy)
    doc = json.loads((SHIPPED_DIR / MANIFEST_NAME).read_text())
    (copy / MANIFEST_NAME).write_text(json.dumps(doc))
    (copy / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match=r"tokenizer\.json is missing"):
        verify_model_dir(copy)


def test_the_cli_writes_the_demo_model_and_resolves_demo_to_it(tmp_path: Path) -> None:
    from tuner.cli.main import main
    from tuner.study.record import resolve_model

    assert main(["demo-model", str(tmp_path / "out")]) == 0
    assert verify_model_dir(tmp_path / "out") == verify_model_dir(SHIPPED_DIR)
    served = Path(resolve_model("demo", tmp_path / "runs"))
    assert served == (tmp_path / "runs" / "_models" / "demo").resolve()
    assert verify_model_dir(served)["files"] == verify_model_dir(SHIPPED_DIR)["files"]


def test_the_wheel_ships_the_demo_model() -> None:
    """``--model demo`` writes the model out of the installed package, so the wheel must carry ``tuner/demo/``.

    Hatch's wheel takes every file under ``packages`` that neither ``.gitignore`` nor an ``exclude`` drops
    (a wheel built from this tree held all seven files); this fails when a change to either would drop one.
    """
    import subprocess

    import tomllib

    repo = Path(__file__).resolve().parents[2]
    wheel = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert "tuner" in wheel["packages"]
    assert not {"exclude", "only-include", "sources"} & set(wheel), "the wheel's selection changed: check tuner/demo/"
    names = [*sorted(verify_model_dir(SHIPPED_DIR)["files"]), MANIFEST_NAME]
    paths = [str((SHIPPED_DIR / n).relative_to(repo)) for n in names]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=repo, capture_output=True, text=True)
    assert ignored.returncode == 1 and not ignored.stdout, f"ignored, so left out of the wheel: {ignored.stdout}"
