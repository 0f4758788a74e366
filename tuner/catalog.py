"""Find and load the YAML catalogs: hardware profiles, objectives, guards.

A catalog entry is named (``--hw gh200x4``) or given by path (``--hw ./my-node.yaml``). Names are
looked up in the catalogs shipped inside the installed package (``tuner/_catalogs/<kind>/``),
falling back to the source tree's top-level folders in an editable install.

Every problem becomes a :class:`~tuner.errors.CatalogError` naming the file, the key and the fix.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tuner.errors import CatalogError, UnknownNameError

KINDS = ("search_spaces", "objectives", "guards")
_KIND_WORD = {"search_spaces": "hardware profile", "objectives": "objective", "guards": "guard"}

M = TypeVar("M", bound=BaseModel)


def catalog_dir(kind: str) -> Path:
    """The folder holding the shipped catalog of one kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown catalog kind {kind!r}")
    packaged = Path(__file__).parent / "_catalogs" / kind
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / kind


def known_names(kind: str) -> list[str]:
    folder = catalog_dir(kind)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_"))


def resolve(kind: str, name_or_path: str) -> Path:
    """A catalog name or a path to a YAML file → an existing file, or UnknownNameError."""
    candidate = Path(name_or_path).expanduser()
    looks_like_path = candidate.suffix in (".yaml", ".yml") or "/" in name_or_path
    if looks_like_path:
        if candidate.is_file():
            return candidate
        raise CatalogError(candidate, "", "file not found",
                           f"check the path, or use a known {_KIND_WORD[kind]} name: "
                           + ", ".join(known_names(kind)))
    path = catalog_dir(kind) / f"{name_or_path}.yaml"
    if path.is_file():
        return path
    raise UnknownNameError(_KIND_WORD[kind], name_or_path, known_names(kind))


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; malformed YAML names the line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(path, "", f"cannot read: {exc.strerror or exc}", "check the path and permissions") \
            from exc
    except UnicodeDecodeError as exc:
        raise CatalogError(path, "", "not UTF-8 text", "save the file as UTF-8 YAML") from exc
    try:
        return yaml.safe_load(text)
    except RecursionError as exc:
        raise CatalogError(path, "", "YAML nested too deeply to read",
                           "flatten the file; catalogs need only a few levels of nesting") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CatalogError(path, where, f"malformed YAML ({problem})",
                           "fix the YAML syntax at that position (indentation, quotes, colons)") from exc


def format_validation_error(path: Path | str, exc: ValidationError, model: type[BaseModel]) -> CatalogError:
    """Turn pydantic's report into one CatalogError naming the first bad key and a fix."""
    errors = exc.errors()
    first = errors[0]
    key = ".".join(str(part) for part in first["loc"]) or "(top level)"
    kind = first["type"]
    if kind == "extra_forbidden":
        parent = _model_at(model, first["loc"][:-1])
        allowed = _allowed_keys(parent) if parent is not None else []
        close = difflib.get_close_matches(str(first["loc"][-1]), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problem = "unknown key"
        fix = f"{hint}remove it or use one of: {', '.join(allowed)}" if allowed else "remove it"
    elif kind == "missing":
        problem = "required key is missing"
        fix = "add it (see the shipped catalogs for an example)"
    else:
        problem = f"{first['msg']} (got {first.get('input')!r})"
        fix = "change the value to the type and range this key takes"
    more = f" ({len(errors) - 1} more problem(s) after this one)" if len(errors) > 1 else ""
    return CatalogError(path, key, problem + more, fix)


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model at a validation-error location (list indexes and dict keys skipped)."""
    current: Any = model
    skip_key = False
    for part in loc:
        if isinstance(part, int) or skip_key:
            skip_key = False
            continue
        fields: dict[str, Any] | None = getattr(current, "model_fields", None)
        name = _field_for_alias(fields, part) if fields is not None else None
        if fields is None or name is None:
            return None
        annotation = fields[name].annotation
        skip_key = getattr(annotation, "__origin__", None) is dict
        current = _first_model_in(annotation)
        if current is None:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _field_for_alias(fields: dict[str, Any], part: Any) -> str | None:
    for name, info in fields.items():
        if part in (name, info.alias):
            return name
    return None


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return sorted(info.alias or name for name, info in model.model_fields.items())


def _first_model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model_in(arg)
        if found is not None:
            return found
    return None


def load_model(path: Path, model: type[M]) -> M:
    """Read ``path`` and validate it as ``model``; every failure is a CatalogError."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise CatalogError(path, "(top level)", f"expected a mapping of keys, got {type(data).__name__}",
                           "start the file with the keys of this catalog kind (see a shipped example)")
    try:
        return model.model_validate(data)
    except RecursionError as exc:
        raise CatalogError(path, "(top level)", "values nested too deeply",
                           "flatten the file; catalogs need only a few levels of nesting") from exc
    except ValidationError as exc:
        raise format_validation_error(path, exc, model) from exc
