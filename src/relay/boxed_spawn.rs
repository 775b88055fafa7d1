//! The executor every HTTP/2 connection of hyper's spawns its per-stream tasks on (the
//! server's stream handlers, the client's response waiters): each future is boxed once, then
//! spawned. tokio's task cell holds the future by value, and moving it there (and out of it
//! when the task ends) copies it whole; hyper's client task type is as large as its connection
//! task, and a terminated request's handler is several kilobytes. Boxed, the cell holds a
//! pointer and the future is copied once, into the box. [`spawn`] does the same for the
//! proxy's own short-lived tasks of that size (an explicit-proxy connection's, which for a
//! CONNECT ends once its tunnel's task takes over).

use std::future::Future;

/// [`hyper::rt::Executor`]: `tokio::spawn` of the boxed future.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BoxedSpawn;

impl<F> hyper::rt::Executor<F> for BoxedSpawn
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        drop(spawn(fut));
    }
}

/// `tokio::spawn` of `fut` boxed: tokio's cell holds a pointer, not the future's bytes. For a
/// task that lives as long as what it serves, the box is a second allocation kept for that
/// long: boxed only where the copies cost more than that (not a tunnel's task).
pub(crate) fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(Box::pin(fut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;

    #[tokio::test]
    async fn a_spawned_future_runs_to_its_end() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        BoxedSpawn.execute(async move {
            let _ = tx.send([7u8; 4096][4095]);
        });
        assert_eq!(rx.await.ok(), Some(7));
    }
}
