//! The conformance suite: one set of cases that every
//! [`WorkCoordinator`](crate::WorkCoordinator) must pass. The coordinator crate runs it
//! against [`crate::PgCoordinator`] on a real server and against [`crate::FakeCoordinator`];
//! a change to the trait or to a SQL function extends it in the same commit.
//!
//! A [`Harness`] gives a case the coordinator plus the few things a test needs that the trait
//! deliberately lacks: reading a row, and moving rows in time (as an `UPDATE` in the test
//! would) instead of injecting a clock. Use [`conformance_suite!`](crate::conformance_suite)
//! to turn every case into a test.
//!
//! The cases live in one module per concern — `claim.rs`, `renewal.rs`, `liveness.rs`
//! (instances, heartbeats, sweeps, the alive-lock), `outcomes.rs`, `enqueue.rs`,
//! `maintenance.rs`, `operations.rs` (the operator's actions), `inspect.rs` (the operator's
//! reads), `periodic.rs` (`fire_periodic`), `ordering.rs` (ordering keys), `flow.rs` (flow control:
//! running and rate limits per queue) — with the shared short forms of
//! the calls in `helpers.rs` and the [`Harness`] in `harness.rs`; this file lists them.

mod claim;
mod enqueue;
mod flow;
mod harness;
mod helpers;
mod inspect;
mod liveness;
mod maintenance;
mod operations;
mod ordering;
mod outcomes;
mod periodic;
mod renewal;

pub use claim::*;
pub use enqueue::*;
pub use flow::*;
pub use harness::{ErrorEntry, Harness, JudgeSlot, WorkRow};
pub use helpers::judge;
pub use inspect::*;
pub use liveness::*;
pub use maintenance::*;
pub use operations::*;
pub use ordering::*;
pub use outcomes::*;
pub use periodic::*;
pub use renewal::*;

