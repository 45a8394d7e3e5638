//! The conformance suite, run against PostgreSQL (a fresh database per test on the throwaway
//! server, or on `DATABASE_URL`'s) and against the in-memory fake.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::PgPool;
use sqlx::Connection;
use sqlx::Row;
use workpump_coordinator::conformance::{ErrorEntry, Harness, JudgeSlot, WorkRow};
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_coordinator::*;
use workpump_testdb::TestDatabase;

struct PgHarness {
    coordinator: PgCoordinator,
    pool: PgPool,
    judge: JudgeSlot,
    db: TestDatabase,
}

async fn pg() -> Arc<PgHarness> {
    let FreshStore {
        coordinator,
        pool,
        db,
    } = fresh_store().await;
    Arc::new(PgHarness {
        coordinator,
        pool,
        judge: JudgeSlot::default(),
        db,
    })
}

fn interval(d: chrono::Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: d.num_microseconds().expect("small duration"),
    }
}

#[async_trait]
impl Harness for PgHarness {
    fn coordinator(&self) -> Arc<dyn WorkCoordinator> {
        Arc::new(self.coordinator.clone())
    }

    fn operations(&self) -> Arc<dyn Operations> {
        Arc::new(self.coordinator.clone())
    }

    async fn work_row(&self, id: WorkId) -> Option<WorkRow> {
        let r = sqlx::query(
            "SELECT id, queue, state::text AS state, priority, attempt, max_attempts, instance_id,
                    lease_expiry IS NOT NULL AS has_lease, claim_token, renewals, cancel_requested,
                    payload, checkpoint, errors, unique_key, ordering_key,
                    finished_at IS NOT NULL AS finished
             FROM workpump.work_all WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .expect("read row")?;
        let errors: serde_json::Value = r.get("errors");
        Some(WorkRow {
            id: r.get("id"),
            queue: r.get("queue"),
            state: WorkState::parse(r.get("state")).expect("known state"),
            priority: r.get("priority"),
            attempt: r.get("attempt"),
            max_attempts: r.get("max_attempts"),
            instance: r
                .get::<Option<uuid::Uuid>, _>("instance_id")
                .map(InstanceId),
            has_lease: r.get("has_lease"),
            claim_token: r.get("claim_token"),
            renewals: r.get("renewals"),
            cancel_requested: r.get("cancel_requested"),
            payload: r.get("payload"),
            checkpoint: r.get("checkpoint"),
            errors: errors
                .as_array()
                .expect("errors is an array")
                .iter()
                .map(ErrorEntry::from_json)
                .collect(),
            unique_key: r.get("unique_key"),
            ordering_key: r.get("ordering_key"),
            finished: r.get("finished"),
        })
    }

    async fn work_count(&self) -> usize {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work_all")
            .fetch_one(&self.pool)
            .await
            .expect("count");
        n as usize
    }

    async fn set_lease_expiry(&self, id: WorkId, offset: chrono::Duration) {
        sqlx::query(
            "UPDATE workpump.work SET lease_expiry = now() + $2
             WHERE id = $1 AND instance_id IS NOT NULL",
        )
        .bind(id)
        .bind(interval(offset))
        .execute(&self.pool)
        .await
        .expect("move the lease");
    }

    async fn sweep_and_claim_with_lease_expiring_now(
        &self,
        id: WorkId,
        params: ClaimWorkParams,
    ) -> workpump_coordinator::Result<ClaimWorkOutcome> {
        // One transaction: now() is the same instant for the UPDATE, the sweep and the claim.
        let mut tx = self.pool.begin().await.expect("begin");
        sqlx::query(
            "UPDATE workpump.work SET lease_expiry = now() WHERE id = $1 AND instance_id IS NOT NULL",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .expect("move the lease");
        sqlx::query("SELECT * FROM workpump.dead_letter_expired(1000)")
            .execute(&mut *tx)
            .await
            .expect("sweep");
        let rows = sqlx::query(
            "SELECT id, claim_token, queue, kind, payload, metadata, priority, attempt, max_attempts, checkpoint,
                    lease_expiry, created_at, reclaimed, pickup_lag, has_more
             FROM workpump.claim_work($1, $2, $3, $4) WHERE id IS NOT NULL",
        )
        .bind(params.instance.0)
        .bind(&params.queues)
        .bind(params.max_items as i32)
        .bind(interval(
            chrono::Duration::from_std(params.lease).expect("lease"),
        ))
        .fetch_all(&mut *tx)
        .await
        .expect("claim");
        tx.commit().await.expect("commit");
        let has_more = rows.iter().any(|r| r.get::<bool, _>("has_more"));
        Ok(ClaimWorkOutcome {
            items: rows
                .iter()
                .map(|r| ClaimedWork {
                    fence: Fence {
                        id: r.get("id"),
                        token: r.get("claim_token"),
                    },
                    queue: r.get("queue"),
                    kind: r.get("kind"),
                    payload: r.get("payload"),
                    metadata: r.get("metadata"),
                    priority: r.get("priority"),
                    attempt: r.get("attempt"),
                    max_attempts: r.get("max_attempts"),
                    checkpoint: r.get("checkpoint"),
                    lease_expiry: r.get("lease_expiry"),
                    created_at: r.get("created_at"),
                    reclaimed: r.get("reclaimed"),
                    pickup_lag: r
                        .get::<Option<f64>, _>("pickup_lag")
                        .map(Duration::from_secs_f64),
                })
                .collect(),
            has_more,
            // (Unlimited queues only, nothing ended: status rows are filtered out above.)
            throttles: Vec::new(),
            orphans_ended: DeadLetterExpiredOutcome::default(),
        })
    }

    async fn age_heartbeat(&self, instance: InstanceId, by: Duration) {
        sqlx::query(
            "UPDATE workpump.instances SET last_heartbeat_at = last_heartbeat_at - $2
             WHERE instance_id = $1",
        )
        .bind(instance.0)
        .bind(interval(chrono::Duration::from_std(by).expect("age")))
        .execute(&self.pool)
        .await
        .expect("age the heartbeat");
    }

    async fn age_lapsed_look(&self, by: Duration) {
        sqlx::query("UPDATE workpump.lapsed_look SET looked_at = looked_at - $1")
            .bind(interval(chrono::Duration::from_std(by).expect("age")))
            .execute(&self.pool)
            .await
            .expect("age the lapsed-lease look");
    }

    async fn age_ordering_check(&self, by: Duration) {
        sqlx::query("UPDATE workpump.ordering_check SET checked_at = checked_at - $1")
            .bind(interval(chrono::Duration::from_std(by).expect("age")))
            .execute(&self.pool)
            .await
            .expect("age the ordering check");
    }

    async fn age_depth_sample(&self, by: Duration) {
        sqlx::query("UPDATE workpump.depth_sample SET sampled_at = sampled_at - $1")
            .bind(interval(chrono::Duration::from_std(by).expect("age")))
            .execute(&self.pool)
            .await
            .expect("age the depth sample");
    }

    async fn request_cancel(&self, id: WorkId) {
        sqlx::query("UPDATE workpump.work SET cancel_requested = true WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .expect("request cancel");
    }

    async fn instance_registered(&self, instance: InstanceId) -> bool {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM workpump.instances WHERE instance_id = $1)",
        )
        .bind(instance.0)
        .fetch_one(&self.pool)
        .await
        .expect("read instance")
    }

    async fn kill_alive_lock_session(&self, instance: InstanceId) {
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(h.pid) FROM workpump.alive_lock_held_keys() h
             WHERE h.key = workpump.alive_lock_key($1)",
        )
        .bind(instance.0)
        .fetch_all(&self.pool)
        .await
        .expect("terminate the lock's session");
        assert_eq!(killed, vec![true], "exactly one session held the lock");
    }

