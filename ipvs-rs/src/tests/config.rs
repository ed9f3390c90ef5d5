//! `GET_CONFIG`/`SET_CONFIG` (timeouts) and `GET_INFO`, answered by
//! `ip_vs_genl_get_cmd` with a single unicast reply (no `NLM_F_MULTI`).

use super::{check_reply, check_request, payload};
use crate::codec::{InfoAttr, IpvsAttr};
use crate::handle::Request;
use crate::{Info, IpvsCmd, IpvsMessage, Timeouts, Version};

#[rustfmt::skip]
static GET_CONFIG: [u8; 20] = [
    0x14, 0x00, 0x00, 0x00, 0x24, 0x00, 0x05, 0x00, // length 20, IPVS, REQUEST | ACK
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x0d, 0x01, 0x00, 0x00, // cmd IPVS_CMD_GET_CONFIG, no attributes
];

#[test]
fn get_config_request() {
    check_request(IpvsMessage::get_config(), Request::Do, &GET_CONFIG);
}

#[rustfmt::skip]
static GET_CONFIG_REPLY: [u8; 44] = [
    0x2c, 0x00, 0x00, 0x00, // length 44
    0x24, 0x00, 0x00, 0x00, // IPVS, no flags
    0x01, 0x00, 0x00, 0x00, 0x40, 0x1f, 0x00, 0x00, // sequence 1, port id
    0x0c, 0x01, 0x00, 0x00, // cmd IPVS_CMD_SET_CONFIG (the reply command)
    0x08, 0x00, 0x04, 0x00, 0x84, 0x03, 0x00, 0x00, // TIMEOUT_TCP 900
    0x08, 0x00, 0x05, 0x00, 0x78, 0x00, 0x00, 0x00, // TIMEOUT_TCP_FIN 120
    0x08, 0x00, 0x06, 0x00, 0x2c, 0x01, 0x00, 0x00, // TIMEOUT_UDP 300
];

#[test]
fn get_config_reply() {
    let message = IpvsMessage {
        cmd: IpvsCmd::SetConfig,
        attrs: vec![
            IpvsAttr::TimeoutTcp(900),
            IpvsAttr::TimeoutTcpFin(120),
            IpvsAttr::TimeoutUdp(300),
        ],
    };
    check_reply(message, 0, &GET_CONFIG_REPLY);
    assert_eq!(
        payload(&GET_CONFIG_REPLY).to_timeouts(),
        Timeouts {
            tcp: 900,
            tcp_fin: 120,
            udp: 300
        }
    );
}

#[rustfmt::skip]
static SET_CONFIG: [u8; 44] = [
    0x2c, 0x00, 0x00, 0x00, 0x24, 0x00, 0x05, 0x00, // length 44, REQUEST | ACK
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x0c, 0x01, 0x00, 0x00, // cmd IPVS_CMD_SET_CONFIG
    0x08, 0x00, 0x04, 0x00, 0x84, 0x03, 0x00, 0x00, // TIMEOUT_TCP 900
    0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, // TIMEOUT_TCP_FIN 0: unchanged
    0x08, 0x00, 0x06, 0x00, 0x2c, 0x01, 0x00, 0x00, // TIMEOUT_UDP 300
];

#[test]
fn set_config_request() {
    let timeouts = Timeouts {
        tcp: 900,
        tcp_fin: 0,
        udp: 300,
    };
    check_request(IpvsMessage::set_config(&timeouts), Request::Do, &SET_CONFIG);
    assert_eq!(payload(&SET_CONFIG).to_timeouts(), timeouts);
}

#[test]
fn missing_timeouts_read_as_zero() {
    // A kernel built without CONFIG_IP_VS_PROTO_UDP omits TIMEOUT_UDP.
    let message = IpvsMessage {
        cmd: IpvsCmd::SetConfig,
        attrs: vec![IpvsAttr::TimeoutTcp(900), IpvsAttr::TimeoutTcpFin(120)],
    };
    assert_eq!(message.to_timeouts().udp, 0);
}

#[rustfmt::skip]
static GET_INFO: [u8; 20] = [
    0x14, 0x00, 0x00, 0x00, 0x24, 0x00, 0x05, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x0f, 0x01, 0x00, 0x00, // cmd IPVS_CMD_GET_INFO
];

#[test]
fn get_info_request() {
    check_request(IpvsMessage::get_info(), Request::Do, &GET_INFO);
}

#[rustfmt::skip]
pub(super) static GET_INFO_REPLY: [u8; 36] = [
    0x24, 0x00, 0x00, 0x00, 0x24, 0x00, 0x00, 0x00, // length 36, IPVS, no flags
    0x01, 0x00, 0x00, 0x00, 0x40, 0x1f, 0x00, 0x00,
    0x0e, 0x01, 0x00, 0x00, // cmd IPVS_CMD_SET_INFO
    0x08, 0x00, 0x01, 0x00, 0x01, 0x02, 0x01, 0x00, // INFO_ATTR_VERSION 0x00010201 (1.2.1)
    0x08, 0x00, 0x02, 0x00, 0x00, 0x10, 0x00, 0x00, // INFO_ATTR_CONN_TAB_SIZE 4096
];

#[test]
fn get_info_reply() {
    let message = IpvsMessage {
        cmd: IpvsCmd::SetInfo,
        attrs: vec![
            IpvsAttr::Info(InfoAttr::Version(0x0001_0201)),
            IpvsAttr::Info(InfoAttr::ConnTabSize(4096)),
        ],
    };
    check_reply(message, 0, &GET_INFO_REPLY);
    assert_eq!(
        payload(&GET_INFO_REPLY).to_info().unwrap(),
        Info {
            version: Version {
                major: 1,
                minor: 2,
                patch: 1
            },
            connection_table_size: 4096,
        }
    );
}

#[test]
fn info_reply_needs_both_attributes() {
    let message = IpvsMessage {
        cmd: IpvsCmd::SetInfo,
        attrs: vec![IpvsAttr::Info(InfoAttr::Version(0x0001_0201))],
    };
    assert!(matches!(message.to_info(), Err(crate::Error::Decode(_))));
}
