"""The services' reference pages (docs/services/<service>.md) hold routes and
variables, and the backup page (docs/backup.md) the backup command's variables,
written from the code by `python -m devtools.reference`; these tests fail when a
committed page has drifted from what the command writes, and show that a changed
page, an undeclared variable and a page without markers are all caught."""

import shutil

import pytest

from app.common import config
from devtools import reference

SERVICES = ("workspace", "decks", "notebook", "audio", "wizard")


def test_the_committed_pages_are_what_the_code_writes():
    problems = reference.run(check=True)
    assert not problems, "the reference drifted from the code:\n" + "\n".join(problems)


def test_a_changed_page_is_detected(tmp_path):
    for service in SERVICES:
        shutil.copy(reference.DOCS_DIR / f"{service}.md", tmp_path)
    page = tmp_path / "decks.md"
    page.write_text(page.read_text().replace("| GET | `/healthz` |", "| POST | `/healthz` |"))
    # The other pages as copies too: the writing run below must write nothing of the checkout's.
    pages = {"metrics_page": tmp_path / "metrics.md", "backup_page": tmp_path / "backup.md"}
    shutil.copy(reference.METRICS_PAGE, pages["metrics_page"])
    shutil.copy(reference.BACKUP_PAGE, pages["backup_page"])
    problems = reference.run(check=True, docs_dir=tmp_path, **pages)
    assert [p for p in problems if "decks.md" in p] == [
        f"{page}: differs from the code (run `python -m devtools.reference`)"
    ]
    assert not [p for p in problems if "decks.md" not in p]
    assert "| POST | `/healthz` |" in page.read_text(), "--check writes nothing"

    assert reference.run(check=False, docs_dir=tmp_path, **pages) == []
    assert page.read_text() == (reference.DOCS_DIR / "decks.md").read_text()


def test_a_changed_backup_page_is_detected(tmp_path):
    page = tmp_path / "backup.md"
    committed = reference.BACKUP_PAGE.read_text()
    page.write_text(committed.replace("| `BACKUP_KEEP_DAILY` | `7` |", "| `BACKUP_KEEP_DAILY` | `14` |"))
    assert page.read_text() != committed
    assert reference.run(check=True, backup_page=page) == [
        f"{page}: differs from the code (run `python -m devtools.reference`)"
    ]
    assert reference.run(check=False, backup_page=page) == []
    assert page.read_text() == committed

    page.write_text("# Backups\n\nNo reference here.\n")
    assert reference.run(check=True, backup_page=page) == [
        f"{page}: it needs one `<!-- reference:variables:begin -->` line and, after it, "
        "one `<!-- reference:variables:end -->` line"
    ]


def test_the_backup_page_names_every_metric_of_the_status_file():
    from app.backup import status

    text = reference.BACKUP_PAGE.read_text()
    for name in [status._SUCCESS, *status._HELP]:
        assert f"`{name}`" in text


def test_a_page_without_its_markers_is_named(tmp_path):
    for service in SERVICES:
        shutil.copy(reference.DOCS_DIR / f"{service}.md", tmp_path)
    (tmp_path / "audio.md").write_text("# audio\n\nNo reference here.\n")
    (tmp_path / "wizard.md").unlink()
    problems = reference.run(check=False, docs_dir=tmp_path)
    assert (
        f"{tmp_path / 'audio.md'}: it needs one `<!-- reference:routes:begin -->` line and, after it, "
        "one `<!-- reference:routes:end -->` line" in problems
    )
    assert f"{tmp_path / 'wizard.md'}: missing" in problems
    assert (tmp_path / "audio.md").read_text() == "# audio\n\nNo reference here.\n"


def test_a_variable_read_without_a_declaration_is_named(tmp_path, monkeypatch):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "thing.py").write_text(
        'x = env_int("DECKS_SOMETHING_NEW", 3)\ny = os.environ.get("DATA_DIR")\n'
        'z = os.environ.get("BACKUP_REPOSITORY")\n'
    )
    assert "BACKUP_REPOSITORY" in reference.all_declared()  # the backup command's, counted too
    assert reference.undeclared_reads(tmp_path) == [("DECKS_SOMETHING_NEW", "app/thing.py")]
    assert reference.undeclared_reads() == []
    # A declaration of a variable the code parses itself counts only while the code names it.
    assert ("CURL_CA_BUNDLE", "services that call providers") in reference.unread_declarations(tmp_path)
    assert reference.unread_declarations() == []


