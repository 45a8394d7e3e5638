//! Fresh databases on the process's server: the contract every integration test relies on.

use std::collections::HashSet;

use workpump_testdb::{server, Server};

#[tokio::test]
async fn two_fresh_databases_are_distinct_and_usable() {
    let server = server().await.expect("a server");
    let first = server.create_database().await.expect("first database");
    let second = server.create_database().await.expect("second database");
    assert_ne!(first.name(), second.name());
    assert_ne!(first.url(), second.url());

    let first_pool = first.pool().await.expect("pool on the first database");
    let second_pool = second.pool().await.expect("pool on the second database");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&first_pool)
        .await
        .expect("SELECT 1 on the first database");
    assert_eq!(one, 1);

    sqlx::query("CREATE TABLE only_in_first (id int)")
        .execute(&first_pool)
        .await
        .expect("create a table in the first database");
    let visible_in_second: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('only_in_first')::text")
            .fetch_one(&second_pool)
            .await
            .expect("look the table up in the second database");
    assert_eq!(visible_in_second, None);
    let current: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&second_pool)
        .await
        .expect("current_database()");
    assert_eq!(current, second.name());

    first_pool.close().await;
    second_pool.close().await;
    first
        .drop_database()
        .await
        .expect("drop the first database");
    second
        .drop_database()
        .await
        .expect("drop the second database");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_of_server_share_one_server() {
    let callers: Vec<_> = (0..16)
        .map(|_| tokio::spawn(async { server().await.map(|s| s as *const Server as usize) }))
        .collect();
    let mut servers = HashSet::new();
    for caller in callers {
        servers.insert(caller.await.expect("caller task").expect("a server"));
    }
    assert_eq!(servers.len(), 1, "every caller got the same server");
}

#[tokio::test]
async fn dropping_a_database_removes_it_either_way() {
    let server = server().await.expect("a server");
    let explicit = server.create_database().await.expect("a database");
    let implicit = server.create_database().await.expect("another database");
    let names = [explicit.name().to_owned(), implicit.name().to_owned()];

    let admin = sqlx::PgPool::connect(server.admin_url())
        .await
        .expect("admin pool");
    let count_existing = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_database WHERE datname = ANY($1)")
            .bind(&names[..])
            .fetch_one(&admin)
            .await
            .expect("count databases")
    };
    assert_eq!(count_existing().await, 2);

    // A connection left open does not keep the database alive.
    let pool = explicit.pool().await.expect("pool");
    let _held = pool.acquire().await.expect("a held connection");
    explicit.drop_database().await.expect("drop_database");
    drop(implicit); // Drop drops it before returning.
    assert_eq!(count_existing().await, 0);
    admin.close().await;
}

#[tokio::test]
async fn urls_name_the_database() {
    let server = server().await.expect("a server");
    let db = server.create_database().await.expect("a database");
    assert_eq!(server.url_for(db.name()), db.url());
    if let Some(tcp_url) = server.tcp_url_for(db.name()) {
        let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&tcp_url)
            .await
            .expect("connect over TCP");
        let current: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&mut connection)
            .await
            .expect("current_database()");
        assert_eq!(current, db.name());
    }
    db.drop_database().await.expect("drop the database");
}
