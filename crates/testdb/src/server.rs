//! The server a test process uses, and the fresh databases it hands out.

use std::env;
use std::thread;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::url;

/// Connections of one [`TestDatabase::pool`].
const POOL_MAX_CONNECTIONS: u32 = 20;

/// The maintenance database of the throwaway cluster.
const ADMIN_DATABASE: &str = "postgres";

/// This process's server; only URLs and paths are cached, never a pool (a pool belongs to
/// the runtime it was made on, and every `#[tokio::test]` makes its own).
static SERVER: OnceCell<Server> = OnceCell::const_new();

/// The server for this process: `DATABASE_URL`'s if that is set and not empty, or else the
/// shared throwaway `"test"` cluster, started if needed. Initialised once per process;
/// concurrent callers wait for the first and share its result.
pub async fn server() -> Result<&'static Server> {
    SERVER.get_or_try_init(Server::from_environment).await
}

/// A PostgreSQL server on which tests create fresh databases. Get it from [`server`].
#[derive(Debug)]
pub struct Server {
    kind: Kind,
    /// How to connect to [`admin_url`](Self::admin_url): a test database's options are these
    /// with its name as the database.
    admin: PgConnectOptions,
}

#[derive(Debug)]
enum Kind {
    /// The throwaway cluster, and the URL of its `postgres` database.
    Cluster {
        cluster: Box<Cluster>,
        admin_url: String,
    },
    /// `DATABASE_URL`'s server; the URL as given is the admin URL.
    External { url: String },
}

impl Server {
    async fn from_environment() -> Result<Server> {
        if let Some(url) = env::var("DATABASE_URL")
            .ok()
            .filter(|url| !url.trim().is_empty())
        {
            // Fail here, once, with the URL in the message, rather than in every test.
            let admin: PgConnectOptions = url.parse().map_err(|source| Error::Connect {
                url: url::redact(&url),
                source,
            })?;
            let connection = connect(&admin, &url).await?;
            let _ = connection.close().await;
            return Ok(Server {
                kind: Kind::External { url },
                admin,
            });
        }
        let cluster = tokio::task::spawn_blocking(|| {
            let cluster = Cluster::test()?;
            cluster.start()?;
            Ok::<_, Error>(cluster)
        })
        .await
        .map_err(|join_error| Error::Io {
            context: "starting the throwaway PostgreSQL".to_owned(),
            source: std::io::Error::other(join_error),
        })??;
        let admin_url = cluster.url(ADMIN_DATABASE);
        let admin = cluster.connect_options(ADMIN_DATABASE);
        // pg_stat_statements in the admin database, so that each test database's entries
        // can be forgotten when it is dropped (drop_database). Best effort: where the
        // extension is missing, tests that read the statistics say so themselves.
        if let Ok(mut connection) = connect(&admin, &admin_url).await {
            let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .execute(&mut connection)
                .await;
            let _ = connection.close().await;
        }
        Ok(Server {
            kind: Kind::Cluster {
                cluster: Box::new(cluster),
                admin_url,
            },
            admin,
        })
    }

    /// The URL to administer the server with: the throwaway cluster's `postgres` database,
    /// or `DATABASE_URL` as given.
    pub fn admin_url(&self) -> &str {
        match &self.kind {
            Kind::Cluster { admin_url, .. } => admin_url,
            Kind::External { url } => url,
        }
    }

    /// Creates a fresh, empty database `wp_<uuid>` (a copy of `template1`).
    pub async fn create_database(&self) -> Result<TestDatabase> {
        let name = format!("wp_{}", Uuid::new_v4().simple());
        let admin_url = self.admin_url().to_owned();
        let mut connection = connect(&self.admin, &admin_url).await?;
        sqlx::raw_sql(&format!("CREATE DATABASE {}", quote_identifier(&name)))
            .execute(&mut connection)
            .await
            .map_err(|source| Error::Database {
                context: format!(
                    "creating database {name} (the user needs the CREATEDB privilege)"
                ),
                source,
            })?;
        let _ = connection.close().await;
        Ok(TestDatabase {
            url: self.url_for(&name),
            options: self.admin.clone().database(&name),
            name,
            admin: self.admin.clone(),
            admin_url,
            dropped: false,
        })
    }

    /// The URL of database `db` on this server (through the unix socket for the throwaway
    /// cluster). For `DATABASE_URL`'s server it is that URL with its database replaced and
    /// every other part kept as given (sqlx's options cannot say all of them back: a host
    /// list, `target_session_attrs`, `application_name`); to connect from Rust,
    /// [`TestDatabase::connect_options`] says the same without a URL.
    pub fn url_for(&self, db: &str) -> String {
        match &self.kind {
            Kind::Cluster { cluster, .. } => cluster.url(db),
            Kind::External { url } => url::with_database(url, db),
        }
    }

