"""Reading config files into the schema: YAML, ``extends``, ``--set``, checks, one-line errors.

``extends: base.yaml`` (a path relative to the file) inherits another file, deep-merged;
``--set section.key=value`` overrides on the command line (values parsed as YAML
scalars). Every key remembers which file (or ``--set``) set it last, so a mistake stops
here with a one-line ``ConfigError`` naming that file, the key and what is allowed
(with a did-you-mean for unknown keys), before any model is built.

The fields themselves, their docs and bounds are in ``gpt.config.schema``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml

import gpt.config.architecture as architecture
from gpt.common.errors import UserError, clipped, quoted
from gpt.config.schema import REQUIRED, Config
from gpt.config.sizes import SIZES


class ConfigError(UserError):
    """A mistake in a config file or override."""


# ---------------------------------------------------------------------------- reading

OVERRIDE = "--set"  # the "file" named for keys that came from the command line


CONFIG_LIMIT = 1 << 20  # bytes: the largest config file read (the write-up's is about 2 KB)
OVERRIDE_LIMIT = 64 << 10  # characters: the largest --set
YAML_LIMIT = 100_000  # values a YAML document may hold once its aliases are expanded (a config has a few hundred)


def parse_yaml(text: str, where: str) -> Any:
    """``text`` (from ``where``: a file, ``--set``) as plain YAML data. A document whose anchors and aliases
    expand past ``YAML_LIMIT`` values (a "billion laughs"), or that contains itself, is refused before it is
    built; every error is one line."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses control characters at once
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML{at}: {clipped(problem)}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: nested too deeply for a config") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Count the values ``root`` holds with every alias expanded, each shared node counted once per use
    but visited once (so a bomb costs no more than its text), and stop at ``YAML_LIMIT``."""
    sizes: dict[int, int] = {}
    ancestors: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        children = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else (node.value if isinstance(node, yaml.SequenceNode) else [])
        )
        if expanded:
            ancestors.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(node)] > YAML_LIMIT:
                raise ConfigError(
                    f"{where}: its anchors and aliases expand it past {YAML_LIMIT:,} values (a config holds a few "
                    "hundred); write the values out, or alias fewer times"
                )
        elif id(node) not in sizes:
            if id(node) in ancestors:
                raise ConfigError(f"{where}: a YAML alias refers to a value that contains it; a config is a tree")
            ancestors.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)


def _read_yaml(path: Path) -> dict:
    try:
        size = path.stat().st_size
        if size > CONFIG_LIMIT:
            raise ConfigError(
                f"{path}: {size:,} bytes, and a config file is at most {CONFIG_LIMIT:,} (the write-up's is about "
                "2 KB); is it the right file?"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); a config is a UTF-8 YAML file"
        ) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    data = parse_yaml(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of sections, got {type(data).__name__}")
    return data


def _leaves(data: dict, prefix: str = ""):
    """Dotted keys of every leaf (non-mapping value, or empty mapping) of ``data``."""
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from _leaves(v, key + ".")
        else:
            yield key


def _merge(base: dict, top: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in ``top`` replaces."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _load_raw(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, dict[str, str]]:
    """The merged mapping of ``path`` and its ``extends`` chain, and which file set each key."""
    real = path.resolve()
    if real in seen:
        chain = " -> ".join(str(p) for p in (*seen, real))
        raise ConfigError(f"{path}: extends: circular inheritance ({chain})")
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    raw: dict = {}
    sources: dict[str, str] = {}
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: extends: expected a relative path (str), got {quoted(parent)}")
        parent_path = path.parent / parent
        if not parent_path.is_file():
            raise ConfigError(f"{path}: extends: {parent}: no such file (looked at {parent_path})")
        raw, sources = _load_raw(parent_path, (*seen, real))
    for key in _leaves(data):
        _set_source(sources, key, str(path))
    return _merge(raw, data), sources


def _set_source(sources: dict[str, str], key: str, source: str) -> None:
    """Record who set ``key``; the dict's order stays the order in which keys were last set."""
    sources.pop(key, None)
    sources[key] = source


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"model.norm_type=pytorch_rmsnorm"`` -> (["model", "norm_type"], "pytorch_rmsnorm")."""
    key, sep, value = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError(
            f"{OVERRIDE}: expected SECTION.KEY=VALUE (e.g. model.norm_type=pytorch_rmsnorm), got {quoted(text)}"
        )
    if len(text) > OVERRIDE_LIMIT:
        raise ConfigError(
            f"{OVERRIDE} {clipped(key, 80)}=...: {len(text):,} characters, and a --set is at most {OVERRIDE_LIMIT:,}; "
            "put a value that large in a config file"
        )
    parsed = parse_yaml(value, f"{OVERRIDE} {clipped(key, 80)}") if value.strip() else None
    return parts, parsed


def _apply_override(raw: dict, parts: list[str], value: Any) -> None:
    node = raw
    for i, p in enumerate(parts[:-1]):
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{OVERRIDE}: {'.'.join(parts)}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = value


# ------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


_NO = object()  # "does not fit this type"


def _coerce(tp: Any, value: Any) -> Any:
    """``value`` as type ``tp``, or ``_NO``. Ints are accepted as floats, and so are
    strings like ``1e-5`` (PyYAML reads an exponent without a dot as a string)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return None
                continue
            out = _coerce(arg, value)
            if out is not _NO:
                return out
        return _NO
    if origin is list:
        if not isinstance(value, list):
            return _NO
        items = [_coerce(typing.get_args(tp)[0], v) for v in value]
        return _NO if any(i is _NO for i in items) else items
    if tp is bool:
        return value if isinstance(value, bool) else _NO
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                out = float(value)
            except ValueError:
                return _NO
            return out if math.isfinite(out) else _NO
        return _NO
    if tp is str:
        return value if isinstance(value, str) else _NO
    raise TypeError(f"config field type {tp!r} is not supported")


