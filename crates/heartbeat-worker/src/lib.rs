//! heartbeat-worker (to be written)
