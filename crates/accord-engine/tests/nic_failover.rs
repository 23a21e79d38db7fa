//! NIC failover, on this machine: two engines, each in a network namespace of its own, joined
//! by two veth pairs on two subnets (two "NICs" per engine, one lane each). A bounded bulk
//! transfer runs; once a quarter of it has completed the test takes one veth down from the
//! parent namespace. It prints the bandwidth of each 100 ms window before, during and after
//! the cut, and asserts only that every write completed and the destination equals the
//! source byte for byte (never a timing).
//!
//! Needs root (network namespaces, veth); without them it prints why and passes as a skip.
//! The namespaces are deleted when the test ends, also when it fails (`Namespaces::drop`).
//!
//! `cargo test --release -p accord-engine --test nic_failover -- --nocapture`

use accord_engine::{Engine, EngineConfig, Transfer, WriteOp};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

/// Bytes moved in all.
const TOTAL_BYTES: u64 = 3 << 30;
/// Bytes per write (split into one shard per lane by the engine).
const WRITE_BYTES: usize = 4 << 20;
/// Size of the source and destination regions; writes cycle through them.
const REGION_BYTES: usize = 64 << 20;
/// Writes in flight.
const IN_FLIGHT: usize = 8;
/// Width of one row of the bandwidth table.
const WINDOW: Duration = Duration::from_millis(100);
/// The whole transfer must finish within this (a bound against hanging, not a measurement).
const DEADLINE: Duration = Duration::from_secs(180);

/// Runs `ip` with `args`; its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Network namespaces this test made; deleted on drop (their veths go with them).
struct Namespaces(Vec<String>);

impl Namespaces {
    fn add(&mut self, name: &str) -> Result<(), String> {
        ip(&["netns", "add", name])?;
        self.0.push(name.to_string());
        Ok(())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.0 {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("nic_failover: could not delete namespace {name}: {e}");
            }
        }
    }
}

/// Address of NIC `nic` (0 or 1) of side `side` (1 or 2): one /24 per veth pair.
fn addr(nic: u8, side: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 231, nic, side)
}

/// Two namespaces joined by veth pairs `v0` (10.231.0.0/24) and `v1` (10.231.1.0/24).
fn make_namespaces() -> Result<(Namespaces, String, String), String> {
    let pid = std::process::id();
    let (a, b) = (format!("accord-nf-a-{pid}"), format!("accord-nf-b-{pid}"));
    let mut ns = Namespaces(vec![]);
    ns.add(&a)?;
    ns.add(&b)?;
    for nic in 0..2u8 {
        let dev = format!("v{nic}");
        ip(&["-n", &a, "link", "add", &dev, "type", "veth", "peer", "name", &dev, "netns", &b])?;
        for (side, name) in [(1u8, &a), (2u8, &b)] {
            ip(&["-n", name, "addr", "add", &format!("{}/24", addr(nic, side)), "dev", &dev])?;
            // Jumbo frames, as on the fabrics the engine's 4 KiB datagrams are sized for.
            ip(&["-n", name, "link", "set", &dev, "mtu", "9000", "up"])?;
        }
    }
    for name in [&a, &b] {
        ip(&["-n", name, "link", "set", "lo", "up"])?;
    }
    Ok((ns, a, b))
}

/// Builds an engine on a thread that entered namespace `name` first: the engine's sockets
/// are made while it builds, so they live in that namespace, whichever thread uses them.
fn engine_in(name: &str, side: u8) -> Result<Engine, String> {
    let path = format!("/var/run/netns/{name}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            // SAFETY: a valid namespace descriptor; setns changes only this thread.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
            }
            let mut config = EngineConfig {
                nics: vec![IpAddr::V4(addr(0, side)), IpAddr::V4(addr(1, side))],
                workers_per_nic: 1,
                force_network: true,
                ..EngineConfig::default()
            };
            config.shm.enabled = false;
            config.cma = false;
            Engine::builder().ignore_env().config(config).build().map_err(|e| format!("engine in {name}: {e}"))
        })
        .join()
        .map_err(|_| "the engine's thread panicked".to_string())?
    })
}

/// Bandwidth of each window, and when the cut and the failover happened (offsets from the start).
struct Run {
    windows: Vec<u64>,
    cut_at: Duration,
    /// When every write submitted before the cut, and the first one submitted after it, had
    /// completed: the first after the cut has a shard on the dead NIC (every write is split
    /// over both), so this is when the engine had moved past the dead NIC.
    recovered_at: Duration,
    elapsed: Duration,
}

