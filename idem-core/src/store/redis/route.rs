//! How the Redis store sends a script: to one server through a connection manager, or to a Redis
//! Cluster through the redis crate's async cluster client (`redis::cluster_async`).
//!
//! Scripts go as `EVALSHA`; a `NOSCRIPT` answer (the server ran nothing) sends the script's text
//! with `EVAL`, which runs it and caches it for the next `EVALSHA`. Not `SCRIPT LOAD` then
//! `EVALSHA` again: a cache emptied between the two (`SCRIPT FLUSH`, a failover onto a server
//! that never saw the script) would fail the step. (A user whose ACL refuses `EVAL` gets
//! `SCRIPT LOAD` and `EVALSHA` again.)
//!
//! # Redirections
//! The cluster client is built with no retries of its own: it would send a step again after an
//! I/O error without the resend flag of `store/resend.rs`, so a completion whose reply was lost
//! would come back `LeaseLost`. Whatever may have run comes back to the store, which resends it
//! flagged. What a node refused without running it is sent again here:
//! - `MOVED`: to the node it names (the client refreshes its slot map meanwhile);
//! - `ASK` (the slot is being migrated and the key is not here): to the importing node, after
//!   `ASKING`, on the same connection;
//! - `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY` (a failover under way), no connection
//!   to the node, or more than [`MAX_REDIRECTS`] redirections in a row (the nodes disagree about
//!   the slot while its new owner is named to each master in turn): to the slot's master again
//!   after a full-jitter pause, for [`REFUSED_FOR`] at most; then the refusal is the answer (the
//!   caller fails closed with `StoreUnavailable`, and nothing ran).
//!
//! `TRYAGAIN` lasts as long as the migration of a slot: a script names a record and its fence
//! counter, and while the slot moves a node runs a command on several keys only if it holds all
//! of them (Redis Cluster specification, "Multi-keys operations"). The old owner sends a script
//! whose keys are all gone to the new owner (`ASK`), which refuses it while one of them is missing
//! there: a fresh key, whose record and counter do not exist yet, or a record that has moved
//! ahead of its counter. So a claim of a new key in a moving slot waits for the migration's end,
//! and fails closed when the migration takes longer than [`REFUSED_FOR`] (or the caller's store
//! timeout): correct, as no node will run it, and the caller may retry.
//!
//! Every script names its record first, and every key it touches carries the record's hash tag,
//! so a script runs on one node, chosen by its first key's slot.
//!
//! # Replica acknowledgement
//! With [`Replicas`], the script and `WAIT count timeout` go as one pipeline on one connection to
//! one node, so the `WAIT` covers the script's writes (Redis counts the replicas that acknowledged
//! every write of the connection so far).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind, ToRedisArgs, Value,
};

use crate::clock::ms;

/// How long a send keeps trying while cluster nodes refuse it without running it. A slot being
/// migrated refuses a script on a record whose fence counter has not moved with it (`TRYAGAIN`)
/// until its last key has moved, and a failover refuses until a replica has been promoted. The
/// executor's `Policy::store_timeout` (5 s by default) bounds a step sooner.
pub(super) const REFUSED_FOR: Duration = Duration::from_secs(5);
/// The pauses in between: full jitter, up to 10 ms at first, doubling up to 250 ms.
const REFUSED_PAUSE: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(250));

/// Redirections followed in a row (with no refusal in between); more means the nodes disagree
/// about the slot.
const MAX_REDIRECTS: usize = 5;

/// After a write, wait until `count` replicas acknowledged it, for at most `timeout` (Redis
/// `WAIT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// How many replicas must acknowledge.
    pub count: u32,
    /// How long the server waits for them.
    pub timeout: Duration,
}

/// A Lua script with its text (for `EVAL`) and SHA-1 (for `EVALSHA`).
pub(super) struct Script {
    script: redis::Script,
    code: String,
}

impl Script {
    pub(super) fn new(code: &str) -> Self {
        Script { script: redis::Script::new(code), code: code.to_owned() }
    }

