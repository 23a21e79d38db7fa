use super::*;

#[test]
fn the_parser_reads_exactly_the_registered_knobs() {
    use accord_knobs::{check_reads, names_read_by, Component};
    let read = names_read_by(|lookup| {
        let _ = EngineConfig::default().with_overrides_from(|n| lookup(n));
    });
    check_reads(Component::Engine, &read).unwrap();
}
