//! Acceptance harness: two processes load the built `libnccl_net_accord.so` with `dlopen`
//! (libloading) and drive `ncclNetPlugin_v11` the way NCCL's proxy does: `listen`, then
//! `connect` and `accept` interleaved on one thread until both return a comm; then, on another
//! thread, `isend`/`irecv`/`test` in both directions at once with tags, grouped receives sent
//! in shuffled order, zero-byte messages, short sends into larger receives and 32 outstanding
//! receives. Every byte is checked, and bytes past each message must stay untouched. The lossy
//! variant runs the same traffic with the engine's fault injector dropping and reordering
//! packets (`ACCORD_LOSS`, `ACCORD_REORDER`).
//!
//! Each process is a child running `plugin_child` (`accord_testkit`, its role the scenario);
//! the parent relays the two listen handles between them.
#![allow(unsafe_code)]

use accord_testkit::{hear, say, Context, Group, Spawn};
use nccl_net_accord::abi::{self, CommConfig, DebugLogger, NetV11, PropertiesV11, NET_HANDLE_BYTES_MAX};
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
mod plugin_lib;

use plugin_lib::plugin_path;
use std::time::{Duration, Instant};

/// The pair's roles: the traffic, or the peer-death scenario (`death_child`).
const PAIR: &str = "pair";
const DEATH: &str = "death";
/// The value naming the rank whose `connect` calls come slowly (the clear-to-send-before-connect
/// race).
const SLOW_CONNECT_RANK: &str = "slow_connect_rank";
/// The value saying how many groups of receives each direction carries.
const GROUPS: &str = "groups";
/// Receive slots (NCCL's outstanding request bound) and the bytes each slot's arena holds.
const SLOTS: usize = abi::NET_REQUESTS_MAX;
const SLOT_BYTES: usize = 1 << 20;
const RECVS_MAX: usize = 8;
const PART_BYTES: usize = SLOT_BYTES / RECVS_MAX;
const GUARD_BYTE: u8 = 0xEE;
const CHILD_DEADLINE: Duration = Duration::from_secs(60);
const PARENT_DEADLINE: Duration = Duration::from_secs(200);

/// One receive of a group: its capacity and what the sender sends into it.
#[derive(Clone, Copy, Debug)]
struct Part {
    tag: i32,
    capacity: usize,
    send: usize,
}

/// The traffic of one direction, known to both processes from the seed.
fn script(seed: u64, groups: usize) -> Vec<Vec<Part>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..groups)
        .map(|g| {
            let n = if g % 3 == 0 { rng.gen_range(2..=RECVS_MAX) } else { 1 };
            let limit = if n == 1 { SLOT_BYTES } else { PART_BYTES };
            (0..n)
                .map(|j| {
                    let capacity = match rng.gen_range(0..10) {
                        0 => 0,
                        1 => limit,
                        2 => rng.gen_range(1..64),
                        _ => rng.gen_range(1..=limit),
                    };
                    let send = match rng.gen_range(0..6) {
                        0 => 0,
                        1 => rng.gen_range(0..=capacity),
                        _ => capacity,
                    };
                    Part { tag: (g % 5) as i32 * 16 + j as i32, capacity, send }
                })
                .collect()
        })
        .collect()
}

fn payload(seed: u64, group: usize, part: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed ^ (group as u64) << 8 ^ part as u64).fill_bytes(&mut v);
    v
}

/// The harness's logger. NCCL's logger is C-variadic; Rust cannot define one, so this takes
/// exactly the six arguments the plugin passes (level, flags, file, line, "%s", message), which
/// the x86-64 and AArch64 Linux calling conventions place where a variadic callee finds them.
unsafe extern "C" fn logger(
    level: c_int,
    _flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    _fmt: *const c_char,
    msg: *const c_char,
) {
    // Safety: the plugin passes a NUL-terminated message.
    let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    eprintln!("[plugin log level {level}] {text}");
    if text.contains("engine statistics") {
        STATISTICS.lock().unwrap().push(text.into_owned());
    }
}

