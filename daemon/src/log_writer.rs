//! The log writer: a thread that writes the lines the daemon's threads queue, in
//! batches, on its own clock.
//!
//! A thread that logs appends its formatted line to one shared buffer under a short
//! lock and goes on; it wakes the writer only when the writer is parked (nothing was
//! queued for a whole period) or the buffer holds [`WAKE_BYTES`]. The writer, once
//! awake, writes what is buffered, then sleeps [`PERIOD`] before it looks again, so
//! lines queued meanwhile cost no wake-up at all: a steady trickle of requests costs
//! the writer at most one wake-up and one `write` per period, whatever the rate.
//!
//! Why not `tracing-appender`'s non-blocking writer, which this replaces: its worker
//! blocks on a channel and is woken by every line. Under a saturating load it finds
//! many lines at each wake-up, but when requests come one at a time (a sale's crowd
//! as opposed to a benchmark's closed loop) every access line paid a futex wake-up,
//! the writer's context switch and a `write` of its own: measured at one connection
//! (`ACCESS_LOG=true CONNS=1 CASES=sold_out deploy/bench/gateway.sh`) the gateway's
//! sold-out answer took 47.2 µs of CPU with the access log against 26.3 without it.
//! That crate has no setting for a writer that waits.
//!
//! Past [`crate::telemetry::QUEUED_LINES`] lines buffered (a stalled stderr), new lines
//! are dropped and counted rather than making a request wait. Stopping ([`Writer::stop`])
//! writes what is buffered, waiting at most a second for a stalled sink.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long the writer sleeps after a write before it looks at the buffer again: the
/// most a line waits in a steady trickle.
pub const PERIOD: Duration = Duration::from_millis(20);

/// Buffered bytes at which a logging thread wakes the writer before its period is over.
pub const WAKE_BYTES: usize = 256 * 1024;

/// How long [`Writer::stop`] waits for the last write.
const STOP_WAIT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    lines: usize,
    /// The writer found nothing after a period and waits to be woken.
    parked: bool,
    stop: bool,
}

struct Shared {
    buffer: Mutex<Buffer>,
    wake: Condvar,
    dropped: AtomicU64,
    max_lines: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where logging threads queue their lines (cheap to clone).
#[derive(Clone)]
pub struct Queue {
    shared: Arc<Shared>,
}

impl Queue {
    /// Queues one line (one formatted event: the fmt layer writes each in one call).
    pub fn push(&self, line: &[u8]) {
        let mut b = self.shared.lock();
        if b.stop || b.lines >= self.shared.max_lines {
            drop(b);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        b.bytes.extend_from_slice(line);
        b.lines += 1;
        let wake = b.parked || b.bytes.len() >= WAKE_BYTES;
        if wake {
            b.parked = false;
        }
        drop(b);
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Lines dropped because the buffer was full.
    pub fn dropped_lines(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

/// By reference, so the subscriber's writer for each event borrows the one queue
/// instead of cloning its `Arc` (two atomic operations per line).
impl Write for &Queue {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The writer thread; [`Writer::stop`] (or dropping it) writes what is left and ends it.
pub struct Writer {
    shared: Arc<Shared>,
    done: Option<mpsc::Receiver<()>>,
}

impl Writer {
    /// Starts the thread `name`, writing to `sink`, holding at most `max_lines` lines.
    pub fn start<W: Write + Send + 'static>(
        name: &str,
        sink: W,
        max_lines: usize,
        period: Duration,
    ) -> std::io::Result<(Queue, Writer)> {
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Buffer::default()),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
            max_lines,
        });
        let (tx, done) = mpsc::channel();
        let s = shared.clone();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                run(&s, sink, period);
                let _ = tx.send(());
            })?;
        Ok((
            Queue {
                shared: shared.clone(),
            },
            Writer {
                shared,
                done: Some(done),
            },
        ))
    }

