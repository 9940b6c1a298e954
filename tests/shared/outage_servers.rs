//! The store servers tests/outage.rs takes away and brings back: a private redis-server it
//! crashes, hangs and restarts, and a TCP proxy in front of PostgreSQL it cuts and restores.

#[cfg(feature = "redis")]
use std::time::Duration;

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
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let dir = idem_tests::workers::temp_dir("outage-redis");
        let mut server = Server { port, dir, child: None };
        let started = server.spawn();
        idem_tests::or_skip("redis-server (the binary, for a private server)", started)?;
        Some(server)
    }
    pub(super) fn spawn(&mut self) -> Result<(), String> {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        self.child = Some(child);
        // Wait until it answers.
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("redis-server did not start".into())
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
