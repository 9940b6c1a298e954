//! The PostgreSQL store's schema: the tables, the claim function `idem_claim`, and how a
//! database is created, checked or migrated when a store connects.

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::error::pg;
use crate::store::StoreError;

/// The schema this version reads and writes; stored in `idem_meta` as `schema_version`.
///
/// History: 1, the tables; 2, adds the `idem_claim` function (a database at version 1 is migrated
/// when a store of this version connects). Changes that stores of the same version keep working
/// with are revisions ([`SCHEMA_REVISION`]).
pub const SCHEMA_VERSION: i64 = 2;

/// The revision of [`SCHEMA_VERSION`] this store writes; stored in `idem_meta` as
/// `schema_revision` (absent: 0). Stores of an older revision of the same version keep working on
/// a database of a newer one, so processes can be upgraded one by one.
///
/// History: 1 adds the `owner` column and `idem_claim(k, fp, lease_ms, take, own)` (the owner
/// token); the function of revision 0, which older stores call, becomes the new one with no
/// token. 3 adds the record's origin (`tool`, `tenant`, `run_id`), the time it entered its state
/// (`since`), the indexes for listing (`docs/design.md` §5.1; on a table that holds records,
/// built after the migration commits, with `CREATE INDEX CONCURRENTLY`, so that no running
/// store's writes wait for the build) and
/// `idem_claim(k, fp, lease_ms, take, own, tool, tenant, run)`; the function of revision 1 becomes
/// the new one with no origin, so stores of an older revision keep working on a migrated
/// database (their records list with an unknown origin and age). The migration only adds
/// (columns, indexes, functions), so a database of any older revision takes it. 4 adds
/// `idem_claim_fresh(k, fp, lease_ms, own, tool, tenant, run)`, the fresh acquisition of the
/// claim's common path (one plain statement; `idem_claim` stays for the rare paths and for
/// stores of older revisions, and both draw fences under the same per-key lock). 5 makes
/// `idem_claim` give a row it takes over (a lease or a retention that ended) a fence above the
/// row's own even when the `idem_fence` sequence is below it (a table restored without its
/// sequence, a promoted logical replica); the migration only replaces the function.
pub const SCHEMA_REVISION: i64 = 5;

/// Serializes schema creation across processes (`pg_advisory_xact_lock`).
const SCHEMA_LOCK: i64 = 0x6964_656d_0001;

/// How long a migration waits for a table lock before it gives way to the statements queued
/// behind it, how long it pauses at most before trying again, and how many times it tries: about
/// half a minute in all, while a claim waits at most `LOCK_WAIT` for each try.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
const LOCK_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
const LOCK_TRIES: u32 = 50;

const SCHEMA: &str = "
-- Left behind when the tables were dropped by hand: fences go on above its last one.
CREATE SEQUENCE IF NOT EXISTS idem_fence AS bigint;
CREATE TABLE idem_records (
    key         text PRIMARY KEY,
    fingerprint text NOT NULL,
    fence       bigint NOT NULL,
    -- 0: in flight until lease_until; 1: done, kept until expires_at.
    state       smallint NOT NULL,
    lease_until timestamptz,
    expires_at  timestamptz,
    -- Outcome kind when done: 1 success, 2 failure, 3 unknown; payload is its JSON text.
    kind        smallint,
    payload     text,
    -- Whether the last acquisition took over an expired lease (read by RETURNING).
    takeover    boolean NOT NULL DEFAULT false,
    -- Whether someone waits on this holder: complete and release then NOTIFY.
    waited      boolean NOT NULL DEFAULT false,
    owner       text
);
CREATE INDEX idem_records_expiry ON idem_records (expires_at) WHERE state = 1;
";

/// The claim, as a function so that the common answers cost one indexed read: it reads the row
/// and returns it when the claim cannot take it (a replay, a live lease, a mismatch, an unknown
/// outcome), writing nothing; otherwise it upserts. The upsert acquires when the key is absent,
/// its retention ended, or its lease expired with the same fingerprint and the request takes over
/// (`take`). When the upsert's conflict check sees a newer row than the read did (a concurrent
/// claim), it changes nothing and the loop reads again: each statement inside takes a new
/// snapshot under READ COMMITTED. One row: acquired, fence, takeover, fingerprint, state, alive
/// (the lease or the retention has not ended), lease remaining (ms), outcome kind, payload; all
/// NULL after 16 rounds of racing writers. Not a set-returning function: no tuplestore per call.
///
/// `own` is the claim's owner token (see `store/resend.rs`), stored in the row it acquires. A row
/// in flight under the same token was created by an earlier send of this very claim whose reply
/// was lost: the upsert then keeps its fence and answers acquired again, with a fresh lease.
pub(super) const CLAIM_FUNCTION: &str = "
CREATE OR REPLACE FUNCTION idem_claim(k text, fp text, lease_ms bigint, take boolean, own text,
    tool_name text, tenant_id text, run text,
    OUT o_acquired boolean, OUT o_fence bigint, OUT o_takeover boolean, OUT o_fingerprint text,
    OUT o_state smallint, OUT o_alive boolean, OUT o_remaining_ms bigint, OUT o_kind smallint,
    OUT o_payload text)
