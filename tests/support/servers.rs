//! Private servers for the managed-database tests: a CA and certificates made by `openssl`, a
//! PostgreSQL cluster made by `initdb` with TLS on, and a `redis-server` with a TLS port. Each
//! runs on a free loopback port in its own temporary directory, and is stopped (and its directory
//! removed) when the test process ends: a small shell watchdog waits for the process to exit, so
//! a server shared by every test of a binary does not outlive it.
//!
//! Only the standard library and the tools named: the store benches include this file too
//! (`idem-core/benches/stores/tls.rs`), to start the same servers.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A fresh temporary directory (`idem-<tag>-<pid>-<ns>` under the system's).
pub fn temp_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("idem-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// Runs a command; its stderr on failure.
fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// Runs `stop` (a shell script) once this process has exited.
pub(crate) fn stop_at_exit(stop: &str) -> Result<(), String> {
    let script = "while kill -0 \"$0\" 2>/dev/null; do sleep 0.3; done; eval \"$1\"";
    Command::new("sh")
        .args(["-c", script, &std::process::id().to_string(), stop])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|e| format!("watchdog: {e}"))
}

/// Starts a server on a port that was free a moment before, on another port when it cannot
/// have that one: between `pick` and the server's bind, the port can go to another test's server
/// or to a client's ephemeral socket. `start` fails when the server did not start; 3 ports at
/// most are tried.
pub fn on_free_port<T>(
    pick: impl Fn() -> Result<u16, String>,
    mut start: impl FnMut(u16) -> Result<T, String>,
) -> Result<T, String> {
    let mut failures = Vec::new();
    for _ in 0..3 {
        let port = pick()?;
        match start(port) {
            Ok(started) => return Ok(started),
            Err(e) => failures.push(format!("on port {port}: {e}")),
        }
    }
    Err(failures.join("; "))
}

/// Spawns `redis-server` (`cmd`, its options given) logging to `log`, stopped when this process
/// exits, and waits until the log says it accepts connections, which it writes only once it
/// holds all its ports. An error with the log's end when it exits first (a port taken) or is
/// silent for 10 s. A port that answers proves nothing: it may be another server's.
pub fn spawn_redis(cmd: &mut Command, log: &Path) -> Result<std::process::Child, String> {
    // A restarted server appends to the log of its earlier life: only what follows counts.
    let from = std::fs::metadata(log).map(|m| m.len() as usize).unwrap_or(0);
    let mut child = cmd
        .arg("--logfile")
        .arg(log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("redis-server: {e}"))?;
    // Only while that pid is still a redis-server: a server stopped earlier (a test's crash)
    // gives its pid back to the system.
    let pid = child.id();
    stop_at_exit(&format!(
        "grep -qa redis-server /proc/{pid}/cmdline 2>/dev/null && kill -9 {pid} 2>/dev/null"
    ))?;
    let said = || {
        let text = std::fs::read(log).unwrap_or_default();
        String::from_utf8_lossy(text.get(from..).unwrap_or_default()).into_owned()
    };
    let tail = |text: &str| text.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
    for _ in 0..200 {
        let text = said();
        if text.contains("Ready to accept connections") {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server exited ({status}): {}", tail(&said())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!("redis-server did not accept connections within 10 s: {}", tail(&said())))
}

pub(crate) fn wait_for_port(port: u16, what: &str) -> Result<(), String> {
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{what} did not open port {port}"))
}

/// A test CA, a server certificate it signed (for `db.idem.test` and 127.0.0.1; for client
/// authentication too, as the nodes of a TLS Redis Cluster present it to each other), and a
/// second CA that signed nothing here (the wrong CA).
pub struct Certs {
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl Certs {
    /// `redis-server` options serving these certificates, without client certificates.
    pub fn redis_server_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        for (option, path) in [
            ("--tls-cert-file", &self.server_cert),
            ("--tls-key-file", &self.server_key),
            ("--tls-ca-cert-file", &self.ca),
        ] {
            args.push(option.into());
            args.push(path.into());
        }
        args.extend(["--tls-auth-clients".into(), "no".into()]);
        args
    }

    /// The host name the server certificate is valid for (besides 127.0.0.1).
    pub const HOST: &'static str = "db.idem.test";

    pub fn make(dir: &Path) -> Result<Certs, String> {
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        for name in ["ca", "other-ca"] {
            run(Command::new("openssl")
                .args(["req", "-x509", "-days", "2", "-subj"])
                .arg(format!("/CN=idem test {name}"))
                .args(ec)
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
                .arg("-keyout")
                .arg(dir.join(format!("{name}.key")))
                .arg("-out")
                .arg(dir.join(format!("{name}.pem"))))?;
        }
        run(Command::new("openssl")
            .args(["req", "-subj"])
            .arg(format!("/CN={}", Self::HOST))
            .args(ec)
            .arg("-keyout")
            .arg(dir.join("server.key"))
            .arg("-out")
            .arg(dir.join("server.csr")))?;
        let ext = dir.join("server.ext");
        std::fs::write(
            &ext,
            format!(
                "subjectAltName=DNS:{},IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
                 keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
                Self::HOST
            ),
        )
        .map_err(|e| e.to_string())?;
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in"])
            .arg(dir.join("server.csr"))
            .arg("-CA")
            .arg(dir.join("ca.pem"))
            .arg("-CAkey")
            .arg(dir.join("ca.key"))
            .args(["-set_serial", "2", "-extfile"])
            .arg(&ext)
            .arg("-out")
            .arg(dir.join("server.pem")))?;
        Ok(Certs {
            ca: dir.join("ca.pem"),
            other_ca: dir.join("other-ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
        })
    }
}

/// The directory holding PostgreSQL's server binaries (`initdb`, `pg_ctl`): the newest under
/// /usr/lib/postgresql, else the PATH.
fn pg_bin(tool: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path().join("bin"))).collect())
        .unwrap_or_default();
    versions.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    match versions.last() {
        Some(dir) if dir.join(tool).exists() => dir.join(tool),
        _ => PathBuf::from(tool),
    }
}

