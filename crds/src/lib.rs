//! kipvs API types.
