//! `serve --io auto` (the default): which I/O mode each new mount gets, chosen from what it would
//! cost (docs/performance.md "Which mode a mount gets"). A no-open mount keeps its own page-cache
//! copy of every base file it reads; a handles mount shares the host's one copy through
//! passthrough but pays a FUSE round trip per open. So a mount is no-open while its base's file
//! bytes, plus those of the live no-open mounts, fit in half the memory the daemon's cgroup may
//! use (`memory.max` of its cgroup v2, else `MemTotal`; `OCTOFS_IO_MEMORY` overrides); past that
//! it gets handles. An operator may also cap the live no-open mounts of one base
//! (`OCTOFS_IO_PER_BASE`; no cap by default): measured with `scripts/agents`, 20 agents reading
//! one base at once on 2 CPUs took as long with no-open as with handles (the CPUs were busy either
//! way) while the copies held 5.8× the memory — memory the budget already keeps from crowding out
//! anything else, so by default it buys the lone agent's speed. Decided once per mount, kept in
//! the workspace record (so that a restart, an adoption or a remount serves it the same way)
//! until the workspace is released.
//!
//! Owns the daemon-level setting ([`IoSetting`]), the rule ([`choose`]), the budget and the
//! holds on it ([`Budget`], [`Hold`]), and the reasons `status` and `stats` print. It must not
//! touch the filesystem: the mount only ever sees the resolved [`IoMode`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::fs::IoMode;
use crate::workspace::IoChosen;

/// Overrides the memory the budget is half of, in bytes (for tests and for operators who know
/// better than the cgroup); 0: no budget (every auto mount gets handles).
pub const MEMORY_ENV: &str = "OCTOFS_IO_MEMORY";

/// The daemon's `serve --io`: a mode for every mount, or `auto` (per mount, [`choose`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IoSetting {
    #[default]
    Auto,
    Mode(IoMode),
}

impl std::str::FromStr for IoSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoSetting::Auto),
            m => m
                .parse::<IoMode>()
                .map(IoSetting::Mode)
                .map_err(|_| format!("unknown I/O mode {s:?} (auto, handles or no-open)")),
        }
    }
}

impl std::fmt::Display for IoSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoSetting::Auto => f.write_str("auto"),
            IoSetting::Mode(m) => m.fmt(f),
        }
    }
}

/// The rule: no-open while `bytes` (this mount's base) plus `live` (the live no-open mounts')
/// fit in `budget` (a budget of 0 holds nothing) and fewer than `per_base` live no-open mounts
/// share this base (`same_base`; a `per_base` of 0 sets no such limit).
pub fn choose(bytes: u64, live: u64, budget: u64, same_base: u32, per_base: u32) -> IoMode {
    let fits = budget > 0 && bytes.saturating_add(live) <= budget;
    if fits && (per_base == 0 || same_base < per_base) {
        IoMode::NoOpen
    } else {
        IoMode::Handles
    }
}

/// How many live no-open mounts one base may have (0, the default: no limit).
pub const PER_BASE_ENV: &str = "OCTOFS_IO_PER_BASE";

/// How many live no-open mounts one base may have: `OCTOFS_IO_PER_BASE`, else no limit (0; the
/// module doc says why).
pub fn per_base() -> u32 {
    match std::env::var(PER_BASE_ENV) {
        Ok(v) => v.trim().parse::<u32>().unwrap_or_else(|_| {
            tracing::warn!("{PER_BASE_ENV}={v:?} is not a number: ignored");
            0
        }),
        Err(_) => 0,
    }
}

/// Why a mount has its mode, as `status` and `stats` say it: `auto: 210 MiB of 4.0 GiB budget`
/// (this base plus the live no-open mounts), `auto: budget full (…)`, `asked` (`open --io`) or
/// `serve --io`.
pub fn why(asked: bool, chosen: Option<&IoChosen>) -> String {
    match (asked, chosen) {
        (true, _) => "asked".into(),
        (false, None) => "serve --io".into(),
        (false, Some(c)) if c.mode == IoMode::NoOpen => format!(
            "auto: {} of {} budget",
            human(c.bytes.saturating_add(c.live)),
            human(c.budget)
        ),
        (false, Some(c))
            if c.budget > 0
                && c.bytes.saturating_add(c.live) <= c.budget
                && c.per_base > 0
                && c.same_base >= c.per_base =>
        {
            format!(
                "auto: {} no-open mounts of this base already (OCTOFS_IO_PER_BASE; the others share one copy)",
                c.same_base
            )
        }
        (false, Some(c)) => format!(
            "auto: budget full ({} base, {} in use of {})",
            human(c.bytes),
            human(c.live),
            human(c.budget)
        ),
    }
}

