-- Server locks (os-lock-server): who locked a server (its project's users, 'owner', or an
-- admin of another project, 'admin') and why (microversion 2.73). NULL: unlocked.
ALTER TABLE instances
    ADD COLUMN locked_by TEXT CHECK (locked_by IN ('owner', 'admin')),
    ADD COLUMN locked_reason TEXT;
