//! Extended attributes, stored in the inode's catalog record (`system.*` unsupported). A workspace
//! that never set one answers `getxattr` without taking the state lock, and one that never set
//! `security.capability` (which the kernel asks of each file before its first write) answers that
//! name without it.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use crate::fs::FsError;
use fuser::Errno;

use crate::cow::catalog::Ts;

use super::{WorkspaceFs, tx::Tx, types::XattrReply};

const XATTR_NAME_MAX: usize = 255;
/// The extended attribute holding a file's capabilities.
pub(super) const CAPABILITY: &[u8] = b"security.capability";
const XATTR_SIZE_MAX: usize = 65_536;
impl WorkspaceFs {
    pub(super) fn xattr_name(name: &OsStr) -> Result<&[u8], FsError> {
        let b = name.as_bytes();
        if b.is_empty() || b.len() > XATTR_NAME_MAX {
            return Err(Errno::ERANGE.into());
        }
        if b.starts_with(b"system.") {
            // POSIX ACLs and other system attributes are not supported.
            return Err(Errno::EOPNOTSUPP.into());
        }
        Ok(b)
    }

    pub fn setxattr(
        &self,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), FsError> {
        let name = Self::xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG.into());
        }
        // Raised before the attribute exists: a lock-free `getxattr` that sees it down ran before
        // this set took effect.
        self.any_xattr.store(true, Ordering::SeqCst);
        if name == CAPABILITY {
            self.any_capability.store(true, Ordering::SeqCst);
        }
        let mut st = self.lock_for(ino)?;
        let exists = st.node(ino)?.rec.xattrs.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST.into());
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(Errno::NO_XATTR.into());
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        r.xattrs.insert(name.to_vec(), value.to_vec());
        r.ctime = Ts::now();
        st.commit(tx)
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> Result<XattrReply, FsError> {
        let name = Self::xattr_name(name)?;
        if !self.any_xattr.load(Ordering::SeqCst)
            || (name == CAPABILITY && !self.any_capability.load(Ordering::SeqCst))
        {
            return Err(Errno::NO_XATTR.into());
        }
        let st = self.lock();
        let rec = self.record(&st, ino)?;
        let v = rec.xattrs.get(name).ok_or(Errno::NO_XATTR)?;
        sized(v.clone(), size)
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> Result<XattrReply, FsError> {
        let st = self.lock();
        let mut out = Vec::new();
        for k in self.record(&st, ino)?.xattrs.keys() {
            out.extend_from_slice(k);
            out.push(0);
        }
        sized(out, size)
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<(), FsError> {
        let name = Self::xattr_name(name)?;
        let mut st = self.lock_for(ino)?;
        if !st.node(ino)?.rec.xattrs.contains_key(name) {
            return Err(Errno::NO_XATTR.into());
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        r.xattrs.remove(name);
        r.ctime = Ts::now();
        st.commit(tx)
    }
}

pub(super) fn sized(v: Vec<u8>, size: u32) -> Result<XattrReply, FsError> {
    if size == 0 {
        Ok(XattrReply::Size(v.len() as u32))
    } else if (size as usize) < v.len() {
        Err(Errno::ERANGE.into())
    } else {
        Ok(XattrReply::Data(v))
    }
}
