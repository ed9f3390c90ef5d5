//! [`Handle`]: the async IPVS client.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::{GenlFamily, GenlMessage};
use netlink_proto::ConnectionHandle;
use netlink_sys::SocketAddr;
use netlink_sys::protocols::NETLINK_GENERIC;

use crate::codec::IpvsMessage;
use crate::ctrl;
use crate::error::Error;
use crate::types::{Destination, Info, Service, ServiceId, Timeouts};

/// How long a [`Handle`] waits for the kernel's answer to one request unless
/// told otherwise ([`Handle::with_request_timeout`]).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How a request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// A do-request with `NLM_F_ACK`: optional reply messages, then an
    /// acknowledgement or an error.
    Do,
    /// A dump (`NLM_F_DUMP`): `NLM_F_MULTI` messages closed by `NLMSG_DONE`.
    Dump,
}

/// Wraps `payload` in generic-netlink and netlink headers for `family_id`,
/// with the flags of `kind`, and finalizes it (sequence number 0: the
/// connection assigns the real one).
pub(crate) fn request_message(
    payload: IpvsMessage,
    family_id: u16,
    kind: Request,
) -> NetlinkMessage<GenlMessage<IpvsMessage>> {
    let mut genl = GenlMessage::from_payload(payload);
    genl.set_resolved_family_id(family_id);
    let mut message = NetlinkMessage::from(genl);
    message.header.flags = match kind {
        Request::Do => NLM_F_REQUEST | NLM_F_ACK,
        Request::Dump => NLM_F_REQUEST | NLM_F_DUMP,
    };
    message.finalize();
    message
}

/// What one message received for a request means.
#[derive(Debug)]
pub(crate) enum Step {
    /// An IPVS message of the answer (a reply or a dump entry).
    Reply(IpvsMessage),
    /// The request is over: acknowledged or dump complete (`Ok`), or
    /// refused by the kernel (`Err`, from the negative errno of an
    /// `NLMSG_ERROR` or of an `NLMSG_DONE` that ends a failed dump).
    End(Result<(), Error>),
    /// Nothing for the request (`NLMSG_NOOP`).
    Skip,
}

/// Classifies one message received for a request.
pub(crate) fn step(message: NetlinkMessage<GenlMessage<IpvsMessage>>) -> Step {
    match message.payload {
        NetlinkPayload::InnerMessage(genl) => Step::Reply(genl.payload),
        NetlinkPayload::Error(err) => Step::End(match err.code {
            None => Ok(()),
            Some(code) => Err(Error::from_errno(code.get().saturating_abs())),
        }),
        NetlinkPayload::Done(done) => Step::End(match done.code {
            0 => Ok(()),
            code => Err(Error::from_errno(code.saturating_abs())),
        }),
        _ => Step::Skip,
    }
}

/// A connection to the kernel's IPVS configuration interface (the `IPVS`
/// generic-netlink family of `net/netfilter/ipvs/ip_vs_ctl.c`).
///
/// One `NETLINK_GENERIC` socket is driven by a background task spawned on the
/// Tokio runtime; the handle sends requests to it. Cloning is cheap (a
/// channel sender) and every method takes `&self`, so any number of requests
/// can be in flight at once: they are pipelined over the one socket, and
/// replies are matched to requests by sequence number. The background task
/// ends when the last clone is dropped.
///
/// The socket belongs to the network namespace of the thread that called
/// [`Handle::connect`]; IPVS state is per namespace. Every command needs
/// `CAP_NET_ADMIN` ([`Error::PermissionDenied`] otherwise).
///
/// Each method waits for the kernel's answer: the acknowledgement of a
/// change, the reply of a query, or the end of a dump, at most the request
/// timeout ([`REQUEST_TIMEOUT`] by default; [`Error::Timeout`] then, so one
/// request the kernel never answers cannot stall its caller). Kernel errors
/// map to [`Error`] variants as documented there.
#[derive(Clone, Debug)]
pub struct Handle {
    connection: ConnectionHandle<GenlMessage<IpvsMessage>>,
    family_id: u16,
    /// The kernel runs one dump per socket at a time (`__netlink_dump_start` answers
    /// `EBUSY` to a second one), so dumps take turns; do-requests are never held back.
    dump_turn: Arc<tokio::sync::Mutex<()>>,
    /// How long one request may wait for its answer (its dump turn included).
    request_timeout: Duration,
}