/// The plugin's statistics lines, as logged at `finalize`.
static STATISTICS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The number after `name` in a statistics line.
fn counter(line: &str, name: &str) -> u64 {
    let rest = line.split_once(name).map_or("", |(_, r)| r).trim_start();
    rest.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// Memory the plugin's engine writes into; touched only through raw copies.
struct Arena {
    ptr: *mut u8,
    len: usize,
}

// Safety: the arena is plain bytes; the driver thread is its only user after the hand-over.
unsafe impl Send for Arena {}

impl Arena {
    fn new(len: usize) -> Arena {
        let mut v = vec![0u8; len].into_boxed_slice();
        let ptr = v.as_mut_ptr();
        std::mem::forget(v);
        Arena { ptr, len }
    }
    fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.len);
        // Safety: in bounds; no transfer touches this range now (the driver's slot discipline).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(offset), bytes.len()) };
    }
    fn fill(&self, offset: usize, len: usize, value: u8) {
        assert!(offset + len <= self.len);
        // Safety: as for write.
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), value, len) };
    }
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.len);
        let mut v = vec![0u8; len];
        // Safety: as for write.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), v.as_mut_ptr(), len) };
        v
    }
}

struct Plugin {
    table: &'static NetV11,
    _lib: libloading::Library,
}

fn check(what: &str, rc: c_int) {
    assert_eq!(rc, abi::NCCL_SUCCESS, "{what} returned NCCL error {rc}");
}

fn load() -> Plugin {
    let path = plugin_path();
    // Safety: loading our own plugin; its initialisers only set up Rust statics.
    let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen the plugin");
    // Safety: ncclNetPlugin_v11 is a static NetV11 in the plugin, alive while `lib` is.
    let table: &'static NetV11 = unsafe {
        let symbol = lib.get::<*const NetV11>(b"ncclNetPlugin_v11\0").expect("ncclNetPlugin_v11 exported");
        &**symbol
    };
    // Safety: the plugin also exports the v10 shim; only its presence is checked.
    assert!(unsafe { lib.get::<*const c_void>(b"ncclNetPlugin_v10\0") }.is_ok());
    Plugin { table, _lib: lib }
}

struct SendGroupState {
    group: usize,
    order: Vec<usize>,
    next: usize,
}

/// Both directions of traffic on one thread, as NCCL's progress thread drives them.
struct Driver<'a> {
    t: &'a NetV11,
    send_comm: *mut c_void,
    recv_comm: *mut c_void,
    send_seed: u64,
    recv_seed: u64,
    send_script: Vec<Vec<Part>>,
    recv_script: Vec<Vec<Part>>,
    send_arena: Arena,
    recv_arena: Arena,
    send_mr: *mut c_void,
    recv_mr: *mut c_void,
    rng: ChaCha8Rng,
}