/// Where `program` is installed: in one of `dirs`, or else on the PATH.
fn installed(program: &str, dirs: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    dirs.iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// PostgreSQL refuses to run as root: as root, its tools run as the `postgres` user.
pub fn as_pg_user(tool: &str) -> Command {
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(pg_bin(tool));
        cmd
    } else {
        Command::new(pg_bin(tool))
    }
}

/// A private PostgreSQL cluster on a free loopback port, with the `pg_hba.conf` lines given (a
/// `local all all trust` line first, for the superuser's set-up over the socket).
pub struct PgPrivate {
    pub port: u16,
    pub dir: PathBuf,
}

impl PgPrivate {
    /// `conf`: lines added to postgresql.conf (`listen_addresses`, the port, the socket's
    /// directory, `fsync = off` and `max_connections = 200` are set); `hba`: its TCP lines.
    /// `setup`: SQL the superuser runs once it is up (roles, passwords).
    pub fn start(tag: &str, conf: &str, hba: &str, setup: &str) -> Result<PgPrivate, String> {
        let dir = temp_dir(tag);
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        Self::start_in(dir, &data, conf, hba, setup)
    }

    fn start_in(
        dir: PathBuf,
        data: &Path,
        conf: &str,
        hba: &str,
        setup: &str,
    ) -> Result<PgPrivate, String> {
        if is_root() {
            run(Command::new("chown").args(["-R", "postgres"]).arg(&dir))?;
        }
        run(as_pg_user("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "-D"])
            .arg(data))?;
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nmax_connections = 200\n{conf}",
            dir.display(),
        );
        append(&data.join("postgresql.conf"), &conf)?;
        std::fs::write(data.join("pg_hba.conf"), format!("local all all trust\n{hba}"))
            .map_err(|e| e.to_string())?;
        // `pg_ctl -w` fails when the server exits, as it does when its port is taken. The last
        // `port` line of the file counts.
        let port = on_free_port(free_port, |port| {
            append(&data.join("postgresql.conf"), &format!("port = {port}\n"))?;
            run(as_pg_user("pg_ctl")
                .args(["-w", "-l"])
                .arg(dir.join("log"))
                .arg("-D")
                .arg(data)
                .arg("start"))?;
            Ok(port)
        })
        .map_err(|e| format!("PostgreSQL did not start: {e}"))?;
        let stop = format!(
            "{} stop -m immediate -D '{}'; rm -rf '{}'",
            if is_root() {
                format!("runuser -u postgres -- '{}'", pg_bin("pg_ctl").display())
            } else {
                format!("'{}'", pg_bin("pg_ctl").display())
            },
            data.display(),
            dir.display()
        );
        stop_at_exit(&stop)?;
        wait_for_port(port, "PostgreSQL")?;
        if !setup.is_empty() {
            run(as_pg_user("psql")
                .args(["-q", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-h"])
                .arg(&dir)
                .args(["-p", &port.to_string(), "-d", "postgres", "-c", setup]))?;
        }
        Ok(PgPrivate { port, dir })
    }
}

/// A private PostgreSQL cluster on 127.0.0.1 with `ssl=on` and the test certificates, trust
/// authentication, and only `hostssl` lines for TCP (a plaintext connection is refused).
pub struct PgTls {
    pub port: u16,
    pub certs: Certs,
}

impl PgTls {
    pub fn start() -> Result<PgTls, String> {
        let dir = temp_dir("pg-tls");
        let data = dir.join("data");
        let certs = Certs::make(&dir)?;
        let conf = format!(
            "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            certs.server_cert.display(),
            certs.server_key.display()
        );
        let hba = "hostssl all all 127.0.0.1/32 trust\n";
        let server = PgPrivate::start_in(dir, &data, &conf, hba, "")?;
        Ok(PgTls { port: server.port, certs })
    }

    /// A connection string with `extra` options (`sslmode=…`).
    pub fn conninfo(&self, extra: &str) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres {extra}", self.port)
    }
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).map_err(|e| e.to_string())?;
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())
}

