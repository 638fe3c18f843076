//! Holding a daemon at a fail point (`fail::fail_point!`, in-process daemons only): the
//! test hears when the point is reached and says when it goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How long a held point waits for the test, and the test for the point.
const WITHIN: Duration = Duration::from_secs(30);

/// A fail point that, the first time it is reached, says so and waits until the test
/// lets it go (or [`WITHIN`] passes); later passes go straight on. The wait hands its
/// runtime worker over (`block_in_place`): an in-process daemon runs on the test's
/// runtime, and the tasks queued on a blocked worker would wait behind it.
pub struct Hold {
    reached: mpsc::Receiver<()>,
    go: mpsc::Sender<()>,
}

impl Hold {
    /// Configures `name` (process-wide: a binary whose tests hold points runs one
    /// test, or makes its tests take turns).
    pub fn at(name: &str) -> Self {
        let (reached_tx, reached) = mpsc::channel::<()>();
        let (go, go_rx) = mpsc::channel::<()>();
        let (reached_tx, go_rx) = (Mutex::new(reached_tx), Mutex::new(go_rx));
        let once = Arc::new(AtomicBool::new(false));
        fail::cfg_callback(name, move || {
            if once.swap(true, Ordering::SeqCst) {
                return;
            }
            let _ = reached_tx.lock().unwrap().send(());
            tokio::task::block_in_place(|| {
                let _ = go_rx.lock().unwrap().recv_timeout(WITHIN);
            });
        })
        .expect("fail point callback");
        Self { reached, go }
    }

    /// Waits until the point is reached (panics naming `what` otherwise); the sender
    /// lets it go.
    pub async fn reached(self, what: &str) -> mpsc::Sender<()> {
        let Hold { reached, go } = self;
        tokio::task::spawn_blocking(move || reached.recv_timeout(WITHIN))
            .await
            .expect("the wait for a fail point")
            .unwrap_or_else(|_| panic!("never reached: {what}"));
        go
    }
}
