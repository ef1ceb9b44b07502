"""DATABASE_URL's PostgreSQL form (app.common.database_url): one host and libpq's
multi-host URL, the parameters every connection gets, the errors of a bad URL (naming
DATABASE_URL, never the password), and the pool and the copy built on it. A real
failover under a service is tests/common/test_postgres_failover.py."""

import pytest
from psycopg.conninfo import conninfo_to_dict

from app.common import database_url
from app.common.config import ConfigError
from app.common.db import _pooled_postgres

HA = "postgresql://bundle:s3cret@db1:5432,db2:5433,db3/wizard"


def test_one_host_keeps_its_settings_and_gets_the_time_outs():
    params = database_url.postgres_params("postgresql://bundle:s3cret@db.internal:5432/wizard")
    assert params["host"] == "db.internal" and params["port"] == "5432" and params["dbname"] == "wizard"
    assert params["user"] == "bundle" and params["password"] == "s3cret"
    assert "target_session_attrs" not in params  # one host: whatever it is, it is the database
    assert params["connect_timeout"] == "3" and params["tcp_user_timeout"] == "5000"
    assert params["keepalives"] == "1" and params["keepalives_idle"] == "5"


def test_several_hosts_connect_to_the_one_that_writes():
    params = database_url.postgres_params(HA)
    assert params["host"] == "db1,db2,db3" and params["port"] == "5432,5433,"
    assert params["target_session_attrs"] == "read-write"
    assert database_url.hosts(HA) == ["db1:5432", "db2:5433", "db3:5432"]


def test_what_the_url_says_wins():
    url = HA + "?target_session_attrs=any&connect_timeout=10&tcp_user_timeout=0"
    params = database_url.postgres_params(url)
    assert params["target_session_attrs"] == "any"
    assert params["connect_timeout"] == "10" and params["tcp_user_timeout"] == "0"


def test_the_postgres_scheme_and_a_socket_folder():
    assert database_url.postgres_params("postgres://u@h/db")["host"] == "h"
    assert database_url.postgres_params("postgresql:///db?host=/run/postgresql")["host"] == "/run/postgresql"


@pytest.mark.parametrize(
    "url, words",
    [
        ("mysql://bundle:s3cret@db/wizard", "must be postgresql://..., got mysql:"),
        ("postgresql://bundle:s3cret@db1:5432,db2:x/wizard", "invalid port 'x'"),
        ("postgresql://bundle:s3cret@db1:99999/wizard", "invalid port '99999'"),
        ("postgresql://bundle:s3cret@db1/wizard?sslmode=sometimes&pool=9", "not a valid PostgreSQL URL"),
        ("postgresql://bundle:s3cret@db1", "names no database"),
        ("postgresql://bundle:s3%zzcret@db1/wizard", "not a valid PostgreSQL URL"),
    ],
)
def test_a_bad_url_is_one_line_naming_the_variable_never_the_password(url, words):
    with pytest.raises(ConfigError) as caught:
        database_url.postgres_params(url)
    message = str(caught.value)
    assert message.startswith("DATABASE_URL ") and words in message
    assert "s3cret" not in message and "zzcret" not in message and "\n" not in message


def test_the_pool_connects_with_the_parameters():
    db = _pooled_postgres(HA, "wizard")
    assert db.database == "wizard"
    sent = conninfo_to_dict(db.connect_params["conninfo"])
    assert sent["host"] == "db1,db2,db3" and sent["target_session_attrs"] == "read-write"
    assert sent["tcp_user_timeout"] == "5000" and sent["application_name"].startswith("bundle wizard ")
    assert sent["options"] == "-c idle_in_transaction_session_timeout=20s"


def test_the_urls_own_server_options_are_kept():
    db = _pooled_postgres(HA + "?options=-c%20work_mem%3D8MB", "wizard")
    options = conninfo_to_dict(db.connect_params["conninfo"])["options"]
    assert options == "-c work_mem=8MB -c idle_in_transaction_session_timeout=20s"