    /// An invocation to which keys and arguments are added.
    pub(super) fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            script: self,
            // Two keys of about a hundred bytes each (prefix, `{key}`, suffix).
            keys: Cmd::with_capacity(2, 256),
            args: Cmd::with_capacity(8, 256),
        }
    }
}

/// One call of a [`Script`]: its keys and arguments, each packed into one buffer as the redis
/// crate packs a command's (a [`Cmd`] used as a list of arguments): a completion adds two keys
/// and six arguments, which as a `Vec` each cost two allocations apiece.
pub(super) struct Invocation<'a> {
    script: &'a Script,
    keys: Cmd,
    args: Cmd,
}

impl Invocation<'_> {
    pub(super) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys.arg(key);
        self
    }

    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.arg(arg);
        self
    }

    /// The first key: the one whose slot a cluster routes the invocation by.
    fn first_key(&self) -> &[u8] {
        match self.keys.args_iter().next() {
            Some(redis::Arg::Simple(key)) => key,
            _ => &[],
        }
    }

    /// By the script's SHA-1 (`EVALSHA`), or with its text (`EVAL`, when the server's cache
    /// lacks it). Sized once: a first call builds one for its completion.
    fn command(&self, by_hash: bool) -> Cmd {
        let (name, body) = if by_hash {
            ("EVALSHA", self.script.script.get_hash())
        } else {
            ("EVAL", self.script.code.as_str())
        };
        let (keys, args) = (self.keys.args_iter(), self.args.args_iter());
        let size = |cmd: &Cmd| {
            cmd.args_iter()
                .map(|a| if let redis::Arg::Simple(a) = a { a.len() } else { 0 })
                .sum::<usize>()
        };
        let mut cmd = Cmd::with_capacity(
            3 + keys.len() + args.len(),
            32 + body.len() + size(&self.keys) + size(&self.args),
        );
        cmd.arg(name).arg(body).arg(keys.len());
        for arg in keys.chain(args) {
            if let redis::Arg::Simple(arg) = arg {
                cmd.arg(arg);
            }
        }
        cmd
    }

    fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.script.code);
        cmd
    }
}

/// The store's connection for commands: one server, or a cluster.
#[derive(Clone)]
pub(super) enum Conn {
    One(std::sync::Arc<One>),
    Cluster(std::sync::Arc<Cluster>),
}

/// The runtime a connection was made on, watched. The redis crate drives a connection (and
/// delivers its pub/sub messages) in tasks on that runtime, which end with it: a store kept in a
/// `static` and used by one `#[tokio::test]` runtime after another would find its connections
/// dead on the next one (each first command failing with "broken pipe", no pub/sub message
/// delivered), so a connection whose runtime ended is made again on the current one.
pub(super) struct MadeOn {
    /// A task on that runtime, alive until the connection is dropped (with the sender): it has
    /// finished before then only if its runtime ended. `None` until the connection is first
    /// used: a lazy `ConnectionManager` is made on the runtime that first sends on it, which need
    /// not be the one it was created on (`open_lazy`). A cluster connection starts its task when
    /// created, so it is watched from then (`here`).
    watch: Option<(tokio::task::JoinHandle<()>, tokio::sync::oneshot::Sender<()>)>,
}

impl MadeOn {
    /// A connection not used yet: the runtime of its first use is watched.
    pub(super) fn unused() -> MadeOn {
        MadeOn { watch: None }
    }

    /// The current runtime (a connection is made on one).
    pub(super) fn here() -> MadeOn {
        let (keep, kept) = tokio::sync::oneshot::channel::<()>();
        let watch = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let task = rt.spawn(async move {
                let _ = kept.await;
            });
            (task, keep)
        });
        MadeOn { watch }
    }

    /// Whether that runtime has ended, and the connection's tasks with it. Called before each
    /// use: the first one watches the current runtime, where the connection is then made.
    pub(super) fn ended(&mut self) -> bool {
        match &self.watch {
            Some((task, _)) => task.is_finished(),
            None => {
                *self = MadeOn::here();
                false
            }
        }
    }
}

