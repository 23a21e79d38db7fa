use super::*;
use std::os::unix::fs::symlink;

/// A fake host: `proc/driver/nvidia/gpus/<bus id>` per GPU and a sysfs tree under `sys/`, with
/// GPU 0000:00:06.0 on the root bus (as on the 2xH200 host) and GPU 0000:41:00.0 behind two
/// bridges (a switch's downstream port under a root port), each linked from `bus/pci/devices`.
struct FakeHost {
    dir: PathBuf,
}

impl FakeHost {
    fn new(name: &str) -> FakeHost {
        let dir = std::env::temp_dir().join(format!("accord-placement-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let gpus = dir.join("proc/driver/nvidia/gpus");
        let devices = dir.join("sys/devices/pci0000:00");
        let deep = devices.join("0000:00:01.0/0000:40:00.0/0000:41:00.0");
        std::fs::create_dir_all(devices.join("0000:00:06.0")).unwrap();
        std::fs::create_dir_all(&deep).unwrap();
        let links = dir.join("sys/bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        symlink("../../../devices/pci0000:00/0000:00:06.0", links.join("0000:00:06.0")).unwrap();
        symlink("../../../devices/pci0000:00/0000:00:01.0/0000:40:00.0/0000:41:00.0", links.join("0000:41:00.0"))
            .unwrap();
        for id in ["0000:41:00.0", "0000:00:06.0"] {
            std::fs::create_dir_all(gpus.join(id)).unwrap();
        }
        std::fs::write(gpus.join("README"), "not a GPU").unwrap();
        FakeHost { dir }
    }
    fn gpus(&self) -> PathBuf {
        self.dir.join("proc/driver/nvidia/gpus")
    }
    fn sys(&self) -> PathBuf {
        self.dir.join("sys")
    }
    fn real(&self, rel: &str) -> PathBuf {
        std::fs::canonicalize(self.sys()).unwrap().join(rel)
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn bus_ids_are_pci_addresses_only() {
    assert!(is_bus_id("0000:00:06.0"));
    assert!(is_bus_id("0001:af:1f.7"));
    for bad in ["pci0000:00", "0000:00:06", "0000-00:06.0", "0000:00:06.0x", "000g:00:06.0", ""] {
        assert!(!is_bus_id(bad), "{bad}");
    }
}

#[test]
fn gpus_are_listed_by_bus_id_and_a_host_without_the_driver_has_none() {
    let host = FakeHost::new("list");
    assert_eq!(gpu_bus_ids(&host.gpus()), ["0000:00:06.0", "0000:41:00.0"]);
    assert!(gpu_bus_ids(&host.dir.join("nowhere")).is_empty());
}

#[test]
fn the_gpu_placement_is_the_real_sysfs_path_and_the_bridge_its_pci_parent() {
    let host = FakeHost::new("walk");
    let sys = host.sys();
    assert_eq!(
        pci_path(&sys, "0000:41:00.0", PciPlacement::Gpu),
        Some(host.real("devices/pci0000:00/0000:00:01.0/0000:40:00.0/0000:41:00.0"))
    );
    assert_eq!(
        pci_path(&sys, "0000:41:00.0", PciPlacement::Bridge),
        Some(host.real("devices/pci0000:00/0000:00:01.0/0000:40:00.0"))
    );
    assert_eq!(pci_path(&sys, "0000:00:06.0", PciPlacement::Gpu), Some(host.real("devices/pci0000:00/0000:00:06.0")));
    assert_eq!(pci_path(&sys, "0000:00:06.0", PciPlacement::Bridge), None, "a GPU on the root bus has no bridge");
    assert_eq!(pci_path(&sys, "0000:41:00.0", PciPlacement::None), None);
    assert_eq!(pci_path(&sys, "0000:99:00.0", PciPlacement::Gpu), None, "unknown to sysfs");
    assert_eq!(pci_path(&sys, "../../etc", PciPlacement::Gpu), None, "only bus ids are looked up");
}

#[test]
fn one_device_per_gpu_only_with_gpu_buffers_and_a_placement() {
    let host = FakeHost::new("devices");
    let (gpus, sys) = (host.gpus(), host.sys());
    let bridge = gpu_devices(PciPlacement::Bridge, true, &gpus, &sys);
    assert_eq!(bridge.len(), 2);
    assert_eq!((bridge[0].bus_id.as_str(), bridge[0].pci_path.as_ref()), ("0000:00:06.0", None));
    assert_eq!(bridge[1].pci_path, Some(host.real("devices/pci0000:00/0000:00:01.0/0000:40:00.0")));
    assert!(gpu_devices(PciPlacement::Gpu, false, &gpus, &sys).is_empty(), "GPU buffers off");
    assert!(gpu_devices(PciPlacement::None, true, &gpus, &sys).is_empty(), "placement none");
    assert!(gpu_devices(PciPlacement::Gpu, true, &host.dir.join("nowhere"), &sys).is_empty(), "no GPU");
}

#[test]
fn the_gdr_level_is_set_only_for_gpu_buffers_and_never_over_the_users() {
    assert_eq!(gdr_level_to_set(GdrLevel::Sys, true, None), Some("SYS"));
    assert_eq!(gdr_level_to_set(GdrLevel::Phb, true, None), Some("PHB"));
    assert_eq!(gdr_level_to_set(GdrLevel::Off, true, None), None);
    assert_eq!(gdr_level_to_set(GdrLevel::Sys, false, None), None, "host buffers need no GPUDirect");
    assert_eq!(gdr_level_to_set(GdrLevel::Sys, true, Some("PXB")), None, "the user's value stands");
    assert_eq!(gdr_level_to_set(GdrLevel::Sys, true, Some("")), None, "even an empty one");
}

#[test]
fn knob_words_parse() {
    assert_eq!("gpu".parse::<PciPlacement>(), Ok(PciPlacement::Gpu));
    assert_eq!("bridge".parse::<PciPlacement>(), Ok(PciPlacement::Bridge));
    assert_eq!("none".parse::<PciPlacement>(), Ok(PciPlacement::None));
    assert!("nic".parse::<PciPlacement>().is_err());
    assert_eq!("SYS".parse::<GdrLevel>(), Ok(GdrLevel::Sys));
    assert_eq!("off".parse::<GdrLevel>(), Ok(GdrLevel::Off));
    assert!("PXB".parse::<GdrLevel>().is_err());
}