    /// The TCP URL of database `db` (for a proxy in between); `None` for a `DATABASE_URL`
    /// server, whose URL is used as given.
    pub fn tcp_url_for(&self, db: &str) -> Option<String> {
        match &self.kind {
            Kind::Cluster { cluster, .. } => Some(cluster.tcp_url(db)),
            Kind::External { .. } => None,
        }
    }

    /// The throwaway cluster behind this server (to restart it, say); `None` for a
    /// `DATABASE_URL` server.
    pub fn cluster(&self) -> Option<&Cluster> {
        match &self.kind {
            Kind::Cluster { cluster, .. } => Some(cluster),
            Kind::External { .. } => None,
        }
    }
}

/// A fresh database for one test. Dropping it drops the database (best effort);
/// [`TestDatabase::drop_database`] does so and reports errors.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    /// How to connect to it.
    options: PgConnectOptions,
    /// How to connect to the server's admin database, to drop it.
    admin: PgConnectOptions,
    /// The admin database's URL, for messages.
    admin_url: String,
    dropped: bool,
}

impl TestDatabase {
    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name, `wp_<uuid>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How to connect to the database, as sqlx's options (the server's, with this database):
    /// change the user or the application name here rather than in the URL.
    pub fn connect_options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// A new pool on this database, of at most 20 connections. Make it inside the runtime
    /// that uses it.
    pub async fn pool(&self) -> Result<PgPool> {
        PgPoolOptions::new()
            .max_connections(POOL_MAX_CONNECTIONS)
            .connect_with(self.options.clone())
            .await
            .map_err(|source| Error::Connect {
                url: url::redact(&self.url),
                source,
            })
    }

    /// Drops the database, disconnecting whoever is still connected.
    pub async fn drop_database(mut self) -> Result<()> {
        self.dropped = true;
        drop_database(&self.admin, &self.admin_url, &self.name).await
    }
}

impl Drop for TestDatabase {
    /// Drops the database on a thread of its own with its own runtime, so that it works
    /// inside and outside a runtime alike, and waits for it, so that the process does not
    /// exit first. Errors are logged at debug level and otherwise ignored.
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let admin = self.admin.clone();
        let admin_url = std::mem::take(&mut self.admin_url);
        let name = std::mem::take(&mut self.name);
        let dropper = thread::Builder::new()
            .name("testdb-drop".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(Error::io("building a runtime to drop a test database"))?;
                runtime.block_on(drop_database(&admin, &admin_url, &name))
            });
        let outcome = match dropper {
            Ok(handle) => handle.join().unwrap_or_else(|_| {
                Err(Error::Io {
                    context: "dropping a test database".to_owned(),
                    source: std::io::Error::other("the dropping thread panicked"),
                })
            }),
            Err(source) => Err(Error::Io {
                context: "spawning a thread to drop a test database".to_owned(),
                source,
            }),
        };
        if let Err(error) = outcome {
            tracing::debug!(%error, database = %self.url, "could not drop test database");
        }
    }
}

async fn drop_database(admin: &PgConnectOptions, admin_url: &str, name: &str) -> Result<()> {
    let mut connection = connect(admin, admin_url).await?;
    // The database's pg_stat_statements entries go with it (where the admin database has the
    // extension and the role may reset): the server keeps those of dropped databases until it
    // evicts entries at pg_stat_statements.max (5 000), and a whole test run makes far more,
    // so without this the entries a running test reads could be evicted under it.
    let _ = sqlx::query(
        "SELECT pg_stat_statements_reset(0, d.oid, 0) FROM pg_database d
         WHERE d.datname = $1",
    )
    .bind(name)
    .execute(&mut connection)
    .await;
    sqlx::raw_sql(&format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        quote_identifier(name)
    ))
    .execute(&mut connection)
    .await
    .map_err(|source| Error::Database {
        context: format!("dropping database {name}"),
        source,
    })?;
    let _ = connection.close().await;
    Ok(())
}

/// Connects with `options`; `url` (what they were made from) names the server in errors.
async fn connect(options: &PgConnectOptions, url: &str) -> Result<PgConnection> {
    PgConnection::connect_with(options)
        .await
        .map_err(|source| Error::Connect {
            url: url::redact(url),
            source,
        })
}

/// `name` as an SQL identifier.
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
