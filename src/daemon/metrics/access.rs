//! Who may read the metrics listener: the `--metrics`/`--metrics-allow` settings, and the owner
//! of the socket at the other end of a connection, read from the kernel's `/proc/net/tcp{,6}`,
//! never from the request.
//!
//! Must not read anything a client sends nor answer it (that is `http`'s).

use std::net::{IpAddr, SocketAddr};

/// Who may read the listener besides root and the daemon's user (`serve --metrics-allow`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Allow {
    /// Root and the daemon's user only (the default).
    #[default]
    Root,
    /// Also these uids.
    Uids(Vec<u32>),
    /// Every client, local or not (the operator's network decides).
    Any,
}

impl std::str::FromStr for Allow {
    type Err = String;

    fn from_str(s: &str) -> Result<Allow, String> {
        match s.trim() {
            "" | "root" => Ok(Allow::Root),
            "any" => Ok(Allow::Any),
            list => list
                .split(',')
                .map(|u| {
                    u.trim().parse::<u32>().map_err(|_| {
                        format!(
                            "--metrics-allow: {u:?} is not a uid (give uid[,uid…], root or any)"
                        )
                    })
                })
                .collect::<Result<Vec<u32>, String>>()
                .map(Allow::Uids),
        }
    }
}

impl std::fmt::Display for Allow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Allow::Root => f.write_str("root"),
            Allow::Any => f.write_str("any"),
            Allow::Uids(u) => {
                let list: Vec<String> = u.iter().map(u32::to_string).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

impl Allow {
    /// Whether a client whose socket belongs to `uid` (`None`: unknown, not a local socket of
    /// this network namespace) may read the metrics.
    pub fn admits(&self, uid: Option<u32>) -> bool {
        match (self, uid) {
            (Allow::Any, _) => true,
            (_, Some(u)) if u == 0 || u == crate::sys::euid() => true,
            (Allow::Uids(list), Some(u)) => list.contains(&u),
            _ => false,
        }
    }
}

/// The listener of `serve --metrics ADDR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub allow: Allow,
}

/// The uid owning the local socket at the other end of our connection from `local` to `peer`:
/// its row in `/proc/net/tcp` or `tcp6` has `peer` as its local address and `local` as its
/// remote. `None` when no such row is there (the client is on another host or in another network
/// namespace).
pub(super) fn peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            find_owner(&text, peer, local)
        })
}

/// [`peer_uid`] in one table's text.
pub(super) fn find_owner(table: &str, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let same = |a: SocketAddr, b: SocketAddr| {
        a.port() == b.port() && a.ip().to_canonical() == b.ip().to_canonical()
    };
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (own, other, uid) = (f.get(1)?, f.get(2)?, f.get(7)?);
        (same(parse_proc_addr(own)?, peer) && same(parse_proc_addr(other)?, local))
            .then(|| uid.parse().ok())
            .flatten()
    })
}

/// An address as `/proc/net/tcp{,6}` writes it: the address's 32-bit words in hex, each in host
/// byte order, a colon and the port in hex.
pub(super) fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |w: &str| u32::from_str_radix(w, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::from(word(ip)?),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(&ip[i * 8..i * 8 + 8])?);
            }
            IpAddr::from(b)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Refuses an address `serve --metrics` cannot use, before the daemon starts.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        format!("--metrics: {s:?} is not an address and port (e.g. 127.0.0.1:9464 or [::1]:9464)")
    })
}
