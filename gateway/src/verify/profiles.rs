//! Which execution profile each provider of a model last named, and whether one is
//! alone: a profile that no other provider of its model runs cannot be checked bit for
//! bit by anyone (only within the cross-profile tolerance), so naming one is itself a
//! finding — every job of that provider is verified (SPEC §12).

use std::collections::HashMap;

use sharemesh_protocol::{ExecutionProfile, ModelId, NodeId};

/// Providers remembered; beyond it the census starts over.
const MAX_PROVIDERS: usize = 10_000;

#[derive(Default)]
pub struct ProfileCensus {
    named: HashMap<NodeId, (ModelId, ExecutionProfile)>,
}

impl ProfileCensus {
    /// Remembers the profile `provider` named for a job of `model`.
    pub fn note(&mut self, provider: NodeId, model: ModelId, profile: &ExecutionProfile) {
        if self.named.len() >= MAX_PROVIDERS && !self.named.contains_key(&provider) {
            self.named.clear();
        }
        self.named.insert(provider, (model, profile.clone()));
    }

    /// Whether `provider`'s profile is one no other provider of its model (among those
    /// seen) replays exactly, while there are others: nobody can hold it to the bit.
    pub fn is_lone(&self, provider: &NodeId) -> bool {
        let Some((model, profile)) = self.named.get(provider) else {
            return false;
        };
        let mut others = self
            .named
            .iter()
            .filter(|(id, (m, _))| *id != provider && m == model)
            .peekable();
        others.peek().is_some() && others.all(|(_, (_, p))| !p.replays_exactly(profile))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(engine: &str, isa: &str, device: &str) -> ExecutionProfile {
        ExecutionProfile {
            engine: engine.into(),
            version: "3".into(),
            isa: isa.into(),
            quantization: "Q4_1".into(),
            device: device.into(),
        }
    }

    #[test]
    fn a_profile_nobody_else_runs_is_alone_once_there_are_others() {
        let (a, b, c) = (
            NodeId::from_bytes([1; 32]),
            NodeId::from_bytes([2; 32]),
            NodeId::from_bytes([3; 32]),
        );
        let (model, other_model) = (ModelId::from_bytes([7; 32]), ModelId::from_bytes([8; 32]));
        let mut census = ProfileCensus::default();
        census.note(a, model, &profile("sharemesh-kernels", "avx2", "cpu"));
        assert!(
            !census.is_lone(&a),
            "the only provider: nothing to compare with"
        );
        // Another ISA of the kernels replays exactly: not alone.
        census.note(
            b,
            model,
            &profile("sharemesh-kernels", "avx512-vnni", "cpu"),
        );
        assert!(!census.is_lone(&a) && !census.is_lone(&b));
        // A CUDA provider among CPU ones: alone; another model's providers do not count.
        census.note(c, model, &profile("candle", "x86_64", "cuda"));
        assert!(census.is_lone(&c));
        assert!(!census.is_lone(&a));
        census.note(
            NodeId::from_bytes([4; 32]),
            other_model,
            &profile("candle", "x86_64", "cuda"),
        );
        assert!(census.is_lone(&c));
        assert!(!census.is_lone(&NodeId::from_bytes([9; 32])), "never seen");
    }
}
