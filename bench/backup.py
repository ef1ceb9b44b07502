"""What an online backup costs the services' writers, and how long it and a restore take
(issue #36). Run by hand:

    .venv/bin/python -m bench.backup            # 200 sessions x 2,000 events, 300 MB of uploads, 3 rounds
    .venv/bin/python -m bench.backup --quick    # 10 sessions x 200 events, 10 MB of uploads, 1 round (smoke run)
    .venv/bin/python bench/backup.py --help

It starts the deck service and the wizard (one gunicorn gevent worker each, with
devtools.services.start as production does) on the data folders of one temporary
data root, `<root>/data/<service>`, and fills them: the sample deck, S review sessions
made through the API whose event logs are then written straight to their files (E
valid note lines each, shaped like the line the service itself stored for a note
posted first), U MB of uploads as files of random bytes under `wizard/uploads/`,
and B blueprints posted through the wizard's API (its SQLite database). A restic
repository is made in the temporary folder with `python -m app.backup init`, and a
first snapshot is taken before any load (every byte new to the repository): its
duration is printed apart.

Then a steady write load runs to the end: K clients on keep-alive connections, half
posting deck notes (`POST /api/sessions/<id>/events`, a random session of the
filled ones) and half posting blueprints to the wizard (`POST
/api/collections/blueprints`, `X-Wiz-Test-User: bench`), each paced at P writes a
second (closed loop: a write waits for the answer before the next, late ones are
not caught up in a burst). Every write's send time and latency is kept. In each of
R rounds the load first runs alone, then `python -m app.backup create` runs as a
subprocess (its BACKUP_* variables naming the repository, the data root and a work
folder on the same file system); the window "during" is the backup's own run, and
the window "without" is the same length just before it, in the same round. Per round
and over all: write p50/p99 without and during, the ratio during/without of the
p99, the backup's duration (its own figure and the subprocess's wall time), the
size it read and what was new in the repository (from the command's line "created
snapshot ... N files, B bytes (A new in the repository) in S s"), its CPU (the
command and restic, from this process's waited-for children), and the repository's
size on disk. Machines are noisy: compare the ratio, not the milliseconds.

Last, `python -m app.backup restore latest` into a fresh data root (BACKUP_DATA_ROOT
pointing at it; nothing runs there) is timed: the restore's own time, from the
repository to files in place, checked. A host's recovery time adds the services'
start (and, on a new host, the provisioning) to it.

Everything runs on this machine: the clients (gevent, in this process), the two
services, the backup command and restic share its CPUs (2 on the VM of
docs/performance.md), so the backup's CPU shows in the writers' latency as much as
its disk reads do. Prints figures; asserts nothing; never collected as a test.
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/backup.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HttpError,
    KeepAliveClient,
    Service,
    build_request,
    exit_on_sigterm,
    fmt_ms,
    percentile,
    print_targets,
    run_header,
)

SAMPLE_DECK = ROOT / "samples" / "decks" / "welcome"
WIZARD_USER = {"X-Wiz-Test-User": "bench"}
BLUEPRINTS = "/api/collections/blueprints"
HOST_NAME = "bench"
SNAPSHOT_LINE = re.compile(
    r"created snapshot (?P<id>\w+) of (?P<host>\S+): (?P<files>\d+) files, (?P<bytes>\d+) bytes "
    r"\((?P<new>\d+) new in the repository\) in (?P<seconds>[\d.]+) s"
)
UPLOAD_FILE_BYTES = 2 * 1024 * 1024  # a photo-sized upload
SETTLE_S = 1.0  # after a backup, before the next round's reference window opens
BACKUP_TIMEOUT_S = 1800.0
MIN_QUIET_S = 3.0


# --------------------------------------------------------------------------- the data


def fill_decks(port, data_dir, sessions, events, rng):
    """The sample deck, `sessions` sessions made through the API, and `events` note
    lines written straight into each one's log; the session ids."""
    shutil.copytree(SAMPLE_DECK, data_dir / "sources" / "welcome")
    client = KeepAliveClient(port)
    try:
        client.json(
            "POST",
            "/api/decks/import",
            {"id": "welcome", "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"},
            expect=(201,),
        )
        ids = [
            client.json("POST", "/api/sessions", {"deck_id": "welcome", "title": f"review {i}"})["id"]
            for i in range(sessions)
        ]
        # One note through the service: the shape of a stored line, copied below.
        stored = client.json("POST", f"/api/sessions/{ids[0]}/events", note(rng), expect=(201,))
    finally:
        client.close()
    template = {k: v for k, v in stored.items() if k not in ("seq", "text")}
    for index, session_id in enumerate(ids):
        first = 2 if index == 0 else 1  # the posted note holds seq 1 of the first session
        lines = [
            json.dumps({**template, "seq": seq, "text": note(rng)["text"]}, separators=(",", ":")).encode() + b"\n"
            for seq in range(first, events + 1)
        ]
        with open(data_dir / "sessions" / session_id / "events.jsonl", "ab") as f:
            f.write(b"".join(lines))
    return ids


