use super::*;

#[test]
fn the_gdr_level_is_set_only_for_gpu_buffers_and_never_over_the_users() {
    assert_eq!(gdr_level_to_set(GdrLevel::Sys, true, None), Some("SYS"));
    assert_eq!(gdr_level_to_set(GdrLevel::Phb, true, None), Some("PHB"));
    assert_eq!(gdr_level_to_set(GdrLevel::Off, true, None), None);
    assert_eq!(gdr_level_to_set(GdrLevel::Sys, false, None), None, "host buffers need no GPUDirect");
    assert_eq!(gdr_level_to_set(GdrLevel::Sys, true, Some("PXB")), None, "the user's value stands");
    assert_eq!(gdr_level_to_set(GdrLevel::Sys, true, Some("")), None, "even an empty one");
}

#[test]
fn knob_words_parse() {
    assert_eq!("SYS".parse::<GdrLevel>(), Ok(GdrLevel::Sys));
    assert_eq!("PHB".parse::<GdrLevel>(), Ok(GdrLevel::Phb));
    assert_eq!("off".parse::<GdrLevel>(), Ok(GdrLevel::Off));
    assert!("PXB".parse::<GdrLevel>().is_err());
    assert!("sys".parse::<GdrLevel>().is_err(), "NCCL's spelling only");
}
