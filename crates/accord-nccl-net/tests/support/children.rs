//! Shared by the two-process test harness and the `plugin_bench` example: both run two copies
//! of themselves as the plugin's ranks and read what they print.

use std::io::{BufRead, BufReader, Write};
use std::process::Child;
use std::sync::mpsc::{self, Receiver};

/// Every stdout line of each child as `(rank, Some(line))`, then `(rank, None)` at its end;
/// read to the end so no child writes into a closed pipe.
pub fn stdout_lines(children: &mut [Child]) -> Receiver<(usize, Option<String>)> {
    let (tx, rx) = mpsc::channel();
    for (rank, child) in children.iter_mut().enumerate() {
        let out = BufReader::new(child.stdout.take().expect("children are spawned with piped stdout"));
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send((rank, Some(line)));
            }
            let _ = tx.send((rank, None));
        });
    }
    rx
}

/// Hands each of the two ranks the other's connection handle once both are known.
pub fn exchange_handles(handles: &[Option<String>], children: &mut [Child]) {
    if let [Some(h0), Some(h1)] = handles {
        writeln!(children[0].stdin.as_mut().expect("piped stdin"), "{h1}").unwrap();
        writeln!(children[1].stdin.as_mut().expect("piped stdin"), "{h0}").unwrap();
    }
}
