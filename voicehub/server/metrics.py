"""Prometheus metrics, in a registry owned by one app (no process-global collectors)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

FIRST_AUDIO_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class Metrics:
    """requests, first-audio latency, real-time factor, queue depth, active streams, GPU memory."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "voicehub_requests",
            "HTTP and WebSocket requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.first_audio = Histogram(
            "voicehub_first_audio_seconds",
            "time from accepting a request to its first audio chunk being ready to send",
            ["route"],
            buckets=FIRST_AUDIO_BUCKETS_S,
            registry=r,
        )
        self.rtf = Histogram(
            "voicehub_real_time_factor",
            "model compute seconds per second of audio made, per finished stream",
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.audio_seconds = Counter("voicehub_audio_seconds", "seconds of audio sent", registry=r)
        self.queue_depth = Gauge("voicehub_queue_depth", "requests waiting for the worker", registry=r)
        self.active_streams = Gauge("voicehub_active_streams", "streams the worker is making", registry=r)
        self.cancelled = Counter("voicehub_cancelled_streams", "streams stopped before their end", registry=r)
        self.models_loaded = Gauge("voicehub_models_loaded", "models the worker holds", registry=r)
        self.gpu_memory = Gauge(
            "voicehub_gpu_memory_bytes", "CUDA memory of this process", ["device", "kind"], registry=r
        )

    def render(self) -> bytes:
        """The text exposition; GPU memory is read at scrape time, when CUDA is present."""
        try:
            import torch

            if torch.cuda.is_available():
                for i in range(torch.cuda.device_count()):
                    self.gpu_memory.labels(str(i), "allocated").set(torch.cuda.memory_allocated(i))
                    self.gpu_memory.labels(str(i), "reserved").set(torch.cuda.memory_reserved(i))
        except ImportError:
            pass
        return generate_latest(self.registry)
