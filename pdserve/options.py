"""Command-line options derived from the config dataclasses: the one place flags come from.

    add_config_args(parser_or_group, EngineConfig)   # a flag per field, help from metadata
    config = config_from_args(EngineConfig, args)     # parsed flags -> the dataclass
    argv = config_to_argv(config)                     # the dataclass -> flags (non-defaults)

so ``pdserve generate|serve|prefill|decode``, the worker processes ``pdserve serve`` starts and
the Helm chart's container args all speak the same flags. Flag of field ``f``: ``--f`` with
``_`` as ``-``, or the field's ``metadata["flag"]`` (a ``--no-...`` flag for a boolean that
defaults to True). Imports no torch and no model code.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from engine.engine_config import EngineConfig

C = TypeVar("C")

ArgTarget = argparse.ArgumentParser | argparse._ArgumentGroup


def flag_of(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("flag", "--" + f.name.replace("_", "-")))


def _scalar(tp: Any) -> tuple[Any, bool, tuple[Any, ...] | None]:
    """``(python type, optional, literal choices)`` of a field's annotation."""
    optional = False
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        optional = len(args) != len(get_args(tp))
        if len(args) != 1:
            raise TypeError(f"unsupported option type {tp}")
        tp = args[0]
    if get_origin(tp) is typing.Literal:
        choices = get_args(tp)
        return type(choices[0]), optional, choices
    return tp, optional, None


def add_config_args(target: ArgTarget, cls: type[Any], exclude: tuple[str, ...] = ()) -> None:
    """One flag per field of dataclass ``cls`` (except ``exclude``), defaulting to the
    field's default."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        tp, _, choices = _scalar(hints[f.name])
        choices = f.metadata.get("choices", choices)
        help_text = f.metadata.get("help", "")
        flag = flag_of(f)
        if tp is bool:
            if f.default is True:
                if not flag.startswith("--no-"):
                    raise TypeError(f"{cls.__name__}.{f.name}: a True default needs a --no- flag")
                target.add_argument(
                    flag, dest=f.name, action="store_false", help=f"turn off: {help_text}"
                )
            else:
                target.add_argument(flag, dest=f.name, action="store_true", help=help_text)
            continue
        target.add_argument(
            flag,
            dest=f.name,
            type=tp,
            default=f.default,
            choices=choices,
            help=help_text or None,
        )


def config_from_args(cls: type[C], args: argparse.Namespace, **overrides: Any) -> C:
    """``cls`` from the parsed flags (fields without a flag in ``args`` keep their
    defaults); ``overrides`` win."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if hasattr(args, f.name)
    }
    values.update(overrides)
    return cls(**values)


def config_to_argv(config: Any, exclude: tuple[str, ...] = ()) -> list[str]:
    """The flags that rebuild ``config`` from defaults (non-default fields only)."""
    argv: list[str] = []
    for f in dataclasses.fields(config):
        if f.name in exclude:
            continue
        value = getattr(config, f.name)
        if value == f.default:
            continue
        flag = flag_of(f)
        if isinstance(value, bool):
            argv.append(flag)  # store_true / store_false: the flag is the non-default
        else:
            argv += [flag, str(value)]
    return argv


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Every ``EngineConfig`` field as a flag, in an "engine" group."""
    add_config_args(p.add_argument_group("engine"), EngineConfig)


def engine_config_from_args(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    return config_from_args(EngineConfig, args, **overrides)
