"""Host and port text: ``host:port`` and ``[v6]:port`` parsed and written, wildcards recognised.

A node listens on a *bind* address and tells clients an *advertised* one. A wildcard (``0.0.0.0``,
``::``) is only ever a bind address: told to a client on another host, it would make that client
connect to itself. A node bound to a wildcard without an advertised host therefore advertises its
data port alone (``:8486``), and the client joins it to the host it reached the control plane at,
which is a name that works from the client's side by construction.
"""

from __future__ import annotations

import ipaddress
import socket

from qjm.errors import BindError, ConfigError


def is_wildcard(host: str) -> bool:
    """True for the any-address of either family (``0.0.0.0``, ``::``, ``[::]``, empty)."""
    h = host.strip()
    if not h:
        return True
    try:
        return ipaddress.ip_address(h.strip("[]")).is_unspecified
    except ValueError:
        return False


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets (``[::1]:8485``) as URIs and gRPC expect."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(text: str, default_port: int | None = None, *, what: str = "address") -> tuple[str, int]:
    """``host:port``, ``[v6]:port``, ``host`` or a bare IPv6 literal → ``(host, port)``; the host
    comes back without brackets. A missing port takes ``default_port``, or is an error without one."""
    t = text.strip()
    if t.startswith("["):
        end = t.find("]")
        if end < 0:
            raise ConfigError(f"bad {what} {text!r}: '[' without ']' (write an IPv6 host as [::1]:8485)")
        host, rest = t[1:end], t[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ConfigError(f"bad {what} {text!r}: expected ':port' after ']'")
        port_s = rest[1:] if rest else ""
        if not host or (":" not in host and not _is_ip(host)):
            raise ConfigError(f"bad {what} {text!r}: brackets are for IPv6 literals only")
    elif t.count(":") > 1:
        host, port_s = t, ""  # a bare IPv6 literal: no port can follow it unbracketed
        if not _is_ip(host):
            raise ConfigError(f"bad {what} {text!r}: write an IPv6 host with a port as [host]:port")
    else:
        host, _, port_s = t.partition(":")
    if "," in host or any(c.isspace() for c in host):
        raise ConfigError(f"bad {what} {text!r}: a host name holds no commas or spaces")
    if not port_s:
        if default_port is None:
            raise ConfigError(f"bad {what} {text!r}: no port (expected host:port)")
        return host, default_port
    try:
        return host, parse_port(port_s)
    except ConfigError as e:
        raise ConfigError(f"bad {what} {text!r}: {e}") from None


def parse_port(value: object) -> int:
    """A TCP port 0-65535 (0: any free port) from text or an integer."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"port {value!r} is not an integer 0-65535")
    try:
        port = int(value)
    except ValueError:
        raise ConfigError(f"port {value!r} is not a number") from None
    if not 0 <= port < 65536:
        raise ConfigError(f"port {port} is outside 0-65535")
    return port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def family_of(host: str) -> socket.AddressFamily:
    """The address family a listener on ``host`` needs: IPv6 for a v6 literal or a name that only
    resolves to v6; IPv4 otherwise. ``::`` takes IPv4 clients too (Linux's default dual stack)."""
    if ":" in host:
        return socket.AF_INET6
    if is_wildcard(host) or _is_ip(host):
        return socket.AF_INET
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"cannot resolve bind host {host!r}: {e.strerror}") from None
    families = {info[0] for info in infos}
    return socket.AF_INET if socket.AF_INET in families else socket.AF_INET6


def is_loopback(host: str) -> bool:
    """True if ``host`` (an address, or a name: every address it resolves to) is this machine's
    loopback; a wildcard is every interface, so never loopback."""
    if is_wildcard(host):
        return False
    text = host.strip("[]")
    if _is_ip(text):
        return ipaddress.ip_address(text).is_loopback
    try:
        infos = socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def advertised(bind_host: str, bound_port: int, advertise: str | None) -> str:
    """What a node tells clients about one of its ports.

    ``advertise`` is ``host`` or ``host:port`` (a port forwarded elsewhere, a proxy in front);
    without it the bind host is told, unless that is a wildcard: then only ``:port``, and the
    client supplies the host (module docstring). A wildcard is never advertised.
    """
    if advertise:
        host, port = split_host_port(advertise, bound_port, what="advertised address")
        if is_wildcard(host):
            raise ConfigError(
                f"advertised address {advertise!r} is a wildcard: give a host name or address clients can reach"
            )
        return join_host_port(host, port)
    if is_wildcard(bind_host):
        return f":{bound_port}"
    return join_host_port(bind_host, bound_port)


def reachable_at(advertised_address: str, control_host: str) -> str:
    """The address a client dials for a node's advertised ``advertised_address``: a port-only
    advertisement is joined to ``control_host``, the host the client reached the node's control plane at."""
    if advertised_address.startswith(":"):
        return join_host_port(control_host, int(advertised_address[1:]))
    return advertised_address


def check_bindable(host: str, port: int, what: str) -> None:
    """Bind a plain socket where a listener is about to go, so that a taken port or a foreign
    address is refused with its reason (gRPC reports only "Failed to bind")."""
    family = family_of(host)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
        except OSError as e:
            err = BindError(f"cannot bind the {what} to {join_host_port(host, port)}: {e.strerror}")
            err.errno = e.errno  # minicluster and callers tell a taken port (EADDRINUSE) from other refusals
            raise err from None
