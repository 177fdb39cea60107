//! The thread the storage providers' connection drivers run on.
//!
//! A store client spawns tasks that carry its connections' I/O (etcd's
//! HTTP/2 connection and balancer, the Redis multiplexer) on the runtime that
//! opens the connection. Opened from the application's arbiter, every store
//! call of the silo's membership and reminder threads then waits for that
//! arbiter, however busy its actors keep it: a silo whose application spins
//! the CPU lapsed its fences although its own threads were idle. Providers
//! open their connections through [`on_io`], so the drivers live on one
//! thread of this process that runs nothing else.

use std::future::Future;
use std::sync::OnceLock;

/// The runtime of the `rollcall-io` thread, started at the first call: a
/// current-thread tokio runtime with I/O and timers, alive for the rest of
/// the process.
///
/// # Panics
/// If the operating system refuses a thread or the runtime cannot be built
/// (out of resources at the first call).
pub fn io_runtime() -> &'static tokio::runtime::Handle {
    static HANDLE: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("rollcall-io".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the rollcall-io runtime builds");
                let _ = tx.send(rt.handle().clone());
                // Runs the spawned drivers until the process ends.
                rt.block_on(std::future::pending::<()>());
            })
            .expect("the rollcall-io thread starts");
        rx.recv().expect("the rollcall-io runtime starts")
    })
}

/// Runs `work` on the [`io_runtime`] thread and returns its output: every
/// task `work` spawns (a connection's driver) lives there. Cancelling the
/// returned future does not cancel `work`.
///
/// # Panics
/// Re-raises a panic of `work`.
pub async fn on_io<F>(work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match io_runtime().spawn(work).await {
        Ok(out) => out,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_the_io_thread_and_its_tasks_stay_there() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let names = rt.block_on(on_io(async {
            let outer = std::thread::current().name().map(str::to_owned);
            let inner = tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
                .await
                .unwrap();
            (outer, inner)
        }));
        assert_eq!(names, (Some("rollcall-io".into()), Some("rollcall-io".into())));
    }
}
