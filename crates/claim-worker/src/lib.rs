//! claim-worker (to be written)
