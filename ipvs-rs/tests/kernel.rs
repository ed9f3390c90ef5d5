//! Integration tests against the running kernel's IPVS.
//!
//! They need Linux with the `ip_vs` module (loaded or autoloadable, with the
//! `rr` and `wrr` schedulers, IPv6 and SCTP support) and `CAP_NET_ADMIN`, and
//! they change the IPVS table of the current network namespace, so run them
//! in a throwaway VM or network namespace:
//!
//! ```text
//! KIPVS_REQUIRE_KERNEL=1 cargo test -p ipvs-rs --test kernel -- --test-threads=1
//! ```
//!
//! Without `KIPVS_REQUIRE_KERNEL` (or with it empty or `0`) a test whose
//! kernel has no IPVS family prints `skipped: IPVS family not available`
//! and passes; with it, that is a failure.
//!
//! Every test uses its own documentation-range addresses (192.0.2.0/24,
//! 198.51.100.0/24, 2001:db8::/32) so tests may run in parallel and next to
//! other IPVS users; each deletes exactly the services it created (also when
//! it fails, through [`Cleanup`]) and never flushes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::future::join_all;
use ipvs::{
    AddressFamily, Destination, Error, ForwardMethod, Handle, Protocol, Service, ServiceFlags,
    ServiceId, Timeouts,
};

