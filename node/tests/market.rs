#![allow(clippy::unwrap_used)]
//! Provider selection on a real order book: eligibility (model, price ceiling, region,
//! VRAM, tier, availability window, capacity) and ranking (cheapest first).

use sharemesh_gateway::budget::Budget;
use sharemesh_gateway::dispatch::Dispatcher;
use sharemesh_gateway::plan::RoutingDefaults;
use sharemesh_gateway::route::{RouteRequest, RoutingOptions};
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::{self as mesh, MeshConfig};
use sharemesh_protocol::*;

const MODEL: ModelId = ModelId::from_bytes([7; 32]);

struct Offer {
    seed: u8,
    price: u64,
    region: &'static str,
    vram_gb: u64,
    tiers: Vec<Tier>,
    window: Option<AvailabilityWindow>,
    active: u32,
}

fn advert(offer: &Offer) -> (Keypair, Advert) {
    let key = Keypair::from_secret([offer.seed; 32]);
    let advert = Advert {
        provider: key.node_id(),
        region: offer.region.into(),
        hardware: if offer.vram_gb > 0 {
            HardwareSummary::Gpu {
                name: "GPU".into(),
                count: 1,
                vram_total_bytes: offer.vram_gb * 1_000_000_000,
                vram_free_bytes: 0,
                fingerprints: vec![],
            }
        } else {
            HardwareSummary::Cpu {
                cores: 8,
                ram_bytes: 1 << 34,
            }
        },
        models: vec![ModelOffer {
            model: ModelDescriptor {
                id: MODEL,
                name: "test-model".into(),
                architecture: "llama".into(),
                quantization: "Q4_1".into(),
                context_length: 2048,
            },
            generation_milli_tokens_per_second: 10_000,
            prices: offer
                .tiers
                .iter()
                .map(|&tier| TierPrice {
                    tier,
                    price_per_token: NanoUsd(offer.price),
                })
                .collect(),
        }],
        tiers: offer.tiers.clone(),
        windows: offer.window.into_iter().collect(),
        load: Load {
            active_jobs: offer.active,
            queue_depth: 0,
            max_concurrent: 4,
            ..Load::default()
        },
        addresses: vec![],
    };
    (key, advert)
}

fn request(routing: RoutingOptions) -> RouteRequest {
    RouteRequest {
        model: "test-model".into(),
        prompt: Prompt::Text("hi".into()),
        sampling: Sampling::default(),
        routing,
    }
}

#[tokio::test]
async fn eligibility_and_ranking() {
    let buyer = Keypair::from_secret([1; 32]);
    let handle = mesh::spawn(buyer.secret(), MeshConfig::default())
        .await
        .unwrap();
    // A window that is certainly closed now: the opposite half of today.
    let minute_now = ((now_ms() / 60_000) % 1440) as u16;
    let closed = AvailabilityWindow {
        weekdays: 0x7f,
        start_minute: (minute_now + 600) % 1440,
        end_minute: (minute_now + 700) % 1440,
        utc_offset_minutes: 0,
    };
    let both = vec![Tier::OnDemand, Tier::Interruptible];
    let offers = [
        Offer {
            seed: 10,
            price: 100,
            region: "eu",
            vram_gb: 24,
            tiers: both.clone(),
            window: None,
            active: 0,
        },
        Offer {
            seed: 11,
            price: 50,
            region: "us",
            vram_gb: 0,
            tiers: vec![Tier::OnDemand],
            window: None,
            active: 0,
        },
        Offer {
            seed: 12,
            price: 80,
            region: "eu",
            vram_gb: 80,
            tiers: both.clone(),
            window: Some(closed),
            active: 0,
        },
        Offer {
            seed: 13,
            price: 10,
            region: "eu",
            vram_gb: 80,
            tiers: both.clone(),
            window: None,
            active: 4,
        },
    ];
    let ids: Vec<NodeId> = offers
        .iter()
        .map(|offer| {
            let (key, advert) = advert(offer);
            let bytes = key
                .seal(&advert, 1, now_ms(), 60_000)
                .unwrap()
                .to_bytes()
                .unwrap();
            handle
                .book
                .write()
                .unwrap()
                .offer(&bytes, now_ms())
                .unwrap()
                .provider
        })
        .collect();
    let dispatcher = Dispatcher::new(
        handle,
        buyer,
        RoutingDefaults::default(),
        None,
        Budget::default(),
    );
    let pick = |routing: RoutingOptions| -> Vec<NodeId> {
        dispatcher
            .candidates(&MODEL, &request(routing), &Default::default())
            .0
            .into_iter()
            .map(|c| c.entry.advert.provider)
            .collect()
    };
    // Outside its window (12): never chosen. Cheapest first, but one whose advert says
    // it is at capacity (13, the cheapest) after every provider with room: its live
    // quote or refusal decides, a stale advert does not turn it into a 503.
    assert_eq!(
        pick(RoutingOptions::default()),
        vec![ids[1], ids[0], ids[3]]
    );
    assert_eq!(
        pick(RoutingOptions {
            region: Some("eu".into()),
            ..Default::default()
        }),
        vec![ids[0], ids[3]]
    );
    assert_eq!(
        pick(RoutingOptions {
            max_price_per_token: Some(NanoUsd(60)),
            ..Default::default()
        }),
        vec![ids[1], ids[3]]
    );
    assert_eq!(
        pick(RoutingOptions {
            min_vram_bytes: Some(16_000_000_000),
            ..Default::default()
        }),
        vec![ids[0], ids[3]]
    );
    assert_eq!(
        pick(RoutingOptions {
            interruptible: true,
            ..Default::default()
        }),
        vec![ids[0], ids[3]]
    );
    assert_eq!(
        pick(RoutingOptions {
            tier: Some(Tier::Reserved),
            ..Default::default()
        }),
        Vec::<NodeId>::new()
    );
    // Outside the catalog a model is addressed by its id, never by a declared name.
    assert_eq!(dispatcher.resolve_model(&MODEL.to_string()).unwrap(), MODEL);
    assert!(dispatcher.resolve_model("test-model").is_err());
    assert!(dispatcher.resolve_model("other").is_err());
}
