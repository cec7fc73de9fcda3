//! The control socket (docs/security.md): every request is authenticated by the socket's peer
//! credentials, never by what the request says. Requests run on bounded pools of blocking threads:
//! at most `HEAVY_WORKERS` for everything that may take time (clones, snapshots, listings),
//! `FAST_WORKERS` of their own for git's fsmonitor queries, and `ping` inline, so that git's hook
//! never queues behind a flood of heavy requests and no flood grows the daemon's threads.
//! Connections past `MAX_CONNECTIONS` wait in the listen backlog; one user other than root holds at
//! most `USER_CONNECTIONS` of them.
//!
//! Owns the wire (one JSON request line, one JSON reply line) and the dispatch of each request to
//! the room that serves it; it decides nothing about threads or mirrors itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::Error;
use super::proto::{Ack, Call, Request, Response};
use super::refusal::RequestRefusal;
use super::{Daemon, Reply, lock};
use crate::access::Caller;

/// Blocking threads for requests that may take time (clone, sync, open, snapshot, list, ...).
const HEAVY_WORKERS: usize = 8;
/// Blocking threads of their own for fsmonitor queries, which git waits on.
const FAST_WORKERS: usize = 4;
/// Every blocking thread the runtime may have: the request pools, the sweep timer, and a little
/// slack. A flood of requests queues; it never grows the daemon's threads.
pub(super) const BLOCKING_THREADS: usize = HEAVY_WORKERS + FAST_WORKERS + 4;
/// Connections served at once; more wait in the listen backlog, costing the daemon nothing.
const MAX_CONNECTIONS: usize = 2048;
/// Connections one user other than root may have open at once: one user holding idle connections
/// must not take every slot from the others (and their fsmonitor queries).
const USER_CONNECTIONS: usize = 128;
/// A request line longer than this is not one of ours.
const MAX_REQUEST: usize = 64 << 10;
/// How often the mounts waiting for `release --when-idle` are checked.
const IDLE_WAIT_TICK: Duration = Duration::from_millis(250);
/// How long a client may take to send its request line, and to take its answer.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

impl Daemon {
    fn handle(&self, req: Request, c: &Caller) -> Response {
        // Counted while served; refused while a restart hands everything over.
        let _in_flight = match super::takeover::enter() {
            Ok(g) => g,
            Err(e) => return Response::err(e.to_string()),
        };
        match self.dispatch(req, c) {
            Ok((v, w)) => Response::ok(v, w),
            Err(e) => Response::err(e.to_string()),
        }
    }