LANGUAGE plpgsql AS $fn$
DECLARE
    mine boolean;
BEGIN
    FOR round IN 1..16 LOOP
        -- One statement and one test on the common path: every plpgsql expression costs.
        SELECT false, fence, takeover, fingerprint, state,
               CASE WHEN state = 0 THEN lease_until > now() ELSE expires_at > now() END,
               (extract(epoch FROM lease_until - now()) * 1000)::bigint, kind, payload,
               (state = 0 AND owner = own) IS TRUE
        INTO o_acquired, o_fence, o_takeover, o_fingerprint, o_state, o_alive, o_remaining_ms,
             o_kind, o_payload, mine
        FROM idem_records WHERE key = k;
        -- Takeable: retention ended, or lease ended and this claim takes over, or the row is this
        -- claim's own. Anything else, a row of an unknown state included, is the answer (the
        -- client judges it).
        IF FOUND AND NOT (mine OR (o_alive IS FALSE
                          AND (o_state = 1 OR (o_state = 0 AND o_fingerprint = fp AND take)))) THEN
            RETURN;
        END IF;
        -- Claims that may write take the key's lock first, so fences are drawn in the order
        -- owners acquire: a fence drawn before waiting on another claim's row would otherwise
        -- land below that claim's (held until this call's transaction ends).
        PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
        INSERT INTO idem_records AS x
            (key, fingerprint, fence, state, lease_until, takeover, owner, tool, tenant, run_id,
             since)
        VALUES (k, fp, nextval('idem_fence'), 0, now() + lease_ms * interval '1 millisecond', false,
                own, tool_name, tenant_id, run, now())
        ON CONFLICT (key) DO UPDATE SET
            fingerprint = EXCLUDED.fingerprint,
            -- Above the row's own fence whatever the sequence says: a table restored without
            -- its sequence, or a promoted logical replica (sequences are not replicated),
            -- restarts it below the fences its rows hold.
            fence = CASE WHEN x.owner = own THEN x.fence
                         ELSE greatest(EXCLUDED.fence, x.fence + 1) END,
            takeover = CASE WHEN x.owner = own THEN x.takeover ELSE x.state = 0 END,
            state = 0,
            lease_until = EXCLUDED.lease_until,
            expires_at = NULL,
            kind = NULL,
            payload = NULL,
            waited = CASE WHEN x.owner = own THEN x.waited ELSE false END,
            owner = own,
            tool = EXCLUDED.tool,
            tenant = EXCLUDED.tenant,
            run_id = EXCLUDED.run_id,
            since = CASE WHEN x.owner = own THEN x.since ELSE EXCLUDED.since END
        WHERE (x.state = 1 AND x.expires_at <= now())
           OR (x.state = 0 AND x.lease_until <= now() AND x.fingerprint = EXCLUDED.fingerprint
               AND take)
           OR (x.state = 0 AND x.owner = own)
        RETURNING true, x.fence, x.takeover, NULL, NULL, NULL, NULL, NULL, NULL
        INTO o_acquired, o_fence, o_takeover, o_fingerprint, o_state, o_alive, o_remaining_ms,
             o_kind, o_payload;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    -- Gave up racing: o_acquired NULL, which the client reads as 'send again'.
    o_acquired := NULL;
END
$fn$";

