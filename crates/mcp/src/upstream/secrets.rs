//! Secret values of an upstream connection: variables of a stdio child and headers of an HTTP
//! server taken from ring0's environment or from files, so that none has to be written in
//! `ring0.toml`.
//!
//! They are resolved at each connection (a rotated token file is read again at the next start)
//! and held as [`Secret`]s, whose `Debug` shows nothing; every value is registered with the log
//! so that no line shows it, not even one an upstream prints itself. An error names the key and
//! the variable or file, never a value. A secret file inside the workspace is refused: the
//! model's tools read the workspace.

use crate::config::UpstreamConfig;
use crate::log::Log;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest secret file read.
pub const SECRET_FILE_BYTES_MAX: u64 = 64 * 1024;

/// A value that must not be shown.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// The secret part of one upstream's connection.
#[derive(Debug, Default, Clone)]
pub struct Resolved {
    /// Child variables (stdio).
    pub env: BTreeMap<String, Secret>,
    /// Request headers (HTTP), `Authorization` included when a token is configured.
    pub headers: BTreeMap<String, Secret>,
}

/// Reads every secret source of `config`. Relative file paths start at `workspace`; files
/// inside it are refused.
pub fn resolve(config: &UpstreamConfig, workspace: &Path) -> Result<Resolved, String> {
    let mut out = Resolved::default();
    for (child, var) in &config.env_from_env {
        out.env.insert(
            child.clone(),
            from_env(&format!("env_from_env.{child}"), var)?,
        );
    }
    for (child, file) in &config.env_from_file {
        out.env.insert(
            child.clone(),
            from_file(&format!("env_from_file.{child}"), file, workspace)?,
        );
    }
    for (header, var) in &config.headers_env {
        out.headers.insert(
            header.clone(),
            header_value(
                &format!("headers_env.{header}"),
                from_env(&format!("headers_env.{header}"), var)?,
            )?,
        );
    }
    for (header, file) in &config.headers_file {
        let key = format!("headers_file.{header}");
        out.headers.insert(
            header.clone(),
            header_value(&key, from_file(&key, file, workspace)?)?,
        );
    }
    let token = match (&config.token_env, &config.token_file) {
        (Some(var), _) => Some(("token_env", from_env("token_env", var)?)),
        (None, Some(file)) => Some(("token_file", from_file("token_file", file, workspace)?)),
        (None, None) => None,
    };
    if let Some((key, token)) = token {
        let bearer = Secret(format!("Bearer {}", token.expose()));
        out.headers
            .insert("Authorization".into(), header_value(key, bearer)?);
    }
    Ok(out)
}

/// Registers every value with the log (and the bare token behind `Bearer `).
pub fn register(resolved: &Resolved, log: &Log) {
    for s in resolved.env.values().chain(resolved.headers.values()) {
        let v = s.expose();
        let ok = log.redact(v) && v.strip_prefix("Bearer ").is_none_or(|t| log.redact(t));
        if !ok {
            log.line("too many secret values to hide from the log; some may show");
        }
    }
}

fn from_env(key: &str, var: &str) -> Result<Secret, String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(Secret(v)),
        Ok(_) => Err(format!("{key}: the variable {var} is empty")),
        Err(std::env::VarError::NotPresent) => Err(format!("{key}: the variable {var} is not set")),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("{key}: the variable {var} is not valid UTF-8"))
        }
    }
}

fn from_file(key: &str, file: &Path, workspace: &Path) -> Result<Secret, String> {
    let path: PathBuf = workspace.join(file);
    let real =
        std::fs::canonicalize(&path).map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    let ws = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    if real.starts_with(&ws) {
        return Err(format!(
            "{key}: {} is inside the workspace, where the model's tools can read it; keep secret files outside it",
            path.display()
        ));
    }
    let mut text = String::new();
    std::fs::File::open(&real)
        .and_then(|f| f.take(SECRET_FILE_BYTES_MAX + 1).read_to_string(&mut text))
        .map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    if text.len() as u64 > SECRET_FILE_BYTES_MAX {
        return Err(format!(
            "{key}: {} is larger than {SECRET_FILE_BYTES_MAX} bytes",
            path.display()
        ));
    }
    let value = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text)
        .to_string();
    if value.is_empty() {
        return Err(format!("{key}: {} is empty", path.display()));
    }
    Ok(Secret(value))
}

fn header_value(key: &str, value: Secret) -> Result<Secret, String> {
    if reqwest::header::HeaderValue::from_str(value.expose()).is_err() {
        return Err(format!(
            "{key}: the value is not a valid header value (control characters or non-ASCII)"
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> UpstreamConfig {
        toml::from_str(&format!(
            "alias = \"s\"\nurl = \"http://127.0.0.1:1/mcp\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn a_token_file_becomes_a_bearer_header_without_its_newline_and_debug_hides_it() {
        let outside = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let file = outside.path().join("token");
        std::fs::write(&file, "s3cret-token\n").unwrap();
        let c = config(&format!("token_file = {:?}", file.display().to_string()));
        let r = resolve(&c, ws.path()).unwrap();
        assert_eq!(r.headers["Authorization"].expose(), "Bearer s3cret-token");
        assert!(!format!("{r:?}").contains("s3cret"));
    }

    #[test]
    fn a_secret_file_inside_the_workspace_is_refused() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("token"), "t0ken").unwrap();
        let c = config("token_file = \"token\"");
        let e = resolve(&c, ws.path()).unwrap_err();
        assert!(e.contains("inside the workspace"), "{e}");
        assert!(!e.contains("t0ken"), "{e}");
    }

    #[test]
    fn a_missing_variable_is_named_and_fails_the_start() {
        let c = config("headers_env = { \"X-Api-Key\" = \"RING0_TEST_SURELY_UNSET_VAR\" }");
        let e = resolve(&c, Path::new("/")).unwrap_err();
        assert!(
            e.contains("headers_env.X-Api-Key") && e.contains("RING0_TEST_SURELY_UNSET_VAR"),
            "{e}"
        );
    }
}
