//! The CUDA header `include/accord/device.cuh` against `layout.rs`: a tiny C++ program that
//! includes the header is built with the host compiler (`$CXX`, else `c++`, `g++`, `clang++`)
//! and prints the size of every struct and the offset and size of every field, plus the
//! header's constants; each line must equal what Rust's `offset_of!`/`size_of` say of the same
//! field. A field added, removed, reordered or resized on either side fails the test. Skips with
//! a printed reason when no host C++ compiler is installed.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of, size_of_val};
use std::path::{Path, PathBuf};
use std::process::Command;

use accord_device::layout::{
    Descriptor, DeviceTable, Op, RingControl, RingDevice, SignalOp, WindowEntry, DESCRIPTOR_BYTES, FLAG_COUNTER,
    LAYOUT_VERSION,
};

/// Every field the header must mirror: (struct, field) -> (offset, size), from Rust.
fn rust_layout() -> BTreeMap<String, (usize, usize)> {
    let mut m = BTreeMap::new();
    macro_rules! fields {
        ($ty:ident: $($field:ident),+) => {{
            let v = $ty::default();
            m.insert(format!("{}.SIZE", stringify!($ty)), (0, size_of::<$ty>()));
            m.insert(format!("{}.ALIGN", stringify!($ty)), (0, std::mem::align_of::<$ty>()));
            $(m.insert(
                format!("{}.{}", stringify!($ty), stringify!($field)),
                (offset_of!($ty, $field), size_of_val(&v.$field)),
            );)+
        }};
    }
    fields!(Descriptor: seq, op, signal_op, flags, peer, window, src_window, dst_offset, src_offset, bytes,
        signal_id, counter_id, signal_value);
    // RingControl's padding is private in Rust; its size (three lines) pins it down.
    fields!(RingControl: consumed, completed, error);
    fields!(RingDevice: slots, control, reserved, cached_consumed, slot_count, _pad);
    fields!(WindowEntry: local_base, bytes, peer_bases);
    fields!(DeviceTable: layout_version, rank, world, ring_count, signal_count, counter_count, window_count,
        readable_windows, rings, signals, signal_bases, counters, windows, peer_signals, barrier_epoch);
    m
}

