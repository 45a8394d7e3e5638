-- migrate: the lock is held; the migrations themselves run with the session's usual lock_timeout.
RESET lock_timeout
