use super::cache::BoundedCache;
use super::*;

#[test]
fn cache_never_exceeds_capacity_and_evicts_least_recently_used() {
    let mut cache = BoundedCache::new(3);
    for key in 0..3 {
        cache.insert(key, key * 10);
    }
    assert_eq!(cache.get(&0), Some(0)); // 0 is now the most recent; 1 the least.
    cache.insert(3, 30);
    assert_eq!(cache.len(), 3);
    assert_eq!(cache.get(&1), None);
    assert_eq!(cache.get(&0), Some(0));
    assert_eq!(cache.evictions(), 1);
    for key in 4..100 {
        cache.insert(key, key);
        assert!(cache.len() <= cache.capacity());
    }
    assert_eq!(cache.evictions(), 97);
}

#[test]
fn cache_replaces_in_place() {
    let mut cache = BoundedCache::new(2);
    cache.insert("a", 1);
    cache.insert("a", 2);
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.get(&"a"), Some(2));
    assert!(BoundedCache::<u8, u8>::new(0).capacity() >= 1);
}

#[test]
fn fnv_matches_published_vectors() {
    assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn options_name_the_architecture_and_include_paths() {
    assert_eq!(arch_name((9, 0)), "sm_90");
    assert_eq!(arch_name((10, 3)), "sm_103");
    let options = compile_options("sm_90", &[std::path::PathBuf::from("/usr/local/cuda/include")]);
    assert!(options.contains(&"--gpu-architecture=sm_90".to_string()));
    assert!(options.contains(&"--include-path=/usr/local/cuda/include".to_string()));
}

#[test]
fn compiling_without_nvrtc_is_not_available_not_a_panic() {
    if crate::probe().nvrtc {
        println!("skipped: NVRTC is present here; this test covers its absence");
        return;
    }
    match compile_cached("extern \"C\" __global__ void k() {}", "k.cu", "sm_90") {
        Err(CudaError::NotAvailable { reason }) => assert!(reason.contains("NVRTC"), "{reason}"),
        other => panic!("expected NotAvailable, got {other:?}"),
    }
    assert_eq!(cached_binary_count(), 0);
}

/// A source that includes a header from an extra folder compiles with that folder and fails,
/// with the compiler's log, without it (NVRTC needs no GPU; skipped without NVRTC).
#[test]
fn extra_include_folders_reach_the_compiler() {
    if !crate::probe().nvrtc {
        println!("skipped: no NVRTC");
        return;
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("accord-include-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(dir.join("accordtest")).unwrap();
    std::fs::write(dir.join("accordtest/seven.cuh"), "#define ACCORD_TEST_SEVEN 7\n").unwrap();
    let source = "#include <accordtest/seven.cuh>\n\
                  extern \"C\" __global__ void k(int* p) { *p = ACCORD_TEST_SEVEN; }\n";
    let with = compile_cached_with_includes(source, "seven.cu", "sm_90", std::slice::from_ref(&dir));
    let without = compile_cached_with_includes(source, "seven.cu", "sm_90", &[]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(with.is_ok_and(|cubin| !cubin.is_empty()));
    match without {
        Err(CudaError::Compile { log, .. }) => assert!(log.contains("seven.cuh"), "{log}"),
        other => panic!("expected a compile error naming the header, got {other:?}"),
    }
}
