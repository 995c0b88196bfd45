//! `docs/DESIGN.md` maps each guarantee to the tests that prove it. A citation that names a
//! test which was renamed or removed would leave a guarantee looking proven when nothing
//! checks it, so every cited test must exist. Its map of the layers is checked against the
//! code's imports the same way.

use std::path::Path;

/// The `a::b::c` paths written in backticks in `text`.
fn cited_paths(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.contains("::")
                && s.split("::").all(|part| {
                    !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
        })
        .collect()
}

/// Whether `source` defines a function `name` (`fn name(` or `fn name<`).
fn defines_fn(source: &str, name: &str) -> bool {
    source.contains(&format!("fn {name}(")) || source.contains(&format!("fn {name}<"))
}

/// The source of module `path` of the crate (`["store", "keys"]`): `src/store/keys.rs` or
/// `src/store/keys/mod.rs`.
fn module_source(root: &Path, path: &[&str]) -> Option<String> {
    let base = root.join("src").join(path.join("/"));
    std::fs::read_to_string(base.with_extension("rs"))
        .or_else(|_| std::fs::read_to_string(base.join("mod.rs")))
        .ok()
}

/// Every test `docs/DESIGN.md` cites exists: `file::test` for the integration tests of
/// `tests/api/file.rs`, and `module::path::tests::test` (or `...::tests`, the module) for a
/// unit test in `src/`. Citations of other code (`store::BellPools`) are not tests and are
/// left out.
#[test]
fn every_test_the_design_cites_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).expect("docs/DESIGN.md");
    let (mut checked, mut missing) = (0, Vec::new());
    for cite in cited_paths(&design) {
        let parts: Vec<&str> = cite.split("::").collect();
        let integration = root.join(format!("tests/api/{}.rs", parts[0]));
        if parts.len() == 2 && integration.exists() {
            checked += 1;
            let source = std::fs::read_to_string(&integration).unwrap();
            if !defines_fn(&source, parts[1]) {
                missing.push(cite);
            }
        } else if let Some(at) = parts.iter().position(|p| *p == "tests") {
            checked += 1;
            let module: Vec<&str> = parts[..at]
                .iter()
                .copied()
                .filter(|p| *p != "crate")
                .collect();
            let found =
                module_source(root, &module).is_some_and(|source| match parts.get(at + 1) {
                    Some(name) => defines_fn(&source, name),
                    None => source.contains("mod tests"),
                });
            if !found {
                missing.push(cite);
            }
        }
    }
    assert!(
        checked >= 50,
        "only {checked} citations of tests found: is the parser broken?"
    );
    assert!(
        missing.is_empty(),
        "docs/DESIGN.md cites tests that do not exist: {missing:?}"
    );
}

/// The top-level modules of `src/` each module imports: `crate::x` in its files, outside
/// comments and `#[cfg(test)]` modules (which may reach anything). `main.rs` and `lib.rs`
/// are left out: they only dispatch and declare.
fn imports(root: &Path) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = root.join("src");
    let mut modules = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "main" || name == "lib" {
            continue;
        }
        let mut list = Vec::new();
        if path.is_dir() {
            files(&path, &mut list);
        } else if path.extension().is_some_and(|e| e == "rs") {
            list.push(path);
        } else {
            continue;
        }
        modules.insert(name, list);
    }
    let names: std::collections::BTreeSet<String> = modules.keys().cloned().collect();
    let mut edges = std::collections::BTreeMap::new();
    for (module, list) in &modules {
        let mut used = std::collections::BTreeSet::new();
        for file in list {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for line in code.lines() {
                let line = line.split("//").next().unwrap();
                for (at, _) in line.match_indices("crate::") {
                    let rest = &line[at + "crate::".len()..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if name != *module && names.contains(&name) {
                        used.insert(name);
                    }
                }
            }
        }
        edges.insert(module.clone(), used);
    }
    edges
}

/// The layer map of `docs/DESIGN.md` (its "Layers" section: one line per module, `a ──► b c`)
/// lists exactly the imports the code has, and they form no cycle. The drawing it replaced
/// had lost edges as the code grew; this keeps the map and the code in step.
#[test]
fn the_layer_map_lists_every_import_and_has_no_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).expect("docs/DESIGN.md");
    let layers = design
        .split("\n## Layers\n")
        .nth(1)
        .expect("a Layers section")
        .split("```")
        .nth(1)
        .expect("a code block in Layers");
    let mut drawn = std::collections::BTreeMap::new();
    for line in layers.lines().filter(|l| l.contains("──►")) {
        let (from, to) = line.split_once("──►").unwrap();
        let to: std::collections::BTreeSet<String> =
            to.split_whitespace().map(str::to_owned).collect();
        assert!(
            drawn.insert(from.trim().to_owned(), to).is_none(),
            "{} drawn twice",
            from.trim()
        );
    }
    let real = imports(root);
    assert!(
        real.len() >= 15,
        "only {} modules found in src/",
        real.len()
    );
    let mut wrong = Vec::new();
    for (module, uses) in &real {
        let shown = drawn.get(module).cloned().unwrap_or_default();
        if &shown != uses {
            wrong.push(format!(
                "{module}: the code imports {uses:?}, the map shows {shown:?}"
            ));
        }
    }
    for module in drawn.keys().filter(|m| !real.contains_key(*m)) {
        wrong.push(format!("{module} is drawn but is no module of src/"));
    }
    assert!(
        wrong.is_empty(),
        "docs/DESIGN.md, Layers:\n{}",
        wrong.join("\n")
    );
    // No cycle: repeatedly remove the modules that import nothing left.
    let mut left = real.clone();
    while !left.is_empty() {
        let leaves: Vec<String> = left
            .iter()
            .filter(|(_, uses)| uses.iter().all(|u| !left.contains_key(u)))
            .map(|(m, _)| m.clone())
            .collect();
        assert!(
            !leaves.is_empty(),
            "an import cycle among {:?}",
            left.keys()
        );
        for m in leaves {
            left.remove(&m);
        }
    }
}

