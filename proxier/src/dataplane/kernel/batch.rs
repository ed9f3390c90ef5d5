//! Batched netlink do-requests: many requests in one `sendmsg`, answered by one acknowledgement.
//!
//! The kernel handles every netlink message of a `sendmsg` in turn, in the sender's context,
//! before the call returns (`netlink_rcv_skb`), and answers a message only when it asks for an
//! acknowledgement (`NLM_F_ACK`) or fails. So a batch asks for the acknowledgement of its last
//! message only: once that answer (an acknowledgement, or the last message's own error) is read,
//! every message of the batch was handled, and those with no error answer succeeded. A request
//! costs a share of one `sendmsg` and one `recvmsg`, where a request/answer exchange through
//! `netlink-proto` costs a send, a receive and a wake-up of its connection task each (that
//! task sends one request per wake-up, however many are queued).
//!
//! Failures stay per request: the error answers carry the failed request's sequence number.
//! The socket asks for short error answers (`NETLINK_CAP_ACK`: the request is not echoed) and
//! a batch is at most [`BATCH`] requests, so even a batch that fails whole fits the receive
//! buffer. If answers are lost anyway (`ENOBUFS`), or the last answer does not come within
//! [`ANSWER_TIMEOUT`], the requests of that batch without an error answer are reported failed
//! with that error (`ENOBUFS`, `ETIMEDOUT`) although they may have been applied: their entries
//! are re-read before they are retried (see `engine::syncer`), never assumed done or undone.
//! Answers that come after their batch was given up carry older sequence numbers and are
//! ignored.

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkDeserializable, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};
use netlink_proto::sys::{AsyncSocket, AsyncSocketExt, TokioSocket};
use std::io;

/// The most requests sent in one `sendmsg`. A batch's error answers, each a few hundred bytes
/// of receive buffer, must fit the socket's receive buffer ([`RECEIVE_BUFFER`]); its requests
/// (≤ 100 bytes each for addresses and IPVS entries) fit the default send buffer.
pub const BATCH: usize = 256;

/// The receive buffer asked for (the kernel caps it at `net.core.rmem_max`, and doubles it).
const RECEIVE_BUFFER: usize = 1 << 20;

/// How long the answers of a batch are waited for. The kernel answers every request of a
/// `sendmsg` before the call returns, so this is only a bound on a kernel or socket fault.
pub const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A netlink socket of one protocol (`NETLINK_ROUTE`, `NETLINK_GENERIC`, ...) that sends
/// do-requests in batches ([`Batcher::send_all`]).
pub struct Batcher {
    socket: TokioSocket,
    sequence: u32,
}

impl Batcher {
    /// Open and bind a socket of `protocol` (a `netlink_sys::protocols` constant).
    ///
    /// Errors: the socket cannot be opened or bound.
    pub fn open(protocol: isize) -> io::Result<Batcher> {
        Self::open_with_buffer(protocol, RECEIVE_BUFFER)
    }

    /// [`Batcher::open`] with a receive buffer of `receive_buffer` bytes asked for.
    fn open_with_buffer(protocol: isize, receive_buffer: usize) -> io::Result<Batcher> {
        let mut socket = TokioSocket::new(protocol)?;
        let inner = socket.socket_mut();
        inner.bind_auto()?;
        inner.set_cap_ack(true)?;
        // Best effort: without it the default buffer still holds a batch of acknowledgements.
        let _ = inner.set_rx_buf_sz(receive_buffer);
        Ok(Batcher {
            socket,
            sequence: 0,
        })
    }

    /// Send `requests` (do-requests whose success has no reply: adds, deletes, sets) in
    /// batches of at most [`BATCH`], and return, in the same order, `Ok` or the errno the
    /// kernel answered for each (positive, e.g. `libc::EEXIST`; `ENOBUFS` or `ETIMEDOUT` when
    /// the answer was lost and the request may have been applied). `NLM_F_REQUEST | flags`
    /// (plus `NLM_F_ACK` on each batch's last) are added to the requests' flags; their
    /// sequence numbers are assigned here.
    ///
    /// Errors: the socket fails; nothing more is sent then.
    pub async fn send_all<T>(
        &mut self,
        requests: Vec<NetlinkMessage<T>>,
        flags: u16,
    ) -> io::Result<Vec<Result<(), i32>>>
    where
        T: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
    {
        let mut results = Vec::with_capacity(requests.len());
        let mut requests = requests.into_iter().peekable();
        while requests.peek().is_some() {
            let batch: Vec<NetlinkMessage<T>> = requests.by_ref().take(BATCH).collect();
            let count = batch.len();
            let (buffer, first) = serialize(&mut self.sequence, batch, |i| {
                flags | if i + 1 == count { NLM_F_ACK } else { 0 }
            });
            self.socket.send(&buffer).await?;
            let mut answered = vec![Ok(()); count];
            self.read_answers::<T>(first, &mut answered).await?;
            results.extend(answered);
        }
        Ok(results)
    }

    /// Read the answers of the batch whose first request is `first`, until the answer for its
    /// last; record errors in `batch`.
    async fn read_answers<T>(&mut self, first: u32, batch: &mut [Result<(), i32>]) -> io::Result<()>
    where
        T: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
    {
        let last = self.sequence;
        loop {
            let received = tokio::time::timeout(ANSWER_TIMEOUT, self.socket.recv_from_full()).await;
            let datagram = match received {
                Ok(Ok((datagram, _))) => datagram,
                Err(_elapsed) => {
                    // The requests without an error answer may or may not have been handled.
                    for slot in batch.iter_mut().filter(|slot| slot.is_ok()) {
                        *slot = Err(libc::ETIMEDOUT);
                    }
                    return Ok(());
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Answers were dropped: which requests failed is unknown, so all of the
                    // batch count as failed (re-read and retried by the caller). Every answer
                    // was queued before `sendmsg` returned: read what is left without waiting.
                    batch.fill(Err(libc::ENOBUFS));
                    while self.socket.socket_ref().recv_from_full().is_ok() {}
                    return Ok(());
                }
                Ok(Err(e)) => return Err(e),
            };
            for (sequence, errno) in answers::<T>(&datagram)? {
                if let (Some(errno), Some(slot)) =
                    (errno, batch.get_mut(sequence.wrapping_sub(first) as usize))
                {
                    *slot = Err(errno);
                }
                if sequence == last {
                    return Ok(());
                }
            }
        }
    }
}

