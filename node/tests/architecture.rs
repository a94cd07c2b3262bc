#![allow(clippy::unwrap_used)]
//! The workspace's layout keeps its promises: the light client (gateway) and the mesh
//! do not link the engine (no candle), the pure crates stay pure, no two files of a
//! crate import each other (a cycle means a responsibility sits in the wrong place), and
//! every patched copy in `vendor/` is the one the build uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cargo tree` of the normal dependencies, one package per line, for `select`
/// (`["-p", name]`, `["--workspace"]`).
fn cargo_tree(select: &[&str]) -> String {
    cargo_tree_of_edges("normal", select)
}

/// `cargo tree -e edges` for `select`, one package per line.
fn cargo_tree_of_edges(edges: &str, select: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace())
        .args(["tree", "--offline", "-e", edges, "--prefix", "none"])
        .args(select)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree {select:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The packages `package` links (normal dependencies, transitively).
fn linked(package: &str) -> BTreeSet<String> {
    cargo_tree(&["-p", package])
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The light client (`--no-default-features`: a gateway and the bookkeeping commands)
/// links no inference: no candle, no NVML, no engine or provider; the default build
/// does link them, so the check can fail.
#[test]
fn the_light_client_links_no_inference() {
    let light: BTreeSet<String> = cargo_tree(&["-p", "sharemesh-node", "--no-default-features"])
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    let heavy = [
        "candle-core",
        "nvml-wrapper",
        "sharemesh-engine",
        "sharemesh-provider",
    ];
    for package in heavy {
        assert!(!light.contains(package), "the light client links {package}");
        assert!(
            linked("sharemesh-node").contains(package),
            "{package} is no longer linked by default"
        );
    }
    assert!(light.contains("sharemesh-gateway"));
}

/// Each third-party package's feature sets, as `cargo tree -e edges` resolves them for
/// `select` (`name version` -> the features of each build of it: a package built for
/// proc-macros as well as for the target is resolved twice, with its own features).
fn third_party_features(edges: &str, select: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let mut features = BTreeMap::<String, BTreeSet<String>>::new();
    for line in cargo_tree_of_edges(edges, &[select, &["-f", "{p}|{f}"]].concat()).lines() {
        if line.starts_with("sharemesh") {
            continue;
        }
        let Some((package, enabled)) = line.trim_end_matches(" (*)").split_once('|') else {
            continue;
        };
        let mut words = package.split_whitespace();
        if let (Some(name), Some(version)) = (words.next(), words.next()) {
            features
                .entry(format!("{name} {version}"))
                .or_default()
                .insert(enabled.trim().to_owned());
        }
    }
    features
}

/// The light client resolves every third-party crate with the features the workspace's
/// own build (tests included) gives it, so CI's lint of the light build re-checks only
/// sharemesh's crates instead of most of the graph again (node/Cargo.toml pins the
/// features the inference crates would otherwise add alone).
#[test]
fn the_light_client_resolves_shared_crates_as_the_workspace_does() {
    let workspace = third_party_features("normal,build,dev", &["--workspace"]);
    let light = third_party_features("no-dev", &["-p", "sharemesh-node", "--no-default-features"]);
    let differing: Vec<String> = light
        .iter()
        .filter(|(package, features)| {
            workspace
                .get(*package)
                .is_none_or(|built| !features.is_subset(built))
        })
        .map(|(package, features)| {
            format!(
                "{package}: light {features:?}, workspace {:?}",
                workspace.get(package)
            )
        })
        .collect();
    assert!(!light.is_empty() && light.len() < workspace.len());
    assert!(differing.is_empty(), "{differing:#?}");
}

/// The shipped `sharemesh` carries no adversary kit and no test rig (`sharemesh-lab`): no
/// crate it links is built with the `adversary` feature (the tests turn it on through
/// dev-dependencies only), and asking for the kit does turn it on, so the check can fail.
#[test]
fn the_shipped_binary_has_no_adversary_kit() {
    let with_kit = |select: &[&str]| -> Vec<String> {
        let tree = cargo_tree(&[select, &["-f", "{p} [{f}]"]].concat());
        tree.lines()
            .filter(|line| line.contains("adversary"))
            .map(str::to_owned)
            .collect()
    };
    assert!(
        !linked("sharemesh-node").contains("sharemesh-lab"),
        "the shipped build links the test rig"
    );
    let shipped = with_kit(&["-p", "sharemesh-node"]);
    assert!(
        shipped.is_empty(),
        "the default build has the kit: {shipped:?}"
    );
    let testnet = with_kit(&["-p", "sharemesh-node", "--features", "adversary"]);
    for crate_with_cheats in [
        "sharemesh-provider",
        "sharemesh-engine",
        "sharemesh-kernels",
    ] {
        assert!(
            testnet
                .iter()
                .any(|line| line.starts_with(crate_with_cheats)),
            "--features adversary does not reach {crate_with_cheats}: {testnet:?}"
        );
    }
}

#[test]
fn the_gateway_mesh_and_testnet_do_not_link_the_engine() {
    for package in ["sharemesh-gateway", "sharemesh-mesh", "sharemesh-testnet"] {
        let linked = linked(package);
        for heavy in ["candle-core", "sharemesh-engine", "sharemesh-provider"] {
            assert!(
                !linked.contains(heavy),
                "{package} links {heavy}: a gateway-only build must not carry inference"
            );
        }
    }
    // The gateway counts what it pays for with the model's vocabulary (tokenizers,
    // without candle); the mesh and the testnet need no tokenizer at all.
    for package in ["sharemesh-mesh", "sharemesh-testnet"] {
        assert!(
            !linked(package).contains("tokenizers"),
            "{package} links tokenizers"
        );
    }
    assert!(!linked("sharemesh-tokenizer").contains("candle-core"));
    // Constrained decoding is vocabulary work: no inference, no I/O.
    let constrain = linked("sharemesh-constrain");
    for heavy in ["candle-core", "tokio", "sled", "libp2p"] {
        assert!(
            !constrain.contains(heavy),
            "sharemesh-constrain links {heavy}"
        );
    }
    for pure in [
        "sharemesh-protocol",
        "sharemesh-reputation",
        "sharemesh-market",
    ] {
        let links = linked(pure);
        for io in ["tokio", "sled", "libp2p", "reqwest"] {
            assert!(!links.contains(io), "{pure} is pure, but links {io}");
        }
    }
}

/// The `[patch.crates-io]` entries of the workspace manifest: crate name → path.
fn patches() -> BTreeMap<String, String> {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let section = manifest
        .split("[patch.crates-io]")
        .nth(1)
        .expect("a [patch.crates-io] section");
    section
        .lines()
        .take_while(|line| !line.trim_start().starts_with('['))
        .filter_map(|line| {
            let (name, rest) = line.split_once('=')?;
            let path = rest.split("path = \"").nth(1)?.split('"').next()?;
            Some((name.trim().to_owned(), path.to_owned()))
        })
        .collect()
}

/// A libp2p upgrade that no longer matches a patched copy's version makes cargo take the
/// published crate and only warn that the patch was not used: each fix in `vendor/`
/// would be dropped silently. Every copy must be patched in, carry its marked changes
/// (`// sharemesh:`), and be the one the workspace links.
#[test]
fn every_vendored_patch_is_in_use() {
    let patches = patches();
    let copies: BTreeSet<String> = std::fs::read_dir(workspace().join("vendor"))
        .unwrap()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().is_dir() && entry.file_name() != "patches")
        .map(|entry| format!("vendor/{}", entry.file_name().to_string_lossy()))
        .collect();
    let patched: BTreeSet<String> = patches.values().cloned().collect();
    assert_eq!(
        copies, patched,
        "every copy in vendor/ is patched in, and only those"
    );
    let tree = cargo_tree(&["--workspace"]);
    for (name, path) in &patches {
        let linked: BTreeSet<&str> = tree
            .lines()
            .filter(|line| line.split_whitespace().next() == Some(name.as_str()))
            .collect();
        assert!(!linked.is_empty(), "{name} is patched but nothing links it");
        for line in linked {
            assert!(
                line.contains(&format!("/{path})")),
                "{name} is linked from elsewhere than its patched copy {path}: {line}"
            );
        }
        let marked = files_containing(&workspace().join(path).join("src"), "// sharemesh:");
        assert!(marked > 0, "{path} carries no marked change");
    }
}

/// Each copy in `vendor/` is the crate as published with its patch and nothing else: the
/// patch (`vendor/patches/NAME.patch`) reversed out of a scratch copy must apply whole
/// and leave exactly the published files, whose sha256 `NAME.sha256` records from the
/// crates.io release. A change to a copy that its patch does not record, or a patch
/// whose changes are gone from the copy, fails here; `scripts/vendor-patches` writes
/// both again from the registry.
#[test]
fn every_vendored_copy_is_its_release_and_its_patch() {
    for (name, path) in patches() {
        let dir = workspace().join("vendor/patches");
        let patch = dir.join(format!("{name}.patch"));
        let sums = std::fs::read_to_string(dir.join(format!("{name}.sha256")))
            .unwrap_or_else(|err| panic!("{name}: its published files' sums: {err}"));
        let published: BTreeMap<String, String> = sums
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .map(|line| {
                let (sum, file) = line.split_once("  ").expect("`SHA256  PATH` lines");
                (file.to_owned(), sum.to_owned())
            })
            .collect();
        let scratch = tempfile::tempdir().unwrap();
        copy_tree(&workspace().join(&path), scratch.path());
        // Outside any repository, `git apply` patches the files it is given.
        let reversed = Command::new("git")
            .args(["apply", "-R", "--"])
            .arg(&patch)
            .current_dir(scratch.path())
            .env("GIT_CEILING_DIRECTORIES", scratch.path().parent().unwrap())
            .output()
            .expect("git");
        assert!(
            reversed.status.success(),
            "{name}: its patch does not reverse out of {path} (a change it records is gone, \
             or another was made over it): {}",
            String::from_utf8_lossy(&reversed.stderr)
        );
        let found = sha256_of_files(scratch.path());
        let differing: Vec<&String> = published
            .keys()
            .chain(found.keys())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|file| published.get(*file) != found.get(*file))
            .collect();
        assert!(
            differing.is_empty(),
            "{path} differs from {name} as published in {differing:?} beyond its patch \
             (record the change in vendor/patches with scripts/vendor-patches)"
        );
    }
}

