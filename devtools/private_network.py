"""A private network of this machine's own, for staging hosts that must meet over a
network and not over loopback: a bridge with this machine at .1, and a network
namespace per host joined to it by a veth pair, with private addresses only.

    with PrivateNetwork() as lan:
        data = lan.add("data")                     # Host(name, netns, address)
        lan.run(data, "ip", "addr")                # a command in its namespace
        Box.boot(root, netns=data.netns)           # a staging box in it (devtools/staging.py)

This machine is the hosts' gateway: what they send outside the network is
masqueraded (an nftables table of the network's own), so that apt and pip still
reach the package registries while the hosts see only private addresses. Each
network takes a /24 of 10.231.0.0/16 no route of this machine uses yet. Everything
is removed at close(): the namespaces (their veth pairs go with them), the bridge,
the table; IP forwarding is put back as it was. Needs root, iproute2 and nftables.
Not app code: imports nothing from app/.
"""

import ipaddress
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUPERNET = ipaddress.ip_network("10.231.0.0/16")
FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    address: str


def _ip(*args):
    _run("ip", *args)


def _run(*argv, input=None):
    result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result


def _free_subnet():
    used = _run("ip", "-4", "route", "show").stdout
    for subnet in SUPERNET.subnets(new_prefix=24):
        if f"{subnet} " not in used:
            return subnet
    raise RuntimeError(f"no free /24 left in {SUPERNET}")


class PrivateNetwork:
    def __init__(self):
        self.subnet = _free_subnet()
        # Names of this network's own: the kernel destroys a deleted namespace's veth
        # pair a moment later, so the next network must not reuse them.
        tag = secrets.token_hex(3)
        self.bridge = f"bn{tag}"
        self.table = f"bundle_lan_{tag}"
        self.gateway = str(self.subnet.network_address + 1)
        self.hosts = []
        self._forwarding = None
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            self._forwarding = FORWARDING.read_text().strip()
            FORWARDING.write_text("1\n")
            _run(
                "nft",
                "-f",
                "-",
                input=f"""
table ip {self.table} {{
    chain postrouting {{
        type nat hook postrouting priority srcnat;
        ip saddr {self.subnet} oifname != "{self.bridge}" masquerade
    }}
}}
""",
            )
        except BaseException:
            self.close()
            raise

    def add(self, name, hosts=None):
        """A new host `name` on the network: its namespace, its address (the next
        free one), a default route through this machine. `hosts`: {name: address}
        that `run` resolves in it (ip netns exec's /etc/netns/<netns>/hosts)."""
        address = str(self.subnet.network_address + 2 + len(self.hosts))
        netns = f"{self.bridge}-{name}"
        host = Host(name, netns, address)
        _ip("netns", "add", netns)
        self.hosts.append(host)
        outside = f"{self.bridge}v{len(self.hosts)}"
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "route", "add", "default", "via", self.gateway)
        if hosts:
            folder = Path("/etc/netns") / netns
            folder.mkdir(parents=True, exist_ok=True)
            lines = ["127.0.0.1 localhost", *(f"{address} {name}" for name, address in hosts.items())]
            (folder / "hosts").write_text("\n".join(lines) + "\n")
        return host

    def run_command(self, host, *argv):
        """argv to run in `host`'s namespace."""
        return ["ip", "netns", "exec", host.netns, *map(str, argv)]

    def run(self, host, *argv, timeout=60):
        """Run argv in `host`'s namespace; the CompletedProcess (text), whatever its status."""
        return subprocess.run(self.run_command(host, *argv), capture_output=True, text=True, timeout=timeout)

    def cut(self, host):
        """Take `host` off the network at once (its link down, as a host powered off):
        nothing it sends or is sent arrives, and no connection is refused."""
        _ip("-n", host.netns, "link", "set", "eth0", "down")

    def restore(self, host):
        """Put `host` back on the network (its link up), as after cut()."""
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "route", "replace", "default", "via", self.gateway)

    def close(self):
        for host in reversed(self.hosts):
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, timeout=60)
            folder = Path("/etc/netns") / host.netns
            if folder.exists():
                for item in folder.iterdir():
                    item.unlink()
                folder.rmdir()
        self.hosts = []
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=60)
        subprocess.run(["nft", "delete", "table", "ip", self.table], capture_output=True, timeout=60)
        if self._forwarding is not None:
            FORWARDING.write_text(self._forwarding + "\n")
            self._forwarding = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def unavailable():
    """Why this machine cannot make a private network, or None."""
    if os.geteuid() != 0:
        return "a private network needs root (ip netns, nft)"
    for tool in ("ip", "nft"):
        if not any((Path(d) / tool).exists() for d in ("/usr/sbin", "/sbin", "/usr/bin")):
            return f"{tool} is not installed (apt-get install iproute2 nftables)"
    return None
