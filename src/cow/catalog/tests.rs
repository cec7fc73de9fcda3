//! Unit tests of the catalog: replay, torn tails, damaged frames of the log and the snapshot, old
//! formats.

use super::frame::{HEADER, RS};
use super::snap::SNAP_CHUNK;
use super::*;
use std::fs::OpenOptions;
use std::io::Write;

fn rec(ino: u64) -> InodeRecord {
    InodeRecord {
        ino,
        kind: Kind::File,
        base: None,
        upper: true,
        target: None,
        mode: 0o644,
        uid: 1,
        gid: 2,
        rdev: 0,
        atime: Ts(1, 2),
        mtime: Ts(3, 4),
        ctime: Ts(5, 6),
        nlink: 1,
        parent: 0,
        name: b"f".to_vec(),
        xattrs: [(b"user.k".to_vec(), vec![0, 255])].into_iter().collect(),
        copied_ctime: None,
        shared: None,
    }
}

#[test]
fn replays_batches_and_survives_a_torn_tail() {
    let d = tempfile::tempdir().unwrap();
    let (mut c, s, clean) = Catalog::open(d.path()).unwrap();
    assert!(!clean);
    assert_eq!(s, CatalogState::default());
    let name = vec![b'a', 0xff, b'b'];
    let batch = vec![
        Record::Inode(rec(7)),
        Record::Entry {
            dir: 1,
            name: name.clone(),
            ino: Some(7),
        },
        Record::NextIno { next: 8 },
    ];
    c.append(&batch).unwrap();
    c.append(&[Record::Entry {
        dir: 1,
        name: b"gone".to_vec(),
        ino: None,
    }])
    .unwrap();
    drop(c);
    // A torn batch at the end (power loss mid-write) is ignored and cut off.
    let mut f = OpenOptions::new()
        .append(true)
        .open(d.path().join(LOG))
        .unwrap();
    f.write_all(b"[{\"op\":\"drop\",\"in").unwrap();
    drop(f);
    let (mut c, s, _) = Catalog::open(d.path()).unwrap();
    assert_eq!(s.inodes[&7], rec(7));
    assert_eq!(s.dirs[&1][&name], Some(7));
    assert_eq!(s.dirs[&1][&b"gone"[..]], None);
    assert_eq!(s.next_ino, 8);
    c.append(&[Record::Drop { ino: 7 }]).unwrap();
    drop(c);
    let (mut c, s, _) = Catalog::open(d.path()).unwrap();
    assert!(!s.inodes.contains_key(&7));
    // Compaction keeps the state and a clean close is seen by the next open.
    c.close_clean(&s).unwrap();
    let (_c, s2, clean) = Catalog::open(d.path()).unwrap();
    assert!(clean);
    assert_eq!(s, s2);
    assert_eq!(std::fs::metadata(d.path().join(LOG)).unwrap().len(), 0);
}

#[test]
fn replaying_an_old_log_over_a_newer_snapshot_changes_nothing() {
    let mut s: CatalogState = CatalogState::default();
    let log = vec![
        Record::Inode(rec(9)),
        Record::Entry {
            dir: 1,
            name: b"x".to_vec(),
            ino: Some(9),
        },
        Record::Unentry {
            dir: 1,
            name: b"x".to_vec(),
        },
        Record::Drop { ino: 9 },
        Record::NextIno { next: 10 },
    ];
    for r in &log {
        s.apply(r);
    }
    let snap = s.clone();
    for r in &log {
        s.apply(r);
    }
    assert_eq!(s, snap);
}

/// A log of six batches, each creating file `f<i>` as inode `i`, and the log's bytes.
fn six_batches(dir: &Path) -> Vec<u8> {
    let (mut c, _, _) = Catalog::open(dir).unwrap();
    for i in 1..=6u64 {
        let mut r = rec(i);
        r.name = format!("f{i}").into_bytes();
        c.append(&[
            Record::Inode(r),
            Record::Entry {
                dir: 1,
                name: format!("f{i}").into_bytes(),
                ino: Some(i),
            },
            Record::NextIno { next: i + 1 },
        ])
        .unwrap();
    }
    drop(c);
    std::fs::read(dir.join(LOG)).unwrap()
}

