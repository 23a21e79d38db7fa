use super::*;

#[test]
fn factors_match_nccl_tests() {
    assert_eq!(busbw_factor(Collective::AllReduce, 8), 1.75);
    assert_eq!(busbw_factor(Collective::AllGather, 4), 0.75);
    assert_eq!(busbw_factor(Collective::ReduceScatter, 2), 0.5);
    assert_eq!(busbw_factor(Collective::AllToAll, 4), 0.75);
    assert_eq!(busbw_factor(Collective::Broadcast, 16), 1.0);
    assert_eq!(busbw_factor(Collective::Reduce, 16), 1.0);
    assert_eq!(busbw_factor(Collective::SendRecv, 2), 1.0);
    assert_eq!(busbw_factor(Collective::AllReduce, 1), 0.0);
}

#[test]
fn bandwidths() {
    // 1 GB in 1 s = 1 GB/s algbw; all_reduce on 4 ranks = 1.5 GB/s busbw.
    assert!((algbw_gbps(1_000_000_000, 1e6) - 1.0).abs() < 1e-12);
    assert!((busbw_gbps(Collective::AllReduce, 4, 1_000_000_000, 1e6) - 1.5).abs() < 1e-12);
    assert_eq!(algbw_gbps(10, 0.0), 0.0);
}

#[test]
fn table_and_json_shapes() {
    let t = BenchTable {
        collective: "all_reduce".into(),
        dtype: "float".into(),
        redop: "sum".into(),
        root: -1,
        rows: vec![BenchRow::new(Collective::AllReduce, 2, 1024, 256, 10.0, 0)],
    };
    let text = t.to_text();
    for col in ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "float", "sum"] {
        assert!(text.contains(col), "{col} missing from\n{text}");
    }
    let v: serde_json::Value = serde_json::from_str(&t.to_json()).unwrap();
    assert_eq!(v["collective"], "all_reduce");
    let row = &v["rows"][0];
    assert_eq!(row["bytes"], 1024);
    assert_eq!(row["wrong"], 0);
    assert!((row["algbw_gbps"].as_f64().unwrap() - 0.1024).abs() < 1e-9);
    assert!((row["busbw_gbps"].as_f64().unwrap() - 0.1024).abs() < 1e-9);
    assert!(row.get("time_us").is_some());
    assert_eq!(row.as_object().unwrap().len(), 5);
}
