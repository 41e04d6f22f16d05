"""The incident store's file and schema (the store itself is portal/data/incident_store.py).

Here, below the hub, because `gpuslice upgrade` (hub/state.py) migrates every store and the
hub may not import the portal; the portal's store opens the file with these same steps.
"""

FILE_NAME = "incidents.sqlite"  # in the platform's data folder

# The first version: one row per incident the portal saw when an admin opened the page.
FIRST_VERSION = """
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    severity TEXT NOT NULL,
    opened_at REAL NOT NULL,
    resolved_at REAL,
    alerts TEXT NOT NULL,
    summary TEXT NOT NULL DEFAULT '',
    summary_by TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS incident_notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id TEXT NOT NULL REFERENCES incidents(id),
    author TEXT NOT NULL,
    at REAL NOT NULL,
    text TEXT NOT NULL
);
"""
# The recorder's: each alert episode with Alertmanager's times, each notification, the silences;
# the first version's alerts and summaries brought along (its ends were when the portal looked).
RECORDED = """
CREATE TABLE alerts (
    fingerprint TEXT NOT NULL,
    started INTEGER NOT NULL,  -- Alertmanager's startsAt in microseconds: with the fingerprint, one episode
    labels TEXT NOT NULL,
    summary TEXT NOT NULL DEFAULT '',
    runbook TEXT NOT NULL DEFAULT '',
    inhibited_by TEXT NOT NULL DEFAULT '[]',
    silenced_by TEXT NOT NULL DEFAULT '[]',
    ended REAL,
    end_exact INTEGER NOT NULL DEFAULT 1,
    last_seen REAL NOT NULL,
    PRIMARY KEY (fingerprint, started)
);
CREATE INDEX alerts_open ON alerts (ended);
CREATE TABLE notifications (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    receiver TEXT NOT NULL,
    at REAL NOT NULL,
    firing TEXT NOT NULL,
    resolved TEXT NOT NULL
);
CREATE TABLE silences (
    id TEXT PRIMARY KEY,
    created_by TEXT NOT NULL,
    comment TEXT NOT NULL,
    starts REAL NOT NULL,
    ends REAL,
    matchers TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE incident_summaries (
    incident_id TEXT PRIMARY KEY,
    summary TEXT NOT NULL,
    summary_by TEXT NOT NULL
);
INSERT OR IGNORE INTO alerts
    (fingerprint, started, labels, summary, runbook, inhibited_by, ended, end_exact, last_seen)
SELECT
    json_extract(a.value, '$.fingerprint'),
    CAST(ROUND(json_extract(a.value, '$.started') * 1000000) AS INTEGER),
    json_extract(a.value, '$.labels'),
    COALESCE(json_extract(a.value, '$.summary'), ''),
    COALESCE(json_extract(a.value, '$.runbook'), ''),
    COALESCE(json_extract(a.value, '$.inhibited_by'), '[]'),
    i.resolved_at,
    0,
    COALESCE(i.resolved_at, json_extract(a.value, '$.started'))
FROM incidents AS i, json_each(i.alerts) AS a;
INSERT OR IGNORE INTO incident_summaries (incident_id, summary, summary_by)
SELECT id, summary, summary_by FROM incidents WHERE summary != '';
"""
SCHEMA_STEPS = (FIRST_VERSION, RECORDED)  # a change to the tables is a new step (spawner/sqlite_schema.py)
