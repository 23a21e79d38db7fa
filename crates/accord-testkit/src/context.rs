//! The child's side: what the parent passed, and the two ways to talk to it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// The one variable that makes a test binary a child of a [`crate::Group`]: it carries the
/// whole [`Context`] (JSON), so no harness needs a variable of its own.
pub const CHILD_ENV: &str = "ACCORD_TEST_CHILD";

/// Marks a child's stdout line meant for the parent. libtest prints its own text on the same
/// stdout (with `--nocapture`, "test name ... " without a newline before the test's first
/// line), so the parent looks for the mark anywhere in a line and takes what follows it.
pub const MARK: &str = "@@";

/// What the parent passed to one child.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// This child's index in its group, `0..ranks`.
    pub rank: usize,
    /// How many children the group has.
    pub ranks: usize,
    /// What the parent asked the group to do (the test's own word; may be empty).
    pub role: String,
    /// A directory made for the group, removed when the group is dropped.
    pub dir: PathBuf,
    /// Further values the parent passed by name (ports, sizes, switches of the scenario).
    pub values: BTreeMap<String, String>,
}

impl Context {
    /// The context of this process, if it was started as a child: `Ok(None)` in an ordinary
    /// run, an error naming the variable when its value is not one the kit wrote.
    pub fn from_env() -> Result<Option<Context>, String> {
        match std::env::var(CHILD_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(format!("{CHILD_ENV}: {e}")),
            Ok(text) => Context::decode(&text).map(Some),
        }
    }

    /// The variable's value for this context.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a context of strings and numbers serialises")
    }

    /// Reads a value written by [`Context::encode`].
    pub fn decode(text: &str) -> Result<Context, String> {
        let context: Context = serde_json::from_str(text).map_err(|e| format!("{CHILD_ENV} is not a context: {e}"))?;
        if context.rank >= context.ranks {
            return Err(format!("{CHILD_ENV}: rank {} of {} ranks", context.rank, context.ranks));
        }
        Ok(context)
    }

    /// The value passed under `key`, if any.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The value passed under `key`, parsed; an error names the key and the value.
    pub fn parse<T: std::str::FromStr>(&self, key: &str) -> Result<T, String> {
        let text = self.value(key).ok_or_else(|| format!("the parent passed no {key:?}"))?;
        text.parse().map_err(|_| format!("{key:?} = {text:?} does not parse"))
    }
}

/// This process's [`Context`] when it runs as a child, `None` otherwise; a child test begins
/// `let Some(ctx) = accord_testkit::child() else { return };`. Panics (failing the child,
/// which its parent then names) when the variable holds something the kit did not write.
pub fn child() -> Option<Context> {
    Context::from_env().unwrap_or_else(|e| panic!("{e}"))
}

/// Sends one line to the parent (it arrives as [`crate::Event::Said`]): marked, on a line of
/// its own, flushed at once.
pub fn say(line: &str) {
    debug_assert!(!line.contains('\n'), "one line at a time: {line:?}");
    let mut out = std::io::stdout().lock();
    // A leading newline ends whatever libtest printed before the test's first line.
    let _ = writeln!(out, "\n{MARK}{line}");
    let _ = out.flush();
}

/// The parent's next line ([`crate::Group::send`]) without its newline; `None` once the
/// parent closed this child's stdin (or it is unreadable).
pub fn hear() -> Option<String> {
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end_matches(['\n', '\r']).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> Context {
        let values = [("port".to_string(), "29500".to_string())].into();
        Context { rank: 1, ranks: 2, role: "pull".into(), dir: "/tmp/x y".into(), values }
    }

    #[test]
    fn a_context_survives_its_encoding() {
        let c = context();
        assert_eq!(Context::decode(&c.encode()), Ok(c.clone()));
        assert_eq!(c.parse::<u16>("port"), Ok(29500));
        assert_eq!(c.value("nothing"), None);
    }

    #[test]
    fn bad_values_are_errors_that_say_what_is_wrong() {
        assert!(Context::decode("child").unwrap_err().contains(CHILD_ENV));
        let mut c = context();
        c.rank = 2;
        assert!(Context::decode(&c.encode()).unwrap_err().contains("rank 2 of 2"));
        let c = context();
        assert!(c.parse::<u8>("port").unwrap_err().contains("29500"));
        assert!(c.parse::<u8>("missing").unwrap_err().contains("missing"));
    }
}
