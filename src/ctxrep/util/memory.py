"""Peak memory of this process, measured (never guessed): what training reports in its progress lines and metrics.

    peak = PeakMemory("cpu")     # starts a fresh peak where the system allows it
    peak.read()                  # bytes: the resident set's high-water mark since then (CPU), or torch's peak of
                                 # allocated memory on a CUDA device

On Linux the resident set's high-water mark (VmHWM in /proc/self/status) can be reset by writing 5 to
/proc/self/clear_refs; where that is refused (or off Linux) the peak counts from the process's start
(getrusage's ru_maxrss), which `since_start` says.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["PeakMemory", "format_bytes"]


class PeakMemory:
    def __init__(self, device: str = "cpu") -> None:
        import torch

        self.device = torch.device(device)
        self.since_start = False
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.since_start = True

    def read(self) -> int:
        """Bytes at the peak so far (see the module docstring)."""
        if self.device.type == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        if not self.since_start:
            try:
                for line in Path("/proc/self/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024  # kB
            except OSError:
                pass
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB on Linux


def format_bytes(n: float) -> str:
    """1536 -> "1.5 KiB", 3.2e9 -> "3.0 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