/// Where each frame of `log` starts.
fn frame_starts(log: &[u8]) -> Vec<usize> {
    log.iter()
        .enumerate()
        .filter(|(_, b)| **b == RS)
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn one_damaged_batch_costs_that_batch_alone_and_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let pristine = six_batches(d.path());
    let starts = frame_starts(&pristine);
    assert_eq!(starts.len(), 6);
    let third = starts[2];
    let payload_end = starts[3] - 1;
    // (byte to flip, whether batch 3 is lost): in its JSON, length, checksum, separator, RS
    // and LF. A hit RS or LF alone costs nothing: the checksum still proves the batch.
    let cases = [
        (third + HEADER + 20, true),
        (third + 3, true),
        (third + 15, true),
        (third + 9, true),
        (third, false),
        (payload_end, false),
    ];
    for (at, lost) in cases {
        let ws = tempfile::tempdir().unwrap();
        let mut log = pristine.clone();
        log[at] ^= 0x04;
        std::fs::write(ws.path().join(LOG), &log).unwrap();
        let (c, s, _) = Catalog::open(ws.path()).unwrap();
        for i in [1u64, 2, 4, 5, 6] {
            assert_eq!(
                s.inodes[&i].name,
                format!("f{i}").into_bytes(),
                "flip at {at}"
            );
            assert_eq!(s.dirs[&1][format!("f{i}").as_bytes()], Some(i));
        }
        assert_eq!(s.next_ino, 7);
        if !lost {
            assert!(s.inodes.contains_key(&3), "flip at {at}");
            assert!(c.damage().is_empty(), "flip at {at}: {:?}", c.damage());
            continue;
        }
        assert!(!s.inodes.contains_key(&3), "flip at {at}");
        assert!(!s.dirs[&1].contains_key(&b"f3"[..]), "flip at {at}");
        let damage = c.damage();
        assert_eq!(damage.len(), 1, "flip at {at}: {damage:?}");
        assert_eq!(damage[0].offset, third as u64);
        assert_eq!(damage[0].len, (starts[3] - third) as u64);
        assert!(damage[0].names.contains(&"f3".to_string()), "{damage:?}");
        assert!(damage[0].to_string().contains("f3"), "{}", damage[0]);
        if at != third + HEADER + 20 {
            assert_eq!(damage[0].inodes, vec![3], "flip at {at}");
        }
        // The damaged log is kept aside and the live log compacted: the damage is reported
        // once, and what was replayed stays.
        let kept: Vec<_> = std::fs::read_dir(ws.path().join("quarantine"))
            .unwrap()
            .flatten()
            .map(|e| std::fs::read(e.path()).unwrap())
            .collect();
        assert_eq!(kept, vec![log.clone()]);
        assert_eq!(std::fs::metadata(ws.path().join(LOG)).unwrap().len(), 0);
        drop(c);
        let (c, s2, _) = Catalog::open(ws.path()).unwrap();
        assert!(c.damage().is_empty());
        assert_eq!(s, s2);
    }
}

#[test]
fn damaged_last_batch_is_reported_but_a_torn_one_is_not() {
    let d = tempfile::tempdir().unwrap();
    let pristine = six_batches(d.path());
    let last = *frame_starts(&pristine).last().unwrap();
    // Complete but damaged: reported.
    let ws = tempfile::tempdir().unwrap();
    let mut log = pristine.clone();
    log[last + HEADER + 5] ^= 0x01;
    std::fs::write(ws.path().join(LOG), &log).unwrap();
    let (c, s, _) = Catalog::open(ws.path()).unwrap();
    assert!(!s.inodes.contains_key(&6));
    assert!(s.inodes.contains_key(&5));
    assert_eq!(c.damage().len(), 1);
    assert!(c.damage()[0].names.contains(&"f6".to_string()));
    // Torn (cut short, or cut short and padded with zeros by the file system): silently cut.
    let cut = last + (pristine.len() - last) / 2;
    let mut zeros = pristine[..cut].to_vec();
    zeros.resize(pristine.len() + 100, 0);
    for log in [
        pristine[..cut].to_vec(),
        pristine[..last + 4].to_vec(),
        zeros,
    ] {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join(LOG), &log).unwrap();
        let (c, s, _) = Catalog::open(ws.path()).unwrap();
        assert!(c.damage().is_empty(), "{:?}", c.damage());
        assert!(!s.inodes.contains_key(&6));
        assert!(s.inodes.contains_key(&5));
        assert_eq!(
            std::fs::metadata(ws.path().join(LOG)).unwrap().len(),
            last as u64
        );
        assert!(!ws.path().join("quarantine").exists());
    }
}

