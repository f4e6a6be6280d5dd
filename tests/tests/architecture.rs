//! The workspace's layering, read from its sources: no module depends on itself through
//! others (at the level of files, and of each crate's top-level modules), and the layer rules
//! that keep the storage layer below the operator's tools hold. A change that adds an import
//! against them fails here, with the path of modules that closes the loop.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module, as the path of names from its crate's root (`[]` is the root).
type Module = Vec<String>;

/// The published crates.
const LIBRARIES: &[&str] = &[
    "outbox-core",
    "outbox-macros",
    "outbox-diesel",
    "outbox-webhook",
    "outbox-relay",
    "outbox-admin",
    "outbox-cli",
];

/// The workspace's other crates with modules of their own: what the tests, benchmarks and
/// examples share or run.
const OTHERS: &[&str] = &[
    "testkit",
    "tests",
    "benches",
    "examples/blog",
    "examples/redis-destination",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// Every module file of a crate's `src`, by module path (binaries under `src/bin` left out:
/// each is a crate of its own).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, src: &Path, found: &mut BTreeMap<Module, PathBuf>) {
        for entry in fs::read_dir(dir).expect("a readable source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                if path.file_name() != Some("bin".as_ref()) || dir != src {
                    walk(&path, src, found);
                }
                continue;
            }
            if path.extension() != Some("rs".as_ref()) {
                continue;
            }
            let relative = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut module: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            if module == ["lib"] || module == ["main"] {
                module.clear();
            }
            found.insert(module, path);
        }
    }
    let mut found = BTreeMap::new();
    walk(src, src, &mut found);
    found
}

/// The code of a module file: comments and its unit tests left out (tests may reach anywhere).
fn code(text: &str) -> String {
    // Only a unit-test module written inline: `mod tests;` declares a file checked on its own.
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(tests) => &text[..tests],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string (a URL) is rare in paths that matter; cut at it anyway.
            Some(comment) => &line[..comment],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a `use` tree names, expanded: `a::{b, c::{d}}` → `a::b`, `a::c::d`.
fn expand_use(tree: &str, prefix: &str, paths: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find("::{") {
        if tree.ends_with('}') {
            let head = format!("{prefix}{}::", &tree[..open]);
            let inner = &tree[open + 3..tree.len() - 1];
            let (mut depth, mut start) = (0, 0);
            for (i, ch) in inner.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand_use(&inner[start..i], &head, paths);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand_use(&inner[start..], &head, paths);
            return;
        }
    }
    if tree.is_empty() {
        return;
    }
    let path = tree.split(" as ").next().unwrap_or(tree).trim();
    paths.push(format!("{prefix}{path}"));
}

/// A path a module names, and whether it is a re-export (`pub use`).
struct Named {
    path: String,
    reexport: bool,
}

fn named_paths(code: &str) -> Vec<Named> {
    let mut named = Vec::new();
    // `use` declarations, with their visibility.
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let visibility = rest[..at].split_whitespace().next_back().unwrap_or("");
        let reexport = visibility == "pub" || visibility.starts_with("pub(");
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        let tree = after[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace(" ::", "::")
            .replace(":: ", "::")
            .replace("{ ", "{")
            .replace(" }", "}")
            .replace(" ,", ",")
            .replace(", ", ",");
        let mut paths = Vec::new();
        expand_use(&tree, "", &mut paths);
        named.extend(paths.into_iter().map(|path| Named { path, reexport }));
        rest = &after[end..];
    }
    // Paths written in the code: `crate::a::b`, `super::c`.
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(start) {
            let at = from + found;
            let preceded = code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            if !preceded {
                named.push(Named {
                    path: path.trim_end_matches(':').to_owned(),
                    reexport: false,
                });
            }
            from = at + path.len().max(1);
        }
    }
    named
}

/// Where `word` starts as a whole word in `text`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(word) {
        let at = from + found;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let boundary = |c: Option<char>| !c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if boundary(before) && after.is_some_and(char::is_whitespace) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The module a path names from `module`: the deepest module file along it.
fn target(module: &Module, path: &str, modules: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut base: Module = match segments.peek().copied() {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        Some("super") | Some("self") => {
            let mut base = module.clone();
            while let Some(&step) = segments.peek() {
                match step {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                segments.next();
            }
            base
        }
        Some(first) => {
            // A child module named from its parent (`pace::Pacer` in `destination`).
            let mut child = module.clone();
            child.push(first.to_owned());
            if !modules.contains_key(&child) {
                return None;
            }
            module.clone()
        }
        None => return None,
    };
    for segment in segments {
        let mut deeper = base.clone();
        deeper.push(segment.to_owned());
        if modules.contains_key(&deeper) {
            base = deeper;
        } else {
            break;
        }
    }
    Some(base)
}

/// Which module depends on which, within one crate. A module's `pub use` of its own
/// descendants publishes them (a facade) and is not a dependency of its code.
fn dependencies(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules = modules(src);
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, file) in &modules {
        let code = code(&fs::read_to_string(file).expect("a readable module"));
        // A child named in code without a `use` (`pace::Pacer::new()` in `destination`).
        for child in modules.keys() {
            let is_child = child.len() == module.len() + 1 && child.starts_with(module);
            let Some(name) = child.last().filter(|_| is_child) else {
                continue;
            };
            let written = code.match_indices(&format!("{name}::")).any(|(at, _)| {
                !code[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                    && !code[..at].trim_end().ends_with("use")
            });
            if written {
                edges
                    .entry(module.clone())
                    .or_default()
                    .insert(child.clone());
            }
        }
        for named in named_paths(&code) {
            let Some(target) = target(module, &named.path, &modules) else {
                continue;
            };
            let descendant = target.len() > module.len() && target.starts_with(module);
            if target == *module || target.is_empty() || named.reexport && descendant {
                continue;
            }
            edges.entry(module.clone()).or_default().insert(target);
        }
    }
    edges
}

/// The same dependencies between top-level modules (`worker::acker` counts as `worker`).
fn top_level(edges: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut top: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, tos) in edges {
        for to in tos {
            let (a, b) = (from[..1.min(from.len())].to_vec(), to[..1].to_vec());
            if !a.is_empty() && a != b {
                top.entry(a).or_default().insert(b);
            }
        }
    }
    top
}

