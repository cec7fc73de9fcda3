//! What git's fsmonitor hook (protocol v2) prints for an answer of the daemon
//! ([`super::FsmonitorAnswer`]): the token, then each changed path, or `/` when everything may have
//! changed, each ended by NUL. The one encoding of both hooks, `octofs fsmonitor` and the
//! `octofs-fsmonitor` program; std only (that program includes this file by path: it links
//! nothing but std and the wire's JSON). Does no I/O.

/// The hook's output for `token`, `everything` and `paths`.
pub fn encode(token: &str, everything: bool, paths: &[String]) -> Vec<u8> {
    let size = token.len() + 3 + paths.iter().map(|p| p.len() + 1).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(token.as_bytes());
    out.push(0);
    if everything {
        out.extend_from_slice(b"/\0");
    } else {
        for p in paths {
            out.extend_from_slice(p.as_bytes());
            out.push(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::encode;

    /// Catches: a path or the token not ended by NUL, paths printed along with `/`.
    #[test]
    fn the_answer_is_what_git_reads() {
        let paths = ["a.txt".to_string(), "dir/".to_string()];
        assert_eq!(
            encode("octofs:1:2", false, &paths),
            b"octofs:1:2\0a.txt\0dir/\0"
        );
        assert_eq!(encode("octofs:1:3", false, &[]), b"octofs:1:3\0");
        let ignored = ["ignored".to_string()];
        assert_eq!(encode("octofs:1:4", true, &ignored), b"octofs:1:4\0/\0");
    }
}