/// A connection that is replaced by a new one rather than repaired, numbered by generation so
/// that a failure many commands saw replaces it once, with the runtime it runs on, so that one
/// whose runtime ended is made again before it is used. `make` gives a new connection and where
/// it is watched (`None`: it could not be made, and the current one is kept).
pub(super) struct Replaceable<C> {
    current: std::sync::Mutex<(u64, C, MadeOn)>,
}

impl<C: Clone> Replaceable<C> {
    pub(super) fn new(conn: C, made_on: MadeOn) -> Self {
        Replaceable { current: std::sync::Mutex::new((0, conn, made_on)) }
    }

    /// The current connection and its generation, made again first if its runtime has ended
    /// (and then `true`).
    pub(super) fn current(&self, make: impl FnOnce() -> Option<(C, MadeOn)>) -> (u64, C, bool) {
        let mut current = crate::sync::lock(&self.current);
        let ended = current.2.ended();
        if ended && let Some((conn, made_on)) = make() {
            *current = (current.0 + 1, conn, made_on);
        }
        (current.0, current.1.clone(), ended)
    }

    /// Replaces the connection of `generation`, unless that was done already; whether it was
    /// replaced now.
    pub(super) fn replace(
        &self,
        generation: u64,
        make: impl FnOnce() -> Option<(C, MadeOn)>,
    ) -> bool {
        let mut current = crate::sync::lock(&self.current);
        if current.0 != generation {
            return false;
        }
        let Some((conn, made_on)) = make() else { return false };
        *current = (generation + 1, conn, made_on);
        true
    }
}

/// A cluster's connection, replaced by a new one (every node connected again from the nodes
/// first listed) when a node does not answer within the response timeout: the cluster client
/// reconnects to a node only when its connection drops, and one that went silent (a NAT or load
/// balancer that forgot the flow, a node's address gone) is closed only by the kernel's
/// retransmission limit, about 15 minutes, while every step routed to it times out.
pub(super) struct Cluster {
    client: redis::cluster::ClusterClient,
    config: redis::cluster::ClusterConfig,
    current: Replaceable<ClusterConnection>,
}

impl Cluster {
    /// A connection that connects to the nodes in the background.
    pub(super) fn new(
        client: redis::cluster::ClusterClient,
        config: redis::cluster::ClusterConfig,
    ) -> Cluster {
        let conn = client.get_pending_async_connection_with_config(config.clone());
        Cluster { client, config, current: Replaceable::new(conn, MadeOn::here()) }
    }

    /// A new connection, which starts its tasks on the current runtime at once.
    fn make(&self) -> Option<(ClusterConnection, MadeOn)> {
        let conn = self.client.get_pending_async_connection_with_config(self.config.clone());
        Some((conn, MadeOn::here()))
    }

    /// The current connection (a clone shares it) and its generation; a new one first if the
    /// runtime it was made on has ended.
    pub(super) fn connection(&self) -> (u64, ClusterConnection) {
        let (generation, conn, _) = self.current.current(|| self.make());
        (generation, conn)
    }

    /// Notes the answer of a command sent on the connection of `generation`: after a response
    /// timeout, the next command goes on a new connection (once per generation). The timed-out
    /// command is sent again by its caller (`store/resend.rs`).
    pub(super) fn saw<T>(&self, generation: u64, answer: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &answer
            && e.is_timeout()
            && self.current.replace(generation, || self.make())
        {
            tracing::warn!(
                "a Redis Cluster node did not answer within the response timeout; connecting to \
                 the cluster again"
            );
        }
        answer
    }
}

