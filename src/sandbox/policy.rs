//! What one session's shell may reach: a pure allow-list, built from the
//! session's directories and the operator's additions, checked against the
//! worker's own paths, and carried to the supervisor on its command line.
//!
//! Nothing here touches the kernel: [`super::confine`] applies a policy.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Read and execute for every session, those that exist.
pub(crate) const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc",
];

/// Where write is never granted, nor anything inside (`/opt` is for
/// read-and-execute too, but an application's directory below it is a
/// working directory like any other).
const NO_WRITE_BELOW: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys",
    "/boot", "/run", "/dev",
];

/// The character devices every shell needs, read and write.
pub(crate) const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// A session's allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShellPolicy {
    /// Read and execute.
    pub read: Vec<PathBuf>,
    /// Read, write, create, remove, execute.
    pub write: Vec<PathBuf>,
    /// Character devices: read and write, as files.
    pub devices: Vec<PathBuf>,
    /// TCP ports the shell may bind and connect to; empty: TCP unrestricted.
    pub tcp_ports: Vec<u16>,
    /// Signals and abstract unix sockets scoped to the session (Landlock ABI 6+).
    pub scoped: bool,
    /// A private mount namespace: its own `/tmp` and `/dev/shm`, and `binds`.
    pub private_tmp: bool,
    /// `(folder, where the shell sees it)`: bind mounts in the namespace.
    pub binds: Vec<(PathBuf, PathBuf)>,
    /// The Landlock ABI the rules are written for.
    pub abi: i32,
}

impl ShellPolicy {
    /// What the namespace probe enters: a private `/tmp` and nothing to
    /// bind or restrict (so entering it allocates nothing).
    pub fn namespace_probe() -> ShellPolicy {
        ShellPolicy {
            private_tmp: true,
            ..Default::default()
        }
    }
}

/// A policy the worker must not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "write cannot be granted on {path}: it is / or a system directory (choose a working directory elsewhere)"
    )]
    SystemWrite { path: String },
    #[error(
        "{granted} would give the agent's shell the worker's {what} {path}: move it out of every path the shell is granted"
    )]
    Exposes {
        granted: String,
        what: &'static str,
        path: String,
    },
}

/// The worker's own paths, never reachable from a shell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protected {
    /// `(what, path)`: the state directory, the endpoint file, the worker's
    /// `HOME`, the directory holding the sessions' directories, `/run`.
    pub paths: Vec<(&'static str, PathBuf)>,
}

impl Protected {
    pub fn add(&mut self, what: &'static str, path: impl Into<PathBuf>) {
        self.paths.push((what, path.into()));
    }
}

/// What one session is given, before the checks.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    pub workdir: PathBuf,
    pub stores_rw: Vec<PathBuf>,
    pub stores_ro: Vec<PathBuf>,
    pub home: Option<PathBuf>,
    pub tmpdir: Option<PathBuf>,
    pub extra_read: Vec<PathBuf>,
    pub extra_write: Vec<PathBuf>,
    pub tcp_ports: Vec<u16>,
    pub scoped: bool,
    pub private_tmp: bool,
    pub binds: Vec<(PathBuf, PathBuf)>,
    pub abi: i32,
}

/// Collapse `.` and `..` by text (a grant is a path the operator or the
/// worker named; symlinks are resolved by the kernel when the rule's
/// directory is opened).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    out
}

/// `inner` is `outer` or below it.
fn within(inner: &Path, outer: &Path) -> bool {
    lexical(inner).starts_with(lexical(outer))
}

impl Grants {
    /// The allow-list, or why it must not be applied. `/tmp` and `/dev/shm`
    /// are granted in either case: private (a tmpfs in the session's mount
    /// namespace) or shared with the replica's other sessions.
    pub fn policy(&self, protected: &Protected) -> Result<ShellPolicy, PolicyError> {
        let mut read: Vec<PathBuf> = SYSTEM_DIRS.iter().map(PathBuf::from).collect();
        read.extend(self.stores_ro.iter().cloned());
        read.extend(self.extra_read.iter().cloned());
        let mut write = vec![self.workdir.clone()];
        write.extend(self.stores_rw.iter().cloned());
        write.extend(self.home.iter().cloned());
        write.extend(self.tmpdir.iter().cloned());
        write.extend(self.extra_write.iter().cloned());
        write.push("/tmp".into());
        write.push("/dev/shm".into());
        for path in &write {
            let p = lexical(path);
            // `/dev/shm` is a tmpfs for anyone's files, not a device.
            let shared_memory = within(&p, Path::new("/dev/shm"));
            if p == Path::new("/")
                || NO_WRITE_BELOW.iter().any(|d| within(&p, Path::new(d))) && !shared_memory
            {
                return Err(PolicyError::SystemWrite {
                    path: path.display().to_string(),
                });
            }
        }
        for granted in read.iter().chain(&write) {
            // A private /tmp hides the host's: nothing of it is reachable.
            let hidden = self.private_tmp
                && (lexical(granted) == Path::new("/tmp")
                    || lexical(granted) == Path::new("/dev/shm"));
            if hidden {
                continue;
            }
            for (what, path) in &protected.paths {
                if within(path, granted) {
                    return Err(PolicyError::Exposes {
                        granted: granted.display().to_string(),
                        what,
                        path: path.display().to_string(),
                    });
                }
            }
        }
        Ok(ShellPolicy {
            read,
            write,
            devices: DEVICES.iter().map(PathBuf::from).collect(),
            tcp_ports: self.tcp_ports.clone(),
            scoped: self.scoped,
            private_tmp: self.private_tmp,
            binds: self.binds.clone(),
            abi: self.abi,
        })
    }
}