def note(rng):
    words = ("slide", "chart", "font", "colour", "typo", "legend", "axis", "title", "spacing", "logo", "quote")
    return {"type": "note", "slide": 0, "text": " ".join(rng.choice(words) for _ in range(rng.randint(8, 20)))}


def fill_uploads(uploads_dir, total_bytes):
    uploads_dir.mkdir(parents=True, exist_ok=True)
    written = 0
    while written < total_bytes:
        size = min(UPLOAD_FILE_BYTES, total_bytes - written)
        (uploads_dir / f"{uuid.uuid4().hex}.webp").write_bytes(os.urandom(size))
        written += size
    return written


def blueprint(i, rng):
    return {
        "title": f"blueprint {i}: {rng.choice(('poster', 'portrait', 'storyboard', 'landscape'))}",
        "description": "Step-by-step prompts for a "
        + " ".join(rng.choice(("neon", "noir", "retro", "pastel")) for _ in range(20)),
        "cover_url": f"/uploads/{uuid.uuid4().hex}.webp",
        "tags": ["bench", rng.choice(("poster", "photo", "draft"))],
        "is_public": True,
    }


def fill_wizard(port, count, rng, concurrency=8):
    """`count` blueprints posted through the API by `concurrency` clients."""
    left = list(range(count))

    def poster():
        client = KeepAliveClient(port)
        try:
            while left:
                client.json("POST", BLUEPRINTS, blueprint(left.pop(), rng), headers=WIZARD_USER, expect=(201,))
        finally:
            client.close()

    gevent.joinall([gevent.spawn(poster) for _ in range(concurrency)], raise_error=True)


