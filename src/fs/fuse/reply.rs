//! Turning a request's outcome into fuser's reply, and fuser's argument types into the core's: one
//! function per reply kind, each answering a failure with [`answer`]'s errno (logged and counted
//! once). Decides nothing: TTLs and FOPEN flags come with the outcome ([`Entry`], [`Opening`]).

use fuser::{
    BackingId, FileHandle, Generation, ReplyAttr, ReplyCreate, ReplyData, ReplyEmpty, ReplyEntry,
    ReplyLseek, ReplyOpen, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};

use crate::fs::caching::{Entry, Opening};
use crate::fs::failures::{Cx, answer};
use crate::fs::{Caller, FsError, SetTime, XattrReply};

/// The kernel's mark on a request it sends again after the daemon that read it died
/// (`FUSE_UNIQUE_RESEND`, set by `FUSE_NOTIFY_RESEND`): its change may be applied already
/// (`workspace/resend.rs`).
const UNIQUE_RESEND: u64 = 1 << 63;

pub fn resent(req: &Request) -> bool {
    req.unique().0 & UNIQUE_RESEND != 0
}

pub fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

pub fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    }
}

pub fn entry(cx: &Cx, reply: ReplyEntry, r: Result<Entry, FsError>) {
    match r {
        Ok(e) => reply.entry_with_ttls(&e.attr_ttl, &e.entry_ttl, &e.attr, Generation(0)),
        Err(e) => reply.error(answer(cx, e)),
    }
}

pub fn attr(cx: &Cx, reply: ReplyAttr, r: Result<Entry, FsError>) {
    match r {
        Ok(e) => reply.attr(&e.attr_ttl, &e.attr),
        Err(e) => reply.error(answer(cx, e)),
    }
}

pub fn data(cx: &Cx, reply: ReplyData, r: Result<Vec<u8>, FsError>) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(answer(cx, e)),
    }
}

pub fn written(cx: &Cx, reply: ReplyWrite, r: Result<u32, FsError>) {
    match r {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(answer(cx, e)),
    }
}

pub fn empty(cx: &Cx, reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(answer(cx, e)),
    }
}

pub fn offset(cx: &Cx, reply: ReplyLseek, r: Result<i64, FsError>) {
    match r {
        Ok(off) => reply.offset(off),
        Err(e) => reply.error(answer(cx, e)),
    }
}

pub fn xattr(cx: &Cx, reply: ReplyXattr, r: Result<XattrReply, FsError>) {
    match r {
        Ok(XattrReply::Size(n)) => reply.size(n),
        Ok(XattrReply::Data(d)) => reply.data(&d),
        Err(e) => reply.error(answer(cx, e)),
    }
}

pub fn opened(cx: &Cx, reply: ReplyOpen, r: Result<Opening<BackingId>, FsError>) {
    match r {
        Ok(Opening {
            fh,
            flags,
            backing: Some(id),
        }) => reply.opened_passthrough(FileHandle(fh), flags, &id),
        Ok(Opening { fh, flags, .. }) => reply.opened(FileHandle(fh), flags),
        Err(e) => reply.error(answer(cx, e)),
    }
}

/// CREATE's entry carries one TTL for the name and its attributes (fuser's `ReplyCreate` has one):
/// only the core creates, and its entries keep both for the same time (`caching::TTL`).
pub fn created(cx: &Cx, reply: ReplyCreate, r: Result<(Entry, Opening<BackingId>), FsError>) {
    match r {
        Ok((e, Opening { fh, flags, backing })) => match backing {
            Some(id) => reply.created_passthrough(
                &e.attr_ttl,
                &e.attr,
                Generation(0),
                FileHandle(fh),
                flags,
                &id,
            ),
            None => reply.created(&e.attr_ttl, &e.attr, Generation(0), FileHandle(fh), flags),
        },
        Err(e) => reply.error(answer(cx, e)),
    }
}
