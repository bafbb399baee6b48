//! envworker's serve app in this process, as `serve` runs it in a
//! container: on a real listener, until the test flips its stop switch.

use std::net::SocketAddr;
use std::time::Duration;

use envworker::serve::{AppState, serve_container};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `serve_container` over `state` on a fresh listener on 127.0.0.1, its
/// drain bounded by `grace` at shutdown: the listener's address, the
/// switch that starts the shutdown, and the task (what `serve_container`
/// returned: whether the drain ended in time).
pub async fn spawn_container(
    state: AppState,
    grace: Duration,
) -> (
    SocketAddr,
    oneshot::Sender<()>,
    JoinHandle<std::io::Result<bool>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(serve_container(
        listener,
        state,
        async move {
            let _ = stopped.await;
        },
        grace,
    ));
    (addr, stop, served)
}