/// The flag that starts a policy on the supervisor's command line.
pub(crate) const ARG: &str = "--sandbox";

impl ShellPolicy {
    /// The supervisor's arguments before the program: `--sandbox ABI` then
    /// one flag per rule, ended by `--`. Paths only: no secret ever travels
    /// here.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![ARG.into(), self.abi.to_string().into()];
        let mut push = |flag: &str, value: OsString| {
            args.push(flag.into());
            args.push(value);
        };
        for p in &self.read {
            push("--read", p.clone().into());
        }
        for p in &self.write {
            push("--write", p.clone().into());
        }
        for p in &self.devices {
            push("--device", p.clone().into());
        }
        for port in &self.tcp_ports {
            push("--tcp", port.to_string().into());
        }
        for (from, to) in &self.binds {
            push("--bind", from.clone().into());
            push("--at", to.clone().into());
        }
        if self.scoped {
            args.push("--scoped".into());
        }
        if self.private_tmp {
            args.push("--private-tmp".into());
        }
        args.push("--".into());
        args
    }

    /// Parse [`Self::to_args`]'s output from the front of `args`; returns the
    /// policy (when `args` starts with one) and the rest (the program).
    pub fn from_args(args: &[OsString]) -> Result<(Option<ShellPolicy>, &[OsString]), String> {
        if args.first().is_none_or(|a| a != ARG) {
            return Ok((None, args));
        }
        let text = |i: usize| -> Result<&str, String> {
            args.get(i)
                .and_then(|a| a.to_str())
                .ok_or_else(|| format!("argument {i} is missing or not UTF-8"))
        };
        let mut policy = ShellPolicy {
            abi: text(1)?.parse().map_err(|e| format!("bad ABI: {e}"))?,
            ..Default::default()
        };
        let mut i = 2;
        let mut pending_bind: Option<PathBuf> = None;
        loop {
            let flag = text(i)?;
            let value = || {
                args.get(i + 1)
                    .map(PathBuf::from)
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag {
                "--" => return Ok((Some(policy), &args[i + 1..])),
                "--scoped" => policy.scoped = true,
                "--private-tmp" => policy.private_tmp = true,
                "--read" => policy.read.push(value()?),
                "--write" => policy.write.push(value()?),
                "--device" => policy.devices.push(value()?),
                "--tcp" => policy
                    .tcp_ports
                    .push(text(i + 1)?.parse().map_err(|e| format!("bad port: {e}"))?),
                "--bind" => pending_bind = Some(value()?),
                "--at" => {
                    let from = pending_bind.take().ok_or("--at without --bind")?;
                    policy.binds.push((from, value()?));
                }
                other => return Err(format!("unknown sandbox argument {other:?}")),
            }
            i += if matches!(flag, "--scoped" | "--private-tmp") {
                1
            } else {
                2
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(workdir: &str) -> Grants {
        Grants {
            workdir: workdir.into(),
            abi: 6,
            ..Default::default()
        }
    }

    fn protected() -> Protected {
        let mut p = Protected::default();
        p.add("state directory", "/var/lib/envworker");
        p.add("endpoint file", "/config/envworker.toml");
        p.add("HOME", "/home/worker");
        p.add("directory holding the sessions' directories", "/workspace");
        p.add("runtime directory", "/run");
        p
    }

    #[test]
    fn which_working_directories_are_refused() {
        let table: &[(&str, bool)] = &[
            ("/", false),
            ("/usr", false),
            ("/usr/local/src", false),
            ("/etc/app", false),
            ("/proc/1", false),
            ("/dev", false),
            ("/dev/pts", false),
            ("/dev/shm/work", true),
            ("/tmp/work", true),
            ("/run/x", false),
            ("/workspace/../usr", false),
            ("/opt/app", true),
            ("/srv/work", true),
            ("/workspace/session-1", true),
            // The directory holding the sessions' directories.
            ("/workspace", false),
            // An ancestor of the state directory.
            ("/var", false),
            ("/var/lib", false),
            ("/var/work", true),
            // The worker's HOME and anything holding it; a project below it
            // is its own subtree (HOME's dotfiles stay out of reach).
            ("/home", false),
            ("/home/worker", false),
            ("/home/worker/project", true),
            ("/home/agent", true),
        ];
        for &(workdir, ok) in table {
            let got = grants(workdir).policy(&protected());
            assert_eq!(got.is_ok(), ok, "{workdir}: {got:?}");
        }
    }

    #[test]
    fn a_protected_path_under_a_read_grant_is_refused() {
        let mut p = protected();
        p.add("endpoint file", "/etc/envworker/envworker.toml");
        let err = grants("/srv/w").policy(&p).unwrap_err();
        assert!(
            matches!(&err, PolicyError::Exposes { granted, .. } if granted == "/etc"),
            "{err}"
        );
        let mut g = grants("/srv/w");
        g.extra_read.push("/config".into());
        assert!(
            g.policy(&protected()).is_err(),
            "an operator's read grant over the endpoint file"
        );
    }

    #[test]
    fn a_shared_tmp_exposes_what_lives_there_and_a_private_one_does_not() {
        let mut p = protected();
        p.add("state directory", "/tmp/envworker-1000");
        let shared = grants("/srv/w").policy(&p);
        assert!(
            matches!(&shared, Err(PolicyError::Exposes { granted, .. }) if granted == "/tmp"),
            "{shared:?}"
        );
        let mut private = grants("/srv/w");
        private.private_tmp = true;
        assert!(private.policy(&p).is_ok());
    }

    #[test]
    fn the_policy_lists_every_grant() {
        let g = Grants {
            workdir: "/srv/w".into(),
            stores_rw: vec!["/mnt/memory/notes".into()],
            stores_ro: vec!["/mnt/memory/docs".into()],
            home: Some("/srv/rooms/s/home".into()),
            tmpdir: Some("/srv/rooms/s/tmp".into()),
            extra_read: vec!["/srv/cache".into()],
            extra_write: vec!["/srv/pip".into()],
            tcp_ports: vec![5432],
            scoped: true,
            private_tmp: true,
            binds: vec![("/srv/rooms/s/mnt".into(), "/mnt/memory".into())],
            abi: 6,
        };
        let p = g.policy(&protected()).unwrap();
        for w in [
            "/srv/w",
            "/mnt/memory/notes",
            "/srv/rooms/s/home",
            "/srv/rooms/s/tmp",
            "/srv/pip",
            "/tmp",
            "/dev/shm",
        ] {
            assert!(p.write.contains(&PathBuf::from(w)), "{w} writable");
        }
        for r in ["/usr", "/etc", "/proc", "/mnt/memory/docs", "/srv/cache"] {
            assert!(p.read.contains(&PathBuf::from(r)), "{r} readable");
        }
        assert!(
            !p.write.contains(&PathBuf::from("/mnt/memory/docs")),
            "a read-only store is read only"
        );
        assert!(p.devices.contains(&PathBuf::from("/dev/null")));
    }

    #[test]
    fn the_policy_survives_the_command_line() {
        let g = Grants {
            workdir: "/srv/w w".into(),
            tcp_ports: vec![22, 5432],
            scoped: true,
            private_tmp: true,
            binds: vec![("/a".into(), "/mnt/memory".into())],
            abi: 4,
            ..Default::default()
        };
        let policy = g.policy(&Protected::default()).unwrap();
        let mut args = policy.to_args();
        args.extend(["/bin/bash".into(), "--norc".into()]);
        let (back, rest) = ShellPolicy::from_args(&args).unwrap();
        assert_eq!(back.as_ref(), Some(&policy));
        assert_eq!(
            rest,
            &[OsString::from("/bin/bash"), OsString::from("--norc")]
        );
        let plain = [OsString::from("/bin/bash")];
        assert_eq!(ShellPolicy::from_args(&plain).unwrap(), (None, &plain[..]));
        let bad = [
            OsString::from(ARG),
            "6".into(),
            "--what".into(),
            "x".into(),
            "--".into(),
        ];
        assert!(ShellPolicy::from_args(&bad).is_err());
        let unterminated = [
            OsString::from(ARG),
            "6".into(),
            "--read".into(),
            "/x".into(),
        ];
        assert!(ShellPolicy::from_args(&unterminated).is_err());
    }
}
