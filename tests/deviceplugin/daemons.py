"""The device-plugin daemon run in-process for wire tests: on a thread of its own, next to a
test kubelet, stopped when the block ends and its exit status checked."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.testing.kubelet import FakeKubelet


@contextlib.contextmanager
def serving(daemon: DevicePluginDaemon, sock_dir: str) -> Iterator[FakeKubelet]:
    """Run `daemon` with a test kubelet on `sock_dir` until the block ends (it is serving
    when the block starts); then stop both, and require exit status 0."""
    kubelet = FakeKubelet(sock_dir).start()
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()))
    thread.start()
    try:
        assert daemon.started.wait(10)
        yield kubelet
    finally:
        daemon.stop()
        thread.join(10)
        kubelet.stop()
    assert exit_codes == [0]
