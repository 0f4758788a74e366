"""A guard kind is one module plus one YAML file: the registry finds a kind's module by itself (a throwaway
module dropped beside the shipped kinds here), and a kind registered by hand is read, built and run like the
shipped ones (and ordered by its ``runs_last``)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import textwrap
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

import tuner.guards as guards
from tuner.errors import CatalogError
from tuner.guards import (
    GuardKind,
    GuardResult,
    GuardTarget,
    SpecGuard,
    StrictModel,
    discover_kinds,
    load_suite,
    register_kind,
)


class CoinSpec(StrictModel):
    kind: Literal["coin"]
    description: str = ""
    side: Literal["heads", "tails"] = "heads"
    wants: str = Field(default="heads")


class CoinGuard(SpecGuard[CoinSpec]):
    """A throwaway kind: passes when its side is the side it wants."""

    kind = "coin"

    def run(self, target: GuardTarget) -> GuardResult:
        passed = self.spec.side == self.spec.wants
        return GuardResult(self.name, self.kind, passed, f"{self.spec.side} ({target.model})", {})


class LastCoinGuard(CoinGuard):
    kind = "last_coin"
    runs_last = True

    def run(self, target: GuardTarget) -> GuardResult:
        return GuardResult(self.name, self.kind, True, f"earlier gates passed: {target.earlier_gates_passed}", {})


class LastCoinSpec(CoinSpec):
    kind: Literal["last_coin"]  # type: ignore[assignment]


@pytest.fixture
def coin_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guards, "KINDS", dict(guards.KINDS))
    register_kind(GuardKind("coin", CoinSpec, CoinGuard))
    register_kind(GuardKind("last_coin", LastCoinSpec, LastCoinGuard))


def _target(tmp_path: Path) -> GuardTarget:
    return GuardTarget(base_url="http://127.0.0.1:9", headers={}, model="m", trial_dir=tmp_path / "trial",
                       study_dir=tmp_path, params={}, args={}, is_speculative=False)


def test_every_kind_module_of_the_package_is_registered() -> None:
    with_kind = set()
    for module in pkgutil.iter_modules(guards.__path__):
        found = getattr(importlib.import_module(f"tuner.guards.{module.name}"), "KIND", None)
        if isinstance(found, GuardKind):
            with_kind.add(found.name)
    assert with_kind == {"tool_call", "reasoning", "equivalence", "needle"}
    assert set(guards.KINDS) >= with_kind


THROWAWAY_MODULE = textwrap.dedent("""\
    from typing import Literal

    from tuner.guards.api import GuardKind, GuardResult, GuardTarget, SpecGuard
    from tuner.guards.specs import StrictModel


    class ParitySpec(StrictModel):
        kind: Literal["parity"]
        number: int


    class ParityGuard(SpecGuard[ParitySpec]):
        kind = "parity"

        def run(self, target: GuardTarget) -> GuardResult:
            even = self.spec.number % 2 == 0
            return GuardResult(self.name, self.kind, even, "even" if even else "odd")


    KIND = GuardKind("parity", ParitySpec, ParityGuard)
""")


def test_a_new_kind_is_one_new_module_plus_one_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "more_kinds"
    package.mkdir()
    (package / "throwaway_parity.py").write_text(THROWAWAY_MODULE)  # the one new module
    monkeypatch.setattr(guards, "__path__", [*guards.__path__, str(package)])  # as if beside the others
    monkeypatch.setattr(guards, "KINDS", dict(guards.KINDS))
    monkeypatch.delitem(sys.modules, "tuner.guards.throwaway_parity", raising=False)
    try:
        assert "parity" in discover_kinds()
        (tmp_path / "odd.yaml").write_text("kind: parity\nnumber: 3\n")  # the one YAML file
        report = load_suite([str(tmp_path / "odd.yaml")]).run(_target(tmp_path))
    finally:
        sys.modules.pop("tuner.guards.throwaway_parity", None)
    assert [(r.name, r.kind, r.passed, r.detail) for r in report.results] == [("odd", "parity", False, "odd")]


def test_a_throwaway_kind_is_one_registration_plus_one_yaml(tmp_path: Path, coin_kinds: None) -> None:
    (tmp_path / "tails.yaml").write_text("kind: coin\nside: tails\nwants: heads\n")
    (tmp_path / "last.yaml").write_text("kind: last_coin\n")
    (tmp_path / "heads.yaml").write_text("kind: coin\n")
    suite = load_suite([str(tmp_path / "last.yaml"), str(tmp_path / "tails.yaml"), str(tmp_path / "heads.yaml")])
    report = suite.run(_target(tmp_path))
    assert [(r.name, r.kind, r.passed) for r in report.results] == [
        ("tails", "coin", False), ("heads", "coin", True), ("last", "last_coin", True)]
    assert report.results[2].detail == "earlier gates passed: False"  # runs last, and is told
    assert report.reason.startswith("tails: tails (m)")


def test_a_typo_in_a_throwaway_kind_is_a_catalog_error(tmp_path: Path, coin_kinds: None) -> None:
    (tmp_path / "typo.yaml").write_text("kind: coin\nsdie: heads\n")
    with pytest.raises(CatalogError) as info:
        load_suite([str(tmp_path / "typo.yaml")])
    assert info.value.key == "sdie" and "did you mean 'side'?" in info.value.fix


def test_an_unknown_kind_lists_the_registered_ones(tmp_path: Path, coin_kinds: None) -> None:
    (tmp_path / "nope.yaml").write_text("kind: dice\n")
    with pytest.raises(CatalogError, match="coin, equivalence, last_coin, needle, reasoning, tool_call"):
        load_suite([str(tmp_path / "nope.yaml")])


def test_a_kind_name_cannot_be_taken_twice(coin_kinds: None) -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_kind(GuardKind("coin", CoinSpec, LastCoinGuard))