#[test]
fn logs_of_the_old_format_replay_and_resynchronize() {
    let d = tempfile::tempdir().unwrap();
    let mut log = Vec::new();
    for i in 1..=4u64 {
        let mut line = serde_json::to_vec(&vec![
            Record::Inode(rec(i)),
            Record::Entry {
                dir: 1,
                name: format!("old{i}").into_bytes(),
                ino: Some(i),
            },
        ])
        .unwrap();
        if i == 2 {
            line[3] = b'#';
        }
        line.push(b'\n');
        log.extend(line);
    }
    std::fs::write(d.path().join(LOG), &log).unwrap();
    let (mut c, s, _) = Catalog::open(d.path()).unwrap();
    assert_eq!(s.dirs[&1].len(), 3);
    assert!(!s.inodes.contains_key(&2));
    assert_eq!(c.damage().len(), 1);
    assert!(c.damage()[0].names.contains(&"old2".to_string()));
    // Names holding RS and LF are escaped in the JSON, so they cannot fake a frame.
    let odd = vec![b'a', RS, b'\n', b'b'];
    c.append(&[Record::Entry {
        dir: 1,
        name: odd.clone(),
        ino: None,
    }])
    .unwrap();
    drop(c);
    assert_eq!(
        frame_starts(&std::fs::read(d.path().join(LOG)).unwrap()).len(),
        1
    );
    let (c, s, _) = Catalog::open(d.path()).unwrap();
    assert!(c.damage().is_empty());
    assert_eq!(s.dirs[&1][&odd], None);
    assert_eq!(s.dirs[&1].len(), 4);
}

/// A state large enough for several snapshot frames: inodes 2..=200 named `f<i>` in the
/// overlay of directory 1.
fn big_state() -> CatalogState {
    let mut s = CatalogState {
        next_ino: 500,
        generation: 9,
        ..Default::default()
    };
    for i in 2..=200u64 {
        let mut r = rec(i);
        r.name = format!("f{i}").into_bytes();
        r.parent = 1;
        s.apply(&Record::Inode(r));
        s.apply(&Record::Entry {
            dir: 1,
            name: format!("f{i}").into_bytes(),
            ino: Some(i),
        });
    }
    s
}

