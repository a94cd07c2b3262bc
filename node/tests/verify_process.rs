#![allow(clippy::unwrap_used)]
//! Verified work with real processes and the real model: a provider that runs the
//! model with two layers dropped (cheaper, worse) under its honest name and profile
//! serves a gateway that holds the model (`--verify`). The gateway replays the job,
//! finds the fingerprints differ, voids the cheat's pay and drops it; the fraud proof
//! gossips to a second gateway that never dealt with the cheat — started with no flag,
//! holding the model in its data dir — which replays the disputed step itself and
//! drops it too. Both then route to the honest
//! provider and get the model's own answer.

mod common;

use serde_json::Value;

const QUESTION: &str = "Name a large river in Europe.";
const MAX_TOKENS: u32 = 10;

fn reference() -> String {
    common::greedy_answer(
        &common::default_model_path(),
        "smollm2-135m-instruct",
        QUESTION,
        MAX_TOKENS,
    )
    .text
}

fn ask(http: &str) -> Value {
    let body = serde_json::json!({
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0, "max_tokens": MAX_TOKENS,
    });
    common::chat(http, &body)
}

fn dropped(http: &str, peer: &str) -> bool {
    common::get_json(http, "/v1/trust")["dropped_for_fraud"]
        .as_array()
        .is_some_and(|d| d.iter().any(|p| p == peer))
}

/// The cheapest provider, `cheat`, serves the first request; within `limit_s` the
/// buyer convicts it, drops it and voids what it paid it.
fn served_then_convicted(buyer: &str, cheat: &str, limit_s: u64) {
    let served = ask(buyer);
    assert_eq!(served["sharemesh"]["providers"][0], cheat, "{served}");
    let cost = served["sharemesh"]["cost_nano_usd"].as_u64().unwrap();
    assert!(cost > 0, "{served}");
    common::wait_until(limit_s, "the buyer to convict the cheat", || {
        // Counted once the cheat is out of routing and its pay voided.
        common::get_json(buyer, "/v1/trust")["stats"]["frauds_found"] == 1
    });
    assert!(dropped(buyer, cheat));
    let spend = common::get_json(buyer, "/v1/account/spend");
    assert_eq!(spend["settlement"]["voided_nano_usd"], cost, "{spend}");
}

#[test]
fn a_truncated_model_is_caught_unpaid_and_dropped_by_both_verifying_gateways() {
    let expected = reference();
    let model = common::default_model_path();
    let model = model.to_str().unwrap();
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_honest, honest) = common::provider(dirs[0].path(), None, &["--price", "0.1"]);
    let bootstrap = honest["listen"][0].as_str().unwrap().to_owned();
    let (_cheat, cheat) = common::provider(
        dirs[1].path(),
        Some(&bootstrap),
        &["--price", "0.05", "--adversary", "truncate-layers:2"],
    );
    let verifying = [
        "--verify",
        model,
        "--verify-threads",
        "1",
        "--quote-k",
        "0",
        "--warm-standby-every",
        "0",
        "--count-wait-ms",
        "60000",
    ];
    let (_buyer, buyer) = common::gateway(&bootstrap, dirs[2].path(), 2, &verifying);
    // The other holds the model in its data dir (as after `sharemesh models fetch`) and
    // is started with no verification flag: it replays with what it holds.
    let added = std::process::Command::new(common::sharemesh_bin())
        .args([
            "--data-dir",
            dirs[3].path().to_str().unwrap(),
            "models",
            "add",
            model,
        ])
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let holding = &verifying[2..]; // the same flags but --verify
    let (_other, other) = common::gateway(&bootstrap, dirs[3].path(), 2, holding);
    common::wait_until(60, "the other gateway holds the model", || {
        common::get_json(&other, "/v1/trust")["verification"] == "replay+outsourced"
    });
    let peer = |ready: &Value| ready["peer_id"].as_str().unwrap().to_owned();
    let (honest, cheat) = (peer(&honest), peer(&cheat));
    // Gossip meshes form within a few heartbeats.
    std::thread::sleep(std::time::Duration::from_secs(3));

    // The cheaper provider serves first: a plausible answer from a worse network.
    let first = ask(&buyer);
    assert_eq!(
        first["sharemesh"]["providers"][0],
        cheat.as_str(),
        "{first}"
    );
    assert_ne!(
        first["choices"][0]["message"]["content"],
        expected.as_str(),
        "{first}"
    );
    let cost = first["sharemesh"]["cost_nano_usd"].as_u64().unwrap();
    assert!(cost > 0, "{first}");

    common::wait_until(60, "the buyer's replay to convict the cheat", || {
        // Counted once the cheat is out of routing and its pay voided.
        common::get_json(&buyer, "/v1/trust")["stats"]["frauds_found"] == 1
    });
    assert!(dropped(&buyer, &cheat));
    let trust = common::get_json(&buyer, "/v1/trust");
    assert_eq!(trust["stats"]["frauds_found"], 1, "{trust}");
    let spend = common::get_json(&buyer, "/v1/account/spend");
    assert_eq!(spend["settlement"]["voided_nano_usd"], cost, "{spend}");
    assert_eq!(spend["total"]["amount_nano_usd"], 0, "{spend}");

    common::wait_until(
        60,
        "the other gateway to confirm the gossiped proof",
        || common::get_json(&other, "/v1/trust")["stats"]["frauds_confirmed_from_gossip"] == 1,
    );
    assert!(dropped(&other, &cheat));
    assert!(!dropped(&other, &honest));

    // Both route around the cheat now and get the model's own answer.
    for http in [&buyer, &other] {
        let answer = ask(http);
        assert_eq!(
            answer["sharemesh"]["providers"][0],
            honest.as_str(),
            "{answer}"
        );
        assert_eq!(
            answer["choices"][0]["message"]["content"],
            expected.as_str()
        );
    }
    common::wait_until(60, "the honest job to verify", || {
        common::get_json(&buyer, "/v1/trust")["stats"]["verified_ok"] == 1
    });
    assert_eq!(
        common::get_json(&buyer, "/v1/trust")["stats"]["frauds_found"],
        1
    );
}

