"""The chart's flag values, derived from pdserve's own argument parsers.

A values key is the flag's name in camelCase (``--max-num-seqs`` -> ``maxNumSeqs``); the chart
turns it back with Sprig's ``kebabcase``, so no flag string is written twice. Flags the chart
sets itself (addresses, ports, the model, the drain time) are not offered as values.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Literal

from pydantic.alias_generators import to_camel

# Flags the chart owns: it renders them from other values, so a user cannot contradict it.
CHART_OWNED = frozenset(
    {
        "--help",
        "--model",  # model.source
        "--host",  # the pod IP (workers) or every interface (router)
        "--port",
        "--grpc-port",
        "--http-port",
        "--metrics-port",
        "--kv-host",
        "--kv-port",
        "--kv-transport",  # kvTransfer.transport
        "--served-model-name",  # model.servedModelName
        "--shutdown-grace-s",  # drain.seconds
        "--decode",  # static control plane: the decode Service
        "--prefill",
        # Security: from Secrets mounted as files (auth.apiKeys, tls.router, tls.internal).
        "--api-key",
        "--api-key-file",
        "--auth-exempt",
        "--tls-cert-file",
        "--tls-key-file",
        "--tls-client-ca-file",
        "--worker-tls-ca-file",
        "--worker-tls-cert-file",
        "--worker-tls-key-file",
        "--worker-tls-server-name",
    }
)
# Engine flags every process must agree on: set once under `engine`, never per pool.
SHARED_ENGINE = frozenset({"--block-size", "--max-model-len"})


@dataclass(frozen=True)
class Flag:
    """One command-line option as a values key."""

    flag: str  # "--max-num-seqs"
    key: str  # "maxNumSeqs"
    kind: Literal["boolean", "integer", "number", "string"]
    choices: tuple[str, ...] | None
    default: Any  # the CLI's default (None: unset)
    help: str
    dest: str = ""  # the parsed attribute (argparse's dest)
    inverted: bool = False  # a "--no-x" switch: passing it sets dest to False

    def python_type(self) -> Any:
        base: Any = {"boolean": bool, "integer": int, "number": float, "string": str}[self.kind]
        if self.choices:
            base = Literal[self.choices]  # type: ignore[valid-type]
        return base | None


def key_of(flag: str) -> str:
    return to_camel(flag.removeprefix("--").replace("-", "_"))


def _kind(action: argparse.Action) -> Literal["boolean", "integer", "number", "string"]:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "boolean"  # a switch: true passes the flag
    if action.type is int:
        return "integer"
    if action.type is float:
        return "number"
    if action.type in (None, str):
        return "string"
    raise TypeError(f"{action.option_strings[0]}: no values type for {action.type!r}")


def flags_of(parser: argparse.ArgumentParser, exclude: frozenset[str] = frozenset()) -> list[Flag]:
    """Every long option of ``parser`` that the chart offers as a value, in parser order."""
    out = []
    for action in parser._actions:
        long = [s for s in action.option_strings if s.startswith("--")]
        if not long or long[0] in CHART_OWNED | exclude:
            continue
        if action.nargs not in (None, 0) or isinstance(action, argparse._AppendAction):
            raise TypeError(f"{long[0]}: repeatable or multi-value flags have no values form")
        flag = long[0]
        choices = tuple(str(c) for c in action.choices) if action.choices else None
        default = None if action.default is argparse.SUPPRESS else action.default
        if isinstance(action, argparse._StoreFalseAction):
            default = False  # "--no-x": the switch is off unless passed
        inverted = isinstance(action, argparse._StoreFalseAction)
        out.append(
            Flag(
                flag,
                key_of(flag),
                _kind(action),
                choices,
                default,
                action.help or "",
                dest=action.dest,
                inverted=inverted,
            )
        )
    return out


def engine_parser() -> argparse.ArgumentParser:
    """The engine flags both worker roles take (``pdserve.options.add_engine_args``)."""
    from pdserve.options import add_engine_args

    p = argparse.ArgumentParser(add_help=False)
    add_engine_args(p)
    return p


def router_parser() -> argparse.ArgumentParser:
    """``pdserve router``'s parser, as ``pdserve.cli.build_parser`` builds it."""
    from pdserve.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["router"]  # type: ignore[no-any-return]


def engine_flags() -> list[Flag]:
    return flags_of(engine_parser())


def pool_flags() -> list[Flag]:
    """Per-pool engine overrides: every engine flag but those all processes share."""
    return flags_of(engine_parser(), SHARED_ENGINE)


def router_flags() -> list[Flag]:
    """Router-only flags (its engine-shaped ones, block size and length, come from `engine`)."""
    engine = {f.flag for f in engine_flags()}
    return flags_of(router_parser(), frozenset(engine))
