//! The NCCL plugin's in-flight dumps (`plugin-inflight-*.json`, written by
//! `accord_nccl_net::inflight` when NCCL aborts, a request fails, or on `SIGUSR1`), read beside
//! the collectives' stuck reports: one line per process that names the peer it waits on, and
//! whether that peer left a dump of its own (a peer that wrote none is dead, stopped or hung).

use serde::Deserialize;
use std::collections::BTreeMap;

/// The `kind` a plugin dump carries.
pub const DUMP_KIND: &str = "accord-plugin-inflight";

/// The fields of a plugin dump the doctor reads (the plugin writes more).
#[derive(Clone, Debug, Deserialize)]
pub struct PluginDump {
    /// The process that wrote it.
    pub pid: u32,
    /// Its engine id.
    pub engine: String,
    /// Why it was written.
    pub reason: String,
    /// When (ms since the Unix epoch).
    pub unix_ms: u64,
    /// Requests in flight, oldest first.
    pub requests: Vec<PluginRequest>,
}

/// One request of a plugin dump.
#[derive(Clone, Debug, Deserialize)]
pub struct PluginRequest {
    /// `send` or `recv`.
    pub direction: String,
    /// `clear_to_send`, `writes_to_land` or `data`.
    pub waiting: String,
    /// The peer's engine id.
    pub peer: String,
    /// Bytes.
    pub bytes: u64,
    /// Milliseconds since posted.
    pub age_ms: u64,
}

/// Whether a parsed JSON document is a plugin dump.
pub fn is_plugin_dump(value: &serde_json::Value) -> bool {
    value.get("kind").and_then(|k| k.as_str()) == Some(DUMP_KIND)
}

/// One line per process (the latest dump of each): what it waits on, and from whom.
pub fn diagnose(dumps: &[PluginDump]) -> Vec<String> {
    let mut latest: BTreeMap<u32, &PluginDump> = BTreeMap::new();
    for d in dumps {
        if latest.get(&d.pid).is_none_or(|old| old.unix_ms < d.unix_ms) {
            latest.insert(d.pid, d);
        }
    }
    let pid_of_engine: BTreeMap<&str, u32> = latest.values().map(|d| (d.engine.as_str(), d.pid)).collect();
    latest
        .values()
        .map(|d| {
            let head = format!("process {} (NCCL plugin, engine {}; {})", d.pid, d.engine, d.reason);
            let Some(oldest) = d.requests.first() else {
                return format!("{head}: nothing in flight");
            };
            let mut by_peer: BTreeMap<&str, usize> = BTreeMap::new();
            for r in &d.requests {
                *by_peer.entry(r.peer.as_str()).or_default() += 1;
            }
            let peers: Vec<String> = by_peer
                .iter()
                .map(|(peer, n)| {
                    let who = match pid_of_engine.get(peer) {
                        Some(pid) => format!("process {pid}, which left a dump too"),
                        None => "no dump from it: dead, stopped or hung".to_string(),
                    };
                    format!("engine {peer} ({n} request(s); {who})")
                })
                .collect();
            format!(
                "{head}: {} request(s) in flight, oldest a {} of {} B waiting for {} for {} ms; waits on {}",
                d.requests.len(),
                oldest.direction,
                oldest.bytes,
                oldest.waiting.replace('_', " "),
                oldest.age_ms,
                peers.join(", ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(pid: u32, engine: &str, peer: &str, unix_ms: u64) -> PluginDump {
        PluginDump {
            pid,
            engine: engine.into(),
            reason: "test failed: peer died".into(),
            unix_ms,
            requests: vec![PluginRequest {
                direction: "recv".into(),
                waiting: "data".into(),
                peer: peer.into(),
                bytes: 4096,
                age_ms: 5200,
            }],
        }
    }

    #[test]
    fn names_the_peer_and_whether_it_left_a_dump() {
        let lines = diagnose(&[dump(10, "aa", "bb", 1), dump(11, "bb", "cc", 1)]);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("process 10") && lines[0].contains("engine bb"), "{}", lines[0]);
        assert!(lines[0].contains("process 11, which left a dump too"), "{}", lines[0]);
        assert!(lines[1].contains("engine cc") && lines[1].contains("no dump from it"), "{}", lines[1]);
        assert!(lines[0].contains("a recv of 4096 B waiting for data for 5200 ms"), "{}", lines[0]);
    }

    #[test]
    fn the_latest_dump_of_a_process_wins() {
        let mut old = dump(10, "aa", "bb", 1);
        old.reason = "the earlier dump".into();
        let lines = diagnose(&[old, dump(10, "aa", "bb", 2)]);
        assert_eq!(lines.len(), 1);
        assert!(!lines[0].contains("the earlier dump"), "{}", lines[0]);
    }

    #[test]
    fn a_plugin_dump_is_told_from_a_stuck_report_by_its_kind() {
        let v: serde_json::Value = serde_json::json!({"kind": DUMP_KIND, "pid": 1});
        assert!(is_plugin_dump(&v));
        assert!(!is_plugin_dump(&serde_json::json!({"comm": "c0", "rank": 0})));
    }
}