#[test]
fn a_transfer_survives_one_nic_going_down() {
    let (namespaces, a_ns, b_ns) = match make_namespaces() {
        Ok(made) => made,
        Err(why) => {
            println!("SKIP nic_failover: cannot make network namespaces here ({why})");
            return;
        }
    };
    let a = engine_in(&a_ns, 1).expect("engine a");
    let b = engine_in(&b_ns, 2).expect("engine b");
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let src = a.alloc(REGION_BYTES).unwrap();
    let dst = b.alloc(REGION_BYTES).unwrap();
    let pattern: Vec<u8> = (0..REGION_BYTES).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    src.write_at(0, &pattern).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());

    let writes = TOTAL_BYTES.div_ceil(WRITE_BYTES as u64);
    let start = Instant::now();
    let mut windows: Vec<u64> = vec![];
    let mut in_flight: VecDeque<(u64, Transfer)> = VecDeque::new();
    let (mut submitted, mut done_bytes) = (0u64, 0u64);
    let mut cut: Option<(Duration, u64)> = None;
    let mut recovered_at = None;
    while submitted < writes || !in_flight.is_empty() {
        assert!(
            start.elapsed() < DEADLINE,
            "the transfer did not finish within {DEADLINE:?}: {} of {writes} writes done, {} in flight",
            submitted - in_flight.len() as u64,
            in_flight.len()
        );
        while submitted < writes && in_flight.len() < IN_FLIGHT {
            let offset = ((submitted as usize * WRITE_BYTES) % REGION_BYTES) as u64;
            let op = WriteOp {
                src: &h,
                src_offset: offset,
                dst: &d,
                dst_offset: offset,
                len: WRITE_BYTES as u64,
                imm: None,
            };
            in_flight.push_back((submitted, a.write(&op).expect("submit")));
            submitted += 1;
        }
        let mut progressed = false;
        let mut i = 0;
        while i < in_flight.len() {
            match in_flight[i].1.poll() {
                Some(result) => {
                    let (n, _) = in_flight.remove(i).unwrap();
                    result.unwrap_or_else(|e| panic!("write {n} failed: {e}"));
                    done_bytes += WRITE_BYTES as u64;
                    let window = (start.elapsed().as_nanos() / WINDOW.as_nanos()) as usize;
                    if windows.len() <= window {
                        windows.resize(window + 1, 0);
                    }
                    windows[window] += WRITE_BYTES as u64;
                    if let Some((at, before)) = cut {
                        if recovered_at.is_none() && !in_flight.iter().any(|(m, _)| *m <= before) && submitted > before
                        {
                            recovered_at = Some(start.elapsed().max(at));
                        }
                    }
                    progressed = true;
                }
                None => i += 1,
            }
        }
        if cut.is_none() && done_bytes >= TOTAL_BYTES / 4 {
            ip(&["-n", &a_ns, "link", "set", "v1", "down"]).expect("take v1 down");
            cut = Some((start.elapsed(), submitted));
        }
        if !progressed {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let elapsed = start.elapsed();
    let (cut_at, _) = cut.expect("the cut happened");
    let run = Run { windows, cut_at, recovered_at: recovered_at.unwrap_or(cut_at), elapsed };
    print_table(&run);
    let stats = a.stats();
    let failovers: u64 = stats.lanes.iter().map(|l| l.failovers).sum();
    let tx_errors: u64 = stats.lanes.iter().map(|l| l.tx_errors).sum();
    let cut_offs: u64 = stats.lanes.iter().map(|l| l.lane_cut_offs).sum();
    println!("sender: lane cut-offs {cut_offs}, parts failed over {failovers}, send errors {tx_errors}");

    let mut landed = vec![0u8; REGION_BYTES];
    dst.read_at(0, &mut landed).unwrap();
    assert!(landed == pattern, "the destination differs from the source after the failover");
    drop((a, b));
    drop(namespaces);
}

/// Prints one row per window and the mean bandwidth of each phase.
fn print_table(run: &Run) {
    let gbps = |bytes: u64, over: Duration| bytes as f64 / over.as_secs_f64() / 1e9;
    let phase = |w: usize| {
        let end = WINDOW * (w as u32 + 1);
        if end <= run.cut_at {
            "before"
        } else if WINDOW * w as u32 <= run.recovered_at {
            "during"
        } else {
            "after"
        }
    };
    println!(
        "window  t_s    GB/s  phase   (cut at {:.2} s; recovered at {:.2} s; engine defaults: \
         idle timeout {:?}, lane cut-off after {:?})",
        run.cut_at.as_secs_f64(),
        run.recovered_at.as_secs_f64(),
        EngineConfig::default().idle_timeout,
        accord_engine::LANE_CUT_OFF_AFTER
    );
    for (w, bytes) in run.windows.iter().enumerate() {
        println!("{w:>6} {:>5.1} {:>7.2}  {}", w as f64 * WINDOW.as_secs_f64(), gbps(*bytes, WINDOW), phase(w));
    }
    let mean = |name: &str| {
        let (n, bytes) = run
            .windows
            .iter()
            .enumerate()
            .filter(|(w, _)| phase(*w) == name)
            .fold((0u32, 0u64), |(n, s), (_, b)| (n + 1, s + b));
        (n > 0).then(|| gbps(bytes, WINDOW * n))
    };
    let before = mean("before");
    for name in ["before", "during", "after"] {
        match (mean(name), before) {
            (Some(g), Some(b)) => println!("{name:>7}: {g:.2} GB/s ({:.0}% of before)", 100.0 * g / b),
            (Some(g), None) => println!("{name:>7}: {g:.2} GB/s"),
            _ => println!("{name:>7}: no window"),
        }
    }
    println!("total: {:.2} GB/s over {:.2} s", gbps(TOTAL_BYTES, run.elapsed), run.elapsed.as_secs_f64());
}
