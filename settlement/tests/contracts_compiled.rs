//! The compiled contracts the crate embeds are what the pinned compiler makes of the
//! sources: a fresh compile with solc-js (installed by scripts/test) must match them.

#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

#[test]
fn the_embedded_contracts_match_a_fresh_compile_of_their_sources() {
    let tools = support::evm_tools();
    assert!(
        tools.join("node_modules/solc").exists(),
        "solc-js is not installed in {} — scripts/test installs it",
        tools.display()
    );
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("evm-tools/compile.mjs");
    let output = Command::new("node")
        .arg(script)
        .arg("--check")
        .current_dir(&tools)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
