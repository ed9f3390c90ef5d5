//! The ports the proxier shares with kube-proxy during a takeover: its healthz and metrics
//! servers bind them only while the proxier programs and release them for kube-proxy while it
//! stands by ([`serve_while`]), as kube-proxy binds the same ones.

use super::health;
use super::metrics::Metrics;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::watch;

/// When the healthz and metrics servers hold their ports.
pub struct Ports {
    /// Whether they may hold them now: `true` while the proxier programs
    /// ([`Takeover::ports`](crate::engine::takeover::Takeover::ports)), always without a
    /// takeover.
    pub may_hold: watch::Receiver<bool>,
    /// kube-proxy's healthz port, and the flag set while the healthz server holds it (an answer
    /// there is the proxier's own then).
    pub own_healthz: Option<(u16, Arc<AtomicBool>)>,
}

impl Ports {
    /// Ports held all along (no takeover).
    pub fn always() -> Self {
        Ports {
            may_hold: watch::channel(true).1,
            own_healthz: None,
        }
    }
}

/// Serves `routes` on `addr` whenever `may_hold` is true: bound when it turns true (retried
/// while the port is taken, counted in `metrics`), released when it turns false; `own` is set
/// while bound.
pub async fn serve_while<F>(
    addr: SocketAddr,
    what: &'static str,
    routes: F,
    metrics: Metrics,
    mut may_hold: watch::Receiver<bool>,
    own: Option<Arc<AtomicBool>>,
) where
    F: warp::Filter<Extract = (warp::reply::Response,)> + Clone + Send + Sync + 'static,
{
    loop {
        if may_hold.wait_for(|hold| *hold).await.is_err() {
            return;
        }
        let bind = health::bind_retrying(addr, what, || metrics.bind_failed(what));
        let listener = tokio::select! {
            listener = bind => listener,
            Ok(_) = may_hold.wait_for(|hold| !*hold) => continue,
        };
        if let Some(own) = &own {
            own.store(true, Ordering::Relaxed);
        }
        let mut released = may_hold.clone();
        let release = async move {
            if released.wait_for(|hold| !*hold).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        health::serve(listener, routes.clone(), release).await;
        if let Some(own) = &own {
            own.store(false, Ordering::Relaxed);
        }
        tracing::info!(%addr, "released the {what} port");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The healthz and metrics servers hold their port only while the proxier programs: bound
    /// when it may hold it, released (and `own` cleared) when it hands it to kube-proxy.
    #[tokio::test]
    async fn the_ports_are_held_only_while_allowed() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let (may_hold, rx) = watch::channel(false);
        let own = Arc::new(AtomicBool::new(false));
        let metrics = Metrics::new();
        let routes = metrics.routes();
        tokio::spawn(serve_while(
            addr,
            "metrics",
            routes,
            metrics,
            rx,
            Some(own.clone()),
        ));
        let bound = |want: bool| async move {
            for _ in 0..200 {
                let taken = std::net::TcpListener::bind(addr).is_err();
                if taken == want {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(bound(false).await, "not held in standby");
        may_hold.send_replace(true);
        assert!(bound(true).await, "held while programming");
        assert!(own.load(Ordering::Relaxed));
        may_hold.send_replace(false);
        assert!(bound(false).await, "released for kube-proxy");
        for _ in 0..100 {
            if !own.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!own.load(Ordering::Relaxed));
        may_hold.send_replace(true);
        assert!(bound(true).await, "held again after a takeover again");
    }
}
