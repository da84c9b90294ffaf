"""One registry per component kind (model, pipeline, strategy, data), and typed options from a config node.

A component is a dataclass: its fields are its options (choices as `Literal`s) and its methods do its work. Nothing
here imports TensorFlow, so validation runs before TensorFlow starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import inspect
import operator
import pkgutil
import typing
from typing import Any, Callable, Literal, Mapping, Optional, Union

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from runner.errors import ConfigError

TARGET = "_target_"
Rule = tuple[Callable[[Any], bool], str]  # (check of a value, what is allowed): a component's `RULES[field]`


def positive(value: Any) -> bool:
    return value is None or value > 0


def non_negative(value: Any) -> bool:
    return value is None or value >= 0


def literal_values(annotation: Any) -> tuple | None:
    """The allowed values of a `Literal[...]` or `Optional[Literal[...]]` annotation, else None."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) is Union:
        for arg in typing.get_args(annotation):
            if typing.get_origin(arg) is Literal:
                return (*typing.get_args(arg), *([None] if type(None) in typing.get_args(annotation) else []))
    return None


def _plain(annotation: Any) -> Any:
    """An annotation OmegaConf 2.3 can check: Literal[...] becomes the type of its values."""
    values = literal_values(annotation)
    if values is None:
        return annotation
    if len({type(v) for v in values if v is not None}) > 1:  # e.g. Literal["auto", True, False]: checked by us
        return Any
    base = type(values[0])
    return Optional[base] if type(None) in typing.get_args(annotation) else base


