"""The system limits for one host at full scale (issue #38: 10,000 SSE streams and
10,000 workspace agents over 2 workers per service): the values the playbook sets are
consistent with each other and with that target. The templates are rendered and the
role's edits of Debian's nginx.conf applied here, in process; the staging box
(tests/ops) runs the playbook itself."""

import re
from pathlib import Path

import yaml

from devtools import nginx
from tests.support.ops import ansible_like

ROOT = Path(__file__).resolve().parents[3]
OPS = ROOT / "ops"
STREAMS, AGENTS = 10_000, 10_000  # the target of one host
WORKERS = 2  # per service; nginx's worker_processes auto on 2 CPUs
# Debian 12's /etc/nginx/nginx.conf, the lines the nginx role edits and their neighbours.
DEBIAN_NGINX_CONF = """user www-data;
worker_processes auto;
pid /run/nginx.pid;
include /etc/nginx/modules-enabled/*.conf;

events {
\tworker_connections 768;
\t# multi_accept on;
}

http {
\tsendfile on;
}
"""


def defaults(role):
    return yaml.safe_load((OPS / f"roles/{role}/defaults/main.yml").read_text())


def role_task(role, name):
    tasks = yaml.safe_load((OPS / f"roles/{role}/tasks/main.yml").read_text())
    return next(task for task in tasks if task["name"] == name)


def directive(text, name):
    """The integer values of `name` directives in an nginx configuration."""
    return [int(value) for value in re.findall(rf"^\s*{name}\s+(\d+)\s*;", text, re.M)]


def gunicorn_default_connections():
    text = (ROOT / "gunicorn.conf.py").read_text()
    return int(re.search(r'"WORKER_CONNECTIONS", "(\d+)"', text).group(1))


def unit_setting(unit, name):
    text = (ROOT / "systemd" / unit).read_text()
    return int(re.search(rf"^{name}=(\d+)$", text, re.M).group(1))


def edit_like_the_role(text, nginx_vars):
    """Debian's nginx.conf after the nginx role's two edits (Ansible's replace and
    lineinfile, as those modules apply a regexp line by line)."""
    replace = role_task("nginx", "Set nginx's connections per worker in nginx.conf (Debian's says 768)")
    replace = replace["ansible.builtin.replace"]
    template = ansible_like(OPS).from_string(replace["replace"])
    text = re.sub(replace["regexp"], template.render(**nginx_vars), text, flags=re.M)
    line_task = role_task("nginx", "Set each nginx worker's open-file limit in nginx.conf")[
        "ansible.builtin.lineinfile"
    ]
    line = ansible_like(OPS).from_string(line_task["line"]).render(**nginx_vars)
    lines = text.splitlines()
    present = [i for i, old in enumerate(lines) if re.search(line_task["regexp"], old)]
    if present:
        lines[present[-1]] = line
    else:
        after = [i for i, old in enumerate(lines) if re.search(line_task["insertafter"], old)]
        lines.insert(after[-1] + 1, line)
    return "\n".join(lines) + "\n"


def test_nginx_holds_every_stream_and_agent_of_a_full_host():
    limits = defaults("nginx")
    connections, files = limits["nginx_worker_connections"], limits["nginx_worker_rlimit_nofile"]
    # Each proxied connection is two of nginx's (client, upstream).
    assert WORKERS * connections >= 2 * (STREAMS + AGENTS) * 1.5, "no room for an uneven split"
    assert files >= 2 * connections
    assert limits["nginx_listen_backlog"] >= STREAMS


def test_the_role_writes_the_limits_into_debians_nginx_conf():
    limits = defaults("nginx")
    edited = edit_like_the_role(DEBIAN_NGINX_CONF, limits)
    assert directive(edited, "worker_connections") == [limits["nginx_worker_connections"]]
    assert directive(edited, "worker_rlimit_nofile") == [limits["nginx_worker_rlimit_nofile"]]
    # In the main context (before `events`), and a second run changes nothing.
    assert edited.index("worker_rlimit_nofile") < edited.index("events {")
    assert edit_like_the_role(edited, limits) == edited
    drop_in = (
        ansible_like(OPS / "roles/nginx/templates")
        .get_template("limits.conf.j2")
        .render(ansible_managed="test", **limits)
    )
    assert f"LimitNOFILE={limits['nginx_worker_rlimit_nofile']}" in drop_in.splitlines()


