//! Resolving the IPVS family id through the generic-netlink controller
//! (`nlctrl`, fixed id `GENL_ID_CTRL` = 0x10; `CTRL_CMD_GETFAMILY` in
//! `include/uapi/linux/genetlink.h`, served by `ctrl_getfamily` in
//! `net/netlink/genetlink.c`).

use futures::StreamExt;
use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::GenlMessage;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_sys::SocketAddr;
use netlink_sys::protocols::NETLINK_GENERIC;

use crate::error::Error;

/// `CTRL_CMD_GETFAMILY` for `name`, acknowledged, ready to serialize
/// (sequence number 0; the connection assigns the real one).
pub(crate) fn get_family_request(name: &str) -> NetlinkMessage<GenlMessage<GenlCtrl>> {
    let genl = GenlMessage::from_payload(GenlCtrl {
        cmd: GenlCtrlCmd::GetFamily,
        nlas: vec![GenlCtrlAttrs::FamilyName(name.to_owned())],
    });
    let mut message = NetlinkMessage::from(genl);
    message.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    message.finalize();
    message
}

/// The `CTRL_ATTR_FAMILY_ID` of a `CTRL_CMD_NEWFAMILY` reply.
pub(crate) fn family_id(reply: &GenlCtrl) -> Option<u16> {
    reply.nlas.iter().find_map(|attr| match attr {
        GenlCtrlAttrs::FamilyId(id) => Some(*id),
        _ => None,
    })
}

/// Maps the errno of a failed `CTRL_CMD_GETFAMILY`: `ENOENT` means the
/// family is not registered.
pub(crate) fn family_error(errno: i32) -> Error {
    match errno {
        libc::ENOENT => Error::FamilyNotFound,
        errno => Error::from_errno(errno),
    }
}

/// Asks the kernel for the id of the generic-netlink family `name` over a
/// short-lived socket of its own. If the family is not registered yet, the
/// kernel first tries to load the module that declares it
/// (`MODULE_ALIAS_GENL_FAMILY`, so `ip_vs` for `IPVS`) and answers
/// `ENOENT` if that fails, reported as [`Error::FamilyNotFound`].
pub(crate) async fn resolve_family(name: &str) -> Result<u16, Error> {
    let (mut connection, handle, _) =
        netlink_proto::new_connection::<GenlMessage<GenlCtrl>>(NETLINK_GENERIC)?;
    connection.set_forward_ack(true);
    let mut replies = handle.request(get_family_request(name), SocketAddr::new(0, 0))?;
    let answer = async {
        let mut id = None;
        while let Some(message) = replies.next().await {
            match message.payload {
                NetlinkPayload::InnerMessage(genl) => {
                    id = id.or_else(|| family_id(&genl.payload));
                }
                NetlinkPayload::Error(err) => {
                    return match err.code.map(|code| code.get().saturating_abs()) {
                        None => id.ok_or_else(|| {
                            Error::Decode("CTRL_CMD_GETFAMILY reply lacks a family id".into())
                        }),
                        Some(errno) => Err(family_error(errno)),
                    };
                }
                _ => {}
            }
        }
        Err(Error::ConnectionClosed)
    };
    // Drive the connection only while waiting for this one answer; both are
    // dropped (closing the socket) when it arrives.
    tokio::select! {
        result = answer => result,
        () = connection => Err(Error::ConnectionClosed),
    }
}
