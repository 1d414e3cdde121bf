"""Declarative conversion between dataclasses and the wire: extFields (flat strings) and JSON bodies.

A header or body is a frozen, keyword-only dataclass. Each field's wire name is
its camelCase name unless ``wire("name")`` overrides it; a field without a
default is required. Values are read leniently, as the clients send them
(numbers as strings, enums as ordinals or names, booleans as ``"true"``), and
written the way Java writes them. Every failure is an InvalidParameterError
naming the class and the wire field.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sluice.errors import InvalidParameterError
from sluice.speedups import C

__all__ = ["camel", "from_ext", "from_jsonable", "to_ext", "to_jsonable", "wire"]

T = TypeVar("T")
_INT_RE = re.compile(r"[+-]?\d+")
_JAVA_LONG = (-(2**63), 2**63 - 1)


def wire(name: str | None = None, *, default: Any = dataclasses.MISSING, enum: tuple[str, ...] | None = None,
         default_factory: Any = dataclasses.MISSING) -> Any:
    """A field with an explicit wire name and/or enum names (an int on the wire is read as ``enum[int]``)."""
    meta: dict[str, Any] = {}
    if name is not None:
        meta["wire"] = name
    if enum is not None:
        meta["enum"] = enum
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class _Field(typing.NamedTuple):
    name: str
    wire: str
    tp: Any
    optional: bool
    required: bool
    default: Any
    factory: Any
    enum: tuple[str, ...] | None


_PLANS: dict[type, tuple[_Field, ...]] = {}


def _plan(cls: type) -> tuple[_Field, ...]:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            optional = False
            if _is_union(tp):
                args = [a for a in typing.get_args(tp) if a is not type(None)]
                optional = len(args) < len(typing.get_args(tp))
                tp = args[0] if len(args) == 1 else tp
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
            out.append(_Field(f.name, f.metadata.get("wire", camel(f.name)), tp, optional, required, f.default,
                              factory, f.metadata.get("enum")))
        plan = _PLANS[cls] = tuple(out)
    return plan


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _default(f: _Field) -> Any:
    return f.factory() if f.factory is not None else f.default


def _bad(where: str, message: str) -> InvalidParameterError:
    return InvalidParameterError(f"{where}: {message}")


def _missing(f: _Field, where: str) -> Any:
    """The value of a field absent (or null) on the wire: refused if it has no default and is not
    Optional, None if it is Optional without a default, else its default."""
    if f.required and not f.optional:
        raise _bad(where, "the field is missing")
    return None if f.required else _default(f)


# --------------------------------------------------------------------------------------------- scalars

def _to_int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise _bad(where, f"expected an integer, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        n = int(value.strip())
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    else:
        raise _bad(where, f"expected an integer, got {value!r}")
    if not _JAVA_LONG[0] <= n <= _JAVA_LONG[1]:
        raise _bad(where, f"{n} does not fit a 64-bit integer")
    return n


def _to_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):  # Java Boolean.parseBoolean: only "true" (any case) is true
        return value.strip().lower() == "true"
    if isinstance(value, int):
        return value != 0
    raise _bad(where, f"expected a boolean, got {value!r}")


def _to_str(value: Any, where: str, enum: tuple[str, ...] | None) -> str:
    if enum is not None and isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < len(enum):
            return enum[value]
        raise _bad(where, f"enum ordinal {value} is out of range 0..{len(enum) - 1}")
    if isinstance(value, str):
        if enum is not None and value.strip().isdigit():
            return _to_str(int(value), where, enum)
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    raise _bad(where, f"expected a string, got {type(value).__name__}")


def _scalar_to_wire(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


# -------------------------------------------------------------------------------------------- extFields

def from_ext(cls: type[T], ext: Mapping[str, str]) -> T:
    """Build a header dataclass from a command's extFields (with a reader generated once per class)."""
    reader = _READERS.get(cls)
    if reader is None:
        reader = _READERS[cls] = _compile_reader(cls)
    return reader(ext)


_READERS: dict[Any, Any] = {}  # by class (from_ext), or by class and keys (keyed_reader)


