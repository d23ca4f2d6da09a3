"""The server's counters, written in Prometheus' text format (GET /metrics)."""

from __future__ import annotations

import threading
from collections import defaultdict


class Metrics:
    """Counters and sums; written from the event loop (requests) and the worker threads (model calls)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency_sum: dict[str, float] = defaultdict(float)
        self.latency_count: dict[str, int] = defaultdict(int)
        self.texts = 0
        self.tokens = 0
        self.batches = 0
        self.batch_texts = 0
        self.inference_seconds = 0.0
        self.queued_texts = 0

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[(endpoint, status)] += 1
            self.latency_sum[endpoint] += seconds
            self.latency_count[endpoint] += 1

    def call(self, texts: int, tokens: int, seconds: float) -> None:
        """One merged model call that succeeded."""
        with self.lock:
            self.batches += 1
            self.batch_texts += texts
            self.texts += texts
            self.tokens += tokens
            self.inference_seconds += seconds

    def render(self, model: str) -> str:
        lines = [
            "# HELP ctxrep_requests_total HTTP requests by endpoint and status code.",
            "# TYPE ctxrep_requests_total counter",
        ]
        with self.lock:
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(f'ctxrep_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines += [
                "# HELP ctxrep_request_seconds Time from a request's arrival to its answer.",
                "# TYPE ctxrep_request_seconds summary",
            ]
            for endpoint in sorted(self.latency_count):
                lines.append(f'ctxrep_request_seconds_sum{{endpoint="{endpoint}"}} {self.latency_sum[endpoint]:.6f}')
                lines.append(f'ctxrep_request_seconds_count{{endpoint="{endpoint}"}} {self.latency_count[endpoint]}')
            for name, kind, value, text in (
                ("ctxrep_texts_total", "counter", self.texts, "Texts embedded."),
                ("ctxrep_tokens_total", "counter", self.tokens, "Subword tokens of the texts embedded."),
                ("ctxrep_batches_total", "counter", self.batches, "Model calls (merged requests)."),
                ("ctxrep_batch_texts_total", "counter", self.batch_texts, "Texts in those calls (mean = /batches)."),
                (
                    "ctxrep_inference_seconds_total",
                    "counter",
                    self.inference_seconds,
                    "Wall time of model calls (interleaved steps included).",
                ),
                ("ctxrep_queue_texts", "gauge", self.queued_texts, "Texts waiting for the model."),
            ):
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        lines += ["# HELP ctxrep_model_info The served model.", "# TYPE ctxrep_model_info gauge"]
        lines.append(f'ctxrep_model_info{{model="{model}"}} 1')
        return "\n".join(lines) + "\n"
