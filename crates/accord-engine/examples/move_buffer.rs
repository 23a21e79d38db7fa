//! Moves a 64 MiB buffer between two processes: `cargo run --release --example move_buffer`.
use accord_engine::{Engine, EngineAddress, MrDescriptor, WriteOp};
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

const LEN: usize = 64 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::builder().build()?;
    if std::env::var("MOVE_BUFFER_RECEIVER").is_ok() {
        let buf = engine.alloc(LEN)?; // receiver: print where to write, wait for the immediate
        println!("{}\n{}", engine.address().to_string_compact(), buf.descriptor().to_string_compact());
        engine.imm_counter(1).wait(1, Duration::from_secs(30));
        let ok = buf.to_vec().iter().enumerate().all(|(i, b)| *b == (i % 251) as u8);
        println!("received {LEN} bytes, intact: {ok}");
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe).env("MOVE_BUFFER_RECEIVER", "1").stdout(Stdio::piped()).spawn()?;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let peer = EngineAddress::parse(&lines.next().unwrap()?)?;
    let dst = MrDescriptor::parse(&lines.next().unwrap()?)?;
    engine.add_peer(&peer)?;
    let src = engine.alloc(LEN)?;
    src.write_at(0, &(0..LEN).map(|i| (i % 251) as u8).collect::<Vec<_>>())?;
    let op = WriteOp { src: &src.handle(), src_offset: 0, dst: &dst, dst_offset: 0, len: LEN as u64, imm: Some(1) };
    let start = std::time::Instant::now();
    engine.write(&op)?.wait()?;
    println!("wrote {LEN} bytes in {:?}; peer says: {}", start.elapsed(), lines.next().unwrap()?);
    std::io::stdout().flush()?;
    child.wait()?;
    Ok(())
}