    async fn set_run_at(&self, id: WorkId, offset: chrono::Duration) {
        sqlx::query(
            "UPDATE workpump.work SET run_at = now() + $2
             WHERE id = $1 AND state IN ('scheduled', 'available')",
        )
        .bind(id)
        .bind(interval(offset))
        .execute(&self.pool)
        .await
        .expect("move run_at");
    }

    async fn age_rate_bucket(&self, queue: &str, by: Duration) {
        sqlx::query(
            "UPDATE workpump.queues SET rate_refilled_at = rate_refilled_at - $2
             WHERE name = $1 AND rate_refilled_at IS NOT NULL",
        )
        .bind(queue)
        .bind(interval(chrono::Duration::from_std(by).expect("age")))
        .execute(&self.pool)
        .await
        .expect("age the rate bucket");
    }

    async fn age_finished(&self, id: WorkId, by: Duration) {
        for table in ["work", "work_history"] {
            sqlx::query(&format!(
                "UPDATE workpump.{table} SET finished_at = finished_at - $2
                 WHERE id = $1 AND finished_at IS NOT NULL"
            ))
            .bind(id)
            .bind(interval(chrono::Duration::from_std(by).expect("age")))
            .execute(&self.pool)
            .await
            .expect("age finished_at");
        }
    }

