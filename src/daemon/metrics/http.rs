//! The opt-in HTTP listener of `serve --metrics ADDR`: binding, reading a request head, and the
//! answer, given only to a peer the access rule (`access`) admits.
//!
//! Must not decide who may read (that is `access`'s) nor render (that is `render`'s).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::access::{Allow, Endpoint, peer_uid};
use crate::daemon::Daemon;

/// The most bytes of a request head read.
pub(super) const MAX_HEAD: usize = 8 << 10;
/// How long a client may take to send its request and take the answer.
pub(super) const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections answered at once; more wait in the backlog.
pub(super) const HTTP_CONNECTIONS: usize = 16;
/// How long a listener keeps trying an address in use (a restart's old process may hold it
/// until it exits).
pub(super) const BIND_PATIENCE: Duration = Duration::from_secs(30);

/// Serves `GET /metrics` on `ep.addr` until the runtime stops. Never fails the daemon: an address
/// that cannot be bound is logged.
pub(in crate::daemon) async fn listen(daemon: Arc<Daemon>, ep: Endpoint) {
    let deadline = Instant::now() + BIND_PATIENCE;
    let listener = loop {
        match tokio::net::TcpListener::bind(ep.addr).await {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => {
                tracing::error!("metrics: cannot listen on {}: {e}", ep.addr);
                return;
            }
        }
    };
    tracing::info!(addr = %ep.addr, allow = %ep.allow, "metrics listener ready");
    let slots = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS));
    let allow = Arc::new(ep.allow);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let d = daemon.clone();
        let allow = allow.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(HTTP_TIMEOUT, http(d, &allow, stream, peer)).await;
            drop(slot);
        });
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Asked {
    Metrics { head_only: bool },
    NotFound,
    Method,
    Bad,
}

/// Reads the request line of `head` (the bytes up to the blank line).
pub(super) fn parse_head(head: &[u8]) -> Asked {
    let Ok(text) = std::str::from_utf8(head) else {
        return Asked::Bad;
    };
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Asked::Bad;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Asked::Bad;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => Asked::Metrics { head_only: false },
        ("HEAD", "/metrics") => Asked::Metrics { head_only: true },
        ("GET" | "HEAD", _) => Asked::NotFound,
        _ => Asked::Method,
    }
}

/// Reads the head of one request (at most [`MAX_HEAD`] bytes): `None` when it is longer or the
/// client closed before its end.
pub(super) async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = find_end(&head) {
            head.truncate(end);
            return Some(head);
        }
        if head.len() > MAX_HEAD {
            return None;
        }
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
}

pub(super) fn find_end(head: &[u8]) -> Option<usize> {
    head.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| head.windows(2).position(|w| w == b"\n\n"))
}

pub(super) fn response(
    status: &str,
    content_type: Option<&str>,
    body: &[u8],
    head_only: bool,
) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    if let Some(ct) = content_type {
        let _ = write!(out, "Content-Type: {ct}\r\n");
    }
    let _ = write!(
        out,
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

pub(super) async fn http(
    daemon: Arc<Daemon>,
    allow: &Allow,
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    // The head is read first, whoever asks: closing on unread bytes would reset the connection
    // and the client would see an error instead of the refusal.
    let asked = match read_head(&mut stream).await {
        Some(head) => parse_head(&head),
        None => Asked::Bad,
    };
    let local = stream.local_addr().ok();
    let uid = match local {
        Some(local) => tokio::task::spawn_blocking(move || peer_uid(peer, local))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    let out = if !allow.admits(uid) {
        tracing::debug!(%peer, ?uid, "metrics: refused");
        response("403 Forbidden", None, b"", false)
    } else {
        match asked {
            Asked::Metrics { head_only } => {
                let text = tokio::task::spawn_blocking(move || daemon.metrics_text())
                    .await
                    .unwrap_or_default();
                response(
                    "200 OK",
                    Some("text/plain; version=0.0.4; charset=utf-8"),
                    text.as_bytes(),
                    head_only,
                )
            }
            Asked::NotFound => response("404 Not Found", None, b"", false),
            Asked::Method => response("405 Method Not Allowed", None, b"", false),
            Asked::Bad => response("400 Bad Request", None, b"", false),
        }
    };
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
}
