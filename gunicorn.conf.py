"""gunicorn settings for every service of the bundle.

Never import app code here: the gevent worker must monkey-patch before the app is
imported. HOST and PORT are read here, by the server adapter, not by the app.
"""

import glob
import importlib.util
import json
import os
import resource
import shutil
import sys
import tempfile
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
# Each open SSE or websocket stream holds one connection of the worker (a greenlet of
# its pool). One host at full scale is 10,000 streams or agents over 2 workers: 5,000
# each if the kernel dealt them out evenly, which it does not (an idle worker accepts
# more). 8192 holds that with room for users' requests; a full worker stops accepting
# and leaves new connections to the other worker, or to the socket's queue. The
# playbook writes it to each service's environment (services_worker_connections).
worker_connections = int(os.environ.get("WORKER_CONNECTIONS", "8192"))
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

# Metrics (app/common/metrics.py): prometheus_client's multiprocess mode, each worker
# writing its values to files in PROMETHEUS_MULTIPROC_DIR, which must be set before a
# worker imports prometheus_client: here, in the master, whose environment the workers
# inherit. Under systemd: $RUNTIME_DIRECTORY/metrics (/run/bundle-<service>/metrics,
# tmpfs); a folder the admin names: its subfolder <service> (two services given the
# same folder never empty nor read each other's files); else a temporary folder of this
# master's own (on_starting: never in a reload's preflight, which reads this file too),
# removed at its exit. The folder chosen is made here: on a HUP the master reads this
# file again but runs no on_starting. METRICS=off: none.
_METRICS_OFF = os.environ.get("METRICS", "").strip().lower() in ("0", "false", "no", "off")
_METRICS_TEMP_PREFIX = f"bundle-{_service}-metrics-"
# The folder this master chose, kept in its environment: a HUP keeps it as it is.
_METRICS_CHOSEN = "BUNDLE_METRICS_DIR"


def _use_metrics_folder(folder):
    os.makedirs(folder, mode=0o750, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.environ[_METRICS_CHOSEN] = folder


_runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
_runtime_metrics = os.path.join(_runtime, "metrics") if _runtime else None
_metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
if _METRICS_OFF:
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    os.environ.pop(_METRICS_CHOSEN, None)
elif _metrics_dir and _metrics_dir not in (os.environ.get(_METRICS_CHOSEN), _runtime_metrics):
    _use_metrics_folder(os.path.join(_metrics_dir, _service))  # the admin's folder
elif _metrics_dir or _runtime_metrics:
    _use_metrics_folder(_metrics_dir or _runtime_metrics)


def _metrics_files(pattern):
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return glob.glob(os.path.join(folder, pattern)) if folder else []


def on_starting(server):
    """The master's start: an empty metrics folder (the files of an earlier run would
    add their counts to this one's), or a temporary one, then gunicorn_systemd's hook."""
    if not _METRICS_OFF and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _use_metrics_folder(tempfile.mkdtemp(prefix=_METRICS_TEMP_PREFIX))
    # Only the files metrics write there: the folder may be one an admin named.
    for pattern in ("*.db", "*.partial", "*.folding", "metrics.lock"):
        for path in _metrics_files(pattern):
            os.remove(path)
    gunicorn_systemd.on_starting(server)


def child_exit(server, worker):
    """A worker reaped (in the master, from its SIGCHLD handling): the files of its live
    gauges go (prometheus_client's mark_process_dead, done here by name without
    importing it: nothing but removing files here). Its counters and histograms stay
    until a scrape folds them into the archive (app/common/metrics.py)."""
    for path in _metrics_files(f"gauge_live*_{worker.pid}.db"):
        try:
            os.remove(path)
        except OSError:
            pass
    gunicorn_systemd.child_exit(server, worker)


def on_exit(server):
    """The master's exit: the temporary metrics folder made above goes with it."""
    folder = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or "/nonexistent")
    if folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith(_METRICS_TEMP_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


# READY=1 reaches systemd only once every worker has loaded the app, not when the
# socket is bound as gunicorn would say it; and `python -m gunicorn_systemd reload`
# (ExecReload=) waits for the new workers the same way. gunicorn_systemd.py says how.
post_worker_init = gunicorn_systemd.post_worker_init

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
