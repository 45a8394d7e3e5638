//! Building connection URLs in the form sqlx 0.8 parses, and the connect options testdb
//! itself connects with.

use std::path::Path;

use sqlx::postgres::PgConnectOptions;

/// The URL of database `db` through the unix socket in `sock_dir`:
/// `postgres://postgres@localhost/<db>?host=<sock_dir>&port=<port>`.
///
/// sqlx takes a `host` query value that starts with `/` as the socket directory and connects
/// to `<host>/.s.PGSQL.<port>`. Query values are form-decoded (`+` would become a space), so
/// the directory is percent-encoded except for `/`.
pub(crate) fn socket_url(sock_dir: &Path, port: u16, db: &str) -> String {
    format!(
        "postgres://postgres@localhost/{}?host={}&port={port}",
        encode(db, false),
        encode(&sock_dir.to_string_lossy(), true),
    )
}

/// The options of [`socket_url`]: the same server, user and database, without a URL in
/// between. Unset settings come from the `PG*` environment variables, as when sqlx parses
/// the URL; no password file is read (the cluster trusts local connections).
pub(crate) fn socket_options(sock_dir: &Path, port: u16, db: &str) -> PgConnectOptions {
    PgConnectOptions::new_without_pgpass()
        .socket(sock_dir)
        .port(port)
        .username("postgres")
        .database(db)
}

/// The URL of database `db` over TCP on 127.0.0.1.
pub(crate) fn tcp_url(port: u16, db: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{}", encode(db, false))
}

/// `url` with its database replaced by `db`: the path is replaced (or added), a `dbname`
/// query parameter (which would override the path) is dropped, everything else is kept.
pub(crate) fn with_database(url: &str, db: &str) -> String {
    let (prefix, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    let query_start = after.find(['?', '#']).unwrap_or(after.len());
    let suffix = &after[query_start..];
    let (query, fragment) = match suffix.find('#') {
        Some(at) => suffix.split_at(at),
        None => (suffix, ""),
    };
    let kept: Vec<&str> = query
        .trim_start_matches('?')
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.starts_with("dbname="))
        .collect();
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    format!("{prefix}{authority}/{}{query}{fragment}", encode(db, false))
}

/// `url` with the password of its user info, if any, masked.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |at| scheme_end + at);
    let authority = &url[scheme_end..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let Some(colon) = authority[..at].find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:***{}",
        &url[..scheme_end],
        &authority[..colon],
        &url[scheme_end + at..]
    )
}

/// Percent-encodes everything but RFC 3986's unreserved characters (and `/` if asked).
fn encode(text: &str, keep_slash: bool) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        let unreserved = byte.is_ascii_alphanumeric() || b"-._~".contains(&byte);
        if unreserved || (keep_slash && byte == b'/') {
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

    #[test]
    fn socket_urls_keep_slashes_and_encode_the_rest() {
        assert_eq!(
            socket_url(Path::new("/tmp/a b+c/sock"), 5433, "wp_1"),
            "postgres://postgres@localhost/wp_1?host=/tmp/a%20b%2Bc/sock&port=5433"
        );
    }

    #[test]
    fn socket_options_say_what_the_socket_url_says() {
        let dir = Path::new("/tmp/a b+c/sock");
        let parsed: PgConnectOptions = socket_url(dir, 5433, "wp_1").parse().expect("parses");
        let built = socket_options(dir, 5433, "wp_1");
        for options in [&parsed, &built] {
            assert_eq!(options.get_socket(), Some(&dir.to_path_buf()));
            assert_eq!(options.get_port(), 5433);
            assert_eq!(options.get_username(), "postgres");
            assert_eq!(options.get_database(), Some("wp_1"));
        }
    }

    #[test]
    fn tcp_urls_name_the_loopback_address() {
        assert_eq!(
            tcp_url(5433, "postgres"),
            "postgres://postgres@127.0.0.1:5433/postgres"
        );
    }

    #[test]
    fn replacing_the_database_keeps_user_host_and_options() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/app?sslmode=disable", "wp_1"),
            "postgres://u:p@h:5432/wp_1?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://u@h", "wp_1"),
            "postgres://u@h/wp_1"
        );
        assert_eq!(
            with_database("postgres://u@h?sslmode=disable", "wp_1"),
            "postgres://u@h/wp_1?sslmode=disable"
        );
        assert_eq!(
            with_database("postgresql:///app?host=/run/postgresql&dbname=app", "wp_1"),
            "postgresql:///wp_1?host=/run/postgresql"
        );
    }

    #[test]
    fn redaction_masks_only_the_password() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h/db?x=a:b@c"), "postgres://h/db?x=a:b@c");
    }
}
