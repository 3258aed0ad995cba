//! `ring0 init`: a commented `ring0.toml` for a workspace.
//!
//! The file states every section with its default, commented, so a person sees what can be
//! set; the embedded default grants stay in force (they merge with the file's own). MCP servers
//! already configured for common clients — Claude Desktop, Claude Code (`.mcp.json`, and the
//! project's entry in `~/.claude.json`), Cursor (`.cursor/mcp.json`), VS Code
//! (`.vscode/mcp.json`) — are written out as commented `[[upstreams]]` to move behind ring0.
//! Values of their environment variables and headers are never copied (they are often
//! secrets): each is taken from ring0's environment under the same name.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Largest client configuration file read (`~/.claude.json` holds a history and grows).
pub const CLIENT_CONFIG_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Most upstreams written out from client configuration files.
pub const FOUND_UPSTREAMS_MAX: usize = 64;
use ring0_mcp::limits::ALIAS_BYTES_MAX;

/// An MCP server found in a client's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundServer {
    /// The alias it would get (derived from the client's name for it).
    pub alias: String,
    /// The file it was found in.
    pub source: PathBuf,
    /// How it is reached.
    pub transport: FoundTransport,
}

/// How a found server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundTransport {
    /// A child process.
    Stdio {
        /// Program.
        command: String,
        /// Arguments.
        args: Vec<String>,
        /// Names of the environment variables the client set (values are not kept).
        env: Vec<String>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The URL.
        url: String,
        /// Names of the headers the client sent (values are not kept).
        headers: Vec<String>,
    },
}

/// The client configuration files looked at, with the key holding their servers: the
/// workspace's own files, then the user's (`home`), then Claude Desktop's.
pub fn client_config_files(workspace: &Path, home: Option<&Path>) -> Vec<(PathBuf, &'static str)> {
    let mut out = vec![
        (workspace.join(".mcp.json"), "mcpServers"),
        (workspace.join(".cursor/mcp.json"), "mcpServers"),
        (workspace.join(".vscode/mcp.json"), "servers"),
    ];
    if let Some(home) = home {
        out.push((home.join(".claude.json"), "mcpServers"));
        out.push((home.join(".cursor/mcp.json"), "mcpServers"));
        out.push((
            home.join(".config/Claude/claude_desktop_config.json"),
            "mcpServers",
        ));
        out.push((
            home.join("Library/Application Support/Claude/claude_desktop_config.json"),
            "mcpServers",
        ));
    }
    out
}

/// The MCP servers configured in the client files of `workspace` and `home`, each once (by
/// alias, the first found wins), at most [`FOUND_UPSTREAMS_MAX`]. A file that is absent,
/// too large or not JSON is skipped and named in the second list with the reason.
pub fn find_servers(workspace: &Path, home: Option<&Path>) -> (Vec<FoundServer>, Vec<String>) {
    let mut found: Vec<FoundServer> = Vec::new();
    let mut skipped = Vec::new();
    for (file, key) in client_config_files(workspace, home) {
        if !file.is_file() {
            continue;
        }
        let value = match read_json(&file) {
            Ok(v) => v,
            Err(why) => {
                skipped.push(format!("{}: {why}", file.display()));
                continue;
            }
        };
        let mut tables: Vec<&Map<String, Value>> = Vec::new();
        tables.extend(value.get(key).and_then(Value::as_object));
        // `~/.claude.json` keeps a project's servers under its path.
        if let Some(project) = value
            .get("projects")
            .and_then(|p| p.get(workspace.to_string_lossy().as_ref()))
        {
            tables.extend(project.get("mcpServers").and_then(Value::as_object));
        }
        for (name, entry) in tables.into_iter().flatten() {
            let Some(transport) = transport_of(entry) else {
                continue;
            };
            if is_ring0(&transport) {
                continue;
            }
            let alias = alias_for(name, &found);
            if found.len() < FOUND_UPSTREAMS_MAX {
                found.push(FoundServer {
                    alias,
                    source: file.clone(),
                    transport,
                });
            }
        }
    }
    (found, skipped)
}

fn read_json(file: &Path) -> Result<Value, String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(file)
        .and_then(|f| {
            f.take(CLIENT_CONFIG_BYTES_MAX + 1)
                .read_to_string(&mut text)
        })
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > CLIENT_CONFIG_BYTES_MAX {
        return Err(format!("larger than {CLIENT_CONFIG_BYTES_MAX} bytes"));
    }
    // VS Code's files are JSON with comments.
    serde_json::from_str(&strip_json_comments(&text)).map_err(|e| format!("not JSON: {e}"))
}

/// `text` with `//` and `/* */` comments outside strings replaced by spaces.
fn strip_json_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_string, mut escaped) = (false, false);
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

fn transport_of(entry: &Value) -> Option<FoundTransport> {
    let keys = |field: &str| -> Vec<String> {
        entry
            .get(field)
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    if let Some(url) = entry.get("url").and_then(Value::as_str) {
        return Some(FoundTransport::Http {
            url: url.to_string(),
            headers: keys("headers"),
        });
    }
    let command = entry.get("command").and_then(Value::as_str)?.to_string();
    let args = entry
        .get("args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Some(FoundTransport::Stdio {
        command,
        args,
        env: keys("env"),
    })
}

/// A client already pointed at ring0 is not an upstream of it.
fn is_ring0(transport: &FoundTransport) -> bool {
    matches!(transport, FoundTransport::Stdio { command, .. }
        if Path::new(command).file_name().is_some_and(|n| n == "ring0"))
}

