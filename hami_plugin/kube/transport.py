"""How one Kubernetes REST call travels: built and sent through the real client's `ApiClient`,
retried, timed and held to the calling thread's time budget. `hami_plugin.kube.client.KubeClient`
says which calls there are and what they mean; this module how each is sent.

* `Request`: one call as data. Its `{name}` path parts are filled and percent-quoted here, each
  value checked as one path segment first (`hami_plugin.kube.paths`), so no name changes the
  path, whatever the configuration's `safe_chars_for_path_param`;
* `Transport.send`: one attempt with the ApiClient's plumbing (`param_serialize`: host, auth,
  default headers; `call_api`: the urllib3 REST client), the raw 2xx response handed back unread
  (a watch reads it as a stream), any other status raised as the generated API raises it;
* `Transport.call`: `send` with retries and backoff (`hami_plugin.kube.retry`), the answer
  decoded as one JSON object; errors are translated there, in one place
  (`hami_plugin.kube.errors`);
* `Transport.deadline`: one time budget shared by every call a thread makes inside the block;
* the client-side rate limit (`--kube-qps`/`--kube-burst`, `hami_plugin.kube.ratelimit`): with
  one, every attempt `send` makes waits for its token first, within the thread's budget.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import urllib3

# Submodules only: `kubernetes.client` and `kubernetes.client.models` load their members lazily,
# and `kubernetes.client.CoreV1Api` (or any other generated API or model) must stay unloaded.
from kubernetes.client.api_client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from hami_plugin.clock import Clock
from hami_plugin.kube.errors import InvalidName, Retryable
from hami_plugin.kube.paths import fill_path
from hami_plugin.kube.ratelimit import TokenBucket
from hami_plugin.kube.records import json_object
from hami_plugin.kube.retry import RetryPolicy, call_with_retries, stopped_during

__all__ = ["JSON", "JSON_PATCH", "MERGE_PATCH", "STRATEGIC_MERGE_PATCH", "Request", "Transport"]

JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
# Set explicitly on every metadata patch: the generated client would pick `json-patch+json`,
# which its REST layer rewrites to `strategic-merge-patch+json` for a dict body. Strategic merge
# behaves like merge patch on string maps, but it is not what HAMi sends.
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
"""What kube-scheduler patches a pod's status with: `status.conditions` merge by `type`."""
# The auth entry of the generated configuration (`Configuration.auth_settings()`): the bearer
# token, refreshed by the loaders' `refresh_api_key_hook` (in-cluster token rotation, exec
# plugins). Client certificates are set up by the REST client's pool manager.
_AUTH_SETTINGS = ["BearerToken"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Request:
    """One REST call. `{name}` parts of `path` are filled (percent-quoted) from `path_params`;
    a value that is no path segment (`a/b`, `..`, `50%`) is refused before anything is sent
    (InvalidName, `hami_plugin.kube.paths`)."""

    method: str
    path: str
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: tuple[tuple[str, str], ...] = ()
    body: Mapping[str, Any] | list[Any] | None = None
    """A JSON object, or a list (a JSON patch)."""
    content_type: str | None = None


class Transport:
    """Sends `Request`s through `api_client` under the `retry` policy and each thread's
    `deadline()` budget. Safe to share between threads (the budgets are per thread).

    It neither sets up nor closes `api_client`: its owner (`KubeClient`) does both. `clock`
    times the budgets and reads `Retry-After` dates; backoffs are waited out with `sleep`, their
    jitter drawn from `rng`. `rate_limit`: the token bucket every attempt waits on (its waits
    through `sleep` too); None sends at once, as without `--kube-qps`.
    """

    def __init__(
        self,
        api_client: ApiClient,
        retry: RetryPolicy,
        *,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        rate_limit: TokenBucket | None = None,
    ) -> None:
        self._api_client = api_client
        self._retry = retry
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._rate_limit = rate_limit
        self._local = threading.local()

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Give the calls this thread makes inside the block `seconds` in total (what that
        means for each call: `KubeClient.deadline`)."""
        previous = getattr(self._local, "budget", None)
        self._local.budget = (self._clock.monotonic() + seconds, seconds)
        try:
            yield
        finally:
            self._local.budget = previous

    def _time_left(self) -> tuple[float, float] | None:
        """(seconds left, whole budget) inside `deadline()`, else None."""
        budget: tuple[float, float] | None = getattr(self._local, "budget", None)
        if budget is None:
            return None
        end, seconds = budget
        return end - self._clock.monotonic(), seconds

    def send(
        self, request: Request, timeout: float | tuple[float, float]
    ) -> urllib3.BaseHTTPResponse:
        """One attempt: build the request with the ApiClient (host, auth, default headers, URL
        quoting), send it with `timeout` (seconds for the whole answer, or (connect, read)
        seconds for a stream) and return the raw 2xx response, unread.

        Raises ApiException for any other status (the body read, the connection released), as
        the generated API does, and urllib3 errors as they come.
        """
        headers = {"Accept": JSON}
        if request.content_type:
            headers["Content-Type"] = request.content_type
        method, url, header_params, body, post_params = self._api_client.param_serialize(
            method=request.method,
            # quoted here, whatever the configuration's `safe_chars_for_path_param`
            resource_path=fill_path(request.path, request.path_params),
            query_params=list(request.query),
            header_params=headers,
            body=_json_body(request.body),
            auth_settings=_AUTH_SETTINGS,
        )
        response: RESTResponse = self._api_client.call_api(
            method,
            url,
            header_params,
            body,
            post_params,
            _request_timeout=timeout,
        )
        if 200 <= response.status <= 299:
            return cast(urllib3.BaseHTTPResponse, response.response)
        try:
            response.read()  # type: ignore[no-untyped-call]
        finally:
            response.response.release_conn()
        raise ApiException.from_response(http_resp=response, body=None, data=None)

    def call(self, what: str, request: Request, decode: Callable[[dict[str, Any]], _T]) -> _T:
        """Send `request` with retries; `decode` the JSON object it answers.

        Raises as `with_retries`. A body that does not decode (ValueError) is a KubeError,
        not retried; a path parameter that is no path segment is InvalidName, not sent.
        """
        try:
            fill_path(request.path, request.path_params)
        except InvalidName as exc:
            raise InvalidName(f"{what}: {exc}") from None
        return self.with_retries(
            what, lambda timeout: decode(_read_object(self.send(request, timeout)))
        )

    def with_retries(
        self,
        what: str,
        attempt: Callable[[float], _T],
        stop: threading.Event | None = None,
    ) -> _T:
        """Run `attempt(timeout_seconds)` under the retry policy and the thread's `deadline()`
        budget (see `retry.call_with_retries`: what it raises), each attempt after its token of
        the rate limit (Retryable, unsent, when the wait would outlast the budget)."""
        if self._rate_limit is not None:
            attempt = self._throttled(what, self._rate_limit, attempt, stop)
        return call_with_retries(
            what,
            attempt,
            self._retry,
            rng=self._rng,
            sleep=self._sleep,
            time_left=self._time_left,
            clock=self._clock,
            stop=stop,
        )

    def _throttled(
        self,
        what: str,
        bucket: TokenBucket,
        attempt: Callable[[float], _T],
        stop: threading.Event | None,
    ) -> Callable[[float], _T]:
        """`attempt`, run after waiting for a token of `bucket`."""

        def throttled(timeout: float) -> _T:
            return attempt(self._throttle(what, bucket, timeout, stop))

        return throttled

    def _throttle(
        self, what: str, bucket: TokenBucket, timeout: float, stop: threading.Event | None
    ) -> float:
        """Wait for a token of `bucket` (woken by `stop`: Retryable); `timeout` cut to what the
        wait leaves of the budget."""
        left = self._time_left()
        wait = bucket.reserve(None if left is None else max(left[0], 0.0))
        if wait is None:
            assert left is not None  # only a budget refuses a token
            raise Retryable(
                f"{what}: not sent, the client-side rate limit (--kube-qps "
                f"{bucket.limit.qps:g}) would hold it past its {left[1]:g} s time budget"
            )
        if wait <= 0:
            return timeout
        logger.debug("%s: waiting %.3f s for the client-side rate limit", what, wait)
        if stopped_during(wait, stop, self._sleep):
            raise Retryable(f"{what}: stopped while waiting for the client-side rate limit")
        if left is None:
            return timeout
        return max(min(timeout, left[0] - wait), 0.001)


def _read_object(response: urllib3.BaseHTTPResponse) -> dict[str, Any]:
    """Read, release and decode a raw (unread) urllib3 response."""
    try:
        data = response.data
    finally:
        response.release_conn()
    return json_object(data)


def _json_body(body: Mapping[str, Any] | list[Any] | None) -> dict[str, Any] | list[Any] | None:
    """A request body as the ApiClient serialises it (a mapping as a plain dict)."""
    if body is None or isinstance(body, list):
        return body
    return dict(body)
