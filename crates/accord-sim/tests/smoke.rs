use accord_proto::cc::CcKind;
use accord_sim::scenarios::{loss_sweep, path_cut, ScenarioConfig};

#[test]
#[ignore]
fn smoke_experiments() {
    let cfg = ScenarioConfig { seed: 1, bytes: 8 << 20, paths: 8, cc: CcKind::from_name("cubic").unwrap() };
    let t = std::time::Instant::now();
    let rows = loss_sweep(&cfg, &[0.0, 1.0 / 256.0, 1.0 / 64.0]).unwrap();
    for r in rows {
        println!("{r:?}");
    }
    println!("sweep {:?}", t.elapsed());
    let r = path_cut(&ScenarioConfig { bytes: 32 << 20, ..cfg }).unwrap();
    println!("{r:?} {:?}", t.elapsed());
}
