use super::*;

/// A job's completion tokens, sent and paid, with nothing prefilled.
fn tokens(sent: u64, paid: u64) -> Tally {
    Tally {
        sent,
        paid,
        ..Tally::default()
    }
}

/// How many jobs like `job` `buyer` ends before it is refused (at most 1,000).
fn jobs_until_refused(table: &UnpaidWork, buyer: &Asker, job: Tally) -> u64 {
    let mut served = 0;
    while table.check(buyer, 0).is_ok() {
        table.ended(buyer, job, 0);
        served += 1;
        assert!(served < 1_000, "never refused");
    }
    served
}

fn asker(n: u8, origin: &str, newcomer: bool) -> Asker {
    Asker {
        buyer: NodeId::from_bytes([n; 32]),
        origin: Origin(origin.into()),
        newcomer,
        at_risk: AtRisk::default(),
    }
}

/// `asker` asking for a job that prefills `prefill` positions, with a credit window
/// of `tokens`.
fn asking(asker: Asker, prefill: u64, tokens: u64) -> Asker {
    Asker {
        at_risk: AtRisk { prefill, tokens },
        ..asker
    }
}

#[test]
fn origins_are_one_host() {
    let of = |a: &str| Origin::of(&a.parse().unwrap()).to_string();
    assert_eq!(of("/ip4/10.0.0.7/tcp/4001"), "10.0.0.7");
    assert_eq!(of("/ip4/10.0.0.7/udp/9/quic-v1"), "10.0.0.7");
    assert_eq!(of("/ip6/2001:db8:1:2:3:4:5:6/tcp/1"), "2001:db8:1:2::/64");
    assert_eq!(of("/dns4/example.org/tcp/1"), "example.org");
    assert_eq!(of("/memory/123"), of("/memory/456"));
    // Relayed: our relayed listen address, which starts with the relay's.
    let relayed = "/ip4/203.0.113.9/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit";
    assert_eq!(of(relayed), "203.0.113.9");
}

#[test]
fn a_key_that_leaves_tokens_unpaid_is_refused_for_an_hour() {
    let table = UnpaidWork::default();
    let free_rider = asker(1, "a", true);
    assert!(table.admit(&free_rider, 0).is_ok());
    table.ended(&free_rider, tokens(16, 0), 10);
    table.ended(&free_rider, tokens(16, 0), 20);
    assert!(
        table.check(&free_rider, 30).is_ok(),
        "under two newcomer windows"
    );
    table.ended(&free_rider, tokens(3, 0), 30);
    let (reason, why) = table.admit(&free_rider, 40).unwrap_err();
    assert_eq!(reason, RejectReason::NotAllowed);
    assert!(why.contains("32 tokens unpaid"), "{why}");
    // Paying since does not wash it: the key itself is refused.
    let paid = Asker {
        newcomer: false,
        ..free_rider.clone()
    };
    assert!(table.check(&paid, 40).is_err(), "the key itself is refused");
    assert!(
        table.check(&free_rider, 30 + REMEMBERED_MS).is_ok(),
        "forgotten"
    );
}

#[test]
fn an_honest_buyer_s_stray_tokens_stay_within_its_allowance() {
    // A gateway that hedges or whose clients leave: a few tokens in flight each
    // time, and what it pays for grows the allowance by an eighth.
    let table = UnpaidWork::default();
    let gateway = asker(1, "a", false);
    for n in 0..100 {
        table.ended(&gateway, tokens(200, 200), n);
        table.ended(&gateway, tokens(3, 0), n);
    }
    assert!(table.check(&gateway, 100).is_ok());
    // Paying one job does not buy a stream of free ones.
    let table = UnpaidWork::default();
    let payer_once = asker(2, "a", false);
    table.ended(&payer_once, tokens(8, 8), 0);
    table.ended(&payer_once, tokens(33, 0), 1);
    assert!(table.check(&payer_once, 2).is_ok());
    table.ended(&payer_once, tokens(2, 0), 1);
    assert!(table.check(&payer_once, 2).is_err());
}

