//! The two halves every record beside a snapshot shares (the POSIX record, the kept side, the
//! repository record): a versioned JSON document decoded with one check of its version, and the
//! trailer line (`Octofs-…: <id>`) by which a snapshot message names its record.
//!
//! Owns nothing on disk and reads no repository; it must not learn what a record holds (each
//! record's own module does).

use crate::git::error::{Context, Error};
use gix::ObjectId;
use serde::de::DeserializeOwned;

/// Decodes `bytes` as a record `what` ("POSIX record", "kept record") of format version
/// `supported`: a document that does not parse, or of another version, is one error line.
pub fn decode_versioned<T: DeserializeOwned>(
    bytes: &[u8],
    what: &str,
    supported: u32,
    version: impl Fn(&T) -> u32,
) -> Result<T, Error> {
    // The version first: a record of another version is refused as such, whatever else in it
    // this version cannot read (an object id is parsed as the record is).
    #[derive(serde::Deserialize)]
    struct Version {
        version: u32,
    }
    let unsupported = |v: u32| {
        Error::Invalid(format!(
            "{what} version {v} is not supported (this octofs reads version {supported})"
        ))
    };
    if let Ok(Version { version: v }) = serde_json::from_slice(bytes)
        && v != supported
    {
        return Err(unsupported(v));
    }
    let r: T = serde_json::from_slice(bytes).context(|| format!("bad {what}"))?;
    let v = version(&r);
    if v != supported {
        return Err(unsupported(v));
    }
    Ok(r)
}

/// The object id of the first line of `message` starting with `trailer` (`"Octofs-Kept: "`).
pub fn trailer_id(message: &[u8], trailer: &str) -> Option<ObjectId> {
    message.split(|b| *b == b'\n').find_map(|l| {
        let l = std::str::from_utf8(l).ok()?;
        ObjectId::from_hex(l.strip_prefix(trailer)?.trim().as_bytes()).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct R {
        version: u32,
    }

    #[test]
    fn a_version_it_does_not_read_is_one_line() {
        let r: R =
            decode_versioned(br#"{"version":1}"#, "test record", 1, |r: &R| r.version).unwrap();
        assert_eq!(r.version, 1);
        let e = decode_versioned(br#"{"version":7}"#, "test record", 1, |r: &R| r.version)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("test record version 7"), "{e}");
        assert!(decode_versioned(b"{", "test record", 1, |r: &R| r.version).is_err());
    }

    #[test]
    fn the_trailer_names_the_id() {
        let id = "0123456789abcdef0123456789abcdef01234567";
        let msg = format!("subject\n\nOctofs-Posix: {id}\nOctofs-Kept: zz\n");
        assert_eq!(
            trailer_id(msg.as_bytes(), "Octofs-Posix: ").map(|i| i.to_string()),
            Some(id.to_string())
        );
        assert_eq!(trailer_id(msg.as_bytes(), "Octofs-Kept: "), None);
        assert_eq!(trailer_id(b"\xff\nno", "Octofs-Repo: "), None);
    }
}