/// The fresh acquisition of the claim's common path (`Sql::Claim` in `conn.rs` calls it only
/// when the key has no row): the fence is drawn under the key's lock, as `idem_claim` draws it,
/// so fences follow the order in which owners acquire; a concurrent claim that inserted first
/// makes it answer NULL (the caller then runs `idem_claim`). plpgsql rather than a SQL function:
/// its plan is kept for the session, where a SQL function's body is planned again at every call.
const CLAIM_FRESH_FUNCTION: &str = "
CREATE OR REPLACE FUNCTION idem_claim_fresh(k text, fp text, lease_ms bigint, own text,
    tool_name text, tenant_id text, run text)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    f bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
    INSERT INTO idem_records
        (key, fingerprint, fence, state, lease_until, takeover, owner, tool, tenant, run_id, since)
    VALUES (k, fp, nextval('idem_fence'), 0, now() + lease_ms * interval '1 millisecond', false,
            own, tool_name, tenant_id, run, now())
    ON CONFLICT (key) DO NOTHING
    RETURNING fence INTO f;
    RETURN f;
END
$fn$";

/// The function of revision 1 (no origin), which stores of that revision call, is the new one
/// with no origin.
const CLAIM_FUNCTION_REV1: &str = "
CREATE OR REPLACE FUNCTION idem_claim(k text, fp text, lease_ms bigint, take boolean, own text,
    OUT o_acquired boolean, OUT o_fence bigint, OUT o_takeover boolean, OUT o_fingerprint text,
    OUT o_state smallint, OUT o_alive boolean, OUT o_remaining_ms bigint, OUT o_kind smallint,
    OUT o_payload text)
LANGUAGE sql AS $fn$
SELECT * FROM idem_claim(k, fp, lease_ms, take, own, NULL::text, NULL::text, NULL::text) $fn$";

/// Revision 3's columns; `IF NOT EXISTS`, so it applies to new databases and to those of an older
/// revision alike. Adding a column without a default rewrites nothing: a moment's lock.
const REVISION_3: &str = "
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS tool text;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS tenant text;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS run_id text;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS since timestamptz;
";

/// Revision 3's indexes for listing (`docs/design.md` §5.1): name and key. The run id index is
/// in byte order ("C"), which prefix ranges need.
const LISTING_INDEXES: [(&str, &str); 3] = [
    ("idem_records_state", "(state, kind, key)"),
    ("idem_records_tool", "(tool, key)"),
    ("idem_records_run", "((run_id COLLATE \"C\"), key)"),
];

/// How long an index build waits for each lock (its table's, and each older transaction's
/// end) before it gives up, leaving the index for a later store to open.
const INDEX_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the store that builds the listing indexes keeps others from building them (a lease
/// in `idem_meta`, ended when the builds succeed). After a failed build it stays: the next try
/// waits that long, rather than every open paying for a build that fails again (a transaction
/// kept open, a `statement_timeout`). A build that outlasts it is not raced: the next store sees
/// the table busy.
const INDEX_BUILD_LEASE: std::time::Duration = std::time::Duration::from_secs(2 * 60);

/// Takes the lease on the index builds (`$1`: its length in ms); a row when taken.
const INDEX_BUILD_TAKE: &str = "
INSERT INTO idem_meta (name, value)
VALUES ('listing_index_build', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1)
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value
WHERE idem_meta.value < (extract(epoch FROM clock_timestamp()) * 1000)::bigint
RETURNING value";

/// The table's schema; the listing indexes (`$1`) it lacks; those it has but invalid (a
/// `CREATE INDEX CONCURRENTLY` cut short, or one under way); whether another session builds an
/// index on it or changes it now (holds its SHARE UPDATE EXCLUSIVE lock; an autovacuum worker,
/// which gives way to a build, does not count, but a session whose kind this role may not see
/// does); whether this role may build them (owns the table, or is a member of its owner).
const LISTING_INDEXES_FOUND: &str = "
SELECT quote_ident(n.nspname),
    ARRAY(SELECT w FROM unnest($1::text[]) w
          WHERE NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
                            WHERE x.indrelid = t.oid AND c.relname = w)),
    ARRAY(SELECT c.relname::text FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
          WHERE x.indrelid = t.oid AND NOT x.indisvalid AND c.relname = ANY($1::text[])),
    EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.relation = t.oid AND l.mode = 'ShareUpdateExclusiveLock' AND l.granted
              AND l.pid <> pg_backend_pid()
              AND a.backend_type IS DISTINCT FROM 'autovacuum worker'),
    pg_has_role(t.relowner, 'USAGE')
FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE t.oid = to_regclass('idem_records')";

/// The names of [`LISTING_INDEXES`]: the `text[]` parameter of the queries that look for them.
fn listing_index_names() -> Vec<&'static str> {
    LISTING_INDEXES.iter().map(|(name, _)| *name).collect()
}

/// What [`LISTING_INDEXES_FOUND`] answers.
struct IndexesFound {
    schema: String,
    missing: Vec<String>,
    invalid: Vec<String>,
    busy: bool,
    owner: bool,
}