/// What [`One::sent`] sends: a pipeline of `count` commands, or one command.
#[derive(Clone, Copy)]
enum Sending<'a> {
    Pipeline(&'a Pipeline, usize),
    One(&'a Cmd),
}

/// The replies of what [`One::sent`] sent.
enum Sent {
    Pipeline(Vec<Value>),
    One(Value),
}

impl Sent {
    /// The first reply, which says whether the server refused the writes.
    fn first(&self) -> Option<&Value> {
        match self {
            Sent::Pipeline(replies) => replies.first(),
            Sent::One(reply) => Some(reply),
        }
    }
}

/// One server's connection manager, replaced by a new connection when the server it reached
/// answers `READONLY` (a master demoted to a replica in a failover: Sentinel, a managed Redis
/// whose primary endpoint now names another node), or does not answer within the response
/// timeout (see [`One::saw`]). The manager reconnects only when its connection drops, and a
/// demoted master keeps it open, so without this every write would be refused until the process
/// restarted, while the address already leads to the new master.
pub(super) struct One {
    client: redis::Client,
    config: ConnectionManagerConfig,
    current: Replaceable<ConnectionManager>,
}

impl One {
    /// A manager that connects on first use (needs a tokio runtime).
    pub(super) fn new(client: redis::Client, config: ConnectionManagerConfig) -> RedisResult<One> {
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        Ok(One { client, config, current: Replaceable::new(manager, MadeOn::unused()) })
    }

    /// A new manager, which connects on the runtime of its first use (watched from then).
    fn make(&self) -> Option<(ConnectionManager, MadeOn)> {
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(manager) => Some((manager, MadeOn::unused())),
            Err(e) => {
                tracing::warn!(error = %e, "cannot replace the Redis connection");
                None
            }
        }
    }

    /// The current manager (a clone shares its connection) and its generation; a new one first
    /// if the runtime it was made on has ended.
    pub(super) fn manager(&self) -> (u64, ConnectionManager) {
        let (generation, manager, _) = self.current.current(|| self.make());
        (generation, manager)
    }

    /// The manager of `generation` reached a server that refuses writes, or its connection
    /// went silent (`why`): the next command connects again (once per generation, however many
    /// commands saw it).
    fn reconnect(&self, generation: u64, why: &str) {
        if self.current.replace(generation, || self.make()) {
            tracing::warn!("{why}; connecting to Redis again");
        }
    }

    /// Notes the answer of a command sent on the manager of `generation`. A response timeout
    /// replaces the connection: one that went silent (a NAT or load balancer that forgot the
    /// flow, a server address gone in a failover) is not closed by anything but the kernel's
    /// retransmission limit, about 15 minutes, and the manager reconnects only when a connection
    /// drops, so every command would time out until then. The timed-out command is sent again by
    /// its caller (`store/resend.rs`), on the new connection.
    ///
    /// Any other error that is not an I/O error also replaces the manager: the server's replies
    /// to commands come back as values, so such an error is the manager's own, and the one it
    /// keeps for good is a connection whose setup the server refused (a `SELECT` answered
    /// `BUSY` while another client's script ran, a password refused while it was being
    /// rotated): the manager reconnects only after an I/O error, and would answer every later
    /// command with that refusal until the process restarted.
    pub(super) fn saw<T>(&self, generation: u64, answer: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &answer {
            if e.is_timeout() {
                self.reconnect(generation, "Redis did not answer within the response timeout");
            } else if !e.is_io_error() {
                self.reconnect(generation, "the Redis connection failed outside any command");
            }
        }
        answer
    }

    /// Sends `pipe` (`count` commands); while the first reply is `READONLY` (nothing ran),
    /// connects again and sends it again after a full-jitter pause, for [`REFUSED_FOR`] at
    /// most; then the refusal is the answer.
    async fn send(&self, pipe: &Pipeline, count: usize) -> RedisResult<Vec<Value>> {
        match self.sent(Sending::Pipeline(pipe, count)).await? {
            Sent::Pipeline(replies) => Ok(replies),
            Sent::One(reply) => Ok(vec![reply]),
        }
    }

    /// [`One::send`] of one command, without a pipeline around it.
    async fn send_one(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self.sent(Sending::One(cmd)).await? {
            Sent::One(reply) => Ok(reply),
            Sent::Pipeline(replies) => Ok(replies.into_iter().next().unwrap_or(Value::Nil)),
        }
    }

    /// Sends `what` until the (first) reply is not `READONLY`.
    async fn sent(&self, what: Sending<'_>) -> RedisResult<Sent> {
        let started = tokio::time::Instant::now();
        let mut pause = REFUSED_PAUSE.0;
        loop {
            let (generation, mut conn) = self.manager();
            let sent = match what {
                Sending::Pipeline(pipe, count) => self
                    .saw(generation, conn.req_packed_commands(pipe, 0, count).await)
                    .map(Sent::Pipeline),
                Sending::One(cmd) => {
                    self.saw(generation, conn.req_packed_command(cmd).await).map(Sent::One)
                }
            };
            let refused = match &sent {
                Ok(sent) => matches!(sent.first(), Some(Value::ServerError(e))
                    if e.kind() == Some(ServerErrorKind::ReadOnly)),
                Err(e) => e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly),
            };
            if !refused {
                return sent;
            }
            self.reconnect(
                generation,
                "the Redis server refused a write as a read-only replica (a failover?)",
            );
            if started.elapsed() >= REFUSED_FOR {
                return sent;
            }
            tokio::time::sleep(crate::store::full_jitter(pause)).await;
            pause = (pause * 2).min(REFUSED_PAUSE.1);
        }
    }
}

