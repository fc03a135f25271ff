"""Prometheus's HTTP API answers as plain data: an instant query's vector or a subquery's matrix,
or the error it names.

The documented envelope: ``{"status": "success", "data": {"resultType": "vector", "result":
[{"metric": {labels}, "value": [unix_time, "string value"]}]}}`` (a matrix: ``"values": [[t, v],
...]`` per series), or ``{"status": "error", "errorType": ..., "error": ...}``. Pure: a decoded
JSON object in, series out.
"""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple


class ApiError(Exception):
    """The server answered, but not with a vector: its own error, or something that is not the API."""


class Series(NamedTuple):
    """One series' value at one evaluation. A named tuple, not a frozen dataclass: a one-minute
    answer at 1,024 ranks is 150,000 of them, and a tuple is made several times faster."""

    name: str
    labels: Mapping[str, str]  # without __name__
    value: float
    ts: float


def _data(payload: object, want: str, what: str) -> dict:
    if not isinstance(payload, dict) or "status" not in payload:
        raise ApiError("the answer is not Prometheus's query API (no 'status')")
    if payload["status"] != "success":
        kind = payload.get("errorType") or "error"
        raise ApiError(f"Prometheus answered {kind}: {payload.get('error') or 'no reason given'}")
    data = payload.get("data")
    if not isinstance(data, dict) or data.get("resultType") != want:
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise ApiError(f"expected {what}, got {got!r}")
    return data


def parse_vector(payload: object) -> list[Series]:
    data = _data(payload, "vector", "an instant vector")
    out = []
    for item in data.get("result") or ():
        try:
            labels = dict(item["metric"])
            ts, raw = item["value"]
            value = float(raw)  # "NaN", "+Inf" are valid sample values
        except (KeyError, TypeError, ValueError) as exc:
            raise ApiError(f"a malformed sample in the answer: {exc}") from None
        if math.isnan(value):
            continue
        name = labels.pop("__name__", "")
        out.append(Series(name, labels, value, float(ts)))
    return out


def parse_matrix(payload: object) -> list[Series]:
    """A subquery's answer (``selector[60s:5s]``) as one ``Series`` per series and evaluation
    time: each carries its evaluation's timestamp, so ``model.build_jobs`` can lay the job out
    step by step. NaN values are left out, as in ``parse_vector``."""
    data = _data(payload, "matrix", "a range (matrix)")
    out = []
    for item in data.get("result") or ():
        try:
            labels = dict(item["metric"])
            values = [(float(ts), float(raw)) for ts, raw in item["values"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ApiError(f"a malformed sample in the answer: {exc}") from None
        name = labels.pop("__name__", "")
        # One labels dict shared by the series' steps: they are read, never changed.
        out.extend(Series(name, labels, v, ts) for ts, v in values if not math.isnan(v))
    return out
