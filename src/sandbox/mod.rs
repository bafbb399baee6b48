//! The agent's shell in a sandbox: one Landlock domain per session, and a
//! private mount namespace where the kernel lets an unprivileged process
//! make one. Needs no root and no capability.
//!
//! - [`policy`] — pure: what one session's shell may reach (an allow-list:
//!   system directories read-only, its own working directory, stores,
//!   `HOME` and `TMPDIR` read-write), checked against the worker's own
//!   paths, carried to the supervisor on its command line.
//! - [`probe`] — what the kernel can enforce: the Landlock ABI (file system;
//!   TCP ports from 4; signal and abstract-socket scopes from 6) and
//!   namespaces, probed once.
//! - [`confine`] — applied by the session's supervisor (`envworker
//!   __supervise`, see [`crate::cleanroom`]) to itself right before it
//!   starts the shell: namespace (private `/tmp`, `/dev/shm`, the session's
//!   own `/mnt/memory`), then `landlock_restrict_self`, whose status is
//!   checked. Everything the agent starts inherits both.
//!
//! [`Mode`] says how much of this a replica demands: `off` (the reference's
//! unconfined shell: the container is the boundary), `auto` (what the
//! kernel offers, said once at start), `require` (all of it or no start).
//! With one session at a time the default is `off`; with several at once,
//! `require`.

pub mod confine;
pub mod policy;
pub mod probe;

use std::path::{Path, PathBuf};

pub use policy::{Grants, PolicyError, Protected, ShellPolicy};
pub use probe::Capabilities;

/// Where the server advertises memory stores; with a namespace, each
/// session sees its own folders there.
pub const MOUNT_ROOT: &str = "/mnt/memory";

/// The supervisor's namespace-only mode: the namespace probe's steps
/// (`cleanroom::probe_namespaces`) as a process of its own, for a diagnosis as
/// another user (`envworker __supervise --probe-namespace`, exit 0 when the
/// namespace can be made).
pub const NAMESPACE_PROBE: &str = "--probe-namespace";

/// How much confinement a replica demands of its shells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// No sandbox: the shell runs as the worker's user, as the reference's.
    Off,
    /// Whatever the kernel offers; a missing feature is logged, not fatal.
    Auto,
    /// The whole sandbox, or the worker does not start.
    Require,
}

impl Mode {
    /// The default for an endpoint serving `concurrency` items at once.
    pub fn default_for(concurrency: usize) -> Mode {
        if concurrency > 1 {
            Mode::Require
        } else {
            Mode::Off
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Auto => "auto",
            Mode::Require => "require",
        }
    }
}

/// What the operator adds to every session's allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Additions {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub tcp_ports: Vec<u16>,
}

/// The sandbox an endpoint's sessions get, decided once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enforcement {
    pub landlock_abi: i32,
    pub additions: Additions,
    /// The worker's own paths, never granted.
    pub protected: Protected,
    /// Where the stores are advertised (`/mnt/memory`), when each session
    /// can see its own there (a bind in its namespace); `None`: every
    /// session's stores share the host's mount paths.
    pub own_mount_root: Option<PathBuf>,
}

impl Enforcement {
    /// What the kernel gives (waits for the namespace probe, once).
    pub fn caps(&self) -> Capabilities {
        Capabilities {
            landlock_abi: self.landlock_abi,
            namespaces: probe::namespaces_available(),
        }
    }

    /// Each session sees its own `own_mount_root` (namespaces and a root).
    pub fn own_mounts(&self) -> Option<&Path> {
        self.own_mount_root
            .as_deref()
            .filter(|_| probe::namespaces_available())
    }

    /// One session's allow-list.
    pub fn grants(&self, workdir: &Path, room: &SessionRoom) -> Grants {
        self.grants_with(self.caps(), workdir, room)
    }

    /// [`Self::grants`] for given capabilities.
    pub fn grants_with(&self, caps: Capabilities, workdir: &Path, room: &SessionRoom) -> Grants {
        Grants {
            workdir: workdir.to_path_buf(),
            stores_rw: Vec::new(),
            stores_ro: Vec::new(),
            home: Some(room.home.clone()),
            tmpdir: room.tmpdir.clone(),
            // Its own `/mnt/memory` lists only its own stores: `ls` works
            // there as on the reference's host.
            extra_read: room
                .mount_root
                .iter()
                .filter(|_| caps.namespaces && self.own_mount_root.is_some())
                .cloned()
                .chain(self.additions.read.iter().cloned())
                .collect(),
            extra_write: self.additions.write.clone(),
            tcp_ports: if caps.tcp() {
                self.additions.tcp_ports.clone()
            } else {
                Vec::new()
            },
            scoped: caps.scopes(),
            private_tmp: caps.namespaces,
            binds: match (&self.own_mount_root, &room.mount_root) {
                (Some(shown), Some(actual)) if caps.namespaces => {
                    vec![(actual.clone(), shown.clone())]
                }
                _ => Vec::new(),
            },
            abi: caps.landlock_abi,
        }
    }