#[test]
fn standby_warm_ups_cost_a_gateway_nothing() {
    // One unbilled token each, by design: a gateway standing by all hour is served.
    let table = UnpaidWork::default();
    let gateway = asker(1, "a", true);
    for n in 0..1_000 {
        table.ended(&gateway, tokens(1, 0), n);
    }
    assert!(table.check(&gateway, 1_000).is_ok());
    // Each warm-up prefills what was delivered since the last (64 tokens) on an
    // engine that reuses the cached prefix: a thousand an hour stay inside the floor.
    let warm_up = Tally {
        prefilled: 64,
        ..tokens(1, 0)
    };
    let table = UnpaidWork::default();
    for n in 0..1_000 {
        table.ended(&gateway, warm_up, n);
    }
    assert!(table.check(&gateway, 1_000).is_ok());
}

/// One-token jobs never receipted (or closed right after `Accept`): the token rule
/// never sees them (a job's first token is the provider's bid), so before the
/// prefill rule a key had any number of long prompts prefilled for nothing.
#[test]
fn unpaid_prefill_holds_a_key_that_never_pays() {
    let table = UnpaidWork::default();
    let classifier = asker(1, "a", false);
    let one_token = Tally {
        prefilled: 8_000,
        billed_prompt: 8_000,
        ..tokens(1, 0)
    };
    let served = jobs_until_refused(&table, &classifier, one_token);
    assert_eq!(served, FREE_PREFILL_FLOOR.div_ceil(8_000));
    let (reason, why) = table.admit(&classifier, 0).unwrap_err();
    assert_eq!(reason, RejectReason::NotAllowed);
    assert!(why.contains("prompt tokens prefilled here unpaid"), "{why}");
    assert!(
        table.check(&classifier, REMEMBERED_MS + 1).is_ok(),
        "forgotten"
    );
    // The same jobs paid for cost nothing: the first receipt pays the prompt.
    let table = UnpaidWork::default();
    let paid = Tally {
        paid: 1,
        ..one_token
    };
    for n in 0..1_000 {
        table.ended(&classifier, paid, n);
    }
    assert!(table.check(&classifier, 1_000).is_ok());
}

/// A resume bills no prompt (a failover's re-prefill is the provider's cost to bid),
/// so a buyer that carries its prompt in `resume` and pays for the new tokens alone
/// has the rest prefilled unpaid; each paid token still adds to the allowance.
#[test]
fn a_resume_s_prefill_counts_even_when_its_tokens_are_paid() {
    let table = UnpaidWork::default();
    let buyer = asker(1, "a", false);
    let carried = Tally {
        sent: 2,
        paid: 2,
        prefilled: 8_003,
        billed_prompt: 0,
    };
    let served = jobs_until_refused(&table, &buyer, carried);
    // 72,027 unpaid against 65,536 plus 16 for each job's two paid tokens.
    assert_eq!(served, 9);
    // An honest failover now and then beside paid work stays inside.
    let table = UnpaidWork::default();
    let job = Tally {
        sent: 300,
        paid: 300,
        prefilled: 500,
        billed_prompt: 500,
    };
    let failover = Tally {
        sent: 150,
        paid: 150,
        prefilled: 650,
        billed_prompt: 0,
    };
    for n in 0..200 {
        table.ended(&buyer, job, n);
        table.ended(&buyer, failover, n);
    }
    assert!(table.check(&buyer, 200).is_ok());
}

#[test]
fn the_prefill_allowance_is_a_minute_of_measured_prefill_at_least_the_floor() {
    let never_pays = Tally {
        prefilled: 10_000,
        ..tokens(0, 0)
    };
    let buyer = asker(1, "a", false);
    let refused_after = |table: UnpaidWork| jobs_until_refused(&table, &buyer, never_pays);
    assert_eq!(refused_after(UnpaidWork::default()), 7);
    assert_eq!(refused_after(UnpaidWork::new(500_000)), 7, "the floor");
    // 20,000 tokens/s: 1.2 M tokens a minute.
    assert_eq!(refused_after(UnpaidWork::new(20_000_000)), 120);
}

