//! Replaying a recorded [`Trace`]: each recorded client's commands go, in order, on one
//! connection (clients beyond `max_connections` share connections, `client % n`).
//!
//! Timing: [`Speed::Scaled`] keeps the recorded inter-arrival times divided by a factor
//! (1 = as recorded, 2 = twice as fast, 10, ...) and runs open loop (latency from the
//! scheduled time, see [`crate::open`]); [`Speed::Max`] ignores the timing and sends every
//! connection's commands back to back with `pipeline` in flight (closed loop, see
//! [`crate::closed`]), each command once.
//!
//! Databases: MONITOR records the database of every command. By default they are ignored
//! (proxies have one keyspace); [`DbMode::Select`] sends `SELECT n` on a connection before
//! a command whose database differs from the connection's current one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::open::Slot;
use crate::trace::Trace;
use crate::workload::RequestPool;

/// Most distinct command names given their own latency histogram; the rest are `OTHER`.
const MAX_KINDS: usize = 64;

/// How fast to replay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Speed {
    /// Recorded inter-arrival times divided by this factor.
    Scaled(f64),
    /// As fast as the target answers.
    Max,
}

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("max") || s.eq_ignore_ascii_case("asap") {
            return Ok(Speed::Max);
        }
        let s = s.trim_end_matches(['x', 'X', '×']);
        match s.parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 => Ok(Speed::Scaled(f)),
            _ => Err(format!(
                "speed {s:?}: expected a factor > 0 (1, 2, 10x) or max"
            )),
        }
    }
}

/// What to do with the recorded databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DbMode {
    /// Send every command to the connection's default database.
    #[default]
    Ignore,
    /// `SELECT` the recorded database first when it changes.
    Select,
}

/// A trace turned into per-connection request pools and a send schedule.
#[derive(Debug, Clone, Default)]
pub struct ReplayPlan {
    /// One pool per connection, commands in recorded order.
    pub pools: Vec<RequestPool>,
    /// Kind names (upper-case command names).
    pub names: Vec<String>,
    /// `(µs offset, connection, request index)` for every request, by time.
    pub schedule: Vec<(u64, usize, usize)>,
    /// `SELECT`s added.
    pub selects: u64,
}

impl ReplayPlan {
    /// Plans the replay of `trace` over at most `max_connections` connections.
    pub fn new(trace: &Trace, max_connections: usize, db: DbMode) -> ReplayPlan {
        let conns = (trace.clients as usize).clamp(1, max_connections.max(1));
        let mut plan = ReplayPlan {
            pools: vec![RequestPool::new(); conns],
            ..ReplayPlan::default()
        };
        let mut kinds: HashMap<Vec<u8>, u16> = HashMap::new();
        let mut kind_of = |name: &[u8], names: &mut Vec<String>| -> u16 {
            let upper = name.to_ascii_uppercase();
            if let Some(&k) = kinds.get(&upper) {
                return k;
            }
            let k = if names.len() < MAX_KINDS {
                names.push(String::from_utf8_lossy(&upper).into_owned());
                (names.len() - 1) as u16
            } else {
                let other = b"OTHER".to_vec();
                if let Some(&k) = kinds.get(&other) {
                    return k;
                }
                names.push("OTHER".into());
                let k = (names.len() - 1) as u16;
                kinds.insert(other, k);
                k
            };
            kinds.insert(upper, k);
            k
        };
        let mut current_db = vec![0u32; conns];
        for e in &trace.events {
            let c = e.client as usize % conns;
            if db == DbMode::Select && current_db[c] != e.db {
                let k = kind_of(b"SELECT", &mut plan.names);
                plan.pools[c].push_args(&[b"SELECT".to_vec(), e.db.to_string().into_bytes()], k);
                plan.schedule
                    .push((e.offset_us, c, plan.pools[c].len() - 1));
                current_db[c] = e.db;
                plan.selects += 1;
            }
            let k = kind_of(&e.args[0], &mut plan.names);
            plan.pools[c].push_args(&e.args, k);
            plan.schedule
                .push((e.offset_us, c, plan.pools[c].len() - 1));
        }
        plan
    }

    /// The open-loop schedule at `factor` × the recorded speed (ns offsets).
    pub fn timed(&self, factor: f64) -> Vec<Slot> {
        self.schedule
            .iter()
            .map(|&(us, c, i)| (((us as f64) * 1000.0 / factor) as u64, c, i))
            .collect()
    }

    /// Requests in all.
    pub fn len(&self) -> usize {
        self.schedule.len()
    }

    /// Whether there is nothing to replay.
    pub fn is_empty(&self) -> bool {
        self.schedule.is_empty()
    }

    /// Recorded duration (last offset), seconds.
    pub fn recorded_secs(&self) -> f64 {
        self.schedule.last().map_or(0.0, |s| s.0 as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Event;

    fn ev(t: u64, client: u32, db: u32, args: &[&str]) -> Event {
        Event {
            offset_us: t,
            client,
            db,
            args: args.iter().map(|a| a.as_bytes().to_vec()).collect(),
        }
    }

    #[test]
    fn plan_keeps_client_order_and_selects() {
        let trace = Trace {
            events: vec![
                ev(0, 0, 0, &["set", "a", "1"]),
                ev(5, 1, 2, &["GET", "a"]),
                ev(9, 2, 0, &["get", "b"]),
                ev(12, 1, 2, &["INCR", "c"]),
            ],
            clients: 3,
            ..Trace::default()
        };
        let p = ReplayPlan::new(&trace, 2, DbMode::Select);
        assert_eq!(p.pools.len(), 2);
        // client 2 shares connection 0 with client 0; client 1 needs SELECT 2 once
        assert_eq!(p.pools[0].len(), 2);
        assert_eq!(p.pools[1].len(), 3);
        assert_eq!(p.selects, 1);
        assert_eq!(
            p.pools[1].request(0),
            b"*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n".as_slice()
        );
        assert_eq!(p.names, vec!["SET", "SELECT", "GET", "INCR"]);
        assert_eq!(
            p.schedule,
            vec![(0, 0, 0), (5, 1, 0), (5, 1, 1), (9, 0, 1), (12, 1, 2)]
        );
        assert_eq!(p.timed(2.0)[4], (6000, 1, 2));
        let q = ReplayPlan::new(&trace, 8, DbMode::Ignore);
        assert_eq!(q.pools.len(), 3);
        assert_eq!(q.selects, 0);
        assert_eq!("10x".parse::<Speed>().unwrap(), Speed::Scaled(10.0));
        assert_eq!("max".parse::<Speed>().unwrap(), Speed::Max);
        assert!("0".parse::<Speed>().is_err());
    }
}
