"""The store's schema, as an ordered set of migrations.

A migration, once released, never changes: a new column or table is a new migration appended at
the end. A database that holds a migration this code does not know was written by a newer Kiln
and is refused rather than guessed at.
"""

from __future__ import annotations

from sqlite_utils import Database, Migrations

MIGRATIONS = Migrations("kiln-store")

FAMILIES = ("pointwise", "reduction", "matmul", "conv", "attention", "other")
TIERS = ("triton", "cuda")
RUN_STATUSES = ("running", "done", "failed", "interrupted")


def _sql_list(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


@MIGRATIONS()
def m001_records(db: Database) -> None:
    """Models, runs, sites, candidates, verdicts and LLM calls."""
    db.executescript(f"""
        CREATE TABLE models (
            id INTEGER PRIMARY KEY,
            spec TEXT NOT NULL,
            hash TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (spec, hash)
        );
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            model_id INTEGER NOT NULL REFERENCES models(id),
            gpu TEXT NOT NULL,
            versions TEXT NOT NULL,
            config TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ({_sql_list(RUN_STATUSES)})),
            started_at TEXT NOT NULL,
            finished_at TEXT,
            heartbeat_at TEXT NOT NULL,
            writer_host TEXT NOT NULL,
            writer_pid INTEGER NOT NULL,
            writer_token TEXT,
            resumes INTEGER NOT NULL DEFAULT 0,
            e2e TEXT
        );
        CREATE INDEX runs_status ON runs(status);
        CREATE TABLE sites (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            key TEXT NOT NULL,
            family TEXT NOT NULL CHECK (family IN ({_sql_list(FAMILIES)})),
            signature TEXT NOT NULL,
            ops TEXT NOT NULL,
            calls INTEGER NOT NULL,
            share REAL NOT NULL CHECK (share >= 0 AND share <= 1),
            time_ms REAL,
            eager_ms REAL,
            compile_ms REAL,
            floor_ms REAL,
            problem_source TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (run_id, key)
        );
        CREATE TABLE llm_calls (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            site_id INTEGER REFERENCES sites(id),
            model TEXT NOT NULL,
            prompt TEXT NOT NULL,
            reply TEXT,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            latency_ms REAL,
            cost_usd REAL,
            error TEXT,
            created_at TEXT NOT NULL
        );
        CREATE INDEX llm_calls_run ON llm_calls(run_id);
        CREATE TABLE candidates (
            id INTEGER PRIMARY KEY,
            site_id INTEGER NOT NULL REFERENCES sites(id),
            parent_id INTEGER REFERENCES candidates(id),
            tier TEXT NOT NULL CHECK (tier IN ({_sql_list(TIERS)})),
            generator TEXT NOT NULL,
            rationale TEXT NOT NULL,
            source TEXT NOT NULL,
            source_hash TEXT NOT NULL,
            llm_call_id INTEGER REFERENCES llm_calls(id),
            verdict_id INTEGER REFERENCES verdicts(id),
            created_at TEXT NOT NULL,
            UNIQUE (site_id, source_hash)
        );
        CREATE INDEX candidates_parent ON candidates(parent_id);
        -- Counting a run's candidates and accepted ones reads this index alone: 250 -> 55 ms
        -- for `runs` over 100,000 candidates.
        CREATE INDEX candidates_site_verdict ON candidates(site_id, verdict_id);
        CREATE TABLE verdicts (
            id INTEGER PRIMARY KEY,
            candidate_id INTEGER NOT NULL REFERENCES candidates(id),
            compiled INTEGER NOT NULL,
            correct INTEGER NOT NULL,
            accepted INTEGER NOT NULL,
            reason TEXT,
            reason_code TEXT,
            max_abs_err REAL,
            max_rel_err REAL,
            tolerance REAL,
            tolerance_name TEXT,
            latency_ms REAL,
            latency_mean_ms REAL,
            latency_min_ms REAL,
            latency_max_ms REAL,
            latency_stdev_ms REAL,
            timing_trials INTEGER,
            timing_device TEXT,
            baseline_ms REAL,
            speedup REAL,
            flagged INTEGER,
            library_ops TEXT,
            kernel_launches INTEGER,
            compile_log TEXT,
            crashed INTEGER,
            timed_out INTEGER,
            speedup_vs_eager REAL,
            speedup_vs_compile REAL,
            roofline_fraction REAL,
            verdict TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX verdicts_candidate ON verdicts(candidate_id);
    """)


# What the index holds of a verdict: its reason code ('wrong_values') and its sentence.
_REASON = "nullif(trim(coalesce({v}.reason_code, '') || ' ' || coalesce({v}.reason, '')), '')"


@MIGRATIONS()
def m002_search(db: Database) -> None:
    """Full-text search over candidate source, rationale, site signature and ops, and reasons.

    The index holds no copy of the text: it reads it through `candidate_text`, and triggers keep
    it in step inside the writer's own transaction, so a reader sees a candidate and its index
    entry together or not at all. Candidates, sites and verdicts are never edited in place (a
    new verdict is a new row that `candidates.verdict_id` points to), which is what makes the
    'delete' with the old values below exact.
    """
    db.executescript(f"""
        CREATE VIEW candidate_text AS
            SELECT c.id AS id, c.source AS source, c.rationale AS rationale,
                   s.signature AS signature, s.ops AS ops, {_REASON.format(v="v")} AS reason
            FROM candidates c
            JOIN sites s ON s.id = c.site_id
            LEFT JOIN verdicts v ON v.id = c.verdict_id;
        CREATE VIRTUAL TABLE candidate_fts USING fts5(
            source, rationale, signature, ops, reason,
            content='candidate_text', content_rowid='id'
        );
        CREATE TRIGGER candidates_fts_insert AFTER INSERT ON candidates BEGIN
            INSERT INTO candidate_fts (rowid, source, rationale, signature, ops, reason)
                SELECT id, source, rationale, signature, ops, reason
                FROM candidate_text WHERE id = new.id;
        END;
        CREATE TRIGGER candidates_fts_verdict AFTER UPDATE OF verdict_id ON candidates BEGIN
            INSERT INTO candidate_fts
                (candidate_fts, rowid, source, rationale, signature, ops, reason)
                SELECT 'delete', old.id, old.source, old.rationale, s.signature, s.ops,
                       (SELECT {_REASON.format(v="verdicts")} FROM verdicts
                        WHERE id = old.verdict_id)
                FROM sites s WHERE s.id = old.site_id;
            INSERT INTO candidate_fts (rowid, source, rationale, signature, ops, reason)
                SELECT id, source, rationale, signature, ops, reason
                FROM candidate_text WHERE id = new.id;
        END;
        INSERT INTO candidate_fts (candidate_fts) VALUES ('rebuild');
    """)



@MIGRATIONS()
def m003_candidate_settings(db: Database) -> None:
    """The knobs a generator wrote a candidate with (JSON), so a resumed search can mutate it."""
    db.execute("ALTER TABLE candidates ADD COLUMN settings TEXT")


@MIGRATIONS()
def m004_site_declined(db: Database) -> None:
    """Why the kernel compiler could not plan a site (NULL where it could): the op that
    stopped it, as `--list-sites` shows it."""
    db.execute("ALTER TABLE sites ADD COLUMN declined TEXT")

# Every migration this code knows, in order: all of them are pending on an empty database.
MIGRATION_NAMES = tuple(migration.name for migration in MIGRATIONS.pending(Database(memory=True)))
