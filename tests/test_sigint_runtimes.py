"""Ctrl-C after OpenVINO runtimes came and went: a SIGINT is handled, not a SIGSEGV.

OpenVINO's CPU plugin (one per ov.Core) installs an alternate signal stack of its own on the thread that first uses
it and, when it ends, puts back the one it found only if its own is still current, and unmaps its own. Two of them
ending in the order they were made left the thread on an unmapped stack, and the next signal with a Python handler
(those run on that stack) killed the process with SIGSEGV and no Python frame: what the full suite met when a
Trainer test sent itself SIGINT. ctxrep's compiles now leave the thread's signal stack as they found it
(runtime.openvino_backend.keeping_signal_stack).
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys

from ctxrep import Featurizer


class _Stack(ctypes.Structure):  # Linux's stack_t
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def signal_stack() -> tuple:
    """This thread's alternate signal stack: (address, flags, size)."""
    stack = _Stack()
    assert ctypes.CDLL(None, use_errno=True).sigaltstack(None, ctypes.byref(stack)) == 0
    return stack.ss_sp, stack.ss_flags, stack.ss_size


def test_compiling_for_openvino_leaves_this_threads_signal_stack_as_it_was(tiny_models):
    before = signal_stack()
    featurizer = Featurizer(str(tiny_models["bert"]), backend="openvino")
    featurizer.embed_words([["a", "bank"]])  # exports (or reads) the IR and compiles it: a CPU plugin of its own
    assert signal_stack() == before
    del featurizer
    assert signal_stack() == before


# Without the fix this body dies of SIGSEGV, so it runs in an interpreter of its own.
DROPPED_FIRST_MADE_FIRST = """
import gc, os, signal, sys, time
from ctxrep import Featurizer

first = Featurizer(sys.argv[1], backend="openvino")
first.embed_words([["a", "bank"]])
second = Featurizer(sys.argv[1], backend="openvino")
second.embed_words([["the", "bank"]])
del first  # the order they were made in, as a test suite or a notebook drops them
gc.collect()
del second
gc.collect()
try:
    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, to Python's own handler
    time.sleep(5)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""


def test_ctrl_c_after_two_openvino_featurizers_dropped_first_made_first_is_a_keyboard_interrupt(tiny_models):
    done = subprocess.run(
        [sys.executable, "-c", DROPPED_FIRST_MADE_FIRST, str(tiny_models["bert"])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != -signal.SIGSEGV, f"SIGSEGV on Ctrl-C:\n{done.stderr[-3000:]}"
    assert done.returncode == 0 and done.stdout.strip() == "KeyboardInterrupt", done.stderr[-3000:]