impl Conn {
    /// Runs the script; with `wait`, then `WAIT` on the same connection. The script's reply, and
    /// with `wait` how many replicas acknowledged (0 when `WAIT` itself failed: nothing is known
    /// to be replicated).
    pub(super) async fn eval(
        &self,
        inv: &Invocation<'_>,
        wait: Option<Replicas>,
    ) -> RedisResult<(Value, Option<i64>)> {
        let mut replies = self.send_script(inv, wait, true).await?;
        if matches!(replies.first(), Some(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::NoScript))
        {
            replies = self.send_script(inv, wait, false).await?;
            // An ACL user allowed `SCRIPT LOAD` and `EVALSHA` but not `EVAL`.
            if matches!(replies.first(), Some(Value::ServerError(e)) if super::reply::server_refused(e))
            {
                self.command(&inv.load()).await?.extract_error()?;
                replies = self.send_script(inv, wait, true).await?;
            }
        }
        let mut replies = replies.into_iter();
        let reply = replies.next().unwrap_or(Value::Nil).extract_error()?;
        let acks = wait.map(|_| match replies.next() {
            Some(Value::Int(n)) => n,
            other => {
                tracing::warn!(reply = ?other, "redis WAIT failed; counting no replica");
                0
            }
        });
        Ok((reply, acks))
    }

    /// Sends the script (by hash, or with its text), and with `wait` then `WAIT`; the replies.
    /// Without `WAIT` one server takes the script as a single command: no pipeline to build,
    /// encode and collect for each completion.
    async fn send_script(
        &self,
        inv: &Invocation<'_>,
        wait: Option<Replicas>,
        by_hash: bool,
    ) -> RedisResult<Vec<Value>> {
        if let (Conn::One(one), None) = (self, wait) {
            return Ok(vec![one.send_one(&inv.command(by_hash)).await?]);
        }
        let mut pipe = Pipeline::with_capacity(2);
        pipe.add_command(inv.command(by_hash));
        if let Some(w) = wait {
            // At least 1 ms: `WAIT n 0` would wait for ever (a zero timeout is refused when
            // the store opens; one under a millisecond would round to 0).
            pipe.cmd("WAIT").arg(w.count).arg(ms(w.timeout).max(1));
        }
        let count = if wait.is_some() { 2 } else { 1 };
        self.pipeline(&pipe, count, inv.first_key()).await
    }