/// Bytes in the largest binary unit that keeps them ≥ 1: `512 B`, `210 MiB`, `4.0 GiB`.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if v < 10.0 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.0} {}", UNITS[u])
    }
}

/// The memory the daemon may use: `OCTOFS_IO_MEMORY`, else the smallest `memory.max` on the path
/// of its cgroup v2 (a parent's limit binds it too; on a cgroup v1 host `memory.limit_in_bytes`),
/// else `MemTotal`, whichever is smaller.
pub fn memory() -> u64 {
    if let Ok(v) = std::env::var(MEMORY_ENV) {
        match v.trim().parse::<u64>() {
            Ok(n) => return n,
            Err(_) => tracing::warn!("{MEMORY_ENV}={v:?} is not a number of bytes: ignored"),
        }
    }
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_total(&m))
        .unwrap_or(0);
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let v2 = cgroup_path(&cgroup).and_then(|p| {
        cgroup_limit(&p, |dir| {
            std::fs::read_to_string(format!("/sys/fs/cgroup{dir}/memory.max")).ok()
        })
    });
    // A cgroup v1 host (its memory controller mounted on its own): `memory.limit_in_bytes`.
    let v1 = || {
        cgroup_v1_memory_path(&cgroup).and_then(|p| {
            cgroup_limit(&p, |dir| {
                std::fs::read_to_string(format!("/sys/fs/cgroup/memory{dir}/memory.limit_in_bytes"))
                    .ok()
            })
        })
    };
    let limit = v2.or_else(v1);
    match limit {
        Some(l) if total == 0 || l < total => l,
        _ => total,
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The cgroup v2 path of `/proc/self/cgroup` (its `0::` line).
fn cgroup_path(cgroup: &str) -> Option<String> {
    cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().trim_end_matches('/').to_string())
}

/// The path of the cgroup v1 memory controller in `/proc/self/cgroup` (its `N:memory:` line).
fn cgroup_v1_memory_path(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.trim().trim_end_matches('/').to_string())
    })
}

/// The smallest `memory.max` from `path` up to the root (`read` gives a directory's file);
/// `max` or an unreadable file sets no limit.
fn cgroup_limit(path: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut dir = path.to_string();
    let mut least: Option<u64> = None;
    loop {
        if let Some(n) = read(&dir).and_then(|s| s.trim().parse::<u64>().ok()) {
            least = Some(least.map_or(n, |l| l.min(n)));
        }
        match dir.rfind('/') {
            Some(i) if !dir.is_empty() => dir.truncate(i),
            _ => return least,
        }
    }
}

/// The page-cache budget of no-open mounts and what the live ones hold of it. Held only to
/// decide and to take or give back a hold, never across I/O.
#[derive(Debug)]
pub struct Budget {
    /// Half the memory the daemon may use (0: none).
    pub bytes: u64,
    /// The most live no-open mounts of one base (0: no limit).
    pub per_base: u32,
    /// Each no-open mount's hold: its base's bytes and its base.
    held: Mutex<HashMap<u64, (u64, Base)>>,
    next: AtomicU64,
}

/// What tells bases apart for the per-base limit: the tree a workspace presents at its start.
pub type Base = gix::ObjectId;

/// A mount's I/O mode and, for a no-open mount, its base's bytes held against the budget until
/// the hold is dropped (with the mount).
#[derive(Debug)]
pub struct Hold {
    pub mode: IoMode,
    id: Option<u64>,
    budget: Arc<Budget>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.budget
                .held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        }
    }
}

impl Budget {
    /// A budget of half of `memory` bytes, at most `per_base` no-open mounts per base.
    pub fn new(memory: u64, per_base: u32) -> Arc<Budget> {
        tracing::info!(
            "no-open budget {} (half of {} the daemon may use), {per_base} no-open mounts per base",
            human(memory / 2),
            human(memory)
        );
        Arc::new(Budget {
            bytes: memory / 2,
            per_base,
            held: Mutex::default(),
            next: AtomicU64::new(1),
        })
    }

