//! The reader's documents checked against the repository itself: the README's "Layout" names
//! every workspace crate and every top-level folder; no document, source file or script points
//! into a folder beside the repository or to a file the repository does not hold; every
//! relative link of the README, the pages of `docs/`, ARCHITECTURE.md and xds/SCHEMA.md names
//! a file that exists, and every `#anchor` a heading of the page it points into; the index
//! `docs/README.md` links every page of `docs/`; every crate's `lib.rs` opens with a map that
//! names each of its modules.
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

/// The documents whose links are checked strictly, as GitHub renders them: the README, every
/// page of `docs/`, ARCHITECTURE.md and xds/SCHEMA.md.
fn linked_documents(files: &[String]) -> Vec<String> {
    files
        .iter()
        .filter(|f| {
            matches!(
                f.as_str(),
                "README.md" | "ARCHITECTURE.md" | "xds/SCHEMA.md"
            ) || (f.starts_with("docs/") && f.ends_with(".md") && !f[5..].contains('/'))
        })
        .cloned()
        .collect()
}

/// A markdown document cut into what GitHub reads as text: fenced code blocks left out, and the
/// code spans of each paragraph blanked (a span may run over several lines). Each paragraph
/// comes with the number of its first line.
fn prose_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut fence: Option<&str> = None;
    let mut current: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(marker) = fence {
            if trimmed.starts_with(marker) {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = Some(&trimmed[..3]);
            blocks.extend(current.take());
            continue;
        }
        if line.trim().is_empty() || line.starts_with('#') {
            blocks.extend(current.take());
            if line.starts_with('#') {
                blocks.push((n + 1, line.to_string()));
            }
            continue;
        }
        let block = current.get_or_insert_with(|| (n + 1, String::new()));
        block.1.push_str(line);
        block.1.push('\n');
    }
    blocks.extend(current);
    blocks
        .into_iter()
        .map(|(n, b)| (n, blank_code_spans(&b)))
        .collect()
}