    /// The start-up line's fields and the metric's: waits for the probe's
    /// answer, without starting it (it starts once the start-up is done).
    pub fn describe(&self) -> Described {
        self.describe_with(Capabilities {
            landlock_abi: self.landlock_abi,
            namespaces: probe::namespaces_once_probed(),
        })
    }

    /// [`Self::describe`] without waiting: `/readyz` answers at once, and
    /// says `namespaces: false` until the probe has answered.
    pub fn describe_now(&self) -> Described {
        self.describe_with(Capabilities {
            landlock_abi: self.landlock_abi,
            namespaces: probe::namespaces_if_known().unwrap_or(false),
        })
    }

    fn describe_with(&self, caps: Capabilities) -> Described {
        Described {
            mode: "enforced",
            landlock_abi: caps.landlock_abi,
            file_system: true,
            scopes: caps.scopes(),
            tcp_filter: caps.tcp() && !self.additions.tcp_ports.is_empty(),
            namespaces: caps.namespaces,
            tmp: if caps.namespaces { "private" } else { "shared" },
        }
    }
}

/// What is enforced, for operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Described {
    /// `enforced`, or `off`.
    pub mode: &'static str,
    pub landlock_abi: i32,
    pub file_system: bool,
    pub scopes: bool,
    pub tcp_filter: bool,
    pub namespaces: bool,
    /// `private`, `shared` (between this replica's sessions), or `unconfined`.
    pub tmp: &'static str,
}

impl Described {
    pub fn off(caps: Capabilities) -> Described {
        Described {
            mode: "off",
            landlock_abi: caps.landlock_abi,
            file_system: false,
            scopes: false,
            tcp_filter: false,
            namespaces: false,
            tmp: "unconfined",
        }
    }
}

/// Why a replica refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    #[error("--shell-sandbox require: {missing}. {advice}")]
    Missing {
        missing: String,
        advice: &'static str,
    },
    #[error("--shell-sandbox: {0}")]
    Policy(PolicyError),
}

impl From<PolicyError> for SandboxError {
    fn from(e: PolicyError) -> Self {
        SandboxError::Policy(e)
    }
}

const ADVICE_CONCURRENT: &str = "Sessions side by side need a sandbox: lower --max-concurrent-items to 1 (one session per replica, the container as the boundary), or pass --shell-sandbox off to accept sessions sharing one user";
const ADVICE_SINGLE: &str =
    "Pass --shell-sandbox auto to take what the kernel offers, or --shell-sandbox off";

/// Decide an endpoint's sandbox from its mode and the probe: `Ok(None)`
/// off (or `auto` on a kernel without Landlock: the caller logs that),
/// `Err` when `require` cannot be met.
pub fn decide(
    mode: Mode,
    concurrency: usize,
    caps: Capabilities,
    supervised: bool,
    additions: &Additions,
) -> Result<Option<i32>, SandboxError> {
    let advice = if concurrency > 1 {
        ADVICE_CONCURRENT
    } else {
        ADVICE_SINGLE
    };
    let missing = if !supervised {
        Some(
            "the shell has no supervisor to confine it (the library runs inside another program)"
                .to_string(),
        )
    } else if caps.landlock_abi == 0 {
        Some("this kernel has no Landlock (Linux 5.13 or newer, with landlock in the boot's lsm= list)".to_string())
    } else if !additions.tcp_ports.is_empty() && !caps.tcp() {
        Some(format!(
            "--shell-allow-tcp needs Landlock ABI 4 (Linux 6.7); this kernel has ABI {}",
            caps.landlock_abi
        ))
    } else {
        None
    };
    match (mode, missing) {
        (Mode::Off, _) => Ok(None),
        (Mode::Require, Some(missing)) => Err(SandboxError::Missing { missing, advice }),
        (Mode::Auto, Some(_)) if caps.landlock_abi == 0 || !supervised => Ok(None),
        (_, _) => Ok(Some(caps.landlock_abi)),
    }
}

/// A session's own directories outside its working directory: `HOME`,
/// `TMPDIR` when `/tmp` is shared, and where its memory folders live when
/// it has its own `/mnt/memory`. Keyed by session, so a dead worker's
/// folders are found again by the session's next claim.
#[derive(Debug, Clone)]
pub struct SessionRoom {
    pub path: PathBuf,
    pub home: PathBuf,
    pub tmpdir: Option<PathBuf>,
    pub mount_root: Option<PathBuf>,
}