def _check_range(value: Any, meta: dict) -> str | None:
    """What is wrong with ``value`` given the field's constraints, or None."""
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{quoted(value)} is not a finite number"
    if meta["choices"] is not None and value not in meta["choices"]:
        return f"{quoted(value)} is not one of: {', '.join(meta['choices'])}"
    for op, ok, word in (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
        ("lt", lambda v, b: v < b, "<"),
    ):
        bound = meta[op]
        if bound is not None and not ok(value, bound):
            shown = bound if isinstance(bound, int) else f"{bound:g}"
            return f"{quoted(value)} is out of range; allowed: {word} {shown}"
    return None


def _build(cls: type, data: Any, prefix: str, sources: dict[str, str], root: str) -> Any:
    """Instantiate dataclass ``cls`` from ``data``, checking keys, types and ranges."""
    where = prefix.rstrip(".") or "top level"
    if not isinstance(data, dict):
        raise ConfigError(
            f"{sources.get(prefix.rstrip('.'), root)}: {where}: expected a mapping of keys, got {quoted(data)}"
        )
    if hasattr(cls, "upgrade"):  # a section written before its keys changed, read with the meaning it had
        data = cls.upgrade(data)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            dotted = f"{prefix}{key}"
            src = sources.get(dotted) or next((s for k, s in sources.items() if k.startswith(dotted + ".")), root)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean '{prefix}{close[0]}'? " if close else ""
            raise ConfigError(f"{src}: {clipped(dotted)}: unknown key; {hint}valid keys in {where}: {', '.join(names)}")

    def fail(name: str | tuple[str, ...], message: str):
        """Stop at key ``name``; of several keys, the one set last (where the clash was made)."""
        if isinstance(name, tuple):
            order = list(sources)
            name = max(name, key=lambda n: order.index(prefix + n) if prefix + n in order else -1)
        raise ConfigError(f"{sources.get(prefix + name, root)}: {prefix}{name}: {message}")

    values = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            values[f.name] = _build(tp, data.get(f.name, {}), f"{prefix}{f.name}.", sources, root)
            continue
        if f.name not in data or (data[f.name] is None and f.default is REQUIRED):  # --help-config prints null
            if f.default is REQUIRED:
                fail(f.name, f"missing required value ({f.metadata['doc']})")
            continue
        value = _coerce(tp, data[f.name])
        if value is _NO:
            fail(f.name, f"expected {_type_name(tp)}, got {quoted(data[f.name])}")
        problem = _check_range(value, f.metadata)
        if problem:
            fail(f.name, problem)
        values[f.name] = value
    obj = cls(**values)
    if hasattr(obj, "validate"):
        obj.validate(fail)
    return obj


