"""The prompt wizard behind the real nginx site: nginx is what vouches for identity.
Client-sent identity and test headers never get through; forward auth at an
Authelia-shaped provider makes signed-in visitors themselves and everyone else
`public`; uploads are served from the folder with nosniff; collection lists are sent
by nginx from the files the service names; events are unbuffered."""

import io
import re
import threading

import pytest
import requests
from PIL import Image

from app.common.sse_client import iter_records
from devtools import nginx
from devtools.oidc_provider import SESSION_COOKIE, portal_session
from tests.support.wizard import FORWARD_AUTH_PASSWORD

FORGED = {
    "Remote-User": "root",
    "Remote-Groups": "admins",
    "X-Wiz-Test-User": "root",
    "X-Wiz-Test-Groups": "admins",
    "X-Forwarded-For": "127.0.0.1",
}


@pytest.fixture(scope="module")
def wizard_backend(start_module_service):
    # The test identity is on: it must still be unusable through the proxy.
    return start_module_service("wizard", env={"WIZ_ALLOW_TEST_IDENTITY": "1"})


def site(wizard_backend, prefix, lists=True, provider=None):
    """The wizard's site in front of `wizard_backend`: its uploads folder, its lists
    folder (`lists`), forward auth at `provider` (else everyone is `public`)."""
    variables = {"wizard_uploads_dir": str(wizard_backend.data_dir / "uploads")}
    if lists:
        variables["wizard_lists_dir"] = str(wizard_backend.data_dir / "lists")
    if provider is not None:
        variables["wizard_auth_request_url"] = provider.issuer + "/api/authz/auth-request"
    return nginx.start(prefix, upstreams={"wizard": f"127.0.0.1:{wizard_backend.port}"}, variables=variables)


@pytest.fixture(scope="module")
def open_proxy(wizard_backend, tmp_path_factory):
    """The site with no identity provider: everyone is `public`."""
    proxy = site(wizard_backend, tmp_path_factory.mktemp("nginx-wizard-open"))
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def auth_proxy(wizard_backend, forward_auth_provider, tmp_path_factory):
    """Forward auth, and no lists folder: the service sends every list itself."""
    proxy = site(
        wizard_backend, tmp_path_factory.mktemp("nginx-wizard-auth"), lists=False, provider=forward_auth_provider
    )
    yield proxy
    proxy.stop()


def provider_session(forward_auth_provider, username):
    """The provider's session cookie after a portal sign-in (the browser would send it
    to the wizard's host too: Authelia's cookie covers the parent domain)."""
    session = portal_session(forward_auth_provider.issuer, username, FORWARD_AUTH_PASSWORD)
    return {"Cookie": f"{SESSION_COOKIE}={session}"}


def me(proxy, **headers):
    response = requests.get(proxy.url + "/api/me", headers=proxy.headers("wizard", **headers), timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def test_without_a_provider_everyone_is_public_whatever_they_send(open_proxy):
    assert me(open_proxy) == {"id": "public", "username": "public", "is_admin": False}
    assert me(open_proxy, **FORGED) == {"id": "public", "username": "public", "is_admin": False}


def test_the_test_identity_cannot_be_used_through_the_proxy(open_proxy, auth_proxy):
    for proxy in (open_proxy, auth_proxy):
        assert me(proxy, **{"X-Wiz-Test-User": "root", "X-Wiz-Test-Groups": "admins"})["id"] == "public"


def test_anonymous_visitors_pass_as_public(auth_proxy, forward_auth_provider):
    assert me(auth_proxy) == {"id": "public", "username": "public", "is_admin": False}
    assert me(auth_proxy, **FORGED) == {"id": "public", "username": "public", "is_admin": False}
    # A session cookie the provider does not know is anonymous too.
    assert me(auth_proxy, Cookie=f"{SESSION_COOKIE}=forged")["id"] == "public"


def test_signed_in_visitors_carry_their_user_and_groups(auth_proxy, forward_auth_provider):
    ada = provider_session(forward_auth_provider, "ada")
    assert me(auth_proxy, **ada) == {"id": "ada", "username": "ada", "is_admin": True}
    # What the client claims changes nothing.
    assert me(auth_proxy, **ada, **{"Remote-User": "root", "Remote-Groups": ""})["id"] == "ada"
    bo = provider_session(forward_auth_provider, "bo")
    assert me(auth_proxy, **bo, **{"Remote-Groups": "admins"}) == {"id": "bo", "username": "bo", "is_admin": False}


def test_uploads_are_served_from_the_folder_with_nosniff(open_proxy, wizard_backend):
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "WEBP")
    response = requests.post(
        open_proxy.url + "/api/uploads",
        headers=open_proxy.headers("wizard"),
        files={"file": ("a.webp", buffer.getvalue(), "image/webp")},
        timeout=10,
    )
    assert response.status_code == 201
    url = response.json()["url"]
    served = requests.get(open_proxy.url + url, headers=open_proxy.headers("wizard"), timeout=10)
    assert served.status_code == 200 and served.content == buffer.getvalue()
    assert served.headers["Content-Type"] == "image/webp"
    assert served.headers["X-Content-Type-Options"] == "nosniff"
    assert re.fullmatch(r"/uploads/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.webp", url)
    old_name = "cd" * 16 + ".webp"  # as earlier releases named them: still served
    (wizard_backend.data_dir / "uploads" / old_name).write_bytes(buffer.getvalue())
    old = requests.get(open_proxy.url + "/uploads/" + old_name, headers=open_proxy.headers("wizard"), timeout=10)
    assert old.status_code == 200 and old.content == buffer.getvalue()
    for path in (
        "/uploads/../wizard.db",
        "/uploads/wizard.db",
        "/uploads/" + "0" * 32 + ".png",
        "/uploads/00000000-0000-0000-0000-000000000000.png",
    ):
        missing = requests.get(open_proxy.url + path, headers=open_proxy.headers("wizard"), timeout=10)
        assert missing.status_code == 404 and b"SQLite" not in missing.content


