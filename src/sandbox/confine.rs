//! Apply a [`ShellPolicy`] to the calling process: the session's
//! supervisor, single-threaded, right before it starts the shell, so the
//! shell and everything it starts inherit the namespace and the Landlock
//! domain. Every step either holds or fails: a shell that asked for a
//! sandbox never starts without one.

use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use super::policy::ShellPolicy;

/// Why a shell could not be confined.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("cannot enter a private mount namespace: {step}: {source}")]
    Namespace {
        step: &'static str,
        source: std::io::Error,
    },
    #[error("cannot build the Landlock rules: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("Landlock was not fully enforced ({0})")]
    NotEnforced(String),
}

fn ns_step(step: &'static str) -> impl FnOnce(std::io::Error) -> ConfineError {
    move |source| ConfineError::Namespace { step, source }
}

/// Is `path` below a directory the namespace covers with a fresh tmpfs?
fn under_private(path: &Path) -> bool {
    (path.starts_with("/tmp") && path != Path::new("/tmp"))
        || (path.starts_with("/dev/shm") && path != Path::new("/dev/shm"))
}

/// A new user and mount namespace in which this process keeps its own uid
/// and gid (so files it creates belong to the worker's user outside too),
/// with `/tmp` and `/dev/shm` fresh tmpfs and each bind in place. A granted
/// path below `/tmp` (a working directory there) is bound back into the
/// fresh `/tmp` at the same path, alone: the rest of the host's `/tmp`
/// stays out of sight. Needs unprivileged user namespaces (or
/// `CAP_SYS_ADMIN`) and one thread. With nothing to bind (the namespace
/// probe's policy) it allocates nothing: the probe runs it in a forked
/// child (`cleanroom::probe_namespaces`).
pub fn enter_namespace(policy: &ShellPolicy) -> Result<(), ConfineError> {
    unshare_keeping_ids()?;
    // Nothing mounted here reaches the host's namespace.
    rustix::mount::mount_change(
        "/",
        rustix::mount::MountPropagationFlags::PRIVATE | rustix::mount::MountPropagationFlags::REC,
    )
    .map_err(|e| ns_step("make / private")(e.into()))?;
    // What must stay reachable once the tmpfs hides the host's /tmp: held
    // by descriptor (opened here, in the new namespace: a bind's source must
    // be one of its mounts), bound back from `/proc/self/fd/N` afterwards.
    let mut restore = Vec::new();
    if policy.private_tmp {
        for path in policy.read.iter().chain(&policy.write) {
            if under_private(path)
                && let Ok(fd) = open_path(path)
            {
                restore.push((fd, path.clone()));
            }
        }
    }
    let mut binds = Vec::new();
    for (from, to) in &policy.binds {
        let fd = open_path(from).map_err(|e| ns_step("open a memory folder to bind")(e.into()))?;
        binds.push((fd, to.clone()));
    }
    if policy.private_tmp {
        mount_tmpfs("/tmp").map_err(|e| ns_step("mount a private /tmp")(e.into()))?;
        // Without /dev/shm (some minimal images) POSIX shared memory is absent anyway.
        if Path::new("/dev/shm").is_dir() {
            mount_tmpfs("/dev/shm").map_err(|e| ns_step("mount a private /dev/shm")(e.into()))?;
        }
    }
    for (fd, target) in restore.iter().chain(&binds) {
        bind_back(fd, target)?;
    }
    Ok(())
}

/// Enter a new user and mount namespace, mapping this process's uid and
/// gid to themselves. Allocates nothing (the maps are formatted on the
/// stack): the namespace probe runs it in a forked child of the
/// multi-threaded worker, where an allocation could wait on a lock another
/// thread held at the fork.
fn unshare_keeping_ids() -> Result<(), ConfineError> {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    // SAFETY: no FILES flag; the supervisor is single-threaded.
    unsafe {
        rustix::thread::unshare_unsafe(
            rustix::thread::UnshareFlags::NEWUSER | rustix::thread::UnshareFlags::NEWNS,
        )
    }
    .map_err(|e| ns_step("unshare")(e.into()))?;
    // A non-dumpable process's /proc/self files belong to root: an
    // unprivileged supervisor could not write its own maps. Dumpable for
    // these three writes only (the shell's exec resets the flag anyway).
    use rustix::process::{DumpableBehavior, set_dumpable_behavior};
    let _ = set_dumpable_behavior(DumpableBehavior::Dumpable);
    let maps = (|| -> Result<(), ConfineError> {
        write_proc(c"/proc/self/setgroups", format_args!("deny")).map_err(ns_step("setgroups"))?;
        write_proc(c"/proc/self/uid_map", format_args!("{uid} {uid} 1\n"))
            .map_err(ns_step("uid_map"))?;
        write_proc(c"/proc/self/gid_map", format_args!("{gid} {gid} 1\n"))
            .map_err(ns_step("gid_map"))
    })();
    let _ = set_dumpable_behavior(DumpableBehavior::NotDumpable);
    maps
}

