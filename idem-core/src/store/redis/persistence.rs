//! Whether the Redis server keeps what it acknowledged across a restart, checked when the store
//! opens. Without an append-only file (`appendonly no`) a restarted Redis comes back with its
//! last RDB snapshot, or empty without snapshots (`save ""`): the records and fence counters
//! written since are gone, so a completed call runs again and a `never` tool's record in flight
//! vanishes with its owner alive. The same kind of loss as a PostgreSQL with
//! `synchronous_commit = off`, and as there the window is a crash's or a restart's and the setting
//! may be deliberate (a local server, a replica set that fails over instead of restarting): a
//! warning, not a refusal. Nothing is said when the server will not answer `INFO persistence`;
//! the eviction check has already refused or accepted such a server.

use super::eviction::{Answer, answers};
use super::route::Conn;

/// Whether an `INFO persistence` text says the append-only file is on; `None` without the field.
fn aof_enabled(info: &str) -> Option<bool> {
    match super::eviction::info_field(info, "aof_enabled")? {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// Logs a warning for each server of `conn` (`at`: their address) that keeps no append-only file.
pub(super) async fn warn_if_not_durable(conn: &Conn, at: &str) {
    let Ok(reply) = conn.command(redis::cmd("INFO").arg("persistence")).await else { return };
    let mut servers = Vec::new();
    answers(&reply, at, &mut servers);
    for (node, answer) in servers {
        if let Answer::Info(text) = answer
            && aof_enabled(&text) == Some(false)
        {
            tracing::warn!(
                redis = %node,
                appendonly = "no",
                "Redis keeps no append-only file: a restart loses every record written since its \
                 last RDB snapshot (all of them without snapshots), and a call whose record was \
                 lost can run the tool again; set appendonly yes (appendfsync everysec loses at \
                 most about a second)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_whether_the_append_only_file_is_on() {
        let info =
            "# Persistence\r\nloading:0\r\nrdb_changes_since_last_save:3\r\naof_enabled:0\r\n";
        assert_eq!(aof_enabled(info), Some(false));
        assert_eq!(aof_enabled("aof_enabled:1\n"), Some(true));
        assert_eq!(aof_enabled("loading:0\n"), None);
        assert_eq!(aof_enabled("aof_enabled:yes\n"), None);
    }
}
