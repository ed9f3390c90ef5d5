//! Linux IPVS (IP Virtual Server) configuration over generic netlink.
//!
//! Two layers:
//!
//! * [`Handle`]: an async client. [`Handle::connect`] resolves the `IPVS`
//!   generic-netlink family, opens a socket driven by a Tokio task, and every
//!   method sends one request and waits for the kernel's answer. Clones share
//!   the socket and requests may run concurrently.
//! * [`codec`]: [`IpvsMessage`] and typed attribute enums implementing the
//!   `netlink-packet-*` traits, for building or inspecting raw messages.
//!
//! The object model ([`Service`], [`Destination`], [`Timeouts`], [`Info`])
//! mirrors what the kernel stores. The wire format is defined by the kernel
//! uapi header `include/uapi/linux/ip_vs.h` (numbers in [`constants`]); the
//! semantics (which attributes are required, which errno means what) come
//! from `net/netfilter/ipvs/ip_vs_ctl.c`, cited on each item.
//!
//! # Example
//!
//! ```no_run
//! use ipvs::{Destination, Handle, Protocol, Service, ServiceId};
//!
//! # async fn example() -> Result<(), ipvs::Error> {
//! let ipvs = Handle::connect().await?;
//! let id = ServiceId::Inet {
//!     address: "10.96.0.10".parse().unwrap(),
//!     port: 53,
//!     protocol: Protocol::Udp,
//! };
//! match ipvs.add_service(&Service::new(id, "rr")).await {
//!     Ok(()) | Err(ipvs::Error::Exists) => {}
//!     Err(err) => return Err(err),
//! }
//! ipvs.add_destination(&id, &Destination::new("10.244.1.7".parse().unwrap(), 53, 1))
//!     .await?;
//! for dest in ipvs.destinations(&id).await? {
//!     println!("{id} -> {}:{} weight {}", dest.address, dest.port, dest.weight);
//! }
//! ipvs.delete_service(&id).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Requirements: Linux with the `ip_vs` module (loaded, or loadable by the
//! kernel on first use), `CAP_NET_ADMIN`, and a Tokio runtime.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod codec;
pub mod constants;
mod ctrl;
mod error;
mod handle;
pub mod procfs;
mod types;

pub use codec::{IpvsCmd, IpvsMessage};
pub use error::Error;
pub use handle::{Handle, REQUEST_TIMEOUT};
pub use types::{
    AddressFamily, Destination, ForwardMethod, Info, Protocol, Service, ServiceFlags, ServiceId,
    Stats, Timeouts, Version,
};

#[cfg(all(test, target_endian = "little"))]
mod tests;
