"""The server's queue and batcher: requests wait in one queue, the batcher merges those that may share a model call
(equal `key`, up to a token budget) and runs each merged call on a worker thread; `Turns` lets one call use the model
at a time and passes the model on between batches, so a long call runs in steps with the other calls' steps in
between (round robin, each call as many batches a turn as it carries requests: every request the same share): a
short request waits for one step of a long one, not for all of it.

Steps are measured in time (`Pace`): a step is one batch of the call, of as many tokens as the model runs in
`ServeConfig.step_ms` (`--step-ms`) at the throughput the server measured on its own calls (tokens over the seconds
each call held the model; recent calls weigh most), never more than the model's own batch budget. A long request of
many short texts, a few long texts or a big rerank is cut into steps of that size alike, and a request that arrives
meanwhile is admitted at the next step. Requests merge into one call up to one step's tokens (`merge_budget`; at
most max_batch_tokens): a merged request is answered when its call ends, so a short request never joins a long one.

A call takes its requests when it gets the model, not when it is formed: requests that arrive while the last call
waits for its first turn join it (up to the token budget), and the next call is formed only once it has started.
A call whose requests were all cancelled (cut when the server shuts down past its graceful wait) stops at its next
step (`Abandoned`): nobody waits for its answer.
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


@dataclass(frozen=True)
class Step:
    """How a call runs in turns: `tokens`, the token budget of one of its batches (rows x longest, as the
    Featurizer's and the rerankers' batch_tokens; never more than their own), and `between_batches(drain)`, the hook
    of that name that the Featurizer and the rerankers call between two batches, where other calls take their turns."""

    tokens: int
    between_batches: Callable[[Callable[[], None]], None]

    def budget(self, own: int | None) -> int:
        """The batch budget of a runner whose own is `own` (None: it has none of its own)."""
        return self.tokens if own is None else min(own, self.tokens)


# run(key, items, step) -> (results, token counts, ...): sequences with one entry per item (the token counts second),
# sliced per request; one model call on a worker thread. step is None when the call must run whole. A key names the
# model it runs as `key.answer` (ctxrep.serve.kinds.Answer): the throughput the steps are sized by is that model's.
RunCall = Callable[[Hashable, list, Step | None], tuple]


class QueueFull(Exception):
    pass


class Abandoned(Exception):
    """Every request of a call was cancelled (cut at shutdown): nobody waits for its answer, so it stops at its next
    step instead of running to its end."""


@dataclass
class Waiting:
    """One request's items (texts, documents) waiting for the model."""

    key: Hashable  # requests with equal keys may share one model call
    texts: list
    tokens: int  # an estimate before tokenizing: what the token budget counts
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class Call:
    """Requests that share one model call. Until the call has its first turn, later requests with its key join it
    (up to the token budget), so that requests arriving while it waits for the model still merge."""

    def __init__(self, key: Hashable, requests: list[Waiting], budget: int) -> None:
        self.key, self.requests, self.budget = key, requests, budget
        self.tokens = sum(w.tokens for w in requests)
        self._lock = threading.Lock()
        self._closed = False

    def join(self, waiting: Waiting) -> bool:
        """Add a request with the same key if the call has not started and has room; False otherwise."""
        with self._lock:
            if self._closed or waiting.key != self.key or self.tokens + waiting.tokens > self.budget:
                return False
            self.requests.append(waiting)
            self.tokens += waiting.tokens
            return True

    def close(self) -> list[Waiting]:
        """The call's requests, final from now on (called when it takes the model)."""
        with self._lock:
            self._closed = True
            return list(self.requests)


