//! The reader's documents checked against the repository itself: the README's "Layout" names
//! every workspace crate and every top-level folder; no document, source file or script points
//! into a folder beside the repository or to a file the repository does not hold;
//! every crate's `lib.rs` opens with a map that names each of its modules.
//!
//! Files are those git knows (tracked, or new and not ignored); without git (a copy of the tree),
//! every file under the root but `target/`, `.git/` and `node_modules/`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file of the repository, as paths relative to its root.
fn repo_files() -> Vec<String> {
    let git = Command::new("git")
        .arg("-C")
        .arg(root())
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .output();
    if let Ok(out) = git {
        if out.status.success() && !out.stdout.is_empty() {
            let mut files: Vec<String> = out
                .stdout
                .split(|&b| b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| String::from_utf8_lossy(p).into_owned())
                // Deleted but not yet staged: not a file of the tree any more.
                .filter(|p| root().join(p).is_file())
                .collect();
            files.sort();
            files.dedup();
            return files;
        }
    }
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(root().join(&dir))
            .unwrap_or_else(|e| panic!("{}: {e}", root().join(&dir).display()));
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = dir.join(&name);
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                    dirs.push(rel);
                }
            } else if kind.is_file() {
                files.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    files
}

/// The folders at the top of the repository that hold any of its files.
fn top_level_folders(files: &[String]) -> BTreeSet<String> {
    files
        .iter()
        .filter_map(|f| f.split_once('/').map(|(dir, _)| dir.to_string()))
        .collect()
}

/// The README section under `## {title}`, up to the next `## ` heading.
fn readme_section(title: &str) -> String {
    let readme = read("README.md");
    let heading = format!("## {title}\n");
    let start = readme
        .find(&heading)
        .unwrap_or_else(|| panic!("README.md has no \"## {title}\" section"));
    let body = &readme[start + heading.len()..];
    let end = body.find("\n## ").map_or(body.len(), |i| i + 1);
    body[..end].to_string()
}

/// The workspace's members (folders) and the crate each one is.
fn workspace_crates() -> Vec<(String, String)> {
    let manifest = read("Cargo.toml");
    let start = manifest
        .find("members = [")
        .expect("Cargo.toml lists its workspace members");
    let list = &manifest[start + "members = [".len()..];
    let list = &list[..list.find(']').expect("the members list ends")];
    let members: Vec<String> = list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect();
    assert!(members.len() > 1, "members: {members:?}");
    members
        .into_iter()
        .map(|m| {
            let text = read(&format!("{m}/Cargo.toml"));
            let package = &text[text.find("[package]").expect("a [package] section")..];
            let name = package
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = "))
                .unwrap_or_else(|| panic!("{m}/Cargo.toml names its package"))
                .trim_matches('"')
                .to_string();
            (m, name)
        })
        .collect()
}

#[test]
fn readme_layout_names_every_crate_and_top_level_folder() {
    let layout = readme_section("Layout");
    let mut missing = Vec::new();
    for (folder, name) in workspace_crates() {
        if !layout.contains(&format!("`{name}`")) {
            missing.push(format!("crate `{name}` (workspace member {folder:?})"));
        }
    }
    let files = repo_files();
    let folders = top_level_folders(&files);
    for wanted in ["src", "filters", "xds", "tls", "testkit", "perf", "tests"] {
        assert!(
            folders.contains(wanted),
            "{wanted}/ not found in {folders:?}"
        );
    }
    for folder in &folders {
        if !layout.contains(&format!("`{folder}/`")) {
            missing.push(format!("folder `{folder}/`"));
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's Layout does not name:\n  {}",
        missing.join("\n  ")
    );
}

/// The nearest folder above `file` (or the root) that holds a `Cargo.toml`: a crate's root.
fn crate_root(file: &str) -> PathBuf {
    let mut dir = Path::new(file).parent();
    while let Some(d) = dir {
        if root().join(d).join("Cargo.toml").is_file() {
            return d.to_path_buf();
        }
        dir = d.parent();
    }
    PathBuf::new()
}

/// Whether `target`, named in `file`, is a file or folder of the repository: relative to the
/// file, to its crate or to the root.
fn resolves(file: &str, target: &str) -> bool {
    let here = Path::new(file).parent().unwrap_or(Path::new(""));
    [here.to_path_buf(), crate_root(file), PathBuf::new()]
        .iter()
        .any(|base| root().join(base).join(target).exists())
}

/// The words of `text` that look like file names ending in `.md`.
fn markdown_names(text: &str) -> Vec<&str> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(".md") {
        let after = rest[i + 3..].chars().next();
        if after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            rest = &rest[i + 3..];
            continue;
        }
        let start = rest[..i]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_name(c))
            .last()
            .map_or(i, |(j, _)| j);
        let name = &rest[start..i + 3];
        // `$ROOT/x.md` is a script's variable, `/x.md` a URL path or an absolute file.
        let variable = rest[..start].ends_with('$');
        if name.len() > 3 && !name.starts_with('.') && !name.starts_with('/') && !variable {
            out.push(name);
        }
        rest = &rest[i + 3..];
    }
    out
}

