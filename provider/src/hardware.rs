//! Hardware detection: NVML for NVIDIA GPUs, with a CPU fallback that one log line
//! explains. What is found feeds adverts and attestations.

use serde::Serialize;
use sharemesh_protocol::{GpuFingerprint, HardwareSummary};

#[derive(Clone, Debug, Serialize)]
pub struct GpuStatus {
    pub name: String,
    pub uuid: String,
    pub vram_total_bytes: u64,
    pub vram_free_bytes: u64,
    pub driver_version: String,
    pub cuda_version: String,
    pub utilization_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub power_watts: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Hardware {
    pub gpus: Vec<GpuStatus>,
    pub cpu_model: String,
    pub cpu_cores: u32,
    pub ram_bytes: u64,
    /// Why no GPU is used, when none is.
    pub gpu_note: Option<String>,
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

fn ram_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn query_nvml() -> Result<Vec<GpuStatus>, String> {
    use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML unavailable ({e})"))?;
    let driver = nvml.sys_driver_version().unwrap_or_default();
    let cuda = nvml
        .sys_cuda_driver_version()
        .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
        .unwrap_or_default();
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count failed ({e})"))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML device {index} failed ({e})"))?;
        let memory = device.memory_info().ok();
        gpus.push(GpuStatus {
            name: device.name().unwrap_or_default(),
            uuid: device.uuid().unwrap_or_default(),
            vram_total_bytes: memory.as_ref().map_or(0, |m| m.total),
            vram_free_bytes: memory.as_ref().map_or(0, |m| m.free),
            driver_version: driver.clone(),
            cuda_version: cuda.clone(),
            utilization_percent: device.utilization_rates().ok().map(|u| u.gpu),
            temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok(),
            power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        });
    }
    Ok(gpus)
}

/// Detects the machine. Never fails: a missing driver or GPU is reported in `gpu_note`.
pub fn detect() -> Hardware {
    let (gpus, gpu_note) = match query_nvml() {
        Ok(gpus) if gpus.is_empty() => (gpus, Some("NVML found no GPU".to_owned())),
        Ok(gpus) => (gpus, None),
        Err(note) => (Vec::new(), Some(note)),
    };
    Hardware {
        gpus,
        cpu_model: cpu_model(),
        cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        ram_bytes: ram_bytes(),
        gpu_note,
    }
}

impl Hardware {
    /// This machine's CPU without asking NVML (in-process labs and scripted engines).
    pub fn cpu_only() -> Self {
        Hardware {
            gpus: Vec::new(),
            cpu_model: cpu_model(),
            cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            ram_bytes: ram_bytes(),
            gpu_note: Some("not asked (CPU only)".into()),
        }
    }

    /// Logs one line saying what will serve.
    pub fn log(&self) {
        match (&self.gpus.first(), &self.gpu_note) {
            (Some(gpu), _) => tracing::info!(
                gpu = %gpu.name, vram_gb = gpu.vram_total_bytes as f64 / 1e9,
                driver = %gpu.driver_version, cuda = %gpu.cuda_version, "GPU detected"
            ),
            (None, note) => tracing::info!(
                reason = note.as_deref().unwrap_or("none"),
                cores = self.cpu_cores,
                "no GPU in use; serving on CPU"
            ),
        }
    }

    pub fn summary(&self) -> HardwareSummary {
        match self.gpus.first() {
            Some(gpu) => HardwareSummary::Gpu {
                name: gpu.name.clone(),
                count: self.gpus.len() as u32,
                vram_total_bytes: self.gpus.iter().map(|g| g.vram_total_bytes).sum(),
                vram_free_bytes: self.gpus.iter().map(|g| g.vram_free_bytes).sum(),
                fingerprints: self.fingerprints(),
            },
            None => HardwareSummary::Cpu {
                cores: self.cpu_cores,
                ram_bytes: self.ram_bytes,
            },
        }
    }

    pub fn fingerprints(&self) -> Vec<GpuFingerprint> {
        self.gpus
            .iter()
            .map(|g| GpuFingerprint {
                name: g.name.clone(),
                uuid: g.uuid.clone(),
                vram_bytes: g.vram_total_bytes,
                driver_version: g.driver_version.clone(),
                cuda_version: g.cuda_version.clone(),
            })
            .collect()
    }
}

/// Evidence that a device is what a node claims, for a buyer-chosen nonce. The NVML
/// fingerprint in `Attestation` is *not* such evidence (it proves only what the key
/// claims); a hardware root of trust is: NVIDIA confidential computing on Hopper and
/// later signs a report over the GPU's identity, firmware and a nonce with a key
/// certified by NVIDIA. No implementation ships: none can be tested without such a
/// GPU, and a stand-in would be a fake. `attestor()` says so.
pub trait Attestor: Send + Sync {
    /// What kind of evidence this is (e.g. `nvidia-cc`).
    fn kind(&self) -> &'static str;
    /// Signed evidence bound to `nonce`.
    fn evidence(&self, nonce: &[u8; 32]) -> Result<Vec<u8>, AttestError>;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestError {
    #[error("no hardware attestation on this node: {0}")]
    Unavailable(String),
}

/// The hardware attestor of this node, if any: today always none, with the reason.
pub fn attestor(hardware: &Hardware) -> Result<Box<dyn Attestor>, AttestError> {
    let reason = if hardware.gpus.is_empty() {
        "no GPU".to_owned()
    } else {
        "confidential-computing attestation is not implemented (it needs a Hopper-class GPU in CC mode to build and test against)".to_owned()
    };
    Err(AttestError::Unavailable(reason))
}