/// `text` with every code span (`` `x` ``, ``` ``x`` ```) replaced by spaces, newlines kept.
fn blank_code_spans(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('`') {
        out.push_str(&rest[..i]);
        let ticks = rest[i..].len() - rest[i..].trim_start_matches('`').len();
        let after = &rest[i + ticks..];
        let closing = "`".repeat(ticks);
        // The span ends at the next run of exactly as many backticks.
        let mut end = None;
        let mut from = 0;
        while let Some(j) = after[from..].find(&closing) {
            let at = from + j;
            let run = after[at..].len() - after[at..].trim_start_matches('`').len();
            if run == ticks {
                end = Some(at);
                break;
            }
            from = at + run;
        }
        match end {
            Some(j) => {
                let span = &rest[i..i + ticks + j + ticks];
                out.extend(span.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
                rest = &after[j + ticks..];
            }
            None => {
                out.push_str(&rest[i..i + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// GitHub's anchor for a heading's text: lowercase, markup dropped, every character but
/// letters, digits, spaces, `-` and `_` dropped, spaces turned into `-`.
fn github_slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading.trim().trim_end_matches('#').trim_end();
    // A link in a heading reads as its text.
    while let Some(i) = rest.find("](") {
        let Some(open) = rest[..i].rfind('[') else {
            break;
        };
        let Some(close) = rest[i..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..i]);
        rest = &rest[i + close + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The headings of a markdown document (outside fenced code), as their text after the `#`s.
fn headings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(marker) = fence {
            if trimmed.starts_with(marker) {
                fence = None;
            }
        } else if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = Some(&trimmed[..3]);
        } else if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start_matches('#');
            if rest.starts_with(' ') && line.len() - rest.len() <= 6 {
                out.push(rest.trim().to_string());
            }
        }
    }
    out
}

/// The anchors of a markdown document's headings, as GitHub makes them (a repeated one gets
/// `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for heading in headings(text) {
        let slug = github_slug(&heading.replace('`', ""));
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The markdown links `[label](target)` (and images) of `text` outside code, with their lines.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (first, block) in prose_blocks(text) {
        let mut rest = block.as_str();
        let mut consumed = 0;
        while let Some(i) = rest.find("](") {
            let tail = &rest[i + 2..];
            let Some(end) = tail.find(')') else { break };
            let target = tail[..end].trim();
            // `[text](target "title")`: the target is the first word.
            let target = target.split_whitespace().next().unwrap_or("");
            let line = first + block[..consumed + i].matches('\n').count();
            out.push((line, target.to_string()));
            consumed += i + 2 + end;
            rest = &tail[end..];
        }
    }
    out
}

/// Every broken link of `doc` (a path from the repository's root) whose text is `text`: a
/// relative target that is not a file or folder of the repository (resolved from the
/// document's own folder, as GitHub resolves it), or an anchor that names no heading of the
/// markdown page it points into.
fn broken_links(doc: &str, text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let here = Path::new(doc).parent().unwrap_or(Path::new(""));
    for (line, target) in links(text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let say = |why: String| format!("{doc}:{line}: ({target}) {why}");
        if path.is_empty() {
            let anchor = anchor.unwrap_or_default();
            if !anchors(text).contains(anchor) {
                bad.push(say(format!("names no heading of {doc} (#{anchor})")));
            }
            continue;
        }
        // The target, relative to the repository's root, with `.` and `..` resolved.
        let mut parts: Vec<&str> = Vec::new();
        let mut outside = path.starts_with('/');
        let joined = here.join(path);
        for part in joined.to_str().unwrap_or_default().split('/') {
            match part {
                "" | "." => {}
                ".." => outside |= parts.pop().is_none(),
                p => parts.push(p),
            }
        }
        if outside {
            bad.push(say("points outside the repository".into()));
            continue;
        }
        let rel = parts.join("/");
        let full = root().join(&rel);
        if !full.exists() {
            bad.push(say(format!("names {rel}, which does not exist")));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if !rel.ends_with(".md") || !full.is_file() {
            bad.push(say(format!(
                "has an anchor, but {rel} is not a markdown file"
            )));
            continue;
        }
        if !anchors(&read(&rel)).contains(anchor) {
            bad.push(say(format!("names no heading of {rel} (#{anchor})")));
        }
    }
    bad
}

#[test]
fn every_link_between_the_documents_resolves_to_a_file_and_a_heading() {
    let files = repo_files();
    let docs = linked_documents(&files);
    for wanted in [
        "README.md",
        "docs/README.md",
        "ARCHITECTURE.md",
        "xds/SCHEMA.md",
    ] {
        assert!(
            docs.iter().any(|d| d == wanted),
            "{wanted} not among {docs:?}"
        );
    }
    assert!(docs.len() >= 12, "only {docs:?}");
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = read(doc);
        checked += links(&text).len();
        bad.extend(broken_links(doc, &text));
    }
    assert!(checked > 150, "only {checked} links read");
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// The checker itself: a link to a missing file, a missing heading of another page or of the
/// same page, and a path out of the repository are each reported; links in code are not read.
#[test]
fn the_link_checker_reports_broken_links() {
    // Built with `MD` so that these names of files that do not exist are not taken for
    // references by the test above, which reads this file too.
    const MD: &str = "md";
    let text = format!(
        "# Page\n\n## A heading (with `code`)\n\n\
        [ok](configuration.{MD}#full-example), [ok](#a-heading-with-code), [ok](../COMMANDS.{MD}),\n\
        [ok](../examples/), [ok](https://example.invalid/x#y).\n\n\
        [gone](no-such-page.{MD}) and [nohead](configuration.{MD}#no-such-heading)\n\
        and [self](#nowhere) and [out](../../elsewhere.{MD}) and `[code](not-read.{MD})`.\n\n\
        ```\n[fenced](not-read-either.{MD})\n```\n"
    );
    let bad = broken_links(&format!("docs/example.{MD}"), &text);
    let reported = |what: String| bad.iter().any(|b| b.contains(&what));
    assert_eq!(bad.len(), 4, "{bad:#?}");
    assert!(
        reported(format!(
            "(no-such-page.{MD}) names docs/no-such-page.{MD}, which does not exist"
        )),
        "{bad:#?}"
    );
    assert!(
        reported(format!(
            "(configuration.{MD}#no-such-heading) names no heading"
        )),
        "{bad:#?}"
    );
    assert!(
        reported(format!("(#nowhere) names no heading of docs/example.{MD}")),
        "{bad:#?}"
    );
    assert!(
        reported(format!("(../../elsewhere.{MD}) points outside")),
        "{bad:#?}"
    );
    let at = format!("docs/example.{MD}:");
    assert!(bad.iter().all(|b| b.starts_with(&at)), "{bad:#?}");
}

#[test]
fn github_slugs_are_githubs() {
    assert_eq!(
        github_slug("Admin endpoint (`--admin ADDR`)"),
        "admin-endpoint---admin-addr"
    );
    assert_eq!(
        github_slug("Client-side caching (CLIENT TRACKING)"),
        "client-side-caching-client-tracking"
    );
    assert_eq!(
        github_slug("Resharding with one command: `respway-xds reshard`"),
        "resharding-with-one-command-respway-xds-reshard"
    );
    assert_eq!(github_slug("Pub/sub"), "pubsub");
    let twice = anchors("# T\n\n## Hot keys\n\n```\n# not a heading\n```\n\n### Hot keys\n");
    assert!(
        twice.contains("hot-keys") && twice.contains("hot-keys-1"),
        "{twice:?}"
    );
    assert!(!twice.contains("not-a-heading"), "{twice:?}");
}

/// The index of the book links every page of `docs/`, and the README links the index.
#[test]
fn the_docs_index_links_every_page() {
    let files = repo_files();
    let index = read("docs/README.md");
    let linked: BTreeSet<String> = links(&index)
        .into_iter()
        .map(|(_, t)| t.split('#').next().unwrap_or("").to_string())
        .collect();
    let mut missing = Vec::new();
    for doc in linked_documents(&files) {
        let Some(page) = doc.strip_prefix("docs/") else {
            continue;
        };
        if page != "README.md" && !linked.contains(page) {
            missing.push(page.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/README.md does not link {missing:?}"
    );
    assert!(
        links(&read("README.md"))
            .iter()
            .any(|(_, t)| t == "docs/README.md"),
        "README.md does not link docs/README.md"
    );
}