/// A private `redis-server` that serves only TLS (`--port 0 --tls-port`), with the test
/// certificates and no client certificates required.
pub struct RedisTls {
    pub port: u16,
    pub certs: Certs,
}

impl RedisTls {
    pub fn start() -> Result<RedisTls, String> {
        let dir = temp_dir("redis-tls");
        let certs = Certs::make(&dir)?;
        let port = start_redis(&dir, "redis-server (TLS)", |port| {
            let mut args: Vec<std::ffi::OsString> =
                ["--port", "0", "--tls-port", &port.to_string()].map(Into::into).into();
            args.extend(certs.redis_server_args());
            args
        })?;
        Ok(RedisTls { port, certs })
    }

    /// The `rediss://` URL checked against `ca`.
    pub fn url(&self, ca: &Path) -> String {
        format!("rediss://127.0.0.1:{}/?ca={}", self.port, ca.display())
    }
}

/// Starts a `redis-server` on loopback on a free port, with the arguments `args` makes for that
/// port, no persistence, its files in `dir`; stopped, and `dir` removed, when this process
/// exits. Its port.
fn start_redis(
    dir: &Path,
    what: &str,
    args: impl Fn(u16) -> Vec<std::ffi::OsString>,
) -> Result<u16, String> {
    let port = on_free_port(free_port, |port| {
        let mut cmd = Command::new("redis-server");
        cmd.args(args(port))
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"])
            .arg(dir);
        spawn_redis(&mut cmd, &dir.join(format!("redis-{port}.log")))?;
        Ok(port)
    })
    .map_err(|e| format!("{what} did not start: {e}"))?;
    stop_at_exit(&format!("sleep 0.5; rm -rf '{}'", dir.display()))?;
    Ok(port)
}

/// A private plain `redis-server` started with extra options (e.g. a memory limit and an
/// eviction policy the shared server must not be given).
pub struct RedisPrivate {
    pub port: u16,
}