#[test]
fn newcomers_of_one_origin_share_four_prefill_allowances() {
    let table = UnpaidWork::default();
    let long_unpaid = Tally {
        prefilled: 8_192,
        ..tokens(1, 0)
    };
    // Two jobs per fresh key (each within its own allowance), keys without end.
    let mut jobs = 0u64;
    for n in 0..=255u8 {
        let key = asker(n, "a", true);
        if table.check(&key, 0).is_err() {
            break;
        }
        table.ended(&key, long_unpaid, 0);
        table.ended(&key, long_unpaid, 0);
        jobs += 2;
    }
    assert_eq!(jobs * 8_192, ORIGIN_PREFILL_SHARES * FREE_PREFILL_FLOOR);
    let (_, why) = table.check(&asker(255, "a", true), 0).unwrap_err();
    assert!(why.contains("buyers from a had"), "{why}");
    assert!(
        table.check(&asker(255, "b", true), 0).is_ok(),
        "another origin"
    );
    assert!(
        table.check(&asker(255, "a", false), 0).is_ok(),
        "a paying buyer"
    );
}

#[test]
fn keys_that_each_paid_once_share_their_origin_s_prefill_allowances() {
    // Each key pays for one tiny job, then asks for long prefills it will not pay
    // for: prompts moved into `resume` (which bills none), or fresh jobs left before
    // their first receipt. Before, every such key had a whole floor of its own.
    let paid_once = tokens(2, 2);
    let resumed = Tally {
        prefilled: 8_192,
        ..tokens(1, 1)
    };
    let left_early = Tally {
        prefilled: 8_192,
        ..tokens(16, 0)
    };
    for (unpaid_job, window) in [(resumed, 64), (left_early, 64)] {
        let table = UnpaidWork::default();
        let (mut free, mut earned, mut keys) = (0u64, 0u64, 0u64);
        for n in 0..=255u8 {
            let key = asking(asker(n, "a", false), 8_192, window);
            table.ended(&key, paid_once, 0);
            earned += 2 * FREE_PREFILL_PER_PAID_TOKEN;
            let mut took = 0;
            while took < 8 && table.check(&key, 0).is_ok() {
                table.ended(&key, unpaid_job, 0);
                earned += unpaid_job.paid * FREE_PREFILL_PER_PAID_TOKEN;
                free += 8_192;
                took += 1;
            }
            keys += 1;
            if took == 0 {
                break;
            }
        }
        assert!(keys < 10, "the crowd ran out after {keys} keys");
        let bound = ORIGIN_PREFILL_SHARES * FREE_PREFILL_FLOOR + 8_192 + earned;
        assert!(free <= bound, "{free} taken, bound {bound}");
        let (reason, why) = table.check(&asker(250, "a", true), 0).unwrap_err();
        assert_eq!(reason, RejectReason::NotAllowed);
        assert!(why.contains("buyers from a "), "{why}");
        // A buyer there whose payments cover what its job could leave unpaid is
        // still served; so is everyone elsewhere.
        let honest = asker(251, "a", false);
        table.ended(&honest, tokens(1_000, 1_000), 0);
        let warm_up = Tally {
            prefilled: 2_000,
            ..tokens(1, 1)
        };
        table.ended(&honest, warm_up, 0);
        // Earned 8 × 1,001 prefill (6,008 left) and 1,001 / 8 = 125 tokens.
        let ask = |prefill, window| table.check(&asking(honest.clone(), prefill, window), 0);
        assert!(ask(6_000, 64).is_ok(), "a job it earned");
        assert!(ask(6_100, 64).is_err(), "more prefill than it earned");
        assert!(ask(100, 200).is_err(), "a wider window than it earned");
        // A key that paid for one tiny job is held with the crowd.
        let paid_once_key = asker(253, "a", false);
        table.ended(&paid_once_key, paid_once, 0);
        assert!(table.check(&asking(paid_once_key, 100, window), 0).is_err());
        assert!(table.check(&asker(252, "b", true), 0).is_ok());
        let later = REMEMBERED_MS + 1;
        assert!(
            table.check(&asker(250, "a", true), later).is_ok(),
            "forgotten"
        );
    }
}