def keyed_reader(cls: type[T], keys: Mapping[str, str]) -> Callable[[Mapping[str, str]], T]:
    """from_ext for ``cls`` reading each field named in ``keys`` (field name -> ext key) under that key instead
    of its wire name, as compiled as from_ext's own (SendMessageRequestHeaderV2's letters); errors still name
    the wire name. Generated once per class and keys."""
    cache_key = (cls, tuple(sorted(keys.items())))
    reader = _READERS.get(cache_key)
    if reader is None:
        reader = _READERS[cache_key] = _compile_reader(cls, keys)
    return reader  # type: ignore[no-any-return]


def _compile_reader(cls: type[T], keys: Mapping[str, str] | None = None) -> Any:
    """from_ext for one class as straight-line code, the same steps as _from_ext_generic's loop without
    its per-field dispatch: every request is parsed through one (docs/protocol.md has the figures)."""
    env: dict[str, Any] = {"cls": cls, "conv": _convert, "bad": _bad}
    lines = ["def read(ext):", " g = ext.get"]
    for i, f in enumerate(_plan(cls)):
        where = f"{cls.__name__}.{f.wire}"
        key = f.wire if keys is None else keys.get(f.name, f.wire)
        env[f"w{i}"], env[f"t{i}"], env[f"e{i}"], env[f"d{i}"], env[f"f{i}"] = key, f.tp, f.enum, f.default, f.factory
        lines.append(f" v{i} = g(w{i})")
        lines.append(f" if v{i} is None:")
        if f.required and not f.optional:
            lines.append(f"  raise bad({where!r}, 'the field is missing')")
        elif f.required:
            lines.append("  pass")
        else:
            lines.append(f"  v{i} = f{i}()" if f.factory is not None else f"  v{i} = d{i}")
        if f.tp is str and f.enum is None:
            lines.append(f" elif type(v{i}) is not str:")
        elif f.tp is int:
            lines.append(f" elif type(v{i}) is str and v{i}.isdigit() and v{i}.isascii() and len(v{i}) < 19:")
            lines.append(f"  v{i} = int(v{i})")
            lines.append(" else:")
        elif f.tp is bool:  # what every client sends, without the general conversion
            lines.append(f" elif v{i} == 'false':")
            lines.append(f"  v{i} = False")
            lines.append(f" elif v{i} == 'true':")
            lines.append(f"  v{i} = True")
            lines.append(" else:")
        else:
            lines.append(" else:")
        lines.append(f"  v{i} = conv(t{i}, v{i}, {where!r}, e{i})")
    plan = _plan(cls)
    if hasattr(cls, "__post_init__") or not all(f.name in getattr(cls, "__slots__", ()) for f in plan):
        args = ", ".join(f"{f.name}=v{i}" for i, f in enumerate(plan))
        lines.append(f" return cls({args})")
    else:  # a frozen slots dataclass's __init__ sets each field through object.__setattr__, the slower road
        lines.append(" o = new(cls)")
        for i, f in enumerate(plan):
            env[f"s{i}"] = cls.__dict__[f.name].__set__
            lines.append(f" s{i}(o, v{i})")
        lines.append(" return o")
        env["new"] = object.__new__
    exec("\n".join(lines), env)  # noqa: S102 - the source is built from the dataclass's own field names
    read = env["read"]
    spec = _c_spec(cls, keys, read)
    return read if spec is None else functools.partial(C.read_header, spec)  # type: ignore[union-attr]


_C_KINDS = {str: 0, int: 1, bool: 2}


def _c_spec(cls: type, keys: Mapping[str, str] | None, read: Any) -> tuple[Any, ...] | None:
    """speedups.read_header's spec for the reader ``read`` (its twin, and its fallback for any value but
    what clients send), or None where C does not apply: no extension, a field C does not read (an enum, a
    default factory, a type other than str, int or bool), or a class built through its __init__."""
    if C is None or not hasattr(C, "read_header"):
        return None
    plan = _plan(cls)
    if hasattr(cls, "__post_init__") or not all(f.name in getattr(cls, "__slots__", ()) for f in plan):
        return None
    offsets = C.slot_offsets(cls, tuple(f.name for f in plan))
    if offsets is None:
        return None
    fields = []
    for f, off in zip(plan, offsets):
        kind = _C_KINDS.get(f.tp)
        if kind is None or f.enum is not None or f.factory is not None:
            return None
        missing = 0 if f.required and not f.optional else 1 if f.required else 2
        fields.append((f.wire if keys is None else keys.get(f.name, f.wire), kind, missing,
                       None if missing != 2 else f.default, off))
    return cls, read, tuple(fields)


