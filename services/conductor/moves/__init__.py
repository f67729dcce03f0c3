"""Moving a server to another host: evacuation and cold migration, one workflow.

keel-api records a move (:mod:`services.api.servers.moves`): a migration record of
kind ``evacuation`` or ``migration`` in status ``accepted``, the server's task, and an
instance action. From there:

* :mod:`~services.conductor.moves.task` chooses the destination (a claim held by the
  move), records it (``pre-migrating``), has a cold migration's source shut its guest
  down, and asks the destination's agent to build the server there;
* :mod:`~services.conductor.moves.arrival` takes the destination's result: an
  evacuation becomes ``done``, a cold migration ``finished`` (VERIFY_RESIZE), a failure
  ``failed``;
* :mod:`~services.conductor.moves.endings` ends it: a cold migration confirmed (the
  source's copy removed) or reverted (the destination's copy removed), an evacuation
  confirmed by its returning source (``completed``);
* :mod:`services.conductor.guests` (a room of its own, beside this one) decides, from
  the server's whole move history, what each guest an agent reports is to become: the
  only place a copy is ever condemned;
* :mod:`~services.conductor.moves.sweep` gives every state a deadline: auto-confirm,
  stalled confirms and reverts, moves past ``KEEL_MOVE_TIMEOUT``.

Every step is a compare-and-swap on the record's status, taken with the locks in one
order (the instance, the migration, the claims: :func:`shared.db.moves.lock`), so twin
and late deliveries change nothing.
"""
