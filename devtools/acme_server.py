"""Pebble, the ACME test server Let's Encrypt publishes (Debian's `pebble` package), on
loopback for the staging box's certbot, with pebble-challtestsrv as its DNS: every name
resolves to 127.0.0.1, where the box's nginx answers the http-01 challenges, and the
TXT records of the DNS-01 challenges (wildcard names) are the ones certbot's manual
hooks set through challtestsrv's management API (`/set-txt`, `/clear-txt`).

    with AcmeServer(http_port=8080, tmp_dir) as acme:
        acme.directory      # https://127.0.0.1:<port>/dir, for certbot --server
        acme.tls_ca_file    # what certbot must trust to reach the directory
        acme.issuing_root() # PEM of the root that signs what it issues (new at every start)
        acme.dns_hook()     # a certbot manual hook script (python3, standard library):
                            # `<script> set` publishes the DNS-01 record, `<script> clear` removes it

Certificates are valid for `validity_days` (20 by default: inside certbot's 30-day
renewal window, so that certbot's own timer service renews them at once).
Not app code.
"""

import json
import os
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

from devtools.services import free_port, terminate
from devtools.waiting import wait_for

HOOK = """#!/usr/bin/python3
# certbot's manual DNS-01 hook for pebble-challtestsrv (devtools/acme_server.py): set|clear.
import json, os, sys, urllib.request
action = sys.argv[1]
record = {"host": "_acme-challenge." + os.environ["CERTBOT_DOMAIN"] + "."}
if action == "set":
    record["value"] = os.environ["CERTBOT_VALIDATION"]
request = urllib.request.Request("http://127.0.0.1:@PORT@/" + action + "-txt", data=json.dumps(record).encode())
urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).read()
"""


class AcmeServer:
    def __init__(self, http_port, folder, validity_days=20):
        self.http_port, self.folder, self.validity_days = http_port, Path(folder), validity_days
        self.port, self.management_port, self.dns_port = free_port(), free_port(), free_port()
        self.challenge_port = free_port()  # challtestsrv's management API (TXT records)
        self.directory = f"https://127.0.0.1:{self.port}/dir"
        self.tls_ca_file = self.folder / "pebble-tls.pem"
        self.processes = []

    @staticmethod
    def unavailable():
        missing = [tool for tool in ("pebble", "pebble-challtestsrv", "openssl") if not shutil.which(tool)]
        return f"{', '.join(missing)} not installed (apt-get install pebble)" if missing else None

    def __enter__(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        key = self.folder / "pebble-tls.key"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=pebble",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
                "-keyout",
                str(key),
                "-out",
                str(self.tls_ca_file),
            ],
            check=True,
            capture_output=True,
        )
        config = self.folder / "pebble.json"
        config.write_text(
            json.dumps(
                {
                    "pebble": {
                        "listenAddress": f"127.0.0.1:{self.port}",
                        "managementListenAddress": f"127.0.0.1:{self.management_port}",
                        "certificate": str(self.tls_ca_file),
                        "privateKey": str(key),
                        "httpPort": self.http_port,
                        "tlsPort": free_port(),
                        "ocspResponderURL": "",
                        "externalAccountBindingRequired": False,
                        "certificateValidityPeriod": self.validity_days * 86400,
                    }
                }
            )
        )
        log = open(self.folder / "pebble.log", "ab")
        try:
            # Only its DNS: A records of 127.0.0.1, no AAAA (the box listens on IPv4), and the
            # TXT records the hooks set.
            self._start(
                [
                    "pebble-challtestsrv",
                    "-dns01",
                    f"127.0.0.1:{self.dns_port}",
                    "-http01",
                    "",
                    "-https01",
                    "",
                    "-tlsalpn01",
                    "",
                    "-management",
                    f"127.0.0.1:{self.challenge_port}",
                    "-defaultIPv4",
                    "127.0.0.1",
                    "-defaultIPv6",
                    "",
                ],
                log,
            )
            # No random sleep before a validation, no nonce refused on purpose: a run's time is the box's.
            self._start(
                ["pebble", "-config", str(config), "-dnsserver", f"127.0.0.1:{self.dns_port}"],
                log,
                {"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0"},
            )
            wait_for(self._answers, "pebble's directory", timeout=30)
        except BaseException:
            self.stop()
            raise
        finally:
            log.close()
        return self

    def _start(self, command, log, env=None):
        self.processes.append(
            subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        )

    def _get(self, url):
        context = ssl.create_default_context(cafile=str(self.tls_ca_file))
        with urllib.request.urlopen(url, context=context, timeout=10) as answer:
            return answer.read()

    def _answers(self):
        for process in self.processes:
            if process.poll() is not None:
                log = (self.folder / "pebble.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{process.args[0]} exited with {process.returncode}:\n{log}")
        try:
            return b"newOrder" in self._get(self.directory)
        except OSError:
            return False

    def dns_hook(self):
        """The text of a certbot --manual-auth-hook / --manual-cleanup-hook script for the
        DNS-01 challenge against this server: `set` publishes CERTBOT_VALIDATION as the TXT
        record _acme-challenge.<CERTBOT_DOMAIN>, `clear` removes it. What an admin's hook
        does with their DNS provider's API. It runs where certbot runs (the staging box
        shares this machine's loopback), with the box's python3: standard library only."""
        return HOOK.replace("@PORT@", str(self.challenge_port))

    def issuing_root(self):
        """The root certificate (PEM) that what it issues chains to."""
        return self._get(f"https://127.0.0.1:{self.management_port}/roots/0").decode()

    def stop(self):
        for process in reversed(self.processes):
            terminate(process, 10)
        self.processes = []

    def __exit__(self, *exc):
        self.stop()
