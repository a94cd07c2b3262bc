//! Hardware claims checked for consistency (SPEC §12). A signed NVML fingerprint
//! proves only what its key claims, so it earns no trust; what it can do is expose
//! claims that do not fit together: one GPU (by UUID) under two identities, an advert
//! whose hardware is not what its own attestation lists, or numbers no card has. A
//! provider with such a finding is suspected (every job verified) and ranked lower.
//! A GPU UUID is public (any buyer of the card's time can read it in adverts), so a
//! shared UUID counts against the identity that claimed it later: copying an honest
//! provider's UUID into a fresh attestation flags the copier, not the owner. (Nothing
//! here can prove possession of a GPU; a hardware root of trust would.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use sharemesh_protocol::{Attestation, HardwareSummary, NodeId};

/// The most VRAM one GPU is believed to have (a 2026 data-centre card has ≤ 288 GB).
const MAX_PLAUSIBLE_VRAM_BYTES: u64 = 1 << 40;
/// Attestations kept; beyond it the oldest identity is forgotten.
const MAX_ATTESTED_NODES: usize = 10_000;

/// GPU UUID → each identity that claims it, with when it first did (an arrival count).
pub type UuidOwners = BTreeMap<String, BTreeMap<NodeId, u64>>;

/// What does not fit in one node's claims, given what others attested.
pub fn inconsistencies(
    attestation: &Attestation,
    advertised: Option<&HardwareSummary>,
    uuid_owners: &UuidOwners,
) -> Vec<String> {
    let mut found = Vec::new();
    for gpu in &attestation.gpus {
        if gpu.uuid.is_empty() {
            found.push(format!("GPU `{}` has no UUID", gpu.name));
        }
        if gpu.vram_bytes == 0 || gpu.vram_bytes > MAX_PLAUSIBLE_VRAM_BYTES {
            found.push(format!(
                "GPU `{}` claims {} bytes of VRAM",
                gpu.name, gpu.vram_bytes
            ));
        }
        // Only identities that claimed it first count against this one.
        let owners = uuid_owners.get(&gpu.uuid);
        let since = owners.and_then(|o| o.get(&attestation.node)).copied();
        let others: Vec<&NodeId> = owners
            .into_iter()
            .flatten()
            .filter(|(owner, claimed)| {
                **owner != attestation.node && since.is_none_or(|since| **claimed < since)
            })
            .map(|(owner, _)| owner)
            .collect();
        if !gpu.uuid.is_empty() && !others.is_empty() {
            found.push(format!(
                "GPU {} was attested first by {} other identit{}",
                gpu.uuid,
                others.len(),
                if others.len() == 1 { "y" } else { "ies" }
            ));
        }
    }
    let mut uuids: Vec<&str> = attestation.gpus.iter().map(|g| g.uuid.as_str()).collect();
    uuids.sort_unstable();
    if uuids
        .windows(2)
        .any(|pair| pair[0] == pair[1] && !pair[0].is_empty())
    {
        found.push("one GPU listed twice".into());
    }
    match advertised {
        Some(HardwareSummary::Gpu {
            count,
            vram_total_bytes,
            fingerprints,
            ..
        }) => {
            let uuids = |gpus: &[sharemesh_protocol::GpuFingerprint]| -> BTreeSet<String> {
                gpus.iter().map(|g| g.uuid.clone()).collect()
            };
            if !fingerprints.is_empty() && uuids(fingerprints) != uuids(&attestation.gpus) {
                found.push("the advert and the attestation name different GPUs".into());
            }
            let attested: u64 = attestation.gpus.iter().map(|g| g.vram_bytes).sum();
            if *count as usize != attestation.gpus.len() {
                found.push(format!(
                    "advertises {count} GPUs, attests {}",
                    attestation.gpus.len()
                ));
            } else if attested.abs_diff(*vram_total_bytes) > attested / 100 {
                found.push(format!(
                    "advertises {vram_total_bytes} bytes of VRAM, attests {attested}"
                ));
            }
        }
        Some(HardwareSummary::Cpu { .. }) if !attestation.gpus.is_empty() => {
            // Serving on the CPU beside a GPU is allowed; it is worth noting only when
            // the advert claims GPU service (above).
        }
        _ => {}
    }
    found
}

