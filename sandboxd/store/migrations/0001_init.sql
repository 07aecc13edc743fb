CREATE TABLE owners (
    name       TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);

-- API keys are stored as SHA-256 of their secret part: keys are 256 random bits, so a fast hash is
-- enough (no dictionary to attack), and lookups go by the public key id.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    owner       TEXT NOT NULL REFERENCES owners(name) ON DELETE CASCADE,
    secret_hash BLOB NOT NULL,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
CREATE INDEX api_keys_owner ON api_keys(owner);

-- The run log: who ran what kind of code and how it went. No source, no output.
CREATE TABLE runs (
    id          TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    kind        TEXT NOT NULL,
    language    TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    duration_ms INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX runs_owner_created ON runs(owner, created_at);
