use super::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Words shaped like knobs that are not environment variables (kernel macro names, and the
/// device header's compile-time switches, which accord-device-bench's `--define` sets).
const NOT_VARIABLES: &[&str] = &[
    "ACCORD_OP_SUM",
    "ACCORD_OP_PROD",
    "ACCORD_OP_MIN",
    "ACCORD_OP_MAX",
    "ACCORD_OP_AVG",
    "ACCORD_DEVICE_PUT_INLINE",
    "ACCORD_DEVICE_TABLE_PLAIN_LOADS",
];

#[test]
fn names_are_unique_well_formed_and_documented() {
    let mut seen = BTreeSet::new();
    for k in KNOBS {
        assert!(seen.insert(k.name), "{} is registered twice", k.name);
        assert!(k.name.starts_with("ACCORD_"), "{}", k.name);
        assert!(k.name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == '*'));
        assert!(!k.doc.is_empty() && !k.default.is_empty(), "{} needs a doc line and a default", k.name);
        assert!(!k.doc.contains('|'), "{}: a doc line must not break the README's table", k.name);
    }
    for name in INTERNAL {
        assert!(find(name).is_none(), "{name} is both a knob and internal");
    }
}

#[test]
fn the_readme_table_is_the_registry() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let (begin, end) = ("<!-- knobs:begin (generated from crates/accord-knobs; do not edit) -->", "<!-- knobs:end -->");
    let start = readme.find(begin).expect("the README marks where the knob table begins") + begin.len();
    let stop = readme[start..].find(end).expect("the README marks where the knob table ends") + start;
    let expected = readme_table();
    if readme[start..stop].trim() != expected.trim() {
        panic!(
            "README.md's configuration table differs from the registry; replace the lines between the markers with:\n{expected}"
        );
    }
}

/// Every `"ACCORD_..."` string in the Rust and Python sources names a knob or an internal
/// variable (so a knob read somewhere is registered, and nothing is read under a name the
/// registry lacks).
#[test]
fn every_variable_the_code_names_is_registered() {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ["crates", "python", "tests"] {
        collect(&root.join(dir), &mut files);
    }
    let mut missing = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (i, _) in text.match_indices("\"ACCORD_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !is_known(&name) && !NOT_VARIABLES.contains(&name.as_str()) && !names_a_family(&name) {
                missing.insert(format!("{name} ({})", file.strip_prefix(&root).unwrap_or(&file).display()));
            }
        }
    }
    assert!(missing.is_empty(), "register these in crates/accord-knobs/src/table.rs: {missing:?}");
}

/// A family's prefix, with or without its last underscore (messages name the family).
fn names_a_family(name: &str) -> bool {
    KNOBS
        .iter()
        .filter_map(|k| k.name.strip_suffix('*'))
        .any(|prefix| prefix.trim_end_matches('_') == name.trim_end_matches('_'))
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            // This crate's own tests spell unknown names on purpose.
            let skip = name == "target" || name == "fuzz" || name == "accord-knobs";
            if !skip && !name.to_string_lossy().starts_with('.') {
                collect(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs" || e == "py") {
            out.push(path);
        }
    }
}

#[test]
fn unknown_variables_are_named_with_the_closest_knob() {
    let vars = [
        "ACCORD_SHM_RINGBYTES",
        "ACCORD_SHM",
        "PATH",
        "ACCORD_ALGO_ALL_REDUCE",
        "ACCORD_TEST_CHILD",
        "ACCORD_ZZZZZZZZZZZZZZZZZZZZ",
    ];
    let unknown = unknown_variables(vars);
    assert_eq!(
        unknown,
        vec![
            ("ACCORD_SHM_RINGBYTES".to_string(), Some("ACCORD_SHM_RING_BYTES")),
            ("ACCORD_ZZZZZZZZZZZZZZZZZZZZ".to_string(), None),
        ]
    );
    assert_eq!(closest("ACCORD_CC_"), Some("ACCORD_CC"));
    assert!(find("ACCORD_ALGO_").is_none(), "a family needs a member name");
}

#[test]
fn every_component_has_knobs_and_a_table() {
    let table = readme_table();
    for c in Component::ALL {
        assert!(of(c).next().is_some(), "{c:?} has no knobs");
        assert!(table.contains(c.title()));
    }
}
