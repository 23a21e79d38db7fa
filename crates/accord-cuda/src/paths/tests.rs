use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("accord-cuda-paths-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn keeps_only_folders_with_the_file_in_order_without_duplicates() {
    let root = scratch("keep");
    let wheel = root.join("site/nvidia/cu13/lib");
    let toolkit = root.join("cuda/lib64");
    let empty = root.join("empty");
    for dir in [&wheel, &toolkit, &empty] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(wheel.join("libnvrtc.so.13"), b"").unwrap();
    std::fs::write(toolkit.join("libnvrtc.so"), b"").unwrap();
    let candidates = vec![empty.clone(), toolkit.clone(), root.join("missing"), wheel.clone(), toolkit.clone()];
    let found = dirs_containing(candidates, |n| n.starts_with("libnvrtc.so"));
    assert_eq!(found, vec![toolkit.canonicalize().unwrap(), wheel.canonicalize().unwrap()]);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn split_and_join_are_inverse() {
    let dirs = split_paths("/a::/b/c:");
    assert_eq!(dirs, vec![PathBuf::from("/a"), PathBuf::from("/b/c")]);
    assert_eq!(join_paths(&dirs), "/a:/b/c");
    assert!(split_paths("").is_empty());
}

#[test]
fn discovery_is_bounded_and_never_panics() {
    assert!(site_packages_dirs().len() <= SITE_PACKAGES_DIRS_MAX);
    for dir in nvrtc_library_dirs() {
        assert!(dir.is_dir());
    }
    for dir in cuda_include_dirs() {
        assert!(dir.join("cuda_fp16.h").exists());
    }
    let _ = nvrtc_library_path();
}
