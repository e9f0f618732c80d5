//! Hashtags: the part of a key that decides its shard, so related keys can be kept together.
//!
//! All the systems we emulate take the first opening delimiter and the first closing delimiter
//! after it. They differ only on an empty tag (`"{}abc"`):
//!
//! - Redis Cluster, Envoy `redis_proxy` and twemproxy hash the **whole key** when the tag is empty
//!   (twemproxy wants at least one byte between the delimiters);
//! - Codis hashes the **empty** tag.
//!
//! A missing opening delimiter, or no closing delimiter after it, means the whole key everywhere.

use crate::model::HashTag;

/// The hashtag'd part of `key` under `tag`.
///
/// Finds the first `tag.open`, then the first `tag.close` after it, and returns the bytes between
/// them. Returns the whole key when there is no such pair, and also when the bytes between are
/// empty unless `allow_empty` is set (Codis). Never allocates.
///
/// ```
/// use respway_filters::hash::hashtag_slice;
/// use respway_filters::model::HashTag;
/// let tag = HashTag::default();
/// assert_eq!(hashtag_slice(b"{user1000}.following", tag, false), b"user1000");
/// assert_eq!(hashtag_slice(b"{}abc", tag, false), b"{}abc");
/// assert_eq!(hashtag_slice(b"{}abc", tag, true), b"");
/// ```
pub fn hashtag_slice(key: &[u8], tag: HashTag, allow_empty: bool) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == tag.open) else {
        return key;
    };
    let rest = &key[open + 1..];
    let Some(len) = rest.iter().position(|&b| b == tag.close) else {
        return key;
    };
    if len == 0 && !allow_empty {
        return key;
    }
    &rest[..len]
}

/// [`hashtag_slice`] when the cluster has a hashtag rule, the whole key when it has none.
#[inline]
pub(crate) fn tagged(key: &[u8], tag: Option<HashTag>, allow_empty: bool) -> &[u8] {
    match tag {
        Some(tag) => hashtag_slice(key, tag, allow_empty),
        None => key,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const BRACES: HashTag = HashTag {
        open: b'{',
        close: b'}',
    };

    fn redis(key: &str) -> &str {
        std::str::from_utf8(hashtag_slice(key.as_bytes(), BRACES, false)).unwrap()
    }

    fn codis(key: &str) -> &str {
        std::str::from_utf8(hashtag_slice(key.as_bytes(), BRACES, true)).unwrap()
    }

    /// Envoy `conn_pool_impl_test.cc`, `RedisConnPoolImplTest.Hashtagging`.
    #[test]
    fn envoy_redis_proxy_hashtagging() {
        assert_eq!(redis("{foo}.bar"), "foo");
        assert_eq!(redis("foo{}{bar}"), "foo{}{bar}");
        assert_eq!(redis("foo{{bar}}zap"), "{bar");
        assert_eq!(redis("foo{bar}{zap}"), "bar");
    }

    /// The Redis Cluster specification's hash tag examples.
    #[test]
    fn redis_cluster_spec_examples() {
        assert_eq!(redis("{user1000}.following"), "user1000");
        assert_eq!(redis("{user1000}.followers"), "user1000");
        assert_eq!(redis("foo{}{bar}"), "foo{}{bar}");
        assert_eq!(redis("foo{{bar}}zap"), "{bar");
        assert_eq!(redis("foo{bar}{zap}"), "bar");
        assert_eq!(redis("no-tag"), "no-tag");
        assert_eq!(redis("open{only"), "open{only");
        assert_eq!(redis("close}only{"), "close}only{");
        assert_eq!(redis(""), "");
    }

    /// Codis `pkg/proxy/mapper_test.go`, `TestHashSlot`: key → the string it must hash like.
    pub(crate) const CODIS_CASES: [(&str, &str); 12] = [
        ("{abc}", "abc"),
        ("{{{abc1}abc2}", "{{abc1"),
        ("abc1{abc2{abc3}", "abc2{abc3"),
        ("{{{{abc", "{{{{abc"),
        ("{{{{abc}", "{{{abc"),
        ("{{}{{abc", "{"),
        ("abc}{abc", "abc}{abc"),
        ("abc}{123}456", "123"),
        ("123{abc}456", "abc"),
        ("{}abc", ""),
        ("abc{}123", ""),
        ("123{456}", "456"),
    ];

    #[test]
    fn codis_mapper_test_cases() {
        for (key, want) in CODIS_CASES {
            assert_eq!(codis(key), want, "key {key:?}");
        }
    }

    /// Twemproxy's rule (at least one byte between the delimiters) is the Redis rule, also with
    /// other delimiters, including equal ones.
    #[test]
    fn custom_delimiters() {
        let dollars = HashTag {
            open: b'$',
            close: b'$',
        };
        assert_eq!(hashtag_slice(b"a$tag$b", dollars, false), b"tag");
        assert_eq!(hashtag_slice(b"a$$b", dollars, false), b"a$$b");
        let colons = HashTag {
            open: b':',
            close: b':',
        };
        assert_eq!(hashtag_slice(b"user:42:name", colons, false), b"42");
    }

    #[test]
    fn tagged_without_rule_is_whole_key() {
        assert_eq!(tagged(b"{a}b", None, false), b"{a}b");
        assert_eq!(tagged(b"{a}b", Some(BRACES), false), b"a");
    }
}
