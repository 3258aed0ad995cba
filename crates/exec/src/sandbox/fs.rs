//! The filesystem part of a sandbox: Landlock rules (what may be read, written, executed) and
//! masks (what is covered before the rules apply, since Landlock only ever adds access beneath a
//! path and cannot carve a protected file out of the workspace).

use super::{Bound, Cover, HIDDEN_DEFAULT, Mask, SYSTEM_READ_DIRS, SandboxError, cstring};
use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
    path_beneath_rules,
};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The Landlock ABI every sandbox needs: v2 for cross-directory renames and links (`Refer`),
/// v3 for truncation rights.
const ABI_REQUIRED: ABI = ABI::V3;

/// The name of the empty file in the scratch directory that masks hidden files.
const MASK_FILE: &str = ".ring0-masked";

/// Device nodes a confined process may read and write.
const DEVICES_READ_WRITE: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/pts",
];
/// Device nodes a confined process may read.
const DEVICES_READ: &[&str] = &["/dev/random", "/dev/urandom"];

/// Checks that the kernel enforces the Landlock ABI the sandbox needs.
pub(super) fn probe() -> Result<(), String> {
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI_REQUIRED))
        .and_then(|r| r.create())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The ruleset of one process, created here; the child only calls `landlock_restrict_self`.
pub(super) fn ruleset(bound: &Bound, scratch: &Path) -> Result<OwnedFd, SandboxError> {
    let rw = AccessFs::from_all(ABI_REQUIRED);
    let rx = AccessFs::from_read(ABI_REQUIRED);
    let dev_rw = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::ReadDir;
    let setup = |e: landlock::RulesetError| SandboxError::Setup(format!("Landlock: {e}"));

    check_exists(bound, &bound.workspace)?;
    for path in bound.profile.read.iter().chain(&bound.profile.write) {
        check_exists(bound, path)?;
    }
    let existing = |paths: &[&str]| -> Vec<PathBuf> {
        paths
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.exists())
            .collect()
    };
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(rw)
        .and_then(|r| r.create())
        .map_err(setup)?
        .add_rules(path_beneath_rules(existing(SYSTEM_READ_DIRS), rx))
        .and_then(|r| r.add_rules(path_beneath_rules(&bound.profile.read, rx)))
        .and_then(|r| {
            r.add_rules(path_beneath_rules(
                existing(DEVICES_READ),
                AccessFs::ReadFile,
            ))
        })
        .and_then(|r| r.add_rules(path_beneath_rules(existing(DEVICES_READ_WRITE), dev_rw)))
        .and_then(|r| r.add_rules(path_beneath_rules([&bound.workspace], rw)))
        .and_then(|r| r.add_rules(path_beneath_rules([scratch], rw)))
        .and_then(|r| r.add_rules(path_beneath_rules(&bound.profile.write, rw)))
        .map_err(setup)?;
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| SandboxError::Unavailable {
        feature: "Landlock (ABI 3 or later)",
        detail: "the ruleset was not created".into(),
    })
}

fn check_exists(bound: &Bound, path: &Path) -> Result<(), SandboxError> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) => Err(SandboxError::Path {
            profile: bound.profile.name.clone(),
            path: path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// The masks of one process: ring0's protected paths and the hidden system files covered with
/// empty read-only ones, the workspace's `.git/hooks` made read-only.
pub(super) fn masks(bound: &Bound, scratch: &Path) -> Result<Vec<Mask>, SandboxError> {
    let mask_file = scratch.join(MASK_FILE);
    std::fs::write(&mask_file, b"")
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&mask_file, std::fs::Permissions::from_mode(0o000))
        })
        .map_err(|e| SandboxError::Setup(format!("creating the mask file: {e}")))?;
    let mut masks = Vec::new();
    let hidden = HIDDEN_DEFAULT
        .iter()
        .map(PathBuf::from)
        .chain(bound.profile.hide.iter().cloned())
        .chain(bound.protected.iter().cloned());
    for path in hidden {
        // A path that does not exist has nothing to hide; one created later by ring0 is outside
        // the process's view of the workspace only if it is beneath a masked or denied path.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let cover = if meta.is_dir() {
            Cover::EmptyDir
        } else {
            Cover::EmptyFile(cstring(&mask_file)?)
        };
        masks.push(Mask {
            target: cstring(&path)?,
            cover,
            locked_flags: locked_flags(&path),
        });
    }
    let hooks = bound.workspace.join(".git").join("hooks");
    if hooks.is_dir() {
        masks.push(Mask {
            target: cstring(&hooks)?,
            cover: Cover::ReadOnly,
            locked_flags: locked_flags(&hooks),
        });
    }
    Ok(masks)
}

/// The flags of the mount `path` is on that a user namespace may not drop: a read-only remount
/// of a bind mount must repeat them.
fn locked_flags(path: &Path) -> libc::c_ulong {
    let Ok(stat) = rustix::fs::statvfs(path) else {
        return 0;
    };
    use rustix::fs::StatVfsMountFlags as F;
    let pairs = [
        (F::NOSUID, libc::MS_NOSUID),
        (F::NODEV, libc::MS_NODEV),
        (F::NOEXEC, libc::MS_NOEXEC),
        (F::NOATIME, libc::MS_NOATIME),
        (F::NODIRATIME, libc::MS_NODIRATIME),
        (F::RELATIME, libc::MS_RELATIME),
    ];
    pairs
        .iter()
        .filter(|(f, _)| stat.f_flag.contains(*f))
        .fold(0, |acc, (_, ms)| acc | ms)
}
