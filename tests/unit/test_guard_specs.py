"""Guard YAML: the shipped catalog loads; every mistake is a CatalogError naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.catalog import known_names
from tuner.errors import CatalogError, UnknownNameError, UsageError
from tuner.guards import (
    EquivalenceGuard,
    EquivalenceSpec,
    NeedleSpec,
    ReasoningSpec,
    Suite,
    ToolCallSpec,
    load_spec,
    load_suite,
)

SHIPPED = {"tool_call": ToolCallSpec, "reasoning": ReasoningSpec, "equivalence": EquivalenceSpec,
           "needle": NeedleSpec}


def _write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_every_shipped_guard_loads_as_its_kind() -> None:
    assert set(SHIPPED) <= set(known_names("guards"))
    suite = load_suite(list(SHIPPED))
    assert isinstance(suite, Suite)
    assert suite.names[-1] == "equivalence"  # equivalence runs last
    for guard in suite.guards:
        assert isinstance(guard.spec, SHIPPED[guard.name])  # type: ignore[union-attr]


def test_a_path_works_like_a_name(tmp_path: Path) -> None:
    path = _write(tmp_path, "kind: equivalence\nprobes: [{name: a, prompt: hi}]\n"
                  "thresholds: {max_mean_drift_nats: 0.1, max_token_drift_nats: 1, max_tie_gap_nats: 0.1}\n",
                  "mine.yaml")
    suite = load_suite([str(path)])
    assert isinstance(suite, Suite) and suite.names == ["mine"]
    assert isinstance(suite.guards[0], EquivalenceGuard)


def test_unknown_key_names_file_key_and_a_close_match(tmp_path: Path) -> None:
    path = _write(tmp_path, "kind: tool_call\nprobes:\n  - name: p\n    messages: [{role: user, content: x}]\n"
                  "    tools: [{type: function, function: {name: f}}]\n    expect_call: {name: f}\n"
                  "    round_trp: {tool_result: r, expect_content_contains: x}\n")
    with pytest.raises(CatalogError) as info:
        load_spec(path)
    assert info.value.file == str(path)
    assert info.value.key == "probes.0.round_trp"
    assert "round_trip" in info.value.fix


def test_unknown_kind_lists_the_kinds(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as info:
        load_spec(_write(tmp_path, "kind: vibes\n"))
    assert info.value.key == "kind"
    assert "equivalence" in info.value.fix and "needle" in info.value.fix


def test_needle_needs_exactly_one_length(tmp_path: Path) -> None:
    text = ("kind: needle\ncontext_tokens: 100\ncontext_fraction: 0.5\nneedles: [{depth: 0.5, code: '1'}]\n"
            "filler: [a]\nneedle_template: 'code {code}'\nquestion: q\n")
    with pytest.raises(CatalogError) as info:
        load_spec(_write(tmp_path, text))
    assert "exactly one of context_tokens and context_fraction" in str(info.value)


def test_tool_probe_without_tools_is_refused(tmp_path: Path) -> None:
    text = ("kind: tool_call\nprobes:\n  - name: p\n    messages: [{role: user, content: x}]\n"
            "    expect_call: {name: f}\n")
    with pytest.raises(CatalogError, match="at least one entry in tools"):
        load_spec(_write(tmp_path, text))


def test_negative_threshold_is_refused(tmp_path: Path) -> None:
    text = ("kind: equivalence\nprobes: [{name: a, prompt: hi}]\n"
            "thresholds: {max_mean_drift_nats: -1, max_token_drift_nats: 1, max_tie_gap_nats: 0.1}\n")
    with pytest.raises(CatalogError) as info:
        load_spec(_write(tmp_path, text))
    assert info.value.key == "thresholds.max_mean_drift_nats"


def test_unknown_name_and_duplicate_are_refused() -> None:
    with pytest.raises(UnknownNameError):
        load_suite(["no_such_guard"])
    with pytest.raises(UsageError, match="listed twice"):
        load_suite(["needle", "needle"])
