"""gputop: a live terminal monitor and advisor for GPU training jobs."""

__version__ = "0.1.0"
