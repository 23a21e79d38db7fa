//! `accord-knobs`: every `ACCORD_*` environment variable of the workspace, in one table.
//!
//! Why one table: the knobs used to live in seven registries parsed in three idioms, and a
//! variable nobody reads (a typo, a knob renamed) was silently ignored. Here each knob has its
//! name, the component that reads it, its type and unit, its default and a doc line; the
//! README's configuration table is generated from this table ([`readme_table`], checked by a
//! test), each component's tests check that its parser reads exactly its registered knobs,
//! and [`warn_unknown_once`] names an unknown `ACCORD_*` variable with the closest known knob.
//!
//! Each component's `config.rs` reads its knobs with the typed accessors of [`parse`]
//! ([`get`], [`choice`], [`is_set`]): the table says how a knob's value is written (its
//! [`Kind`]), one parser per kind reads it, and a bad value is a [`KnobError`] naming the knob,
//! the value and what is accepted. The component keeps what only it knows: the field a knob
//! sets and the range it allows. This crate depends on nothing of ours, so every crate can name
//! it.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod parse;
mod table;

pub use parse::{
    choice, env, env_is_set, env_path, get, is_set, parse_bool, parse_bytes, parse_duration, parse_duration_ms,
    KnobError, KnobValue,
};
pub use table::{INTERNAL, KNOBS};

/// Who reads a knob.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// The TransferEngine (`accord-engine/src/config.rs`).
    Engine,
    /// The shared-memory datapath (`accord-net/src/shm/config.rs`).
    SharedMemory,
    /// The UDP datapath (`accord-net/src/udp/config.rs`).
    Udp,
    /// The host collectives and their bootstrap (`accord-coll/src/config.rs`).
    Collectives,
    /// The GPU collectives on one host (`accord-coll/src/gpu/config.rs`).
    GpuCollectives,
    /// The NCCL net plugin (`accord-nccl-net/src/config.rs`).
    Plugin,
    /// The NCCL tuner (`accord-nccl-net/src/tuner/mod.rs`).
    Tuner,
    /// CUDA loading (`accord-cuda`).
    Cuda,
    /// The Python package's own choices (`python/accord`), read in Python.
    Python,
    /// Diagnostics and tools: debug output, benches, test seeds.
    Tools,
}

impl Component {
    /// Every component, in the README's order.
    pub const ALL: [Component; 10] = [
        Component::Engine,
        Component::SharedMemory,
        Component::Udp,
        Component::Collectives,
        Component::GpuCollectives,
        Component::Plugin,
        Component::Tuner,
        Component::Cuda,
        Component::Python,
        Component::Tools,
    ];

    /// The README's heading for the component's knobs.
    pub fn title(self) -> &'static str {
        match self {
            Component::Engine => "Engine (`crates/accord-engine/src/config.rs`)",
            Component::SharedMemory => "Shared-memory datapath (`crates/accord-net/src/shm/config.rs`)",
            Component::Udp => "UDP datapath (`crates/accord-net/src/udp/config.rs`)",
            Component::Collectives => "Collectives (`crates/accord-coll/src/config.rs`)",
            Component::GpuCollectives => "GPU collectives (`crates/accord-coll/src/gpu/config.rs`)",
            Component::Plugin => "NCCL plugin (`crates/accord-nccl-net/src/config.rs`)",
            Component::Tuner => "NCCL tuner (`crates/accord-nccl-net/src/tuner/mod.rs`)",
            Component::Cuda => "CUDA (`crates/accord-cuda`)",
            Component::Python => "Python package (`python/accord`)",
            Component::Tools => "Diagnostics, benches and tests",
        }
    }
}

/// What a knob's value is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `0` or `1`.
    Switch,
    /// A whole number with no unit.
    Count,
    /// Bytes.
    Bytes,
    /// Milliseconds.
    Millis,
    /// Microseconds.
    Micros,
    /// Gigabits per second.
    Gbps,
    /// Megabits per second.
    Mbps,
    /// A probability in [0, 1].
    Probability,
    /// One of the listed words.
    Choice(&'static [&'static str]),
    /// A comma-separated list.
    List,
    /// A path.
    Path,
    /// Free text (an address, a name).
    Text,
}

impl Kind {
    /// How the README writes the type.
    pub fn describe(self) -> String {
        match self {
            Kind::Switch => "0 or 1".into(),
            Kind::Count => "count".into(),
            Kind::Bytes => "bytes".into(),
            Kind::Millis => "ms".into(),
            Kind::Micros => "µs".into(),
            Kind::Gbps => "Gbit/s".into(),
            Kind::Mbps => "Mbit/s".into(),
            Kind::Probability => "0..1".into(),
            Kind::Choice(words) => words.join(" \\| "),
            Kind::List => "list".into(),
            Kind::Path => "path".into(),
            Kind::Text => "text".into(),
        }
    }
}

/// One `ACCORD_*` environment variable.
#[derive(Copy, Clone, Debug)]
pub struct Knob {
    /// The variable; a name ending in `_*` is a family (`ACCORD_ALGO_*`: one per collective).
    pub name: &'static str,
    /// Who reads it.
    pub component: Component,
    /// Its type and unit.
    pub kind: Kind,
    /// Its default, as a person would write it (`-`: unset means off or derived, see `doc`).
    pub default: &'static str,
    /// What it does, in one line.
    pub doc: &'static str,
}

