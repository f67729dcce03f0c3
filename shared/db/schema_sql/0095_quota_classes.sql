-- Limits set for a quota class (os-quota-class-sets). The class named 'default' holds
-- the defaults every project gets where no limit of its own is set; they override the
-- KEEL_QUOTA__* settings, so every keel-api agrees. Other classes are stored and shown
-- only.
CREATE TABLE quota_classes (
    class_name TEXT NOT NULL,
    resource   TEXT NOT NULL,
    hard_limit INTEGER NOT NULL CHECK (hard_limit >= -1),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (class_name, resource)
);
