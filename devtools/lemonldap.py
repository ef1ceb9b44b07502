"""LemonLDAP::NG, a real OpenID Connect provider (Debian's `liblemonldap-ng-portal-perl` and
`lemonldap-ng-fastcgi-server`), on loopback for the single sign-on tests: its FastCGI
server (portal and nginx handler in one process group) behind an nginx of its own, with a
file configuration and the portal's demo users.

    with LemonLdap(redirect_uris=[...], protected_hosts=["wizard.localhost"]) as idp:
        idp.issuer          # http://127.0.0.1:<port> (its portal, which is the issuer)
        idp.client_secret   # the confidential client's secret (client_secret_basic)
        idp.handler_socket  # the FastCGI socket nginx's auth_request passes to (forward auth)
        idp.rotate_key()    # a new signing key, served by its JWKS once it returns

Users (the portal's demo backend; each one's password is their login):

| user   | email               | groups (demo + ours)       | email_verified |
|--------|---------------------|----------------------------|----------------|
| dwho   | dwho@badwolf.org    | timelords, users, wiz-admins | true         |
| rtyler | rtyler@badwolf.org  | earthlings, users          | true           |
| msmith | msmith@badwolf.org  | earthlings, users          | false          |

The client is registered as the spec's table says: confidential, `client_secret_basic`,
PKCE `S256` required, exactly the redirect URIs given, scopes `openid profile email groups`
(the `groups` scope is an extra claim). Consent is bypassed, as for a first-party client.

The FastCGI server refuses to run as root: as root it runs as www-data, and its folder
sits outside pytest's (which only root may enter). Not app code.
"""

import base64
import html
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from devtools.nginx import nginx_binary
from devtools.services import free_port, stop_all
from devtools.waiting import wait_for

FASTCGI_SERVER = "/usr/sbin/llng-fastcgi-server"
PORTAL_HTDOCS = "/usr/share/lemonldap-ng/portal/htdocs"
TEMPLATES = "/usr/share/lemonldap-ng/portal/templates"
CLIENT_ID = "workspace"
SERVICE_USER = "www-data"
USERS = ("dwho", "rtyler", "msmith")
UNVERIFIED = "msmith"
# A host the handler protects for the tests' forward auth; what it exports there.
FORWARDED_HEADERS = {"Remote-User": "$uid", "Remote-Groups": "$groups"}


def unavailable():
    """Why the provider cannot run here, or None."""
    if not os.access(FASTCGI_SERVER, os.X_OK):
        return (
            "LemonLDAP::NG is not installed (apt-get install liblemonldap-ng-portal-perl lemonldap-ng-fastcgi-server)"
        )
    return None


def basic_safe_secret():
    """A client secret LemonLDAP::NG 2.16 reads back whole from a client_secret_basic
    header: it matches the header's base64 with `\\w+`, so a `+` or `/` in
    base64("workspace:<secret>") cuts the secret short and the token endpoint refuses it."""
    while True:
        secret = secrets.token_urlsafe(32)
        encoded = base64.b64encode(f"{CLIENT_ID}:{secret}".encode()).decode()
        if "+" not in encoded and "/" not in encoded:
            return secret


def _signing_key():
    """(private PEM, public PEM) of a new 2048-bit RSA key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


class LemonLdap:
    def __init__(self, redirect_uris=(), protected_hosts=(), issuer_suffix="", client_secret=None):
        """`redirect_uris`: the client's (exactly these); `protected_hosts`: hosts whose
        nginx asks the handler (forward auth), which exports FORWARDED_HEADERS there;
        `issuer_suffix`: "/" to announce the issuer with a trailing slash."""
        self.folder = None
        self.redirect_uris, self.protected_hosts = list(redirect_uris), list(protected_hosts)
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}" + issuer_suffix
        self.client_secret = client_secret or basic_safe_secret()
        self.config_number = 0
        self.client_options = {}  # changed by reconfigure()
        self.processes = []

    # --- paths ------------------------------------------------------------------------

    @property
    def handler_socket(self):
        return self.folder / "run" / "llng-fastcgi.sock"

    @property
    def ini(self):
        return self.folder / "lemonldap-ng.ini"

    # --- configuration ------------------------------------------------------------------

    def _write_ini(self):
        self.ini.write_text(f"""[all]
logLevel = warn
checkTime = 1

