//! The seccomp filter of a sandbox: system calls a confined process has no business making fail
//! with `EPERM` (never a kill, which would look like a crash); `clone3`, whose flags a filter
//! cannot read, fails with `ENOSYS` so that C libraries fall back to `clone`, whose flags it can.

use super::SandboxError;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// System calls refused outright.
const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_userfaultfd,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_quotactl,
    libc::SYS_vhangup,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_lookup_dcookie,
];

/// The bits of `socket`'s type argument that hold the type (the rest are flags).
const SOCKET_TYPE_MASK: u64 = 0xf;

/// `clone` flags that make a namespace.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWTIME as u64,
];

/// The two filters (the EPERM list, then the ENOSYS one), compiled once.
pub(super) fn filter() -> Result<Arc<[BpfProgram; 2]>, SandboxError> {
    static FILTER: OnceLock<Result<Arc<[BpfProgram; 2]>, String>> = OnceLock::new();
    FILTER
        .get_or_init(|| compile().map(Arc::new).map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| SandboxError::Setup(format!("seccomp filter: {e}")))
}

fn arch() -> Result<TargetArch, seccompiler::BackendError> {
    TargetArch::try_from(std::env::consts::ARCH)
}

fn compile() -> Result<[BpfProgram; 2], seccompiler::Error> {
    let arg = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value)
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|nr| (*nr, Vec::new())).collect();
    // clone(flags, …): any namespace flag.
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|flag| SeccompRule::new(vec![arg(0, SeccompCmpOp::MaskedEq(*flag), *flag)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    // socket(domain, type, …): packet sockets, and raw IP sockets (netlink, which the C
    // library's address lookups use, stays open: it only reaches the process's own namespace).
    let raw = |domain: libc::c_int| -> Result<SeccompRule, seccompiler::Error> {
        Ok(SeccompRule::new(vec![
            arg(0, SeccompCmpOp::Eq, domain as u64)?,
            arg(
                1,
                SeccompCmpOp::MaskedEq(SOCKET_TYPE_MASK),
                libc::SOCK_RAW as u64,
            )?,
        ])?)
    };
    let socket_rules = vec![
        SeccompRule::new(vec![arg(0, SeccompCmpOp::Eq, libc::AF_PACKET as u64)?])?,
        raw(libc::AF_INET)?,
        raw(libc::AF_INET6)?,
    ];
    rules.insert(libc::SYS_socket, socket_rules);
    // ioctl(fd, TIOCSTI, …): typing into the terminal of whoever reads it next.
    rules.insert(
        libc::SYS_ioctl,
        vec![SeccompRule::new(vec![SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::TIOCSTI,
        )?])?],
    );
    let eperm = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )?;
    let enosys = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )?;
    Ok([eperm.try_into()?, enosys.try_into()?])
}