def fields(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation of an options dataclass (its ClassVars excluded)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


@functools.cache
def schema(cls: type) -> type:
    """The dataclass OmegaConf and Hydra's ConfigStore type-check against: cls's fields, Literals as plain types,
    nested options dataclasses as their own schemas."""
    specs = []
    for f in dataclasses.fields(cls):
        annotation = fields(cls)[f.name]
        if dataclasses.is_dataclass(annotation):
            annotation = schema(annotation)
            default = {"default_factory": annotation}
        elif f.default_factory is not dataclasses.MISSING:
            default = {"default_factory": f.default_factory}
        else:
            default = {"default": f.default} if f.default is not dataclasses.MISSING else {}
        specs.append((f.name, _plain(annotation), dataclasses.field(**default)))
    return dataclasses.make_dataclass(cls.__name__, specs)


def _key(kind: str, key: str) -> str:
    return f"{kind}.{key}" if kind else key


def spelled(value: Any) -> str:
    """`value` as an override types it: null, true or false, else as Python writes it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _check_values(cls: type, values: dict[str, Any], kind: str) -> None:
    """Literal choices and `RULES` of cls, and of the options dataclasses nested in it."""
    for name, annotation in fields(cls).items():
        if dataclasses.is_dataclass(annotation):
            _check_values(annotation, values[name], _key(kind, name))
        allowed = literal_values(annotation)
        if allowed is not None and values[name] not in allowed:
            choices = ", ".join(spelled(a) for a in allowed)
            raise ConfigError(f"{_key(kind, name)}={values[name]!r} is not allowed; choose one of: {choices}")
    for key, rule in getattr(cls, "RULES", {}).items():
        check(_key(kind, key), values[key], rule)


def check(key: str, value: Any, rule: Rule) -> None:
    """Raise a ConfigError naming `key`, `value` and what `rule` allows when the value breaks it."""
    ok, allowed = rule
    if not ok(value):
        raise ConfigError(f"{key}={value!r} is not allowed; expected {allowed}")


def near(word: str, names: list[str], prefix: str = "", shown: int = 12, whose: str = "its keys") -> str:
    """'did you mean <prefix>.a or <prefix>.b?' for the names spelled like `word`, else `whose`: the names (up to
    `shown`)."""
    spell = [f"{prefix}.{n}" if prefix else n for n in names]
    close = [spell[names.index(n)] for n in difflib.get_close_matches(word, names, n=3)]
    more = f" (+{len(spell) - shown} more)" if len(spell) > shown else ""
    return f"did you mean {' or '.join(close)}?" if close else f"{whose}: {', '.join(spell[:shown])}{more}"


def unknown(cls: type, key: str, kind: str) -> str:
    """'; did you mean ...' of the dataclass at `key`'s parent (dotted, under cls), for a `key` it has no field for;
    '' where that parent is not one of cls's dataclasses."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        known, inner = list(fields(cls)), fields(cls).get(part)
        if part not in known:  # the first part it has no field for: the ones spelled like it
            return "; " + near(part, known, _key(kind, ".".join(parts[:i])) if i else kind)
        if not dataclasses.is_dataclass(inner):  # a value, not a section: not what is misspelt
            return ""
        cls = inner
    return ""


def typed_values(cls: type, node: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """`node`'s values checked against cls: types and unknown keys by OmegaConf, then Literal choices and the
    class's `RULES` (value ranges), a ConfigError naming the key, the value and what is allowed. The `_target_` key,
    which names the class, is left out."""
    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    for name, annotation in fields(cls).items():  # a section given as a value: OmegaConf's merge error names no key
        if dataclasses.is_dataclass(annotation) and name in plain and not isinstance(plain[name], Mapping):
            given = spelled(plain[name]) if plain[name] is None else repr(plain[name])  # null, 'P100'
            raise ConfigError(f"{_key(kind, name)}={given} is not allowed; expected its keys: "
                              f"{', '.join(fields(annotation))}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema(cls)), {k: v for k, v in plain.items() if k != TARGET})
    except OmegaConfBaseException as e:  # named by the component's key; the message's first line (the rest: detail)
        key, message = getattr(e, "full_key", None) or "", str(getattr(e, "msg", e)).splitlines()[0]
        if allowed := _type_allowed(cls, key, message):  # `link.bandwidth: fast`: what the key takes, with its unit
            value = functools.reduce(operator.getitem, key.split("."), plain)  # at the dotted key
            raise ConfigError(f"{_key(kind, key)}={value!r} is not allowed; expected {allowed}") from None
        near_by = unknown(cls, key, kind) if isinstance(e, ConfigKeyError) and key else ""
        raise ConfigError(f"{_key(kind, key)}: {message}{near_by}" if key else f"{kind or 'config'}: {message}") \
            from None
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:  # a field without a default (`???`) that the node does not give
        raise ConfigError(f"{_key(kind, missing[0])} is not set and has no default; give it "
                          f"({_key(kind, missing[0])}=...)")
    values = OmegaConf.to_container(merged, resolve=True)
    _check_values(cls, values, kind)
    return values


def _type_allowed(cls: type, key: str, message: str) -> str:
    """What a dotted `key` of cls allows, where OmegaConf refused a value of the wrong type (`could not be converted
    to Float`): its rule's words (a range, a unit, an example), else the type's; '' for any other refusal."""
    kinds = {"Float": "a number", "Integer": "an integer", "Boolean": "true or false"}
    wanted = next((words for name, words in kinds.items() if f"could not be converted to {name}" in message), "")
    if not wanted or "[" in key:  # another refusal, or an item of a list option (`shape[2]`): OmegaConf's words
        return ""
    *path, name = key.split(".")
    for part in path:  # down the nested options dataclasses to the one holding the key
        cls = fields(cls).get(part) if dataclasses.is_dataclass(cls) else None
    rule = getattr(cls, "RULES", {}).get(name)
    return rule[1] if rule else wanted


def _built(cls: type, values: dict[str, Any]) -> Any:
    """A `cls` of checked values, its nested options dataclasses built too."""
    kinds = fields(cls)
    return cls(**{k: _built(kinds[k], v) if dataclasses.is_dataclass(kinds.get(k)) else v for k, v in values.items()})


def locate(path: str, kind: str) -> Any:
    """The object at dotted `path` (`package.module.name`), or a ConfigError saying why it cannot be imported; the
    start-up lines of TensorFlow where the user's module imports it, filtered as a run's are."""
    from runner.runtime.quiet import filtered_stderr

    module_name, _, attr = path.rpartition(".")
    try:
        with filtered_stderr():
            module = importlib.import_module(module_name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(
            f"{kind}.{TARGET}={path!r} cannot be imported ({type(e).__name__}: {e}); put its package on PYTHONPATH "
            "or install it"
        ) from None
    if not hasattr(module, attr):  # the module is there: PYTHONPATH is not the fix
        names = [n for n, v in vars(module).items()  # its own functions and classes, not what it imported
                 if callable(v) and getattr(v, "__module__", None) == module_name and not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3)
        raise ConfigError(f"{kind}.{TARGET}={path!r}: module {module_name} ({module.__file__}) has no {attr!r}; "
                          + (f"did you mean {' or '.join(close)}?" if close else
                             f"it has {', '.join(sorted(names)[:12]) or 'nothing callable'}"))
    return getattr(module, attr)


class Registry:
    """The components of one kind (the config group, e.g. "model"): built-ins found in `package` (each public module
    imported once, to register them), plus classes a config names with `_target_`. `from_function` turns (target
    path, function, other keys) into a component where a plain function is one (models); None: a class only."""

    def __init__(self, kind: str, package: str, from_function: Callable[..., Any] | None = None, own: str = ""):
        self.kind, self.package, self.from_function = kind, package, from_function
        self.own = own  # the class a user's YAML of this kind names with `_target_` (hardware: a spec sheet's)
        self._classes: dict[str, type] = {}
        self._discovered = False

    def register(self, cls: type) -> type:
        """Class decorator: a built-in component under the default of its `name` field, and its Hydra schema."""
        from hydra.core.config_store import ConfigStore

        name = cls.name
        self._classes[name] = cls
        ConfigStore.instance().store(group=f"schema/{self.kind}", name=name, node=schema(cls))
        return cls

    def discover(self) -> None:
        """Import every public module of the package, so each built-in registers itself."""
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{self.package}.{module.name}")

    def names(self) -> list[str]:
        """The built-in components' names, sorted."""
        self.discover()
        return sorted(self._classes)

    def get(self, name: str) -> type:
        """The built-in component class `name`."""
        self.discover()
        if name not in self._classes:
            raise ConfigError(
                f"{self.kind}.name={name!r} is not a built-in {self.kind} ({', '.join(self.names())}), and a "
                f"{self.kind} YAML of your own names its class: {TARGET}: {self.own}" if self.own else
                f"{self.kind}.name={name!r} is not allowed; choose one of: {', '.join(self.names())} (or name your "
                f"own class with {self.kind}.{TARGET})"
            )
        return self._classes[name]

    def options(self, node: Mapping[str, Any]) -> Any:
        """The component a composed config node describes: by `_target_` if it has one, else by `name`; its options
        checked as `typed_values` does."""
        if TARGET not in node:
            cls = self.get(str(node.get("name")))
            return _built(cls, typed_values(cls, node, self.kind))
        target = locate(str(node[TARGET]), self.kind)
        if node.get("name") in self._classes:  # the default choice's name (model=mlp's `mlp`), not the user's own
            node = {k: v for k, v in node.items() if k != "name"}  # the target's: its dataclass default, its function
        if inspect.isclass(target) and dataclasses.is_dataclass(target):
            return _built(target, typed_values(target, node, self.kind))
        if callable(target) and self.from_function is not None:
            rest = {k: v for k, v in node.items() if k != TARGET}
            return self.from_function(str(node[TARGET]), target, rest)
        wanted = "a dataclass or a function" if self.from_function else "a dataclass"
        raise ConfigError(f"{self.kind}.{TARGET}={node[TARGET]!r} is not {wanted}")
