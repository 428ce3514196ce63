"""A one-line progress display on stderr for long computations (no dependency).

Long work in fdp (noise calibration with the JL mechanism runs one accountant per
probed sigma, a few seconds in all) reports what it is doing when asked to:

    calibrate_noise_multiplier: 7 evaluations, 3.2 s, sigma in [0.71, 0.78], eps(0.78) = 2.98

The line is rewritten in place on a terminal and printed once per update
otherwise (so logs stay readable); ``close`` ends it with a newline.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Write ``label: message`` lines to ``stream`` when ``enabled``."""

    def __init__(self, label: str, enabled: bool, stream: TextIO | None = None) -> None:
        self.label = label
        self.enabled = bool(enabled)
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self._open = False

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def update(self, message: str) -> None:
        if not self.enabled:
            return
        line = f"{self.label}: {message}, {self.elapsed:.1f} s"
        if self.stream.isatty():
            self.stream.write("\r\033[K" + line)
            self._open = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self, message: str | None = None) -> None:
        if not self.enabled:
            return
        if message is not None:
            self.update(message)
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