    /// Writes what is buffered and ends the thread (waits at most a second).
    pub fn stop(&mut self) {
        let Some(done) = self.done.take() else {
            return;
        };
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        let _ = done.recv_timeout(STOP_WAIT);
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run<W: Write>(shared: &Shared, mut sink: W, period: Duration) {
    let mut batch = Vec::new();
    loop {
        let mut b = shared.lock();
        // Nothing queued: park until a line comes (its thread wakes us) or we stop.
        while b.bytes.is_empty() && !b.stop {
            b.parked = true;
            b = shared.wake.wait(b).unwrap_or_else(|p| p.into_inner());
        }
        b.parked = false;
        std::mem::swap(&mut batch, &mut b.bytes);
        b.lines = 0;
        let stop = b.stop;
        drop(b);
        // A sink that fails (a closed stderr) loses the batch; there is nowhere to say so.
        let _ = sink.write_all(&batch).and_then(|()| sink.flush());
        batch.clear();
        if stop {
            // Lines pushed after `stop` are dropped; those before it are written above.
            return;
        }
        // Let lines gather: woken early only by a full buffer or a stop.
        let b = shared.lock();
        if b.bytes.len() < WAKE_BYTES && !b.stop {
            let _ = shared.wake.wait_timeout(b, period);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A sink that records each `write_all` batch.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            let all: Vec<u8> = self.0.lock().unwrap().concat();
            String::from_utf8(all).unwrap()
        }
        fn writes(&self) -> usize {
            self.0.lock().unwrap().len()
        }
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(5), "timed out: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn lines_from_many_threads_are_written_whole_in_their_order_per_thread() {
        let sink = Sink::default();
        let (q, mut w) = Writer::start("t-writer", sink.clone(), 100_000, PERIOD).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        q.push(format!("t{t} line {i}\n").as_bytes());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        w.stop();
        let text = sink.text();
        assert_eq!(text.lines().count(), 4000);
        for t in 0..4 {
            let mine: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("t{t} ")))
                .collect();
            let want: Vec<String> = (0..1000).map(|i| format!("t{t} line {i}")).collect();
            assert_eq!(mine, want, "thread {t}'s lines out of order or torn");
        }
        assert_eq!(q.dropped_lines(), 0);
    }

    #[test]
    fn a_trickle_costs_one_write_per_period_not_one_per_line() {
        let sink = Sink::default();
        let period = Duration::from_millis(100);
        let (q, mut w) = Writer::start("t-writer", sink.clone(), 100_000, period).unwrap();
        // 40 lines, one every 5 ms: about 200 ms, two or three periods (more on a busy
        // machine, where the sleeps run long: the bound follows the time it took).
        let t0 = Instant::now();
        for i in 0..40 {
            q.push(format!("line {i}\n").as_bytes());
            std::thread::sleep(Duration::from_millis(5));
        }
        let periods = (t0.elapsed().as_millis() / period.as_millis()) as usize;
        w.stop();
        assert_eq!(sink.text().lines().count(), 40);
        let writes = sink.writes();
        assert!(
            writes <= periods + 3,
            "{writes} writes for 40 lines over {periods} periods: the writer woke per line"
        );
    }

    #[test]
    fn a_parked_writer_is_woken_by_the_first_line_after_a_quiet_spell() {
        let sink = Sink::default();
        let (q, _w) = Writer::start("t-writer", sink.clone(), 100_000, PERIOD).unwrap();
        q.push(b"first\n");
        wait_for("the first line", || sink.text() == "first\n");
        // Quiet for several periods: the writer parks with nothing to do.
        std::thread::sleep(PERIOD * 4);
        q.push(b"second\n");
        wait_for("the line after the quiet spell", || {
            sink.text() == "first\nsecond\n"
        });
    }

    #[test]
    fn a_full_buffer_drops_and_counts_new_lines_and_stop_writes_the_rest() {
        /// A sink that blocks until released: a stalled stderr.
        struct Stalled(Arc<(Mutex<bool>, Condvar)>, Sink);
        impl Write for Stalled {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let (m, c) = &*self.0;
                let mut open = m.lock().unwrap();
                while !*open {
                    open = c.wait(open).unwrap();
                }
                self.1.write(buf)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let sink = Sink::default();
        let (q, mut w) =
            Writer::start("t-writer", Stalled(gate.clone(), sink.clone()), 10, PERIOD).unwrap();
        q.push(b"taken by the stalled write\n");
        wait_for("the writer to take the first line", || {
            q.shared.lock().bytes.is_empty()
        });
        for i in 0..15 {
            q.push(format!("queued {i}\n").as_bytes());
        }
        assert_eq!(q.dropped_lines(), 5, "ten fit, five dropped");
        {
            let (m, c) = &*gate;
            *m.lock().unwrap() = true;
            c.notify_all();
        }
        w.stop();
        let text = sink.text();
        assert_eq!(text.lines().count(), 11, "{text}");
        assert!(text.contains("queued 9\n") && !text.contains("queued 10\n"));
        q.push(b"after the stop\n");
        assert_eq!(q.dropped_lines(), 6, "a line after the stop is dropped");
    }
}
