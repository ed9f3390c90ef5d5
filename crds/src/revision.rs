//! Content hashes: the revision of a configuration, and the stable per-node hash that orders
//! nodes when a stage takes a share of them.
//!
//! Both are FNV-1a (64 bit) followed by a SplitMix64 finaliser, so that names differing only in
//! their last characters (`node-001`, `node-002`) still spread over the whole range. The values
//! are part of the API (stored in NodeProxyConfig specs and ProxyConfig status): changing the
//! function would re-roll every node, so it must not change.

use crate::ProxierConfiguration;
use serde_json::Value;

/// Number of hex digits of a revision (40 bits: collisions are irrelevant at fleet scale; the
/// revision is for humans and for equality).
const REVISION_HEX_DIGITS: usize = 10;

fn hash64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // SplitMix64 finaliser.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// The revision of a configuration: a hash of its settings that differ from the defaults, as
/// canonical JSON (struct field order, sorted maps). So `{}` and a file spelling out the
/// defaults have the same revision, and upgrading kipvs to a version with a new setting (at
/// its default) does not re-roll the fleet; a changed default reaches the nodes with the next
/// revision.
///
/// Settings with two spellings of one meaning are normalised first, so that they do not re-roll
/// the fleet for nothing: an empty `ipvs.scheduler` is `rr` (kube-proxy's rule).
pub fn config_revision(config: &ProxierConfiguration) -> String {
    let value = |c: &ProxierConfiguration| {
        let mut c = c.clone();
        c.ipvs.scheduler = c.ipvs.effective_scheduler().to_owned();
        serde_json::to_value(c).expect("ProxierConfiguration serializes to JSON")
    };
    let mut settings = value(config);
    strip_defaults(&mut settings, &value(&ProxierConfiguration::default()));
    let json = serde_json::to_vec(&settings).expect("JSON value serializes");
    let hex = format!("{:016x}", hash64(&json));
    hex[..REVISION_HEX_DIGITS].to_owned()
}

/// Whether `revision` has the form of a [`config_revision`] (what the operator writes in
/// `NodeProxyConfig.spec.revision`), so that the content it names can be checked; a
/// NodeProxyConfig written by hand may name its revision freely (`r1`).
pub fn is_config_revision(revision: &str) -> bool {
    revision.len() == REVISION_HEX_DIGITS
        && revision
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Removes from `value` every object member equal to the same member of `default`.
fn strip_defaults(value: &mut Value, default: &Value) {
    if let (Value::Object(map), Value::Object(defaults)) = (value, default) {
        map.retain(|key, v| match defaults.get(key) {
            Some(d) if d == v => false,
            Some(d) => {
                strip_defaults(v, d);
                !v.as_object().is_some_and(|o| o.is_empty()) || !d.is_object()
            }
            None => true,
        });
    }
}

/// The stable hash of a node name that orders nodes when a stage takes a count or a percentage
/// of them.
pub fn node_hash(name: &str) -> u64 {
    hash64(name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gate;

    #[test]
    fn new_settings_at_their_defaults_do_not_change_a_revision() {
        // As if an older kipvs had written the configuration: a setting it did not know is absent.
        let mut value = serde_json::to_value(ProxierConfiguration::default()).unwrap();
        value["ipvs"]
            .as_object_mut()
            .unwrap()
            .remove("drainTimeout");
        value["ipvs"]["scheduler"] = "wlc".into();
        strip_defaults(
            &mut value,
            &serde_json::to_value(ProxierConfiguration::default()).unwrap(),
        );
        assert_eq!(value, serde_json::json!({"ipvs": {"scheduler": "wlc"}}));
    }

    #[test]
    fn revision_ignores_spelling_but_not_content() {
        let default = ProxierConfiguration::default();
        let spelled: ProxierConfiguration = ProxierConfiguration::from_yaml_str(
            "ipvs: {syncPeriod: 30s, minSyncPeriod: 0s}\nhealthzBindAddress: 0.0.0.0:10256\n",
        )
        .unwrap();
        assert_eq!(config_revision(&default), config_revision(&spelled));
        let mut changed = default.clone();
        changed
            .feature_gates
            .insert(Gate::LoadBalancerIPMode.name().to_owned(), false);
        assert_ne!(config_revision(&default), config_revision(&changed));
        assert_eq!(config_revision(&default).len(), REVISION_HEX_DIGITS);
        assert!(is_config_revision(&config_revision(&changed)));
        assert!(!is_config_revision("r1") && !is_config_revision("FE0C740AAE"));
    }

    #[test]
    fn an_empty_scheduler_is_rr() {
        let mut rr = ProxierConfiguration::default();
        rr.ipvs.scheduler = "rr".to_owned();
        assert_eq!(
            config_revision(&rr),
            config_revision(&ProxierConfiguration::default())
        );
        let mut wlc = rr.clone();
        wlc.ipvs.scheduler = "wlc".to_owned();
        assert_ne!(config_revision(&wlc), config_revision(&rr));
    }

    /// Pinned values: the functions are part of the stored state (see the module docs).
    #[test]
    fn hashes_are_stable() {
        assert_eq!(
            config_revision(&ProxierConfiguration::default()),
            "fe0c740aae"
        );
        assert_eq!(node_hash("node-1"), 0x1395_0d4e_f307_e655);
    }

    #[test]
    fn node_hashes_spread_similar_names() {
        let mut below_half = 0;
        for i in 0..1000 {
            if node_hash(&format!("node-{i:04}")) < u64::MAX / 2 {
                below_half += 1;
            }
        }
        assert!((400..600).contains(&below_half), "{below_half}");
    }
}