impl IndexesFound {
    async fn read(client: &Client) -> Result<Option<IndexesFound>, tokio_postgres::Error> {
        let names = [(&listing_index_names() as _, Type::TEXT_ARRAY)];
        let Some(row) = client.query_typed_opt(LISTING_INDEXES_FOUND, &names).await? else {
            return Ok(None);
        };
        Ok(Some(IndexesFound {
            schema: row.try_get(0)?,
            missing: row.try_get(1)?,
            invalid: row.try_get(2)?,
            busy: row.try_get(3)?,
            owner: row.try_get(4)?,
        }))
    }
}

/// Builds the listing indexes a table that already holds records lacks, with `CREATE INDEX
/// CONCURRENTLY`: a plain `CREATE INDEX` keeps every claim and completion of every running store
/// waiting for as long as it reads the table. An index left invalid by a build that was cut short
/// (a crash, a lock wait given up, a `statement_timeout`) is dropped and built again.
///
/// One store builds at a time: it takes a lease in `idem_meta` ([`INDEX_BUILD_LEASE`]), since
/// concurrent builds on one table deadlock on each other's snapshots. Nothing is done while
/// another session builds an index on the table or changes it. Best effort, since the store works
/// without the indexes (a listing then reads the whole table): the builds stop at the first
/// failure, which is a warning with the statements to run, and are tried again once the lease
/// ends; a role that does not own the table only warns.
///
/// `bounded`: each lock wait gives up after [`INDEX_LOCK_WAIT`] (a session's `lock_timeout`,
/// set around the builds, then put back as it was). Behind PgBouncer in transaction mode
/// (`bounded` false) a session setting would stay on a server connection other clients then
/// use, and a build without it waits as long as any older transaction stays open, so there
/// nothing is built: a warning says to open a store once on a direct connection.
async fn build_listing_indexes(client: &Client, bounded: bool) {
    let found = match IndexesFound::read(client).await {
        Ok(Some(found)) if !found.busy => found,
        Ok(_) => return,
        Err(e) => {
            let error = super::error::PgError(e);
            tracing::warn!(%error, "idem could not look for its listing indexes");
            return;
        }
    };
    let IndexesFound { schema, missing, invalid, owner, .. } = found;
    if missing.is_empty() && invalid.is_empty() {
        return;
    }
    let wanted = |n: &&(&str, &str)| missing.iter().chain(&invalid).any(|m| m == n.0);
    let statements = |name: &str, key: &str| {
        let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {schema}.{name}");
        let build = format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {schema}.idem_records {key}"
        );
        (drop, build)
    };
    if !owner || !bounded {
        let why = if owner {
            "through PgBouncer in transaction mode they are not built (a build could wait without \
             end); open a store once on a direct connection, or run"
        } else {
            "this role does not own idem_records, so the table's owner must run"
        };
        for (name, key) in LISTING_INDEXES.iter().filter(wanted) {
            let (drop, build) = statements(name, key);
            tracing::warn!(
                index = %format!("{schema}.{name}"),
                "idem's listing index {schema}.{name} is missing or invalid, and listings read the \
                 whole table until it is built; {why}: {drop}; {build}"
            );
        }
        return;
    }
    let lease = INDEX_BUILD_LEASE.as_millis() as i64;
    match client.query_typed_opt(INDEX_BUILD_TAKE, &[(&lease, Type::INT8)]).await {
        Ok(Some(_)) => {}
        // Another store builds them, or one failed to within the lease.
        Ok(None) => return,
        Err(e) => {
            let error = super::error::PgError(e);
            tracing::warn!(%error, "idem could not take the lease on building its listing indexes");
            return;
        }
    }
    // The session's own setting is put back after, not reset: a pool's connection may have
    // been given one when it was made.
    let read = "SELECT current_setting('lock_timeout')";
    let Ok(before) = client.query_typed_one(read, &[]).await else { return };
    let Ok(before) = before.try_get::<_, String>(0) else { return };
    let set = "SELECT set_config('lock_timeout', $1, false)";
    let timeout = format!("{}ms", INDEX_LOCK_WAIT.as_millis());
    if client.query_typed(set, &[(&timeout, Type::TEXT)]).await.is_err() {
        return;
    }
    let mut failed = false;
    for (name, key) in LISTING_INDEXES.iter().filter(wanted) {
        let (drop, build) = statements(name, key);
        let built = async {
            if invalid.iter().any(|i| i == name) {
                client.batch_execute(&drop).await?;
            }
            client.batch_execute(&build).await
        };
        let Err(e) = built.await else { continue };
        failed = true;
        // A concurrent build that fails leaves its index behind, invalid.
        if let Ok(Some(now)) = IndexesFound::read(client).await
            && !now.busy
            && now.invalid.iter().any(|i| i == name)
        {
            let _ = client.batch_execute(&drop).await;
        }
        tracing::warn!(
            index = %format!("{schema}.{name}"),
            error = %super::error::PgError(e),
            "idem could not build its listing index {schema}.{name}, and listings read the whole \
             table until it exists: a store opening {} min from now tries again, or run {drop}; \
             {build}",
            INDEX_BUILD_LEASE.as_secs() / 60
        );
        break;
    }
    let _ = client.query_typed(set, &[(&before, Type::TEXT)]).await;
    if !failed {
        let end = "DELETE FROM idem_meta WHERE name = 'listing_index_build'";
        let _ = client.batch_execute(end).await;
    }
}