impl Driver<'_> {
    fn run(&mut self) -> (usize, usize, usize) {
        let deadline = Instant::now() + CHILD_DEADLINE;
        let mut recv_next = 0;
        let mut recv_done = 0;
        let mut recvs: VecDeque<(usize, *mut c_void)> = VecDeque::new();
        let mut recv_outstanding_max = 0;
        let mut send_current: Option<SendGroupState> = None;
        let mut send_next = 0;
        let mut send_groups_done = vec![0usize; self.send_script.len()];
        let mut sends_completed_groups = 0;
        let mut sends: VecDeque<(usize, usize, *mut c_void)> = VecDeque::new();
        let mut send_outstanding_max = 0;
        let mut bytes = 0;
        while recv_done < self.recv_script.len() || sends_completed_groups < self.send_script.len() {
            assert!(
                Instant::now() < deadline,
                "traffic did not finish in {CHILD_DEADLINE:?}: receives done {recv_done} posted {recv_next} outstanding {}, \
                 send groups done {sends_completed_groups} started {send_next} outstanding sends {} (current {:?})",
                recvs.len(),
                sends.len(),
                send_current.as_ref().map(|c| (c.group, c.next, c.order.len()))
            );
            // Post receives while the plugin takes them.
            while recv_next < self.recv_script.len() && recvs.len() < SLOTS {
                let group = &self.recv_script[recv_next];
                let base = (recv_next % SLOTS) * SLOT_BYTES;
                self.recv_arena.fill(base, SLOT_BYTES, GUARD_BYTE);
                let mut data: Vec<*mut c_void> = vec![];
                let mut sizes: Vec<usize> = vec![];
                let mut tags: Vec<c_int> = vec![];
                let mut mhandles: Vec<*mut c_void> = vec![];
                for (j, p) in group.iter().enumerate() {
                    // Safety: inside the receive arena.
                    data.push(unsafe { self.recv_arena.ptr.add(base + j * PART_BYTES) }.cast());
                    sizes.push(p.capacity);
                    tags.push(p.tag);
                    mhandles.push(self.recv_mr);
                }
                let mut phandles = vec![std::ptr::null_mut::<c_void>(); group.len()];
                let mut request = std::ptr::null_mut();
                // Safety: arrays of group.len() entries, a live recv comm, registered arena.
                check("irecv", unsafe {
                    (self.t.calls.irecv)(
                        self.recv_comm,
                        group.len() as c_int,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhandles.as_mut_ptr(),
                        phandles.as_mut_ptr(),
                        &mut request,
                    )
                });
                if request.is_null() {
                    assert!(recvs.len() >= SLOTS, "irecv refused with only {} outstanding", recvs.len());
                    break;
                }
                recvs.push_back((recv_next, request));
                recv_next += 1;
                recv_outstanding_max = recv_outstanding_max.max(recvs.len());
            }
            // Issue sends: a group's parts in shuffled order, each matched by tag.
            loop {
                if send_current.is_none() && send_next < self.send_script.len() {
                    // The group's send slot is free once the group 32 before it completed.
                    if send_next >= SLOTS
                        && send_groups_done[send_next - SLOTS] < self.send_script[send_next - SLOTS].len()
                    {
                        break;
                    }
                    let group = &self.send_script[send_next];
                    let base = (send_next % SLOTS) * SLOT_BYTES;
                    for (j, p) in group.iter().enumerate() {
                        self.send_arena.write(base + j * PART_BYTES, &payload(self.send_seed, send_next, j, p.send));
                    }
                    let mut order: Vec<usize> = (0..group.len()).collect();
                    order.shuffle(&mut self.rng);
                    send_current = Some(SendGroupState { group: send_next, order, next: 0 });
                    send_next += 1;
                }
                let Some(cur) = send_current.as_mut() else { break };
                let j = cur.order[cur.next];
                let part = self.send_script[cur.group][j];
                let base = (cur.group % SLOTS) * SLOT_BYTES + j * PART_BYTES;
                let mut request = std::ptr::null_mut();
                // Safety: inside the registered send arena; a live send comm.
                check("isend", unsafe {
                    (self.t.calls.isend)(
                        self.send_comm,
                        self.send_arena.ptr.add(base).cast(),
                        part.send,
                        part.tag,
                        self.send_mr,
                        std::ptr::null_mut(),
                        &mut request,
                    )
                });
                if request.is_null() {
                    break;
                }
                sends.push_back((cur.group, j, request));
                send_outstanding_max = send_outstanding_max.max(sends.len());
                cur.next += 1;
                if cur.next == cur.order.len() {
                    send_current = None;
                }
            }
            // Test sends in order.
            while let Some(&(group, j, request)) = sends.front() {
                let (mut done, mut size) = (0, -1);
                // Safety: a live request from isend.
                check("test(send)", unsafe { (self.t.calls.test)(request, &mut done, &mut size) });
                if done == 0 {
                    break;
                }
                let part = self.send_script[group][j];
                assert_eq!(size as usize, part.send, "send size reported for group {group} part {j}");
                sends.pop_front();
                send_groups_done[group] += 1;
                if send_groups_done[group] == self.send_script[group].len() {
                    sends_completed_groups += 1;
                }
            }
            // Test receives in order and check every byte.
            while let Some(&(group, request)) = recvs.front() {
                let parts = &self.recv_script[group];
                let mut done = 0;
                let mut sizes = vec![-1 as c_int; parts.len()];
                // Safety: a live request from irecv; room for one size per receive.
                check("test(recv)", unsafe { (self.t.calls.test)(request, &mut done, sizes.as_mut_ptr()) });
                if done == 0 {
                    break;
                }
                let base = (group % SLOTS) * SLOT_BYTES;
                for (j, p) in parts.iter().enumerate() {
                    assert_eq!(sizes[j] as usize, p.send, "received size, group {group} part {j}");
                    let got = self.recv_arena.read(base + j * PART_BYTES, p.send);
                    assert!(got == payload(self.recv_seed, group, j, p.send), "bytes differ in group {group} part {j}");
                    if p.send < p.capacity {
                        let after = self.recv_arena.read(base + j * PART_BYTES + p.send, 1)[0];
                        assert_eq!(after, GUARD_BYTE, "a byte past the message changed (group {group} part {j})");
                    }
                    bytes += p.send;
                }
                recvs.pop_front();
                recv_done += 1;
            }
            std::thread::yield_now();
        }
        assert_eq!(recv_outstanding_max, SLOTS, "the plugin must take {SLOTS} outstanding receives");
        (recv_done, bytes, send_outstanding_max)
    }
}

