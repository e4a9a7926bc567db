//! What a daemon tells systemd, and how it learns it runs under it.
//!
//! * Readiness (`Type=notify`): [`Notifier`] speaks the `sd_notify` protocol, one datagram of
//!   `KEY=VALUE` lines to the unix socket named by `NOTIFY_SOCKET` (a path, or `@name` in the
//!   abstract namespace). `tessera serve` sends `READY=1` once the gRPC port is bound and the
//!   actors are up, `STATUS=` lines as it goes, and `STOPPING=1` when it starts draining.
//! * Watchdog (`WatchdogSec=`): systemd sets `WATCHDOG_USEC` (and `WATCHDOG_PID`);
//!   [`watchdog_interval`] is half of it, the period `sd_watchdog_enabled` recommends, at which
//!   the daemon sends `WATCHDOG=1` while it is serving.
//! * Logs: under systemd, stderr goes to journald, which sets `JOURNAL_STREAM` to the stream's
//!   `device:inode`; [`logs_to_journal`] tells the logger to drop colours and timestamps (the
//!   journal stamps every line itself).
//!
//! The protocol is a handful of lines, written here rather than pulled in as a crate; outside
//! systemd (no `NOTIFY_SOCKET`) every call does nothing.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// A command that runs `program` with `listener` handed over as systemd socket activation
/// does: fd 3, `LISTEN_FDS=1` and `LISTEN_PID` naming the program (a shell sets it to its own
/// pid, `$$`, then `exec`s the program, which keeps the pid). `tessera local` starts its tasks
/// this way, so no port is picked twice; the caller adds the program's arguments and must keep
/// `listener` open until the command is spawned.
pub fn socket_activated(program: &std::path::Path, listener: &std::net::TcpListener) -> Command {
    let fd = listener.as_raw_fd();
    let mut command = Command::new("/bin/sh");
    command
        .args(["-c", r#"LISTEN_PID=$$ exec "$0" "$@""#])
        .arg(program)
        .env("LISTEN_FDS", "1");
    // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl) run.
    unsafe {
        command.pre_exec(move || {
            if fd == 3 {
                // dup2 onto itself keeps close-on-exec; clear it by hand.
                let flags = libc::fcntl(3, libc::F_GETFD);
                if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// A handle on systemd's notification socket.
pub struct Notifier {
    socket: UnixDatagram,
    target: SocketAddr,
}

impl Notifier {
    /// The notifier of `NOTIFY_SOCKET`, or `None` when the variable is unset (not started by
    /// systemd with `Type=notify`). A variable that names no usable socket is an error, so a
    /// broken unit is reported instead of silently never becoming ready.
    pub fn from_env() -> io::Result<Option<Self>> {
        match std::env::var_os("NOTIFY_SOCKET") {
            None => Ok(None),
            Some(path) if path.is_empty() => Ok(None),
            Some(path) => Self::connect(&path.to_string_lossy()).map(Some),
        }
    }

    /// A notifier sending to `path`: a filesystem path, or `@name` for the abstract namespace.
    pub fn connect(path: &str) -> io::Result<Self> {
        let target = match path.strip_prefix('@') {
            Some(name) => abstract_address(name)?,
            None if path.starts_with('/') => SocketAddr::from_pathname(path)?,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "NOTIFY_SOCKET=\"{path}\" is neither an absolute path nor an @abstract \
                         name"
                    ),
                ))
            }
        };
        Ok(Self {
            socket: UnixDatagram::unbound()?,
            target,
        })
    }

    /// Sends `state`: newline-separated assignments such as `READY=1\nSTATUS=serving`.
    pub fn notify(&self, state: &str) -> io::Result<()> {
        let sent = self.socket.send_to_addr(state.as_bytes(), &self.target)?;
        if sent != state.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("sd_notify sent {sent} of {} bytes", state.len()),
            ));
        }
        Ok(())
    }
}

#[cfg(target_os = "linux")]
fn abstract_address(name: &str) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name.as_bytes())
}

#[cfg(not(target_os = "linux"))]
fn abstract_address(name: &str) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!("NOTIFY_SOCKET=@{name}: abstract sockets exist only on Linux"),
    ))
}

/// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, when it is set for this process
/// (`WATCHDOG_PID` unset or ours). `None` when systemd runs no watchdog for us.
pub fn watchdog_interval() -> Option<Duration> {
    let pid = std::env::var("WATCHDOG_PID").ok();
    let usec = std::env::var("WATCHDOG_USEC").ok();
    watchdog_interval_of(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// [`watchdog_interval`] over given values (tests).
fn watchdog_interval_of(usec: Option<&str>, pid: Option<&str>, own: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(own) {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec / 2))
}

/// Whether stderr goes to the journal: `JOURNAL_STREAM` is set and, where it can be checked,
/// names stderr's own `device:inode` (a child whose stderr was redirected must not take the
/// variable it inherited for its own).
pub fn logs_to_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let stream = stream.to_string_lossy();
    match std::fs::metadata("/proc/self/fd/2") {
        Ok(meta) => {
            use std::os::unix::fs::MetadataExt;
            stream == format!("{}:{}", meta.dev(), meta.ino())
        }
        // No /proc to check against: trust the variable.
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_fires_at_half_its_timeout_for_this_pid_only() {
        assert_eq!(
            watchdog_interval_of(Some("2000000"), None, 7),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            watchdog_interval_of(Some("2000000"), Some("7"), 7),
            Some(Duration::from_secs(1))
        );
        assert_eq!(watchdog_interval_of(Some("2000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_of(None, None, 7), None);
        assert_eq!(watchdog_interval_of(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_of(Some("soon"), None, 7), None);
    }

    #[test]
    fn a_notification_arrives_as_one_datagram() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let systemd = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::connect(path.to_str().unwrap()).unwrap();
        notifier.notify("READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let n = systemd.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
    }

    #[test]
    fn a_relative_socket_path_is_refused() {
        let err = Notifier::connect("run/notify").err().unwrap();
        assert!(err.to_string().contains("NOTIFY_SOCKET"), "{err}");
    }
}