[configuration]
type = File
dirName = {self.folder}/conf

[portal]
staticPrefix = /static
templateDir = {TEMPLATES}
languages = en

[handler]
status = 0
useRedirectOnError = 0
""")

    def _storage(self, name):
        return {"Directory": f"{self.folder}/{name}", "LockDirectory": f"{self.folder}/{name}/lock"}

    def configuration(self):
        """The portal's whole configuration (what its manager would write), numbered."""
        portal = f"http://127.0.0.1:{self.port}/"
        return {
            "cfgNum": self.config_number,
            "cfgAuthor": "tests",
            "cfgDate": str(int(time.time())),
            "cfgVersion": "2.16.1",
            "authentication": "Demo",
            "userDB": "Same",
            "passwordDB": "Demo",
            "registerDB": "Null",
            "portal": portal,
            "domain": "127.0.0.1",
            "cookieName": "lemonldap",
            "securedCookie": 0,
            "timeout": 72000,
            "whatToTrace": "uid",
            "demoExportedVars": {"cn": "cn", "mail": "mail", "uid": "uid"},
            "groups": {"wiz-admins": '$uid eq "dwho"'},
            "globalStorage": "Apache::Session::File",
            "globalStorageOptions": self._storage("sessions"),
            "persistentStorage": "Apache::Session::File",
            "persistentStorageOptions": self._storage("psessions"),
            "localSessionStorage": "Cache::FileCache",
            "localSessionStorageOptions": {
                "cache_root": f"{self.folder}/cache",
                "cache_depth": 3,
                "namespace": "lemonldap-ng-sessions",
                "default_expires_in": 600,
                "directory_umask": "007",
            },
            "loginHistoryEnabled": 0,
            "notification": 0,
            "portalSkin": "bootstrap",
            # The nginx handler (forward auth) for the hosts the tests protect.
            "locationRules": {host: {"default": "accept"} for host in self.protected_hosts},
            "exportedHeaders": {host: dict(FORWARDED_HEADERS) for host in self.protected_hosts},
            # OpenID Connect provider, one confidential client.
            "issuerDBOpenIDConnectActivation": 1,
            "oidcServiceMetaDataIssuer": self.issuer,
            "oidcServicePrivateKeySig": self.private_key,
            "oidcServicePublicKeySig": self.public_key,
            "oidcServiceKeyIdSig": self.key_id,
            "oidcServiceAllowAuthorizationCodeFlow": 1,
            "oidcServiceIgnoreScopeForClaims": 0,
            "oidcRPMetaDataOptions": {
                CLIENT_ID: {
                    "oidcRPMetaDataOptionsClientID": CLIENT_ID,
                    "oidcRPMetaDataOptionsClientSecret": self.client_secret,
                    "oidcRPMetaDataOptionsPublic": 0,
                    "oidcRPMetaDataOptionsRequirePKCE": 1,
                    "oidcRPMetaDataOptionsRedirectUris": " ".join(self.redirect_uris),
                    "oidcRPMetaDataOptionsBypassConsent": 1,
                    "oidcRPMetaDataOptionsIDTokenSignAlg": "RS256",
                    "oidcRPMetaDataOptionsIDTokenExpiration": 3600,
                    "oidcRPMetaDataOptionsAccessTokenExpiration": 3600,
                    "oidcRPMetaDataOptionsDisplayName": "Workspace",
                    **{f"oidcRPMetaDataOptions{name}": value for name, value in self.client_options.items()},
                }
            },
            "oidcRPMetaDataExportedVars": {
                CLIENT_ID: {
                    "email": "mail",
                    "name": "cn",
                    "preferred_username": "uid",
                    "email_verified": "email_verified;bool",
                    "groups": "groups;string;always",
                }
            },
            "oidcRPMetaDataMacros": {CLIENT_ID: {"email_verified": f'$uid ne "{UNVERIFIED}"'}},
            "oidcRPMetaDataOptionsExtraClaims": {CLIENT_ID: {"groups": "groups"}},
        }

    def _write_configuration(self):
        """A new numbered configuration; the portal reads it within its checkTime."""
        self.config_number += 1
        path = self.folder / "conf" / f"lmConf-{self.config_number}.json"
        path.write_text(json.dumps(self.configuration(), indent=1))
        self._give_to_service(path)

    def _new_key(self):
        self.private_key, self.public_key = _signing_key()
        self.key_id = secrets.token_hex(8)

    def _served(self):
        """Whether the JWKS serves the current key under the current id: the portal (one
        process) has read the newest configuration."""
        public_n = self._public_n()
        return any(key.get("kid") == self.key_id and key.get("n") == public_n for key in self.jwks()["keys"])

    def reconfigure(self, **client_options):
        """Change the client's options (oidcRPMetaDataOptions<Name>=value) and wait until
        the portal uses them. Each configuration signs under a new key id, by which its
        arrival is seen."""
        self.client_options.update(client_options)
        self.key_id = secrets.token_hex(8)
        self._write_configuration()
        wait_for(self._served, "the provider to read its new configuration", timeout=30)

    def rotate_key(self, same_id=False):
        """Replace the signing key (as the manager's "new key" button does: the old one is
        gone at once); `same_id` keeps the key id, as LemonLDAP::NG's own rotation can.
        Returns once the JWKS serves the new key."""
        old_id = self.key_id
        self._new_key()
        if same_id:
            self.key_id = old_id
        self._write_configuration()
        wait_for(self._served, "the provider's JWKS to serve the new key", timeout=30)

    def _public_n(self):
        numbers = serialization.load_pem_public_key(self.public_key.encode()).public_numbers()
        return (
            base64.urlsafe_b64encode(numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")).rstrip(b"=").decode()
        )

    # --- talking to it --------------------------------------------------------------------

    def _get_json(self, path):
        response = requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=10)
        response.raise_for_status()
        return response.json()

    def metadata(self):
        return self._get_json("/.well-known/openid-configuration")

    def jwks(self):
        return self._get_json("/oauth2/jwks")

    def _answers(self):
        try:
            return self.metadata().get("issuer") == self.issuer
        except (OSError, ValueError):  # starting: refused, a 502 from nginx (requests' errors are OSErrors)
            return False

    # --- processes ----------------------------------------------------------------------

    def _give_to_service(self, path):
        if os.geteuid() == 0:
            shutil.chown(path, SERVICE_USER, SERVICE_USER)

    def _prepare_folder(self):
        # Below /tmp itself: the FastCGI server runs as www-data, which cannot enter
        # pytest's folders (0700, root's).
        self.folder = Path(tempfile.mkdtemp(prefix="lemonldap-"))
        self.folder.chmod(0o755)
        for name in (
            "run",
            "conf",
            "sessions",
            "sessions/lock",
            "psessions",
            "psessions/lock",
            "cache",
            "nginx",
            "nginx/logs",
            "nginx/tmp",
        ):
            (self.folder / name).mkdir(parents=True, exist_ok=True)
            self._give_to_service(self.folder / name)
        self._write_ini()
        self._new_key()
        self._write_configuration()

    def _nginx_conf(self):
        # The portal as Debian's portal-nginx.conf serves it: every path but the static
        # ones goes to index.psgi, through FastCGI.
        return f"""daemon off;
worker_processes 1;
{"user root;" if os.geteuid() == 0 else ""}
pid {self.folder}/nginx/nginx.pid;
error_log stderr warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {self.folder}/nginx/tmp/body;
    proxy_temp_path {self.folder}/nginx/tmp/proxy;
    fastcgi_temp_path {self.folder}/nginx/tmp/fastcgi;
    uwsgi_temp_path {self.folder}/nginx/tmp/uwsgi;
    scgi_temp_path {self.folder}/nginx/tmp/scgi;
    include /etc/nginx/mime.types;
    server {{
        listen 127.0.0.1:{self.port};
        server_name 127.0.0.1;
        root {PORTAL_HTDOCS};
        if ($uri !~ ^/((static|javascript|favicon).*|.*\\.psgi)) {{
            rewrite ^/(.*)$ /index.psgi/$1 break;
        }}
        location ~ ^(?<sc>/.*\\.psgi)(?:$|/) {{
            include /etc/nginx/fastcgi_params;
            fastcgi_pass unix:{self.handler_socket};
            fastcgi_param LLTYPE psgi;
            fastcgi_param SCRIPT_FILENAME $document_root$sc;
            fastcgi_split_path_info ^(.*\\.psgi)(/.*)$;
            fastcgi_param PATH_INFO $fastcgi_path_info;
        }}
        location /static/ {{ alias {PORTAL_HTDOCS}/static/; }}
        location /javascript/ {{ alias /usr/share/javascript/; }}
    }}
}}
"""

    def start(self):
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self._prepare_folder()
        env = {
            **os.environ,
            "LLNG_DEFAULTCONFFILE": str(self.ini),
            "LLNG_DEFAULTLOGGER": "Lemonldap::NG::Common::Logger::Std",
        }
        command = [
            FASTCGI_SERVER,
            "--foreground",
            "--proc",
            "1",
            "--socket",
            str(self.handler_socket),
            "--pid",
            str(self.folder / "run" / "llng-fastcgi.pid"),
        ]
        if os.geteuid() == 0:
            command += ["--user", SERVICE_USER, "--group", SERVICE_USER]
        self._spawn(command, self.folder / "fastcgi.log", env=env, cwd=self.folder)
        conf = self.folder / "nginx" / "nginx.conf"
        conf.write_text(self._nginx_conf())
        self._spawn(
            [nginx_binary(), "-p", f"{self.folder}/nginx/", "-c", str(conf), "-e", "stderr"],
            self.folder / "nginx" / "logs" / "stderr",
        )
        try:
            wait_for(self._ready, "LemonLDAP::NG's portal to answer its discovery document", timeout=60)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, command, log_path, **options):
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.processes.append(
                subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **options)
            )

    def _ready(self):
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"a LemonLDAP::NG process exited with {process.returncode}:\n{self.logs()}")
        return self.handler_socket.exists() and self._answers()

    def logs(self):
        parts = []
        for path in (self.folder / "fastcgi.log", self.folder / "nginx" / "logs" / "stderr"):
            if path.exists():
                parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def stop(self):
        stop_all(self.processes)
        self.processes = []
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# --- a browser's side -------------------------------------------------------------------------

