//! Database URLs as libpq reads them: several hosts, and what a session must be.
//!
//! sqlx 0.8 reads a URL with one host and knows neither a host list nor
//! `target_session_attrs`. This module reads the parts libpq adds — the comma-separated
//! `host[:port]` list (in the authority, or in `host` and `port` parameters),
//! `target_session_attrs` and `connect_timeout` — and hands each host, with everything else
//! in the URL unchanged, to sqlx as a URL of its own.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use crate::error::{Error, Result};

/// How long finding a server waits for one host to accept a connection, unless the URL's
/// `connect_timeout` says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The URL parameters this module reads; every other one goes to sqlx as written.
const OWN_PARAMETERS: [&str; 5] = [
    "host",
    "port",
    "target_session_attrs",
    "connect_timeout",
    "load_balance_hosts",
];

/// What a server must be for a session on it to count, as libpq's `target_session_attrs`
/// says. A multi-host URL settles on the first host (the current one first, then the others
/// in the order listed) whose server satisfies it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TargetSessionAttrs {
    /// Any server that accepts the connection. **The default.**
    #[default]
    Any,
    /// A server whose sessions accept writes by default: not a standby, and
    /// `default_transaction_read_only` off. What a workpump fleet needs.
    ReadWrite,
    /// A server whose sessions are read-only by default (a standby, or
    /// `default_transaction_read_only` on).
    ReadOnly,
    /// A server not in recovery (not a standby), whatever its default read-only setting.
    Primary,
    /// A server in recovery: a hot standby.
    Standby,
    /// A standby if one answers, else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    /// The value as written in a URL, e.g. `read-write`.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// Whether a session under these attributes can write: `any`, `read-write` and
    /// `primary`. Workpump writes in every call but a few reads, so a fleet needs one of
    /// these.
    pub fn can_write(self) -> bool {
        matches!(
            self,
            TargetSessionAttrs::Any | TargetSessionAttrs::ReadWrite | TargetSessionAttrs::Primary
        )
    }

    /// Whether a server in `role` is the one to settle on (for `prefer-standby`: a standby).
    pub(crate) fn prefers(self, role: ServerRole) -> bool {
        match self {
            TargetSessionAttrs::Any => true,
            TargetSessionAttrs::ReadWrite => !role.read_only,
            TargetSessionAttrs::ReadOnly => role.read_only,
            TargetSessionAttrs::Primary => !role.in_recovery,
            TargetSessionAttrs::Standby | TargetSessionAttrs::PreferStandby => role.in_recovery,
        }
    }

    /// Whether a session on a server in `role` may be used at all (`prefer-standby` takes
    /// any server when no standby answered).
    pub(crate) fn admits(self, role: ServerRole) -> bool {
        self == TargetSessionAttrs::PreferStandby || self.prefers(role)
    }

    /// Whether a session must be asked what its server is (everything but `any`).
    pub(crate) fn needs_probe(self) -> bool {
        self != TargetSessionAttrs::Any
    }
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TargetSessionAttrs {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Ok(match text {
            "any" => TargetSessionAttrs::Any,
            "read-write" => TargetSessionAttrs::ReadWrite,
            "read-only" => TargetSessionAttrs::ReadOnly,
            "primary" => TargetSessionAttrs::Primary,
            "standby" => TargetSessionAttrs::Standby,
            "prefer-standby" => TargetSessionAttrs::PreferStandby,
            other => {
                return Err(invalid(format!(
                    "target_session_attrs={other:?} is not one of any, read-write, read-only, \
                     primary, standby, prefer-standby"
                )))
            }
        })
    }
}

/// What a session found its server to be (`sql/queries/session_attrs.sql`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ServerRole {
    /// `pg_is_in_recovery()`: a standby.
    pub(crate) in_recovery: bool,
    /// `transaction_read_only` of a new session: a standby, or `default_transaction_read_only`.
    pub(crate) read_only: bool,
}

impl fmt::Display for ServerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.in_recovery, self.read_only) {
            (true, _) => "a standby (in recovery)",
            (false, true) => {
                "a primary whose sessions are read-only (default_transaction_read_only)"
            }
            (false, false) => "a read-write primary",
        })
    }
}

/// One host of a URL: how it is named in messages, and sqlx's options for it.
#[derive(Clone)]
pub(crate) struct Host {
    /// `host:port`, `[v6]:port`, or the socket directory and port.
    pub(crate) label: String,
    /// Everything the URL says, with this host and port.
    pub(crate) options: PgConnectOptions,
}