impl SessionRoom {
    /// Create `<rooms>/<session>/home` (and `tmp`, `mnt`), owner-only.
    pub fn create(
        rooms: &Path,
        session_id: &str,
        private_tmp: bool,
        own_mounts: bool,
    ) -> std::io::Result<SessionRoom> {
        use std::os::unix::fs::DirBuilderExt;
        if session_id.is_empty() || session_id.contains('/') || session_id.starts_with('.') {
            return Err(std::io::Error::other("not a session id"));
        }
        let path = rooms.join(session_id);
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true).mode(0o700);
        builder.create(&path)?;
        let home = path.join("home");
        builder.create(&home)?;
        let tmpdir = if private_tmp {
            None
        } else {
            let tmp = path.join("tmp");
            builder.create(&tmp)?;
            Some(tmp)
        };
        let mount_root = if own_mounts {
            let m = path.join("mnt");
            builder.create(&m)?;
            Some(m)
        } else {
            None
        };
        Ok(SessionRoom {
            path,
            home,
            tmpdir,
            mount_root,
        })
    }

    /// The shell's `HOME` and `TMPDIR`.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("HOME".to_string(), self.home.display().to_string())];
        env.push((
            "TMPDIR".to_string(),
            self.tmpdir
                .as_ref()
                .map(|t| t.display().to_string())
                .unwrap_or_else(|| "/tmp".into()),
        ));
        env
    }

    /// Remove `home` and `tmp` (by fd, never through the agent's links);
    /// `mnt` goes only when the memory engine left it empty (a folder it
    /// kept holds edits its journal recovers), and the room with it.
    pub fn discard(self) {
        let Ok(room) =
            rustix::fs::open(&self.path, crate::fsx::DIR_FLAGS, rustix::fs::Mode::empty())
        else {
            return;
        };
        for name in ["home", "tmp"] {
            let _ = crate::fsx::remove_tree_at(&room, name);
        }
        let _ = rustix::fs::unlinkat(&room, "mnt", rustix::fs::AtFlags::REMOVEDIR);
        let _ = std::fs::remove_dir(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(abi: i32, ns: bool) -> Capabilities {
        Capabilities {
            landlock_abi: abi,
            namespaces: ns,
        }
    }

    #[test]
    fn the_default_mode_follows_the_concurrency() {
        assert_eq!(Mode::default_for(1), Mode::Off);
        assert_eq!(Mode::default_for(2), Mode::Require);
        assert_eq!(Mode::default_for(64), Mode::Require);
    }

    #[test]
    fn what_each_mode_decides_on_each_kernel() {
        let none = Additions::default();
        let tcp = Additions {
            tcp_ports: vec![5432],
            ..Default::default()
        };
        // (mode, concurrency, caps, supervised, additions, expected: Ok(Some)/Ok(None)/Err)
        let table: &[(Mode, usize, Capabilities, bool, &Additions, &str)] = &[
            (Mode::Off, 4, caps(0, false), true, &none, "none"),
            (Mode::Off, 1, caps(7, true), true, &none, "none"),
            (Mode::Auto, 1, caps(7, true), true, &none, "some"),
            (Mode::Auto, 1, caps(0, true), true, &none, "none"),
            (Mode::Auto, 1, caps(3, false), true, &tcp, "some"),
            (Mode::Auto, 1, caps(7, true), false, &none, "none"),
            (Mode::Require, 2, caps(7, false), true, &none, "some"),
            (Mode::Require, 2, caps(0, true), true, &none, "err"),
            (Mode::Require, 1, caps(3, true), true, &tcp, "err"),
            (Mode::Require, 1, caps(4, true), true, &tcp, "some"),
            (Mode::Require, 2, caps(7, true), false, &none, "err"),
        ];
        for (mode, n, c, sup, add, want) in table {
            let got = decide(*mode, *n, *c, *sup, add);
            let kind = match &got {
                Ok(Some(_)) => "some",
                Ok(None) => "none",
                Err(_) => "err",
            };
            assert_eq!(kind, *want, "{mode:?} ×{n} {c:?} supervised={sup}: {got:?}");
        }
        let err = decide(Mode::Require, 2, caps(0, true), true, &none)
            .unwrap_err()
            .to_string();
        for part in ["Landlock", "--max-concurrent-items", "--shell-sandbox off"] {
            assert!(err.contains(part), "the refusal names {part}: {err}");
        }
    }

    #[test]
    fn a_room_has_a_home_and_a_tmp_only_when_tmp_is_shared() {
        let dir = tempfile::tempdir().unwrap();
        let shared = SessionRoom::create(dir.path(), "sesn_a", false, false).unwrap();
        assert!(shared.home.is_dir());
        assert!(shared.tmpdir.as_ref().unwrap().is_dir());
        assert!(shared.env().contains(&(
            "TMPDIR".into(),
            shared.tmpdir.as_ref().unwrap().display().to_string()
        )));
        let private = SessionRoom::create(dir.path(), "sesn_b", true, true).unwrap();
        assert!(private.tmpdir.is_none());
        assert!(private.env().contains(&("TMPDIR".into(), "/tmp".into())));
        assert!(private.mount_root.as_ref().unwrap().is_dir());
        assert!(SessionRoom::create(dir.path(), "../x", true, false).is_err());
        std::fs::write(shared.home.join("f"), "x").unwrap();
        let path = shared.path.clone();
        shared.discard();
        assert!(!path.exists());
    }
}