/// The relative targets of the markdown links `[text](target)` in `text`.
fn link_targets(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        let tail = &rest[i + 2..];
        let Some(end) = tail.find(')') else { break };
        let target = tail[..end].split('#').next().unwrap_or("").trim();
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external && !target.contains(' ') {
            out.push(target);
        }
        rest = &tail[end..];
    }
    out
}

/// Paths into the repository's own folders (`perf/bench/compare.sh`), in `text`.
fn repo_paths<'a>(text: &'a str, folders: &BTreeSet<String>) -> Vec<&'a str> {
    let is_path = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let exts = [
        ".rs", ".md", ".sh", ".py", ".yaml", ".yml", ".toml", ".json", ".patch", ".proto",
    ];
    let mut out = Vec::new();
    for (start, _) in text.match_indices(|c: char| c.is_ascii_alphanumeric() || c == '.') {
        if start > 0 {
            let before = text[..start].chars().next_back().unwrap_or(' ');
            if is_path(before) || before == '$' || before == '~' {
                continue;
            }
        }
        let word = &text[start..];
        let end = word.find(|c: char| !is_path(c)).unwrap_or(word.len());
        let word = word[..end].trim_end_matches('.');
        let Some((first, _)) = word.split_once('/') else {
            continue;
        };
        if folders.contains(first) && exts.iter().any(|e| word.ends_with(e)) {
            out.push(word);
        }
    }
    out
}

#[test]
fn no_file_points_outside_the_repository_or_to_a_missing_file() {
    let files = repo_files();
    let folders = top_level_folders(&files);
    let mut bad = Vec::new();
    let mut checked = 0;
    // A folder next to the checkout, which readers of the repository do not have.
    let beside = format!("../{}", "shared");
    for file in &files {
        let kind = Path::new(file).extension().and_then(|e| e.to_str());
        if !matches!(kind, Some("md" | "rs" | "sh")) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root().join(file)) else {
            continue;
        };
        checked += 1;
        for (n, line) in text.lines().enumerate() {
            if line.contains(&beside) {
                bad.push(format!(
                    "{file}:{}: points beside the repository: {line}",
                    n + 1
                ));
            }
        }
        // A dated log records the tree of its day: only the rule above applies to it.
        if file == "perf/RESULTS-archive.md" {
            continue;
        }
        for name in markdown_names(&text) {
            if !resolves(file, name) {
                bad.push(format!(
                    "{file}: names {name}, which is not in the repository"
                ));
            }
        }
        if kind == Some("md") {
            for target in link_targets(&text) {
                if !resolves(file, target) {
                    bad.push(format!(
                        "{file}: links to {target}, which is not in the repository"
                    ));
                }
            }
        }
        for path in repo_paths(&text, &folders) {
            if !resolves(file, path) {
                bad.push(format!(
                    "{file}: names {path}, which is not in the repository"
                ));
            }
        }
    }
    assert!(checked > 50, "only {checked} files read");
    bad.sort();
    bad.dedup();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The modules a `lib.rs` declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`), but not
/// inline test modules.
fn declared_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

#[test]
fn every_lib_rs_opens_with_a_map_of_its_modules() {
    let mut missing = Vec::new();
    for (folder, name) in workspace_crates() {
        let path = if folder == "." {
            "src/lib.rs".to_string()
        } else {
            format!("{folder}/src/lib.rs")
        };
        let lib = read(&path);
        let header: String = lib
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .map(|l| format!("{l}\n"))
            .collect();
        if header.lines().count() < 5 {
            missing.push(format!("{path} ({name}): no map at its top"));
            continue;
        }
        for module in declared_modules(&lib) {
            if !header.contains(&format!("`{module}`"))
                && !header.contains(&format!("[`{module}`]"))
            {
                missing.push(format!("{path} ({name}): module `{module}` not in its map"));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
