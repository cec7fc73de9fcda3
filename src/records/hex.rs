//! Object ids in durable records as the 40-hex strings the records have always held
//! (`"base_commit": "3f2a…"`), for `#[serde(with = "crate::records::hex")]` on a
//! [`gix::ObjectId`] field and `#[serde(with = "crate::records::hex::option")]` on an
//! `Option<gix::ObjectId>` one. gix's own serde form (`{"Sha1":[…]}`) would change every record on
//! disk. A string that is not an object id is a clear error naming it, which makes the record
//! corrupt ([`super::RecordError::Corrupt`]). Knows nothing of which records hold ids.

use gix::ObjectId;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

/// Writes `id` as its full hex string.
pub fn serialize<S: Serializer>(id: &ObjectId, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

/// Reads a hex object id.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectId, D::Error> {
    let s = String::deserialize(d)?;
    parse(&s).map_err(D::Error::custom)
}

/// `s` as an object id, or why it is not one.
fn parse(s: &str) -> Result<ObjectId, String> {
    ObjectId::from_hex(s.as_bytes()).map_err(|e| format!("not a hex object id: {s:?} ({e})"))
}

/// The same for an optional id: `null` when there is none.
pub mod option {
    use gix::ObjectId;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &Option<ObjectId>, s: S) -> Result<S::Ok, S::Error> {
        match id {
            Some(id) => s.collect_str(id),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ObjectId>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| super::parse(&s).map_err(D::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct R {
        #[serde(with = "super")]
        id: ObjectId,
        #[serde(default, with = "super::option")]
        maybe: Option<ObjectId>,
    }

    const HEX: &str = "0123456789abcdef0123456789abcdef01234567";

    /// Catches: gix's own form (`{"Sha1":[…]}`) written instead of the hex string, or a `None`
    /// written as anything but `null`.
    #[test]
    fn an_id_is_written_and_read_as_its_hex_string() {
        let text = format!(r#"{{"id":"{HEX}","maybe":null}}"#);
        let r: R = serde_json::from_str(&text).expect("parse");
        assert_eq!(r.id.to_string(), HEX);
        assert_eq!(r.maybe, None);
        assert_eq!(serde_json::to_string(&r).expect("encode"), text);
        let some = format!(r#"{{"id":"{HEX}","maybe":"{HEX}"}}"#);
        let r: R = serde_json::from_str(&some).expect("parse");
        assert_eq!(r.maybe, Some(r.id));
        assert_eq!(serde_json::to_string(&r).expect("encode"), some);
        let missing: R = serde_json::from_str(&format!(r#"{{"id":"{HEX}"}}"#)).expect("parse");
        assert_eq!(missing.maybe, None);
    }

    /// Catches: a malformed id read as some id (or a panic) instead of an error that names it.
    #[test]
    fn a_malformed_id_is_a_clear_error() {
        for bad in ["0", "zz23456789abcdef0123456789abcdef01234567", ""] {
            for text in [
                format!(r#"{{"id":"{bad}"}}"#),
                format!(r#"{{"id":"{HEX}","maybe":"{bad}"}}"#),
            ] {
                let e = serde_json::from_str::<R>(&text)
                    .expect_err(&text)
                    .to_string();
                assert!(
                    e.starts_with(&format!("not a hex object id: {bad:?} (")),
                    "{text}: {e}"
                );
            }
        }
        let e = serde_json::from_str::<R>(r#"{"id":7}"#).expect_err("a number");
        assert!(e.to_string().contains("expected a string"), "{e}");
    }
}
