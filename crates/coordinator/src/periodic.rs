//! The values of `fire_periodic`, the call that claims one fire time of a periodic job for
//! the whole fleet and enqueues its item in the same transaction (docs/periodic.md).

use chrono::{DateTime, Utc};

use crate::types::{Enqueued, NewWork};

/// The longest schedule name, in characters.
pub const MAX_PERIODIC_NAME_CHARS: usize = 128;
/// The longest schedule fingerprint, in characters.
pub const MAX_PERIODIC_FINGERPRINT_CHARS: usize = 512;

/// Claims fire time `fire.fire_at` of schedule `name` and enqueues `fire.work` with it, or,
/// with `fire` `None`, reads the schedule's state. See the SQL function `fire_periodic`.
#[derive(Clone, Debug)]
pub struct FirePeriodicParams {
    /// The schedule's name, fleet-wide (1 to [`MAX_PERIODIC_NAME_CHARS`] characters).
    pub name: String,
    /// What the caller computes the fire times from (e.g. `cron "0 * * * *" in UTC`), stored
    /// with each claim so a changed definition can be told apart (1 to
    /// [`MAX_PERIODIC_FINGERPRINT_CHARS`] characters).
    pub fingerprint: String,
    /// The fire time to claim and the item it enqueues; `None` reads the state only.
    pub fire: Option<PeriodicFire>,
}

/// One fire time to claim, and the item to enqueue when it is claimed.
#[derive(Clone, Debug)]
pub struct PeriodicFire {
    /// The fire time (a business time computed from the schedule, like a `run_at`). Claimed
    /// only when the store's clock has reached it.
    pub fire_at: DateTime<Utc>,
    /// The schedule's next fire time after `fire_at` (`None` when it has none). When the
    /// store's clock has reached it too, `fire_at` was missed and nothing is claimed
    /// ([`FireResult::Overtaken`]): the caller applies its misfire policy.
    pub next_fire_at: Option<DateTime<Utc>>,
    /// The item to enqueue, exactly as given (queue, payload and every other field), in the
    /// same transaction as the claim.
    pub work: NewWork,
}

/// What `fire_periodic` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FireResult {
    /// No fire time was asked: the state only.
    State,
    /// The fire time is later than the store's now: nothing was claimed.
    NotDue,
    /// The next fire time is due too, so this one was missed: nothing was claimed.
    Overtaken,
    /// This fire time, or a later one, was already claimed (by a peer, or by an earlier call):
    /// nothing was claimed.
    AlreadyFired,
    /// Claimed, and the item enqueued in the same transaction (`inserted` false when the
    /// item's unique key matched an unfinished item, which then stands for it).
    Fired(Enqueued),
}

/// The result of `fire_periodic`: what it did, and the schedule's state after the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirePeriodicOutcome {
    /// What happened.
    pub result: FireResult,
    /// The last fire time claimed for this schedule by anyone; `None` when it never fired.
    pub last_fire_at: Option<DateTime<Utc>>,
    /// The definition that claimed it; `None` when it never fired.
    pub fingerprint: Option<String>,
    /// The store's clock during the call.
    pub db_now: DateTime<Utc>,
}

impl FirePeriodicParams {
    /// Refuses what the store would refuse, before anything is written (the item itself is
    /// checked as an enqueue checks it).
    pub(crate) fn validate(&self) -> crate::Result<()> {
        let name_chars = self.name.chars().count();
        if name_chars == 0 || name_chars > MAX_PERIODIC_NAME_CHARS || self.name.contains('\0') {
            return Err(crate::Error::InvalidArgument(format!(
                "fire_periodic: the schedule name must be 1 to {MAX_PERIODIC_NAME_CHARS} \
                 characters without NUL, got {name_chars}"
            )));
        }
        let fp_chars = self.fingerprint.chars().count();
        if fp_chars == 0
            || fp_chars > MAX_PERIODIC_FINGERPRINT_CHARS
            || self.fingerprint.contains('\0')
        {
            return Err(crate::Error::InvalidArgument(format!(
                "fire_periodic: schedule {:?}: the fingerprint must be 1 to \
                 {MAX_PERIODIC_FINGERPRINT_CHARS} characters without NUL, got {fp_chars}",
                self.name
            )));
        }
        if let Some(fire) = &self.fire {
            if fire.next_fire_at.is_some_and(|next| next <= fire.fire_at) {
                return Err(crate::Error::InvalidArgument(format!(
                    "fire_periodic: schedule {:?}: next_fire_at must be later than fire_at {}",
                    self.name, fire.fire_at
                )));
            }
        }
        Ok(())
    }
}
