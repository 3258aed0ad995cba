//! `[sandbox]`: the OS sandbox of the processes ring0 starts (`shell`, background jobs, stdio
//! upstreams), its named profiles and which one each tool and upstream runs in.
//!
//! ```toml
//! [sandbox]
//! default = "workspace"            # a profile name, or "off" (explicit, printed at start)
//! tools = { shell = "workspace" }  # per tool (today: shell and its jobs)
//! upstreams = { files = "node" }   # per upstream alias
//!
//! [sandbox.profiles.node]
//! read = ["/opt/node"]             # more to read and execute (toolchains)
//! write = []                       # more to read and write
//! hide = []                        # more to mask
//! network = "none"                 # or "proxy", with `allow = ["host:port", …]` (port or *)
//! processes = 4096                 # most tasks of one process tree (its pids cgroup)
//! ```
//!
//! The built-in profile `workspace` (the workspace read-write, the system read-only, no network)
//! exists without being written; a file may redefine it.

use ring0_exec::sandbox::{NetworkPolicy, PROFILE_DEFAULT, SandboxProfile};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The value that turns the sandbox off where it is named.
pub const SANDBOX_OFF: &str = "off";
/// Most profiles one file may define.
pub const SANDBOX_PROFILES_MAX: usize = 64;
/// Most paths one profile may list in each of `read`, `write`, `hide` and `allow`.
pub const SANDBOX_PROFILE_PATHS_MAX: usize = 256;
/// The smallest `processes` a profile may set: a confined tree has a keeper, an init and the
/// program before the program starts anything.
pub const SANDBOX_PROCESSES_MIN: u64 = 8;
/// The largest `processes` a profile may set (the kernel's own ceiling on process ids).
pub const SANDBOX_PROCESSES_MAX: u64 = 4_194_304;

/// `[sandbox]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSection {
    /// The profile processes run in unless `tools` or `upstreams` name another; `"off"` runs them
    /// unconfined (then `shell` is not a sandboxed tool and stays held for approval). Default
    /// `"workspace"`.
    #[serde(default = "profile_default")]
    pub default: String,
    /// Tool name → profile (or `"off"`). Applies to `shell` and the jobs it starts.
    #[serde(default)]
    pub tools: BTreeMap<String, String>,
    /// Upstream alias → profile (or `"off"`), for stdio upstreams.
    #[serde(default)]
    pub upstreams: BTreeMap<String, String>,
    /// Named profiles.
    #[serde(default)]
    pub profiles: BTreeMap<String, ProfileSection>,
}

impl Default for SandboxSection {
    fn default() -> Self {
        Self {
            default: profile_default(),
            tools: BTreeMap::new(),
            upstreams: BTreeMap::new(),
            profiles: BTreeMap::new(),
        }
    }
}

fn profile_default() -> String {
    PROFILE_DEFAULT.to_owned()
}

/// One `[sandbox.profiles.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSection {
    /// More paths to read and execute (relative to the configuration file's directory, or
    /// absolute; each must exist). Default none.
    #[serde(default)]
    pub read: Vec<PathBuf>,
    /// More directories to read and write. Default none.
    #[serde(default)]
    pub write: Vec<PathBuf>,
    /// More paths to mask with an empty read-only file or directory. Default none.
    #[serde(default)]
    pub hide: Vec<PathBuf>,
    /// `"none"` (a private loopback only) or `"proxy"` (through ring0's egress proxy, to the
    /// hosts in `allow`). Default `"none"`.
    #[serde(default)]
    pub network: NetworkSection,
    /// With `network = "proxy"`: what the proxy lets through, as `host:port` rules (`host` a
    /// name, `*.suffix` or an IP literal; `port` a number or `*`). Default none.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Most tasks (processes and threads) one process tree of this profile may have at once,
    /// enforced by its pids cgroup. Default: the run's own limit (4096).
    #[serde(default)]
    pub processes: Option<u64>,
}

/// `network` of a profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkSection {
    /// A loopback of its own and nothing else.
    #[default]
    None,
    /// Outbound through ring0's egress proxy.
    Proxy,
}

/// Where a process runs: a resolved profile, or nowhere (off).
pub type Selection = Option<SandboxProfile>;

