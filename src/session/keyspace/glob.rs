//! Redis's glob patterns (`MATCH`, `KEYS`), matched in respway for the keys of a
//! `remove_prefix` route's cluster when the pattern cannot be narrowed for it.

/// Redis's `stringmatchlen` (case-sensitive): `*`, `?`, `[abc]`, `[^a-z]`, `\x`.
pub(crate) fn glob(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    // Where to resume after the last `*`: (pattern after it, string position).
    let mut star: Option<(usize, usize)> = None;
    loop {
        if p < pattern.len() && pattern[p] == b'*' {
            while p < pattern.len() && pattern[p] == b'*' {
                p += 1;
            }
            if p == pattern.len() {
                return true;
            }
            star = Some((p, i));
            continue;
        }
        if i == s.len() {
            return p == pattern.len();
        }
        if let Some((ok, next)) = one(pattern, p, s[i]) {
            if ok {
                p = next;
                i += 1;
                continue;
            }
        }
        // Mismatch (or pattern exhausted): let the last `*` take one more byte.
        match star {
            Some((sp, si)) if si < s.len() => {
                star = Some((sp, si + 1));
                p = sp;
                i = si + 1;
            }
            _ => return false,
        }
    }
}

/// Whether the pattern token at `p` (not `*`) matches byte `c`, and where the next token
/// starts; `None` at the pattern's end.
fn one(pattern: &[u8], p: usize, c: u8) -> Option<(bool, usize)> {
    match *pattern.get(p)? {
        b'?' => Some((true, p + 1)),
        b'\\' if p + 1 < pattern.len() => Some((pattern[p + 1] == c, p + 2)),
        b'[' => {
            let mut j = p + 1;
            let not = pattern.get(j) == Some(&b'^');
            if not {
                j += 1;
            }
            let mut hit = false;
            // An unterminated class ends at the pattern's end, as in Redis.
            while j < pattern.len() && pattern[j] != b']' {
                if pattern[j] == b'\\' && j + 1 < pattern.len() {
                    hit |= pattern[j + 1] == c;
                    j += 2;
                } else if j + 2 < pattern.len() && pattern[j + 1] == b'-' {
                    let (a, b) = (pattern[j], pattern[j + 2]);
                    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                    hit |= (lo..=hi).contains(&c);
                    j += 3;
                } else {
                    hit |= pattern[j] == c;
                    j += 1;
                }
            }
            let next = (j + 1).min(pattern.len());
            Some((hit != not, next))
        }
        b => Some((b == c, p + 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyspace_glob_follows_redis() {
        let yes: &[(&[u8], &[u8])] = &[
            (b"*", b""),
            (b"*", b"abc"),
            (b"a*", b"abc"),
            (b"*c", b"abc"),
            (b"a*c", b"abbbc"),
            (b"a?c", b"abc"),
            (b"[ab]x", b"bx"),
            (b"[^ab]x", b"cx"),
            (b"[a-c]", b"b"),
            (b"[c-a]", b"b"),
            (b"\\*", b"*"),
            (b"[\\]]", b"]"),
            (b"*a*b*", b"xxaxxbxx"),
            (b"side:*", b"side:k1"),
        ];
        for (p, s) in yes {
            assert!(glob(p, s), "{:?} {:?}", p, s);
        }
        let no: &[(&[u8], &[u8])] = &[
            (b"a*", b"bac"),
            (b"*c", b"abd"),
            (b"a?c", b"ac"),
            (b"[ab]x", b"cx"),
            (b"[^ab]x", b"ax"),
            (b"\\*", b"a"),
            (b"abc", b"abcd"),
            (b"", b"a"),
        ];
        for (p, s) in no {
            assert!(!glob(p, s), "{:?} {:?}", p, s);
        }
    }
}
