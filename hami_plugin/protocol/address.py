"""A listen address, `host:port`, as every bind flag of both daemons takes it: the scheduler's
`--http-bind` and `--webhook-bind`, both daemons' `--metrics-bind-address`.

HAMi's syntax, which its daemons hand to Go's `net.Listen`: `host:port`, `:port` (every
interface) or `[IPv6 address]:port`. Pure: the parser raises ValueError with a short reason,
which the caller prefixes with the flag.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["BindAddress", "parse_host_port"]

_MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class BindAddress:
    """Where a listener binds. `host` "" means every IPv4 interface; port 0 asks the kernel
    for a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_host_port(text: str) -> BindAddress:
    """`host:port`, `:port` or `[v6]:port`, blanks around it ignored. Raises ValueError naming
    the problem: no port, a port that is not a number from 0 to 65535, an IPv6 address without
    brackets, or something in brackets that is not one."""
    value = text.strip()
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(f"expected [address]:port, got {text!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address, in {text!r}") from None
        port_text = rest[1:]
    else:
        host, colon, port_text = value.rpartition(":")
        if not colon:
            raise ValueError(f"address {text!r} has no port (expected host:port)")
        if ":" in host:
            raise ValueError(f"an IPv6 address needs brackets, [{host}]:{port_text}, got {text!r}")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > _MAX_PORT:
        raise ValueError(
            f"port must be a number from 0 to {_MAX_PORT}, got {port_text!r} in {text!r}"
        )
    return BindAddress(host, int(port_text))
