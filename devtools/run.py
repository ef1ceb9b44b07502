"""`make run`: every built service under gunicorn on its loopback port, with
DATA_DIR=./var/<service>, behind a local nginx on 127.0.0.1:8080, until Ctrl-C.
Workspace apps are served on hosts of their own, `<app>--<agent>--<workspace>--<user>
.apps.localhost:8080` (browsers resolve every *.localhost name to loopback).

The deck review service is seeded with the sample deck (and one session) on its
first run, so there is a real deck to look at at once.
"""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import requests

from app import built_services
from devtools import nginx, services

ROOT = Path(__file__).resolve().parents[1]
VAR = ROOT / "var"
NGINX_PORT = 8080
APPS_HOST = "*.apps.localhost"  # the workspace apps' wildcard host


def _relay(name, stream):
    """Prefix each log line of a service with its name."""
    for line in iter(stream.readline, b""):
        sys.stderr.write(f"[{name}] {line.decode(errors='replace')}")
    stream.close()


def _seed_decks(service):
    """Import the sample deck and open a session, the first time only."""
    if (service.data_dir / "decks" / "welcome").exists():
        return
    source = service.data_dir / "sources" / "welcome"
    if not source.exists():
        shutil.copytree(ROOT / "samples" / "decks" / "welcome", source)
    body = {"id": "welcome", "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"}
    requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=30).raise_for_status()
    requests.post(
        f"{service.base_url}/api/sessions", json={"deck_id": "welcome", "title": "Sample review"}, timeout=10
    ).raise_for_status()


def _prepare_audio(data_dir):
    """Sounds the bundle makes itself, in the local sound library (kept if present),
    before the start: the worker probes its library as it starts."""
    from app.audio.seed import seed

    seed(str(data_dir / "soundlib"))


def _made_once(path, make):
    """A secret made once per checkout (0600 under var/), the same at every start."""
    if not path.exists():
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()


def _prepare_notebook(data_dir):
    from cryptography.fernet import Fernet

    ENVIRONMENTS["notebook"] = {
        "NOTEBOOK_PASSWORD": _made_once(data_dir / "dev-password", lambda: secrets.token_urlsafe(18)),
        # Encrypts provider API keys at rest (printed nowhere).
        "NOTEBOOK_ENCRYPTION_KEY": _made_once(data_dir / "encryption-key", lambda: Fernet.generate_key().decode()),
        "NOTEBOOK_CORS_ORIGINS": "*",
        # A model server on this machine (Ollama, llama.cpp, LM Studio) may be used.
        "NOTEBOOK_MODEL_HOST_ALLOWLIST": "127.0.0.1/32,::1/128",
    }


def _notebook_worker(service):
    """The notebook's job consumer, a process of its own beside the web service."""
    process = subprocess.Popen(
        [sys.executable, "-m", "app.notebook", "worker"],
        cwd=ROOT,
        env={**os.environ, "DATA_DIR": str(service.data_dir), **ENVIRONMENTS["notebook"]},
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    threading.Thread(target=_relay, args=("notebook-worker", process.stderr), daemon=True).start()
    return process


# Where a person starts: the audio service has no page, its capabilities say what works.
HOME_PATHS = {"audio": "/api/audio/capabilities", "notebook": "/docs"}
PREPARERS = {"audio": _prepare_audio, "notebook": _prepare_notebook}  # on DATA_DIR, before the start
SEEDERS = {"decks": _seed_decks}  # through the running service
COMPANIONS = {"notebook": _notebook_worker}  # processes that run beside a service
# What a service needs besides SERVICE, PORT and DATA_DIR on this machine.
ENVIRONMENTS = {
    "audio": {"AUDIO_PUBLIC_ORIGIN": f"http://audio.localhost:{NGINX_PORT}"},
    "workspace": {
        "WORKSPACE_ACCESS_URL": f"http://workspace.localhost:{NGINX_PORT}",
        "WORKSPACE_WILDCARD_ACCESS_URL": f"{APPS_HOST}:{NGINX_PORT}",
    },
}


def _start_services(companions):
    running = []
    for name in built_services():
        data_dir = VAR / name
        data_dir.mkdir(parents=True, exist_ok=True)
        PREPARERS.get(name, lambda d: None)(data_dir)
        service = services.start(
            name,
            data_dir,
            port=services.PORTS[name],
            env=ENVIRONMENTS.get(name),
            stderr=subprocess.PIPE,
            own_session=True,
        )
        threading.Thread(target=_relay, args=(name, service.process.stderr), daemon=True).start()
        running.append(service)
        SEEDERS.get(name, lambda s: None)(service)
        if name in COMPANIONS:
            companions.append(COMPANIONS[name](service))
    return running


def main():
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    running, companions, proxy = [], [], None
    try:
        running = _start_services(companions)
        proxy = nginx.start(
            VAR / "nginx",
            NGINX_PORT,
            {s.name: f"127.0.0.1:{s.port}" for s in running},
            stderr=sys.stderr,
            variables={
                "wizard_uploads_dir": str(VAR / "wizard" / "uploads"),
                "wizard_lists_dir": str(VAR / "wizard" / "lists"),
                "workspace_apps_host": APPS_HOST,
            },
        )
        print("\nThe bundle is running (Ctrl-C stops it):", flush=True)
        for service in running:
            home = HOME_PATHS.get(service.name, "/")
            print(
                f"  {service.name:10} http://{proxy.host(service.name)}:{proxy.port}{home}   "
                f"(direct: {service.base_url}/, data: {service.data_dir})",
                flush=True,
            )
            if service.name == "workspace":
                print(
                    f"  {'apps':10} http://<app>--<agent>--<workspace>--<user>{APPS_HOST[1:]}:{proxy.port}/", flush=True
                )
        if "notebook" in ENVIRONMENTS:
            print(
                f"  notebook password: {ENVIRONMENTS['notebook']['NOTEBOOK_PASSWORD']}  "
                "(Authorization: Bearer <password>)",
                flush=True,
            )
        print(flush=True)
        while not stop.is_set() and all(s.process.poll() is None for s in running):
            stop.wait(1)
        for service in running:
            if service.process.poll() is not None:
                print(f"{service.name} exited with {service.process.returncode}", file=sys.stderr)
    except (OSError, RuntimeError, nginx.NginxError, requests.RequestException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if proxy is not None:
            proxy.stop()
        for process in companions:
            services.terminate(process, 20)
        for service in running:
            service.stop()
        print("stopped.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
