//! The check binary on this host: without a driver it must skip cleanly.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_accord-cuda-check");

#[test]
fn skips_cleanly_or_runs() {
    let output = Command::new(BIN).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !accord_cuda::probe().driver {
        assert!(output.status.success(), "exit status {:?}", output.status);
        assert!(stdout.starts_with("skipped: no CUDA driver"), "{stdout}");
    } else {
        println!("GPU host: ran the full check:\n{stdout}");
        assert!(output.status.success(), "check failed:\n{stdout}");
    }
}

#[test]
fn helper_modes_and_bad_arguments() {
    let dirs = Command::new(BIN).arg("--print-nvrtc-dirs").output().unwrap();
    assert!(dirs.status.success());
    let includes = Command::new(BIN).arg("--print-include-dirs").output().unwrap();
    assert!(includes.status.success());
    let bad = Command::new(BIN).arg("--frobnicate").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("usage"));
}