def _from_ext_generic(cls: type[T], ext: Mapping[str, str]) -> T:
    """The reference from_ext (tests hold the generated readers equal to it)."""
    kwargs: dict[str, Any] = {}
    for f in _plan(cls):
        raw = ext.get(f.wire)
        if raw is None:
            kwargs[f.name] = _missing(f, f"{cls.__name__}.{f.wire}")
            continue
        if type(raw) is not str:
            kwargs[f.name] = _convert(f.tp, raw, f"{cls.__name__}.{f.wire}", f.enum)
        elif f.tp is str and f.enum is None:
            kwargs[f.name] = raw
        elif f.tp is int and raw.isdigit() and raw.isascii() and len(raw) < 19:
            kwargs[f.name] = int(raw)  # the common case, without the regex and range checks
        else:
            kwargs[f.name] = _convert(f.tp, raw, f"{cls.__name__}.{f.wire}", f.enum)
    return cls(**kwargs)


def to_ext(obj: Any) -> dict[str, str]:
    """Render a header dataclass as extFields; ``None`` fields are left out."""
    out: dict[str, str] = {}
    for f in _plan(type(obj)):
        value = getattr(obj, f.name)
        if value is not None:
            out[f.wire] = _scalar_to_wire(value)
    return out


# --------------------------------------------------------------------------------------------- JSON

#: (typing.get_origin, typing.get_args) of each composite field type met, looked up once.
_SHAPES: dict[Any, tuple[Any, tuple[Any, ...]]] = {}


def _convert(tp: Any, value: Any, where: str, enum: tuple[str, ...] | None = None) -> Any:
    if value is None:
        raise _bad(where, "must not be null")
    if tp is int:
        return _to_int(value, where)
    if tp is str:
        return _to_str(value, where, enum)
    if tp is bool:
        return _to_bool(value, where)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise _bad(where, f"expected a number, got {value!r}") from None
    if tp is Any:
        return value
    shape = _SHAPES.get(tp)
    if shape is None:
        shape = _SHAPES[tp] = (typing.get_origin(tp), typing.get_args(tp))
    origin, args = shape
    if origin in (list, tuple, frozenset, set):
        if not isinstance(value, list):
            raise _bad(where, f"expected a list, got {type(value).__name__}")
        (item_tp, *_) = args
        if item_tp is str and all(type(v) is str for v in value):  # tagsSet: as it comes
            return origin(value)
        items = [_convert(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return origin(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise _bad(where, f"expected an object, got {type(value).__name__}")
        key_tp, val_tp = args
        return {_convert(key_tp, k, f"{where} key {k!r}"): _convert(val_tp, v, f"{where}[{k!r}]")
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_jsonable(tp, value, where)
    raise TypeError(f"unsupported field type {tp!r} at {where}")


def from_jsonable(cls: type[T], data: Any, where: str | None = None) -> T:
    """Build a body dataclass from parsed JSON; unknown keys are ignored."""
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise _bad(where, f"expected an object, got {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for f in _plan(cls):
        raw = data.get(f.wire)
        if raw is None:
            kwargs[f.name] = _missing(f, f"{where}.{f.wire}")
            continue
        # The common cases as they come (a JSON string for a str, an in-range int, a bool), without
        # _convert and the path string it would be given for its errors: every heartbeat is decoded here.
        tp, kind = f.tp, type(raw)
        if kind is tp and (kind is bool or (kind is str and f.enum is None)
                           or (kind is int and _JAVA_LONG[0] <= raw <= _JAVA_LONG[1])):
            kwargs[f.name] = raw
            continue
        kwargs[f.name] = _convert(tp, raw, f"{where}.{f.wire}", f.enum)
    return cls(**kwargs)


def to_jsonable(obj: Any) -> Any:
    """Plain JSON values for a body dataclass (dict keys as strings, sets as lists); ``None`` left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in _plan(type(obj)):
            value = getattr(obj, f.name)
            if value is not None:
                out[f.wire] = to_jsonable(value)
        return out
    if isinstance(obj, dict):
        return {_scalar_to_wire(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    return obj
