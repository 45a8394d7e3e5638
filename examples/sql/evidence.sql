-- The evidence of what workpump-worker processes did, for the checks of the fault suite
-- (`cargo xtask chaos`), the demo (`cargo xtask demo`) and the process tests
-- (examples/tests): whoever starts the workers runs this on the fresh, migrated database.
-- The one copy: xtask's harness and the process tests include this file.
--
-- In `public`, where the workers' unqualified inserts land:
--
-- workpump_ledger          one row per handler execution, written by the worker before its
--                          handler runs (`--ledger`): item, attempt, claim token, instance,
--                          the writing process's application_name, the database time.
-- workpump_effects         the `tx` items' business write. Deliberately without a primary
--                          key, so that a second write shows as a second row instead of a
--                          failed insert; a trigger stamps each row with the claim token the
--                          item holds inside the writing transaction.
-- workpump_audit           triggers on workpump.work record every insert and delete of an
--                          item and every change of its state, owner, claim token, attempt,
--                          lease expiry, renewal count, checkpoint or cancel request: before
--                          and after, the error entry it appended, which process wrote it
--                          (application_name) and when (clock_timestamp(), and the writing
--                          transaction's now()). A completion moves the row to
--                          workpump.work_history: recorded as the update it stands for, from
--                          running to completed (owner and expiry cleared, token and attempt
--                          kept); a completed item deleted from work_history (retention of
--                          its default partition, an operator's discard) as a delete from
--                          state completed. A partition dropped whole past the retention
--                          fires no trigger: its items vanish unrecorded (the default
--                          retention, 24 h, is never reached within a run).
-- workpump_enqueued        the ids the harness enqueued: every one must be there at the end.
-- workpump_instance_audit  triggers on workpump.instances and workpump.evicted_instances
--                          record every registration, deletion and eviction tombstone, with
--                          the writing process and the row's heartbeat and lock state.
-- workpump_cancels         the items the harness asked to cancel, and what cancel_work
--                          answered.
--
-- The trigger functions pin their search_path: they fire inside workpump's SQL functions,
-- which run with theirs set to the workpump schema.

CREATE TABLE workpump_ledger (
    item     bigint      NOT NULL,
    attempt  int         NOT NULL,
    token    bigint      NOT NULL,
    instance uuid        NOT NULL,
    proc     text        NOT NULL DEFAULT current_setting('application_name'),
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX workpump_ledger_item ON workpump_ledger (item);

CREATE TABLE workpump_effects (
    item  bigint      NOT NULL,
    token bigint,
    proc  text        NOT NULL DEFAULT current_setting('application_name'),
    at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION workpump_effect_token() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_catalog AS $$
BEGIN
    NEW.token := (SELECT w.claim_token FROM workpump.work w WHERE w.id = NEW.item);
    RETURN NEW;
END
$$;
CREATE TRIGGER workpump_effect_token BEFORE INSERT ON workpump_effects
    FOR EACH ROW EXECUTE FUNCTION workpump_effect_token();

CREATE TABLE workpump_audit (
    seq           bigserial   PRIMARY KEY,
    -- insert | update | delete
    op            text        NOT NULL,
    item          bigint      NOT NULL,
    from_state    text,
    to_state      text,
    from_instance uuid,
    to_instance   uuid,
    from_token    bigint,
    to_token      bigint,
    from_attempt  int,
    to_attempt    int,
    from_expiry   timestamptz,
    to_expiry     timestamptz,
    from_renewals int,
    to_renewals   int,
    checkpointed  boolean     NOT NULL DEFAULT false,
    from_cancel   boolean,
    to_cancel     boolean,
    error         jsonb,
    proc          text        NOT NULL DEFAULT current_setting('application_name'),
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The writing transaction's now(): the clock the store's functions compare leases with.
    txn_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workpump_audit_item ON workpump_audit (item);
CREATE FUNCTION workpump_audit() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_catalog AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO workpump_audit (op, item, to_state, to_instance, to_token, to_attempt,
                                 to_expiry, to_renewals, to_cancel)
        VALUES ('insert', NEW.id, NEW.state::text, NEW.instance_id, NEW.claim_token, NEW.attempt,
                NEW.lease_expiry, NEW.renewals, NEW.cancel_requested);
    ELSIF TG_OP = 'DELETE' AND TG_TABLE_NAME LIKE 'work\_history%' THEN
        -- A row trigger of work_history fires on its partition: the table is one of them.
        INSERT INTO workpump_audit (op, item, from_state, from_token, from_attempt, from_renewals,
                                 from_cancel)
        VALUES ('delete', OLD.id, 'completed', OLD.claim_token, OLD.attempt, OLD.renewals,
                OLD.cancel_requested);
    ELSIF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM workpump.work_history h WHERE h.id = OLD.id) THEN
        -- complete_work: the row left for work_history in the statement this trigger ends.
        INSERT INTO workpump_audit (op, item, from_state, to_state, from_instance, to_instance,
                                 from_token, to_token, from_attempt, to_attempt,
                                 from_expiry, to_expiry, from_renewals, to_renewals,
                                 from_cancel, to_cancel)
        VALUES ('update', OLD.id, OLD.state::text, 'completed', OLD.instance_id, NULL,
                OLD.claim_token, OLD.claim_token, OLD.attempt, OLD.attempt,
                OLD.lease_expiry, NULL, OLD.renewals, OLD.renewals,
                OLD.cancel_requested, OLD.cancel_requested);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO workpump_audit (op, item, from_state, from_instance, from_token, from_attempt,
                                 from_expiry, from_renewals, from_cancel)
        VALUES ('delete', OLD.id, OLD.state::text, OLD.instance_id, OLD.claim_token, OLD.attempt,
                OLD.lease_expiry, OLD.renewals, OLD.cancel_requested);
    ELSE
        INSERT INTO workpump_audit (op, item, from_state, to_state, from_instance, to_instance,
                                 from_token, to_token, from_attempt, to_attempt,
                                 from_expiry, to_expiry, from_renewals, to_renewals,
                                 checkpointed, from_cancel, to_cancel, error)
        VALUES ('update', NEW.id, OLD.state::text, NEW.state::text, OLD.instance_id,
                NEW.instance_id, OLD.claim_token, NEW.claim_token, OLD.attempt, NEW.attempt,
                OLD.lease_expiry, NEW.lease_expiry, OLD.renewals, NEW.renewals,
                OLD.checkpoint IS DISTINCT FROM NEW.checkpoint,
                OLD.cancel_requested, NEW.cancel_requested,
                CASE WHEN jsonb_array_length(NEW.errors) > jsonb_array_length(OLD.errors)
                     THEN NEW.errors -> -1 END);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER workpump_audit AFTER UPDATE ON workpump.work FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          OR OLD.instance_id IS DISTINCT FROM NEW.instance_id
          OR OLD.claim_token IS DISTINCT FROM NEW.claim_token
          OR OLD.attempt IS DISTINCT FROM NEW.attempt
          OR OLD.lease_expiry IS DISTINCT FROM NEW.lease_expiry
          OR OLD.renewals IS DISTINCT FROM NEW.renewals
          OR OLD.checkpoint IS DISTINCT FROM NEW.checkpoint
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION workpump_audit();
CREATE TRIGGER workpump_audit_rows AFTER INSERT OR DELETE ON workpump.work FOR EACH ROW
    EXECUTE FUNCTION workpump_audit();
CREATE TRIGGER workpump_audit_history AFTER DELETE ON workpump.work_history FOR EACH ROW
    EXECUTE FUNCTION workpump_audit();

-- The ids the suite enqueued: every one must be there at the end.
CREATE TABLE workpump_enqueued (item bigint PRIMARY KEY);

-- Every registration and deletion of an instance row, and every eviction tombstone, with
-- the writing process and what the row said (heartbeat, lock) at that moment.
CREATE TABLE workpump_instance_audit (
    seq               bigserial   PRIMARY KEY,
    -- register | delete | tombstone
    op                text        NOT NULL,
    instance          uuid        NOT NULL,
    -- The instance's own process (`host`, which is the worker's name).
    host              text,
    started_at        timestamptz,
    last_heartbeat_at timestamptz,
    alive_lock        boolean,
    lock_lost_at      timestamptz,
    -- Whether some session held its alive-lock when the row was deleted.
    lock_held         boolean,
    postmaster_start  timestamptz NOT NULL DEFAULT pg_postmaster_start_time(),
    proc              text        NOT NULL DEFAULT current_setting('application_name'),
    at                timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION workpump_instance_audit() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_catalog AS $$
BEGIN
    IF TG_TABLE_NAME = 'evicted_instances' THEN
        INSERT INTO workpump_instance_audit (op, instance) VALUES ('tombstone', NEW.instance_id);
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO workpump_instance_audit (op, instance, host, started_at, last_heartbeat_at,
                                          alive_lock, lock_lost_at)
        VALUES ('register', NEW.instance_id, NEW.host, NEW.started_at, NEW.last_heartbeat_at,
                NEW.alive_lock, NEW.lock_lost_at);
    ELSE
        INSERT INTO workpump_instance_audit (op, instance, host, started_at, last_heartbeat_at,
                                          alive_lock, lock_lost_at, lock_held)
        VALUES ('delete', OLD.instance_id, OLD.host, OLD.started_at, OLD.last_heartbeat_at,
                OLD.alive_lock, OLD.lock_lost_at,
                EXISTS (SELECT 1 FROM workpump.alive_lock_held_keys() h
                        WHERE h.key = OLD.alive_lock_key));
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER workpump_instance_audit AFTER INSERT OR DELETE ON workpump.instances
    FOR EACH ROW EXECUTE FUNCTION workpump_instance_audit();
CREATE TRIGGER workpump_instance_audit AFTER INSERT ON workpump.evicted_instances
    FOR EACH ROW EXECUTE FUNCTION workpump_instance_audit();

CREATE TABLE workpump_cancels (
    item   bigint      NOT NULL,
    result text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