def test_a_body_over_the_upload_limit_is_refused_by_nginx(open_proxy):
    response = requests.post(
        open_proxy.url + "/api/uploads",
        headers=open_proxy.headers("wizard"),
        files={"file": ("big.png", b"\0" * (10 * 1024 * 1024), "image/png")},
        timeout=30,
    )
    assert response.status_code == 413
    assert "8 MB" in response.json()["error"]


def test_events_flow_through_unbuffered(open_proxy):
    with requests.get(
        open_proxy.url + "/api/events", headers=open_proxy.headers("wizard"), stream=True, timeout=10
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["X-Accel-Buffering"] == "no"
        requests.post(
            open_proxy.url + "/api/collections/saved_prompts",
            headers=open_proxy.headers("wizard"),
            json={"text": "through nginx"},
            timeout=10,
        )
        record = next(iter_records(stream))
        assert record.json() == {"collection": "saved_prompts"}


def test_an_unavailable_identity_provider_fails_closed(auth_proxy, forward_auth_provider):
    # Never served as `public` meanwhile: a signed-in user's writes would land in the
    # shared anonymous library.
    forward_auth_provider.down = 503
    try:
        response = requests.get(auth_proxy.url + "/api/me", headers=auth_proxy.headers("wizard"), timeout=10)
        assert response.status_code == 500
    finally:
        forward_auth_provider.down = False
    assert me(auth_proxy)["id"] == "public"


def list_of(proxy, params=None, **headers):
    return requests.get(
        proxy.url + "/api/collections/blueprints", params=params, headers=proxy.headers("wizard", **headers), timeout=10
    )


# A filtered read: never answered from the published anonymous view (below).
PUBLIC_ROWS = {"filter": '{"is_public":true}'}


def test_collection_lists_are_sent_by_nginx_from_the_named_file(open_proxy, wizard_backend):
    requests.post(
        open_proxy.url + "/api/collections/blueprints",
        headers=open_proxy.headers("wizard"),
        json={"title": "sent by nginx", "is_public": True},
        timeout=10,
    )
    through = list_of(open_proxy, PUBLIC_ROWS)
    direct = requests.get(
        wizard_backend.base_url + "/api/collections/blueprints",
        params=PUBLIC_ROWS,
        headers={"Remote-User": "public"},
        timeout=10,
    )
    assert through.status_code == 200 and through.content == direct.content
    tag = through.headers["ETag"]
    assert tag == direct.headers["ETag"]
    assert through.headers["Content-Type"] == "application/json"
    assert through.headers["Cache-Control"] == "private, no-cache"
    assert "X-Accel-Redirect" not in through.headers
    assert (wizard_backend.data_dir / "lists" / (tag.strip('"') + ".json")).read_bytes() == direct.content
    unchanged = list_of(open_proxy, PUBLIC_ROWS, **{"If-None-Match": tag})
    assert unchanged.status_code == 304 and unchanged.content == b"" and unchanged.headers["ETag"] == tag
    # The internal location is not reachable from outside.
    assert (
        requests.get(
            open_proxy.url + "/_wizard_lists/" + tag.strip('"') + ".json",
            headers=open_proxy.headers("wizard"),
            timeout=10,
        ).status_code
        == 404
    )


def test_a_client_cannot_ask_for_a_file_redirect_where_nginx_sends_none(auth_proxy):
    answer = list_of(auth_proxy, **{"X-Wiz-Accel-Lists": "on"})
    assert answer.status_code == 200 and answer.content.startswith(b"[")


def test_a_list_file_nginx_cannot_find_is_sent_by_the_service(wizard_backend, tmp_path_factory):
    # nginx looks in an empty folder: every file is "gone", as one swept between the
    # service's answer and nginx's open would be.
    prefix = tmp_path_factory.mktemp("nginx-wizard-lists-gone")
    proxy = nginx.start(
        prefix,
        upstreams={"wizard": f"127.0.0.1:{wizard_backend.port}"},
        variables={"wizard_lists_dir": str(prefix / "elsewhere")},
    )
    try:
        direct = requests.get(
            wizard_backend.base_url + "/api/collections/blueprints", headers={"Remote-User": "public"}, timeout=10
        )
        answer = list_of(proxy)
        assert answer.status_code == 200 and answer.content == direct.content
        assert answer.headers["ETag"] == direct.headers["ETag"]
    finally:
        proxy.stop()


# ---- the anonymous view, published and sent by nginx alone (app/wizard/public_lists.py)


@pytest.fixture(scope="module")
def auth_lists_proxy(wizard_backend, forward_auth_provider, tmp_path_factory):
    """The production site: an identity provider, and the lists folder nginx sends from."""
    proxy = site(wizard_backend, tmp_path_factory.mktemp("nginx-wizard-auth-lists"), provider=forward_auth_provider)
    yield proxy
    proxy.stop()


def sent_by_nginx_alone(answer):
    """An answer nginx made from a published file: its own ETag (the file's time and
    size, in hex) and none of the service's headers."""
    return (
        re.fullmatch(r'"[0-9a-f]+-[0-9a-f]+"', answer.headers.get("ETag", "")) is not None
        and "X-Request-Id" not in answer.headers
    )


def ids(answer):
    return {row["id"] for row in answer.json()}


def post_blueprint(base_url, headers, title, is_public=True):
    made = requests.post(
        base_url + "/api/collections/blueprints",
        headers=headers,
        json={"title": title, "is_public": is_public},
        timeout=10,
    )
    assert made.status_code == 201, made.text
    return made.json()


def test_the_anonymous_view_is_published_and_kept_current(open_proxy, wizard_backend):
    post_blueprint(open_proxy.url, open_proxy.headers("wizard"), "anonymous view")
    list_of(open_proxy)  # the first anonymous read (the service's) publishes the view
    published = list_of(open_proxy)
    assert published.status_code == 200 and sent_by_nginx_alone(published)
    assert published.headers["Content-Type"] == "application/json"
    assert published.headers["Cache-Control"] == "private, no-cache"
    assert published.headers["X-Content-Type-Options"] == "nosniff"
    direct = requests.get(
        wizard_backend.base_url + "/api/collections/blueprints", headers={"Remote-User": "public"}, timeout=10
    )
    assert published.content == direct.content
    tag = published.headers["ETag"]
    assert list_of(open_proxy, **{"If-None-Match": tag}).status_code == 304
    head = requests.head(
        open_proxy.url + "/api/collections/blueprints", headers=open_proxy.headers("wizard"), timeout=10
    )
    assert head.status_code == 200 and head.headers["ETag"] == tag

    # Another user's private row: the anonymous view is the same, and so is its tag.
    post_blueprint(wizard_backend.base_url, {"Remote-User": "ada"}, "ada's own", is_public=False)
    assert list_of(open_proxy, **{"If-None-Match": tag}).status_code == 304

    # A public row: the read right after the write holds it, under a new tag.
    row = post_blueprint(open_proxy.url, open_proxy.headers("wizard"), "seen at once")
    fresh = list_of(open_proxy, **{"If-None-Match": tag})
    assert fresh.status_code == 200 and sent_by_nginx_alone(fresh) and row["id"] in ids(fresh)
    assert fresh.headers["ETag"] != tag

    # A query and a write still reach the service.
    filtered = list_of(open_proxy, PUBLIC_ROWS)
    assert filtered.status_code == 200 and not sent_by_nginx_alone(filtered) and row["id"] in ids(filtered)


def test_contents_of_the_same_size_never_share_a_tag(open_proxy, wizard_backend):
    row = post_blueprint(open_proxy.url, open_proxy.headers("wizard"), "title A")
    list_of(open_proxy)
    tags = []
    for title in ("title B", "title C", "title D"):  # each change keeps the list's size
        changed = requests.patch(
            f"{open_proxy.url}/api/collections/blueprints/{row['id']}",
            headers=open_proxy.headers("wizard"),
            json={"title": title},
            timeout=10,
        )
        assert changed.status_code == 200, changed.text
        answer = list_of(open_proxy, **({"If-None-Match": tags[-1]} if tags else {}))
        assert answer.status_code == 200 and sent_by_nginx_alone(answer)
        assert {r["id"]: r["title"] for r in answer.json()}[row["id"]] == title
        tags.append(answer.headers["ETag"])
    assert len(set(tags)) == 3


def read_on_the_event(proxy, service_url, title):
    """A page's re-read: an anonymous stream through `proxy`; a public row `title`
    written straight to the service; the list read through `proxy` as soon as the
    event arrives, while the write's request may still be answering."""
    written = []
    with requests.get(proxy.url + "/api/events", headers=proxy.headers("wizard"), stream=True, timeout=10) as stream:
        assert stream.status_code == 200
        writer = threading.Thread(
            target=lambda: written.append(post_blueprint(service_url, {"Remote-User": "ada"}, title))
        )
        writer.start()
        assert next(iter_records(stream)).json() == {"collection": "blueprints"}
        answer = list_of(proxy)
        writer.join(10)
    assert written, "the write failed"
    return answer


def test_a_page_told_of_a_write_reads_the_new_view(open_proxy, wizard_backend):
    list_of(open_proxy)
    answer = read_on_the_event(open_proxy, wizard_backend.base_url, "told by the event")
    assert sent_by_nginx_alone(answer)
    assert "told by the event" in {row["title"] for row in answer.json()}


def test_signed_in_visitors_are_answered_by_the_service_as_themselves(auth_lists_proxy, forward_auth_provider):
    bo = provider_session(forward_auth_provider, "bo")
    own = post_blueprint(auth_lists_proxy.url, auth_lists_proxy.headers("wizard", **bo), "bo's own", is_public=False)
    assert own["user_id"] == "bo"  # identified once, passed on to the service
    list_of(auth_lists_proxy)
    anonymous = list_of(auth_lists_proxy)
    assert anonymous.status_code == 200 and sent_by_nginx_alone(anonymous) and own["id"] not in ids(anonymous)
    theirs = list_of(auth_lists_proxy, **bo)
    assert theirs.status_code == 200 and not sent_by_nginx_alone(theirs) and own["id"] in ids(theirs)
    # Whoever the client claims to be.
    assert own["id"] not in ids(list_of(auth_lists_proxy, **FORGED))
    # A user whose name differs from `public` by its case only is that user, not anonymous.
    capital = provider_session(forward_auth_provider, "Public")
    theirs = post_blueprint(
        auth_lists_proxy.url, auth_lists_proxy.headers("wizard", **capital), "Public's own", is_public=False
    )
    read = list_of(auth_lists_proxy, **capital)
    assert theirs["user_id"] == "Public" and not sent_by_nginx_alone(read) and theirs["id"] in ids(read)
    # A provider that does not answer: refused, never the anonymous view.
    forward_auth_provider.down = 503
    try:
        assert list_of(auth_lists_proxy, **bo).status_code == 500
    finally:
        forward_auth_provider.down = False


def test_with_two_workers_a_page_told_by_the_other_worker_reads_the_new_view(start_service, redis_server, tmp_path):
    # The write lands on one worker and the event reaches the page's stream through
    # Redis, from whichever worker holds it: the file was rebuilt before the publish.
    service = start_service(
        "wizard", data_dir=tmp_path / "wizard", workers=2, env={"REDIS_URL": redis_server.new_url()}
    )
    proxy = site(service, tmp_path / "nginx")
    try:
        list_of(proxy)
        for number in range(6):  # new connections: the writes and the streams spread over both workers
            answer = read_on_the_event(proxy, service.base_url, f"written {number}")
            assert sent_by_nginx_alone(answer) and f"written {number}" in {row["title"] for row in answer.json()}
    finally:
        proxy.stop()