fn child(kit: &Context) {
    let rank = kit.rank;
    let plugin = load();
    let t = plugin.table;
    // Safety: the table's name is a static C string.
    assert_eq!(unsafe { CStr::from_ptr(t.name) }.to_str().unwrap(), "Accord");
    // Safety: finalize tolerates the null context of a failed init.
    check("finalize(null)", unsafe { (t.finalize)(std::ptr::null_mut()) });
    // Safety: the harness logger stands in for NCCL's (see its comment).
    let log: DebugLogger = unsafe {
        Some(std::mem::transmute::<
            unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, *const c_char),
            unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...),
        >(logger))
    };
    let mut ctx = std::ptr::null_mut();
    let mut config = CommConfig { trafficClass: -1 };
    // Safety: valid out-pointers; the profiler callback is optional.
    check("init", unsafe { (t.init)(&mut ctx, 0x1234, &mut config, log, std::ptr::null_mut()) });
    let mut ndev = 0;
    // Safety: valid out-pointer.
    check("devices", unsafe { (t.devices)(&mut ndev) });
    assert!(ndev >= 1);
    // Safety: a zeroed properties struct is a valid out-buffer.
    let mut props: PropertiesV11 = unsafe { std::mem::zeroed() };
    // Safety: valid out-pointer for device 0.
    check("getProperties", unsafe { (t.getProperties)(0, &mut props) });
    let p = &props.base;
    assert!(!p.name.is_null() && p.guid != 0 && p.speed > 0);
    assert_eq!(
        (p.ptrSupport, p.netDeviceType, p.regIsGlobal, p.forceFlush),
        (abi::PTR_HOST, abi::NET_DEVICE_HOST, 0, 0)
    );
    assert_eq!(p.maxRecvs as usize, RECVS_MAX);
    assert!(p.maxP2pBytes > 0 && p.maxCollBytes > 0 && p.maxComms > 0);
    assert_eq!((p.vProps.ndevs, p.vProps.devs[0], props.maxMultiRequestSize), (1, 0, 1));
    // Safety: as above; an out-of-range device must be an error, not a crash.
    assert_eq!(unsafe { (t.getProperties)(ndev, &mut props) }, abi::NCCL_INVALID_ARGUMENT);
    // Safety: regMr with a CUDA pointer type must fail cleanly.
    let mut bogus = std::ptr::null_mut();
    let mut byte = 0u8;
    assert_ne!(
        unsafe { (t.calls.regMr)(std::ptr::null_mut(), (&mut byte as *mut u8).cast(), 1, abi::PTR_CUDA, &mut bogus) },
        abi::NCCL_SUCCESS
    );

    let mut handle = [0u8; NET_HANDLE_BYTES_MAX];
    let mut listen_comm = std::ptr::null_mut();
    // Safety: a handle buffer of NCCL_NET_HANDLE_MAXSIZE bytes and valid out-pointers.
    check("listen", unsafe { (t.listen)(ctx, 0, handle.as_mut_ptr().cast(), &mut listen_comm) });
    let hex: String = handle.iter().map(|b| format!("{b:02x}")).collect();
    say(&format!("HANDLE {hex}"));
    let line = hear().expect("the parent sends the peer's handle");
    let line = line.trim();
    let mut peer_handle = [0u8; NET_HANDLE_BYTES_MAX];
    for (i, b) in peer_handle.iter_mut().enumerate() {
        *b = u8::from_str_radix(&line[2 * i..2 * i + 2], 16).unwrap();
    }

    // Service thread: connect and accept interleaved until both return a comm.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut send_comm, mut recv_comm): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mut dev_comm: *mut c_void = std::ptr::null_mut();
    let mut calls = 0;
    let slow_connect = kit.value(SLOW_CONNECT_RANK) == Some(rank.to_string().as_str());
    while send_comm.is_null() || recv_comm.is_null() {
        assert!(Instant::now() < deadline, "connect/accept did not finish ({calls} calls)");
        if send_comm.is_null() {
            // Safety: the peer's handle buffer, reused across calls as NCCL does.
            check("connect", unsafe {
                (t.connect)(ctx, 0, peer_handle.as_mut_ptr().cast(), &mut send_comm, &mut dev_comm)
            });
        }
        if recv_comm.is_null() {
            // Safety: a live listen comm and valid out-pointers.
            check("accept", unsafe { (t.calls.accept)(listen_comm, &mut recv_comm, &mut dev_comm) });
        }
        calls += 1;
        std::thread::sleep(Duration::from_micros(200));
        if slow_connect && send_comm.is_null() {
            // A sender slow to finish its connect: the receiver may already write
            // clear-to-sends into the comm before connect returns it.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    eprintln!("rank {rank}: connected after {calls} rounds of connect/accept");

    let groups: usize = kit.parse(GROUPS).unwrap_or(200);
    let send_seed = 1000 + rank as u64;
    let recv_seed = 1000 + (1 - rank) as u64;
    let arena_bytes = SLOTS * SLOT_BYTES;
    let send_arena = Arena::new(arena_bytes);
    let recv_arena = Arena::new(arena_bytes);
    let (mut send_mr, mut recv_mr): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
    // Safety: the arenas live for the rest of the process.
    check("regMr(send)", unsafe {
        (t.calls.regMr)(send_comm, send_arena.ptr.cast(), arena_bytes, abi::PTR_HOST, &mut send_mr)
    });
    // Safety: as above.
    check("regMr(recv)", unsafe {
        (t.calls.regMr)(recv_comm, recv_arena.ptr.cast(), arena_bytes, abi::PTR_HOST, &mut recv_mr)
    });

    if kit.role == DEATH {
        death_child(t, rank, send_comm, recv_comm, send_mr, recv_mr, &send_arena, &recv_arena);
        return;
    }
    let comms = (send_comm as usize, recv_comm as usize, send_mr as usize, recv_mr as usize);
    let progress = std::thread::spawn(move || {
        let mut driver = Driver {
            t,
            send_comm: comms.0 as *mut c_void,
            recv_comm: comms.1 as *mut c_void,
            send_seed,
            recv_seed,
            send_script: script(send_seed, groups),
            recv_script: script(recv_seed, groups),
            send_arena,
            recv_arena,
            send_mr: comms.2 as *mut c_void,
            recv_mr: comms.3 as *mut c_void,
            rng: ChaCha8Rng::seed_from_u64(rank as u64),
        };
        driver.run()
    });
    let (groups_done, bytes, send_max) = progress.join().expect("progress thread");
    // Both sides finished before either closes: a peer that left early would turn the other's
    // retransmission of a lost acknowledgement into a failure (NCCL's teardown has the same
    // barrier).
    say("DONE");
    hear().expect("the parent says go once both are done");
    // Safety: handing back what the plugin gave, once each.
    unsafe {
        check("deregMr", (t.calls.deregMr)(send_comm, send_mr));
        check("deregMr", (t.calls.deregMr)(recv_comm, recv_mr));
        check("closeSend", (t.calls.closeSend)(send_comm));
        check("closeRecv", (t.calls.closeRecv)(recv_comm));
        check("closeListen", (t.calls.closeListen)(listen_comm));
        check("finalize", (t.finalize)(ctx));
    }
    let stats = STATISTICS.lock().unwrap().last().cloned().expect("finalize logs engine statistics");
    let (retransmits, drops) = (counter(&stats, "retransmits"), counter(&stats, "injected drops"));
    if std::env::var("ACCORD_LOSS").is_ok() {
        assert!(drops > 0 && retransmits > 0, "the fault injector was meant to be active: {stats}");
    }
    say(&format!(
        "OK groups={groups_done} bytes={bytes} send_outstanding_max={send_max} retransmits={retransmits} \
         injected_drops={drops}"
    ));
}

/// The peer-death scenario: rank 1 idles until the parent kills it; rank 0 has an `irecv`
/// posted for it and an `isend` waiting for its clear-to-send, and drives both with `test` /
/// `isend` until each returns an error code (bounded: a hang fails the parent's deadline).
#[allow(clippy::too_many_arguments)]
fn death_child(
    t: &'static NetV11,
    rank: usize,
    send_comm: *mut c_void,
    recv_comm: *mut c_void,
    send_mr: *mut c_void,
    recv_mr: *mut c_void,
    send_arena: &Arena,
    recv_arena: &Arena,
) {
    say("READY");
    if rank == 1 {
        std::thread::sleep(CHILD_DEADLINE);
        return;
    }
    let mut recv_request = std::ptr::null_mut();
    let (mut data, mut sizes, mut tags, mut mhandles) =
        ([recv_arena.ptr.cast::<c_void>()], [4096 as c_ulong], [1 as c_int], [recv_mr]);
    let mut phandles = [std::ptr::null_mut::<c_void>()];
    // Safety: arrays of one entry, a live recv comm, a registered arena.
    check("irecv", unsafe {
        (t.calls.irecv)(
            recv_comm,
            1,
            data.as_mut_ptr(),
            sizes.as_mut_ptr().cast(),
            tags.as_mut_ptr(),
            mhandles.as_mut_ptr(),
            phandles.as_mut_ptr(),
            &mut recv_request,
        )
    });
    assert!(!recv_request.is_null(), "a first irecv has a free slot");
    let (mut recv_rc, mut send_rc) = (abi::NCCL_SUCCESS, abi::NCCL_SUCCESS);
    let deadline = Instant::now() + CHILD_DEADLINE;
    while (recv_rc == abi::NCCL_SUCCESS || send_rc == abi::NCCL_SUCCESS) && Instant::now() < deadline {
        if recv_rc == abi::NCCL_SUCCESS {
            let (mut done, mut size) = (0, -1);
            // Safety: a live request from irecv.
            recv_rc = unsafe { (t.calls.test)(recv_request, &mut done, &mut size) };
            assert_eq!(done, 0, "nothing was sent, so nothing can have arrived");
        }
        if send_rc == abi::NCCL_SUCCESS {
            let mut request = std::ptr::null_mut();
            // Safety: inside the registered send arena; a live send comm.
            send_rc = unsafe {
                (t.calls.isend)(send_comm, send_arena.ptr.cast(), 4096, 1, send_mr, std::ptr::null_mut(), &mut request)
            };
            assert!(request.is_null(), "the peer posted no receive, so no clear-to-send can have come");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    say(&format!("OK recv_rc={recv_rc} send_rc={send_rc}"));
}

/// Entry point of a child process (a no-op in a normal test run).
#[test]
fn plugin_child() {
    let Some(kit) = accord_testkit::child() else { return };
    match kit.role.as_str() {
        "init-failure" => init_failure_child(),
        "foreign-loopback" => foreign_loopback_child(),
        PAIR | DEATH => child(&kit),
        other => panic!("no plugin_child role {other:?}"),
    }
}

/// A process whose `init` fails (bad `ACCORD_NET_IFS`): every call returns an NCCL error code
/// with a logged reason, `finalize` takes the null context, and the process lives on.
fn init_failure_child() {
    let plugin = load();
    let t = plugin.table;
    let mut ctx = std::ptr::null_mut();
    let mut config = CommConfig { trafficClass: -1 };
    // Safety: valid out-pointers; no logger (warnings go to stderr).
    let rc = unsafe { (t.init)(&mut ctx, 1, &mut config, None, std::ptr::null_mut()) };
    assert_eq!(rc, abi::NCCL_INTERNAL_ERROR, "a bad ACCORD_NET_IFS is a configuration error");
    assert!(ctx.is_null());
    let mut ndev = -1;
    // Safety: valid out-pointer.
    assert_eq!(unsafe { (t.devices)(&mut ndev) }, abi::NCCL_INVALID_USAGE, "devices before a successful init");
    // Safety: finalize tolerates the null context of a failed init.
    check("finalize(null)", unsafe { (t.finalize)(ctx) });
    // Safety: null arguments must be errors, not crashes.
    assert_eq!(
        unsafe { (t.calls.test)(std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()) },
        abi::NCCL_INVALID_ARGUMENT
    );
    say("OK init failure handled");
}

/// A process given a handle whose listener sits on another machine's loopback (a job across
/// hosts run with the default device): `connect` fails at once with a reason that names
/// ACCORD_NET_IFS, instead of retrying until the setup timeout.
fn foreign_loopback_child() {
    use nccl_net_accord::handle::Handle;
    let plugin = load();
    let t = plugin.table;
    let mut ctx = std::ptr::null_mut();
    let mut config = CommConfig { trafficClass: -1 };
    // Safety: valid out-pointers; no logger (warnings go to stderr).
    check("init", unsafe { (t.init)(&mut ctx, 1, &mut config, None, std::ptr::null_mut()) });
    let mut handle = [0u8; NET_HANDLE_BYTES_MAX];
    let mut listen_comm = std::ptr::null_mut();
    // Safety: a handle buffer of NCCL_NET_HANDLE_MAXSIZE bytes and a valid out-pointer.
    check("listen", unsafe { (t.listen)(ctx, 0, handle.as_mut_ptr().cast(), &mut listen_comm) });
    let mut decoded = Handle::decode(&handle).expect("our own handle");
    assert!(decoded.addr.ip().is_loopback() && decoded.machine != 0, "{decoded:?}");
    decoded.machine ^= 0x5a5a_5a5a_5a5a_5a5a;
    decoded.encode(&mut handle);
    let (mut send_comm, mut dev_comm) = (std::ptr::null_mut(), std::ptr::null_mut());
    let started = Instant::now();
    // Safety: the handle buffer and valid out-pointers.
    let rc = unsafe { (t.connect)(ctx, 0, handle.as_mut_ptr().cast(), &mut send_comm, &mut dev_comm) };
    assert_eq!(rc, abi::NCCL_INVALID_USAGE, "a loopback listener on another machine is a usage error");
    assert!(send_comm.is_null() && started.elapsed() < Duration::from_secs(5));
    // Safety: the listen comm from listen above, and the context from init.
    check("closeListen", unsafe { (t.calls.closeListen)(listen_comm) });
    check("finalize", unsafe { (t.finalize)(ctx) });
    say("OK foreign loopback refused");
}

/// Runs one single-process child mode with `ACCORD_NET_IFS` set to `ifs`; asserts it reported
/// success and returns its standard error (the plugin's logged reasons).
fn run_solo_child(mode: &str, ifs: &str) -> String {
    let mut group = Spawn::new("plugin_child", 1).role(mode).env("ACCORD_NET_IFS", ifs).start().expect("spawn child");
    let (_, said) = group.said().unwrap_or_else(|f| panic!("child {mode}: {f}"));
    assert!(said.starts_with("OK"), "child {mode} said {said:?}");
    group.finish().unwrap_or_else(|f| panic!("child {mode}: {f}"));
    group.stderr(0)
}

#[test]
fn a_connect_to_another_machines_loopback_fails_at_once_with_what_to_set() {
    let stderr = run_solo_child("foreign-loopback", "127.0.0.1");
    assert!(stderr.contains("ACCORD_NET_IFS") && stderr.contains("another machine"), "the reason is logged: {stderr}");
}

#[test]
fn a_failed_init_returns_codes_and_finalize_takes_its_null_context() {
    let stderr = run_solo_child("init-failure", "no-such-interface-7");
    assert!(stderr.contains("ACCORD_NET_IFS"), "the reason is logged: {stderr}");
}

/// Hands each of the two ranks the other's connection handle once both are known.
fn exchange_handles(handles: &[Option<String>], group: &mut Group) {
    if let [Some(h0), Some(h1)] = handles {
        group.send(0, h1).expect("rank 0 hears rank 1's handle");
        group.send(1, h0).expect("rank 1 hears rank 0's handle");
    }
}

#[test]
fn a_killed_peer_fails_posted_irecv_and_waiting_isend_with_remote_error() {
    let mut group = Spawn::new("plugin_child", 2)
        .role(DEATH)
        .env_dir("ACCORD_REPORT_DIR")
        .bound(PARENT_DEADLINE)
        .start()
        .expect("spawn the ranks");
    let mut handles: Vec<Option<String>> = vec![None, None];
    let mut ready = [false; 2];
    let mut killed_at = None;
    let result = loop {
        let (rank, line) = group.said().unwrap_or_else(|f| panic!("rank 0 reports (a hang hits the bound): {f}"));
        if let Some(h) = line.strip_prefix("HANDLE ") {
            handles[rank] = Some(h.trim().to_string());
            exchange_handles(&handles, &mut group);
        } else if line == "READY" {
            ready[rank] = true;
            if ready[0] && ready[1] && killed_at.is_none() {
                std::thread::sleep(Duration::from_millis(200)); // rank 0 is waiting by now
                group.kill(1);
                killed_at = Some(Instant::now());
            }
        } else if let Some(r) = line.strip_prefix("OK") {
            break r.trim().to_string();
        }
    };
    group.finish().unwrap();
    let log = group.stderr(0);
    eprintln!("rank 0 saw both errors {:?} after the kill: {result}", killed_at.map(|t| t.elapsed()));
    let remote = abi::NCCL_REMOTE_ERROR;
    assert_eq!(result, format!("recv_rc={remote} send_rc={remote}"), "log: {log}");
    assert!(log.contains("is dead") && log.contains("exited"), "the reason is logged: {log}");
    // The survivor left the record of what it was waiting for (crate::inflight).
    assert!(log.contains("request(s) in flight"), "the dump's line is logged: {log}");
    let dumps: Vec<serde_json::Value> = std::fs::read_dir(group.dir())
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("plugin-inflight-")))
                .filter_map(|p| serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok())
                .collect()
        })
        .unwrap_or_default();
    let dump = dumps.first().unwrap_or_else(|| panic!("rank 0 wrote an in-flight dump; log: {log}"));
    assert_eq!(dump["kind"], "accord-plugin-inflight");
    let requests = dump["requests"].as_array().expect("requests");
    let waiting: Vec<(&str, &str)> =
        requests.iter().map(|r| (r["direction"].as_str().unwrap_or(""), r["waiting"].as_str().unwrap_or(""))).collect();
    assert!(waiting.contains(&("recv", "data")), "the posted irecv is in the dump: {dump}");
    assert!(waiting.contains(&("send", "clear_to_send")), "the isend waiting for its receiver is in the dump: {dump}");
    let peers: std::collections::BTreeSet<&str> = requests.iter().filter_map(|r| r["peer"].as_str()).collect();
    assert_eq!(peers.len(), 1, "both wait for the one peer that died: {dump}");
}

