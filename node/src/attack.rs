//! `sharemesh attack MODE` (hidden; a build with the adversary kit only — the tests'
//! and a testnet's, never the shipped one, which refuses every mode): a buyer that
//! misbehaves against one provider, so a testnet can play the buyer side of the attack
//! table as `provide --adversary` plays the provider side. Each mode prints what the
//! attack got as one JSON object; the defences are the provider's unpaid-work rules
//! (`provider/src/unpaid.rs`, SPEC §8).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use libp2p::Multiaddr;
use serde::Serialize;
use sharemesh_gateway::buyer::{start_job, Billing, BuyerStream, JobEvent, StreamTerms};
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::{MeshConfig, MeshHandle};
use sharemesh_protocol::{
    Digest, JobId, JobRequest, Keypair, ModelId, NanoUsd, NodeId, Prompt, Sampling, Tier,
};

#[derive(Args, Debug)]
pub struct AttackArgs {
    /// `free-rider`: takes tokens and never pays, holding every other job until the
    /// provider gives up on it, with a fresh key whenever one is refused;
    /// `free-prefill`: long prompts, one token each, never paid, every other stream
    /// left right after `Accept`; `proof-spam`: buys one job, then gossips `--rounds`
    /// false fraud proofs against the provider, built from its real signed chunks with
    /// a made-up replay at each step.
    pub mode: BuyerAttack,
    /// The provider attacked (its node id).
    #[arg(long)]
    pub provider: NodeId,
    /// Where to join the mesh (the provider's listen address will do).
    #[arg(long, required = true)]
    pub bootstrap: Vec<Multiaddr>,
    /// Keys tried (`free-rider`, four jobs each), jobs run (`free-prefill`) or proofs
    /// sent (`proof-spam`).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
    /// Words in each `free-prefill` prompt (about a token each).
    #[arg(long, default_value_t = 4_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub prompt_words: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BuyerAttack {
    FreeRider,
    FreePrefill,
    ProofSpam,
}

/// What an attack got from the provider.
#[derive(Debug, Default, Serialize)]
pub struct AttackReport {
    pub mode: Option<BuyerAttack>,
    pub keys: u32,
    pub jobs: u32,
    /// Jobs the provider accepted.
    pub served: u32,
    /// Completion tokens received, none of them paid.
    pub tokens: u64,
    /// Prompt words the provider was asked to prefill in accepted jobs.
    pub prompt_words_prefilled: u64,
    /// Refusals, in order, with the provider's words.
    pub refusals: Vec<String>,
    /// Whether a fresh key was refused at its first job (the origin's newcomers ran out).
    pub origin_refused: bool,
    /// False fraud proofs gossiped (`proof-spam`); what they cost is seen at the nodes
    /// that check them (a gateway's `GET /v1/trust`).
    pub proofs_sent: u32,
}