impl SandboxSection {
    /// Checks every name and list (paths are checked when resolved).
    pub fn check(&self) -> Result<(), (String, String)> {
        if self.profiles.len() > SANDBOX_PROFILES_MAX {
            return Err((
                "sandbox.profiles".into(),
                format!("at most {SANDBOX_PROFILES_MAX} profiles"),
            ));
        }
        for (name, p) in &self.profiles {
            let key = format!("sandbox.profiles.{name}");
            if name == SANDBOX_OFF || name.is_empty() {
                return Err((key, format!("{name:?} cannot name a profile")));
            }
            if let Some(n) = p.processes
                && !(SANDBOX_PROCESSES_MIN..=SANDBOX_PROCESSES_MAX).contains(&n)
            {
                return Err((
                    format!("{key}.processes"),
                    format!("{n} is outside {SANDBOX_PROCESSES_MIN}..={SANDBOX_PROCESSES_MAX}"),
                ));
            }
            for (list, len) in [
                ("read", p.read.len()),
                ("write", p.write.len()),
                ("hide", p.hide.len()),
                ("allow", p.allow.len()),
            ] {
                if len > SANDBOX_PROFILE_PATHS_MAX {
                    return Err((
                        format!("{key}.{list}"),
                        format!("at most {SANDBOX_PROFILE_PATHS_MAX} entries"),
                    ));
                }
            }
            if p.network == NetworkSection::None && !p.allow.is_empty() {
                return Err((format!("{key}.allow"), "needs network = \"proxy\"".into()));
            }
            for (i, rule) in p.allow.iter().enumerate() {
                ring0_egress::AllowRule::parse(rule)
                    .map_err(|e| (format!("{key}.allow[{i}]"), e.to_string()))?;
            }
        }
        self.known("sandbox.default".into(), &self.default)?;
        for (tool, name) in &self.tools {
            self.known(format!("sandbox.tools.{tool}"), name)?;
        }
        for (alias, name) in &self.upstreams {
            self.known(format!("sandbox.upstreams.{alias}"), name)?;
        }
        Ok(())
    }

    fn known(&self, key: String, name: &str) -> Result<(), (String, String)> {
        if name == SANDBOX_OFF || name == PROFILE_DEFAULT || self.profiles.contains_key(name) {
            Ok(())
        } else {
            Err((key, format!("no sandbox profile is named {name:?}")))
        }
    }

