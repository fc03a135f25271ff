"""Prometheus's HTTP API answers as plain data: an instant query's vector, or the error it names.

The documented envelope: ``{"status": "success", "data": {"resultType": "vector", "result":
[{"metric": {labels}, "value": [unix_time, "string value"]}]}}``, or ``{"status": "error",
"errorType": ..., "error": ...}``. Pure: a decoded JSON object in, series out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping


class ApiError(Exception):
    """The server answered, but not with a vector: its own error, or something that is not the API."""


@dataclass(frozen=True)
class Series:
    name: str
    labels: Mapping[str, str]  # without __name__
    value: float
    ts: float


def parse_vector(payload: object) -> list[Series]:
    if not isinstance(payload, dict) or "status" not in payload:
        raise ApiError("the answer is not Prometheus's query API (no 'status')")
    if payload["status"] != "success":
        kind = payload.get("errorType") or "error"
        raise ApiError(f"Prometheus answered {kind}: {payload.get('error') or 'no reason given'}")
    data = payload.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise ApiError(f"expected an instant vector, got {got!r}")
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
