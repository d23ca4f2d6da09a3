"""Progress for long work: a tqdm bar on a terminal, plain lines in a log.

A job scheduler or `cmd 2> log.txt` has no terminal, and a carriage-return bar there is one unreadable line. So
`progress(...)` returns tqdm when stderr is a terminal and otherwise a small object with tqdm's interface that
writes one plain line at most every `interval` seconds, and a last one when it closes:

    embed: 1,200/5,000 texts (24%), 12.3 texts/s, 0:01:37 elapsed, ~0:05:09 left

Every long-running command and library call takes its progress from here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import IO, Any

__all__ = ["progress", "progress_from", "LineProgress", "format_duration"]


def format_duration(seconds: float) -> str:
    """0:01:37 style, whole seconds."""
    return str(timedelta(seconds=int(max(seconds, 0))))


def _amount(value: float, unit_scale: bool) -> str:
    if not unit_scale:
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    for prefix in ("", "k", "M", "G", "T"):
        if abs(value) < 1000:
            return f"{value:.1f}{prefix}" if prefix else f"{value:.0f}"
        value /= 1000
    return f"{value:.1f}P"


class LineProgress:
    """tqdm's interface (update, set_postfix_str, set_description, write, close, iteration, `with`), printing plain
    lines to `file` at most every `interval` seconds instead of redrawing a bar."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        *,
        total: float | None = None,
        desc: str = "",
        unit: str = "it",
        unit_scale: bool = False,
        file: IO[str] | None = None,
        interval: float = 10.0,
        disable: bool = False,
        initial: float = 0,
        rate: bool = True,
    ) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.unit_scale, self.file, self.interval, self.disable = unit_scale, file, interval, disable
        self.n: float = initial
        self.initial, self.rate = initial, rate  # a resumed count: the rate and time left read what this run did
        self.postfix = ""
        self.start = self.last_print = time.monotonic()
        self.closed = False

    def line(self) -> str:
        """The line that would be printed now."""
        elapsed = time.monotonic() - self.start
        done = _amount(self.n, self.unit_scale)
        parts = [f"{done}/{_amount(self.total, self.unit_scale)} {self.unit}" if self.total else f"{done} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        done_here = self.n - self.initial
        if self.rate and elapsed > 0 and done_here:
            parts.append(f"{_amount(done_here / elapsed, self.unit_scale)} {self.unit}/s")
        parts.append(f"{format_duration(elapsed)} elapsed")
        if self.total and done_here > 0 and self.n < self.total:
            parts.append(f"~{format_duration(elapsed * (self.total - self.n) / done_here)} left")
        if self.postfix:
            parts.append(self.postfix)
        return f"{self.desc + ': ' if self.desc else ''}{', '.join(parts)}"

    def _print(self) -> None:
        if not self.disable:
            print(self.line(), file=self.file or sys.stderr, flush=True)
        self.last_print = time.monotonic()

    def update(self, n: float = 1) -> None:
        self.n += n
        if time.monotonic() - self.last_print >= self.interval:
            self._print()

    def refresh(self) -> None:
        self._print()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def reset(self, total: float | None = None) -> None:
        self.n, self.initial, self.total = 0, 0, total if total is not None else self.total
        self.start = self.last_print = time.monotonic()

    def write(self, s: str, file: IO[str] | None = None) -> None:
        if not self.disable:
            print(s, file=file or self.file or sys.stderr, flush=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._print()

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(
    iterable: Iterable | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    unit_scale: bool = False,
    enabled: bool = True,
    file: IO[str] | None = None,
    interval: float = 10.0,
    initial: float = 0,
    rate: bool = True,
    **bar_options: Any,
) -> Any:
    """A progress display for `iterable` (or for `total` units updated by hand): tqdm's bar when `file` (stderr by
    default) is a terminal, plain lines every `interval` seconds otherwise; nothing when `enabled` is False.

    `initial`: where a resumed count starts. `rate`: show units per second (off for a count of seconds).
    `bar_options` go to tqdm only (bar_format, smoothing, dynamic_ncols, ...): the look of the terminal bar."""
    stream = file or sys.stderr
    if enabled and getattr(stream, "isatty", lambda: False)():
        from tqdm.auto import tqdm  # here, not at the top: `ctxrep --help` imports this module

        return tqdm(
            iterable,
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=unit_scale,
            file=stream,
            initial=initial,
            **bar_options,
        )
    return LineProgress(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit_scale,
        file=file,
        interval=interval,
        disable=not enabled,
        initial=initial,
        rate=rate,
    )


def progress_from(setting: bool | str, **options: Any) -> Any:
    """The display a `progress` setting asks for: False, nothing; True, `progress(...)` (a bar on a terminal, plain
    lines otherwise); "lines", plain lines at most every 10 s even on a terminal (`ctxrep finetune --no-progress`: a
    log that still says how far along the work is). `options`: progress()'s keyword arguments."""
    if setting == "lines":
        for bar_only in ("bar_format", "smoothing", "dynamic_ncols"):
            options.pop(bar_only, None)
        return LineProgress(**options)
    return progress(enabled=bool(setting), **options)