_FORM = re.compile(r'<form id="lform"(.*?)</form>', re.S)
_HIDDEN = re.compile(r'<input[^>]*type="hidden"[^>]*>')
_ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')


def login_form_fields(page):
    """The hidden fields of the portal's login form (its `url`, anti-replay `token`, ...),
    or None when `page` has no login form."""
    form = _FORM.search(page)
    if not form:
        return None
    fields = {}
    for tag in _HIDDEN.findall(form.group(1)):
        attributes = dict(_ATTRIBUTE.findall(tag))
        if "name" in attributes:
            fields[attributes["name"]] = html.unescape(attributes.get("value", ""))
    return fields


def sign_in(http, authorization_url, user, password=None):
    """Drive the portal's side of a sign-in with a requests.Session `http`, as a browser:
    open the authorization URL, post its login form (skipped when `http` already holds a
    portal session), follow the portal's own redirects, and return the Location that
    leaves the portal (the client's redirect URI with code and state, or error), without
    following it. Raises AssertionError when the portal answers otherwise."""
    portal = urlsplit(authorization_url)[:2]
    response = http.get(authorization_url, allow_redirects=False, timeout=10)
    fields = login_form_fields(response.text) if response.status_code == 200 else None
    if fields is not None:  # the form posts back to the page's own URL (action="#")
        fields.update(user=user, password=user if password is None else password)
        response = http.post(authorization_url, data=fields, allow_redirects=False, timeout=10)
    for _ in range(5):
        if response.status_code not in (302, 303):
            raise AssertionError(f"the portal answered {response.status_code}: {response.text[:300]}")
        location = urljoin(response.url, response.headers["Location"])
        if urlsplit(location)[:2] != portal:
            return location
        response = http.get(location, allow_redirects=False, timeout=10)
    raise AssertionError("the portal kept redirecting to itself")


def portal_session(issuer, user, password=None):
    """The portal's session cookie (`lemonldap`) after signing in at its front page: what
    a browser sends to the hosts its handler protects. AssertionError when refused."""
    import requests

    http = requests.Session()
    page = http.get(issuer.rstrip("/") + "/", timeout=10)
    fields = login_form_fields(page.text) or {}
    fields.update(user=user, password=user if password is None else password)
    http.post(issuer.rstrip("/") + "/", data=fields, allow_redirects=False, timeout=10)
    if "lemonldap" not in http.cookies:
        raise AssertionError(f"the portal refused {user}'s sign-in")
    return http.cookies["lemonldap"]
