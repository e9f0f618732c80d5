//! The data plane's side of ACL users: a listener's users compiled once per configuration
//! ([`Acl`]), what a session authenticated as ([`User`]), the refusals in Redis's words, and
//! the process's rate of failed `AUTH` attempts ([`AuthTarpit`]).
//!
//! A listener with no password and no users has no [`Acl`]: its sessions are `default`
//! with no permissions to check (one branch per command). A user who may do everything
//! (`allcommands allkeys allchannels`, the `default` user of `downstream_auth_password`) is
//! checked for nothing either.

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

/// Failed `AUTH` attempts per second, over the whole process, answered at once; past them
/// each failure is answered [`TARPIT_DELAY`] late.
pub(crate) const FAILURES_PER_SECOND: u32 = 10;
/// How late a failed `AUTH` past [`FAILURES_PER_SECOND`] is answered. The session reads
/// nothing more meanwhile, so one connection makes at most one guess per delay.
pub(crate) const TARPIT_DELAY: Duration = Duration::from_secs(1);

/// The process's rate of failed `AUTH` attempts (every listener and worker), counted in
/// one-second windows. It never refuses anything: past the rate, failures are answered late
/// (a tarpit), which slows a guesser without letting it lock out the application, whose
/// clients of a sidecar all come from the same loopback address. A correct password is
/// answered at once, whatever others did. Touched only on failures (a lock there costs the
/// data path nothing).
#[derive(Debug)]
pub(crate) struct AuthTarpit {
    /// (start of the window, failures in it).
    window: Mutex<(Instant, u32)>,
    rate: u32,
    delay: Duration,
}

impl Default for AuthTarpit {
    fn default() -> Self {
        AuthTarpit::new(FAILURES_PER_SECOND, TARPIT_DELAY)
    }
}

impl AuthTarpit {
    /// A tarpit that answers `rate` failures per second at once and the rest `delay` late.
    pub(crate) fn new(rate: u32, delay: Duration) -> Self {
        AuthTarpit {
            window: Mutex::new((Instant::now(), 0)),
            rate,
            delay,
        }
    }

    /// Counts a failed attempt at `now`: how late its reply goes out (`None`: at once).
    pub(crate) fn failed(&self, now: Instant) -> Option<Duration> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_duration_since(w.0) >= Duration::from_secs(1) {
            *w = (now, 0);
        }
        w.1 = w.1.saturating_add(1);
        (w.1 > self.rate).then_some(self.delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_past_the_rate_are_delayed_and_the_window_starts_again() {
        let t = AuthTarpit::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(t.failed(t0), None);
        }
        assert_eq!(t.failed(t0), Some(Duration::from_secs(1)));
        assert_eq!(
            t.failed(t0 + Duration::from_millis(999)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(t.failed(t0 + Duration::from_secs(1)), None, "a new window");
    }
}