def disk_usage(path):
    """Bytes the files below `path` take on disk (st_blocks)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def fmt_mb(count):
    return f"{count / 1e6:,.1f} MB"


# --------------------------------------------------------------------------- the load


class Load:
    """K paced writers; every write's (send time, latency, service) in `samples`."""

    def __init__(self, deck_port, wizard_port, session_ids, clients, rate, seed):
        self.samples, self.errors, self.statuses = [], Counter(), Counter()
        self.running = True
        self.greenlets = []
        rng = random.Random(seed)
        for index in range(clients):
            if index % 2 == 0:
                self.greenlets.append(
                    gevent.spawn(self._deck, deck_port, session_ids, rate, random.Random(rng.random()))
                )
            else:
                self.greenlets.append(gevent.spawn(self._wizard, wizard_port, rate, random.Random(rng.random())))

    def _deck(self, port, session_ids, rate, rng):
        def request():
            path = f"/api/sessions/{rng.choice(session_ids)}/events"
            return build_request("POST", path, f"127.0.0.1:{port}", None, note(rng))

        self._paced("decks", port, request, rate, rng)

    def _wizard(self, port, rate, rng):
        counter = iter(range(10**9))

        def request():
            return build_request("POST", BLUEPRINTS, f"127.0.0.1:{port}", WIZARD_USER, blueprint(next(counter), rng))

        self._paced("wizard", port, request, rate, rng)

    def _paced(self, service, port, request, rate, rng):
        client = KeepAliveClient(port)
        interval = 1.0 / rate
        gevent.sleep(rng.random() * interval)  # spread the clients over the interval
        due = time.perf_counter()
        try:
            while self.running:
                raw = request()
                sent = time.perf_counter()
                try:
                    status, _, _ = client.send(raw)
                except (OSError, ConnectionError, HttpError, ValueError) as exc:
                    self.errors[f"{service}: {type(exc).__name__}: {exc}"] += 1
                    gevent.sleep(interval)
                    continue
                latency = time.perf_counter() - sent
                self.statuses[(service, status)] += 1
                if status == 201:
                    self.samples.append((sent, latency, service))
                due = max(due + interval, time.perf_counter())  # late: no burst to catch up
                gevent.sleep(max(0.0, due - time.perf_counter()))
        finally:
            client.close()

    def window(self, start, end, service=None):
        return [lat for sent, lat, name in self.samples if start <= sent < end and (service is None or name == service)]

    def stop(self):
        self.running = False
        gevent.joinall(self.greenlets, timeout=30)
        gevent.killall(self.greenlets, timeout=5)


# --------------------------------------------------------------------------- the backup command


