"""A small schema language over frozen dataclasses: `from_data(cls, value, where)` builds a dataclass tree from
JSON data and raises SchemaError naming the key path (`rollout.updates[0].post_process`) and what was expected.

Every record fp8check writes to disk (the typed engine record, the payload and trainer metadata of a snapshot
manifest) is a dataclass tree validated here once, when it is read: checks then read fields, never dict keys,
and never see malformed metadata. The field annotations are the schema (one source). The run configuration
(`harness.config.SyncConfig.from_dict`) is validated here too, so a config file and a record read by one rule.

Besides builtin scalars, containers and dataclasses: a StrEnum field takes one of its values (a string; the error
lists them), `tuple[int, int]` is a fixed-length list (`tuple[int, ...]` any length), a float field takes an
integer, and a type with a `__from_data__(value, where)` classmethod builds itself (a recipe: a name or a mapping
of overrides), raising SchemaError.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import lru_cache
from typing import Any, Union

from .errors import did_you_mean


class SchemaError(ValueError):
    """Data does not follow its schema; the message names the key path and what was expected."""


def _name(tp) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = typing.get_args(tp)
        if _fixed(tp):
            if len(set(args)) == 1 and args[0] in _PLURAL:
                return f"a list of {len(args)} {_PLURAL[args[0]]}"
            return f"a list [{', '.join(_name(a) for a in args)}]"
        if args and args[0] in _PLURAL:
            return f"a list of {_PLURAL[args[0]]}"
        return f"a list of {_name(args[0])}" if args else "a list"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return f"one of {_values(tp)}"
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"a mapping of {_name(k)} -> {_name(v)}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if tp is Any:
        return "any value"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


_PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}


def _fixed(tp) -> bool:
    """`tuple[A, B]` (that many items, each its own type), not `tuple[A, ...]` or a list."""
    args = typing.get_args(tp)
    return typing.get_origin(tp) is tuple and bool(args) and args[-1] is not Ellipsis


def _values(tp) -> tuple:
    return tuple(m.value for m in tp)


def _kind(v) -> str:
    """What was found: a scalar shown as itself (short), a container by its kind."""
    if isinstance(v, (str, int, float)) and not isinstance(v, enum.Enum):
        shown = repr(v)
        return shown if len(shown) <= 40 else shown[:37] + "..."
    return {dict: "a mapping", list: "a list", tuple: "a list", type(None): "null"}.get(type(v), type(v).__name__)


@lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def from_data(tp, value, where: str):
    """Build `tp` (a dataclass, a builtin scalar, list/tuple/dict of those, or a union with None) from JSON data."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    build = getattr(tp, "__from_data__", None)
    if build is not None:
        return build(value, where)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return from_data(a, value, where)
            except SchemaError as e:
                errors.append(e)
        if len(errors) == 1:        # one candidate (`X | None`): its own error names the key inside it
            raise errors[0]
        raise SchemaError(f"{where} must be {_name(tp)}, got {_kind(value)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SchemaError(f"{where} must be {_name(tp)} ({tp.__name__}), got {_kind(value)}")
        hints = _hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise SchemaError(f"{where or 'top level'}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], known)}; "
                              f"expected keys: {', '.join(sorted(known))}")
        kw = {}
        for f in dataclasses.fields(tp):
            if f.name not in value:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    key = f"{where}.{f.name}" if where else f.name
                    raise SchemaError(f"{key}: missing ({_name(hints[f.name])} expected)")
                continue
            kw[f.name] = from_data(hints[f.name], value[f.name], f"{where}.{f.name}" if where else f.name)
        return tp(**kw)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise SchemaError(f"{where} must be {_name(tp)}, got {_kind(value)}")
        args = typing.get_args(tp)
        if _fixed(tp):
            if len(value) != len(args):
                raise SchemaError(f"{where} must be {_name(tp)}, got {len(value)} item{'s' * (len(value) != 1)}")
            return tuple(from_data(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        item = args[0] if args else Any
        out = [from_data(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{where} must be {_name(tp)}, got {_kind(value)}")
        kt, vt = typing.get_args(tp)
        return {from_data(kt, k, f"{where} key"): from_data(vt, v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        if isinstance(value, str) and value in _values(tp):
            return tp(value)
        raise SchemaError(f"{where}: {_kind(value)} is not one of {_values(tp)}")
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(f"{where} must be a number, got {_kind(value)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{where} must be an integer, got {_kind(value)}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise SchemaError(f"{where} must be {_name(tp)}, got {_kind(value)}")
        return value
    raise TypeError(f"schema: unsupported type {tp!r} at {where}")


def to_data(obj):
    """A dataclass tree as JSON data (tuples become lists, enum members their values)."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_data(v) for k, v in obj.items()}
    return obj


__all__ = ["SchemaError", "from_data", "to_data"]
