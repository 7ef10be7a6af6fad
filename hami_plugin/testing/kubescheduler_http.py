"""The kube-scheduler stand-in's HTTP client for the extender: POST a JSON document to a verb,
errors worded as kube-scheduler's `HTTPExtender.send` (`pkg/scheduler/extender.go`) words
them."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

__all__ = ["ExtenderError", "post_json"]

JsonObject = dict[str, Any]


class ExtenderError(Exception):
    """A failed extender call."""


def post_json(
    url: str,
    path: str,
    document: Mapping[str, Any],
    *,
    timeout_seconds: float,
    ssl_context: ssl.SSLContext | None = None,
) -> JsonObject:
    """POST `document` to `url` + `path`; its JSON answer. Raises ExtenderError."""
    target = url.rstrip("/") + path
    parts = urllib.parse.urlsplit(target)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout_seconds, context=ssl_context
        )
    else:
        connection = http.client.HTTPConnection(
            parts.hostname or "", parts.port, timeout=timeout_seconds
        )
    try:
        body = json.dumps(document).encode()
        connection.request(
            "POST", parts.path, body=body, headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as error:
        raise ExtenderError(f'Post "{target}": {error}') from None
    finally:
        connection.close()
    if response.status != 200:
        raise ExtenderError(
            f"failed {path.lstrip('/')} with extender at URL {target}, code {response.status}"
        )
    try:
        answer = json.loads(data)
    except ValueError as error:
        raise ExtenderError(f"{path.lstrip('/')}: {error}") from None
    if not isinstance(answer, dict):
        raise ExtenderError(f"{path.lstrip('/')}: the answer is not an object")
    return answer
