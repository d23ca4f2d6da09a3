"""The click group and the one place that turns user-fixable errors into a one-line message."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import signal
import sys
import threading

import click

# Errors whose message tells the user what to fix: printed on one line, no traceback. The library's own
# (CheckpointError, TokenizerError, PretrainError, ...) are ValueErrors; naming them here would import torch to
# print `ctxrep --help`.
USER_ERRORS = (ValueError, FileNotFoundError, IsADirectoryError, PermissionError)


class LazyChoice(click.Choice):
    """click.Choice whose choices come from a library table read only when needed (parsing or --help of that
    command), so that registering the command imports nothing heavy."""

    def __init__(self, load, case_sensitive: bool = True) -> None:
        self._load, self._choices, self.case_sensitive = load, None, case_sensitive

    @property
    def choices(self):
        if self._choices is None:
            self._choices = tuple(self._load())
        return self._choices


class _Main(click.Group):
    """Ctrl-C ends a command with exit status 130 (128 + SIGINT, as a shell reports it) and one line, instead of
    click's "Aborted!" and status 1; what a command keeps on Ctrl-C is its own (embed: the complete shards)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            ignore_further_ctrl_c()
            click.echo("\ninterrupted (Ctrl-C)", err=True)
            ctx.exit(130)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log progress details.")
def main(verbose: bool) -> None:
    """ctxrep: contextual word representations (featurize, fine-tune, pretrain, analyse)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")


def user_errors(func):
    """Run a command; a user-fixable error becomes `error: <message>` on stderr and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except USER_ERRORS as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            click.echo(f"error: {msg}", err=True)
            sys.exit(1)

    return wrapper


def exit_if_interrupted(metrics: dict, command: str, echo: bool = True) -> None:
    """A training run stopped by Ctrl-C (the Trainer saved its checkpoint and returned `interrupted`) ends with exit
    status 130, as an interrupted command does, and one line saying where the checkpoint is and how to continue
    (`echo` false: status 130 only, as torchrun's other ranks end)."""
    if metrics.get("interrupted"):
        ignore_further_ctrl_c()
        if not echo:
            sys.exit(130)
        where = metrics.get("checkpoint", "the --out folder")
        click.echo(
            f"interrupted (Ctrl-C) at step {metrics['step']}; checkpoint saved in {where}; "
            f"continue with the same `{command}` command plus --resume",
            err=True,
        )
        sys.exit(130)


def ignore_further_ctrl_c() -> None:
    """A command exiting after Ctrl-C ignores another one during the interpreter's exit: landing in an atexit
    callback (torch's) it printed a traceback. Registered last, this runs first; a process that goes on (a test
    calling main) keeps its handler."""
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def ctrl_c_waits(what: str):
    """Ctrl-C inside the block is held until the block ends, then stops the command as any Ctrl-C does (status 130):
    `what` (a save) is never left half-written. Where SIGINT is ignored or cannot be handled (not the main thread),
    the block just runs."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return
    caught = []

    def hold(signum, frame) -> None:
        if not caught:
            click.echo(f"Ctrl-C: finishing {what}, then stopping", err=True)
        caught.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
