//! The user crate's structure, checked with the unit tests (`cargo xtask test`): its modules
//! import one another without a circle, and nothing outside the commands imports a command.
//!
//! Every `crate::`, `super::` and `self::` path of `profiler-user/src` (in `use` items and in
//! code; not in `#[cfg(test)]` items, nor inside macro invocations, which syn leaves as
//! tokens) is resolved to the module it names. Modules are compared by their first segments:
//! one (the layers: `cmd`, `session`, `sample`, `target`, `output`, ...) and two
//! (`session::target`, `target::memory`, `stats`); a module and the modules inside it may use
//! one another (a folder's `mod.rs` and its parts).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use syn::visit::Visit;

/// The commands: only they may import one another.
const COMMANDS: &str = "cmd";

type Module = Vec<String>;

/// Which module imports which, modules named by their first segments.
#[derive(Debug, Default)]
pub struct Graph {
    pub edges: BTreeMap<Module, BTreeSet<Module>>,
}

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file holds: `session/target.rs` → `session::target`, `target/mod.rs` →
/// `target`, `lib.rs` → the crate root (empty).
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Module = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// The paths a file names, each as its segments (`crate::stats::Counters` → crate, stats,
/// Counters), outside test items.
#[derive(Default)]
struct Paths {
    found: Vec<Module>,
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Module, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.found.push(prefix.iter().cloned().chain([n.ident.to_string()]).collect()),
            syn::UseTree::Rename(r) => self.found.push(prefix.iter().cloned().chain([r.ident.to_string()]).collect()),
            syn::UseTree::Glob(_) => self.found.push(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if is_cfg_test(attrs) {
            return;
        }
        if let syn::Item::Use(u) = item {
            self.use_tree(&mut Vec::new(), &u.tree);
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.found.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

/// The module `path` (as written in module `here`) names: the longest prefix that is one of
/// `modules`; `None` for paths outside the crate (std, dependencies, locals).
fn resolve(here: &Module, path: &Module, modules: &BTreeSet<Module>) -> Option<Module> {
    let (mut base, mut rest): (Module, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (here.clone(), &path[1..]),
        Some("super") => (here.clone(), &path[..]),
        _ => return None,
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    let full: Module = base.into_iter().chain(rest.iter().cloned()).collect();
    (1..=full.len()).rev().map(|n| full[..n].to_vec()).find(|m| modules.contains(m))
}

/// The import graph of the crate whose sources are in `src` (the binary's `main.rs` aside),
/// modules named by their first `depth` segments.
pub fn graph(src: &Path, depth: usize) -> Result<Graph, String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.retain(|f| f.strip_prefix(src).is_ok_and(|r| r != Path::new("main.rs")));
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(src, f)).collect();
    let mut g = Graph::default();
    for file in &files {
        let text = fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut paths = Paths::default();
        paths.visit_file(&ast);
        let here = module_of(src, file);
        let from: Module = here.iter().take(depth).cloned().collect();
        for path in &paths.found {
            let Some(to) = resolve(&here, path, &modules) else { continue };
            let to: Module = to.into_iter().take(depth).collect();
            let nested = from.starts_with(&to) || to.starts_with(&from);
            if !nested && !to.is_empty() && !from.is_empty() {
                g.edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    Ok(g)
}

impl Graph {
    /// The circles: groups of two or more modules that import one another (strongly
    /// connected components), each sorted.
    pub fn circles(&self) -> Vec<Vec<Module>> {
        // Tarjan's algorithm, iterative enough for a crate's few hundred modules.
        struct State<'a> {
            g: &'a Graph,
            index: BTreeMap<&'a Module, usize>,
            low: BTreeMap<&'a Module, usize>,
            stack: Vec<&'a Module>,
            on_stack: BTreeSet<&'a Module>,
            found: Vec<Vec<Module>>,
        }
        fn strong<'a>(s: &mut State<'a>, v: &'a Module) {
            let n = s.index.len();
            s.index.insert(v, n);
            s.low.insert(v, n);
            s.stack.push(v);
            s.on_stack.insert(v);
            for w in s.g.edges.get(v).into_iter().flatten() {
                if !s.index.contains_key(w) {
                    strong(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if s.low[v] == s.index[v] {
                let mut group = Vec::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack.remove(w);
                    group.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    s.found.push(group);
                }
            }
        }
        let mut s = State { g: self, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on_stack: BTreeSet::new(), found: Vec::new() };
        for v in self.edges.keys() {
            if !s.index.contains_key(v) {
                strong(&mut s, v);
            }
        }
        s.found
    }

    /// Imports of a command from outside the commands.
    pub fn imports_of_commands(&self) -> Vec<(Module, Module)> {
        let mut bad = Vec::new();
        for (from, tos) in &self.edges {
            for to in tos {
                if to.first().is_some_and(|m| m == COMMANDS) && from.first().is_none_or(|m| m != COMMANDS) {
                    bad.push((from.clone(), to.clone()));
                }
            }
        }
        bad
    }

    /// Each edge inside `group`, as "a -> b" lines.
    pub fn describe(&self, group: &[Module]) -> String {
        let mut lines = Vec::new();
        for a in group {
            for b in self.edges.get(a).into_iter().flatten().filter(|b| group.contains(b)) {
                lines.push(format!("    {} -> {}", a.join("::"), b.join("::")));
            }
        }
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user_src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiler-user/src")
    }

    /// No two modules of the user crate import one another, directly or through others: not
    /// two layers (`cmd`, `session`, `sample`, `target`, ...), nor two modules of a layer.
    #[test]
    fn the_user_crate_has_no_import_circles() {
        for depth in [1, 2] {
            let g = graph(&user_src(), depth).unwrap_or_else(|e| panic!("{e}"));
            assert!(g.edges.len() > 8, "the graph is too small to be the crate's: {:?}", g.edges.keys());
            let circles = g.circles();
            let text: Vec<String> = circles.iter().map(|c| g.describe(c)).collect();
            assert!(circles.is_empty(), "import circles (modules of {depth} segments):\n{}", text.join("\n\n"));
        }
    }

    /// Only commands import commands: the layers below never reach up.
    #[test]
    fn nothing_below_the_commands_imports_one() {
        let g = graph(&user_src(), 2).unwrap_or_else(|e| panic!("{e}"));
        let bad: Vec<String> = g.imports_of_commands().iter().map(|(a, b)| format!("{} -> {}", a.join("::"), b.join("::"))).collect();
        assert!(bad.is_empty(), "imports of a command from below:\n{}", bad.join("\n"));
    }

    /// The check sees a circle and resolves `super::` the way the compiler does.
    #[test]
    fn a_circle_is_found() {
        let modules: BTreeSet<Module> =
            [vec!["a".to_string()], vec!["a".into(), "x".into()], vec!["b".into()]].into_iter().collect();
        let here = vec!["a".to_string(), "x".to_string()];
        let p = |s: &str| s.split("::").map(String::from).collect::<Module>();
        assert_eq!(resolve(&here, &p("super::Thing"), &modules), Some(p("a")));
        assert_eq!(resolve(&here, &p("super::super::b::f"), &modules), Some(p("b")));
        assert_eq!(resolve(&here, &p("crate::b::f"), &modules), Some(p("b")));
        assert_eq!(resolve(&here, &p("std::fs"), &modules), None);
        let mut g = Graph::default();
        g.edges.entry(p("a")).or_default().insert(p("b"));
        g.edges.entry(p("b")).or_default().insert(p("a"));
        assert_eq!(g.circles(), vec![vec![p("a"), p("b")]]);
    }
}
