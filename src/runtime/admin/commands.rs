//! `GET /commands` of the admin endpoint: the commands learned from the shards
//! (`discovery::commands`), per cluster and endpoint, with the server version each came from.
//!
//! ```text
//! cluster main endpoint 127.0.0.1:7001 version=redis 7.0.15 learned=27
//!   ft.add arity=-1 flags=write,denyoom,module class=single keys=[index 1 range(lastkey=0,step=1,limit=0) RW]
//!   t.odd arity=-2 flags=write,movablekeys class=refused why="its key specs are incomplete"
//! cluster main endpoint 127.0.0.1:7003 version= learned=0 error="connection refused"
//! ```
//!
//! `error` is why the last attempt failed; the table shown is then the last one learned.

use std::fmt::Write as _;

use respway_filters::command::learned::{Begin, Find, LearnedCommand};
use respway_filters::command::{CommandClass, KeySpec};

use super::State;

/// The page.
pub(super) fn page(state: &State) -> String {
    let learned = crate::discovery::Running::learned(&state.config);
    let mut o = String::new();
    for ((cluster, endpoint), t) in learned.tables() {
        let _ = write!(
            o,
            "cluster {cluster} endpoint {endpoint} version={} learned={}",
            t.version,
            t.commands.len()
        );
        if let Some(e) = &t.error {
            let _ = write!(o, " error={e:?}");
        }
        o.push('\n');
        let mut commands = t.commands.clone();
        commands.sort_by_key(|c| c.info.name);
        for c in &commands {
            line(&mut o, c);
        }
    }
    if o.is_empty() {
        o.push_str("no endpoint answered yet\n");
    }
    o
}

fn line(o: &mut String, c: &LearnedCommand) {
    let i = c.info;
    let _ = write!(
        o,
        "  {} arity={} flags={}",
        i.name,
        i.arity,
        i.flag_names.join(",")
    );
    if !i.acl_categories.is_empty() {
        let _ = write!(o, " acl={}", i.acl_categories.join(","));
    }
    if let Some(why) = c.refused {
        let _ = writeln!(o, " class=refused why={why:?}");
        return;
    }
    let class = match i.class {
        CommandClass::Single => "single",
        CommandClass::SameShard => "same_shard",
        _ => "other",
    };
    let _ = write!(o, " class={class} keys=[");
    if i.keys == KeySpec::Asked {
        // Its specs are incomplete: a shard names the keys (COMMAND GETKEYS).
        o.push_str("asked");
    }
    if let KeySpec::Learned(specs) = i.keys {
        for (n, s) in specs.iter().enumerate() {
            if n > 0 {
                o.push_str("; ");
            }
            match s.begin {
                Begin::Index(at) => {
                    let _ = write!(o, "index {at}");
                }
                Begin::Keyword { keyword, startfrom } => {
                    let _ = write!(o, "keyword {keyword:?} from {startfrom}");
                }
            }
            match s.find {
                Find::Range {
                    lastkey,
                    keystep,
                    limit,
                } => {
                    let _ = write!(o, " range(lastkey={lastkey},step={keystep},limit={limit})");
                }
                Find::Keynum {
                    keynumidx,
                    firstkey,
                    keystep,
                } => {
                    let _ = write!(
                        o,
                        " keynum(keynumidx={keynumidx},firstkey={firstkey},step={keystep})"
                    );
                }
            }
            o.push_str(if s.read_only { " RO" } else { " RW" });
        }
    }
    o.push_str("]\n");
}
