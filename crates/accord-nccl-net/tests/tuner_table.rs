//! The built library's tuner tables, loaded with `dlopen` and driven as NCCL 2.28 drives them:
//! `init` with a logger, `getCollInfo` on NCCL's contiguous `float[7][3]` cost table passed as
//! `float**`, `finalize`. Null arguments are errors, never crashes.

use nccl_net_accord::abi;
use nccl_net_accord::tuner::ffi::{TunerV4, TunerV5};
use nccl_net_accord::tuner::{COST_IGNORE, PROTO_LL, PROTO_LL128, PROTO_SIMPLE};
use std::ffi::{c_int, c_void};
use std::path::PathBuf;

fn library() -> libloading::Library {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let path = [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("libnccl_net_accord.so"))
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("libnccl_net_accord.so not built"));
    // Safety: loading our own library; its initialisers only set up Rust statics.
    unsafe { libloading::Library::new(&path) }.expect("dlopen the plugin library")
}

fn costs() -> [[f32; 3]; 7] {
    let mut t = [[0.0f32; 3]; 7];
    for (a, row) in t.iter_mut().enumerate() {
        for (p, c) in row.iter_mut().enumerate() {
            *c = 5.0 + (a * 3 + p) as f32;
        }
    }
    t
}

#[test]
fn v5_tunes_network_comms_and_leaves_single_node_ones() {
    let lib = library();
    // Safety: the symbol is a static TunerV5 in the library, alive while `lib` is.
    let v5: &TunerV5 = unsafe { &**lib.get::<*const TunerV5>(b"ncclTunerPlugin_v5\0").expect("v5 exported") };
    // Safety: the v4 table is exported too; only its presence and name are checked here.
    let v4: &TunerV4 = unsafe { &**lib.get::<*const TunerV4>(b"ncclTunerPlugin_v4\0").expect("v4 exported") };
    assert!(!v4.name.is_null());
    // Safety (all calls below): arguments as NCCL passes them, pointers to live locals.
    unsafe {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        assert_eq!((v5.init)(&mut ctx, 7, 2, 2, None, std::ptr::null_mut(), std::ptr::null_mut()), abi::NCCL_SUCCESS);
        assert!(!ctx.is_null());
        let mut t = costs();
        let mut channels: c_int = 0;
        let rc = (v5.get_coll_info)(ctx, 4, 1 << 20, 1, t.as_mut_ptr().cast(), 7, 3, 0, &mut channels);
        assert_eq!(rc, abi::NCCL_SUCCESS);
        assert_eq!(channels, 1, "1 MiB all_reduce over the network: one channel");
        for row in &t {
            assert_eq!((row[PROTO_LL], row[PROTO_LL128]), (COST_IGNORE, COST_IGNORE));
            assert!(row[PROTO_SIMPLE] >= 0.0);
        }
        let mut t = costs();
        let mut channels: c_int = 0;
        let rc = (v5.get_coll_info)(ctx, 4, 256 << 20, 1, t.as_mut_ptr().cast(), 7, 3, 0, &mut channels);
        assert_eq!(rc, abi::NCCL_SUCCESS);
        assert_eq!(channels, 0, "large: NCCL's own channel count");
        // Null pointers and absurd tables are errors.
        let mut t = costs();
        assert_ne!((v5.get_coll_info)(ctx, 4, 1 << 20, 1, std::ptr::null_mut(), 7, 3, 0, &mut channels), 0);
        assert_ne!((v5.get_coll_info)(ctx, 4, 1 << 20, 1, t.as_mut_ptr().cast(), 7, 3, 0, std::ptr::null_mut()), 0);
        assert_ne!((v5.get_coll_info)(ctx, 4, 1 << 20, 1, t.as_mut_ptr().cast(), -1, 3, 0, &mut channels), 0);
        assert_ne!((v5.get_coll_info)(ctx, 4, 1 << 20, 1, t.as_mut_ptr().cast(), 1000, 1000, 0, &mut channels), 0);
        assert_ne!(
            (v5.get_coll_info)(std::ptr::null_mut(), 4, 1 << 20, 1, t.as_mut_ptr().cast(), 7, 3, 0, &mut channels),
            0
        );
        assert_eq!((v5.finalize)(ctx), abi::NCCL_SUCCESS);
        assert_eq!((v5.finalize)(std::ptr::null_mut()), abi::NCCL_SUCCESS, "finalize tolerates a failed init");
        assert_ne!((v5.init)(std::ptr::null_mut(), 7, 2, 2, None, std::ptr::null_mut(), std::ptr::null_mut()), 0);

        // One node: nothing changes.
        let mut ctx: *mut c_void = std::ptr::null_mut();
        assert_eq!((v4.init)(8, 1, None, &mut ctx), abi::NCCL_SUCCESS);
        let mut t = costs();
        let mut channels: c_int = 0;
        assert_eq!((v4.get_coll_info)(ctx, 4, 1 << 20, 1, t.as_mut_ptr().cast(), 7, 3, 0, &mut channels), 0);
        assert_eq!((t, channels), (costs(), 0));
        assert_eq!((v4.destroy)(ctx), abi::NCCL_SUCCESS);
    }
}
