//! How an errno is shown to a user: its symbolic name and what it means, e.g. "ENOENT (No such
//! file or directory)" — never `Errno(NonZeroI32…)` or a bare number. Shared by every layer that
//! reports a failed filesystem operation in a message; it decides nothing.

/// The symbolic name and meaning of errno `code`, e.g. "EACCES (Permission denied)".
pub fn describe(code: i32) -> String {
    let meaning = std::io::Error::from_raw_os_error(code).to_string();
    // The standard library appends " (os error N)"; the name says it better.
    let meaning = meaning
        .strip_suffix(&format!(" (os error {code})"))
        .unwrap_or(&meaning)
        .to_string();
    match name(code) {
        Some(n) => format!("{n} ({meaning})"),
        None => format!("errno {code} ({meaning})"),
    }
}

/// [`describe`] for the core's errnos.
pub fn describe_errno(e: fuser::Errno) -> String {
    describe(e.code())
}

/// The symbolic name of the errnos a workspace operation can end with.
pub fn name(code: i32) -> Option<&'static str> {
    Some(match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESTALE => "ESTALE",
        libc::EDQUOT => "EDQUOT",
        libc::ECANCELED => "ECANCELED",
        libc::EINTR => "EINTR",
        libc::ENXIO => "ENXIO",
        libc::ETXTBSY => "ETXTBSY",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_read_as_name_and_meaning() {
        assert_eq!(describe(libc::ENOENT), "ENOENT (No such file or directory)");
        assert_eq!(
            describe_errno(fuser::Errno::ENOSPC),
            "ENOSPC (No space left on device)"
        );
        // Nothing of the Debug form leaks into a message.
        assert!(!describe_errno(fuser::Errno::EIO).contains("NonZero"));
        assert!(describe(4095).starts_with("errno 4095 ("));
    }
}