/// Generates one `#[tokio::test]` per conformance case. `$make` is an async fn returning
/// something that derefs to a [`Harness`].
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!(@cases $make;
            // claim.rs
            orphan_predicate_truth_table,
            concurrent_claimers_receive_each_row_exactly_once,
            claim_honours_max_items_and_the_queue_filter,
            claim_orders_by_priority_then_age,
            claim_waits_for_run_at_in_the_future,
            claim_refuses_an_unknown_queue_naming_the_first_and_an_unregistered_instance,
            an_orphan_claim_bumps_the_attempt_and_mints_a_new_token,
            an_orphan_with_attempts_used_up_becomes_a_dead_letter,
            a_lapsed_lease_is_its_owners_until_the_sweep_releases_it,
            the_drain_hint_says_whether_more_were_left,
            a_claim_reports_the_pickup_lag_from_due_to_claim_except_for_reclaims,
            // renewal.rs
            renewal_extends_only_leases_fenced_to_the_caller,
            renewal_of_a_finished_or_reclaimed_item_reports_lost,
            renewal_reports_a_cancel_request,
            renewal_of_an_empty_list_returns_nothing_and_bad_arguments_are_refused,
            renewal_by_an_evicted_instance_answers_evicted_for_every_lease,
            // liveness.rs
            heartbeat_inserts_then_updates,
            heartbeat_sweeps_only_when_a_peer_is_stale_and_never_reaps_the_caller,
            heartbeat_from_an_evicted_instance_reports_eviction_and_writes_nothing,
            cleanup_releases_every_lease_of_the_instances_it_deletes,
            cleanup_keeps_a_stale_instance_whose_alive_lock_is_held,
            cleanup_deletes_past_the_definitive_dead_cutoff_even_with_the_lock_held,
            a_lock_proven_instance_whose_lock_stays_gone_past_the_grace_is_reaped_and_its_queues_woken,
            a_lock_taken_again_within_the_grace_keeps_the_instance,
            an_instance_that_never_held_its_lock_is_judged_by_staleness_alone,
            a_heartbeat_sweeps_when_a_lock_proven_peer_loses_its_lock,
            a_restart_evicts_nobody_and_a_peer_that_never_comes_back_goes_by_staleness,
            a_lock_blip_at_any_heartbeat_age_is_covered_by_the_grace,
            the_liveness_check_credits_only_the_instances_own_lock_session,
            a_sweep_never_reaps_its_caller,
            a_judge_that_sees_a_peers_lock_held_can_fail_it_over_in_seconds,
            a_judge_reaps_by_staleness_only_after_watching_for_longer_than_the_cutoff,
            a_peer_is_judged_by_the_cutoffs_it_declared,
            liveness_cutoffs_below_the_store_floor_are_refused,
            alive_lock_keys_that_hash_to_negative_values_work,
            killing_the_alive_lock_session_releases_the_lock,
            the_alive_lock_is_taken_once_per_session,
            deregistering_releases_leases_and_deletes_the_instance,
            // outcomes.rs
            a_zombies_outcomes_after_a_reclaim_are_fenced_out,
            complete_records_success_once,
            failure_with_retry_schedules_the_item_and_keeps_the_error,
            failure_at_max_attempts_dead_letters_with_the_full_history,
            rejection_and_cancellation_finish_the_item,
            a_drained_release_does_not_consume_an_attempt,
            a_release_that_consumes_the_last_attempt_dead_letters,
            a_checkpoint_reaches_the_next_attempt,
            a_repeated_pair_is_answered_once_and_its_first_disposition_wins,
            a_cancel_requested_item_that_fails_or_is_released_ends_cancelled_and_says_why,
            // enqueue.rs
            bulk_enqueue_of_ten_thousand_items_in_one_call,
            enqueue_refuses_unknown_queues_oversized_batches_and_invalid_payloads_and_writes_nothing,
            a_unique_key_returns_the_existing_item_while_it_is_unfinished,
            scheduled_items_are_scheduled_and_priorities_kept,
            kinds_and_metadata_reach_the_claim_and_bad_ones_are_refused,
            // maintenance.rs
            server_status_reports_the_notification_queue_usage,
            maintenance_due_flags_exactly_the_steps_that_have_work,
            the_fleet_looks_for_lapsed_leases_in_turns,
            the_work_table_is_vacuumed_only_when_due,
            promotion_moves_only_due_scheduled_items_and_wakes_their_claimers,
            promotion_takes_at_most_limit_items_oldest_first,
            concurrent_sweeps_promote_each_due_item_exactly_once,
            expired_leases_with_attempts_used_up_become_dead_letters_in_every_queue,
            expired_leases_of_cancelled_items_end_cancelled_and_the_limit_holds,
            pruning_deletes_only_finished_items_past_their_retention,
            pruning_takes_completed_items_first_and_at_most_limit,
            pruning_tombstones_forgets_only_old_evictions,
            queue_depth_counts_waiting_and_running_items_per_queue,
            queue_depth_reports_the_age_of_the_oldest_due_item_per_queue,
            the_fleet_samples_the_queue_depth_in_turns,
            maintenance_calls_refuse_bad_limits_and_retentions,
            // operations.rs
            cancel_of_a_waiting_item_cancels_it_at_once,
            cancel_of_a_running_item_is_requested_and_reaches_its_owner,
            cancel_of_a_finished_or_unknown_item_is_refused,
            a_retried_dead_letter_is_claimable_again_with_fresh_attempts_and_its_history,
            retry_refuses_items_that_are_not_dead_letters_or_whose_unique_key_is_taken,
            discard_deletes_finished_items_and_refuses_unfinished_ones,
            a_paused_queue_hands_out_nothing_until_resumed_and_resuming_wakes_its_claimers,
            bulk_work_by_ids_applies_each_item_whole_and_says_why_others_were_refused,
            bulk_work_matching_acts_in_bounded_batches_and_refuses_an_empty_filter,
            bulk_work_matching_by_kind_acts_only_on_items_of_those_kinds,
            bulk_discard_takes_completed_and_dead_items_lowest_ids_first,
            run_now_makes_scheduled_items_due_at_once_and_refuses_others,
            queue_settings_have_one_owner_and_an_operator_may_change_or_hand_them_over,
            // inspect.rs
            list_work_pages_through_every_item_newest_first,
            list_work_filters_by_queue_state_owner_time_and_error_text,
            list_work_shows_each_items_kind_and_filters_by_kinds,
            list_work_refuses_a_malformed_cursor_and_out_of_range_arguments,
            get_work_returns_the_whole_item_with_every_attempt,
            queue_overview_counts_states_lag_rates_and_settings,
            list_instances_reports_beats_locks_and_leases_per_queue,
            // periodic.rs
            concurrent_callers_enqueue_one_item_per_fire_time,
            fire_times_are_claimed_forward_only_even_after_the_item_completed,
            a_fire_time_not_yet_due_or_overtaken_claims_nothing,
            a_changed_definition_claims_only_later_fire_times_and_is_recorded,
            fire_periodic_refuses_bad_arguments_and_an_unknown_queue_leaves_it_unclaimed,
            // ordering.rs
            keyed_items_run_one_at_a_time_in_enqueue_order,
            a_retrying_head_keeps_its_key,
            a_dead_head_holds_its_key_until_retried_or_discarded,
            a_dead_head_is_skipped_in_a_skip_queue,
            cancel_of_a_blocked_item_or_of_a_head,
            an_expired_last_attempt_of_a_head_follows_the_dead_head_rule,
            the_dead_head_rule_is_a_queue_setting_with_one_owner,
            the_operator_lists_a_keys_items_and_reads_an_items_key,
            a_released_head_keeps_its_key_unless_it_ends,
            a_keyed_item_turned_away_by_its_unique_key_leaves_the_next_as_head,
            the_repair_promotes_the_next_item_of_a_key_left_without_a_head,
            the_fleet_checks_ordering_keys_in_turns,
            a_bad_ordering_key_is_refused_naming_the_item,
            enqueue_racing_completion_never_strands_a_key,
            a_completion_hands_its_key_on_to_the_completer_when_asked,
            a_hand_off_is_refused_where_a_claim_would_wait_or_count,
            // flow.rs
            the_running_limit_holds_across_instances_and_slots_come_back_when_items_end,
            a_dead_instances_slots_come_back_with_its_leases_and_a_reclaim_is_allowed_at_the_limit,
            the_rate_limit_allows_a_burst_then_refills_over_time,
            a_reclaim_is_not_refused_by_the_rate_but_takes_a_token,
            a_limit_throttles_only_its_queue_and_never_the_drain_hint,
            flow_limits_are_queue_settings_and_bad_ones_are_refused,
            items_running_before_a_limit_is_set_count_toward_it,
            items_running_before_their_service_declares_a_limit_count_toward_it,
            after_a_limit_is_lowered_nothing_starts_until_the_items_above_it_end,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make().await;
                $crate::conformance::$case(&*harness).await;
            }
        )*
    };
}
