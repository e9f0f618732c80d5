//! No two files (or folders) of one folder import each other in a circle.

use super::*;

/// The names a path reaches inside folder module `prefix` (its path from the crate root) in
/// `code`, a file `depth` modules below that folder: `crate::PREFIX::NAME` and `super::…::NAME`
/// with exactly enough `super`s to reach the folder.
fn folder_names(code: &str, depth: usize, prefix: &[String]) -> Vec<String> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let word_start = i == 0 || !ident(b[i - 1]);
        let keyword = |w: &str| {
            word_start && code[i..].starts_with(w) && !b.get(i + w.len()).is_some_and(|&c| ident(c))
        };
        if keyword("crate") {
            let mut rest = code[i + 5..].trim_start();
            let mut inside = true;
            for seg in prefix {
                match rest.strip_prefix("::").map(str::trim_start) {
                    Some(r)
                        if r.starts_with(seg.as_str())
                            && !r.as_bytes().get(seg.len()).is_some_and(|&c| ident(c)) =>
                    {
                        rest = r[seg.len()..].trim_start();
                    }
                    _ => {
                        inside = false;
                        break;
                    }
                }
            }
            if inside {
                if let Some(r) = rest.strip_prefix("::") {
                    out.extend(first_segments(r));
                }
            }
            i += 5;
        } else if keyword("super") {
            let mut ups = 0;
            let mut rest = &code[i..];
            while let Some(r) = rest.strip_prefix("super") {
                match r.trim_start().strip_prefix("::") {
                    Some(r) => {
                        ups += 1;
                        rest = r.trim_start();
                    }
                    None => break,
                }
            }
            if ups == depth {
                out.extend(first_segments(rest));
            }
            i = (code.len() - rest.len()).max(i + 5);
        } else {
            i += code[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// The graph between the children (files and folders) of folder `dir`, module `prefix` of a
/// crate: an arrow from a child to a sibling it names.
fn folder_graph(dir: &Path, prefix: &[String]) -> ModuleGraph {
    let roots = ["mod.rs", "lib.rs", "main.rs"];
    let mut children: BTreeMap<String, Vec<(PathBuf, usize)>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("folder") {
        let p = e.expect("entry").path();
        let name = p.file_name().expect("name").to_string_lossy().to_string();
        if p.is_file() && name.ends_with(".rs") && !roots.contains(&name.as_str()) {
            children.insert(name.trim_end_matches(".rs").to_string(), vec![(p, 1)]);
        } else if p.is_dir() && p.join("mod.rs").is_file() {
            let mut files = Vec::new();
            rust_files(&p, &mut files);
            let deep = files
                .into_iter()
                .map(|f| {
                    let parts = f.strip_prefix(dir).expect("under").components().count();
                    let depth = if f.ends_with("mod.rs") {
                        parts - 1
                    } else {
                        parts
                    };
                    (f, depth)
                })
                .collect();
            children.insert(name, deep);
        }
    }
    let mut arrows = BTreeSet::new();
    for (c, files) in &children {
        for (f, depth) in files {
            let code = code_only(&std::fs::read_to_string(f).expect("read"));
            for n in folder_names(&code, *depth, prefix) {
                if &n != c && children.contains_key(&n) {
                    arrows.insert((c.clone(), n));
                }
            }
        }
    }
    ModuleGraph {
        modules: children.into_keys().collect(),
        arrows,
    }
}

/// No two files (or folders) of one folder import each other in a circle, in any folder of
/// the crates (`src/`'s own top level and the crate roots are the test above), nor in the
/// binaries' crates (`src/bin/*`).
#[test]
fn no_import_circles_between_the_files_of_a_folder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // (crate root, whether the root folder itself is checked here)
    let mut crates: Vec<(PathBuf, bool)> = ["src", "filters/src", "xds/src"]
        .iter()
        .map(|d| (root.join(d), false))
        .collect();
    for bins in ["src/bin", "xds/src/bin"] {
        for e in std::fs::read_dir(root.join(bins)).into_iter().flatten() {
            let p = e.expect("entry").path();
            if p.join("main.rs").is_file() {
                crates.push((p, true));
            }
        }
    }
    let mut found = Vec::new();
    let mut folders_seen = 0;
    for (krate, with_root) in &crates {
        let mut stack = vec![(krate.clone(), Vec::<String>::new())];
        while let Some((dir, prefix)) = stack.pop() {
            if !prefix.is_empty() || *with_root {
                folders_seen += 1;
                let g = folder_graph(&dir, &prefix);
                for c in circles(&g) {
                    found.push(format!("{}: {}", dir.display(), describe(&g, &c)));
                }
            }
            for e in std::fs::read_dir(&dir).expect("folder") {
                let p = e.expect("entry").path();
                let name = p.file_name().expect("name").to_string_lossy().to_string();
                // A binary's folder is a crate of its own (listed above).
                if p.is_dir() && name != "bin" && p.join("mod.rs").is_file() {
                    let mut sub = prefix.clone();
                    sub.push(name);
                    stack.push((p, sub));
                }
            }
        }
    }
    assert!(folders_seen > 15, "{folders_seen} folders");
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The folder reader: `crate::` paths count only inside the folder, `super::` only from the
/// depth that reaches it.
#[test]
fn the_folder_reader_reads_only_its_folder() {
    let code = code_only(
        "use crate::yaml::{cluster::X, shards};\nuse crate::other::y;\nuse super::value::Map;\n\
         fn f() { super::super::z(); crate::yaml::w::v(); }\n",
    );
    let yaml = ["yaml".to_string()];
    assert_eq!(
        folder_names(&code, 1, &yaml),
        ["cluster", "shards", "value", "w"]
    );
    assert_eq!(
        folder_names(&code, 2, &yaml),
        ["cluster", "shards", "z", "w"]
    );
    assert_eq!(
        folder_names(&code, 1, &[]),
        ["yaml", "other", "value", "yaml"]
    );
}