    /// Each request to the room that serves it; `answer::<R>` checks at compile time that the
    /// room answers with the type the request names (`R::Answer`), which the client reads.
    pub(super) fn dispatch(&self, req: Request, c: &Caller) -> Reply<serde_json::Value> {
        use crate::proto as p;
        match req {
            Request::Ping => answer::<p::Ping>(Ok((Ack("pong".into()), vec![]))),
            Request::MirrorAdd(r) => {
                self.require_admin(c, "add mirrors")?;
                answer::<p::MirrorAdd>(self.mirror_add(
                    &r.project,
                    &r.upstream,
                    r.credential.as_deref(),
                    r.access,
                ))
            }
            Request::MirrorAccess(r) => {
                self.require_admin(c, "see or change who may bind a project")?;
                answer::<p::MirrorAccess>(self.mirror_access(&r.project, r.access))
            }
            Request::MirrorSync(r) => {
                self.require_admin(c, "sync mirrors")?;
                answer::<p::MirrorSync>(self.mirror_sync(&r.project))
            }
            Request::MirrorList => answer::<p::MirrorList>(self.mirror_list(c)),
            Request::Open(r) => answer::<p::Open>(self.open(
                &r.thread,
                r.project.as_deref(),
                r.git_ref.as_deref(),
                r.io,
                c,
            )),
            Request::List => answer::<p::List>(self.list(c)),
            Request::Status(r) => answer::<p::Status>(self.status(&r.thread, c)),
            Request::Fsmonitor(r) => answer::<p::Fsmonitor>(self.fsmonitor(&r.thread, &r.token, c)),
            Request::Snapshot(r) => answer::<p::Snapshot>(self.snapshot(&r.thread, c)),
            Request::Release(r) => {
                answer::<p::Release>(self.release(&r.thread, r.force, r.discard, c))
            }
            Request::Sweep(r) => {
                self.require_admin(c, "sweep every user's workspaces")?;
                answer::<p::Sweep>(self.sweep(r.idle_secs))
            }
            Request::Diff(r) => answer::<p::Diff>(self.diff(
                &r.thread,
                r.from.as_deref(),
                r.to.as_deref(),
                r.format(),
                c,
            )),
            Request::Stats(r) => answer::<p::Stats>(self.stats(r.thread.as_deref(), c)),
            Request::Metrics => answer::<p::Metrics>(self.metrics(c)),
            Request::Stop => {
                self.require_admin(c, "stop the daemon")?;
                answer::<p::Stop>(Ok((Ack("stopping".into()), vec![])))
            }
            Request::Watch(r) => answer::<p::Watch>(self.watch(&r.thread, &r.token, c)),
            Request::Fork(r) => answer::<p::Fork>(self.fork(&r.from, &r.to, c)),
            Request::Teleport(r) => answer::<p::Teleport>(self.teleport(
                &r.from,
                &r.to,
                r.project.as_deref(),
                r.git_ref.as_deref(),
                c,
            )),
            Request::ReleaseWhenIdle(r) => {
                answer::<p::ReleaseWhenIdle>(self.release_when_idle(&r.thread, c))
            }
            Request::Commit(r) => answer::<p::Commit>(self.commit(&r, c)),
            Request::Push(r) => answer::<p::Push>(self.push(
                &r.thread,
                r.remote.as_deref(),
                r.branch.as_deref(),
                r.lease.as_deref(),
                &r.gates,
                c,
            )),
            Request::DepsBuild(r) => {
                self.require_admin(c, "build dependency layers")?;
                answer::<p::DepsBuild>(self.deps_build(&r.project, r.git_ref.as_deref()))
            }
            Request::DepsList => answer::<p::DepsList>(self.deps_list(c)),
            Request::DepsGc => {
                self.require_admin(c, "collect dependency layers")?;
                answer::<p::DepsGc>(self.deps_gc())
            }
            Request::DepsProgress(r) => {
                self.require_admin(c, "follow dependency builds")?;
                answer::<p::DepsProgress>(self.deps_progress(&r.project, r.after))
            }
            Request::Export(r) => answer::<p::Export>(self.export(&r.thread, r.dry_run, c)),
            Request::Resync(r) => answer::<p::Resync>(self.resync(&r.thread, &r.role, c)),
            Request::SnapshotNamed(r) => answer::<p::SnapshotNamed>(self.snapshot_named(
                &r.thread,
                r.name.as_deref(),
                r.push.as_deref(),
                c,
            )),
            Request::Pull(r) => {
                answer::<p::Pull>(self.pull(&r.thread, &r.remote, &r.name, r.force, c))
            }
            Request::MirrorShare(r) => {
                self.require_admin(c, "change a project's share remote")?;
                answer::<p::MirrorShare>(self.mirror_share(&r.project, r.share.as_deref()))
            }
            Request::MirrorExcludes(r) => {
                self.require_admin(c, "change a project's excludes")?;
                answer::<p::MirrorExcludes>(self.mirror_excludes(&r.project, r.excludes))
            }
            Request::MirrorProgress(r) => {
                self.require_admin(c, "follow a mirror's clone or fetch")?;
                answer::<p::MirrorProgress>(Ok((super::mirrors::progress(&r.project), vec![])))
            }
            Request::MirrorCancel(r) => {
                self.require_admin(c, "cancel a mirror's clone or fetch")?;
                answer::<p::MirrorCancel>(super::mirrors::cancel(&r.project))
            }
            Request::Restart(r) => answer::<p::Restart>(self.restart(r.exe.as_deref(), c)),
            Request::Remount(r) => answer::<p::Remount>(self.remount(&r.thread, c)),
        }
    }
}

/// `R`'s answer as the `result` of a response.
fn answer<R: Call>(r: Reply<R::Answer>) -> Reply<serde_json::Value> {
    let (v, warnings) = r?;
    let v = serde_json::to_value(v).map_err(|e| Error::Op {
        what: "cannot encode the answer".into(),
        source: Box::new(e),
    })?;
    Ok((v, warnings))
}

