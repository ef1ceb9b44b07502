"""Host-side commands of the notebook service.

    python -m app.notebook worker     consume the job queue (sources, note embeddings)
    python -m app.notebook reembed    queue an embedding rebuild: every chunk and note that the
                                      configured model did not make (after a model change)
    python -m app.notebook copy-to-postgres postgresql://USER:PASSWORD@HOST/DB
                                      move this SQLite database into an empty PostgreSQL one
    python -m app.notebook contract [--dry-run]
                                      run the pending contract schema steps (docs/operations.md)

The worker reads the same environment as the service (DATA_DIR, DATABASE_URL,
REDIS_URL, NOTEBOOK_*); stop it with SIGINT to let running jobs finish, SIGTERM to
stop at once (a job cut off is marked failed at the next start, or by another worker
of a Redis queue, and can be retried). With REDIS_URL, any number of workers, on any
hosts, share the queue.
"""

import logging
import sys
import threading
import time

from app.common import config
from app.common.cli import CommandLine, CopyPlan
from app.common.logsetup import configure_logging

log = logging.getLogger("bundle.notebook.worker")


def _preload_model(settings):
    """Load the embedding model once, beside the consumer, so that the first job
    that needs it does not pay the load, and jobs without it need not wait. (The
    NOTEBOOK_EMBEDDING_* model: a provider's default embedding model has nothing to
    load, and is not called for nothing.)"""
    from app.notebook.core import embeddings

    try:
        embeddings.env_embedder(settings).embed(["warm up"])
        log.info("embedding model ready: %s", settings.embedding_model)
    except embeddings.EmbeddingUnavailable as exc:
        log.warning("vector search is unavailable: %s", exc)
    except Exception:  # the model failed to load: jobs will fail with the error; say it here too
        log.exception("the embedding model could not be loaded")


def worker(args):
    from app.common import live_processes
    from app.notebook.core.migrations import open_database
    from app.notebook.settings import NotebookSettings
    from app.notebook.worker import processing
    from app.notebook.worker.jobs import JobQueue

    configure_logging()
    logging.getLogger("huey").setLevel(logging.WARNING)
    settings = NotebookSettings.from_env(config.data_dir("notebook"), serving=False)
    database = open_database(settings.database_url, pool=False)
    # A live process of this release until it stops (a contract step waits for the
    # older releases' ones to be gone).
    registration = live_processes.register(database, "job worker")
    queue = JobQueue(settings)
    processing.configure(settings, queue)
    orphaned = None
    if queue.on_redis:
        # Other workers may share the queue: only the jobs of gone workers are cut off.
        from app.common import redis_client
        from app.notebook.worker.presence import Presence

        queue.presence = Presence(redis_client.for_url(settings.redis_url))
        orphaned = queue.presence.orphaned
        if not queue.presence.beat():
            log.warning("waiting for the job queue's Redis to answer")
            while not queue.presence.beat():
                time.sleep(1)
    _sweep(database, orphaned)
    processing.requeue_waiting(queue)
    if queue.presence:
        queue.presence.start(lambda: _sweep_redis(database, orphaned, queue))
    threading.Thread(target=_preload_model, args=(settings,), daemon=True, name="model-preload").start()
    # SQLite: poll the queue every 50 ms when busy, backing off to 0.5 s when idle (a
    # queued job starts within half a second). Redis: each thread waits in BRPOP, and
    # the back-off paces its attempts while Redis does not answer.
    consumer = queue.huey.create_consumer(
        workers=settings.worker_threads,
        worker_type="thread",
        periodic=False,
        initial_delay=0.05,
        backoff=1.15,
        max_delay=0.5,
    )
    # huey's SIGHUP restarts the consumer by exec'ing the command again, which registers
    # anew: the row goes first. Its run loop stops the consumer (stop()) on every way
    # out, the restart included, and has no hook of its own for it.
    stop_consumer = consumer.stop

    def stop_and_unregister(graceful=False):
        stop_consumer(graceful)
        registration.stop()

    consumer.stop = stop_and_unregister
    log.info("notebook worker: %d thread(s), queue %s", settings.worker_threads, queue.describe())
    try:
        consumer.run()
    finally:
        if queue.presence:
            queue.presence.stop()
        registration.stop()
    return 0


