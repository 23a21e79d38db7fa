//! Names of the configuration selectors: `FromStr` and `Display` of [`CcKind`],
//! [`SelectorKind`], [`PacerOrder`] and [`Integrity`].
//!
//! Why here: the engine, the command line and the Python bindings each take these choices by
//! name (`ACCORD_CC=eqds`, `--cc swift`); parsing them once into the protocol's own enums, with
//! an error that lists what is accepted, keeps a misspelt name from travelling as a string
//! until some later lookup quietly falls back to a default. `Display` writes the canonical
//! name, which parses back to the same value.

use crate::cc::{CcKind, UnknownCcError};
use crate::config::PacerOrder;
use crate::path::SelectorKind;
use crate::wire::Integrity;
use core::fmt;
use core::str::FromStr;

/// A selector name that is not one of the accepted ones.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown {what} {name:?}: use one of {valid}")]
pub struct UnknownNameError {
    /// What was being chosen (`path selector`, `pacer order`, `integrity`).
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// The accepted names, comma separated.
    pub valid: &'static str,
}

impl CcKind {
    /// The canonical name: `cubic`, `swift`, `eqds` or `fixed` (parameters are not named).
    pub const fn name(&self) -> &'static str {
        match self {
            CcKind::Cubic(_) => "cubic",
            CcKind::Swift(_) => "swift",
            CcKind::Eqds(_) => "eqds",
            CcKind::Fixed { .. } => "fixed",
        }
    }
}

impl FromStr for CcKind {
    type Err = UnknownCcError;
    /// As [`CcKind::from_name`]: default parameters of the named policy.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        CcKind::from_name(name)
    }
}

impl fmt::Display for CcKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl SelectorKind {
    /// Names [`SelectorKind::from_name`] accepts, as an error lists them.
    pub const NAMES: &'static str = "p2c, rr, recycle";

    /// The canonical name: `p2c`, `rr` or `recycle`.
    pub const fn name(self) -> &'static str {
        match self {
            SelectorKind::PowerOfTwoChoices => "p2c",
            SelectorKind::RoundRobin => "rr",
            SelectorKind::Recycle => "recycle",
        }
    }
}

impl FromStr for SelectorKind {
    type Err = UnknownNameError;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        SelectorKind::from_name(name).ok_or_else(|| UnknownNameError {
            what: "path selector",
            name: name.to_string(),
            valid: SelectorKind::NAMES,
        })
    }
}

impl fmt::Display for SelectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl PacerOrder {
    /// Names [`PacerOrder::from_name`] accepts, as an error lists them.
    pub const NAMES: &'static str = "rr, srpt";

    /// The canonical name: `rr` or `srpt`.
    pub const fn name(self) -> &'static str {
        match self {
            PacerOrder::RoundRobin => "rr",
            PacerOrder::ShortestRemaining => "srpt",
        }
    }
}

impl FromStr for PacerOrder {
    type Err = UnknownNameError;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        PacerOrder::from_name(name).ok_or_else(|| UnknownNameError {
            what: "pacer order",
            name: name.to_string(),
            valid: PacerOrder::NAMES,
        })
    }
}

impl fmt::Display for PacerOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Integrity {
    /// Names [`Integrity::from_name`] accepts, as an error lists them.
    pub const NAMES: &'static str = "full, header, off, mac";
}

impl FromStr for Integrity {
    type Err = UnknownNameError;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Integrity::from_name(name).ok_or_else(|| UnknownNameError {
            what: "integrity",
            name: name.to_string(),
            valid: Integrity::NAMES,
        })
    }
}

impl fmt::Display for Integrity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T>(values: &[T])
    where
        T: FromStr + fmt::Display + PartialEq + fmt::Debug,
        T::Err: fmt::Debug,
    {
        for v in values {
            let back: T = v.to_string().parse().expect("a displayed name parses");
            assert_eq!(&back, v, "{v} does not round-trip");
        }
    }

    #[test]
    fn every_selector_round_trips_through_its_name() {
        round_trips(&["cubic", "swift", "eqds", "fixed"].map(|n| CcKind::from_name(n).unwrap()));
        round_trips(&[SelectorKind::PowerOfTwoChoices, SelectorKind::RoundRobin, SelectorKind::Recycle]);
        round_trips(&[PacerOrder::RoundRobin, PacerOrder::ShortestRemaining]);
        round_trips(&[Integrity::Full, Integrity::Header, Integrity::Off, Integrity::Mac]);
    }

    #[test]
    fn aliases_and_case_still_parse() {
        assert_eq!("power-of-two".parse::<SelectorKind>(), Ok(SelectorKind::PowerOfTwoChoices));
        assert_eq!("reps".parse::<SelectorKind>(), Ok(SelectorKind::Recycle));
        assert_eq!(" SRPT ".parse::<PacerOrder>(), Ok(PacerOrder::ShortestRemaining));
        assert_eq!("fair".parse::<PacerOrder>(), Ok(PacerOrder::RoundRobin));
        assert_eq!("crc32c".parse::<Integrity>(), Ok(Integrity::Full));
        assert_eq!("EQDS".parse::<CcKind>().map(|c| c.name()), Ok("eqds"));
    }

    #[test]
    fn an_unknown_name_is_an_error_listing_the_valid_ones() {
        let e = "bbr".parse::<CcKind>().unwrap_err().to_string();
        assert!(e.contains("\"bbr\"") && e.contains("cubic, swift, eqds, fixed"), "{e}");
        let e = "ecmp".parse::<SelectorKind>().unwrap_err().to_string();
        assert!(e.contains("path selector \"ecmp\"") && e.contains("p2c, rr, recycle"), "{e}");
        let e = "fifo".parse::<PacerOrder>().unwrap_err().to_string();
        assert!(e.contains("pacer order \"fifo\"") && e.contains("rr, srpt"), "{e}");
        let e = "md5".parse::<Integrity>().unwrap_err().to_string();
        assert!(e.contains("integrity \"md5\"") && e.contains("full, header, off"), "{e}");
    }
}
