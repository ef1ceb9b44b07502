"""gunicorn settings for every service of the bundle.

Never import app code here: the gevent worker must monkey-patch before the app is
imported. HOST and PORT are read here, by the server adapter, not by the app.
"""

import importlib.util
import json
import os
import resource
import sys
from pathlib import Path

import gunicorn_systemd

# The registry of the services (services.json, the one list that app.registry, the dev
# runner, the tests and the playbook read too), read raw: no app code is imported here.
REGISTRY = {
    entry["name"]: entry for entry in json.loads((Path(__file__).resolve().parent / "services.json").read_text())
}
# Each service's loopback port.
DEFAULT_PORTS = {name: entry["port"] for name, entry in REGISTRY.items()}

_service = os.environ.get("SERVICE", "").strip()
if _service not in DEFAULT_PORTS:
    sys.exit(f"error: SERVICE must be one of {' '.join(DEFAULT_PORTS)} (got {_service!r})")

_host = os.environ.get("HOST", "").strip() or "127.0.0.1"
_port = os.environ.get("PORT", "").strip() or DEFAULT_PORTS[_service]
# Used only when no socket is handed over: under systemd (bundle@.socket), and from
# devtools.services, gunicorn takes the listening socket from LISTEN_FDS instead, so
# a restart queues connections in the kernel rather than refusing them.
bind = f"{_host}:{_port}"
# The backlog of a socket gunicorn binds itself (systemd's and devtools' sockets set
# their own): connections wait there while the workers load the app.
backlog = 4096
# gunicorn's gevent worker, with the first request of a connection given `timeout`
# rather than `keepalive` (gunicorn_worker.py says why).
worker_class = "gunicorn_worker.Worker"
workers = int(os.environ.get("WEB_CONCURRENCY", "1"))
# Services whose workers share live state (streams, rate limits, connected agents)
# through Redis once there are several; one worker keeps it in its own memory.
NEEDS_REDIS_TO_SCALE = {name for name, entry in REGISTRY.items() if entry["needs_redis_to_scale"]}
if workers > 1 and _service in NEEDS_REDIS_TO_SCALE and not os.environ.get("REDIS_URL", "").strip():
    sys.exit(
        f"error: {_service} with WEB_CONCURRENCY={workers} needs REDIS_URL (redis://...) for the state its"
        " workers share; set REDIS_URL or WEB_CONCURRENCY=1"
    )
# Each open SSE or websocket stream holds one connection of the worker.
worker_connections = int(os.environ.get("WORKER_CONNECTIONS", "4096"))
# Well under systemd's 20 s stop time-out; streams end at once on SIGTERM anyway.
graceful_timeout = 10
timeout = 30
# Idle keep-alive connections hold a stopping worker until they time out, so keep
# this short; nginx's upstream keepalive_timeout must stay below it.
keepalive = 2
proc_name = f"bundle-{_service}"
accesslog = None  # the app logs one line per request itself
errorlog = "-"
control_socket_disable = True  # no runtime control socket: systemd is the control plane

# READY=1 reaches systemd only once every worker has loaded the app, not when the
# socket is bound as gunicorn would say it; and `python -m gunicorn_systemd reload`
# (ExecReload=) waits for the new workers the same way. gunicorn_systemd.py says how.
on_starting = gunicorn_systemd.on_starting
post_worker_init = gunicorn_systemd.post_worker_init
child_exit = gunicorn_systemd.child_exit

# Open streams need file descriptors: raise the soft limit to the hard one.
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _soft < _hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_hard, _hard))

# LOG_FORMAT=json: gunicorn's own records (the arbiter's, a worker's boot and exit) as
# the same JSON lines as the app's. logsetup.py is loaded by its path, not imported: no
# app code in the master (a bad LOG_FORMAT stops the start in the worker, with one line).
if os.environ.get("LOG_FORMAT", "").strip().lower() == "json":
    _spec = importlib.util.spec_from_file_location(
        "bundle_logsetup", Path(__file__).resolve().parent / "app/common/logsetup.py"
    )
    _logsetup = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_logsetup)
    logconfig_dict = _logsetup.gunicorn_logconfig(_service)