impl Knob {
    /// Whether `variable` is this knob (or a member of its family).
    pub fn names(&self, variable: &str) -> bool {
        match self.name.strip_suffix('*') {
            Some(prefix) => variable.starts_with(prefix) && variable.len() > prefix.len(),
            None => self.name == variable,
        }
    }
}

/// The knob `variable` names, if any.
pub fn find(variable: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.names(variable))
}

/// Whether `variable` is a knob or one of the [`INTERNAL`] variables our launchers set.
pub fn is_known(variable: &str) -> bool {
    find(variable).is_some() || INTERNAL.contains(&variable)
}

/// The knobs `component` reads.
pub fn of(component: Component) -> impl Iterator<Item = &'static Knob> {
    KNOBS.iter().filter(move |k| k.component == component)
}

/// The registered knob whose name is closest to `variable` (edit distance), for "did you mean".
pub fn closest(variable: &str) -> Option<&'static str> {
    KNOBS
        .iter()
        .map(|k| (edit_distance(variable, k.name.trim_end_matches('*')), k.name))
        .min_by_key(|(d, _)| *d)
        .filter(|(d, _)| *d <= variable.len() / 2)
        .map(|(_, name)| name)
}

/// The `ACCORD_*` variables among `vars` that no knob names, each with the closest known knob.
pub fn unknown_variables<I, K>(vars: I) -> Vec<(String, Option<&'static str>)>
where
    I: IntoIterator<Item = K>,
    K: AsRef<str>,
{
    let mut unknown: Vec<(String, Option<&'static str>)> = vars
        .into_iter()
        .filter(|v| v.as_ref().starts_with("ACCORD_") && !is_known(v.as_ref()))
        .map(|v| (v.as_ref().to_string(), closest(v.as_ref())))
        .collect();
    unknown.sort();
    unknown.dedup();
    unknown
}

/// Warns, once per process, about every `ACCORD_*` variable in the environment that no knob
/// names (a typo or a renamed knob would otherwise be ignored without a word). Engines and the
/// CLI call it when they start; later calls do nothing.
pub fn warn_unknown_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
        for (variable, near) in unknown_variables(names) {
            match near {
                Some(near) => {
                    tracing::warn!("{variable} is not an Accord setting and is ignored; did you mean {near}?")
                }
                None => tracing::warn!("{variable} is not an Accord setting and is ignored"),
            }
        }
    });
}

/// The README's configuration tables, one per component, made from [`KNOBS`].
pub fn readme_table() -> String {
    let mut out = String::new();
    for component in Component::ALL {
        let knobs: Vec<&Knob> = of(component).collect();
        if knobs.is_empty() {
            continue;
        }
        out.push_str(&format!("\n**{}**\n\n", component.title()));
        out.push_str("| variable | type | default | what it does |\n|---|---|---|---|\n");
        for k in knobs {
            out.push_str(&format!("| `{}` | {} | {} | {} |\n", k.name, k.kind.describe(), k.default, k.doc));
        }
    }
    out
}

/// The `ACCORD_*` names a parser asks for: runs `parse` with a lookup that records every name
/// it is asked and finds nothing (so defaults apply and nothing fails).
pub fn names_read_by(parse: impl FnOnce(&dyn Fn(&str) -> Option<String>)) -> std::collections::BTreeSet<String> {
    let asked = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let lookup = |name: &str| {
        asked.borrow_mut().insert(name.to_string());
        None
    };
    parse(&lookup);
    asked.into_inner().into_iter().filter(|n| n.starts_with("ACCORD_")).collect()
}

/// Checks a component's parser against the registry: it must read every knob registered for
/// `component` (one member of a family will do), and nothing the registry lacks (it may read
/// another component's knobs on that component's behalf). The error names what differs.
pub fn check_reads(component: Component, read: &std::collections::BTreeSet<String>) -> Result<(), String> {
    let unread: Vec<&str> = of(component).filter(|k| !read.iter().any(|n| k.names(n))).map(|k| k.name).collect();
    let unregistered: Vec<&String> = read.iter().filter(|n| find(n).is_none()).collect();
    if unread.is_empty() && unregistered.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{component:?}: registered but never read: {unread:?}; read but not registered in \
             crates/accord-knobs/src/table.rs: {unregistered:?}"
        ))
    }
}

/// Checks that a component's parser accepts every word the table lists for each of its
/// selectors (so the README's accepted values and the enum's `FromStr` agree): runs `parse`
/// once per word with only that knob set. The error names each word refused and why.
pub fn check_choices<E: std::fmt::Display>(
    component: Component,
    parse: impl Fn(&dyn Fn(&str) -> Option<String>) -> Result<(), E>,
) -> Result<(), String> {
    let mut refused = Vec::new();
    for knob in of(component) {
        let Kind::Choice(words) = knob.kind else { continue };
        for word in words {
            let lookup = |n: &str| (n == knob.name).then(|| word.to_string());
            if let Err(e) = parse(&lookup) {
                refused.push(format!("{}={word}: {e}", knob.name));
            }
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!("{component:?}: the table lists values the parser refuses: {refused:?}"))
    }
}

/// Levenshtein distance, for [`closest`].
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
