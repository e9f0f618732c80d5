//! A session's own state: authentication and user, protocol, database, name, client id.
//! The local commands (`local.rs`) read and change it; the session reads it on every command.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::stack::acl::{Acl, User};

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Per-connection state the local commands read and change.
#[derive(Debug)]
pub(crate) struct SessionState {
    /// AUTH done, or no password configured.
    pub(crate) authenticated: bool,
    /// The ACL user authenticated as; `None` is `default` without an ACL.
    pub(crate) user: Option<Arc<User>>,
    /// The user's permissions, when there are any to check (the hot path reads only this).
    pub(crate) perms: Option<Arc<respway_filters::acl::Permissions>>,
    /// CLIENT SETNAME.
    pub(crate) name: Option<Bytes>,
    /// CLIENT ID (taken once per connection, not per request).
    pub(crate) id: u64,
    /// Failed AUTH attempts on this connection.
    pub(crate) auth_failures: u32,
    /// RESP3 (`HELLO 3`).
    pub(crate) resp3: bool,
    /// The selected database (`SELECT n`).
    pub(crate) db: u8,
    /// `CLIENT SETINFO lib-name` / `lib-ver`.
    pub(crate) lib: (Option<Bytes>, Option<Bytes>),
    /// The client's address.
    pub(crate) peer: Option<std::net::SocketAddr>,
    /// The connection's local address (the node a cluster emulation without announced
    /// addresses shows).
    pub(crate) local: Option<std::net::SocketAddr>,
    /// `CLIENT TRACKING on`: what the client follows, and its announcements.
    pub(crate) tracking: Option<Box<crate::cache::near_cache::clients::ClientTracking>>,
}

impl SessionState {
    /// State of a new connection on a listener with `acl`, from `peer` to `local`:
    /// authenticated as `default` when there is no ACL or its `default` user has `nopass`.
    pub(crate) fn new(
        acl: Option<&Acl>,
        peer: Option<std::net::SocketAddr>,
        local: Option<std::net::SocketAddr>,
    ) -> Self {
        let mut s = SessionState {
            authenticated: false,
            user: None,
            perms: None,
            name: None,
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            auth_failures: 0,
            resp3: false,
            db: 0,
            lib: (None, None),
            peer,
            local,
            tracking: None,
        };
        s.start_as_default(acl);
        s
    }

    /// Authenticated as `default` if it needs no `AUTH`, else not authenticated.
    pub(crate) fn start_as_default(&mut self, acl: Option<&Acl>) {
        match acl {
            None => {
                self.authenticated = true;
                self.set_user(None);
            }
            Some(acl) => {
                let u = acl.implicit_default().cloned();
                self.authenticated = u.is_some();
                self.set_user(u);
            }
        }
    }

    /// Now acting as `user`.
    pub(crate) fn set_user(&mut self, user: Option<Arc<User>>) {
        self.perms = user.as_ref().and_then(|u| u.perms.clone());
        self.user = user;
    }

    /// The user's name (`default` without an ACL).
    pub(crate) fn user_name(&self) -> &str {
        self.user.as_ref().map_or("default", |u| &u.name)
    }

    /// After a configuration change: the same user under the new `acl`. False when the
    /// session must close: its user was removed or disabled.
    pub(crate) fn rebind(&mut self, acl: Option<&Acl>) -> bool {
        if !self.authenticated {
            // Not yet authenticated: the next AUTH uses the new users; a default user that
            // became nopass lets it in now.
            self.start_as_default(acl);
            return true;
        }
        let name = self.user_name().to_string();
        match acl {
            None => {
                self.set_user(None);
                true
            }
            Some(acl) => match acl.find(name.as_bytes()) {
                Some(u) if u.enabled => {
                    self.set_user(Some(u.clone()));
                    true
                }
                _ => false,
            },
        }
    }

    /// Upstream connections this client's commands use.
    pub(crate) fn flavor(&self) -> respway_filters::request::Flavor {
        respway_filters::request::Flavor {
            resp3: self.resp3,
            db: self.db,
            track: false,
        }
    }
}
