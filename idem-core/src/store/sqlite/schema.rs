//! The SQLite store's schema: the tables, and how a database is created, checked or migrated when
//! a store opens it.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::SqlError;
use crate::store::StoreError;

/// The schema this version reads and writes; stored in `idem_meta` as `schema_version`.
pub const SCHEMA_VERSION: i64 = 1;

/// The revision of [`SCHEMA_VERSION`] this store writes; stored in `idem_meta` as
/// `schema_revision` (absent: 0). Stores of an older revision keep working on a database of a
/// newer one (they ignore the columns they do not know), so processes can be upgraded one by one.
///
/// History: 1 adds the record's origin (`tool`, `tenant`, `run_id`), the time it entered its
/// state (`since`, ms) and the indexes for listing (`docs/design.md` §5.1). A database of
/// revision 0 is migrated when a store of this version opens it, one index per transaction; its
/// records list with an unknown origin and age.
pub const SCHEMA_REVISION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE idem_records (
    key         TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    fence       INTEGER NOT NULL,
    -- 0: in flight until lease_until (ms); 1: done, kept until expires_at (ms).
    state       INTEGER NOT NULL,
    lease_until INTEGER,
    expires_at  INTEGER,
    -- Outcome kind when done: 1 success, 2 failure, 3 unknown; payload is its JSON text.
    kind        INTEGER,
    payload     TEXT,
    -- Whether the last acquisition took over an expired lease (read by RETURNING).
    takeover    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX idem_records_expiry ON idem_records (expires_at) WHERE state = 1;
INSERT INTO idem_meta (name, value) VALUES ('fence', 0);
-- Every new fence is taken from the counter in the claim statement; the triggers move the
-- counter in that same statement.
CREATE TRIGGER idem_fence_insert AFTER INSERT ON idem_records BEGIN
    UPDATE idem_meta SET value = NEW.fence WHERE name = 'fence' AND value < NEW.fence;
END;
CREATE TRIGGER idem_fence_update AFTER UPDATE OF fence ON idem_records BEGIN
    UPDATE idem_meta SET value = NEW.fence WHERE name = 'fence' AND value < NEW.fence;
END;
";

/// Revision 1's columns (see [`SCHEMA_REVISION`]): name and type. Adding one rewrites nothing.
const REVISION_1_COLUMNS: [(&str, &str); 4] =
    [("tool", "TEXT"), ("tenant", "TEXT"), ("run_id", "TEXT"), ("since", "INTEGER")];

/// Revision 1's indexes for listing. On a table that holds records each is built in a transaction
/// of its own: SQLite has one writer at a time, so every other process's claims wait for a build,
/// and waiting for one at a time keeps them further from the busy timeout than waiting for all.
const REVISION_1_INDEXES: [&str; 3] = [
    "CREATE INDEX IF NOT EXISTS idem_records_state ON idem_records (state, kind, key)",
    "CREATE INDEX IF NOT EXISTS idem_records_tool ON idem_records (tool, key)",
    "CREATE INDEX IF NOT EXISTS idem_records_run ON idem_records (run_id, key)",
];

/// Whether the database already holds this version's schema at this revision: read without
/// the write lock, so that opening a store does not wait for another process's long write (a
/// backup, a `VACUUM`) when there is nothing to create or migrate.
fn is_current(conn: &Connection) -> bool {
    let meta = |name: &str| -> Option<i64> {
        conn.query_row("SELECT value FROM idem_meta WHERE name = ?1", params![name], |r| r.get(0))
            .ok()
    };
    meta("schema_version") == Some(SCHEMA_VERSION)
        && meta("schema_revision").is_some_and(|r| r >= SCHEMA_REVISION)
}

/// For a store that must exist: refuses a database whose `idem_records` table is not idem's of
/// this version, by reading alone, before anything (the journal mode included) is written to a
/// file that may be another application's.
pub(super) fn check_existing(conn: &Connection) -> Result<(), StoreError> {
    // No `idem_meta` table reads as no version; a damaged file is said to be damaged, not to
    // need another idem.
    let version: Option<i64> =
        match conn.query_row("SELECT value FROM idem_meta WHERE name = 'schema_version'", [], |r| {
            r.get(0)
        }) {
            Ok(version) => Some(version),
            Err(e) if super::is_corrupt(&e) => return Err(super::corrupt(None, &e)),
            Err(_) => None,
        };
    match version {
        Some(SCHEMA_VERSION) => Ok(()),
        Some(v) => Err(StoreError::Incompatible(format!(
            "the SQLite database has idem schema version {v}; this idem reads version \
             {SCHEMA_VERSION}"
        ))),
        None => Err(StoreError::Incompatible(
            "the SQLite database has an idem_records table without a schema version".into(),
        )),
    }
}

pub(super) fn init_schema(conn: &mut Connection) -> Result<(), StoreError> {
    if is_current(conn) {
        return Ok(());
    }
    let run = |conn: &mut Connection| -> Result<(), SqlError> {
        // IMMEDIATE: two processes opening a new file at once create the schema once.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS idem_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        )?;
        let version: Option<i64> = tx
            .query_row("SELECT value FROM idem_meta WHERE name = 'schema_version'", [], |r| {
                r.get(0)
            })
            .optional()?;
        let fresh = version.is_none();
        match version {
            Some(SCHEMA_VERSION) => {}
            Some(v) => {
                return Err(SqlError::Incompatible(format!(
                    "the SQLite database has idem schema version {v}; this idem reads version \
                     {SCHEMA_VERSION}"
                )));
            }
            None => {
                let records: i64 = tx.query_row(
                    "SELECT count(*) FROM sqlite_master WHERE name = 'idem_records'",
                    [],
                    |r| r.get(0),
                )?;
                if records > 0 {
                    return Err(SqlError::Incompatible(
                        "the SQLite database has an idem_records table without a schema version"
                            .into(),
                    ));
                }
                tx.execute_batch(SCHEMA)?;
                tx.execute(
                    "INSERT INTO idem_meta (name, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION],
                )?;
            }
        }
        let revision: i64 = tx
            .query_row("SELECT value FROM idem_meta WHERE name = 'schema_revision'", [], |r| {
                r.get(0)
            })
            .optional()?
            .unwrap_or(0);
        if revision >= 1 {
            return Ok(tx.commit()?);
        }
        // Each step can be taken again: a migration cut short (a crash) is finished by the next
        // store to open, and the revision is recorded last.
        let has: Vec<String> = tx
            .prepare("SELECT name FROM pragma_table_info('idem_records')")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for (name, kind) in REVISION_1_COLUMNS.iter().filter(|(n, _)| !has.iter().any(|h| h == n)) {
            tx.execute_batch(&format!("ALTER TABLE idem_records ADD COLUMN {name} {kind}"))?;
        }
        let mark = "INSERT OR REPLACE INTO idem_meta (name, value) VALUES ('schema_revision', ?1)";
        if fresh {
            for index in REVISION_1_INDEXES {
                tx.execute_batch(index)?;
            }
            tx.execute(mark, params![SCHEMA_REVISION])?;
            return Ok(tx.commit()?);
        }
        tx.commit()?;
        for index in REVISION_1_INDEXES {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(index)?;
            tx.commit()?;
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(mark, params![SCHEMA_REVISION])?;
        tx.commit()?;
        Ok(())
    };
    run(conn).map_err(StoreError::from)
}

#[cfg(test)]
mod tests {
    use crate::store::SqliteStore;

    /// Opening a database whose schema is current takes no write lock: another process's long
    /// write (a backup, a `VACUUM`) does not keep a store, or the command line, from opening.
    #[test]
    fn a_current_database_opens_while_another_process_writes() {
        let dir =
            std::env::temp_dir().join(format!("idem-sqlite-open-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("store.db");
        drop(SqliteStore::open(&path).unwrap());
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        assert!(
            SqliteStore::open(&path).is_ok(),
            "open while another process holds the write lock"
        );
        assert!(SqliteStore::open_existing(&path).is_ok());
        other.execute_batch("ROLLBACK").unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
