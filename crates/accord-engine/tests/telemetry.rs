//! Telemetry end to end: two engines talk over the network path; the metrics endpoint is
//! scraped over HTTP and its Prometheus text parsed, and the trace file written at drop is
//! loaded as JSON with one complete event per transfer.

mod telemetry_pair;

use accord_engine::WriteOp;

const WRITES: usize = 20;

/// Parses the text exposition with a Prometheus text parser (`prometheus-parse`). That
/// parser skips what it cannot read, so each line is first checked to be a comment, a `# TYPE`
/// or `# HELP` line, or a sample with a number; and every sample must belong to a typed family
/// (a histogram's `_sum` and `_count` come out untyped from this parser).
fn parse(body: &str) -> prometheus_parse::Scrape {
    use prometheus_parse::LineInfo;
    for line in body.lines() {
        match LineInfo::parse(line) {
            LineInfo::Sample { value, .. } => {
                let number = value.parse::<f64>().is_ok() || matches!(value, "+Inf" | "-Inf" | "NaN");
                assert!(number, "not a number in {line:?}");
            }
            LineInfo::Ignored => assert!(line.starts_with('#'), "unreadable line {line:?}"),
            LineInfo::Doc { .. } | LineInfo::Type { .. } | LineInfo::Empty => {}
        }
    }
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text");
    for sample in &scrape.samples {
        let histogram_part = sample.metric.ends_with("_sum") || sample.metric.ends_with("_count");
        assert!(
            histogram_part || !matches!(sample.value, prometheus_parse::Value::Untyped(_)),
            "{} has no # TYPE line in:\n{body}",
            sample.metric
        );
    }
    scrape
}

/// The samples of `metric` whose labels include every (name, value) of `with`.
fn samples<'a>(
    scrape: &'a prometheus_parse::Scrape,
    metric: &str,
    with: &[(&str, &str)],
) -> Vec<&'a prometheus_parse::Sample> {
    let matches =
        |s: &&prometheus_parse::Sample| s.metric == metric && with.iter().all(|(k, v)| s.labels.get(k) == Some(*v));
    scrape.samples.iter().filter(matches).collect()
}

#[test]
fn metrics_are_scraped_and_the_trace_loads_as_json() {
    let (a, b, trace) = telemetry_pair::recording_pair("test");
    let src = a.alloc(1 << 20).unwrap();
    let dst = b.alloc(1 << 20).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    for _ in 0..WRITES {
        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 1 << 20, imm: None };
        a.write(&op).unwrap().wait().unwrap();
    }
    let addr = a.metrics_addr().expect("the endpoint is up");
    let scrape = parse(&telemetry_pair::scrape(addr));
    let peer = format!("{:016x}", b.id().0);
    let sent: f64 = samples(&scrape, "accord_peer_bytes_sent_total", &[("peer", &peer)])
        .into_iter()
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) => v,
            ref other => panic!("bytes sent is a counter, not {other:?}"),
        })
        .sum();
    assert!(sent >= (WRITES << 20) as f64, "bytes sent to b: {sent}");
    let rtt =
        samples(&scrape, "accord_path_rtt_seconds", &[("peer", &peer)]).first().copied().expect("a per-path RTT gauge");
    assert!(matches!(rtt.value, prometheus_parse::Value::Gauge(_)), "{rtt:?}");
    assert!(rtt.labels.get("lane").is_some() && rtt.labels.get("path").is_some(), "{rtt:?}");
    let latency = samples(&scrape, "accord_op_latency_seconds", &[("op", "transfer")])
        .first()
        .copied()
        .expect("transfer latencies");
    let prometheus_parse::Value::Histogram(buckets) = &latency.value else { panic!("{latency:?} is not a histogram") };
    let all = buckets.iter().find(|b| b.less_than == f64::INFINITY).expect("a +Inf bucket");
    assert_eq!(all.count, WRITES as f64, "every transfer counted");
    assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count), "cumulative buckets: {buckets:?}");
    let count =
        samples(&scrape, "accord_op_latency_seconds_count", &[("op", "transfer")]).first().copied().expect("a count");
    assert_eq!(count.value, prometheus_parse::Value::Untyped(WRITES as f64));
    drop(a);
    let text = std::fs::read_to_string(&trace).expect("the trace file was written at drop");
    let _ = std::fs::remove_file(&trace);
    let json: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let transfers = events.iter().filter(|e| e["name"] == "transfer" && e["ph"] == "X").count();
    assert_eq!(transfers, WRITES, "one complete event per transfer");
    assert!(events.iter().all(|e| e["ts"].is_u64() && e["dur"].is_u64()));
}