/// What is wrong with serving a model that needs `needed` bytes at least (weights and
/// a KV cache for the advertised context, `sharemesh_tokenizer::ModelMemory`) on the
/// advertised hardware: a GPU advert's total VRAM, or a CPU advert's RAM, below it.
pub fn memory_shortfall(hardware: &HardwareSummary, model: &str, needed: u64) -> Option<String> {
    let (what, has) = match hardware {
        HardwareSummary::Gpu {
            vram_total_bytes, ..
        } => ("VRAM", *vram_total_bytes),
        HardwareSummary::Cpu { ram_bytes, .. } => ("RAM", *ram_bytes),
    };
    (has < needed).then(|| {
        format!("advertises {has} bytes of {what}, below the {needed} that {model} needs with its context")
    })
}

/// The attestations held, and who owns each GPU.
#[derive(Default)]
struct Held {
    /// Each node's latest attestation, with when it arrived (a counter).
    latest: BTreeMap<NodeId, (u64, Attestation)>,
    /// GPU UUID → the nodes that attest it or name it in their signed advert, with
    /// when each first did (kept while it goes on claiming it).
    owners: UuidOwners,
    /// The UUIDs each node is listed under in `owners`.
    indexed: BTreeMap<NodeId, BTreeSet<String>>,
    arrivals: u64,
}

impl Held {
    /// Takes `node` out of the owners index; the UUIDs it was listed under.
    fn unindex(&mut self, node: &NodeId) -> BTreeSet<String> {
        let uuids = self.indexed.remove(node).unwrap_or_default();
        for uuid in &uuids {
            if let Some(owners) = self.owners.get_mut(uuid) {
                owners.remove(node);
                if owners.is_empty() {
                    self.owners.remove(uuid);
                }
            }
        }
        uuids
    }
}

/// The attestations this node has seen and what it found in them.
#[derive(Default)]
pub struct Attestations {
    held: Mutex<Held>,
    findings: Mutex<BTreeMap<NodeId, Vec<String>>>,
    /// Adverts offering a model on less memory than it needs, per node and model.
    short: Mutex<BTreeMap<NodeId, BTreeMap<String, String>>>,
}

impl Attestations {
    /// Takes a node's newest attestation (the mesh checked signature and order) and
    /// re-checks it and every node that shares, or shared, a GPU with it: work in
    /// proportion to those, not to every node held. Returns the re-checked nodes with
    /// findings now.
    pub fn on_attestation(
        &self,
        attestation: Attestation,
        advertised: impl Fn(&NodeId) -> Option<HardwareSummary>,
    ) -> Vec<NodeId> {
        let (Ok(mut held), Ok(mut findings)) = (self.held.lock(), self.findings.lock()) else {
            return Vec::new();
        };
        let node = attestation.node;
        if held.latest.len() >= MAX_ATTESTED_NODES && !held.latest.contains_key(&node) {
            let stalest = held
                .latest
                .iter()
                .min_by_key(|(_, (arrived, _))| *arrived)
                .map(|(id, _)| *id);
            if let Some(stalest) = stalest {
                held.latest.remove(&stalest);
                held.unindex(&stalest);
                findings.remove(&stalest);
            }
        }
        let claimed_since: BTreeMap<String, u64> = held
            .indexed
            .get(&node)
            .into_iter()
            .flatten()
            .filter_map(|uuid| Some((uuid.clone(), *held.owners.get(uuid)?.get(&node)?)))
            .collect();
        let before = held.unindex(&node);
        let advert = advertised(&node);
        let advertised_gpus = match &advert {
            Some(HardwareSummary::Gpu { fingerprints, .. }) => fingerprints.as_slice(),
            _ => &[],
        };
        let now: BTreeSet<String> = attestation
            .gpus
            .iter()
            .chain(advertised_gpus)
            .filter(|gpu| !gpu.uuid.is_empty())
            .map(|gpu| gpu.uuid.clone())
            .collect();
        held.arrivals += 1;
        let arrived = held.arrivals;
        for uuid in &now {
            let since = claimed_since.get(uuid).copied().unwrap_or(arrived);
            held.owners
                .entry(uuid.clone())
                .or_default()
                .insert(node, since);
        }
        held.indexed.insert(node, now.clone());
        held.latest.insert(node, (arrived, attestation));
        let mut recheck = BTreeSet::from([node]);
        for uuid in before.union(&now) {
            recheck.extend(
                held.owners
                    .get(uuid)
                    .into_iter()
                    .flatten()
                    .map(|(id, _)| *id),
            );
        }
        let mut flagged = Vec::new();
        for other in recheck {
            let Some((_, attested)) = held.latest.get(&other) else {
                continue;
            };
            let hardware = if other == node {
                advert.clone()
            } else {
                advertised(&other)
            };
            let found = inconsistencies(attested, hardware.as_ref(), &held.owners);
            if found.is_empty() {
                findings.remove(&other);
            } else {
                findings.insert(other, found);
                flagged.push(other);
            }
        }
        flagged
    }