/// Copies the files under `from` into `to`.
fn copy_tree(from: &Path, to: &Path) {
    for file in files_under(from) {
        let target = to.join(file.strip_prefix(from).unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&file, &target).unwrap();
    }
}

/// The sha256 of every file under `root`, by its path below it.
fn sha256_of_files(root: &Path) -> BTreeMap<String, String> {
    use sha2::Digest as _;
    files_under(root)
        .into_iter()
        .map(|path| {
            let digest = sha2::Sha256::digest(std::fs::read(&path).unwrap());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            let file = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (file, hex)
        })
        .collect()
}

/// How many files under `dir` contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> usize {
    files_under(dir)
        .iter()
        .filter(|path| std::fs::read_to_string(path).is_ok_and(|text| text.contains(needle)))
        .count()
}

/// Every file under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
    {
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A crate's modules: path (`["dispatch"]`, `["a", "b"]`) → file.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut found = BTreeMap::new();
    let root = if src.join("lib.rs").exists() {
        src.join("lib.rs")
    } else {
        src.join("main.rs")
    };
    let mut todo = vec![(Vec::<String>::new(), root)];
    while let Some((path, file)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap();
        // `foo.rs` keeps its children in `foo/`, `lib.rs` and `mod.rs` beside them.
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("lib.rs" | "main.rs" | "mod.rs") => file.parent().unwrap().to_owned(),
            _ => file.with_extension(""),
        };
        for line in non_test_code(&text).lines() {
            let line = line.trim();
            let declaration = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "));
            let Some(name) = declaration.and_then(|rest| rest.strip_suffix(';')) else {
                continue;
            };
            let child = [
                dir.join(format!("{name}.rs")),
                dir.join(name).join("mod.rs"),
            ]
            .into_iter()
            .find(|p| p.exists());
            if let Some(child) = child {
                let mut child_path = path.clone();
                child_path.push(name.to_owned());
                todo.push((child_path, child));
            }
        }
        found.insert(path, file);
    }
    found
}

