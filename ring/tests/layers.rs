//! The layers of the house, checked so they stay (ARCHITECTURE.md, "Which way dependencies
//! point"):
//!
//! 1. `garden-ring-core` depends on data-only crates and nothing else: no runtime, network or
//!    storage library can enter the deterministic core.
//! 2. No import circles between the files of `ring/src` or of `ring/core/src`.
//! 3. Each top-level module of `garden_ring` uses only the modules its row in ARCHITECTURE.md's
//!    table allows, every module has a row, and the table itself has no circle, so a lower layer
//!    never imports a higher one.
//!
//! References are read from the source text: `use` trees and inline paths starting with
//! `crate::`, `super::` or `self::` (and child modules named from their parent), comments
//! removed. Test code (`tests.rs`, `*_test.rs`, a trailing `#[cfg(test)] mod tests { .. }`) may
//! reach further and is not checked. A parent module's `pub use` of its own children is its table
//! of contents, not a dependency, so it is not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates the core may depend on: data only.
const CORE_DEPENDENCIES: &[&str] = &["serde", "thiserror"];

/// Modules of `garden_ring` that are not files of `ring/src`: the core crate re-exported as
/// `core`, and the generated gRPC code.
const EXTERNAL_MODULES: &[&str] = &["core", "pb", "etcdpb"];

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One source file: its module path and the module paths it refers to.
#[derive(Debug)]
struct SourceFile {
    /// Relative to the crate's `src`.
    rel: String,
    module: Vec<String>,
    references: BTreeSet<Vec<String>>,
}

/// The text without comments (line comments, doc comments, block comments) and with the
/// contents of string literals blanked. Works on bytes: non-ASCII text only ever appears in
/// comments and strings, which are dropped.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            // String contents are blanked: a "use " or a path in a message is no import.
            if c == b'\\' && i + 1 < bytes.len() {
                out.push_str("  ");
                i += 2;
                continue;
            }
            if c == b'"' {
                in_string = false;
                out.push('"');
            } else {
                out.push(if c == b'\n' { '\n' } else { ' ' });
            }
            i += 1;
            continue;
        }
        if c == b'"' && (i == 0 || bytes[i - 1] != b'\'') {
            in_string = true;
            out.push('"');
            i += 1;
        } else if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i..].starts_with(b"/*") {
            i += 2;
            while i + 1 < bytes.len() && !bytes[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

/// The code before a trailing `#[cfg(test)] mod tests {`.
fn without_test_module(code: &str) -> &str {
    let mut end = code.len();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let at = from + at;
        let rest = code[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod tests {") || rest.starts_with("mod tests;") {
            end = at;
            break;
        }
        from = at + 1;
    }
    &code[..end]
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into paths.
fn expand_use_tree(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        // Split at top-level commas.
        let mut depth = 0;
        let mut start = 0;
        let mut parts = Vec::new();
        for (i, c) in tree.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&tree[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&tree[start..]);
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            if let Some(open) = part.find('{') {
                let head = part[..open].trim().trim_end_matches("::");
                let mut next = prefix.to_vec();
                next.extend(head.split("::").filter(|s| !s.is_empty()).map(String::from));
                expand(&next, &part[open + 1..part.len() - 1], out);
            } else {
                let path = part.split(" as ").next().unwrap_or(part).trim();
                let mut full = prefix.to_vec();
                // `self` inside braces (`a::{self, b}`) names the prefix itself; a leading
                // `self::` is a path relative to this module and stays.
                let leading = prefix.is_empty();
                full.extend(
                    path.split("::")
                        .map(str::trim)
                        .enumerate()
                        .filter(|(i, s)| {
                            !s.is_empty() && *s != "*" && (*s != "self" || (leading && *i == 0))
                        })
                        .map(|(_, s)| String::from(s)),
                );
                out.push(full);
            }
        }
    }
    let mut out = Vec::new();
    expand(&[], &tree, &mut out);
    out
}

/// Every path the code refers to, as written (first segment `crate`, `super`, `self`, or a
/// plain name), with whether it came from a `pub use`.
fn paths_in(code: &str) -> Vec<(Vec<String>, bool)> {
    let mut found = Vec::new();
    let mut rest = String::new();
    // `use` statements first (they may span lines and hold brace trees).
    let mut i = 0;
    let chars: Vec<char> = code.chars().collect();
    while i < chars.len() {
        let at_word_start = i == 0 || !is_ident_char(chars[i - 1]);
        if at_word_start && code_starts(&chars, i, "use ") {
            let public = preceded_by_pub(&chars, i);
            let start = i + 4;
            let mut end = start;
            while end < chars.len() && chars[end] != ';' {
                end += 1;
            }
            let tree: String = chars[start..end].iter().collect();
            for path in expand_use_tree(&tree) {
                found.push((path, public));
            }
            i = end + 1;
            continue;
        }
        rest.push(chars[i]);
        i += 1;
    }
    // Inline paths: `crate::a::b`, `super::x`, `self::y`.
    let rest: Vec<char> = rest.chars().collect();
    let mut i = 0;
    while i < rest.len() {
        let at_word_start = i == 0 || !(is_ident_char(rest[i - 1]) || rest[i - 1] == ':');
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| at_word_start && code_starts(&rest, i, h));
        if let Some(head) = head {
            let mut end = i + head.len();
            while end < rest.len()
                && (is_ident_char(rest[end]) || (rest[end] == ':' && end + 1 < rest.len()))
            {
                if rest[end] == ':' && rest[end + 1] != ':' && rest[end - 1] != ':' {
                    break;
                }
                end += 1;
            }
            let text: String = rest[i..end].iter().collect();
            let path: Vec<String> = text
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            found.push((path, false));
            i = end;
            continue;
        }
        i += 1;
    }
    found
}