/// `--adversary substitute:PATH`: another file of the same network (requantized to
/// Q8_0) served under the catalog model's id, header and profile. The buyer's counts
/// and text checks pass (same vocabulary); the replay does not.
#[test]
fn a_substituted_file_is_caught_and_unpaid() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let substitute = dirs[1].path().join("substitute-q8_0.gguf");
    sharemesh_engine::weights::requantize_to_q8_0(&common::default_model_path(), &substitute)
        .unwrap();
    let model = common::default_model_path();
    let (_honest, honest) = common::provider(dirs[0].path(), None, &["--price", "0.1"]);
    let bootstrap = honest["listen"][0].as_str().unwrap().to_owned();
    let adversary = format!("substitute:{}", substitute.display());
    let (_cheat, cheat) = common::provider(
        dirs[1].path(),
        Some(&bootstrap),
        &["--price", "0.05", "--adversary", &adversary],
    );
    let (_buyer, buyer) = common::gateway(
        &bootstrap,
        dirs[2].path(),
        2,
        &[
            "--verify",
            model.to_str().unwrap(),
            "--verify-threads",
            "1",
            "--quote-k",
            "0",
            "--warm-standby-every",
            "0",
            "--count-wait-ms",
            "60000",
        ],
    );
    let cheat = cheat["peer_id"].as_str().unwrap().to_owned();
    served_then_convicted(&buyer, &cheat, 60);
    let again = ask(&buyer);
    assert_ne!(
        again["sharemesh"]["providers"][0],
        cheat.as_str(),
        "{again}"
    );
}

/// A gateway started with no verification flag (verification is on by default): a
/// light client without the model buys a window of the cheat's job re-run by an honest
/// provider (a paid resume), sees the fingerprints differ from the cheat's, has the
/// third provider settle it, and voids the cheat's pay. Two provider processes running
/// the real model agree bit for bit.
#[test]
fn a_default_gateway_has_providers_check_and_catches_a_truncated_model() {
    let expected = reference();
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_first, first) = common::provider(dirs[0].path(), None, &["--price", "0.1"]);
    let bootstrap = first["listen"][0].as_str().unwrap().to_owned();
    let (_second, _) = common::provider(dirs[1].path(), Some(&bootstrap), &["--price", "0.1"]);
    let (_cheat, cheat) = common::provider(
        dirs[2].path(),
        Some(&bootstrap),
        &["--price", "0.05", "--adversary", "truncate-layers:2"],
    );
    let (_buyer, buyer) = common::gateway(
        &bootstrap,
        dirs[3].path(),
        3,
        &["--quote-k", "0", "--warm-standby-every", "0"],
    );
    let cheat = cheat["peer_id"].as_str().unwrap().to_owned();
    assert_eq!(
        common::get_json(&buyer, "/v1/trust")["verification"],
        "outsourced"
    );
    served_then_convicted(&buyer, &cheat, 120);
    let trust = common::get_json(&buyer, "/v1/trust");
    assert_eq!(trust["outsourced"]["disputes"], 1, "{trust}");
    assert_eq!(trust["outsourced"]["windows_run"], 2, "{trust}");
    let checks = trust["outsourced"]["spent_nano_usd"].as_u64().unwrap();
    assert!(checks > 0, "{trust}");
    // What the checks cost is its own line in the spend report.
    let spend = common::get_json(&buyer, "/v1/account/spend");
    assert_eq!(
        spend["per_api_key"]["(verification)"]["amount_nano_usd"], checks,
        "{spend}"
    );
    assert_eq!(
        trust["suspected"].as_array().map_or(0, Vec::len),
        0,
        "{trust}"
    );
    let again = ask(&buyer);
    assert_ne!(
        again["sharemesh"]["providers"][0],
        cheat.as_str(),
        "{again}"
    );
    assert_eq!(again["choices"][0]["message"]["content"], expected.as_str());
}

