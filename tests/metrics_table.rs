//! The table of metric families (`respway::admin::family_docs`) against what a running
//! respway shows and what the documentation says: every family is in `/metrics` with its type
//! and only its labels, every `INFO` field the table declares is in `INFO`, and the metrics
//! table of `docs/operations-and-metrics.md` names exactly the table's families and is the
//! one the table renders (`RESPWAY_BLESS=1 cargo test -p respway --test metrics_table` rewrites
//! it after a change to the table).

mod support;

use std::collections::BTreeSet;

use support::*;

/// The respway binary with an admin endpoint (so that it counts configuration changes, as a
/// deployed one does) in front of one redis-server, after a little traffic; (respway, admin).
fn running() -> (Proc, Proc, std::net::SocketAddr) {
    let shard = redis();
    let admin = loopback(free_port());
    let rw = respway_process(
        &sharded_yaml(&[shard.addr], "{ policy: maglev }", true),
        &["--admin", &admin.to_string()],
    );
    wait_port(admin, "admin");
    let mut c = RespConn::connect(rw.addr);
    for i in 0..20 {
        let k = format!("k{i}");
        assert_eq!(c.call(&["SET", &k, "v"]), Resp::Simple("OK".into()));
        assert_eq!(c.call(&["GET", &k]), Resp::bulk("v"));
    }
    (shard, rw, admin)
}

/// Every family of the table is in `/metrics` under its name and type, and each of its
/// samples carries only the labels the table gives it.
#[test]
fn every_family_of_the_table_is_in_metrics() {
    let (_shard, _rw, admin) = running();
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200, "{body}");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text");
    let families = respway::admin::family_docs();
    assert!(families.len() > 40, "{} families", families.len());
    for f in &families {
        let ty = format!("# TYPE {} {}\n", f.name, f.kind);
        assert!(body.contains(&ty), "no {ty:?} in /metrics:\n{body}");
    }
    for s in &scrape.samples {
        let f = families
            .iter()
            .find(|f| {
                s.metric == f.name
                    || (f.kind == "histogram"
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|x| s.metric == format!("{}{x}", f.name)))
            })
            .unwrap_or_else(|| panic!("{} is in no family of the table", s.metric));
        for (k, _) in s.labels.iter() {
            assert!(
                f.labels.contains(&k.as_str()),
                "{}: label {k} is not among the table's {:?}",
                s.metric,
                f.labels
            );
        }
    }
}

/// The lines of `section` (`# Proxy`, ...) of an INFO reply, as field names.
fn fields(info: &str, section: &str) -> BTreeSet<String> {
    info.split("# ")
        .find(|s| s.starts_with(section))
        .unwrap_or_else(|| panic!("no # {section} in {info}"))
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_string()))
        .collect()
}

/// Every `INFO` field the table declares is in `INFO`'s `# Proxy`, and in the Redis section
/// (`# Clients`, `# Stats`) it says shows it too.
#[test]
fn every_info_field_of_the_table_is_in_info() {
    let (_shard, rw, _admin) = running();
    let info = RespConn::connect(rw.addr).call(&["INFO"]).text();
    let proxy = fields(&info, "Proxy");
    let mut declared = 0;
    for f in respway::admin::family_docs() {
        for field in &f.info_fields {
            declared += 1;
            assert!(
                proxy.contains(field),
                "{field} ({}) not in INFO proxy:\n{info}",
                f.name
            );
            if let Some(section) = f.info_section {
                let title = format!("{}{}", section[..1].to_uppercase(), &section[1..]);
                assert!(
                    fields(&info, &title).contains(field),
                    "{field} ({}) not in INFO {section}:\n{info}",
                    f.name
                );
            }
        }
    }
    assert!(declared >= 20, "{declared} INFO fields declared");
}

/// The page that documents the metrics, under its `### Metrics` heading.
const METRICS_PAGE: &str = "docs/operations-and-metrics.md";

