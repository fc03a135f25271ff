"""Stand-ins for the exporter's attacher: a pipeline that only lists its sources, a sampler that
only remembers its pid, and a session holding a store."""

from __future__ import annotations


class FakePipeline:
    def __init__(self):
        self.sources = []

    def add_source(self, s):
        self.sources.append(s)

    def remove_source(self, s):
        self.sources.remove(s)


class FakeSampler:
    def __init__(self, pid):
        self.pid, self.exited = pid, None


def attach_session(store):
    return type("S", (), {"store": store, "pipeline": FakePipeline(), "target_pid": None})()