fn code_starts(chars: &[char], at: usize, word: &str) -> bool {
    word.chars()
        .enumerate()
        .all(|(k, w)| chars.get(at + k) == Some(&w))
}

fn preceded_by_pub(chars: &[char], at: usize) -> bool {
    let before: String = chars[at.saturating_sub(16)..at].iter().collect();
    let before = before.trim_end();
    before.ends_with("pub") || before.ends_with(')') && before.contains("pub(")
}

/// The module path of a file relative to `src`.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

fn read_crate(src: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                // Binaries refer to the library by its name, not by `crate::`.
                if path.file_name().is_some_and(|n| n != "bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let name = path.file_stem().unwrap().to_string_lossy();
            if name == "tests" || name.ends_with("_test") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = strip_comments(&text);
            let code = without_test_module(&code);
            let module = module_of(&rel);
            let is_parent = rel.ends_with("mod.rs") || rel == "lib.rs";
            let mut references = BTreeSet::new();
            for (path, public) in paths_in(code) {
                let Some(first) = path.first() else { continue };
                let absolute: Vec<String> = match first.as_str() {
                    "crate" => path[1..].to_vec(),
                    "super" => {
                        let mut base = module.clone();
                        let mut rest = &path[..];
                        while rest.first().is_some_and(|s| s == "super") {
                            base.pop();
                            rest = &rest[1..];
                        }
                        base.extend(rest.iter().cloned());
                        base
                    }
                    "self" => {
                        let mut base = module.clone();
                        base.extend(path[1..].iter().cloned());
                        base
                    }
                    // A child module named from its parent (`use driver::Workloads;`).
                    _ if is_parent => {
                        let mut base = module.clone();
                        base.extend(path.iter().cloned());
                        // A parent's `pub use` of its own child: its table of contents.
                        if public {
                            continue;
                        }
                        base
                    }
                    _ => continue,
                };
                if public
                    && is_parent
                    && absolute.starts_with(&module)
                    && absolute.len() > module.len()
                {
                    continue;
                }
                references.insert(absolute);
            }
            files.push(SourceFile {
                rel,
                module,
                references,
            });
        }
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    files
}

/// The file each reference lands in (the longest module prefix that is a file), without
/// references to the file itself or to the crate root.
fn file_graph(files: &[SourceFile]) -> BTreeMap<String, BTreeSet<String>> {
    let by_module: BTreeMap<&[String], &str> = files
        .iter()
        .map(|f| (f.module.as_slice(), f.rel.as_str()))
        .collect();
    let mut graph = BTreeMap::new();
    for f in files {
        let mut targets = BTreeSet::new();
        for r in &f.references {
            let target = (1..=r.len())
                .rev()
                .find_map(|n| by_module.get(&r[..n]).copied());
            if let Some(target) = target
                && target != f.rel
            {
                targets.insert(target.to_string());
            }
        }
        graph.insert(f.rel.clone(), targets);
    }
    graph
}

