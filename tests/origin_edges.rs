//! Origins (tool, tenant, run id) at their edges through every store and back out of the
//! listing: separators of the stores' own encodings, LIKE wildcards, NUL, newlines, bidi marks
//! and long emoji runs must come back as they went in, and a run id prefix filter must treat
//! every character literally.

use idem_core::conformance::LONG;
use idem_core::store::{Claim, ClaimRequest, ListQuery, OnExpired, Origin, Store};
use idem_core::{Fingerprint, Key, Scope, key};

fn tag() -> String {
    format!("edge-{}-", idem_tests::process_tag())
}

/// Strings at the edges of the stores' encodings, each after `base` so that a test's records
/// are its own.
fn edges(base: &str) -> Vec<String> {
    let mut out: Vec<String> = [
        "a|b",
        "a,b",
        "a%b",
        "a%2Cb",
        "a:b",
        "{a}",
        "a\nb",
        "a\r\nb",
        "a\u{202e}b",
        "a\tb",
        "a_b",
        "a%",
        "a_",
        "a\\b",
        "a'b",
        "a\"b",
        " ",
        "",
        "é",
        "e\u{301}",
    ]
    .iter()
    .map(|s| format!("{base}{s}"))
    .collect();
    out.push(format!("{base}{}", "\u{1F600}".repeat(300)));
    out
}

async fn claim_with(store: &dyn Store, origin: Origin<'_>, salt: &str) -> Key {
    let scope = Scope::run(origin.run).with_tenant(origin.tenant);
    let key = key::derive_key(&scope, origin.tool, salt.as_bytes());
    let fp = Fingerprint::of_derived_key(&key);
    let req = ClaimRequest {
        key: &key,
        fingerprint: &fp,
        lease: LONG,
        on_expired: OnExpired::TakeOver,
        origin,
    };
    match store.claim(req).await {
        Ok(Claim::Acquired { .. }) => key,
        other => panic!("a fresh key must be acquired, got {other:?}"),
    }
}

async fn list_all(store: &dyn Store, mut query: ListQuery) -> Vec<idem_core::store::RecordInfo> {
    let mut out = Vec::new();
    query.limit = 50;
    loop {
        let page = store.list(&query).await.expect("list");
        out.extend(page.records);
        match page.next {
            Some(next) => query.cursor = Some(next),
            None => return out,
        }
    }
}

/// Every edge string as tool, tenant and run comes back from `inspect` and `list` as it went in.
/// `run_fits` is what the store keeps of a run id (PostgreSQL: its first 1,024 bytes).
async fn origins_round_trip(store: &dyn Store, run_fits: impl Fn(&str) -> String) {
    let base = tag();
    for (i, s) in edges(&base).iter().enumerate() {
        let origin = Origin { tool: s, tenant: s, run: s };
        let key = claim_with(store, origin, &i.to_string()).await;
        let info = store.inspect(&key).await.expect("inspect").expect("the record exists");
        let got = info.origin.expect("an origin");
        let run = run_fits(s);
        assert_eq!(
            (got.tool.as_str(), got.tenant.as_str(), got.run.as_str()),
            (s.as_str(), s.as_str(), run.as_str())
        );
        let listed = list_all(
            store,
            ListQuery { run_prefix: Some(s.clone()), tool: Some(s.clone()), ..Default::default() },
        )
        .await;
        assert!(
            listed.iter().any(|r| r.key == key),
            "the record of run {s:?} must list under its own run as prefix and tool"
        );
        let exact = list_all(store, ListQuery { run: Some(s.clone()), ..Default::default() }).await;
        assert!(
            exact.iter().any(|r| r.key == key),
            "the record of run {s:?} must list under its own run id"
        );
    }
}

/// A run id prefix treats `%`, `_` and `\` literally: `a%` selects `a%...`, not `ab`.
async fn prefix_is_literal(store: &dyn Store) {
    let base = tag() + "lit-";
    let mut keys = std::collections::BTreeMap::new();
    for (i, run) in ["x%y", "xzy", "x_y", "xqy", "x\\y"].iter().enumerate() {
        let run = format!("{base}{run}");
        let key =
            claim_with(store, Origin { tool: "t", tenant: "", run: &run }, &i.to_string()).await;
        keys.insert(run, key);
    }
    for wild in ["x%", "x_", "x\\"] {
        let prefix = format!("{base}{wild}");
        let listed: Vec<_> =
            list_all(store, ListQuery { run_prefix: Some(prefix.clone()), ..Default::default() })
                .await
                .into_iter()
                .map(|r| r.origin.expect("origin").run)
                .collect();
        let want: Vec<_> = keys.keys().filter(|r| r.starts_with(&prefix)).cloned().collect();
        assert_eq!(listed, want, "prefix {prefix:?}");
    }
}

/// A run id with a NUL lists under a prefix that holds the NUL (stores that keep NUL).
async fn nul_in_run(store: &dyn Store) {
    let base = tag() + "nul-";
    let run = format!("{base}a\0b");
    let key = claim_with(store, Origin { tool: "t\0", tenant: "\0", run: &run }, "nul").await;
    for prefix in [format!("{base}a\0"), run.clone(), format!("{base}a")] {
        let listed =
            list_all(store, ListQuery { run_prefix: Some(prefix.clone()), ..Default::default() })
                .await;
        assert!(listed.iter().any(|r| r.key == key), "prefix {prefix:?} must select run {run:?}");
    }
    let other = list_all(
        store,
        ListQuery { run_prefix: Some(format!("{base}a\0c")), ..Default::default() },
    )
    .await;
    assert!(other.iter().all(|r| r.key != key), "prefix a\\0c must not select a\\0b");
    // The exact run: the whole id with its NUL, not the part before it.
    let exact = |run: String| list_all(store, ListQuery { run: Some(run), ..Default::default() });
    assert!(exact(run.clone()).await.iter().any(|r| r.key == key), "run {run:?} exactly");
    let before_nul = exact(format!("{base}a")).await;
    assert!(before_nul.iter().all(|r| r.key != key), "the part before the NUL is another run");
}

#[tokio::test]
async fn memory_origins() {
    let store = idem_core::store::MemoryStore::new();
    origins_round_trip(&store, |s| s.to_owned()).await;
    prefix_is_literal(&store).await;
    nul_in_run(&store).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_origins() {
    let dir = std::env::temp_dir().join(format!("idem-origin-{}", idem_tests::process_tag()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = idem_core::SqliteStore::open(dir.join("o.db")).expect("open");
    origins_round_trip(&store, |s| s.to_owned()).await;
    prefix_is_literal(&store).await;
    nul_in_run(&store).await;
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_origins() {
    let Some(store) = idem_tests::or_skip(
        "PostgreSQL",
        idem_core::PostgresStore::connect(&idem_tests::pg_url()).await,
    ) else {
        return;
    };
    // The run id's first 1,024 bytes, cut at a character (docs/design.md §5.1).
    let fits = |s: &str| {
        let mut end = s.len().min(1024);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_owned()
    };
    origins_round_trip(&store, fits).await;
    prefix_is_literal(&store).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_origins() {
    let Some(store) = idem_tests::or_skip(
        "Redis",
        idem_core::store::RedisStore::builder(idem_tests::redis_url())
            .prefix(idem_tests::redis_prefix())
            .open()
            .await,
    ) else {
        return;
    };
    origins_round_trip(&store, |s| s.to_owned()).await;
    prefix_is_literal(&store).await;
    nul_in_run(&store).await;
}
