use std::os::fd::AsRawFd;

use super::*;

#[test]
fn a_contiguous_piece_list_is_accepted_with_its_total() {
    assert_eq!(check_pieces(&[(0, 20 << 20), (20 << 20, 20 << 20), (40 << 20, 2 << 20)]).unwrap(), 42 << 20);
    assert_eq!(check_pieces(&[(0, 1)]).unwrap(), 1);
}

#[test]
fn malformed_piece_lists_are_refused_before_any_mapping() {
    let refused = |pieces: &[(u64, u64)]| matches!(check_pieces(pieces), Err(CudaError::InvalidArgument { .. }));
    assert!(refused(&[]), "no piece");
    assert!(refused(&[(4096, 4096)]), "not starting at 0");
    assert!(refused(&[(0, 4096), (8192, 4096)]), "a gap");
    assert!(refused(&[(0, 8192), (4096, 4096)]), "an overlap");
    assert!(refused(&[(0, 0)]), "an empty piece");
    assert!(refused(&[(0, u64::MAX), (u64::MAX, 2)]), "past 2^64");
    assert!(refused(&[(0, u64::MAX)]), "larger than an address space");
    let too_many: Vec<(u64, u64)> = (0..=VMM_PIECES_MAX as u64).map(|i| (i, 1)).collect();
    assert!(refused(&too_many), "too many pieces");
}

#[test]
fn a_descriptor_is_taken_from_a_process_and_names_the_same_file() {
    use std::os::unix::fs::MetadataExt;
    let path = std::env::temp_dir().join(format!("accord-vmm-fd-{}", std::process::id()));
    std::fs::write(&path, b"x").unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let taken = match take_fd_of(std::process::id(), file.as_raw_fd()) {
        Ok(fd) => fd,
        // Kernels before 5.6, or seccomp filters, lack pidfd_getfd: an error, not a panic.
        Err(CudaError::VmmShare { reason, .. }) => {
            println!("skipped: pidfd_getfd unavailable here ({reason})");
            return;
        }
        Err(other) => panic!("unexpected error {other:?}"),
    };
    let theirs = std::fs::File::from(taken);
    assert_ne!(theirs.as_raw_fd(), file.as_raw_fd());
    assert_eq!(theirs.metadata().unwrap().ino(), file.metadata().unwrap().ino());
}

#[test]
fn taking_from_a_missing_process_or_descriptor_is_an_error_naming_it() {
    match take_fd_of(u32::MAX >> 1, 0) {
        Err(CudaError::VmmShare { exporter_pid, reason }) => {
            assert_eq!(exporter_pid, u32::MAX >> 1);
            assert!(reason.contains("pidfd_open"), "{reason}");
        }
        other => panic!("expected VmmShare, got {other:?}"),
    }
    match take_fd_of(std::process::id(), 1 << 20) {
        Err(CudaError::VmmShare { reason, .. }) => assert!(reason.contains("pidfd"), "{reason}"),
        other => panic!("expected VmmShare, got {other:?}"),
    }
}
