//! nftables set elements over netlink: an element-only change (an endpoint's hairpin element, a
//! Service's ClusterIP, ...) as one nfnetlink batch (`NFNL_MSG_BATCH_BEGIN`, one
//! `NFT_MSG_DELSETELEM` / `NFT_MSG_NEWSETELEM` per set, `NFNL_MSG_BATCH_END`) in one `sendmsg`,
//! instead of an `nft` process. The kernel applies a batch atomically, as `nft -f` does (it is
//! what `nft` itself sends). An `nft` run takes seconds on a loaded or emulated CPU (figures in
//! docs/performance.md); a batch is one system call.
//!
//! The rules, the table and its sets stay with `nft -f` ([`super::codec::transaction`]), and so do
//! the interval elements of `firewall-allow` (a key range per element): [`batch`] answers `None`
//! for a transaction it does not cover. The messages are built with `netlink-packet-netfilter`'s
//! nftables types; the keys are encoded as `nft` encodes them (below), so `nft list` reads them
//! back as the same elements ([`super::codec::parse_element`]; proxier/tests/nft_kernel.rs).
//!
//! Key encoding (`nft`'s `netlink_gen_concat_data`): an address is 4 or 16 bytes in network
//! order, a protocol 1 byte, a port 2 bytes in network order; inside a concatenation (`ip .
//! proto . port`, `ip . ip`) every field is padded with zeros to a multiple of 4 bytes (one
//! 32-bit register each); a lone port (`health-check-ports`) is 2 bytes.

use super::codec::Transaction;
use super::rules::TABLE;
use crate::dataplane::kernel::batch;
use crate::model::{Protocol, SetElement, VirtualServerKey};
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NetlinkMessage};
use netlink_packet_netfilter::nftables::{
    DataAttribute, ListAttribute, NfTablesMessage, SetElementAttribute, SetElementList,
    SetElementMessage,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use netlink_proto::sys::protocols::NETLINK_NETFILTER;
use netlink_proto::sys::{AsyncSocket, AsyncSocketExt, TokioSocket};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// The nfnetlink subsystem of nftables (`NFNL_SUBSYS_NFTABLES`): the batch messages' `res_id`.
const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// How long the kernel's answers to a batch are awaited. They are queued before `sendmsg`
/// returns; this only bounds a socket that stopped answering.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The key of `element` as `nft` encodes it (module docs); `None` for a `firewall-allow`
/// element (an interval: a key range, left to `nft`).
pub fn key(element: &SetElement) -> Option<Vec<u8>> {
    fn address(ip: IpAddr) -> Vec<u8> {
        match ip {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        }
    }
    fn destination(key: &VirtualServerKey) -> Vec<u8> {
        let protocol = match key.protocol {
            Protocol::Tcp => libc::IPPROTO_TCP,
            Protocol::Udp => libc::IPPROTO_UDP,
            Protocol::Sctp => libc::IPPROTO_SCTP,
        } as u8;
        let mut out = address(key.address);
        out.extend([protocol, 0, 0, 0]);
        out.extend(key.port.to_be_bytes());
        out.extend([0, 0]);
        out
    }
    Some(match element {
        SetElement::ClusterIp(k)
        | SetElement::External(k)
        | SetElement::ExternalLocal(k)
        | SetElement::ExternalNoLocal(k)
        | SetElement::Firewall(k) => destination(k),
        SetElement::ServiceIp(ip) => address(*ip),
        SetElement::Hairpin(ip) => [address(*ip), address(*ip)].concat(),
        SetElement::HealthCheckNodePort(port) => port.to_be_bytes().to_vec(),
        SetElement::FirewallAllow(..) => return None,
    })
}

/// The most elements in one `NEWSETELEM`/`DELSETELEM` message. A netlink attribute's length
/// is 16 bits: the element list of one message must stay under 64 KiB, and an element takes at
/// most 44 bytes (a 32-byte key in three nested attribute headers). Above it a set's elements
/// go in several messages of the same batch, still one transaction.
pub const ELEMENTS_PER_MESSAGE: usize = 1_000;

/// The most elements of one batch: its datagram must fit the socket's send buffer (the kernel
/// refuses a larger one with `EMSGSIZE`; the default buffer is 208 KiB). Larger transactions,
/// which only a full sync of a large table makes, are left to `nft -f`.
pub const ELEMENTS_PER_BATCH: usize = 4_000;

/// The nfnetlink batch of an element-only transaction: batch begin, the deletions then the
/// additions (per set and verb, like [`super::codec::transaction`], in messages of at most
/// [`ELEMENTS_PER_MESSAGE`]), batch end; flags and sequence numbers are set when sent
/// ([`SetElements::apply`]). `None` when `tx` rewrites the rules, holds more than
/// [`ELEMENTS_PER_BATCH`] elements, or holds an element [`key`] does not encode: `nft -f`
/// applies it.
pub fn batch(tx: &Transaction<'_>) -> Option<Vec<NetlinkMessage<NetfilterMessage>>> {
    if tx.rules.is_some() || tx.delete.len() + tx.add.len() > ELEMENTS_PER_BATCH {
        return None;
    }
    let control = |message: ControlMessage| {
        let header = NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES);
        NetlinkMessage::from(NetfilterMessage::new(header, message))
    };
    let mut messages = vec![control(ControlMessage::BatchBegin)];
    for (elements, add) in [(&tx.delete, false), (&tx.add, true)] {
        let mut by_set: BTreeMap<&'static str, Vec<ListAttribute<SetElementAttribute>>> =
            BTreeMap::new();
        for element in elements {
            let key = SetElementAttribute::Key(DataAttribute::Value(key(element)?));
            by_set
                .entry(element.set_name())
                .or_default()
                .push(ListAttribute::Element(vec![key]));
        }
        let chunks = by_set.into_iter().flat_map(|(set, mut elements)| {
            let mut chunks = Vec::new();
            while elements.len() > ELEMENTS_PER_MESSAGE {
                let rest = elements.split_off(ELEMENTS_PER_MESSAGE);
                chunks.push((set, std::mem::replace(&mut elements, rest)));
            }
            chunks.push((set, elements));
            chunks
        });
        for (set, elements) in chunks {
            let message = SetElementMessage {
                attributes: vec![
                    SetElementList::Table(TABLE.to_owned()),
                    SetElementList::Set(set.to_owned()),
                    SetElementList::Elements(elements),
                ],
            };
            let message = match add {
                true => NfTablesMessage::NewSetElement(message),
                false => NfTablesMessage::DeleteSetElement(message),
            };
            let header = NetfilterHeader::new(NetfilterProtoFamily::Inet, 0, 0);
            let mut message = NetlinkMessage::from(NetfilterMessage::new(header, message));
            message.header.flags = if add { NLM_F_CREATE } else { 0 };
            messages.push(message);
        }
    }
    messages.push(control(ControlMessage::BatchEnd));
    Some(messages)
}

