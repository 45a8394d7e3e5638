//! The `[liveness]` keys from the environment (`WORKPUMP_LIVENESS__*`), the former
//! `WORKPUMP_HEARTBEAT__*` cutoff variables refused naming their new key, and
//! `WORKPUMP_HEALTH__LISTEN`. One test in its own
//! binary: it sets process-wide environment variables.

use std::time::Duration;

use workpump_host::{HostConfig, HostError, Liveness};

#[test]
fn liveness_keys_come_from_the_environment_and_a_moved_variable_is_refused_by_name() {
    std::env::set_var("WORKPUMP_LIVENESS__STALE_AFTER_MS", "20000");
    std::env::set_var("WORKPUMP_LIVENESS__DEAD_AFTER_MS", "none");
    let config = HostConfig::load(None).expect("loads");
    assert_eq!(
        config.liveness,
        Liveness {
            stale_after: Duration::from_secs(20),
            dead_after: None,
            ..Liveness::default()
        }
    );
    assert!(config.validate(std::iter::empty()).is_empty());

    for (var, moved) in [
        (
            "WORKPUMP_HEARTBEAT__STALE_AFTER_MS",
            "heartbeat.stale_after_ms moved to liveness.stale_after_ms",
        ),
        (
            "WORKPUMP_MAINTENANCE__LOCK_GRACE_MS",
            "maintenance.lock_grace_ms moved to liveness.lock_grace_ms",
        ),
    ] {
        std::env::set_var(var, "3000");
        match HostConfig::load(None) {
            Err(HostError::ConfigLoad(msg)) => {
                let msg = msg.to_string();
                assert!(msg.contains(moved), "{var}: {msg}");
                assert!(msg.contains("WORKPUMP_LIVENESS__"), "{var}: {msg}");
            }
            other => panic!("{var} loaded: {other:?}"),
        }
        std::env::remove_var(var);
    }
    std::env::remove_var("WORKPUMP_LIVENESS__STALE_AFTER_MS");
    std::env::remove_var("WORKPUMP_LIVENESS__DEAD_AFTER_MS");
    assert_eq!(
        HostConfig::load(None).expect("loads").liveness,
        Liveness::default()
    );

    // The health endpoints like any other section.
    std::env::set_var("WORKPUMP_HEALTH__LISTEN", "0.0.0.0:9091");
    assert_eq!(
        HostConfig::load(None).expect("loads").health.listen,
        Some(std::net::SocketAddr::from(([0, 0, 0, 0], 9091)))
    );
    std::env::remove_var("WORKPUMP_HEALTH__LISTEN");
}
