//! The Prometheus side both kipvs binaries share: one [`Registry`] per process, its text
//! exposition (format 0.0.4, `text/plain; version=0.0.4`) and the `GET /metrics` route that
//! serves it. Each binary keeps its own metrics and HTTP server; only this plumbing is common.

#![warn(missing_docs)]

use prometheus::{Encoder, Registry, TextEncoder};
use warp::Filter;
use warp::reply::{Reply, Response};

/// The text exposition (format 0.0.4) of every metric in `registry`.
pub fn encode(registry: &Registry) -> String {
    TextEncoder::new()
        .encode_to_string(&registry.gather())
        .expect("text encoding of gathered metrics")
}

/// `GET /metrics`: [`encode`] of `registry`, with the text format's `Content-Type`.
pub fn route(
    registry: Registry,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    warp::path!("metrics").and(warp::get()).map(move || {
        let content_type = TextEncoder::new().format_type().to_owned();
        warp::reply::with_header(encode(&registry), "Content-Type", content_type).into_response()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::IntCounter;

    #[tokio::test]
    async fn metrics_route_serves_the_registry_as_text() {
        let registry = Registry::new();
        let total = IntCounter::new("demo_total", "A demo.").unwrap();
        registry.register(Box::new(total.clone())).unwrap();
        total.inc_by(3);
        let answer = warp::test::request()
            .path("/metrics")
            .reply(&route(registry.clone()))
            .await;
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.headers()["content-type"],
            "text/plain; version=0.0.4"
        );
        let body = std::str::from_utf8(answer.body()).unwrap();
        assert!(
            body.contains("# TYPE demo_total counter\ndemo_total 3\n"),
            "{body}"
        );
        assert_eq!(body, encode(&registry));
        let missing = warp::test::request()
            .path("/other")
            .reply(&route(registry))
            .await;
        assert_eq!(missing.status(), 404);
    }
}
