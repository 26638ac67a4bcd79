"""Parse a container's argv with the parser pdserve itself would use for it.

``pdserve router ...`` goes through ``pdserve.cli.build_parser``; ``pdserve prefill|decode ...``
are handed by ``pdserve.cli.main`` to the worker's own ``main``, which builds its parser and
parses straight away. To read that parser's verdict without starting a worker, the worker's
``main`` runs with ``ArgumentParser.parse_args`` answering through ``parse_known_args`` and
stopping right there; the parser, its flags, types and choices are the worker's own.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from unittest import mock


@dataclass(frozen=True)
class Parsed:
    namespace: argparse.Namespace
    unknown: list[str]  # arguments the parser does not know (flags pdserve lacks)

    @property
    def unknown_flags(self) -> set[str]:
        return {a.split("=", 1)[0] for a in self.unknown if a.startswith("--")}


class ParseError(AssertionError):
    """argparse refused the argv (a wrong type, a bad choice); the message is argparse's."""


class _Stop(Exception):
    def __init__(self, parsed: Parsed) -> None:
        self.parsed = parsed


def _worker_main(role: str) -> Callable[[Sequence[str]], int]:
    if role == "prefill":
        from prefill_service.server import main as prefill_main

        return prefill_main
    from decode_service.server import main as decode_main

    return decode_main


def _guard(parse: Callable[[], Parsed]) -> Parsed:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse()
    except SystemExit as e:
        raise ParseError(err.getvalue().strip() or f"exit {e.code}") from None


def parse_pdserve_args(argv: Sequence[str]) -> Parsed:
    """``argv`` as given to ``pdserve`` (the container's args, its command being pdserve)."""
    argv = list(argv)
    if argv and argv[0] in ("prefill", "decode"):
        main = _worker_main(argv[0])

        def capture(
            self: argparse.ArgumentParser, args: Sequence[str] | None = None, namespace: None = None
        ) -> argparse.Namespace:
            known, unknown = self.parse_known_args(args)
            raise _Stop(Parsed(known, unknown))

        def parse_worker() -> Parsed:
            with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
                try:
                    main(argv[1:])
                except _Stop as stop:
                    return stop.parsed
            raise AssertionError(f"pdserve {argv[0]} never parsed its arguments")

        return _guard(parse_worker)
    from pdserve.cli import build_parser

    def parse_cli() -> Parsed:
        known, unknown = build_parser().parse_known_args(argv)
        return Parsed(known, unknown)

    return _guard(parse_cli)