/// The function of revision 0 (no owner token), which stores of that revision call, is the new one
/// with no token, so their takeovers clear the previous owner's token too (a token left on a row
/// another owner took would let the first owner's resend acquire it).
const CLAIM_FUNCTION_REV0: &str = "
CREATE OR REPLACE FUNCTION idem_claim(k text, fp text, lease_ms bigint, take boolean,
    OUT o_acquired boolean, OUT o_fence bigint, OUT o_takeover boolean, OUT o_fingerprint text,
    OUT o_state smallint, OUT o_alive boolean, OUT o_remaining_ms bigint, OUT o_kind smallint,
    OUT o_payload text)
LANGUAGE sql AS $fn$ SELECT * FROM idem_claim(k, fp, lease_ms, take, NULL::text) $fn$";

const VERSION: &str = "
SELECT max(value) FILTER (WHERE name = 'schema_version'),
       coalesce(max(value) FILTER (WHERE name = 'schema_revision'), 0)
FROM idem_meta";

fn incompatible_version(v: i64) -> StoreError {
    StoreError::Incompatible(format!(
        "the PostgreSQL database has idem schema version {v}; this idem reads version \
         {SCHEMA_VERSION}"
    ))
}

/// Why creating or migrating the schema failed. When the role may not (42501) or `search_path`
/// names no schema to create in (3F000), says what the database holds and what to do: managed
/// databases often let one role create and migrate the tables and the application's role only
/// use them, and the server's own refusal ("permission denied for schema") says neither.
/// `before`: the version and revision found, `None` when there were no tables.
async fn setup_refused(
    client: &Client,
    e: tokio_postgres::Error,
    before: Option<(i64, i64)>,
) -> StoreError {
    let code = e.code();
    if code != Some(&SqlState::INSUFFICIENT_PRIVILEGE)
        && code != Some(&SqlState::INVALID_SCHEMA_NAME)
    {
        return pg(e);
    }
    // The schema of the tables search_path reaches, else the one new tables would go to.
    let names = format!(
        "SELECT current_database(), current_setting('search_path'), \
         coalesce(({HOLDER}), quote_ident(current_schema())), quote_ident(current_user)"
    );
    let Ok(row) = client.query_typed_one(&names, &[]).await else { return pg(e) };
    let (Ok(db), Ok(path), Ok(schema), Ok(user)) = (
        row.try_get::<_, String>(0),
        row.try_get::<_, String>(1),
        row.try_get::<_, Option<String>>(2),
        row.try_get::<_, String>(3),
    ) else {
        return pg(e);
    };
    let refused = super::error::PgError(e);
    let Some(schema) = schema else {
        return StoreError::InvalidConfig(format!(
            "no schema of search_path {path:?} exists in PostgreSQL database {db:?} (or role \
             {user} may not use it), so idem's tables cannot be created there: set search_path \
             to the schema that holds them, or create that schema ({refused})"
        ));
    };
    StoreError::InvalidConfig(match before {
        None => format!(
            "idem's tables are not in schema {schema} of PostgreSQL database {db:?} (search_path \
             {path:?}), and role {user} may not create them ({refused}). Create them once with a \
             role that may (open the store as that role, which then owns them), and grant this \
             one what it uses: GRANT USAGE ON SCHEMA {schema} TO {user}; GRANT SELECT, INSERT, \
             UPDATE, DELETE ON {schema}.idem_records TO {user}; GRANT SELECT ON \
             {schema}.idem_meta TO {user}; GRANT USAGE ON SEQUENCE {schema}.idem_fence TO \
             {user}; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {user} (functions \
             run for anyone unless execution was revoked from PUBLIC). Or GRANT CREATE ON SCHEMA \
             {schema} TO {user}"
        ),
        Some((version, revision)) => format!(
            "idem's tables in schema {schema} of PostgreSQL database {db:?} are of schema \
             version {version}, revision {revision}; this idem brings them to version \
             {SCHEMA_VERSION}, revision {SCHEMA_REVISION} when it opens them, which role {user} \
             may not do ({refused}). Open the store once as the role that owns the tables (it \
             migrates them, and this role's grants stay)"
        ),
    })
}