pub fn run(args: AttackArgs) -> Result<()> {
    if !sharemesh_provider::adversary::KIT {
        bail!("this build has no adversary kit: `attack` needs `--features adversary`");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(attack(&args))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn attack(args: &AttackArgs) -> Result<AttackReport> {
    let mut report = AttackReport {
        mode: Some(args.mode),
        ..AttackReport::default()
    };
    match args.mode {
        BuyerAttack::FreeRider => {
            for _ in 0..args.rounds {
                let buyer = Buyer::join(args).await?;
                report.keys += 1;
                for job in 0..4u32 {
                    // Every other job is held until the provider gives up on it.
                    let leave = (report.keys + job) % 2 == 1;
                    let story = "a long story for free";
                    let refused = buyer.take(args, &mut report, story, 500, leave).await?;
                    if refused {
                        report.origin_refused |= job == 0;
                        break;
                    }
                }
                if report.origin_refused {
                    break;
                }
            }
        }
        BuyerAttack::FreePrefill => {
            let buyer = Buyer::join(args).await?;
            report.keys = 1;
            let prompt = "word ".repeat(args.prompt_words as usize);
            for job in 0..args.rounds {
                // Every other stream is left at once (`Accept` read, nothing more).
                let leave_at_accept = job % 2 == 1;
                if buyer
                    .take(args, &mut report, &prompt, 1, leave_at_accept)
                    .await?
                {
                    break;
                }
            }
        }
        BuyerAttack::ProofSpam => {
            let buyer = Buyer::join(args).await?;
            report.keys = 1;
            buyer.spam_proofs(args, &mut report).await?;
        }
    }
    Ok(report)
}

/// One key of the attacker, on its own swarm, connected to the provider.
struct Buyer {
    key: Arc<Keypair>,
    mesh: MeshHandle,
    model: ModelId,
}

impl Buyer {
    async fn join(args: &AttackArgs) -> Result<Self> {
        let key = Keypair::from_secret(rand::random::<[u8; 32]>());
        let config = MeshConfig {
            bootstrap: args.bootstrap.clone(),
            heartbeat: Duration::from_millis(200),
            ..MeshConfig::default()
        };
        let mesh = sharemesh_mesh::spawn(key.secret(), config)
            .await
            .context("joining the mesh")?;
        let peer = args.provider.peer_id().context("the provider's peer id")?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if mesh.is_connected(&peer) {
                if let Some(model) = advertised_model(&mesh, args.provider) {
                    return Ok(Self {
                        key: Arc::new(key),
                        mesh,
                        model,
                    });
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "no connection to {} and its advert within 30 s",
                    args.provider
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs one job, never paying: reads its tokens until the provider ends it (or,
    /// with `leave`, leaves after 15 tokens — at `Accept` for one-token jobs); whether
    /// the provider refused it.
    async fn take(
        &self,
        args: &AttackArgs,
        report: &mut AttackReport,
        prompt: &str,
        max_tokens: u32,
        leave: bool,
    ) -> Result<bool> {
        report.jobs += 1;
        let mut stream = self
            .open(args, prompt, max_tokens, Billing::Unbilled)
            .await?;
        let mut tokens = 0u64;
        while let Some(event) = stream.next().await {
            match event {
                JobEvent::Rejected(reject) => {
                    report
                        .refusals
                        .push(format!("{:?}: {}", reject.reason, reject.detail));
                    return Ok(true);
                }
                JobEvent::Accepted(_) => {
                    report.served += 1;
                    report.prompt_words_prefilled += prompt.split_whitespace().count() as u64;
                    if leave && max_tokens == 1 {
                        break;
                    }
                }
                JobEvent::Token(chunk) => {
                    tokens += chunk.token_ids.len() as u64;
                    if leave && tokens >= 15 {
                        break;
                    }
                }
                JobEvent::Failed(_) | JobEvent::Finished { .. } => break,
                JobEvent::Receipted(_) => {}
            }
        }
        report.tokens += tokens;
        // The provider books each end before the next job (as the lab's attacker waits).
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(false)
    }

    /// Opens a job on the provider for `prompt`, paid or not as `billing` says.
    async fn open(
        &self,
        args: &AttackArgs,
        prompt: &str,
        max_tokens: u32,
        billing: Billing,
    ) -> Result<BuyerStream> {
        let job = JobRequest {
            job_id: JobId::from_bytes(rand::random()),
            buyer: self.key.node_id(),
            provider: args.provider,
            model: self.model,
            prompt: Prompt::Text(prompt.into()),
            sampling: Sampling {
                max_tokens,
                ..Sampling::default()
            },
            max_price_per_token: NanoUsd(1_000_000),
            tier: Tier::OnDemand,
            deadline_ms: now_ms() + 60_000,
            resume: Vec::new(),
            audit_commitment: Digest::from_bytes([0; 32]),
        };
        let terms = StreamTerms {
            ledger: None,
            stall_timeout: Duration::from_secs(60),
            billing,
            counted: None,
        };
        let peer = args.provider.peer_id().context("the provider's peer id")?;
        start_job(&self.mesh, self.key.clone(), peer, job, terms)
            .await
            .map_err(|e| anyhow::anyhow!("opening a job: {e}"))
    }

    /// Buys one job (paid: the proofs then come from a buyer the provider served), and
    /// gossips a false proof per round from its signed chunks: at each step a replay
    /// whose logits are made up.
    async fn spam_proofs(&self, args: &AttackArgs, report: &mut AttackReport) -> Result<()> {
        report.jobs = 1;
        let mut stream = self
            .open(args, "something to accuse", 12, Billing::Metered(None))
            .await?;
        while stream.next().await.is_some() {}
        let transcript = stream
            .transcript()
            .context("the provider accepted no job to accuse")?
            .clone();
        report.served = 1;
        let committed: Vec<_> = transcript.committed().into_iter().cloned().collect();
        report.tokens = committed.len() as u64;
        if committed.is_empty() {
            bail!("the provider's answer committed no step to accuse");
        }
        let reporter = self.key.node_id();
        for n in 0..args.rounds {
            let step = n as usize % committed.len();
            let mut replayed = committed[step].clone();
            for (_, logit) in &mut replayed.top {
                *logit = (f32::from_bits(*logit) + 1.0 + n as f32).to_bits();
            }
            let proof = transcript
                .proof(reporter, step, replayed, transcript.profile().clone())
                .context("a proof from the job's own chunks")?;
            let sealed = self
                .key
                .seal(&proof, u64::from(n) + 1, now_ms(), 3_600_000)?;
            // The first waits for this node's gossip mesh to form.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while let Err(err) = self.mesh.publish_fraud_proof(&sealed).await {
                if tokio::time::Instant::now() >= deadline {
                    bail!("could not gossip a proof: {err}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            report.proofs_sent += 1;
        }
        Ok(())
    }
}

/// The first model `provider`'s live advert offers, as this buyer's book holds it.
fn advertised_model(mesh: &MeshHandle, provider: NodeId) -> Option<ModelId> {
    let book = mesh.book.read().ok()?;
    book.live(now_ms())
        .iter()
        .find(|entry| entry.advert.provider == provider)
        .and_then(|entry| entry.advert.models.first())
        .map(|offer| offer.model.id)
}