/// Write `text` to a `/proc` file in one `write`, formatted on the stack.
fn write_proc(path: &std::ffi::CStr, text: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut buf = [0u8; 64];
    let mut rest = &mut buf[..];
    rest.write_fmt(text)?;
    let unused = rest.len();
    let len = buf.len() - unused;
    let file = rustix::fs::open(
        path,
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let written = rustix::io::write(&file, &buf[..len])?;
    if written != len {
        return Err(std::io::ErrorKind::WriteZero.into());
    }
    Ok(())
}

/// `path`, held by an `O_PATH` descriptor.
fn open_path(path: &Path) -> rustix::io::Result<rustix::fd::OwnedFd> {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
}

/// A fresh tmpfs over `target`, open to all as `/tmp` is (sticky).
fn mount_tmpfs(target: &str) -> rustix::io::Result<()> {
    use rustix::mount::MountFlags;
    rustix::mount::mount(
        "tmpfs",
        target,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(c"mode=1777"),
    )
}

/// Bind what `fd` holds at `target`; below a private tmpfs, the mount
/// point is made first, at the same path.
fn bind_back(fd: &rustix::fd::OwnedFd, target: &Path) -> Result<(), ConfineError> {
    use std::os::fd::AsRawFd;
    let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if under_private(target) {
        // A mount point in the fresh tmpfs, at the same path.
        let is_dir = rustix::fs::fstat(fd).is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        });
        if is_dir {
            std::fs::create_dir_all(target).map_err(ns_step("make a mount point"))?;
        } else {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(ns_step("make a mount point"))?;
            }
            std::fs::File::create(target).map_err(ns_step("make a mount point"))?;
        }
    }
    rustix::mount::mount_bind_recursive(source.as_str(), target)
        .map_err(|e| ns_step("bind a granted path into the namespace")(e.into()))
}

/// Restrict this process (and what it starts) to `policy`'s allow-list,
/// with the rights of the ABI the probe found. A grant whose path does not
/// exist is skipped on its own; anything else that fails, or a status short
/// of fully enforced, is an error.
pub fn restrict(policy: &ShellPolicy) -> Result<(), ConfineError> {
    let abi = ABI::from(policy.abi);
    if abi == ABI::Unsupported {
        return Err(ConfineError::NotEnforced(
            "the kernel has no Landlock".into(),
        ));
    }
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))?;
    if !policy.tcp_ports.is_empty() {
        ruleset = ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?;
    }
    if policy.scoped {
        ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
    }
    let mut created = ruleset.create()?;
    let grants = policy
        .read
        .iter()
        .map(|p| (p, AccessFs::from_read(abi)))
        .chain(policy.write.iter().map(|p| (p, AccessFs::from_all(abi))))
        .chain(policy.devices.iter().map(|p| (p, AccessFs::from_file(abi))));
    for (path, access) in grants {
        // Opened with O_PATH; a missing path is skipped, never fatal.
        let Ok(fd) = PathFd::new(path) else { continue };
        let is_dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
        let access = if is_dir {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    for &port in &policy.tcp_ports {
        created = created.add_rule(NetPort::new(
            port,
            AccessNet::BindTcp | AccessNet::ConnectTcp,
        ))?;
    }
    let status = created.restrict_self()?;
    if status.ruleset != RulesetStatus::FullyEnforced || !status.no_new_privs {
        return Err(ConfineError::NotEnforced(format!(
            "ruleset {:?}, no_new_privs {}",
            status.ruleset, status.no_new_privs
        )));
    }
    Ok(())
}

/// Both steps, namespace first (mounting needs the rights Landlock takes).
pub fn apply(policy: &ShellPolicy) -> Result<(), ConfineError> {
    if policy.private_tmp || !policy.binds.is_empty() {
        enter_namespace(policy)?;
    }
    restrict(policy)
}