def test_a_read_outside_the_declarations_must_agree_with_its_declaration(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "generation.py").write_text(
        'a = env_int("WIZ_AI_CONCURRENCY", 4, minimum=1, maximum=256)\n'
        'b = config.env_int("DECKS_MAX_LOG_BYTES", 64 * 1024 * 1024, minimum=4096)\n'
        'c = env_str("WIZ_AI_BASE_URL", computed())\n'
        'd = env_int("WIZ_AI_CONCURRENCY", 5, maximum=256)\n'
        'e = env_str("WIZ_AI_PROVIDER")\n'
        'f = env_int("WIZ_AI_TIMEOUT", 60)\n'
        'g = env_int("BACKUP_KEEP_DAILY", 3, minimum=0)\n'
    )
    assert reference.mismatched_reads(tmp_path) == [
        ("BACKUP_KEEP_DAILY", "app/generation.py", "default 3, declared 7"),
        ("WIZ_AI_CONCURRENCY", "app/generation.py", "default 5, declared 4"),
        ("WIZ_AI_CONCURRENCY", "app/generation.py", "minimum None, declared 1"),
        ("WIZ_AI_PROVIDER", "app/generation.py", "default '', declared 'openai'"),
        ("WIZ_AI_TIMEOUT", "app/generation.py", "read with env_int, declared a Seconds"),
    ]
    assert reference.mismatched_reads() == []


def test_every_route_and_variable_is_listed_once_and_in_the_same_order():
    app = reference.build_app("notebook")
    once = reference.routes_of(app)
    assert once == reference.routes_of(reference.build_app("notebook"))
    paths = [path for _, path, _, _ in once]
    assert "/notebooks" in paths and "/api/notebooks" not in paths
    assert {mirrors for *_, mirrors in once} == {("/api",), ()}
    assert [path for _, path, _, mirrors in once if not mirrors] == ["/metrics"]  # the app's own, not mirrored
    # Every rule of the URL map is in the table, the /api twins folded into theirs.
    methods_and_paths = {
        (m, p)
        for methods, path, _, mirrors in once
        for m in methods
        for p in (path, *(prefix + path for prefix in mirrors))
    }
    for rule in app.url_map.iter_rules():
        for method in set(rule.methods) - {"HEAD", "OPTIONS"}:
            assert (method, rule.rule) in methods_and_paths
    names = [v.name for group in reference.variables_of("notebook").groups() for v in group]
    assert len(names) == len(set(names))
    assert {"DATA_DIR", "REDIS_URL", "NOTEBOOK_PASSWORD", "REQUESTS_CA_BUNDLE"} <= set(names)


def test_a_views_websocket_and_plain_rules_share_a_row():
    routes = {path: methods for methods, path, _, _ in reference.routes_of(reference.build_app("workspace"))}
    assert routes["/relay"] == ("GET", "websocket")
    assert routes["/healthz"] == ("GET",)


def test_the_output_names_no_path_of_this_machine():
    for service in SERVICES:
        text = (reference.DOCS_DIR / f"{service}.md").read_text()
        assert str(reference.ROOT) not in text and "/tmp" not in text


def test_a_declaration_reads_as_the_helper_it_stands_for(monkeypatch):
    """Same default, same bounds, same message as the env_* helper."""
    limit = config.Integer(name="X_LIMIT", doc="A limit.", default=5, minimum=1, maximum=9)
    monkeypatch.delenv("X_LIMIT", raising=False)
    assert limit.read() == 5 and limit.read(default=7) == 7
    monkeypatch.setenv("X_LIMIT", " 10 ")
    with pytest.raises(config.ConfigError, match=r"^X_LIMIT must be between 1 and 9, got 10$"):
        limit.read()
    monkeypatch.setenv("X_LIMIT", "2")
    with pytest.raises(config.ConfigError, match=r"^X_LIMIT must be between 3 and 9, got 2$"):
        limit.read(minimum=3)
    password = config.Text(name="X_PASSWORD", doc="A secret.", strip=False)
    monkeypatch.setenv("X_PASSWORD", " spaced ")
    assert password.read() == " spaced "
    assert config.Text(name="X_PASSWORD", doc="", default="d").read() == "spaced"
    assert config.Choice(name="X_PASSWORD", doc="", default="a", choices=("a",)).reference() == ("`a`", "a")
    assert config.Seconds(name="X", doc="", default=20.0, maximum=600).reference() == (
        "`20`",
        "seconds, more than 0 and at most 600",
    )
    group = config.Variables("x")
    group.add(limit)
    with pytest.raises(ValueError, match="X_LIMIT is declared twice in x"):
        group.add(limit)
