//! The roots an upstream is told: what ring0 answers its `roots/list` with.
//!
//! A server that asks for roots (the filesystem reference server does, at start) replaces the
//! directories it was started with by the answer, so the answer decides what it may touch. It is
//! the upstream's own `roots` from config — by default none, which leaves the server with its own
//! directories — and never the client's: a request for roots is answered here, never relayed.
//! Each configured root must be a directory within what the workspace grants the tools to read,
//! and must neither contain nor lie inside a protected path (the config file, the lock file, the
//! state directory); otherwise the gateway refuses to start, naming the root.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The absolute, symlink-free form of `p`, or of its parent joined with its name when `p` does
/// not exist yet (a lock file not yet written is still protected).
fn real(p: &Path) -> PathBuf {
    if let Ok(r) = std::fs::canonicalize(p) {
        return r;
    }
    match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| p.to_path_buf()),
        _ => p.to_path_buf(),
    }
}

/// Resolves an upstream's configured roots into `roots/list` entries. `granted` are the
/// directories the workspace grants (relative to `workspace` or absolute); `protected` the paths
/// no root may contain or lie inside.
pub fn resolve(
    configured: &[PathBuf],
    workspace: &Path,
    granted: &[PathBuf],
    protected: &[PathBuf],
) -> Result<Vec<Value>, String> {
    let granted: Vec<PathBuf> = granted
        .iter()
        .filter_map(|g| std::fs::canonicalize(workspace.join(g)).ok())
        .collect();
    let protected: Vec<PathBuf> = protected.iter().map(|p| real(&workspace.join(p))).collect();
    let mut out = Vec::with_capacity(configured.len());
    for root in configured {
        let shown = root.display();
        let dir = std::fs::canonicalize(workspace.join(root))
            .map_err(|e| format!("root {shown}: {e}"))?;
        if !dir.is_dir() {
            return Err(format!("root {shown} is not a directory"));
        }
        if !granted.iter().any(|g| dir.starts_with(g)) {
            return Err(format!(
                "root {shown} ({}) is outside the directories the workspace grants ([paths])",
                dir.display()
            ));
        }
        if let Some(p) = protected
            .iter()
            .find(|p| dir.starts_with(p) || p.starts_with(&dir))
        {
            return Err(format!(
                "root {shown} ({}) would give the server ring0's own {}; name a directory that neither holds nor lies inside it",
                dir.display(),
                p.display()
            ));
        }
        let uri = url::Url::from_directory_path(&dir)
            .map_err(|()| format!("root {shown}: no file URI for {}", dir.display()))?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string());
        out.push(json!({"uri": uri.as_str().trim_end_matches('/'), "name": name}));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> tempfile::TempDir {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ws.path().join("data/sub")).unwrap();
        std::fs::create_dir_all(ws.path().join(".ring0")).unwrap();
        std::fs::write(ws.path().join("ring0.toml"), "").unwrap();
        ws
    }

    fn protected() -> Vec<PathBuf> {
        vec!["ring0.toml".into(), "ring0.lock".into(), ".ring0".into()]
    }

    #[test]
    fn no_roots_configured_answers_none() {
        let ws = workspace();
        assert_eq!(
            resolve(&[], ws.path(), &[".".into()], &protected()),
            Ok(vec![])
        );
    }

    #[test]
    fn a_granted_directory_is_answered_as_a_file_uri() {
        let ws = workspace();
        let roots = resolve(&["data".into()], ws.path(), &[".".into()], &protected()).unwrap();
        let real = std::fs::canonicalize(ws.path().join("data")).unwrap();
        assert_eq!(roots[0]["uri"], format!("file://{}", real.display()));
        assert_eq!(roots[0]["name"], "data");
    }

    #[test]
    fn the_workspace_itself_is_refused_because_it_holds_the_config() {
        let ws = workspace();
        let e = resolve(&[".".into()], ws.path(), &[".".into()], &protected()).unwrap_err();
        assert!(e.contains("ring0's own"), "{e}");
    }

    #[test]
    fn a_root_inside_the_state_dir_or_outside_the_grants_is_refused() {
        let ws = workspace();
        let e = resolve(&[".ring0".into()], ws.path(), &[".".into()], &protected()).unwrap_err();
        assert!(e.contains("ring0's own"), "{e}");
        let e = resolve(
            &["data".into()],
            ws.path(),
            &["data/sub".into()],
            &protected(),
        )
        .unwrap_err();
        assert!(e.contains("outside the directories"), "{e}");
        let e = resolve(&["/".into()], ws.path(), &[".".into()], &protected()).unwrap_err();
        assert!(e.contains("outside") || e.contains("ring0's own"), "{e}");
    }
}
