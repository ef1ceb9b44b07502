"""Render the nginx templates of nginx/ and run a real nginx in an unprivileged prefix.

    conf = render(prefix, {"decks_host": "decks.localhost", "decks_upstream": "127.0.0.1:7081",
                           "listen_port": 8080})
    proxy = start(prefix, 8080, {"decks": "127.0.0.1:7081"})
    requests.get(proxy.url + "/healthz", headers={"Host": proxy.host("decks")})
    proxy.stop()

The same templates are rendered by Ansible's `template` module in production: they
use plain Jinja2 only. Everything nginx reads or writes here lives under `prefix`
(config, pid, temporary files, access log); errors go to stderr. Nothing under
/etc/nginx, /var/log/nginx, /var/lib/nginx or /run is touched.

Used by the dev runner and the proxy tests: it never imports app code.

    python -m devtools.nginx check                      # render every site, nginx -t
    python -m devtools.nginx run --port 8080 decks=127.0.0.1:7081
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jinja2

from app import registry
from devtools.services import free_port, terminate

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "nginx"
SERVICES = registry.NAMES  # services.json, in its order
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi", "cache")
STDERR_LOG = "logs/nginx.stderr"


class NginxError(RuntimeError):
    pass


def nginx_binary():
    """$NGINX, else nginx on PATH, else /usr/sbin/nginx (not on a normal user's PATH)."""
    found = os.environ.get("NGINX") or shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(found, os.X_OK):
        raise NginxError(f"nginx is not installed (looked for {found}); set NGINX to its path")
    return found


def site_services():
    """The services that have a site template in nginx/sites/."""
    return [s for s in SERVICES if (TEMPLATES / "sites" / f"{s}.conf.j2").exists()]


def default_host(service):
    return f"{service}.localhost"


def _environment():
    # As Ansible's template module: trim_blocks on, lstrip_blocks off, and an
    # undefined variable is an error (so optional ones need `| default(...)`).
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=False,
        keep_trailing_newline=True,
        autoescape=False,
    )


def variables_for(
    listen_port,
    upstreams,
    hosts=None,
    listen_address="127.0.0.1",
    tls_certificate=None,
    tls_certificate_key=None,
    **extra,
):
    """The template variables for `upstreams` ({service: "127.0.0.1:port"}); each
    service's host defaults to <service>.localhost. `extra` is passed through."""
    variables = {"services": list(upstreams), "listen_port": int(listen_port), "listen_address": listen_address}
    for service, upstream in upstreams.items():
        variables[f"{service}_upstream"] = upstream
        variables[f"{service}_host"] = (hosts or {}).get(service) or default_host(service)
    if tls_certificate or tls_certificate_key:
        variables["tls_certificate"] = str(tls_certificate)
        variables["tls_certificate_key"] = str(tls_certificate_key)
    variables.update(extra)
    return variables