def backup_command(environment, *arguments):
    """(wall seconds, CPU seconds of the command and what it waited for, stdout) of
    `python -m app.backup ...`; RuntimeError when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "app.backup", *arguments],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=BACKUP_TIMEOUT_S,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(f"backup {' '.join(arguments)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return wall, cpu, done.stdout


def snapshot_facts(stdout):
    found = SNAPSHOT_LINE.search(stdout)
    if found is None:
        raise RuntimeError(f"the backup printed no snapshot line: {stdout!r}")
    return {k: (v if k in ("id", "host") else float(v)) for k, v in found.groupdict().items()}


def environment_for(data_root, repository, password, work_dir):
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("BACKUP_", "RESTIC_"))}
    return {
        **keep,
        "BACKUP_REPOSITORY": str(repository),
        "BACKUP_PASSWORD_FILE": str(password),
        "BACKUP_DATA_ROOT": str(data_root),
        "BACKUP_WORK_DIR": str(work_dir),
        "BACKUP_SECRETS_FILE": "",
        "BACKUP_STATUS_FILE": "",
        "BACKUP_HOST_NAME": HOST_NAME,
    }


# --------------------------------------------------------------------------- the run


def ratio(during, without):
    return during / without if during is not None and without else None


def fmt_ratio(value):
    return "-" if value is None else f"{value:.2f}"


def row_figures(load, start_without, start, end):
    figures = {}
    for service in (None, "decks", "wizard"):
        without = load.window(start_without, start, service)
        during = load.window(start, end, service)
        figures[service] = {
            "n_without": len(without),
            "n_during": len(during),
            "p50_without": percentile(without, 50),
            "p99_without": percentile(without, 99),
            "p50_during": percentile(during, 50),
            "p99_during": percentile(during, 99),
        }
    return figures


def print_window(label, f):
    print(
        f"     {label:<7} without: p50 {fmt_ms(f['p50_without'])}, p99 {fmt_ms(f['p99_without'])}"
        f" ({f['n_without']} writes);"
        f" during: p50 {fmt_ms(f['p50_during'])}, p99 {fmt_ms(f['p99_during'])} ({f['n_during']} writes);"
        f" p99 during/without {fmt_ratio(ratio(f['p99_during'], f['p99_without']))}"
    )


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.backup", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="10 sessions x 200 events, 10 MB, 200 rows, 1 round: a smoke run"
    )
    p.add_argument("--sessions", type=int, default=None, help="deck review sessions (default 200)")
    p.add_argument("--events", type=int, default=None, help="events in each session's log (default 2000)")
    p.add_argument("--uploads-mb", type=float, default=None, help="MB of wizard uploads (default 300)")
    p.add_argument("--rows", type=int, default=None, help="blueprints in the wizard's database (default 3000)")
    p.add_argument("--clients", type=int, default=8, help="writers, half on each service (default 8)")
    p.add_argument("--rate", type=float, default=20.0, help="writes a second per writer (default 20)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of without/during (default 3)")
    p.add_argument("--tmp-dir", help="parent of the temporary folder (default: the system's, /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = p.parse_args(argv)
    quick = {"sessions": 10, "events": 200, "uploads_mb": 10.0, "rows": 200, "rounds": 1}
    full = {"sessions": 200, "events": 2000, "uploads_mb": 300.0, "rows": 3000, "rounds": 3}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.sessions, args.events, args.clients, args.rounds, args.rows) < 1 or args.rate <= 0:
        p.error("--sessions, --events, --rows, --clients, --rounds must be at least 1 and --rate above 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()
    print(run_header("backup: writers' latency during an online backup, its duration and size, a restore", args.quick))
    root = Path(tempfile.mkdtemp(prefix="bench-backup-", dir=args.tmp_dir))
    data_root = root / "data"
    print(
        f"temporary folder {root}; data root, work folder and repository on the same file system;"
        f" the clients, both services, the backup and restic share this machine's {os.cpu_count()} CPUs"
    )
    started = []
    load = None
    rng = random.Random(36)
    try:
        t0 = time.perf_counter()
        decks_dir, wizard_dir = data_root / "decks", data_root / "wizard"
        decks_dir.mkdir(parents=True)
        wizard_dir.mkdir(parents=True)
        decks = Service("decks", decks_dir, root / "decks.log")
        started.append(decks)
        wizard = Service("wizard", wizard_dir, root / "wizard.log", env={"WIZ_ALLOW_TEST_IDENTITY": "1"})
        started.append(wizard)
        session_ids = fill_decks(decks.port, decks_dir, args.sessions, args.events, rng)
        uploads = fill_uploads(wizard_dir / "uploads", int(args.uploads_mb * 1e6))
        fill_wizard(wizard.port, args.rows, rng)
        db_files = [p for p in wizard_dir.iterdir() if p.is_file()]
        print(
            f"data: {args.sessions} deck sessions x {args.events} events"
            f" ({fmt_mb(disk_usage(decks_dir / 'sessions'))}),"
            f" {fmt_mb(uploads)} of wizard uploads, {args.rows} blueprints"
            f" ({', '.join(f'{p.name} {fmt_mb(p.stat().st_size)}' for p in db_files)});"
            f" made in {time.perf_counter() - t0:.1f} s"
        )

        repo_dir = root / "restic"
        repo_dir.mkdir()
        password = repo_dir / "password"
        password.write_text("bench password, not secret\n")
        password.chmod(0o600)
        repository = repo_dir / "repository"
        environment = environment_for(data_root, repository, password, root / "work")
        backup_command(environment, "init")

        wall, cpu, out = backup_command(environment, "create")
        first = snapshot_facts(out)
        print(
            f"first snapshot, no load: {first['seconds']:.1f} s ({wall:.1f} s wall, {cpu:.1f} CPU-s),"
            f" {int(first['files'])} files, {fmt_mb(first['bytes'])} in the snapshot, {fmt_mb(first['new'])} new in the"
            f" repository; repository {fmt_mb(disk_usage(repository))} on disk"
        )

        print(
            f"load: {args.clients} keep-alive writers ({(args.clients + 1) // 2} deck notes, {args.clients // 2}"
            f" blueprints), each paced at {args.rate:g}/s ({args.clients * args.rate:g} writes/s in all)"
        )
        load = Load(decks.port, wizard.port, session_ids, args.clients, args.rate, seed=36)
        quiet = max(MIN_QUIET_S, first["seconds"] * 1.25) + SETTLE_S
        rounds, all_without, all_during = [], [], []
        for number in range(1, args.rounds + 1):
            gevent.sleep(quiet)
            start = time.perf_counter()
            wall, cpu, out = backup_command(environment, "create")
            end = time.perf_counter()
            facts = snapshot_facts(out)
            length = end - start
            start_without = max(start - length, start - quiet + SETTLE_S)
            figures = row_figures(load, start_without, start, end)
            repo_size = disk_usage(repository)
            rounds.append({"facts": facts, "wall": wall, "cpu": cpu, "figures": figures, "repo": repo_size})
            all_without += load.window(start_without, start)
            all_during += load.window(start, end)
            print(
                f"   round {number}: backup {facts['seconds']:.1f} s ({wall:.1f} s wall, {cpu:.1f} CPU-s:"
                f" {cpu / wall * 100:.0f}% of one CPU), {fmt_mb(facts['bytes'])} in the snapshot,"
                f" {fmt_mb(facts['new'])} new;"
                f" repository {fmt_mb(repo_size)}; window without {start - start_without:.1f} s"
            )
            for label, service in (("all", None), ("decks", "decks"), ("wizard", "wizard")):
                print_window(label, figures[service])
            quiet = max(MIN_QUIET_S, length * 1.25) + SETTLE_S
        load.stop()
        bad = {f"{s} {code}": n for (s, code), n in load.statuses.items() if code != 201}
        print(
            f"   writes answered 201: {len(load.samples)}; other answers {bad or 'none'};"
            f" errors {sum(load.errors.values())}"
        )
        for error, count in load.errors.most_common(3):
            print(f"     {count} x {error}")

        for service in started:
            service.stop()
        fresh = root / "restored"
        fresh.mkdir()
        restore_env = environment_for(fresh, repository, password, root / "restore-work")
        wall, cpu, out = backup_command(restore_env, "restore", "latest")
        restored = sum(1 for _, _, files in os.walk(fresh) for _ in files)
        print(
            f"restore latest into a fresh data root: {wall:.1f} s ({cpu:.1f} CPU-s), {restored} files,"
            f" {fmt_mb(disk_usage(fresh))} on disk (the restore's own time; a host's RTO adds the services' start)"
        )
        restore_seconds = wall

        p99_without, p99_during = percentile(all_without, 99), percentile(all_during, 99)
        durations = [r["facts"]["seconds"] for r in rounds]
        print(f"\n== Summary ({'quick smoke run' if args.quick else 'full run'}, {args.rounds} round(s)) ==")
        print_targets(
            [
                (
                    "write p50 without / during",
                    f"{fmt_ms(percentile(all_without, 50))} / {fmt_ms(percentile(all_during, 50))}",
                    "-",
                    None,
                ),
                ("write p99 without / during", f"{fmt_ms(p99_without)} / {fmt_ms(p99_during)}", "-", None),
                ("write p99 during/without", fmt_ratio(ratio(p99_during, p99_without)), "-", None),
                ("backup duration under load", ", ".join(f"{d:.1f} s" for d in durations), "-", None),
                ("first snapshot, no load", f"{first['seconds']:.1f} s", "-", None),
                (
                    "data backed up",
                    f"{fmt_mb(rounds[-1]['facts']['bytes'])} in {int(rounds[-1]['facts']['files'])} files",
                    "-",
                    None,
                ),
                ("repository on disk", fmt_mb(rounds[-1]["repo"]), "-", None),
                ("restore latest (fresh root)", f"{restore_seconds:.1f} s", "-", None),
            ]
        )
    except BaseException:
        for service in started:
            if service.running is not None:
                print(f"   --- {service.log_path} tail ---\n{service.log_tail()}", file=sys.stderr)
        raise
    finally:
        if load is not None:
            load.stop()
        for service in started:
            service.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