    async fn delete_behind_the_stores_back(&self, id: WorkId) {
        for table in ["work", "work_history"] {
            sqlx::query(&format!("DELETE FROM workpump.{table} WHERE id = $1"))
                .bind(id)
                .execute(&self.pool)
                .await
                .expect("delete a row by hand");
        }
    }

    async fn make_vacuum_due(&self) {
        workpump_coordinator::testing::lower_vacuum_threshold(&self.pool, 0).await;
        workpump_coordinator::testing::wait_for_dead_rows(&self.pool, 1).await;
    }

    async fn age_eviction(&self, instance: InstanceId, by: Duration) {
        sqlx::query(
            "UPDATE workpump.evicted_instances SET evicted_at = evicted_at - $2
             WHERE instance_id = $1",
        )
        .bind(instance.0)
        .bind(interval(chrono::Duration::from_std(by).expect("age")))
        .execute(&self.pool)
        .await
        .expect("age the tombstone");
    }

    async fn age_lock_loss(&self, instance: InstanceId, by: Duration) {
        sqlx::query(
            "UPDATE workpump.instances SET lock_lost_at = lock_lost_at - $2
             WHERE instance_id = $1 AND lock_lost_at IS NOT NULL",
        )
        .bind(instance.0)
        .bind(interval(chrono::Duration::from_std(by).expect("age")))
        .execute(&self.pool)
        .await
        .expect("age the lock loss");
    }

    async fn age_watch(&self, instance: InstanceId, by: Duration) {
        sqlx::query(
            "UPDATE workpump.instances SET lock_since = lock_since - $2
             WHERE instance_id = $1 AND lock_since IS NOT NULL",
        )
        .bind(instance.0)
        .bind(interval(chrono::Duration::from_std(by).expect("age")))
        .execute(&self.pool)
        .await
        .expect("age the watch");
    }

    async fn age_lock_sighting(&self, instance: InstanceId, by: Duration) {
        sqlx::query(
            "UPDATE workpump.instances SET lock_seen_at = lock_seen_at - $2
             WHERE instance_id = $1 AND lock_seen_at IS NOT NULL",
        )
        .bind(instance.0)
        .bind(interval(chrono::Duration::from_std(by).expect("age")))
        .execute(&self.pool)
        .await
        .expect("age the lock sighting");
    }

    async fn restart(&self) {
        // From a connection outside the pool, which then closes too: afterwards no session
        // of this database is older than the "restart".
        let mut admin = sqlx::PgConnection::connect(self.db.url())
            .await
            .expect("connect");
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&mut admin)
        .await
        .expect("list sessions");
        for pid in &pids {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&mut admin)
                .await
                .expect("terminate");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1)")
                    .bind(&pids)
                    .fetch_one(&mut admin)
                    .await
                    .expect("count sessions");
            if left == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{left} terminated sessions still there"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        admin.close().await.expect("close");
    }

    fn judge_slot(&self) -> &JudgeSlot {
        &self.judge
    }

    async fn alive_lock_key(&self, instance: InstanceId) -> Option<i64> {
        Some(
            sqlx::query_scalar("SELECT workpump.alive_lock_key($1)")
                .bind(instance.0)
                .fetch_one(&self.pool)
                .await
                .expect("key"),
        )
    }
}

