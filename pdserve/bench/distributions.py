"""Length distributions for prompts and outputs: ``fixed:N``, ``uniform:LO:HI``,
``lognormal:MEDIAN:SIGMA[:MAX]``, parsed from the strings the CLI and the config file use."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthDist:
    """A distribution over token counts >= 1.

    ``fixed``: always ``a``. ``uniform``: integers in ``[a, b]`` inclusive. ``lognormal``:
    ``round(exp(N(ln a, sigma)))`` with median ``a``, clamped to ``[1, b]`` (``b`` 0 = no cap).
    """

    kind: str
    a: int
    b: int = 0
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise ValueError(f"unknown length distribution {self.kind!r}")
        if self.a < 1:
            raise ValueError(f"{self.spec}: lengths must be >= 1")
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError(f"{self.spec}: need LO <= HI")
        if self.kind == "lognormal" and (self.sigma < 0 or (self.b and self.b < self.a)):
            raise ValueError(f"{self.spec}: need SIGMA >= 0 and MAX >= MEDIAN")

    @property
    def spec(self) -> str:
        """The string this distribution parses from (round-trips through ``parse``)."""
        if self.kind == "fixed":
            return f"fixed:{self.a}"
        if self.kind == "uniform":
            return f"uniform:{self.a}:{self.b}"
        return f"lognormal:{self.a}:{self.sigma:g}" + (f":{self.b}" if self.b else "")

    @property
    def mean(self) -> float:
        """The distribution's mean (before the lognormal cap)."""
        if self.kind == "fixed":
            return float(self.a)
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return self.a * math.exp(self.sigma**2 / 2)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.randint(self.a, self.b)
        n = max(1, round(rng.lognormvariate(math.log(self.a), self.sigma)))
        return min(n, self.b) if self.b else n

    @staticmethod
    def parse(spec: str | int) -> LengthDist:
        """``"fixed:128"``, ``"uniform:32:512"``, ``"lognormal:128:0.8[:2048]"``; a bare
        integer means fixed. Raises ValueError naming the spec."""
        if isinstance(spec, int) or str(spec).strip().isdigit():
            return LengthDist("fixed", int(spec))
        kind, _, rest = str(spec).strip().partition(":")
        parts = rest.split(":") if rest else []
        try:
            if kind == "fixed" and len(parts) == 1:
                return LengthDist("fixed", int(parts[0]))
            if kind == "uniform" and len(parts) == 2:
                return LengthDist("uniform", int(parts[0]), int(parts[1]))
            if kind == "lognormal" and len(parts) in (2, 3):
                cap = int(parts[2]) if len(parts) == 3 else 0
                return LengthDist("lognormal", int(parts[0]), cap, float(parts[1]))
        except ValueError as e:
            raise ValueError(f"bad length distribution {spec!r}: {e}") from None
        raise ValueError(
            f"bad length distribution {spec!r}: use fixed:N, uniform:LO:HI or "
            "lognormal:MEDIAN:SIGMA[:MAX]"
        )
