"""The wizard's test client: requests as a given user, through the loopback test
identity or trusted Remote-* headers; and the forward-auth portal's password."""

import requests


class WizardClient:
    """Requests to a running wizard as `user` (with `groups`), through the loopback
    test identity, or with explicit trusted Remote-* headers (`trusted=True`)."""

    def __init__(self, base_url, user="alice", groups="", trusted=False):
        self.base_url, self.user, self.groups, self.trusted = base_url, user, groups, trusted
        self.http = requests.Session()

    def as_user(self, user, groups=""):
        return WizardClient(self.base_url, user, groups, self.trusted)

    def headers(self):
        if self.user is None:
            return {}
        if self.trusted:
            return {"Remote-User": self.user, "Remote-Groups": self.groups}
        return {"X-Wiz-Test-User": self.user, "X-Wiz-Test-Groups": self.groups}

    def request(self, method, path, **kwargs):
        headers = {**self.headers(), **kwargs.pop("headers", {})}
        kwargs.setdefault("timeout", 30)
        return self.http.request(method, self.base_url + path, headers=headers, **kwargs)

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, **kwargs):
        return self.request("POST", path, **kwargs)

    def patch(self, path, **kwargs):
        return self.request("PATCH", path, **kwargs)

    def delete(self, path, **kwargs):
        return self.request("DELETE", path, **kwargs)


TEST_IDENTITY = {"WIZ_ALLOW_TEST_IDENTITY": "1"}

# The password of the forward-auth portal's users (the `forward_auth_provider` fixture).
FORWARD_AUTH_PASSWORD = "correct horse battery staple"


# The key of the local AI provider of the wizard's AI tests (devtools.fake_providers).
AI_KEY = "sk-test-wizard-0123456789"


def text_call(client, model=None, json_mode=True, kind="smoke", **more):
    """POST /api/ai/text as `client`: a JSON-mode smoke prompt unless told otherwise."""
    body = {
        "system": "Answer in JSON.",
        "messages": [{"role": "user", "content": "Say hello."}],
        "json": json_mode,
        "kind": kind,
        "templateKey": "smoke.v1",
        **more,
    }
    if model:
        body["model"] = model
    return client.post("/api/ai/text", json=body)