    /// What the live no-open mounts hold.
    pub fn live(&self) -> u64 {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.values().fold(0u64, |a, (b, _)| a.saturating_add(*b))
    }

    /// Decides a new mount's mode for a base of `bytes` ([`choose`]) and holds it, in one step
    /// (two mounts deciding at once cannot both take the last room).
    pub fn decide(self: &Arc<Self>, bytes: u64, base: Base) -> (IoChosen, Hold) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let live = held.values().fold(0u64, |a, (b, _)| a.saturating_add(*b));
        let same = held.values().filter(|(_, b)| *b == base).count();
        let same_base = u32::try_from(same).unwrap_or(u32::MAX);
        let mode = choose(bytes, live, self.bytes, same_base, self.per_base);
        let id = (mode == IoMode::NoOpen).then(|| {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            held.insert(id, (bytes, base));
            id
        });
        drop(held);
        let chosen = IoChosen {
            mode,
            bytes,
            live,
            budget: self.bytes,
            same_base,
            per_base: self.per_base,
        };
        let hold = Hold {
            mode,
            id,
            budget: self.clone(),
        };
        (chosen, hold)
    }

    /// Holds a mode decided before (asked, `serve --io`, or an earlier decision): a no-open
    /// mount's `bytes` count against the budget whether or not they fit.
    pub fn hold(self: &Arc<Self>, mode: IoMode, bytes: u64, base: Base) -> Hold {
        let id = (mode == IoMode::NoOpen).then(|| {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            self.held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, (bytes, base));
            id
        });
        Hold {
            mode,
            id,
            budget: self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn base(n: u8) -> Base {
        gix::ObjectId::from_bytes_or_panic(&[n; 20])
    }

    #[test]
    fn a_base_is_no_open_while_it_fits_in_the_budget() {
        assert_eq!(choose(100 * MIB, 0, 1024 * MIB, 0, 2), IoMode::NoOpen);
        assert_eq!(
            choose(100 * MIB, 924 * MIB, 1024 * MIB, 1, 2),
            IoMode::NoOpen
        );
        assert_eq!(
            choose(100 * MIB, 925 * MIB, 1024 * MIB, 0, 2),
            IoMode::Handles
        );
        assert_eq!(choose(2048 * MIB, 0, 1024 * MIB, 0, 0), IoMode::Handles);
        // No budget: nothing is no-open, not even an empty base.
        assert_eq!(choose(0, 0, 0, 0, 0), IoMode::Handles);
        assert_eq!(choose(u64::MAX, 1, u64::MAX - 1, 0, 0), IoMode::Handles);
        // One per CPU for a base, however much memory is left; 0 sets no limit.
        assert_eq!(choose(MIB, 0, 1024 * MIB, 2, 2), IoMode::Handles);
        assert_eq!(choose(MIB, 0, 1024 * MIB, 200, 0), IoMode::NoOpen);
    }

    #[test]
    fn the_budget_fills_and_empties_with_its_mounts() {
        let b = Budget::new(1000, 0);
        assert_eq!(b.bytes, 500);
        let (c1, h1) = b.decide(300, base(1));
        assert_eq!((c1.mode, c1.live, c1.budget), (IoMode::NoOpen, 0, 500));
        // The second no longer fits beside the first: handles, holding nothing.
        let (c2, h2) = b.decide(300, base(2));
        assert_eq!((c2.mode, c2.live), (IoMode::Handles, 300));
        assert_eq!(b.live(), 300);
        let (c3, _h3) = b.decide(200, base(3));
        assert_eq!(c3.mode, IoMode::NoOpen);
        assert_eq!(b.live(), 500);
        drop(h1);
        drop(h2);
        assert_eq!(b.live(), 200);
        // A mode decided before holds its bytes even past the budget.
        let h4 = b.hold(IoMode::NoOpen, 900, base(4));
        assert_eq!(b.live(), 1100);
        assert_eq!(b.decide(1, base(5)).0.mode, IoMode::Handles);
        drop(h4);
        assert_eq!(b.hold(IoMode::Handles, 900, base(4)).mode, IoMode::Handles);
        assert_eq!(b.live(), 200);
    }

    #[test]
    fn a_base_has_at_most_per_base_no_open_mounts_and_others_are_not_counted() {
        let b = Budget::new(1 << 40, 2);
        let (c1, h1) = b.decide(MIB, base(1));
        let (c2, _h2) = b.decide(MIB, base(1));
        assert_eq!((c1.mode, c1.same_base), (IoMode::NoOpen, 0));
        assert_eq!((c2.mode, c2.same_base), (IoMode::NoOpen, 1));
        // The third of the same base gets handles and holds nothing; another base is free.
        let (c3, _h3) = b.decide(MIB, base(1));
        assert_eq!(
            (c3.mode, c3.same_base, c3.per_base),
            (IoMode::Handles, 2, 2)
        );
        assert_eq!(b.live(), 2 * MIB);
        assert_eq!(b.decide(MIB, base(2)).0.mode, IoMode::NoOpen);
        // An asked or earlier no-open mount of the base counts too; a handles one does not.
        let _h5 = b.hold(IoMode::Handles, 0, base(3));
        assert_eq!(b.decide(MIB, base(3)).0.mode, IoMode::NoOpen);
        // Room again once one of them is gone.
        drop(h1);
        assert_eq!(b.decide(MIB, base(1)).0.mode, IoMode::NoOpen);
    }

    #[test]
    fn the_setting_reads_auto_or_a_mode() {
        assert_eq!("auto".parse::<IoSetting>(), Ok(IoSetting::Auto));
        assert_eq!(
            "no-open".parse::<IoSetting>(),
            Ok(IoSetting::Mode(IoMode::NoOpen))
        );
        assert_eq!(
            "handles".parse::<IoSetting>(),
            Ok(IoSetting::Mode(IoMode::Handles))
        );
        assert!("fast".parse::<IoSetting>().unwrap_err().contains("auto"));
        for s in ["auto", "handles", "no-open"] {
            assert_eq!(s.parse::<IoSetting>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn reasons_name_the_figures() {
        let no_open = IoChosen {
            mode: IoMode::NoOpen,
            bytes: 200 * MIB,
            live: 10 * MIB,
            budget: 4096 * MIB,
            same_base: 1,
            per_base: 2,
        };
        assert_eq!(
            why(false, Some(&no_open)),
            "auto: 210 MiB of 4.0 GiB budget"
        );
        let full = IoChosen {
            mode: IoMode::Handles,
            ..no_open
        };
        assert_eq!(
            why(false, Some(&full)),
            "auto: budget full (200 MiB base, 10 MiB in use of 4.0 GiB)"
        );
        let crowded = IoChosen {
            mode: IoMode::Handles,
            same_base: 2,
            ..no_open
        };
        assert_eq!(
            why(false, Some(&crowded)),
            "auto: 2 no-open mounts of this base already (OCTOFS_IO_PER_BASE; the others share one copy)"
        );
        // A record written before the per-base limit (both 0) reads as before.
        let old = IoChosen {
            same_base: 0,
            per_base: 0,
            ..full
        };
        assert_eq!(
            why(false, Some(&old)),
            "auto: budget full (200 MiB base, 10 MiB in use of 4.0 GiB)"
        );
        assert_eq!(why(true, Some(&full)), "asked");
        assert_eq!(why(false, None), "serve --io");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
    }

    #[test]
    fn memory_comes_from_the_tightest_cgroup_else_meminfo() {
        assert_eq!(
            mem_total("MemTotal:       8049852 kB\nMemFree: 1 kB\n"),
            Some(8049852 * 1024)
        );
        assert_eq!(
            cgroup_path("0::/system.slice/octofs.service\n").as_deref(),
            Some("/system.slice/octofs.service")
        );
        assert_eq!(cgroup_path("1:name=systemd:/x\n"), None);
        assert_eq!(
            cgroup_v1_memory_path("5:devices:/\n4:memory:/api/b5\n0::/\n").as_deref(),
            Some("/api/b5")
        );
        assert_eq!(cgroup_v1_memory_path("0::/a\n"), None);
        let files = |dir: &str| match dir {
            "/system.slice/octofs.service" => Some("max\n".to_string()),
            "/system.slice" => Some("4294967296\n".to_string()),
            "" => None,
            _ => None,
        };
        assert_eq!(
            cgroup_limit("/system.slice/octofs.service", files),
            Some(4294967296)
        );
        assert_eq!(cgroup_limit("/other", files), None);
        // The root cgroup ("0::/") has no memory.max: no limit.
        assert_eq!(cgroup_limit("", |_| None), None);
    }
}