def render(prefix, variables):
    """Render nginx.conf, the snippets and the sites of the services given into
    `prefix`; returns the path of nginx.conf.

    The services are `variables["services"]` if given, else every service with a
    `<service>_upstream` variable. `nginx_prefix` is set to the prefix; `nginx_user`
    defaults to root when rendered as root (the workers then can write the temporary
    paths, which may sit below directories only root can enter)."""
    prefix = Path(prefix).resolve()
    services = list(variables.get("services") or [s for s in SERVICES if f"{s}_upstream" in variables])
    if not services:
        raise NginxError("no service to render: give `services` or <service>_upstream variables")
    for service in services:
        if service not in site_services():
            raise NginxError(f"no site template nginx/sites/{service}.conf.j2 for {service!r}")
        if not variables.get(f"{service}_upstream"):
            raise NginxError(f"{service}_upstream is missing (the host:port of its gunicorn)")
    variables = {
        **{f"{s}_host": default_host(s) for s in services},
        **variables,
        "services": services,
        "nginx_prefix": str(prefix),
    }
    if os.geteuid() == 0:
        variables.setdefault("nginx_user", "root")

    for directory in ("snippets", "sites", "logs", "tmp"):
        (prefix / directory).mkdir(parents=True, exist_ok=True)
    for name in TEMP_DIRS:
        (prefix / "tmp" / name).mkdir(exist_ok=True)
    for stale in (prefix / "sites").glob("*.conf"):  # a service left out must not stay
        stale.unlink()

    environment = _environment()
    outputs = {"nginx.conf": "nginx.conf.j2", "sites/default.conf": "sites/default.conf.j2"}
    for template in sorted((TEMPLATES / "snippets").glob("*.conf.j2")):
        outputs[f"snippets/{template.name[:-3]}"] = f"snippets/{template.name}"
    for service in services:
        outputs[f"sites/{service}.conf"] = f"sites/{service}.conf.j2"
    for target, template in outputs.items():
        text = environment.get_template(template).render(**variables)
        (prefix / target).write_text(text)
    return prefix / "nginx.conf"


def _command(prefix, *extra):
    prefix = Path(prefix).resolve()
    return [nginx_binary(), "-p", f"{prefix}/", "-c", str(prefix / "nginx.conf"), "-e", "stderr", *extra]


def test_config(prefix, check=True):
    """`nginx -t` on the configuration rendered in `prefix`; returns the completed
    process (its stderr holds nginx's verdict). Raises NginxError if `check` and it fails."""
    result = subprocess.run(
        _command(prefix, "-t"), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30
    )
    if check and result.returncode != 0:
        raise NginxError(f"nginx -t failed for {prefix}:\n{result.stderr}")
    return result


test_config.__test__ = False  # not a pytest test, whoever imports it


def _connect_address(listen_address):
    address = listen_address if isinstance(listen_address, str) else list(listen_address)[0]
    address = address.strip("[]")
    return {"0.0.0.0": "127.0.0.1", "*": "127.0.0.1", "::": "::1"}.get(address, address)


class RunningNginx:
    """A running nginx: `.port`, `.url`, `.host(service)`, `.stop()`, `.test_config()`."""

    def __init__(
        self, prefix, port, hosts, process, scheme="http", address="127.0.0.1", stderr_path=None, stderr_file=None
    ):
        self.prefix, self.port, self.hosts, self.process = Path(prefix), port, dict(hosts), process
        self.scheme, self.address = scheme, address
        bracketed = f"[{address}]" if ":" in address else address
        self.url = f"{scheme}://{bracketed}:{port}"
        self.conf = self.prefix / "nginx.conf"
        self.access_log = self.prefix / "logs" / "access.log"
        self.stderr_path = stderr_path
        self._stderr_file = stderr_file

    def host(self, service):
        """The public host name of `service` (send it as the Host header)."""
        return self.hosts[service]

    def headers(self, service, **more):
        """Request headers that address `service` through this nginx."""
        return {"Host": self.host(service), **more}

    def test_config(self, check=True):
        return test_config(self.prefix, check=check)

    def stderr_text(self):
        """What nginx wrote to stderr (its error log), when start() captured it."""
        if self.stderr_path and self.stderr_path.exists():
            return self.stderr_path.read_text(errors="replace")
        return ""

    def stop(self, timeout=10.0):
        """Fast shutdown (SIGTERM: open streams are closed, not waited for) and
        wait; killed past `timeout`. Returns nginx's exit status."""
        try:
            terminate(self.process, timeout)
            return self.process.returncode
        except subprocess.TimeoutExpired:
            raise NginxError(f"nginx did not stop within {timeout} s; killed") from None
        finally:
            if self._stderr_file is not None:
                self._stderr_file.close()
                self._stderr_file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _answers(address, port, tls):
    """True once a worker answers a request (not only the listening socket)."""
    try:
        with socket.create_connection((address, port), timeout=2) as sock:
            if tls:
                return True  # the socket accepts; a TLS handshake needs a served name
            sock.sendall(b"HEAD / HTTP/1.0\r\nHost: readiness.invalid\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/1.")
    except OSError:
        return False