    /// Checks that the servers answer (on a cluster, one node of it).
    pub(super) async fn ping(&self) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        let reply = match self {
            Conn::One(c) => {
                let (generation, mut conn) = c.manager();
                c.saw(generation, conn.req_packed_command(&ping).await)
            }
            Conn::Cluster(c) => {
                let (generation, mut conn) = c.connection();
                let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                c.saw(generation, conn.route_command(ping, random).await)
            }
        };
        reply?.extract_error().map(drop)
    }

    /// Runs one command without a key (`PING`, `SCRIPT LOAD`): on a cluster where the cluster
    /// client routes it.
    pub(super) async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::One(c) => {
                let (generation, mut conn) = c.manager();
                c.saw(generation, conn.req_packed_command(cmd).await)
            }
            Conn::Cluster(c) => {
                let (generation, mut conn) = c.connection();
                c.saw(generation, conn.req_packed_command(cmd).await)
            }
        }
    }

    /// `GET key`'s reply (a server error as a value). One server takes it as a single command:
    /// no pipeline to build, encode and collect for the read a replay is; a cluster, as a
    /// pipeline of one, to follow redirections.
    pub(super) async fn get(&self, key: &str) -> RedisResult<Value> {
        let mut get = redis::cmd("GET");
        get.arg(key);
        match self {
            // A read: never refused as a write (`READONLY`), so no check for it.
            Conn::One(c) => {
                let (generation, mut conn) = c.manager();
                c.saw(generation, conn.req_packed_command(&get).await)
            }
            Conn::Cluster(c) => {
                let mut pipe = redis::pipe();
                pipe.add_command(get).ignore_errors();
                let replies = cluster_send(c, &pipe, 1, key.as_bytes()).await?;
                Ok(replies.into_iter().next().unwrap_or(Value::Nil))
            }
        }
    }

    /// The replies of `count` commands of `pipe` (server errors among them as values), on the
    /// master of `key`'s slot, following redirections (see the module docs). After `ASK` the
    /// importing node runs only the first command: put the one on `key` first.
    pub(super) async fn pipeline(
        &self,
        pipe: &Pipeline,
        count: usize,
        key: &[u8],
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::One(c) => c.send(pipe, count).await,
            Conn::Cluster(c) => cluster_send(c, pipe, count, key).await,
        }
    }
}

/// Sends `pipe` to the master of `key`'s slot, following redirections (see the module docs).
async fn cluster_send(
    cluster: &Cluster,
    pipe: &Pipeline,
    count: usize,
    key: &[u8],
) -> RedisResult<Vec<Value>> {
    // The node a redirection named, and whether it was an ASK.
    let mut to: Option<(String, u16, bool)> = None;
    let mut redirects = 0;
    let started = tokio::time::Instant::now();
    let mut pause = REFUSED_PAUSE.0;
    loop {
        let (generation, mut conn) = cluster.connection();
        let sent = match &to {
            None => {
                let route = Route::with_key(key, SlotAddr::Master);
                conn.route_pipeline(
                    pipe.clone(),
                    0,
                    count,
                    SingleNodeRoutingInfo::SpecificNode(route),
                )
                .await
            }
            Some((host, port, asking)) => {
                let node = SingleNodeRoutingInfo::ByAddress { host: host.clone(), port: *port };
                if *asking {
                    let mut asked = redis::pipe();
                    asked.cmd("ASKING");
                    for cmd in pipe.cmd_iter() {
                        asked.add_command(cmd.clone());
                    }
                    conn.route_pipeline(asked, 1, count, node).await
                } else {
                    conn.route_pipeline(pipe.clone(), 0, count, node).await
                }
            }
        };
        let err = match cluster.saw(generation, sent) {
            Ok(replies) => return Ok(replies),
            Err(err) => err,
        };
        match err.kind() {
            ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask))
                if redirects < MAX_REDIRECTS =>
            {
                let Some((host, port)) = redirected_to(&err) else { return Err(err) };
                redirects += 1;
                to = Some((host, port, kind == ServerErrorKind::Ask));
                continue;
            }
            // Redirected MAX_REDIRECTS times in a row: the nodes disagree about the slot (at the
            // end of a migration its new owner is named to each master in turn, and meanwhile
            // the old owner and the new one may each send the script to the other). No node ran
            // it: a refusal like the ones below, retried once the topology has settled.
            ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
            | ErrorKind::Server(
                ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly,
            )
            | ErrorKind::ClusterConnectionNotFound => {}
            _ => return Err(err),
        }
        if started.elapsed() >= REFUSED_FOR {
            return Err(err);
        }
        tokio::time::sleep(crate::store::full_jitter(pause)).await;
        pause = (pause * 2).min(REFUSED_PAUSE.1);
        // Back to the slot's master, which redirects again while the slot moves.
        to = None;
        redirects = 0;
    }
}

/// The node a `MOVED` or `ASK` names (`<slot> <host>:<port>`).
fn redirected_to(err: &RedisError) -> Option<(String, u16)> {
    let (node, _slot) = err.redirect_node()?;
    let (host, port) = node.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_owned(), port.parse().ok()?))
}