/// `--adversary claim-gpu:64`: a provider advertising (and attesting) a 64 MiB GPU for
/// a model whose weights alone are larger. Once the gateway holds the model's header
/// (fetched to count the first prompt) the claim is a hardware finding: the provider is
/// suspected and ranked lower, and `/v1/trust` says why.
#[test]
fn a_gpu_too_small_for_the_model_is_a_finding() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_honest, honest) = common::provider(dirs[0].path(), None, &["--price", "0.1"]);
    let bootstrap = honest["listen"][0].as_str().unwrap().to_owned();
    let (_claimer, claimer) = common::provider(
        dirs[1].path(),
        Some(&bootstrap),
        &["--price", "0.1", "--adversary", "claim-gpu:64"],
    );
    let (_buyer, buyer) =
        common::gateway(&bootstrap, dirs[2].path(), 2, &["--count-wait-ms", "60000"]);
    let (honest, claimer) = (
        honest["peer_id"].as_str().unwrap().to_owned(),
        claimer["peer_id"].as_str().unwrap().to_owned(),
    );
    ask(&buyer);
    common::wait_until(60, "the claim to be found", || {
        ask(&buyer);
        let trust = common::get_json(&buyer, "/v1/trust");
        trust["suspected"]
            .as_array()
            .is_some_and(|s| s.iter().any(|p| p == claimer.as_str()))
    });
    let trust = common::get_json(&buyer, "/v1/trust");
    let findings = &trust["hardware_findings"];
    let found = findings[claimer.as_str()][0].as_str().unwrap();
    assert!(found.contains("bytes of VRAM, below the"), "{found}");
    assert!(findings.get(honest.as_str()).is_none(), "{trust}");
}

/// `--adversary uuid-copy:UUID`: a provider advertises and attests another provider's
/// GPU UUID (public in its adverts) to get it flagged as one GPU under two identities.
/// The identity that claimed the UUID later at the gateway is flagged; the first is not.
#[test]
fn a_copied_gpu_uuid_flags_the_copier_not_the_owner() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // The "owner" claims an 80 GiB GPU (the kit's claimed UUID) and is seen first.
    let (_owner, owner) =
        common::provider(dirs[0].path(), None, &["--adversary", "claim-gpu:81920"]);
    let bootstrap = owner["listen"][0].as_str().unwrap().to_owned();
    let (_buyer, buyer) = common::gateway(&bootstrap, dirs[1].path(), 1, &[]);
    let owner = owner["peer_id"].as_str().unwrap().to_owned();
    // Providers attest with their first advert and every tenth after (an advert a
    // second here): let one of the owner's reach the gateway before the copier starts.
    std::thread::sleep(std::time::Duration::from_secs(11));
    let (_copier, copier) = common::provider(
        dirs[2].path(),
        Some(&bootstrap),
        &["--adversary", "uuid-copy:GPU-claimed-00000000"],
    );
    let copier = copier["peer_id"].as_str().unwrap().to_owned();
    common::wait_until(60, "the copy to be found", || {
        common::get_json(&buyer, "/v1/trust")["hardware_findings"]
            .get(copier.as_str())
            .is_some()
    });
    let trust = common::get_json(&buyer, "/v1/trust");
    let found = trust["hardware_findings"][copier.as_str()][0]
        .as_str()
        .unwrap();
    assert!(
        found.contains("attested first by 1 other identity"),
        "{found}"
    );
    assert!(
        trust["hardware_findings"].get(owner.as_str()).is_none(),
        "{trust}"
    );
}
