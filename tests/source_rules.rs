//! Rules about the source itself that review alone would not keep: no decision is made by
//! matching respway's own error text, and failures stay typed until the session writes them
//! to the client, so a changed message cannot change behaviour; and hand-written files stay
//! under 800 lines.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The lines of `text` outside `#[cfg(test)]` modules (which come last in a file here).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
}

#[test]
fn nothing_decides_by_matching_respways_own_error_text() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "filters/src", "xds/src", "tls/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "{} files", files.len());
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        for (i, line) in code_lines(&text) {
            let compares = [
                "starts_with(",
                "ends_with(",
                "contains(",
                "find(",
                "== b\"",
                "== \"",
            ]
            .iter()
            .any(|m| line.contains(m));
            if compares && line.contains("respway:") {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "decisions made by respway's own error text (use the typed error instead):\n{}",
        found.join("\n")
    );
}

/// A failure (`respway_filters::error::Failure`) becomes RESP bytes in one place: the
/// session (`src/session/conn/`), where the reply is written. Everything between the upstream and
/// the session passes the typed failure on.
#[test]
fn failures_become_bytes_only_where_the_session_writes_the_reply() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "filters/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let session = root.join("src/session/conn");
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !f.starts_with(&session)) {
        let text = std::fs::read_to_string(f).expect("read");
        for (i, line) in code_lines(&text) {
            if line.contains(".to_reply(") {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "failures rendered before the session writes them (pass the Failure on):\n{}",
        found.join("\n")
    );
}

/// Hand-written source files stay under 800 lines (split by concern when they grow); the
/// generated command table and protobuf code are not hand-written.
#[test]
fn hand_written_source_files_stay_under_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "filters/src", "xds/src", "tls/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let long: Vec<String> = files
        .iter()
        .filter(|f| {
            !f.ends_with("command_table.rs") && !f.components().any(|c| c.as_os_str() == "gen")
        })
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).expect("read").lines().count();
            (n > 800).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over 800 lines:\n{}",
        long.join("\n")
    );
}
