use super::*;

#[test]
fn stall_kernel_has_a_timeout_escape_and_records_it() {
    assert!(STALL_KERNEL_SOURCE.contains("%%globaltimer"));
    assert!(STALL_KERNEL_SOURCE.contains("timeout_ns"));
    assert!(STALL_KERNEL_SOURCE.contains("status = 2ull"));
    assert!(STALL_KERNEL_SOURCE.contains("extern \"C\" __global__ void accord_stall("));
    assert!(STALL_STATUS_SLOTS.is_power_of_two());
    assert!(STALL_TIMEOUT_DEFAULT >= Duration::from_secs(1));
}

#[test]
fn host_waiter_times_out_when_never_signalled() {
    let waiter = HostWaiter { state: Arc::new((Mutex::new(false), Condvar::new())) };
    assert!(!waiter.is_signalled());
    match waiter.wait(Duration::from_millis(5)) {
        Err(CudaError::Timeout { what, .. }) => assert_eq!(what, "host function signal"),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn host_waiter_wakes_on_signal() {
    let waiter = HostWaiter { state: Arc::new((Mutex::new(false), Condvar::new())) };
    let state = Arc::clone(&waiter.state);
    let signaller = std::thread::spawn(move || {
        *state.0.lock().unwrap() = true;
        state.1.notify_all();
    });
    waiter.wait(Duration::from_secs(10)).unwrap();
    signaller.join().unwrap();
    assert!(waiter.is_signalled());
}
