"""Another site's set-up form cannot claim a fresh platform (under gunicorn). The other
cross-site requests are tests/unit/workspace/test_csrf.py."""

import requests

from tests.support.workspace import CSRF_ACCESS_URL as ACCESS_URL
from tests.support.workspace import CSRF_COOKIE as COOKIE
from tests.support.workspace import CSRF_CROSS_SITE as CROSS_SITE
from tests.support.workspace import CSRF_SAME_ORIGIN as SAME_ORIGIN
from tests.support.workspace import OWNER


def _session_cookie(response):
    return response.cookies.get(COOKIE)


def test_another_sites_setup_form_cannot_claim_the_platform(start_service):
    from tests.support.workspace import Workspace

    ws = Workspace(start_service("workspace", env={"WORKSPACE_ACCESS_URL": ACCESS_URL}))
    response = requests.post(ws.url + "/setup", data=OWNER, headers=CROSS_SITE[0], allow_redirects=False, timeout=30)
    assert response.status_code == 403 and "Set-Cookie" not in response.headers
    assert requests.get(ws.api + "/users/first", timeout=10).status_code == 404  # still unclaimed
    claimed = requests.post(ws.url + "/setup", data=OWNER, headers=SAME_ORIGIN[0], allow_redirects=False, timeout=30)
    assert claimed.status_code == 303 and _session_cookie(claimed)
