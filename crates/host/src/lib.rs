//! host (to be written)