fn kernel_required() -> bool {
    std::env::var("KIPVS_REQUIRE_KERNEL").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Connects, or returns `None` (after printing why) when the kernel has no
/// IPVS and the kernel is not required.
async fn connect() -> Option<Handle> {
    match Handle::connect().await {
        Ok(handle) => Some(handle),
        Err(Error::FamilyNotFound) if !kernel_required() => {
            println!("skipped: IPVS family not available");
            None
        }
        Err(err) => panic!("cannot connect to IPVS: {err}"),
    }
}

/// Deletes the listed services and restores the timeouts when dropped,
/// from a thread of its own so that it also runs when a test panics.
struct Cleanup {
    services: Vec<ServiceId>,
    timeouts: Option<Timeouts>,
}

impl Cleanup {
    fn services(services: impl IntoIterator<Item = ServiceId>) -> Cleanup {
        Cleanup {
            services: services.into_iter().collect(),
            timeouts: None,
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let services = std::mem::take(&mut self.services);
        let timeouts = self.timeouts.take();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            runtime.block_on(async move {
                let Ok(handle) = Handle::connect().await else {
                    return;
                };
                for id in &services {
                    // Already deleted by the test in the normal case.
                    let _ = handle.delete_service(id).await;
                }
                if let Some(timeouts) = timeouts {
                    let _ = handle.set_timeouts(&timeouts).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn v6(last: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, last))
}

fn inet(address: IpAddr, port: u16, protocol: Protocol) -> ServiceId {
    ServiceId::Inet {
        address,
        port,
        protocol,
    }
}

/// A service as the kernel reports it, reduced to what was configured.
fn configured(mut service: Service) -> Service {
    service.flags = service.flags.without_hashed();
    service.stats = None;
    service
}

/// A destination as the kernel reports it, reduced to what was configured.
fn configured_dest(mut dest: Destination) -> Destination {
    dest.active_connections = 0;
    dest.inactive_connections = 0;
    dest.persistent_connections = 0;
    dest.stats = None;
    dest
}

async fn find(handle: &Handle, id: &ServiceId) -> Option<Service> {
    handle
        .services()
        .await
        .expect("list services")
        .into_iter()
        .find(|service| service.id == *id)
}

#[tokio::test]
async fn info_reports_version_and_table_size() {
    let Some(handle) = connect().await else {
        return;
    };
    let info = handle.info().await.expect("GET_INFO");
    assert!(info.version.major >= 1, "version {}", info.version);
    assert!(info.connection_table_size > 0);
    assert!(handle.family_id() >= 0x10);
}

#[tokio::test]
async fn services_add_list_update_delete() {
    let Some(handle) = connect().await else {
        return;
    };
    let tcp = Service::new(inet(v4(198, 51, 100, 1), 80, Protocol::Tcp), "rr");
    let mut udp6 = Service::new(inet(v6(0x101), 53, Protocol::Udp), "wrr");
    udp6.flags = ServiceFlags::ONEPACKET;
    let sctp = Service::new(inet(v4(198, 51, 100, 1), 3868, Protocol::Sctp), "rr");
    let fwmark = Service::new(
        ServiceId::Fwmark {
            family: AddressFamily::Inet,
            mark: 0x4b1d,
        },
        "rr",
    );
    let mut persistent = Service::new(inet(v4(198, 51, 100, 1), 443, Protocol::Tcp), "rr");
    persistent.flags = ServiceFlags::PERSISTENT;
    persistent.timeout = 10800;
    let all = [tcp, udp6, sctp, fwmark, persistent];
    let _cleanup = Cleanup::services(all.iter().map(|s| s.id));

    for service in &all {
        handle
            .add_service(service)
            .await
            .unwrap_or_else(|err| panic!("add {}: {err}", service.id));
    }

    let listed = handle.services().await.expect("list services");
    for service in &all {
        let found = listed
            .iter()
            .find(|s| s.id == service.id)
            .unwrap_or_else(|| panic!("{} missing from the dump", service.id));
        assert!(
            found.flags.contains(ServiceFlags::HASHED),
            "dumps report HASHED"
        );
        assert!(found.stats.is_some(), "dumps carry statistics");
        assert_eq!(configured(found.clone()), *service);
        let one = handle.service(&service.id).await.expect("GET_SERVICE");
        assert_eq!(configured(one), *service);
    }

    let [mut tcp, _, _, _, mut persistent] = all.clone();
    tcp.scheduler = "wrr".into();
    persistent.timeout = 600;
    persistent.netmask = 0x00ff_ffff; // 255.255.255.0, network byte order
    for service in [&tcp, &persistent] {
        handle.update_service(service).await.expect("SET_SERVICE");
        let read = handle.service(&service.id).await.expect("GET_SERVICE");
        assert_eq!(configured(read), *service);
    }

    for service in &all {
        handle
            .delete_service(&service.id)
            .await
            .expect("DEL_SERVICE");
        assert!(matches!(
            handle.service(&service.id).await,
            Err(Error::NoSuchService)
        ));
        assert_eq!(find(&handle, &service.id).await, None);
    }
}

#[tokio::test]
async fn destinations_add_list_update_delete() {
    let Some(handle) = connect().await else {
        return;
    };
    let id = inet(v4(198, 51, 100, 2), 8080, Protocol::Tcp);
    let id6 = inet(v6(0x102), 8080, Protocol::Tcp);
    let _cleanup = Cleanup::services([id, id6]);
    handle
        .add_service(&Service::new(id, "wrr"))
        .await
        .expect("add service");

    let first = Destination::new(v4(192, 0, 2, 10), 8080, 1);
    let mut second = Destination::new(v4(192, 0, 2, 11), 8081, 2);
    for dest in [&first, &second] {
        handle.add_destination(&id, dest).await.expect("NEW_DEST");
    }
    let mut listed: Vec<_> = handle
        .destinations(&id)
        .await
        .expect("GET_DEST")
        .into_iter()
        .map(|dest| {
            assert!(dest.stats.is_some(), "dumps carry statistics");
            configured_dest(dest)
        })
        .collect();
    listed.sort_by_key(|dest| dest.address);
    assert_eq!(listed, vec![first.clone(), second.clone()]);

    second.weight = 5;
    second.upper_threshold = 100;
    second.lower_threshold = 10;
    handle
        .update_destination(&id, &second)
        .await
        .expect("SET_DEST");
    let quiesced = Destination {
        weight: 0,
        ..first.clone()
    };
    handle
        .update_destination(&id, &quiesced)
        .await
        .expect("SET_DEST weight 0");
    let mut listed: Vec<_> = handle
        .destinations(&id)
        .await
        .expect("GET_DEST")
        .into_iter()
        .map(configured_dest)
        .collect();
    listed.sort_by_key(|dest| dest.address);
    assert_eq!(listed, vec![quiesced, second.clone()]);

    handle
        .delete_destination(&id, first.address, first.port)
        .await
        .expect("DEL_DEST");
    assert!(matches!(
        handle
            .delete_destination(&id, first.address, first.port)
            .await,
        Err(Error::NotFound)
    ));
    let listed: Vec<_> = handle
        .destinations(&id)
        .await
        .expect("GET_DEST")
        .into_iter()
        .map(configured_dest)
        .collect();
    assert_eq!(listed, vec![second]);

    // IPv6, direct routing.
    handle
        .add_service(&Service::new(id6, "rr"))
        .await
        .expect("add IPv6 service");
    let mut dest6 = Destination::new(v6(0x10), 8080, 3);
    dest6.forward = ForwardMethod::DirectRoute;
    handle
        .add_destination(&id6, &dest6)
        .await
        .expect("NEW_DEST IPv6");
    let listed: Vec<_> = handle
        .destinations(&id6)
        .await
        .expect("GET_DEST IPv6")
        .into_iter()
        .map(configured_dest)
        .collect();
    assert_eq!(listed, vec![dest6]);

    for service in [id, id6] {
        handle.delete_service(&service).await.expect("DEL_SERVICE");
    }
    assert!(handle.destinations(&id).await.expect("GET_DEST").is_empty());
}

#[tokio::test]
async fn duplicate_add_is_exists() {
    let Some(handle) = connect().await else {
        return;
    };
    let service = Service::new(inet(v4(198, 51, 100, 3), 80, Protocol::Tcp), "rr");
    let _cleanup = Cleanup::services([service.id]);
    handle.add_service(&service).await.expect("first add");
    let err = handle.add_service(&service).await.unwrap_err();
    assert!(matches!(err, Error::Exists), "got {err:?}");
    assert_eq!(err.errno(), Some(libc::EEXIST));

    let dest = Destination::new(v4(192, 0, 2, 30), 80, 1);
    handle
        .add_destination(&service.id, &dest)
        .await
        .expect("first NEW_DEST");
    assert!(matches!(
        handle.add_destination(&service.id, &dest).await,
        Err(Error::Exists)
    ));
    handle
        .delete_service(&service.id)
        .await
        .expect("DEL_SERVICE");
}

#[tokio::test]
async fn missing_service_is_no_such_service() {
    let Some(handle) = connect().await else {
        return;
    };
    let id = inet(v4(198, 51, 100, 4), 80, Protocol::Tcp);
    let dest = Destination::new(v4(192, 0, 2, 40), 80, 1);
    let results = [
        handle.delete_service(&id).await,
        handle.update_service(&Service::new(id, "rr")).await,
        handle.service(&id).await.map(drop),
        handle.add_destination(&id, &dest).await,
        handle.update_destination(&id, &dest).await,
        handle
            .delete_destination(&id, dest.address, dest.port)
            .await,
    ];
    for result in results {
        let err = result.expect_err("the service does not exist");
        assert!(matches!(err, Error::NoSuchService), "got {err:?}");
        assert_eq!(err.errno(), Some(libc::ESRCH));
    }
    // The GET_DEST dump callback ends quietly when the service is missing.
    assert!(handle.destinations(&id).await.expect("GET_DEST").is_empty());
}

#[tokio::test]
async fn unknown_scheduler_is_not_found() {
    let Some(handle) = connect().await else {
        return;
    };
    let service = Service::new(
        inet(v4(198, 51, 100, 5), 80, Protocol::Tcp),
        "kipvs-nosched",
    );
    let _cleanup = Cleanup::services([service.id]);
    let err = handle.add_service(&service).await.unwrap_err();
    assert!(matches!(err, Error::NotFound), "got {err:?}");
    assert_eq!(find(&handle, &service.id).await, None);
}

#[tokio::test]
async fn timeouts_get_set_round_trip() {
    let Some(handle) = connect().await else {
        return;
    };
    let original = handle.timeouts().await.expect("GET_CONFIG");
    assert!(original.tcp > 0 && original.tcp_fin > 0 && original.udp > 0);
    let _cleanup = Cleanup {
        services: Vec::new(),
        timeouts: Some(original),
    };

    let changed = Timeouts {
        tcp: original.tcp + 7,
        tcp_fin: 0, // left unchanged by the kernel
        udp: original.udp + 11,
    };
    handle.set_timeouts(&changed).await.expect("SET_CONFIG");
    assert_eq!(
        handle.timeouts().await.expect("GET_CONFIG"),
        Timeouts {
            tcp_fin: original.tcp_fin,
            ..changed
        }
    );

    handle.set_timeouts(&original).await.expect("restore");
    assert_eq!(handle.timeouts().await.expect("GET_CONFIG"), original);
}

#[tokio::test]
async fn two_hundred_concurrent_adds_through_one_handle() {
    let Some(handle) = connect().await else {
        return;
    };
    let address = v4(198, 51, 100, 200);
    let services: Vec<Service> = (0..200)
        .map(|i| Service::new(inet(address, 20000 + i, Protocol::Tcp), "rr"))
        .collect();
    let _cleanup = Cleanup::services(services.iter().map(|s| s.id));

    let added = join_all(services.iter().map(|service| handle.add_service(service))).await;
    for (service, result) in services.iter().zip(added) {
        result.unwrap_or_else(|err| panic!("add {}: {err}", service.id));
    }

    let mut listed: Vec<Service> = handle
        .services()
        .await
        .expect("list services")
        .into_iter()
        .filter(|service| matches!(service.id, ServiceId::Inet { address: a, .. } if a == address))
        .map(configured)
        .collect();
    listed.sort_by_key(|service| match service.id {
        ServiceId::Inet { port, .. } => port,
        ServiceId::Fwmark { .. } => 0,
    });
    assert_eq!(listed, services);

    let deleted = join_all(
        services
            .iter()
            .map(|service| handle.delete_service(&service.id)),
    )
    .await;
    for result in deleted {
        result.expect("DEL_SERVICE");
    }
    let left = handle
        .services()
        .await
        .expect("list services")
        .into_iter()
        .filter(|service| matches!(service.id, ServiceId::Inet { address: a, .. } if a == address))
        .count();
    assert_eq!(left, 0);
}

/// What the listing and a netlink dump both say about a service: its scheduler and each
/// destination's address, port, forwarding, weight and connection counts, sorted.
type Shared = (String, Vec<(IpAddr, u16, ForwardMethod, u32, u32, u32)>);

/// `services` as the netlink dumps report them (`None` for one that is gone).
async fn dumped(handle: &Handle, services: &[Service]) -> Vec<Option<Shared>> {
    let mut out = Vec::new();
    for service in services {
        let Some(found) = find(handle, &service.id).await else {
            out.push(None);
            continue;
        };
        let mut dests: Vec<_> = handle
            .destinations(&service.id)
            .await
            .expect("GET_DEST")
            .into_iter()
            .map(|d| {
                let forward = match d.forward {
                    ForwardMethod::Bypass => ForwardMethod::Masquerade, // listed as Masq
                    other => other,
                };
                let (active, inactive) = (d.active_connections, d.inactive_connections);
                (d.address, d.port, forward, d.weight, active, inactive)
            })
            .collect();
        dests.sort_by_key(|d| (d.0, d.1));
        out.push(Some((found.scheduler, dests)));
    }
    out
}

/// `services` as one read of `/proc/net/ip_vs` reports them (a firewall-mark service by its
/// mark, the listing not printing its family).
fn listed(services: &[Service]) -> Vec<Option<Shared>> {
    let listing = ipvs::procfs::ProcListing::open()
        .expect("open /proc/thread-self/net/ip_vs")
        .read()
        .expect("read and parse the listing");
    services
        .iter()
        .map(|service| {
            let found = listing.iter().find(|l| match (l.id, service.id) {
                (ipvs::procfs::ListedId::Fwmark { mark }, ServiceId::Fwmark { mark: m, .. }) => {
                    mark == m
                }
                (id, want) => id.service_id() == Some(want),
            })?;
            let mut dests: Vec<_> = found
                .destinations
                .iter()
                .map(|d| {
                    let (active, inactive) = (d.active_connections, d.inactive_connections);
                    (d.address, d.port, d.forward, d.weight, active, inactive)
                })
                .collect();
            dests.sort_by_key(|d| (d.0, d.1));
            Some((found.scheduler.clone(), dests))
        })
        .collect()
}

/// Runs `ip ARGS`, panicking when it fails.
fn ip(args: &str) {
    let status = std::process::Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .unwrap_or_else(|err| panic!("ip {args}: {err}"));
    assert!(status.success(), "ip {args}: {status}");
}

/// `/proc/net/ip_vs` against the netlink dumps on a table with both families, SCTP, a
/// firewall-mark service, weights 0 and live connections: a virtual IP of each family on `lo`
/// is also its service's real server (the connections of this namespace reach it through IPVS),
/// a connection held open counts as active and one closed as inactive (FIN_WAIT, 2 minutes).
#[tokio::test]
async fn listing_matches_the_netlink_dumps() {
    let Some(handle) = connect().await else {
        return;
    };
    let (vip4, vip6) = (v4(198, 51, 100, 77), v6(0x77));
    ip("address replace 198.51.100.77/32 dev lo");
    ip("-6 address replace 2001:db8::77/128 dev lo nodad");
    let tcp4 = Service::new(inet(vip4, 8080, Protocol::Tcp), "rr");
    let tcp6 = Service::new(inet(vip6, 8080, Protocol::Tcp), "wrr");
    let mut udp6 = Service::new(inet(vip6, 53, Protocol::Udp), "rr");
    udp6.flags = ServiceFlags::PERSISTENT | ServiceFlags::ONEPACKET;
    udp6.timeout = 10800;
    let sctp = Service::new(inet(v4(192, 0, 2, 77), 3868, Protocol::Sctp), "rr");
    let fwmark = Service::new(
        ServiceId::Fwmark {
            family: AddressFamily::Inet,
            mark: 0x77,
        },
        "wrr",
    );
    let all = [tcp4, tcp6, udp6, sctp, fwmark];
    let _cleanup = Cleanup::services(all.iter().map(|s| s.id));
    let mut direct = Destination::new(v4(192, 0, 2, 8), 0, 3);
    direct.forward = ForwardMethod::DirectRoute;
    let dests = [
        (0, Destination::new(vip4, 8080, 1)),
        (0, Destination::new(v4(192, 0, 2, 9), 8080, 0)),
        (1, Destination::new(vip6, 8080, 2)),
        (1, Destination::new(v6(0x79), 8080, 0)),
        (2, Destination::new(v6(0x5), 53, 0)),
        (2, Destination::new(v6(0x6), 53, 5)),
        (4, direct),
    ];
    for service in &all {
        handle
            .add_service(service)
            .await
            .unwrap_or_else(|err| panic!("add {}: {err}", service.id));
    }
    for (i, dest) in &dests {
        handle
            .add_destination(&all[*i].id, dest)
            .await
            .unwrap_or_else(|err| panic!("add {} to {}: {err}", dest.address, all[*i].id));
    }

    // Through IPVS to the virtual IP itself: one connection held, one closed, per family.
    let mut held = Vec::new();
    for vip in [vip4, vip6] {
        let address = std::net::SocketAddr::new(vip, 8080);
        let listener = std::net::TcpListener::bind(address).expect("listen on the virtual IP");
        let open = std::net::TcpStream::connect(address).expect("connect through IPVS");
        drop(std::net::TcpStream::connect(address).expect("connect through IPVS"));
        held.push((listener, open));
    }
    let local = |table: &[Option<Shared>], i: usize| {
        let vip = [vip4, vip6][i];
        table[i].as_ref().and_then(|(_, dests)| {
            let (.., active, inactive) = *dests.iter().find(|d| d.0 == vip)?;
            Some((active, inactive))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let before = loop {
        let table = dumped(&handle, &all).await;
        let counted = [0, 1].iter().all(|&i| {
            local(&table, i).is_some_and(|(active, inactive)| active >= 1 && inactive >= 1)
        });
        if counted || std::time::Instant::now() > deadline {
            break table;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    for i in [0, 1] {
        let counts = local(&before, i);
        assert!(
            counts.is_some_and(|(active, inactive)| active >= 1 && inactive >= 1),
            "{}: want an active and an inactive connection on the virtual IP's own real server, got {counts:?} in {before:?}",
            all[i].id
        );
    }

    // Equal to the dumps just before it or, the counts having moved, just after it.
    let listing = listed(&all);
    if listing != before {
        assert_eq!(listing, dumped(&handle, &all).await, "before: {before:?}");
    }
    assert!(listing.iter().all(Option::is_some), "{listing:?}");
    // Both families, weight 0 and an empty service are in it.
    let weights: Vec<u32> = listing
        .iter()
        .flatten()
        .flat_map(|(_, d)| d.iter().map(|d| d.3))
        .collect();
    assert_eq!(
        weights.iter().filter(|&&w| w == 0).count(),
        3,
        "{listing:?}"
    );
    assert_eq!(listing[3].as_ref().map(|(_, d)| d.len()), Some(0));

    drop(held);
    for service in &all {
        handle
            .delete_service(&service.id)
            .await
            .expect("DEL_SERVICE");
    }
    assert_eq!(listed(&all), vec![None; all.len()]);
    ip("address del 198.51.100.77/32 dev lo");
    ip("-6 address del 2001:db8::77/128 dev lo");
}
