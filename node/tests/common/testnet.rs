//! Helpers for tests that start whole testnets (`sharemesh testnet up`).

use std::path::Path;
use std::process::Command;

pub fn sharemesh(data_dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(super::sharemesh_bin())
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .unwrap()
}

pub fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// A data folder whose catalog already has the cached default model (no re-download).
pub fn data_dir_with_model() -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    let model = super::default_model_path();
    let out = sharemesh(data.path(), &["models", "add", model.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

/// The names a testnet file lists under `hosts.<key>` (namespaces, routers).
pub fn host_names(file: &serde_json::Value, key: &str) -> Vec<String> {
    file["hosts"][key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Why this machine cannot run `--netns` testnets (root, and network namespaces allowed).
pub fn netns_usable() -> Result<(), String> {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if !is_root {
        return Err("--netns needs root (network namespaces)".into());
    }
    // Root in a container may still lack CAP_SYS_ADMIN: probe before relying on it.
    let probe = format!("smprobe{}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &probe])
        .output()
        .is_ok_and(|o| o.status.success());
    if !made {
        return Err(
            "this machine does not allow network namespaces (`ip netns add` failed)".into(),
        );
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    Ok(())
}

/// Whether nftables (the NAT routers' rules) is installed.
pub fn nft_available() -> bool {
    Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Kills leftover pids if an assertion fails half-way.
pub struct Guard(pub Vec<u64>);
impl Drop for Guard {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// Deletes namespaces left behind if an assertion fails half-way.
pub struct NetnsCleanup(pub Vec<String>);
impl Drop for NetnsCleanup {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}
