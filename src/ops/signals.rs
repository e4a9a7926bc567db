//! SIGTERM and SIGINT for code that blocks on threads rather than in async tasks (the local
//! launcher): [`Interrupts::install`] takes both signals from the moment it returns, and
//! [`Interrupts::wait`] blocks until one arrives.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::error::{Result, Status};

/// SIGTERM and SIGINT, taken from their default action (exit) while this lives.
pub struct Interrupts {
    runtime: tokio::runtime::Runtime,
    term: Signal,
    int: Signal,
}

impl Interrupts {
    /// Installs the handlers; a signal from now on is held for [`Interrupts::wait`].
    pub fn install() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|e| Status::internal(format!("cannot build the signal runtime: {e}")))?;
        let (term, int) = runtime.block_on(async {
            let refuse = |e: std::io::Error| {
                Status::internal(format!("cannot install a signal handler: {e}"))
            };
            Ok::<_, Status>((
                signal(SignalKind::terminate()).map_err(refuse)?,
                signal(SignalKind::interrupt()).map_err(refuse)?,
            ))
        })?;
        Ok(Self { runtime, term, int })
    }

    /// Blocks until SIGTERM (`"sigterm"`) or SIGINT (`"sigint"`) arrives; `None` when no more
    /// can.
    pub fn wait(mut self) -> Option<&'static str> {
        let Self {
            runtime, term, int, ..
        } = &mut self;
        runtime.block_on(async {
            tokio::select! {
                got = term.recv() => got.map(|()| "sigterm"),
                got = int.recv() => got.map(|()| "sigint"),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_sent_after_install_is_waited_for_not_fatal() {
        let interrupts = Interrupts::install().unwrap();
        // SAFETY: raising a signal whose handler is installed.
        unsafe { libc::raise(libc::SIGINT) };
        assert_eq!(interrupts.wait(), Some("sigint"));
    }
}
