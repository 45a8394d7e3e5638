//! One SQL question from blocking code. The cluster methods block and are called from inside
//! a tokio runtime (`block_in_place`, `spawn_blocking`) as well as outside one, where no
//! runtime may be started on the calling thread; so each question runs on a thread of its
//! own, with a runtime of its own, and the caller waits for it.

use std::thread;

use sqlx::{Connection, PgConnection};

use crate::error::{Error, Result};
use crate::url;

/// The first column of the first row of `sql` (which must yield text or NULL) on database
/// `url`; `None` for no row or NULL.
pub(crate) fn text(url: &str, sql: &str) -> Result<Option<String>> {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    let asker = thread::Builder::new()
        .name("testdb-query".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(Error::io("building a runtime for a query"))?;
            runtime.block_on(async {
                let mut connection =
                    PgConnection::connect(&url)
                        .await
                        .map_err(|source| Error::Connect {
                            url: url::redact(&url),
                            source,
                        })?;
                let answer = sqlx::query_scalar::<_, Option<String>>(&sql)
                    .fetch_optional(&mut connection)
                    .await
                    .map_err(|source| Error::Database {
                        context: format!("asking {}: {sql}", url::redact(&url)),
                        source,
                    });
                let _ = connection.close().await;
                answer.map(Option::flatten)
            })
        })
        .map_err(Error::io("spawning a thread for a query"))?;
    asker.join().unwrap_or_else(|_| {
        Err(Error::Io {
            context: "asking the server a question".to_owned(),
            source: std::io::Error::other("the querying thread panicked"),
        })
    })
}
