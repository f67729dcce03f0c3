"""keel's RPC layer: typed messages between services over a broker.

``transport`` (the broker interface: ``amqp`` for RabbitMQ, ``fake`` in memory),
``envelope`` (what travels), ``client`` and ``server`` (the two ends), ``settlement`` (what
becomes of each message).

Compatibility across releases
=============================

During a rolling upgrade release N and N+1 run side by side, so every message and every
stored JSON value must be readable by both. The rules:

* **Readers ignore what they do not know.** Envelopes, request contexts, request and
  result models, and the models of stored rows and JSON (``shared.objects``) ignore
  unknown fields (``extra="ignore"``). Strictness belongs to the REST API's edge, where a
  client's typo must be a 400; on the bus and in the database an unknown field is just
  a newer writer.
* **New fields are optional, with defaults**, so an older writer's message or row still
  validates in the newer reader.
* **Senders step down for older receivers.** Each RPC API has a version (``major.minor``)
  and a history in its ``rpcapi.py`` docstring. A change to a method's arguments or a new
  method bumps the minor version, adds a ``SERVICE_VERSION_HISTORY`` line
  (``shared/versions.py``) and updates the schema fingerprints the tests keep
  (``tests/unit/shared/rpc/fingerprints.json``). The client asks
  ``can_send_version`` against its version cap — pinned by setting, or chosen from the
  deployment's minimum service version — and either sends the older version with the
  newer arguments removed (the backports live beside the request models) or refuses
  with a clear error when the older receiver cannot do what is asked at all.
* **Results are stepped down for an older caller** the same way: a server answers a
  request at the version it was asked in, and fields a caller at that version would not
  know are optional for it to read.
"""