/// A loop of dependencies, if there is one: the modules along it.
fn a_cycle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<Module, Mark>,
        path: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|m| m == node).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(node.clone());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        path.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut marks, &mut Vec::new()))
}

fn shown(cycle: &[Module]) -> String {
    cycle
        .iter()
        .map(|m| m.join("::"))
        .collect::<Vec<_>>()
        .join(" → ")
}

#[test]
fn no_module_depends_on_itself_through_others() {
    let root = workspace();
    let mut loops = Vec::new();
    for krate in LIBRARIES.iter().chain(OTHERS) {
        let src = root.join(krate).join("src");
        assert!(
            src.is_dir(),
            "{krate}/src is missing: update LIBRARIES or OTHERS"
        );
        let edges = dependencies(&src);
        if let Some(cycle) = a_cycle(&edges) {
            loops.push(format!("{krate}: {}", shown(&cycle)));
        }
        if let Some(cycle) = a_cycle(&top_level(&edges)) {
            loops.push(format!("{krate} (top-level modules): {}", shown(&cycle)));
        }
    }
    assert!(
        loops.is_empty(),
        "modules that import each other in a loop:\n{}",
        loops.join("\n")
    );
}

/// The detector itself finds a loop where there is one, through a `use` tree, a written
/// path and a parent's code, and not through a facade's re-export.
#[test]
fn the_detector_finds_a_loop_and_lets_a_facade_be() {
    let src = std::env::temp_dir().join(format!("outbox-architecture-{}", std::process::id()));
    let write = |file: &str, text: &str| {
        let path = src.join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod a;\nmod b;\nmod c;\n");
    write("a.rs", "use crate::{b::{Thing as T}, c};\n");
    write("b.rs", "fn f() { crate::c::d::g(); }\n");
    write("c/mod.rs", "mod d;\npub use d::D;\n");
    write("c/d.rs", "use super::super::a::X;\n// crate::b::nothing\n");
    let edges = dependencies(&src);
    let module = |path: &str| -> Module { path.split("::").map(str::to_owned).collect() };
    assert_eq!(
        edges[&module("a")],
        BTreeSet::from([module("b"), module("c")])
    );
    assert_eq!(edges[&module("b")], BTreeSet::from([module("c::d")]));
    assert_eq!(edges[&module("c::d")], BTreeSet::from([module("a")]));
    assert!(
        !edges.contains_key(&module("c")),
        "a facade's re-export is no dependency"
    );
    let cycle = a_cycle(&edges).expect("a → b → c::d → a");
    assert_eq!(shown(&cycle), "a → b → c::d → a");
    write("c/d.rs", "pub struct D;\n");
    assert!(a_cycle(&dependencies(&src)).is_none());
    write("c/mod.rs", "mod d;\nfn h() { d::D; }\n");
    write("c/d.rs", "use super::h;\n");
    assert!(
        a_cycle(&dependencies(&src)).is_some(),
        "a parent whose code uses a child that uses it is a loop"
    );
    fs::remove_dir_all(&src).unwrap();
}

/// What each module of a crate imports from the crate's other top-level modules.
fn imports_of(krate: &str, module: &str) -> BTreeSet<String> {
    let edges = top_level(&dependencies(&workspace().join(krate).join("src")));
    edges
        .get(&vec![module.to_owned()])
        .into_iter()
        .flatten()
        .map(|m| m.join("::"))
        .collect()
}

#[test]
fn the_storage_layers_import_nothing_above_them() {
    // The SQL layer reads and writes rows; it knows the crate's errors, nothing of its API.
    let sql = imports_of("outbox-diesel", "sql");
    assert_eq!(
        sql,
        BTreeSet::from(["error".to_owned()]),
        "outbox-diesel's sql imports"
    );
    // The operator's module stands on the store; nothing of the library stands on it.
    let root = workspace().join("outbox-diesel").join("src");
    for (module, tos) in top_level(&dependencies(&root)) {
        assert!(
            !tos.contains(&vec!["admin".to_owned()]),
            "outbox-diesel's {} imports the operator's admin module",
            module.join("::")
        );
    }
    // What a storage backend implements speaks of messages and their vocabulary only: no
    // destinations, workers or handlers.
    let store = imports_of("outbox-core", "store");
    let vocabulary: BTreeSet<String> = [
        "answer",
        "error",
        "headers",
        "message_id",
        "priority",
        "subscription",
    ]
    .map(str::to_owned)
    .into();
    assert!(
        store.is_subset(&vocabulary),
        "outbox-core's store imports {:?}",
        store.difference(&vocabulary).collect::<Vec<_>>()
    );
}

/// Every module of the published crates says what it is for.
#[test]
fn every_library_module_has_a_module_doc() {
    let mut undocumented = Vec::new();
    for krate in LIBRARIES {
        for file in modules(&workspace().join(krate).join("src")).values() {
            let text = fs::read_to_string(file).expect("a readable module");
            if !text.trim_start().starts_with("//!") {
                undocumented.push(file.display().to_string());
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "modules without a `//!` doc: {undocumented:?}"
    );
}
