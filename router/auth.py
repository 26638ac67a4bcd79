"""API keys for the router's public APIs (OpenAI-style ``Authorization: Bearer <key>``).

    keys = ApiKeys.load(["k1"], key_file="/etc/pdserve/keys", env="PDSERVE_API_KEYS")
    auth = Authenticator(keys, exempt=DEFAULT_EXEMPT, failures=counter)
    auth.check(path, authorization_header) -> None (let in) | AuthFailure (why not)

Keys come from ``--api-key`` (repeatable), ``--api-key-file`` (one key per line, ``#``
comments) and ``PDSERVE_API_KEYS`` (comma-separated), all accepted together. The file is
read again when it changes (``ApiKeys.reload_if_changed``, polled by the server, and on
SIGHUP), so keys rotate without a restart; a file that cannot be read keeps the keys it had.

Only SHA-256 digests of the keys are kept, and a presented key is compared with every one of
them with ``hmac.compare_digest``: the time taken does not depend on how much of a key
matched. Keys are never logged or used as metric labels; failures are counted by protocol and
reason only.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pdserve.tls import file_signature

logger = logging.getLogger(__name__)

ENV_VAR = "PDSERVE_API_KEYS"
# Open without a key unless configured otherwise: probes and scrapes carry no key. An entry
# ending in "/" is a prefix (gRPC paths are /package.Service/Method).
DEFAULT_EXEMPT = ("/health", "/metrics", "/grpc.health.v1.Health/")


class AuthFailure(enum.Enum):
    MISSING = "missing"  # no Authorization header / metadata
    MALFORMED = "malformed"  # not "Bearer <key>"
    INVALID = "invalid"  # a key that is not (or no longer) accepted

    @property
    def message(self) -> str:
        if self is AuthFailure.MISSING:
            return (
                "You didn't provide an API key. Provide it in an Authorization header "
                "using Bearer auth (Authorization: Bearer YOUR_KEY)."
            )
        if self is AuthFailure.MALFORMED:
            return "The Authorization header must be 'Bearer YOUR_KEY'."
        return "Incorrect API key provided."


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def parse_key_file(text: str) -> list[str]:
    keys = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(line)
    return keys


class ApiKeys:
    """The accepted keys (as digests). Thread-safe: gRPC and HTTP check from one loop, the
    reload may come from a signal handler or a poll."""

    def __init__(self, fixed: Iterable[str], key_file: str | None = None) -> None:
        self._fixed = frozenset(_digest(k) for k in fixed)
        self._file = key_file
        self._from_file: frozenset[bytes] = frozenset()
        self._seen: tuple[object, ...] | None = None
        self._lock = threading.Lock()
        if key_file is not None:
            self._from_file = self._read_file(key_file)
            self._seen = file_signature([key_file])

    @classmethod
    def load(
        cls,
        keys: Sequence[str] | None,
        key_file: str | None = None,
        env: str | None = None,
    ) -> ApiKeys | None:
        """None when no key is configured anywhere (authentication off). Raises
        ``ValueError`` for an empty key or an unreadable/empty key file."""
        fixed = list(keys or [])
        if env:
            fixed += [k.strip() for k in env.split(",") if k.strip()]
        if any(not k.strip() for k in fixed):
            raise ValueError("--api-key: an API key must not be empty")
        if not fixed and key_file is None:
            return None
        return cls([k.strip() for k in fixed], key_file)

    @staticmethod
    def _read_file(path: str) -> frozenset[bytes]:
        try:
            with open(path, encoding="utf-8") as f:
                keys = parse_key_file(f.read())
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--api-key-file: cannot read {path}: {e}") from None
        if not keys:
            raise ValueError(f"--api-key-file: {path} holds no key")
        return frozenset(_digest(k) for k in keys)

    @property
    def has_file(self) -> bool:
        return self._file is not None

    @property
    def count(self) -> int:
        return len(self._fixed | self._from_file)

    def accepts(self, key: str) -> bool:
        presented = _digest(key)
        with self._lock:
            digests = self._fixed | self._from_file
        ok = False
        for d in digests:  # every digest is compared: no early exit
            ok |= hmac.compare_digest(presented, d)
        return ok

    def reload(self) -> bool:
        """Read the key file again; True when it loaded (its keys replace the file's old
        ones), False when there is no file or it is unusable (the old keys stay)."""
        if self._file is None:
            return False
        signature = file_signature([self._file])
        try:
            digests = self._read_file(self._file)
        except ValueError as e:
            logger.warning("API keys not reloaded, keeping the previous ones: %s", e)
            self._seen = signature  # counted once per change, not once per poll
            return False
        with self._lock:
            changed = digests != self._from_file
            self._from_file = digests
            self._seen = signature
        if changed:
            logger.info("API key file reloaded: %d key(s)", len(digests))
        return True

    def reload_if_changed(self) -> bool | None:
        """None when the file did not change since the last look; else ``reload()``."""
        if self._file is None or file_signature([self._file]) == self._seen:
            return None
        return self.reload()


@dataclass(frozen=True)
class ExemptPaths:
    exact: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def parse(cls, entries: Iterable[str]) -> ExemptPaths:
        items = [e.strip() for e in entries if e.strip()]
        for e in items:
            if not e.startswith("/"):
                raise ValueError(f"--auth-exempt: {e!r} must be a path starting with '/'")
        return cls(
            frozenset(e for e in items if not e.endswith("/")),
            tuple(e for e in items if e.endswith("/")),
        )

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and (path in self.exact or path.startswith(self.prefixes))


class Authenticator:
    """Decides one request from its path and its ``authorization`` value."""

    def __init__(self, keys: ApiKeys, exempt: ExemptPaths) -> None:
        self.keys = keys
        self.exempt = exempt

    def check(self, path: str, authorization: str | None) -> AuthFailure | None:
        if path in self.exempt:
            return None
        if authorization is None or not authorization.strip():
            return AuthFailure.MISSING
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return AuthFailure.MALFORMED
        return None if self.keys.accepts(key) else AuthFailure.INVALID
