//! The proxier's `/livez` verdict ([`ProxyHealth`]) as the `healthy` of the NodeProxyConfig
//! status that [`kipvs_proxier_contract::report_status`] writes.

use super::health::ProxyHealth;
use kipvs_proxier_contract::Liveness;
use tokio::sync::watch;
use tokio::time::Instant;

impl Liveness for ProxyHealth {
    fn live(&self) -> bool {
        ProxyHealth::live(self)
    }

    fn stale_at(&self) -> Option<Instant> {
        ProxyHealth::stale_at(self)
    }

    fn subscribe(&self) -> watch::Receiver<()> {
        ProxyHealth::subscribe(self)
    }
}