/// The Markdown files of the repository (not build output, dependencies or dev data).
fn markdown_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if ![".git", "target", "node_modules", ".sluice-dev"].contains(&name.as_ref()) {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// A document's lines outside fenced code blocks (inside, they are blank), with inline code
/// removed: links and headings there are examples, not structure.
fn prose_lines(text: &str) -> Vec<String> {
    let mut fence: Option<String> = None;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let marker: String = trimmed
                .chars()
                .take_while(|c| *c == '`' || *c == '~')
                .collect();
            let is_fence = marker.len() >= 3;
            match &fence {
                Some(open) => {
                    if is_fence && marker.starts_with(&open[..1]) && marker.len() >= open.len() {
                        fence = None;
                    }
                    String::new()
                }
                None if is_fence => {
                    fence = Some(marker);
                    String::new()
                }
                None => {
                    // Paired backticks only: an unpaired one (a code span that goes on to the
                    // next line) hides nothing after it.
                    let parts: Vec<&str> = line.split('`').collect();
                    let unpaired = parts.len().is_multiple_of(2);
                    parts
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| i % 2 == 0 || (unpaired && *i == parts.len() - 1))
                        .map(|(_, p)| *p)
                        .collect::<Vec<_>>()
                        .join("")
                }
            }
        })
        .collect()
}

/// GitHub's anchor for a heading: lowercased, only letters, digits, `-`, `_` and spaces kept,
/// spaces made `-`.
fn slug(heading: &str) -> String {
    let mut text = heading.trim().to_owned();
    // A link in a heading anchors by its text.
    while let (Some(open), Some(mid)) = (text.find('['), text.find("](")) {
        let Some(close) = text[mid..].find(')').map(|c| mid + c) else {
            break;
        };
        if open > mid {
            break;
        }
        text = format!(
            "{}{}{}",
            &text[..open],
            &text[open + 1..mid],
            &text[close + 1..]
        );
    }
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (a repeated one gets `-1`, `-2`, ...).
fn anchors(text: &str) -> std::collections::BTreeSet<String> {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let mut out = std::collections::BTreeSet::new();
    for line in text.lines() {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let s = slug(line[hashes..].trim_end_matches('#'));
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links and images of a line: `[text](target)`.
fn link_targets(line: &str) -> Vec<&str> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            let end = rest.find(')')?;
            let target = rest[..end].trim().trim_start_matches('<');
            let target = target.split_whitespace().next()?.trim_end_matches('>');
            (!target.is_empty()).then_some(target)
        })
        .collect()
}

/// The README is a front door, not the reference: at most 10 KB, with the reference in
/// focused documents. And every relative link of every Markdown file resolves — the file
/// exists, and an `#anchor` names one of its headings — so moving a section never leaves a
/// reader at a dead end.
#[test]
fn the_readme_is_short_and_every_link_of_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::metadata(root.join("README.md"))
        .expect("README.md")
        .len();
    assert!(
        readme <= 10_000,
        "README.md is {readme} bytes; at most 10,000"
    );
    let mut files = Vec::new();
    markdown_files(root, &mut files);
    assert!(
        files.len() >= 8,
        "only {} Markdown files found",
        files.len()
    );
    let (mut checked, mut broken) = (0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file.strip_prefix(root).unwrap().display().to_string();
        for (no, line) in prose_lines(&text).iter().enumerate() {
            for target in link_targets(line) {
                let scheme = target.split_once(':').is_some_and(|(s, _)| {
                    s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
                });
                if scheme || target.starts_with("//") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                let to = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap().join(path)
                };
                if !to.exists() {
                    broken.push(format!("{shown}:{}: {target}: no such file", no + 1));
                    continue;
                }
                if anchor.is_empty() {
                    continue;
                }
                let found = to.extension().is_some_and(|e| e == "md")
                    && anchors(&prose_lines(&std::fs::read_to_string(&to).unwrap()).join("\n"))
                        .contains(anchor);
                if !found {
                    broken.push(format!("{shown}:{}: {target}: no such heading", no + 1));
                }
            }
        }
    }
    assert!(
        checked >= 50,
        "only {checked} links checked: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