/// The strongly connected components with more than one node (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// ARCHITECTURE.md's table of allowed module dependencies: module -> the modules it may use.
fn allowed_table() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(manifest_dir().join("../ARCHITECTURE.md")).unwrap();
    let section = text
        .split("### Which way dependencies point")
        .nth(1)
        .expect("ARCHITECTURE.md has a section \"Which way dependencies point\"");
    let mut table = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 3 || cells[1] == "module" || cells[1].starts_with("---") {
            continue;
        }
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(String::from)
                .collect()
        };
        let uses: BTreeSet<String> = ticked(cells[2]).into_iter().collect();
        for module in ticked(cells[1]) {
            table.insert(module, uses.clone());
        }
    }
    table
}

#[test]
fn the_core_depends_on_data_only_crates() {
    let manifest =
        std::fs::read_to_string(manifest_dir().join("core/Cargo.toml")).expect("ring/core");
    let mut in_dependencies = false;
    let mut found = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if in_dependencies && !line.is_empty() && !line.starts_with('#') {
            let name = line
                .split(['=', '.', ' '])
                .next()
                .unwrap_or_default()
                .to_string();
            found.push(name);
        }
    }
    assert!(
        !found.is_empty(),
        "no [dependencies] read from ring/core/Cargo.toml"
    );
    let refused: Vec<&String> = found
        .iter()
        .filter(|d| !CORE_DEPENDENCIES.contains(&d.as_str()))
        .collect();
    assert!(
        refused.is_empty(),
        "garden-ring-core may depend on data-only crates {CORE_DEPENDENCIES:?}, not {refused:?}"
    );
}

#[test]
fn no_import_circles_between_files() {
    for src in [manifest_dir().join("src"), manifest_dir().join("core/src")] {
        let files = read_crate(&src);
        assert!(
            files.len() > 10,
            "read {} files of {}",
            files.len(),
            src.display()
        );
        let graph = file_graph(&files);
        let edges: usize = graph.values().map(BTreeSet::len).sum();
        println!(
            "{}: {} files, {edges} imports between them",
            src.display(),
            files.len()
        );
        let found = circles(&graph);
        assert!(
            found.is_empty(),
            "import circles in {}: {found:?}",
            src.display()
        );
    }
}

#[test]
fn every_module_uses_only_what_architecture_md_allows() {
    let table = allowed_table();
    let files = read_crate(&manifest_dir().join("src"));
    let mut modules: BTreeSet<String> = EXTERNAL_MODULES.iter().map(|m| m.to_string()).collect();
    modules.extend(files.iter().filter_map(|f| f.module.first().cloned()));
    let mut missing = Vec::new();
    let mut violations = Vec::new();
    for f in &files {
        let Some(me) = f.module.first() else { continue }; // lib.rs
        let Some(allowed) = table.get(me) else {
            missing.push(me.clone());
            continue;
        };
        for r in &f.references {
            let Some(used) = r.first() else { continue };
            if used == me || !modules.contains(used) || allowed.contains(used) {
                continue;
            }
            violations.push(format!("{} uses {}", f.rel, r.join("::")));
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "modules without a row in ARCHITECTURE.md's dependency table: {missing:?}"
    );
    violations.sort();
    violations.dedup();
    assert!(
        violations.is_empty(),
        "uses that ARCHITECTURE.md's dependency table does not allow (add them there if they \
         are right, and keep the table free of circles):\n{}",
        violations.join("\n")
    );
    // The table itself is layered: no module may reach itself through it.
    let graph: BTreeMap<String, BTreeSet<String>> = table
        .iter()
        .map(|(m, uses)| {
            let uses = uses
                .iter()
                .filter(|u| table.contains_key(*u))
                .cloned()
                .collect();
            (m.clone(), uses)
        })
        .collect();
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "ARCHITECTURE.md's table has circles: {found:?}"
    );
}

#[test]
fn the_checker_finds_what_it_must() {
    let code = strip_comments(
        "use crate::a::{b::C, d};\n// use crate::hidden;\npub use self::e::F;\nfn f() { super::g::h(); crate::i::J::k() }\n#[cfg(test)]\nmod tests { use crate::t; }",
    );
    let code = without_test_module(&code);
    let paths: Vec<Vec<String>> = paths_in(code).into_iter().map(|(p, _)| p).collect();
    let want = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    for expected in [
        "crate::a::b::C",
        "crate::a::d",
        "self::e::F",
        "super::g::h",
        "crate::i::J::k",
    ] {
        assert!(
            paths.contains(&want(expected)),
            "{expected} not in {paths:?}"
        );
    }
    assert!(
        !paths
            .iter()
            .any(|p| p.contains(&"hidden".to_string()) || p.contains(&"t".to_string()))
    );
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
        ("d".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(
        circles(&graph),
        vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]
    );
}