impl Handle {
    /// Resolves the `IPVS` family (`CTRL_CMD_GETFAMILY`, which makes the
    /// kernel autoload `ip_vs` when it can), opens the `NETLINK_GENERIC`
    /// socket and spawns its connection task with [`tokio::spawn`], so it
    /// must be called within a Tokio runtime.
    ///
    /// Errors: [`Error::FamilyNotFound`] when IPVS is unavailable,
    /// [`Error::Io`] when a socket cannot be opened.
    pub async fn connect() -> Result<Handle, Error> {
        let family_id = ctrl::resolve_family(IpvsMessage::family_name()).await?;
        Handle::open(family_id)
    }

    /// Opens the socket and spawns its connection task, for messages of the
    /// generic-netlink family `family_id`.
    pub(crate) fn open(family_id: u16) -> Result<Handle, Error> {
        let (mut connection, handle, _unsolicited) =
            netlink_proto::new_connection::<GenlMessage<IpvsMessage>>(NETLINK_GENERIC)?;
        // Hand acknowledgements and end-of-dump markers to the requests so
        // that a request can tell "done" from "connection lost".
        connection.set_forward_ack(true);
        connection.set_forward_done(true);
        tokio::spawn(connection);
        Ok(Handle {
            connection: handle,
            family_id,
            dump_turn: Arc::default(),
            request_timeout: REQUEST_TIMEOUT,
        })
    }

    /// This handle with requests abandoned after `timeout` without an answer
    /// ([`Error::Timeout`]) instead of [`REQUEST_TIMEOUT`].
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Handle {
        self.request_timeout = timeout;
        self
    }

    /// The generic-netlink id the kernel assigned to the `IPVS` family.
    pub fn family_id(&self) -> u16 {
        self.family_id
    }

    /// Lists every virtual service of the network namespace
    /// (`IPVS_CMD_GET_SERVICE` dump, answered by `ip_vs_genl_dump_services`).
    /// Flags include the kernel's `HASHED` bit and `stats` is set.
    pub async fn services(&self) -> Result<Vec<Service>, Error> {
        self.execute(IpvsMessage::get_services(), Request::Dump)
            .await?
            .iter()
            .map(IpvsMessage::to_service)
            .collect()
    }

    /// Reads one virtual service (`IPVS_CMD_GET_SERVICE` do-request).
    ///
    /// Errors: [`Error::NoSuchService`] if it does not exist.
    pub async fn service(&self, id: &ServiceId) -> Result<Service, Error> {
        self.execute(IpvsMessage::get_service(id), Request::Do)
            .await?
            .first()
            .ok_or_else(|| Error::Decode(format!("no GET_SERVICE reply for {id}")))?
            .to_service()
    }

    /// Creates a virtual service (`IPVS_CMD_NEW_SERVICE`, `ip_vs_add_service`).
    /// `stats` is ignored and `HASHED` is not sent.
    ///
    /// Errors: [`Error::Exists`] if it exists already (change it with
    /// [`Handle::update_service`]), [`Error::NotFound`] for an unknown
    /// scheduler or persistence engine, [`Error::InvalidArgument`] for an
    /// IPv6 netmask outside 1..=128, [`Error::AddressFamilyNotSupported`]
    /// for IPv6 on a kernel without IPv6 IPVS.
    pub async fn add_service(&self, service: &Service) -> Result<(), Error> {
        self.execute(IpvsMessage::new_service(service), Request::Do)
            .await
            .map(drop)
    }

    /// Changes the scheduler, flags, persistence timeout, netmask and
    /// persistence engine of a service (`IPVS_CMD_SET_SERVICE`,
    /// `ip_vs_edit_service`). All flags are replaced (mask `0xffffffff`).
    ///
    /// Errors: [`Error::NoSuchService`], plus those of [`Handle::add_service`].
    pub async fn update_service(&self, service: &Service) -> Result<(), Error> {
        self.execute(IpvsMessage::set_service(service), Request::Do)
            .await
            .map(drop)
    }

    /// Deletes a virtual service and all its destinations
    /// (`IPVS_CMD_DEL_SERVICE`).
    ///
    /// Errors: [`Error::NoSuchService`].
    pub async fn delete_service(&self, id: &ServiceId) -> Result<(), Error> {
        self.execute(IpvsMessage::del_service(id), Request::Do)
            .await
            .map(drop)
    }

    /// Lists the destinations of a service (`IPVS_CMD_GET_DEST` dump,
    /// `ip_vs_genl_dump_dests`), with connection counts and `stats`.
    ///
    /// The kernel answers an empty list, not an error, when the service does
    /// not exist.
    pub async fn destinations(&self, id: &ServiceId) -> Result<Vec<Destination>, Error> {
        self.execute(IpvsMessage::get_dests(id), Request::Dump)
            .await?
            .iter()
            .map(IpvsMessage::to_destination)
            .collect()
    }

