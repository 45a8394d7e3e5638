//! `docs/workpump.example.toml` documents every setting at its default: it must load (no
//! unknown or mistyped key) and equal the defaults.

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use workpump_host::HostConfig;

#[test]
fn the_example_configuration_loads_and_equals_the_defaults() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/workpump.example.toml"
    );
    let loaded: HostConfig = Figment::from(Serialized::defaults(HostConfig::default()))
        .merge(Toml::file_exact(path))
        .extract()
        .expect("the example configuration loads");
    assert_eq!(loaded, HostConfig::default());
    assert!(loaded.validate(std::iter::empty()).is_empty());
}
