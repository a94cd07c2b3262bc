//! A Rust buyer using the node crate as a library: join the mesh as a light client,
//! wait for a provider's advert, and stream one job straight over `/sharemesh/infer/2`
//! (no HTTP in between).
//!
//!     cargo run -p sharemesh-node --example rust_buyer -- /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW…

use std::time::Duration;

use anyhow::{bail, Context, Result};
use sharemesh_gateway::buyer::{start_job, Billing, JobEvent, StreamTerms, DEFAULT_STALL_TIMEOUT};
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::{self as mesh, MeshConfig};
use sharemesh_protocol::{
    ChatMessage, JobId, JobRequest, Keypair, NanoUsd, Prompt, Role, Sampling, Tier,
};

#[tokio::main]
async fn main() -> Result<()> {
    let bootstrap = std::env::args()
        .nth(1)
        .context("usage: rust_buyer BOOTSTRAP_MULTIADDR")?;
    let mut secret = [0u8; 32];
    rand::fill(&mut secret);
    let key = Keypair::from_secret(secret);
    let config = MeshConfig {
        bootstrap: vec![bootstrap.parse()?],
        ..MeshConfig::default()
    };
    let mesh = mesh::spawn(key.secret(), config).await?;

    // Wait for a provider's signed advert to reach our order book.
    let offer = loop {
        let live = mesh
            .book
            .read()
            .map(|b| b.live(now_ms()))
            .unwrap_or_default();
        if let Some(entry) = live.into_iter().find(|e| !e.advert.models.is_empty()) {
            break entry;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let model = offer.advert.models[0].clone();
    let price = model
        .prices
        .first()
        .map_or(NanoUsd(0), |p| p.price_per_token);
    println!(
        "provider {} offers {} at {} nano-USD/token",
        offer.advert.provider, model.model.name, price.0
    );

    let mut job_id = [0u8; 16];
    rand::fill(&mut job_id);
    // The secret decides, after delivery, whether to verify the job; the provider sees
    // only the commitment (this example does not verify).
    let (_audit_secret, audit_commitment) =
        sharemesh_gateway::verify::audit::audit_secret(&JobId::from_bytes(job_id));
    let request = JobRequest {
        job_id: JobId::from_bytes(job_id),
        buyer: key.node_id(),
        provider: offer.advert.provider,
        model: model.model.id,
        prompt: Prompt::Chat(vec![ChatMessage {
            role: Role::User,
            content: "What is 2 + 2?".into(),
        }]),
        sampling: Sampling {
            max_tokens: 32,
            ..Sampling::default()
        },
        max_price_per_token: price,
        tier: Tier::OnDemand,
        deadline_ms: now_ms() + 60_000,
        resume: vec![],
        audit_commitment,
    };
    let peer = offer.advert.provider.peer_id()?;
    let mut events = start_job(
        &mesh,
        std::sync::Arc::new(Keypair::from_secret(key.secret())),
        peer,
        request,
        StreamTerms {
            ledger: None,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            billing: Billing::Metered(None),
            counted: None,
        },
    )
    .await?;
    let mut paid = 0;
    while let Some(event) = events.next().await {
        match event {
            JobEvent::Accepted(accept) => {
                println!("accepted: {} prompt tokens", accept.prompt_tokens)
            }
            JobEvent::Token(chunk) => print!("{}", chunk.text_delta),
            // Receipts are cumulative: the last one signed is what the job costs.
            JobEvent::Receipted(receipt) => paid = receipt.amount.0,
            JobEvent::Finished { finish, .. } => {
                println!("\nfinished ({finish:?}); our last signed receipt pays {paid} nano-USD");
                return Ok(());
            }
            JobEvent::Rejected(reject) => bail!("rejected: {:?} {}", reject.reason, reject.detail),
            JobEvent::Failed(why) => bail!("failed: {why}"),
        }
    }
    bail!("the job ended without finishing")
}