/// A PostgreSQL connection URL read the way libpq reads it:
/// `postgres://user@10.0.0.1:5432,10.0.0.2:5432/app?target_session_attrs=read-write`.
///
/// - **hosts**: a comma-separated `host[:port]` list in the authority (IPv6 addresses in
///   brackets, socket directories percent-encoded), or in the `host` parameter with the
///   ports in `port` (one port for every host, or one per host). A host without a port uses
///   `PGPORT`, else 5432.
/// - **`target_session_attrs`**: `any` (the default), `read-write`, `read-only`, `primary`,
///   `standby`, `prefer-standby` (see [`TargetSessionAttrs`]).
/// - **`connect_timeout`**: seconds to wait for one host while looking for a server
///   (default 5; at least 1 — libpq's "0 waits forever" is refused, since one silent host
///   would then stall every search).
/// - everything else (user, password, database, `sslmode`, `options`, `application_name`,
///   ...) applies to every host and is read by sqlx as usual.
///
/// A URL with one host and neither `target_session_attrs` nor `connect_timeout` is exactly
/// what sqlx makes of it. A malformed URL is an [`Error::InvalidArgument`] that names the
/// problem (and never the password).
#[derive(Clone)]
pub struct DatabaseUrl {
    hosts: Vec<Host>,
    attrs: TargetSessionAttrs,
    connect_timeout: Duration,
    libpq: bool,
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseUrl")
            .field("hosts", &self.hosts())
            .field("target_session_attrs", &self.attrs)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl FromStr for DatabaseUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        DatabaseUrl::parse(url)
    }
}

