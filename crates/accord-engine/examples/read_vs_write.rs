//! READ against WRITE between two processes of this host, one operation at a time, alternated
//! in one run: `cargo run --release -p accord-engine --example read_vs_write [iterations]`.
//! Prints, per size, the median time from submission to completion (a write completes when the
//! peer acknowledged its bytes, a read when its bytes landed here) and the bytes per second of
//! that median. Engines take their `ACCORD_*` settings from the environment (e.g. `ACCORD_CMA=1`).
use accord_engine::{Engine, EngineAddress, MrDescriptor, ReadOp, WriteOp};
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SIZES: [usize; 6] = [64, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
const MAX: usize = 64 << 20;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::builder().build()?;
    let buf = engine.alloc(MAX)?;
    if std::env::var("READ_VS_WRITE_PEER").is_ok() {
        // The peer: prints where to read and write, learns the other engine, waits for EOF.
        println!("{}\n{}", engine.address().to_string_compact(), buf.descriptor().to_string_compact());
        std::io::stdout().flush()?;
        let mut lines = std::io::stdin().lock().lines();
        engine.add_peer(&EngineAddress::parse(&lines.next().ok_or("no address")??)?)?;
        for _ in lines {}
        return Ok(());
    }
    let iterations: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(200);
    let exe = std::env::current_exe()?;
    let mut child =
        Command::new(exe).env("READ_VS_WRITE_PEER", "1").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    let mut lines = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let peer = EngineAddress::parse(&lines.next().ok_or("peer said nothing")??)?;
    let remote = MrDescriptor::parse(&lines.next().ok_or("peer sent no descriptor")??)?;
    engine.add_peer(&peer)?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    writeln!(stdin, "{}", engine.address().to_string_compact())?;
    stdin.flush()?;
    buf.write_at(0, &(0..MAX).map(|i| (i % 251) as u8).collect::<Vec<_>>())?;
    let h = buf.handle();
    // The peer learns our address asynchronously: the first reads may find it not yet added.
    let warm = ReadOp { dst: &h, dst_offset: 0, src: &remote, src_offset: 0, len: 64, imm: None };
    let until = Instant::now() + Duration::from_secs(10);
    while engine.read(&warm)?.wait_timeout(Duration::from_secs(10)).is_err() && Instant::now() < until {}
    println!("size_bytes\twrite_median_us\tread_median_us\twrite_GBps\tread_GBps");
    for len in SIZES {
        let (len64, n) = (len as u64, if len >= 16 << 20 { iterations.min(20) } else { iterations });
        let write = WriteOp { src: &h, src_offset: 0, dst: &remote, dst_offset: 0, len: len64, imm: None };
        let read = ReadOp { dst: &h, dst_offset: 0, src: &remote, src_offset: 0, len: len64, imm: None };
        let (mut w, mut r) = (vec![], vec![]);
        for _ in 0..n {
            let t = Instant::now();
            engine.write(&write)?.wait_timeout(Duration::from_secs(30))?;
            w.push(t.elapsed());
            let t = Instant::now();
            engine.read(&read)?.wait_timeout(Duration::from_secs(30))?;
            r.push(t.elapsed());
        }
        let (w, r) = (median(w), median(r));
        let gbps = |d: Duration| len as f64 / d.as_secs_f64() / 1e9;
        println!("{len}\t{:.1}\t{:.1}\t{:.2}\t{:.2}", w.as_secs_f64() * 1e6, r.as_secs_f64() * 1e6, gbps(w), gbps(r));
    }
    drop(stdin);
    child.wait()?;
    Ok(())
}
