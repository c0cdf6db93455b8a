"""Load TOML into frozen, keyword-only dataclasses, validated once at the edge.

Every config class in hilrec is ``@dataclass(frozen=True, kw_only=True)``. :func:`from_mapping`
builds one from a plain mapping (parsed TOML), walking the type hints: nested dataclasses,
``Literal``, ``X | None``, ``tuple[...]``, ``list[...]``, ``dict[str, ...]``, ``Path``, and the
scalars. Unknown keys, missing required keys and wrong types raise :class:`ConfigError` with the
dotted key path, so a person sees ``config key 'follower.port' in configs/hil.toml: ...``.

A dataclass may define ``validate(self) -> None`` to check cross-field rules; it should raise
``ConfigError`` naming the key (relative keys are prefixed automatically).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from hilrec.daemon.errors import ConfigError, FlagError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML file as a mapping; a missing or malformed file is a ConfigError naming it."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError("<file>", f"no such file: {path}", source=str(path)) from exc
    except IsADirectoryError as exc:
        raise ConfigError("<file>", f"{path} is a folder, not a TOML file", source=str(path)) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("<file>", f"not valid TOML: {exc}", source=str(path)) from exc


def load_toml(cls: type[T], path: str | Path, *, section: str | None = None) -> T:
    """Parse ``path`` and build ``cls`` from it (or from its ``[section]``)."""
    data = read_toml(path)
    if section is not None:
        if section not in data:
            raise ConfigError(section, "missing section", source=str(path))
        data = data[section]
    return from_mapping(cls, data, source=str(path), prefix=section or "")


@contextlib.contextmanager
def flag_errors(flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """Inside, a ConfigError about a value that came from a flag names the flag: ``--episodes``
    for the key ``episodes`` (or ``flags[key]`` where the flag is spelled otherwise)."""
    try:
        yield
    except FlagError:
        raise
    except ConfigError as exc:
        top = exc.key.split(".")[0]
        flag = (flags or {}).get(top, "--" + top.replace("_", "-"))
        raise FlagError(flag, exc.problem) from None


def from_mapping(cls: type[T], data: Mapping[str, Any], *, source: str | None = None, prefix: str = "") -> T:
    """Build the dataclass ``cls`` from ``data``; errors name the dotted key."""
    try:
        return _build(cls, data, prefix)
    except ConfigError as exc:
        if source is not None and exc.source is None:
            raise ConfigError(exc.key, exc.problem, source=source) from None
        raise


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _build(cls: type[T], data: Any, prefix: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(prefix or "<root>", f"expected a table, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(_join(prefix, unknown[0]), f"unknown key (known keys: {', '.join(sorted(fields))})")
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        key = _join(prefix, name)
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(key, "required key is missing")
            continue
        kwargs[name] = _convert(hints[name], data[name], key)
    instance = cls(**kwargs)
    validate = getattr(instance, "validate", None)
    if callable(validate):
        try:
            validate()
        except ConfigError as exc:
            if prefix and not exc.key.startswith(prefix + "."):
                raise ConfigError(_join(prefix, exc.key), exc.problem) from None
            raise
    return instance


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    args = get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError as exc:
                errors.append(exc.problem)
        raise ConfigError(key, " or ".join(errors))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise ConfigError(key, f"must be one of {allowed}, got {value!r}") from None
    if origin is Literal:
        if value not in args:
            raise ConfigError(key, f"must be one of {', '.join(repr(a) for a in args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, key)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected an array, got {type(value).__name__}")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            items = [_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
        elif origin is tuple and args:
            if len(value) != len(args):
                raise ConfigError(key, f"expected {len(args)} items, got {len(value)}")
            items = [_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))]
        else:
            inner = args[0] if args else Any
            items = [_convert(inner, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping, typing.Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"expected a table, got {type(value).__name__}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _convert(vt, v, _join(key, str(k))) for k, v in value.items()}
    if tp is Path:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a path string, got {type(value).__name__}")
        return Path(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(key, f"unsupported config type {tp!r}")  # a programming error, named anyway
