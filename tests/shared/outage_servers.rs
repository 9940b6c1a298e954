//! The store servers tests/outage.rs takes away and brings back: a private redis-server it
//! crashes, hangs and restarts, and a TCP proxy in front of PostgreSQL it cuts and restores.

/// A private redis-server: a free port, its own directory, an fsync-always AOF.
#[cfg(feature = "redis")]
pub(super) struct Server {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

#[cfg(feature = "redis")]
impl Server {
    pub(super) fn start() -> Option<Server> {
        use idem_tests::servers::{free_port, on_free_port};
        let dir = idem_tests::workers::temp_dir("outage-redis");
        let mut server = Server { port: 0, dir, child: None };
        let started = on_free_port(free_port, |port| {
            server.port = port;
            server.spawn()
        });
        idem_tests::or_skip("redis-server (the binary, for a private server)", started)?;
        Some(server)
    }
    /// Starts the server on its port, again after a crash; returns once it accepts connections.
    pub(super) fn spawn(&mut self) -> Result<(), String> {
        let mut cmd = std::process::Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&self.dir);
        self.child = Some(idem_tests::servers::spawn_redis(&mut cmd, &self.dir.join("log"))?);
        Ok(())
    }
    pub(super) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
    pub(super) fn port(&self) -> u16 {
        self.port
    }
    pub(super) fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    pub(super) fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            let _ = std::process::Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(child.id().to_string())
                .status();
        }
    }
}

#[cfg(feature = "redis")]
impl Drop for Server {
    fn drop(&mut self) {
        self.signal("CONT");
        self.crash();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy in front of PostgreSQL that the test can cut and restore.
#[cfg(feature = "postgres")]
pub(super) struct Proxy(idem_tests::proxy::Proxy);

#[cfg(feature = "postgres")]
impl Proxy {
    pub(super) async fn start() -> Option<Proxy> {
        // Only when the server answers: otherwise skip (or fail under CI).
        let url = idem_tests::pg_url();
        idem_tests::or_skip("PostgreSQL", idem_core::PostgresStore::connect(&url).await)?;
        Some(Proxy(idem_tests::proxy::Proxy::start(super::pg::target()).await))
    }

    /// The connection string of the server, through the proxy.
    pub(super) fn conninfo(&self) -> String {
        super::pg::through(self.0.port())
    }

    pub(super) fn cut(&self) {
        self.0.cut();
    }

    pub(super) fn restore(&self) {
        self.0.restore();
    }

    /// Open connections go silent (see `idem_tests::proxy::Proxy::stall`); new ones pass.
    pub(super) fn stall(&self) {
        self.0.stall();
    }
}
