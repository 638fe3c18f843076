//! Graceful shutdown as a value: a cloneable signal that servers and background loops
//! wait on. [`Shutdown::on_signals`] fires it on SIGINT or SIGTERM.

use std::time::Duration;
use tokio::sync::watch;

/// Cloneable "time to stop" signal.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// The side that fires a [`Shutdown`].
#[derive(Debug)]
pub struct Trigger {
    tx: watch::Sender<bool>,
}

impl Trigger {
    /// Fires every clone of the paired [`Shutdown`]. Idempotent.
    pub fn fire(&self) {
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    /// A signal and the trigger that fires it.
    pub fn new() -> (Trigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (Trigger { tx }, Shutdown { rx })
    }

    /// A signal fired on SIGINT or SIGTERM.
    pub fn on_signals() -> Shutdown {
        let (trigger, shutdown) = Self::new();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown signal received");
            trigger.fire();
        });
        shutdown
    }

    /// True once fired.
    pub fn is_fired(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once fired (at once if it already was).
    pub async fn wait(self) {
        let mut rx = self.rx;
        // An error means every trigger is gone: treat as fired.
        let _ = rx.wait_for(|fired| *fired).await;
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Awaits `task` for at most `drain`; warns when the drain ran out.
pub async fn drain<F: std::future::Future>(
    what: &str,
    drain: Duration,
    task: F,
) -> Option<F::Output> {
    match tokio::time::timeout(drain, task).await {
        Ok(out) => Some(out),
        Err(_) => {
            tracing::warn!(
                what,
                drain_ms = drain.as_millis() as u64,
                "drain ran out; stopping anyway"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_signal() {
        let (trigger, shutdown) = Shutdown::new();
        let a = shutdown.clone();
        let waiter = tokio::spawn(a.wait());
        assert!(!shutdown.is_fired());
        trigger.fire();
        waiter.await.unwrap();
        assert!(shutdown.is_fired());
        shutdown.clone().wait().await;
    }
}