/// Errors of applying a batch.
#[derive(Debug, thiserror::Error)]
pub enum ElementsError {
    /// The socket failed, or the kernel did not answer every message (the batch may or may
    /// not have been applied).
    #[error("nfnetlink socket: {0}")]
    Socket(#[from] std::io::Error),
    /// The kernel refused the batch: nothing was changed. The first error answered, as a
    /// positive errno (e.g. `ENOENT`: a deleted element or the set is missing).
    #[error("nftables refused the set element batch: {}", std::io::Error::from_raw_os_error(*.0))]
    Refused(i32),
}

/// A `NETLINK_NETFILTER` socket that applies element batches ([`batch`]).
pub struct SetElements {
    socket: TokioSocket,
    sequence: u32,
}

impl SetElements {
    /// Open and bind the socket.
    ///
    /// Errors: the socket cannot be opened or bound.
    pub fn open() -> std::io::Result<SetElements> {
        let mut socket = TokioSocket::new(NETLINK_NETFILTER)?;
        let inner = socket.socket_mut();
        inner.bind_auto()?;
        inner.set_cap_ack(true)?;
        Ok(SetElements {
            socket,
            sequence: 0,
        })
    }

    /// Send `batch` in one `sendmsg`, every element message asking for an acknowledgement, and
    /// wait for the kernel's answers (it answers once the whole batch was handled).
    ///
    /// Errors: [`ElementsError::Refused`] when the kernel answered an error (the batch was
    /// aborted: nothing changed); [`ElementsError::Socket`] when the socket failed or an answer
    /// did not come within 5 s.
    pub async fn apply(
        &mut self,
        batch: Vec<NetlinkMessage<NetfilterMessage>>,
    ) -> Result<(), ElementsError> {
        let last = batch.len().saturating_sub(1);
        let (buffer, first) = batch::serialize(&mut self.sequence, batch, |i| {
            if i != 0 && i != last { NLM_F_ACK } else { 0 }
        });
        self.socket.send(&buffer).await?;
        // The element messages are `first + 1 ..= first + last - 1`; an error answered to the
        // batch begin (`first`) means the batch was not run at all.
        let mut waiting = last.saturating_sub(1);
        let mut refused = None;
        let answers = async {
            while waiting > 0 {
                let (datagram, _) = self.socket.recv_from_full().await?;
                for (sequence, errno) in batch::answers::<NetfilterMessage>(&datagram)? {
                    let offset = sequence.wrapping_sub(first) as usize;
                    if offset > last {
                        continue;
                    }
                    if let Some(errno) = errno {
                        refused.get_or_insert(errno);
                    }
                    if offset == 0 {
                        waiting = 0;
                    } else if offset < last {
                        waiting = waiting.saturating_sub(1);
                    }
                }
            }
            Ok::<(), std::io::Error>(())
        };
        tokio::time::timeout(ANSWER_TIMEOUT, answers)
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer from the kernel")
            })??;
        match refused {
            Some(errno) => Err(ElementsError::Refused(errno)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::NLM_F_REQUEST;

    fn vs(address: &str, protocol: Protocol, port: u16) -> VirtualServerKey {
        VirtualServerKey {
            address: address.parse().unwrap(),
            port,
            protocol,
        }
    }

    /// The bytes of each kind of key (the kernel and `nft list` read them back as the same
    /// elements: proxier/tests/nft_kernel.rs).
    #[test]
    fn keys_are_encoded_as_nft_encodes_them() {
        let cluster_ip = SetElement::ClusterIp(vs("10.96.0.10", Protocol::Udp, 53));
        assert_eq!(
            key(&cluster_ip).unwrap(),
            [10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0]
        );
        let node_port = SetElement::External(vs("fd00::10", Protocol::Sctp, 30082));
        let mut v6 = vec![0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];
        v6.extend([132, 0, 0, 0, 0x75, 0x82, 0, 0]);
        assert_eq!(key(&node_port).unwrap(), v6);
        let hairpin = SetElement::Hairpin("10.244.1.2".parse().unwrap());
        assert_eq!(key(&hairpin).unwrap(), [10, 244, 1, 2, 10, 244, 1, 2]);
        let service_ip = SetElement::ServiceIp("10.96.0.10".parse().unwrap());
        assert_eq!(key(&service_ip).unwrap(), [10, 96, 0, 10]);
        assert_eq!(
            key(&SetElement::HealthCheckNodePort(32000)).unwrap(),
            [0x7d, 0x00]
        );
        let allow = SetElement::FirewallAllow(
            vs("203.0.113.10", Protocol::Tcp, 80),
            "192.168.100.0/24".parse().unwrap(),
        );
        assert_eq!(key(&allow), None);
    }

    /// Begin, one message per set and verb (deletions first), end; the exact bytes of an
    /// element message, as `nft` sends them for `add element inet kipvs hairpin { 10.244.1.2 .
    /// 10.244.1.2 }` (with this sequence number).
    #[test]
    fn a_batch_is_begin_deletions_additions_end() {
        let (a, b) = (
            SetElement::Hairpin("10.244.1.2".parse().unwrap()),
            SetElement::Hairpin("10.244.1.3".parse().unwrap()),
        );
        let c = SetElement::ServiceIp("10.96.0.10".parse().unwrap());
        let tx = Transaction {
            rules: None,
            delete: vec![&a],
            add: vec![&b, &c],
        };
        let messages = batch(&tx).unwrap();
        let types: Vec<u16> = messages.iter().map(|m| m.payload.message_type()).collect();
        // NFNL_MSG_BATCH_BEGIN, DELSETELEM (10 << 8 | 14), NEWSETELEM x2 (one per set), END.
        assert_eq!(types, [16, 0x0a0e, 0x0a0c, 0x0a0c, 17]);
        assert_eq!(messages[2].header.flags, NLM_F_CREATE);
        assert_eq!(messages[1].header.flags, 0);

        let mut add = batch(&Transaction {
            rules: None,
            delete: vec![],
            add: vec![&a],
        })
        .unwrap()
        .remove(1);
        add.header.flags |= NLM_F_REQUEST | NLM_F_ACK;
        add.header.sequence_number = 2;
        add.finalize();
        let mut bytes = vec![0; add.buffer_len()];
        add.serialize(&mut bytes);
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            // nlmsghdr: length 68, type NFT_MSG_NEWSETELEM, flags REQUEST|ACK|CREATE, seq 2, pid 0
            68, 0, 0, 0, 0x0c, 0x0a, 0x05, 0x04, 2, 0, 0, 0, 0, 0, 0, 0,
            // nfgenmsg: family inet, version 0, res_id 0
            1, 0, 0, 0,
            // NFTA_SET_ELEM_LIST_TABLE "kipvs"
            10, 0, 1, 0, b'k', b'i', b'p', b'v', b's', 0, 0, 0,
            // NFTA_SET_ELEM_LIST_SET "hairpin"
            12, 0, 2, 0, b'h', b'a', b'i', b'r', b'p', b'i', b'n', 0,
            // NFTA_SET_ELEM_LIST_ELEMENTS > NFTA_LIST_ELEM > NFTA_SET_ELEM_KEY > NFTA_DATA_VALUE
            24, 0, 3, 0x80, 20, 0, 1, 0x80, 16, 0, 1, 0x80, 12, 0, 1, 0,
            10, 244, 1, 2, 10, 244, 1, 2,
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn rules_and_intervals_are_left_to_nft() {
        let rules = crate::model::NftRules::new(vec![], false);
        let hairpin = SetElement::Hairpin("10.244.1.2".parse().unwrap());
        let with_rules = Transaction {
            rules: Some(&rules),
            delete: vec![],
            add: vec![&hairpin],
        };
        assert!(batch(&with_rules).is_none());
        let allow = SetElement::FirewallAllow(
            vs("203.0.113.10", Protocol::Tcp, 80),
            "192.168.100.0/24".parse().unwrap(),
        );
        let with_interval = Transaction {
            rules: None,
            delete: vec![&allow],
            add: vec![&hairpin],
        };
        assert!(batch(&with_interval).is_none());
    }
}