#[test]
fn a_damaged_snapshot_frame_costs_that_frame_alone_and_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let state = big_state();
    let (mut c, _, _) = Catalog::open(d.path()).unwrap();
    c.compact(&state).unwrap();
    drop(c);
    let pristine = std::fs::read(d.path().join(SNAP)).unwrap();
    assert_eq!(pristine[0], RS, "the snapshot is framed");
    let (_, s, _) = Catalog::open(d.path()).unwrap();
    assert_eq!(s, state);
    let starts = frame_starts(&pristine);
    assert!(starts.len() >= 6, "{} frames", starts.len());
    // The first frame holds inode records, the last one directory entries.
    let mut ends = starts[1..].to_vec();
    ends.push(pristine.len());
    for (k, (start, end)) in [
        (starts[0], ends[0]),
        (*starts.last().unwrap(), pristine.len()),
    ]
    .into_iter()
    .enumerate()
    {
        let ws = tempfile::tempdir().unwrap();
        let mut snap = pristine.clone();
        snap[(start + end) / 2] ^= 0x04;
        std::fs::write(ws.path().join(SNAP), &snap).unwrap();
        let (c, s, _) = Catalog::open(ws.path()).unwrap();
        let damage = c.damage().to_vec();
        assert_eq!(damage.len(), 1, "frame {k}: {damage:?}");
        assert_eq!(damage[0].file, SNAP);
        assert_eq!(damage[0].offset, start as u64);
        assert_eq!(damage[0].len, (end - start) as u64);
        assert!(damage[0].to_string().contains("snapshot"), "{}", damage[0]);
        // The counters are in every frame: the damage does not lose them.
        assert_eq!((s.next_ino, s.generation), (500, 9));
        let lost_inodes: Vec<u64> = (2..=200).filter(|i| !s.inodes.contains_key(i)).collect();
        let lost_names: Vec<u64> = (2..=200)
            .filter(|i| !s.dirs[&1].contains_key(format!("f{i}").as_bytes()))
            .collect();
        if k == 0 {
            assert_eq!(lost_inodes.len(), SNAP_CHUNK, "{lost_inodes:?}");
            assert!(lost_names.is_empty());
            for i in &lost_inodes {
                assert!(damage[0].inodes.contains(i), "{i}: {damage:?}");
            }
        } else {
            assert!(lost_inodes.is_empty());
            assert!(!lost_names.is_empty() && lost_names.len() <= SNAP_CHUNK);
            let f = format!("f{}", lost_names[0]);
            assert!(damage[0].names.contains(&f), "{f}: {damage:?}");
        }
        // Everything else is there, the damaged snapshot is kept aside, and the snapshot is
        // rewritten: the damage is reported once.
        let mut expect = state.clone();
        for i in &lost_inodes {
            expect.inodes.remove(i);
        }
        for i in &lost_names {
            expect
                .dirs
                .get_mut(&1)
                .unwrap()
                .remove(format!("f{i}").as_bytes());
        }
        assert_eq!(s, expect);
        let kept: Vec<_> = std::fs::read_dir(ws.path().join("quarantine"))
            .unwrap()
            .flatten()
            .map(|e| std::fs::read(e.path()).unwrap())
            .collect();
        assert_eq!(kept, vec![snap.clone()]);
        drop(c);
        let (c, s2, _) = Catalog::open(ws.path()).unwrap();
        assert!(c.damage().is_empty(), "{:?}", c.damage());
        assert_eq!(s2, expect);
    }
    // A hit on the last byte of the snapshot is damage, not a torn tail: the snapshot is
    // written whole.
    let ws = tempfile::tempdir().unwrap();
    let mut snap = pristine.clone();
    let last = snap.len() - 2;
    snap[last] = 0;
    std::fs::write(ws.path().join(SNAP), &snap).unwrap();
    let (c, _, _) = Catalog::open(ws.path()).unwrap();
    assert_eq!(c.damage().len(), 1, "{:?}", c.damage());
    // A hit on the first byte (RS) costs nothing: the checksum proves the frame.
    let ws = tempfile::tempdir().unwrap();
    let mut snap = pristine.clone();
    snap[0] = b'{';
    std::fs::write(ws.path().join(SNAP), &snap).unwrap();
    let (c, s, _) = Catalog::open(ws.path()).unwrap();
    assert!(c.damage().is_empty(), "{:?}", c.damage());
    assert_eq!(s, state);
}

#[test]
fn snapshots_of_the_old_format_load_and_are_rewritten_framed() {
    let d = tempfile::tempdir().unwrap();
    let state = big_state();
    std::fs::write(d.path().join(SNAP), serde_json::to_vec(&state).unwrap()).unwrap();
    let (mut c, s, _) = Catalog::open(d.path()).unwrap();
    assert!(c.damage().is_empty());
    assert_eq!(s, state);
    c.compact(&s).unwrap();
    drop(c);
    assert_eq!(std::fs::read(d.path().join(SNAP)).unwrap()[0], RS);
    let (_, s, _) = Catalog::open(d.path()).unwrap();
    assert_eq!(s, state);
}

#[test]
fn a_long_log_counts_its_live_records_once_per_eighth_of_growth() {
    // A commit asks whether to compact; counting the live records walks the whole inode table, so a
    // long log that is not yet worth compacting must not pay that walk on every commit.
    let d = tempfile::tempdir().unwrap();
    let (mut c, _, _) = Catalog::open(d.path()).unwrap();
    let mut counts = 0;
    let live = 10_000; // 4 × live = 40,000 batches before compaction is worth it
    for i in 0..30_000u64 {
        c.append(&[Record::Inode(rec(i % 64 + 2))]).unwrap();
        assert!(!c.wants_compaction(|| {
            counts += 1;
            live
        }));
    }
    // Checks at 20,001 and then every eighth: 20,001 → 22,501 → 25,313 → 28,477 (and not past 30,000).
    assert!(
        (1..=5).contains(&counts),
        "counted the live records {counts} times"
    );
    let mut asked = false;
    for i in 0..15_000u64 {
        c.append(&[Record::Inode(rec(i % 64 + 2))]).unwrap();
        if c.wants_compaction(|| live) {
            asked = true;
            break;
        }
    }
    assert!(asked, "a log 4.5× the live state must be compacted");
}

