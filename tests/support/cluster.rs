//! A private Redis Cluster for tests: 3 masters and 3 replicas (`redis-server --cluster-enabled
//! yes`, joined by `redis-cli --cluster create --cluster-replicas 1`) on free loopback ports in a
//! temporary directory, with a short node timeout so failovers take about two seconds. The test
//! can kill, stop and resume nodes, read the topology, and migrate a slot by hand. Every node is
//! killed and the directory removed when the test process ends.
//!
//! `Cluster::start_tls` starts 3 masters that serve only TLS (`--port 0 --tls-port`), with TLS
//! on the cluster bus too (`--tls-cluster yes`), and the certificates of `servers::Certs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::servers::{Certs, free_port, on_free_port, spawn_redis, stop_at_exit};

/// How long a node may be unreachable before the others mark it failed (ms).
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// One node as `CLUSTER NODES` shows it.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Whether the cluster marks it failed.
    pub failed: bool,
    /// Slot ranges it serves (inclusive), for a master.
    pub slots: Vec<(u16, u16)>,
}

impl NodeInfo {
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// A running cluster. Nodes killed by the test stay dead.
pub struct Cluster {
    pub ports: Vec<u16>,
    dir: PathBuf,
    children: Mutex<Vec<Option<Child>>>,
    /// The certificates of a TLS-only cluster.
    pub tls: Option<Certs>,
}

/// `redis-cli`'s arguments to reach a node: its port, and TLS with the test CA.
fn cli_args(port: u16, tls: Option<&Certs>) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec!["-h".into(), "127.0.0.1".into()];
    args.extend(["-p".into(), port.to_string().into()]);
    if let Some(certs) = tls {
        args.extend(["--tls".into(), "--cacert".into(), certs.ca.clone().into_os_string()]);
    }
    args
}

