"""The monitoring role's Prometheus configuration and alert rules, rendered by
ansible-playbook from the role's templates and defaults (as a pull renders them) and
checked by Debian's promtool (the test layer of devtools/system-deps.sh installs it):
`promtool check config` with the production defaults and with a test deployment's short
intervals, and `promtool test rules` with a unit test of each alert on synthetic series,
firing and not firing. Its nginx server is checked by `nginx -t`. The role applied by
ansible-pull, with a real alert delivered to a webhook, is checked by
tests/ops/test_two_hosts.py. Fast: no box, no daemon."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.ops import role_task, run_play

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
ROLE = OPS / "roles/monitoring"
DEFAULTS = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
METRICS = DEFAULTS["monitoring_metrics"]
TEMPLATES = {
    "prometheus.yml": "etc/prometheus/prometheus.yml.j2",
    "bundle-alerts.yml": "etc/prometheus/bundle-alerts.yml.j2",
    "alertmanager.yml": "etc/prometheus/alertmanager.yml.j2",
    "blackbox.yml": "etc/prometheus/blackbox.yml.j2",
    "monitoring.conf": "etc/nginx/conf.d/monitoring.conf.j2",
    "prometheus-redis-exporter": "etc/default/prometheus-redis-exporter.j2",
    "prometheus-postgres-exporter": "etc/default/prometheus-postgres-exporter.j2",
}
# A monitoring host with everything, its application hosts elsewhere.
HOST_VARS = {
    "bundle_roles": ["data", "services", "nginx", "monitoring"],
    "bundle_domain": "example.org",
    "base_services": ["workspace", "decks", "notebook", "audio", "wizard"],
    "monitoring_listen_address": "10.0.0.5",
    "monitoring_allowed_addresses": ["10.0.0.5"],
    "monitoring_application_hosts": ["10.0.0.11", "10.0.0.12"],
    "monitoring_data_hosts": ["10.0.0.5"],
    "monitoring_alert_webhook_url": "http://10.0.0.1:5001/alerts",
    "base_secret_values": {"postgresql_monitoring_password": "pg-s3cret", "redis_password": "redis-s3cret"},
}
# The data host's exporters scraped from another host; email with an SMTP login.
ELSEWHERE = {
    "bundle_roles": ["data", "nginx"],
    "monitoring_data_hosts": ["10.0.0.5"],
    "monitoring_alert_email_to": "admin@example.org",
    "monitoring_smtp_smarthost": "smtp.example.org:587",
    "monitoring_smtp_auth_username": "alerts",
    "base_secret_values": {**HOST_VARS["base_secret_values"], "monitoring_smtp_auth_password": "smtp-s3cret"},
}
# A test deployment's (tests/ops/test_two_hosts.py): seconds, not minutes.
SHORT = {
    "monitoring_scrape_interval": "2s",
    "monitoring_evaluation_interval": "2s",
    "monitoring_target_down_for": "6s",
    "monitoring_alert_group_wait": "1s",
    "monitoring_alert_group_interval": "2s",
}

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is missing: run devtools/system-deps.sh test (Debian's prometheus)",
)


def _render(folder, variants):
    """Each variant's templates rendered by ansible-playbook into folder/<variant>/,
    with group_vars/all.yml, the role's defaults and the variant's settings."""
    tasks = []
    for variant, settings in variants.items():
        out = folder / variant
        out.mkdir()
        for name, template in TEMPLATES.items():
            tasks.append(
                {
                    "name": f"{variant}: {name}",
                    "ansible.builtin.template": {"src": str(ROLE / "templates" / template), "dest": str(out / name)},
                    # Task vars: above the vars files (group_vars, the role's defaults).
                    "vars": {**HOST_VARS, **settings, "monitoring_config_dir": str(out)},
                }
            )
    result = run_play(folder, tasks, {}, roles=("monitoring",))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return {variant: folder / variant for variant in variants}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return _render(tmp_path_factory.mktemp("monitoring"), {"production": {}, "short": SHORT, "elsewhere": ELSEWHERE})


def _promtool(*argv, cwd=None):
    return subprocess.run(["promtool", *argv], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("variant", ["production", "short"])
def test_promtool_accepts_the_configuration_and_its_rules(rendered, variant):
    checked = _promtool("check", "config", str(rendered[variant] / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout, checked.stdout


def test_every_host_and_service_is_scraped_and_every_public_host_probed(rendered):
    config = yaml.safe_load((rendered["production"] / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {name: job["static_configs"][0]["targets"] for name, job in jobs.items()}
    assert config["global"] == {"scrape_interval": "30s", "evaluation_interval": "30s"}
    assert targets["node"] == ["10.0.0.11:9100", "10.0.0.12:9100", "10.0.0.5:9100"]
    assert targets["nginx"] == ["10.0.0.11:9113", "10.0.0.12:9113"]
    # The data exporters of the monitoring host itself listen on loopback, named by its address.
    for job, port in (("postgresql", 9187), ("redis", 9121)):
        assert jobs[job]["static_configs"] == [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"instance": f"10.0.0.5:{port}"}}
        ]
    for service in ("workspace", "decks", "notebook", "audio", "wizard"):
        assert jobs[f"bundle_{service}"]["metrics_path"] == f"/{service}/metrics"
        assert targets[f"bundle_{service}"] == ["10.0.0.11:9180", "10.0.0.12:9180"]
    assert targets["blackbox"] == [
        "https://workspace.example.org/healthz",
        "https://decks.example.org/healthz",
        "https://notebook.example.org/health",
        "https://audio.example.org/api/audio/health",
        "https://wizard.example.org/healthz",
    ]
    assert targets["blackbox_exporter"] == ["127.0.0.1:9115"] and "metrics_path" not in jobs["blackbox_exporter"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.0.0.5:9093"]
    elsewhere = yaml.safe_load((rendered["elsewhere"] / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in elsewhere["scrape_configs"]}
    assert jobs["postgresql"]["static_configs"] == [{"targets": ["10.0.0.5:9187"]}]
    assert jobs["redis"]["static_configs"] == [{"targets": ["10.0.0.5:9121"]}]
    short = yaml.safe_load((rendered["short"] / "prometheus.yml").read_text())
    assert short["global"] == {"scrape_interval": "2s", "evaluation_interval": "2s"}


def test_alertmanager_sends_every_alert_and_its_resolution_to_the_receiver(rendered):
    config = yaml.safe_load((rendered["production"] / "alertmanager.yml").read_text())
    assert config["route"]["receiver"] == "admin"
    (receiver,) = config["receivers"]
    assert receiver["webhook_configs"] == [{"url": "http://10.0.0.1:5001/alerts", "send_resolved": True}]
    assert "email_configs" not in receiver
    # A label missing on both sides counts as equal: `service` keeps a service's critical
    # alert from silencing another service's warnings.
    (inhibit,) = config["inhibit_rules"]
    assert inhibit["equal"] == ["job", "instance", "service"]


def test_the_smtp_password_comes_from_the_secrets_file(rendered, tmp_path):
    config = yaml.safe_load((rendered["elsewhere"] / "alertmanager.yml").read_text())
    assert config["global"]["smtp_auth_username"] == "alerts"
    assert config["global"]["smtp_auth_password"] == "smtp-s3cret"
    task = role_task("monitoring", "Check that the SMTP password is in the secrets file", "server.yml")
    email = {k: v for k, v in ELSEWHERE.items() if k.startswith("monitoring_")}
    missing = run_play(tmp_path, [task], {**email, "base_secret_values": {}}, roles=("base", "monitoring"))
    assert missing.returncode != 0 and "not a playbook variable" in missing.stdout, missing.stdout[-3000:]
    as_variable = {**email, "monitoring_smtp_auth_password": "x", "base_secret_values": ELSEWHERE["base_secret_values"]}
    assert run_play(tmp_path, [task], as_variable, roles=("base", "monitoring")).returncode != 0
    given = run_play(
        tmp_path, [task], {**email, "base_secret_values": ELSEWHERE["base_secret_values"]}, roles=("base", "monitoring")
    )
    assert given.returncode == 0, given.stdout[-3000:]


def test_the_data_exporters_listen_on_loopback_beside_prometheus_and_redis_has_no_password_in_its_environment(
    rendered,
):
    beside = (rendered["production"] / "prometheus-redis-exporter").read_text()
    assert "-web.listen-address=127.0.0.1:9121" in beside
    assert "-redis.password-file=/etc/prometheus/redis-exporter-passwords.json" in beside
    assert "\nREDIS_PASSWORD=" not in beside and "redis-s3cret" not in beside
    assert (
        "--web.listen-address=127.0.0.1:9187" in (rendered["production"] / "prometheus-postgres-exporter").read_text()
    )
    elsewhere = (rendered["elsewhere"] / "prometheus-redis-exporter").read_text()
    assert "-web.listen-address=10.0.0.5:9121" in elsewhere and "redis-s3cret" not in elsewhere
    assert "--web.listen-address=10.0.0.5:9187" in (rendered["elsewhere"] / "prometheus-postgres-exporter").read_text()


def test_the_redis_exporters_password_file_names_its_own_redis_only(tmp_path):
    task = role_task("monitoring", "Write Redis's password for the redis exporter (its own Redis only)", "data.yml")
    assert (task["ansible.builtin.copy"]["group"], task["ansible.builtin.copy"]["mode"]) == ("prometheus", "0640")
    task["ansible.builtin.copy"] = {
        "content": task["ansible.builtin.copy"]["content"],
        "dest": str(tmp_path / "pw.json"),
    }
    played = run_play(
        tmp_path,
        [task],
        {"bundle_redis_port": 6380, "base_secret_values": {"redis_password": "redis-s3cret"}},
        roles=("base", "monitoring"),
    )
    assert played.returncode == 0, played.stdout[-3000:]
    assert json.loads((tmp_path / "pw.json").read_text()) == {"redis://127.0.0.1:6380": "redis-s3cret"}
    assert "redis-s3cret" not in played.stdout


def test_the_play_stops_where_alerts_would_go_nowhere(tmp_path):
    task = role_task("monitoring", "Check that the alerts have somewhere to go", "server.yml")
    stopped = run_play(tmp_path, [task], {"bundle_roles": ["monitoring"]}, roles=("monitoring",))
    assert stopped.returncode != 0 and "alerts would go nowhere" in stopped.stdout, stopped.stdout[-3000:]
    given = run_play(tmp_path, [task], {"monitoring_alert_email_to": "admin@example.org"}, roles=("monitoring",))
    assert given.returncode == 0, given.stdout[-3000:]


def test_a_daemon_that_restarts_gets_no_reload_behind_it(tmp_path):
    """One signal per daemon: a restart (its /etc/default changed) skips the reload that
    its configuration asked for in the same run; a daemon that does not restart reloads."""
    handlers = yaml.safe_load((ROLE / "handlers/main.yml").read_text())
    units = {f"{package}.service" for package in DEFAULTS["monitoring_server_packages"]}
    reloads = [
        h
        for h in handlers
        if h.get("ansible.builtin.systemd_service", {}).get("state") == "reloaded"
        and h["ansible.builtin.systemd_service"]["name"] in units
    ]
    assert len(reloads) == len(units)
    written = [
        {"item": package, "changed": package == "prometheus"} for package in DEFAULTS["monitoring_server_packages"]
    ]
    tasks = [
        {"name": "Written", "ansible.builtin.set_fact": {"monitoring_server_defaults": {"results": written}}},
        role_task("monitoring", "Note the daemons that restart (their reload is skipped)", "server.yml"),
        *(
            {
                "name": handler["name"],
                "when": handler.get("when", True),
                "ansible.builtin.debug": {"msg": "RELOAD " + handler["ansible.builtin.systemd_service"]["name"]},
            }
            for handler in reloads
        ),
    ]
    played = run_play(tmp_path, tasks, {}, roles=("monitoring",))
    assert played.returncode == 0, played.stdout[-3000:]
    assert "RELOAD prometheus.service" not in played.stdout
    assert "RELOAD prometheus-alertmanager.service" in played.stdout
    assert "RELOAD prometheus-blackbox-exporter.service" in played.stdout


def test_nginx_serves_each_services_metrics_to_the_monitoring_hosts_only(rendered, tmp_path):
    site = (rendered["production"] / "monitoring.conf").read_text()
    assert "listen 10.0.0.5:9180;" in site and "allow 10.0.0.5;\n    deny all;" in site
    assert "location = /wizard/metrics {\n        proxy_pass http://127.0.0.1:7084/metrics;" in site
    assert "listen 127.0.0.1:9182;" in site and "stub_status;" in site
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n{site}\n}}\n"
    )
    checked = subprocess.run(
        ["nginx", "-t", "-q", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Only the address may be missing here (10.0.0.5 is not this machine's).
    assert checked.returncode == 0 or "bind() to 10.0.0.5:9180 failed" in checked.stderr, checked.stderr


# --------------------------------------------------------------------------- promtool test rules


def _series(name, labels, values):
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _case(alert, series, not_firing_at, firing_at, labels, summary, interval="1m"):
    """A unit test of `alert`: nothing at `not_firing_at`, exactly one alert with
    `labels` and `summary` at `firing_at` (series' samples `interval` apart)."""
    return {
        "interval": interval,
        "input_series": series,
        "alert_rule_test": [
            {"eval_time": not_firing_at, "alertname": alert, "exp_alerts": []},
            {
                "eval_time": firing_at,
                "alertname": alert,
                "exp_alerts": [{"exp_labels": labels, "exp_annotations": {"summary": summary}}],
            },
        ],
    }


WIZARD_A = {"job": "bundle_wizard", "instance": "10.0.0.11:9180"}
PROBE = {"job": "blackbox", "instance": "https://wizard.example.org/healthz"}
OTHER_PROBE = {"job": "blackbox", "instance": "https://decks.example.org/healthz"}
ROOT_FS = {"job": "node", "instance": "10.0.0.11:9100", "device": "/dev/sda1", "fstype": "ext4", "mountpoint": "/"}
SRV_FS = {**ROOT_FS, "device": "/dev/sdb1", "mountpoint": "/srv"}
RUN_FS = {**ROOT_FS, "device": "tmpfs", "fstype": "tmpfs", "mountpoint": "/run"}
PG = {"job": "postgresql", "instance": "10.0.0.5:9187"}
REDIS = {"job": "redis", "instance": "10.0.0.5:9121"}
NODE_A = {"job": "node", "instance": "10.0.0.11:9100"}


def _requests(service, status, values, route="/api/x", method="GET"):
    labels = {"service": service, "method": method, "route": route, "status": status}
    return _series(METRICS["requests"], labels, values)


def _bucket(service, le, values, route="/api/x", method="GET"):
    labels = {"service": service, "method": method, "route": route, "le": le}
    return _series(METRICS["duration"] + "_bucket", labels, values)


# The routes monitoring_routes_not_alerted leaves out by default: a user's app behind the
# workspace's apps front (app/workspace/routes/apps.py) and the wizard's model calls.
APP_ROUTES = ("/@<user>/<target>/apps/<slug>/", "/@<user>/<target>/apps/<slug>/<path:path>")
MODEL_ROUTES = ("/api/ai/text", "/api/ai/image")
NOTEBOOK_A = {"job": "bundle_notebook", "instance": "10.0.0.11:9180"}
NOTEBOOK_B = {"job": "bundle_notebook", "instance": "10.0.0.12:9180"}
BLACKBOX_EXPORTER = {"job": "blackbox_exporter", "instance": "127.0.0.1:9115"}


RULE_TESTS = [
    # A target down for 5 minutes; the one beside it up; a probe's `up` (the blackbox
    # exporter's answer for a public URL) is no target of its own.
    _case(
        "TargetDown",
        [_series("up", WIZARD_A, "0x15"), _series("up", NODE_A, "1x15"), _series("up", PROBE, "0x15")],
        "3m",
        "10m",
        {**WIZARD_A, "severity": "critical"},
        "bundle_wizard on 10.0.0.11:9180 does not answer",
    ),
    # The blackbox exporter down: one TargetDown (its own job), none per probe.
    _case(
        "TargetDown",
        [
            _series("up", BLACKBOX_EXPORTER, "0x15"),
            _series("up", PROBE, "0x15"),
            _series("up", OTHER_PROBE, "0x15"),
        ],
        "3m",
        "10m",
        {**BLACKBOX_EXPORTER, "severity": "critical"},
        "blackbox_exporter on 127.0.0.1:9115 does not answer",
    ),
    _case(
        "PublicHostDown",
        [_series("probe_success", PROBE, "0x15"), _series("probe_success", OTHER_PROBE, "1x15")],
        "3m",
        "10m",
        {**PROBE, "severity": "critical"},
        "https://wizard.example.org/healthz fails its probe",
    ),
    # 10 % of the wizard's requests are 5xx; 1 % of the deck service's. The workspace's
    # users' apps and the wizard's model calls fail half the time: not the platform's.
    _case(
        "ServiceErrors",
        [
            _requests("wizard", "5xx", "0+10x30"),
            _requests("wizard", "2xx", "0+90x30"),
            _requests("decks", "5xx", "0+1x30"),
            _requests("decks", "2xx", "0+99x30"),
            *(_requests("wizard", "5xx", "0+100x30", route, "POST") for route in MODEL_ROUTES),
            *(_requests("workspace", "5xx", "0+50x30", route) for route in APP_ROUTES),
            *(_requests("workspace", "2xx", "0+50x30", route) for route in APP_ROUTES),
            _requests("workspace", "2xx", "0+100x30"),
        ],
        "3m",
        "20m",
        {"service": "wizard", "severity": "critical"},
        "wizard answers 10% of its requests with 5xx",
    ),
    # Every wizard request takes 0.3-0.5 s (p95 0.49 s); every deck request under 0.1 s.
    # The workspace's users' apps and the wizard's model calls take seconds: left out.
    _case(
        "ServiceSlow",
        [
            *(_bucket("wizard", le, "0x30") for le in ("0.1", "0.3")),
            *(_bucket("wizard", le, "0+10x30") for le in ("0.5", "+Inf")),
            *(_bucket("decks", le, "0+10x30") for le in ("0.1", "0.3", "0.5", "+Inf")),
            *(_bucket("wizard", le, "0x30", route, "POST") for route in MODEL_ROUTES for le in ("0.1", "0.3", "0.5")),
            *(_bucket("wizard", "+Inf", "0+100x30", route, "POST") for route in MODEL_ROUTES),
            *(_bucket("workspace", le, "0+10x30") for le in ("0.1", "0.3", "0.5", "+Inf")),
            *(_bucket("workspace", le, "0x30", route) for route in APP_ROUTES for le in ("0.1", "0.3", "0.5")),
            *(_bucket("workspace", "+Inf", "0+100x30", route) for route in APP_ROUTES),
        ],
        "3m",
        "20m",
        {"service": "wizard", "severity": "warning"},
        "wizard's p95 is 490ms",
    ),
    # / is 90 % full, /srv 50 %, a full tmpfs does not count.
    _case(
        "DiskAlmostFull",
        [
            _series("node_filesystem_avail_bytes", ROOT_FS, "10x15"),
            _series("node_filesystem_size_bytes", ROOT_FS, "100x15"),
            _series("node_filesystem_avail_bytes", SRV_FS, "50x15"),
            _series("node_filesystem_size_bytes", SRV_FS, "100x15"),
            _series("node_filesystem_avail_bytes", RUN_FS, "0x15"),
            _series("node_filesystem_size_bytes", RUN_FS, "100x15"),
        ],
        "3m",
        "10m",
        {**ROOT_FS, "severity": "warning"},
        "/ on 10.0.0.11:9100 is 90% full",
    ),
    # One certificate expires 20 days after the epoch, the other 30: after a day, none
    # within 14 days; after a week, the first.
    _case(
        "CertificateExpiresSoon",
        [
            _series("probe_ssl_earliest_cert_expiry", PROBE, f"{20 * 86400}x200"),
            _series("probe_ssl_earliest_cert_expiry", OTHER_PROBE, f"{30 * 86400}x200"),
        ],
        "1d",
        "7d",
        {**PROBE, "severity": "warning"},
        "the certificate of https://wizard.example.org/healthz expires in 13d 0h 0m 0s",
        interval="1h",
    ),
    # The oldest queued job's age grows a minute a minute: 5 then 15 minutes old. The
    # figure has no label of its own (docs/reference/metrics.md): the scrape's job and
    # instance only. Both application hosts see the one queue: one alert.
    _case(
        "NotebookJobsWaiting",
        [
            _series(METRICS["notebook_oldest_queued"], NOTEBOOK_A, "0+60x20"),
            _series(METRICS["notebook_oldest_queued"], NOTEBOOK_B, "0+60x20"),
        ],
        "5m",
        "15m",
        {"job": "bundle_notebook", "severity": "warning"},
        "the notebook's oldest queued job has waited 15m 0s",
    ),
    # The last backup succeeded at the epoch: 25 hours later fine, 27 hours later not.
    _case(
        "BackupTooOld",
        [_series(METRICS["backup_last_success"], {**NODE_A, "store": "files"}, "0x1700")],
        "25h",
        "27h",
        {"instance": "10.0.0.11:9100", "store": "files", "severity": "critical"},
        "the last files backup on 10.0.0.11:9100 succeeded 1d 3h 0m 0s ago",
    ),
    # Two stores of one host are judged apart: the files' backup succeeds every minute
    # (its timestamp follows the clock), PostgreSQL's stopped at the epoch: only it fires.
    _case(
        "BackupTooOld",
        [
            _series(METRICS["backup_last_success"], {**NODE_A, "store": "files"}, "0+60x1700"),
            _series(METRICS["backup_last_success"], {**NODE_A, "store": "postgresql"}, "0x1700"),
        ],
        "25h",
        "27h",
        {"instance": "10.0.0.11:9100", "store": "postgresql", "severity": "critical"},
        "the last postgresql backup on 10.0.0.11:9100 succeeded 1d 3h 0m 0s ago",
    ),
    _case(
        "PostgresqlDown",
        [_series("pg_up", PG, "0x15"), _series("redis_up", REDIS, "1x15")],
        "3m",
        "10m",
        {**PG, "severity": "critical"},
        "PostgreSQL on 10.0.0.5:9187 does not answer its exporter",
    ),
    _case(
        "RedisDown",
        [_series("redis_up", REDIS, "0x15"), _series("pg_up", PG, "1x15")],
        "3m",
        "10m",
        {**REDIS, "severity": "critical"},
        "Redis on 10.0.0.5:9121 does not answer its exporter",
    ),
]


def test_every_alert_rule_has_a_unit_test():
    rules = (ROLE / "templates/etc/prometheus/bundle-alerts.yml.j2").read_text()
    named = {line.split(":", 1)[1].strip() for line in rules.splitlines() if line.strip().startswith("- alert:")}
    assert named == {case["alert_rule_test"][0]["alertname"] for case in RULE_TESTS}


def test_each_alert_fires_on_its_condition_and_not_before(rendered):
    folder = rendered["production"]
    (folder / "rules_test.yml").write_text(
        yaml.safe_dump({"rule_files": ["bundle-alerts.yml"], "evaluation_interval": "1m", "tests": RULE_TESTS})
    )
    result = _promtool("test", "rules", "rules_test.yml", cwd=folder)
    assert result.returncode == 0, result.stdout + result.stderr