    pub fn is_flagged(&self, node: &NodeId) -> bool {
        self.findings.lock().is_ok_and(|f| f.contains_key(node))
            || self.short.lock().is_ok_and(|s| s.contains_key(node))
    }

    /// Records what `node`'s advert for `model` lacks (`None`: nothing); `true` when
    /// this is a new finding.
    pub fn note_memory(&self, node: NodeId, model: &str, finding: Option<String>) -> bool {
        let Ok(mut short) = self.short.lock() else {
            return false;
        };
        match finding {
            Some(finding) => {
                if short.len() >= MAX_ATTESTED_NODES && !short.contains_key(&node) {
                    return false;
                }
                short
                    .entry(node)
                    .or_default()
                    .insert(model.to_owned(), finding)
                    .is_none()
            }
            None => {
                if let Some(models) = short.get_mut(&node) {
                    models.remove(model);
                    if models.is_empty() {
                        short.remove(&node);
                    }
                }
                false
            }
        }
    }

    /// Findings per node, for `GET /v1/trust`.
    pub fn findings(&self) -> BTreeMap<String, Vec<String>> {
        let mut all: BTreeMap<String, Vec<String>> = self
            .findings
            .lock()
            .map(|f| f.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
            .unwrap_or_default();
        if let Ok(short) = self.short.lock() {
            for (node, models) in short.iter() {
                all.entry(node.to_string())
                    .or_default()
                    .extend(models.values().cloned());
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharemesh_protocol::GpuFingerprint;

    #[test]
    fn too_little_memory_for_the_model_is_a_finding_until_the_advert_changes() {
        let small_gpu = HardwareSummary::Gpu {
            name: "tiny".into(),
            count: 1,
            vram_total_bytes: 64 << 20,
            vram_free_bytes: 64 << 20,
            fingerprints: vec![],
        };
        let finding = memory_shortfall(&small_gpu, "m", 100 << 20).unwrap();
        assert!(finding.contains("VRAM"), "{finding}");
        assert_eq!(memory_shortfall(&small_gpu, "m", 64 << 20), None);
        let cpu = HardwareSummary::Cpu {
            cores: 8,
            ram_bytes: 1 << 30,
        };
        assert!(memory_shortfall(&cpu, "m", 2 << 30)
            .unwrap()
            .contains("RAM"));
        let attestations = Attestations::default();
        let node = NodeId::from_bytes([3; 32]);
        assert!(attestations.note_memory(node, "m", Some(finding.clone())));
        assert!(
            !attestations.note_memory(node, "m", Some(finding)),
            "not new"
        );
        assert!(attestations.is_flagged(&node));
        assert_eq!(attestations.findings()[&node.to_string()].len(), 1);
        attestations.note_memory(node, "m", None);
        assert!(!attestations.is_flagged(&node));
    }

    fn gpu(uuid: &str, vram: u64) -> GpuFingerprint {
        GpuFingerprint {
            name: "NVIDIA H200".into(),
            uuid: uuid.into(),
            vram_bytes: vram,
            driver_version: "560".into(),
            cuda_version: "12.6".into(),
        }
    }

    fn attestation(node: u8, gpus: Vec<GpuFingerprint>) -> Attestation {
        Attestation {
            node: NodeId::from_bytes([node; 32]),
            gpus,
            cpu_model: "x86".into(),
            cpu_cores: 16,
            ram_bytes: 1 << 37,
            benchmarks: vec![],
        }
    }

    fn advert_gpu(count: u32, vram: u64) -> HardwareSummary {
        HardwareSummary::Gpu {
            name: "NVIDIA H200".into(),
            count,
            vram_total_bytes: vram,
            vram_free_bytes: vram,
            fingerprints: vec![],
        }
    }

    const GB: u64 = 1 << 30;

    /// A node that stops sharing a GPU clears its finding; a flood of attestations
    /// stays bounded, the stalest forgotten first.
    #[test]
    fn findings_follow_the_latest_claims_and_the_book_stays_bounded() {
        let book = Attestations::default();
        let advert = |_: &NodeId| Some(advert_gpu(1, 141 * GB));
        book.on_attestation(attestation(1, vec![gpu("GPU-a", 141 * GB)]), advert);
        book.on_attestation(attestation(2, vec![gpu("GPU-a", 141 * GB)]), advert);
        assert!(book.is_flagged(&NodeId::from_bytes([2; 32])));
        assert!(!book.is_flagged(&NodeId::from_bytes([1; 32])));
        let flagged = book.on_attestation(attestation(2, vec![gpu("GPU-b", 141 * GB)]), advert);
        assert!(flagged.is_empty(), "{flagged:?}");
        assert!(!book.is_flagged(&NodeId::from_bytes([2; 32])));
        for i in 0..(MAX_ATTESTED_NODES as u32 + 50) {
            let mut id = [9u8; 32];
            id[..4].copy_from_slice(&i.to_le_bytes());
            let mut flood = attestation(0, vec![gpu(&format!("GPU-f{i}"), GB)]);
            flood.node = NodeId::from_bytes(id);
            book.on_attestation(flood, |_| None);
        }
        let held = book.held.lock().unwrap();
        assert_eq!(held.latest.len(), MAX_ATTESTED_NODES);
        assert_eq!(held.indexed.len(), MAX_ATTESTED_NODES);
        assert_eq!(held.owners.len(), MAX_ATTESTED_NODES);
        assert!(!held.latest.contains_key(&NodeId::from_bytes([1; 32])));
    }

    /// Attack `uuid-copy`: a fresh identity copies an honest provider's public GPU UUID
    /// into its own signed attestation. The copier is flagged, not the owner — also
    /// after the owner re-attests (its claim keeps its date).
    #[test]
    fn one_gpu_under_two_identities_flags_the_later_claimant() {
        let book = Attestations::default();
        let advert = |_: &NodeId| Some(advert_gpu(1, 141 * GB));
        assert!(book
            .on_attestation(attestation(1, vec![gpu("GPU-a", 141 * GB)]), advert)
            .is_empty());
        assert!(book
            .on_attestation(attestation(2, vec![gpu("GPU-b", 141 * GB)]), advert)
            .is_empty());
        let flagged = book.on_attestation(attestation(3, vec![gpu("GPU-a", 141 * GB)]), advert);
        assert_eq!(flagged, vec![NodeId::from_bytes([3; 32])]);
        let refreshed = book.on_attestation(attestation(1, vec![gpu("GPU-a", 141 * GB)]), advert);
        assert_eq!(refreshed, vec![NodeId::from_bytes([3; 32])]);
        assert!(!book.is_flagged(&NodeId::from_bytes([1; 32])));
        assert!(book.is_flagged(&NodeId::from_bytes([3; 32])));
        assert!(!book.is_flagged(&NodeId::from_bytes([2; 32])));
        let findings = book.findings();
        assert!(
            findings[&NodeId::from_bytes([3; 32]).to_string()][0].contains("attested first by 1")
        );
    }

    #[test]
    fn adverts_must_match_their_attestation_and_numbers_must_be_plausible() {
        let owners = BTreeMap::new();
        let one = attestation(1, vec![gpu("GPU-a", 80 * GB)]);
        assert!(inconsistencies(&one, Some(&advert_gpu(1, 80 * GB)), &owners).is_empty());
        let more = inconsistencies(&one, Some(&advert_gpu(4, 320 * GB)), &owners);
        assert!(more[0].contains("advertises 4 GPUs, attests 1"), "{more:?}");
        let bigger = inconsistencies(&one, Some(&advert_gpu(1, 141 * GB)), &owners);
        assert!(bigger[0].contains("bytes of VRAM"), "{bigger:?}");
        let absurd = attestation(1, vec![gpu("GPU-a", 1 << 50)]);
        assert!(!inconsistencies(&absurd, None, &owners).is_empty());
        let twice = attestation(1, vec![gpu("GPU-a", GB), gpu("GPU-a", GB)]);
        assert!(inconsistencies(&twice, None, &owners)
            .iter()
            .any(|f| f.contains("twice")));
        let anonymous = attestation(1, vec![gpu("", GB)]);
        assert!(!inconsistencies(&anonymous, None, &owners).is_empty());
        // A CPU provider attests no GPU: nothing to find.
        assert!(inconsistencies(&attestation(1, vec![]), None, &owners).is_empty());
        // The advert's own fingerprints must name the attested GPUs.
        let with = |uuid: &str| HardwareSummary::Gpu {
            name: "NVIDIA H200".into(),
            count: 1,
            vram_total_bytes: 80 * GB,
            vram_free_bytes: 80 * GB,
            fingerprints: vec![gpu(uuid, 80 * GB)],
        };
        assert!(inconsistencies(&one, Some(&with("GPU-a")), &owners).is_empty());
        let other = inconsistencies(&one, Some(&with("GPU-z")), &owners);
        assert!(other[0].contains("name different GPUs"), "{other:?}");
    }

    /// A GPU named in one identity's signed advert and attested later by another that
    /// advertises another GPU: the later one is flagged twice over (shared, mismatch).
    #[test]
    fn a_gpu_in_someone_elses_advert_counts_as_shared() {
        let book = Attestations::default();
        let mine = NodeId::from_bytes([1; 32]);
        let advert = move |node: &NodeId| {
            let uuid = if *node == mine { "GPU-a" } else { "GPU-b" };
            Some(HardwareSummary::Gpu {
                name: "NVIDIA H200".into(),
                count: 1,
                vram_total_bytes: 141 * GB,
                vram_free_bytes: 141 * GB,
                fingerprints: vec![gpu(uuid, 141 * GB)],
            })
        };
        book.on_attestation(attestation(1, vec![gpu("GPU-a", 141 * GB)]), advert);
        // Node 2 attests GPU-a but advertises GPU-b: a mismatch, and GPU-a is shared.
        let flagged = book.on_attestation(attestation(2, vec![gpu("GPU-a", 141 * GB)]), advert);
        assert_eq!(
            flagged,
            vec![NodeId::from_bytes([2; 32])],
            "{:?}",
            book.findings()
        );
        assert_eq!(
            book.findings()[&NodeId::from_bytes([2; 32]).to_string()].len(),
            2
        );
    }
}
