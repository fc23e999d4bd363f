"""Loading a config: built-in defaults < YAML file < `--set dotted.key=value` overrides.

Every failure becomes a `ConfigError` naming the file or key and what to do.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from leo_cli.config.keys import (
    allowed_values,
    closest,
    closest_key,
    list_of_sections,
    section_of,
    sections,
)
from leo_cli.config.schema import LeoConfig
from leo_cli.errors import ConfigError
from leo_cli.run_dir import RunDir
from leo_cli.util import files


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> LeoConfig:
    """Build the validated config from an optional YAML file and `--set` overrides."""
    tree: dict[str, Any] = read_yaml(path) if path is not None else {}
    sources = {}
    for item in overrides or []:
        key, value = parse_override(item)
        set_dotted(tree, key, value)
        sources[key] = f"--set {item}"
    return validate(tree, str(path) if path else "the built-in defaults", sources)


def with_overrides(cfg: LeoConfig, items: list[str], source: str) -> LeoConfig:
    """`cfg` with `dotted.key=value` overrides applied and validated again; errors name the
    key and `source` (e.g. a benchmark variant)."""
    tree = cfg.model_dump(mode="json")
    sources = {}
    for item in items:
        key, value = parse_override(item)
        set_dotted(tree, key, value)
        sources[key] = f"{source} ({item})"
    return validate(tree, source, sources)


class _Loader(yaml.SafeLoader):
    """YAML as `yaml.safe_load` reads it, except that `1:2` is a string, not YAML 1.1's base-60
    integer 62: `launch.nnodes: 1:2` is a range of machines."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(
        r"""^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    list("-+0123456789"),
)


def load_yaml(text: str) -> Any:
    """Parse YAML text as the config files and `--set` values are read."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, or fail with the file name and the reason."""
    if not path.is_file():
        raise ConfigError(
            f"Config file {path} does not exist; pass an existing YAML file to --config."
        )
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"Config file {path} is not valid YAML{where}; fix its syntax.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {path} must hold a mapping of sections (run:, data:, ...).")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """Split `dotted.key=value`; the value is parsed as YAML (`[a,b]` is a list, `3` an int)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"--set {item!r} is not of the form dotted.key=value (e.g. train.lr=0.01)."
        )
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        if raw.strip()[:1] in ("[", "{"):  # meant as a list or mapping: say so, not "a string"
            raise ConfigError(
                f"--set {item!r}: the value of {key} is not a valid YAML list or mapping; quote "
                "items that hold [ ] { } or commas (e.g. ['partition.part_weights=[1,2]'])."
            ) from None
        value = raw
    return key, value


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set `tree[a][b][c] = value` for key `a.b.c`, creating mappings on the way."""
    *parents, leaf = key.split(".")
    node = tree
    for i, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parents[: i + 1])
            raise ConfigError(f"--set {key}: {where} is a value, not a section.")
        node = child
    node[leaf] = value


def validate(tree: dict[str, Any], source: str, sources: dict[str, str] | None = None) -> LeoConfig:
    """Validate a raw tree; the first problem becomes one sentence naming the key and where
    it came from (`sources` maps keys set by `--set` to that flag)."""
    try:
        return LeoConfig.model_validate(tree)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = field_path(err["loc"]) or "(top level)"
        given = sources or {}
        # A section-wide check (key `model`) names the --set flags inside that section.
        inside = [flag for k, flag in given.items() if k.startswith(key + ".")]
        # A key below a --set value (`launch.emulate={...}`) names that flag.
        above = [f for k, f in given.items() if key.startswith((k + ".", k + "[]"))]
        source = given.get(key) or next(iter(above), None) or (", ".join(inside) or source)
        section = key.split(".")[0]
        listed = f"`leo config keys {section}`" if section in sections() else "`leo config keys`"
        if err["type"] == "extra_forbidden":
            near = closest_key(key)
            guess = f"did you mean {near}? " if near else "check the spelling; "
            raise ConfigError(
                f"Unknown config key {key!r} in {source}; {guess}{listed} lists the valid keys."
            ) from None
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        msg = err["msg"].removeprefix("Value error, ")  # our validators' own sentences
        allowed = allowed_values(key)
        items = value if isinstance(value, list) else [value]
        wrong = [v for v in items if isinstance(v, str) and v not in allowed]
        near = closest(wrong[0], allowed) if wrong and allowed else None
        guess = f"; did you mean {near}?" if near else ""
        raise ConfigError(
            f"Config key {key!r} in {source}: {msg}{shown}{guess} ({listed} lists every key "
            "with its values)."
        ) from None


def field_path(loc: tuple[int | str, ...]) -> str:
    """The dotted config key of an error location, without pydantic's union-branch suffixes."""
    model: type[BaseModel] | None = LeoConfig
    parts: list[str] = []
    for part in loc:
        if model is None:  # below a leaf field: pydantic's own branch names
            break
        if isinstance(part, int) and parts:  # an item of a list of sections
            parts[-1] += "[]"
            continue
        parts.append(str(part))
        field = model.model_fields.get(str(part))
        if field is None:  # an unknown key
            break
        model = section_of(field.annotation) or list_of_sections(field.annotation)
    return ".".join(parts)


def dump_config(cfg: LeoConfig) -> str:
    """The resolved config as YAML, loadable again with `--config`."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def write_resolved(cfg: LeoConfig) -> Path:
    """Write `<out_dir>/resolved_config.yaml` atomically and return its path."""
    out = cfg.run.folder
    path = RunDir(out).config
    try:
        out.mkdir(parents=True, exist_ok=True)
        files.write_text(path, dump_config(cfg))  # a fresh temporary file, then a rename
    except OSError as exc:
        raise ConfigError(
            f"run.out_dir={out} cannot be written ({exc.strerror}); choose a writable folder."
        ) from None
    return path


# Where each node is and where it sees the shared files; every other key must match.
PER_NODE_KEYS = ("launch.node_rank", "launch.master_addr", "run.out_dir", "data.root")


def config_fingerprint(cfg: LeoConfig) -> str:
    """sha256 of the resolved config, less the keys that may differ between nodes: what the
    launcher and every worker compare."""
    tree = cfg.model_dump(mode="json")
    for key in PER_NODE_KEYS:
        section, name = key.split(".")
        del tree[section][name]
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()
