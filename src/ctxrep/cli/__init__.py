"""The `ctxrep` command line. Each command lives in its own module here and is registered below.

Errors the user can fix (bad input, unknown model, ...) exit with status 1 and a one-line message.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn


def _interrupted_while_loading() -> NoReturn:
    """Ctrl-C while the CLI loads (click, every command's module: the first ~0.2 s) ends it as any Ctrl-C does:
    status 130 and one line, no traceback; a second one during the interpreter's exit is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stderr.write("\ninterrupted (Ctrl-C)\n")
    raise SystemExit(130) from None


try:
    import click

    from ctxrep.cli.common import main
except KeyboardInterrupt:
    _interrupted_while_loading()


def _register() -> None:
    from ctxrep.cli.analysis import COMMANDS as ANALYSIS
    from ctxrep.cli.big_models import COMMANDS as BIG_MODELS
    from ctxrep.cli.demo import demo
    from ctxrep.cli.distill import distill
    from ctxrep.cli.embed import embed
    from ctxrep.cli.export import export
    from ctxrep.cli.finetune import finetune
    from ctxrep.cli.index import COMMANDS as INDEX
    from ctxrep.cli.info import info
    from ctxrep.cli.mt import mt
    from ctxrep.cli.plot_run import plot_run
    from ctxrep.cli.predict import predict
    from ctxrep.cli.pretrain import pretrain
    from ctxrep.cli.prune import prune
    from ctxrep.cli.rerank import rerank
    from ctxrep.cli.sentence_encoder import COMMANDS as SENTENCE_ENCODER
    from ctxrep.cli.seq2seq import seq2seq
    from ctxrep.cli.serve import serve
    from ctxrep.cli.tokenizer import tokenizer

    for command in (
        embed,
        demo,
        info,
        finetune,
        pretrain,
        distill,
        tokenizer,
        plot_run,
        export,
        prune,
        mt,
        seq2seq,
        *ANALYSIS,
    ):
        main.add_command(command)
    for command in (*INDEX, *SENTENCE_ENCODER):  # index build, search, train- and evaluate-sentence-encoder
        main.add_command(command)
    main.add_command(predict)
    main.add_command(serve)
    main.add_command(rerank)
    for command in BIG_MODELS:  # merge
        main.add_command(command)


try:
    _register()
except KeyboardInterrupt:
    _interrupted_while_loading()

__all__ = ["main", "click"]