/// The file's code before its test-only items (unit tests may import anything of their
/// parent), without comments (a doc link is not an import).
fn non_test_code(text: &str) -> String {
    let code = text.find("#[cfg(test)]").map_or(text, |end| &text[..end]);
    code.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Module paths a file names through `crate::` or `super::`, resolved to the deepest
/// module that exists.
fn references(
    path: &[String],
    text: &str,
    modules: &BTreeMap<Vec<String>, PathBuf>,
) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let code = &non_test_code(text);
    let mut words: Vec<(Vec<String>, &str)> = Vec::new();
    for (anchor, prefix) in [("crate", "crate::"), ("super", "super::")] {
        for (at, _) in code.match_indices(prefix) {
            let base: Vec<String> = match anchor {
                "crate" => Vec::new(),
                _ => path[..path.len().saturating_sub(1)].to_vec(),
            };
            words.push((base, &code[at + prefix.len()..]));
        }
    }
    for (base, rest) in words {
        // `a::b::C`, or a group `{a::X, b}` (one level).
        let heads: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .collect(),
            None => vec![rest],
        };
        for head in heads {
            let mut target = base.clone();
            for segment in head.split("::") {
                let name: String = segment
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let mut next = target.clone();
                next.push(name);
                if modules.contains_key(&next) {
                    target = next;
                } else {
                    break;
                }
            }
            found.insert(target);
        }
    }
    found
}

