"""A Prometheus server's instant-query API over HTTP (the standard library's urllib: no new
dependency). It fetches and decodes; what the answer means is ``fleet``'s.

Every failure becomes one ``PrometheusError`` line naming the URL and the cause (bad URL, no
answer, an HTTP error with Prometheus's own reason), for the command to print and exit on.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from ..errors import os_reason, value_problem

# A refresh that waits longer than this is worse than a stale one: the view says so and retries.
TIMEOUT_S = 10.0
QUERY_PATH = "/api/v1/query"


class PrometheusError(Exception):
    pass


class BadPrometheusUrl(PrometheusError):
    """The URL itself cannot be used (not http(s), a query in it): bad input, not a failing server."""


def base_url(url: str) -> str:
    """``url`` checked and without a trailing slash: http(s), a host, no query string."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadPrometheusUrl("--prometheus: " + value_problem("not an http(s) URL", url, "e.g. http://prometheus:9090"))
    if parts.query or parts.fragment:
        raise BadPrometheusUrl("--prometheus: " + value_problem("not the server's base URL", url,
                                                                "without a query, e.g. http://prometheus:9090"))
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def shown(url: str) -> str:
    """The URL as it may be printed: a password in it is hidden."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def query(url: str, promql: str, timeout: float = TIMEOUT_S) -> object:
    """The decoded JSON answer to one instant query (``fleet.parse_vector`` reads it)."""
    base = base_url(url)
    data = urllib.parse.urlencode({"query": promql}).encode()
    req = urllib.request.Request(base + QUERY_PATH, data=data, method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded",
                                          "Accept": "application/json"})
    where = shown(base)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        # Prometheus answers a bad query with 400 and its JSON reason: keep the reason.
        body = exc.read() or b""
        try:
            payload = json.loads(body)
            if isinstance(payload, dict) and payload.get("status") == "error":
                return payload
        except ValueError:
            pass
        raise PrometheusError(f"{where} answered HTTP {exc.code} {exc.reason} (is it a Prometheus server?)") from None
    except urllib.error.URLError as exc:
        raise PrometheusError(f"cannot reach {where}: {os_reason(exc.reason) if isinstance(exc.reason, OSError) else exc.reason}") from None
    except (TimeoutError, OSError) as exc:
        raise PrometheusError(f"cannot reach {where}: {exc}") from None
    try:
        return json.loads(body)
    except ValueError:
        raise PrometheusError(f"{where} answered something that is not JSON (is it a Prometheus server?)") from None