def _sweep(database, orphaned):
    """Fail the jobs of workers that are gone: at the start, then periodically in the
    presence thread (several workers)."""
    from app.notebook.worker import processing

    with database.connection_context():
        recovered = processing.recover_interrupted(orphaned)
    if recovered:
        log.warning("%d job(s) were cut off by a stopped worker: marked failed", recovered)


def _sweep_redis(database, orphaned, queue):
    """The periodic sweep of a Redis queue: the jobs of gone workers, then the queue
    entries a Redis failover lost (a command `new` for a whole sweep's period that the
    queue does not hold is queued again; a copy runs once)."""
    from app.notebook.worker import processing
    from app.notebook.worker.presence import BEAT_SECONDS

    _sweep(database, orphaned)
    with database.connection_context():
        lost = processing.requeue_lost(queue, older_than=BEAT_SECONDS)
    if lost:
        log.warning("%d queued job(s) were missing from the queue (a Redis failover?): queued again", lost)


def reembed(args):
    """Queue an embedding rebuild (mode `all`: whatever the configured model did not
    embed), the same job as POST /embeddings/rebuild; the worker runs it."""
    from app.notebook.core import embeddings, reembed
    from app.notebook.core.ids import public
    from app.notebook.core.migrations import open_database
    from app.notebook.core.models import write_transaction
    from app.notebook.settings import NotebookSettings
    from app.notebook.worker.jobs import JobQueue

    settings = NotebookSettings.from_env(config.data_dir("notebook"), serving=False)
    open_database(settings.database_url, pool=False)
    reason = embeddings.unavailable_reason(settings)
    if reason:
        sys.stderr.write(f"error: {reason}\n")
        return 1
    try:
        name = reembed.model_name(settings)
    except embeddings.EmbeddingUnavailable as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sources, notes = reembed.stale_items(name, "all")
    queue = JobQueue(settings)
    with write_transaction():
        command = queue.new_command(reembed.KIND, reembed.target(None), reembed.request("all", True, True))
    if not queue.enqueue(command):
        sys.stderr.write("error: the job queue is unavailable; try again later\n")
        return 1
    print(
        f"queued {len(sources)} source(s) and {len(notes)} note(s) for {name}: "
        f"{public('command', command.id)} (GET /embeddings/rebuild/<command>/status)"
    )
    return 0


def copy_plan():
    """The tables, but the full-text index: each engine has its own, made again from
    the copied sources and notes."""
    from app.notebook.core.migrations import HISTORY, index_everything, open_database
    from app.notebook.core.models import SearchDoc, database
    from app.notebook.settings import NotebookSettings

    def rebuild(url):
        db = open_database(url, pool=False)
        with database.connection_context(), database.atomic():
            index_everything(db)
            return f"indexed for text search: {SearchDoc.select().count()} rows"

    settings = NotebookSettings.from_env(config.data_dir("notebook"), serving=False)
    return CopyPlan(HISTORY, settings.database_url, derived=(SearchDoc,), rebuild=rebuild)


def _contract_target():
    from app.notebook.core.migrations import HISTORY
    from app.notebook.settings import NotebookSettings

    return HISTORY, NotebookSettings.from_env(config.data_dir("notebook"), serving=False).database_url


commands = CommandLine("python -m app.notebook", __doc__)
commands.add("worker", "consume the job queue until stopped", lambda args, streams: worker(args))
commands.add(
    "reembed", "queue embeddings for what the configured model did not embed", lambda args, streams: reembed(args)
)
commands.add_copy_to_postgres(copy_plan)
commands.add_contract(_contract_target)


def main(argv=None):
    return commands.main(argv)
