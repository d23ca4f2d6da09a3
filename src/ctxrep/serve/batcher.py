"""The server's queue and batcher: requests wait in one queue, the batcher merges those that may share a model call
(equal `key`, up to a token budget) and runs each merged call on a worker thread; `Turns` lets one call use the model
at a time and passes the model on between batches, so a long call runs in token-budget steps with the other calls'
steps in between (round robin by batch): a short request waits for one batch of a long one, not for all of it.

The batcher dispatches the next merged call only once every dispatched call has had its first turn, so requests that
arrive while a call waits keep joining the queue and are merged into the next call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ctxrep.serve.metrics import Metrics

# run(key, texts, between_batches) -> (results, token counts): one model call on a worker thread; between_batches is
# None when the call must run whole (it is the Featurizer's hook of that name otherwise).
RunCall = Callable[[Hashable, list[list[str]], Callable | None], tuple[Any, list[int]]]


class QueueFull(Exception):
    pass


@dataclass
class Waiting:
    """One request's texts waiting for the model."""

    key: Hashable  # requests with equal keys may share one model call
    texts: list[list[str]]
    tokens: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class Turns:
    """Who uses the model now: one call at a time, the others in line (first come, first served). Between two batches
    the call holding the turn passes it to the first in line, if any, and joins the end of the line."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: int | None = None
        self._line: deque[int] = deque()
        self.steps: deque[int] = deque(maxlen=10_000)  # the call of each batch run, oldest first

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._line)

    def take(self, call: int) -> None:
        """Block until `call` holds the turn."""
        with self._cond:
            self._line.append(call)
            while self._holder is not None or self._line[0] != call:
                self._cond.wait()
            self._line.popleft()
            self._holder = call

    def release(self) -> None:
        with self._cond:
            self._holder = None
            self._cond.notify_all()

    def between_batches(self, call: int, drain: Callable[[], None]) -> None:
        """The Featurizer's `between_batches` hook for `call`: let the calls in line run a batch each, then go on."""
        self.steps.append(call)
        if not self.waiting:
            return
        drain()  # nothing of this call in flight while others use the model
        self.release()
        self.take(call)


class Batcher:
    """The queue, the merging and the dispatch of model calls (see the module's docstring)."""

    def __init__(self, run: RunCall, *, max_batch_tokens: int, max_wait_ms: float, max_queue_texts: int,
                 max_active_calls: int, interleave: bool, metrics: Metrics) -> None:  # fmt: skip
        self.run = run
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000
        self.max_queue_texts = max_queue_texts
        self.interleave = interleave  # False: each call runs whole (e.g. ELMo numbers its words per call)
        self.metrics = metrics
        self.turns = Turns()
        self.queue: deque[Waiting] = deque()
        self.queued_texts = 0
        self.executor = ThreadPoolExecutor(max_workers=max_active_calls, thread_name_prefix="ctxrep-inference")
        self._calls = 0
        self._unstarted = 0  # dispatched calls that have not had their first turn
        self._running: set[asyncio.Task] = set()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    # ---- lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Finish what is queued and running, then stop (the server has stopped taking requests)."""
        self._stopping = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._task is not None:
            await self._task
        self.executor.shutdown(wait=True)

    # ---- the queue --------------------------------------------------------------------------------------------

    async def submit(self, key: Hashable, texts: list[list[str]]) -> Any:
        """Queue `texts` and wait for (results, token counts); QueueFull when the queue is over its limit."""
        if self.queued_texts + len(texts) > self.max_queue_texts:
            raise QueueFull
        tokens = sum(len(w) for w in texts) + 2 * len(texts)  # words + special tokens: an estimate before tokenizing
        waiting = Waiting(key, texts, tokens, asyncio.get_running_loop().create_future())
        self.queue.append(waiting)
        self._queued(len(texts))
        self._wakeup.set()
        return await waiting.future

    def _queued(self, n: int) -> None:
        self.queued_texts += n
        self.metrics.queued_texts = self.queued_texts

    async def _sleep(self, timeout: float | None = None) -> None:
        """Wait for the next wake-up (a request, a call's first turn, stop), at most `timeout` seconds."""
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout=timeout)
        except TimeoutError:
            pass

    async def _loop(self) -> None:
        while True:
            if not self.queue:
                if self._stopping:
                    break
                await self._sleep()
                continue
            first = self.queue[0]
            # wait (at most max_wait after the first request arrived) while the call is below the token budget
            while not self._stopping:
                pending = sum(w.tokens for w in self.queue if w.key == first.key)
                left = first.arrived + self.max_wait - time.monotonic()
                if pending >= self.max_batch_tokens or left <= 0:
                    break
                await self._sleep(left)
            while self._unstarted and not self._stopping:  # the last call has not started: keep merging
                await self._sleep()
            batch = self._take(first.key)
            self._unstarted += 1
            task = asyncio.create_task(self._dispatch(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        if self._running:
            await asyncio.gather(*self._running)

    def _take(self, key: Hashable) -> list[Waiting]:
        """The queued requests with this key, in arrival order, up to the token budget (at least one)."""
        batch, rest, tokens = [], deque(), 0
        for w in self.queue:
            if w.key == key and (not batch or tokens + w.tokens <= self.max_batch_tokens):
                batch.append(w)
                tokens += w.tokens
            else:
                rest.append(w)
        self.queue = rest
        self._queued(-sum(len(w.texts) for w in batch))
        return batch

    # ---- model calls ------------------------------------------------------------------------------------------

    async def _dispatch(self, batch: list[Waiting]) -> None:
        loop = asyncio.get_running_loop()
        texts = [t for w in batch for t in w.texts]
        try:
            results, counts = await self._call(loop, batch[0].key, texts, first_of_batch=True)
        except Exception as e:  # the Featurizer refused the call
            if len(batch) == 1:
                _settle(batch[0].future, error=e)
                return
            # several requests were merged: run each alone, so that only the one it refused gets the reason
            for w in batch:
                try:
                    _settle(w.future, result=await self._call(loop, w.key, w.texts, first_of_batch=False))
                except Exception as refused:
                    _settle(w.future, error=refused)
            return
        at = 0
        for w in batch:
            n = len(w.texts)
            _settle(w.future, result=(results[at : at + n], counts[at : at + n]))
            at += n

    async def _call(self, loop, key: Hashable, texts: list[list[str]], first_of_batch: bool):
        call = self._calls = self._calls + 1

        def started() -> None:
            if first_of_batch:
                self._unstarted -= 1
                self._wakeup.set()

        def on_worker():
            self.turns.take(call)
            loop.call_soon_threadsafe(started)
            try:
                hook = (lambda drain: self.turns.between_batches(call, drain)) if self.interleave else None
                start = time.perf_counter()
                results, counts = self.run(key, texts, hook)
                self.metrics.call(len(texts), int(sum(counts)), time.perf_counter() - start)
                return results, counts
            finally:
                self.turns.release()

        return await loop.run_in_executor(self.executor, on_worker)


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Answer a waiting request (a client that went away leaves a cancelled future)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
