//! [`Handle`]'s request machinery against the running kernel, without IPVS:
//! messages framed by this crate are sent to the generic-netlink controller
//! (`nlctrl`, always registered at `GENL_ID_CTRL`), whose answers exercise
//! the same paths as IPVS's: errors with the request echoed back,
//! acknowledgements, and multi-part dumps closed by `NLMSG_DONE`.

use std::time::Duration;

use futures::future::join_all;
use netlink_packet_core::DefaultNla;

use crate::codec::IpvsAttr;
use crate::handle::Request;
use crate::{Error, Handle, IpvsCmd, IpvsMessage};

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

fn get_family(name: &str) -> IpvsMessage {
    let mut value = name.as_bytes().to_vec();
    value.push(0);
    IpvsMessage {
        cmd: IpvsCmd::Other(CTRL_CMD_GETFAMILY),
        attrs: vec![IpvsAttr::Other(DefaultNla::new(
            CTRL_ATTR_FAMILY_NAME,
            value,
        ))],
    }
}

#[tokio::test]
async fn kernel_errors_end_requests() {
    let handle = Handle::open(GENL_ID_CTRL).unwrap();
    // nlctrl has no handler for command 1 (it only sends NEWFAMILY).
    let new_service = IpvsMessage {
        cmd: IpvsCmd::NewService,
        attrs: Vec::new(),
    };
    let err = handle.execute(new_service, Request::Do).await.unwrap_err();
    assert!(matches!(err, Error::NotSupported), "got {err:?}");
    // ENOENT, with the whole request echoed after the error code.
    let err = handle
        .execute(get_family("kipvs-no-such"), Request::Do)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound), "got {err:?}");
}

#[tokio::test]
async fn acknowledged_request_completes() {
    let handle = Handle::open(GENL_ID_CTRL).unwrap();
    // The NEWFAMILY reply is not an IPVS message: the connection drops it
    // as undecodable, and the acknowledgement still ends the request.
    let replies = handle
        .execute(get_family("nlctrl"), Request::Do)
        .await
        .unwrap();
    assert!(replies.is_empty());
}

#[tokio::test]
async fn concurrent_dumps_and_requests_all_complete() {
    let handle = Handle::open(GENL_ID_CTRL).unwrap();
    let dump = IpvsMessage {
        cmd: IpvsCmd::Other(CTRL_CMD_GETFAMILY),
        attrs: Vec::new(),
    };
    let requests = (0..200).map(|i| {
        let handle = handle.clone();
        let dump = dump.clone();
        async move {
            if i % 2 == 0 {
                handle.execute(dump, Request::Dump).await.map(drop)
            } else {
                match handle
                    .execute(get_family("kipvs-no-such"), Request::Do)
                    .await
                {
                    Err(Error::NotFound) => Ok(()),
                    other => other.map(drop),
                }
            }
        }
    });
    let results = tokio::time::timeout(Duration::from_secs(60), join_all(requests))
        .await
        .expect("every request is answered");
    for result in results {
        result.unwrap();
    }
}

/// Handles and their request futures can move across threads (for
/// `tokio::spawn` on a multi-threaded runtime), and errors suit `anyhow`.
/// The futures are only built, never polled, so nothing is sent.
#[tokio::test]
async fn handles_futures_and_errors_are_send_and_sync() {
    fn send<T: Send>(_: T) {}
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<Handle>();
    send_sync_static::<Error>();
    let handle = Handle::open(GENL_ID_CTRL).unwrap();
    let service = crate::Service::new(
        crate::ServiceId::Fwmark {
            family: crate::AddressFamily::Inet,
            mark: 1,
        },
        "rr",
    );
    let dest = crate::Destination::new(std::net::Ipv4Addr::LOCALHOST.into(), 80, 1);
    let id = &service.id;
    send(handle.services());
    send(handle.service(id));
    send(handle.add_service(&service));
    send(handle.update_service(&service));
    send(handle.delete_service(id));
    send(handle.destinations(id));
    send(handle.add_destination(id, &dest));
    send(handle.update_destination(id, &dest));
    send(handle.delete_destination(id, dest.address, dest.port));
    send(handle.timeouts());
    send(handle.set_timeouts(&crate::Timeouts::default()));
    send(handle.info());
    send(Handle::connect());
}

/// Issue 23: a request the kernel never answers stalled its caller for good. A do-request
/// without `NLM_F_ACK` is one: nlctrl sends its reply but no acknowledgement, so the request
/// never ends; after the handle's request timeout it is an error, and the handle still works.
#[tokio::test]
async fn a_request_without_an_answer_times_out() {
    let handle = Handle::open(GENL_ID_CTRL)
        .unwrap()
        .with_request_timeout(Duration::from_millis(300));
    let mut message =
        crate::handle::request_message(get_family("nlctrl"), GENL_ID_CTRL, Request::Do);
    message.header.flags = netlink_packet_core::NLM_F_REQUEST;
    let started = std::time::Instant::now();
    let err = handle.send(message, Request::Do).await.unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "got {err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(err.errno(), Some(libc::ETIMEDOUT));
    let replies = handle
        .execute(get_family("nlctrl"), Request::Do)
        .await
        .unwrap();
    assert!(replies.is_empty());
}