/// Runs the pair's traffic, `groups` groups each way, with `knobs` set for the plugin and
/// `slow_connect_rank`'s connect calls slowed; checks both ranks said OK and succeeded.
fn run_pair(knobs: &[(&str, &str)], slow_connect_rank: Option<usize>, groups: usize) {
    let mut spawn = Spawn::new("plugin_child", 2).role(PAIR).value(GROUPS, groups).bound(PARENT_DEADLINE);
    if let Some(rank) = slow_connect_rank {
        spawn = spawn.value(SLOW_CONNECT_RANK, rank);
    }
    for (k, v) in knobs {
        spawn = spawn.env(k, v);
    }
    let mut group = spawn.start().expect("spawn the ranks");
    let mut handles: Vec<Option<String>> = vec![None, None];
    let mut done = [false; 2];
    let mut results: Vec<Option<String>> = vec![None, None];
    while results.iter().any(Option::is_none) {
        let (rank, line) = group.said().unwrap_or_else(|f| panic!("results so far {results:?}: {f}"));
        if let Some(h) = line.strip_prefix("HANDLE ") {
            handles[rank] = Some(h.trim().to_string());
            exchange_handles(&handles, &mut group);
        } else if line == "DONE" {
            done[rank] = true;
            if done[0] && done[1] {
                group.send_all("go").expect("both ranks hear go");
            }
        } else if let Some(r) = line.strip_prefix("OK") {
            results[rank] = Some(r.trim().to_string());
        }
    }
    group.finish().unwrap();
    for (rank, result) in results.iter().enumerate() {
        eprintln!("rank {rank}: {}", result.as_deref().unwrap_or("?"));
    }
}

#[test]
fn two_processes_move_bytes_exactly() {
    run_pair(&[], Some(0), 200);
}

/// Three lanes per process: every receive of 128 KiB or more is written in 2 or 3 pieces, each
/// its own unsharded write and immediate, short sends leave pieces empty (zero-byte writes).
#[test]
fn two_processes_move_bytes_exactly_in_pieces_over_lanes() {
    run_pair(&[("ACCORD_WORKERS_PER_NIC", "3")], None, 120);
}

#[test]
fn two_processes_move_bytes_exactly_under_loss_and_reordering() {
    run_pair(&[("ACCORD_LOSS", "0.01"), ("ACCORD_REORDER", "0.02"), ("ACCORD_IDLE_TIMEOUT_MS", "3000")], None, 120);
}