def start(
    prefix,
    listen_port=None,
    upstreams=None,
    hosts=None,
    listen_address="127.0.0.1",
    tls_certificate=None,
    tls_certificate_key=None,
    variables=None,
    stderr=None,
    timeout=10.0,
):
    """Render into `prefix` and run nginx in the foreground of a child process;
    returns once it answers on `listen_port` (a free one if None).

    `upstreams`: {service: "127.0.0.1:port"}; `hosts`: {service: host}, default
    <service>.localhost; `variables`: more template variables. nginx's stderr goes
    to `stderr` if given (a file object), else to <prefix>/logs/nginx.stderr."""
    prefix = Path(prefix).resolve()
    if not upstreams:
        raise NginxError("start() needs upstreams, e.g. {'decks': '127.0.0.1:7081'}")
    address = _connect_address(listen_address)
    listen_port = listen_port or free_port(address)
    rendered = variables_for(
        listen_port, upstreams, hosts, listen_address, tls_certificate, tls_certificate_key, **(variables or {})
    )
    render(prefix, rendered)
    stderr_path, stderr_file = None, None
    if stderr is None:
        stderr_path = prefix / STDERR_LOG
        stderr = stderr_file = open(stderr_path, "ab")
    process = subprocess.Popen(_command(prefix), stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
    tls = bool(tls_certificate and tls_certificate_key)
    running = RunningNginx(
        prefix,
        listen_port,
        {s: rendered[f"{s}_host"] for s in upstreams},
        process,
        scheme="https" if tls else "http",
        address=address,
        stderr_path=stderr_path,
        stderr_file=stderr_file,
    )
    deadline = time.monotonic() + timeout
    try:
        while not _answers(address, listen_port, tls):
            if process.poll() is not None:
                raise NginxError(
                    f"nginx exited with {process.returncode} before answering on "
                    f"port {listen_port}:\n{running.stderr_text()}"
                )
            if time.monotonic() > deadline:
                raise NginxError(
                    f"nginx did not answer on port {listen_port} within {timeout} s:\n{running.stderr_text()}"
                )
            time.sleep(0.05)  # polling for readiness, not papering over a race
        if process.poll() is not None:  # someone else answered on that port
            raise NginxError(f"nginx exited with {process.returncode}:\n{running.stderr_text()}")
    except BaseException:
        running.stop()
        raise
    return running


def _check_all():
    """Render every site with placeholder upstreams and run nginx -t."""
    with tempfile.TemporaryDirectory(prefix="bundle-nginx-") as prefix:
        services = site_services()
        render(prefix, variables_for(8080, {s: f"127.0.0.1:{7080 + i}" for i, s in enumerate(services)}))
        result = test_config(prefix, check=False)
        sys.stderr.write(result.stderr)
        return result.returncode


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m devtools.nginx", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="render every site template and run nginx -t")
    run = commands.add_parser("run", help="run nginx in front of running services until Ctrl-C")
    run.add_argument("--prefix", default=str(ROOT / "var" / "nginx"))
    run.add_argument("--port", type=int, default=8080)
    run.add_argument("--listen", default="127.0.0.1")
    run.add_argument("upstreams", nargs="+", metavar="SERVICE=HOST:PORT")
    args = parser.parse_args(argv)
    if args.command == "check":
        return _check_all()
    upstreams = dict(item.split("=", 1) for item in args.upstreams)
    proxy = start(args.prefix, args.port, upstreams, listen_address=args.listen, stderr=sys.stderr)
    for service in upstreams:
        print(f"{service}: http://{proxy.host(service)}:{proxy.port}/", flush=True)
    try:
        proxy.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
