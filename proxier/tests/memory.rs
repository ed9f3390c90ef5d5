//! Memory follows the live objects: what the proxier keeps of a Service (the store's converted
//! object, its shared strings, the planner's index and problems) is let go when the object
//! changes or goes, however many distinct values it carried. A counting allocator measures the
//! heap around a loop that writes 10,000 distinct `kipvs.io/scheduler` values and port names,
//! as a client writing random text to one annotation in a loop would.

use k8s_openapi::api::core::v1::Service;
use kipvs_crds::ProxierConfiguration;
use kipvs_proxier::engine::planner::{NodeIdentity, Planner};
use kipvs_proxier::source::store::{Store, object_key};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting the bytes in use.
struct Counting;

static IN_USE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        IN_USE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn service(scheduler: &str, port_name: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop",
                     "annotations": {"kipvs.io/scheduler": scheduler}},
        "spec": {"clusterIP": "10.96.0.10", "type": "NodePort",
                 "ports": [{"name": port_name, "port": 80, "nodePort": 30080}]}
    }))
    .unwrap()
}

#[test]
fn the_heap_returns_to_its_level_after_10000_distinct_annotation_values() {
    let mut store = Store::default();
    let identity = NodeIdentity {
        name: "node-1".into(),
        node_ips: vec!["192.168.0.10".parse().unwrap()],
    };
    let mut planner = Planner::new(identity, ProxierConfiguration::default());
    let step = |store: &mut Store, planner: &mut Planner, svc: Service| {
        store.upsert_service(svc);
        planner.replan(store);
        store.take_trigger_times();
    };
    // Warm: the allocations every step makes and frees (and the interner's first table).
    for i in 0..2000 {
        step(
            &mut store,
            &mut planner,
            service(&format!("warm{i}"), &format!("w{i}")),
        );
    }
    step(&mut store, &mut planner, service("rr", "http"));
    let before = IN_USE.load(Ordering::Relaxed);
    for i in 0..10_000 {
        // A scheduler value is not interned (it names no scheduler); a port name (15 characters at
        // most, IANA_SVC_NAME) is.
        let value = format!("{i:0>1000}");
        step(
            &mut store,
            &mut planner,
            service(&value, &format!("p{i:0>14}")),
        );
    }
    step(&mut store, &mut planner, service("rr", "http"));
    let after = IN_USE.load(Ordering::Relaxed);
    // 10,000 values of 1,000 bytes would be 10 MB; a bounded interner keeps at most ~2x the
    // live strings plus its minimum table.
    assert!(
        after - before < 256 * 1024,
        "the heap grew by {} bytes (before {before}, after {after})",
        after - before
    );
    // The Service goes: what was kept of it goes too.
    store.delete_service(&object_key(&service("rr", "http").metadata));
    planner.replan(&mut store);
    let gone = IN_USE.load(Ordering::Relaxed);
    assert!(
        gone < after,
        "deleting the Service freed nothing ({after} -> {gone})"
    );
}
