use super::*;

/// A fresh private directory and the path of a file `name` in it (not created).
fn dir_and_path(name: &str) -> (TestDir, PathBuf) {
    let d = TestDir::new();
    let path = d.0.join(name);
    (d, path)
}

#[test]
fn words_written_through_one_mapping_are_seen_through_another() {
    let (_d, path) = dir_and_path("board");
    let a = SharedMapping::create(&path, 4096).unwrap();
    let b = SharedMapping::open(&path, 4096).unwrap();
    assert_eq!(a.words().len(), 512);
    assert!(a.words().iter().all(|w| w.load(Ordering::Relaxed) == 0), "a new file is zeroed");
    a.words()[511].store(0xfeed, Ordering::Release);
    assert_eq!(b.words()[511].load(Ordering::Acquire), 0xfeed);
    b.words()[0].fetch_add(3, Ordering::AcqRel);
    assert_eq!(a.words()[0].load(Ordering::Acquire), 3);
    assert_eq!(a.words().as_ptr() as usize % 8, 0, "words are aligned");
}

#[test]
fn create_is_exclusive_and_open_checks_the_length_and_the_kind_of_file() {
    let (d, path) = dir_and_path("seg");
    let _a = SharedMapping::create(&path, 800).unwrap();
    let err = SharedMapping::create(&path, 800).unwrap_err();
    assert!(matches!(err.reason, SharedMapFailure::Io { op: "create", .. }), "{err}");
    let err = SharedMapping::open(&path, 808).unwrap_err();
    assert!(matches!(err.reason, SharedMapFailure::WrongLength { actual: 800, expected: 808 }), "{err}");
    assert!(err.to_string().contains("seg"), "the message names the path: {err}");
    let err = SharedMapping::open(&d.0.join("missing"), 800).unwrap_err();
    assert!(matches!(err.reason, SharedMapFailure::Io { op: "open", .. }), "{err}");
    let link = d.0.join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert!(SharedMapping::open(&link, 800).is_err(), "links are not followed");
    assert!(matches!(SharedMapping::open(&d.0, 800).unwrap_err().reason, SharedMapFailure::Io { .. }));
    assert!(matches!(SharedMapping::create(&d.0.join("e"), 0).unwrap_err().reason, SharedMapFailure::Empty));
    assert!(!d.0.join("e").exists(), "nothing is created for a refused length");
}

#[test]
fn unlink_keeps_the_mappings_and_the_creator_cleans_up_after_a_failed_start() {
    let (_d, path) = dir_and_path("seg");
    let a = SharedMapping::create(&path, 64).unwrap();
    let b = SharedMapping::open(&path, 64).unwrap();
    b.unlink().unwrap();
    assert!(!path.exists());
    a.unlink().unwrap(); // already gone: still fine
    a.words()[1].store(9, Ordering::Release);
    assert_eq!(b.words()[1].load(Ordering::Acquire), 9, "the mappings outlive the name");
    drop((a, b));

    let failed_start = SharedMapping::create(&path, 64).unwrap();
    drop(failed_start);
    assert!(!path.exists(), "a creator that never unlinked does so on drop");

    let creator = SharedMapping::create(&path, 64).unwrap();
    let opener = SharedMapping::open(&path, 64).unwrap();
    creator.words()[2].store(5, Ordering::Release);
    drop(creator);
    assert!(!path.exists(), "the creator's drop removes the name");
    assert_eq!(opener.words()[2].load(Ordering::Acquire), 5, "an opener keeps its mapping");
}

#[test]
fn unlink_leaves_a_file_that_replaced_the_mapped_one() {
    let (_d, path) = dir_and_path("seg");
    let a = SharedMapping::create(&path, 64).unwrap();
    std::fs::remove_file(&path).unwrap();
    let b = SharedMapping::create(&path, 64).unwrap();
    let err = a.unlink().unwrap_err();
    assert!(matches!(err.reason, SharedMapFailure::Replaced), "{err}");
    drop(a);
    assert!(path.exists(), "the old creator's drop left the new file");
    drop(b);
    assert!(!path.exists());
}

#[test]
fn populated_mappings_share_bytes_like_lazy_ones() {
    let (_d, path) = dir_and_path("ring");
    let a = SharedMapping::create_with(&path, 1 << 16, Pages::Populated).unwrap();
    let b = SharedMapping::open_with(&path, 1 << 16, Pages::Populated).unwrap();
    let lazy = SharedMapping::open(&path, 1 << 16).unwrap();
    a.words()[8191].store(7, Ordering::Release);
    assert_eq!(b.words()[8191].load(Ordering::Acquire), 7);
    assert_eq!(lazy.words()[8191].load(Ordering::Acquire), 7);
    assert!(SharedMapping::open_with(&path, 1 << 15, Pages::Populated).is_err(), "the length is still checked");
}
