-- Host fences (keel-fence): a compute host counts as fenced without an operator only if
-- its last heartbeat said its fence was armed, and only once that lease has run out.
--
-- fence_lease: the lease, in seconds, of the host's fence as the agent's last heartbeat
-- reported it: the fence powers every guest off that many seconds after the heartbeat
-- was sent unless a newer answered heartbeat renewed it. NULL: no armed fence (fencing
-- off, a fence dead or not yet armed, an agent of a release before fences): the host is
-- evacuated only once forced down.
ALTER TABLE services ADD COLUMN fence_lease DOUBLE PRECISION;

-- held_until: an evacuation whose source was forced down while its fence's lease still
-- ran waits until then before its destination builds the new copy; the conductors'
-- sweep sends it on once this has passed (services/conductor/moves/held.py).
ALTER TABLE migrations ADD COLUMN held_until TIMESTAMPTZ;
CREATE INDEX migrations_held ON migrations (held_until) WHERE held_until IS NOT NULL;