impl RedisPrivate {
    pub fn start(tag: &str, options: &[&str]) -> Result<RedisPrivate, String> {
        let dir = temp_dir(tag);
        let port = start_redis(&dir, "redis-server", |port| {
            let mut args: Vec<std::ffi::OsString> =
                ["--port", &port.to_string()].map(Into::into).into();
            args.extend(options.iter().map(Into::into));
            args
        })?;
        Ok(RedisPrivate { port })
    }

    pub fn url(&self, query: &str) -> String {
        format!("redis://127.0.0.1:{}/{query}", self.port)
    }
}

/// A private PgBouncer (the `pgbouncer` package) in transaction mode on a free loopback port, in
/// front of an existing PostgreSQL: every transaction may run on another server connection, so
/// named prepared statements and `LISTEN` do not carry over. Trust authentication; run as the
/// `postgres` user when the test runs as root (PgBouncer refuses root).
pub struct PgBouncer {
    pub port: u16,
    /// The database name clients connect to (the upstream's).
    pub dbname: String,
    pub user: String,
}

impl PgBouncer {
    /// Starts PgBouncer in front of the PostgreSQL at `host:port`, database `dbname`, as `user`.
    pub fn start(host: &str, port: u16, dbname: &str, user: &str) -> Result<PgBouncer, String> {
        // Found here, not by `runuser`: as root it searches root's PATH as the postgres user, and
        // a directory in it that user cannot enter (`/root/.cargo/bin`) turns "not installed"
        // into "Permission denied".
        let bin = installed("pgbouncer", &["/usr/sbin", "/usr/bin"])
            .ok_or("pgbouncer is not installed (install the pgbouncer package; .ci/run does)")?;
        let dir = temp_dir("pgbouncer");
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n"))
            .map_err(|e| e.to_string())?;
        if is_root() {
            run(Command::new("chown").args(["-R", "postgres"]).arg(&dir))?;
        }
        // Later than the watchdogs below, which read their pid files in this directory.
        stop_at_exit(&format!("sleep 2; rm -rf '{}'", dir.display()))?;
        let listen = on_free_port(free_port, |listen| {
            let ini = dir.join(format!("pgbouncer-{listen}.ini"));
            let pid = dir.join(format!("pgbouncer-{listen}.pid"));
            let log = dir.join(format!("pgbouncer-{listen}.log"));
            // server_reset_query is not used in transaction mode; ignore_startup_parameters lets
            // clients that send extra_float_digits (many drivers do) connect.
            let conf = format!(
                "[databases]\n{dbname} = host={host} port={port} dbname={dbname} user={user}\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {users}\n\
                 pool_mode = transaction\nmax_client_conn = 500\ndefault_pool_size = 10\n\
                 logfile = {log}\npidfile = {pid}\n\
                 ignore_startup_parameters = extra_float_digits\n",
                users = dir.join("users.txt").display(),
                log = log.display(),
                pid = pid.display(),
            );
            std::fs::write(&ini, conf).map_err(|e| e.to_string())?;
            let mut cmd = if is_root() {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", "postgres", "--"]).arg(&bin);
                cmd
            } else {
                Command::new(&bin)
            };
            run(cmd.arg("-d").arg(&ini))
                .map_err(|e| format!("{e} (is the pgbouncer package installed?)"))?;
            stop_at_exit(&format!("kill $(cat '{}' 2>/dev/null) 2>/dev/null", pid.display()))?;
            // It forks before it binds: only its log says whether it got the port.
            let listening = format!("listening on 127.0.0.1:{listen}");
            for _ in 0..200 {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains(&listening) {
                    return Ok(listen);
                }
                if let Some(fatal) = text.lines().find(|l| l.contains("FATAL")) {
                    return Err(format!("pgbouncer: {fatal}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err("pgbouncer did not say it listens within 10 s".to_owned())
        })?;
        Ok(PgBouncer { port: listen, dbname: dbname.to_owned(), user: user.to_owned() })
    }

    /// A connection string through PgBouncer with `extra` options (`pgbouncer=true`).
    pub fn conninfo(&self, extra: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname={} sslmode=disable {extra}",
            self.port, self.user, self.dbname
        )
    }
}
