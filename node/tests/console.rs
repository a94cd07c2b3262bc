#![allow(clippy::unwrap_used)]
//! The web console in a real browser (headless Chromium driven by Playwright) against
//! real providers and a gateway on loopback: the playground streams an answer and names
//! its provider, the job page shows the route, the network page the providers; the
//! serving provider is killed with SIGKILL mid-answer and the route shows the failover;
//! the other provider's page shows its earnings grow; a request over the daily budget
//! shows the 402's reason. The gateway asks for API keys: the browser signs in with an
//! admin key and sees every key's spend against its budget, a key that spent shows it,
//! an ordinary key sees only itself. The provider's page shows its policy in force, the
//! network page adverts as they arrive. Screenshots land in the test's target directory.

mod common;

use std::process::Command;

/// `sharemesh keys create` in `dir` with `extra` flags; returns the key.
fn create_key(dir: &std::path::Path, name: &str, extra: &[&str]) -> String {
    let out = Command::new(common::sharemesh_bin())
        .arg("--data-dir")
        .arg(dir)
        .args(["keys", "create", "--name", name])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn the_console_works_in_a_real_browser() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_provider, provider) = common::provider(
        dirs[0].path(),
        None,
        &[
            "--http",
            "127.0.0.1:0",
            "--price",
            "0.1",
            "--window",
            "mon-sun 00:00-24:00",
            "--max-jobs-per-buyer",
            "3",
        ],
    );
    let bootstrap = provider["listen"][0].as_str().unwrap().to_owned();
    let provider_http = provider["http"].as_str().unwrap().to_owned();
    // The cheaper provider serves first; the browser test kills it mid-answer.
    let (cheap, _) = common::provider(dirs[2].path(), Some(&bootstrap), &["--price", "0.05"]);
    // A team's gateway: the browser holds the admin key, a script spends with alice's.
    let admin = create_key(dirs[1].path(), "ops", &["--admin"]);
    let alice = create_key(dirs[1].path(), "alice", &["--daily-budget", "0.00005"]);
    let (_gateway, gateway) = common::gateway_with_key(
        &bootstrap,
        dirs[1].path(),
        2,
        &[
            "--daily-budget",
            "0.0001",
            "--stall-timeout-ms",
            "3000",
            "--require-api-key",
        ],
        Some(&admin),
    );
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console_browser.py");
    let out = Command::new("python3")
        .arg(script)
        .args([&gateway, &provider_http])
        .arg(&shots)
        .arg(cheap.0.id().to_string())
        .args([&admin, &alice])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the console failed in the browser: {stdout}\n{}\n(scripts/test installs Debian's chromium and Playwright)",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
    for page in [
        "playground",
        "buyer",
        "network",
        "failover",
        "provider",
        "over-budget",
    ] {
        assert!(shots.join(format!("{page}.png")).exists(), "{page}.png");
    }
}
