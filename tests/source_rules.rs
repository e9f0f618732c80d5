//! Rules about the source itself that review alone would not keep: no decision is made by
//! matching respway's own error text, and failures stay typed until the session writes them
//! to the client, so a changed message cannot change behaviour; and hand-written files stay
//! under 800 lines.

use std::collections::{BTreeMap, BTreeSet};
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

// ---------------------------------------------------------------------------------------------
// The module graph: which top-level module of a crate imports which, read from the sources.

/// `text` with comments, string and char literals removed (a doc link or a path written in
/// a message is not an import) and every `#[cfg(test)]` item left out.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let prev = if i > 0 { b[i - 1] } else { b' ' };
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r'))) && !ident(prev) && {
            let mut j = i + if c == b'b' { 2 } else { 1 };
            while b.get(j) == Some(&b'#') {
                j += 1;
            }
            b.get(j) == Some(&b'"')
        } {
            // A raw string: r"…", r#"…"#, br"…".
            i += if c == b'b' { 2 } else { 1 };
            let mut hashes = 0;
            while b[i] == b'#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            loop {
                if i >= b.len() {
                    break;
                }
                if b[i] == b'"'
                    && b[i + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            } else if let Some(len) = text[i + 1..].chars().next().map(char::len_utf8) {
                if b.get(i + 1 + len) == Some(&b'\'') {
                    i += 2 + len;
                } else {
                    out.push('\'');
                    i += 1;
                }
            } else {
                i += 1;
            }
        } else {
            let ch = text[i..].chars().next().expect("char");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    // Leave out each `#[cfg(test)]` item: up to its `;` or its matching `}`.
    let mut kept = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        let item = &rest[at..];
        let open = item.find('{').unwrap_or(item.len());
        let semi = item.find(';').unwrap_or(item.len());
        if semi < open {
            rest = &item[(semi + 1).min(item.len())..];
            continue;
        }
        let mut depth = 0;
        let mut end = item.len();
        for (k, ch) in item.char_indices().skip_while(|&(k, _)| k < open) {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    kept.push_str(rest);
    kept
}

/// `code` without its attributes (`#[…]`, `#![…]`).
fn without_attributes(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find('#') {
        out.push_str(&rest[..at]);
        let attr = &rest[at..];
        let body = attr.strip_prefix("#!").or_else(|| attr.strip_prefix('#'));
        match body.filter(|b| b.starts_with('[')) {
            Some(b) => {
                let mut depth = 0;
                let mut end = b.len();
                for (k, ch) in b.char_indices() {
                    match ch {
                        '[' => depth += 1,
                        ']' => {
                            depth -= 1;
                            if depth == 0 {
                                end = k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                out.push(' ');
                rest = &b[end..];
            }
            None => {
                out.push('#');
                rest = &attr[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The first segments of the paths a use tree or path names after `crate::` (or after enough
/// `super::` to reach the crate root): `a::b::C` gives `a`; `{a::X, b, c::{D, E}}` gives
/// `a`, `b` and `c`.
fn first_segments(after: &str) -> Vec<String> {
    let s = after.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        let mut out = Vec::new();
        let mut depth = 0;
        let mut start = 0;
        for (k, ch) in group.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.extend(first_segments(&group[start..k]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.extend(first_segments(&group[start..k]));
                    start = k + 1;
                }
                _ => {}
            }
        }
        return out;
    }
    let name: String = s
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if name.is_empty() || name == "self" {
        Vec::new()
    } else {
        vec![name]
    }
}

/// The names a path reaches from the crate root in `code` (a file `depth` modules below the
/// root: 1 for a top-level `M.rs` or `M/mod.rs`, 2 for `M/N.rs`): `crate::NAME` and
/// `super::…::NAME` with enough `super`s to reach the root.
fn root_names(code: &str, depth: usize) -> Vec<String> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let word_start = i == 0 || !ident(b[i - 1]);
        if word_start && code[i..].starts_with("crate") && !b.get(i + 5).is_some_and(|&c| ident(c))
        {
            let after = code[i + 5..].trim_start();
            if let Some(rest) = after.strip_prefix("::") {
                out.extend(first_segments(rest));
            }
            i += 5;
        } else if word_start
            && code[i..].starts_with("super")
            && !b.get(i + 5).is_some_and(|&c| ident(c))
        {
            let mut ups = 0;
            let mut rest = &code[i..];
            while let Some(r) = rest.strip_prefix("super") {
                let r = r.trim_start();
                match r.strip_prefix("::") {
                    Some(r) => {
                        ups += 1;
                        rest = r.trim_start();
                    }
                    None => break,
                }
            }
            if ups > 0 && ups >= depth {
                out.extend(first_segments(rest));
            }
            i = (code.len() - rest.len()).max(i + 5);
        } else {
            i += code[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// A crate's top-level modules (declared in `lib.rs`), the module each name re-exported by
/// `lib.rs` comes from, and the imports between the modules: `(from, to)`, each once.
/// Names of items defined in `lib.rs` itself map to `lib.rs`.
struct ModuleGraph {
    modules: BTreeSet<String>,
    arrows: BTreeSet<(String, String)>,
}

fn module_graph(src: &Path) -> ModuleGraph {
    let lib = without_attributes(&code_only(
        &std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"),
    ));
    let mut modules = BTreeSet::new();
    let mut reexports: BTreeMap<String, String> = BTreeMap::new();
    for stmt in lib.split(';') {
        let words: Vec<&str> = stmt.split_whitespace().collect();
        let Some(k) = words.iter().position(|w| *w == "mod" || *w == "use") else {
            continue;
        };
        if words[..k].iter().any(|w| !w.starts_with("pub")) {
            continue;
        }
        let rest = words[k + 1..].join(" ");
        if words[k] == "mod" {
            if !rest.contains('{') {
                modules.insert(rest.trim().to_string());
            }
            continue;
        }
        // `use a::b::{C, D as E}`: C and E come from `a`.
        let rest = rest
            .trim_start_matches("crate::")
            .trim_start_matches("self::");
        let Some(first) = first_segments(rest).into_iter().next() else {
            continue;
        };
        let leaves = rest
            .replace(['{', '}'], ",")
            .split(',')
            .filter_map(|p| {
                let p = p.trim();
                let leaf = p.rsplit(" as ").next()?.rsplit("::").next()?.trim();
                (!leaf.is_empty()).then(|| leaf.to_string())
            })
            .collect::<Vec<_>>();
        for leaf in leaves {
            reexports.insert(leaf, first.clone());
        }
    }
    let mut arrows = BTreeSet::new();
    for m in &modules {
        let mut files = Vec::new();
        if src.join(format!("{m}.rs")).is_file() {
            files.push(src.join(format!("{m}.rs")));
        }
        if src.join(m).is_dir() {
            rust_files(&src.join(m), &mut files);
        }
        for f in files {
            let rel = f.strip_prefix(src).expect("under src");
            let parts = rel.components().count();
            let depth = if f.ends_with("mod.rs") {
                parts - 1
            } else {
                parts
            };
            let code = code_only(&std::fs::read_to_string(&f).expect("read"));
            for name in root_names(&code, depth) {
                let to = if modules.contains(&name) {
                    name
                } else if let Some(m) = reexports.get(&name) {
                    m.clone()
                } else {
                    "lib.rs".to_string()
                };
                if &to != m {
                    arrows.insert((m.clone(), to));
                }
            }
        }
    }
    ModuleGraph { modules, arrows }
}

/// The circles of a graph (its strongly connected components of more than one module),
/// each sorted, by Tarjan's algorithm.
fn circles(g: &ModuleGraph) -> Vec<Vec<String>> {
    struct T<'a> {
        next: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.next.get(v).cloned().unwrap_or_default() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("low");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("low");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        next: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for (a, b) in &g.arrows {
        t.next.entry(a.as_str()).or_default().push(b.as_str());
    }
    for m in &g.modules {
        if !t.index.contains_key(m.as_str()) {
            visit(&mut t, m);
        }
    }
    t.out.sort();
    t.out
}

fn describe(g: &ModuleGraph, circle: &[String]) -> String {
    let arrows: Vec<String> = g
        .arrows
        .iter()
        .filter(|(a, b)| circle.contains(a) && circle.contains(b))
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect();
    format!(
        "{} modules: {}\n    {}",
        circle.len(),
        circle.join(", "),
        arrows.join("\n    ")
    )
}

/// No crate's modules import each other in a circle: each crate reads as floors, a module
/// above what it uses. (Arrows to `lib.rs` are not counted here: a crate root that holds
/// items is its face; `src/`'s root holds none, see below. In `src/`, the arrows up still
/// listed in [`KNOWN_UP`] are left out until they are gone.)
#[test]
fn no_import_circles_between_the_modules_of_a_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for dir in ["src", "filters/src", "xds/src"] {
        let mut g = module_graph(&root.join(dir));
        assert!(g.modules.len() > 5, "{dir}: {} modules", g.modules.len());
        g.arrows.retain(|(a, b)| {
            b != "lib.rs" && !(dir == "src" && KNOWN_UP.contains(&(a.as_str(), b.as_str())))
        });
        for c in circles(&g) {
            found.push(format!("{dir}: {}", describe(&g, &c)));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The floors of `src/`, bottom first: a folder imports only folders below it. The upstream
/// knows no feature; the cache, discovery and the chain are beside or above it; the session
/// uses the chain; the runtime (workers, side threads, admin, xDS wiring) is on top.
const FLOORS: &[&str] = &[
    "net",
    "lifecycle",
    "stats",
    "upstream",
    "discovery",
    "cache",
    "stack",
    "session",
    "runtime",
];

/// Arrows of `src/` that still run up a floor, each to be removed (issue 42). The test fails
/// on an arrow up that is not here, and on one here that is gone (so the list only shrinks).
const KNOWN_UP: &[(&str, &str)] = &[];

#[test]
fn src_folders_import_only_the_floors_below_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let g = module_graph(&root.join("src"));
    let floor = |m: &str| FLOORS.iter().position(|f| *f == m);
    let unplaced: Vec<&String> = g.modules.iter().filter(|m| floor(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "src/ modules on no floor (add them to FLOORS): {unplaced:?}"
    );
    let up: BTreeSet<(String, String)> = g
        .arrows
        .iter()
        .filter(|(a, b)| b == "lib.rs" || floor(b) > floor(a))
        .cloned()
        .collect();
    let known: BTreeSet<(String, String)> = KNOWN_UP
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<String> = up
        .difference(&known)
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect();
    let gone: Vec<String> = known
        .difference(&up)
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "src/ arrows running up a floor (bottom first: {FLOORS:?}):\n  new: {new:?}\n  \
         gone (remove them from KNOWN_UP): {gone:?}"
    );
}

/// `src/` holds `main.rs`, `lib.rs` and folders; `lib.rs` only declares the folders and
/// re-exports the public API (an item defined there would be a floor above every folder).
#[test]
fn src_top_level_is_main_lib_and_folders() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut loose = Vec::new();
    for e in std::fs::read_dir(root.join("src")).expect("src") {
        let p = e.expect("entry").path();
        let name = p.file_name().expect("name").to_string_lossy().to_string();
        if p.is_file() && name != "main.rs" && name != "lib.rs" {
            loose.push(name);
        }
    }
    assert!(loose.is_empty(), "loose files in src/: {loose:?}");
    let lib = code_only(&std::fs::read_to_string(root.join("src/lib.rs")).expect("lib.rs"));
    let items: Vec<&str> = lib
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter(|s| {
            let w: Vec<&str> = s.split_whitespace().collect();
            let k = w.iter().position(|w| !w.starts_with("pub")).unwrap_or(0);
            !(w.get(k) == Some(&"mod") || w.get(k) == Some(&"use"))
        })
        .collect();
    assert!(items.is_empty(), "src/lib.rs defines items: {items:?}");
}

/// The reader itself: comments, strings and doc links are not imports; `super` reaches the
/// root only from deep enough; groups are split.
#[test]
fn the_module_graph_reader_reads_only_paths() {
    let code = code_only(
        "//! [`crate::a`]\nuse crate::{b::X, c::{D, E}};\nfn f() { let s = \"crate::d\"; \
         let c = '\"'; let r = r#\"crate::e\"#; super::super::g::h(); crate::i::j(); }\n\
         #[cfg(test)]\nmod tests { use crate::k; }\n",
    );
    assert_eq!(root_names(&code, 2), ["b", "c", "g", "i"]);
    assert_eq!(root_names(&code, 3), ["b", "c", "i"]);
}

/// Circles between the files of one folder.
#[path = "source_rules/folders.rs"]
mod folders;
