//! Blocks of a documentation page written from the code: a reference table (the metric families,
//! the configuration keys) sits in its page between two marker lines,
//!
//! ```text
//! <!-- generated: ID (where it comes from; how to rewrite it) -->
//! ...
//! <!-- end generated -->
//! ```
//!
//! and a test renders it from the code and calls [`check_generated`], which fails when the page
//! holds anything else there (printing what it should hold), or rewrites the blocks when
//! `RESPWAY_BLESS` is set. Everything outside the markers is the page's own, written by hand.

use std::path::Path;

/// The opening of a block's first line; its id follows, up to the next space.
const START: &str = "<!-- generated: ";
/// A block's last line.
pub const END: &str = "<!-- end generated -->";

/// One block as the code renders it: its id (`metrics`, `config.listener`), what its first
/// line says after the id (where it comes from and how to rewrite it), and its body (the lines
/// between the markers, each ending in `\n`).
#[derive(Debug, Clone)]
pub struct Block {
    pub id: String,
    pub note: String,
    pub body: String,
}

impl Block {
    /// The block as the page holds it, both marker lines included.
    pub fn text(&self) -> String {
        format!(
            "{START}{} ({}) -->\n{}{END}\n",
            self.id, self.note, self.body
        )
    }
}

/// A generated block found in a page: its id and the byte range of its lines.
struct Found {
    id: String,
    range: std::ops::Range<usize>,
}

/// Every generated block of `page` whose id starts with `namespace`, in page order; a start
/// marker without its end is an error.
fn find(page: &str, namespace: &str) -> Result<Vec<Found>, String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = page[from..].find(START) {
        let start = from + i;
        let line_start = page[..start].rfind('\n').map_or(0, |n| n + 1);
        let id: String = page[start + START.len()..]
            .chars()
            .take_while(|c| !c.is_whitespace())
            .collect();
        let Some(j) = page[start..].find(END) else {
            return Err(format!("the block `{id}` has no `{END}` line"));
        };
        let mut end = start + j + END.len();
        if page[end..].starts_with('\n') {
            end += 1;
        }
        if id.starts_with(namespace) {
            out.push(Found {
                id,
                range: line_start..end,
            });
        }
        from = end;
    }
    Ok(out)
}

/// Checks that `page` (a path from `root`) holds exactly `blocks` among its generated blocks
/// whose ids start with `namespace`: each once, as rendered, and no other. With
/// `RESPWAY_BLESS` set, rewrites the blocks the page has instead (a new block is added by
/// writing its two marker lines where it goes, then blessing). `bless` is the command that
/// rewrites them, for the failure message.
pub fn check_generated(root: &Path, page: &str, namespace: &str, blocks: &[Block], bless: &str) {
    let path = root.join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
    let found = find(&text, namespace).unwrap_or_else(|e| panic!("{page}: {e}"));
    let mut problems = Vec::new();
    for f in &found {
        if !blocks.iter().any(|b| b.id == f.id) {
            problems.push(format!(
                "{page}: the generated block `{}` is generated from nothing (a section that is gone?); remove its lines",
                f.id
            ));
        }
    }
    for b in blocks {
        let n = found.iter().filter(|f| f.id == b.id).count();
        if n != 1 {
            problems.push(format!(
                "{page}: the generated block `{}` is there {n} times, not once; put its two marker lines \
                 (`{START}{} -->` and `{END}`) where it goes and run `{bless}`",
                b.id, b.id
            ));
        }
    }
    let bless_now = std::env::var_os("RESPWAY_BLESS").is_some();
    let mut fresh = text.clone();
    // Back to front, so that the earlier ranges stay valid.
    for f in found.iter().rev() {
        let Some(b) = blocks.iter().find(|b| b.id == f.id) else {
            continue;
        };
        let want = b.text();
        if text[f.range.clone()] == want {
            continue;
        }
        fresh.replace_range(f.range.clone(), &want);
        if !bless_now {
            let line = text[..f.range.start].matches('\n').count() + 1;
            let held = &text[f.range.clone()];
            let (n, (page_line, code_line)) = held
                .lines()
                .chain(std::iter::repeat(""))
                .zip(want.lines().chain(std::iter::repeat("")))
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .unwrap_or((0, ("", "")));
            problems.push(format!(
                "{page}:{line}: the generated block `{}` differs from what the code renders, first at \
                 {page}:{}:\n  page: {page_line}\n  code: {code_line}\n\
                 Run `{bless}` to rewrite it (edit the code, not the page). It should read:\n{want}",
                b.id,
                line + n
            ));
        }
    }
    if bless_now && fresh != text {
        std::fs::write(&path, &fresh).unwrap_or_else(|e| panic!("{page}: {e}"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// A Markdown table cell: `|` escaped (also inside code spans, as GitHub's tables want it), and
/// the links written from the repository's root (`docs/caching.md#near-cache`, as the source
/// can name them and have them checked) made relative to the page's folder `page_dir`
/// (`docs`); links to an anchor of the same page (`#x`) and external ones are kept.
pub fn cell(text: &str, page_dir: &str) -> String {
    let text = text.replace('|', "\\|");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        out.push_str(&rest[..i + 2]);
        rest = &rest[i + 2..];
        let target = &rest[..rest.find(')').unwrap_or(rest.len())];
        if target.starts_with('#') || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let prefix = format!("{page_dir}/");
        match rest.strip_prefix(&prefix) {
            Some(within) => rest = within,
            None => {
                let up = page_dir.split('/').filter(|p| !p.is_empty()).count();
                out.push_str(&"../".repeat(up));
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_escape_pipes_and_make_links_relative() {
        assert_eq!(
            cell("a `x|y` [c](docs/README.md#the-book) [s](#same) [r](COMMANDS.md) [w](https://e.invalid/docs/x)", "docs"),
            "a `x\\|y` [c](README.md#the-book) [s](#same) [r](../COMMANDS.md) [w](https://e.invalid/docs/x)"
        );
    }

    #[test]
    fn blocks_are_found_by_namespace() {
        let page = format!(
            "intro\n{START}metrics (x) -->\n| a |\n{END}\nmiddle\n{START}config.node (y) -->\n\n{END}\nend\n"
        );
        let found = find(&page, "config.").unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].id, "config.node");
        assert_eq!(
            &page[found[0].range.clone()],
            format!("{START}config.node (y) -->\n\n{END}\n")
        );
        assert!(find(&format!("{START}x -->\n"), "").is_err());
    }
}
