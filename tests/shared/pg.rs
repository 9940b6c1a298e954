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