impl DatabaseUrl {
    /// Reads `url`; see the type's docs.
    pub fn parse(url: &str) -> Result<DatabaseUrl> {
        let url = url.trim();
        let (scheme, rest) = ["postgres://", "postgresql://"]
            .iter()
            .find_map(|scheme| {
                let head = url.get(..scheme.len())?;
                head.eq_ignore_ascii_case(scheme)
                    .then(|| (&url[..scheme.len()], &url[scheme.len()..]))
            })
            .ok_or_else(|| invalid("it must start with postgres:// or postgresql://"))?;
        let rest = rest.split('#').next().unwrap_or_default();
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, after) = rest.split_at(authority_end);
        let (path, query) = match after.split_once('?') {
            Some((path, query)) => (path, query),
            None => (after, ""),
        };
        let (userinfo, host_list) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };

        let mut hosts: Vec<(String, Option<u16>)> = Vec::new();
        if !host_list.is_empty() {
            let count = host_list.split(',').count();
            for (n, spec) in host_list.split(',').enumerate() {
                hosts.push(host_spec(spec, n + 1, count)?);
            }
        }

        let mut passed_on: Vec<&str> = Vec::new();
        let mut attrs = None;
        let mut connect_timeout = None;
        let mut host_param = None;
        let mut port_param = None;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = form_decode(key)?;
            if !OWN_PARAMETERS.contains(&key.as_str()) {
                if key == "hostaddr" {
                    return Err(invalid(
                        "hostaddr is not supported here; name the hosts in the host list",
                    ));
                }
                passed_on.push(pair);
                continue;
            }
            let value = form_decode(value)?;
            match key.as_str() {
                "target_session_attrs" => attrs = Some(value.parse::<TargetSessionAttrs>()?),
                "connect_timeout" => connect_timeout = Some(parse_connect_timeout(&value)?),
                "host" => host_param = Some(value),
                "port" => port_param = Some(value),
                "load_balance_hosts" if value == "disable" => {}
                "load_balance_hosts" => {
                    return Err(invalid(format!(
                        "load_balance_hosts={value:?} is not supported: hosts are tried in the \
                         order listed (load_balance_hosts=disable)"
                    )))
                }
                _ => {}
            }
        }

        // libpq: the `host` parameter replaces the authority's hosts (and their ports).
        if let Some(list) = &host_param {
            let names: Vec<&str> = list.split(',').collect();
            hosts = Vec::with_capacity(names.len());
            for (n, name) in names.iter().enumerate() {
                if name.is_empty() {
                    return Err(invalid(empty_host(n + 1, names.len())));
                }
                hosts.push(((*name).to_owned(), None));
            }
        }
        if let Some(list) = &port_param {
            let ports: Vec<&str> = list.split(',').collect();
            let count = hosts.len().max(1);
            if ports.len() != 1 && ports.len() != count {
                return Err(invalid(format!(
                    "the port parameter lists {} ports for {count} hosts; give one port for \
                     every host, or one per host",
                    ports.len()
                )));
            }
            let mut parsed = Vec::with_capacity(ports.len());
            for (n, port) in ports.iter().enumerate() {
                let port = match *port {
                    "" => None,
                    text => Some(parse_port(text).map_err(|reason| {
                        invalid(format!("port {} of the port parameter: {reason}", n + 1))
                    })?),
                };
                parsed.push(port);
            }
            if hosts.is_empty() {
                // One default host, as sqlx reads it, with this port.
                hosts.push((String::new(), None));
            }
            for (n, host) in hosts.iter_mut().enumerate() {
                host.1 = if parsed.len() == 1 {
                    parsed[0]
                } else {
                    parsed[n]
                };
            }
        }

        let libpq = hosts.len() > 1 || attrs.is_some() || connect_timeout.is_some();
        let hosts = if !libpq {
            // One host and nothing of libpq's: exactly what sqlx makes of the URL.
            let options = PgConnectOptions::from_str(url)
                .map_err(|e| invalid(format!("sqlx cannot read it: {e}")))?;
            let label = label_of(&options);
            vec![Host { label, options }]
        } else {
            let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
            let count = hosts.len();
            hosts
                .into_iter()
                .enumerate()
                .map(|(n, (name, port))| {
                    let mut host_url = format!("{scheme}{userinfo}localhost{path}?");
                    for pair in &passed_on {
                        host_url.push_str(pair);
                        host_url.push('&');
                    }
                    if !name.is_empty() {
                        host_url.push_str(&format!("host={}&", encode(&name)));
                    }
                    if let Some(port) = port {
                        host_url.push_str(&format!("port={port}&"));
                    }
                    host_url.pop();
                    let options = PgConnectOptions::from_str(&host_url).map_err(|e| {
                        invalid(format!(
                            "host {} of {count} ({}): sqlx cannot read it: {e}",
                            n + 1,
                            display_name(&name, port)
                        ))
                    })?;
                    let label = label_of(&options);
                    Ok(Host { label, options })
                })
                .collect::<Result<Vec<_>>>()?
        };
        Ok(DatabaseUrl {
            hosts,
            attrs: attrs.unwrap_or_default(),
            connect_timeout: connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            libpq,
        })
    }

    /// The hosts, in the order listed: `host:port`, `[v6]:port`, or a socket directory and
    /// port (`/run/postgresql:5432`).
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.iter().map(|host| host.label.clone()).collect()
    }

    /// What a session's server must be.
    pub fn target_session_attrs(&self) -> TargetSessionAttrs {
        self.attrs
    }

    /// How long looking for a server waits for one host.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Whether a coordinator on this URL must choose among hosts or check its server: more
    /// than one host, or a `target_session_attrs` or `connect_timeout` given.
    pub fn needs_failover(&self) -> bool {
        self.libpq
    }

    pub(crate) fn host_list(&self) -> &[Host] {
        &self.hosts
    }
}

/// `spec` is the `n`th of `count` entries of an authority's host list.
fn host_spec(spec: &str, n: usize, count: usize) -> Result<(String, Option<u16>)> {
    if spec.is_empty() {
        return Err(invalid(empty_host(n, count)));
    }
    let (name, port) = if let Some(inner) = spec.strip_prefix('[') {
        let Some((address, after)) = inner.split_once(']') else {
            return Err(invalid(format!(
                "host {n} of {count} ({spec:?}) opens an IPv6 address with [ but does not close it"
            )));
        };
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => {
                    return Err(invalid(format!(
                        "host {n} of {count} ({spec:?}): after the ] comes :port or nothing"
                    )))
                }
            },
        };
        (address.to_owned(), port)
    } else {
        match spec.split_once(':') {
            Some((name, port)) => (percent_decode(name)?, Some(port)),
            None => (percent_decode(spec)?, None),
        }
    };
    if name.is_empty() {
        return Err(invalid(format!(
            "host {n} of {count} ({spec:?}) has a port but no host name"
        )));
    }
    let port = match port {
        None => None,
        Some(port) => Some(
            parse_port(port)
                .map_err(|reason| invalid(format!("host {n} of {count} ({spec:?}): {reason}")))?,
        ),
    };
    Ok((name, port))
}

