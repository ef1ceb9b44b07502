"""The browser tests' helpers: where Chromium is and how it starts, where the
screenshots go, and `Site`, a service behind a real nginx."""

import re
import shutil

from devtools import services
from tests.support.shared import ROOT

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]


class Site:
    def __init__(self, service, proxy, name, env):
        self.service, self.proxy, self.name, self.env = service, proxy, name, env
        # Chromium resolves *.localhost to loopback by itself, so the Host is right.
        self.url = f"http://{proxy.host(name)}:{proxy.port}"
        self.host = proxy.host(name)
        self.api = service.base_url  # straight to gunicorn, for set-up and checks

    def restart_service(self):
        """SIGTERM the service and start it again on the same port and DATA_DIR (as
        systemctl restart does); nginx stays up."""
        self.service.stop()
        self.service = services.start(self.name, self.service.data_dir, port=self.service.port, env=self.env)
        return self.service


def artifact_name(request):
    """The test's name as a file name (its screenshots under ARTIFACTS)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:120]


def copy_tree(source, target):
    shutil.copytree(source, target, dirs_exist_ok=True)


# The workspace platform's Owner in the browser tests, and her sign-in through the form.
WORKSPACE_OWNER = {"email": "owner@example.com", "username": "owner", "password": "Tr1cky-horse-battery"}


def sign_in_to_the_workspace(page, url, user=WORKSPACE_OWNER):
    """Sign `user` in on the platform at `url` through its login form, as a person would."""
    from playwright.sync_api import expect

    page.goto(url + "/login")
    page.get_by_label("Email").fill(user["email"])
    page.get_by_label("Password").fill(user["password"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#username")).to_have_text(user["username"])
