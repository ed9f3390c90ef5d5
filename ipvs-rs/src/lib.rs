//! IPVS generic-netlink codec and async handle.