/// A record that only points at a mirror blob (a file of a fork's change set) is written without
/// the fields that hold their default, and a log written with every field (the encoding before)
/// replays to the same state as one written now. Fails if a default field is written again (the
/// size bound) or if a left-out field does not read back as its default.
#[test]
fn blob_records_leave_defaults_out_and_both_encodings_load() {
    let blob = InodeRecord {
        ino: 0x8000_0000_0000_1234,
        kind: Kind::File,
        base: Some(BaseRef {
            oid: "e69de29bb2d1d6434b8b29ae775ad8c2d48c5391".into(),
            path: b"d012/s5/f12345.txt".to_vec(),
            gitlink: false,
        }),
        upper: false,
        target: None,
        mode: 0o644,
        uid: 1000,
        gid: 1000,
        rdev: 0,
        atime: Ts(1_764_000_000, 123_456_789),
        mtime: Ts(1_764_000_000, 123_456_789),
        ctime: Ts(1_764_000_000, 123_456_789),
        nlink: 1,
        parent: 0x8000_0000_0000_0042,
        name: b"f12345.txt".to_vec(),
        xattrs: Default::default(),
        copied_ctime: None,
        shared: None,
    };
    let records = vec![
        Record::Inode(blob.clone()),
        Record::Inode(rec(7)),
        Record::Entry {
            dir: 1,
            name: b"f12345.txt".to_vec(),
            ino: Some(blob.ino),
        },
    ];
    let now = serde_json::to_vec(&records).unwrap();
    let one = serde_json::to_string(&Record::Inode(blob.clone())).unwrap();
    for absent in [
        "\"upper\"",
        "\"target\"",
        "\"rdev\"",
        "\"xattrs\"",
        "\"copied_ctime\"",
        "\"shared\"",
        "\"gitlink\"",
    ] {
        assert!(!one.contains(absent), "{absent} written: {one}");
    }
    assert!(one.len() <= 340, "{} bytes: {one}", one.len());
    // The encoding before: every field written.
    let full = |r: &InodeRecord| {
        let mut v = serde_json::to_value(Record::Inode(r.clone())).unwrap();
        let m = v.as_object_mut().unwrap();
        m.entry("upper").or_insert(r.upper.into());
        m.entry("target").or_insert(serde_json::Value::Null);
        m.entry("rdev").or_insert(r.rdev.into());
        m.entry("xattrs").or_insert(serde_json::json!([]));
        m.entry("copied_ctime").or_insert(serde_json::Value::Null);
        m.entry("shared").or_insert(serde_json::Value::Null);
        if let Some(b) = m.get_mut("base").and_then(|b| b.as_object_mut()) {
            b.entry("gitlink").or_insert(false.into());
        }
        v
    };
    let before = serde_json::to_vec(&serde_json::json!([
        full(&blob),
        full(&rec(7)),
        serde_json::to_value(&records[2]).unwrap(),
    ]))
    .unwrap();
    assert!(
        before.len() > now.len() + 60,
        "{}",
        String::from_utf8_lossy(&before)
    );
    assert_eq!(
        serde_json::from_slice::<Vec<Record>>(&before).unwrap(),
        records
    );
    assert_eq!(
        serde_json::from_slice::<Vec<Record>>(&now).unwrap(),
        records
    );
    // Through the log: a frame of each encoding, one after the other, replays both.
    let d = tempfile::tempdir().unwrap();
    let mut log = Vec::new();
    for payload in [&before, &now] {
        log.push(RS);
        log.extend(format!("{:08x} {:016x} ", payload.len(), frame::checksum(payload)).bytes());
        log.extend_from_slice(payload);
        log.push(b'\n');
    }
    std::fs::write(d.path().join(LOG), &log).unwrap();
    let (c, s, _) = Catalog::open(d.path()).unwrap();
    assert!(c.damage().is_empty());
    assert_eq!(s.inodes[&blob.ino], blob);
    assert_eq!(s.inodes[&7], rec(7));
    assert_eq!(s.dirs[&1][b"f12345.txt".as_slice()], Some(blob.ino));
}