/// The rows of the documented metrics table (after "Metrics (`respway_*`"): the backticked
/// names of the first column and of the last.
fn documented_metric_rows() -> Vec<(Vec<String>, Vec<String>)> {
    let page = std::fs::read_to_string(format!("{}/{METRICS_PAGE}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{METRICS_PAGE}: {e}"));
    let heading = page
        .find("\n### Metrics\n")
        .unwrap_or_else(|| panic!("{METRICS_PAGE} has no \"### Metrics\" heading"));
    let start = heading
        + page[heading..]
            .find("Metrics (`respway_*`")
            .unwrap_or_else(|| panic!("{METRICS_PAGE} has no metrics table"));
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    page[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split(" | ").collect();
            let names = ticked(cells[0]);
            for n in &names {
                assert!(
                    n.starts_with("respway_") || n.starts_with("process_"),
                    "{METRICS_PAGE}'s metrics table: `{n}` is not a full metric name (row {row})"
                );
            }
            (names, ticked(cells.last().copied().unwrap_or_default()))
        })
        .collect()
}

/// The documented metrics table names every family of the table, and nothing else; a row
/// that names `INFO` fields names those of its families, in the same order.
#[test]
fn documented_metrics_are_exactly_the_tables_families() {
    let docs = respway::admin::family_docs();
    let rows = documented_metric_rows();
    let page: BTreeSet<String> = rows.iter().flat_map(|(n, _)| n.clone()).collect();
    let table: BTreeSet<String> = docs.iter().map(|f| f.name.to_string()).collect();
    let missing: Vec<_> = table.difference(&page).collect();
    let extra: Vec<_> = page.difference(&table).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{METRICS_PAGE}'s metrics table lacks {missing:?} and names {extra:?}, which /metrics does not have"
    );
    let all_fields: BTreeSet<&String> = docs.iter().flat_map(|f| &f.info_fields).collect();
    for (names, what) in &rows {
        let said: Vec<&String> = what.iter().filter(|w| all_fields.contains(w)).collect();
        if said.is_empty() {
            continue;
        }
        let theirs: Vec<&String> = names
            .iter()
            .filter_map(|n| docs.iter().find(|f| f.name == n))
            .flat_map(|f| &f.info_fields)
            .collect();
        assert_eq!(
            said, theirs,
            "{METRICS_PAGE}'s row for {names:?} names other INFO fields"
        );
    }
}

/// How the metrics table of the page is rewritten after a change to the families' table.
const BLESS: &str =
    "RESPWAY_BLESS=1 cargo test -p respway --test metrics_table documented_metrics_table";

/// The page's metrics table as the families' table renders it, one row per family in
/// `/metrics` order: its name, type, labels, what it counts (the help, then the page's words)
/// and the `INFO` fields showing the same quantity.
fn metrics_table() -> Block {
    let dir = "docs";
    let mut body =
        String::from("\n| metric | type | labels | what | `INFO` |\n|---|---|---|---|---|\n");
    for f in respway::admin::family_docs() {
        let labels = if f.labels.is_empty() {
            "—".to_string()
        } else {
            f.labels.join(", ")
        };
        let what = if f.doc.is_empty() {
            f.help.to_string()
        } else {
            format!("{} {}", f.help, f.doc)
        };
        let mut info: Vec<String> = f.info_fields.iter().map(|x| format!("`{x}`")).collect();
        if info.is_empty() {
            info.push("—".into());
        }
        let mut info = info.join(", ");
        if let Some(section) = f.info_section {
            info.push_str(&format!(" (also `INFO {section}`)"));
        }
        body.push_str(&format!(
            "| `{}` | {} | {labels} | {} | {info} |\n",
            f.name,
            f.kind,
            cell(&what, dir)
        ));
    }
    body.push('\n');
    Block {
        id: "metrics".into(),
        note: format!("from the table of src/stats/families/table.rs; `{BLESS}` rewrites it"),
        body,
    }
}

/// The page's metrics table is the one the families' table renders, word for word.
#[test]
fn documented_metrics_table_is_the_generated_one() {
    check_generated(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        METRICS_PAGE,
        "metrics",
        &[metrics_table()],
        BLESS,
    );
}
