"""Fetching links without becoming a proxy into the host's network (SSRF guard).

A link may only reach public addresses: every address its host resolves to is
checked (loopback, private, link-local — 169.254.169.254, the cloud metadata
service, among them — CGNAT, multicast, reserved and unspecified are refused), unless
NOTEBOOK_URL_ALLOWLIST names its network. An IPv6 address that carries an IPv4 one
(IPv4-mapped, IPv4-compatible, NAT64 64:ff9b::/96, 6to4, Teredo) is judged by the
IPv4 address it carries; NAT64's local-use prefix 64:ff9b:1::/48 is refused. Redirects are followed by hand, each hop
checked the same way, and the address actually connected to is checked again
(a name that resolves differently the second time gains nothing). Bodies are
capped in size and the whole download in time."""

import ipaddress
import socket
import time
from urllib.parse import urljoin, urlsplit

import requests

MAX_REDIRECTS = 5
USER_AGENT = "bundle-notebook/1 (+link import)"


class LinkRefused(Exception):
    """The link may not be fetched or did not give a document; the message says why."""


# IPv6 forms that carry an IPv4 address, which a translator or relay on the path may
# deliver to (issue #32: NAT64 and 6to4 forms of internal addresses got through).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the v4 address is the last 32 bits
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: a site's own translator
_COMPATIBLE = ipaddress.ip_network("::/96")  # IPv4-compatible (deprecated): the last 32 bits


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list:
    """The IPv4 addresses an IPv6 address stands for (none for a plain one)."""
    if ip.ipv4_mapped:  # ::ffff:a.b.c.d
        return [ip.ipv4_mapped]
    if ip in _NAT64 or ip in _COMPATIBLE:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour:  # 2002:AABB:CCDD::/48
        return [ip.sixtofour]
    if ip.teredo:  # 2001::/32: server, and client (bits inverted)
        return list(ip.teredo)
    return []


def _forbidden(address, allowlist):
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if any(ip in network for network in allowlist):
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64_LOCAL:  # its prefix length (where the v4 address sits) is the site's choice
            return True
        embedded = _embedded_ipv4(ip)
        if embedded:  # judged by what it reaches: a public v4 address through NAT64 is a public host
            return any(_forbidden(str(v4), allowlist) for v4 in embedded)
    return not ip.is_global or ip.is_multicast


def _is_address(host):
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return True
    except ValueError:
        return False


def check_url(url, allowlist):
    """Raise LinkRefused unless `url` is http(s) to a host whose every address is allowed."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise LinkRefused(f"the URL is malformed: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise LinkRefused("only http and https links can be added")
    if not parts.hostname:
        raise LinkRefused("the URL has no host")
    if parts.username or parts.password:
        raise LinkRefused("links with credentials in them are not fetched")
    if _is_address(parts.hostname):  # nothing to resolve (and no trip to the resolver's threads)
        if _forbidden(parts.hostname, allowlist):
            raise LinkRefused(f"the host {parts.hostname!r} is a non-public address that links may not reach")
        return
    try:
        infos = socket.getaddrinfo(
            parts.hostname, port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise LinkRefused(f"the host {parts.hostname!r} could not be resolved: {exc}") from None
    for info in infos:
        address = info[4][0]
        if _forbidden(address, allowlist):
            raise LinkRefused(
                f"the host {parts.hostname!r} resolves to {address}, a non-public address that links may not reach"
            )


def _peer_allowed(response, allowlist):
    """The address the connection really went to (None when it cannot be read)."""
    try:
        sock = response.raw._connection.sock
        address = sock.getpeername()[0]
    except (AttributeError, OSError, TypeError):
        return True  # no socket left to read it from: the name was checked before connecting
    return not _forbidden(address, allowlist)


def _read_capped(response, max_bytes, deadline):
    declared = response.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise LinkRefused(f"the page is larger than {max_bytes} bytes")
    body = bytearray()
    for chunk in response.iter_content(64 * 1024):
        body += chunk
        if len(body) > max_bytes:
            raise LinkRefused(f"the page is larger than {max_bytes} bytes")
        if time.monotonic() > deadline:
            raise LinkRefused("the download took too long")
    return bytes(body)


def fetch(url, allowlist, timeout, max_bytes):
    """(body, content type, final URL) of `url`; raises LinkRefused."""
    deadline = time.monotonic() + timeout
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment may carry the request elsewhere
    try:
        for _ in range(MAX_REDIRECTS + 1):
            check_url(url, allowlist)
            remaining = max(0.1, deadline - time.monotonic())
            try:
                response = session.get(
                    url,
                    stream=True,
                    allow_redirects=False,
                    timeout=(min(5, remaining), remaining),
                    headers={"User-Agent": USER_AGENT, "Accept": "text/html,application/pdf,text/*;q=0.9,*/*;q=0.5"},
                )
            except requests.RequestException as exc:
                raise LinkRefused(f"the link could not be fetched: {type(exc).__name__}") from None
            with response:
                if not _peer_allowed(response, allowlist):
                    raise LinkRefused("the link connected to a non-public address")
                if response.is_redirect:
                    url = urljoin(url, response.headers.get("Location", ""))
                    continue
                if response.status_code >= 400:
                    raise LinkRefused(f"the link answered HTTP {response.status_code}")
                try:
                    body = _read_capped(response, max_bytes, deadline)
                except requests.RequestException as exc:
                    raise LinkRefused(f"the download failed: {type(exc).__name__}") from None
                return body, response.headers.get("Content-Type", ""), url
        raise LinkRefused(f"more than {MAX_REDIRECTS} redirects")
    finally:
        session.close()