pub(super) async fn run(daemon: Arc<Daemon>) -> anyhow::Result<()> {
    let sock = daemon.layout.socket();
    let _ = std::fs::remove_file(&sock);
    let listener = tokio::net::UnixListener::bind(&sock)
        .with_context(|| format!("cannot listen on {}", sock.display()))?;
    // Every local user must reach the socket (agents run the fsmonitor hook and `octofs open` as
    // themselves), whatever the umask: each request is authorized by its peer credentials instead.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("cannot set the mode of {}", sock.display()))?;
    }
    super::metrics::started();
    if let Some(ep) = daemon.settings.metrics.clone() {
        tokio::spawn(super::metrics::listen(daemon.clone(), ep));
    }
    tracing::info!(socket = %sock.display(), "octofs daemon ready");
    super::notify::ready();
    super::takeover::serving();
    let stop = Arc::new(tokio::sync::Notify::new());
    if daemon.settings.sweep_idle > 0 && daemon.settings.sweep_every > 0 {
        let d = daemon.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(d.settings.sweep_every));
            tick.tick().await;
            loop {
                tick.tick().await;
                let d = d.clone();
                let idle = d.settings.sweep_idle;
                match tokio::task::spawn_blocking(move || d.sweep(idle)).await {
                    Ok(Ok((v, _))) => {
                        tracing::debug!(released = ?v.released, kept = v.kept.len(), "sweep")
                    }
                    Ok(Err(e)) => tracing::warn!("sweep: {e}"),
                    Err(e) => tracing::warn!("sweep: {e}"),
                }
            }
        });
    }
    {
        // `release --when-idle`: checks the waiting mounts four times a second (nothing to do,
        // nothing done).
        let d = daemon.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(IDLE_WAIT_TICK);
            loop {
                tick.tick().await;
                if !d.has_idle_waits() {
                    continue;
                }
                let d = d.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || d.release_idle_waits()).await {
                    tracing::warn!("release when idle: {e}");
                }
            }
        });
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let pools = Arc::new(Pools {
        heavy: Semaphore::new(HEAVY_WORKERS),
        fast: Semaphore::new(FAST_WORKERS),
    });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_user: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = stop.notified() => break,
            conn = accept(&listener, &slots) => {
                let (stream, slot) = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors, most likely: let connections finish.
                        tracing::warn!("control socket: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let uid = stream.peer_cred().map(|c| c.uid()).ok();
                let share = match uid {
                    Some(uid) if !daemon.is_admin(&Caller { uid, ..Caller::default() }) => {
                        match UserShare::take(&per_user, uid) {
                            Some(s) => Some(s),
                            None => {
                                tokio::spawn(refuse(stream, uid));
                                drop(slot);
                                continue;
                            }
                        }
                    }
                    _ => None,
                };
                let d = daemon.clone();
                let stop = stop.clone();
                let pools = pools.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(d, pools, stream, stop).await {
                        tracing::debug!("control connection: {e}");
                    }
                    drop(share);
                    drop(slot);
                });
            }
        }
    }
    tracing::info!("stopping");
    Ok(())
}

/// One of the `USER_CONNECTIONS` connections a user may have open; given back on drop.
struct UserShare {
    counts: Arc<Mutex<HashMap<u32, usize>>>,
    uid: u32,
}

impl UserShare {
    /// A share for `uid`, or `None` when it has all of its connections open already.
    fn take(counts: &Arc<Mutex<HashMap<u32, usize>>>, uid: u32) -> Option<UserShare> {
        let mut map = lock(counts);
        let n = map.entry(uid).or_insert(0);
        if *n >= USER_CONNECTIONS {
            return None;
        }
        *n += 1;
        Some(UserShare {
            counts: counts.clone(),
            uid,
        })
    }
}

impl Drop for UserShare {
    fn drop(&mut self) {
        let mut map = lock(&self.counts);
        if let Some(n) = map.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.uid);
            }
        }
    }
}

