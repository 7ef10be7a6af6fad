"""LIST and WATCH of any collection, as `KubeClient` makes them, and a pod read through a LIST.

Lists are followed page by page with `limit`/`continue` and watch events read as they arrive
(`hami_plugin.kube.watch`); `hami_plugin.kube.informer` builds the list-then-watch loop on them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import urllib3

from hami_plugin.clock import Clock
from hami_plugin.kube.api import ListApi
from hami_plugin.kube.errors import Gone, KubeError
from hami_plugin.kube.paths import collection_path
from hami_plugin.kube.records import ObjectList, WatchEvent, page
from hami_plugin.kube.transport import Request, Transport
from hami_plugin.kube.watch import WATCH_READ_TIMEOUT_SECONDS, read_events
from hami_plugin.protocol.objects import ObjectError, PodInfo, read_pod

__all__ = ["CollectionCalls", "fetch_pod"]

logger = logging.getLogger(__name__)


class CollectionCalls:
    """The list and watch calls of `KubeClient` (which provides the transport and the clock)."""

    _transport: Transport
    _clock: Clock

    def list_objects(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> ObjectList:
        """LIST a collection (`/api/v1/pods`, `/api/v1/namespaces/ns/pods`, `/api/v1/nodes`...)
        in pages of `page_size` (0: one page), following `continue`; every page is retried like
        any call.

        If a continue token expires (410) the list starts over once without pages, as
        client-go's pager does. Raises Gone, Retryable or KubeError (InvalidName for a path
        of another shape, see `list_pages`).
        """
        items: list[dict[str, Any]] = []
        version = ""
        pages = 0
        try:
            for page in self.list_pages(
                path,
                label_selector=label_selector,
                field_selector=field_selector,
                page_size=page_size,
            ):
                items.extend(page.items)
                version = page.resource_version
                pages += 1
        except Gone:
            if pages == 0:
                raise
            logger.info("list %s: continue token expired; listing again in one page", path)
            return self.list_objects(
                path, label_selector=label_selector, field_selector=field_selector, page_size=0
            )
        return ObjectList(items, version)

    def list_pages(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[ObjectList]:
        """LIST a collection page by page (`limit`/`continue`; `page_size` 0: one page), so a
        caller can reduce each page before the next one is read. Every page carries the list's
        resourceVersion. Raises Gone (a continue token expired: list again), Retryable or
        KubeError; InvalidName for a path of another shape (`collection_path`: a namespace
        `a/b` written into it).
        """
        path = collection_path(path)
        base: list[tuple[str, str]] = []
        if label_selector:
            base.append(("labelSelector", label_selector))
        if field_selector:
            base.append(("fieldSelector", field_selector))
        if page_size > 0:
            base.append(("limit", str(page_size)))
        token = ""
        number = 1
        while True:
            query = [*base, ("continue", token)] if token else base
            request = Request("GET", path, query=tuple(query))
            answer = self._transport.call(f"list {path} (page {number})", request, page)
            yield ObjectList(answer.items, answer.resource_version)
            if not answer.continue_token:
                return
            token = answer.continue_token
            number += 1

    def watch_objects(
        self,
        path: str,
        resource_version: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        stop: threading.Event | None = None,
        read_timeout_seconds: float = WATCH_READ_TIMEOUT_SECONDS,
    ) -> Iterator[WatchEvent]:
        """WATCH a collection from `resource_version` ("" or "0": the current state first, as
        ADDED events), with bookmarks, for at most `timeout_seconds` (asked of the server).

        The request is sent (and retried like any call, each attempt waiting at most the retry
        policy's timeout for the answer's headers) on the first `next()`; events are read as
        they arrive. The iterator ends when the server ends the stream, when the connection
        drops or stays silent for `read_timeout_seconds`, past `timeout_seconds +
        read_timeout_seconds` in any case, and when `stop` is set (a blocked read is woken).
        Resume from the last event's resourceVersion. Raises Gone (HTTP 410 or an ERROR event
        with code 410: list again), Retryable (could not connect, 5xx, or such an ERROR event)
        or KubeError (any other refusal, a malformed event); InvalidName for a path of another
        shape, as `list_pages`.
        """
        path = collection_path(path)
        what = f"watch {path} from resourceVersion {resource_version or '(now)'}"
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        request = Request("GET", path, query=tuple(query))
        end = self._clock.monotonic() + timeout_seconds + read_timeout_seconds

        def open_stream(timeout: float) -> urllib3.BaseHTTPResponse:
            response = self._transport.send(request, (timeout, timeout))
            # The headers came within the call's timeout; events may be far apart.
            if response.connection is not None:
                response.connection.timeout = read_timeout_seconds
            return response

        response = self._transport.with_retries(what, open_stream, stop)
        yield from read_events(response, what, stop=stop, end=end, clock=self._clock)


def fetch_pod(api: ListApi, namespace: str, name: str) -> PodInfo | None:
    """The pod as the API server has it now, read through a LIST by name: None when it does
    not exist (an empty list, where a GET would raise NotFound). Raises KubeError when the
    server cannot answer or the pod cannot be read."""
    listed = api.list_objects(
        f"/api/v1/namespaces/{namespace}/pods",
        field_selector=f"metadata.name={name}",
        page_size=0,
    )
    for item in listed.items:
        try:
            return read_pod(item)
        except ObjectError as error:
            raise KubeError(f"pod {namespace}/{name} unreadable: {error}") from error
    return None
