//! `docs/DESIGN.md` maps each guarantee to the tests that prove it. A citation that names a
//! test which was renamed or removed would leave a guarantee looking proven when nothing
//! checks it, so every cited test must exist.

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
