//! lease-renewal (to be written)