    /// Adds a destination to a service (`IPVS_CMD_NEW_DEST`,
    /// `ip_vs_add_dest`). Read-only counters and `stats` are ignored.
    ///
    /// Errors: [`Error::NoSuchService`], [`Error::Exists`] if the service has
    /// it already, [`Error::InvalidArgument`] for a destination of the other
    /// family without [`crate::ForwardMethod::Tunnel`], [`Error::Kernel`]
    /// with `ERANGE` for a weight above `i32::MAX` or a lower threshold above
    /// the upper one.
    pub async fn add_destination(&self, id: &ServiceId, dest: &Destination) -> Result<(), Error> {
        self.execute(IpvsMessage::new_dest(id, dest), Request::Do)
            .await
            .map(drop)
    }

    /// Changes the forwarding method, weight and thresholds of a destination
    /// (`IPVS_CMD_SET_DEST`, `ip_vs_edit_dest`).
    ///
    /// Errors: [`Error::NoSuchService`], [`Error::NotFound`] if the service
    /// has no such destination, plus those of [`Handle::add_destination`].
    pub async fn update_destination(
        &self,
        id: &ServiceId,
        dest: &Destination,
    ) -> Result<(), Error> {
        self.execute(IpvsMessage::set_dest(id, dest), Request::Do)
            .await
            .map(drop)
    }

    /// Removes a destination from a service (`IPVS_CMD_DEL_DEST`,
    /// `ip_vs_del_dest`). Existing connections to it follow the
    /// `expire_nodest_conn` sysctl.
    ///
    /// Errors: [`Error::NoSuchService`], [`Error::NotFound`] if the service
    /// has no such destination.
    pub async fn delete_destination(
        &self,
        id: &ServiceId,
        address: IpAddr,
        port: u16,
    ) -> Result<(), Error> {
        self.execute(IpvsMessage::del_dest(id, address, port), Request::Do)
            .await
            .map(drop)
    }

    /// Reads the TCP, TCP FIN and UDP connection timeouts
    /// (`IPVS_CMD_GET_CONFIG`).
    pub async fn timeouts(&self) -> Result<Timeouts, Error> {
        self.execute(IpvsMessage::get_config(), Request::Do)
            .await?
            .first()
            .map(IpvsMessage::to_timeouts)
            .ok_or_else(|| Error::Decode("no GET_CONFIG reply".into()))
    }

    /// Sets the connection timeouts (`IPVS_CMD_SET_CONFIG`,
    /// `ip_vs_set_timeout`); a 0 leaves that timeout unchanged.
    ///
    /// Errors: [`Error::InvalidArgument`] for a value above `INT_MAX / HZ`.
    pub async fn set_timeouts(&self, timeouts: &Timeouts) -> Result<(), Error> {
        self.execute(IpvsMessage::set_config(timeouts), Request::Do)
            .await
            .map(drop)
    }

    /// Reads the IPVS version and connection table size (`IPVS_CMD_GET_INFO`).
    pub async fn info(&self) -> Result<Info, Error> {
        self.execute(IpvsMessage::get_info(), Request::Do)
            .await?
            .first()
            .ok_or_else(|| Error::Decode("no GET_INFO reply".into()))?
            .to_info()
    }

    /// Sends one request and collects the IPVS messages of its answer, up to
    /// the acknowledgement (do) or `NLMSG_DONE` (dump).
    pub(crate) async fn execute(
        &self,
        payload: IpvsMessage,
        kind: Request,
    ) -> Result<Vec<IpvsMessage>, Error> {
        self.send(request_message(payload, self.family_id, kind), kind)
            .await
    }

    /// Sends `message` (a request of `kind`) and collects the IPVS messages
    /// of its answer; [`Error::Timeout`] when it takes longer than the
    /// request timeout.
    pub(crate) async fn send(
        &self,
        message: NetlinkMessage<GenlMessage<IpvsMessage>>,
        kind: Request,
    ) -> Result<Vec<IpvsMessage>, Error> {
        let answer = async {
            let _turn = match kind {
                Request::Dump => Some(self.dump_turn.lock().await),
                Request::Do => None,
            };
            let mut replies = self.connection.request(message, SocketAddr::new(0, 0))?;
            let mut answer = Vec::new();
            while let Some(reply) = replies.next().await {
                match step(reply) {
                    Step::Reply(message) => answer.push(message),
                    Step::End(result) => return result.map(|()| answer),
                    Step::Skip => {}
                }
            }
            // The connection dropped the request without a final message.
            Err(Error::ConnectionClosed)
        };
        tokio::time::timeout(self.request_timeout, answer)
            .await
            .unwrap_or(Err(Error::Timeout(self.request_timeout)))
    }
}
