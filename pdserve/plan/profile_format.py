"""The profile file: what one worker's hardware costs, fitted from measurement or written by
hand. JSON; every field is documented in docs/planning.md ("The profile format").

    {
      "format": "pdserve-plan-profile/1",
      "name": "...", "description": "...",
      "device": {"kind": "cpu" | "gpu", "cores": 1, "price_per_hour": 0.0, ...},
      "model": {"name": "...", "block_size": 16, "kv_bytes_per_token": 23040},
      "kv": {"num_blocks": 4096, "num_host_blocks": 2048},
      "step": {"base_s": ..., "per_token_s": ..., "per_seq_s": ..., "per_sampled_s": ...,
               "per_context_token_s": ..., "per_attention_pair_s": ..., "fit": {...}},
      "transfer": {"tcp": {"latency_s": ..., "bytes_per_s": ...}, ...},
      "swap": {"latency_s": ..., "per_block_s": ...},
      "overhead": {"dispatch_s": ..., "admit_s": ...},
      "measured": {"command": "...", "date": "...", "machine": {...}, "load": {...}},
      "samples": {"steps": [...], "swaps": [...]}      # optional: the raw points of the fit
    }
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pdserve.plan.cost_model import StepCost, SwapCost, TransferCost
from pdserve.plan.step_shape import StepShape

FORMAT = "pdserve-plan-profile/1"


@dataclass(frozen=True)
class StepSample:
    """One measured point: the step's shape and its median time over ``times_s``."""

    label: str
    shape: StepShape
    seconds: float
    times_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class SwapSample:
    num_blocks: int
    out_s: float
    in_s: float


@dataclass(frozen=True)
class Device:
    kind: str = "cpu"  # cpu | gpu
    cores: int = 1  # CPU cores one worker runs on (GPU profiles: 0)
    name: str = ""  # e.g. "AMD EPYC (2 vCPU VM)" or "NVIDIA H100 SXM"
    price_per_hour: float = 0.0  # for goodput per dollar (0 = unknown)


@dataclass(frozen=True)
class ModelInfo:
    name: str = ""
    block_size: int = 16
    kv_bytes_per_token: int = 0  # K and V of every layer for one token (the transfer's unit)


@dataclass(frozen=True)
class KvCapacity:
    num_blocks: int = 4096  # device KV blocks per worker
    num_host_blocks: int = 0  # swap tier per worker


@dataclass(frozen=True)
class Overhead:
    """Fixed latencies outside the engine's steps (seconds)."""

    dispatch_s: float = 0.0  # router: request in -> worker sees it (tokenize, RPC)
    admit_s: float = 0.0  # decode: KV arrived -> request in the batch (RPC, bookkeeping)
    stream_s: float = 0.0  # a token: engine -> client (router hop, SSE)


@dataclass(frozen=True)
class Profile:
    name: str
    step: StepCost
    transfer: dict[str, TransferCost]
    swap: SwapCost
    device: Device = field(default_factory=Device)
    model: ModelInfo = field(default_factory=ModelInfo)
    kv: KvCapacity = field(default_factory=KvCapacity)
    overhead: Overhead = field(default_factory=Overhead)
    description: str = ""
    measured: dict[str, Any] = field(default_factory=dict)
    step_samples: tuple[StepSample, ...] = ()
    swap_samples: tuple[SwapSample, ...] = ()

    def transfer_cost(self, transport: str) -> TransferCost:
        if transport not in self.transfer:
            known = ", ".join(sorted(self.transfer)) or "none"
            raise ValueError(f"profile {self.name!r} has no {transport!r} transfer (has {known})")
        return self.transfer[transport]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "device": asdict(self.device),
            "model": asdict(self.model),
            "kv": asdict(self.kv),
            "step": self.step.to_json(),
            "transfer": {k: asdict(v) for k, v in self.transfer.items()},
            "swap": asdict(self.swap),
            "overhead": asdict(self.overhead),
            "measured": self.measured,
        }
        if self.step_samples or self.swap_samples:
            d["samples"] = {
                "steps": [
                    {
                        "label": s.label,
                        "shape": asdict(s.shape),
                        "seconds": s.seconds,
                        "times_s": list(s.times_s),
                    }
                    for s in self.step_samples
                ],
                "swaps": [asdict(s) for s in self.swap_samples],
            }
        return d

    @staticmethod
    def from_json(d: dict[str, Any], where: str = "profile") -> Profile:
        """Unknown keys and a wrong ``format`` are errors naming the key (a typo must not
        silently leave a cost at zero)."""
        if d.get("format") != FORMAT:
            raise ValueError(f"{where}: format must be {FORMAT!r}, got {d.get('format')!r}")
        top = {"format", "name", "description", "device", "model", "kv", "step", "transfer"}
        top |= {"swap", "overhead", "measured", "samples"}
        _no_unknown(d, top, where)
        if "step" not in d or "name" not in d:
            raise ValueError(f"{where}: needs 'name' and 'step'")
        transfer = {
            k: _make(TransferCost, v, f"{where}.transfer.{k}")
            for k, v in d.get("transfer", {}).items()
        }
        samples = d.get("samples", {})
        return Profile(
            name=str(d["name"]),
            description=str(d.get("description", "")),
            step=StepCost.from_json(d["step"], f"{where}.step"),
            transfer=transfer,
            swap=_make(SwapCost, d.get("swap", {}), f"{where}.swap"),
            device=_make(Device, d.get("device", {}), f"{where}.device"),
            model=_make(ModelInfo, d.get("model", {}), f"{where}.model"),
            kv=_make(KvCapacity, d.get("kv", {}), f"{where}.kv"),
            overhead=_make(Overhead, d.get("overhead", {}), f"{where}.overhead"),
            measured=dict(d.get("measured", {})),
            step_samples=tuple(
                StepSample(
                    s["label"],
                    _make(StepShape, s["shape"], f"{where}.samples"),
                    float(s["seconds"]),
                    tuple(s.get("times_s", ())),
                )
                for s in samples.get("steps", [])
            ),
            swap_samples=tuple(
                _make(SwapSample, s, f"{where}.samples") for s in samples.get("swaps", [])
            ),
        )


def _no_unknown(d: dict[str, Any], known: set[str], where: str) -> None:
    bad = sorted(set(d) - known)
    if bad:
        raise ValueError(f"{where}: unknown key(s) {', '.join(bad)}")


def _make(cls: Any, d: dict[str, Any], where: str) -> Any:
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be an object")
    _no_unknown(d, {f.name for f in fields(cls)}, where)
    return cls(**d)


def load_profile(path: Path | str) -> Profile:
    """A profile file, or a shipped profile by name (``pdserve plan profiles`` lists them)."""
    p = Path(path)
    if not p.exists():
        shipped = SHIPPED_DIR / f"{path}.json"
        if not shipped.exists():
            names = ", ".join(shipped_profiles()) or "none"
            raise ValueError(
                f"no profile file {str(path)!r} and no shipped profile of that name "
                f"(shipped: {names})"
            )
        p = shipped
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON: {e}") from None
    return Profile.from_json(data, str(p))


def save_profile(profile: Profile, path: Path) -> None:
    path.write_text(json.dumps(profile.to_json(), indent=1) + "\n", encoding="utf-8")


SHIPPED_DIR = Path(__file__).resolve().parent / "profiles"


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.json"))


__all__ = [
    "FORMAT",
    "Device",
    "KvCapacity",
    "ModelInfo",
    "Overhead",
    "Profile",
    "StepSample",
    "SwapSample",
    "load_profile",
    "save_profile",
]
