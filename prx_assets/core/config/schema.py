"""Config values validated by pydantic v2, errors said the project's way.

Every config file's entries are typed once: the dataclasses the code uses (``IngestSettings``,
``CaptionerSpec``, ``Recipe``'s ``Dedup``, ...) and the pydantic models of each file's shape
(:mod:`prx_assets.core.config.files`) are validated strictly (no ``"92"`` for an int, no
``true`` for a number, no unknown key). :func:`validate` turns the first error into a
:class:`~prx_assets.errors.ConfigError` of the form ``file: entry: key=value: expected X (fix:
...)``. The same models give the JSON Schemas published in ``docs/schemas/`` (editors validate
the YAML files with them).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from prx_assets.errors import ConfigError

T = TypeVar("T")
#: How every config type validates: strictly, unknown keys refused.
STRICT = ConfigDict(strict=True, extra="forbid")
#: What a value of each JSON type is called in an error, and an example of one.
_TYPES = {"int": ("an int", "92"), "float": ("a float", "4.0"), "string": ("a str", "'text'"),
          "bool": ("a bool", "true"), "list": ("a list", "[a, b]"), "tuple": ("a list", "[a, b]"),
          "dict": ("a mapping", "{key: value}"), "model": ("a mapping", "{key: value}"),
          "dataclass": ("a mapping", "{key: value}")}


@functools.cache
def model_of(cls: type) -> type[BaseModel]:
    """The strict pydantic model of a config type: the class itself when it is one, else a model
    with the fields, types and defaults of the dataclass (which stays a plain dataclass: the jobs
    that import it do not import pydantic, and its identity methods stay as they are)."""
    if issubclass(cls, BaseModel):
        return cls
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], f.default)
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (hints[f.name], ...)
    return create_model(cls.__name__, __config__=STRICT, __doc__=cls.__doc__, **fields)


def validate(cls: type[T], raw: Any, path: str, where: str | None, what: str = "key") -> T:
    """``raw`` (parsed YAML) as a ``cls``, or a ConfigError naming the file, the entry, the value,
    what was expected and the fix. ``what`` names an unknown key (``unknown ingest setting 'x'``)."""
    model = model_of(cls)
    try:
        value = model.model_validate_json(json.dumps(raw, default=str))
    except ValidationError as e:
        raise error_of(e, model, raw, path, where, what) from None
    if model is cls:
        return value  # type: ignore[return-value]
    return cls(**{name: getattr(value, name) for name in model.model_fields})


def _key(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _value(raw: Any, loc: Sequence[Any]) -> Any:
    for part in loc:
        try:
            raw = raw[part]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _walk(cls: type[BaseModel], loc: Sequence[Any]) -> tuple[Any, tuple[bool, Any]]:
    """The type at ``loc`` in ``cls`` (through lists and nested models), with ``(optional, default)``
    of the last field on the way."""
    found: tuple[bool, Any] = (False, dataclasses.MISSING)
    current: Any = cls
    for part in loc:
        if isinstance(part, int):
            args = [a for a in typing.get_args(current) if a is not type(None)]
            current = typing.get_args(args[0])[0] if args and typing.get_args(args[0]) else (args[0] if args else None)
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None, (False, dataclasses.MISSING)
        info = fields[part]
        found = ("None" in str(info.annotation), info.default)
        current = next((a for a in typing.get_args(info.annotation) if hasattr(a, "model_fields")), info.annotation)
    return current, found


def error_of(err: ValidationError, cls: type[BaseModel], raw: Any, path: str, where: str | None, what: str) -> ConfigError:
    """The first error of ``err`` as a ConfigError in the project's form (the others counted)."""
    errors = err.errors()
    error = _one(errors[0], cls, raw, what)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ConfigError(error[0] + more, path=path, entry=where, fix=error[1])


def _one(first: Any, cls: type[BaseModel], raw: Any, what: str) -> tuple[str, str]:
    """``(message, fix)`` of one pydantic error."""
    loc, kind, ctx = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))], \
        first["type"], first.get("ctx") or {}
    if loc and kind != "union_tag_invalid" and isinstance(raw, Mapping) and loc[0] == raw.get("kind"):
        loc = loc[1:]  # the tag of a discriminated union (a source's kind) is not a key
    key, value, last = _key(loc), _value(raw, loc), str(loc[-1]) if loc else "value"
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        parent, _ = _walk(cls, loc[:-1])
        known = sorted(getattr(parent, "model_fields", {}))
        return f"unknown {what} {key!r}", f"use one of: {', '.join(known)}" if known else "remove it (see docs/schemas/)"
    if kind in ("missing", "missing_argument", "missing_keyword_only_argument"):
        return f"missing '{key}'", f"add {last}: ..."
    if kind == "union_tag_invalid":
        return (f"unknown {ctx.get('discriminator', 'kind').strip(chr(39))} {ctx.get('tag')!r}",
                f"use one of: {ctx.get('expected_tags', '')}".replace("'", ""))
    base = kind.split("_")[0]
    if kind.endswith(("_type", "_parsing", "_from_float")) and base in _TYPES:
        _, (optional, default) = _walk(cls, loc)
        name, example = _TYPES[base]
        shown = f" (default {default!r})" if default not in (dataclasses.MISSING, None) and \
            not callable(default) and repr(default) != "PydanticUndefined" else ""
        said = f"{key}={value!r}: expected" if loc else "expected"
        return (f"{said} {name}{' or null' if optional else ''}, got {type(value if loc else raw).__name__}",
                f"write {last}: {example}{shown}")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "")
        return f"{key}={value!r} must be {op} {bound}", f"write {last}: a value {op} {bound}"
    if kind == "literal_error":
        return f"{key}={value!r} is not supported", f"use one of: {ctx.get('expected', '')}".replace("'", "")
    if kind == "string_pattern_mismatch":
        return f"{key}={value!r} is invalid", "use lowercase letters, digits and '_' starting with a letter"
    return f"{key}={value!r}: {first['msg']}", "see docs/schemas/"


def mapping(raw: Any, path: str, where: str | None, example: str) -> Mapping[str, Any]:
    """``raw`` when it is a mapping, else a ConfigError showing ``example``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"expected a mapping, got {type(raw).__name__}", path=path, entry=where,
                          fix=f"write {example}")
    return raw