/// Answers a connection over its user's share with an error, without reading it.
async fn refuse(mut stream: tokio::net::UnixStream, uid: u32) {
    let resp = Response::err(format!(
        // Not `describe_uid`: a user lookup may block, and this runs on the accept path.
        "uid {uid} has {USER_CONNECTIONS} connections to the daemon open already; close some"
    ));
    if let Ok(mut out) = serde_json::to_vec(&resp) {
        out.push(b'\n');
        let _ = tokio::time::timeout(IO_TIMEOUT, stream.write_all(&out)).await;
    }
}

/// The bounded pools of blocking threads that serve requests.
struct Pools {
    heavy: Semaphore,
    fast: Semaphore,
}

/// The next connection, once fewer than `MAX_CONNECTIONS` are being served.
async fn accept(
    listener: &tokio::net::UnixListener,
    slots: &Arc<Semaphore>,
) -> std::io::Result<(tokio::net::UnixStream, OwnedSemaphorePermit)> {
    let slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(std::io::Error::other)?;
    let (stream, _) = listener.accept().await?;
    Ok((stream, slot))
}

/// Reads one request line: at most `MAX_REQUEST` bytes of UTF-8 JSON.
async fn read_request(r: tokio::net::unix::OwnedReadHalf) -> Result<Request, Error> {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    BufReader::new(r.take(MAX_REQUEST as u64 + 1))
        .read_until(b'\n', &mut line)
        .await
        .map_err(RequestRefusal::Unreadable)?;
    if line.len() > MAX_REQUEST {
        return Err(RequestRefusal::TooLong { max: MAX_REQUEST }.into());
    }
    let text = std::str::from_utf8(&line).map_err(|e| RequestRefusal::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    Ok(serde_json::from_str(text).map_err(RequestRefusal::NotJson)?)
}

async fn connection(
    daemon: Arc<Daemon>,
    pools: Arc<Pools>,
    stream: tokio::net::UnixStream,
    stop: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()> {
    // Who is asking is what the kernel says about the peer, never what the request says.
    let caller = stream.peer_cred().map(|cred| Caller {
        uid: cred.uid(),
        gid: cred.gid(),
        groups: crate::sys::peer_groups(&stream).unwrap_or_default(),
    });
    let (r, mut w) = stream.into_split();
    let request = match tokio::time::timeout(IO_TIMEOUT, read_request(r)).await {
        Ok(req) => req,
        Err(_) => Err(RequestRefusal::NoLine {
            secs: IO_TIMEOUT.as_secs(),
        }
        .into()),
    };
    // Only the answer to `restart` ends a daemon that handed over: another connection answered
    // meanwhile (a ping, a status) must not make it exit before that answer is written.
    let restart = matches!(request, Ok(Request::Restart(_)));
    let resp = match (request, caller) {
        (Err(e), _) => Response::err(e.to_string()),
        (Ok(_), Err(e)) => Response::err(format!("cannot tell who is asking: {e}")),
        (Ok(req), Ok(caller)) => serve_request(daemon, &pools, req, caller, &stop).await,
    };
    let mut out = serde_json::to_vec(&resp)?;
    out.push(b'\n');
    tokio::time::timeout(IO_TIMEOUT, w.write_all(&out))
        .await
        .context("the client did not take its answer")??;
    if restart {
        super::takeover::exit_if_handed_over();
    }
    Ok(())
}

/// Answers `ping` at once, fsmonitor queries on their own pool, everything else on the heavy pool.
async fn serve_request(
    daemon: Arc<Daemon>,
    pools: &Pools,
    req: Request,
    caller: Caller,
    stop: &tokio::sync::Notify,
) -> Response {
    let pool = match req {
        Request::Ping => return daemon.handle(req, &caller),
        Request::Fsmonitor(_)
        | Request::Stats(_)
        | Request::Metrics
        | Request::Watch(_)
        | Request::Stop
        | Request::DepsProgress(_)
        | Request::MirrorProgress(_)
        | Request::MirrorCancel(_) => &pools.fast,
        _ => &pools.heavy,
    };
    let is_stop = matches!(req, Request::Stop);
    let Ok(_worker) = pool.acquire().await else {
        return Response::err("the daemon is stopping");
    };
    let resp = tokio::task::spawn_blocking(move || daemon.handle(req, &caller))
        .await
        .unwrap_or_else(|e| Response::err(format!("internal error: {e}")));
    if is_stop && resp.ok {
        stop.notify_one();
    }
    resp
}
