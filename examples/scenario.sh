#!/usr/bin/env bash
# A researcher's scenario: a 4-provider testnet with mixed prices and one staller,
# then load, churn and a partition, with the reports kept side by side; then the
# in-process mesh and market simulations (no inference). Copy and edit.
#
#   examples/scenario.sh [OUT_DIR]
set -euo pipefail
out="${1:-/tmp/sharemesh-scenario}"
sharemesh() { cargo run -q -p sharemesh-node --bin sharemesh -- "$@"; }

sharemesh testnet down --dir "$out" 2>/dev/null || true
# Prices are passed to every provider; the launcher gives each provider one thread.
sharemesh testnet up --dir "$out" --providers 4 --gateways 1 --provider-args "--price 0.1 --max-concurrent 8"
trap 'sharemesh testnet down --dir "$out"' EXIT

sharemesh testnet scenario load  --dir "$out" --requests 16 --concurrency 4 --max-tokens 16
sharemesh testnet scenario churn --dir "$out" --requests 16 --concurrency 4 --max-tokens 16
sharemesh testnet scenario partition --dir "$out" --requests 16 --concurrency 4 --max-tokens 16

echo "reports: $out/scenario-load.json $out/scenario-churn.json $out/scenario-partition.json"
sharemesh testnet status --dir "$out"
sharemesh testnet down --dir "$out"

# The same processes behind emulated 40 ms ± 10 ms links with 1% loss (the kernel has
# no tc netem; every connection a node dials goes through sharemesh's link wrapper).
sharemesh testnet up --dir "$out" --providers 4 --gateways 1 --provider-args "--price 0.1" \
  --link-latency-ms 40 --link-jitter-ms 10 --link-loss 0.01
sharemesh testnet scenario load --dir "$out" --requests 16 --concurrency 4 --max-tokens 16
cp "$out/scenario-load.json" "$out/scenario-load-wan.json"

# No processes, no model: 100 mesh nodes in this process on emulated 20-60 ms links
# with 1% loss, and the market's auction against random and round-robin.
sharemesh testnet simulate --nodes 100 --gateways 10 --duration 60 --loss 0.01 --json > "$out/simulate.json"
sharemesh testnet market-sim --csv "$out/market.csv"
