//! The data plane's side of ACL users: a listener's users compiled once per configuration
//! ([`Acl`]), what a session authenticated as ([`User`]), the refusals in Redis's words, and
//! the per-address limit of failed `AUTH` attempts ([`AddressLimiter`]).
//!
//! A listener with no password and no users has no [`Acl`]: its sessions are `default`
//! with no permissions to check (one branch per command). A user who may do everything
//! (`allcommands allkeys allchannels`, the `default` user of `downstream_auth_password`) is
//! checked for nothing either.

use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use respway_filters::acl::{password_matches, Denied, Digest, Permissions};
use respway_filters::command::CommandInfo;
use respway_filters::model::Listener;
use respway_filters::request::{error_reply, Reply};

/// A user as sessions see it.
#[derive(Debug)]
pub(crate) struct User {
    /// The user's name.
    pub(crate) name: Arc<str>,
    /// Off: `AUTH` as this user fails.
    pub(crate) enabled: bool,
    passwords: Vec<Digest>,
    nopass: bool,
    /// `None`: every command, key and channel.
    pub(crate) perms: Option<Arc<Permissions>>,
    /// The permission part of `ACL LIST`.
    describe: String,
}

impl User {
    /// The user's `ACL LIST` line; passwords are shown as `#<redacted>`, one per password.
    pub(crate) fn list_line(&self) -> String {
        let mut s = format!(
            "user {} {}",
            self.name,
            if self.enabled { "on" } else { "off" }
        );
        if self.nopass {
            s.push_str(" nopass");
        }
        for _ in &self.passwords {
            s.push_str(" #<redacted>");
        }
        s.push(' ');
        s.push_str(&self.describe);
        s
    }
}

/// A listener's users, compiled.
#[derive(Debug)]
pub(crate) struct Acl {
    users: Vec<Arc<User>>,
}

const UNRESTRICTED: &str = "~* &* +@all";

impl Acl {
    /// The users of `l` (its `downstream_password` as the `default` user's), or `None` when
    /// it has neither users nor a password. Rules were checked when the configuration was
    /// read; a user whose rules still do not compile gets no permission at all.
    pub(crate) fn build(l: &Listener) -> Option<Arc<Acl>> {
        if l.users.is_empty() && l.downstream_password.is_none() {
            return None;
        }
        let mut users = Vec::new();
        if let Some(p) = &l.downstream_password {
            users.push(Arc::new(User {
                name: Arc::from("default"),
                enabled: true,
                passwords: vec![respway_filters::acl::sha256(p.as_bytes())],
                nopass: false,
                perms: None,
                describe: UNRESTRICTED.to_string(),
            }));
        }
        for u in &l.users {
            let perms = Permissions::compile(&u.rules, u.read_only).unwrap_or_else(|e| {
                tracing::warn!(user = %u.name, error = %e, "ACL rules do not compile: no permissions");
                Permissions::none()
            });
            users.push(Arc::new(User {
                name: Arc::from(u.name.as_str()),
                enabled: u.enabled,
                passwords: u.passwords.clone(),
                nopass: u.nopass,
                describe: perms.describe(),
                perms: (!perms.unrestricted()).then(|| Arc::new(perms)),
            }));
        }
        Some(Arc::new(Acl { users }))
    }

    /// The user named `name`.
    pub(crate) fn find(&self, name: &[u8]) -> Option<&Arc<User>> {
        self.users.iter().find(|u| u.name.as_bytes() == name)
    }

    /// The `default` user when it needs no `AUTH` (enabled, `nopass`).
    pub(crate) fn implicit_default(&self) -> Option<&Arc<User>> {
        self.find(b"default").filter(|u| u.enabled && u.nopass)
    }

    /// The user `name` (`default` when `None`) if `password` is one of its passwords (any
    /// password for `nopass`) and it is enabled. The password is hashed and compared with
    /// every digest whether or not the user exists.
    pub(crate) fn authenticate(&self, name: Option<&[u8]>, password: &[u8]) -> Option<Arc<User>> {
        let user = self.find(name.unwrap_or(b"default"));
        let digests = user.map_or(&[][..], |u| &u.passwords[..]);
        let matched = password_matches(digests, password);
        user.filter(|u| u.enabled && (u.nopass || matched)).cloned()
    }

    /// Every user's `ACL LIST` line, in configuration order.
    pub(crate) fn list(&self) -> Vec<String> {
        self.users.iter().map(|u| u.list_line()).collect()
    }

    /// Every user's name.
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.users.iter().map(|u| u.name.clone()).collect()
    }
}

/// `ACL LIST` of a listener without users or password.
pub(crate) fn unrestricted_default_line() -> String {
    format!("user default on nopass {UNRESTRICTED}")
}

/// The refusal of a command the user may not run, in Redis 7.2's words.
pub(crate) fn denied(d: Denied, user: &str, cmd: &CommandInfo) -> Reply {
    match d {
        Denied::Command => error_reply(&format!(
            "NOPERM User {user} has no permissions to run the '{}' command",
            cmd.name
        )),
        Denied::Key => error_reply("NOPERM No permissions to access a key"),
        Denied::Channel => error_reply("NOPERM No permissions to access a channel"),
        Denied::SortBy => {
            error_reply("ERR BY option of SORT denied due to insufficient ACL permissions.")
        }
        Denied::SortGet => {
            error_reply("ERR GET option of SORT denied due to insufficient ACL permissions.")
        }
        Denied::Script => error_reply(&format!(
            "NOPERM User {user} may not run scripts through respway: a script runs on the shard \
             with the upstream user's rights, beyond this user's rules (the listener's \
             allow_restricted_scripts allows it)"
        )),
    }
}

