//! `GET /metrics`: the management server's state in Prometheus's text format, read from the
//! same state as `GET /status`.

use std::fmt::Write as _;

use crate::server::{Server, ServerStatus};

/// Every family `GET /metrics` serves, with its type and help (the docs list the same).
pub const FAMILIES: &[(&str, &str, &str)] = &[
    ("respway_xds_generation", "gauge", "The served generation (with a shared store: the store revision of the latest file change)."),
    ("respway_xds_files", "gauge", "Resource files at the last scan, by state (ok, invalid)."),
    ("respway_xds_nodes_connected", "gauge", "Nodes with an ADS stream open on this server."),
    ("respway_xds_fleet_nodes_connected", "gauge", "Nodes connected to any replica of the shared store, as this replica sees them (this server's alone without a store)."),
    ("respway_xds_nodes_nacking", "gauge", "Connected nodes whose last response of some type was NACKed, fleet-wide."),
    ("respway_xds_store_connected", "gauge", "1 while the shared store is followed, 0 while it is lost and the last copy is served (absent without a store)."),
    ("respway_xds_store_revision", "gauge", "The store revision this replica's copy of the files is of (absent without a store)."),
    ("respway_xds_store_lost_total", "counter", "Times the shared store was lost since the server started (absent without a store)."),
    ("respway_xds_admin_accept_errors_total", "counter", "Failed accepts on the admin port."),
    ("respway_xds_ads_accept_errors_total", "counter", "Failed accepts on the ADS port."),
];

/// The text of `GET /metrics`.
pub(crate) fn render(server: &Server) -> String {
    let s = server.status();
    let here = server.connected_nodes().len();
    text(&s, here)
}

fn text(s: &ServerStatus, here: usize) -> String {
    let mut out = String::new();
    let mut family = |name: &str, samples: &[(&str, String)]| {
        if samples.is_empty() {
            return;
        }
        if let Some((_, kind, help)) = FAMILIES.iter().find(|(n, ..)| *n == name) {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    family("respway_xds_generation", &[("", s.version.to_string())]);
    let ok = s.files.iter().filter(|f| f.ok).count();
    family(
        "respway_xds_files",
        &[
            ("{state=\"ok\"}", ok.to_string()),
            ("{state=\"invalid\"}", (s.files.len() - ok).to_string()),
        ],
    );
    family("respway_xds_nodes_connected", &[("", here.to_string())]);
    let connected = s.nodes.iter().filter(|n| n.connected);
    family(
        "respway_xds_fleet_nodes_connected",
        &[("", connected.clone().count().to_string())],
    );
    let nacking = connected
        .filter(|n| n.types.values().any(|t| t.nack.is_some()))
        .count();
    family("respway_xds_nodes_nacking", &[("", nacking.to_string())]);
    if let Some(st) = &s.store {
        family(
            "respway_xds_store_connected",
            &[("", u8::from(st.connected).to_string())],
        );
        family(
            "respway_xds_store_revision",
            &[("", st.revision.to_string())],
        );
        family("respway_xds_store_lost_total", &[("", st.lost.to_string())]);
    }
    family(
        "respway_xds_admin_accept_errors_total",
        &[("", s.admin.accept_errors.to_string())],
    );
    family(
        "respway_xds_ads_accept_errors_total",
        &[("", s.ads_accept_errors.to_string())],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_rendered_is_declared_and_the_store_only_with_one() {
        let s: ServerStatus = serde_json::from_str(
            r#"{"version": 7, "files": [{"name": "a.yaml", "ok": true, "error": null, "serving_previous": false}],
                "errors": [], "nodes": []}"#,
        )
        .unwrap();
        let t = text(&s, 0);
        assert!(t.contains("respway_xds_generation 7\n"), "{t}");
        assert!(t.contains("respway_xds_files{state=\"ok\"} 1\n"), "{t}");
        assert!(!t.contains("respway_xds_store"), "{t}");
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(
                FAMILIES.iter().any(|(n, ..)| *n == name),
                "{name} undeclared"
            );
        }
    }
}
