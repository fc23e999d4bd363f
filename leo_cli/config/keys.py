"""Every config key as the schema defines it: its type, default, allowed values and
description, for `leo config keys`, docs/config.md and the suggestions of config errors."""

from __future__ import annotations

import difflib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from leo_cli.config.schema import LeoConfig

_NAMES = {int: "int", float: "float", str: "text", bool: "true/false", Path: "path"}
_BOUNDS = ((at.Ge, ">="), (at.Gt, ">"), (at.Le, "<="), (at.Lt, "<"))


@dataclass(frozen=True)
class Key:
    """One setting: its dotted name, type (allowed values and bounds included), default as
    YAML, and description."""

    name: str
    type: str
    default: str
    description: str

    @property
    def section(self) -> str:
        return self.name.split(".")[0]


def config_keys(section: str | None = None) -> list[Key]:
    """Every key of the schema in its order, or those of one section (`run`, `data`, ...)."""
    keys = list(_walk(LeoConfig, ""))
    return keys if section is None else [k for k in keys if k.section == section]


def sections() -> list[str]:
    """The config's sections, in order."""
    return list(LeoConfig.model_fields)


def allowed_values(key: str) -> list[str]:
    """The names a key takes (its Literal values), or [] where it is not a choice of names."""
    field = _field(key)
    if field is None:
        return []
    return _named(field) or [str(v) for v in _literals(field.annotation)]


def _named(field: FieldInfo) -> list[str]:
    """The names a text field takes from a registry table (`json_schema_extra["names"]`)."""
    extra = field.json_schema_extra
    names = extra.get("names") if isinstance(extra, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else []


def closest(name: str, candidates: list[str]) -> str | None:
    """The candidate spelled most like `name`, or None where none is close."""
    found = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def closest_key(key: str) -> str | None:
    """The valid dotted key (or section) spelled most like `key`, at the same depth first
    (never `key` itself)."""
    names = [n for n in sections() + [k.name for k in config_keys()] if n != key]
    depth = key.count(".")
    same = [n for n in names if n.count(".") == depth]
    return closest(key, same) or closest(key, names)


def _walk(model: type[BaseModel], prefix: str) -> list[Key]:
    out: list[Key] = []
    for name, field in model.model_fields.items():
        dotted = prefix + name
        sub = section_of(field.annotation)
        if sub is not None and _optional(field.annotation):
            out.append(_key(dotted, field, f"null or a mapping of {dotted}.*"))
        if sub is not None:
            out += _walk(sub, dotted + ".")
            continue
        items = list_of_sections(field.annotation)
        if items is not None:
            inner = ", ".join(items.model_fields)
            out.append(_key(dotted, field, f"list of mappings {{{inner}}}"))
            out += _walk(items, dotted + "[].")
            continue
        named = _named(field)
        kind = "one of: " + ", ".join(named) if named else None
        if kind and get_origin(field.annotation) is list:
            kind = f"list of ({kind})"
        out.append(_key(dotted, field, kind or type_text(field.annotation, field.metadata)))
    return out


def _key(name: str, field: FieldInfo, kind: str) -> Key:
    return Key(name, kind, default_text(field), " ".join((field.description or "").split()))


def _field(key: str) -> FieldInfo | None:
    """The schema field of a dotted key, or None."""
    model: type[BaseModel] | None = LeoConfig
    field = None
    for part in key.replace("[]", "").split("."):
        if model is None or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        model = section_of(field.annotation) or list_of_sections(field.annotation)
    return field


def section_of(ann: Any) -> type[BaseModel] | None:
    """The section class of a field that holds one (or null), else None."""
    for arg in [ann, *_union_args(ann)]:
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def list_of_sections(ann: Any) -> type[BaseModel] | None:
    if get_origin(ann) is list:
        (item,) = get_args(ann)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def _union_args(ann: Any) -> tuple[Any, ...]:
    return get_args(ann) if get_origin(ann) in (Union, types.UnionType) else ()


def _optional(ann: Any) -> bool:
    return type(None) in _union_args(ann)


def _literals(ann: Any) -> list[Any]:
    if get_origin(ann) is Literal:
        return list(get_args(ann))
    return [v for arg in _union_args(ann) for v in _literals(arg)]


def type_text(ann: Any, metadata: list[Any] | None = None) -> str:
    """A type as a user reads it: `int >= 1`, `one of: a, b`, `list of float > 0`, `... or
    null`."""
    bounds = ", ".join(
        f"{sign} {getattr(m, attr)}"
        for m in metadata or []
        for cls, sign in _BOUNDS
        if isinstance(m, cls)
        for attr in ("ge", "gt", "le", "lt")
        if hasattr(m, attr)
    )
    origin = get_origin(ann)
    if origin is Annotated:
        base, *extra = get_args(ann)
        found = [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        return type_text(base, found + list(metadata or []))
    if origin is Literal:
        names = [str(v) for v in get_args(ann)]
        text = names[0] if len(names) == 1 else "one of: " + ", ".join(names)
    elif origin in (Union, types.UnionType):
        kept = [a for a in get_args(ann) if a is not type(None)]
        bounds_of = metadata if len(kept) == 1 else None  # `float | None = Field(gt=0)`
        text = " or ".join(type_text(a, bounds_of) for a in kept)
        return text + (" or null" if _optional(ann) else "")
    elif origin is list:
        item = type_text(get_args(ann)[0])
        text = "list of " + (f"({item})" if " or " in item else item)
    else:
        text = _NAMES.get(ann, getattr(ann, "__name__", str(ann)))
    return f"{text} {bounds}".strip()


def default_text(field: FieldInfo) -> str:
    """The default as it would be written in YAML (`(required)` where there is none)."""
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    else:
        return "(required)"
    if isinstance(value, BaseModel):
        return "(section)"
    plain = value if not isinstance(value, Path) else str(value)
    dumped = yaml.safe_dump(plain, default_flow_style=True, width=1_000_000).strip()
    return dumped.removesuffix("\n...").removesuffix("...").strip()