struct FakeHarness(FakeCoordinator, JudgeSlot);

async fn fake() -> Arc<FakeHarness> {
    Arc::new(FakeHarness(FakeCoordinator::new(), JudgeSlot::default()))
}

#[async_trait]
impl Harness for FakeHarness {
    fn coordinator(&self) -> Arc<dyn WorkCoordinator> {
        Arc::new(self.0.clone())
    }
    fn operations(&self) -> Arc<dyn Operations> {
        Arc::new(self.0.clone())
    }
    async fn work_row(&self, id: WorkId) -> Option<WorkRow> {
        self.0.work_row(id)
    }
    async fn work_count(&self) -> usize {
        self.0.work_rows().len()
    }
    async fn set_lease_expiry(&self, id: WorkId, offset: chrono::Duration) {
        self.0.set_lease_expiry(id, offset)
    }
    async fn sweep_and_claim_with_lease_expiring_now(
        &self,
        id: WorkId,
        params: ClaimWorkParams,
    ) -> workpump_coordinator::Result<ClaimWorkOutcome> {
        self.0.sweep_and_claim_with_lease_expiring_now(id, params)
    }
    async fn age_heartbeat(&self, instance: InstanceId, by: Duration) {
        self.0.age_heartbeat(instance, by)
    }
    async fn age_lapsed_look(&self, by: Duration) {
        self.0.age_lapsed_look(by)
    }
    async fn age_depth_sample(&self, by: Duration) {
        self.0.age_depth_sample(by)
    }
    async fn age_ordering_check(&self, by: Duration) {
        self.0.age_ordering_check(by)
    }
    async fn request_cancel(&self, id: WorkId) {
        self.0.request_cancel(id)
    }
    async fn instance_registered(&self, instance: InstanceId) -> bool {
        self.0.instance_registered(instance)
    }
    async fn kill_alive_lock_session(&self, instance: InstanceId) {
        assert!(self.0.kill_alive_lock_session(instance));
    }
    async fn alive_lock_key(&self, _instance: InstanceId) -> Option<i64> {
        None
    }
    async fn set_run_at(&self, id: WorkId, offset: chrono::Duration) {
        self.0.set_run_at(id, offset)
    }
    async fn age_rate_bucket(&self, queue: &str, by: Duration) {
        self.0.age_rate_bucket(queue, by)
    }
    async fn age_finished(&self, id: WorkId, by: Duration) {
        self.0.age_finished(id, by)
    }
    async fn delete_behind_the_stores_back(&self, id: WorkId) {
        self.0.delete_behind_the_stores_back(id)
    }
    async fn make_vacuum_due(&self) {
        self.0.set_vacuum_due(true)
    }
    async fn age_eviction(&self, instance: InstanceId, by: Duration) {
        self.0.age_eviction(instance, by)
    }
    async fn age_lock_loss(&self, instance: InstanceId, by: Duration) {
        self.0.age_lock_loss(instance, by)
    }
    async fn age_watch(&self, instance: InstanceId, by: Duration) {
        self.0.age_watch(instance, by)
    }
    async fn age_lock_sighting(&self, instance: InstanceId, by: Duration) {
        self.0.age_lock_sighting(instance, by)
    }
    async fn restart(&self) {
        self.0.restart()
    }
    fn judge_slot(&self) -> &JudgeSlot {
        &self.1
    }
}

mod postgres {
    workpump_coordinator::conformance_suite!(super::pg);
}

mod in_memory {
    workpump_coordinator::conformance_suite!(super::fake);
}