class Pace:
    """The size of a step, in tokens: what the model runs in `step_s` seconds at the throughput measured on the
    server's own calls. Each model call reports its tokens and the seconds it held the model (`observe`); the rate
    is the ratio of their sums, which decay by DECAY at each call, so that recent calls weigh most and a call weighs
    by its time. A call of fewer tokens than one step (a one-sentence request) does not count: its time is mostly
    the fixed cost of a call, and counting it sizes the next long call's steps as if every token cost that much
    (measured before this rule: after 500 one-sentence requests a 3,000-sentence request ran in 64-token steps,
    2.8x slower than in the model's own batches; RESULTS.md). Before any call (the server's warm-up makes the first),
    a step is the model's own batch budget."""

    DECAY = 0.8
    FLOOR = 64  # tokens: the smallest step (a step always holds at least one row, whatever its length)

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._lock = threading.Lock()
        self._sums: dict[Hashable, tuple[float, float]] = {}  # model -> (tokens, seconds), decayed

    def observe(self, model: Hashable, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        with self._lock:
            if model in self._sums and tokens < self._step(model):
                return  # a call smaller than a step: its time says how long a small call takes, not the rate
            done, spent = self._sums.get(model, (0.0, 0.0))
            self._sums[model] = (self.DECAY * done + tokens, self.DECAY * spent + seconds)

    def rate(self, model: Hashable) -> float | None:
        """Tokens per second that `model` ran at lately, or None before its first call."""
        with self._lock:
            sums = self._sums.get(model)
        return None if sums is None else sums[0] / sums[1]

    def _step(self, model: Hashable) -> float:
        """The tokens of one step at the measured rate (no budget), under the lock."""
        done, spent = self._sums[model]
        return max(self.FLOOR, done / spent * self.step_s)

    def step_tokens(self, model: Hashable, budget: int) -> int:
        """The token budget of one step of `model` (at most `budget`, its own batch budget)."""
        with self._lock:
            if model not in self._sums:
                return budget
            return int(min(budget, self._step(model)))


class Turns:
    """Who uses the model now: one call at a time, the others in line (first come, first served). A call holds the
    model for as many batches as it carries requests (its share: every request the same), then, if a call is in
    line, passes the model to it and joins the end of the line. A long request alone passes the model on after each
    of its batches; a call of 20 merged short requests keeps it for up to 20."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: int | None = None
        self._line: deque[int] = deque()
        self._share = self._used = 0  # batches the holder may run in this turn, and has run
        self._since = 0.0  # when the holder took the model
        self._held: dict[int, float] = {}  # seconds each call has held the model so far
        self.steps: deque[int] = deque(maxlen=10_000)  # the call of each batch run, oldest first

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._line)

    def take(self, call: int, share: int = 1) -> None:
        """Block until `call` holds the model, for `share` batches a turn."""
        with self._cond:
            self._line.append(call)
            while self._holder is not None or self._line[0] != call:
                self._cond.wait()
            self._line.popleft()
            self._holder, self._share, self._used = call, max(1, share), 0
            self._since = time.perf_counter()

    def grant(self, share: int) -> None:
        """Let the holder run `share` batches a turn (its number of requests, known once it holds the model)."""
        with self._cond:
            self._share = max(1, share)

    def release(self) -> None:
        with self._cond:
            if self._holder is not None:
                self._held[self._holder] = self._held.get(self._holder, 0.0) + time.perf_counter() - self._since
            self._holder = None
            self._cond.notify_all()

    def held(self, call: int) -> float:
        """The seconds `call` held the model (its turns added up; asked once it has released it for good)."""
        with self._cond:
            return self._held.pop(call, 0.0)

    def between_batches(self, call: int, drain: Callable[[], None]) -> None:
        """The Featurizer's `between_batches` hook for `call`: at the end of its share, let the calls in line have
        their turns, then go on."""
        self.steps.append(call)
        with self._cond:
            self._used += 1
            if self._used < self._share or not self._line:
                return
            share = self._share
        drain()  # nothing of this call in flight while others use the model
        self.release()
        self.take(call, share)


class Batcher:
    """The queue, the merging and the dispatch of model calls (see the module's docstring)."""

    def __init__(self, run: RunCall, *, max_batch_tokens: int, max_wait_ms: float, max_queue_texts: int,
                 max_active_calls: int, interleave: bool, metrics: Metrics, step_ms: float = 50.0,
                 budgets: Callable[[Hashable], int] | None = None) -> None:  # fmt: skip
        self.run = run
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000
        self.max_queue_texts = max_queue_texts
        self.interleave = interleave  # False: each call runs whole (e.g. ELMo numbers its words per call)
        self.metrics = metrics
        self.turns = Turns()
        self.pace = Pace(step_ms / 1000)
        self.budgets = budgets or (lambda model: max_batch_tokens)  # a model's own batch budget (its batch_tokens)
        self.queue: deque[Waiting] = deque()
        self.queued_texts = 0
        self.executor = ThreadPoolExecutor(max_workers=max_active_calls, thread_name_prefix="ctxrep-inference")
        self._calls = 0
        self._open: Call | None = None  # the dispatched call that has not had its first turn: requests join it
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

    async def submit(self, key: Hashable, texts: list, tokens: int) -> Any:
        """Queue `texts` (about `tokens` tokens) and wait for their part of the call's answer (results, token counts,
        ...); QueueFull when the queue is over its limit."""
        if self.queued_texts + len(texts) > self.max_queue_texts:
            raise QueueFull
        waiting = Waiting(key, texts, tokens, asyncio.get_running_loop().create_future())
        if self._open is None or self.queue or not self._open.join(waiting):  # joining keeps arrival order
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
            budget = self.merge_budget(first.key)
            # wait (at most max_wait after the first request arrived) while the call is below the token budget
            while not self._stopping:
                pending = sum(w.tokens for w in self.queue if w.key == first.key)
                left = first.arrived + self.max_wait - time.monotonic()
                if pending >= budget or left <= 0:
                    break
                await self._sleep(left)
            while self._open is not None and not self._stopping:  # the last call has not started: let it grow
                await self._sleep()
            call = Call(first.key, self._take(first.key, budget), budget)
            self._open = call
            task = asyncio.create_task(self._dispatch(call))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        if self._running:
            await asyncio.gather(*self._running)

    def merge_budget(self, key: Hashable) -> int:
        """How many tokens (the words + 2 a text estimate) the requests merged into one call may hold: one step of
        the model (`Pace`), at most max_batch_tokens; a call of one request may hold more. A request merged into a
        call is answered when the whole call ends, so a short request must not join a long one: a long request runs
        as its own call, in steps, and short ones merge among themselves up to a step. Calls that run whole (ELMo):
        max_batch_tokens."""
        if not self.interleave:
            return self.max_batch_tokens
        model = key.answer
        return min(self.max_batch_tokens, self.pace.step_tokens(model, self.budgets(model)))

    def _take(self, key: Hashable, budget: int) -> list[Waiting]:
        """The queued requests with this key, in arrival order, up to the token budget (at least one)."""
        batch, rest, tokens = [], deque(), 0
        for w in self.queue:
            if w.key == key and (not batch or tokens + w.tokens <= budget):
                batch.append(w)
                tokens += w.tokens
            else:
                rest.append(w)
        self.queue = rest
        return batch

    # ---- model calls ------------------------------------------------------------------------------------------

    async def _dispatch(self, call: Call) -> None:
        loop = asyncio.get_running_loop()
        try:
            parts = await self._run(loop, call)
        except Abandoned:
            return
        except Exception as e:  # the Featurizer refused the call
            if len(call.requests) == 1:
                _settle(call.requests[0].future, error=e)
                return
            # several requests were merged: run each alone, so that only the one it refused gets the reason
            for w in call.requests:
                try:
                    _settle(w.future, result=await self._run(loop, Call(w.key, [w], w.tokens), queued=False))
                except Exception as refused:
                    _settle(w.future, error=refused)
            return
        if len(call.requests) == 1:  # a call of one request (every rerank call) answers it whole
            _settle(call.requests[0].future, result=tuple(parts))
            return
        at = 0
        for w in call.requests:
            n = len(w.texts)
            _settle(w.future, result=tuple(part[at : at + n] for part in parts))
            at += n

    async def _run(self, loop, call: Call, queued: bool = True):
        """Run `call` on a worker thread once it holds the model; its requests are fixed at that moment (and leave
        the queue's count, unless they left it before: `queued`)."""
        number = self._calls = self._calls + 1

        def started(texts: int) -> None:  # on the event loop
            if queued:
                self._queued(-texts)
            if self._open is call:
                self._open = None
                self._wakeup.set()

        def step(requests: list[Waiting], drain: Callable[[], None]) -> None:  # between two batches of the call
            if abandoned(requests):
                raise Abandoned
            self.turns.between_batches(number, drain)

        def on_worker():
            self.turns.take(number)
            requests = call.close()
            self.turns.grant(len(requests))  # a share of batches per request
            texts = [t for w in requests for t in w.texts]
            loop.call_soon_threadsafe(started, len(texts))
            model = call.key.answer
            try:
                if abandoned(requests):
                    raise Abandoned
                plan = None
                if self.interleave:
                    tokens = self.pace.step_tokens(model, self.budgets(model))
                    plan = Step(tokens, lambda drain: step(requests, drain))
                start = time.perf_counter()
                parts = self.run(call.key, texts, plan)
                tokens = int(sum(parts[1]))
                self.metrics.call(len(texts), tokens, time.perf_counter() - start)
            finally:
                self.turns.release()
                held = self.turns.held(number)
            self.pace.observe(model, tokens, held)
            return parts

        return await loop.run_in_executor(self.executor, on_worker)


def abandoned(requests: list[Waiting]) -> bool:
    """Whether every request's handler was cancelled (read from a worker thread: a cancelled future stays so)."""
    return all(w.future.cancelled() for w in requests)


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Answer a waiting request (a client that went away leaves a cancelled future)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
