"""tuner/catalog.py: every way a catalog file can be wrong becomes a CatalogError naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner import catalog
from tuner.errors import CatalogError, UnknownNameError
from tuner.objective import Objective
from tuner.search.profile import HardwareProfile

HW = "name: x\nhardware: {accelerator: cpu, device_name: c, device_count: 1, memory_per_device_gb: 1}\n"


def _write(tmp_path: Path, text: str, name: str = "cat.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_objective_loads_with_given_values(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: mine\ndirection: minimize\nmetric: p95_itl_ms\nslos: {p99_ttft_ms: 1500}\n")
    obj = catalog.load_model(path, Objective)
    assert (obj.name, obj.direction, obj.metric, dict(obj.slos)) == ("mine", "minimize", "p95_itl_ms",
                                                                     {"p99_ttft_ms": 1500.0})


def test_unclosed_flow_mapping_points_at_end_of_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: a\nslos: {p95_ttft_ms: 5\n")
    with pytest.raises(CatalogError) as info:
        catalog.read_yaml(path)
    assert info.value.key == "line 3, column 1"
    assert info.value.__cause__ is not None  # chained to the yaml error


BAD_KEYS: dict[str, tuple[str, type[Objective] | type[HardwareProfile], str, str, str]] = {
    # case: (file text, model, the key named, the part of the error, what it says there)
    "malformed YAML names file, line and column": (
        "name: a\ndescription: b\n  broken: : here\n", Objective, "line 3, column 9", "problem", "malformed YAML"),
    "unknown top-level key names key and suggests": (
        "name: a\ndirecton: minimize\n", Objective, "directon", "fix", "did you mean 'direction'?"),
    "unknown nested key gives dotted key and hint": (
        "name: a\nworkload: {input_lenn: 5}\n", Objective, "workload.input_lenn", "fix", "did you mean 'input_len'?"),
    "unknown key in hardware profile section": (
        HW.replace("accelerator: cpu", "acelerator: cpu"), HardwareProfile, "hardware.acelerator", "fix",
        "did you mean 'accelerator'?"),
    "unknown key inside a lever gets a hint": (
        HW + "levers:\n  max-num-seqs: {choices: [1, 2], whne: {a: [1]}}\n", HardwareProfile,
        "levers.max-num-seqs.whne", "fix", "did you mean 'when'?"),
    "wrong type names key and value": (
        HW.replace("device_count: 1", "device_count: one"), HardwareProfile, "hardware.device_count", "problem",
        "'one'"),
    "out of range value is rejected": (
        "name: a\nmax_failed_fraction: 1.5\n", Objective, "max_failed_fraction", "problem", "1.5"),
    "missing required key": (
        "description: no name here\n", Objective, "name", "problem", "required key is missing"),
    "missing nested required key": (
        HW.replace("device_name: c, ", ""), HardwareProfile, "hardware.device_name", "problem", "required key"),
}


@pytest.mark.parametrize("case", list(BAD_KEYS))
def test_a_bad_key_is_named_with_its_problem_or_fix(tmp_path: Path, case: str) -> None:
    text, model, key, part, says = BAD_KEYS[case]
    path = _write(tmp_path, text)
    with pytest.raises(CatalogError) as info:
        catalog.load_model(path, model)
    assert info.value.file == str(path)
    assert info.value.key == key
    assert says in getattr(info.value, part)
    assert str(path) in str(info.value) and key in str(info.value)


@pytest.mark.parametrize(("text", "problem"), [("description: no name here\n", "required key is missing"),
                                               ("name: a\ndirecton: minimize\n", "unknown key")],
                         ids=["missing required key", "unknown top-level key"])
def test_the_problem_says_exactly_what_is_wrong(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(CatalogError) as info:
        catalog.load_model(_write(tmp_path, text), Objective)
    assert info.value.problem == problem


def test_unknown_key_without_close_match_lists_allowed_keys(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: a\nzzzzzz: 1\n")
    with pytest.raises(CatalogError) as info:
        catalog.load_model(path, Objective)
    assert "did you mean" not in info.value.fix
    for allowed in ("description", "direction", "metric", "slos", "workload"):
        assert allowed in info.value.fix


def test_several_problems_are_counted(tmp_path: Path) -> None:
    path = _write(tmp_path, "nme: a\ndirecton: up\n")
    with pytest.raises(CatalogError) as info:
        catalog.load_model(path, Objective)
    assert "(2 more problem(s) after this one)" in info.value.problem


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just a string\n", "str"),
                                            ("", "NoneType"), ("42\n", "int")])
def test_non_mapping_top_level(tmp_path: Path, text: str, kind: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(CatalogError) as info:
        catalog.load_model(path, Objective)
    assert info.value.key == "(top level)"
    assert info.value.problem == f"expected a mapping of keys, got {kind}"


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        catalog.resolve("search_spaces", "nope")
    err = info.value
    assert err.name == "nope"
    assert err.kind == "hardware profile"
    assert "cpu" in err.known
    assert err.known == catalog.known_names("search_spaces")
    assert "cpu" in str(err) and "'nope'" in str(err)


def test_known_name_resolves_to_shipped_file() -> None:
    path = catalog.resolve("objectives", "throughput")
    assert path.name == "throughput.yaml" and path.is_file()


def test_path_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "node.yaml"
    with pytest.raises(CatalogError) as info:
        catalog.resolve("search_spaces", str(missing))
    assert info.value.file == str(missing)
    assert info.value.problem == "file not found"
    assert "cpu" in info.value.fix  # points at the known names


def test_relative_path_without_yaml_suffix_is_a_path(tmp_path: Path) -> None:
    # a slash makes it a path, not a catalog name
    with pytest.raises(CatalogError):
        catalog.resolve("objectives", str(tmp_path / "mine"))


def test_existing_path_is_returned_as_is(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: a\n", "mine.yml")
    assert catalog.resolve("objectives", str(path)) == path


def test_read_yaml_missing_file_is_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as info:
        catalog.read_yaml(tmp_path / "gone.yaml")
    assert "cannot read" in info.value.problem


def test_non_utf8_file_is_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(CatalogError) as info:
        catalog.read_yaml(path)
    assert info.value.problem == "not UTF-8 text"


def test_underscore_names_hidden_from_known_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "search_spaces"
    folder.mkdir()
    for stem in ("b-node", "_checkpoints", "a-node", "_private"):
        (folder / f"{stem}.yaml").write_text("name: x\n")
    (folder / "notes.txt").write_text("not yaml")
    monkeypatch.setattr(catalog, "catalog_dir", lambda kind: folder)
    assert catalog.known_names("search_spaces") == ["a-node", "b-node"]


def test_shipped_known_names_hide_underscore_files() -> None:
    names = catalog.known_names("search_spaces")
    assert "cpu" in names
    assert all(not n.startswith("_") for n in names)
    assert names == sorted(names)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown catalog kind"):
        catalog.catalog_dir("recipes")
