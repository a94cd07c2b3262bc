//! Configuration: `<data-dir>/config.toml` for every flag of every role, overridden by
//! `SHAREMESH_*` environment variables, overridden by flags.
//!
//! Every flag `--some-flag` of every subcommand reads `SHAREMESH_SOME_FLAG`. Before the
//! command line is parsed, the config file's table for the subcommand being run (and
//! its top-level keys) are exported as those variables — only where the variable is
//! not already set, so the environment wins over the file and flags win over both.
//!
//! ```toml
//! log_format = "json"          # top level: global flags
//! [provide]
//! price = 0.2                  # USD per million tokens
//! region = "eu-west"
//! tier = ["on_demand", "interruptible"]
//! [gateway]
//! http = "127.0.0.1:8080"
//! max_price = 1.0
//! ```

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Arg, ArgAction, Command};

pub const CONFIG_FILE: &str = "config.toml";

/// `SHAREMESH_` + the flag's name in upper snake case.
pub fn env_name(arg_id: &str) -> String {
    format!("SHAREMESH_{}", arg_id.to_uppercase().replace('-', "_"))
}

fn with_env_arg(arg: Arg) -> Arg {
    if arg.is_positional() || arg.get_id() == "help" || arg.get_id() == "version" {
        return arg;
    }
    let name: &'static str = Box::leak(env_name(arg.get_id().as_str()).into_boxed_str());
    let arg = arg.env(name);
    if matches!(arg.get_action(), ArgAction::Append) {
        arg.value_delimiter(',')
    } else {
        arg
    }
}

/// Gives every flag of `command` and its subcommands its `SHAREMESH_*` variable.
pub fn with_env(command: Command) -> Command {
    command.mut_args(with_env_arg).mut_subcommands(with_env)
}

fn toml_to_env(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Array(items) => Some(
            items
                .iter()
                .filter_map(toml_to_env)
                .collect::<Vec<_>>()
                .join(","),
        ),
        toml::Value::Datetime(d) => Some(d.to_string()),
        toml::Value::Table(_) => None,
    }
}

/// The data folder and subcommand named on a command line, before clap parses it.
fn peek(args: &[OsString]) -> (Option<PathBuf>, Option<String>) {
    let mut data_dir = None;
    let mut positionals: Vec<String> = Vec::new();
    let mut iter = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned());
    while let Some(arg) = iter.next() {
        if let Some(dir) = arg.strip_prefix("--data-dir=") {
            data_dir = Some(PathBuf::from(dir));
        } else if arg == "--data-dir" {
            data_dir = iter.next().map(PathBuf::from);
        } else if arg == "--log-format" {
            iter.next();
        } else if !arg.starts_with('-') {
            positionals.push(arg);
        }
    }
    // `config show ROLE` shows ROLE's section.
    let subcommand = match positionals.first().map(String::as_str) {
        Some("config") => Some(
            positionals
                .get(2)
                .cloned()
                .unwrap_or_else(|| "provide".to_owned()),
        ),
        _ => positionals.into_iter().next(),
    };
    (data_dir, subcommand)
}

/// Reads the config file of the data folder on `args` and exports its values for the
/// subcommand about to run. Returns the file's path, if it exists.
pub fn load_into_env(args: &[OsString]) -> Result<Option<PathBuf>> {
    let (flag_dir, subcommand) = peek(args);
    let data_dir =
        match flag_dir.or_else(|| std::env::var_os("SHAREMESH_DATA_DIR").map(PathBuf::from)) {
            Some(dir) => dir,
            None => match data_dir(None) {
                Ok(dir) => dir,
                Err(_) => return Ok(None),
            },
        };
    let path = data_dir.join(CONFIG_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("{} is not valid TOML", path.display()))?;
    for (key, value) in &table {
        match value {
            toml::Value::Table(section) if Some(key) == subcommand.as_ref() => {
                for (key, value) in section {
                    export(key, value);
                }
            }
            toml::Value::Table(_) => {}
            value => export(key, value),
        }
    }
    Ok(Some(path))
}

fn export(key: &str, value: &toml::Value) {
    let name = env_name(key);
    if std::env::var_os(&name).is_none() {
        if let Some(text) = toml_to_env(value) {
            std::env::set_var(name, text);
        }
    }
}

/// `sharemesh config show [ROLE]`: each flag of the role with its effective value
/// (from the environment — which includes the config file — or the default) and source.
pub fn show(
    command: &Command,
    role: &str,
    file: Option<&Path>,
    file_table: &BTreeMap<String, String>,
) -> Result<String> {
    let sub = command
        .find_subcommand(role)
        .with_context(|| format!("no subcommand `{role}` (try provide or gateway)"))?;
    let mut out = format!("# effective configuration of `sharemesh {role}`\n");
    if let Some(file) = file {
        out.push_str(&format!("# config file: {}\n", file.display()));
    }
    out.push_str(&format!("[{role}]\n"));
    for arg in sub.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.is_positional() || id == "help" || id == "version" {
            continue;
        }
        let name = env_name(id);
        let (value, source) = match std::env::var(&name) {
            Ok(value) if file_table.get(id).is_some_and(|v| v == &value) => {
                (Some(value), "config file".to_owned())
            }
            Ok(value) => (Some(value), format!("env {name}")),
            Err(_) => {
                let defaults: Vec<String> = arg
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect();
                if defaults.is_empty() {
                    (None, "unset".to_owned())
                } else {
                    (Some(defaults.join(",")), "default".to_owned())
                }
            }
        };
        match value {
            Some(value) => out.push_str(&format!("{id} = {value:?}  # {source}\n")),
            None => out.push_str(&format!("# {id} (unset)\n")),
        }
    }
    Ok(out)
}

/// The config file's values for `role`, as the strings exported to the environment.
pub fn file_values(path: Option<&Path>, role: &str) -> BTreeMap<String, String> {
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return BTreeMap::new();
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return BTreeMap::new();
    };
    let mut values = BTreeMap::new();
    for (key, value) in &table {
        match value {
            toml::Value::Table(section) if key == role => {
                for (key, value) in section {
                    if let Some(v) = toml_to_env(value) {
                        values.insert(key.clone(), v);
                    }
                }
            }
            toml::Value::Table(_) => {}
            value => {
                if let Some(v) = toml_to_env(value) {
                    values.insert(key.clone(), v);
                }
            }
        }
    }
    values
}

/// The data folder: the flag/env, else the platform data folder.
pub fn data_dir(flag: Option<PathBuf>) -> Result<PathBuf> {
    match flag {
        Some(dir) => Ok(dir),
        None => dirs::data_dir()
            .map(|d| d.join("sharemesh"))
            .context("no platform data folder; pass --data-dir"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peeks_data_dir_and_subcommand() {
        let args: Vec<OsString> = [
            "sharemesh",
            "--log-format",
            "json",
            "--data-dir",
            "/x",
            "provide",
            "--price",
            "1",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        assert_eq!(
            peek(&args),
            (Some(PathBuf::from("/x")), Some("provide".to_owned()))
        );
    }

    #[test]
    fn env_names_are_upper_snake_case() {
        assert_eq!(env_name("max-price"), "SHAREMESH_MAX_PRICE");
        assert_eq!(env_name("data_dir"), "SHAREMESH_DATA_DIR");
    }
}