/// Failed `AUTH` attempts from one address before `AUTH` from it is refused.
pub(crate) const FAILURES_PER_ADDRESS: u32 = 20;
/// How long `AUTH` from an address is refused after [`FAILURES_PER_ADDRESS`] failures; also
/// how long a failure is remembered (a run of failures each less than this apart counts).
pub(crate) const ADDRESS_COOLDOWN: Duration = Duration::from_secs(60);
/// Sets of the table, and addresses per set: 4096 addresses at most, a few dozen bytes
/// each, whatever the number of clients.
const SETS: usize = 1024;
const WAYS: usize = 4;

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The address (IPv6 by its /64), `None` when free.
    key: Option<IpAddr>,
    failures: u32,
    last: Instant,
    blocked_until: Option<Instant>,
}

/// Failed `AUTH` attempts per client address, in a fixed-size set-associative table: an
/// address is found in one set of [`WAYS`] slots (by a hash seeded per process); when the
/// set is full the slot whose last failure is oldest is taken over. Memory is bounded; an
/// attacker with many addresses can only make the table forget, not block other addresses.
#[derive(Debug)]
pub(crate) struct AddressLimiter {
    slots: Mutex<Vec<Slot>>,
    seed: std::collections::hash_map::RandomState,
    limit: u32,
    cooldown: Duration,
}

impl Default for AddressLimiter {
    fn default() -> Self {
        AddressLimiter::new(FAILURES_PER_ADDRESS, ADDRESS_COOLDOWN)
    }
}

/// IPv4 as it is, IPv6 by its /64 (one host usually holds a whole /64).
fn key_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl AddressLimiter {
    /// A table that refuses an address for `cooldown` after `limit` failures.
    pub(crate) fn new(limit: u32, cooldown: Duration) -> Self {
        let now = Instant::now();
        AddressLimiter {
            slots: Mutex::new(vec![
                Slot {
                    key: None,
                    failures: 0,
                    last: now,
                    blocked_until: None,
                };
                SETS * WAYS
            ]),
            seed: Default::default(),
            limit,
            cooldown,
        }
    }

    fn set_of(&self, key: IpAddr) -> usize {
        (self.seed.hash_one(key) as usize % SETS) * WAYS
    }

    /// Seconds left while `ip` is refused, else `None`.
    pub(crate) fn blocked(&self, ip: IpAddr, now: Instant) -> Option<u64> {
        let key = key_of(ip);
        let base = self.set_of(key);
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots[base..base + WAYS]
            .iter()
            .find(|s| s.key == Some(key))
            .and_then(|s| s.blocked_until)
            .filter(|&t| t > now)
            .map(|t| (t - now).as_secs().max(1))
    }

    /// Counts a failed attempt from `ip`; true when it starts the address's cool-down.
    pub(crate) fn failed(&self, ip: IpAddr, now: Instant) -> bool {
        let key = key_of(ip);
        let base = self.set_of(key);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let set = &mut slots[base..base + WAYS];
        let i = set
            .iter()
            .position(|s| s.key == Some(key))
            .or_else(|| set.iter().position(|s| s.key.is_none()))
            .unwrap_or_else(|| {
                (0..WAYS)
                    .min_by_key(|&i| set[i].blocked_until.unwrap_or(set[i].last))
                    .unwrap_or(0)
            });
        let s = &mut set[i];
        let stale = s.key != Some(key)
            || now.saturating_duration_since(s.last) >= self.cooldown
            || s.blocked_until.is_some_and(|t| t <= now);
        if stale {
            *s = Slot {
                key: Some(key),
                failures: 0,
                last: now,
                blocked_until: None,
            };
        }
        s.failures += 1;
        s.last = now;
        if s.failures >= self.limit && s.blocked_until.is_none() {
            s.blocked_until = Some(now + self.cooldown);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_refused_after_the_limit_and_forgiven_after_the_cooldown() {
        let l = AddressLimiter::new(3, Duration::from_secs(60));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        assert!(!l.failed(a, t0));
        assert!(!l.failed(a, t0));
        assert_eq!(l.blocked(a, t0), None);
        assert!(l.failed(a, t0));
        assert_eq!(l.blocked(a, t0), Some(60));
        assert_eq!(l.blocked(b, t0), None, "another address is not refused");
        let later = t0 + Duration::from_secs(61);
        assert_eq!(l.blocked(a, later), None);
        assert!(
            !l.failed(a, later),
            "the count starts again after the cool-down"
        );
    }

    #[test]
    fn ipv6_addresses_count_by_their_64() {
        let l = AddressLimiter::new(2, Duration::from_secs(60));
        let t = Instant::now();
        l.failed("2001:db8::1".parse().unwrap(), t);
        l.failed("2001:db8::2".parse().unwrap(), t);
        assert!(l.blocked("2001:db8::3".parse().unwrap(), t).is_some());
        assert!(l.blocked("2001:db8:1::1".parse().unwrap(), t).is_none());
    }

    #[test]
    fn the_table_stays_bounded_under_many_addresses() {
        let l = AddressLimiter::new(2, Duration::from_secs(60));
        let t = Instant::now();
        for i in 0..100_000u32 {
            l.failed(IpAddr::V4(i.into()), t);
        }
        assert_eq!(l.slots.lock().unwrap().len(), SETS * WAYS);
    }
}
