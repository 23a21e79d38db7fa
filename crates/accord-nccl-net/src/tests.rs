//! ABI layout checks: sizes and offsets as NCCL's C headers lay them out on LP64.

use crate::abi::*;
use std::mem::{offset_of, size_of};

#[test]
fn properties_layout_matches_the_c_struct() {
    assert_eq!(offset_of!(PropertiesV10, name), 0);
    assert_eq!(offset_of!(PropertiesV10, pciPath), 8);
    assert_eq!(offset_of!(PropertiesV10, guid), 16);
    assert_eq!(offset_of!(PropertiesV10, ptrSupport), 24);
    assert_eq!(offset_of!(PropertiesV10, speed), 36);
    assert_eq!(offset_of!(PropertiesV10, latency), 44);
    assert_eq!(offset_of!(PropertiesV10, maxRecvs), 52);
    assert_eq!(offset_of!(PropertiesV10, netDeviceType), 56);
    assert_eq!(offset_of!(PropertiesV10, netDeviceVersion), 60);
    assert_eq!(offset_of!(PropertiesV10, vProps), 64);
    assert_eq!(offset_of!(PropertiesV10, maxP2pBytes), 88);
    assert_eq!(offset_of!(PropertiesV10, maxCollBytes), 96);
    assert_eq!(size_of::<PropertiesV10>(), 104);
    assert_eq!(offset_of!(PropertiesV11, maxMultiRequestSize), 104);
    assert_eq!(size_of::<PropertiesV11>(), 112);
    assert_eq!(size_of::<VDeviceProps>(), 20);
    assert_eq!(size_of::<NetAttr>(), 44);
}

#[test]
fn tables_are_a_name_and_one_pointer_per_function() {
    assert_eq!(size_of::<NetV11>(), 8 * (1 + 21));
    assert_eq!(size_of::<NetV10>(), 8 * (1 + 19));
    assert_eq!(size_of::<NetCalls>(), 8 * 14);
    assert_eq!(offset_of!(NetV11, calls) + offset_of!(NetCalls, isend), 8 * 10);
    assert_eq!(offset_of!(NetV10, calls) + offset_of!(NetCalls, makeVDevice), 8 * 19);
    assert_eq!(offset_of!(NetV11, setNetAttr), 8 * 21);
}

#[test]
fn objects_handed_to_nccl_may_cross_its_threads() {
    // NCCL's service thread creates comms and registers memory; its progress thread sends,
    // receives and tests, all through the same pointers.
    fn shared<T: Send + Sync>() {}
    shared::<crate::comm::SendComm>();
    shared::<crate::comm::RecvComm>();
    shared::<crate::comm::SendRequest>();
    shared::<crate::comm::RecvRequest>();
    shared::<crate::setup::ListenComm>();
    shared::<crate::mr::MemoryRegion>();
}