/// Starts the node on `port` with its files in `dir/<port>` (its `nodes.conf` survives a kill,
/// so a restarted node rejoins with its identity); returns once it accepts connections, an error
/// when it cannot have its port or its bus port.
fn spawn_node(dir: &Path, port: u16, tls: Option<&Certs>) -> Result<Child, String> {
    let node_dir = dir.join(port.to_string());
    std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
    let mut cmd = Command::new("redis-server");
    match tls {
        None => cmd.args(["--port", &port.to_string()]),
        // Clients, the cluster bus and replication all over TLS; no client certificates.
        Some(certs) => cmd
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
            .args(certs.redis_server_args()),
    };
    cmd.args(["--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
        // A replica may take over however long ago it last heard from its master (the tests
        // decide what it missed), and replicas stay where they are.
        .args(["--cluster-replica-validity-factor", "0", "--repl-ping-replica-period", "1"])
        .args(["--cluster-allow-replica-migration", "no"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&node_dir);
    spawn_redis(&mut cmd, &node_dir.join("log"))
}

/// A free port whose cluster bus port (10000 above it) is free and valid too.
fn bus_port_free() -> Result<u16, String> {
    for _ in 0..100 {
        let port = free_port()?;
        if port <= 55535 && std::net::TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port with a free cluster bus port".to_owned())
}

impl Cluster {
    /// Starts 6 nodes and joins them: 3 masters, each with one replica.
    pub fn start(tag: &str) -> Result<Cluster, String> {
        Self::start_with(tag, 1, false)
    }

    /// Starts 3 masters without replicas (plain TCP).
    pub fn start_masters(tag: &str) -> Result<Cluster, String> {
        Self::start_with(tag, 0, false)
    }

    /// Starts 3 masters without replicas that serve only TLS (the cluster bus too), with
    /// certificates made in the cluster's directory.
    pub fn start_tls(tag: &str) -> Result<Cluster, String> {
        Self::start_with(tag, 0, true)
    }

    fn start_with(tag: &str, replicas: usize, tls: bool) -> Result<Cluster, String> {
        let dir = crate::workers::temp_dir(tag);
        // Runs after the nodes' own watchdogs (registered later, so they kill first).
        stop_at_exit(&format!("sleep 1; rm -rf '{}'", dir.display()))?;
        let tls = if tls { Some(Certs::make(&dir)?) } else { None };
        let mut ports = Vec::new();
        let mut children = Vec::new();
        for _ in 0..3 * (1 + replicas) {
            let (port, child) = on_free_port(bus_port_free, |port| {
                Ok((port, spawn_node(&dir, port, tls.as_ref())?))
            })
            .map_err(|e| format!("a cluster node did not start: {e}"))?;
            children.push(Some(child));
            ports.push(port);
        }
        // Bounded: redis-cli waits for the nodes to agree with no end of its own.
        let mut create = Command::new("timeout");
        create.args(["60", "redis-cli"]);
        if let Some(certs) = &tls {
            create.arg("--tls").arg("--cacert").arg(&certs.ca);
        }
        create.args(["--cluster", "create"]);
        for port in &ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = create.stdin(Stdio::null()).output().map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let cluster = Cluster { ports, dir, children: Mutex::new(children), tls };
        cluster.wait_healthy(3, 3 * replicas, Duration::from_secs(30))?;
        cluster.wait_replicated(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Waits until every live replica's link to its master is up (its first sync is done).
    pub fn wait_replicated(&self, max: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let mut pending = Vec::new();
            for node in self.nodes()?.iter().filter(|n| !n.master && !n.failed) {
                let info = self.cli(node.port, &["INFO", "replication"])?;
                if !info.contains("master_link_status:up") {
                    pending.push(node.port);
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if start.elapsed() > max {
                return Err(format!("replicas {pending:?} did not sync in {max:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The store URL of the cluster: every node listed, then `query` (e.g. `?wait_replicas=1`;
    /// on a TLS cluster, `?ca=…`).
    pub fn url(&self, query: &str) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let scheme = if self.tls.is_some() { "rediss+cluster" } else { "redis+cluster" };
        format!("{scheme}://{}/{query}", nodes.join(","))
    }

    fn index(&self, port: u16) -> usize {
        self.ports.iter().position(|&p| p == port).expect("a node of this cluster")
    }

    /// Runs `redis-cli -p port args…`; its stdout.
    pub fn cli(&self, port: u16, args: &[&str]) -> Result<String, String> {
        let out = Command::new("redis-cli")
            .args(cli_args(port, self.tls.as_ref()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || text.starts_with("ERR") || text.starts_with("(error)") {
            return Err(format!("redis-cli -p {port} {args:?}: {text}"));
        }
        Ok(text)
    }

    /// The last lines of the node's log (for failure messages).
    pub fn log(&self, port: u16) -> String {
        let text = std::fs::read_to_string(self.dir.join(port.to_string()).join("log"))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&self, port: u16) {
        let i = self.index(port);
        if let Some(mut child) = lock(&self.children)[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed node again (it rejoins, as a replica if it was failed over).
    pub fn restart(&self, port: u16) -> Result<(), String> {
        let i = self.index(port);
        let child = spawn_node(&self.dir, port, self.tls.as_ref())?;
        lock(&self.children)[i] = Some(child);
        Ok(())
    }

    fn signal(&self, port: u16, signal: &str) {
        let i = self.index(port);
        if let Some(child) = &lock(&self.children)[i] {
            let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
        }
    }

    /// SIGSTOPs the node on `port` (it keeps its sockets, answers nothing).
    pub fn stop(&self, port: u16) {
        self.signal(port, "-STOP");
    }

    /// SIGCONTs a stopped node.
    pub fn resume(&self, port: u16) {
        self.signal(port, "-CONT");
    }

    fn alive(&self) -> Vec<u16> {
        let children = lock(&self.children);
        self.ports
            .iter()
            .zip(children.iter())
            .filter(|(_, c)| c.is_some())
            .map(|(p, _)| *p)
            .collect()
    }

    /// The topology as a live node sees it.
    pub fn nodes(&self) -> Result<Vec<NodeInfo>, String> {
        let mut last = String::new();
        for port in self.alive() {
            match self.cli(port, &["CLUSTER", "NODES"]) {
                Ok(text) => return Ok(parse_nodes(&text)),
                Err(e) => last = e,
            }
        }
        Err(format!("no live node answered CLUSTER NODES: {last}"))
    }

    /// The master serving `slot`.
    pub fn master_of(&self, slot: u16) -> Result<NodeInfo, String> {
        let nodes = self.nodes()?;
        nodes
            .into_iter()
            .find(|n| n.master && !n.failed && n.serves(slot))
            .ok_or_else(|| format!("no master serves slot {slot}"))
    }

    /// The replica of the master `id`.
    pub fn replica_of(&self, id: &str) -> Result<NodeInfo, String> {
        let nodes = self.nodes()?;
        nodes
            .into_iter()
            .find(|n| !n.failed && n.master_id.as_deref() == Some(id))
            .ok_or_else(|| format!("master {id} has no replica"))
    }

    /// Waits until every live node says `cluster_state:ok` and sees `masters` healthy masters
    /// that serve all 16384 slots between them, and `replicas` healthy replicas.
    pub fn wait_healthy(
        &self,
        masters: usize,
        replicas: usize,
        max: Duration,
    ) -> Result<(), String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < max {
            match self.healthy(masters, replicas) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("the cluster did not become healthy in {max:?}: {last}"))
    }

    fn healthy(&self, masters: usize, replicas: usize) -> Result<(), String> {
        for port in self.alive() {
            let info = self.cli(port, &["CLUSTER", "INFO"])?;
            if !info.contains("cluster_state:ok") {
                return Err(format!("node {port}: {info}"));
            }
            let nodes = parse_nodes(&self.cli(port, &["CLUSTER", "NODES"])?);
            let serving: Vec<&NodeInfo> =
                nodes.iter().filter(|n| n.master && !n.failed && !n.slots.is_empty()).collect();
            let covered: u32 =
                serving.iter().flat_map(|n| &n.slots).map(|&(a, b)| u32::from(b - a) + 1).sum();
            let following = nodes.iter().filter(|n| !n.master && !n.failed).count();
            if serving.len() != masters || covered != 16384 || following != replicas {
                return Err(format!(
                    "node {port} sees {} masters covering {covered} slots and {following} replicas",
                    serving.len()
                ));
            }
        }
        Ok(())
    }

    /// Moves `slot` to the master `to` by hand, as `redis-cli --cluster reshard` does: IMPORTING
    /// and MIGRATING, then its keys one `MIGRATE` at a time with `pause` in between (so calls
    /// meet the slot half-moved: `ASK`, `TRYAGAIN`), then the new owner told to every master,
    /// the old owner first and the new owner last.
    /// Returns how many keys moved.
    pub fn migrate_slot(&self, slot: u16, to: &NodeInfo, pause: Duration) -> Result<usize, String> {
        let from = self.begin_migration(slot, to)?;
        self.end_migration(slot, &from, to, pause)
    }

    /// Starts moving `slot` to the master `to`: IMPORTING on `to`, then MIGRATING on the slot's
    /// master, which is returned. Keys move with `Cluster::move_key` or
    /// `Cluster::end_migration`.
    pub fn begin_migration(&self, slot: u16, to: &NodeInfo) -> Result<NodeInfo, String> {
        let from = self.master_of(slot)?;
        let s = slot.to_string();
        self.cli(to.port, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id])?;
        self.cli(from.port, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id])?;
        Ok(from)
    }

    /// Moves one key of a migrating slot from `from` to `to` (`MIGRATE`).
    pub fn move_key(&self, from: &NodeInfo, to: &NodeInfo, key: &str) -> Result<(), String> {
        let port = to.port.to_string();
        self.cli(from.port, &["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]).map(drop)
    }

    /// Ends a migration begun with `Cluster::begin_migration`: the keys left on `from` moved
    /// one at a time with `pause` in between, then the new owner told to every master. Returns
    /// how many keys it moved.
    pub fn end_migration(
        &self,
        slot: u16,
        from: &NodeInfo,
        to: &NodeInfo,
        pause: Duration,
    ) -> Result<usize, String> {
        let s = slot.to_string();
        let mut moved = 0;
        loop {
            let keys = self.cli(from.port, &["CLUSTER", "GETKEYSINSLOT", &s, "1"])?;
            let Some(key) = keys.lines().map(str::trim).find(|k| !k.is_empty()) else { break };
            self.move_key(from, to, key)?;
            moved += 1;
            std::thread::sleep(pause);
        }
        // The old owner first and the new one last: meanwhile each redirects to the other (the
        // old one says MOVED, the new one does not own the slot yet), which callers must ride out.
        let mut masters: Vec<NodeInfo> =
            self.nodes()?.into_iter().filter(|n| n.master && !n.failed).collect();
        masters.sort_by_key(|n| (n.id != from.id, n.id == to.id));
        for node in &masters {
            self.cli(node.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id])?;
        }
        Ok(moved)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        // `127.0.0.1:7000@17000[,hostname]`
        let port = f[1].split('@').next().and_then(|a| a.rsplit(':').next());
        let Some(port) = port.and_then(|p| p.parse().ok()) else { continue };
        let flags = f[2];
        let slots = f[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        out.push(NodeInfo {
            id: f[0].to_owned(),
            port,
            master: flags.contains("master"),
            master_id: (f[3] != "-").then(|| f[3].to_owned()),
            failed: flags.split(',').any(|f| f == "fail" || f == "noaddr"),
            slots,
        });
    }
    out
}

/// The Redis Cluster hash slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key.
pub fn slot(key: &str) -> u16 {
    let tagged = match (key.find('{'), key.find('}')) {
        (Some(open), Some(close)) if close > open + 1 => &key[open + 1..close],
        _ => key,
    };
    let mut crc: u16 = 0;
    for &b in tagged.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

/// Whether `redis-server` and `redis-cli` can be run.
pub fn available() -> Result<(), String> {
    for tool in ["redis-server", "redis-cli"] {
        Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("{tool}: {e}"))?;
    }
    Ok(())
}