/// Constants the header must agree on, from Rust.
fn rust_constants() -> BTreeMap<String, u64> {
    [
        ("LAYOUT_VERSION", u64::from(LAYOUT_VERSION)),
        ("DESCRIPTOR_BYTES", DESCRIPTOR_BYTES as u64),
        ("OP_PUT", Op::Put as u64),
        ("OP_PUT_VALUE", Op::PutValue as u64),
        ("OP_SIGNAL", Op::Signal as u64),
        ("SIGNAL_NONE", SignalOp::None as u64),
        ("SIGNAL_ADD", SignalOp::Add as u64),
        ("SIGNAL_SET", SignalOp::Set as u64),
        ("FLAG_COUNTER", u64::from(FLAG_COUNTER)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The C++ program: one `F struct.field offset size` line per field, `F struct.SIZE 0 size`,
/// `C name value` per constant, `V version`.
const PROGRAM: &str = r#"
#include <accord/device.cuh>
#include <cstdio>
using namespace accord::device;
#define F(T, f) std::printf("F %s.%s %zu %zu\n", #T, #f, offsetof(T, f), sizeof(((T*)0)->f))
#define S(T) std::printf("F %s.SIZE 0 %zu\nF %s.ALIGN 0 %zu\n", #T, sizeof(T), #T, alignof(T))
#define C(x) std::printf("C %s %llu\n", #x, (unsigned long long)(x))
int main() {
  S(Descriptor); F(Descriptor, seq); F(Descriptor, op); F(Descriptor, signal_op); F(Descriptor, flags);
  F(Descriptor, peer); F(Descriptor, window); F(Descriptor, src_window); F(Descriptor, dst_offset);
  F(Descriptor, src_offset); F(Descriptor, bytes); F(Descriptor, signal_id); F(Descriptor, counter_id);
  F(Descriptor, signal_value);
  S(RingControl); F(RingControl, consumed); F(RingControl, completed); F(RingControl, error);
  S(RingDevice); F(RingDevice, slots); F(RingDevice, control); F(RingDevice, reserved);
  F(RingDevice, cached_consumed); F(RingDevice, slot_count); F(RingDevice, _pad);
  S(WindowEntry); F(WindowEntry, local_base); F(WindowEntry, bytes); F(WindowEntry, peer_bases);
  S(DeviceTable); F(DeviceTable, layout_version); F(DeviceTable, rank); F(DeviceTable, world);
  F(DeviceTable, ring_count); F(DeviceTable, signal_count); F(DeviceTable, counter_count);
  F(DeviceTable, window_count); F(DeviceTable, readable_windows);
  F(DeviceTable, rings); F(DeviceTable, signals);
  F(DeviceTable, signal_bases); F(DeviceTable, counters); F(DeviceTable, windows);
  F(DeviceTable, peer_signals); F(DeviceTable, barrier_epoch);
  std::printf("C LAYOUT_VERSION %d\n", ACCORD_DEVICE_LAYOUT_VERSION); C(DESCRIPTOR_BYTES); C(OP_PUT); C(OP_PUT_VALUE); C(OP_SIGNAL);
  C(SIGNAL_NONE); C(SIGNAL_ADD); C(SIGNAL_SET); C(FLAG_COUNTER);
  std::printf("V %s\n", ACCORD_VERSION_STRING);
  return 0;
}
"#;

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// The first host C++ compiler that answers `--version`.
fn compiler() -> Option<String> {
    let candidates = std::env::var("CXX").ok().into_iter().chain(["c++", "g++", "clang++"].map(String::from));
    candidates.into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// A fresh folder for this test's files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("accord-header-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds `source` with the header on the include path, `-Werror`, and runs it.
fn build_and_run(cxx: &str, scratch: &Scratch, source: &str, std: &str) -> Result<String, String> {
    let src = scratch.0.join("layout.cpp");
    let exe = scratch.0.join("layout");
    std::fs::write(&src, source).map_err(|e| e.to_string())?;
    let built = Command::new(cxx)
        .args([&format!("-std={std}"), "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(include_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("{cxx}: {e}"))?;
    if !built.status.success() {
        return Err(format!("{cxx} -std={std} failed:\n{}", String::from_utf8_lossy(&built.stderr)));
    }
    let ran = Command::new(&exe).output().map_err(|e| e.to_string())?;
    if !ran.status.success() {
        return Err(format!("the layout program exited with {}", ran.status));
    }
    Ok(String::from_utf8_lossy(&ran.stdout).into_owned())
}

struct HeaderFacts {
    fields: BTreeMap<String, (usize, usize)>,
    constants: BTreeMap<String, u64>,
    version: String,
}

fn parse(output: &str) -> HeaderFacts {
    let mut facts = HeaderFacts { fields: BTreeMap::new(), constants: BTreeMap::new(), version: String::new() };
    for line in output.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["F", name, offset, size] => {
                let parsed = (offset.parse().expect("offset"), size.parse().expect("size"));
                assert!(facts.fields.insert(name.to_string(), parsed).is_none(), "{name} printed twice");
            }
            ["C", name, value] => {
                facts.constants.insert(name.to_string(), value.parse().expect("constant"));
            }
            ["V", version] => facts.version = version.to_string(),
            _ => panic!("unexpected line from the layout program: {line:?}"),
        }
    }
    facts
}

/// Names whose (offset, size) differ, or that only one side has, in name order.
fn differences(rust: &BTreeMap<String, (usize, usize)>, header: &BTreeMap<String, (usize, usize)>) -> Vec<String> {
    let names: std::collections::BTreeSet<&String> = rust.keys().chain(header.keys()).collect();
    names.into_iter().filter(|n| rust.get(*n) != header.get(*n)).cloned().collect()
}

#[test]
fn header_layout_matches_layout_rs_field_for_field() {
    let Some(cxx) = compiler() else {
        println!("skipped: no host C++ compiler ($CXX, c++, g++, clang++) to build the header with");
        return;
    };
    let scratch = Scratch::new("layout");
    let facts = parse(&build_and_run(&cxx, &scratch, PROGRAM, "c++17").unwrap_or_else(|e| panic!("{e}")));
    let rust = rust_layout();
    let differ = differences(&rust, &facts.fields);
    let detail: Vec<String> = differ
        .iter()
        .map(|name| {
            format!("{name}: layout.rs (offset, size) {:?}, header {:?}", rust.get(name), facts.fields.get(name))
        })
        .collect();
    assert!(differ.is_empty(), "the header and layout.rs disagree:\n{}", detail.join("\n"));
    assert_eq!(facts.constants, rust_constants(), "constants differ between the header and layout.rs");
    assert_eq!(facts.version, env!("CARGO_PKG_VERSION"), "the header's version string is not the workspace version");
}

/// The header is usable from C++11 host code too (only the types and constants are visible
/// there), without warnings.
#[test]
fn header_compiles_as_plain_cpp11_without_device_code() {
    let Some(cxx) = compiler() else {
        println!("skipped: no host C++ compiler to build the header with");
        return;
    };
    let scratch = Scratch::new("cpp11");
    let source = "#include <accord/device.cuh>\nint main() { accord::device::Descriptor d = {}; \
                  return (int)d.op + (int)sizeof(accord::device::DeviceTable) - 88; }\n";
    let out = build_and_run(&cxx, &scratch, source, "c++11");
    assert_eq!(out, Ok(String::new()));
}

/// The check itself can fail: the same program built against a copy of the header whose
/// `window` and `src_window` swapped places reports exactly those two fields.
#[test]
fn a_drifted_field_is_reported() {
    let Some(cxx) = compiler() else {
        println!("skipped: no host C++ compiler to build the header with");
        return;
    };
    let scratch = Scratch::new("drift");
    let header = std::fs::read_to_string(include_dir().join("accord/device.cuh")).expect("header");
    let (a, b) = ("  u32 window;", "  u32 src_window;");
    let line_of = |needle: &str| header.lines().find(|l| l.starts_with(needle)).expect("field line").to_string();
    let (la, lb) = (line_of(a), line_of(b));
    let drifted = header.replacen(&la, "@A@", 1).replacen(&lb, &la, 1).replacen("@A@", &lb, 1);
    assert_ne!(drifted, header);
    std::fs::create_dir_all(scratch.0.join("include/accord")).expect("folder");
    std::fs::write(scratch.0.join("include/accord/device.cuh"), drifted).expect("drifted header");
    let program = PROGRAM.replace("#include <accord/device.cuh>", "#include \"include/accord/device.cuh\"");
    let facts = parse(&build_and_run(&cxx, &scratch, &program, "c++17").unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(differences(&rust_layout(), &facts.fields), ["Descriptor.src_window", "Descriptor.window"]);
}

/// The words the header's producer stores into a slot (`pack_body`, bytes 8..63) are exactly
/// the bytes of layout.rs's `Descriptor` with the same fields: every field lands where the
/// proxy reads it. Each field gets a value whose bytes are all distinct.
#[test]
fn the_producers_packing_matches_the_rust_descriptor() {
    let Some(cxx) = compiler() else {
        println!("skipped: no host C++ compiler to build the header with");
        return;
    };
    let d = Descriptor {
        seq: 0,
        op: 0x11,
        signal_op: 0x22,
        flags: 0x4433,
        peer: 0x8877_6655,
        window: 0xccbb_aa99,
        src_window: 0x00ff_eedd,
        dst_offset: 0x0807_0605_0403_0201,
        src_offset: 0x1817_1615_1413_1211,
        bytes: 0x2827_2625_2423_2221,
        signal_id: 0x3433_3231,
        counter_id: 0x3837_3635,
        signal_value: 0x4847_4645_4443_4241,
    };
    let program = format!(
        r#"
#include <accord/device.cuh>
#include <cstdio>
using namespace accord::device;
int main() {{
  Descriptor d = {{}};
  d.op = {}; d.signal_op = {}; d.flags = {}; d.peer = {}u; d.window = {}u; d.src_window = {}u;
  d.dst_offset = {}ull; d.src_offset = {}ull; d.bytes = {}ull; d.signal_id = {}u; d.counter_id = {}u;
  d.signal_value = {}ull;
  u64 words[7];
  pack_body(d, words);
  for (int i = 0; i < 7; ++i) std::printf("%llu\n", (unsigned long long)words[i]);
  return 0;
}}
"#,
        d.op,
        d.signal_op,
        d.flags,
        d.peer,
        d.window,
        d.src_window,
        d.dst_offset,
        d.src_offset,
        d.bytes,
        d.signal_id,
        d.counter_id,
        d.signal_value
    );
    let scratch = Scratch::new("pack");
    let out = build_and_run(&cxx, &scratch, &program, "c++17").unwrap_or_else(|e| panic!("{e}"));
    let packed: Vec<u8> = out.lines().flat_map(|l| l.trim().parse::<u64>().expect("a word").to_le_bytes()).collect();
    // The Rust descriptor's own bytes, field by field at layout.rs's offsets.
    let mut expected = [0u8; DESCRIPTOR_BYTES];
    let mut put = |offset: usize, bytes: &[u8]| expected[offset..offset + bytes.len()].copy_from_slice(bytes);
    put(offset_of!(Descriptor, op), &[d.op]);
    put(offset_of!(Descriptor, signal_op), &[d.signal_op]);
    put(offset_of!(Descriptor, flags), &d.flags.to_le_bytes());
    put(offset_of!(Descriptor, peer), &d.peer.to_le_bytes());
    put(offset_of!(Descriptor, window), &d.window.to_le_bytes());
    put(offset_of!(Descriptor, src_window), &d.src_window.to_le_bytes());
    put(offset_of!(Descriptor, dst_offset), &d.dst_offset.to_le_bytes());
    put(offset_of!(Descriptor, src_offset), &d.src_offset.to_le_bytes());
    put(offset_of!(Descriptor, bytes), &d.bytes.to_le_bytes());
    put(offset_of!(Descriptor, signal_id), &d.signal_id.to_le_bytes());
    put(offset_of!(Descriptor, counter_id), &d.counter_id.to_le_bytes());
    put(offset_of!(Descriptor, signal_value), &d.signal_value.to_le_bytes());
    assert_eq!(packed.len(), DESCRIPTOR_BYTES - 8);
    assert_eq!(packed, expected[8..], "the header packs a descriptor differently from layout.rs");
}
