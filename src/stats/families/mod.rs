//! The one table of metric families: each family's name, kind, help, label names, how its
//! series are read, and the `INFO` field that shows the same quantity, if any. `/metrics` is
//! written from [`FAMILIES`] (`admin::exposition`), and so are `INFO`'s counters (`# Proxy`
//! for the process, `# Clients` and `# Stats` for the listener asked: `info`), so
//! that a quantity is defined once and its names cannot drift apart. The table is read only
//! when someone scrapes or asks `INFO`, never on the request path.

use super::scrape::{self, Process, Scrape, Sink, Value};
use super::{EndpointView, Totals};

/// A family's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// As `# TYPE` writes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// How a family's series are read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read {
    /// One series per listener (label `listener`), from its counters summed over workers.
    Listener(fn(&Totals) -> u64),
    /// One unlabelled series for the whole process.
    Process(fn(&Process) -> u64),
    /// One series per endpoint (labels `cluster`, `shard`, `endpoint`); none for an
    /// endpoint that yields no value.
    Endpoint(fn(&EndpointView) -> Option<Value<'_>>),
    /// Any other shape: the reader puts its series; `false` leaves the family out (a process
    /// that does not count configuration changes, /proc that cannot be read).
    Series(fn(&Scrape, &mut Sink<'_>) -> bool),
}

/// How an `INFO` field reads its value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InfoRead {
    /// With the family's own reader (a `Read::Listener` one: over the listeners' totals; a
    /// `Read::Process` one: as is): one definition for both.
    Same,
    /// A process-wide value the family shows in another form: the pipeline-depth histogram's
    /// sum (commands decoded), or the process total of a counter the family keeps per
    /// endpoint (`INFO`'s counts since start, the family's since the endpoint's pools were
    /// created).
    Process(fn(&Process) -> u64),
    /// One field per kind, named the field followed by the kind.
    PerKind(fn(&Process, &mut FieldSink<'_>)),
}

/// Where a per-kind `INFO` reader puts each kind's name and value.
pub(crate) type FieldSink<'a> = dyn FnMut(&str, u64) + 'a;

/// Where `INFO` shows a family's quantity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Info {
    /// The field's name in `# Proxy` (over every listener and worker).
    pub(crate) field: &'static str,
    /// Redis's own section (`clients`, `stats`) that shows the field too, for the listener
    /// asked (read with that listener's totals), as monitoring tools expect.
    pub(crate) section: Option<&'static str>,
    /// How it is read.
    pub(crate) read: InfoRead,
}

/// One metric family.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MetricFamily {
    /// Its name (`respway_*`, or `process_*` for the standard process metrics).
    pub(crate) name: &'static str,
    /// Its type.
    pub(crate) kind: Kind,
    /// Its `# HELP` text.
    pub(crate) help: &'static str,
    /// The label names its series may carry (besides `le`), in the order they are written.
    pub(crate) labels: &'static [&'static str],
    /// How its series are read.
    pub(crate) read: Read,
    /// The `INFO` field showing the same quantity.
    pub(crate) info: Option<Info>,
    /// What the reference page's table says after the help: label values, units, where the
    /// feature is described (Markdown, one line, links from the repository's root:
    /// `docs/caching.md#near-cache`, or `#anchor` within the metrics page); may be empty.
    pub(crate) doc: &'static str,
}

impl MetricFamily {
    /// The family with `doc` as its reference page's words after the help.
    const fn with_doc(self, doc: &'static str) -> MetricFamily {
        MetricFamily { doc, ..self }
    }
}

const LISTENER: &[&str] = &["listener"];
/// The labels of a per-endpoint family, in order.
pub(crate) const ENDPOINT_LABELS: &[&str] = &["cluster", "shard", "endpoint"];
const COMMAND: &[&str] = &["listener", "command", "family"];

/// A per-listener counter family.
const fn listener(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    get: fn(&Totals) -> u64,
    info: Option<Info>,
) -> MetricFamily {
    MetricFamily {
        name,
        kind,
        help,
        labels: LISTENER,
        read: Read::Listener(get),
        info,
        doc: "",
    }
}

/// A per-endpoint family.
const fn endpoint(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    get: fn(&EndpointView) -> Option<Value<'_>>,
    info: Option<Info>,
) -> MetricFamily {
    MetricFamily {
        name,
        kind,
        help,
        labels: ENDPOINT_LABELS,
        read: Read::Endpoint(get),
        info,
        doc: "",
    }
}

/// A family read by `read`.
const fn series(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    labels: &'static [&'static str],
    read: fn(&Scrape, &mut Sink<'_>) -> bool,
) -> MetricFamily {
    MetricFamily {
        name,
        kind,
        help,
        labels,
        read: Read::Series(read),
        info: None,
        doc: "",
    }
}

/// A process-wide family.
const fn process(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    get: fn(&Process) -> u64,
    field: &'static str,
) -> MetricFamily {
    MetricFamily {
        name,
        kind,
        help,
        labels: &[],
        read: Read::Process(get),
        info: Some(proxy(field, InfoRead::Same)),
        doc: "",
    }
}

/// An `INFO proxy` field.
const fn proxy(field: &'static str, read: InfoRead) -> Info {
    Info {
        field,
        section: None,
        read,
    }
}

/// An `INFO proxy` field read with the family's own reader.
const fn same(field: &'static str) -> Option<Info> {
    Some(proxy(field, InfoRead::Same))
}

/// The standard process metrics, read from /proc at each scrape (Linux).
const fn os(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    read: fn(&Scrape, &mut Sink<'_>) -> bool,
) -> MetricFamily {
    series(name, kind, help, &[], read).with_doc(
        "A standard process metric, with the name and meaning Prometheus's client libraries give it, read from `/proc/self` at each scrape (Linux only).",
    )
}

mod table;
pub(crate) use table::FAMILIES;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::info::family_docs;

    /// Names are unique, each is a Prometheus metric name of its kind's shape, and an `INFO`
    /// field read with the family's own reader has a reader `INFO` can sum.
    #[test]
    fn the_table_is_well_formed() {
        let mut names = std::collections::HashSet::new();
        let mut fields = std::collections::HashSet::new();
        for f in FAMILIES {
            assert!(names.insert(f.name), "{} twice", f.name);
            assert!(
                f.name.starts_with("respway_") || f.name.starts_with("process_"),
                "{}",
                f.name
            );
            assert_eq!(
                f.kind == Kind::Counter,
                f.name.ends_with("_total"),
                "{}: a counter's name ends in _total, and only a counter's",
                f.name
            );
            assert!(!f.help.is_empty() && !f.help.contains('\n'), "{}", f.name);
            assert!(!f.doc.contains('\n'), "{}", f.name);
            if let Some(i) = &f.info {
                if matches!(i.read, InfoRead::Same) {
                    assert!(
                        matches!(f.read, Read::Listener(_) | Read::Process(_)),
                        "{}: INFO reads it with a reader it cannot sum",
                        f.name
                    );
                }
                if i.section.is_some() {
                    assert!(matches!(f.labels, ["listener"]), "{}", f.name);
                }
            }
        }
        for d in family_docs() {
            for field in d.info_fields {
                assert!(fields.insert(field.clone()), "INFO field {field} twice");
            }
        }
        assert!(fields.contains("upstream_errors_timeout"), "{fields:?}");
    }
}
