"""A container's filesystem and user for a local process: its own mount namespace, where the
host's root is an overlay (read-only when the spec says readOnlyRootFilesystem), each volume
is bind-mounted at its mountPath, and the process runs as the spec's runAsUser/runAsGroup.
Nothing is mounted outside the namespace; it vanishes with the process. Needs root (as CI
runs) and util-linux's unshare, nsenter and chroot.

One liberty: the host's Python lives under /root (mode 700), so the overlay lets other users
traverse /root, as an image's Python is world-readable.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mount:
    source: Path  # the volume's directory here
    target: str  # the mountPath in the container
    read_only: bool


@dataclass(frozen=True)
class Sandbox:
    scratch: Path  # this pod's directory for the overlay's layers and mount point
    mounts: tuple[Mount, ...]
    uid: int
    gid: int
    read_only_root: bool

    @property
    def rootfs(self) -> Path:
        return self.scratch / "rootfs"

    def _setup(self) -> str:
        root, layers = shlex.quote(str(self.rootfs)), shlex.quote(str(self.scratch / "layers"))
        lines = [
            f"mkdir -p {root} {layers}",
            f"mount -t tmpfs tmpfs {layers}",
            f"mkdir -p {layers}/upper {layers}/work",
            f"mount -t overlay overlay -o lowerdir=/,upperdir={layers}/upper,"
            f"workdir={layers}/work {root}",
            f"chmod o+x {root}/root",
        ]
        for m in self.mounts:
            target = shlex.quote(f"{self.rootfs}{m.target}")
            lines += [f"mkdir -p {target}", f"mount --bind {shlex.quote(str(m.source))} {target}"]
            if m.read_only:
                lines.append(f"mount -o remount,bind,ro {target}")
        for special in ("proc", "dev", "sys"):
            lines.append(f"mount --rbind /{special} {root}/{special}")
        if self.read_only_root:
            lines.append(f"mount -o remount,ro {root}")
        return "\n".join(lines)

    def _enter(self, env: dict[str, str]) -> list[str]:
        assignments = [f"{k}={v}" for k, v in env.items()]
        return [
            "chroot",
            f"--userspec={self.uid}:{self.gid}",
            str(self.rootfs),
            "/usr/bin/env",
            "-i",
            *assignments,
        ]

    def command(self, argv: Sequence[str], env: dict[str, str]) -> list[str]:
        """``argv`` run in a fresh sandbox (the process keeps unshare's pid: no fork)."""
        script = f'set -e\n{self._setup()}\nexec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                script, "sandbox", *self._enter(env), *argv]  # fmt: skip

    def exec_command(self, pid: int, argv: Sequence[str], env: dict[str, str]) -> list[str]:
        """``argv`` in the running sandbox of ``pid`` (as the kubelet execs a probe)."""
        return ["nsenter", f"--target={pid}", "--mount", "--", *self._enter(env), *argv]
