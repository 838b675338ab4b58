"""Retention: archive rows and dead letters are kept for their subscription's time (or the
broker's defaults, 7 and 30 days) and removed by the reaper in bounded batches; on
PostgreSQL the archive's days are created ahead and dropped whole. Time moves by the
test clock, never by sleeping."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.helpers import claim_one

import sqlbroker
from sqlbroker.features.retention import DEFAULT_ARCHIVE_RETENTION, DEFAULT_DEAD_RETENTION

DAY = timedelta(days=1)


def _finish(broker: sqlbroker.Broker, subscription: str, count: int = 1) -> None:
    """Publish ``count`` messages to the queue ``subscription`` and complete them."""
    broker.send_many(subscription, [f"m{i}" for i in range(count)])
    broker.complete(broker.claim(subscription, limit=count))


def _bury(broker: sqlbroker.Broker, subscription: str) -> None:
    broker.send(subscription, "poison")
    broker.dead_letter(claim_one(broker, subscription), reason="bad")


def _archived(broker: sqlbroker.Broker, subscription: str | None = None) -> int:
    return len(broker.archive(subscription, limit=10_000))


def _reap_all(broker: sqlbroker.Broker, limit: int = 1000) -> dict[str, int]:
    """Reap until a pass removes nothing; the summed counts."""
    total = {"archive_trimmed": 0, "dead_trimmed": 0}
    while True:
        counts = broker.reap(limit=limit)
        for key in total:
            total[key] += counts[key]
        if not counts["archive_trimmed"] and not counts["dead_trimmed"]:
            return total


def test_defaults_are_finite_and_shown(clocked_broker: sqlbroker.Broker) -> None:
    clocked_broker.subscribe("orders", "orders.*")
    (kept,) = clocked_broker.retention()
    assert kept == sqlbroker.Retention(
        subscription="orders",
        archive=7 * 86400.0,
        dead=30 * 86400.0,
        archive_default=True,
        dead_default=True,
    )
    (stats,) = clocked_broker.stats()
    assert (stats.archive_retention, stats.dead_retention) == (
        DEFAULT_ARCHIVE_RETENTION,
        DEFAULT_DEAD_RETENTION,
    )


def test_archive_rows_past_retention_go_and_rows_within_stay(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    _finish(clocked_broker, "q", 3)
    clock.advance(6 * DAY)
    _finish(clocked_broker, "q", 2)
    assert _reap_all(clocked_broker)["archive_trimmed"] == 0
    assert _archived(clocked_broker) == 5
    clock.advance(2 * DAY)  # the first three are 8 days old, the last two 2 days
    _reap_all(clocked_broker)
    assert sorted(row.payload for row in clocked_broker.archive()) == ["m0", "m1"]
    clock.advance(6 * DAY)
    _reap_all(clocked_broker)
    assert _archived(clocked_broker) == 0


def test_dead_letters_past_retention_go_and_within_stay(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    _bury(clocked_broker, "q")
    clock.advance(29 * DAY)
    _bury(clocked_broker, "q")
    assert _reap_all(clocked_broker)["dead_trimmed"] == 0
    clock.advance(2 * DAY)
    assert _reap_all(clocked_broker)["dead_trimmed"] == 1
    assert len(clocked_broker.dead_letters.list()) == 1


def test_a_subscription_keeps_its_own_times(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    for name in ("short", "long", "plain"):
        clocked_broker.subscribe(name, f"{name}.*")
    clocked_broker.set_retention("short", archive=DAY, dead=timedelta(hours=12))
    clocked_broker.set_retention("long", archive=timedelta(days=30), dead=60 * 86400)
    assert {
        (r.subscription, r.archive, r.dead, r.archive_default) for r in clocked_broker.retention()
    } == {
        ("long", 30 * 86400.0, 60 * 86400.0, False),
        ("plain", 7 * 86400.0, 30 * 86400.0, True),
        ("short", 86400.0, 43200.0, False),
    }
    for name in ("short", "long", "plain"):
        clocked_broker.publish(f"{name}.done", "x")
        clocked_broker.complete(clocked_broker.claim(name))
        clocked_broker.publish(f"{name}.dead", "y")
        clocked_broker.dead_letter(claim_one(clocked_broker, name), reason="bad")
    clocked_broker.publish("nobody.listens", "z")  # unrouted: the archive default

    clock.advance(2 * DAY)
    _reap_all(clocked_broker)
    assert _archived(clocked_broker, "short") == 0
    assert [d.subscription for d in clocked_broker.dead_letters.list(subscription="short")] == []
    assert (_archived(clocked_broker, "long"), _archived(clocked_broker, "plain")) == (1, 1)

    clock.advance(6 * DAY)  # 8 days: past the default, within "long"'s 30
    _reap_all(clocked_broker)
    assert _archived(clocked_broker, "plain") == 0
    assert clocked_broker.unrouted().total == 0
    assert _archived(clocked_broker, "long") == 1
    assert len(clocked_broker.dead_letters.list()) == 2  # long's and plain's: 30 days

    clock.advance(23 * DAY)  # 31 days
    _reap_all(clocked_broker)
    assert _archived(clocked_broker) == 0
    assert [d.subscription for d in clocked_broker.dead_letters.list()] == ["long"]

    reset = clocked_broker.set_retention("long", reset=True)
    assert (reset.archive_default, reset.dead_default) == (True, True)
    _reap_all(clocked_broker)
    assert clocked_broker.dead_letters.list() == []


def test_retention_removes_in_bounded_batches(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    clocked_broker.subscribe("q", "q")
    clocked_broker.set_retention("q", archive=DAY, dead=DAY)
    _finish(clocked_broker, "q", 25)
    for _ in range(13):
        _bury(clocked_broker, "q")
    clock.advance(2 * DAY)
    passes = [clocked_broker.reap(limit=10) for _ in range(4)]
    assert [p["archive_trimmed"] for p in passes] == [10, 10, 5, 0]
    assert [p["dead_trimmed"] for p in passes] == [10, 3, 0, 0]


def test_nothing_else_is_lost(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """Retention touches the archive and the dead letters only: queued and scheduled copies,
    however old, stay, and the subscriptions with them."""
    waiting = clocked_broker.send("q", "waiting")
    later = clocked_broker.send("q", "later", delay=40 * DAY)
    clock.advance(35 * DAY)
    _reap_all(clocked_broker)
    assert {p.message_id for p in clocked_broker.pending("q")} == {waiting, later}
    assert [s.name for s in clocked_broker.subscriptions()] == ["q"]
    clocked_broker.complete(clocked_broker.claim("q"))
    assert _reap_all(clocked_broker)["archive_trimmed"] == 0
    assert _archived(clocked_broker, "q") == 1


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"archive": 0}, "archive"),
        ({"dead": -1}, "dead"),
        ({"archive": float("inf")}, "archive"),
        ({"dead": "7d"}, "dead"),
        ({"archive": 101 * 365 * 86400}, "archive"),
    ],
)
def test_bad_retention_is_refused_and_writes_nothing(
    broker: sqlbroker.Broker, options: dict[str, Any], field: str
) -> None:
    broker.subscribe("q", "q")
    with pytest.raises(sqlbroker.ValidationError, match=field):
        broker.set_retention("q", **options)
    assert broker.retention("q")[0].archive_default


def test_unknown_subscription_and_bad_defaults(broker: sqlbroker.Broker, backend_url: str) -> None:
    with pytest.raises(sqlbroker.NotFound, match="nope"):
        broker.set_retention("nope", archive=60)
    # Asking of one subscription that does not exist is NotFound, as flow("nope") is.
    with pytest.raises(sqlbroker.NotFound, match="nope"):
        broker.retention("nope")
    with pytest.raises(sqlbroker.NotFound, match="nope"):
        broker.flow("nope")
    with pytest.raises(sqlbroker.ValidationError, match="archive_retention"):
        sqlbroker.Broker(backend_url, archive_retention=0)
    with pytest.raises(sqlbroker.ValidationError, match="dead_retention"):
        sqlbroker.Broker(backend_url, dead_retention=timedelta(days=-1))


def test_broker_defaults_apply(backend_url: str, clock: sqlbroker.ManualClock) -> None:
    """The broker's own defaults. Rows past the longest archive retention leave SQLite at
    once and PostgreSQL with their day (at most a day later); dead letters leave both at
    once."""
    with sqlbroker.Broker(
        backend_url, migrate=True, clock=clock, archive_retention=3600, dead_retention=7200
    ) as broker:
        _finish(broker, "q")
        _bury(broker, "q")
        clock.advance(1.5 * 3600)
        on_time = 0 if backend_url.startswith("postgresql") else 1
        assert _reap_all(broker) == {"archive_trimmed": on_time, "dead_trimmed": 0}
        clock.advance(3600)
        assert _reap_all(broker)["dead_trimmed"] == 1
        clock.advance(DAY)
        _reap_all(broker)
        assert _archived(broker) == 0


# --- PostgreSQL: the archive's days ------------------------------------------------------


def _days(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'sqlbroker_archive'::regclass ORDER BY 1"
        ).fetchall()
    return [str(row[0]) for row in rows]


def _day_name(at: datetime) -> str:
    return f"sqlbroker_archive_p{at.astimezone(UTC):%Y%m%d}"


@pytest.fixture
def pg_clocked(pg_url: str, clock: sqlbroker.ManualClock) -> Iterator[sqlbroker.Broker]:
    with sqlbroker.Broker(pg_url, clock=clock) as broker:
        yield broker


@pytest.mark.postgres
def test_days_are_created_ahead_and_dropped_whole(
    pg_url: str, pg_clocked: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    start = clock.now()
    assert start is not None
    days = _days(pg_url)
    assert "sqlbroker_archive_default" in days
    assert {_day_name(start + n * DAY) for n in range(4)} <= set(days)
    _finish(pg_clocked, "q", 5)
    assert _archived(pg_clocked) == 5

    clock.advance(10 * DAY)
    counts = pg_clocked.reap()
    days = _days(pg_url)
    assert {_day_name(start + n * DAY) for n in range(10, 14)} <= set(days)
    assert _day_name(start) not in days, "a day past the retention is dropped"
    assert counts["archive_trimmed"] == 0, "its rows went with the day, not one by one"
    assert _archived(pg_clocked) == 0
    _finish(pg_clocked, "q", 2)  # into a day the reaper made
    assert _archived(pg_clocked) == 2


@pytest.mark.postgres
def test_many_reapers_create_each_day_once(pg_url: str, clock: sqlbroker.ManualClock) -> None:
    brokers = [sqlbroker.Broker(pg_url, clock=clock) for _ in range(4)]
    try:
        clock.advance(20 * DAY)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda b: [b.reap() for _ in range(3)], brokers))
        start = clock.now()
        assert start is not None
        days = _days(pg_url)
        assert {_day_name(start + n * DAY) for n in range(4)} <= set(days)
        assert len(days) == len(set(days))
    finally:
        for broker in brokers:
            broker.close()


@pytest.mark.postgres
def test_rows_without_a_day_go_to_the_default_and_are_moved_into_their_day(
    pg_url: str, pg_clocked: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    """A publish dated where no day exists yet (no reaper ran for a long while) never
    fails: the row waits in the default partition and moves into its day when the reaper
    creates it."""
    import psycopg

    clock.advance(30 * DAY)
    _finish(pg_clocked, "q", 3)
    with psycopg.connect(pg_url) as conn:
        (in_default,) = conn.execute(
            "SELECT count(*) FROM sqlbroker_archive"
            " WHERE tableoid = 'sqlbroker_archive_default'::regclass"
        ).fetchone()  # type: ignore[misc]
    assert in_default == 3
    pg_clocked.reap()
    with psycopg.connect(pg_url) as conn:
        (in_default,) = conn.execute(
            "SELECT count(*) FROM sqlbroker_archive"
            " WHERE tableoid = 'sqlbroker_archive_default'::regclass"
        ).fetchone()  # type: ignore[misc]
    assert in_default == 0
    assert _archived(pg_clocked) == 3
    start = clock.now()
    assert start is not None
    assert _day_name(start) in _days(pg_url)


# --- PostgreSQL: converting a populated archive ----------------------------------------

_OLD_ROW = (
    "INSERT INTO sqlbroker_archive (message_id, subscription, topic, outcome, priority,"
    " payload, content_type, attempts, max_attempts, replay_count, enqueued_at, finished_at,"
    " tenant) VALUES (gen_random_uuid(), %(name)s, %(name)s, 'completed', 2, '\\x31',"
    " 'application/json', 1, 5, 0, %(at)s, %(at)s, %(tenant)s)"
)


@pytest.mark.postgres
def test_converting_a_populated_archive_keeps_every_row_and_what_is_attached(
    pg_server: Any,
) -> None:
    """A database one migration short of retention, with archive rows from 100 days ago to
    100 days ahead, row security on, a tenant default and a grant: after the migration every
    row is there unchanged, in its day (or the partition for old rows, or the default), the
    policy, the switch, the default, the grant and the indexes are on the new table, and
    new ids continue after every id the old table handed out."""
    import psycopg

    from sqlbroker.storage.sql import load_blocks, load_migrations

    package = "sqlbroker.storage.postgres"
    migrations = load_migrations(f"{package}.migrations")
    (mine,) = [version for version, title, _ in migrations if title == "retention"]
    name = pg_server.create_database(f"sqlbroker_ret_{uuid.uuid4().hex[:12]}")
    url = str(pg_server.url(name))
    reader = f"retention_reader_{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(load_blocks(package, "queries.sql")["schema_version_table"].encode())
            for version, title, script in migrations:
                if version >= mine:
                    break
                conn.execute(script.encode())
                conn.execute(
                    "INSERT INTO sqlbroker_schema_version (version, name) VALUES (%s, %s)",
                    (version, title),
                )
            for days in (-100, -100, -10, -1, -1, 0, 0, 0, 2, 100):
                for tenant in (None, "acme"):
                    conn.execute(
                        _OLD_ROW, {"name": "q", "at": now + timedelta(days=days), "tenant": tenant}
                    )
            conn.execute(
                "DELETE FROM sqlbroker_archive WHERE id = (SELECT max(id) FROM sqlbroker_archive)"
            )
            (handed_out,) = conn.execute(  # type: ignore[misc]
                "SELECT last_value FROM sqlbroker_archive_id_seq"
            ).fetchone()
            conn.execute(f"CREATE ROLE {reader} NOLOGIN")
            conn.execute(f"GRANT SELECT ON sqlbroker_archive TO {reader}")
            conn.execute("ALTER TABLE sqlbroker_archive ENABLE ROW LEVEL SECURITY")
            conn.execute(
                "ALTER TABLE sqlbroker_archive ALTER COLUMN tenant"
                " SET DEFAULT sqlbroker_session_tenant()"
            )
            before = conn.execute("SELECT * FROM sqlbroker_archive ORDER BY id").fetchall()
        assert len(before) == 19

        with sqlbroker.Broker(url, migrate=False) as broker:
            assert mine in broker.migrate()
            assert len(broker.archive(limit=100)) == 19
            broker.publish("nobody.listens", "new")  # an unrouted row, archived now

        with psycopg.connect(url, autocommit=True) as conn:
            after = conn.execute(
                "SELECT * FROM sqlbroker_archive WHERE id <= %s ORDER BY id", (handed_out,)
            ).fetchall()
            assert after == before
            (new_id,) = conn.execute(  # type: ignore[misc]
                "SELECT id FROM sqlbroker_archive WHERE id > %s", (handed_out,)
            ).fetchone()
            assert new_id == handed_out + 1
            (kind, secured) = conn.execute(  # type: ignore[misc]
                "SELECT relkind, relrowsecurity FROM pg_class"
                " WHERE oid = 'sqlbroker_archive'::regclass"
            ).fetchone()
            assert (kind, secured) == ("p", True)
            policies = conn.execute(
                "SELECT policyname FROM pg_policies WHERE tablename = 'sqlbroker_archive'"
            ).fetchall()
            assert policies == [("sqlbroker_tenant_isolation",)]
            (default,) = conn.execute(  # type: ignore[misc]
                "SELECT column_default FROM information_schema.columns"
                " WHERE table_name = 'sqlbroker_archive' AND column_name = 'tenant'"
            ).fetchone()
            assert "sqlbroker_session_tenant" in default
            (granted,) = conn.execute(  # type: ignore[misc]
                "SELECT has_table_privilege(%s, 'sqlbroker_archive', 'SELECT')", (reader,)
            ).fetchone()
            assert granted
            indexes = {
                row[0]
                for row in conn.execute(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'sqlbroker_archive'"
                )
            }
            assert indexes == {
                "sqlbroker_archive_pkey",
                "sqlbroker_archive_finished",
                "sqlbroker_archive_message_id",
                "sqlbroker_archive_rare",
                "sqlbroker_archive_retention",
            }
            placed = dict(
                conn.execute(
                    "SELECT tableoid::regclass::text, count(*) FROM sqlbroker_archive"
                    " WHERE id <= %s GROUP BY 1",
                    (handed_out,),
                ).fetchall()
            )
        assert placed == {
            "sqlbroker_archive_before": 4,
            _day_name(now - 10 * DAY): 2,
            _day_name(now - DAY): 4,
            _day_name(now): 6,
            _day_name(now + 2 * DAY): 2,
            "sqlbroker_archive_default": 1,
        }
        assert set(_days(url)) >= {_day_name(now + n * DAY) for n in range(4)}
    finally:
        pg_server.drop_database(name)
        pg_server.execute(f"DROP ROLE IF EXISTS {reader}")


def test_sqlite_upgrade_keeps_every_row(tmp_path: Any) -> None:
    """A SQLite database one migration short of retention, with archive rows and dead
    letters: migrating keeps them all, and the defaults then apply."""
    import sqlite3

    from sqlbroker.storage.sql import load_migrations
    from sqlbroker.storage.sqlite.dialect import statements

    path = tmp_path / "old.db"
    migrations = load_migrations("sqlbroker.storage.sqlite.migrations")
    (mine,) = [version for version, title, _ in migrations if title == "retention"]
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "CREATE TABLE sqlbroker_schema_version (version INTEGER PRIMARY KEY,"
        " name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    for version, title, script in migrations:
        if version >= mine:
            break
        for statement in statements(script):
            conn.execute(statement)
        conn.execute("INSERT INTO sqlbroker_schema_version VALUES (?, ?, 0)", (version, title))
    conn.close()
    url = f"sqlite:///{path}"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO sqlbroker_subscription (name, created_at) VALUES ('q', 0)")
    for i in range(5):
        conn.execute(
            "INSERT INTO sqlbroker_archive (message_id, subscription, topic, outcome, priority,"
            " payload, content_type, attempts, max_attempts, replay_count, enqueued_at,"
            " finished_at) VALUES (?, 'q', 'q', 'completed', 2, x'31', 'application/json',"
            " 1, 5, 0, ?, ?)",
            (f"00000000-0000-0000-0000-00000000000{i}", 1000.0 * i, 1000.0 * i),
        )
    before = conn.execute("SELECT * FROM sqlbroker_archive ORDER BY id").fetchall()
    conn.close()
    with sqlbroker.Broker(url, migrate=False) as broker:
        assert broker.migrate()[0] == mine
        (kept,) = broker.retention()
        assert (kept.archive_default, kept.dead_default) == (True, True)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT * FROM sqlbroker_archive ORDER BY id").fetchall() == before
    conn.close()
