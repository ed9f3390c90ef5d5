//! Errors returned by [`crate::Handle`].

use netlink_packet_core::DecodeError;
use netlink_proto::NetlinkProtoError;

/// Why an IPVS request failed.
///
/// Kernel refusals arrive as `NLMSG_ERROR` messages carrying a negative
/// errno; [`Error::from_errno`] maps the common ones to their own variants
/// (the causes listed are those of `ip_vs_genl_set_cmd`, `ip_vs_genl_get_cmd`
/// and the functions they call in `net/netfilter/ipvs/ip_vs_ctl.c`) and
/// keeps any other in [`Error::Kernel`]. [`Error::errno`] gives the number back.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// `EEXIST`: `NEW_SERVICE` for a service that already exists, or
    /// `NEW_DEST` for a destination the service already has.
    #[error("already exists (EEXIST)")]
    Exists,
    /// `ESRCH`: any command but `NEW_SERVICE` naming a service that does not
    /// exist (`SET_SERVICE`, `DEL_SERVICE`, `GET_SERVICE`, `*_DEST`).
    #[error("no such virtual service (ESRCH)")]
    NoSuchService,
    /// `ENOENT`: unknown scheduler or persistence engine (no `ip_vs_<name>`
    /// module), or `SET_DEST`/`DEL_DEST` for a destination the service does
    /// not have.
    #[error("not found (ENOENT): unknown scheduler or persistence engine, or no such destination")]
    NotFound,
    /// `EINVAL`: a required attribute is missing or malformed, an IPv6
    /// netmask outside 1..=128, a destination of another family without
    /// tunnel forwarding, or a timeout above `INT_MAX / HZ` seconds.
    #[error("invalid argument (EINVAL)")]
    InvalidArgument,
    /// `EOPNOTSUPP`: the family has no handler for the command
    /// (`genl_family_rcv_msg`), e.g. a command newer than the kernel.
    #[error("operation not supported (EOPNOTSUPP)")]
    NotSupported,
    /// `EAFNOSUPPORT`: address family other than `AF_INET`/`AF_INET6`, or
    /// IPv6 while the kernel lacks `CONFIG_IP_VS_IPV6` or IPv6 is disabled.
    #[error("address family not supported (EAFNOSUPPORT)")]
    AddressFamilyNotSupported,
    /// `EPERM` (or `EACCES`): every IPVS command is `GENL_ADMIN_PERM`, so the
    /// caller needs `CAP_NET_ADMIN` in the network namespace's user namespace.
    #[error("permission denied (EPERM/EACCES): CAP_NET_ADMIN is required")]
    PermissionDenied,
    /// Any other errno from the kernel, positive (for example `ERANGE` for a
    /// weight above `i32::MAX` or thresholds in the wrong order, `ENOMEM`).
    #[error("kernel error: {} (errno {errno})", std::io::Error::from_raw_os_error(*errno))]
    Kernel {
        /// The positive errno value.
        errno: i32,
    },
    /// The generic-netlink family `IPVS` is not registered: the `ip_vs`
    /// module is not loaded and the kernel could not autoload it
    /// (`CTRL_CMD_GETFAMILY` answered `ENOENT`).
    #[error("IPVS generic-netlink family not found: is the ip_vs module loaded?")]
    FamilyNotFound,
    /// The netlink socket could not be created or used.
    #[error("netlink socket error: {0}")]
    Io(#[from] std::io::Error),
    /// A reply could not be understood: malformed attributes, a missing
    /// mandatory attribute, or no reply where one was expected (replies that
    /// fail to parse are dropped by the connection and show up as missing).
    #[error("cannot decode IPVS reply: {0}")]
    Decode(String),
    /// The background netlink connection stopped before the request finished.
    #[error("the netlink connection is closed")]
    ConnectionClosed,
    /// The kernel did not answer within the handle's request timeout
    /// ([`crate::Handle::with_request_timeout`]); the request was abandoned, and
    /// a change it asked for may or may not have been made.
    #[error("no answer from the kernel within {0:?}")]
    Timeout(std::time::Duration),
}

impl Error {
    /// Maps a positive errno from an `NLMSG_ERROR` reply to a variant.
    pub fn from_errno(errno: i32) -> Error {
        match errno {
            libc::EEXIST => Error::Exists,
            libc::ESRCH => Error::NoSuchService,
            libc::ENOENT => Error::NotFound,
            libc::EINVAL => Error::InvalidArgument,
            libc::EOPNOTSUPP => Error::NotSupported,
            libc::EAFNOSUPPORT => Error::AddressFamilyNotSupported,
            libc::EPERM | libc::EACCES => Error::PermissionDenied,
            errno => Error::Kernel { errno },
        }
    }

    /// The errno behind this error: the kernel's (positive) error code, the
    /// OS error of an I/O failure, `ENOENT` for [`Error::FamilyNotFound`];
    /// `None` for decode failures and a closed connection.
    /// [`Error::PermissionDenied`] reports `EPERM`.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Exists => Some(libc::EEXIST),
            Error::NoSuchService => Some(libc::ESRCH),
            Error::NotFound | Error::FamilyNotFound => Some(libc::ENOENT),
            Error::InvalidArgument => Some(libc::EINVAL),
            Error::NotSupported => Some(libc::EOPNOTSUPP),
            Error::AddressFamilyNotSupported => Some(libc::EAFNOSUPPORT),
            Error::PermissionDenied => Some(libc::EPERM),
            Error::Kernel { errno } => Some(*errno),
            Error::Io(err) => err.raw_os_error(),
            Error::Timeout(_) => Some(libc::ETIMEDOUT),
            Error::Decode(_) | Error::ConnectionClosed => None,
        }
    }
}

impl From<DecodeError> for Error {
    fn from(err: DecodeError) -> Error {
        Error::Decode(err.to_string())
    }
}

impl From<NetlinkProtoError> for Error {
    fn from(err: NetlinkProtoError) -> Error {
        match err {
            NetlinkProtoError::ConnectionClosed => Error::ConnectionClosed,
            NetlinkProtoError::NetlinkError(msg) => {
                Error::from_errno(msg.raw_code().saturating_abs())
            }
            NetlinkProtoError::SocketIo(err) => Error::Io(err),
        }
    }
}