/// Edges between files of one crate, leaving out a module naming its own ancestors
/// (`super::Type` from a child that extends its parent is how Rust nests modules).
fn import_cycles(src: &Path) -> Vec<String> {
    let modules = modules(src);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (path, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        for target in references(path, &text, &modules) {
            let is_ancestor = path.starts_with(&target);
            if !is_ancestor && &target != path {
                edges.entry(path.clone()).or_default().insert(target);
            }
        }
    }
    let mut cycles = Vec::new();
    for (from, targets) in &edges {
        for to in targets {
            // A cycle through `to` back to `from`, or to one of `from`'s descendants?
            let mut seen = BTreeSet::new();
            let mut stack = vec![to.clone()];
            while let Some(at) = stack.pop() {
                if !seen.insert(at.clone()) {
                    continue;
                }
                for next in edges.get(&at).into_iter().flatten() {
                    if next == from {
                        cycles.push(format!(
                            "{} -> {} -> … -> {}",
                            from.join("::"),
                            to.join("::"),
                            from.join("::")
                        ));
                    }
                    stack.push(next.clone());
                }
            }
        }
    }
    cycles
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let mut all = Vec::new();
    for krate in [
        "protocol",
        "reputation",
        "market",
        "kernels",
        "engine",
        "mesh",
        "ledger",
        "gateway",
        "provider",
        "node",
        "testnet",
        "tokenizer",
        "constrain",
    ] {
        for cycle in import_cycles(&workspace().join(krate).join("src")) {
            all.push(format!("{krate}: {cycle}"));
        }
    }
    assert!(
        all.is_empty(),
        "import cycles between files:\n{}",
        all.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
    std::fs::write(src.join("b.rs"), "use crate::{a::A, c};\npub struct B;\n").unwrap();
    std::fs::write(src.join("c.rs"), "use super::a::A;\n").unwrap();
    let cycles = import_cycles(src);
    assert!(cycles.iter().any(|c| c.starts_with("a -> b")), "{cycles:?}");
    std::fs::write(src.join("b.rs"), "pub struct B;\n").unwrap();
    assert!(import_cycles(src).is_empty());
}
