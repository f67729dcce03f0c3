-- A request keel-api sent to a compute agent is taken by the agent, or withdrawn by
-- keel-api, never both (services/api/servers/publish.py).
--
-- taken_at: when an agent took the request (conductor RPC take_request) before acting
-- on it; keel-api can no longer withdraw it.
-- withdrawn_at: when keel-api withdrew it (its message could not be confirmed sent, and
-- it answered 503); an agent that receives it later does nothing.
ALTER TABLE instance_actions ADD COLUMN taken_at TIMESTAMPTZ;
ALTER TABLE instance_actions ADD COLUMN withdrawn_at TIMESTAMPTZ;
CREATE INDEX instance_actions_request ON instance_actions (instance_uuid, request_id);
