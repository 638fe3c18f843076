//! A TCP proxy in front of a backend that can be paused: while paused, bytes from the
//! gateway are held, so calls hang in flight (admission and deadline tests).

/// A TCP proxy in front of a backend that can be paused: while paused, bytes from
/// the gateway are held, so calls hang in flight (admission and deadline tests).
#[derive(Debug)]
pub struct PausableProxy {
    pub addr: String,
    paused: tokio::sync::watch::Sender<bool>,
    /// Bytes read from the gateway and held while paused (not yet passed on).
    held: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PausableProxy {
    pub async fn start(upstream: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (paused, rx) = tokio::sync::watch::channel(false);
        let upstream = upstream.to_string();
        let held = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let held_all = held.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let upstream = upstream.clone();
                let rx = rx.clone();
                let held = held_all.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut rx = rx;
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            use std::sync::atomic::Ordering;
                            let paused = *rx.borrow();
                            if paused {
                                held.fetch_add(n as u64, Ordering::SeqCst);
                            }
                            if rx.wait_for(|p| !*p).await.is_err() {
                                return;
                            }
                            if paused {
                                held.fetch_sub(n as u64, Ordering::SeqCst);
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Self {
            addr,
            paused,
            held,
            task,
        }
    }

    /// Bytes the proxy holds back right now (read from the gateway while paused).
    pub fn holding(&self) -> u64 {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn pause(&self) {
        let _ = self.paused.send(true);
    }

    pub fn resume(&self) {
        let _ = self.paused.send(false);
    }
}

impl Drop for PausableProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
