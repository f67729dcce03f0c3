-- The default flavors every new deployment starts with. Operators may delete them.
INSERT INTO flavors (flavorid, name, vcpus, memory_mb, root_gb) VALUES
    ('1', 'm1.tiny',   1,   512,   1),
    ('2', 'm1.small',  1,  2048,  20),
    ('3', 'm1.medium', 2,  4096,  40),
    ('4', 'm1.large',  4,  8192,  80),
    ('5', 'm1.xlarge', 8, 16384, 160);
