//! `INFO`'s counters written from the table of metric families (`families`): `# Proxy` over
//! the whole process, `# Clients` and `# Stats` for the listener asked; and the table as the
//! documentation and the tests see it ([`family_docs`]).

use super::families::{InfoRead, MetricFamily, Read, FAMILIES};
use super::{Info, Process};

/// Calls `f` with every `INFO` field of `fam` and its value read from `p`.
fn info_values(fam: &MetricFamily, info: &Info, p: &Process, f: &mut dyn FnMut(&str, u64)) {
    match (info.read, fam.read) {
        (InfoRead::Same, Read::Listener(get)) => f(info.field, get(&p.totals)),
        (InfoRead::Same, Read::Process(get)) => f(info.field, get(p)),
        // The table's test keeps `Same` to the readers above.
        (InfoRead::Same, _) => {}
        (InfoRead::Process(get), _) => f(info.field, get(p)),
        (InfoRead::PerKind(each), _) => {
            each(p, &mut |kind, n| f(&format!("{}{kind}", info.field), n));
        }
    }
}

/// Writes the `INFO` fields of `section` the table declares, in table order, as
/// `field:value\r\n`: for `proxy`, every field, `p` the whole process; for a Redis section
/// (`clients`, `stats`), the fields it shows, `p` holding the listener's totals.
pub(crate) fn write_info(out: &mut String, section: &str, p: &Process) {
    use std::fmt::Write as _;
    for fam in FAMILIES {
        let Some(info) = &fam.info else { continue };
        if section != "proxy" && info.section != Some(section) {
            continue;
        }
        info_values(fam, info, p, &mut |field, n| {
            let _ = write!(out, "{field}:{n}\r\n");
        });
    }
}

/// A metric family as the documentation and the tests see it.
#[derive(Debug, Clone)]
pub struct FamilyDoc {
    /// The family's name.
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its `# HELP` text.
    pub help: &'static str,
    /// What the reference page says after the help (Markdown, links from the repository's
    /// root); may be empty.
    pub doc: &'static str,
    /// The label names its series may carry.
    pub labels: &'static [&'static str],
    /// The `INFO proxy` fields showing the same quantity (one per kind for a per-kind field).
    pub info_fields: Vec<String>,
    /// The Redis `INFO` section that shows it too, for the listener asked.
    pub info_section: Option<&'static str>,
}

/// Every metric family of the table, in `/metrics` order.
pub fn family_docs() -> Vec<FamilyDoc> {
    let p = Process::default();
    FAMILIES
        .iter()
        .map(|f| {
            let mut info_fields = Vec::new();
            if let Some(info) = &f.info {
                info_values(f, info, &p, &mut |field, _| {
                    info_fields.push(field.to_string())
                });
            }
            FamilyDoc {
                name: f.name,
                kind: f.kind.name(),
                help: f.help,
                doc: f.doc,
                labels: f.labels,
                info_fields,
                info_section: f.info.and_then(|i| i.section),
            }
        })
        .collect()
}