    /// Checks a profile a grant names for `shell`: a profile defined here (or the built-in
    /// one), never `"off"`, and only while `shell` runs in the sandbox at all (a grant's profile
    /// narrows or widens a confinement; it cannot turn one on or off).
    pub fn grant_profile(&self, key: String, name: &str) -> Result<(), (String, String)> {
        if name == SANDBOX_OFF {
            return Err((
                key,
                "a grant names a profile to run in; the sandbox is turned off only in [sandbox]"
                    .into(),
            ));
        }
        self.known(key.clone(), name)?;
        if self.tools.get("shell").unwrap_or(&self.default) == SANDBOX_OFF {
            return Err((
                key,
                "shell runs with its sandbox off ([sandbox]), so a grant cannot choose its profile"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Every profile a grant names (`sandbox`, `sandbox_wider`), resolved, by name.
    pub fn grant_profiles(
        &self,
        grants: &[crate::schema::GrantSection],
        base: &Path,
    ) -> Result<BTreeMap<String, SandboxProfile>, (String, String)> {
        let mut out = BTreeMap::new();
        for name in grants
            .iter()
            .flat_map(|g| g.sandbox.iter().chain(&g.sandbox_wider))
        {
            if !out.contains_key(name)
                && let Some(profile) = self.resolve(name, base)?
            {
                out.insert(name.clone(), profile);
            }
        }
        Ok(out)
    }

    /// The profile of a tool.
    pub fn for_tool(&self, tool: &str, base: &Path) -> Result<Selection, (String, String)> {
        let name = self.tools.get(tool).unwrap_or(&self.default);
        self.resolve(name, base)
    }

    /// The profile of a stdio upstream.
    pub fn for_upstream(&self, alias: &str, base: &Path) -> Result<Selection, (String, String)> {
        let name = self.upstreams.get(alias).unwrap_or(&self.default);
        self.resolve(name, base)
    }

    /// Every place the sandbox is off, for the notice printed at start.
    pub fn off_for(&self, upstream_aliases: &[&str]) -> Vec<String> {
        let mut off = Vec::new();
        let shell = self.tools.get("shell").unwrap_or(&self.default);
        if shell == SANDBOX_OFF {
            off.push("tool shell".to_owned());
        }
        for alias in upstream_aliases {
            if self.upstreams.get(*alias).unwrap_or(&self.default) == SANDBOX_OFF {
                off.push(format!("upstream {alias}"));
            }
        }
        off
    }

    fn resolve(&self, name: &str, base: &Path) -> Result<Selection, (String, String)> {
        if name == SANDBOX_OFF {
            return Ok(None);
        }
        let Some(p) = self.profiles.get(name) else {
            return Ok(Some(SandboxProfile::workspace()));
        };
        let key = format!("sandbox.profiles.{name}");
        let paths = |list: &[PathBuf], field: &str, must_exist: bool| {
            list.iter()
                .map(|path| {
                    let abs = base.join(path);
                    if must_exist && !abs.exists() {
                        return Err((
                            format!("{key}.{field}"),
                            format!("{} does not exist", abs.display()),
                        ));
                    }
                    Ok(abs)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Some(SandboxProfile {
            name: name.to_owned(),
            read: paths(&p.read, "read", true)?,
            write: paths(&p.write, "write", true)?,
            hide: paths(&p.hide, "hide", false)?,
            network: match p.network {
                NetworkSection::None => NetworkPolicy::None,
                NetworkSection::Proxy => NetworkPolicy::Proxy {
                    allow: p.allow.clone(),
                },
            },
            processes_max: p.processes,
        }))
    }
}

/// Prints, once per start, where the sandbox is off (it must never be off unnoticed).
pub fn announce(config: &crate::Config) {
    let aliases: Vec<&str> = config
        .upstreams
        .iter()
        .filter(|u| u.command.is_some())
        .map(|u| u.alias.as_str())
        .collect();
    let off = config.sandbox.off_for(&aliases);
    if !off.is_empty() {
        tracing::warn!(
            "sandbox = \"off\" for {}: these processes run unconfined, with ring0's own access; shell is held for approval",
            off.join(", ")
        );
    }
}

/// The sandbox of each stdio upstream, bound to the workspace and ring0's protected paths. A
/// server whose profile allows egress reaches the network through an egress proxy of its own
/// (served while it runs), every decision recorded in `audit` under `upstream:ALIAS`.
pub fn upstream_sandboxes(
    loaded: &crate::Loaded,
    audit: std::sync::Arc<dyn ring0_policy::AuditSink>,
) -> Result<BTreeMap<String, ring0_exec::Sandbox>, crate::ConfigError> {
    let protected = loaded.protected();
    let protected: Vec<PathBuf> = protected.files.into_iter().chain(protected.dirs).collect();
    let mut out = BTreeMap::new();
    for upstream in loaded
        .config
        .upstreams
        .iter()
        .filter(|u| u.command.is_some())
    {
        let selection = loaded
            .config
            .sandbox
            .for_upstream(&upstream.alias, &loaded.config_dir)
            .map_err(|(key, why)| crate::ConfigError {
                file: loaded.source.clone(),
                key,
                why,
            })?;
        let sandbox = match selection {
            Some(profile) => {
                let proxy = crate::egress::AuditedEgress::new(
                    audit.clone(),
                    crate::egress::upstream_origin(&upstream.alias),
                );
                ring0_exec::Sandbox::new(profile, &loaded.workspace, protected.clone())
                    .egress_proxy(std::sync::Arc::new(proxy))
            }
            None => ring0_exec::Sandbox::off(),
        };
        sandbox.check().map_err(|e| crate::ConfigError {
            file: loaded.source.clone(),
            key: format!("sandbox.upstreams.{}", upstream.alias),
            why: e.to_string(),
        })?;
        out.insert(upstream.alias.clone(), sandbox);
    }
    Ok(out)
}
