//! kipvs's nftables table against the real `nft` and the running kernel's nf_tables, each test
//! in a network namespace of its own (`unshare(CLONE_NEWNET)` on the test's thread; `nft`
//! inherits it). Needs root and the `nft` executable: `.ci/run` installs the `nftables`
//! package. Without them the tests say so and pass, unless `KIPVS_REQUIRE_NFT=1` (set by
//! `hack/test.sh`) makes that a failure.

use kipvs_proxier::dataplane::nftables::codec::{Transaction, transaction};
use kipvs_proxier::dataplane::nftables::elements::{
    self as nft_elements, ElementsError, SetElements,
};
use kipvs_proxier::dataplane::nftables::rules::rule_comments;
use kipvs_proxier::dataplane::nftables::runner::Nft;
use kipvs_proxier::model::{NftRules, Protocol, SetElement, VirtualServerKey};
use std::collections::BTreeSet;

/// Moves this thread into a new network namespace; false (or a panic with
/// `KIPVS_REQUIRE_NFT=1`) when that or `nft` is not available.
fn private_netns() -> bool {
    let required = std::env::var("KIPVS_REQUIRE_NFT").is_ok_and(|v| v == "1");
    // SAFETY: unshare only changes this thread's namespace membership.
    let unshared = unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0;
    let nft = std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !(unshared && nft) {
        assert!(
            !required,
            "KIPVS_REQUIRE_NFT=1 but unshare(CLONE_NEWNET)={unshared}, nft={nft}"
        );
        eprintln!("skipped: needs root (unshare) and the nft executable");
    }
    unshared && nft
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn key(address: &str, protocol: Protocol, port: u16) -> VirtualServerKey {
    VirtualServerKey {
        address: address.parse().unwrap(),
        port,
        protocol,
    }
}

/// One element of every kind, both families.
fn every_kind() -> BTreeSet<SetElement> {
    let c4 = key("10.96.0.10", Protocol::Udp, 53);
    let c6 = key("fd00:96::a", Protocol::Tcp, 443);
    let lb = key("203.0.113.10", Protocol::Tcp, 80);
    [
        SetElement::ClusterIp(c4),
        SetElement::ClusterIp(c6),
        SetElement::External(key("192.168.0.10", Protocol::Tcp, 30080)),
        SetElement::ExternalLocal(key("192.168.0.10", Protocol::Sctp, 30081)),
        SetElement::ExternalNoLocal(key("192.168.0.10", Protocol::Sctp, 30081)),
        SetElement::ExternalNoLocal(key("fd00::10", Protocol::Tcp, 30083)),
        SetElement::External(key("fd00::10", Protocol::Udp, 30082)),
        SetElement::ServiceIp("10.96.0.10".parse().unwrap()),
        SetElement::ServiceIp("fd00:96::a".parse().unwrap()),
        SetElement::Hairpin("10.244.1.2".parse().unwrap()),
        SetElement::Hairpin("fd00:244::2".parse().unwrap()),
        SetElement::Firewall(lb),
        SetElement::FirewallAllow(lb, "192.168.100.0/24".parse().unwrap()),
        SetElement::FirewallAllow(lb, "203.0.113.10/32".parse().unwrap()),
        SetElement::FirewallAllow(
            key("fd00:203::10", Protocol::Tcp, 80),
            "fd00:1::/64".parse().unwrap(),
        ),
        SetElement::HealthCheckNodePort(32000),
    ]
    .into()
}

#[test]
fn table_elements_and_rules_round_trip_through_the_kernel() {
    if !private_netns() {
        return;
    }
    runtime().block_on(async {
        let nft = Nft::default();
        assert_eq!(nft.observe().await.unwrap(), Default::default());
        let rules = NftRules::new(
            vec![
                "10.244.0.0/16".parse().unwrap(),
                "fd00:244::/56".parse().unwrap(),
            ],
            false,
        );
        let elements = every_kind();
        let tx = Transaction {
            rules: Some(&rules),
            delete: vec![],
            add: elements.iter().collect(),
        };
        nft.apply(&transaction(&tx)).await.unwrap();
        let observed = nft.observe().await.unwrap();
        assert_eq!(observed.elements, elements);
        assert_eq!(observed.rule_comments, rule_comments(&rules));

        // Delete some, add others, rules untouched: one transaction.
        let gone = SetElement::Hairpin("10.244.1.2".parse().unwrap());
        let new = SetElement::ClusterIp(key("10.96.0.11", Protocol::Tcp, 80));
        let tx = Transaction {
            rules: None,
            delete: vec![&gone],
            add: vec![&new],
        };
        nft.apply(&transaction(&tx)).await.unwrap();
        let observed = nft.observe().await.unwrap();
        let mut expected = elements.clone();
        expected.remove(&gone);
        expected.insert(new);
        assert_eq!(observed.elements, expected);
        assert_eq!(observed.rule_comments, rule_comments(&rules));

        // Rules rewritten with other parameters: same count, new comments, elements kept.
        let all = NftRules::new(vec![], true);
        let tx = Transaction {
            rules: Some(&all),
            ..Default::default()
        };
        nft.apply(&transaction(&tx)).await.unwrap();
        let observed = nft.observe().await.unwrap();
        assert_eq!(observed.rule_comments, rule_comments(&all));
        assert_eq!(observed.elements, expected);

        // A failing transaction (deleting a missing element) changes nothing.
        let missing = SetElement::HealthCheckNodePort(31999);
        let tx = Transaction {
            rules: None,
            delete: vec![&missing],
            add: vec![&gone],
        };
        let err = nft.apply(&transaction(&tx)).await.unwrap_err();
        assert!(err.to_string().contains("failed"), "{err}");
        assert_eq!(nft.observe().await.unwrap().elements, expected);

        nft.delete_table().await.unwrap();
        assert_eq!(nft.observe().await.unwrap(), Default::default());
        nft.delete_table().await.unwrap();
    });
}

/// Element-only transactions over netlink (`nft_elements`): every kind of element it encodes is
/// read back by `nft` as the same element, deletions and additions land in one batch, and a
/// refused batch (deleting a missing element) changes nothing.
#[test]
fn set_element_batches_over_netlink_read_back_through_nft() {
    if !private_netns() {
        return;
    }
    runtime().block_on(async {
        let nft = Nft::default();
        let rules = NftRules::new(vec!["10.244.0.0/16".parse().unwrap()], false);
        let tx = Transaction {
            rules: Some(&rules),
            ..Default::default()
        };
        nft.apply(&transaction(&tx)).await.unwrap();
        let elements: BTreeSet<SetElement> = every_kind()
            .into_iter()
            .filter(|e| nft_elements::key(e).is_some())
            .collect();
        let mut socket = SetElements::open().unwrap();
        let add = Transaction {
            rules: None,
            delete: vec![],
            add: elements.iter().collect(),
        };
        socket
            .apply(nft_elements::batch(&add).unwrap())
            .await
            .unwrap();
        let observed = nft.observe().await.unwrap();
        assert_eq!(observed.elements, elements);
        assert_eq!(observed.rule_comments, rule_comments(&rules));

        // An endpoint replaced: its hairpin element out, the new one in, one batch.
        let gone = SetElement::Hairpin("10.244.1.2".parse().unwrap());
        let new = SetElement::Hairpin("10.244.1.3".parse().unwrap());
        let change = Transaction {
            rules: None,
            delete: vec![&gone],
            add: vec![&new],
        };
        socket
            .apply(nft_elements::batch(&change).unwrap())
            .await
            .unwrap();
        let mut expected = elements.clone();
        expected.remove(&gone);
        expected.insert(new);
        assert_eq!(nft.observe().await.unwrap().elements, expected);

        // Refused whole: the missing element's deletion fails the batch, the addition with it
        // does not land either.
        let refused = Transaction {
            rules: None,
            delete: vec![&gone],
            add: vec![&gone],
        };
        let err = socket
            .apply(nft_elements::batch(&refused).unwrap())
            .await
            .unwrap_err();
        assert!(matches!(err, ElementsError::Refused(libc::ENOENT)), "{err}");
        assert_eq!(nft.observe().await.unwrap().elements, expected);
        // The socket still works after a refusal.
        let back = Transaction {
            rules: None,
            delete: vec![&new],
            add: vec![&gone],
        };
        socket
            .apply(nft_elements::batch(&back).unwrap())
            .await
            .unwrap();
        assert_eq!(nft.observe().await.unwrap().elements, elements);

        // More elements of one set than one message holds (a netlink attribute's length is 16
        // bits: 3,500 IPv6 ClusterIP elements are ~126 KiB): several messages, one batch, every
        // element there; then all deleted in one batch.
        let many: BTreeSet<SetElement> = (0..3_500u16)
            .map(|i| {
                let address = format!("fd00:10:96::{i:x}");
                SetElement::ClusterIp(key(&address, Protocol::Tcp, 443))
            })
            .collect();
        let add_many = Transaction {
            rules: None,
            delete: vec![],
            add: many.iter().collect(),
        };
        let batch = nft_elements::batch(&add_many).unwrap();
        assert_eq!(batch.len(), 2 + 4, "begin, 4 messages of <= 1,000, end");
        socket.apply(batch).await.unwrap();
        let mut expected = elements.clone();
        expected.extend(many.iter().copied());
        assert_eq!(nft.observe().await.unwrap().elements, expected);
        let delete_many = Transaction {
            rules: None,
            delete: many.iter().collect(),
            add: vec![],
        };
        socket
            .apply(nft_elements::batch(&delete_many).unwrap())
            .await
            .unwrap();
        assert_eq!(nft.observe().await.unwrap().elements, elements);
        nft.delete_table().await.unwrap();
    });
}

/// The kernel refuses a `firewall-allow` interval that overlaps another of the same load-balancer
/// IP and port (`EEXIST`), and with it the whole transaction. [`Isolation`] over the real `nft`
/// finds that element alone: every other Service's elements land, in as few transactions as
/// its halving takes, and the refused one is absent.
#[test]
fn a_refused_interval_is_isolated_and_every_other_element_lands() {
    use kipvs_proxier::dataplane::isolate::Isolation;
    use kipvs_proxier::dataplane::{Op, nft_transaction};
    if !private_netns() {
        return;
    }
    runtime().block_on(async {
        let nft = Nft::default();
        let lb = key("10.0.5.100", Protocol::Tcp, 80);
        let allow = |net: &str| SetElement::FirewallAllow(lb, net.parse().unwrap());
        let rules = NftRules::new(vec!["10.244.0.0/16".parse().unwrap()], false);
        let tx = Transaction {
            rules: Some(&rules),
            delete: vec![],
            add: vec![],
        };
        nft.apply(&transaction(&tx)).await.unwrap();
        let inner = allow("10.0.5.100/32");
        let mut ops = vec![
            Op::AddSetElement(SetElement::Firewall(lb)),
            Op::AddSetElement(allow("10.0.0.0/8")),
        ];
        let others: Vec<SetElement> = (1..=40)
            .map(|i| SetElement::ClusterIp(key(&format!("10.96.0.{i}"), Protocol::Tcp, 80)))
            .collect();
        ops.extend(others[..20].iter().map(|e| Op::AddSetElement(*e)));
        ops.push(Op::AddSetElement(inner));
        ops.extend(others[20..].iter().map(|e| Op::AddSetElement(*e)));

        // Whole, the kernel refuses it and nothing lands.
        let err = nft.apply(&transaction(&nft_transaction(&ops))).await;
        assert!(err.is_err(), "an interval inside another is refused");
        assert!(nft.observe().await.unwrap().elements.is_empty());

        let mut isolation = Isolation::new(&ops);
        let mut transactions = 0;
        while let Some(part) = isolation.next_part() {
            transactions += 1;
            let result = nft.apply(&transaction(&nft_transaction(part))).await;
            isolation.done(result.map_err(Into::into));
        }
        let failed: Vec<Op> = isolation.failures().into_iter().map(|f| f.op).collect();
        assert_eq!(failed, [Op::AddSetElement(inner)]);
        let mut expected: BTreeSet<SetElement> = others.iter().copied().collect();
        expected.extend([SetElement::Firewall(lb), allow("10.0.0.0/8")]);
        assert_eq!(nft.observe().await.unwrap().elements, expected);
        assert!(transactions <= 2 * 6 + 1, "{transactions} transactions");
    });
}

/// `firewall-allow` intervals are created (`NLM_F_EXCL`), so the kernel refuses every clash
/// with an element of the set, kipvs's or not (Debian 12's 6.1 left one out without an error
/// when added without the flag), and also an element that is exactly present, which
/// [`applied_anyway`](kipvs_proxier::dataplane::isolate::applied_anyway) counts as applied once
/// the table is read back. A range narrowed in one transaction (the old interval deleted, a
/// nested one created) still lands, through isolation when the kernel refuses it whole.
#[test]
fn firewall_allow_creations_are_refused_on_any_clash_and_a_present_one_counts_as_applied() {
    use kipvs_proxier::dataplane::isolate::{Isolation, applied_anyway, refused_creations};
    use kipvs_proxier::dataplane::{Op, nft_transaction};
    if !private_netns() {
        return;
    }
    runtime().block_on(async {
        let nft = Nft::default();
        let lb = key("203.0.113.40", Protocol::Tcp, 80);
        let allow = |net: &str| SetElement::FirewallAllow(lb, net.parse().unwrap());
        let rules = NftRules::new(vec![], false);
        let apply = |ops: &[Op]| {
            let ops = ops.to_vec();
            let nft = &nft;
            async move {
                let mut isolation = Isolation::new(&ops);
                while let Some(part) = isolation.next_part() {
                    let result = nft.apply(&transaction(&nft_transaction(part))).await;
                    isolation.done(result.map_err(Into::into));
                }
                isolation.failures()
            }
        };
        let wide = Op::AddSetElement(allow("192.168.0.0/16"));
        assert!(
            apply(&[Op::WriteRules(rules.clone()), wide.clone()])
                .await
                .is_empty()
        );

        // Exactly present: refused, and applied once read back.
        let mut refused = apply(std::slice::from_ref(&wide)).await;
        assert_eq!(refused.len(), 1, "create refuses a present element");
        assert!(refused_creations(&refused));
        let present = nft.observe().await.unwrap().elements;
        assert_eq!(applied_anyway(&mut refused, &present), [wide]);
        assert!(refused.is_empty());

        // Narrowed: /16 deleted and /24 (inside it) created in one stage.
        let narrow = [
            Op::DeleteSetElement(allow("192.168.0.0/16")),
            Op::AddSetElement(allow("192.168.100.0/24")),
        ];
        assert!(apply(&narrow).await.is_empty());
        let elements = nft.observe().await.unwrap().elements;
        assert_eq!(elements, [allow("192.168.100.0/24")].into());

        // A clash with an element kipvs did not write (a range of load-balancer IPs, which kipvs
        // neither reads as its own nor deletes) is refused, and the element stays out.
        let foreign = "203.0.113.40-203.0.113.41 . tcp . 80 . 10.0.0.0/8";
        let status = std::process::Command::new("nft")
            .args(["add", "element", "inet", "kipvs", "firewall-allow"])
            .arg(format!("{{ {foreign} }}"))
            .status()
            .unwrap();
        assert!(status.success());
        let clash = Op::AddSetElement(allow("10.1.0.0/16"));
        let mut refused = apply(std::slice::from_ref(&clash)).await;
        let present = nft.observe().await.unwrap().elements;
        assert!(applied_anyway(&mut refused, &present).is_empty());
        let failed: Vec<&Op> = refused.iter().map(|f| &f.op).collect();
        assert_eq!(failed, [&clash]);
        assert_eq!(present, [allow("192.168.100.0/24")].into());
    });
}

/// The start-up check's `nft --check` (`kipvs_proxier::dataplane::kernel::preflight`) is validated by
/// the running kernel and writes nothing: the table is still absent afterwards, and a batch the
/// kernel refuses fails the check.
#[test]
fn a_check_validates_the_table_and_writes_nothing() {
    if !private_netns() {
        return;
    }
    runtime().block_on(async {
        let nft = Nft::default();
        let rules = NftRules::new(vec!["10.244.0.0/16".parse().unwrap()], false);
        let table = transaction(&Transaction {
            rules: Some(&rules),
            ..Transaction::default()
        });
        nft.check(&table)
            .await
            .expect("the running kernel has what kipvs needs");
        assert_eq!(
            nft.observe().await.unwrap(),
            Default::default(),
            "a check must leave no table behind"
        );
        // An element for a set the batch does not declare: the kernel refuses it.
        let mut refused = serde_json::to_value(&table).unwrap();
        refused["nftables"].as_array_mut().unwrap().push(
            serde_json::json!({"add": {"element": {"family": "inet", "table": "kipvs",
                "name": "no-such-set", "elem": ["10.0.0.1"]}}}),
        );
        let refused: nftables::schema::Nftables<'_> = serde_json::from_value(refused).unwrap();
        assert!(
            nft.check(&refused).await.is_err(),
            "a refused batch fails the check"
        );
    });
}

/// Issue 34: every `detectLocalMode` detector is accepted by the kernel in the ClusterIP
/// masquerade rule and reads back as kube-proxy's match: the node's pod CIDRs, `iifname !=`
/// the bridge, and a wildcard `iifname != "veth*"` (a prefix, not the literal `*`).
#[test]
fn local_traffic_detectors_are_written_as_kube_proxys_matches() {
    use kipvs_proxier::model::LocalTraffic;
    if !private_netns() {
        return;
    }
    runtime().block_on(async {
        let nft = Nft::default();
        for (local, expected) in [
            (
                LocalTraffic::NodeCidrs(vec![
                    "10.244.3.0/24".parse().unwrap(),
                    "fd00:10:244:3::/64".parse().unwrap(),
                ]),
                [
                    "ip saddr != 10.244.3.0/24",
                    "ip6 saddr != fd00:10:244:3::/64",
                ],
            ),
            (
                LocalTraffic::BridgeInterface("cbr0".into()),
                ["iifname != \"cbr0\"", "iifname != \"cbr0\""],
            ),
            (
                LocalTraffic::InterfaceNamePrefix("veth".into()),
                ["iifname != \"veth*\"", "iifname != \"veth*\""],
            ),
        ] {
            let rules = NftRules::detecting(local.clone(), false);
            let tx = Transaction {
                rules: Some(&rules),
                ..Default::default()
            };
            nft.apply(&transaction(&tx)).await.unwrap();
            assert_eq!(
                nft.observe().await.unwrap().rule_comments,
                rule_comments(&rules)
            );
            let listed = std::process::Command::new("nft")
                .args(["list", "chain", "inet", "kipvs", "mark-masquerade"])
                .output()
                .unwrap();
            let listed = String::from_utf8(listed.stdout).unwrap();
            for (family, matched) in ["IPv4", "IPv6"].into_iter().zip(expected) {
                let line = listed
                    .lines()
                    .find(|l| {
                        l.contains(&format!("{family}: ClusterIP connections"))
                            && !l.contains("service IP")
                    })
                    .unwrap_or_else(|| panic!("{local:?} {family}: {listed}"));
                assert!(line.contains(matched), "{local:?}: {line}");
            }
        }
        nft.delete_table().await.unwrap();
    });
}

/// A hostPort on a ClusterIP's port (issue 34 item 6, kubernetes#62718): a NAT chain at
/// priority -100 that DNATs every local destination's port 80 elsewhere, as the CNI portmap
/// plugin's `CNI-HOSTPORT-DNAT` does in iptables' nat table, captures a connection to a local
/// cluster IP; once kipvs's table holds that ClusterIP, its `pin-output` chain (-110) binds the
/// connection first and it reaches the cluster IP. A listener on the cluster IP stands in for
/// IPVS (the connection's destination is what this shows), traffic is the node's own (`output`).
#[test]
fn a_host_port_dnat_does_not_capture_a_cluster_ip() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    if !private_netns() {
        return;
    }
    let ip = |args: &str| {
        let ok = std::process::Command::new("ip")
            .args(args.split(' '))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args}");
    };
    ip("link set lo up");
    ip("addr add 10.96.0.10/32 dev lo");
    ip("addr add 10.1.1.1/32 dev lo");
    let serve = |addr: &str, answer: &'static [u8]| {
        let listener = TcpListener::bind(addr).unwrap();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let _ = conn.write_all(answer);
            }
        });
    };
    serve("10.96.0.10:80", b"service");
    serve("10.1.1.1:8080", b"hostport");
    let get = || {
        let mut conn = TcpStream::connect("10.96.0.10:80").unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answer
    };
    let portmap = "table ip portmap {\n chain out {\n  type nat hook output priority -100;\n  \
                   fib daddr type local tcp dport 80 dnat to 10.1.1.1:8080\n }\n}\n";
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(portmap.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "nft -f - (portmap)");
    assert_eq!(get(), "hostport", "the emulated portmap DNAT captures");
    runtime().block_on(async {
        let rules = NftRules::new(vec![], false);
        let cluster_ip = SetElement::ClusterIp(key("10.96.0.10", Protocol::Tcp, 80));
        let tx = Transaction {
            rules: Some(&rules),
            delete: vec![],
            add: vec![&cluster_ip],
        };
        Nft::default().apply(&transaction(&tx)).await.unwrap();
    });
    assert_eq!(get(), "service", "kipvs's pin keeps the cluster IP");
}
