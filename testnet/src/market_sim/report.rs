//! What a simulation run reports, as a table and as CSV.

use serde::Serialize;

use super::Policy;

#[derive(Clone, Debug, Default, Serialize)]
pub struct TierOutcome {
    pub requests: usize,
    /// Requests no provider could ever serve (price ceiling, region, tier): excluded
    /// from the SLA ratio, since no policy can meet them.
    pub infeasible: usize,
    pub completed: usize,
    pub sla_met: usize,
}

impl TierOutcome {
    /// SLA met over feasible requests.
    pub fn sla_ratio(&self) -> f64 {
        let feasible = self.requests - self.infeasible;
        if feasible == 0 {
            1.0
        } else {
            self.sla_met as f64 / feasible as f64
        }
    }
}

/// What one policy achieved on the trace.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyReport {
    pub policy: Policy,
    pub tiers: [TierOutcome; 3],
    /// What buyers paid, nano-USD, and for how many tokens.
    pub cost_nano_usd: u128,
    pub tokens_served: u64,
    /// Mean price paid per token over the offline assignment's mean price per token.
    pub cost_vs_offline: f64,
    /// Mean price paid per token over the relaxed lower bound's (every request at the
    /// cheapest provider eligible at its arrival, capacity ignored).
    pub cost_vs_lower_bound: f64,
    /// Tokens served over the fleet's token capacity inside its windows (useful work;
    /// busy time on slow hardware does not count as more utilisation).
    pub utilisation: f64,
    pub failovers: usize,
    pub preemptions: usize,
}

pub(super) const COLUMNS: [&str; 12] = [
    "policy",
    "gold_sla",
    "silver_sla",
    "bronze_sla",
    "completed",
    "requests",
    "cost_usd",
    "cost_vs_offline",
    "cost_vs_bound",
    "utilisation",
    "failovers",
    "preemptions",
];

fn row(report: &PolicyReport) -> [String; 12] {
    let completed: usize = report.tiers.iter().map(|t| t.completed).sum();
    let requests: usize = report.tiers.iter().map(|t| t.requests).sum();
    [
        report.policy.name().to_string(),
        format!("{:.4}", report.tiers[0].sla_ratio()),
        format!("{:.4}", report.tiers[1].sla_ratio()),
        format!("{:.4}", report.tiers[2].sla_ratio()),
        completed.to_string(),
        requests.to_string(),
        format!("{:.6}", report.cost_nano_usd as f64 / 1e9),
        format!("{:.4}", report.cost_vs_offline),
        format!("{:.4}", report.cost_vs_lower_bound),
        format!("{:.4}", report.utilisation),
        report.failovers.to_string(),
        report.preemptions.to_string(),
    ]
}

/// The reports as an aligned table.
pub fn table(reports: &[PolicyReport]) -> String {
    let rows: Vec<[String; 12]> = reports.iter().map(row).collect();
    let widths: Vec<usize> = (0..COLUMNS.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([COLUMNS[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:>w$}"))
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(COLUMNS.to_vec());
    for r in &rows {
        out.push('\n');
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// The reports as CSV (same columns as the table).
pub fn csv(reports: &[PolicyReport]) -> String {
    let mut out = COLUMNS.join(",");
    for report in reports {
        out.push('\n');
        out.push_str(&row(report).join(","));
    }
    out.push('\n');
    out
}