/// Number `messages` on from `*sequence + 1` (advancing `sequence`), add `NLM_F_REQUEST` and
/// `flags(i)` to the flags of the `i`-th, and serialize them into one buffer for one
/// `sendmsg`. Returns the buffer and the first message's sequence number. Shared with the
/// nfnetlink element batches ([`crate::dataplane::nftables::elements`]).
pub fn serialize<T>(
    sequence: &mut u32,
    messages: Vec<NetlinkMessage<T>>,
    flags: impl Fn(usize) -> u16,
) -> (Vec<u8>, u32)
where
    T: NetlinkSerializable + std::fmt::Debug,
{
    let first = sequence.wrapping_add(1);
    let mut buffer = Vec::new();
    for (i, mut message) in messages.into_iter().enumerate() {
        *sequence = sequence.wrapping_add(1);
        message.header.sequence_number = *sequence;
        message.header.flags |= NLM_F_REQUEST | flags(i);
        message.finalize();
        let at = buffer.len();
        buffer.resize(at + message.buffer_len(), 0);
        message.serialize(&mut buffer[at..]);
    }
    (buffer, first)
}

/// The acknowledgements and error answers in one received datagram, in order: the sequence
/// number each answers, and `None` (an acknowledgement) or the errno (positive). Other
/// messages (replies) are passed over.
///
/// Errors: a message does not parse (`InvalidData`).
pub fn answers<T>(datagram: &[u8]) -> io::Result<Vec<(u32, Option<i32>)>>
where
    T: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut at = 0;
    while at < datagram.len() {
        let message = NetlinkMessage::<T>::deserialize(&datagram[at..])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        if let NetlinkPayload::Error(error) = &message.payload {
            let errno = error.code.map(|code| -code.get());
            out.push((message.header.sequence_number, errno));
        }
        match message.header.length as usize {
            0 => break,
            length => at += (length + 3) & !3,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    //! Against this machine's own `NETLINK_ROUTE` socket, with requests that change nothing.
    use super::*;
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_packet_route::link::LinkMessage;
    use netlink_proto::sys::protocols::NETLINK_ROUTE;
    use rtnetlink::AddressMessageBuilder;
    use std::net::Ipv4Addr;

    /// Succeeds: read the loopback link (index 1 in every network namespace). Its reply is not
    /// an error answer, so `send_all` passes over it.
    fn read_loopback() -> NetlinkMessage<RouteNetlinkMessage> {
        let mut link = LinkMessage::default();
        link.header.index = 1;
        NetlinkMessage::from(RouteNetlinkMessage::GetLink(link))
    }

    /// Fails: delete an address from a link that does not exist (`ENODEV`; `EPERM` for a
    /// process without `CAP_NET_ADMIN`).
    fn delete_from_no_link() -> NetlinkMessage<RouteNetlinkMessage> {
        let message = AddressMessageBuilder::<Ipv4Addr>::new()
            .index(0x7fff_fff0)
            .address(Ipv4Addr::new(192, 0, 2, 1), 32)
            .build();
        NetlinkMessage::from(RouteNetlinkMessage::DelAddress(message))
    }

    fn fails(i: usize) -> bool {
        i % 7 == 3 || i == BATCH - 1 || i == BATCH
    }

    #[tokio::test]
    async fn each_request_gets_its_own_answer_across_batches() {
        let mut batcher = Batcher::open(NETLINK_ROUTE).unwrap();
        let count = 2 * BATCH + 88;
        let requests = (0..count)
            .map(|i| match fails(i) {
                true => delete_from_no_link(),
                false => read_loopback(),
            })
            .collect();
        let results = batcher.send_all(requests, 0).await.unwrap();
        assert_eq!(results.len(), count);
        for (i, result) in results.iter().enumerate() {
            match fails(i) {
                true => assert!(
                    matches!(result, Err(libc::ENODEV | libc::EPERM)),
                    "request {i}: {result:?}"
                ),
                false => assert_eq!(*result, Ok(()), "request {i}"),
            }
        }
    }

    #[tokio::test]
    async fn lost_answers_fail_the_whole_batch_and_the_next_batch_is_answered_right() {
        // A receive buffer far too small for a batch of link replies (about 1.4 KiB each).
        let mut batcher = Batcher::open_with_buffer(NETLINK_ROUTE, 4096).unwrap();
        let requests = (0..BATCH).map(|_| read_loopback()).collect();
        let results = batcher.send_all(requests, 0).await.unwrap();
        assert!(
            results.iter().all(|r| *r == Err(libc::ENOBUFS)),
            "{results:?}"
        );
        // Nothing left over from the lost batch is taken for the next one's answers.
        let requests = vec![read_loopback(), delete_from_no_link(), read_loopback()];
        let results = batcher.send_all(requests, 0).await.unwrap();
        assert_eq!(results[0], Ok(()));
        assert!(matches!(results[1], Err(libc::ENODEV | libc::EPERM)));
        assert_eq!(results[2], Ok(()));
    }
}