#[test]
fn fresh_keys_from_one_origin_run_out_but_paying_buyers_there_do_not() {
    let table = UnpaidWork::default();
    for n in 0..(ORIGIN_UNPAID_ALLOWANCE / 16) as u8 {
        let key = asker(n, "a", true);
        assert!(table.admit(&key, u64::from(n)).is_ok(), "key {n}");
        table.ended(&key, tokens(17, 0), u64::from(n));
    }
    let (reason, why) = table.check(&asker(100, "a", true), 50).unwrap_err();
    assert_eq!(reason, RejectReason::NotAllowed);
    assert!(why.contains("from a"), "{why}");
    assert!(
        table.check(&asker(101, "a", false), 50).is_ok(),
        "a paying buyer"
    );
    assert!(
        table.check(&asker(102, "b", true), 50).is_ok(),
        "another origin"
    );
    // Keys that each paid once, then left windows unpaid, count against their
    // origin too: the crowd runs out, a buyer there that pays for what it takes does
    // not.
    let table = UnpaidWork::default();
    let mut left = 0;
    for n in 0..=255u8 {
        let key = asking(asker(n, "a", false), 0, 64);
        table.ended(&key, tokens(2, 2), 0);
        if table.check(&key, 0).is_err() {
            break;
        }
        table.ended(&key, tokens(30, 0), 0);
        left += 29;
    }
    assert!(
        left <= ORIGIN_UNPAID_ALLOWANCE + 29,
        "{left} tokens left unpaid"
    );
    let (_, why) = table.check(&asker(200, "a", true), 1).unwrap_err();
    assert!(why.contains("buyers from a left"), "{why}");
    let honest = asking(asker(201, "a", false), 0, 64);
    table.ended(&honest, tokens(600, 600), 0);
    table.ended(&honest, tokens(3, 0), 0);
    assert!(
        table.check(&honest, 1).is_ok(),
        "its payments cover its window"
    );
    assert!(
        table.check(&asker(202, "b", true), 1).is_ok(),
        "another origin"
    );
}

#[test]
fn newcomers_share_a_bounded_number_of_jobs() {
    let table = UnpaidWork::default();
    let newcomer = asker(1, "a", true);
    let held: Vec<_> = (0..NEWCOMER_JOBS_PER_BUYER)
        .map(|_| table.admit(&newcomer, 0).unwrap())
        .collect();
    let (reason, _) = table.admit(&newcomer, 0).unwrap_err();
    assert_eq!(reason, RejectReason::BuyerLimit);
    assert!(
        table.admit(&asker(1, "a", false), 0).unwrap().is_none(),
        "once paid"
    );
    drop(held);
    assert!(table.admit(&newcomer, 0).is_ok(), "slots come back");
    let table = UnpaidWork::default();
    let mut held = Vec::new();
    for n in 0..NEWCOMER_JOBS_PER_ORIGIN as u8 {
        held.push(table.admit(&asker(n, "a", true), 0).unwrap());
    }
    let (reason, why) = table.admit(&asker(200, "a", true), 0).unwrap_err();
    assert_eq!(reason, RejectReason::BuyerLimit);
    assert!(why.contains("from a"), "{why}");
    assert!(table.admit(&asker(200, "b", true), 0).is_ok());
}

#[test]
fn the_table_is_bounded() {
    let table = UnpaidWork::default();
    for n in 0..MAX_JOBS + 10 {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&(n as u64).to_le_bytes());
        let buyer = NodeId::from_bytes(bytes);
        let asker = Asker {
            buyer,
            origin: Origin::unknown(),
            newcomer: false,
            at_risk: AtRisk::default(),
        };
        table.ended(&asker, tokens(1, 0), 0);
    }
    assert_eq!(table.0.lock().unwrap().jobs.len(), MAX_JOBS);
}