fn empty_host(n: usize, count: usize) -> String {
    format!("host {n} of {count} in the host list is empty (a stray comma?)")
}

fn parse_port(text: &str) -> std::result::Result<u16, String> {
    match text.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(format!("the port {text:?} is not a number from 1 to 65535")),
    }
}

fn parse_connect_timeout(text: &str) -> Result<Duration> {
    match text.parse::<u64>() {
        Ok(0) => Err(invalid(
            "connect_timeout=0 (wait forever) is not supported: one silent host would stall \
             every search for a server; give whole seconds, at least 1",
        )),
        Ok(seconds) if seconds <= 3600 => Ok(Duration::from_secs(seconds)),
        _ => Err(invalid(format!(
            "connect_timeout={text:?} is not a whole number of seconds from 1 to 3600"
        ))),
    }
}

/// How a host is named in messages, from its options.
fn label_of(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(dir) => format!("{}:{}", dir.display(), options.get_port()),
        None if options.get_host().contains(':') => {
            format!("[{}]:{}", options.get_host(), options.get_port())
        }
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

fn display_name(name: &str, port: Option<u16>) -> String {
    match port {
        Some(port) => format!("{name}:{port}"),
        None => name.to_owned(),
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidArgument(format!("database URL: {}", reason.into()))
}

/// `%XX` escapes decoded, as UTF-8.
fn percent_decode(text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| {
                    invalid(format!("{text:?} has a % that does not start a %XX escape"))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid(format!("{text:?} decodes to invalid UTF-8")))
}

/// A query key or value decoded as a form does (`+` is a space), the way sqlx reads them.
fn form_decode(text: &str) -> Result<String> {
    percent_decode(&text.replace('+', " "))
}

/// Percent-encodes everything but RFC 3986's unreserved characters and `/`.
fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> DatabaseUrl {
        DatabaseUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn refusal(url: &str) -> String {
        match DatabaseUrl::parse(url) {
            Ok(parsed) => panic!("{url} must be refused, got {parsed:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_host_list_with_read_write_names_every_host_in_order() {
        let url = parse(
            "postgres://app:secret@10.0.0.1:5432,10.0.0.2:5433/app?target_session_attrs=read-write",
        );
        assert_eq!(url.hosts(), ["10.0.0.1:5432", "10.0.0.2:5433"]);
        assert_eq!(url.target_session_attrs(), TargetSessionAttrs::ReadWrite);
        assert_eq!(url.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert!(url.needs_failover());
        for host in url.host_list() {
            assert_eq!(host.options.get_username(), "app");
            assert_eq!(host.options.get_database(), Some("app"));
        }
        assert!(!format!("{url:?}").contains("secret"));
    }

    #[test]
    fn every_other_parameter_reaches_every_host() {
        let url = parse(
            "postgresql://u@a,b:6000/db?application_name=wp&sslmode=disable&connect_timeout=2",
        );
        assert_eq!(url.hosts(), ["a:5432", "b:6000"]);
        assert_eq!(url.connect_timeout(), Duration::from_secs(2));
        for host in url.host_list() {
            assert_eq!(host.options.get_application_name(), Some("wp"));
            assert!(matches!(
                host.options.get_ssl_mode(),
                sqlx::postgres::PgSslMode::Disable
            ));
        }
    }

    #[test]
    fn hosts_and_ports_may_come_as_parameters() {
        let url = parse("postgres://u@/db?host=a,b,c&port=5433&target_session_attrs=primary");
        assert_eq!(url.hosts(), ["a:5433", "b:5433", "c:5433"]);
        let url = parse("postgres://u@x/db?host=a,b&port=1,2");
        assert_eq!(url.hosts(), ["a:1", "b:2"]);
        let url =
            parse("postgres://u@/db?host=/run/postgresql,/tmp&port=5432&target_session_attrs=any");
        assert_eq!(url.hosts(), ["/run/postgresql:5432", "/tmp:5432"]);
    }

    #[test]
    fn ipv6_hosts_and_encoded_socket_directories_are_read() {
        let url = parse("postgres://u@[::1]:5432,%2Frun%2Fpostgresql/db?target_session_attrs=any");
        assert_eq!(url.hosts(), ["[::1]:5432", "/run/postgresql:5432"]);
    }

    #[test]
    fn a_single_host_url_is_what_sqlx_makes_of_it() {
        let url = parse("postgres://postgres@localhost/wp_1?host=/tmp/sock&port=5433");
        assert!(!url.needs_failover());
        assert_eq!(url.hosts(), ["/tmp/sock:5433"]);
        let url = parse("postgres://u@db.example:6432/app?sslmode=disable");
        assert!(!url.needs_failover());
        assert_eq!(url.hosts(), ["db.example:6432"]);
        assert!(parse("postgres://u@db/app?target_session_attrs=read-write").needs_failover());
    }

    #[test]
    fn every_session_attribute_of_libpq_is_read() {
        for (text, attrs) in [
            ("any", TargetSessionAttrs::Any),
            ("read-write", TargetSessionAttrs::ReadWrite),
            ("read-only", TargetSessionAttrs::ReadOnly),
            ("primary", TargetSessionAttrs::Primary),
            ("standby", TargetSessionAttrs::Standby),
            ("prefer-standby", TargetSessionAttrs::PreferStandby),
        ] {
            let url = parse(&format!("postgres://u@a,b/db?target_session_attrs={text}"));
            assert_eq!(url.target_session_attrs(), attrs);
            assert_eq!(attrs.as_str(), text);
        }
    }

    #[test]
    fn malformed_urls_are_refused_with_the_problem_named() {
        for (url, problem) in [
            (
                "mysql://a/db",
                "must start with postgres:// or postgresql://",
            ),
            (
                "postgres://u@a,,b/db",
                "host 2 of 3 in the host list is empty",
            ),
            (
                "postgres://u@a,b,/db",
                "host 3 of 3 in the host list is empty",
            ),
            (
                "postgres://u@a:5432,b:x/db",
                "host 2 of 2 (\"b:x\"): the port \"x\" is not a number",
            ),
            (
                "postgres://u@a:0/db?target_session_attrs=any",
                "the port \"0\" is not a number from 1 to 65535",
            ),
            (
                "postgres://u@a,:5432/db",
                "host 2 of 2 (\":5432\") has a port but no host name",
            ),
            (
                "postgres://u@[::1,b/db",
                "opens an IPv6 address with [ but does not close it",
            ),
            (
                "postgres://u@a,b/db?target_session_attrs=readwrite",
                "target_session_attrs=\"readwrite\" is not one of any, read-write",
            ),
            (
                "postgres://u@a,b/db?connect_timeout=0",
                "connect_timeout=0 (wait forever) is not supported",
            ),
            (
                "postgres://u@a,b/db?connect_timeout=soon",
                "connect_timeout=\"soon\" is not a whole number",
            ),
            (
                "postgres://u@/db?host=a,b&port=1,2,3",
                "lists 3 ports for 2 hosts",
            ),
            (
                "postgres://u@a,b/db?load_balance_hosts=random",
                "load_balance_hosts=\"random\" is not supported",
            ),
            (
                "postgres://u@a,b/db?hostaddr=10.0.0.1",
                "hostaddr is not supported",
            ),
        ] {
            let message = refusal(url);
            assert!(
                message.starts_with("invalid argument: database URL: "),
                "{message}"
            );
            assert!(message.contains(problem), "{url}: {message}");
        }
    }

    #[test]
    fn a_refusal_never_shows_the_password() {
        let message = refusal("postgres://app:hunter2@a,b:x/db");
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn roles_satisfy_the_attributes_libpq_says_they_do() {
        let primary = ServerRole {
            in_recovery: false,
            read_only: false,
        };
        let read_only_primary = ServerRole {
            in_recovery: false,
            read_only: true,
        };
        let standby = ServerRole {
            in_recovery: true,
            read_only: true,
        };
        use TargetSessionAttrs::*;
        for (attrs, roles) in [
            (Any, [true, true, true]),
            (ReadWrite, [true, false, false]),
            (ReadOnly, [false, true, true]),
            (Primary, [true, true, false]),
            (Standby, [false, false, true]),
            (PreferStandby, [false, false, true]),
        ] {
            assert_eq!(
                [primary, read_only_primary, standby].map(|role| attrs.prefers(role)),
                roles,
                "{attrs}"
            );
        }
        assert!(PreferStandby.admits(primary));
        assert!(!ReadWrite.admits(standby));
    }
}