# ------------------------------------------------------------------------- public API


def config_from_dict(data: dict, source: str = "<dict>") -> Config:
    """Validate a plain mapping (as read from YAML) into a ``Config``."""
    return _build(Config, data, "", {k: source for k in _leaves(data)}, source)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = (), built: bool = False) -> Config:
    """Read ``path`` (following ``extends``), apply ``--set`` overrides, validate. ``built``: the config of a
    model already trained (a checkpoint's): settings a new config refuses because they cannot change the model
    are read as the model they built (``architecture.as_built``), each said in a line on stderr."""
    path = Path(path)
    raw, sources = _load_raw(path)
    for text in overrides:
        parts, value = parse_override(text)
        _apply_override(raw, parts, value)
        _set_source(sources, ".".join(parts), OVERRIDE)
    _check_size(raw, sources)
    if built and isinstance(raw.get("model"), dict):
        raw["model"], notes = architecture.as_built(raw["model"])
        for note in notes:
            print(f"note: {path}: {note}", file=sys.stderr)
    return _build(Config, raw, "", sources, str(path))


def _check_size(raw: dict, sources: dict[str, str]) -> None:
    """Refuse a model dimension that contradicts model.size where it was given on purpose: by ``--set``, or in
    the file that names the size (a size replaces the dimensions of the files it extends: that is its job)."""
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    size = SIZES.get(model.get("size")) if isinstance(model.get("size"), str) else None
    if size is None:
        return
    for key, value in size.settings().items():
        given, source = model.get(key), sources.get(f"model.{key}")
        if given is not None and given != value and source in (OVERRIDE, sources.get("model.size")):
            raise ConfigError(
                f"{source}: model.{key}: {quoted(given)} contradicts model.size {size.name}, which sets "
                f"model.{key}={value} (n_layers x d_model); drop one of them"
            )


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def flatten(data: dict, prefix: str = "") -> dict:
    """``{"model": {"norm_type": x}}`` -> ``{"model.norm_type": x}``."""
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) of every field where the two configs differ."""
    a, b = flatten(config_to_dict(old)), flatten(config_to_dict(new))
    return [(k, a[k], b[k]) for k in a if a[k] != b[k]]


def dump_config(cfg: Config) -> str:
    """The fully resolved config as YAML; ``load_config`` of it gives an equal Config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def _yaml_value(value: Any) -> str:
    """``value`` as one line of YAML that reads back as the same value: ``null``, ``false``, ``1.0e-05``, ``[]``."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def describe_fields() -> str:
    """Every config key with its default, type and doc, as YAML (``train.py --help-config``): pasted into a
    file with the required keys filled in, it loads to the defaults."""
    lines = [
        "# Every config key with its default (train.py --help-config). Valid YAML: fill in run.name and one of",
        "# train.tokens / train.steps / train.tokens_per_param, delete what you keep at its default.",
    ]
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        lines.append(f"{section.name}:  # {cls.__doc__.strip()}")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            required = default is REQUIRED
            value = _yaml_value(None if required else default)
            extra = f" (one of: {', '.join(f.metadata['choices'])})" if f.metadata["choices"] else ""
            must = "required; " if required else ""
            lines.append(f"  {f.name}: {value}  # {must}{_type_name(hints[f.name])}{extra}; {f.metadata['doc']}")
    return "\n".join(lines)
