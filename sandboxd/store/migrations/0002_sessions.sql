-- Durable sessions. Deleting an owner deletes its sessions' records; the reaper then removes their
-- runtimes, which no longer have a record.
CREATE TABLE sessions (
    id               TEXT PRIMARY KEY,
    owner            TEXT NOT NULL REFERENCES owners(name) ON DELETE CASCADE,
    language         TEXT NOT NULL,
    preview_access   TEXT NOT NULL,
    status           TEXT NOT NULL,          -- creating, running, stopped, lost
    status_reason    TEXT NOT NULL DEFAULT '',
    thread_id        TEXT,
    metadata         TEXT NOT NULL DEFAULT '{}',
    state            TEXT NOT NULL DEFAULT '{}',
    timeout_ms       INTEGER NOT NULL,
    idle_timeout_sec INTEGER NOT NULL,
    max_lifetime_sec INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,       -- unix ms
    started_at       INTEGER NOT NULL,       -- last start or resume: the lifetime counts from here
    last_active_at   INTEGER NOT NULL,
    UNIQUE (owner, thread_id)
);
CREATE INDEX sessions_owner ON sessions(owner, created_at);
