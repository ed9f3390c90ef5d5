//! Family resolution: `CTRL_CMD_GETFAMILY` to `nlctrl` and the
//! `CTRL_CMD_NEWFAMILY` reply (`ctrl_fill_info` in `net/netlink/genetlink.c`).

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::GenlMessage;
use netlink_packet_generic::ctrl::nlas::{GenlCtrlAttrs, OpAttrs};
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};

use crate::Error;
use crate::ctrl::{family_error, family_id, get_family_request};

#[rustfmt::skip]
static GET_FAMILY_IPVS: [u8; 32] = [
    0x20, 0x00, 0x00, 0x00, // length 32
    0x10, 0x00,             // GENL_ID_CTRL
    0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
    0x01, 0x00, 0x00, 0x00, // sequence 1
    0x00, 0x00, 0x00, 0x00, // port id 0
    0x03, 0x02, 0x00, 0x00, // cmd CTRL_CMD_GETFAMILY, nlctrl version 2
    0x09, 0x00, 0x02, 0x00, // CTRL_ATTR_FAMILY_NAME, length 9
    b'I', b'P', b'V', b'S', 0x00, 0x00, 0x00, 0x00, // "IPVS\0", padding
];

#[test]
fn get_family_request_bytes() {
    let mut request = get_family_request("IPVS");
    request.header.sequence_number = 1;
    let mut emitted = vec![0xaa; request.buffer_len()];
    request.serialize(&mut emitted);
    assert_eq!(emitted, GET_FAMILY_IPVS);

    let parsed = NetlinkMessage::<GenlMessage<GenlCtrl>>::deserialize(&GET_FAMILY_IPVS).unwrap();
    assert_eq!(parsed.header, request.header);
    let (NetlinkPayload::InnerMessage(parsed), NetlinkPayload::InnerMessage(built)) =
        (parsed.payload, request.payload)
    else {
        panic!("both are generic-netlink messages");
    };
    assert_eq!(parsed.payload, built.payload);
}

/// The kernel's answer for `IPVS`, shortened to the first two of its 17
/// operations.
#[rustfmt::skip]
static NEW_FAMILY_IPVS: [u8; 108] = [
    0x6c, 0x00, 0x00, 0x00, // length 108
    0x10, 0x00,             // GENL_ID_CTRL
    0x00, 0x00,             // no flags (unicast reply)
    0x01, 0x00, 0x00, 0x00, // sequence 1
    0x40, 0x1f, 0x00, 0x00, // port id of the requester
    0x01, 0x02, 0x00, 0x00, // cmd CTRL_CMD_NEWFAMILY, version 2
    0x09, 0x00, 0x02, 0x00, b'I', b'P', b'V', b'S', 0x00, 0x00, 0x00, 0x00, // FAMILY_NAME
    0x06, 0x00, 0x01, 0x00, 0x24, 0x00, 0x00, 0x00, // FAMILY_ID 0x24, u16 + padding
    0x08, 0x00, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, // VERSION 1 (IPVS_GENL_VERSION)
    0x08, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, // HDRSIZE 0
    0x08, 0x00, 0x05, 0x00, 0x06, 0x00, 0x00, 0x00, // MAXATTR 6 (IPVS_CMD_ATTR_MAX)
    0x2c, 0x00, 0x06, 0x00, // OPS, length 44
    0x14, 0x00, 0x01, 0x00, // op #1
    0x08, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, // OP_ID IPVS_CMD_NEW_SERVICE
    0x08, 0x00, 0x02, 0x00, 0x0b, 0x00, 0x00, 0x00, // OP_FLAGS ADMIN_PERM | CAP_DO | CAP_HASPOL
    0x14, 0x00, 0x02, 0x00, // op #2
    0x08, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, // OP_ID IPVS_CMD_SET_SERVICE
    0x08, 0x00, 0x02, 0x00, 0x0b, 0x00, 0x00, 0x00, // OP_FLAGS
];

#[test]
fn new_family_reply() {
    let reply = GenlCtrl {
        cmd: GenlCtrlCmd::NewFamily,
        nlas: vec![
            GenlCtrlAttrs::FamilyName("IPVS".into()),
            GenlCtrlAttrs::FamilyId(0x24),
            GenlCtrlAttrs::Version(1),
            GenlCtrlAttrs::HdrSize(0),
            GenlCtrlAttrs::MaxAttr(6),
            GenlCtrlAttrs::Ops(vec![
                vec![OpAttrs::Id(1), OpAttrs::Flags(0x0b)],
                vec![OpAttrs::Id(2), OpAttrs::Flags(0x0b)],
            ]),
        ],
    };
    let mut message = NetlinkMessage::from(GenlMessage::from_payload(reply.clone()));
    message.header.sequence_number = 1;
    message.header.port_number = 0x1f40;
    message.finalize();
    let mut emitted = vec![0xaa; message.buffer_len()];
    message.serialize(&mut emitted);
    assert_eq!(emitted, NEW_FAMILY_IPVS);

    let parsed = NetlinkMessage::<GenlMessage<GenlCtrl>>::deserialize(&NEW_FAMILY_IPVS).unwrap();
    assert_eq!(parsed.header, message.header);
    let NetlinkPayload::InnerMessage(genl) = parsed.payload else {
        panic!("a generic-netlink message");
    };
    assert_eq!(genl.payload, reply);
    assert_eq!(family_id(&genl.payload), Some(0x24));
}

#[test]
fn missing_family_maps_to_family_not_found() {
    assert!(matches!(family_error(libc::ENOENT), Error::FamilyNotFound));
    assert!(matches!(family_error(libc::EPERM), Error::PermissionDenied));
}

/// Positive control against the running kernel: `nlctrl` itself is always
/// registered, with the fixed id `GENL_ID_CTRL`. This parses a real
/// `CTRL_CMD_NEWFAMILY` reply (operations, multicast groups) end to end.
#[tokio::test]
async fn resolves_a_family_the_kernel_has() {
    let id = crate::ctrl::resolve_family("nlctrl").await.unwrap();
    assert_eq!(id, 0x10);
}

#[tokio::test]
async fn unknown_family_is_family_not_found() {
    let err = crate::ctrl::resolve_family("kipvs-no-such")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FamilyNotFound), "got {err:?}");
}
