//! PostgreSQL helpers shared by tests/conformance_postgres.rs and tests/adversarial_postgres.rs:
//! a raw client behind the store's back, and private schemas for tests that change the idem
//! schema without disturbing the others on the same database.

#![allow(dead_code)] // each test binary uses a part of it

use std::str::FromStr;

use idem_tests::pg_url;
use tokio_postgres::{Config, NoTls};

/// A raw client for checks behind the store's back.
pub async fn raw(config: &Config) -> tokio_postgres::Client {
    let (client, conn) = config.connect(NoTls).await.expect("raw connect");
    tokio::spawn(conn);
    client
}

/// A raw client on the tests' database (`IDEM_PG_URL`).
pub async fn admin() -> tokio_postgres::Client {
    raw(&Config::from_str(&pg_url()).expect("config")).await
}

/// A new, empty schema of this process, `idem_test_<what>_<pid>`: its name, an admin client, and
/// a config whose `search_path` is that schema. Dropped with [`drop_schema`].
pub async fn private_schema(what: &str) -> (String, tokio_postgres::Client, Config) {
    let base = Config::from_str(&pg_url()).expect("config");
    let schema = format!("idem_test_{what}_{}", std::process::id());
    let admin = raw(&base).await;
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))
        .await
        .expect("create schema");
    let mut config = base;
    config.options(format!("-c search_path={schema}"));
    (schema, admin, config)
}

pub async fn drop_schema(admin: &tokio_postgres::Client, schema: &str) {
    admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await.expect("drop");
}

/// A login role `idem_test_<what>_<pid>` (made again if it exists) with `USAGE` on `schema`,
/// and `config` as that role; drop it with [`drop_role`].
pub async fn login_role(
    admin: &tokio_postgres::Client,
    schema: &str,
    what: &str,
    config: &Config,
) -> (String, Config) {
    let role = format!("idem_test_{what}_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
             GRANT USAGE ON SCHEMA {schema} TO {role}"
        ))
        .await
        .expect("create role");
    let mut as_role = config.clone();
    as_role.user(&role);
    (role, as_role)
}

pub async fn drop_role(admin: &tokio_postgres::Client, role: &str) {
    admin.batch_execute(&format!("DROP ROLE IF EXISTS {role}")).await.expect("drop role");
}

/// The `host:port` of the tests' PostgreSQL server (`IDEM_PG_URL`), for a proxy in front of it.
pub fn target() -> String {
    let config = Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    format!("{host}:{}", config.get_ports().first().copied().unwrap_or(5432))
}

/// The connection string of the tests' server through a proxy on `port`, with the user, database
/// and password of `IDEM_PG_URL`.
pub fn through(port: u16) -> String {
    let config = Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    // Plaintext: the proxy reads the requests to find the one whose reply it drops, and the
    // local server offers TLS, which `sslmode=prefer` (the default with `postgres-tls`) would take.
    let mut s = format!("host=127.0.0.1 port={port} sslmode=disable");
    if let Some(user) = config.get_user() {
        s.push_str(&format!(" user={user}"));
    }
    if let Some(db) = config.get_dbname() {
        s.push_str(&format!(" dbname={db}"));
    }
    if let Some(pw) = config.get_password() {
        s.push_str(&format!(" password={}", String::from_utf8_lossy(pw)));
    }
    s
}

/// Turns the idem schema in `schema` back into what schema version 2, revision 0 created: no
/// `owner` column, no origin columns, no owner-token claim function, no revision row. (The claim function without a
/// token stays, as the current one: a migration replaces it.)
pub async fn to_revision_0(admin: &tokio_postgres::Client, schema: &str) {
    admin
        .batch_execute(&format!(
            "DROP FUNCTION {schema}.idem_claim_fresh(text, text, bigint, text, text, text, \
                                                     text); \
             DROP FUNCTION {schema}.idem_claim(text, text, bigint, boolean, text); \
             DROP FUNCTION {schema}.idem_claim(text, text, bigint, boolean, text, text, text, \
                                               text); \
             ALTER TABLE {schema}.idem_records DROP COLUMN owner, DROP COLUMN tool, \
                 DROP COLUMN tenant, DROP COLUMN run_id, DROP COLUMN since; \
             DELETE FROM {schema}.idem_meta WHERE name = 'schema_revision'"
        ))
        .await
        .expect("downgrade to revision 0");
}

/// Turns the idem schema in `schema` back into what schema version 1 created: the tables alone.
pub async fn to_version_1(admin: &tokio_postgres::Client, schema: &str) {
    to_revision_0(admin, schema).await;
    admin
        .batch_execute(&format!(
            "DROP FUNCTION {schema}.idem_claim(text, text, bigint, boolean); \
             UPDATE {schema}.idem_meta SET value = 1 WHERE name = 'schema_version'"
        ))
        .await
        .expect("downgrade to version 1");
}
