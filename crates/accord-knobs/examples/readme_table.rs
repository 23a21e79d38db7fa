//! Prints the README's configuration tables, made from the registry: paste the output between
//! the README's `knobs:begin` and `knobs:end` markers.
//!
//! `cargo run -q -p accord-knobs --example readme_table`
fn main() {
    print!("{}", accord_knobs::readme_table());
}
