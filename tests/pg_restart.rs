//! A private PostgreSQL cluster (`initdb` on a free port) restarted (`pg_ctl restart -m fast`)
//! while a call's tool runs: the tool's completion, sent after the restart, is stored on a new
//! connection, the call gets its output, a later call replays it, fresh calls are served, and no
//! tool runs twice. Skipped when `initdb` cannot run here, a failure under `CI=true`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use idem_core::{Idem, PostgresStore, tool};
use idem_tests::servers::{as_pg_user, free_port, on_free_port, temp_dir};
use idem_tests::{Never, or_skip};
use tokio::sync::{Notify, Semaphore};

static RAN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// The tool says it started, then waits until the test lets it finish (after the restart).
static STARTED: Notify = Notify::const_new();
static FINISH: Semaphore = Semaphore::const_new(0);

#[tool(retry = "keyed")]
async fn held(n: u32) -> Result<u32, Never> {
    RAN.lock().unwrap().push(n);
    if n < 100 {
        STARTED.notify_one();
        FINISH.acquire().await.expect("open").forget();
    }
    Ok(n + 1)
}

/// Runs `pg_ctl` on the cluster in `dir`.
fn pg_ctl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let status = as_pg_user("pg_ctl")
        .args(["-w", "-l"])
        .arg(dir.join("log"))
        .arg("-D")
        .arg(dir.join("data"))
        .args(args)
        .status()
        .map_err(|e| format!("pg_ctl: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("pg_ctl {args:?}: {status}")) }
}

/// A private cluster: its directory and connection string.
fn start() -> Result<(PathBuf, String), String> {
    let dir = temp_dir("pg-restart");
    let chown = std::process::Command::new("chown").args(["-R", "postgres"]).arg(&dir).status();
    if chown.is_err() {
        return Err("chown".into());
    }
    let initdb = as_pg_user("initdb")
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
        .arg(dir.join("data"))
        .output()
        .map_err(|e| format!("initdb: {e}"))?;
    if !initdb.status.success() {
        return Err(format!("initdb: {}", String::from_utf8_lossy(&initdb.stderr)));
    }
    let conf = format!(
        "listen_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nfsync = off\n",
        dir.display()
    );
    let config = dir.join("data/postgresql.conf");
    let mut text = std::fs::read_to_string(&config).unwrap_or_default();
    text.push_str(&conf);
    // `pg_ctl -w` fails when the server exits, as it does when its port is taken meanwhile.
    let port = on_free_port(free_port, |port| {
        std::fs::write(&config, format!("{text}port = {port}\n")).map_err(|e| e.to_string())?;
        pg_ctl(&dir, &["start"])?;
        Ok(port)
    })?;
    Ok((dir, format!("host=127.0.0.1 port={port} user=postgres dbname=postgres")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_a_tool_runs() {
    let Some((dir, url)) = or_skip("private PostgreSQL", start()) else { return };
    let store = PostgresStore::connect(&url).await.expect("store");
    let run = Arc::new(Idem::builder(store).build().run("restart"));
    for n in 1..4u32 {
        let call = tokio::spawn({
            let run = Arc::clone(&run);
            async move { held(&run, n).await }
        });
        STARTED.notified().await;
        let restart = dir.clone();
        tokio::task::spawn_blocking(move || pg_ctl(&restart, &["-m", "fast", "restart"]))
            .await
            .expect("task")
            .expect("restart");
        FINISH.add_permits(1);
        assert_eq!(call.await.expect("task").expect("the call across a restart"), n + 1);
        assert_eq!(held(&run, n).await.expect("replay"), n + 1);
        assert_eq!(held(&run, 100 + n).await.expect("a fresh call"), 101 + n);
    }
    assert_eq!(*RAN.lock().unwrap(), [1, 101, 2, 102, 3, 103], "each tool ran once");
    let _ = pg_ctl(&dir, &["-m", "immediate", "stop"]);
    let _ = std::fs::remove_dir_all(&dir);
}
