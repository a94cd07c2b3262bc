//! Handlers of the bookkeeping subcommands: `keys`, `earnings`, `spend` and `receipts`
//! (`models` is in `models.rs`: it needs the engine).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct AccountArgs {
    #[arg(long)]
    pub json: bool,
    /// Only receipts issued on or after this UTC day (YYYY-MM-DD).
    #[arg(long)]
    pub since: Option<String>,
    /// Ask a running node's HTTP API (its ledger is locked while it runs).
    #[arg(long)]
    pub node: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key (printed once; only its hash is stored).
    Create {
        #[arg(long, default_value = "default")]
        name: String,
        /// This key's own daily spend limit, USD.
        #[arg(long)]
        daily_budget: Option<f64>,
        /// This key's own monthly spend limit, USD.
        #[arg(long)]
        monthly_budget: Option<f64>,
        /// An admin key: may also block and unblock peers (`/v1/network/block`).
        #[arg(long, conflicts_with_all = ["daily_budget", "monthly_budget"])]
        admin: bool,
    },
    /// List keys (ids, names, state).
    List,
    /// Revoke a key by id or name.
    Revoke { id: String },
}

pub fn keys(data_dir: &std::path::Path, command: KeysCommand) -> Result<()> {
    let mut store = sharemesh_gateway::keys::KeyStore::open(data_dir)?;
    match command {
        KeysCommand::Create {
            name,
            daily_budget,
            monthly_budget,
            admin,
        } => {
            let nano = |usd: Option<f64>| -> Result<Option<u64>> {
                usd.map(|v| {
                    anyhow::ensure!(
                        v.is_finite() && v >= 0.0,
                        "budgets must be non-negative USD amounts"
                    );
                    Ok((v * 1e9).round() as u64)
                })
                .transpose()
            };
            let (record, key) = if admin {
                store.create_admin(&name)?
            } else {
                store.create_with_budget(&name, nano(daily_budget)?, nano(monthly_budget)?)?
            };
            eprintln!(
                "created key {} ({}); it is shown only now:",
                record.id, record.name
            );
            println!("{key}");
        }
        KeysCommand::List => {
            let usd =
                |b: Option<u64>| b.map_or("-".to_owned(), |b| format!("${:.2}", b as f64 / 1e9));
            for r in &store.records {
                println!(
                    "{}  {:<20} {:<8} daily {:<10} monthly {}",
                    r.id,
                    r.name,
                    match (r.revoked, r.admin) {
                        (true, _) => "revoked",
                        (false, true) => "admin",
                        (false, false) => "active",
                    },
                    usd(r.daily_budget_nano_usd),
                    usd(r.monthly_budget_nano_usd)
                );
            }
        }
        KeysCommand::Revoke { id } => {
            let record = store.revoke(&id)?;
            println!("revoked {} ({})", record.id, record.name);
        }
    }
    Ok(())
}

pub fn account(
    data_dir: &std::path::Path,
    side: sharemesh_ledger::Side,
    args: AccountArgs,
) -> Result<()> {
    let since_ms = match &args.since {
        Some(day) => sharemesh_ledger::parse_day(day)
            .with_context(|| format!("--since `{day}` is not a date (YYYY-MM-DD)"))?,
        None => 0,
    };
    let report: serde_json::Value = match &args.node {
        Some(node) => {
            let path = match side {
                sharemesh_ledger::Side::Earnings => "earnings",
                sharemesh_ledger::Side::Spend => "spend",
            };
            let mut url = format!("{}/v1/account/{path}", node.trim_end_matches('/'));
            if let Some(day) = &args.since {
                url.push_str(&format!("?since={day}"));
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime
                .block_on(async { reqwest::get(&url).await?.json::<serde_json::Value>().await })
                .with_context(|| format!("asking {url}"))?
        }
        None => {
            let ledger = sharemesh_ledger::Ledger::open(&data_dir.join("ledger"))?;
            let me = crate::identity::load_or_create(data_dir)?.node_id();
            serde_json::to_value(sharemesh_ledger::report(
                &ledger,
                &me,
                side,
                since_ms,
                sharemesh_mesh::clock::now_ms(),
            )?)?
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let usd = |v: &serde_json::Value| v["amount_nano_usd"].as_u64().unwrap_or(0) as f64 / 1e9;
    let title = match side {
        sharemesh_ledger::Side::Earnings => ("earned", "buyer"),
        sharemesh_ledger::Side::Spend => ("spent", "provider"),
    };
    println!(
        "{} ${:.9} for {} tokens over {} receipts",
        title.0,
        usd(&report["total"]),
        report["total"]["tokens"],
        report["total"]["jobs"]
    );
    for (heading, key) in [
        ("per day", "per_day"),
        ("per model", "per_model"),
        (&*format!("per {}", title.1), "per_counterparty"),
    ] {
        println!("{heading}:");
        if let Some(map) = report[key].as_object() {
            for (name, totals) in map {
                println!(
                    "  {name:<54} {:>8} tokens  ${:.9}",
                    totals["tokens"],
                    usd(totals)
                );
            }
        }
    }
    if let Some(seconds) = report["uptime_seconds"].as_f64() {
        println!("uptime: {:.1} h serving", seconds / 3600.0);
    }
    for (name, key) in [
        ("time to first token (ms)", "ttft_ms"),
        ("tokens/s", "tokens_per_second"),
    ] {
        if report[key].is_object() {
            println!(
                "{name}: p50 {:.1}, p95 {:.1}",
                report[key]["p50"].as_f64().unwrap_or(0.0),
                report[key]["p95"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}

/// `sharemesh receipts`: every stored receipt as JSON lines.
pub fn receipts(data_dir: &std::path::Path) -> Result<()> {
    let ledger = sharemesh_ledger::Ledger::open(&data_dir.join("ledger"))?;
    for (receipt, issued_at_ms) in ledger.receipts()? {
        println!(
            "{}",
            serde_json::json!({
                "job_id": receipt.job_id.to_string(),
                "provider": receipt.provider.to_string(),
                "buyer": receipt.buyer.to_string(),
                "prompt_tokens": receipt.prompt_tokens,
                "completion_tokens": receipt.completion_tokens,
                "price_nano_usd_per_token": receipt.price_per_token.0,
                "amount_nano_usd": receipt.amount.0,
                "issued_at_ms": issued_at_ms,
            })
        );
    }
    Ok(())
}