def test_the_rendered_nginx_configuration_carries_the_limits(tmp_path):
    """As the dev runner, the tests and bench.fanout render it with the role's values."""
    limits = defaults("nginx")
    variables = nginx.variables_for(
        8080,
        {"decks": "127.0.0.1:7081"},
        nginx_worker_processes=WORKERS,
        nginx_worker_connections=limits["nginx_worker_connections"],
        nginx_worker_rlimit_nofile=limits["nginx_worker_rlimit_nofile"],
        listen_backlog=limits["nginx_listen_backlog"],
    )
    conf = nginx.render(tmp_path, variables).read_text()
    assert directive(conf, "worker_connections") == [limits["nginx_worker_connections"]]
    assert directive(conf, "worker_rlimit_nofile") == [limits["nginx_worker_rlimit_nofile"]]
    default_site = (tmp_path / "sites/default.conf").read_text()
    assert f"default_server backlog={limits['nginx_listen_backlog']};" in default_site
    # Without them (the tests' own nginx): nginx's defaults, no backlog option.
    bare = nginx.render(tmp_path / "bare", nginx.variables_for(8080, {"decks": "127.0.0.1:7081"})).read_text()
    assert directive(bare, "worker_rlimit_nofile") == []
    assert "backlog=" not in (tmp_path / "bare/sites/default.conf").read_text()


def test_two_gunicorn_workers_hold_a_full_host():
    connections = gunicorn_default_connections()
    assert defaults("services")["services_worker_connections"] == connections
    # 10,000 streams or agents over 2 workers, with room for an uneven split and users.
    assert WORKERS * connections >= 1.5 * max(STREAMS, AGENTS)
    # Each connection is a file descriptor of the worker.
    assert unit_setting("bundle@.service", "LimitNOFILE") >= 2 * connections
    env = (OPS / "roles/services/templates/service.env.j2").read_text()
    assert 'WORKER_CONNECTIONS="{{ services_worker_connections }}"' in env.splitlines()


def render_sysctl(now):
    base = defaults("base")
    text = (
        ansible_like(OPS / "roles/base/templates")
        .get_template("sysctl.conf.j2")
        .render(ansible_managed="test", base_sysctl=base["base_sysctl"], base_sysctl_now=now)
    )
    return dict(
        (key.strip(), int(value))
        for key, _, value in (line.partition("=") for line in text.splitlines())
        if key and not key.startswith("#")
    )


def test_the_kernel_limits_allow_the_backlogs_and_the_deck_watches():
    debian = {
        "net.core.somaxconn": "4096",
        "net.ipv4.tcp_max_syn_backlog": "512",
        "fs.inotify.max_user_watches": "16000",
    }
    values = render_sysctl(debian)
    assert set(values) == set(defaults("base")["base_sysctl"])
    # Listen backlogs are capped at somaxconn: nginx's and the services' sockets'.
    assert values["net.core.somaxconn"] >= defaults("nginx")["nginx_listen_backlog"]
    assert values["net.core.somaxconn"] >= unit_setting("bundle@.socket", "Backlog")
    assert values["net.ipv4.tcp_max_syn_backlog"] >= values["net.core.somaxconn"]
    # A watch per session folder and deck worker, old and new workers during a reload.
    assert values["fs.inotify.max_user_watches"] >= STREAMS * WORKERS * 2


def test_a_higher_value_of_the_host_is_kept():
    values = render_sysctl({"fs.inotify.max_user_watches": "192536"})
    assert values["fs.inotify.max_user_watches"] == 192536
    assert values["net.core.somaxconn"] == defaults("base")["base_sysctl"]["net.core.somaxconn"]