/// The schema (quoted) of the `idem_records` table that search_path reaches (NULL: none).
const HOLDER: &str = "
SELECT (SELECT quote_ident(n.nspname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = to_regclass('idem_records'))";

/// The schemas other than the current one that hold an `idem_records` table (NULL: none).
const ELSEWHERE: &str = "
SELECT string_agg(quote_ident(n.nspname), ', ' ORDER BY n.nspname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'idem_records' AND c.relkind IN ('r', 'p') AND n.nspname <> current_schema()";

/// Logs a warning when this opening created idem's tables while other schemas of the database
/// hold some: an application whose `search_path` changed (a new connection string, a role whose
/// own schema now comes first) starts on an empty store, and every call recorded in the old one
/// runs its tool again when repeated. Not refused: separate stores (one schema per tenant or per
/// test) are made this way on purpose.
async fn warn_elsewhere(client: &Client, elsewhere: &str) {
    let here = "SELECT current_database(), quote_ident(current_schema())";
    let Ok(row) = client.query_typed_one(here, &[]).await else { return };
    let (Ok(db), Ok(schema)) = (row.try_get::<_, String>(0), row.try_get::<_, String>(1)) else {
        return;
    };
    tracing::warn!(
        database = %db,
        created_in = %schema,
        found_in = %elsewhere,
        "created idem's tables in a new schema while other schemas of the database already hold \
         them: if the application used one of those before (its search_path changed), its \
         records are there, and every call recorded there runs its tool again when repeated; set \
         search_path to that schema. Ignore this for separate stores made on purpose (a schema \
         per tenant or per test)"
    );
}

/// The error of a migration that never got its table lock: which sessions keep it, and what to
/// do. Unavailable: the store opens once they end their transactions.
async fn lock_kept(client: &Client, e: tokio_postgres::Error) -> StoreError {
    let holders = "SELECT coalesce(string_agg(DISTINCT pid::text, ', '), '?') FROM pg_locks \
                   WHERE relation = to_regclass('idem_records') AND granted \
                   AND pid <> pg_backend_pid()";
    let pids = match client.query_typed_one(holders, &[]).await {
        Ok(row) => row.try_get::<_, String>(0).unwrap_or_else(|_| "?".into()),
        Err(_) => "?".into(),
    };
    StoreError::unavailable(format!(
        "migrating idem's PostgreSQL schema to revision {SCHEMA_REVISION} needs a moment's \
         exclusive lock on idem_records, which an open transaction of session {pids} kept through \
         {LOCK_TRIES} tries (each gave way after {} ms, so that running stores went on): end \
         that transaction (SELECT pg_terminate_backend(pid)) and open the store again ({})",
        LOCK_WAIT.as_millis(),
        super::error::PgError(e)
    ))
}

/// What the store's statements need on tables that exist, and whether the role has it: each
/// missing privilege as the GRANT that gives it (NULL when nothing is missing); last, whether
/// the listing indexes ([`LISTING_INDEXES`]) are in place and valid. The sequence and
/// functions are looked up by name (`to_regclass`, `to_regprocedure`), and one not found counts
/// as granted: tables of a later revision, which a newer idem made while this one still runs
/// (a rolling deploy), may name them otherwise, and an open must not fail on its own check.
const PRIVILEGES: &str = "
SELECT quote_ident(current_user), current_database(),
    (SELECT quote_ident(n.nspname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = to_regclass('idem_records')),
    array_to_string(ARRAY(SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) p
                          WHERE NOT has_table_privilege('idem_records', p)), ', '),
    coalesce(has_sequence_privilege(to_regclass('idem_fence')::oid, 'USAGE')
             OR has_sequence_privilege(to_regclass('idem_fence')::oid, 'UPDATE'), true),
    coalesce(has_function_privilege(
        to_regprocedure('idem_claim(text, text, bigint, boolean, text, text, text, text)')::oid,
        'EXECUTE'), true)
    AND coalesce(has_function_privilege(
        to_regprocedure('idem_claim_fresh(text, text, bigint, text, text, text, text)')::oid,
        'EXECUTE'), true),
    (SELECT count(*) = cardinality($1::text[]) FROM pg_index x
     JOIN pg_class c ON c.oid = x.indexrelid
     WHERE x.indrelid = to_regclass('idem_records') AND x.indisvalid
       AND c.relname = ANY($1::text[]))";

/// Refuses, at open, an application's store whose role may read idem's tables but not do what
/// claims and completions do (a read-only role, grants on the tables but not on the fence
/// sequence): otherwise it opens, and every call fails. Names the grants missing. Whether the
/// listing indexes are in place and valid.
async fn may_use(client: &Client) -> Result<bool, StoreError> {
    let names = [(&listing_index_names() as _, Type::TEXT_ARRAY)];
    let row = client.query_typed_one(PRIVILEGES, &names).await.map_err(pg)?;
    let (user, db, schema): (String, String, Option<String>) =
        (row.try_get(0).map_err(pg)?, row.try_get(1).map_err(pg)?, row.try_get(2).map_err(pg)?);
    let (tables, sequence, functions): (String, bool, bool) =
        (row.try_get(3).map_err(pg)?, row.try_get(4).map_err(pg)?, row.try_get(5).map_err(pg)?);
    let listing_indexes: bool = row.try_get(6).map_err(pg)?;
    let schema = schema.unwrap_or_default();
    let mut grants = Vec::new();
    if !tables.is_empty() {
        grants.push(format!("GRANT {tables} ON {schema}.idem_records TO {user}"));
    }
    if !sequence {
        grants.push(format!("GRANT USAGE ON SEQUENCE {schema}.idem_fence TO {user}"));
    }
    if !functions {
        grants.push(format!("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {user}"));
    }
    if grants.is_empty() {
        return Ok(listing_indexes);
    }
    Err(StoreError::InvalidConfig(format!(
        "role {user} may read idem's tables in schema {schema} of PostgreSQL database {db:?} but \
         not claim and complete records there: {}",
        grants.join("; ")
    )))
}

/// The schema version and revision recorded in `idem_meta` (version `None` when not recorded).
async fn version_of(
    client: &impl tokio_postgres::GenericClient,
) -> Result<(Option<i64>, i64), tokio_postgres::Error> {
    let row = client.query_typed_one(VERSION, &[]).await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// Whether opening a store may create its schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Schema {
    /// Create the tables where there are none (an application's store).
    Create,
    /// Refuse a database without them (a tool that only looks at a store).
    Existing,
}

/// Creates, checks or migrates the schema. `bounded`: whether an index build may bound its lock
/// waits with a session setting (not behind PgBouncer in transaction mode).
pub(super) async fn ensure_schema(
    client: &mut Client,
    schema: Schema,
    bounded: bool,
) -> Result<(), StoreError> {
    // The common case: the schema exists at our version and revision (for an application's
    // store, then whether its role may use it, and whether a migration's index build was cut
    // short).
    let before = match version_of(client).await {
        Ok((Some(SCHEMA_VERSION), r)) if r >= SCHEMA_REVISION => {
            // A later revision's indexes are that revision's stores' business.
            if schema == Schema::Create && !may_use(client).await? && r == SCHEMA_REVISION {
                build_listing_indexes(client, bounded).await;
            }
            return Ok(());
        }
        Ok((Some(v @ (1 | SCHEMA_VERSION)), r)) => Some((v, r)),
        Ok((None, _)) => None,
        Ok((Some(v), _)) => return Err(incompatible_version(v)),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => None,
        Err(e) => return Err(pg(e)),
    };
    if schema == Schema::Existing {
        let row = client
            .query_typed_one(
                "SELECT to_regclass('idem_records') IS NOT NULL, current_database(), \
                 current_setting('search_path')",
                &[],
            )
            .await
            .map_err(pg)?;
        let (found, db, path): (bool, String, String) =
            (row.try_get(0).map_err(pg)?, row.try_get(1).map_err(pg)?, row.try_get(2).map_err(pg)?);
        if !found {
            return Err(StoreError::InvalidConfig(format!(
                "no idem store in PostgreSQL database {db:?} with search_path {path:?}: no \
                 idem_records table there. Name the database and search_path the application uses"
            )));
        }
    }
    // READ COMMITTED whatever the database's or role's default: each statement after the lock
    // must see what the store that held it before committed, where REPEATABLE READ or
    // SERIALIZABLE would keep the snapshot taken when the lock was asked for (a schema without
    // its version, a sequence that already exists, a serialization failure).
    let mut tries = 1;
    loop {
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
            .start()
            .await
            .map_err(pg)?;
        // Other schemas of the database holding idem's tables, when this opening creates them.
        let mut elsewhere: Option<String> = None;
        let found = async {
            tx.execute_typed("SELECT pg_advisory_xact_lock($1)", &[(&SCHEMA_LOCK, Type::INT8)])
                .await?;
            // A migration's ALTER TABLE waits for every open transaction on idem_records, and
            // every running store's statements queue behind it: with a session left idle in a
            // transaction they would all stop. So it waits a moment, and gives way (tried again).
            tx.batch_execute(&format!("SET LOCAL lock_timeout = {}", LOCK_WAIT.as_millis()))
                .await?;
            // Tables found in a later schema of search_path are the store's (its statements reach
            // them): migrate them there, not beside an empty first schema, where CREATE .. IF
            // NOT EXISTS would look.
            let holder: Option<String> = tx.query_typed_one(HOLDER, &[]).await?.try_get(0)?;
            if let Some(schema) = holder {
                tx.batch_execute(&format!("SET LOCAL search_path = {schema}")).await?;
            }
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS idem_meta \
                 (name text PRIMARY KEY, value bigint NOT NULL)",
            )
            .await?;
            let fresh = match version_of(&tx).await? {
                (Some(SCHEMA_VERSION), r) if r >= SCHEMA_REVISION => return Ok(None),
                (Some(1 | SCHEMA_VERSION), _) => false,
                (Some(v), _) => return Ok(Some(v)),
                (None, _) => {
                    let records: bool = tx
                        .query_typed_one("SELECT to_regclass('idem_records') IS NOT NULL", &[])
                        .await?
                        .try_get(0)?;
                    if records {
                        return Ok(Some(0));
                    }
                    true
                }
            };
            if fresh {
                tx.batch_execute(SCHEMA).await?;
                elsewhere = tx.query_typed_one(ELSEWHERE, &[]).await?.try_get(0)?;
            } else {
                // 1 -> 2 added the claim function; revision 1 the owner column. Stores of version 2
                // that are still running keep working (their claim function now clears owner
                // tokens). Stores of version 1 must stop first: their own upsert would keep a
                // previous owner's token on a row it takes over.
                tx.batch_execute("ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS owner text")
                    .await?;
            }
            tx.batch_execute(REVISION_3).await?;
            if fresh {
                // An empty table: built at once, with the tables.
                for (name, key) in LISTING_INDEXES {
                    tx.batch_execute(&format!("CREATE INDEX {name} ON idem_records {key}")).await?;
                }
            }
            tx.batch_execute(CLAIM_FUNCTION).await?;
            tx.batch_execute(CLAIM_FUNCTION_REV1).await?;
            tx.batch_execute(CLAIM_FUNCTION_REV0).await?;
            tx.batch_execute(CLAIM_FRESH_FUNCTION).await?;
            tx.execute_typed(
                "INSERT INTO idem_meta (name, value) VALUES ('schema_version', $1), \
                 ('schema_revision', $2) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                &[(&SCHEMA_VERSION, Type::INT8), (&SCHEMA_REVISION, Type::INT8)],
            )
            .await?;
            Ok::<_, tokio_postgres::Error>(None)
        }
        .await;
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                // Rolled back before the next statement on this connection.
                drop(tx);
                if e.code() != Some(&SqlState::LOCK_NOT_AVAILABLE) {
                    return Err(setup_refused(client, e, before).await);
                }
                if tries == LOCK_TRIES {
                    return Err(lock_kept(client, e).await);
                }
                tries += 1;
                tokio::time::sleep(crate::store::full_jitter(LOCK_PAUSE)).await;
                continue;
            }
        };
        return match found {
            None => {
                tx.commit().await.map_err(pg)?;
                if let Some(elsewhere) = elsewhere {
                    warn_elsewhere(client, &elsewhere).await;
                }
                // After the commit, which released the table: a migrated table holds records.
                build_listing_indexes(client, bounded).await;
                Ok(())
            }
            Some(0) => Err(StoreError::Incompatible(
                "the PostgreSQL database has an idem_records table without a schema version".into(),
            )),
            Some(v) => Err(incompatible_version(v)),
        };
    }
}