/// An alias the gateway accepts, derived from a client's name for a server and distinct from
/// those already taken.
fn alias_for(name: &str, taken: &[FoundServer]) -> String {
    let mut base = String::new();
    for c in name.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' {
            c
        } else {
            '_'
        };
        if !(c == '_' && base.ends_with('_')) {
            base.push(c);
        }
    }
    if !base.starts_with(|c: char| c.is_ascii_alphabetic()) {
        base.insert_str(0, "s_");
    }
    base.truncate(ALIAS_BYTES_MAX - 3);
    let base = base.trim_end_matches('_').to_string();
    let mut alias = base.clone();
    let mut n = 2;
    while taken.iter().any(|f| f.alias == alias) {
        alias = format!("{base}-{n}");
        n += 1;
    }
    alias
}

/// A TOML string literal.
fn quote(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// The text of a commented `ring0.toml` for `workspace`, with `found` as commented upstreams.
pub fn render(workspace: &Path, found: &[FoundServer]) -> String {
    let mut out = format!(
        "# ring0.toml for {}\n\
         # Every key is documented in docs/config.md; `ring0 config check` shows what this file\n\
         # resolves to: the grants in effect, the tools listed and why any is not.\n\n\
         # The embedded default grants (reads and sandboxed writes in the workspace; shell and\n\
         # anything else held for a person's approval) are added after the grants below. Set\n\
         # `defaults = false` here, before the first table, to use only this file's grants.\n\
         # defaults = true\n",
        workspace.display()
    );
    out.push_str(TEMPLATE);
    out.push_str(
        "\n# MCP servers to serve behind ring0 (`ring0 serve`), their tools as alias__tool.\n",
    );
    if found.is_empty() {
        out.push_str(
            "# None were found in the configuration files of Claude Desktop, Claude Code,\n\
             # Cursor or VS Code. A stdio server looks like this:\n\
             #\n\
             # [[upstreams]]\n\
             # alias = \"fs\"\n\
             # command = \"npx\"\n\
             # args = [\"-y\", \"@modelcontextprotocol/server-filesystem\", \".\"]\n\
             # env = [\"PATH\", \"HOME\"]\n",
        );
        return out;
    }
    out.push_str(
        "# Found in client configuration files; uncomment those ring0 should serve, and remove\n\
         # them from the client so it reaches them only through ring0. Values of environment\n\
         # variables and headers were not copied: ring0 passes each from its own environment.\n",
    );
    for server in found {
        out.push_str(&render_upstream(server));
    }
    out
}

fn render_upstream(server: &FoundServer) -> String {
    let mut lines = vec![
        format!("from {}", server.source.display()),
        "[[upstreams]]".to_string(),
        format!("alias = {}", quote(&server.alias)),
    ];
    let map = |names: &[String]| {
        names
            .iter()
            .map(|n| format!("{} = {}", quote(n), quote(&env_name(n))))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match &server.transport {
        FoundTransport::Stdio { command, args, env } => {
            lines.push(format!("command = {}", quote(command)));
            if !args.is_empty() {
                let args: Vec<String> = args.iter().map(|a| quote(a)).collect();
                lines.push(format!("args = [{}]", args.join(", ")));
            }
            lines.push("env = [\"PATH\", \"HOME\"]".to_string());
            if !env.is_empty() {
                lines.push(format!("env_from_env = {{ {} }}", map(env)));
            }
        }
        FoundTransport::Http { url, headers } => {
            lines.push(format!("url = {}", quote(url)));
            if !headers.is_empty() {
                lines.push(format!("headers_env = {{ {} }}", map(headers)));
            }
        }
    }
    let mut out = String::from("\n");
    for line in lines {
        out.push_str("# ");
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The environment variable a header's or variable's value is taken from: its name in upper
/// case, other characters as `_`.
fn env_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

const TEMPLATE: &str = r#"
[workspace]
# The workspace, relative to this file's directory.
root = "."
# ring0's state (journal, audit log, approvals, pins); default outside the workspace.
# state_dir = "/path/to/state"

[paths]
# Directories the file tools may read, and write (relative to the workspace or absolute).
read = ["."]
write = ["."]

# Grants are consulted in order; the first that names a tool decides for it.
# Example: let `cargo` and `git status` run without approval (other commands are held):
#
# [[grants]]
# name = "build"
# tools = ["shell"]
# ceiling = "A2"
# rules = ["args.argv[0] == 'cargo' || (args.argv[0] == 'git' && args.argv[1] == 'status')"]
# unattended = true

[limits]
# Calls per session, and per principal, all tools together ("N/s", "N/min", "N/h", "N/day").
# session_rate = "120/min"
# principal_rate = "600/h"
max_concurrent_tools = 8

[approval]
# Seconds a held call waits for a person.
timeout_secs = 300

[audit]
# The hash-chained decision log, relative to the state directory.
path = "audit.jsonl"
include_args = false

[shell]
# "A2" (the least a command may be judged at) or "A3" (always held for approval).
authority = "A2"
# env_allow = ["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"]
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_outside_strings_are_stripped() {
        let text = "{ // a\n \"u\": \"http://x//y\", /* b */ \"n\": 1 }";
        let v: Value = serde_json::from_str(&strip_json_comments(text)).unwrap();
        assert_eq!(v["u"], "http://x//y");
        assert_eq!(v["n"], 1);
    }

    #[test]
    fn aliases_are_valid_and_distinct() {
        let first = FoundServer {
            alias: alias_for("my server", &[]),
            source: PathBuf::from("x"),
            transport: FoundTransport::Http {
                url: "http://x".into(),
                headers: vec![],
            },
        };
        assert_eq!(first.alias, "my_server");
        assert_eq!(alias_for("my server", &[first]), "my_server-2");
        assert_eq!(alias_for("1x__y_", &[]), "s_1x_y");
    }
}
