//! How the answers that end a request map to results: `NLMSG_ERROR`
//! (`netlink_ack` in `net/netlink/af_netlink.c`: a negative errno, or 0 for an
//! acknowledgement, followed by the offending request) and `NLMSG_DONE`.

use super::service::DEL_SERVICE_TCP_V4;
use super::{PORT_ID, parse};
use crate::Error;
use crate::handle::{Step, step};

/// The kernel's refusal of [`DEL_SERVICE_TCP_V4`] for a service that does
/// not exist: `-ESRCH`, then the whole request echoed back (the socket does
/// not set `NETLINK_CAP_ACK`).
fn esrch_for_del_service() -> Vec<u8> {
    #[rustfmt::skip]
    let head: [u8; 20] = [
        0x58, 0x00, 0x00, 0x00, // length 88 = 16 + 4 + 68
        0x02, 0x00,             // NLMSG_ERROR
        0x00, 0x00,             // no flags: the request is not capped
        0x01, 0x00, 0x00, 0x00, // sequence of the request
        0x40, 0x1f, 0x00, 0x00, // port id of the requester
        0xfd, 0xff, 0xff, 0xff, // error -3 (-ESRCH)
    ];
    [&head[..], &DEL_SERVICE_TCP_V4[..]].concat()
}

#[test]
fn nlmsg_error_maps_to_no_such_service() {
    let bytes = esrch_for_del_service();
    let message = parse(&bytes);
    assert_eq!(message.header.port_number, PORT_ID);
    assert!(matches!(
        step(message),
        Step::End(Err(Error::NoSuchService))
    ));
}

#[rustfmt::skip]
static EEXIST_CAPPED: [u8; 36] = [
    0x24, 0x00, 0x00, 0x00, // length 36
    0x02, 0x00,             // NLMSG_ERROR
    0x00, 0x01,             // NLM_F_CAPPED: only the request header follows
    0x01, 0x00, 0x00, 0x00, 0x40, 0x1f, 0x00, 0x00,
    0xef, 0xff, 0xff, 0xff, // error -17 (-EEXIST)
    0x68, 0x00, 0x00, 0x00, 0x24, 0x00, 0x05, 0x00, // header of the NEW_SERVICE request
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

#[test]
fn nlmsg_error_maps_to_exists() {
    let end = step(parse(&EEXIST_CAPPED));
    let Step::End(Err(err)) = end else {
        panic!("an error ends the request: {end:?}");
    };
    assert!(matches!(err, Error::Exists));
    assert_eq!(err.errno(), Some(libc::EEXIST));
}

#[rustfmt::skip]
static ACK: [u8; 36] = [
    0x24, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x01, // NLMSG_ERROR, NLM_F_CAPPED
    0x01, 0x00, 0x00, 0x00, 0x40, 0x1f, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, // error 0: acknowledgement
    0x68, 0x00, 0x00, 0x00, 0x24, 0x00, 0x05, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

#[test]
fn ack_ends_the_request_successfully() {
    assert!(matches!(step(parse(&ACK)), Step::End(Ok(()))));
}

#[rustfmt::skip]
static DONE: [u8; 20] = [
    0x14, 0x00, 0x00, 0x00, // length 20
    0x03, 0x00,             // NLMSG_DONE
    0x02, 0x00,             // NLM_F_MULTI
    0x01, 0x00, 0x00, 0x00, 0x40, 0x1f, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, // dump status 0
];

#[test]
fn done_ends_a_dump() {
    assert!(matches!(step(parse(&DONE)), Step::End(Ok(()))));
    let mut failed = DONE;
    failed[16..20].copy_from_slice(&(-libc::EINTR).to_ne_bytes());
    assert!(matches!(
        step(parse(&failed)),
        Step::End(Err(Error::Kernel { errno: libc::EINTR }))
    ));
}

#[test]
fn dump_entries_are_replies() {
    assert!(matches!(
        step(parse(&super::service::SERVICE_DUMP_ENTRY)),
        Step::Reply(_)
    ));
}

#[test]
fn errno_mapping_round_trips() {
    let cases = [
        (libc::EEXIST, "Exists"),
        (libc::ESRCH, "NoSuchService"),
        (libc::ENOENT, "NotFound"),
        (libc::EINVAL, "InvalidArgument"),
        (libc::EOPNOTSUPP, "NotSupported"),
        (libc::EAFNOSUPPORT, "AddressFamilyNotSupported"),
        (libc::EPERM, "PermissionDenied"),
        (libc::ERANGE, "Kernel { errno: 34 }"),
        (libc::ENOMEM, "Kernel { errno: 12 }"),
    ];
    for (errno, variant) in cases {
        let err = Error::from_errno(errno);
        assert_eq!(format!("{err:?}"), variant, "errno {errno}");
        assert_eq!(err.errno(), Some(errno));
        assert!(!err.to_string().is_empty());
    }
    assert!(matches!(
        Error::from_errno(libc::EACCES),
        Error::PermissionDenied
    ));
    assert_eq!(Error::FamilyNotFound.errno(), Some(libc::ENOENT));
    assert_eq!(Error::ConnectionClosed.errno(), None);
    assert_eq!(Error::Decode("x".into()).errno(), None);
    assert_eq!(
        Error::Io(std::io::Error::from_raw_os_error(libc::EMFILE)).errno(),
        Some(libc::EMFILE)
    );
    assert!(
        Error::Kernel {
            errno: libc::ERANGE
        }
        .to_string()
        .contains("errno 34")
    );
}
